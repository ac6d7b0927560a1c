#include "daemon/keys.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/auth.h"
#include "daemon/ledger.h"
#include "common/log.h"
#include "daemon/store/sqldb.h"

struct KeyStore {
        sqlite3 *sql;
        pthread_mutex_t lock;
};

int keystore_open(const char *db_path, KeyStore **ret) {
        sqlite3 *sql = NULL;
        int r = sqldb_open(db_path, &sql);
        if (r < 0)
                return r;
        KeyStore *k = calloc(1, sizeof(*k));
        if (!k) {
                sqlite3_close(sql);
                return -ENOMEM;
        }
        k->sql = sql;
        pthread_mutex_init(&k->lock, NULL);
        *ret = k;
        return 0;
}

void keystore_close(KeyStore *k) {
        if (!k)
                return;
        sqlite3_close(k->sql);
        pthread_mutex_destroy(&k->lock);
        free(k);
}

bool keys_is_admin(const KeyInfo *k) {
        /* A limited key of the admin owner is no admin: it could otherwise
         * mint an unlimited key for itself. */
        return k->full && !k->trial && k->daily_limit_micros < 0 && strcmp(k->owner, KEYS_ADMIN_OWNER) == 0;
}

bool keys_owner_ok(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > KEYS_MAX_OWNER)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && (c == '-' || c == '_'));
                if (!ok)
                        return false;
        }
        return true;
}

void keystore_record_done(KeyRecord *k) {
        if (!k)
                return;
        free(k->id);
        free(k->name);
        free(k->owner);
        *k = (KeyRecord){ 0 };
}

void keystore_records_free(KeyRecord *list, size_t n) {
        for (size_t i = 0; list && i < n; i++)
                keystore_record_done(&list[i]);
        free(list);
}

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
                .full = strcmp(access, "full") == 0,
                .daily_limit_micros = sqlite3_column_type(st, 4) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 4),
                .trial = sqlite3_column_int(st, 5) != 0,
                .created_at = sqlite3_column_int64(st, 6),
                .revoked_at = sqlite3_column_int64(st, 7),
        };
        if (!k.id || !k.name || !k.owner) {
                keystore_record_done(&k);
                return -ENOMEM;
        }
        *ret = k;
        return 0;
}

#define KEY_COLUMNS "id, name, owner, access, daily_limit_micros, trial, created_at, revoked_at"

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

int keystore_create(KeyStore *ks, const char *name, const char *owner, bool full, int64_t daily_limit_micros,
                    bool trial, unsigned max_trial, char ret_secret[64], KeyRecord *ret) {
        char secret[AUTH_KEY_LEN + 1], hash[AUTH_HASH_HEX_LEN + 1], idhex[17], id[24];
        int r;
        if ((r = auth_generate_key(secret)) < 0 || (r = auth_hash_key(secret, hash)) < 0 ||
            (r = random_hex(idhex, 8)) < 0)
                return r;
        snprintf(id, sizeof(id), "key_%s", idhex);
        KeyRecord made = { 0 };
        LOCKED(ks);
        if ((r = sqldb_exec(ks->sql, "BEGIN IMMEDIATE")) < 0)
                return r;
        int64_t n = trial ? count(ks->sql, "SELECT count(*) FROM keys WHERE trial = 1", NULL)
                          : count(ks->sql, "SELECT count(*) FROM keys WHERE owner = ?1 AND revoked_at IS NULL", owner);
        if (n < 0) {
                r = (int)n;
                goto rollback;
        }
        if (trial && n >= (int64_t)max_trial) {
                r = -EUSERS;
                goto rollback;
        }
        if (!trial && n >= KEYS_MAX_PER_OWNER) {
                r = -EDQUOT;
                goto rollback;
        }
        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(ks->sql,
                                       "INSERT INTO keys (id, name, owner, access, hash, daily_limit_micros, trial, "
                                       "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                       -1, &st, NULL) != SQLITE_OK) {
                        r = -EIO;
                        goto rollback;
                }
                sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 3, owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 4, full ? "full" : "read", -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 5, hash, -1, SQLITE_STATIC);
                if (daily_limit_micros >= 0)
                        sqlite3_bind_int64(st, 6, daily_limit_micros);
                else
                        sqlite3_bind_null(st, 6);
                sqlite3_bind_int(st, 7, trial);
                sqlite3_bind_int64(st, 8, time_now_unix());
                if (sqlite3_step(st) != SQLITE_DONE) {
                        r = -EIO;
                        goto rollback;
                }
        }
        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(ks->sql, "SELECT " KEY_COLUMNS " FROM keys WHERE id = ?", -1, &st, NULL) !=
                            SQLITE_OK ||
                    (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), sqlite3_step(st)) != SQLITE_ROW) {
                        r = -EIO;
                        goto rollback;
                }
                if ((r = key_row_read(st, &made)) < 0)
                        goto rollback;
        }
        if ((r = sqldb_exec(ks->sql, "COMMIT")) < 0)
                goto rollback;
        snprintf(ret_secret, 64, "%s", secret);
        explicit_bzero(secret, sizeof(secret));
        *ret = made;
        return 0;
rollback:
        sqldb_exec(ks->sql, "ROLLBACK");
        keystore_record_done(&made);
        explicit_bzero(secret, sizeof(secret));
        return r;
}

int keystore_list(KeyStore *ks, const char *owner, KeyRecord **ret, size_t *ret_n) {
        KeyRecord *list = NULL;
        size_t n = 0, cap = 0;
        int r = 0;
        {
                LOCKED(ks);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                const char *q = owner ? "SELECT " KEY_COLUMNS " FROM keys WHERE owner = ?1 "
                                        "ORDER BY created_at DESC, rowid DESC LIMIT ?2"
                                      : "SELECT " KEY_COLUMNS " FROM keys ORDER BY created_at DESC, rowid DESC LIMIT ?2";
                if (sqlite3_prepare_v2(ks->sql, q, -1, &st, NULL) != SQLITE_OK)
                        return -EIO;
                if (owner)
                        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                sqlite3_bind_int(st, 2, KEYS_MAX_LISTED);
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
                keystore_records_free(list, n);
                return r;
        }
        *ret = list;
        *ret_n = n;
        return 0;
}

int keystore_revoke(KeyStore *ks, const char *id, const char *owner, int64_t now) {
        LOCKED(ks);
        int r = sqldb_exec(ks->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(ks->sql,
                               "SELECT owner, access FROM keys WHERE id = ?1 AND revoked_at IS NULL "
                               "AND (?2 IS NULL OR owner = ?2)",
                               -1, &st, NULL) != SQLITE_OK) {
                r = -EIO;
                goto rollback;
        }
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        if (owner)
                sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        else
                sqlite3_bind_null(st, 2);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) {
                r = -ENOENT;
                goto rollback;
        }
        if (rc != SQLITE_ROW) {
                r = -EIO;
                goto rollback;
        }
        /* Never lock the installation out: the admin owner keeps a full key. */
        if (strcmp((const char *)sqlite3_column_text(st, 0), KEYS_ADMIN_OWNER) == 0 &&
            strcmp((const char *)sqlite3_column_text(st, 1), "full") == 0 &&
            count(ks->sql,
                  "SELECT count(*) FROM keys WHERE owner = ?1 AND access = 'full' AND trial = 0 AND revoked_at IS NULL",
                  KEYS_ADMIN_OWNER) <= 1) {
                r = -EBUSY;
                goto rollback;
        }
        {
                _cleanup_stmt_ sqlite3_stmt *up = NULL;
                if (sqlite3_prepare_v2(ks->sql, "UPDATE keys SET revoked_at = ?2 WHERE id = ?1", -1, &up, NULL) !=
                    SQLITE_OK) {
                        r = -EIO;
                        goto rollback;
                }
                sqlite3_bind_text(up, 1, id, -1, SQLITE_STATIC);
                sqlite3_bind_int64(up, 2, now);
                if (sqlite3_step(up) != SQLITE_DONE) {
                        r = -EIO;
                        goto rollback;
                }
        }
        if ((r = sqldb_exec(ks->sql, "COMMIT")) < 0)
                goto rollback;
        return 0;
rollback:
        sqldb_exec(ks->sql, "ROLLBACK");
        return r;
}
