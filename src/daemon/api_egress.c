/* Egress secrets and a sandbox's egress audit log. */
#include "daemon/api_egress.h"

#include <stdlib.h>

#include "common/jsonutil.h"
#include "daemon/api.h"

/* 503 when the daemon runs without egress. */
static bool egress_ready(Req *r) {
        if (r->app->egress)
                return true;
        ApiError e;
        api_error(&e, 503, "unavailable", NULL, "egress is not set up on this daemon");
        reply_error(r, &e);
        return false;
}

enum MHD_Result handle_secrets_list(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        ApiError e = { 0 };
        SandboxError se;
        json_t *j = NULL;
        int rc = egress_secret_list(r->app->egress, r->key.owner, &j, &se);
        if (rc < 0)
                api_sandbox_error(&se, &e);
        return reply_result(r, rc, j, &e, 200);
}

enum MHD_Result handle_secret_get(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        ApiError e = { 0 };
        SandboxError se;
        json_t *j = NULL;
        int rc = egress_secret_get(r->app->egress, r->key.owner, r->route.secret, &j, &se);
        if (rc < 0)
                api_sandbox_error(&se, &e);
        return reply_result(r, rc, j, &e, 200);
}

enum MHD_Result handle_secret_put(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        ApiError e = { 0 };
        SandboxError se;
        json_t *j = NULL;
        int rc = egress_secret_put(r->app->egress, r->key.owner, r->route.secret, r->json, &j, &se);
        if (rc < 0)
                api_sandbox_error(&se, &e);
        return reply_result(r, rc, j, &e, 200);
}

enum MHD_Result handle_secret_delete(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        ApiError e = { 0 };
        SandboxError se;
        json_t *j = NULL;
        int rc = egress_secret_delete(r->app->egress, r->key.owner, r->route.secret, &j, &se);
        if (rc < 0)
                api_sandbox_error(&se, &e);
        return reply_result(r, rc, j, &e, 200);
}

enum MHD_Result handle_sandbox_egress(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        ApiError e = { 0 };
        json_t *j = NULL;
        /* Only the owner may read a sandbox's log: 404 otherwise. */
        SandboxError se;
        SandboxRow row;
        int rc = sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se);
        if (rc < 0)
                api_sandbox_error(&se, &e);
        else
                sandbox_row_done(&row);
        const char *lim = req_query(r, "limit");
        char *end = NULL;
        long limit = lim ? strtol(lim, &end, 10) : 1000;
        if (rc == 0 && (limit < 1 || limit > 10000 || (lim && *end)))
                rc = api_error(&e, 400, "invalid_request", NULL, "limit must be 1..10000");
        if (rc == 0 && (rc = egress_audit_list(r->app->egress, r->route.sandbox_id, (unsigned)limit, &j, &se)) < 0)
                api_sandbox_error(&se, &e);
        return reply_result(r, rc, j, &e, 200);
}
