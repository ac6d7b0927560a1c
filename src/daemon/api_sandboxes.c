/* The sandbox routes: list, create, get, delete, stop, extend, network, pause,
 * wake, restart. The manager answers rows; the API's sandbox object is made
 * here. */
#include "daemon/api_sandboxes.h"

#include <errno.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api.h"
#include "daemon/request.h"

/* The API's sandbox object for a row. */
static json_t *row_json(Manager *m, const SandboxRow *r) {
        _cleanup_json_ json_t *spec = json_loads(r->spec, 0, NULL);
        _cleanup_json_ json_t *labels = json_loads(r->labels, 0, NULL);
        if (!spec || !labels)
                return NULL;
        unsigned vcpu = (unsigned)json_integer_value(json_object_get(spec, "vcpu"));
        unsigned mem = (unsigned)json_integer_value(json_object_get(spec, "memoryMiB"));
        unsigned disk = (unsigned)json_integer_value(json_object_get(spec, "diskMiB"));
        const char *driver = json_string_value(json_object_get(spec, "driver"));
        const char *image = json_string_value(json_object_get(spec, "image"));
        const char *on_end = json_string_value(json_object_get(spec, "onLeaseEnd"));
        uint64_t per_hour = sandbox_row_cost_per_hour(m, r);
        int64_t run_seconds = sandbox_row_run_seconds(r, time_now_unix());
        uint64_t cost = ledger_cost(per_hour, run_seconds);
        json_t *max_cost = json_object_get(spec, "maxCostMicros");
        json_t *max_total = json_object_get(spec, "maxTotalCostMicros");
        json_t *network = json_object_get(spec, "network");
        json_t *j = json_pack("{s:s,s:o,s:O,s:s,s:s,s:s,s:i,s:i,s:i,s:O,s:I,s:s,s:o,s:o,s:o,s:o,s:I,s:I,s:O,s:o}",
                         "id", r->id, "name", r->name ? json_string(r->name) : json_null(), "labels", labels,
                         "state", r->state, "driver", driver ? driver : "", "image", image ? image : "", "vcpu",
                         (int)vcpu, "memoryMiB", (int)mem, "diskMiB", (int)disk, "network",
                         network ? network : json_null(), "timeoutSeconds",
                         (json_int_t)json_integer_value(json_object_get(spec, "timeoutSeconds")), "onLeaseEnd",
                         on_end ? on_end : "stop", "createdAt", json_time_or_null(r->created_at), "startedAt",
                         json_time_or_null(r->started_at), "stoppedAt", json_time_or_null(r->stopped_at), "leaseEndsAt",
                         json_time_or_null(r->lease_ends_at), "costMicrosPerHour", (json_int_t)per_hour, "costMicros",
                         (json_int_t)cost, "maxCostMicros", max_cost ? max_cost : json_null(), "failureReason",
                         r->failure_reason ? json_string(r->failure_reason) : json_null());
        /* The lifecycle's fields: a paused sandbox costs its disk only. */
        json_t *idle = json_object_get(spec, "idlePauseSeconds");
        json_t *paused_at = json_object_get(spec, "pausedAt");
        uint64_t paused_cost = sandbox_row_paused_cost(m, r, time_now_unix());
        if (j && (json_object_set_new(j, "costMicros", json_integer((json_int_t)(cost + paused_cost))) < 0 ||
                  json_object_set_new(j, "pausedAt", json_time_or_null(json_integer_value(paused_at))) < 0 ||
                  json_object_set_new(j, "idlePauseSeconds", json_integer(json_integer_value(idle))) < 0 ||
                  json_object_set_new(j, "autoWake", json_boolean(!json_is_false(json_object_get(spec, "autoWake")))) < 0 ||
                  json_object_set_new(j, "pausable", json_boolean(!json_is_false(json_object_get(spec, "pausable")))) < 0)) {
                json_decref(j);
                return NULL;
        }
        if (j && (json_object_set_new(j, "runSeconds", json_integer(run_seconds)) < 0 ||
                  json_object_set(j, "maxTotalCostMicros", max_total ? max_total : json_null()) < 0 ||
                  json_object_set(j, "secrets", json_object_get(spec, "secrets") ?: json_null()) < 0)) {
                json_decref(j);
                return NULL;
        }
        return j;
}

/* Answers a manager call's row (cleared here) with status, or its error. */
static enum MHD_Result reply_row(Req *r, int rc, SandboxRow *row, const SandboxError *se, unsigned status) {
        ApiError e = { 0 };
        if (rc < 0) {
                api_sandbox_error(se, &e);
                return reply_error(r, &e);
        }
        json_t *j = row_json(r->app->manager, row);
        sandbox_row_done(row);
        if (!j) {
                api_error(&e, 500, "internal", NULL, "could not render the sandbox");
                return reply_error(r, &e);
        }
        return reply_json(r, status, j);
}

typedef struct ListCtx {
        Manager *m;
        json_t *arr;
} ListCtx;

static int list_one(void *userdata, SandboxRow *row) {
        ListCtx *c = userdata;
        json_t *j = row_json(c->m, row);
        if (!j || json_array_append_new(c->arr, j) < 0)
                return -ENOMEM;
        return 0;
}

enum MHD_Result handle_sandbox_list(Req *r) {
        _cleanup_json_ json_t *arr = json_array();
        if (!arr)
                return reply_internal(r);
        ListCtx c = { r->app->manager, arr };
        SandboxError se;
        ApiError e = { 0 };
        if (sandbox_list(r->app->manager, &r->key, list_one, &c, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        json_t *j = json_pack("{s:O}", "sandboxes", arr);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_sandbox_create(Req *r) {
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        ReqLimits lim = { cfg->max_vcpu, cfg->max_memory_mib, cfg->max_disk_mib };
        CreateRequest cr;
        int rc = request_parse_create(r->json, &lim, &cr, &e);
        if (rc < 0)
                return reply_result(r, rc, NULL, &e, 0);
        if ((rc = request_apply_trial_shape(r->key.trial, r->json, &cr, &e)) < 0) {
                create_request_done(&cr);
                return reply_result(r, rc, NULL, &e, 0);
        }
        rc = sandbox_create(r->app->manager, &r->key, &cr, r->rid, &row, &se);
        create_request_done(&cr);
        return reply_row(r, rc, &row, &se, 201);
}

enum MHD_Result handle_sandbox_get(Req *r) {
        SandboxError se;
        SandboxRow row;
        const char *wait_for = req_query(r, "waitFor");
        int rc;
        if (wait_for) {
                /* The published client waits for a state server-side. */
                ApiError e = { 0 };
                const char *state;
                int64_t timeout_ms;
                if (request_parse_wait_for(wait_for, req_query(r, "timeoutSeconds"), &state, &timeout_ms, &e) < 0)
                        return reply_error(r, &e);
                rc = sandbox_wait_state(r->app->manager, &r->key, r->route.sandbox_id, state, timeout_ms, &row, &se);
                return reply_row(r, rc, &row, &se, 200);
        }
        rc = sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_delete(Req *r) {
        SandboxError se;
        ApiError e = { 0 };
        if (sandbox_delete(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        json_t *j = json_pack("{s:s,s:s}", "id", r->route.sandbox_id, "state", "deleted");
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_sandbox_stop(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        if (json_object_size(r->json) > 0) {
                api_error(&e, 400, "invalid_request", NULL, "unknown field %.64s",
                          json_object_iter_key(json_object_iter(r->json)));
                return reply_error(r, &e);
        }
        int rc = sandbox_stop(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_extend(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        int64_t seconds;
        if (request_parse_extend(r->json, &seconds, &e) < 0)
                return reply_result(r, -EINVAL, NULL, &e, 0);
        int rc = sandbox_extend(r->app->manager, &r->key, r->route.sandbox_id, seconds, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_network(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        _cleanup_json_ json_t *net = NULL;
        if (request_parse_network(r->json, "network", &net, &e) < 0)
                return reply_result(r, -EINVAL, NULL, &e, 0);
        int rc = sandbox_set_network(r->app->manager, &r->key, r->route.sandbox_id, net, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

/* The lifecycle's transitions (docs/lifecycle.md): each answers the sandbox as
 * the transition left it, once it is done. */
enum MHD_Result handle_sandbox_pause(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        if (request_parse_no_fields(r->json, &e) < 0)
                return reply_error(r, &e);
        int rc = sandbox_pause(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_wake(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        int64_t timeout_seconds = 0;
        if (request_parse_wake(r->json, &timeout_seconds, &e) < 0)
                return reply_error(r, &e);
        int rc = sandbox_wake(r->app->manager, &r->key, r->route.sandbox_id, timeout_seconds, r->rid, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_restart(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        if (request_parse_no_fields(r->json, &e) < 0)
                return reply_error(r, &e);
        int rc = sandbox_restart(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_network_get(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        int rc = sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se);
        if (rc < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        _cleanup_json_ json_t *spec = json_loads(row.spec, 0, NULL);
        sandbox_row_done(&row);
        json_t *net = spec ? json_object_get(spec, "network") : NULL;
        if (!net)
                return reply_internal(r);
        return reply_json(r, 200, json_incref(net));
}
