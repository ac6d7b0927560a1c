#pragma once
/* The sandboxes' resource readings (docs/api.md, "Metrics"): every live
 * sandbox of a host read by its maintenance thread every interval (the
 * driver's cgroup for CPU time and memory, its writable layer for disk, the
 * egress proxy's counts for the network), kept in the store, so that any
 * host answers for any sandbox, during its life and after it, until the
 * retention drops them; shown in steps of a range. A round the store
 * refuses is logged and counted, never retried. */
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store_samples.h"

#define SAMPLES_INTERVAL_SECONDS_DEFAULT 60
#define SAMPLES_INTERVAL_SECONDS_MAX 3600
#define SAMPLES_RETENTION_DAYS_DEFAULT 7
/* Steps a range is shown in at most; the step is never shorter than the
 * interval between readings. */
#define SAMPLES_STEPS_MAX 300
/* Sandboxes of one host with a series of their own on /metrics, at most. */
#define SAMPLES_SERIES_MAX 256

typedef struct Samples Samples;

/* The epoch this host registered at: the store's writes of samples are made
 * only while the host is still registered at it and not declared dead. */
int samples_set_epoch(Samples *s, const char *host_id, int64_t epoch);

int samples_open(const StoreBackend *b, const char *location, Samples **ret);
void samples_close(Samples *s);

/* Keeps one round's readings in one write. NULL s: nothing. */
int samples_append(Samples *s, const SampleRecord *rec, size_t n);
int samples_series(Samples *s, const char *sandbox_id, int64_t since, int64_t step, StoreSampleFn fn,
                   void *userdata);
int samples_latest(Samples *s, const char *sandbox_id, StoreSampleFn fn, void *userdata);
/* The readings of the owner's sandboxes after `after` and at `until` or
 * before, oldest first, at most limit. */
int samples_readings(Samples *s, const char *owner, int64_t after, int64_t until, unsigned limit, StoreReadingFn fn,
                     void *userdata);
/* Drops what is older than days; how many went. */
int samples_prune(Samples *s, int64_t days, int64_t *ret_n);
/* Rounds the store refused since the start. */
uint64_t samples_dropped(void);

/* A range's name (15m, 1h, 6h, 24h, 7d, 30d) in seconds; 0 for any other. */
int64_t samples_range_seconds(const char *name);
/* The step a range of range_s seconds is shown in, with a reading every
 * interval_s seconds: at least the interval, at most SAMPLES_STEPS_MAX
 * steps. */
int64_t samples_step(int64_t range_s, int64_t interval_s);
