#pragma once
/*
 * The sandboxes' resource readings as a backend keeps them (store.h): one
 * record per sandbox per round of its host's sampler (the CPU time it used
 * since its reading before, the memory and disk it holds, the bytes it sent
 * and received through the egress proxy since its reading before), read
 * back taken together in steps of a time range, and pruned by age.
 * Append-only: nothing is updated, so nothing carries a version.
 */
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"

typedef struct SampleRecord {
        const char *sandbox_id;
        const char *owner;
        int64_t at;            /* unix seconds of the reading */
        int64_t interval_ms;   /* wall time since the sandbox's reading before; 0: its first */
        int64_t cpu_ns;        /* CPU time used over interval_ms */
        int64_t memory_bytes;  /* resident memory at the reading */
        int64_t disk_bytes;    /* its writable layer's use at the reading */
        int64_t net_in_bytes;  /* received through the egress proxy over interval_ms */
        int64_t net_out_bytes; /* sent, the same */
} SampleRecord;

/* One step of a series: the readings at [at, at + step) together, time,
 * CPU and network summed, memory and disk their largest; n of them. */
typedef struct SampleStep {
        int64_t at;
        int64_t n;
        int64_t interval_ms, cpu_ns, memory_bytes, disk_bytes, net_in_bytes, net_out_bytes;
} SampleStep;

/* Called per step of a series, oldest first, or for the newest reading
 * (a step of one). A negative return stops it and is returned. */
typedef int (*StoreSampleFn)(void *userdata, const SampleStep *s);
/* Called per reading of a listing; its strings live until it returns. */
typedef int (*StoreReadingFn)(void *userdata, const SampleRecord *r);

typedef struct StoreSamples StoreSamples;

struct StoreSampleOps {
        int (*open)(const char *location, StoreSamples **ret);
        void (*close)(StoreSamples *h);
        /* Appends n readings in one write. */
        /* The host whose writes these are, at the epoch it registered at
         * (a fleet): each write from now on is made only while the host is
         * still registered at it and not declared dead, and is -EOWNERDEAD
         * (or, for a claim, claims nothing), changing nothing, otherwise.
         * Epoch 0: no condition. A backend with one host ignores it. */
        int (*set_writer)(StoreSamples *h, const char *host_id, int64_t epoch);
        int (*append)(StoreSamples *h, const SampleRecord *s, size_t n);
        /* The readings of one sandbox at `since` or later (unix seconds), in
         * steps of `step` seconds (>= 1) counted from the epoch. */
        int (*series)(StoreSamples *h, const char *sandbox_id, int64_t since, int64_t step, StoreSampleFn fn,
                      void *userdata);
        /* The sandbox's newest reading; -ENOENT when it has none. */
        int (*latest)(StoreSamples *h, const char *sandbox_id, StoreSampleFn fn, void *userdata);
        /* The readings of every sandbox of owner taken after `after` and at
         * `until` or before (unix seconds), oldest first, at most limit. */
        int (*readings)(StoreSamples *h, const char *owner, int64_t after, int64_t until, unsigned limit,
                        StoreReadingFn fn, void *userdata);
        /* Drops the readings older than `before` (unix seconds); how many went. */
        int (*prune)(StoreSamples *h, int64_t before, int64_t *ret_n);
};

extern const StoreSampleOps store_sqlite_samples;
extern const StoreSampleOps store_postgres_samples;
