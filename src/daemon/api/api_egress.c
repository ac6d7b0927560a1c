/* Egress secrets and a sandbox's egress audit log. */
#include "daemon/api/api_egress.h"

#include <stdlib.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"

/* 503 when the daemon runs without egress. */
static bool egress_ready(Req *r) {
        if (r->app->egress)
                return true;
        ApiError e;
        api_error(&e, 503, "unavailable", NULL, "egress is not set up on this daemon");
        reply_error(r, &e);
        return false;
}

/* A JSON array of n items, each made by one; NULL when out of memory. */
static json_t *json_list(const void *items, size_t n, size_t size, json_t *(*one)(const void *item)) {
        json_t *list = json_array();
        for (size_t i = 0; list && i < n; i++)
                if (json_array_append_new(list, one((const char *)items + i * size)) < 0) {
                        json_decref(list);
                        list = NULL;
                }
        return list;
}

/* A secret (an EgressSecretInfo) in the API's shape; NULL when out of
 * memory. */
static json_t *secret_json(const void *item) {
        const EgressSecretInfo *s = item;
        char created[RFC3339_LEN] = "", updated[RFC3339_LEN] = "";
        (void)time_format_rfc3339(s->created_at, created);
        (void)time_format_rfc3339(s->updated_at, updated);
        json_t *hosts = json_loads(s->hosts, 0, NULL);
        json_t *rules = s->rules ? json_loads(s->rules, 0, NULL) : NULL;
        return json_pack("{s:s,s:o,s:s,s:s,s:s,s:s?,s:s?,s:o,s:b}", "name", s->name, "hosts",
                         hosts ? hosts : json_array(), "placeholder", s->placeholder, "createdAt", created,
                         "updatedAt", updated, "header", s->header, "format",
                         s->header ? (s->format ? s->format : "{value}") : NULL, "rules", rules ? rules : json_null(),
                         "enforced", 1);
}

/* The answer of a call that gives one secret. */
static enum MHD_Result reply_secret(Req *r, int rc, EgressSecretInfo *info, SandboxError *se) {
        ApiError e = { 0 };
        json_t *j = NULL;
        if (rc < 0)
                api_sandbox_error(se, &e);
        else if (!(j = secret_json(info)))
                rc = api_error(&e, 500, "internal", NULL, "out of memory");
        egress_secret_info_done(info);
        return reply_result(r, rc, j, &e, 200);
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
        EgressSecretInfo *list = NULL;
        size_t n = 0;
        bool more = false;
        if (rc == 0 &&
            (rc = egress_secret_list(r->app->egress, r->key.owner, (unsigned)limit, after, &list, &n, &more, &se)) < 0)
                api_sandbox_error(&se, &e);
        if (rc == 0) {
                json_t *secrets = json_list(list, n, sizeof(*list), secret_json);
                j = secrets ? json_pack("{s:o,s:s?}", "secrets", secrets, "next",
                                        more && n ? list[n - 1].name : NULL)
                            : NULL;
                if (!j)
                        rc = api_error(&e, 500, "internal", NULL, "out of memory");
        }
        egress_secret_infos_free(list, n);
        return reply_result(r, rc, j, &e, 200);
}

enum MHD_Result handle_secret_rotate(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        SandboxError se;
        EgressSecretInfo info = { 0 };
        int rc = egress_secret_rotate(r->app->egress, r->key.owner, r->route.secret, r->json, &info, &se);
        return reply_secret(r, rc, &info, &se);
}

enum MHD_Result handle_secret_get(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        SandboxError se;
        EgressSecretInfo info = { 0 };
        int rc = egress_secret_get(r->app->egress, r->key.owner, r->route.secret, &info, &se);
        return reply_secret(r, rc, &info, &se);
}

enum MHD_Result handle_secret_put(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        SandboxError se;
        EgressSecretInfo info = { 0 };
        int rc = egress_secret_put(r->app->egress, r->key.owner, r->route.secret, r->json, &info, &se);
        return reply_secret(r, rc, &info, &se);
}

enum MHD_Result handle_secret_delete(Req *r) {
        if (!egress_ready(r))
                return MHD_YES;
        ApiError e = { 0 };
        SandboxError se;
        json_t *j = NULL;
        int rc = egress_secret_delete(r->app->egress, r->key.owner, r->route.secret, &se);
        if (rc < 0)
                api_sandbox_error(&se, &e);
        else if (!(j = json_pack("{s:s,s:b,s:b}", "name", r->route.secret, "deleted", 1, "enforced", 1)))
                rc = api_error(&e, 500, "internal", NULL, "out of memory");
        return reply_result(r, rc, j, &e, 200);
}

/* One audit entry (an EgressAuditEntry) in the API's shape. */
static json_t *audit_json(const void *item) {
        const EgressAuditEntry *a = item;
        char at[RFC3339_LEN] = "";
        (void)time_format_rfc3339(a->at, at);
        /* rule: null when no rule decided; end and durationMs: null while
         * the connection is open. */
        return json_pack("{s:s,s:s,s:i,s:s,s:b,s:s,s:s?,s:I,s:I,s:b,s:i,s:s?,s:s?,s:o}", "at", at, "host", a->rec.host,
                         "port", (int)a->rec.port, "kind", a->kind, "allowed", a->rec.allowed, "reason", a->rec.reason,
                         "address", a->rec.addr[0] ? a->rec.addr : NULL, "bytesOut", (json_int_t)a->rec.bytes_out,
                         "bytesIn", (json_int_t)a->rec.bytes_in, "intercepted", a->rec.intercepted, "secretsUsed",
                         (int)a->rec.secrets_used, "rule", a->rec.rule[0] ? a->rec.rule : NULL, "end",
                         a->ended ? a->rec.end : NULL, "durationMs",
                         a->ended ? json_integer((json_int_t)a->rec.duration_ms) : json_null());
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
        _cleanup_free_ EgressAuditEntry *entries = NULL;
        size_t n = 0;
        if (rc == 0 &&
            (rc = egress_audit_list(r->app->egress, r->route.sandbox_id, (unsigned)limit, &entries, &n, &se)) < 0)
                api_sandbox_error(&se, &e);
        if (rc == 0) {
                json_t *list = json_list(entries, n, sizeof(*entries), audit_json);
                j = list ? json_pack("{s:s,s:o}", "sandboxId", r->route.sandbox_id, "entries", list) : NULL;
                if (!j)
                        rc = api_error(&e, 500, "internal", NULL, "out of memory");
        }
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
