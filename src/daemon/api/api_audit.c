/* GET /v1/audit (docs/api.md, "Audit"): the key's owner's audit trail (the
 * admin key's: every owner's), newest first, in pages: the published
 * client's {"events": [...], "next": ...} with its filters (action, a group
 * ending in '.', limit, before) and ours (sandboxId: one sandbox's). */
#include "daemon/api/api_audit.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "daemon/api/api.h"
#include "daemon/manager/audit.h"
#include "daemon/manager/keys.h"

typedef struct Page {
        json_t *data;
        unsigned limit;
        int64_t last_seq;
} Page;

static int add_one(void *userdata, const AuditRecord *a) {
        Page *p = userdata;
        json_t *detail = a->detail ? json_loads(a->detail, 0, NULL) : NULL;
        json_t *j = json_pack("{s:s,s:s,s:s,s:s?,s:s?,s:s?,s:s?,s:o,s:o,s:s?,s:s?,s:s,s:o}", "id", a->id, "action",
                              a->action, "owner", a->owner, "keyId", a->key_id, "method", a->method, "path", a->path,
                              "sandboxId", a->sandbox_id, "detail", detail ? detail : json_object(), "status",
                              a->status ? json_integer(a->status) : json_null(), "clientAddress", a->client,
                              "requestId", a->request_id, "hostId", a->host_id ? a->host_id : "", "time",
                              json_time_or_null(a->at));
        if (!j || json_array_append_new(p->data, j) < 0)
                return -ENOMEM;
        if (json_array_size(p->data) == p->limit)
                p->last_seq = a->seq;
        return 0;
}

enum MHD_Result handle_audit(Req *r) {
        ApiError e = { 0 };
        AuditFilter f = { .limit = AUDIT_LIST_DEFAULT };
        if (!r->app->audit) {
                api_error(&e, 503, "unavailable", NULL, "this daemon keeps no audit trail");
                return reply_error(r, &e);
        }
        if (api_page_query_as(r, "before", AUDIT_LIST_DEFAULT, AUDIT_LIST_MAX, &f.limit, &f.before, &e) < 0)
                return reply_error(r, &e);
        f.action = req_query(r, "action");
        if (f.action && !api_filter_ok(f.action)) {
                api_error(&e, 400, "invalid_request", NULL, "action is 1 to 64 letters, digits, '.', '_' or '-'");
                return reply_error(r, &e);
        }
        /* The admin key sees every owner's; any other key its owner's. */
        f.sandbox_id = req_query(r, "sandboxId");
        if (f.sandbox_id && !api_filter_ok(f.sandbox_id)) {
                api_error(&e, 400, "invalid_request", NULL, "sandboxId is 1 to 64 letters, digits, '.', '_' or '-'");
                return reply_error(r, &e);
        }
        f.owner = keys_is_admin(&r->key) ? NULL : r->key.owner;
        Page p = { .data = json_array(), .limit = f.limit };
        f.limit += 1; /* one past the page says whether there is a next one */
        int rc = p.data ? audit_list(r->app->audit, &f, add_one, &p) : -ENOMEM;
        if (rc < 0) {
                json_decref(p.data);
                if (rc == -ENOTCONN || rc == -ETIMEDOUT) {
                        api_error(&e, 503, "unavailable", "try again", "the store did not answer");
                        return reply_error(r, &e);
                }
                return reply_internal(r);
        }
        json_t *page = api_page_json(p.data, p.limit, p.last_seq);
        json_t *j = page ? json_pack("{s:O,s:O,s:O}", "events", json_object_get(page, "data"), "next",
                                     json_object_get(page, "nextCursor"), "hasMore", json_object_get(page, "hasMore"))
                         : NULL;
        json_decref(page);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}
