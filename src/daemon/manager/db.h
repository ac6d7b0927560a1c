#pragma once
/* The manager's handle on the sandboxes' records (and the Idempotency-Key
 * records): the store's sandboxes table (store/store_sandboxes.h) of one backend, behind the
 * names the daemon calls. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/model/sandbox_spec.h"
#include "daemon/store/store_sandboxes.h"

typedef struct Db Db;

int db_open(const StoreBackend *b, const char *location, Db **ret);
void db_close(Db *db);

/* See StoreSandboxOps for each one's contract. */
int db_sandbox_insert(Db *db, SandboxRow *r, unsigned max_total, unsigned max_owner);
int db_sandbox_update(Db *db, SandboxRow *r);
int db_sandbox_set_meta(Db *db, const char *id, const char *name, const char *labels);
int db_sandbox_get(Db *db, const char *id, SandboxRow *ret);
int db_sandbox_query(Db *db, StoreSandboxQuery q, const char *scope, int64_t now, StoreSandboxFn fn,
                     void *userdata);
int db_set_writer(Db *db, const char *host_id, int64_t epoch);
int db_adopt(Db *db, const char *host_id);
int db_sandbox_state_counts(Db *db, StoreStateCountFn fn, void *userdata);
/* Every undeleted row that cannot be read is logged by id; their number,
 * or a negative errno. The daemon refuses to start when there is one. */
int db_sandbox_check(Db *db);

int db_idem_claim(Db *db, const char *owner, const char *key, const char *hash, int64_t now, unsigned *ret_status,
                  char **ret_body);
int db_idem_finish(Db *db, const char *owner, const char *key, unsigned status, const char *body);
/* At a host's start, or for a host declared dead: a claim it left pending
 * belongs to a request of a daemon that is gone. */
int db_idem_drop_pending(Db *db, const char *host_id);
