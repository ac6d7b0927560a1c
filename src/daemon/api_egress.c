/* Egress secrets and a sandbox's egress audit log. */
#include "daemon/api_egress.h"

#include <stdlib.h>

#include "common/jsonutil.h"
#include "common/macro.h"
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
        int rc = 0;
        const char *lim = req_query(r, "limit"), *after = req_query(r, "after");
        char *end = NULL;
        long limit = lim ? strtol(lim, &end, 10) : 0;
        if (lim && (limit < 1 || limit > 100 || *end || end == lim))
                rc = api_error(&e, 400, "invalid_request", NULL, "limit must be 1..100");
        if (rc == 0 && after && !*after)
                after = NULL;
        if (rc == 0 && (rc = egress_secret_list(r->app->egress, r->key.owner, (unsigned)limit, after, &j, &se)) < 0)
                api_sandbox_error(&se, &e);
        return reply_result(r, rc, j, &e, 200);
}

enum MHD_Result handle_secret_rotate(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        ApiError e = { 0 };
        SandboxError se;
        json_t *j = NULL;
        int rc = egress_secret_rotate(r->app->egress, r->key.owner, r->route.secret, r->json, &j, &se);
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

/* What the published client's account and jobs calls reach on a daemon that
 * has no such feature: 501 with what to do instead, never a 404 "no route"
 * that reads as a wrong URL. */
static const struct {
        int kind;
        const char *what, *hint;
} not_offered[] = {
        { ROUTE_JOB_SECRETS, "secrets for scheduled jobs",
          "sandbox secrets live at /v1/egress-secrets: rotate one with POST /v1/egress-secrets/{name}:rotate or "
          "by setting it again; their values are never readable" },
        { ROUTE_JOB_SECRET_CREATE, "secrets for scheduled jobs",
          "keep sandbox secrets with PUT /v1/egress-secrets/{name}; rotate one with POST "
          "/v1/egress-secrets/{name}:rotate" },
        { ROUTE_SECRET_SCOPE, "per-secret sandbox selectors",
          "name the secrets a sandbox may use in its create's \"secrets\" list" },
        { ROUTE_SECRET_NARROW, "narrowing a secret without its value",
          "set it again (PUT /v1/egress-secrets/{name}) with the value and the narrower hosts or rules" },
        { ROUTE_ACCOUNT_CLOSE, "accounts to close", "stop the daemon and remove its state directory" },
        { ROUTE_ACCOUNT_EMAILS, "emails", "read the daemon's log instead" },
        { ROUTE_ACCOUNT_EMAILS_UPDATE, "emails", "read the daemon's log instead" },
        { ROUTE_USAGE_REQUESTS, "per-request usage counts", "read GET /metrics" },
        { ROUTE_USAGE_EXPORT, "usage exports", "read GET /v1/usage" },
};

enum MHD_Result handle_not_offered(Req *r) {
        ApiError e = { 0 };
        for (size_t i = 0; i < ELEMENTSOF(not_offered); i++)
                if (not_offered[i].kind == r->route.kind) {
                        api_error(&e, 501, "not_implemented", not_offered[i].hint,
                                  "this self-hosted daemon has no %s", not_offered[i].what);
                        return reply_error(r, &e);
                }
        api_error(&e, 501, "not_implemented", NULL, "this self-hosted daemon does not offer this call");
        return reply_error(r, &e);
}
