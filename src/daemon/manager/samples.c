#include "daemon/manager/samples.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"

struct Samples {
        const StoreSampleOps *ops;
        StoreSamples *h;
};

static atomic_uint_fast64_t dropped;

int samples_open(const StoreBackend *b, const char *location, Samples **ret) {
        if (!b->samples)
                return -EPROTONOSUPPORT;
        Samples *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->ops = b->samples;
        int r = s->ops->open(location, &s->h);
        if (r < 0) {
                free(s);
                return r;
        }
        *ret = s;
        return 0;
}

void samples_close(Samples *s) {
        if (!s)
                return;
        s->ops->close(s->h);
        free(s);
}

uint64_t samples_dropped(void) {
        return atomic_load(&dropped);
}

int samples_append(Samples *s, const SampleRecord *rec, size_t n) {
        if (!s || n == 0)
                return 0;
        int r = s->ops->append(s->h, rec, n);
        if (r < 0) {
                atomic_fetch_add(&dropped, 1);
                log_warn(NULL, "a round of %zu sandbox reading%s not kept: %s", n, n == 1 ? "" : "s", strerror(-r));
        }
        return r;
}

int samples_series(Samples *s, const char *sandbox_id, int64_t since, int64_t step, StoreSampleFn fn,
                   void *userdata) {
        return s->ops->series(s->h, sandbox_id, since, step, fn, userdata);
}

int samples_latest(Samples *s, const char *sandbox_id, StoreSampleFn fn, void *userdata) {
        return s->ops->latest(s->h, sandbox_id, fn, userdata);
}

int samples_readings(Samples *s, const char *owner, int64_t after, int64_t until, unsigned limit, StoreReadingFn fn,
                     void *userdata) {
        return s->ops->readings(s->h, owner, after, until, limit, fn, userdata);
}

int samples_prune(Samples *s, int64_t days, int64_t *ret_n) {
        return s->ops->prune(s->h, time_now_unix() - days * 86400, ret_n);
}

int64_t samples_range_seconds(const char *name) {
        static const struct {
                const char *name;
                int64_t seconds;
        } ranges[] = {
                { "15m", 15 * 60 }, { "1h", 3600 }, { "6h", 6 * 3600 }, { "24h", 86400 }, { "7d", 7 * 86400 },
                { "30d", 30 * 86400 },
        };
        for (size_t i = 0; name && i < ELEMENTSOF(ranges); i++)
                if (strcmp(name, ranges[i].name) == 0)
                        return ranges[i].seconds;
        return 0;
}

int64_t samples_step(int64_t range_s, int64_t interval_s) {
        int64_t step = (range_s + SAMPLES_STEPS_MAX - 1) / SAMPLES_STEPS_MAX;
        if (interval_s < 1)
                interval_s = 1;
        if (step < interval_s)
                step = interval_s;
        /* Whole multiples of the interval: each step holds as many readings. */
        return (step + interval_s - 1) / interval_s * interval_s;
}

int samples_set_epoch(Samples *s, const char *host_id, int64_t epoch) {
        return s->ops->set_writer(s->h, host_id, epoch);
}
