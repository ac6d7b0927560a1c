/* GET /v1/sandboxes/{sandbox}/metrics?range= (docs/api.md, "Metrics"): the
 * sandbox's CPU, memory, disk and network readings over a range (15m, 1h,
 * 6h, 24h, 7d or 30d; 1h when none is named), in steps, with its newest
 * reading as `latest`: what the published client's sbx.metrics() reads,
 * and its E2B drop-in's get_metrics(). Read from the store, so any host
 * answers it, and a stopped sandbox's readings stay until the retention
 * drops them. */
#include "daemon/api/api_sandbox_metrics.h"

#include <errno.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/manager/samples.h"

typedef struct Series {
        json_t *points;
        json_t *latest;
        unsigned vcpu;
} Series;

/* A step as the client reads it: CPU as a percent of the sandbox's vCPUs
 * and in cores, null where the step has no interval to divide by (a
 * sandbox's first reading alone). */
static json_t *point_json(const SampleStep *s, unsigned vcpu) {
        json_t *pct = json_null(), *cores = json_null();
        if (s->interval_ms > 0) {
                double c = (double)s->cpu_ns / ((double)s->interval_ms * 1e6);
                cores = json_real(c);
                pct = json_real(vcpu ? c * 100.0 / vcpu : c * 100.0);
        }
        return json_pack("{s:o,s:o,s:o,s:I,s:I,s:I,s:I,s:I}", "at", json_time_or_null(s->at), "cpuPercent", pct,
                         "cpuCores", cores, "memoryBytes", (json_int_t)s->memory_bytes, "diskBytes",
                         (json_int_t)s->disk_bytes, "networkInBytes", (json_int_t)s->net_in_bytes, "networkOutBytes",
                         (json_int_t)s->net_out_bytes, "readings", (json_int_t)s->n);
}

static int add_point(void *userdata, const SampleStep *s) {
        Series *q = userdata;
        json_t *j = point_json(s, q->vcpu);
        return j && json_array_append_new(q->points, j) == 0 ? 0 : -ENOMEM;
}

static int set_latest(void *userdata, const SampleStep *s) {
        Series *q = userdata;
        q->latest = point_json(s, q->vcpu);
        return q->latest ? 0 : -ENOMEM;
}

enum MHD_Result handle_sandbox_metrics(Req *r) {
        ApiError e = { 0 };
        Samples *samples = r->app->samples;
        if (!samples) {
                api_error(&e, 501, "not_implemented", NULL, "this daemon keeps no sandbox metrics");
                return reply_error(r, &e);
        }
        const char *range = req_query(r, "range");
        if (!range)
                range = "1h";
        int64_t range_s = samples_range_seconds(range);
        if (!range_s) {
                api_error(&e, 400, "invalid_request", "use 15m, 1h, 6h, 24h, 7d or 30d", "range must be one of "
                          "15m, 1h, 6h, 24h, 7d, 30d");
                return reply_error(r, &e);
        }
        /* Only the owner may read a sandbox's metrics: 404 otherwise. */
        SandboxError se;
        SandboxRow row;
        if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        unsigned vcpu = row.spec.vcpu;
        json_int_t memory = (json_int_t)row.spec.memory_mib << 20, disk = (json_int_t)row.spec.disk_mib << 20;
        sandbox_row_done(&row);

        int64_t interval = r->app->sample_interval_s > 0 ? r->app->sample_interval_s : SAMPLES_INTERVAL_SECONDS_DEFAULT;
        int64_t step = samples_step(range_s, interval);
        Series q = { .points = json_array(), .vcpu = vcpu };
        int rc = q.points ? 0 : -ENOMEM;
        /* From the start of the step the range begins in: every step whole. */
        int64_t since = (time_now_unix() - range_s) / step * step;
        if (rc == 0)
                rc = samples_series(samples, r->route.sandbox_id, since, step, add_point, &q);
        if (rc == 0 && (rc = samples_latest(samples, r->route.sandbox_id, set_latest, &q)) == -ENOENT)
                rc = 0;
        json_t *j = NULL;
        if (rc == 0)
                j = json_pack("{s:s,s:s,s:I,s:I,s:i,s:I,s:I,s:O,s:O}", "sandboxId", r->route.sandbox_id, "range", range,
                              "stepSeconds", (json_int_t)step, "intervalSeconds", (json_int_t)interval, "vcpu",
                              (int)vcpu, "memoryLimitBytes", memory, "diskLimitBytes", disk, "points", q.points,
                              "latest", q.latest ? q.latest : json_null());
        json_decref(q.points);
        json_decref(q.latest);
        if (!j) {
                if (rc < 0 && rc != -ENOMEM)
                        api_error(&e, 503, "unavailable", "try again", "the sandbox's metrics cannot be read now: %s",
                                  strerror(-rc));
                else
                        api_error(&e, 500, "internal", NULL, "out of memory");
                return reply_error(r, &e);
        }
        return reply_json(r, 200, j);
}
