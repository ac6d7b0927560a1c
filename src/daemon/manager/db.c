#include "daemon/manager/db.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

struct Db {
        const StoreSandboxOps *ops;
        StoreSandboxes *h;
};

int db_open(const StoreBackend *b, const char *location, Db **ret) {
        if (!b || !b->sandboxes)
                return -EOPNOTSUPP;
        Db *db = calloc(1, sizeof(*db));
        if (!db)
                return -ENOMEM;
        db->ops = b->sandboxes;
        int r = db->ops->open(location, &db->h);
        if (r < 0) {
                free(db);
                return r;
        }
        *ret = db;
        return 0;
}

void db_close(Db *db) {
        if (!db)
                return;
        db->ops->close(db->h);
        free(db);
}

int db_sandbox_insert(Db *db, SandboxRow *r, unsigned max_total, unsigned max_owner) {
        return db->ops->insert(db->h, r, max_total, max_owner);
}

int db_sandbox_update(Db *db, SandboxRow *r) {
        int rc = db->ops->update(db->h, r);
        if (rc == -ESTALE)
                log_error(NULL, "sandbox %s: another writer changed it first; this change is not kept", r->id);
        return rc;
}

int db_sandbox_set_meta(Db *db, const char *id, const char *name, const char *labels) {
        return db->ops->set_meta(db->h, id, name, labels);
}

int db_sandbox_get(Db *db, const char *id, SandboxRow *ret) {
        return db->ops->get(db->h, id, ret);
}

int db_sandbox_query(Db *db, StoreSandboxQuery q, const char *scope, int64_t now, StoreSandboxFn fn,
                     void *userdata) {
        return db->ops->query(db->h, q, scope, now, fn, userdata);
}

int db_set_writer(Db *db, const char *host_id, int64_t epoch) {
        return db->ops->set_writer(db->h, host_id, epoch);
}

int db_adopt(Db *db, const char *host_id) {
        return db->ops->adopt(db->h, host_id);
}

int db_sandbox_state_counts(Db *db, StoreStateCountFn fn, void *userdata) {
        return db->ops->state_counts(db->h, fn, userdata);
}

static void log_bad_row(void *userdata, const char *id, int error, const char *why) {
        log_error(NULL, "sandbox %s: its stored row cannot be read: %s (%s)", id, why, strerror(-error));
}

int db_sandbox_check(Db *db) {
        return db->ops->check(db->h, log_bad_row, NULL);
}

int db_idem_claim(Db *db, const char *owner, const char *key, const char *hash, int64_t now, unsigned *ret_status,
                  char **ret_body) {
        return db->ops->idem_claim(db->h, owner, key, hash, now, ret_status, ret_body);
}

int db_idem_finish(Db *db, const char *owner, const char *key, unsigned status, const char *body) {
        return db->ops->idem_finish(db->h, owner, key, status, body);
}

int db_idem_drop_pending(Db *db, const char *host_id) {
        return db->ops->idem_drop_pending(db->h, host_id);
}
