#pragma once
/* Sandbox sessions (docs/sessions.md): POST/GET .../sessions, POST
 * .../sessions/{session}:revoke, and how the HTTP edge checks a session's
 * token (api_sessions_edge). */
#include "daemon/http/http.h"

enum MHD_Result handle_session_create(Req *r);
enum MHD_Result handle_session_list(Req *r);
enum MHD_Result handle_session_revoke(Req *r);
/* The edge's side of the sessions, over the app (http_server_set_sessions). */
HttpSessions api_sessions_edge(App *app);
