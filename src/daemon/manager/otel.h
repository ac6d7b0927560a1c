#pragma once
/*
 * OpenTelemetry export (docs/api.md, "OpenTelemetry"): an owner's events
 * pushed as OTLP logs, and its sandboxes' readings (manager/samples.h) as
 * OTLP metrics, over OTLP/HTTP in OTLP's JSON encoding (protobuf's JSON
 * mapping: no code generator or protobuf library in the daemon for two
 * message types, and every collector takes it), to the endpoint each export
 * names, with the headers that authenticate there (sealed at rest, never
 * shown back).
 *
 * Nothing is queued in memory: an export is a cursor into the store (the
 * last event and the last readings pushed). Every interval a thread of each
 * host claims the exports that are due (a write of the version it read, so
 * two hosts never push one), pushes at most a batch of each signal, and
 * writes the cursor forward with the claim released. A collector that is
 * down holds the cursor; what becomes older than OTEL_MAX_AGE_SECONDS while
 * it waits is skipped and counted as dropped, so nothing grows with an
 * outage but that count. A push is a POST under the webhooks' rules
 * (webhooks_post: public addresses or --webhook-allow-cidr, no redirect, no
 * proxy, a timeout) and never runs on a thread that serves a request but a
 * :flush's.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/store/store.h"
#include "daemon/store/store_otel.h"

#define OTEL_EXPORTS_MAX_PER_OWNER 5
#define OTEL_ENDPOINT_MAX 2048
#define OTEL_HEADERS_MAX 16
#define OTEL_HEADER_BYTES_MAX 4096
#define OTEL_INTERVAL_SECONDS_DEFAULT 10
#define OTEL_INTERVAL_SECONDS_MAX 3600
#define OTEL_BATCH_LOGS 500
#define OTEL_BATCH_READINGS 1000
#define OTEL_MAX_AGE_SECONDS 3600
#define OTEL_CLAIM_SECONDS 60
/* Records younger than this are left for the next push: another host's
 * write of an older one may still be on its way to the store. */
#define OTEL_SETTLE_SECONDS 2

typedef struct Otel Otel;
struct Webhooks;
struct Events;
struct Samples;

typedef struct OtelConfig {
        const StoreBackend *store;
        const char *location;
        const uint8_t *seal_key; /* SEAL_KEY_LEN bytes, copied */
        struct Webhooks *poster; /* webhooks_post */
        struct Events *events;
        struct Samples *samples;
        unsigned interval_seconds; /* 0: the default */
} OtelConfig;

int otel_open(const OtelConfig *c, Otel **ret);
void otel_set_host(Otel *o, const char *host_id);
int otel_start(Otel *o);
void otel_stop(Otel *o);
void otel_close(Otel *o);

/* What a client asks of an export; NULL fields are left as they are (on
 * update) or defaulted (on create: every signal, no headers). */
typedef struct OtelInput {
        const char *endpoint;
        const json_t *headers; /* an object of header names to values */
        const json_t *signals; /* an array: "logs", "metrics" */
        int enabled;           /* -1: as it is */
} OtelInput;

/* Whether in is good; why says what is not (-EINVAL). */
int otel_check_input(Otel *o, const OtelInput *in, bool create, char *why, size_t n);
int otel_create(Otel *o, const char *owner, const OtelInput *in, StoreOtelFn fn, void *userdata);
int otel_get(Otel *o, const char *id, const char *owner, StoreOtelFn fn, void *userdata);
int otel_list(Otel *o, const char *owner, StoreOtelFn fn, void *userdata);
int otel_update(Otel *o, const char *id, const char *owner, const OtelInput *in, StoreOtelFn fn, void *userdata);
int otel_delete(Otel *o, const char *id, const char *owner);
/* Pushes the export now, on this thread, and answers it as it is after:
 * -EBUSY while another push of it is in flight. */
int otel_flush(Otel *o, const char *id, const char *owner, StoreOtelFn fn, void *userdata);
/* The names of an export's headers (never their values), as a JSON array. */
json_t *otel_header_names(Otel *o, const OtelExportRecord *x);
/* Pushes made, pushes that failed, records dropped, since the start. */
void otel_counts(uint64_t *pushes, uint64_t *failed, uint64_t *dropped);
