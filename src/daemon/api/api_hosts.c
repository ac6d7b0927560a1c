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

static json_t *host_json(const HostRecord *h, int64_t now) {
        json_t *drivers = names_json(h->drivers);
        if (!drivers)
                return NULL;
        bool live = now - h->heartbeat_at <= HOSTS_DEAD_AFTER_SECONDS;
        return json_pack("{s:s,s:s,s:o,s:s,s:I,s:I,s:I,s:o,s:o,s:s}", "id", h->id, "url", h->url, "drivers", drivers,
                         "version", h->version, "vcpu", (json_int_t)h->vcpu, "memoryMiB", (json_int_t)h->memory_mib,
                         "epoch", (json_int_t)h->epoch, "startedAt", json_time_or_null(h->started_at),
                         "heartbeatAt", json_time_or_null(h->heartbeat_at), "state", live ? "live" : "dead");
}

enum MHD_Result handle_hosts(Req *r) {
        const App *app = r->app;
        HostRecord *list = NULL;
        size_t n = 0;
        int rc = app->host_ops->list(app->hosts, &list, &n);
        if (rc < 0) {
                ApiError e;
                log_error(r->rid, "listing the hosts: %s", strerror(-rc));
                if (rc == -ENOTCONN || rc == -ETIMEDOUT || rc == -EBUSY)
                        api_error(&e, 503, "unavailable", "try again", "the store did not answer");
                else
                        api_error(&e, 500, "internal", "the daemon's log has details", "could not list the hosts");
                return reply_error(r, &e);
        }
        int64_t now = time_now_unix();
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < n; i++)
                if (json_array_append_new(arr, host_json(&list[i], now)) < 0) {
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
