#pragma once
/*
 * The owners' OpenTelemetry exports as a backend keeps them (store.h).
 *
 * An export is an OTLP/HTTP endpoint an owner's events (as logs) and
 * sandbox readings (as metrics) are pushed to, with the headers that
 * authenticate there (sealed: the daemon seals and opens them), and its
 * progress: the last event (its seq) and the last readings (their time)
 * pushed, when the next push is due, and what the last one said. Any host
 * of a fleet may push it: a host claims an export by an update of the
 * version it read (two hosts never both win), for a while (claimed_by,
 * claimed_until), and writes its progress with the claim released. Every
 * write names the version it read: -ESTALE when another came first.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"

#define OTEL_EXPORT_ID_LEN 24 /* "otx_" and 20 hex digits */

typedef struct OtelExportRecord {
        char id[OTEL_EXPORT_ID_LEN + 1];
        const char *owner;
        const char *endpoint; /* the OTLP/HTTP base URL */
        const char *headers;  /* sealed JSON object; NULL or "": none */
        const char *signals;  /* a JSON array: "logs", "metrics" */
        bool enabled;
        int64_t created_at, updated_at;
        int64_t events_after;  /* the seq of the last event pushed */
        int64_t metrics_after; /* the time of the last readings pushed */
        int64_t next_at;       /* when the next push is due */
        const char *claimed_by; /* NULL or "": none */
        int64_t claimed_until;
        int64_t last_push_at;    /* 0: none yet */
        int last_status;         /* the last push's HTTP status; 0: none */
        const char *last_error;  /* NULL or "": none */
        int64_t sent_logs, sent_points, dropped;
        int64_t version; /* set by the store on put (1) and update (+1) */
} OtelExportRecord;

typedef int (*StoreOtelFn)(void *userdata, const OtelExportRecord *x);

typedef struct StoreOtel StoreOtel;

struct StoreOtelOps {
        int (*open)(const char *location, StoreOtel **ret);
        void (*close)(StoreOtel *h);
        /* Adds x (version 1) unless its owner has max_per_owner exports
         * already (-EDQUOT), atomically. -EEXIST for a taken id. */
        int (*put)(StoreOtel *h, const OtelExportRecord *x, unsigned max_per_owner);
        /* The export id, of owner (NULL: anyone's); -ENOENT. */
        int (*get)(StoreOtel *h, const char *id, const char *owner, StoreOtelFn fn, void *userdata);
        /* The exports of owner (NULL: every owner's), oldest first. */
        int (*list)(StoreOtel *h, const char *owner, StoreOtelFn fn, void *userdata);
        /* Writes every field of x but id, owner and created_at if the stored
         * version is x->version: -ESTALE if not, -ENOENT if there is no such
         * export of x->owner. */
        int (*update)(StoreOtel *h, const OtelExportRecord *x);
        /* Removes the export id of owner; -ENOENT. */
        int (*remove)(StoreOtel *h, const char *id, const char *owner);
};

extern const StoreOtelOps store_sqlite_otel;
extern const StoreOtelOps store_postgres_otel;
