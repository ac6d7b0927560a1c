#include "daemon/keys.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/auth.h"
#include "daemon/handlers.h"
#include "daemon/ledger.h"
#include "daemon/log.h"
#include "common/jsonutil.h"

struct KeyStore {
        sqlite3 *sql;
        pthread_mutex_t lock;
};

static inline void stmt_finalizep(sqlite3_stmt **s) {
        if (*s)
                sqlite3_finalize(*s);
}
#define _cleanup_stmt_ _cleanup_(stmt_finalizep)

static void unlockp(pthread_mutex_t **m) {
        if (*m)
                pthread_mutex_unlock(*m);
}
#define LOCKED(k)                                                                                           \
        pthread_mutex_lock(&(k)->lock);                                                                     \
        __attribute__((cleanup(unlockp), unused)) pthread_mutex_t *_held_ = &(k)->lock

static int exec_sql(sqlite3 *sql, const char *text) {
        int rc = sqlite3_exec(sql, text, NULL, NULL, NULL);
        if (rc == SQLITE_OK)
                return 0;
        return (rc & 0xff) == SQLITE_BUSY ? -EBUSY : -EIO;
}

int keystore_open(const char *db_path, KeyStore **ret) {
        sqlite3 *sql = NULL;
        int rc = sqlite3_open_v2(db_path, &sql, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_NOFOLLOW,
                                 NULL);
        if (rc != SQLITE_OK) {
                sqlite3_close(sql);
                return -EIO;
        }
        sqlite3_busy_timeout(sql, 10000);
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

static json_t *time_json(int64_t t) {
        char buf[RFC3339_LEN];
        if (!t || time_format_rfc3339(t, buf) < 0)
                return json_null();
        return json_string(buf);
}

static json_t *key_row_json(sqlite3_stmt *st) {
        /* id, name, owner, access, daily_limit_micros, trial, created_at, revoked_at */
        return json_pack("{s:s,s:s,s:s,s:s,s:o,s:b,s:o,s:o}", "id", (const char *)sqlite3_column_text(st, 0), "name",
                         (const char *)sqlite3_column_text(st, 1), "owner", (const char *)sqlite3_column_text(st, 2),
                         "access", (const char *)sqlite3_column_text(st, 3), "dailyLimitMicros",
                         sqlite3_column_type(st, 4) == SQLITE_NULL ? json_null()
                                                                   : json_integer(sqlite3_column_int64(st, 4)),
                         "trial", sqlite3_column_int(st, 5) != 0, "createdAt", time_json(sqlite3_column_int64(st, 6)),
                         "revokedAt", time_json(sqlite3_column_int64(st, 7)));
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
                    bool trial, unsigned max_trial, char ret_secret[64], json_t **ret) {
        char secret[AUTH_KEY_LEN + 1], hash[AUTH_HASH_HEX_LEN + 1], idhex[17], id[24];
        int r;
        if ((r = auth_generate_key(secret)) < 0 || (r = auth_hash_key(secret, hash)) < 0 ||
            (r = random_hex(idhex, 8)) < 0)
                return r;
        snprintf(id, sizeof(id), "key_%s", idhex);
        LOCKED(ks);
        if ((r = exec_sql(ks->sql, "BEGIN IMMEDIATE")) < 0)
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
                *ret = key_row_json(st);
        }
        if (!*ret) {
                r = -ENOMEM;
                goto rollback;
        }
        if ((r = exec_sql(ks->sql, "COMMIT")) < 0) {
                json_decref(*ret);
                *ret = NULL;
                goto rollback;
        }
        snprintf(ret_secret, 64, "%s", secret);
        explicit_bzero(secret, sizeof(secret));
        return 0;
rollback:
        exec_sql(ks->sql, "ROLLBACK");
        explicit_bzero(secret, sizeof(secret));
        return r;
}

int keystore_list(KeyStore *ks, const char *owner, json_t **ret) {
        _cleanup_json_ json_t *arr = json_array();
        if (!arr)
                return -ENOMEM;
        LOCKED(ks);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        const char *q = owner ? "SELECT " KEY_COLUMNS " FROM keys WHERE owner = ?1 ORDER BY created_at DESC, rowid DESC "
                                "LIMIT 10000"
                              : "SELECT " KEY_COLUMNS " FROM keys ORDER BY created_at DESC, rowid DESC LIMIT 10000";
        if (sqlite3_prepare_v2(ks->sql, q, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        if (owner)
                sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                json_t *k = key_row_json(st);
                if (!k || json_array_append_new(arr, k) < 0)
                        return -ENOMEM;
        }
        if (rc != SQLITE_DONE)
                return -EIO;
        *ret = json_pack("{s:O}", "keys", arr);
        return *ret ? 0 : -ENOMEM;
}

int keystore_revoke(KeyStore *ks, const char *id, const char *owner, int64_t now, json_t **ret) {
        LOCKED(ks);
        int r = exec_sql(ks->sql, "BEGIN IMMEDIATE");
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
        if ((r = exec_sql(ks->sql, "COMMIT")) < 0)
                goto rollback;
        *ret = json_pack("{s:s,s:b,s:o}", "id", id, "revoked", 1, "revokedAt", time_json(now));
        return *ret ? 0 : -ENOMEM;
rollback:
        exec_sql(ks->sql, "ROLLBACK");
        return r;
}

int keys_apply_trial_shape(const KeyInfo *k, json_t *body, CreateRequest *req, ApiError *e) {
        if (!k->trial)
                return 0;
        const char *hint = "a trial sandbox is small; ask the daemon's administrator for a full key for more";
        if (!json_object_get(body, "memoryMiB"))
                req->memory_mib = KEYS_TRIAL_MEMORY_DEFAULT_MIB;
        if (req->vcpu > KEYS_TRIAL_VCPU_MAX)
                return api_error(e, 400, "invalid_request", hint, "vcpu must be at most %u with a trial key",
                                 KEYS_TRIAL_VCPU_MAX);
        if (req->memory_mib > KEYS_TRIAL_MEMORY_MAX_MIB)
                return api_error(e, 400, "invalid_request", hint, "memoryMiB must be at most %u with a trial key",
                                 KEYS_TRIAL_MEMORY_MAX_MIB);
        return 0;
}

/* ---- routes ---- */

static enum MHD_Result reply_rc(Req *r, int rc, const char *what) {
        ApiError e;
        log_error(r->rid, "%s: %s", what, strerror(-rc));
        api_error(&e, 500, "internal", "the daemon's log has details", "could not %s", what);
        return reply_error(r, &e);
}

static int parse_create(Req *r, json_t *body, char **ret_name, char **ret_owner, bool *ret_full,
                        int64_t *ret_limit, ApiError *e) {
        const KeyInfo *me = &r->key;
        const char *key;
        json_t *v;
        json_object_foreach (body, key, v)
                if (strcmp(key, "name") != 0 && strcmp(key, "access") != 0 && strcmp(key, "dailyLimitMicros") != 0 &&
                    strcmp(key, "owner") != 0)
                        return api_error(e, 400, "invalid_request", "the fields are name, access, dailyLimitMicros, owner",
                                         "unknown field %.64s", key);
        v = json_object_get(body, "name");
        if (!json_is_string(v))
                return api_error(e, 400, "invalid_request", NULL, "name is required: a string of 1 to %d bytes",
                                 KEYS_MAX_NAME);
        const char *name = json_string_value(v);
        size_t len = json_string_length(v);
        if (len == 0 || len > KEYS_MAX_NAME)
                return api_error(e, 400, "invalid_request", NULL, "name must be 1 to %d bytes", KEYS_MAX_NAME);
        for (size_t i = 0; i < len; i++)
                if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
                        return api_error(e, 400, "invalid_request", NULL, "name must be printable");
        bool full = true;
        v = json_object_get(body, "access");
        if (v) {
                if (!json_is_string(v) ||
                    (strcmp(json_string_value(v), "full") != 0 && strcmp(json_string_value(v), "read") != 0))
                        return api_error(e, 400, "invalid_request", NULL, "access must be \"full\" or \"read\"");
                full = strcmp(json_string_value(v), "full") == 0;
        }
        int64_t limit = -1;
        v = json_object_get(body, "dailyLimitMicros");
        if (v && !json_is_null(v)) {
                if (!json_is_integer(v))
                        return api_error(e, 400, "invalid_request", NULL,
                                         "dailyLimitMicros must be an integer (micro-dollars) or null");
                limit = json_integer_value(v);
                if (limit < 0 || limit > KEYS_MAX_DAILY_LIMIT_MICROS)
                        return api_error(e, 400, "invalid_request", NULL, "dailyLimitMicros must be between 0 and %lld",
                                         KEYS_MAX_DAILY_LIMIT_MICROS);
        }
        const char *owner = me->owner;
        v = json_object_get(body, "owner");
        if (v && !json_is_null(v)) {
                if (!json_is_string(v) || !keys_owner_ok(json_string_value(v)))
                        return api_error(e, 400, "invalid_request", NULL,
                                         "owner must match [a-z0-9][a-z0-9_-]* and be at most %d bytes", KEYS_MAX_OWNER);
                owner = json_string_value(v);
        }
        if (me->trial)
                return api_error(e, 403, "forbidden", "ask the daemon's administrator for a full key",
                                 "a trial key cannot make keys");
        if (!keys_is_admin(me)) {
                if (strcmp(owner, me->owner) != 0)
                        return api_error(e, 403, "forbidden", "leave owner out: keys are made for your own owner",
                                         "only an admin key makes keys for another owner");
                if (me->daily_limit_micros >= 0 && full)
                        return api_error(e, 403, "forbidden", "make a read key (\"access\": \"read\"), or ask for a key without a daily limit",
                                         "a key with a daily limit can make read keys only");
        }
        *ret_name = strdup(name);
        *ret_owner = strdup(owner);
        if (!*ret_name || !*ret_owner) {
                free(*ret_name);
                free(*ret_owner);
                return -ENOMEM;
        }
        *ret_full = full;
        *ret_limit = limit;
        return 0;
}

enum MHD_Result handle_keys_create(Req *r, json_t *body) {
        ApiError e = { 0 };
        _cleanup_free_ char *name = NULL, *owner = NULL;
        bool full = false;
        int64_t limit = -1;
        int rc = parse_create(r, body, &name, &owner, &full, &limit, &e);
        if (rc < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        char secret[64];
        json_t *j = NULL;
        rc = keystore_create(r->srv->keys, name, owner, full, limit, false, 0, secret, &j);
        if (rc == -EDQUOT) {
                api_error(&e, 429, "rate_limited", "revoke keys you no longer use", "the owner %s has %d keys already",
                          owner, KEYS_MAX_PER_OWNER);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return reply_rc(r, rc, "make the key");
        json_object_set_new(j, "key", json_string(secret));
        explicit_bzero(secret, sizeof(secret));
        log_info(r->rid, "key %s made for owner %s by %s", json_string_value(json_object_get(j, "id")), owner,
                 r->key.id);
        return reply_json(r, 201, j);
}

enum MHD_Result handle_keys_list(Req *r) {
        json_t *j = NULL;
        int rc = keystore_list(r->srv->keys, keys_is_admin(&r->key) ? NULL : r->key.owner, &j);
        if (rc < 0)
                return reply_rc(r, rc, "list the keys");
        return reply_json(r, 200, j);
}

enum MHD_Result handle_key_revoke(Req *r) {
        ApiError e = { 0 };
        json_t *j = NULL;
        int rc = keystore_revoke(r->srv->keys, r->route.key_id, keys_is_admin(&r->key) ? NULL : r->key.owner,
                                 time_now_unix(), &j);
        if (rc == -ENOENT) {
                api_error(&e, 404, "not_found", "list your keys with GET /v1/keys", "no key %s", r->route.key_id);
                return reply_error(r, &e);
        }
        if (rc == -EBUSY) {
                api_error(&e, 409, "conflict", "make another full admin key first",
                          "key %s is the last full key of the admin owner", r->route.key_id);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return reply_rc(r, rc, "revoke the key");
        log_info(r->rid, "key %s revoked by %s", r->route.key_id, r->key.id);
        return reply_json(r, 200, j);
}

/* Unix seconds, or an RFC 3339 UTC time "2026-11-30T09:00:00Z". */
static int parse_time(const char *s, int64_t *ret) {
        if (!s || !*s || strlen(s) > 32)
                return -EINVAL;
        char *end;
        if (s[0] >= '0' && s[0] <= '9' && !strchr(s, '-')) {
                errno = 0;
                long long v = strtoll(s, &end, 10);
                if (errno || *end || v < 0)
                        return -EINVAL;
                *ret = v;
                return 0;
        }
        struct tm tm = { 0 };
        int n = 0;
        if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2dZ%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                   &tm.tm_sec, &n) != 6 ||
            s[n] != '\0' || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
            tm.tm_min > 59 || tm.tm_sec > 60 || tm.tm_year < 1970)
                return -EINVAL;
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        time_t t = timegm(&tm);
        if (t < 0)
                return -EINVAL;
        *ret = t;
        return 0;
}

/* Far enough for any real window, small enough that nothing overflows. */
#define USAGE_MAX_TIME 253402300799LL /* 9999-12-31T23:59:59Z */

enum MHD_Result handle_usage(Req *r) {
        ApiError e = { 0 };
        int64_t now = time_now_unix(), since = now - LEDGER_WINDOW_SECONDS, until = now;
        const char *s = req_query(r, "since"), *u = req_query(r, "until");
        if (s && (parse_time(s, &since) < 0 || since > USAGE_MAX_TIME)) {
                api_error(&e, 400, "invalid_request", "give since as unix seconds or 2026-11-30T09:00:00Z",
                          "since is not a time");
                return reply_error(r, &e);
        }
        if (u && (parse_time(u, &until) < 0 || until > USAGE_MAX_TIME)) {
                api_error(&e, 400, "invalid_request", "give until as unix seconds or 2026-11-30T09:00:00Z",
                          "until is not a time");
                return reply_error(r, &e);
        }
        if (since >= until) {
                api_error(&e, 400, "invalid_request", NULL, "since must be before until");
                return reply_error(r, &e);
        }
        json_t *j = NULL;
        int rc = ledger_usage(r->srv->ledger, r->key.owner, since, until, now, &j);
        if (rc < 0)
                return reply_rc(r, rc, "read the usage");
        json_object_set_new(j, "since", time_json(since));
        json_object_set_new(j, "until", time_json(until));
        json_object_set_new(j, "owner", json_string(r->key.owner));
        return reply_json(r, 200, j);
}

enum MHD_Result handle_limits(Req *r) {
        const KeyInfo *k = &r->key;
        int64_t now = time_now_unix();
        LedgerKeyUse u;
        int rc = ledger_key_use(r->srv->ledger, k->id, now, &u);
        if (rc < 0)
                return reply_rc(r, rc, "read the key's spending");
        json_t *limit = json_null(), *remaining = json_null();
        if (k->daily_limit_micros >= 0) {
                int64_t left = k->daily_limit_micros - u.used_micros;
                limit = json_integer(k->daily_limit_micros);
                remaining = json_integer(left > 0 ? left : 0);
        }
        json_t *trial = json_null();
        if (k->trial) {
                int64_t allowance = r->srv->cfg->trial_allowance_seconds;
                int64_t left = allowance - u.used_seconds;
                trial = json_pack("{s:I,s:I,s:I}", "sandboxSeconds", (json_int_t)allowance, "usedSandboxSeconds",
                                  (json_int_t)u.used_seconds, "remainingSandboxSeconds", (json_int_t)(left > 0 ? left : 0));
        }
        return reply_json(r, 200,
                          json_pack("{s:s,s:s,s:s,s:b,s:{s:o,s:I,s:o,s:I,s:I,s:i,s:o},s:o}", "access",
                                    k->full ? "full" : "read", "keyId", k->id, "owner", k->owner, "trial", k->trial,
                                    "daily", "limitMicros", limit, "usedMicros", (json_int_t)u.used_micros,
                                    "remainingMicros", remaining, "settledMicros", (json_int_t)u.settled_micros,
                                    "reservedMicros", (json_int_t)u.reserved_micros, "windowSeconds",
                                    LEDGER_WINDOW_SECONDS, "freesAt", time_json(u.frees_at), "trialAllowance",
                                    trial));
}

/* Whether the request came over loopback or the unix socket: a trial key is
 * handed to whoever can reach the daemon from this machine only. */
static bool from_this_host(Req *r) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (!ci || !ci->client_addr)
                return r->srv->cfg->socket_path != NULL;
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_UNIX)
                return true;
        if (sa->sa_family == AF_INET) {
                const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
                return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
        }
        if (sa->sa_family == AF_INET6) {
                const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
                if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
                        return true;
                return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
        }
        return r->srv->cfg->socket_path != NULL;
}

enum MHD_Result handle_trial(Req *r) {
        ApiError e = { 0 };
        const DaemonConfig *cfg = r->srv->cfg;
        if (cfg->max_trial_keys == 0) {
                api_error(&e, 403, "forbidden", "ask the daemon's administrator for a key",
                          "this daemon hands out no trial keys");
                return reply_error(r, &e);
        }
        if (!from_this_host(r)) {
                api_error(&e, 403, "forbidden", "ask the daemon's administrator for a key",
                          "trial keys are handed out on this machine only (loopback or the unix socket)");
                return reply_error(r, &e);
        }
        char idhex[9], owner[32], secret[64];
        if (random_hex(idhex, 4) < 0)
                return reply_internal(r);
        snprintf(owner, sizeof(owner), "trial_%s", idhex);
        json_t *j = NULL;
        int rc = keystore_create(r->srv->keys, "trial", owner, true, -1, true, cfg->max_trial_keys, secret, &j);
        if (rc == -EUSERS) {
                api_error(&e, 429, "rate_limited", "ask the daemon's administrator for a full key",
                          "this daemon has handed out its %u trial keys", cfg->max_trial_keys);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return reply_rc(r, rc, "make a trial key");
        json_object_set_new(j, "key", json_string(secret));
        json_object_set_new(j, "trialAllowance",
                            json_pack("{s:I}", "sandboxSeconds", (json_int_t)cfg->trial_allowance_seconds));
        explicit_bzero(secret, sizeof(secret));
        log_info(r->rid, "trial key %s made (owner %s)", json_string_value(json_object_get(j, "id")), owner);
        return reply_json(r, 201, j);
}
