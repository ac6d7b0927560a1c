#pragma once
/*
 * The snapshots as a backend keeps them (store.h): one record per snapshot,
 * owned by the owner it names. The files a snapshot holds are not the
 * backend's: the snapshot store (snapshot.c) keeps them under its state
 * directory and writes a record only once they are safely in place.
 *
 * A record's name, labels and expiry are the one thing two writers may
 * change at once (two clients' updates), so a record carries a version that
 * the update checks and bumps.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/store/store.h"

#define SNAPSHOT_ID_LEN 24 /* "snp_" + 20 hex digits */
/* The key of a transient snapshot's spec: a fork's working copy, which no
 * client sees. */
#define SNAPSHOT_TRANSIENT "transient"
/* The key of a build's per-step layer's spec (docs/images.md, "Per-step
 * layers"): the daemon's own, which no client sees, gets, changes, deletes or
 * starts from, outside the owner's snapshot bounds and not billed (layers
 * have their own bound). The spec, not the runtime.layer label, says it: a
 * client writes labels, and could hide its own snapshots from the bounds. */
#define SNAPSHOT_LAYER "layer"

typedef struct SnapshotRow {
        char id[SNAPSHOT_ID_LEN + 1];
        char *owner;
        char *key_id;
        char *sandbox_id; /* the source */
        char *name;       /* NULL: none */
        char *labels;     /* JSON object text */
        char *spec;       /* the source's spec (JSON text): shape, image, driver, env, network */
        char mode[16];    /* "disk" or "memory" */
        char state[16];   /* "ready" */
        int64_t size_bytes;
        int64_t created_at;
        int64_t expires_at; /* 0: never */
        uint64_t version;   /* 1 when inserted, bumped by every update */
        char host_id[64];   /* its home: the host whose disk holds its files ("" before hosts) */
        bool layer;         /* a build's layer: SNAPSHOT_LAYER in its spec (the backends read it from there) */
} SnapshotRow;

/* Frees what a row holds (not the row) and zeroes it; NULL is fine. */
static inline void store_snapshot_row_clear(SnapshotRow *r) {
        if (!r)
                return;
        free(r->owner);
        free(r->key_id);
        free(r->sandbox_id);
        free(r->name);
        free(r->labels);
        free(r->spec);
        *r = (SnapshotRow){ 0 };
}

/* What one owner keeps: its snapshots and the sum of their size_bytes,
 * transient ones included, layers not. */
typedef struct StoreSnapshotUsage {
        int64_t count;
        int64_t bytes;
} StoreSnapshotUsage;

/* Whether r fits beside what its owner keeps (u): -EDQUOT when the owner
 * keeps max_per_owner snapshots already, -EFBIG when r's bytes would take
 * the owner's past max_bytes_per_owner, else 0. The backends' inserts check
 * it in the transaction that inserts r. */
static inline int store_snapshot_fits(const StoreSnapshotUsage *u, const SnapshotRow *r,
                                      unsigned max_per_owner, int64_t max_bytes_per_owner) {
        if (u->count >= (int64_t)max_per_owner)
                return -EDQUOT;
        /* Written so that no sum can overflow. */
        int64_t size = r->size_bytes > 0 ? r->size_bytes : 0;
        if (size > max_bytes_per_owner || u->bytes > max_bytes_per_owner - size)
                return -EFBIG;
        return 0;
}

/* An update's version that any current version satisfies. */
#define STORE_SNAPSHOT_ANY_VERSION UINT64_C(0)

/* What an update changes. */
typedef struct StoreSnapshotChange {
        bool set_name;
        const char *name;   /* with set_name; NULL clears it */
        const char *labels; /* NULL: kept */
        int64_t expires_at; /* 0: kept */
} StoreSnapshotChange;

/* Which records a listing shows: owner's that a client may see (never a
 * transient one or a layer), oldest first (created_at, then id), after the cursor. */
typedef struct StoreSnapshotFilter {
        const char *owner;
        const char *sandbox_id; /* NULL: any */
        const char *name;       /* NULL: any */
        int64_t cursor_at;
        const char *cursor_id; /* NULL: from the first */
        unsigned limit;
} StoreSnapshotFilter;

/* The ids the daemon's own upkeep walks, of every owner. */
typedef enum StoreSnapshotIds {
        STORE_SNAPSHOT_IDS_ALL,
        STORE_SNAPSHOT_IDS_TRANSIENT, /* transient ones (a fork's, left by a crash) */
        STORE_SNAPSHOT_IDS_EXPIRED,   /* those whose expiry is past `now` */
} StoreSnapshotIds;

typedef struct StoreSnapshots StoreSnapshots;

struct StoreSnapshotOps {
        /* Opens the snapshots at location, making or migrating their table;
         * -EPROTONOSUPPORT when a newer version wrote it. */
        int (*open)(const char *location, StoreSnapshots **ret);
        void (*close)(StoreSnapshots *h);
        /* Inserts r (its id, owner and the rest; state is not kept) at
         * version 1, atomically with the owner's usage it is checked
         * against (store_snapshot_fits, transient ones included): -EDQUOT
         * when r's owner keeps max_per_owner snapshots already, -EFBIG when
         * r's size_bytes would take the sum of the owner's past
         * max_bytes_per_owner; -EEXIST for a taken id. A layer (r->layer)
         * is not checked: it is outside those bounds. */
        int (*insert)(StoreSnapshots *h, const SnapshotRow *r, unsigned max_per_owner,
                      int64_t max_bytes_per_owner);
        /* The host whose writes these are, at the epoch it registered at
         * (a fleet): each write from now on is made only while the host is
         * still registered at it and not declared dead, and is -EOWNERDEAD,
         * changing nothing, otherwise. Epoch 0: no condition. A backend with
         * one host ignores it. */
        int (*set_writer)(StoreSnapshots *h, const char *host_id, int64_t epoch);
        /* owner's snapshot id: -ENOENT for another owner's, a transient one,
         * a layer or none (not told apart). */
        int (*get)(StoreSnapshots *h, const char *owner, const char *id, SnapshotRow *ret);
        /* Any owner's snapshot id, transient too (the daemon's own upkeep). */
        int (*get_any)(StoreSnapshots *h, const char *id, SnapshotRow *ret);
        /* The records of the filter, an array the caller clears record by
         * record and frees; at most f->limit. */
        int (*list)(StoreSnapshots *h, const StoreSnapshotFilter *f, SnapshotRow **ret, size_t *ret_n);
        /* Applies c to owner's snapshot id (not a transient one or a layer) if its
         * version is still `version` (STORE_SNAPSHOT_ANY_VERSION: any), bumps
         * the version and reads the record back, atomically: -ESTALE when
         * another write came first, -ENOENT. */
        int (*update)(StoreSnapshots *h, const char *owner, const char *id, uint64_t version,
                      const StoreSnapshotChange *c, SnapshotRow *ret);
        /* Deletes owner's (NULL: any owner's) snapshot id, transient ones
         * too. -ENOENT. */
        int (*delete)(StoreSnapshots *h, const char *owner, const char *id);
        /* How many snapshots owner keeps and the sum of their size_bytes,
         * transient ones included, layers not: what insert checks its bounds
         * against. */
        int (*usage)(StoreSnapshots *h, const char *owner, StoreSnapshotUsage *ret);
        /* The ids of which (at `now`, for STORE_SNAPSHOT_IDS_EXPIRED) whose
         * home is host (NULL: any; rows of before hosts count as every
         * host's), at most max: an array of ids the caller frees. */
        int (*ids)(StoreSnapshots *h, StoreSnapshotIds which, const char *host, int64_t now, size_t max,
                   char (**ret)[SNAPSHOT_ID_LEN + 1], size_t *ret_n);
};

/* The SQLite backend's snapshots (sqlite_snapshots.c). */
extern const StoreSnapshotOps store_sqlite_snapshots;
/* The PostgreSQL backend's snapshots (postgres_snapshots.c). */
extern const StoreSnapshotOps store_postgres_snapshots;
