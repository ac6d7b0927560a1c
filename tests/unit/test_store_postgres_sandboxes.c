/* The PostgreSQL backend's sandboxes (with the Idempotency-Key records) and
 * snapshots, through the store's interface, against a real server: round
 * trips, the limits, conditional writes, owner scoping, the queries, rows
 * that cannot be read, and connections (as many hosts) racing for a limit. */
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
#include "daemon/store/store_sandboxes.h"
#include "daemon/store/store_snapshots.h"
#include "daemon/store/store_hosts.h"
#include "test_pg_harness.h"
#include "test_store_fleet_helper.h"
#include "test_store_sandbox_order_helper.h"

/* ---- sandboxes ---- */

typedef struct Fixture {
        char *url;
        PgConn raw; /* SQL run directly, as another tool would */
        StoreSandboxes *h;
} Fixture;

static void open_fixture(Fixture *f, const char *schema) {
        f->url = pg_fresh(schema);
        assert_int_equal(store_postgres.sandboxes->open(f->url, &f->h), 0);
        assert_int_equal(pgdb_open(f->url, &f->raw), 0);
        /* The sandboxes name their key. */
        assert_int_equal(pgdb_exec(&f->raw,
                                   "INSERT INTO keys (id, name, owner, access, hash, created_at) VALUES "
                                   "('key_1', 'k', 'alice', 'full', 'h1', 1), ('key_2', 'k', 'bob', 'full', 'h2', 1)",
                                   NULL),
                         0);
}

static void close_fixture(Fixture *f) {
        store_postgres.sandboxes->close(f->h);
        pgdb_close(&f->raw);
        free(f->url);
}

static void make_row(SandboxRow *r, const char *id, const char *owner) {
        *r = (SandboxRow){ .owner = (char *)owner,
                           .key_id = strcmp(owner, "bob") == 0 ? "key_2" : "key_1",
                           .labels = "{}",
                           .created_at = 1,
                           .state = SANDBOX_STARTING };
        snprintf(r->id, sizeof r->id, "%s", id);
        sandbox_spec_init(&r->spec);
        r->spec.image = "default";
        r->spec.driver = SANDBOX_DRIVER_NAMESPACE;
}

static void test_sandboxes_round_trip_and_conditional_update(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_update");
        const StoreSandboxOps *ops = store_postgres.sandboxes;
        SandboxRow row;
        make_row(&row, "sbx_a", "alice");
        row.name = "first";
        row.labels = "{\"team\":\"x\"}";
        row.lease_ends_at = 500;
        row.run_as_root = true;
        row.spec.vcpu = 2;
        row.spec.on_lease_end = LEASE_END_PAUSE;
        assert_int_equal(ops->insert(f.h, &row, 10, 10), 0);
        assert_int_equal(row.version, 1);
        assert_int_equal(ops->insert(f.h, &row, 10, 10), -EEXIST);
        SandboxRow a, b;
        assert_int_equal(ops->get(f.h, "sbx_a", &a), 0);
        assert_string_equal(a.id, "sbx_a");
        assert_string_equal(a.owner, "alice");
        assert_string_equal(a.key_id, "key_1");
        assert_string_equal(a.name, "first");
        assert_string_equal(a.labels, "{\"team\":\"x\"}");
        assert_string_equal(a.spec.image, "default");
        assert_int_equal(a.spec.driver, SANDBOX_DRIVER_NAMESPACE);
        assert_int_equal(a.spec.vcpu, 2);
        assert_int_equal(a.spec.on_lease_end, LEASE_END_PAUSE);
        assert_int_equal(a.state, SANDBOX_STARTING);
        assert_null(a.failure_reason);
        assert_int_equal(a.created_at, 1);
        assert_int_equal(a.started_at, 0);
        assert_int_equal(a.lease_ends_at, 500);
        assert_true(a.run_as_root);
        assert_int_equal(a.version, 1);
        assert_int_equal(ops->get(f.h, "sbx_a", &b), 0);
        a.state = SANDBOX_RUNNING;
        a.started_at = 7;
        a.run_seconds = 3;
        a.spec.timeout_seconds = 60;
        a.run_as_root = false;
        assert_int_equal(ops->update(f.h, &a), 0);
        assert_int_equal(a.version, 2);
        /* b read version 1: its write would lose a's. */
        b.state = SANDBOX_STOPPED;
        assert_int_equal(ops->update(f.h, &b), -ESTALE);
        SandboxRow c;
        assert_int_equal(ops->get(f.h, "sbx_a", &c), 0);
        assert_int_equal(c.state, SANDBOX_RUNNING);
        assert_int_equal(c.started_at, 7);
        assert_int_equal(c.run_seconds, 3);
        assert_int_equal(c.spec.timeout_seconds, 60);
        assert_false(c.run_as_root);
        assert_int_equal(c.version, 2);
        /* Name and labels are their own columns: no version taken. */
        assert_int_equal(ops->set_meta(f.h, "sbx_a", NULL, "{\"x\":\"y\"}"), 0);
        assert_int_equal(ops->set_meta(f.h, "sbx_none", "n", "{}"), -ENOENT);
        c.failure_reason = strdup("it broke");
        c.state = SANDBOX_FAILED;
        assert_int_equal(ops->update(f.h, &c), 0);
        sandbox_row_done(&c);
        assert_int_equal(ops->get(f.h, "sbx_a", &c), 0);
        assert_null(c.name);
        assert_string_equal(c.labels, "{\"x\":\"y\"}");
        assert_string_equal(c.failure_reason, "it broke");
        assert_int_equal(c.version, 3);
        /* Deleted: kept as history, but no longer found. */
        c.deleted_at = 9;
        c.state = SANDBOX_DELETED;
        assert_int_equal(ops->update(f.h, &c), 0);
        sandbox_row_done(&c);
        assert_int_equal(ops->get(f.h, "sbx_a", &c), -ENOENT);
        assert_int_equal(ops->set_meta(f.h, "sbx_a", "n", "{}"), -ENOENT);
        snprintf(b.id, sizeof b.id, "sbx_none");
        assert_int_equal(ops->update(f.h, &b), -ENOENT);
        sandbox_row_done(&a);
        sandbox_row_done(&b);
        close_fixture(&f);
}

static void test_sandboxes_limits(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_limits");
        const StoreSandboxOps *ops = store_postgres.sandboxes;
        SandboxRow row;
        make_row(&row, "sbx_a1", "alice");
        assert_int_equal(ops->insert(f.h, &row, 3, 2), 0);
        make_row(&row, "sbx_a2", "alice");
        assert_int_equal(ops->insert(f.h, &row, 3, 2), 0);
        make_row(&row, "sbx_a3", "alice");
        assert_int_equal(ops->insert(f.h, &row, 3, 2), -EDQUOT);
        make_row(&row, "sbx_b1", "bob");
        assert_int_equal(ops->insert(f.h, &row, 3, 2), 0);
        make_row(&row, "sbx_b2", "bob");
        assert_int_equal(ops->insert(f.h, &row, 3, 2), -EUSERS);
        /* A deleted sandbox no longer counts. */
        SandboxRow got;
        assert_int_equal(ops->get(f.h, "sbx_a1", &got), 0);
        got.deleted_at = 5;
        got.state = SANDBOX_DELETED;
        assert_int_equal(ops->update(f.h, &got), 0);
        sandbox_row_done(&got);
        make_row(&row, "sbx_a3", "alice");
        assert_int_equal(ops->insert(f.h, &row, 3, 2), 0);
        close_fixture(&f);
}

typedef struct Seen {
        char ids[8][32];
        int n;
} Seen;

static int on_row(void *userdata, SandboxRow *row) {
        Seen *s = userdata;
        assert_true(s->n < 8);
        snprintf(s->ids[s->n++], sizeof s->ids[0], "%s", row->id);
        return 0;
}

static bool seen(const Seen *s, const char *id) {
        for (int i = 0; i < s->n; i++)
                if (strcmp(s->ids[i], id) == 0)
                        return true;
        return false;
}

static int stop_walk(void *userdata, SandboxRow *row) {
        (*(int *)userdata)++;
        return -ECANCELED;
}

typedef struct Counts {
        int64_t n[_SANDBOX_STATE_MAX];
} Counts;

static void on_count(void *userdata, SandboxState st, int64_t n) {
        ((Counts *)userdata)->n[st] = n;
}

/* Inserts id of owner in state, with a lease end and a policy. */
static void put(Fixture *f, const char *id, const char *owner, SandboxState st, int64_t created, int64_t lease,
                LeaseEnd on_end) {
        SandboxRow row;
        make_row(&row, id, owner);
        row.created_at = created;
        row.lease_ends_at = lease;
        row.spec.on_lease_end = on_end;
        assert_int_equal(store_postgres.sandboxes->insert(f->h, &row, 100, 100), 0);
        if (st == SANDBOX_STARTING)
                return;
        SandboxRow got;
        assert_int_equal(store_postgres.sandboxes->get(f->h, id, &got), 0);
        got.state = st;
        if (st == SANDBOX_DELETED)
                got.deleted_at = 1;
        assert_int_equal(store_postgres.sandboxes->update(f->h, &got), 0);
        sandbox_row_done(&got);
}

static void test_sandboxes_queries(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_queries");
        const StoreSandboxOps *ops = store_postgres.sandboxes;
        put(&f, "sbx_run_due", "alice", SANDBOX_RUNNING, 10, 100, LEASE_END_STOP);
        put(&f, "sbx_run_later", "alice", SANDBOX_RUNNING, 20, 1000, LEASE_END_STOP);
        put(&f, "sbx_paused_del", "alice", SANDBOX_PAUSED, 20, 100, LEASE_END_DELETE);
        put(&f, "sbx_paused_keep", "bob", SANDBOX_PAUSED, 30, 100, LEASE_END_PAUSE);
        put(&f, "sbx_start_del", "bob", SANDBOX_STARTING, 40, 100, LEASE_END_DELETE);
        put(&f, "sbx_stopped", "bob", SANDBOX_STOPPED, 50, 0, LEASE_END_STOP);
        put(&f, "sbx_gone", "alice", SANDBOX_DELETED, 60, 100, LEASE_END_DELETE);

        /* One owner's, newest first; the same millisecond by id, descending. */
        Seen s = { 0 };
        assert_int_equal(ops->query(f.h, STORE_SANDBOXES_OF_OWNER, "alice", 0, on_row, &s), 0);
        assert_int_equal(s.n, 3);
        assert_string_equal(s.ids[0], "sbx_run_later");
        assert_string_equal(s.ids[1], "sbx_paused_del");
        assert_string_equal(s.ids[2], "sbx_run_due");
        s = (Seen){ 0 };
        assert_int_equal(ops->query(f.h, STORE_SANDBOXES_OF_OWNER, "carol", 0, on_row, &s), 0);
        assert_int_equal(s.n, 0);

        s = (Seen){ 0 };
        assert_int_equal(ops->query(f.h, STORE_SANDBOXES_ACTIVE, NULL, 0, on_row, &s), 0);
        assert_int_equal(s.n, 5);
        assert_false(seen(&s, "sbx_stopped"));
        assert_false(seen(&s, "sbx_gone"));

        /* Due at 100: the running one whose lease is over, and one to be
         * deleted at lease end that is not starting. */
        s = (Seen){ 0 };
        assert_int_equal(ops->query(f.h, STORE_SANDBOXES_LEASE_DUE, NULL, 100, on_row, &s), 0);
        assert_int_equal(s.n, 2);
        assert_true(seen(&s, "sbx_run_due"));
        assert_true(seen(&s, "sbx_paused_del"));
        s = (Seen){ 0 };
        assert_int_equal(ops->query(f.h, STORE_SANDBOXES_LEASE_DUE, NULL, 99, on_row, &s), 0);
        assert_int_equal(s.n, 0);

        /* fn's error stops the walk and is returned. */
        int calls = 0;
        assert_int_equal(ops->query(f.h, STORE_SANDBOXES_ACTIVE, NULL, 0, stop_walk, &calls), -ECANCELED);
        assert_int_equal(calls, 1);
        assert_int_equal(ops->query(f.h, (StoreSandboxQuery)99, NULL, 0, on_row, &s), -EINVAL);

        Counts c = { 0 };
        assert_int_equal(ops->state_counts(f.h, on_count, &c), 0);
        assert_int_equal(c.n[SANDBOX_RUNNING], 2);
        assert_int_equal(c.n[SANDBOX_PAUSED], 2);
        assert_int_equal(c.n[SANDBOX_STARTING], 1);
        assert_int_equal(c.n[SANDBOX_STOPPED], 1);
        assert_int_equal(c.n[SANDBOX_DELETED], 0);
        close_fixture(&f);
}

typedef struct Bad {
        char ids[4][32];
        int errors[4];
        int n;
} Bad;

static void on_bad(void *userdata, const char *id, int error, const char *why) {
        Bad *b = userdata;
        assert_true(b->n < 4);
        assert_true(strlen(why) > 0);
        snprintf(b->ids[b->n], sizeof b->ids[b->n], "%s", id);
        b->errors[b->n++] = error;
}

static void test_sandboxes_unreadable_rows_are_named(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_check");
        const StoreSandboxOps *ops = store_postgres.sandboxes;
        static const char *const ids[] = { "sbx_good", "sbx_future", "sbx_corrupt", "sbx_badstate", "sbx_gone" };
        for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
                SandboxRow row;
                make_row(&row, ids[i], "alice");
                assert_int_equal(ops->insert(f.h, &row, 10, 10), 0);
        }
        assert_int_equal(pgdb_exec(&f.raw,
                                   "UPDATE sandboxes SET spec_version = 99 WHERE id = 'sbx_future';"
                                   "UPDATE sandboxes SET spec = '{\"image\":' WHERE id = 'sbx_corrupt';"
                                   "UPDATE sandboxes SET state = 'asleep' WHERE id = 'sbx_badstate';"
                                   "UPDATE sandboxes SET spec = 'x', deleted_at = 5 WHERE id = 'sbx_gone';",
                                   NULL),
                         0);
        Bad b = { 0 };
        assert_int_equal(ops->check(f.h, on_bad, &b), 3);
        assert_int_equal(b.n, 3);
        for (int i = 0; i < b.n; i++) {
                if (strcmp(b.ids[i], "sbx_future") == 0)
                        assert_int_equal(b.errors[i], -EPROTONOSUPPORT);
                else if (strcmp(b.ids[i], "sbx_corrupt") == 0)
                        assert_int_equal(b.errors[i], -EBADMSG);
                else {
                        assert_string_equal(b.ids[i], "sbx_badstate");
                        assert_int_equal(b.errors[i], -EBADMSG);
                }
        }
        SandboxRow got;
        assert_int_equal(ops->get(f.h, "sbx_good", &got), 0);
        sandbox_row_done(&got);
        assert_int_equal(ops->get(f.h, "sbx_future", &got), -EPROTONOSUPPORT);
        assert_int_equal(ops->get(f.h, "sbx_corrupt", &got), -EBADMSG);
        assert_int_equal(ops->get(f.h, "sbx_badstate", &got), -EBADMSG);
        close_fixture(&f);
}

/* ---- Idempotency-Key records ---- */

static int64_t idem_rows(Fixture *f, const char *owner) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        PGresult *res = NULL;
        assert_int_equal(pgdb_run(&f->raw, "SELECT count(*) FROM idempotency WHERE owner = $1", &p, &res), 0);
        int64_t n = pgi(res, 0, 0);
        PQclear(res);
        return n;
}

static void test_idempotency(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_idem");
        const StoreSandboxOps *ops = store_postgres.sandboxes;
        unsigned status = 0;
        char *body = NULL;
        int64_t now = 1000000;
        assert_int_equal(ops->idem_claim(f.h, "alice", "k1", "hash1", now, &status, &body), STORE_IDEM_CLAIMED);
        /* The same request while it is served; another request's key. */
        assert_int_equal(ops->idem_claim(f.h, "alice", "k1", "hash1", now, &status, &body), STORE_IDEM_PENDING);
        assert_int_equal(ops->idem_claim(f.h, "alice", "k1", "hash2", now, &status, &body), STORE_IDEM_MISMATCH);
        /* The same key is another owner's own. */
        assert_int_equal(ops->idem_claim(f.h, "bob", "k1", "hash9", now, &status, &body), STORE_IDEM_CLAIMED);
        assert_int_equal(ops->idem_finish(f.h, "alice", "k1", 201, "{\"id\":\"sbx_1\"}"), 0);
        assert_int_equal(ops->idem_claim(f.h, "alice", "k1", "hash1", now + 5, &status, &body), STORE_IDEM_REPLAY);
        assert_int_equal(status, 201);
        assert_string_equal(body, "{\"id\":\"sbx_1\"}");
        free(body);
        body = NULL;
        /* A failure that asks for a retry is not kept: the retry runs again. */
        assert_int_equal(ops->idem_finish(f.h, "bob", "k1", 503, "{}"), 0);
        assert_int_equal(ops->idem_claim(f.h, "bob", "k1", "hash9", now, &status, &body), STORE_IDEM_CLAIMED);
        assert_int_equal(ops->idem_finish(f.h, "bob", "k1", 429, "{}"), 0);
        assert_int_equal(ops->idem_claim(f.h, "bob", "k1", "hash9", now, &status, &body), STORE_IDEM_CLAIMED);
        /* Past its age a record is gone: the key is claimed anew. */
        int64_t later = now + STORE_IDEM_MAX_AGE_SECONDS + 1;
        assert_int_equal(ops->idem_claim(f.h, "alice", "k1", "hash2", later, &status, &body), STORE_IDEM_CLAIMED);
        assert_int_equal(idem_rows(&f, "bob"), 0); /* aged out with the claim */

        /* An owner keeps the newest STORE_IDEM_MAX_PER_OWNER: filled up to
         * the bound, the next claim pushes out the oldest, and another
         * owner's are untouched. */
        PgParams p = { 0 };
        pgp_int(&p, later);
        pgp_int(&p, STORE_IDEM_MAX_PER_OWNER - 1);
        assert_int_equal(pgdb_exec(&f.raw,
                                   "INSERT INTO idempotency (owner, key, hash, status, body, created_at) "
                                   "SELECT 'carol', 'c' || i, 'h', 200, '{}', $1 + i FROM generate_series(0, $2) i",
                                   &p),
                         0);
        assert_int_equal(idem_rows(&f, "carol"), STORE_IDEM_MAX_PER_OWNER);
        int64_t last = later + STORE_IDEM_MAX_PER_OWNER;
        assert_int_equal(ops->idem_claim(f.h, "carol", "new", "h", last, &status, &body), STORE_IDEM_CLAIMED);
        assert_int_equal(idem_rows(&f, "carol"), STORE_IDEM_MAX_PER_OWNER);
        assert_int_equal(ops->idem_claim(f.h, "carol", "c0", "h", last, &status, &body), STORE_IDEM_CLAIMED);
        assert_int_equal(ops->idem_claim(f.h, "carol", "c2", "h", last, &status, &body), STORE_IDEM_REPLAY);
        free(body);
        body = NULL;
        assert_int_equal(idem_rows(&f, "carol"), STORE_IDEM_MAX_PER_OWNER);
        assert_int_equal(idem_rows(&f, "alice"), 1);
        /* A body over the bound is not kept. */
        char *big = malloc(STORE_IDEM_MAX_BODY + 2);
        memset(big, 'x', STORE_IDEM_MAX_BODY + 1);
        big[STORE_IDEM_MAX_BODY + 1] = '\0';
        assert_int_equal(ops->idem_finish(f.h, "alice", "k1", 200, big), 0);
        free(big);
        assert_int_equal(ops->idem_claim(f.h, "alice", "k1", "hash2", later, &status, &body), STORE_IDEM_CLAIMED);
        close_fixture(&f);
}

typedef struct Race {
        const char *url;
        int index;
        int result;
} Race;

static void *race_sandbox(void *userdata) {
        Race *a = userdata;
        StoreSandboxes *h;
        a->result = store_postgres.sandboxes->open(a->url, &h);
        if (a->result < 0)
                return NULL;
        char id[32];
        snprintf(id, sizeof id, "sbx_r%d", a->index);
        SandboxRow row;
        make_row(&row, id, "alice");
        a->result = store_postgres.sandboxes->insert(h, &row, 100, 5);
        store_postgres.sandboxes->close(h);
        return NULL;
}

/* Twelve connections (as many hosts) race for an owner's bound of 5:
 * exactly 5 win, by the serializable transactions alone. */
static void test_sandboxes_race_across_connections(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_race");
        Race races[12];
        pthread_t t[12];
        for (int i = 0; i < 12; i++) {
                races[i] = (Race){ .url = f.url, .index = i };
                assert_int_equal(pthread_create(&t[i], NULL, race_sandbox, &races[i]), 0);
        }
        int won = 0;
        for (int i = 0; i < 12; i++) {
                pthread_join(t[i], NULL);
                if (races[i].result == 0)
                        won++;
                else
                        assert_int_equal(races[i].result, -EDQUOT);
        }
        assert_int_equal(won, 5);
        Seen s = { 0 };
        assert_int_equal(store_postgres.sandboxes->query(f.h, STORE_SANDBOXES_OF_OWNER, "alice", 0, on_row, &s), 0);
        assert_int_equal(s.n, 5);
        close_fixture(&f);
}

static void *race_claim(void *userdata) {
        Race *a = userdata;
        StoreSandboxes *h;
        a->result = store_postgres.sandboxes->open(a->url, &h);
        if (a->result < 0)
                return NULL;
        unsigned status = 0;
        char *body = NULL;
        /* Half the same key, half keys of their own. */
        char key[16];
        snprintf(key, sizeof key, "k%d", a->index % 2 ? a->index : 0);
        a->result = store_postgres.sandboxes->idem_claim(h, "alice", key, "hash", 1000, &status, &body);
        free(body);
        store_postgres.sandboxes->close(h);
        return NULL;
}

/* Connections claiming at once: one claim per key, the same key's others
 * see it pending. */
static void test_idempotency_race_across_connections(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_idem_race");
        Race races[12];
        pthread_t t[12];
        for (int i = 0; i < 12; i++) {
                races[i] = (Race){ .url = f.url, .index = i };
                assert_int_equal(pthread_create(&t[i], NULL, race_claim, &races[i]), 0);
        }
        int claimed_same = 0;
        for (int i = 0; i < 12; i++) {
                pthread_join(t[i], NULL);
                if (i % 2)
                        assert_int_equal(races[i].result, STORE_IDEM_CLAIMED);
                else if (races[i].result == STORE_IDEM_CLAIMED)
                        claimed_same++;
                else
                        assert_int_equal(races[i].result, STORE_IDEM_PENDING);
        }
        assert_int_equal(claimed_same, 1);
        assert_int_equal(idem_rows(&f, "alice"), 7);
        close_fixture(&f);
}

/* ---- snapshots ---- */

#define ID_A "snp_aaaaaaaaaaaaaaaaaaaa"
#define ID_B "snp_bbbbbbbbbbbbbbbbbbbb"
#define ID_C "snp_cccccccccccccccccccc"
#define ID_T "snp_dddddddddddddddddddd"
/* An insert's bound on the owner's bytes when the test is not about it. */
#define NO_BYTES_BOUND INT64_MAX
#define SPEC "{\"driver\":\"namespace\",\"image\":\"base\"}"
#define SPEC_TRANSIENT "{\"driver\":\"namespace\",\"image\":\"base\",\"transient\":true}"
#define SPEC_LAYER "{\"driver\":\"namespace\",\"image\":\"base\",\"layer\":true}"

static SnapshotRow snap(const char *id, const char *owner, const char *spec, int64_t created_at) {
        SnapshotRow r = { .owner = (char *)owner,
                          .key_id = (char *)"key_1",
                          .sandbox_id = (char *)"sb_1",
                          .labels = (char *)"{}",
                          .spec = (char *)spec,
                          .size_bytes = 4096,
                          .created_at = created_at,
                          .expires_at = created_at + 100 };
        snprintf(r.id, sizeof r.id, "%s", id);
        snprintf(r.mode, sizeof r.mode, "disk");
        return r;
}

/* How many snapshots owner keeps, as the store's usage says. */
static int64_t count_of(const StoreSnapshotOps *ops, StoreSnapshots *h, const char *owner) {
        StoreSnapshotUsage u = { .count = -1 };
        assert_int_equal(ops->usage(h, owner, &u), 0);
        return u.count;
}

static StoreSnapshots *snapshots_open(const char *schema, char **ret_url) {
        *ret_url = pg_fresh(schema);
        StoreSnapshots *h = NULL;
        assert_int_equal(store_postgres.snapshots->open(*ret_url, &h), 0);
        return h;
}

static void free_list(SnapshotRow *list, size_t n) {
        for (size_t i = 0; i < n; i++)
                store_snapshot_row_clear(&list[i]);
        free(list);
}

static void test_snapshots_round_trip(void **state) {
        char *url;
        StoreSnapshots *h = snapshots_open("t_snp_round", &url);
        const StoreSnapshotOps *ops = store_postgres.snapshots;
        SnapshotRow in = snap(ID_A, "own_a", SPEC, 1000);
        in.name = (char *)"first";
        in.labels = (char *)"{\"team\":\"x\"}";
        snprintf(in.mode, sizeof in.mode, "memory");
        assert_int_equal(ops->insert(h, &in, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(ops->insert(h, &in, 10, NO_BYTES_BOUND), -EEXIST);
        SnapshotRow out;
        assert_int_equal(ops->get(h, "own_a", ID_A, &out), 0);
        assert_string_equal(out.id, ID_A);
        assert_string_equal(out.owner, "own_a");
        assert_string_equal(out.key_id, "key_1");
        assert_string_equal(out.sandbox_id, "sb_1");
        assert_string_equal(out.name, "first");
        assert_string_equal(out.labels, "{\"team\":\"x\"}");
        assert_string_equal(out.spec, SPEC);
        assert_string_equal(out.mode, "memory");
        assert_string_equal(out.state, "ready");
        assert_int_equal(out.size_bytes, 4096);
        assert_int_equal(out.created_at, 1000);
        assert_int_equal(out.expires_at, 1100);
        assert_int_equal(out.version, 1);
        store_snapshot_row_clear(&out);

        /* A second, then the listing: oldest first, after the cursor, by filter. */
        SnapshotRow b = snap(ID_B, "own_a", SPEC, 2000);
        b.sandbox_id = (char *)"sb_2";
        assert_int_equal(ops->insert(h, &b, 10, NO_BYTES_BOUND), 0);
        SnapshotRow *list = NULL;
        size_t n = 0;
        StoreSnapshotFilter all = { .owner = "own_a", .limit = 10 };
        assert_int_equal(ops->list(h, &all, &list, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(list[0].id, ID_A);
        assert_string_equal(list[1].id, ID_B);
        assert_null(list[1].name);
        free_list(list, n);
        StoreSnapshotFilter one = { .owner = "own_a", .limit = 1 };
        assert_int_equal(ops->list(h, &one, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_A);
        free_list(list, n);
        StoreSnapshotFilter after = { .owner = "own_a", .cursor_at = 1000, .cursor_id = ID_A, .limit = 10 };
        assert_int_equal(ops->list(h, &after, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_B);
        free_list(list, n);
        StoreSnapshotFilter by_name = { .owner = "own_a", .name = "first", .limit = 10 };
        assert_int_equal(ops->list(h, &by_name, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_A);
        free_list(list, n);
        StoreSnapshotFilter by_source = { .owner = "own_a", .sandbox_id = "sb_2", .limit = 10 };
        assert_int_equal(ops->list(h, &by_source, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_B);
        free_list(list, n);

        /* An update: name cleared, labels and expiry replaced, version bumped. */
        StoreSnapshotChange c = { .set_name = true, .name = NULL, .labels = "{\"k\":\"v\"}", .expires_at = 5000 };
        assert_int_equal(ops->update(h, "own_a", ID_A, 1, &c, &out), 0);
        assert_null(out.name);
        assert_string_equal(out.labels, "{\"k\":\"v\"}");
        assert_int_equal(out.expires_at, 5000);
        assert_int_equal(out.version, 2);
        store_snapshot_row_clear(&out);
        /* Only the expiry: the rest is kept. */
        StoreSnapshotChange extend = { .expires_at = 6000 };
        assert_int_equal(ops->update(h, "own_a", ID_A, STORE_SNAPSHOT_ANY_VERSION, &extend, &out), 0);
        assert_string_equal(out.labels, "{\"k\":\"v\"}");
        assert_int_equal(out.expires_at, 6000);
        assert_int_equal(out.version, 3);
        store_snapshot_row_clear(&out);
        StoreSnapshotChange rename = { .set_name = true, .name = "second" };
        assert_int_equal(ops->update(h, "own_a", ID_A, 3, &rename, &out), 0);
        assert_string_equal(out.name, "second");
        store_snapshot_row_clear(&out);

        int64_t count = count_of(ops, h, "own_a");
        assert_int_equal(count, 2);
        assert_int_equal(ops->delete(h, "own_a", ID_A), 0);
        assert_int_equal(ops->delete(h, "own_a", ID_A), -ENOENT);
        assert_int_equal(ops->get(h, "own_a", ID_A, &out), -ENOENT);
        count = count_of(ops, h, "own_a");
        assert_int_equal(count, 1);
        ops->close(h);
        free(url);
}

/* A build's layer, as in SQLite: hidden from its owner, outside the
 * owner's bounds, read back as a layer by the upkeep. */
static void test_snapshots_layer_hidden(void **state) {
        char *url;
        StoreSnapshots *h = snapshots_open("t_snp_layer", &url);
        const StoreSnapshotOps *ops = store_postgres.snapshots;
        SnapshotRow a = snap(ID_A, "own_a", SPEC, 1000), layer = snap(ID_T, "own_a", SPEC_LAYER, 1500);
        layer.layer = true;
        assert_int_equal(ops->insert(h, &a, 1, 4096), 0);
        assert_int_equal(ops->insert(h, &layer, 1, 4096), 0);
        StoreSnapshotUsage u;
        assert_int_equal(ops->usage(h, "own_a", &u), 0);
        assert_int_equal(u.count, 1);
        assert_int_equal(u.bytes, 4096);
        SnapshotRow out;
        assert_int_equal(ops->get(h, "own_a", ID_T, &out), -ENOENT);
        StoreSnapshotChange c = { .labels = "{\"x\":\"y\"}" };
        assert_int_equal(ops->update(h, "own_a", ID_T, STORE_SNAPSHOT_ANY_VERSION, &c, &out), -ENOENT);
        SnapshotRow *list = NULL;
        size_t n = 0;
        StoreSnapshotFilter mine = { .owner = "own_a", .limit = 10 };
        assert_int_equal(ops->list(h, &mine, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_A);
        assert_false(list[0].layer);
        free_list(list, n);
        assert_int_equal(ops->get_any(h, ID_T, &out), 0);
        assert_true(out.layer);
        store_snapshot_row_clear(&out);
        assert_int_equal(ops->delete(h, "own_a", ID_T), 0);
        ops->close(h);
        free(url);
}

static void test_snapshots_owner_scoping_and_transient(void **state) {
        char *url;
        StoreSnapshots *h = snapshots_open("t_snp_scope", &url);
        const StoreSnapshotOps *ops = store_postgres.snapshots;
        SnapshotRow a = snap(ID_A, "own_a", SPEC, 1000), fork = snap(ID_T, "own_a", SPEC_TRANSIENT, 1500);
        assert_int_equal(ops->insert(h, &a, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(ops->insert(h, &fork, 10, NO_BYTES_BOUND), 0);
        SnapshotRow out;
        /* Another owner's: not found, not changed, not deleted, not listed. */
        assert_int_equal(ops->get(h, "own_b", ID_A, &out), -ENOENT);
        assert_int_equal(ops->get(h, NULL, ID_A, &out), -ENOENT);
        StoreSnapshotChange c = { .labels = "{\"x\":\"y\"}" };
        assert_int_equal(ops->update(h, "own_b", ID_A, STORE_SNAPSHOT_ANY_VERSION, &c, &out), -ENOENT);
        assert_int_equal(ops->update(h, "own_b", ID_A, 1, &c, &out), -ENOENT);
        assert_int_equal(ops->delete(h, "own_b", ID_A), -ENOENT);
        SnapshotRow *list = NULL;
        size_t n = 5;
        StoreSnapshotFilter other = { .owner = "own_b", .limit = 10 };
        assert_int_equal(ops->list(h, &other, &list, &n), 0);
        assert_int_equal(n, 0);
        free(list);
        int64_t count = count_of(ops, h, "own_b");
        assert_int_equal(count, 0);
        assert_int_equal(ops->get(h, "own_a", ID_A, &out), 0);
        assert_string_equal(out.labels, "{}");
        assert_int_equal(out.version, 1);
        store_snapshot_row_clear(&out);

        /* A transient one: hidden from its owner, counted, seen by the upkeep. */
        assert_int_equal(ops->get(h, "own_a", ID_T, &out), -ENOENT);
        assert_int_equal(ops->update(h, "own_a", ID_T, STORE_SNAPSHOT_ANY_VERSION, &c, &out), -ENOENT);
        StoreSnapshotFilter mine = { .owner = "own_a", .limit = 10 };
        assert_int_equal(ops->list(h, &mine, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_A);
        free_list(list, n);
        count = count_of(ops, h, "own_a");
        assert_int_equal(count, 2);
        char(*ids)[SNAPSHOT_ID_LEN + 1] = NULL;
        assert_int_equal(ops->ids(h, STORE_SNAPSHOT_IDS_TRANSIENT, NULL, 0, SIZE_MAX, &ids, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(ids[0], ID_T);
        free(ids);
        assert_int_equal(ops->ids(h, STORE_SNAPSHOT_IDS_ALL, NULL, 0, SIZE_MAX, &ids, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(ids[0], ID_A);
        free(ids);
        assert_int_equal(ops->ids(h, (StoreSnapshotIds)99, NULL, 0, SIZE_MAX, &ids, &n), -EINVAL);
        assert_int_equal(ops->get_any(h, ID_T, &out), 0);
        assert_string_equal(out.spec, SPEC_TRANSIENT);
        store_snapshot_row_clear(&out);
        assert_int_equal(ops->delete(h, "own_a", ID_T), 0);
        /* The upkeep reaches any owner's. */
        assert_int_equal(ops->get_any(h, ID_A, &out), 0);
        assert_string_equal(out.owner, "own_a");
        store_snapshot_row_clear(&out);
        assert_int_equal(ops->delete(h, NULL, ID_A), 0);
        assert_int_equal(ops->get_any(h, ID_A, &out), -ENOENT);
        ops->close(h);
        free(url);
}

static void test_snapshots_expired_ids(void **state) {
        char *url;
        StoreSnapshots *h = snapshots_open("t_snp_expired", &url);
        const StoreSnapshotOps *ops = store_postgres.snapshots;
        SnapshotRow a = snap(ID_A, "own_a", SPEC, 1000), b = snap(ID_B, "own_b", SPEC, 2000),
                    never = snap(ID_C, "own_a", SPEC, 100);
        never.expires_at = 0;
        assert_int_equal(ops->insert(h, &a, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(ops->insert(h, &b, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(ops->insert(h, &never, 10, NO_BYTES_BOUND), 0);
        char(*ids)[SNAPSHOT_ID_LEN + 1] = NULL;
        size_t n = 0;
        assert_int_equal(ops->ids(h, STORE_SNAPSHOT_IDS_EXPIRED, NULL, 1100, 64, &ids, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(ids[0], ID_A);
        free(ids);
        assert_int_equal(ops->ids(h, STORE_SNAPSHOT_IDS_EXPIRED, NULL, 1000000, 1, &ids, &n), 0);
        assert_int_equal(n, 1);
        free(ids);
        assert_int_equal(ops->ids(h, STORE_SNAPSHOT_IDS_EXPIRED, NULL, 1000000, 64, &ids, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(ids[0], ID_A);
        assert_string_equal(ids[1], ID_B);
        free(ids);
        ops->close(h);
        free(url);
}

/* A host's snapshot writes are made at its epoch: declared dead, it inserts,
 * updates and deletes nothing (-EOWNERDEAD); at its new epoch it does. */
static void test_snapshots_need_a_live_epoch(void **state) {
        char *url;
        StoreSnapshots *h = snapshots_open("t_snp_epoch", &url);
        const StoreSnapshotOps *ops = store_postgres.snapshots;
        const StoreHostOps *hops = store_postgres.hosts;
        StoreHosts *hosts = NULL;
        assert_int_equal(hops->open(url, &hosts), 0);
        HostRecord rec = { .url = (char *)"http://10.0.0.1:7878", .drivers = (char *)"namespace",
                           .version = (char *)"0.1.0", .vcpu = 2, .memory_mib = 1024 };
        snprintf(rec.id, sizeof rec.id, "host_snapsnapsnapsnap");
        int64_t epoch = 0;
        assert_int_equal(hops->register_host(hosts, &rec, 100, &epoch), 0);
        assert_int_equal(ops->set_writer(h, rec.id, epoch), 0);
        SnapshotRow a = snap("snp_epocha0000000000", "own_a", SPEC, 1000);
        assert_int_equal(ops->insert(h, &a, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(hops->declare_dead(hosts, rec.id, epoch, 100, 200), 0);
        SnapshotRow b = snap("snp_epochb0000000000", "own_a", SPEC, 1000);
        assert_int_equal(ops->insert(h, &b, 10, NO_BYTES_BOUND), -EOWNERDEAD);
        StoreSnapshotChange ch = { .name = "renamed", .set_name = true };
        SnapshotRow out = { 0 };
        assert_int_equal(ops->update(h, "own_a", a.id, 0, &ch, &out), -EOWNERDEAD);
        assert_int_equal(ops->delete(h, "own_a", a.id), -EOWNERDEAD);
        assert_int_equal(ops->get(h, "own_a", a.id, &out), 0);
        store_snapshot_row_clear(&out);
        assert_int_equal(ops->get(h, "own_a", b.id, &out), -ENOENT);
        int64_t again = 0;
        assert_int_equal(hops->register_host(hosts, &rec, 300, &again), 0);
        assert_int_equal(ops->delete(h, "own_a", a.id), -EOWNERDEAD); /* still the old epoch */
        assert_int_equal(ops->set_writer(h, rec.id, again), 0);
        assert_int_equal(ops->delete(h, "own_a", a.id), 0);
        hops->close(hosts);
        ops->close(h);
        free(url);
}

static void test_snapshots_stale_update_and_limit(void **state) {
        char *url;
        StoreSnapshots *h = snapshots_open("t_snp_stale", &url);
        const StoreSnapshotOps *ops = store_postgres.snapshots;
        SnapshotRow a = snap(ID_A, "own_a", SPEC, 1000);
        assert_int_equal(ops->insert(h, &a, 10, NO_BYTES_BOUND), 0);
        /* Two writers read version 1; the first wins, the second is stale. */
        SnapshotRow out;
        StoreSnapshotChange first = { .labels = "{\"by\":\"first\"}" }, second = { .labels = "{\"by\":\"second\"}" };
        assert_int_equal(ops->update(h, "own_a", ID_A, 1, &first, &out), 0);
        assert_int_equal(out.version, 2);
        store_snapshot_row_clear(&out);
        assert_int_equal(ops->update(h, "own_a", ID_A, 1, &second, &out), -ESTALE);
        assert_int_equal(ops->get(h, "own_a", ID_A, &out), 0);
        assert_string_equal(out.labels, "{\"by\":\"first\"}");
        assert_int_equal(out.version, 2);
        store_snapshot_row_clear(&out);
        assert_int_equal(ops->update(h, "own_a", ID_A, 2, &second, &out), 0);
        assert_int_equal(out.version, 3);
        store_snapshot_row_clear(&out);
        assert_int_equal(ops->delete(h, "own_a", ID_A), 0);
        assert_int_equal(ops->update(h, "own_a", ID_A, 3, &second, &out), -ENOENT);

        /* The per-owner limit counts transient ones too. */
        SnapshotRow k = snap(ID_A, "own_a", SPEC, 1000), t = snap(ID_T, "own_a", SPEC_TRANSIENT, 1100),
                    b = snap(ID_B, "own_a", SPEC, 1200), other = snap(ID_C, "own_b", SPEC, 1300);
        assert_int_equal(ops->insert(h, &k, 2, NO_BYTES_BOUND), 0);
        assert_int_equal(ops->insert(h, &t, 2, NO_BYTES_BOUND), 0);
        assert_int_equal(ops->insert(h, &b, 2, NO_BYTES_BOUND), -EDQUOT);
        assert_int_equal(ops->insert(h, &other, 2, NO_BYTES_BOUND), 0);
        assert_int_equal(ops->get(h, "own_a", ID_B, &out), -ENOENT);
        assert_int_equal(ops->delete(h, "own_a", ID_T), 0);
        assert_int_equal(ops->insert(h, &b, 2, NO_BYTES_BOUND), 0);
        ops->close(h);
        free(url);
}

/* The bytes an owner keeps: their sum, transient ones included, and the
 * insert that would take them past the bound refused with nothing kept;
 * another owner's are their own, and a delete makes room again. */
static void test_snapshots_bytes_per_owner(void **state) {
        char *url;
        StoreSnapshots *h = snapshots_open("t_snp_bytes", &url);
        const StoreSnapshotOps *ops = store_postgres.snapshots;
        StoreSnapshotUsage u = { .count = -1, .bytes = -1 };
        assert_int_equal(ops->usage(h, "own_a", &u), 0);
        assert_int_equal(u.count, 0);
        assert_int_equal(u.bytes, 0);
        SnapshotRow a = snap(ID_A, "own_a", SPEC, 1000), t = snap(ID_T, "own_a", SPEC_TRANSIENT, 1100),
                    b = snap(ID_B, "own_a", SPEC, 1200), other = snap(ID_C, "own_b", SPEC, 1300);
        a.size_bytes = 3000;
        t.size_bytes = 1000;
        b.size_bytes = 1001;
        other.size_bytes = 5000;
        assert_int_equal(ops->insert(h, &a, 10, 5000), 0);
        assert_int_equal(ops->insert(h, &t, 10, 5000), 0);
        assert_int_equal(ops->usage(h, "own_a", &u), 0);
        assert_int_equal(u.count, 2);
        assert_int_equal(u.bytes, 4000);
        /* 4000 + 1001 > 5000: refused, nothing inserted. */
        assert_int_equal(ops->insert(h, &b, 10, 5000), -EFBIG);
        SnapshotRow out;
        assert_int_equal(ops->get_any(h, ID_B, &out), -ENOENT);
        assert_int_equal(ops->usage(h, "own_a", &u), 0);
        assert_int_equal(u.count, 2);
        assert_int_equal(u.bytes, 4000);
        /* Exactly at the bound fits; another owner's bytes are not A's. */
        b.size_bytes = 1000;
        assert_int_equal(ops->insert(h, &other, 10, 5000), 0);
        assert_int_equal(ops->insert(h, &b, 10, 5000), 0);
        assert_int_equal(ops->usage(h, "own_a", &u), 0);
        assert_int_equal(u.bytes, 5000);
        assert_int_equal(ops->usage(h, "own_b", &u), 0);
        assert_int_equal(u.count, 1);
        assert_int_equal(u.bytes, 5000);
        /* Sums past 32 bits come back whole (sum() of a bigint is a numeric). */
        SnapshotRow big = snap("snp_ffffffffffffffffffff", "own_big", SPEC, 1500),
                    big2 = snap("snp_ffffffffffffffff0000", "own_big", SPEC, 1600);
        big.size_bytes = big2.size_bytes = INT64_C(3) << 40;
        assert_int_equal(ops->insert(h, &big, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(ops->insert(h, &big2, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(ops->usage(h, "own_big", &u), 0);
        assert_int_equal(u.count, 2);
        assert_true(u.bytes == INT64_C(6) << 40);
        /* The count is checked first; a snapshot bigger than the whole
         * bound never fits, and no sum overflows near INT64_MAX. */
        SnapshotRow c = snap("snp_eeeeeeeeeeeeeeeeeeee", "own_a", SPEC, 1400);
        c.size_bytes = 1;
        assert_int_equal(ops->insert(h, &c, 3, 5000), -EDQUOT);
        c.size_bytes = 6000;
        assert_int_equal(ops->insert(h, &c, 10, 5000), -EFBIG);
        c.size_bytes = INT64_MAX;
        assert_int_equal(ops->insert(h, &c, 10, INT64_MAX), -EFBIG);
        /* A delete makes room. */
        assert_int_equal(ops->delete(h, "own_a", ID_T), 0);
        c.size_bytes = 1000;
        assert_int_equal(ops->insert(h, &c, 10, 5000), 0);
        assert_int_equal(ops->usage(h, "own_a", &u), 0);
        assert_int_equal(u.count, 3);
        assert_int_equal(u.bytes, 5000);
        ops->close(h);
        free(url);
}

/* One host's insert of a 1000-byte snapshot of own_a, racing the others. */
typedef struct SnapshotRace {
        Race race;
        int64_t max;
        int64_t max_bytes;
} SnapshotRace;

static void *race_snapshot(void *userdata) {
        SnapshotRace *a = userdata;
        StoreSnapshots *h;
        a->race.result = store_postgres.snapshots->open(a->race.url, &h);
        if (a->race.result < 0)
                return NULL;
        char id[SNAPSHOT_ID_LEN + 1];
        snprintf(id, sizeof id, "snp_%020d", a->race.index);
        SnapshotRow r = snap(id, "own_a", SPEC, 1000 + a->race.index);
        r.size_bytes = 1000;
        a->race.result = store_postgres.snapshots->insert(h, &r, a->max, a->max_bytes);
        store_postgres.snapshots->close(h);
        return NULL;
}

/* Eight hosts insert at once under max snapshots and max_bytes: exactly
 * three win, the others get refused, and three are kept. */
static void snapshots_race(const char *table, int64_t max, int64_t max_bytes, int refused) {
        char *url;
        StoreSnapshots *h = snapshots_open(table, &url);
        SnapshotRace races[8];
        pthread_t t[8];
        for (int i = 0; i < 8; i++) {
                races[i] = (SnapshotRace){ .race = { .url = url, .index = i }, .max = max, .max_bytes = max_bytes };
                assert_int_equal(pthread_create(&t[i], NULL, race_snapshot, &races[i]), 0);
        }
        int won = 0;
        for (int i = 0; i < 8; i++) {
                pthread_join(t[i], NULL);
                if (races[i].race.result == 0)
                        won++;
                else
                        assert_int_equal(races[i].race.result, refused);
        }
        assert_int_equal(won, 3);
        StoreSnapshotUsage u;
        assert_int_equal(store_postgres.snapshots->usage(h, "own_a", &u), 0);
        assert_int_equal(u.count, 3);
        assert_int_equal(u.bytes, 3000);
        store_postgres.snapshots->close(h);
        free(url);
}

static void test_snapshots_race_across_connections(void **state) {
        snapshots_race("t_snp_race", 3, NO_BYTES_BOUND, -EDQUOT);
}

/* Hosts inserting at once for one owner never pass its bound on bytes
 * together: three of eight 1000-byte snapshots fit under 3500. */
static void test_snapshots_bytes_race_across_connections(void **state) {
        snapshots_race("t_snp_bytes_race", 100, 3500, -EFBIG);
}

static void test_sandboxes_order_and_milliseconds(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_order");
        sandbox_order_contract(store_postgres.sandboxes, f.h);
        close_fixture(&f);
}

/* A database of before the milliseconds were kept (step 11): its rows
 * come through the upgrade, their times whole seconds. */
static void test_sandboxes_milliseconds_upgrade(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_msec_upgrade");
        const StoreSandboxOps *ops = store_postgres.sandboxes;
        SandboxRow row;
        make_row(&row, "sbx_old", "alice");
        row.created_at = 1796029200;
        assert_int_equal(ops->insert(f.h, &row, 10, 10), 0);
        SandboxRow got;
        assert_int_equal(ops->get(f.h, "sbx_old", &got), 0);
        got.state = SANDBOX_RUNNING;
        got.started_at = 1796029201;
        assert_int_equal(ops->update(f.h, &got), 0);
        sandbox_row_done(&got);
        ops->close(f.h);
        f.h = NULL;
        assert_int_equal(pgdb_exec(&f.raw,
                                   "ALTER TABLE sandboxes DROP COLUMN created_msec;"
                                   "ALTER TABLE sandboxes DROP COLUMN started_msec;"
                                   "DROP TABLE file_link_secrets, file_link_uses, previews, images, image_tags, sandbox_sessions, image_registries, image_layers, volumes, volume_attachments, volume_backups;"
                                   "UPDATE store_versions SET version = 11 WHERE kind = 'postgres'",
                                   NULL),
                         0);
        assert_int_equal(ops->open(f.url, &f.h), 0);
        assert_int_equal(ops->get(f.h, "sbx_old", &got), 0);
        assert_int_equal(got.created_at, 1796029200);
        assert_int_equal(got.created_msec, 0);
        assert_int_equal(got.started_at, 1796029201);
        assert_int_equal(got.started_msec, 0);
        assert_int_equal(got.state, SANDBOX_RUNNING);
        sandbox_row_done(&got);
        make_row(&row, "sbx_new", "alice");
        row.created_at = 1796029200;
        row.created_msec = 1;
        assert_int_equal(ops->insert(f.h, &row, 10, 10), 0);
        OrderSeen seen = { 0 };
        assert_int_equal(ops->query(f.h, STORE_SANDBOXES_OF_OWNER, "alice", 0, order_test_on_row, &seen), 0);
        assert_int_equal(seen.n, 2);
        assert_string_equal(seen.ids[0], "sbx_new");
        assert_string_equal(seen.ids[1], "sbx_old");
        close_fixture(&f);
}

static void test_sandboxes_fleet(void **state) {
        Fixture f = { 0 };
        open_fixture(&f, "t_sbx_fleet");
        StoreHosts *hosts = NULL;
        assert_int_equal(store_postgres.hosts->open(f.url, &hosts), 0);
        fleet_test_contract(store_postgres.sandboxes, f.h, store_postgres.hosts, hosts);
        store_postgres.hosts->close(hosts);
        close_fixture(&f);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_sandboxes_round_trip_and_conditional_update),
                cmocka_unit_test(test_sandboxes_limits),
                cmocka_unit_test(test_sandboxes_fleet),
                cmocka_unit_test(test_sandboxes_queries),
                cmocka_unit_test(test_sandboxes_order_and_milliseconds),
                cmocka_unit_test(test_sandboxes_milliseconds_upgrade),
                cmocka_unit_test(test_sandboxes_unreadable_rows_are_named),
                cmocka_unit_test(test_idempotency),
                cmocka_unit_test(test_sandboxes_race_across_connections),
                cmocka_unit_test(test_idempotency_race_across_connections),
                cmocka_unit_test(test_snapshots_round_trip),
                cmocka_unit_test(test_snapshots_owner_scoping_and_transient),
                cmocka_unit_test(test_snapshots_layer_hidden),
                cmocka_unit_test(test_snapshots_expired_ids),
                cmocka_unit_test(test_snapshots_stale_update_and_limit),
                cmocka_unit_test(test_snapshots_need_a_live_epoch),
                cmocka_unit_test(test_snapshots_bytes_per_owner),
                cmocka_unit_test(test_snapshots_race_across_connections),
                cmocka_unit_test(test_snapshots_bytes_race_across_connections),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
