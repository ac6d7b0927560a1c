#pragma once
/* The daemon's durable state in SQLite (WAL): keys and sandboxes. One
 * connection shared by every thread behind a lock. Times are unix seconds;
 * 0 stands for NULL in the optional ones. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Db Db;

int db_open(const char *path, Db **ret);
void db_close(Db *db);

typedef struct KeyInfo {
        char id[40];
        char name[128];
        char owner[128];
        bool full;
        int64_t daily_limit_micros; /* -1: unlimited */
        bool trial;
} KeyInfo;

int db_key_count(Db *db, int64_t *ret);
int db_key_insert(Db *db, const char *id, const char *name, const char *owner, bool full,
                  const char *hash_hex, bool trial);
/* A key that is not revoked, by hash; -ENOENT. */
int db_key_by_hash(Db *db, const char *hash_hex, KeyInfo *ret);

typedef struct SandboxRow {
        char id[32];
        char *owner;
        char *key_id;
        char *name; /* may be NULL */
        char *labels;
        char *spec;
        char state[16];
        char *failure_reason; /* may be NULL */
        int64_t created_at, started_at, stopped_at, lease_ends_at, run_seconds, deleted_at;
        bool run_as_root; /* requests that name no user run as root, not the sandbox user */
} SandboxRow;

void sandbox_row_done(SandboxRow *r);
/* Inserts while the number of undeleted sandboxes stays under the limits,
 * atomically: -EUSERS past max_total, -EDQUOT past max_owner. */
int db_sandbox_insert(Db *db, const SandboxRow *r, unsigned max_total, unsigned max_owner);
/* Writes the mutable fields: spec, state, failure_reason, started_at,
 * stopped_at, lease_ends_at, run_seconds, deleted_at, run_as. */
int db_sandbox_update(Db *db, const SandboxRow *r);
/* Writes an undeleted sandbox's name (NULL: none) and labels (a JSON object). */
int db_sandbox_set_meta(Db *db, const char *id, const char *name, const char *labels);
/* An undeleted sandbox; -ENOENT. */
int db_sandbox_get(Db *db, const char *id, SandboxRow *ret);

typedef enum DbSandboxQuery {
        DB_SANDBOXES_OF_OWNER,  /* undeleted, of `owner`, newest first */
        DB_SANDBOXES_ACTIVE,    /* undeleted with processes: starting, running, paused or between */
        DB_SANDBOXES_LEASE_DUE, /* lease over at `now` and still to act on */
} DbSandboxQuery;

/* Calls fn for each row (the row is cleared after the call). A negative
 * return from fn stops the walk and is returned. */
typedef int (*DbSandboxFn)(void *userdata, SandboxRow *row);
int db_sandbox_query(Db *db, DbSandboxQuery q, const char *owner, int64_t now, DbSandboxFn fn, void *userdata);
/* Number of undeleted sandboxes per state, for metrics. */
typedef void (*DbStateCountFn)(void *userdata, const char *state, int64_t n);
int db_sandbox_state_counts(Db *db, DbStateCountFn fn, void *userdata);

/* Idempotency-Key records: one table for the JSON routes that take a key
 * (see http.c). A record belongs to an owner, lives DB_IDEM_MAX_AGE_SECONDS
 * and an owner keeps at most DB_IDEM_MAX_PER_OWNER, the newest. */
#define DB_IDEM_MAX_AGE_SECONDS 86400
#define DB_IDEM_MAX_PER_OWNER 1000
#define DB_IDEM_MAX_BODY (64u * 1024u) /* a larger answer is not kept: its retry runs again */
typedef enum DbIdem {
        DB_IDEM_CLAIMED,  /* new: the caller runs the request, then finishes the record */
        DB_IDEM_REPLAY,   /* answered before: *ret_status and *ret_body (malloc'ed) */
        DB_IDEM_PENDING,  /* the same request is being served now */
        DB_IDEM_MISMATCH, /* the key was used with another request */
} DbIdem;
/* A DbIdem, or a negative errno. `hash` is a digest of the request. */
int db_idem_claim(Db *db, const char *owner, const char *key, const char *hash, int64_t now, unsigned *ret_status,
                  char **ret_body);
/* The claimed request's answer: kept for replays when 2xx..4xx (and at most
 * DB_IDEM_MAX_BODY), else the claim is dropped so that a retry runs again. */
int db_idem_finish(Db *db, const char *owner, const char *key, unsigned status, const char *body);
