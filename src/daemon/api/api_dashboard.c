/* The dashboard (docs/dashboard.md): a page, a script and a style sheet
 * built into the daemon (src/dashboard/, made into C strings at build time)
 * and served to anyone, since they hold nothing: every figure on the page
 * comes from an API call the browser makes with the key a person signs in
 * with, checked here as any client's. The policy sent with them lets the page
 * run only its own script and talk only to this origin; nothing may frame it. */
#include "daemon/api/api_dashboard.h"

#include <string.h>

#include "daemon/api/api.h"

static const char index_html[] =
#include "dashboard/index.html.inc"
        ;
static const char app_js[] =
#include "dashboard/app.js.inc"
        ;
static const char app_css[] =
#include "dashboard/app.css.inc"
        ;

static enum MHD_Result serve(Req *r, const char *text, size_t len, const char *type) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_PERSISTENT);
        if (!resp)
                return MHD_NO;
        MHD_add_response_header(resp, "Content-Security-Policy", DASHBOARD_CSP);
        MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
        MHD_add_response_header(resp, "X-Frame-Options", "DENY");
        MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
        MHD_add_response_header(resp, "Cross-Origin-Opener-Policy", "same-origin");
        MHD_add_response_header(resp, "Cross-Origin-Resource-Policy", "same-origin");
        return reply_response(r, 200, resp, type);
}

/* /dashboard: the page is at /dashboard/ (its links are absolute, but a
 * person typing the short form lands on the one address). */
enum MHD_Result handle_dashboard_root(Req *r) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!resp)
                return MHD_NO;
        MHD_add_response_header(resp, "Location", "/dashboard/");
        return reply_response(r, 308, resp, NULL);
}

enum MHD_Result handle_dashboard(Req *r) {
        return serve(r, index_html, sizeof(index_html) - 1, "text/html; charset=utf-8");
}

enum MHD_Result handle_dashboard_js(Req *r) {
        return serve(r, app_js, sizeof(app_js) - 1, "text/javascript; charset=utf-8");
}

enum MHD_Result handle_dashboard_css(Req *r) {
        return serve(r, app_css, sizeof(app_css) - 1, "text/css; charset=utf-8");
}
