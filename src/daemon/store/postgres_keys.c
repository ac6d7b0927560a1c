/* The keys in PostgreSQL (store_keys.h): the SQLite backend's statements in
 * PostgreSQL's words; each write with its checks is one serializable
 * transaction, run again when another host's write came between. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/auth.h"
#include "daemon/store/pgdb.h"
#include "daemon/store/store_keys.h"

struct StoreKeys {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_keys_open(const char *location, StoreKeys **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_keys_close(StoreKeys *h) {
        pgdb_handle_close(h);
}

#define KEY_COLUMNS "id, name, owner, access, daily_limit_micros, trial, created_at, revoked_at, keeps_awake"

static int key_row_read(const PGresult *res, int i, KeyRecord *ret) {
        const char *id = pgv(res, i, 0), *name = pgv(res, i, 1), *owner = pgv(res, i, 2), *access = pgv(res, i, 3);
        if (!id || !name || !owner || !access)
                return -EIO;
        KeyRecord k = {
                .id = strdup(id),
                .name = strdup(name),
                .owner = strdup(owner),
                .access = strcmp(access, "full") == 0 ? KEY_ACCESS_FULL : KEY_ACCESS_READ,
                .daily_limit_micros = pgnull(res, i, 4) ? -1 : pgi(res, i, 4),
                .trial = pgi(res, i, 5) != 0,
                .created_at = pgi(res, i, 6),
                .revoked_at = pgi(res, i, 7),
                .keeps_awake = pgi(res, i, 8) != 0,
        };
        if (!k.id || !k.name || !k.owner) {
                store_key_record_clear(&k);
                return -ENOMEM;
        }
        *ret = k;
        return 0;
}

static int count_locked(PgConn *c, const char *sql, const char *arg, int64_t *ret) {
        PgParams p = { 0 };
        if (arg)
                pgp_text(&p, arg);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c, sql, arg ? &p : NULL, &res);
        if (r < 0)
                return r;
        *ret = pgi(res, 0, 0);
        return 0;
}

typedef struct Insert {
        const StoreKeyNew *k;
        unsigned max_trial, max_per_owner;
        KeyRecord out;
} Insert;

static int insert_tx(PgConn *c, void *userdata) {
        Insert *a = userdata;
        const StoreKeyNew *k = a->k;
        int64_t n;
        int r = k->trial ? count_locked(c, "SELECT count(*) FROM keys WHERE trial = 1", NULL, &n)
                         : count_locked(c, "SELECT count(*) FROM keys WHERE owner = $1 AND revoked_at IS NULL",
                                        k->owner, &n);
        if (r < 0)
                return r;
        if (k->trial && n >= (int64_t)a->max_trial)
                return -EUSERS;
        if (!k->trial && n >= (int64_t)a->max_per_owner)
                return -EDQUOT;
        PgParams p = { 0 };
        pgp_text(&p, k->id);
        pgp_text(&p, k->name);
        pgp_text(&p, k->owner);
        pgp_text(&p, key_access_name(k->access));
        pgp_text(&p, k->hash);
        if (k->daily_limit_micros >= 0)
                pgp_int(&p, k->daily_limit_micros);
        else
                pgp_text(&p, NULL);
        pgp_int(&p, k->trial);
        pgp_int(&p, k->created_at);
        pgp_int(&p, k->keeps_awake);
        _cleanup_pgres_ PGresult *res = NULL;
        if ((r = pgdb_run_locked(c,
                                 "INSERT INTO keys (id, name, owner, access, hash, daily_limit_micros, trial, "
                                 "created_at, keeps_awake) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
                                 "RETURNING " KEY_COLUMNS,
                                 &p, &res)) < 0)
                return r;
        store_key_record_clear(&a->out);
        return key_row_read(res, 0, &a->out);
}

static int pg_keys_insert(StoreKeys *h, const StoreKeyNew *k, unsigned max_trial, unsigned max_per_owner,
                          KeyRecord *ret) {
        Insert a = { .k = k, .max_trial = max_trial, .max_per_owner = max_per_owner };
        int r = pgdb_transaction(&h->c, insert_tx, &a);
        if (r < 0) {
                store_key_record_clear(&a.out);
                return r;
        }
        *ret = a.out;
        return 0;
}

static int pg_keys_list(StoreKeys *h, const char *owner, size_t max, KeyRecord **ret, size_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_int(&p, (int64_t)max);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT " KEY_COLUMNS " FROM keys WHERE ($1::text IS NULL OR owner = $1) "
                         "ORDER BY created_at DESC, seq DESC LIMIT $2",
                         &p, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        KeyRecord *list = calloc(n > 0 ? (size_t)n : 1, sizeof(*list));
        if (!list)
                return -ENOMEM;
        for (int i = 0; i < n; i++)
                if ((r = key_row_read(res, i, &list[i])) < 0) {
                        for (int j = 0; j < i; j++)
                                store_key_record_clear(&list[j]);
                        free(list);
                        return r;
                }
        *ret = list;
        *ret_n = (size_t)n;
        return 0;
}

typedef struct Revoke {
        const char *id, *owner, *keep_owner;
        int64_t now;
} Revoke;

static int revoke_tx(PgConn *c, void *userdata) {
        const Revoke *a = userdata;
        PgParams p = { 0 };
        pgp_text(&p, a->id);
        pgp_text(&p, a->owner);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c,
                                "SELECT owner, access FROM keys WHERE id = $1 AND revoked_at IS NULL "
                                "AND ($2::text IS NULL OR owner = $2)",
                                &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        const char *key_owner = pgv(res, 0, 0), *access = pgv(res, 0, 1);
        if (a->keep_owner && key_owner && access && strcmp(key_owner, a->keep_owner) == 0 &&
            strcmp(access, "full") == 0) {
                int64_t n;
                if ((r = count_locked(c,
                                      "SELECT count(*) FROM keys WHERE owner = $1 AND access = 'full' AND trial = 0 "
                                      "AND revoked_at IS NULL",
                                      a->keep_owner, &n)) < 0)
                        return r;
                if (n <= 1)
                        return -EBUSY;
        }
        PgParams u = { 0 };
        pgp_text(&u, a->id);
        pgp_int(&u, a->now);
        return pgdb_exec_locked(c, "UPDATE keys SET revoked_at = $2 WHERE id = $1", &u);
}

static int pg_keys_revoke(StoreKeys *h, const char *id, const char *owner, const char *keep_owner, int64_t now) {
        Revoke a = { .id = id, .owner = owner, .keep_owner = keep_owner, .now = now };
        return pgdb_transaction(&h->c, revoke_tx, &a);
}

static int pg_keys_count(StoreKeys *h, int64_t *ret) {
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT count(*) FROM keys", NULL, &res);
        if (r < 0)
                return r;
        *ret = pgi(res, 0, 0);
        return 0;
}

static int pg_keys_by_hash(StoreKeys *h, const char *hash_hex, KeyInfo *ret) {
        PgParams p = { 0 };
        pgp_text(&p, hash_hex);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT id, name, owner, access, daily_limit_micros, trial, hash, keeps_awake "
                         "FROM keys WHERE hash = $1 AND revoked_at IS NULL",
                         &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        /* The index found it; compare again in constant time so that nothing
         * about the stored hash leaks through timing. */
        const char *stored = pgv(res, 0, 6);
        if (!stored || !auth_hash_equal(stored, hash_hex))
                return -ENOENT;
        KeyInfo k = { 0 };
        snprintf(k.id, sizeof(k.id), "%s", pgv(res, 0, 0) ?: "");
        snprintf(k.name, sizeof(k.name), "%s", pgv(res, 0, 1) ?: "");
        snprintf(k.owner, sizeof(k.owner), "%s", pgv(res, 0, 2) ?: "");
        const char *access = pgv(res, 0, 3);
        k.access = access && strcmp(access, "full") == 0 ? KEY_ACCESS_FULL : KEY_ACCESS_READ;
        k.daily_limit_micros = pgnull(res, 0, 4) ? -1 : pgi(res, 0, 4);
        k.trial = pgi(res, 0, 5) != 0;
        k.keeps_awake = pgi(res, 0, 7) != 0;
        *ret = k;
        return 0;
}

const StoreKeyOps store_postgres_keys = {
        .open = pg_keys_open,
        .close = pg_keys_close,
        .insert = pg_keys_insert,
        .list = pg_keys_list,
        .revoke = pg_keys_revoke,
        .count = pg_keys_count,
        .by_hash = pg_keys_by_hash,
};
