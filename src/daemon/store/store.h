#pragma once
/*
 * The daemon's durable state behind one interface, as the drivers are
 * behind theirs: a backend is a table of tables, one per kind of record.
 * The manager's modules (keys, ledger, uploads, sandboxes, snapshots, the
 * egress control) hold a backend's handle for their kind and call through
 * its table; SQL, and any other way of reaching a database, lives only in
 * this folder (the layout test checks it).
 *
 * What every backend keeps, so that a second one (a server database shared
 * by many hosts) is a new file and not a change to the manager:
 *  - Every record names its owner; what a client drives is scoped by it.
 *  - A record that two writers may change carries a version, bumped by each
 *    write; a conditional write of a version that is no longer current
 *    returns -ESTALE and changes nothing.
 *  - What a table calls atomic (an insert under a count limit, a reservation
 *    against a budget, an idempotency claim) is atomic for every process
 *    that shares the store, by the backend's own means (a transaction),
 *    never by a lock of this process.
 *  - Errors are negative errnos: -ENOENT (no such record), -EEXIST, -ESTALE,
 *    -EDQUOT and -EUSERS (a limit), -ENOSPC, -EBUSY, -EPROTONOSUPPORT (a
 *    newer daemon wrote it), -EIO.
 *  - A backend's open makes or migrates what it needs (versioned, forward
 *    only) and refuses a store written by a newer version.
 */
#include <stdbool.h>
#include <stddef.h>

typedef struct StoreKeyOps StoreKeyOps;
typedef struct StoreLedgerOps StoreLedgerOps;
typedef struct StoreUploadOps StoreUploadOps;
typedef struct StoreSandboxOps StoreSandboxOps;
typedef struct StoreSnapshotOps StoreSnapshotOps;
typedef struct StoreEgressOps StoreEgressOps;
typedef struct StoreHostOps StoreHostOps;
typedef struct StoreEventOps StoreEventOps;
typedef struct StoreWebhookOps StoreWebhookOps;
typedef struct StoreAuditOps StoreAuditOps;
typedef struct StoreSampleOps StoreSampleOps;
typedef struct StoreRequestOps StoreRequestOps;
typedef struct StoreOtelOps StoreOtelOps;
typedef struct StoreLinkOps StoreLinkOps;
typedef struct StorePreviewOps StorePreviewOps;
typedef struct StoreImageOps StoreImageOps;
typedef struct StoreSessionOps StoreSessionOps;
typedef struct StoreVolumeOps StoreVolumeOps;

typedef struct StoreBackend {
        const char *name;
        const StoreKeyOps *keys;
        const StoreLedgerOps *ledger;
        const StoreUploadOps *uploads;
        const StoreSandboxOps *sandboxes; /* with the idempotency records */
        const StoreSnapshotOps *snapshots;
        const StoreEgressOps *egress; /* egress secrets and the egress audit log */
        const StoreHostOps *hosts;    /* the runtimed hosts that registered themselves */
        const StoreEventOps *events;  /* the lifecycle events */
        const StoreWebhookOps *webhooks; /* the owners' webhooks and their deliveries */
        const StoreAuditOps *audit;      /* the audit trail */
        const StoreSampleOps *samples;   /* the sandboxes' resource readings */
        const StoreRequestOps *requests; /* the API answers counted per key and hour */
        const StoreOtelOps *otel;        /* the owners' OpenTelemetry exports */
        const StoreLinkOps *links;       /* the file links' secrets and one-time uses */
        const StorePreviewOps *previews; /* the shared ports of sandboxes */
        const StoreImageOps *images;     /* the images users build and their tags */
        const StoreSessionOps *sessions; /* the sandboxes' sessions (browser tokens) */
        const StoreVolumeOps *volumes;   /* the volumes and their attachments to sandboxes */
} StoreBackend;

/* The SQLite backend: one database file, in WAL mode (store/sqlite_*.c). */
extern const StoreBackend store_sqlite;
/* The PostgreSQL backend: a database many hosts share (store/postgres_*.c);
 * a kind it does not have yet is NULL. */
extern const StoreBackend store_postgres;

/* The backend for a location: a postgresql:// (or postgres://) URL is
 * PostgreSQL, anything else a SQLite file's path. */
const StoreBackend *store_backend_for(const char *location);
/* The kinds backend b lacks, comma-separated, in buf; false when it has
 * every one. */
bool store_backend_missing(const StoreBackend *b, char *buf, size_t n);
/* A condition that column is none of n values bound as parameters from
 * number first on, in the backend's placeholder style (mark '?' for
 * SQLite's ?N, '$' for PostgreSQL's $N): " AND column NOT IN (?3, ?4)",
 * or "" when n is 0. false when it does not fit in size. */
bool store_not_in(char *buf, size_t size, const char *column, char mark, int first, size_t n);
