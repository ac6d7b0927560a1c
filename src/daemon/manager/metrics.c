#include "daemon/manager/metrics.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_uint_fast64_t created_total;
static atomic_uint_fast64_t execs_total;
/* Exec durations: upper bounds in milliseconds, then +Inf. */
static const unsigned exec_buckets_ms[] = { 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000 };
#define N_BUCKETS (sizeof(exec_buckets_ms) / sizeof(exec_buckets_ms[0]))
static atomic_uint_fast64_t exec_bucket_counts[N_BUCKETS + 1];
static atomic_uint_fast64_t exec_sum_ms;
/* HTTP status codes 100..599 */
static atomic_uint_fast64_t http_by_status[600];

void metrics_sandbox_created(void) {
        atomic_fetch_add(&created_total, 1);
}

void metrics_exec_done(uint64_t duration_ms) {
        atomic_fetch_add(&execs_total, 1);
        atomic_fetch_add(&exec_sum_ms, duration_ms);
        size_t i = 0;
        while (i < N_BUCKETS && duration_ms > exec_buckets_ms[i])
                i++;
        atomic_fetch_add(&exec_bucket_counts[i], 1);
}

void metrics_http_response(unsigned status) {
        if (status < 600)
                atomic_fetch_add(&http_by_status[status], 1);
}

typedef struct Out {
        FILE *f;
} Out;

static void state_count(void *userdata, SandboxState st, int64_t n) {
        const char *state = sandbox_state_name(st);
        Out *o = userdata;
        if (state)
                fprintf(o->f, "runtime_sandboxes{state=\"%s\"} %lld\n", state, (long long)n);
}

/* The gauge of sandboxes by state, its API states shown even at zero;
 * counts(fn) calls fn for each state and its number. */
static void write_state_gauge(FILE *f, void (*counts)(void *userdata, StoreStateCountFn fn, void *out),
                              void *userdata) {
        fputs("# HELP runtime_sandboxes Sandboxes that are not deleted, by state.\n"
              "# TYPE runtime_sandboxes gauge\n", f);
        static const char *const states[] = { "running", "stopped", "failed" };
        char *tmp = NULL;
        size_t tmp_len = 0;
        FILE *tf = open_memstream(&tmp, &tmp_len);
        if (tf) {
                Out t = { tf };
                counts(userdata, state_count, &t);
                fclose(tf);
        }
        for (size_t i = 0; i < 3; i++) {
                char needle[64];
                snprintf(needle, sizeof(needle), "{state=\"%s\"}", states[i]);
                if (!tmp || !strstr(tmp, needle))
                        fprintf(f, "runtime_sandboxes%s 0\n", needle);
        }
        if (tmp)
                fputs(tmp, f);
        free(tmp);
}

static void db_counts(void *userdata, StoreStateCountFn fn, void *out) {
        db_sandbox_state_counts(userdata, fn, out);
}

static void given_counts(void *userdata, StoreStateCountFn fn, void *out) {
        const MetricsStates *m = userdata;
        for (size_t i = 0; i < _SANDBOX_STATE_MAX; i++)
                if (m->seen[i])
                        fn(out, (SandboxState)i, m->count[i]);
}

char *metrics_render_owner(const MetricsStates *states, MetricsExtra extra, void *userdata) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
                return NULL;
        write_state_gauge(f, given_counts, (void *)states);
        if (extra)
                extra(userdata, f);
        if (fclose(f) != 0) {
                free(buf);
                return NULL;
        }
        return buf;
}

char *metrics_render(Db *db, MetricsExtra extra, void *userdata) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
                return NULL;
        write_state_gauge(f, db_counts, db);
        fprintf(f, "# HELP runtime_sandboxes_created_total Sandboxes created.\n"
                   "# TYPE runtime_sandboxes_created_total counter\n"
                   "runtime_sandboxes_created_total %llu\n",
                (unsigned long long)atomic_load(&created_total));
        fprintf(f, "# HELP runtime_execs_total Commands run.\n"
                   "# TYPE runtime_execs_total counter\n"
                   "runtime_execs_total %llu\n",
                (unsigned long long)atomic_load(&execs_total));
        fputs("# HELP runtime_exec_duration_seconds Duration of commands.\n"
              "# TYPE runtime_exec_duration_seconds histogram\n", f);
        uint64_t cum = 0;
        for (size_t i = 0; i < N_BUCKETS; i++) {
                cum += atomic_load(&exec_bucket_counts[i]);
                fprintf(f, "runtime_exec_duration_seconds_bucket{le=\"%g\"} %llu\n", exec_buckets_ms[i] / 1000.0,
                        (unsigned long long)cum);
        }
        cum += atomic_load(&exec_bucket_counts[N_BUCKETS]);
        fprintf(f, "runtime_exec_duration_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
        fprintf(f, "runtime_exec_duration_seconds_sum %.3f\n", (double)atomic_load(&exec_sum_ms) / 1000.0);
        fprintf(f, "runtime_exec_duration_seconds_count %llu\n", (unsigned long long)cum);
        fputs("# HELP runtime_http_requests_total HTTP responses, by status code.\n"
              "# TYPE runtime_http_requests_total counter\n", f);
        for (unsigned s = 100; s < 600; s++) {
                uint64_t n = atomic_load(&http_by_status[s]);
                if (n)
                        fprintf(f, "runtime_http_requests_total{code=\"%u\"} %llu\n", s, (unsigned long long)n);
        }
        if (extra)
                extra(userdata, f);
        if (fclose(f) != 0) {
                free(buf);
                return NULL;
        }
        return buf;
}
