/* GET /v1/hosts: the hosts that share this daemon's store, the admin key's
 * view of the fleet. */
#include "daemon/api/api_hosts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"

/* A comma-separated list as a JSON array of its non-empty names. */
static json_t *names_json(const char *list) {
        json_t *arr = json_array();
        for (const char *p = list; arr && p && *p;) {
                size_t n = strcspn(p, ",");
                if (n > 0 && json_array_append_new(arr, json_stringn(p, n)) < 0) {
                        json_decref(arr);
                        return NULL;
                }
                p += n + (p[n] == ',');
        }
        return arr;
}

static json_t *host_json(const HostRecord *h, const char *self) {
        json_t *drivers = names_json(h->drivers);
        if (!drivers)
                return NULL;
        return json_pack("{s:s,s:s,s:o,s:s,s:I,s:I,s:I,s:o,s:o,s:s,s:o,s:{s:I,s:I,s:I},s:b}", "id", h->id, "url",
                         h->url, "drivers", drivers, "version", h->version, "vcpu", (json_int_t)h->vcpu, "memoryMiB",
                         (json_int_t)h->memory_mib, "epoch", (json_int_t)h->epoch, "startedAt",
                         json_time_or_null(h->started_at), "heartbeatAt", json_time_or_null(h->heartbeat_at),
                         "state", host_state_name(h->state), "deadAt", json_time_or_null(h->dead_at), "used",
                         "vcpu", (json_int_t)h->used.vcpu, "memoryMiB", (json_int_t)h->used.memory_mib, "sandboxes",
                         (json_int_t)h->used.sandboxes, "self", self && strcmp(self, h->id) == 0);
}

enum MHD_Result handle_hosts(Req *r) {
        const App *app = r->app;
        HostRecord *list = NULL;
        size_t n = 0;
        int rc = app->host_ops->list(app->hosts, &list, &n);
        if (rc < 0)
                return api_reply_store_error(r, rc, "list the hosts");
        const char *self = app->fleet ? fleet_host_id(app->fleet) : NULL;
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < n; i++)
                if (json_array_append_new(arr, host_json(&list[i], self)) < 0) {
                        json_decref(arr);
                        arr = NULL;
                }
        for (size_t i = 0; i < n; i++)
                store_host_record_clear(&list[i]);
        free(list);
        json_t *j = arr ? json_pack("{s:o}", "hosts", arr) : NULL;
        if (!j)
                return reply_internal(r);
        return reply_json(r, 200, j);
}

/* POST /v1/hosts/{host}:drain and :undrain. A draining host takes no new
 * sandboxes (a create sent to it goes elsewhere, or is refused with
 * no_capacity when no host has room); its own keep running. */
enum MHD_Result handle_host_drain(Req *r) {
        const App *app = r->app;
        bool drain = r->route.kind == ROUTE_HOST_DRAIN;
        int rc = app->host_ops->set_draining(app->hosts, r->route.host_id, drain);
        ApiError e;
        if (rc == -ENOENT) {
                api_error(&e, 404, "not_found", "list the hosts with GET /v1/hosts", "no host %s", r->route.host_id);
                return reply_error(r, &e);
        }
        if (rc == -ESTALE) {
                api_error(&e, 409, "conflict", "a dead host is live again when it registers",
                          "host %s is dead", r->route.host_id);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return api_reply_store_error(r, rc, drain ? "drain the host" : "undrain the host");
        if (app->fleet)
                (void)fleet_refresh(app->fleet);
        log_info(r->rid, "host %s %s by key %s", r->route.host_id, drain ? "drained" : "undrained", r->key.id);
        HostRecord *list = NULL;
        size_t n = 0;
        if ((rc = app->host_ops->list(app->hosts, &list, &n)) < 0)
                return api_reply_store_error(r, rc, "list the hosts");
        json_t *j = NULL;
        for (size_t i = 0; i < n; i++) {
                if (!j && strcmp(list[i].id, r->route.host_id) == 0)
                        j = host_json(&list[i], app->fleet ? fleet_host_id(app->fleet) : NULL);
                store_host_record_clear(&list[i]);
        }
        free(list);
        if (!j)
                return reply_internal(r);
        return reply_json(r, 200, j);
}
