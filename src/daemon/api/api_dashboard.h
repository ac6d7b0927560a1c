#pragma once
/* The dashboard's files: GET /dashboard/, /dashboard/app.js, /dashboard/app.css. */
#include "daemon/http/http.h"

/* The Content-Security-Policy the dashboard's files are served with. */
#define DASHBOARD_CSP                                                                                      \
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "             \
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

enum MHD_Result handle_dashboard_root(Req *r);
enum MHD_Result handle_dashboard(Req *r);
enum MHD_Result handle_dashboard_js(Req *r);
enum MHD_Result handle_dashboard_css(Req *r);
