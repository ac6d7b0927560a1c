/* The keys in SQLite. The table keys is made by the daemon's migrations
 * (sqlite_sandboxes.c's migrations[], which has shipped: a change to it is a
 * migration appended there); this file holds only the statements. */
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/model/auth.h"
#include "daemon/store/sqldb.h"
#include "daemon/store/store_keys.h"

#define KEYS_FOUND_MAX 64

struct StoreKeys {
        sqlite3 *sql;
        pthread_mutex_t lock; /* one transaction at a time on this connection */
        /* by_hash's statement, prepared once (under lock). */
        sqlite3_stmt *by_hash;
        /* The keys found by by_hash lately (under lock), so that a request
         * does not read the table: every request looks its key up, and
         * each read after another connection's write (the audit's, one a
         * request) reads the table's pages again, 90 us of an exec after a
         * quiet spell. Only this daemon writes the keys of its state
         * directory (runtimed.lock), and of its writes only a revoke
         * changes a key that was found: it empties the cache in the same
         * critical section. A miss is never kept: a new key works at once. */
        struct {
                char hash[AUTH_HASH_HEX_LEN + 1];
                KeyInfo key;
        } found[KEYS_FOUND_MAX];
        size_t n_found, next_found;
};

static int sqlite_keys_open(const char *location, StoreKeys **ret) {
        sqlite3 *sql = NULL;
        int r = sqldb_open(location, &sql);
        if (r < 0)
                return r;
        StoreKeys *h = calloc(1, sizeof(*h));
        if (!h) {
                sqlite3_close(sql);
                return -ENOMEM;
        }
        h->sql = sql;
        pthread_mutex_init(&h->lock, NULL);
        *ret = h;
        return 0;
}

static void sqlite_keys_close(StoreKeys *h) {
        if (h)
                sqldb_finalizep(&h->by_hash);
        sqldb_handle_close(h);
}

#define KEY_COLUMNS "id, name, owner, access, daily_limit_micros, trial, created_at, revoked_at, keeps_awake"

/* A row of KEY_COLUMNS. */
static int key_row_read(sqlite3_stmt *st, KeyRecord *ret) {
        const char *id = (const char *)sqlite3_column_text(st, 0), *name = (const char *)sqlite3_column_text(st, 1),
                   *owner = (const char *)sqlite3_column_text(st, 2), *access = (const char *)sqlite3_column_text(st, 3);
        if (!id || !name || !owner || !access)
                return -EIO;
        KeyRecord k = {
                .id = strdup(id),
                .name = strdup(name),
                .owner = strdup(owner),
                .access = strcmp(access, "full") == 0 ? KEY_ACCESS_FULL : KEY_ACCESS_READ,
                .daily_limit_micros = sqlite3_column_type(st, 4) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 4),
                .trial = sqlite3_column_int(st, 5) != 0,
                .created_at = sqlite3_column_int64(st, 6),
                .revoked_at = sqlite3_column_int64(st, 7),
                .keeps_awake = sqlite3_column_int(st, 8) != 0,
        };
        if (!k.id || !k.name || !k.owner) {
                store_key_record_clear(&k);
                return -ENOMEM;
        }
        *ret = k;
        return 0;
}

static int64_t count(sqlite3 *sql, const char *text, const char *arg) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(sql, text, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        if (arg)
                sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_ROW)
                return -EIO;
        return sqlite3_column_int64(st, 0);
}

/* The insert and the read back, inside the transaction. */
static int insert_locked(StoreKeys *h, const StoreKeyNew *k, KeyRecord *ret) {
        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(h->sql,
                                       "INSERT INTO keys (id, name, owner, access, hash, daily_limit_micros, trial, "
                                       "created_at, keeps_awake) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                       -1, &st, NULL) != SQLITE_OK)
                        return -EIO;
                sqlite3_bind_text(st, 1, k->id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, k->name, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 3, k->owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 4, key_access_name(k->access), -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 5, k->hash, -1, SQLITE_STATIC);
                if (k->daily_limit_micros >= 0)
                        sqlite3_bind_int64(st, 6, k->daily_limit_micros);
                else
                        sqlite3_bind_null(st, 6);
                sqlite3_bind_int(st, 7, k->trial);
                sqlite3_bind_int64(st, 8, k->created_at);
                sqlite3_bind_int(st, 9, k->keeps_awake);
                if (sqlite3_step(st) != SQLITE_DONE)
                        return -EIO;
        }
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT " KEY_COLUMNS " FROM keys WHERE id = ?", -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, k->id, -1, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_ROW)
                return -EIO;
        return key_row_read(st, ret);
}

static int sqlite_keys_insert(StoreKeys *h, const StoreKeyNew *k, unsigned max_trial, unsigned max_per_owner,
                       KeyRecord *ret) {
        KeyRecord made = { 0 };
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        int64_t n = k->trial ? count(h->sql, "SELECT count(*) FROM keys WHERE trial = 1", NULL)
                             : count(h->sql, "SELECT count(*) FROM keys WHERE owner = ?1 AND revoked_at IS NULL",
                                     k->owner);
        if (n < 0)
                r = (int)n;
        else if (k->trial && n >= (int64_t)max_trial)
                r = -EUSERS;
        else if (!k->trial && n >= (int64_t)max_per_owner)
                r = -EDQUOT;
        else if ((r = insert_locked(h, k, &made)) == 0)
                r = sqldb_exec(h->sql, "COMMIT");
        if (r < 0) {
                sqldb_exec(h->sql, "ROLLBACK");
                store_key_record_clear(&made);
                return r;
        }
        *ret = made;
        return 0;
}

static int sqlite_keys_list(StoreKeys *h, const char *owner, size_t max, KeyRecord **ret, size_t *ret_n) {
        KeyRecord *list = NULL;
        size_t n = 0, cap = 0;
        int r = 0;
        {
                LOCKED(h);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                const char *q = owner ? "SELECT " KEY_COLUMNS " FROM keys WHERE owner = ?1 "
                                        "ORDER BY created_at DESC, rowid DESC LIMIT ?2"
                                      : "SELECT " KEY_COLUMNS " FROM keys ORDER BY created_at DESC, rowid DESC LIMIT ?2";
                if (sqlite3_prepare_v2(h->sql, q, -1, &st, NULL) != SQLITE_OK)
                        return -EIO;
                if (owner)
                        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
                int rc;
                while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                        if (n == cap) {
                                size_t want = cap ? cap * 2 : 16;
                                KeyRecord *grown = reallocarray(list, want, sizeof(*list));
                                if (!grown) {
                                        r = -ENOMEM;
                                        break;
                                }
                                list = grown;
                                cap = want;
                        }
                        if ((r = key_row_read(st, &list[n])) < 0)
                                break;
                        n++;
                }
                if (r == 0 && rc != SQLITE_DONE)
                        r = -EIO;
        }
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        store_key_record_clear(&list[i]);
                free(list);
                return r;
        }
        *ret = list;
        *ret_n = n;
        return 0;
}

/* The check and the update, inside the transaction. */
static int revoke_locked(StoreKeys *h, const char *id, const char *owner, const char *keep_owner, int64_t now) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT owner, access FROM keys WHERE id = ?1 AND revoked_at IS NULL "
                               "AND (?2 IS NULL OR owner = ?2)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        if (owner)
                sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        else
                sqlite3_bind_null(st, 2);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return -EIO;
        const char *key_owner = (const char *)sqlite3_column_text(st, 0),
                   *access = (const char *)sqlite3_column_text(st, 1);
        if (keep_owner && key_owner && access && strcmp(key_owner, keep_owner) == 0 && strcmp(access, "full") == 0 &&
            count(h->sql,
                  "SELECT count(*) FROM keys WHERE owner = ?1 AND access = 'full' AND trial = 0 AND revoked_at IS NULL",
                  keep_owner) <= 1)
                return -EBUSY;
        _cleanup_stmt_ sqlite3_stmt *up = NULL;
        if (sqlite3_prepare_v2(h->sql, "UPDATE keys SET revoked_at = ?2 WHERE id = ?1", -1, &up, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(up, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(up, 2, now);
        return sqlite3_step(up) == SQLITE_DONE ? 0 : -EIO;
}

static int sqlite_keys_revoke(StoreKeys *h, const char *id, const char *owner, const char *keep_owner, int64_t now) {
        LOCKED(h);
        /* Before the change: no request finds the revoked key from here on. */
        h->n_found = h->next_found = 0;
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        if ((r = revoke_locked(h, id, owner, keep_owner, now)) == 0)
                r = sqldb_exec(h->sql, "COMMIT");
        if (r < 0)
                sqldb_exec(h->sql, "ROLLBACK");
        return r;
}

static int sqlite_keys_count(StoreKeys *db, int64_t *ret) {
        LOCKED(db);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db->sql, "SELECT count(*) FROM keys", -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        if (sqlite3_step(st) != SQLITE_ROW)
                return -EIO;
        *ret = sqlite3_column_int64(st, 0);
        return 0;
}

static void copy_text(char *dst, size_t n, sqlite3_stmt *st, int col) {
        const unsigned char *t = sqlite3_column_text(st, col);
        snprintf(dst, n, "%s", t ? (const char *)t : "");
}

/* The key of hash_hex among those found lately: every entry compared, in
 * constant time, as the table's row is. */
static bool found_get(StoreKeys *db, const char *hash_hex, KeyInfo *ret) {
        bool hit = false;
        for (size_t i = 0; i < db->n_found; i++)
                if (auth_hash_equal(db->found[i].hash, hash_hex)) {
                        *ret = db->found[i].key;
                        hit = true;
                }
        return hit;
}

static void found_put(StoreKeys *db, const char *hash_hex, const KeyInfo *k) {
        size_t i = db->n_found < KEYS_FOUND_MAX ? db->n_found++ : db->next_found++ % KEYS_FOUND_MAX;
        snprintf(db->found[i].hash, sizeof db->found[i].hash, "%s", hash_hex);
        db->found[i].key = *k;
}

static int sqlite_keys_by_hash(StoreKeys *db, const char *hash_hex, KeyInfo *ret) {
        LOCKED(db);
        if (strlen(hash_hex) == AUTH_HASH_HEX_LEN && found_get(db, hash_hex, ret))
                return 0;
        if (!db->by_hash &&
            sqlite3_prepare_v3(db->sql,
                               "SELECT id, name, owner, access, daily_limit_micros, trial, hash, keeps_awake "
                               "FROM keys WHERE hash = ? AND revoked_at IS NULL",
                               -1, SQLITE_PREPARE_PERSISTENT, &db->by_hash, NULL) != SQLITE_OK)
                return -EIO;
        _rewind_stmt_ sqlite3_stmt *st = db->by_hash;
        sqlite3_bind_text(st, 1, hash_hex, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ? sqldb_errno(rc) : -EIO;
        /* The index found it; compare again in constant time so that nothing
         * about the stored hash leaks through timing. */
        const char *stored = (const char *)sqlite3_column_text(st, 6);
        if (!stored || !auth_hash_equal(stored, hash_hex))
                return -ENOENT;
        KeyInfo k = { 0 };
        copy_text(k.id, sizeof(k.id), st, 0);
        copy_text(k.name, sizeof(k.name), st, 1);
        copy_text(k.owner, sizeof(k.owner), st, 2);
        const unsigned char *access = sqlite3_column_text(st, 3);
        k.access = access && strcmp((const char *)access, "full") == 0 ? KEY_ACCESS_FULL : KEY_ACCESS_READ;
        k.daily_limit_micros = sqlite3_column_type(st, 4) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 4);
        k.trial = sqlite3_column_int(st, 5) != 0;
        k.keeps_awake = sqlite3_column_int(st, 7) != 0;
        found_put(db, hash_hex, &k);
        *ret = k;
        return 0;
}

const StoreKeyOps store_sqlite_keys = {
        .count = sqlite_keys_count,
        .by_hash = sqlite_keys_by_hash,
        .open = sqlite_keys_open,
        .close = sqlite_keys_close,
        .insert = sqlite_keys_insert,
        .list = sqlite_keys_list,
        .revoke = sqlite_keys_revoke,
};
