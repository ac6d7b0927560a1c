/* GET /healthz, GET /v1/info, GET /metrics. */
#include "daemon/api/api_system.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api/api.h"
#include "daemon/manager/otel.h"
#include "daemon/manager/request_counts.h"
#include "daemon/manager/samples.h"
#include "daemon/manager/metrics.h"
#include "daemon/manager/warm_pool.h"
#include "daemon/manager/webhooks.h"

enum MHD_Result handle_healthz(Req *r) {
        const Driver *d = r->app->cfg->default_driver;
        return reply_json(r, 200, json_pack("{s:s,s:s,s:s?}", "status", "ok", "version", RUNTIME_VERSION,
                                            "defaultDriver", d ? d->name : NULL));
}

static json_t *drivers_json(const DaemonConfig *cfg) {
        json_t *arr = json_array();
        for (unsigned i = 0; arr && i < cfg->n_drivers; i++) {
                const DriverOffer *o = &cfg->drivers[i];
                json_array_append_new(arr, json_pack("{s:s,s:b,s:b,s:s}", "name", o->driver->name, "available",
                                                     o->available && o->offered, "probe", o->available,
                                                     "reason", o->reason));
        }
        return arr;
}

enum MHD_Result handle_info(Req *r) {
        const DaemonConfig *cfg = r->app->cfg;
        const Driver *d = cfg->default_driver;
        json_t *images = api_images_json(cfg);
        json_t *drivers = drivers_json(cfg);
        if (!images || !drivers) {
                json_decref(images);
                json_decref(drivers);
                return reply_internal(r);
        }
        return reply_json(r, 200,
                          json_pack("{s:s,s:s?,s:o,s:o,s:{s:i,s:i,s:i,s:i,s:i,s:I,s:I}}", "version", RUNTIME_VERSION,
                                    "defaultDriver", d ? d->name : NULL, "drivers", drivers, "images", images,
                                    "limits", "maxVcpu", (int)cfg->max_vcpu, "maxMemoryMiB", (int)cfg->max_memory_mib,
                                    "maxDiskMiB", (int)cfg->max_disk_mib, "maxFileMiB", (int)cfg->max_file_mib,
                                    "maxSandboxesPerKey", (int)cfg->max_sandboxes_per_key, "priceVcpuHourMicros",
                                    (json_int_t)cfg->price_vcpu_hour_micros, "priceGibHourMicros",
                                    (json_int_t)cfg->price_gib_hour_micros));
}

/* One of the owner's sandboxes counted under its state. */
static int count_state(void *userdata, SandboxRow *row) {
        MetricsStates *m = userdata;
        if ((size_t)row->state < _SANDBOX_STATE_MAX) {
                m->count[row->state]++;
                m->seen[row->state] = true;
        }
        return 0;
}

/* The admin key sees the daemon's figures; any other key its owner's
 * sandboxes only: another owner's counts and the daemon's traffic are not
 * its to see. */
static void fleet_metrics_extra(void *userdata, FILE *out) {
        fleet_metrics(userdata, out);
        uint64_t delivered, failed, given_up;
        webhooks_counts(&delivered, &failed, &given_up);
        fprintf(out,
                "# HELP runtime_webhook_deliveries_total Webhook deliveries this host made.\n"
                "# TYPE runtime_webhook_deliveries_total counter\nruntime_webhook_deliveries_total %llu\n"
                "# HELP runtime_webhook_attempts_failed_total Webhook delivery attempts of this host that failed.\n"
                "# TYPE runtime_webhook_attempts_failed_total counter\nruntime_webhook_attempts_failed_total %llu\n"
                "# HELP runtime_webhook_deliveries_given_up_total Webhook deliveries this host gave up.\n"
                "# TYPE runtime_webhook_deliveries_given_up_total counter\n"
                "runtime_webhook_deliveries_given_up_total %llu\n",
                (unsigned long long)delivered, (unsigned long long)failed, (unsigned long long)given_up);
}

/* The admin key's extra figures: the fleet's, and every live sandbox's
 * newest reading. */
static void admin_extra(void *userdata, FILE *out) {
        Req *r = userdata;
        fleet_metrics_extra(r->app->fleet, out);
        manager_render_warm_pool(r->app->manager, out);
        manager_render_samples(r->app->manager, NULL, out);
        fprintf(out, "# HELP runtime_sandbox_reading_rounds_dropped_total Rounds of sandbox readings the store "
                     "refused.\n# TYPE runtime_sandbox_reading_rounds_dropped_total counter\n"
                     "runtime_sandbox_reading_rounds_dropped_total %llu\n"
                     "# HELP runtime_requests_uncounted_total API answers left out of the request counts.\n"
                     "# TYPE runtime_requests_uncounted_total counter\nruntime_requests_uncounted_total %llu\n",
                (unsigned long long)samples_dropped(), (unsigned long long)request_counts_lost());
        uint64_t pushes, failed, dropped;
        otel_counts(&pushes, &failed, &dropped);
        fprintf(out, "# HELP runtime_otel_pushes_total OTLP pushes made to the exports' collectors.\n"
                     "# TYPE runtime_otel_pushes_total counter\nruntime_otel_pushes_total %llu\n"
                     "# HELP runtime_otel_push_failures_total OTLP pushes a collector did not take.\n"
                     "# TYPE runtime_otel_push_failures_total counter\nruntime_otel_push_failures_total %llu\n"
                     "# HELP runtime_otel_dropped_total Events and readings too old to push when their turn came.\n"
                     "# TYPE runtime_otel_dropped_total counter\nruntime_otel_dropped_total %llu\n",
                (unsigned long long)pushes, (unsigned long long)failed, (unsigned long long)dropped);
}

/* Another key's: its owner's live sandboxes' newest readings. */
static void owner_extra(void *userdata, FILE *out) {
        Req *r = userdata;
        manager_render_samples(r->app->manager, r->key.owner, out);
}

enum MHD_Result handle_metrics(Req *r) {
        char *text = NULL;
        if (keys_is_admin(&r->key))
                text = metrics_render(r->app->db, admin_extra, r);
        else {
                MetricsStates m = { 0 };
                SandboxError se;
                if (sandbox_list(r->app->manager, &r->key, count_state, &m, &se) == 0)
                        text = metrics_render_owner(&m, owner_extra, r);
        }
        if (!text)
                return reply_internal(r);
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(text);
                return MHD_NO;
        }
        return reply_response(r, 200, resp, "text/plain; version=0.0.4");
}
