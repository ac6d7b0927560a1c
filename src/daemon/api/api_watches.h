#pragma once
/* File watches (docs/api.md, "File watches"): POST/GET .../files/watches,
 * GET/DELETE .../files/watches/{watch}, GET .../files/watches/{watch}/events
 * (by cursor, or followed as NDJSON). */
#include "daemon/http/http.h"

enum MHD_Result handle_watch_start(Req *r);
enum MHD_Result handle_watch_list(Req *r);
enum MHD_Result handle_watch_get(Req *r);
enum MHD_Result handle_watch_stop(Req *r);
enum MHD_Result handle_watch_events(Req *r);
