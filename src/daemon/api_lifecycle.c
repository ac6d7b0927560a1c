/* The lifecycle routes. Each answers the sandbox as the transition left it:
 * the manager runs a transition to its end (or its refusal) before it
 * answers, one at a time per sandbox, so a client never needs to poll. */
#include "daemon/api_lifecycle.h"

#include "daemon/api.h"
#include "daemon/api_sandboxes.h"
#include "daemon/request.h"

enum MHD_Result handle_sandbox_pause(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        if (request_parse_no_fields(r->json, &e) < 0)
                return reply_error(r, &e);
        int rc = sandbox_pause(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &row, &se);
        return api_reply_sandbox_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_wake(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        int64_t timeout_seconds = 0;
        if (request_parse_wake(r->json, &timeout_seconds, &e) < 0)
                return reply_error(r, &e);
        int rc = sandbox_wake(r->app->manager, &r->key, r->route.sandbox_id, timeout_seconds, r->rid, &row, &se);
        return api_reply_sandbox_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_restart(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        if (request_parse_no_fields(r->json, &e) < 0)
                return reply_error(r, &e);
        int rc = sandbox_restart(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &row, &se);
        return api_reply_sandbox_row(r, rc, &row, &se, 200);
}
