#pragma once
/*
 * The audit trail as a backend keeps it (store.h): append-only records of
 * what each key did (a call that changes something, a terminal or a tunnel
 * opened, a refusal of one) and of the fleet's own acts, read newest first by
 * a cursor that is the record's place in the table, and pruned by age.
 * Nothing is ever updated, so nothing carries a version.
 */
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"

#define AUDIT_ID_LEN 24 /* "aud_" and 20 hex digits */

typedef struct AuditRecord {
        char id[AUDIT_ID_LEN + 1];
        const char *owner;
        const char *action;     /* "sandbox.exec", "key.revoke", "host.dead", ... */
        const char *key_id;     /* NULL or "": the daemon's own act */
        const char *method;     /* NULL or "": not a request */
        const char *path;       /* the request's path, bounded; NULL: none */
        const char *sandbox_id; /* where; NULL or "": no sandbox */
        const char *detail;     /* a JSON object's text (a command line, a file's path), or NULL */
        int status;             /* the answer's HTTP status; 0: none */
        const char *client;     /* the client's address; NULL: none */
        const char *request_id; /* NULL: none */
        const char *host_id;    /* "" when none */
        int64_t at;
        int64_t seq; /* set by the store: its place, the cursor */
} AuditRecord;

/* Which records a listing takes: of one owner (NULL: every owner's), of one
 * action or, ending in '.', a group of actions (NULL: any), of one sandbox
 * (NULL: any), older than the cursor `before` (0: the newest). */
typedef struct AuditFilter {
        const char *owner;
        const char *action;
        const char *sandbox_id;
        int64_t before;
        unsigned limit;
} AuditFilter;

/* Called per record of a listing, newest first; the record's strings live
 * until it returns. A negative return stops it and is returned. */
typedef int (*StoreAuditFn)(void *userdata, const AuditRecord *a);

typedef struct StoreAudit StoreAudit;

struct StoreAuditOps {
        int (*open)(const char *location, StoreAudit **ret);
        void (*close)(StoreAudit *h);
        /* Appends the n records of a in one write, all or none (their seq
         * is the store's). -EEXIST for a taken id. */
        /* The host whose writes these are, at the epoch it registered at
         * (a fleet): each write from now on is made only while the host is
         * still registered at it and not declared dead, and is -EOWNERDEAD
         * (or, for a claim, claims nothing), changing nothing, otherwise.
         * Epoch 0: no condition. A backend with one host ignores it. */
        int (*set_writer)(StoreAudit *h, const char *host_id, int64_t epoch);
        int (*append)(StoreAudit *h, const AuditRecord *a, size_t n);
        int (*list)(StoreAudit *h, const AuditFilter *f, StoreAuditFn fn, void *userdata);
        /* Drops the records older than `before` (unix seconds); how many went. */
        int (*prune)(StoreAudit *h, int64_t before, int64_t *ret_n);
};

extern const StoreAuditOps store_sqlite_audit;
extern const StoreAuditOps store_postgres_audit;
