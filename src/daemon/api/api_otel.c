/* The OpenTelemetry exports (docs/api.md, "OpenTelemetry"), as the
 * published client's runtime.otel drives them: create, list, get, update,
 * flush, delete; an owner's own (the admin key's too: its owner's). The
 * headers that authenticate to a collector are never answered back: their
 * names only. */
#include "daemon/api/api_otel.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/jsonutil.h"
#include "daemon/api/api.h"
#include "daemon/manager/otel.h"

static json_t *export_json(Otel *o, const OtelExportRecord *x) {
        json_t *signals = json_loads(x->signals ? x->signals : "[]", 0, NULL);
        return json_pack("{s:s,s:s,s:o,s:o,s:b,s:o,s:o,s:o,s:o,s:s?,s:I,s:I,s:I}", "id", x->id, "endpoint", x->endpoint,
                         "headerNames", otel_header_names(o, x), "signals", signals ? signals : json_array(),
                         "enabled", x->enabled, "createdAt", json_time_or_null(x->created_at), "updatedAt",
                         json_time_or_null(x->updated_at), "lastPushAt",
                         x->last_push_at ? json_time_or_null(x->last_push_at) : json_null(), "lastStatus",
                         x->last_status ? json_integer(x->last_status) : json_null(), "lastError",
                         x->last_error && *x->last_error ? x->last_error : NULL, "sentLogs", (json_int_t)x->sent_logs,
                         "sentPoints", (json_int_t)x->sent_points, "dropped", (json_int_t)x->dropped);
}

typedef struct Out {
        Otel *o;
        json_t *j; /* one record, or the list's array */
} Out;

static int one(void *userdata, const OtelExportRecord *x) {
        Out *out = userdata;
        json_decref(out->j);
        out->j = export_json(out->o, x);
        return out->j ? 0 : -ENOMEM;
}

static int add(void *userdata, const OtelExportRecord *x) {
        Out *out = userdata;
        json_t *j = export_json(out->o, x);
        return j && json_array_append_new(out->j, j) == 0 ? 0 : -ENOMEM;
}

static enum MHD_Result refusal(Req *r, int rc, const char *what) {
        ApiError e;
        switch (rc) {
        case -ENOENT:
                api_error(&e, 404, "not_found", "GET /v1/otel-exports lists them", "no export %s", r->route.export_id);
                return reply_error(r, &e);
        case -EDQUOT:
                api_error(&e, 409, "limit_exceeded", "delete an export you no longer use",
                          "an owner has at most %d OpenTelemetry exports", OTEL_EXPORTS_MAX_PER_OWNER);
                return reply_error(r, &e);
        case -EBUSY:
                api_error(&e, 409, "conflict", "try again in a moment", "a push of this export is in flight");
                return reply_error(r, &e);
        default:
                return api_reply_store_error(r, rc, what);
        }
}

/* The fields of a create or an update, checked. */
static int parse_input(Req *r, bool create, OtelInput *in, char *why, size_t n) {
        json_t *body = r->json;
        *in = (OtelInput){ .enabled = create ? 1 : -1 };
        if (!json_is_object(body)) {
                snprintf(why, n, "the body must be a JSON object");
                return -EINVAL;
        }
        const char *k;
        json_t *v;
        json_object_foreach(body, k, v) {
                if (json_is_null(v))
                        continue;
                if (strcmp(k, "endpoint") == 0) {
                        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
                                snprintf(why, n, "endpoint must be a string");
                                return -EINVAL;
                        }
                        in->endpoint = json_string_value(v);
                } else if (strcmp(k, "headers") == 0)
                        in->headers = v;
                else if (strcmp(k, "signals") == 0)
                        in->signals = v;
                else if (strcmp(k, "enabled") == 0 && !create) {
                        if (!json_is_boolean(v)) {
                                snprintf(why, n, "enabled must be true or false");
                                return -EINVAL;
                        }
                        in->enabled = json_is_true(v);
                } else {
                        snprintf(why, n, "unknown field %.64s", k);
                        return -EINVAL;
                }
        }
        return otel_check_input(r->app->otel, in, create, why, n);
}

enum MHD_Result handle_otel_list(Req *r) {
        if (!r->app->otel)
                return api_reply_not_offered(r, "OpenTelemetry exports are");
        Out out = { .o = r->app->otel, .j = json_array() };
        int rc = out.j ? otel_list(r->app->otel, r->key.owner, add, &out) : -ENOMEM;
        if (rc < 0) {
                json_decref(out.j);
                return refusal(r, rc, "list the OpenTelemetry exports");
        }
        json_t *j = json_pack("{s:o}", "data", out.j);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_otel_create(Req *r) {
        if (!r->app->otel)
                return api_reply_not_offered(r, "OpenTelemetry exports are");
        OtelInput in;
        char why[256];
        if (parse_input(r, true, &in, why, sizeof why) < 0)
                return api_reply_invalid(r, NULL, why);
        Out out = { .o = r->app->otel };
        int rc = otel_create(r->app->otel, r->key.owner, &in, one, &out);
        if (rc < 0)
                return refusal(r, rc, "make the OpenTelemetry export");
        return reply_json(r, 201, out.j);
}

enum MHD_Result handle_otel_get(Req *r) {
        if (!r->app->otel)
                return api_reply_not_offered(r, "OpenTelemetry exports are");
        Out out = { .o = r->app->otel };
        int rc = otel_get(r->app->otel, r->route.export_id, r->key.owner, one, &out);
        if (rc < 0)
                return refusal(r, rc, "read the OpenTelemetry export");
        return reply_json(r, 200, out.j);
}

enum MHD_Result handle_otel_update(Req *r) {
        if (!r->app->otel)
                return api_reply_not_offered(r, "OpenTelemetry exports are");
        OtelInput in;
        char why[256];
        if (parse_input(r, false, &in, why, sizeof why) < 0)
                return api_reply_invalid(r, NULL, why);
        Out out = { .o = r->app->otel };
        int rc = otel_update(r->app->otel, r->route.export_id, r->key.owner, &in, one, &out);
        if (rc < 0)
                return refusal(r, rc, "change the OpenTelemetry export");
        return reply_json(r, 200, out.j);
}

enum MHD_Result handle_otel_flush(Req *r) {
        if (!r->app->otel)
                return api_reply_not_offered(r, "OpenTelemetry exports are");
        Out out = { .o = r->app->otel };
        int rc = otel_flush(r->app->otel, r->route.export_id, r->key.owner, one, &out);
        if (rc < 0)
                return refusal(r, rc, "push the OpenTelemetry export");
        return reply_json(r, 200, out.j);
}

enum MHD_Result handle_otel_delete(Req *r) {
        if (!r->app->otel)
                return api_reply_not_offered(r, "OpenTelemetry exports are");
        int rc = otel_delete(r->app->otel, r->route.export_id, r->key.owner);
        if (rc < 0)
                return refusal(r, rc, "delete the OpenTelemetry export");
        json_t *j = json_pack("{s:s,s:b}", "id", r->route.export_id, "deleted", true);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}
