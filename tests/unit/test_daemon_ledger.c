/* The ledger: exact per-second charges, reservations against a daily limit
 * and a trial allowance (also under concurrency), heartbeats and settling
 * after a crash, usage windows. And the key store the guard rails use:
 * making, listing and revoking keys, the trial bound, trial shapes. On a
 * real SQLite file. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/timeutil.h"
#include "daemon/model/auth.h"
#include "daemon/manager/db.h"
#include "test_store_keys_helper.h"
#include "daemon/manager/keys.h"
#include "daemon/manager/ledger.h"
#include "daemon/api/api.h"
#include "daemon/http/request.h"
#include "daemon/store/sqldb.h"

typedef struct Fixture {
        char dir[64];
        char path[96];
        Db *db;
        Ledger *l;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        snprintf(f->dir, sizeof(f->dir), "/tmp/ledger-test-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof(f->path), "%s/runtime.db", f->dir);
        if (db_open(&store_sqlite, f->path, &f->db) < 0 || ledger_open(&store_sqlite, f->path, &f->l) < 0)
                return -1;
        test_key_insert(f->path, "key_a", "a", "own_a", true, "1111111111111111111111111111111111111111111111111111111111111111",
                      false);
        test_key_insert(f->path, "key_b", "b", "own_b", true, "2222222222222222222222222222222222222222222222222222222222222222",
                      false);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        char cmd[128];
        ledger_close(f->l);
        db_close(f->db);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
        if (system(cmd) != 0)
                return -1;
        free(f);
        return 0;
}

static void test_cost_arithmetic(void **state) {
        assert_int_equal(ledger_cost(31250, 3600), 31250);
        assert_int_equal(ledger_cost(31250, 1), 8);      /* 8.68 */
        assert_int_equal(ledger_cost_ceil(31250, 1), 9);
        assert_int_equal(ledger_cost(9570, 60), 159);    /* 159.5 */
        assert_int_equal(ledger_cost_ceil(9570, 60), 160);
        assert_int_equal(ledger_cost(9570, 0), 0);
        assert_int_equal(ledger_cost(9570, -5), 0);
        assert_int_equal(ledger_cost_ceil(3600, 7), 7);
        /* The largest prices the daemon takes do not overflow. */
        uint64_t huge = 1024ull * 1000000000000ull + 16384ull * 1000000000000ull / 1024;
        assert_true(ledger_cost(huge, 86400) > 0);
        assert_int_equal(ledger_cost(UINT64_MAX, INT64_MAX), INT64_MAX);
}

static void test_reserve_against_daily_limit(void **state) {
        Fixture *f = *state;
        LedgerBudget b = { .daily_limit_micros = 1000, .allowance_seconds = -1 };
        LedgerRefusal no;
        int64_t now = 1800000000;
        assert_int_equal(ledger_reserve(f->l, "key_a", "own_a", "sbx_1", &b, 600, 60, now + 60, now, &no), 0);
        assert_int_equal(ledger_reserve(f->l, "key_a", "own_a", "sbx_2", &b, 500, 60, now + 90, now, &no), -EDQUOT);
        assert_false(no.allowance);
        assert_int_equal(no.limit, 1000);
        assert_int_equal(no.used, 600);
        assert_int_equal(no.wanted, 500);
        assert_int_equal(no.reservations_end, now + 60);
        /* Replacing a sandbox's own reservation leaves the old amount out. */
        assert_int_equal(ledger_reserve(f->l, "key_a", "own_a", "sbx_1", &b, 1000, 100, now + 100, now, &no), 0);
        assert_int_equal(ledger_reserve(f->l, "key_a", "own_a", "sbx_1", &b, 1001, 100, now + 100, now, &no),
                         -EDQUOT);
        /* Another key is not touched by it. */
        assert_int_equal(ledger_reserve(f->l, "key_b", "own_b", "sbx_3", &b, 1000, 60, now + 60, now, &no), 0);
        LedgerKeyUse u;
        assert_int_equal(ledger_key_use(f->l, "key_a", now, &u), 0);
        assert_int_equal(u.reserved_micros, 1000);
        assert_int_equal(u.used_micros, 1000);
        assert_int_equal(u.settled_micros, 0);
        /* Released: room again. */
        assert_int_equal(ledger_release(f->l, "sbx_1", now), 0);
        assert_int_equal(ledger_key_use(f->l, "key_a", now, &u), 0);
        assert_int_equal(u.used_micros, 0);
        assert_int_equal(ledger_reserve(f->l, "key_a", "own_a", "sbx_2", &b, 500, 60, now + 90, now, &no), 0);
        assert_int_equal(ledger_reserve(f->l, "key_a", "own_a", "sbx_x", &b, -1, 60, now, now, &no), -EINVAL);
}

static void test_settle_is_exact(void **state) {
        Fixture *f = *state;
        LedgerBudget b = { .daily_limit_micros = -1, .allowance_seconds = -1 };
        LedgerRefusal no;
        int64_t t = 1800000000;
        assert_int_equal(ledger_reserve(f->l, "key_a", "own_a", "sbx_e", &b, 160, 60, t + 60, t, &no), 0);
        /* Three intervals of 1 s at 9570/h: 2 + 3 + 2 micros, exactly floor(9570 * 3 / 3600) = 7. */
        for (int i = 0; i < 3; i++) {
                assert_int_equal(ledger_begin(f->l, "sbx_e", "key_a", "own_a", t + 10 * i, 9570, 0), 0);
                assert_int_equal(ledger_settle(f->l, "sbx_e", t + 10 * i + 1, t + 10 * i + 1), 0);
        }
        int64_t secs, micros;
        assert_int_equal(ledger_sandbox_total(f->l, "sbx_e", t + 100, 0, &secs, &micros), 0);
        assert_int_equal(secs, 3);
        assert_int_equal(micros, ledger_cost(9570, 3));
        LedgerKeyUse u;
        assert_int_equal(ledger_key_use(f->l, "key_a", t + 30, &u), 0);
        assert_int_equal(u.settled_micros, 7);
        assert_int_equal(u.reserved_micros, 0); /* settled with the first stop */
        assert_int_equal(u.frees_at, t + 1 + LEDGER_WINDOW_SECONDS);
        /* A day later the charges have left the window. */
        assert_int_equal(ledger_key_use(f->l, "key_a", t + 21 + LEDGER_WINDOW_SECONDS, &u), 0);
        assert_int_equal(u.used_micros, 0);
        /* Settling again finds nothing open and bills nothing. */
        assert_int_equal(ledger_settle(f->l, "sbx_e", t + 500, t + 500), 0);
        assert_int_equal(ledger_sandbox_total(f->l, "sbx_e", t + 1000, 0, &secs, &micros), 0);
        assert_int_equal(secs, 3);
}

/* An export has a row per charge and UTC day: a charge across two
 * midnights is three rows, their seconds and micros the charge's whole. */
static void test_export_cuts_at_midnight(void **state) {
        Fixture *f = *state;
        int64_t day = 1800057600; /* a UTC midnight */
        int64_t start = day - 100, end = day + 86400 + 50;
        assert_int_equal(ledger_begin(f->l, "sbx_d", "key_a", "own_a", start, 9570, 0), 0);
        assert_int_equal(ledger_settle(f->l, "sbx_d", end, end), 0);
        int64_t secs, micros;
        assert_int_equal(ledger_sandbox_total(f->l, "sbx_d", end + 10, 0, &secs, &micros), 0);
        LedgerExportRow rows[4];
        size_t n = 0;
        bool more = true;
        int64_t final_through = 0;
        assert_int_equal(ledger_export(f->l, "own_a", start, end + 1, NULL, 4, end + 10, rows, &n, &more,
                                       &final_through),
                         0);
        assert_int_equal(n, 3);
        assert_false(more);
        static const int64_t want_start[] = { 1800057500, 1800057600, 1800144000 };
        static const int64_t want_end[] = { 1800057600, 1800144000, 1800144050 };
        static const int64_t want_secs[] = { 100, 86400, 50 };
        int64_t sum = 0;
        for (size_t i = 0; i < 3; i++) {
                assert_int_equal(rows[i].at.ended_at, end); /* settled at the charge's end */
                assert_int_equal(rows[i].at.started_at, want_start[i]);
                assert_int_equal(rows[i].ended_at, want_end[i]);
                assert_int_equal(rows[i].seconds, want_secs[i]);
                assert_string_equal(rows[i].at.series, "sbx_d");
                sum += rows[i].micros;
        }
        assert_int_equal(secs, 86550);
        assert_int_equal(sum, micros);
        assert_int_equal(rows[1].micros, (int64_t)ledger_cost(9570, 86500) - (int64_t)ledger_cost(9570, 100));
        /* Pages go on from a row inside a charge. */
        LedgerExportRow page[2];
        assert_int_equal(ledger_export(f->l, "own_a", start, end + 1, NULL, 2, end + 10, page, &n, &more,
                                       &final_through),
                         0);
        assert_int_equal(n, 2);
        assert_true(more);
        assert_int_equal(ledger_export(f->l, "own_a", start, end + 1, &page[1].at, 2, end + 10, page, &n, &more,
                                       &final_through),
                         0);
        assert_int_equal(n, 1);
        assert_false(more);
        assert_int_equal(page[0].at.started_at, 1800144000);
}

static void test_heartbeat_and_crash(void **state) {
        Fixture *f = *state;
        int64_t t = 1800000000, end = 0, secs, micros;
        assert_int_equal(ledger_begin(f->l, "sbx_h", "key_a", "own_a", t, 3600, 0), 0);
        assert_int_equal(ledger_heartbeat(f->l, t + 2), 0);
        assert_int_equal(ledger_heartbeat(f->l, t + 4), 0);
        assert_int_equal(ledger_heartbeat(f->l, t + 3), 0); /* never backwards */
        /* The daemon died after t + 4; it starts again at t + 50. */
        assert_int_equal(ledger_settle_at_heartbeat(f->l, "sbx_h", t + 50, t + 50, &end), 0);
        assert_int_equal(end, t + 4);
        assert_int_equal(ledger_sandbox_total(f->l, "sbx_h", t + 60, 0, &secs, &micros), 0);
        assert_int_equal(secs, 4);
        assert_int_equal(micros, 4);
        /* Never twice. */
        assert_int_equal(ledger_settle_at_heartbeat(f->l, "sbx_h", t + 70, t + 70, &end), -ENOENT);
        /* A heartbeat past the lease end is cut at the lease end. */
        assert_int_equal(ledger_begin(f->l, "sbx_i", "key_a", "own_a", t, 3600, 0), 0);
        assert_int_equal(ledger_heartbeat(f->l, t + 30), 0);
        assert_int_equal(ledger_settle_at_heartbeat(f->l, "sbx_i", t + 10, t + 40, &end), 0);
        assert_int_equal(end, t + 10);
}

static void test_trial_allowance(void **state) {
        Fixture *f = *state;
        LedgerBudget b = { .daily_limit_micros = -1, .allowance_seconds = 3600 };
        LedgerRefusal no;
        int64_t t = 1800000000;
        assert_int_equal(ledger_reserve(f->l, "key_b", "own_b", "sbx_t1", &b, 0, 3000, t + 3000, t, &no), 0);
        assert_int_equal(ledger_reserve(f->l, "key_b", "own_b", "sbx_t2", &b, 0, 601, t + 601, t, &no), -EDQUOT);
        assert_true(no.allowance);
        assert_int_equal(no.limit, 3600);
        assert_int_equal(no.used, 3000);
        assert_int_equal(ledger_begin(f->l, "sbx_t1", "key_b", "own_b", t, 0, 0), 0);
        assert_int_equal(ledger_settle(f->l, "sbx_t1", t + 100, t + 100), 0);
        assert_int_equal(ledger_reserve(f->l, "key_b", "own_b", "sbx_t2", &b, 0, 3500, t + 3600, t + 100, &no), 0);
        assert_int_equal(ledger_reserve(f->l, "key_b", "own_b", "sbx_t3", &b, 0, 1, t + 3600, t + 100, &no), -EDQUOT);
}

static void test_orphans_settle(void **state) {
        Fixture *f = *state;
        LedgerBudget b = { .daily_limit_micros = 100, .allowance_seconds = -1 };
        LedgerRefusal no;
        int64_t t = 1800000000;
        /* A reservation whose sandbox never made it into the table: kept
         * while it may be another host's create in flight, then settled. */
        assert_int_equal(ledger_reserve(f->l, "key_a", "own_a", "sbx_o", &b, 100, 60, t + 60, t, &no), 0);
        assert_int_equal(ledger_settle_orphans(f->l, t + 1), 0);
        LedgerKeyUse u;
        assert_int_equal(ledger_key_use(f->l, "key_a", t + 1, &u), 0);
        assert_int_equal(u.reserved_micros, 100);
        assert_int_equal(ledger_settle_orphans(f->l, t + LEDGER_ORPHAN_GRACE_SECONDS), 0);
        assert_int_equal(ledger_key_use(f->l, "key_a", t + 1, &u), 0);
        assert_int_equal(u.reserved_micros, 0);
}

typedef struct Racer {
        Ledger *l;
        int id;
        int result;
} Racer;

static void *race(void *arg) {
        Racer *r = arg;
        LedgerBudget b = { .daily_limit_micros = 500, .allowance_seconds = -1 };
        LedgerRefusal no;
        char sid[32];
        snprintf(sid, sizeof(sid), "sbx_race%02d", r->id);
        r->result = ledger_reserve(r->l, "key_b", "own_b", sid, &b, 100, 60, 1800000060, 1800000000, &no);
        return NULL;
}

static void test_concurrent_reservations_never_overshoot(void **state) {
        Fixture *f = *state;
        /* Another connection on the same file, as a second writer would be. */
        Ledger *other;
        assert_int_equal(ledger_open(&store_sqlite, f->path, &other), 0);
        Racer r[20];
        pthread_t th[20];
        for (int i = 0; i < 20; i++) {
                r[i] = (Racer){ .l = i % 2 ? other : f->l, .id = i };
                pthread_create(&th[i], NULL, race, &r[i]);
        }
        int ok = 0, refused = 0;
        for (int i = 0; i < 20; i++) {
                pthread_join(th[i], NULL);
                ok += r[i].result == 0;
                refused += r[i].result == -EDQUOT;
        }
        assert_int_equal(ok, 5);
        assert_int_equal(refused, 15);
        LedgerKeyUse u;
        assert_int_equal(ledger_key_use(f->l, "key_b", 1800000000, &u), 0);
        assert_int_equal(u.reserved_micros, 500);
        ledger_close(other);
}

static void test_usage_window(void **state) {
        Fixture *f = *state;
        int64_t t = 1800000000;
        /* 100 s at 3600/h (1 micro a second), looked at through [t+40, t+70). */
        assert_int_equal(ledger_begin(f->l, "sbx_u", "key_a", "own_a", t, 3600, 0), 0);
        assert_int_equal(ledger_settle(f->l, "sbx_u", t + 100, t + 100), 0);
        assert_int_equal(ledger_begin(f->l, "sbx_v", "key_a", "own_a", t + 50, 3600, 0), 0); /* still open */
        LedgerUsage u;
        assert_int_equal(ledger_usage(f->l, "own_a", t + 40, t + 70, t + 60, &u), 0);
        assert_int_equal(u.total_seconds, 30 + 10);
        assert_int_equal(u.total_micros, 40);
        assert_false(u.truncated);
        /* In the order of their first interval; the open one counts to now. */
        assert_int_equal(u.n_sandboxes, 2);
        assert_string_equal(u.sandboxes[0].sandbox_id, "sbx_u");
        assert_int_equal(u.sandboxes[0].seconds, 30);
        assert_int_equal(u.sandboxes[0].micros, 30);
        assert_false(u.sandboxes[0].running);
        assert_string_equal(u.sandboxes[1].sandbox_id, "sbx_v");
        assert_string_equal(u.sandboxes[1].key_id, "key_a");
        assert_int_equal(u.sandboxes[1].seconds, 10);
        assert_true(u.sandboxes[1].running);
        assert_int_equal(u.n_keys, 1);
        assert_string_equal(u.keys[0].key_id, "key_a");
        assert_string_equal(u.keys[0].name, "a");
        assert_int_equal(u.keys[0].seconds, 40);
        assert_int_equal(u.keys[0].micros, 40);
        ledger_usage_done(&u);
        /* Another owner sees none of it. */
        assert_int_equal(ledger_usage(f->l, "own_b", t, t + 1000, t + 60, &u), 0);
        assert_int_equal(u.n_sandboxes, 0);
        assert_int_equal(u.n_keys, 0);
        assert_int_equal(u.total_seconds, 0);
        ledger_usage_done(&u);
}

/* Many intervals of many sandboxes: each sums into its own entry, and past
 * LEDGER_USAGE_MAX_SANDBOXES the rest count in the totals and keys only. */
static void test_usage_many_sandboxes(void **state) {
        Fixture *f = *state;
        int64_t t = 1800000000;
        size_t n = LEDGER_USAGE_MAX_SANDBOXES + 5;
        /* Two closed intervals of 1 s each per sandbox at 3600/h (1 micro a
         * second), the sandboxes' first ones interleaved in time. */
        char sql[1024];
        snprintf(sql, sizeof(sql),
                 "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < %zu), "
                 "k(j) AS (VALUES (0), (1)) "
                 "INSERT INTO ledger (sandbox_id, key_id, owner, started_at, ended_at, open, price_per_hour, "
                 "prior_seconds, seconds, micros) "
                 "SELECT printf('sbx_m%%05d', i), CASE i %% 2 WHEN 1 THEN 'key_a' ELSE 'key_b' END, 'own_m', "
                 "%lld + 10 * j + i %% 7, %lld + 10 * j + i %% 7 + 1, 0, 3600, j, 1, 1 FROM n, k",
                 n - 1, (long long)t, (long long)t);
        sqlite3 *raw = NULL;
        assert_int_equal(sqldb_open(f->path, &raw), 0);
        assert_int_equal(sqldb_exec_transaction(raw, sql), 0);
        sqlite3_close(raw);
        LedgerUsage u;
        assert_int_equal(ledger_usage(f->l, "own_m", t, t + 100, t + 100, &u), 0);
        assert_int_equal(u.total_seconds, 2 * (int64_t)n);
        assert_int_equal(u.total_micros, 2 * (int64_t)n);
        assert_true(u.truncated);
        assert_int_equal(u.n_sandboxes, LEDGER_USAGE_MAX_SANDBOXES);
        for (size_t i = 0; i < u.n_sandboxes; i++) {
                assert_int_equal(u.sandboxes[i].seconds, 2);
                assert_int_equal(u.sandboxes[i].micros, 2);
        }
        assert_int_equal(u.n_keys, 2);
        assert_int_equal(u.keys[0].seconds + u.keys[1].seconds, 2 * (int64_t)n);
        ledger_usage_done(&u);
}

static void test_keystore(void **state) {
        Fixture *f = *state;
        KeyStore *ks;
        char secret[64], hash[AUTH_HASH_HEX_LEN + 1];
        KeyRecord rec;
        KeyInfo k;
        assert_int_equal(keystore_open(&store_sqlite, f->path, &ks), 0);
        /* key_a and key_b (full, of own_a and own_b) exist; make the admin's. */
        /* The store's clock (CLOCK_REALTIME), not time(), which may read a
         * coarse clock a tick behind it. */
        int64_t before = time_now_unix();
        assert_int_equal(keystore_create(ks, "admin", "admin", true, false, -1, false, 0, secret, &rec), 0);
        char admin_id[32];
        snprintf(admin_id, sizeof(admin_id), "%s", rec.id);
        assert_true(route_key_id_ok(admin_id));
        assert_string_equal(rec.name, "admin");
        assert_string_equal(rec.owner, "admin");
        assert_true(rec.access == KEY_ACCESS_FULL && !rec.trial);
        assert_int_equal(rec.daily_limit_micros, -1);
        assert_true(rec.created_at >= before && rec.created_at <= time_now_unix());
        assert_int_equal(rec.revoked_at, 0);
        keystore_record_done(&rec);
        assert_true(auth_key_format_ok(secret));
        assert_int_equal(auth_hash_key(secret, hash), 0);
        assert_int_equal(test_key_by_hash(f->path, hash, &k), 0);
        assert_true(k.access == KEY_ACCESS_FULL && !k.trial && keys_is_admin(&k));
        KeyInfo limited_admin = k;
        limited_admin.daily_limit_micros = 5;
        assert_false(keys_is_admin(&limited_admin));
        /* The last full admin key stays. */
        assert_int_equal(keystore_revoke(ks, admin_id, NULL, 1800000000), -EBUSY);
        /* A limited read key of another owner. */
        assert_int_equal(keystore_create(ks, "ro", "own_c", false, false, 25000000, false, 0, secret, &rec), 0);
        char ro_id[32];
        snprintf(ro_id, sizeof(ro_id), "%s", rec.id);
        assert_int_equal(rec.access, KEY_ACCESS_READ);
        assert_int_equal(rec.daily_limit_micros, 25000000);
        keystore_record_done(&rec);
        assert_int_equal(auth_hash_key(secret, hash), 0);
        assert_int_equal(test_key_by_hash(f->path, hash, &k), 0);
        assert_int_equal(k.access, KEY_ACCESS_READ);
        assert_int_equal(k.daily_limit_micros, 25000000);
        /* Only its owner (or any owner: NULL) revokes it, once. */
        assert_int_equal(keystore_revoke(ks, ro_id, "own_a", 1800000000), -ENOENT);
        assert_int_equal(keystore_revoke(ks, ro_id, "own_c", 1800000000), 0);
        assert_int_equal(keystore_revoke(ks, ro_id, NULL, 1800000001), -ENOENT);
        assert_int_equal(test_key_by_hash(f->path, hash, &k), -ENOENT);
        /* Listings: one owner's, revoked ones shown with their time. */
        KeyRecord *list = NULL;
        size_t n = 0;
        assert_int_equal(keystore_list(ks, "own_c", &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ro_id);
        assert_string_equal(list[0].name, "ro");
        assert_int_equal(list[0].revoked_at, 1800000000);
        keystore_records_free(list, n);
        assert_int_equal(keystore_list(ks, NULL, &list, &n), 0);
        assert_int_equal(n, 4);
        /* Newest first. */
        for (size_t i = 1; i < n; i++)
                assert_true(list[i - 1].created_at >= list[i].created_at);
        keystore_records_free(list, n);
        assert_int_equal(keystore_list(ks, "nobody", &list, &n), 0);
        assert_int_equal(n, 0);
        keystore_records_free(list, n);
        /* Trial keys are bounded in all. */
        assert_int_equal(keystore_create(ks, "trial", "trial_1", true, false, -1, true, 2, secret, &rec), 0);
        assert_true(rec.trial);
        keystore_record_done(&rec);
        assert_int_equal(keystore_create(ks, "trial", "trial_2", true, false, -1, true, 2, secret, &rec), 0);
        keystore_record_done(&rec);
        assert_int_equal(keystore_create(ks, "trial", "trial_3", true, false, -1, true, 2, secret, &rec), -EUSERS);
        assert_int_equal(auth_hash_key(secret, hash), 0);
        assert_int_equal(test_key_by_hash(f->path, hash, &k), 0); /* the second one, not a third */
        assert_true(k.trial && !keys_is_admin(&k));
        keystore_close(ks);
}

static void test_owner_names_and_trial_shape(void **state) {
        assert_true(keys_owner_ok("team-a"));
        assert_true(keys_owner_ok("a"));
        assert_false(keys_owner_ok(""));
        assert_false(keys_owner_ok("-a"));
        assert_false(keys_owner_ok("Team"));
        assert_false(keys_owner_ok("a/b"));
        assert_false(keys_owner_ok("a b"));
        char long_name[80];
        memset(long_name, 'a', sizeof(long_name) - 1);
        long_name[sizeof(long_name) - 1] = '\0';
        assert_false(keys_owner_ok(long_name));

        KeyInfo trial = { .access = KEY_ACCESS_FULL, .trial = true, .daily_limit_micros = -1 };
        KeyInfo full = { .access = KEY_ACCESS_FULL, .daily_limit_micros = -1 };
        ApiError e;
        json_t *body = json_pack("{s:i}", "vcpu", 1);
        CreateRequest req = { .spec = { .vcpu = 1, .memory_mib = 1024 } };
        assert_int_equal(request_apply_trial_shape(full.trial, body, &req, &e), 0);
        assert_int_equal(req.spec.memory_mib, 1024);
        assert_int_equal(request_apply_trial_shape(trial.trial, body, &req, &e), 0);
        assert_int_equal(req.spec.memory_mib, KEYS_TRIAL_MEMORY_DEFAULT_MIB);
        req.spec.vcpu = 4;
        assert_int_equal(request_apply_trial_shape(trial.trial, body, &req, &e), -EINVAL);
        assert_int_equal(e.status, 400);
        assert_non_null(strstr(e.message, "vcpu"));
        json_object_set_new(body, "memoryMiB", json_integer(4096));
        req = (CreateRequest){ .spec = { .vcpu = 1, .memory_mib = 4096 } };
        assert_int_equal(request_apply_trial_shape(trial.trial, body, &req, &e), -EINVAL);
        assert_non_null(strstr(e.message, "memoryMiB"));
        json_decref(body);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_cost_arithmetic),
                cmocka_unit_test_setup_teardown(test_reserve_against_daily_limit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_settle_is_exact, setup, teardown),
                cmocka_unit_test_setup_teardown(test_export_cuts_at_midnight, setup, teardown),
                cmocka_unit_test_setup_teardown(test_heartbeat_and_crash, setup, teardown),
                cmocka_unit_test_setup_teardown(test_trial_allowance, setup, teardown),
                cmocka_unit_test_setup_teardown(test_orphans_settle, setup, teardown),
                cmocka_unit_test_setup_teardown(test_concurrent_reservations_never_overshoot, setup, teardown),
                cmocka_unit_test_setup_teardown(test_usage_window, setup, teardown),
                cmocka_unit_test_setup_teardown(test_usage_many_sandboxes, setup, teardown),
                cmocka_unit_test_setup_teardown(test_keystore, setup, teardown),
                cmocka_unit_test(test_owner_names_and_trial_shape),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
