/* The SQLite backend's keys, ledger and uploads, through their ops tables
 * (store_sqlite.keys, .ledger, .uploads) on a real database file: round
 * trips, the limits an insert and a reservation are checked against inside
 * their transaction, -ENOENT where there is nothing, and two handles on one
 * file (as two processes sharing a store) seeing each other's writes and
 * never overshooting a budget together. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/manager/db.h"
#include "daemon/model/auth.h"
#include "daemon/store/sqldb.h"
#include "daemon/store/store.h"
#include "test_store_keys_contract.h"
#include "daemon/store/store_keys.h"
#include "daemon/store/store_ledger.h"
#include "daemon/store/store_uploads.h"

typedef struct Fixture {
        char dir[64];
        char path[96];
        Db *db; /* its migrations make the tables keys and uploads */
} Fixture;

static void sql(Fixture *f, const char *text) {
        sqlite3 *s = NULL;
        assert_int_equal(sqldb_open(f->path, &s), 0);
        assert_int_equal(sqldb_exec(s, text), 0);
        sqlite3_close(s);
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        if (!f)
                return -1;
        snprintf(f->dir, sizeof(f->dir), "/tmp/store-test-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof(f->path), "%s/runtime.db", f->dir);
        if (db_open(&store_sqlite, f->path, &f->db) < 0)
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        db_close(f->db);
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
        if (system(cmd) != 0)
                return -1;
        free(f);
        return 0;
}

static void test_backend_table(void **state) {
        (void)state;
        assert_ptr_equal(store_backend_for("/any/path.db"), &store_sqlite);
        assert_string_equal(store_sqlite.name, "sqlite");
        assert_ptr_equal(store_sqlite.keys, &store_sqlite_keys);
        assert_ptr_equal(store_sqlite.ledger, &store_sqlite_ledger);
        assert_ptr_equal(store_sqlite.uploads, &store_sqlite_uploads);
}

/* ---- keys ---- */

static StoreKeyNew key(const char *id, const char *owner, const char *hash, bool full, bool trial) {
        return (StoreKeyNew){ .id = id, .name = id, .owner = owner, .hash = hash, .access = full ? KEY_ACCESS_FULL : KEY_ACCESS_READ,
                              .daily_limit_micros = trial ? 5 : -1, .trial = trial, .created_at = 1800000000 };
}

static void free_list(KeyRecord *list, size_t n) {
        for (size_t i = 0; i < n; i++)
                store_key_record_clear(&list[i]);
        free(list);
}

static void test_keys_round_trip_and_limits(void **state) {
        Fixture *f = *state;
        const StoreKeyOps *ops = store_sqlite.keys;
        StoreKeys *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        KeyRecord rec;
        StoreKeyNew k = key("key_1", "own_a", "h1", true, false);
        assert_int_equal(ops->insert(h, &k, 0, 2, &rec), 0);
        assert_string_equal(rec.id, "key_1");
        assert_string_equal(rec.owner, "own_a");
        assert_int_equal(rec.access, KEY_ACCESS_FULL);
        assert_false(rec.trial);
        assert_int_equal(rec.daily_limit_micros, -1);
        assert_int_equal(rec.created_at, 1800000000);
        assert_int_equal(rec.revoked_at, 0);
        store_key_record_clear(&rec);
        k = key("key_2", "own_a", "h2", false, false);
        assert_int_equal(ops->insert(h, &k, 0, 2, &rec), 0);
        store_key_record_clear(&rec);
        /* The owner's bound counts unrevoked keys, checked with the insert. */
        k = key("key_3", "own_a", "h3", false, false);
        assert_int_equal(ops->insert(h, &k, 0, 2, &rec), -EDQUOT);
        /* The trial bound counts every trial key. */
        k = key("key_t1", "own_t", "ht1", true, true);
        assert_int_equal(ops->insert(h, &k, 1, 2, &rec), 0);
        assert_true(rec.trial);
        assert_int_equal(rec.daily_limit_micros, 5);
        store_key_record_clear(&rec);
        k = key("key_t2", "own_u", "ht2", true, true);
        assert_int_equal(ops->insert(h, &k, 1, 2, &rec), -EUSERS);

        KeyRecord *list = NULL;
        size_t n = 0;
        assert_int_equal(ops->list(h, "own_a", 100, &list, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(list[0].id, "key_2"); /* newest first */
        assert_int_equal(list[0].access, KEY_ACCESS_READ);
        free_list(list, n);
        assert_int_equal(ops->list(h, NULL, 100, &list, &n), 0);
        assert_int_equal(n, 3);
        free_list(list, n);
        assert_int_equal(ops->list(h, NULL, 1, &list, &n), 0);
        assert_int_equal(n, 1);
        free_list(list, n);
        assert_int_equal(ops->list(h, "nobody", 100, &list, &n), 0);
        assert_int_equal(n, 0);
        free_list(list, n);

        /* Revocation: of the owner's key only, once; then a slot is free. */
        assert_int_equal(ops->revoke(h, "key_2", "own_b", NULL, 1800000100), -ENOENT);
        assert_int_equal(ops->revoke(h, "key_x", NULL, NULL, 1800000100), -ENOENT);
        assert_int_equal(ops->revoke(h, "key_2", "own_a", NULL, 1800000100), 0);
        assert_int_equal(ops->revoke(h, "key_2", NULL, NULL, 1800000101), -ENOENT);
        k = key("key_3", "own_a", "h3", false, false);
        assert_int_equal(ops->insert(h, &k, 0, 2, &rec), 0);
        store_key_record_clear(&rec);
        assert_int_equal(ops->list(h, "own_a", 100, &list, &n), 0);
        assert_int_equal(n, 3);
        bool seen = false;
        for (size_t i = 0; i < n; i++)
                if (strcmp(list[i].id, "key_2") == 0) {
                        assert_int_equal(list[i].revoked_at, 1800000100);
                        seen = true;
                }
        assert_true(seen);
        free_list(list, n);
        /* The last full key of the kept owner stays; a read key may go. */
        assert_int_equal(ops->revoke(h, "key_1", NULL, "own_a", 1800000200), -EBUSY);
        assert_int_equal(ops->revoke(h, "key_3", NULL, "own_a", 1800000200), 0);
        assert_int_equal(ops->revoke(h, "key_1", NULL, NULL, 1800000200), 0);
        ops->close(h);
}

static void test_keys_two_handles(void **state) {
        Fixture *f = *state;
        const StoreKeyOps *ops = store_sqlite.keys;
        StoreKeys *a = NULL, *b = NULL;
        assert_int_equal(ops->open(f->path, &a), 0);
        assert_int_equal(ops->open(f->path, &b), 0);
        KeyRecord rec, *list = NULL;
        size_t n = 0;
        StoreKeyNew k = key("key_1", "own_a", "h1", true, false);
        assert_int_equal(ops->insert(a, &k, 0, 1, &rec), 0);
        store_key_record_clear(&rec);
        assert_int_equal(ops->list(b, "own_a", 100, &list, &n), 0);
        assert_int_equal(n, 1);
        free_list(list, n);
        /* b's insert is checked against a's key. */
        k = key("key_2", "own_a", "h2", true, false);
        assert_int_equal(ops->insert(b, &k, 0, 1, &rec), -EDQUOT);
        assert_int_equal(ops->revoke(b, "key_1", "own_a", NULL, 1800000000), 0);
        assert_int_equal(ops->revoke(a, "key_1", "own_a", NULL, 1800000001), -ENOENT);
        assert_int_equal(ops->list(a, "own_a", 100, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_int_equal(list[0].revoked_at, 1800000000);
        free_list(list, n);
        ops->close(a);
        ops->close(b);
}

/* Whether a read key's requests keep a sandbox awake: stored with the key,
 * read back by the insert, a listing and authentication; off unless set. */
static void test_keys_keeps_awake(void **state) {
        Fixture *f = *state;
        const StoreKeyOps *ops = store_sqlite.keys;
        StoreKeys *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        keys_keeps_awake_contract(ops, h, "own_a");
        char hash_watch[AUTH_HASH_HEX_LEN + 1];
        assert_int_equal(auth_hash_key("rt_watch", hash_watch), 0);
        KeyInfo info;
        /* Revoked, it authenticates nothing, setting or not. */
        assert_int_equal(ops->revoke(h, "key_watch", "own_a", NULL, 1800000100), 0);
        assert_int_equal(ops->by_hash(h, hash_watch, &info), -ENOENT);
        /* The column takes 0 and 1 only. */
        sqlite3 *s = NULL;
        assert_int_equal(sqldb_open(f->path, &s), 0);
        assert_true(sqldb_exec(s, "UPDATE keys SET keeps_awake = 2 WHERE id = 'key_poll'") < 0);
        sqlite3_close(s);
        ops->close(h);
}

/* A database of the daemon before the setting (its keys table without the
 * column): opened by this one, its keys are kept and have it off; new keys
 * take it. */
static void test_keys_keeps_awake_after_an_upgrade(void **state) {
        Fixture *f = *state;
        /* Hashes as authentication compares them: 64 hex digits. */
        char hash_old_read[AUTH_HASH_HEX_LEN + 1], hash_old_full[AUTH_HASH_HEX_LEN + 1],
                hash_new[AUTH_HASH_HEX_LEN + 1];
        assert_int_equal(auth_hash_key("rt_old_read", hash_old_read), 0);
        assert_int_equal(auth_hash_key("rt_old_full", hash_old_full), 0);
        assert_int_equal(auth_hash_key("rt_new", hash_new), 0);
        db_close(f->db);
        f->db = NULL;
        /* Back to the schema of the fifth step, the last one before the
         * column, with a read key and a full key of that time. */
        sql(f, "ALTER TABLE keys DROP COLUMN keeps_awake");
        sql(f, "ALTER TABLE sandboxes DROP COLUMN created_msec");
        sql(f, "ALTER TABLE sandboxes DROP COLUMN started_msec");
        sql(f, "DELETE FROM schema_version WHERE version >= 6");
        char insert[512];
        snprintf(insert, sizeof(insert),
                 "INSERT INTO keys (id, name, owner, access, hash, daily_limit_micros, trial, created_at) "
                 "VALUES ('key_old_read', 'dashboard', 'own_a', 'read', '%s', NULL, 0, 1700000000), "
                 "('key_old_full', 'agent', 'own_a', 'full', '%s', NULL, 0, 1700000001)",
                 hash_old_read, hash_old_full);
        sql(f, insert);
        assert_int_equal(db_open(&store_sqlite, f->path, &f->db), 0);

        const StoreKeyOps *ops = store_sqlite.keys;
        StoreKeys *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        KeyInfo info;
        assert_int_equal(ops->by_hash(h, hash_old_read, &info), 0);
        assert_string_equal(info.id, "key_old_read");
        assert_int_equal(info.access, KEY_ACCESS_READ);
        assert_false(info.keeps_awake);
        assert_false(key_access_keeps_awake(info.access, info.keeps_awake));
        assert_int_equal(ops->by_hash(h, hash_old_full, &info), 0);
        assert_true(key_access_keeps_awake(info.access, info.keeps_awake));
        KeyRecord *list = NULL;
        size_t n = 0;
        assert_int_equal(ops->list(h, "own_a", 100, &list, &n), 0);
        assert_int_equal(n, 2);
        for (size_t i = 0; i < n; i++)
                assert_false(list[i].keeps_awake);
        free_list(list, n);
        KeyRecord rec;
        StoreKeyNew k = key("key_new", "own_a", hash_new, false, false);
        k.keeps_awake = true;
        assert_int_equal(ops->insert(h, &k, 0, 10, &rec), 0);
        assert_true(rec.keeps_awake);
        store_key_record_clear(&rec);
        ops->close(h);
}

/* ---- ledger ---- */

static uint64_t cost(uint64_t per_hour, int64_t seconds) {
        return seconds <= 0 ? 0 : per_hour * (uint64_t)seconds / 3600u;
}

static StoreReservation reservation(const char *sandbox, int64_t amount, int64_t seconds) {
        return (StoreReservation){ .sandbox_id = sandbox, .key_id = "key_a", .owner = "own_a",
                                   .amount_micros = amount, .seconds = seconds, .expires_at = 1800003600 };
}

static void test_ledger_reservation_against_budget(void **state) {
        Fixture *f = *state;
        const StoreLedgerOps *ops = store_sqlite.ledger;
        StoreLedger *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        const int64_t now = 1800000000, since = now - 86400;
        LedgerBudget b = { .daily_limit_micros = 1000, .allowance_seconds = -1 };
        StoreLedgerUse u;
        StoreReservation r = reservation("sbx_1", 600, 60);
        assert_int_equal(ops->reserve(h, &r, &b, since, now, &u), 0);
        r = reservation("sbx_2", 500, 60);
        assert_int_equal(ops->reserve(h, &r, &b, since, now, &u), -EDQUOT);
        assert_int_equal(u.reserved_micros, 600);
        assert_int_equal(u.reservations_end, 1800003600);
        /* A sandbox's own reservation is replaced, not added to. */
        r = reservation("sbx_1", 1000, 60);
        assert_int_equal(ops->reserve(h, &r, &b, since, now, &u), 0);
        assert_int_equal(u.reserved_micros, 0);
        r = reservation("sbx_1", 1001, 60);
        assert_int_equal(ops->reserve(h, &r, &b, since, now, &u), -EDQUOT);
        assert_int_equal(ops->key_use(h, "key_a", since, &u), 0);
        assert_int_equal(u.reserved_micros, 1000); /* the refused one changed nothing */
        r = reservation("sbx_x", -1, 60);
        assert_int_equal(ops->reserve(h, &r, &b, since, now, &u), -EINVAL);
        /* The seconds of an allowance. */
        LedgerBudget trial = { .daily_limit_micros = -1, .allowance_seconds = 100 };
        r = reservation("sbx_2", 0, 41);
        assert_int_equal(ops->reserve(h, &r, &trial, since, now, &u), -EDQUOT);
        assert_int_equal(u.reserved_seconds, 60);
        r = reservation("sbx_2", 0, 40);
        assert_int_equal(ops->reserve(h, &r, &trial, since, now, &u), 0);
        /* Released, it holds nothing. */
        assert_int_equal(ops->release(h, "sbx_1", now), 0);
        assert_int_equal(ops->release(h, "sbx_none", now), 0);
        assert_int_equal(ops->key_use(h, "key_a", since, &u), 0);
        assert_int_equal(u.reserved_micros, 0);
        assert_int_equal(u.reserved_seconds, 40);
        ops->close(h);
}

/* What a listing of charges saw: how many, and the last one. */
typedef struct Collected {
        StoreLedgerInterval last;
        int n;
} Collected;

static int collect(const StoreLedgerInterval *iv, void *userdata) {
        Collected *c = userdata;
        c->last = *iv;
        c->last.sandbox_id = c->last.key_id = c->last.key_name = NULL; /* not kept past the call */
        c->n++;
        return 0;
}

static void test_ledger_charges_round_trip(void **state) {
        Fixture *f = *state;
        const StoreLedgerOps *ops = store_sqlite.ledger;
        StoreLedger *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        sql(f, "INSERT INTO keys (id, name, owner, access, hash, daily_limit_micros, trial, created_at) "
               "VALUES ('key_a', 'a', 'own_a', 'full', 'ha', 777, 1, 0)");
        StoreLedgerKey k;
        assert_int_equal(ops->key_budget(h, "key_a", &k), 0);
        assert_int_equal(k.daily_limit_micros, 777);
        assert_true(k.trial);
        assert_int_equal(ops->key_budget(h, "key_none", &k), -ENOENT);

        const int64_t t = 1800000000;
        LedgerBudget b = { .daily_limit_micros = -1, .allowance_seconds = -1 };
        StoreLedgerUse u;
        StoreReservation r = reservation("sbx_c", 3600, 3600);
        assert_int_equal(ops->reserve(h, &r, &b, t - 86400, t, &u), 0);
        assert_int_equal(ops->begin(h, "sbx_c", "key_a", "own_a", t, 3600, t + 3600), 0);
        assert_int_equal(ops->heartbeat(h, t + 10), 0);
        Collected got = { 0 };
        assert_int_equal(ops->sandbox_intervals(h, "sbx_c", collect, &got), 0);
        assert_int_equal(got.n, 1);
        assert_true(got.last.open);
        assert_int_equal(got.last.ended_at, t + 10);
        /* After a crash: closed at the heartbeat, priced by the caller. */
        int64_t end = 0;
        assert_int_equal(ops->settle(h, "sbx_c", t + 50, true, t + 50, cost, &end), 0);
        assert_int_equal(end, t + 10);
        assert_int_equal(ops->settle(h, "sbx_c", t + 60, false, t + 60, cost, &end), -ENOENT);
        got = (Collected){ 0 };
        assert_int_equal(ops->sandbox_intervals(h, "sbx_c", collect, &got), 0);
        assert_int_equal(got.n, 1);
        assert_false(got.last.open);
        assert_int_equal(got.last.seconds, 10);
        assert_int_equal(got.last.micros, 10);
        assert_int_equal(ops->key_use(h, "key_a", t - 86400, &u), 0);
        assert_int_equal(u.settled_micros, 10);
        assert_int_equal(u.settled_seconds, 10);
        assert_int_equal(u.oldest_charge_end, t + 10);
        assert_int_equal(u.reserved_micros, 0); /* settled with the charge */
        /* A second run: its prior seconds are the first's. */
        assert_int_equal(ops->begin(h, "sbx_c", "key_a", "own_a", t + 100, 3600, t + 200), 0);
        assert_int_equal(ops->settle(h, "sbx_c", t + 105, false, t + 105, cost, NULL), 0);
        got = (Collected){ 0 };
        assert_int_equal(ops->owner_intervals(h, "own_a", t, t + 1000, collect, &got), 0);
        assert_int_equal(got.n, 2);
        assert_int_equal(got.last.prior_seconds, 10);
        assert_int_equal(got.last.seconds, 5);
        got = (Collected){ 0 };
        assert_int_equal(ops->owner_intervals(h, "own_none", t, t + 1000, collect, &got), 0);
        assert_int_equal(got.n, 0);
        assert_int_equal(ops->sandbox_intervals(h, "sbx_none", collect, &got), 0);
        assert_int_equal(got.n, 0);
        /* A reservation of no sandbox settles as an orphan, once it is too
         * old to be a create in flight on another host. */
        r = reservation("sbx_o", 100, 60);
        assert_int_equal(ops->reserve(h, &r, &b, t - 86400, t, &u), 0);
        assert_int_equal(ops->settle_orphans(h, t + 1), 0);
        assert_int_equal(ops->key_use(h, "key_a", t - 86400, &u), 0);
        assert_int_equal(u.reserved_micros, 100);
        assert_int_equal(ops->settle_orphans(h, t + LEDGER_ORPHAN_GRACE_SECONDS), 0);
        assert_int_equal(ops->key_use(h, "key_a", t - 86400, &u), 0);
        assert_int_equal(u.reserved_micros, 0);
        ops->close(h);
}

typedef struct Racer {
        const char *path;
        char sandbox[24];
        int result;
} Racer;

static void *race(void *arg) {
        Racer *r = arg;
        StoreLedger *h = NULL;
        r->result = store_sqlite.ledger->open(r->path, &h);
        if (r->result < 0)
                return NULL;
        LedgerBudget b = { .daily_limit_micros = 500, .allowance_seconds = -1 };
        StoreReservation res = reservation(r->sandbox, 100, 60);
        StoreLedgerUse u;
        r->result = store_sqlite.ledger->reserve(h, &res, &b, 1800000000 - 86400, 1800000000, &u);
        store_sqlite.ledger->close(h);
        return NULL;
}

static void test_ledger_two_handles_never_overshoot(void **state) {
        Fixture *f = *state;
        const StoreLedgerOps *ops = store_sqlite.ledger;
        StoreLedger *a = NULL, *b = NULL;
        assert_int_equal(ops->open(f->path, &a), 0);
        assert_int_equal(ops->open(f->path, &b), 0);
        LedgerBudget budget = { .daily_limit_micros = 150, .allowance_seconds = -1 };
        StoreLedgerUse u;
        StoreReservation r = reservation("sbx_1", 100, 60);
        assert_int_equal(ops->reserve(a, &r, &budget, 0, 1800000000, &u), 0);
        r = reservation("sbx_2", 100, 60);
        assert_int_equal(ops->reserve(b, &r, &budget, 0, 1800000000, &u), -EDQUOT);
        assert_int_equal(u.reserved_micros, 100);
        assert_int_equal(ops->release(b, "sbx_1", 1800000000), 0);
        assert_int_equal(ops->reserve(a, &r, &budget, 0, 1800000000, &u), 0);
        assert_int_equal(ops->release(a, "sbx_2", 1800000000), 0);
        ops->close(a);
        ops->close(b);

        /* Twelve handles race for a budget of five reservations. */
        Racer racers[12];
        pthread_t threads[12];
        for (int i = 0; i < 12; i++) {
                racers[i] = (Racer){ .path = f->path };
                snprintf(racers[i].sandbox, sizeof(racers[i].sandbox), "sbx_r%d", i);
                assert_int_equal(pthread_create(&threads[i], NULL, race, &racers[i]), 0);
        }
        int won = 0;
        for (int i = 0; i < 12; i++) {
                pthread_join(threads[i], NULL);
                if (racers[i].result == 0)
                        won++;
                else
                        assert_int_equal(racers[i].result, -EDQUOT);
        }
        assert_int_equal(won, 5);
}

/* ---- uploads ---- */

static StoreUpload upload(const char *id, const char *sandbox) {
        StoreUpload u = { .id = id, .sandbox_id = sandbox, .owner = "own_a", .path = "/workspace/f",
                          .user = REQ_AS_ROOT, .mode = 0640, .size = 3 * 1024 * 1024 + 5, .has_sha256 = true,
                          .chunk_bytes = 1024 * 1024, .parts = 4, .created_at = 100, .touched_at = 100 };
        memset(u.sha256, 0xab, 32);
        return u;
}

/* What a listing saw: the uploads' ids in order, and the first one whole. */
typedef struct Seen {
        char ids[8][24];
        size_t n;
        StoreUpload first;
        bool first_live;
        StoreUploadPart parts[8];
        size_t n_parts;
} Seen;

static int see(const StoreUploadListed *l, void *userdata) {
        Seen *s = userdata;
        if (s->n == 0) {
                s->first = l->row;
                s->first.id = s->first.sandbox_id = s->first.owner = s->first.path = NULL;
                s->first_live = l->sandbox_live;
                s->n_parts = l->n_parts < 8 ? l->n_parts : 8;
                if (s->n_parts)
                        memcpy(s->parts, l->parts, s->n_parts * sizeof(*l->parts));
        }
        if (s->n < 8)
                snprintf(s->ids[s->n++], sizeof(s->ids[0]), "%s", l->row.id);
        return 0;
}

static void test_uploads_round_trip(void **state) {
        Fixture *f = *state;
        sql(f, "INSERT INTO keys (id, name, owner, access, hash, created_at) VALUES ('key_a', 'a', 'own_a', 'full', "
               "'11', 0);"
               "INSERT INTO sandboxes (id, owner, key_id, labels, spec, state, created_at) VALUES "
               "('sbx_a', 'own_a', 'key_a', '{}', '{}', 'running', 0)");
        const StoreUploadOps *ops = store_sqlite.uploads;
        StoreUploads *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        StoreUpload u = upload("upl_0000000000000001", "sbx_a");
        assert_int_equal(ops->insert(h, &u), 0);
        assert_int_equal(ops->insert(h, &u), -EEXIST);
        StoreUpload arch = upload("upl_0000000000000002", "sbx_gone");
        arch.archive = true;
        arch.user = REQ_AS_SANDBOX;
        arch.created_at = 200;
        assert_int_equal(ops->insert(h, &arch), 0);
        assert_int_equal(ops->record_part(h, u.id, 3, 5, 150), 0);
        assert_int_equal(ops->record_part(h, u.id, 0, 1024 * 1024, 160), 0);
        assert_int_equal(ops->record_part(h, u.id, 3, 5, 170), 0); /* again: replaced */
        assert_int_equal(ops->record_part(h, "upl_none", 0, 1, 170), -ENOENT);

        Seen s = { 0 };
        assert_int_equal(ops->list(h, see, &s), 0);
        assert_int_equal(s.n, 2);
        assert_string_equal(s.ids[0], u.id); /* oldest first */
        assert_string_equal(s.ids[1], arch.id);
        assert_true(s.first_live);
        assert_false(s.first.archive);
        assert_int_equal(s.first.user, REQ_AS_ROOT);
        assert_int_equal(s.first.mode, 0640);
        assert_int_equal(s.first.size, 3 * 1024 * 1024 + 5);
        assert_true(s.first.has_sha256);
        assert_int_equal(s.first.sha256[31], 0xab);
        assert_int_equal(s.first.chunk_bytes, 1024 * 1024);
        assert_int_equal(s.first.parts, 4);
        assert_int_equal(s.first.touched_at, 170);
        assert_int_equal(s.n_parts, 2);
        int64_t sum = 0;
        for (size_t i = 0; i < s.n_parts; i++)
                sum += s.parts[i].index * 1000 + s.parts[i].bytes;
        assert_int_equal(sum, 3 * 1000 + 5 + 1024 * 1024);

        /* Removed, its parts go with it and no part is recorded for it. */
        assert_int_equal(ops->remove(h, u.id), 0);
        assert_int_equal(ops->remove(h, u.id), 0);
        assert_int_equal(ops->record_part(h, u.id, 1, 1024 * 1024, 180), -ENOENT);
        memset(&s, 0, sizeof(s));
        assert_int_equal(ops->list(h, see, &s), 0);
        assert_int_equal(s.n, 1);
        assert_true(s.first.archive);
        assert_false(s.first_live); /* no such sandbox */
        assert_int_equal(s.first.user, REQ_AS_SANDBOX);
        assert_int_equal(s.n_parts, 0);
        assert_int_equal(ops->remove_sandbox(h, "sbx_gone"), 0);
        memset(&s, 0, sizeof(s));
        assert_int_equal(ops->list(h, see, &s), 0);
        assert_int_equal(s.n, 0);
        ops->close(h);
}

static void test_uploads_two_handles(void **state) {
        Fixture *f = *state;
        const StoreUploadOps *ops = store_sqlite.uploads;
        StoreUploads *a = NULL, *b = NULL;
        assert_int_equal(ops->open(f->path, &a), 0);
        assert_int_equal(ops->open(f->path, &b), 0);
        StoreUpload u = upload("upl_0000000000000003", "sbx_a");
        assert_int_equal(ops->insert(a, &u), 0);
        assert_int_equal(ops->record_part(b, u.id, 1, 1024 * 1024, 300), 0);
        Seen s = { 0 };
        assert_int_equal(ops->list(a, see, &s), 0);
        assert_int_equal(s.n, 1);
        assert_int_equal(s.n_parts, 1);
        assert_int_equal(s.parts[0].index, 1);
        assert_int_equal(s.first.touched_at, 300);
        assert_int_equal(ops->remove_sandbox(b, "sbx_a"), 0);
        assert_int_equal(ops->record_part(a, u.id, 2, 1024 * 1024, 310), -ENOENT);
        memset(&s, 0, sizeof(s));
        assert_int_equal(ops->list(a, see, &s), 0);
        assert_int_equal(s.n, 0);
        ops->close(a);
        ops->close(b);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_backend_table),
                cmocka_unit_test_setup_teardown(test_keys_round_trip_and_limits, setup, teardown),
                cmocka_unit_test_setup_teardown(test_keys_two_handles, setup, teardown),
                cmocka_unit_test_setup_teardown(test_keys_keeps_awake, setup, teardown),
                cmocka_unit_test_setup_teardown(test_keys_keeps_awake_after_an_upgrade, setup, teardown),
                cmocka_unit_test_setup_teardown(test_ledger_reservation_against_budget, setup, teardown),
                cmocka_unit_test_setup_teardown(test_ledger_charges_round_trip, setup, teardown),
                cmocka_unit_test_setup_teardown(test_ledger_two_handles_never_overshoot, setup, teardown),
                cmocka_unit_test_setup_teardown(test_uploads_round_trip, setup, teardown),
                cmocka_unit_test_setup_teardown(test_uploads_two_handles, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
