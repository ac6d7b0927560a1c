#pragma once
/* The store's table for sandboxes (and the Idempotency-Key records, which
 * are kept with them): see store.h for what every backend keeps. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/model/sandbox_spec.h"
#include "daemon/store/store.h"

typedef struct StoreSandboxes StoreSandboxes;

/* What a query selects; `scope` narrows it: the owner for OF_OWNER, the
 * host whose drivers run the sandboxes for the others (NULL: every host). */
typedef enum StoreSandboxQuery {
        STORE_SANDBOXES_OF_OWNER,  /* undeleted, of the owner, newest first */
        STORE_SANDBOXES_ACTIVE,    /* undeleted with processes: starting, running, paused or between */
        STORE_SANDBOXES_LEASE_DUE, /* lease over at `now` and still to act on */
        STORE_SANDBOXES_LOST,      /* undeleted and lost */
} StoreSandboxQuery;

/* Calls fn for each row (the row is cleared after the call). A negative
 * return from fn stops the walk and is returned. */
typedef int (*StoreSandboxFn)(void *userdata, SandboxRow *row);
/* For a row that cannot be read: its id and why. */
typedef void (*StoreBadRowFn)(void *userdata, const char *id, int error, const char *why);
typedef void (*StoreStateCountFn)(void *userdata, SandboxState state, int64_t n);

/* The Idempotency-Key records: one table for the JSON routes that take a
 * key. A record belongs to an owner, lives STORE_IDEM_MAX_AGE_SECONDS and an
 * owner keeps at most STORE_IDEM_MAX_PER_OWNER, the newest. */
#define STORE_IDEM_MAX_AGE_SECONDS 86400
#define STORE_IDEM_MAX_PER_OWNER 1000
#define STORE_IDEM_MAX_BODY (64u * 1024u) /* a larger answer is not kept: its retry runs again */
typedef enum StoreIdem {
        STORE_IDEM_CLAIMED,  /* new: the caller runs the request, then finishes the record */
        STORE_IDEM_REPLAY,   /* answered before: *ret_status and *ret_body (malloc'ed) */
        STORE_IDEM_PENDING,  /* the same request is being served now */
        STORE_IDEM_MISMATCH, /* the key was used with another request */
} StoreIdem;


struct StoreSandboxOps {
        int (*open)(const char *location, StoreSandboxes **ret);
        void (*close)(StoreSandboxes *h);
        /* From now on every insert and update through h is made for host
         * host_id at epoch, and only while the hosts table still has that
         * host at that epoch and not declared dead: else -EOWNERDEAD and
         * nothing written. A host declared dead, or whose id registered
         * again since, cannot write over what the fleet decided without it.
         * Until it is called, writes are not conditional. */
        int (*set_writer)(StoreSandboxes *h, const char *host_id, int64_t epoch);
        /* Rows that name no host (written before hosts were kept) become
         * host_id's: the one host that ran them. A store only one host can
         * hold (SQLite's file, under its state directory's lock) gives it
         * every row, snapshots' homes too, whatever id ran them before. */
        int (*adopt)(StoreSandboxes *h, const char *host_id);
        /* Inserts while the number of undeleted sandboxes stays under the
         * limits, atomically: -EUSERS past max_total, -EDQUOT past
         * max_owner, -EEXIST for a taken id. The row is then at version 1.
         * r->host_id is kept as given. */
        int (*insert)(StoreSandboxes *h, SandboxRow *r, unsigned max_total, unsigned max_owner);
        /* Writes the mutable fields (spec, state, failure_reason, times,
         * run_seconds, deleted_at, run_as) if the stored version is still
         * r->version, and bumps r->version; -ESTALE if another write came
         * first, -ENOENT for no such row. */
        int (*update)(StoreSandboxes *h, SandboxRow *r);
        /* Writes an undeleted sandbox's name (NULL: none) and labels (a JSON
         * object's text). These columns no other write touches, so this is
         * not conditional and keeps the version. -ENOENT. */
        int (*set_meta)(StoreSandboxes *h, const char *id, const char *name, const char *labels);
        /* An undeleted sandbox: -ENOENT; -EBADMSG or -EPROTONOSUPPORT when
         * its spec cannot be read. */
        int (*get)(StoreSandboxes *h, const char *id, SandboxRow *ret);
        int (*query)(StoreSandboxes *h, StoreSandboxQuery q, const char *scope, int64_t now, StoreSandboxFn fn,
                     void *userdata);
        /* Number of undeleted sandboxes per state, for metrics. */
        int (*state_counts)(StoreSandboxes *h, StoreStateCountFn fn, void *userdata);
        /* Reads every undeleted row and calls bad for each that cannot be
         * read (a spec of a newer version, a corrupt row); the number of
         * those, or a negative errno. */
        int (*check)(StoreSandboxes *h, StoreBadRowFn bad, void *userdata);
        /* A StoreIdem, or a negative errno; atomic. `hash` is a digest of
         * the request. A new claim names the writer's host (set_writer), so
         * that only that host's pending claims go when it is gone. */
        int (*idem_claim)(StoreSandboxes *h, const char *owner, const char *key, const char *hash, int64_t now,
                          unsigned *ret_status, char **ret_body);
        /* The claimed request's answer: kept for replays when 2xx..4xx (and
         * at most STORE_IDEM_MAX_BODY), else the claim is dropped so that a
         * retry runs again. */
        int (*idem_finish)(StoreSandboxes *h, const char *owner, const char *key, unsigned status,
                           const char *body);
        /* Drops the claims still pending of host_id (and those that name no
         * host): called at its start, when none of its requests can be in
         * flight, and for a host declared dead. */
        int (*idem_drop_pending)(StoreSandboxes *h, const char *host_id);
};

extern const StoreSandboxOps store_sqlite_sandboxes;
extern const StoreSandboxOps store_postgres_sandboxes;
