/* The egress records of the PostgreSQL backend, through its table
 * (store_postgres.egress), against a real server: secrets round trip,
 * paging, owner scoping, conditional writes, the per-owner limit (also
 * raced from several connections), and the audit log. */
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

#include "daemon/store/store.h"
#include "daemon/store/store_egress.h"
#include "test_pg_harness.h"

typedef struct Fixture {
        char *url;
        const StoreEgressOps *ops;
        StoreEgress *h;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        if (!f)
                return -1;
        f->ops = store_postgres.egress;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        if (f->h)
                f->ops->close(f->h);
        free(f->url);
        free(f);
        return 0;
}

/* A fresh schema named name (skips without a server), opened. */
static void open_store(Fixture *f, const char *name) {
        assert_non_null(f->ops);
        f->url = pg_fresh(name);
        assert_int_equal(f->ops->open(f->url, &f->h), 0);
}

static StoreEgressSecret secret(const char *name, const char *value, const char *placeholder) {
        return (StoreEgressSecret){ .name = (char *)name,
                                    .value = (char *)value,
                                    .hosts = (char *)"[\"api.example.com\"]",
                                    .placeholder = (char *)placeholder,
                                    .header = (char *)"Authorization",
                                    .format = (char *)"Bearer {value}",
                                    .created_at = 1000,
                                    .updated_at = 1000 };
}

static void test_backend_table(void **state) {
        (void)state;
        assert_ptr_equal(store_backend_for("postgresql:///x"), &store_postgres);
        assert_ptr_equal(store_postgres.egress, &store_postgres_egress);
}

static void test_secret_round_trip(void **state) {
        Fixture *f = *state;
        open_store(f, "t_egress_round_trip");
        StoreEgressSecret in = secret("OPENAI_API_KEY", "sk-1", "PH-1"), out = { 0 };
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &in, STORE_EGRESS_ANY_VERSION, 100, &out), 0);
        assert_string_equal(out.name, "OPENAI_API_KEY");
        assert_null(out.value); /* never handed back but to the proxy's list */
        assert_string_equal(out.hosts, "[\"api.example.com\"]");
        assert_string_equal(out.placeholder, "PH-1");
        assert_string_equal(out.header, "Authorization");
        assert_string_equal(out.format, "Bearer {value}");
        assert_null(out.rules);
        assert_int_equal(out.created_at, 1000);
        assert_int_equal(out.version, 1);
        store_egress_secret_done(&out);

        /* A replace keeps the placeholder and created_at, clears what it leaves out. */
        StoreEgressSecret again = secret("OPENAI_API_KEY", "sk-2", "PH-OTHER");
        again.header = again.format = NULL;
        again.rules = (char *)"[{\"methods\":[\"GET\"]}]";
        again.created_at = again.updated_at = 2000;
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &again, STORE_EGRESS_ANY_VERSION, 100, &out), 0);
        assert_string_equal(out.placeholder, "PH-1");
        assert_int_equal(out.created_at, 1000);
        assert_int_equal(out.updated_at, 2000);
        assert_null(out.header);
        assert_null(out.format);
        assert_string_equal(out.rules, "[{\"methods\":[\"GET\"]}]");
        assert_int_equal(out.version, 2);
        store_egress_secret_done(&out);

        assert_int_equal(f->ops->secret_rotate(f->h, "own_a", "OPENAI_API_KEY", "sk-3", 3000,
                                               STORE_EGRESS_ANY_VERSION, &out),
                         0);
        assert_int_equal(out.updated_at, 3000);
        assert_int_equal(out.version, 3);
        assert_null(out.value);
        store_egress_secret_done(&out);

        assert_int_equal(f->ops->secret_get(f->h, "own_a", "OPENAI_API_KEY", &out), 0);
        assert_null(out.value);
        assert_int_equal(out.version, 3);
        store_egress_secret_done(&out);

        StoreEgressSecret b = secret("B_KEY", "b", "PH-B"), c = secret("C_KEY", "c", "PH-C");
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &c, STORE_EGRESS_ANY_VERSION, 100, &out), 0);
        store_egress_secret_done(&out);
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &b, STORE_EGRESS_ANY_VERSION, 100, &out), 0);
        store_egress_secret_done(&out);

        StoreEgressSecret *list = NULL;
        size_t n = 0;
        bool more = false;
        assert_int_equal(f->ops->secret_list(f->h, "own_a", NULL, 0, true, &list, &n, &more), 0);
        assert_int_equal(n, 3);
        assert_false(more);
        assert_string_equal(list[0].name, "B_KEY");
        assert_string_equal(list[1].name, "C_KEY");
        assert_string_equal(list[2].name, "OPENAI_API_KEY");
        assert_string_equal(list[2].value, "sk-3");
        store_egress_secrets_free(list, n);

        /* Pages by name. */
        assert_int_equal(f->ops->secret_list(f->h, "own_a", NULL, 2, false, &list, &n, &more), 0);
        assert_int_equal(n, 2);
        assert_true(more);
        assert_null(list[0].value);
        assert_string_equal(list[1].name, "C_KEY");
        store_egress_secrets_free(list, n);
        assert_int_equal(f->ops->secret_list(f->h, "own_a", "C_KEY", 2, false, &list, &n, &more), 0);
        assert_int_equal(n, 1);
        assert_false(more);
        assert_string_equal(list[0].name, "OPENAI_API_KEY");
        store_egress_secrets_free(list, n);
        /* A page exactly full has no more after it. */
        assert_int_equal(f->ops->secret_list(f->h, "own_a", "B_KEY", 2, false, &list, &n, &more), 0);
        assert_int_equal(n, 2);
        assert_false(more);
        store_egress_secrets_free(list, n);

        assert_int_equal(f->ops->secret_delete(f->h, "own_a", "B_KEY", STORE_EGRESS_ANY_VERSION), 0);
        assert_int_equal(f->ops->secret_get(f->h, "own_a", "B_KEY", &out), -ENOENT);
        assert_int_equal(f->ops->secret_delete(f->h, "own_a", "B_KEY", STORE_EGRESS_ANY_VERSION), -ENOENT);
        assert_int_equal(f->ops->secret_rotate(f->h, "own_a", "B_KEY", "x", 1, STORE_EGRESS_ANY_VERSION, &out),
                         -ENOENT);
        StoreEgressSecret bad = secret("X", NULL, "PH");
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &bad, STORE_EGRESS_ANY_VERSION, 100, &out), -EINVAL);

        /* Closed and opened again: still there, the schema not made twice. */
        f->ops->close(f->h);
        f->h = NULL;
        assert_int_equal(f->ops->open(f->url, &f->h), 0);
        assert_int_equal(f->ops->secret_get(f->h, "own_a", "OPENAI_API_KEY", &out), 0);
        assert_int_equal(out.version, 3);
        store_egress_secret_done(&out);
}

/* Names page in byte order, as in SQLite, whatever the database's collation
 * (the suite's server collates C.UTF-8, so this holds the order and the
 * paging; a linguistic collation is not tried here). */
static void test_paging_in_byte_order(void **state) {
        Fixture *f = *state;
        open_store(f, "t_egress_paging");
        const char *names[] = { "b", "A", "a", "B", "_x", "Z9" };
        StoreEgressSecret out = { 0 };
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
                StoreEgressSecret in = secret(names[i], "v", "PH");
                assert_int_equal(f->ops->secret_put(f->h, "own_p", &in, STORE_EGRESS_ANY_VERSION, 0, &out), 0);
                store_egress_secret_done(&out);
        }
        const char *want[] = { "A", "B", "Z9", "_x", "a", "b" };
        const char *after = NULL;
        char last[16] = "";
        size_t seen = 0;
        bool more = true;
        while (more) {
                StoreEgressSecret *list = NULL;
                size_t n = 0;
                assert_int_equal(f->ops->secret_list(f->h, "own_p", after, 4, false, &list, &n, &more), 0);
                for (size_t i = 0; i < n; i++) {
                        assert_true(seen < 6);
                        assert_string_equal(list[i].name, want[seen++]);
                }
                assert_true(n > 0);
                snprintf(last, sizeof last, "%s", list[n - 1].name);
                after = last;
                store_egress_secrets_free(list, n);
        }
        assert_int_equal(seen, 6);
}

static void test_owner_scoping(void **state) {
        Fixture *f = *state;
        open_store(f, "t_egress_owners");
        StoreEgressSecret in = secret("TOKEN", "mine", "PH-A"), out = { 0 };
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &in, STORE_EGRESS_ANY_VERSION, 100, &out), 0);
        store_egress_secret_done(&out);

        assert_int_equal(f->ops->secret_get(f->h, "own_b", "TOKEN", &out), -ENOENT);
        assert_int_equal(f->ops->secret_rotate(f->h, "own_b", "TOKEN", "theirs", 5, STORE_EGRESS_ANY_VERSION, &out),
                         -ENOENT);
        assert_int_equal(f->ops->secret_delete(f->h, "own_b", "TOKEN", STORE_EGRESS_ANY_VERSION), -ENOENT);
        StoreEgressSecret *list = NULL;
        size_t n = 7;
        bool more = true;
        assert_int_equal(f->ops->secret_list(f->h, "own_b", NULL, 0, true, &list, &n, &more), 0);
        assert_int_equal(n, 0);
        assert_false(more);
        store_egress_secrets_free(list, n);

        /* The same name under another owner is another secret. */
        StoreEgressSecret theirs = secret("TOKEN", "theirs", "PH-B");
        assert_int_equal(f->ops->secret_put(f->h, "own_b", &theirs, STORE_EGRESS_ANY_VERSION, 100, &out), 0);
        assert_string_equal(out.placeholder, "PH-B");
        assert_int_equal(out.version, 1);
        store_egress_secret_done(&out);
        assert_int_equal(f->ops->secret_list(f->h, "own_a", NULL, 0, true, &list, &n, &more), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].value, "mine");
        assert_string_equal(list[0].placeholder, "PH-A");
        store_egress_secrets_free(list, n);
}

static void test_stale_version(void **state) {
        Fixture *f = *state;
        open_store(f, "t_egress_stale");
        StoreEgressSecret in = secret("TOKEN", "v1", "PH"), out = { 0 };
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &in, STORE_EGRESS_ANY_VERSION, 100, &out), 0);
        assert_int_equal(out.version, 1);
        store_egress_secret_done(&out);

        /* Two writers read version 1; the first rotation wins, the second is stale. */
        assert_int_equal(f->ops->secret_rotate(f->h, "own_a", "TOKEN", "v2", 10, 1, &out), 0);
        assert_int_equal(out.version, 2);
        store_egress_secret_done(&out);
        assert_int_equal(f->ops->secret_rotate(f->h, "own_a", "TOKEN", "v3", 11, 1, &out), -ESTALE);
        StoreEgressSecret stale = secret("TOKEN", "v4", "PH");
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &stale, 1, 100, &out), -ESTALE);
        assert_int_equal(f->ops->secret_delete(f->h, "own_a", "TOKEN", 1), -ESTALE);
        /* A conditional write of a secret that is not there. */
        StoreEgressSecret none = secret("NONE", "v", "PH");
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &none, 1, 100, &out), -ENOENT);

        /* Nothing changed. */
        StoreEgressSecret *list = NULL;
        size_t n = 0;
        bool more = false;
        assert_int_equal(f->ops->secret_list(f->h, "own_a", NULL, 0, true, &list, &n, &more), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].value, "v2");
        assert_int_equal(list[0].version, 2);
        assert_int_equal(list[0].updated_at, 10);
        store_egress_secrets_free(list, n);

        /* The current version is accepted. */
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &stale, 2, 100, &out), 0);
        assert_int_equal(out.version, 3);
        store_egress_secret_done(&out);
        assert_int_equal(f->ops->secret_delete(f->h, "own_a", "TOKEN", 3), 0);
        assert_int_equal(f->ops->secret_get(f->h, "own_a", "TOKEN", &out), -ENOENT);
}

static void test_limit_per_owner(void **state) {
        Fixture *f = *state;
        open_store(f, "t_egress_limit");
        StoreEgressSecret out = { 0 };
        const char *names[] = { "A", "B", "C" };
        for (size_t i = 0; i < 3; i++) {
                StoreEgressSecret in = secret(names[i], "v", "PH");
                assert_int_equal(f->ops->secret_put(f->h, "own_a", &in, STORE_EGRESS_ANY_VERSION, 3, &out), 0);
                store_egress_secret_done(&out);
        }
        StoreEgressSecret d = secret("D", "v", "PH");
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &d, STORE_EGRESS_ANY_VERSION, 3, &out), -EDQUOT);
        assert_int_equal(f->ops->secret_get(f->h, "own_a", "D", &out), -ENOENT);
        /* A replace is not one more; another owner has its own count; 0 is no limit. */
        StoreEgressSecret a = secret("A", "v2", "PH");
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &a, STORE_EGRESS_ANY_VERSION, 3, &out), 0);
        store_egress_secret_done(&out);
        assert_int_equal(f->ops->secret_put(f->h, "own_b", &d, STORE_EGRESS_ANY_VERSION, 3, &out), 0);
        store_egress_secret_done(&out);
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &d, STORE_EGRESS_ANY_VERSION, 0, &out), 0);
        store_egress_secret_done(&out);
}

typedef struct Race {
        const char *url;
        pthread_barrier_t *start;
        int index;
        int result;
} Race;

static void *race_one(void *userdata) {
        Race *a = userdata;
        StoreEgress *h;
        a->result = store_postgres.egress->open(a->url, &h);
        /* Every connection made before any puts: connecting takes longer
         * than a put, and would otherwise keep them from overlapping. */
        pthread_barrier_wait(a->start);
        if (a->result < 0)
                return NULL;
        char name[32];
        snprintf(name, sizeof name, "SECRET_%d", a->index);
        StoreEgressSecret in = secret(name, "v", "PH"), out = { 0 };
        a->result = store_postgres.egress->secret_put(h, "racer", &in, STORE_EGRESS_ANY_VERSION, 4, &out);
        store_egress_secret_done(&out);
        store_postgres.egress->close(h);
        return NULL;
}

/* Ten connections (as many hosts) put secrets of their own names for one
 * owner whose limit is 4: exactly 4 win, by the serializable transactions,
 * with no lock of this process between them. */
static void test_limit_raced_across_connections(void **state) {
        Fixture *f = *state;
        open_store(f, "t_egress_race"); /* the schema, before the race */
        enum { RACERS = 10 };
        Race races[RACERS];
        pthread_t t[RACERS];
        pthread_barrier_t start;
        assert_int_equal(pthread_barrier_init(&start, NULL, RACERS), 0);
        for (int i = 0; i < RACERS; i++) {
                races[i] = (Race){ .url = f->url, .start = &start, .index = i };
                assert_int_equal(pthread_create(&t[i], NULL, race_one, &races[i]), 0);
        }
        int won = 0;
        for (int i = 0; i < RACERS; i++) {
                pthread_join(t[i], NULL);
                if (races[i].result == 0)
                        won++;
                else
                        assert_int_equal(races[i].result, -EDQUOT);
        }
        pthread_barrier_destroy(&start);
        assert_int_equal(won, 4);
        StoreEgressSecret *list = NULL;
        size_t n = 0;
        bool more = false;
        assert_int_equal(f->ops->secret_list(f->h, "racer", NULL, 0, false, &list, &n, &more), 0);
        assert_int_equal(n, 4);
        store_egress_secrets_free(list, n);
}

static StoreEgressAudit audit(const char *host, bool allowed, const char *reason) {
        StoreEgressAudit a = { .at = 42 };
        snprintf(a.kind, sizeof(a.kind), "connect");
        snprintf(a.rec.host, sizeof(a.rec.host), "%s", host);
        a.rec.port = 443;
        a.rec.connect = true;
        a.rec.allowed = allowed;
        snprintf(a.rec.reason, sizeof(a.rec.reason), "%s", reason);
        return a;
}

static void test_audit_log(void **state) {
        Fixture *f = *state;
        open_store(f, "t_egress_audit");
        StoreEgressAudit a = audit("one.example.com", true, "allowed by rule");
        snprintf(a.rec.rule, sizeof(a.rec.rule), "one.example.com");
        snprintf(a.rec.addr, sizeof(a.rec.addr), "203.0.113.7");
        int64_t id1 = 0, id2 = 0;
        assert_int_equal(f->ops->audit_append(f->h, "sb_1", "own_a", &a, &id1), 0);
        assert_true(id1 > 0);
        StoreEgressAudit b = audit("two.example.com", false, "not in the policy");
        assert_int_equal(f->ops->audit_append(f->h, "sb_1", "own_a", &b, &id2), 0);
        assert_true(id2 > id1);
        StoreEgressAudit other = audit("three.example.com", true, "ok");
        snprintf(other.kind, sizeof(other.kind), "http");
        other.rec.connect = false;
        other.rec.port = 80;
        other.ended = true; /* ended at once, in 0 ms */
        snprintf(other.rec.end, sizeof(other.rec.end), "refused");
        assert_int_equal(f->ops->audit_append(f->h, "sb_2", NULL, &other, NULL), 0);

        /* The first ends. */
        a.ended = true;
        a.rec.bytes_out = 10;
        a.rec.bytes_in = 20;
        a.rec.intercepted = true;
        a.rec.secrets_used = 2;
        a.rec.duration_ms = 30;
        snprintf(a.rec.end, sizeof(a.rec.end), "closed");
        assert_int_equal(f->ops->audit_update(f->h, "sb_1", id1, &a), 0);
        /* Another sandbox's id is not this one's entry. */
        assert_int_equal(f->ops->audit_update(f->h, "sb_2", id1, &a), -ENOENT);
        /* A refusal after the decision, still open. */
        b.rec.allowed = true;
        snprintf(b.rec.reason, sizeof(b.rec.reason), "later allowed");
        assert_int_equal(f->ops->audit_update(f->h, "sb_1", id2, &b), 0);

        StoreEgressAudit *list = NULL;
        size_t n = 0;
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 10, &list, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(list[0].rec.host, "two.example.com"); /* newest first */
        assert_false(list[0].ended);
        assert_true(list[0].rec.allowed);
        assert_string_equal(list[0].rec.reason, "later allowed");
        assert_string_equal(list[0].rec.addr, "");
        assert_string_equal(list[0].rec.rule, "");
        assert_string_equal(list[1].rec.host, "one.example.com");
        assert_true(list[1].ended);
        assert_true(list[1].rec.connect);
        assert_string_equal(list[1].kind, "connect");
        assert_int_equal(list[1].rec.port, 443);
        assert_string_equal(list[1].rec.rule, "one.example.com");
        assert_string_equal(list[1].rec.addr, "203.0.113.7");
        assert_int_equal(list[1].rec.bytes_out, 10);
        assert_int_equal(list[1].rec.bytes_in, 20);
        assert_true(list[1].rec.intercepted);
        assert_int_equal(list[1].rec.secrets_used, 2);
        assert_int_equal(list[1].rec.duration_ms, 30);
        assert_string_equal(list[1].rec.end, "closed");
        assert_int_equal(list[1].at, 42);
        free(list);
        assert_int_equal(f->ops->audit_list(f->h, "sb_2", 10, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_true(list[0].ended);
        assert_false(list[0].rec.connect);
        assert_string_equal(list[0].kind, "http");
        assert_int_equal(list[0].rec.duration_ms, 0);
        assert_string_equal(list[0].rec.end, "refused");
        free(list);

        /* A start ends what its last run left open, and nothing else. */
        assert_int_equal(f->ops->audit_end_open(f->h, "the daemon stopped during the connection"), 0);
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 2, &list, &n), 0);
        assert_int_equal(n, 2);
        assert_true(list[0].ended);
        assert_string_equal(list[0].rec.end, "the daemon stopped during the connection");
        assert_string_equal(list[1].rec.end, "closed");
        free(list);

        assert_int_equal(f->ops->audit_prune(f->h, "sb_1", 1), 0);
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 10, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].rec.host, "two.example.com");
        free(list);
        /* Keeping more than there are drops nothing; another sandbox's are its own. */
        assert_int_equal(f->ops->audit_prune(f->h, "sb_1", 5), 0);
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 10, &list, &n), 0);
        assert_int_equal(n, 1);
        free(list);
        assert_int_equal(f->ops->audit_list(f->h, "sb_2", 10, &list, &n), 0);
        assert_int_equal(n, 1);
        free(list);
        assert_int_equal(f->ops->audit_list(f->h, "sb_none", 0, &list, &n), 0);
        assert_int_equal(n, 0);
        free(list);
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 0, &list, &n), 0);
        assert_int_equal(n, 0);
        free(list);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_backend_table),
                cmocka_unit_test_setup_teardown(test_secret_round_trip, setup, teardown),
                cmocka_unit_test_setup_teardown(test_paging_in_byte_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_owner_scoping, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stale_version, setup, teardown),
                cmocka_unit_test_setup_teardown(test_limit_per_owner, setup, teardown),
                cmocka_unit_test_setup_teardown(test_limit_raced_across_connections, setup, teardown),
                cmocka_unit_test_setup_teardown(test_audit_log, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
