/* The PostgreSQL backend's ledger and uploads, through their ops tables
 * (store_postgres.ledger, .uploads) against a real server: round trips, the
 * budget a reservation is checked against inside its transaction, -ENOENT
 * where there is nothing, two connections (as two hosts) seeing each
 * other's writes, and a dozen connections never overshooting one budget
 * together. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store.h"
#include "daemon/store/store_keys.h"
#include "daemon/store/store_ledger.h"
#include "daemon/store/store_events.h"
#include "daemon/store/store_uploads.h"
#include "test_pg_harness.h"
#include "test_store_hosts_helper.h"

static void test_backend_table(void **state) {
        assert_ptr_equal(store_postgres.ledger, &store_postgres_ledger);
        assert_ptr_equal(store_postgres.uploads, &store_postgres_uploads);
}

/* Inserts a key through the keys' table, as the daemon does. */
static void key_insert(const char *url, const char *id, const char *owner, int64_t daily_limit, bool trial) {
        StoreKeys *h = NULL;
        assert_int_equal(store_postgres.keys->open(url, &h), 0);
        char hash[64];
        snprintf(hash, sizeof hash, "hash_%s", id);
        StoreKeyNew k = { .id = id, .name = id, .owner = owner, .hash = hash, .access = KEY_ACCESS_FULL,
                          .daily_limit_micros = daily_limit, .trial = trial, .created_at = 0 };
        KeyRecord rec = { 0 };
        assert_int_equal(store_postgres.keys->insert(h, &k, 100, 100, &rec), 0);
        store_key_record_clear(&rec);
        store_postgres.keys->close(h);
}

static void sql(const char *url, const char *text) {
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), 0);
        assert_int_equal(pgdb_exec(&c, text, NULL), 0);
        pgdb_close(&c);
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
        char *url = pg_fresh("t_ledger_budget");
        const StoreLedgerOps *ops = store_postgres.ledger;
        StoreLedger *h = NULL;
        assert_int_equal(ops->open(url, &h), 0);
        key_insert(url, "key_a", "own_a", 1000, false);
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
        /* Reserved again after its release: open once more. */
        r = reservation("sbx_1", 300, 10);
        assert_int_equal(ops->reserve(h, &r, &b, since, now + 5, &u), 0);
        assert_int_equal(ops->key_use(h, "key_a", since, &u), 0);
        assert_int_equal(u.reserved_micros, 300);
        assert_int_equal(u.reserved_seconds, 50);
        ops->close(h);
        free(url);
}

/* What a listing of charges saw: how many, and the last one. */
typedef struct Collected {
        StoreLedgerInterval last;
        char last_key_name[32];
        int n;
} Collected;

static int collect(const StoreLedgerInterval *iv, void *userdata) {
        Collected *c = userdata;
        c->last = *iv;
        snprintf(c->last_key_name, sizeof c->last_key_name, "%s", iv->key_name);
        c->last.sandbox_id = c->last.key_id = c->last.key_name = NULL; /* not kept past the call */
        c->n++;
        return 0;
}

static int stop_at_first(const StoreLedgerInterval *iv, void *userdata) {
        (*(int *)userdata)++;
        return -ECANCELED;
}

static void test_ledger_charges_round_trip(void **state) {
        char *url = pg_fresh("t_ledger_charges");
        const StoreLedgerOps *ops = store_postgres.ledger;
        StoreLedger *h = NULL;
        assert_int_equal(ops->open(url, &h), 0);
        key_insert(url, "key_a", "own_a", 777, true);
        key_insert(url, "key_n", "own_n", -1, false);
        StoreLedgerKey k;
        assert_int_equal(ops->key_budget(h, "key_a", &k), 0);
        assert_int_equal(k.daily_limit_micros, 777);
        assert_true(k.trial);
        assert_int_equal(ops->key_budget(h, "key_n", &k), 0);
        assert_int_equal(k.daily_limit_micros, -1);
        assert_false(k.trial);
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
        assert_int_equal(got.last.price_per_hour, 3600);
        /* After a crash: closed at the heartbeat, priced by the caller. */
        int64_t end = 0;
        assert_int_equal(ops->settle(h, "sbx_c", t + 50, true, t + 50, cost, &end), 0);
        assert_int_equal(end, t + 10);
        end = 0;
        assert_int_equal(ops->settle(h, "sbx_c", t + 60, false, t + 60, cost, &end), -ENOENT);
        assert_int_equal(end, 0);
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
        assert_int_equal(u.reservations_end, 0);
        /* Charges ended before `since` do not count against the day. */
        assert_int_equal(ops->key_use(h, "key_a", t + 10, &u), 0);
        assert_int_equal(u.settled_micros, 0);
        assert_int_equal(u.oldest_charge_end, 0);
        assert_int_equal(u.settled_seconds, 10);
        /* A second run: its prior seconds are the first's. */
        assert_int_equal(ops->begin(h, "sbx_c", "key_a", "own_a", t + 100, 3600, t + 200), 0);
        assert_int_equal(ops->settle(h, "sbx_c", t + 105, false, t + 105, cost, NULL), 0);
        got = (Collected){ 0 };
        assert_int_equal(ops->owner_intervals(h, "own_a", t, t + 1000, collect, &got), 0);
        assert_int_equal(got.n, 2);
        assert_int_equal(got.last.prior_seconds, 10);
        assert_int_equal(got.last.seconds, 5);
        assert_string_equal(got.last_key_name, "key_a");
        assert_int_equal(got.last.reservation_expires_at, t + 3600); /* settled before the second run: kept */
        /* A window that ends before the second run started. */
        got = (Collected){ 0 };
        assert_int_equal(ops->owner_intervals(h, "own_a", t, t + 50, collect, &got), 0);
        assert_int_equal(got.n, 1);
        int calls = 0;
        assert_int_equal(ops->owner_intervals(h, "own_a", t, t + 1000, stop_at_first, &calls), -ECANCELED);
        assert_int_equal(calls, 1);
        got = (Collected){ 0 };
        assert_int_equal(ops->owner_intervals(h, "own_none", t, t + 1000, collect, &got), 0);
        assert_int_equal(got.n, 0);
        assert_int_equal(ops->sandbox_intervals(h, "sbx_none", collect, &got), 0);
        assert_int_equal(got.n, 0);
        /* A paused disk's seconds are not sandbox-seconds of the allowance. */
        assert_int_equal(ops->begin(h, "sbx_c" LEDGER_DISK_SUFFIX, "key_a", "own_a", t + 200, 3600, t + 300), 0);
        assert_int_equal(ops->settle(h, "sbx_c" LEDGER_DISK_SUFFIX, t + 230, false, t + 230, cost, NULL), 0);
        assert_int_equal(ops->key_use(h, "key_a", t - 86400, &u), 0);
        assert_int_equal(u.settled_seconds, 15);
        assert_int_equal(u.settled_micros, 45);
        /* A reservation of no sandbox settles as an orphan once it is too
         * old to be a create in flight; a running one's stays. */
        sql(url, "INSERT INTO sandboxes (id, owner, key_id, labels, spec, state, created_at) VALUES "
                 "('sbx_run', 'own_a', 'key_a', '{}', '{}', 'running', 0)");
        r = reservation("sbx_o", 100, 60);
        assert_int_equal(ops->reserve(h, &r, &b, t - 86400, t, &u), 0);
        r = reservation("sbx_run", 200, 60);
        assert_int_equal(ops->reserve(h, &r, &b, t - 86400, t, &u), 0);
        assert_int_equal(ops->settle_orphans(h, t + 1), 0);
        assert_int_equal(ops->key_use(h, "key_a", t - 86400, &u), 0);
        assert_int_equal(u.reserved_micros, 300); /* sbx_o's may be another host's create in flight */
        assert_int_equal(ops->settle_orphans(h, t + LEDGER_ORPHAN_GRACE_SECONDS), 0);
        assert_int_equal(ops->key_use(h, "key_a", t - 86400, &u), 0);
        assert_int_equal(u.reserved_micros, 200);
        ops->close(h);
        free(url);
}

typedef struct Racer {
        const char *url;
        char sandbox[24];
        int result;
} Racer;

static void *race(void *arg) {
        Racer *r = arg;
        StoreLedger *h = NULL;
        r->result = store_postgres.ledger->open(r->url, &h);
        if (r->result < 0)
                return NULL;
        LedgerBudget b = { .daily_limit_micros = 500, .allowance_seconds = -1 };
        StoreReservation res = reservation(r->sandbox, 100, 60);
        StoreLedgerUse u;
        r->result = store_postgres.ledger->reserve(h, &res, &b, 1800000000 - 86400, 1800000000, &u);
        store_postgres.ledger->close(h);
        return NULL;
}

static void test_ledger_two_handles_never_overshoot(void **state) {
        char *url = pg_fresh("t_ledger_race");
        const StoreLedgerOps *ops = store_postgres.ledger;
        StoreLedger *a = NULL, *b = NULL;
        assert_int_equal(ops->open(url, &a), 0);
        assert_int_equal(ops->open(url, &b), 0);
        key_insert(url, "key_a", "own_a", 500, false);
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

        /* Twelve connections, as many hosts, race for a budget of five
         * reservations: the serializable transactions let exactly five in,
         * with no lock of this process between them. */
        Racer racers[12];
        pthread_t threads[12];
        for (int i = 0; i < 12; i++) {
                racers[i] = (Racer){ .url = url };
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
        assert_int_equal(ops->open(url, &a), 0);
        assert_int_equal(ops->key_use(a, "key_a", 0, &u), 0);
        assert_int_equal(u.reserved_micros, 500);
        ops->close(a);
        free(url);
}

/* ---- uploads ---- */

static StoreUpload upload(const char *id, const char *sandbox) {
        StoreUpload u = { .id = id, .sandbox_id = sandbox, .owner = "own_a", .path = "/workspace/f",
                          .user = REQ_AS_ROOT, .mode = 0640, .size = 3 * 1024 * 1024 + 5, .has_sha256 = true,
                          .chunk_bytes = 1024 * 1024, .parts = 4, .created_at = 100, .touched_at = 100 };
        for (size_t i = 0; i < sizeof(u.sha256); i++)
                u.sha256[i] = (uint8_t)(0xa0 + i);
        return u;
}

/* What a listing saw: the uploads' ids in order, and the first one whole. */
typedef struct Seen {
        char ids[8][24];
        size_t n;
        StoreUpload first;
        char first_path[64];
        bool first_live;
        StoreUploadPart parts[8];
        size_t n_parts;
} Seen;

static int see(const StoreUploadListed *l, void *userdata) {
        Seen *s = userdata;
        if (s->n == 0) {
                s->first = l->row;
                snprintf(s->first_path, sizeof s->first_path, "%s", l->row.path);
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

/* The hosts' table of url with rec registered in it at *ret_epoch. */
static StoreHosts *registered(const char *url, const HostRecord *rec, int64_t *ret_epoch) {
        StoreHosts *hosts = NULL;
        assert_int_equal(store_postgres.hosts->open(url, &hosts), 0);
        assert_int_equal(store_postgres.hosts->register_host(hosts, rec, 100, ret_epoch), 0);
        return hosts;
}

/* A host's ledger writes are made at its epoch: once the host is declared
 * dead (or its id registered again), every write of the old epoch is
 * -EOWNERDEAD and changes nothing, while a handle at the new epoch and the
 * other hosts write on. */
static void test_ledger_writes_need_a_live_epoch(void **state) {
        char *url = pg_fresh("t_ledger_epoch");
        const StoreLedgerOps *ops = store_postgres.ledger;
        const StoreHostOps *hops = store_postgres.hosts;
        HostRecord rec = hosts_test_record("host_ledgerledgerled", "http://10.0.0.1:7878");
        int64_t epoch = 0;
        StoreHosts *hosts = registered(url, &rec, &epoch);
        key_insert(url, "key_a", "own_a", -1, false);
        StoreLedger *h = NULL;
        assert_int_equal(ops->open(url, &h), 0);
        assert_int_equal(ops->set_host(h, rec.id), 0);
        assert_int_equal(ops->set_epoch(h, epoch), 0);
        const int64_t now = 1800000000, since = now - 86400;
        LedgerBudget b = { .daily_limit_micros = -1, .allowance_seconds = -1 };
        StoreLedgerUse u;
        StoreReservation r = reservation("sbx_e1", 100, 60);
        assert_int_equal(ops->reserve(h, &r, &b, since, now, &u), 0);
        assert_int_equal(ops->begin(h, "sbx_e1", "key_a", "own_a", now, 3600000000u, now + 3600), 0);
        assert_int_equal(ops->heartbeat(h, now + 10), 0);

        /* Declared dead: the old epoch writes nothing. */
        assert_int_equal(hops->declare_dead(hosts, rec.id, epoch, 100, 200), 0);
        r = reservation("sbx_e2", 100, 60);
        assert_int_equal(ops->reserve(h, &r, &b, since, now, &u), -EOWNERDEAD);
        assert_int_equal(ops->begin(h, "sbx_e1", "key_a", "own_a", now + 20, 3600000000u, now + 3600), -EOWNERDEAD);
        assert_int_equal(ops->heartbeat(h, now + 30), -EOWNERDEAD);
        int64_t end = 0;
        assert_int_equal(ops->settle(h, "sbx_e1", now + 40, false, now + 40, cost, &end), -EOWNERDEAD);
        assert_int_equal(ops->release(h, "sbx_e1", now + 40), -EOWNERDEAD);
        assert_int_equal(ops->settle_orphans(h, now + 40), -EOWNERDEAD);
        /* Nothing moved: one open charge, its heartbeat at +10, one open
         * reservation. */
        assert_int_equal(ops->key_use(h, "key_a", since, &u), 0);
        assert_int_equal(u.reserved_micros, 100);
        assert_int_equal(u.settled_micros, 0);

        /* Registered again at a new epoch: a handle of that epoch writes,
         * settling the charge at its last heartbeat; the old epoch still
         * cannot. */
        int64_t again = 0;
        assert_int_equal(hops->register_host(hosts, &rec, 300, &again), 0);
        assert_true(again > epoch);
        assert_int_equal(ops->heartbeat(h, now + 50), -EOWNERDEAD);
        StoreLedger *h2 = NULL;
        assert_int_equal(ops->open(url, &h2), 0);
        assert_int_equal(ops->set_host(h2, rec.id), 0);
        assert_int_equal(ops->set_epoch(h2, again), 0);
        assert_int_equal(ops->settle(h2, "sbx_e1", now + 60, true, now + 60, cost, &end), 0);
        assert_int_equal(end, now + 10);
        assert_int_equal(ops->key_use(h2, "key_a", since, &u), 0);
        assert_int_equal(u.reserved_micros, 0);
        assert_int_equal(u.settled_micros, 10 * 1000000); /* 10 s at 1 000 000 a second */

        /* Epoch 0: no condition (a host outside a fleet). */
        StoreLedger *solo = NULL;
        assert_int_equal(ops->open(url, &solo), 0);
        assert_int_equal(ops->set_host(solo, rec.id), 0);
        r = reservation("sbx_e3", 100, 60);
        assert_int_equal(ops->reserve(solo, &r, &b, since, now, &u), 0);
        ops->close(solo);
        ops->close(h2);
        ops->close(h);
        hops->close(hosts);
        free(url);
}

static void test_uploads_round_trip(void **state) {
        char *url = pg_fresh("t_uploads");
        key_insert(url, "key_a", "own_a", -1, false);
        sql(url, "INSERT INTO sandboxes (id, owner, key_id, labels, spec, state, created_at) VALUES "
                 "('sbx_a', 'own_a', 'key_a', '{}', '{}', 'running', 0)");
        const StoreUploadOps *ops = store_postgres.uploads;
        StoreUploads *h = NULL;
        assert_int_equal(ops->open(url, &h), 0);
        StoreUpload u = upload("upl_0000000000000001", "sbx_a");
        assert_int_equal(ops->insert(h, &u), 0);
        assert_int_equal(ops->insert(h, &u), -EEXIST);
        StoreUpload arch = upload("upl_0000000000000002", "sbx_gone");
        arch.archive = true;
        arch.user = REQ_AS_SANDBOX;
        arch.created_at = 200;
        assert_int_equal(ops->insert(h, &arch), 0);
        StoreUpload plain = upload("upl_0000000000000004", "sbx_gone");
        plain.has_sha256 = false;
        plain.user = REQ_AS_DEFAULT;
        plain.created_at = 300;
        assert_int_equal(ops->insert(h, &plain), 0);
        StoreUpload bad = upload("upl_0000000000000005", "sbx_a");
        bad.user = (ReqUser)42;
        assert_int_equal(ops->insert(h, &bad), -EINVAL);
        assert_int_equal(ops->record_part(h, u.id, 3, 5, 150), 0);
        assert_int_equal(ops->record_part(h, u.id, 0, 1024 * 1024, 160), 0);
        assert_int_equal(ops->record_part(h, u.id, 3, 5, 170), 0); /* again: replaced */
        assert_int_equal(ops->record_part(h, "upl_none", 0, 1, 170), -ENOENT);

        Seen s = { 0 };
        assert_int_equal(ops->list(h, see, &s), 0);
        assert_int_equal(s.n, 3);
        assert_string_equal(s.ids[0], u.id); /* oldest first */
        assert_string_equal(s.ids[1], arch.id);
        assert_string_equal(s.ids[2], plain.id);
        assert_true(s.first_live);
        assert_false(s.first.archive);
        assert_string_equal(s.first_path, "/workspace/f");
        assert_int_equal(s.first.user, REQ_AS_ROOT);
        assert_int_equal(s.first.mode, 0640);
        assert_int_equal(s.first.size, 3 * 1024 * 1024 + 5);
        assert_true(s.first.has_sha256);
        assert_memory_equal(s.first.sha256, u.sha256, 32);
        assert_int_equal(s.first.chunk_bytes, 1024 * 1024);
        assert_int_equal(s.first.parts, 4);
        assert_int_equal(s.first.created_at, 100);
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
        assert_int_equal(ops->record_part(h, plain.id, 1, 7, 180), 0);
        memset(&s, 0, sizeof(s));
        assert_int_equal(ops->list(h, see, &s), 0);
        assert_int_equal(s.n, 2);
        assert_true(s.first.archive);
        assert_false(s.first_live); /* no such sandbox */
        assert_int_equal(s.first.user, REQ_AS_SANDBOX);
        assert_int_equal(s.first.size, 0);
        assert_false(s.first.has_sha256);
        assert_int_equal(s.n_parts, 0);
        assert_int_equal(ops->remove_sandbox(h, "sbx_gone"), 0);
        memset(&s, 0, sizeof(s));
        assert_int_equal(ops->list(h, see, &s), 0);
        assert_int_equal(s.n, 0);
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), 0);
        PGresult *res = NULL;
        assert_int_equal(pgdb_run(&c, "SELECT count(*) FROM upload_parts", NULL, &res), 0);
        assert_int_equal(pgi(res, 0, 0), 0);
        PQclear(res);
        pgdb_close(&c);
        ops->close(h);
        free(url);
}

static int count_upload(const StoreUploadListed *l, void *userdata) {
        (*(int *)userdata)++;
        return 0;
}

/* Uploads and events are written at the host's epoch too. */
static void test_uploads_and_events_need_a_live_epoch(void **state) {
        char *url = pg_fresh("t_upl_epoch");
        const StoreHostOps *hops = store_postgres.hosts;
        HostRecord rec = hosts_test_record("host_uplduplduplduplo", "http://10.0.0.1:7878");
        int64_t epoch = 0;
        StoreHosts *hosts = registered(url, &rec, &epoch);
        const StoreUploadOps *uops = store_postgres.uploads;
        StoreUploads *u = NULL;
        assert_int_equal(uops->open(url, &u), 0);
        assert_int_equal(uops->set_writer(u, rec.id, epoch), 0);
        const StoreEventOps *eops = store_postgres.events;
        StoreEvents *ev = NULL;
        assert_int_equal(eops->open(url, &ev), 0);
        assert_int_equal(eops->set_writer(ev, rec.id, epoch), 0);
        StoreUpload one = upload("upl_0000000000000011", "sbx_a");
        assert_int_equal(uops->insert(u, &one), 0);
        EventRecord e = { .owner = "own_a", .type = "sandbox.created", .resource_type = "sandbox",
                          .resource_id = "sbx_a", .host_id = rec.id, .at = 100 };
        snprintf(e.id, sizeof e.id, "evt_%020d", 1);
        assert_int_equal(eops->append(ev, &e), 0);

        assert_int_equal(hops->declare_dead(hosts, rec.id, epoch, 100, 200), 0);
        StoreUpload two = upload("upl_0000000000000012", "sbx_a");
        assert_int_equal(uops->insert(u, &two), -EOWNERDEAD);
        assert_int_equal(uops->record_part(u, one.id, 0, 10, 300), -EOWNERDEAD);
        assert_int_equal(uops->remove(u, one.id), -EOWNERDEAD);
        assert_int_equal(uops->remove_sandbox(u, "sbx_a"), -EOWNERDEAD);
        snprintf(e.id, sizeof e.id, "evt_%020d", 2);
        assert_int_equal(eops->append(ev, &e), -EOWNERDEAD);
        /* Nothing moved. */
        int n = 0;
        assert_int_equal(uops->list(u, count_upload, &n), 0);
        assert_int_equal(n, 1);
        eops->close(ev);
        uops->close(u);
        hops->close(hosts);
        free(url);
}

static void test_uploads_two_handles(void **state) {
        char *url = pg_fresh("t_uploads_two");
        const StoreUploadOps *ops = store_postgres.uploads;
        StoreUploads *a = NULL, *b = NULL;
        assert_int_equal(ops->open(url, &a), 0);
        assert_int_equal(ops->open(url, &b), 0);
        StoreUpload u = upload("upl_0000000000000003", "sbx_a");
        assert_int_equal(ops->insert(a, &u), 0);
        assert_int_equal(ops->insert(b, &u), -EEXIST);
        assert_int_equal(ops->record_part(b, u.id, 1, 1024 * 1024, 300), 0);
        Seen s = { 0 };
        assert_int_equal(ops->list(a, see, &s), 0);
        assert_int_equal(s.n, 1);
        assert_false(s.first_live);
        assert_int_equal(s.n_parts, 1);
        assert_int_equal(s.parts[0].index, 1);
        assert_int_equal(s.parts[0].bytes, 1024 * 1024);
        assert_int_equal(s.first.touched_at, 300);
        assert_int_equal(ops->remove_sandbox(b, "sbx_a"), 0);
        assert_int_equal(ops->record_part(a, u.id, 2, 1024 * 1024, 310), -ENOENT);
        memset(&s, 0, sizeof(s));
        assert_int_equal(ops->list(a, see, &s), 0);
        assert_int_equal(s.n, 0);
        ops->close(a);
        ops->close(b);
        free(url);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_backend_table),
                cmocka_unit_test(test_ledger_reservation_against_budget),
                cmocka_unit_test(test_ledger_charges_round_trip),
                cmocka_unit_test(test_ledger_two_handles_never_overshoot),
                cmocka_unit_test(test_ledger_writes_need_a_live_epoch),
                cmocka_unit_test(test_uploads_and_events_need_a_live_epoch),
                cmocka_unit_test(test_uploads_round_trip),
                cmocka_unit_test(test_uploads_two_handles),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
