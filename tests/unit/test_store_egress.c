/* The egress records of the SQLite backend, through its table
 * (store_sqlite.egress): secrets round trip, owner scoping, conditional
 * writes, the per-owner limit, the audit log, and the migration of databases
 * written before the versions were kept. On a real SQLite file. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "daemon/store/store.h"
#include "daemon/store/store_egress.h"

typedef struct Fixture {
        char dir[64];
        char path[96];
        const StoreEgressOps *ops;
        StoreEgress *h;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        snprintf(f->dir, sizeof(f->dir), "/tmp/store-egress-test-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof(f->path), "%s/runtime.db", f->dir);
        f->ops = store_sqlite.egress;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        char cmd[128];
        if (f->h)
                f->ops->close(f->h);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
        if (system(cmd) != 0)
                return -1;
        free(f);
        return 0;
}

static void open_store(Fixture *f) {
        assert_non_null(f->ops);
        assert_int_equal(f->ops->open(f->path, &f->h), 0);
}

/* SQL run on the file directly, as an older daemon (or another tool) would. */
static void raw_sql(const char *path, const char *text) {
        sqlite3 *db = NULL;
        assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
        char *msg = NULL;
        int rc = sqlite3_exec(db, text, NULL, NULL, &msg);
        if (rc != SQLITE_OK)
                fail_msg("%s: %s", text, msg ? msg : "?");
        sqlite3_close(db);
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

static void test_store_backend_table(void **state) {
        (void)state;
        assert_ptr_equal(store_backend_for("/tmp/x.db"), &store_sqlite);
        assert_ptr_equal(store_sqlite.egress, &store_sqlite_egress);
}

static void test_secret_round_trip(void **state) {
        Fixture *f = *state;
        open_store(f);
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
        store_egress_secrets_free(list, n);
        assert_int_equal(f->ops->secret_list(f->h, "own_a", "C_KEY", 2, false, &list, &n, &more), 0);
        assert_int_equal(n, 1);
        assert_false(more);
        assert_string_equal(list[0].name, "OPENAI_API_KEY");
        store_egress_secrets_free(list, n);

        assert_int_equal(f->ops->secret_delete(f->h, "own_a", "B_KEY", STORE_EGRESS_ANY_VERSION), 0);
        assert_int_equal(f->ops->secret_get(f->h, "own_a", "B_KEY", &out), -ENOENT);
        assert_int_equal(f->ops->secret_delete(f->h, "own_a", "B_KEY", STORE_EGRESS_ANY_VERSION), -ENOENT);
        assert_int_equal(f->ops->secret_rotate(f->h, "own_a", "B_KEY", "x", 1, STORE_EGRESS_ANY_VERSION, &out),
                         -ENOENT);

        /* Closed and opened again: still there, nothing migrated twice. */
        f->ops->close(f->h);
        f->h = NULL;
        open_store(f);
        assert_int_equal(f->ops->secret_get(f->h, "own_a", "OPENAI_API_KEY", &out), 0);
        assert_int_equal(out.version, 3);
        store_egress_secret_done(&out);
}

static void test_owner_scoping(void **state) {
        Fixture *f = *state;
        open_store(f);
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
        open_store(f);
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
}

static void test_limit_per_owner(void **state) {
        Fixture *f = *state;
        open_store(f);
        StoreEgressSecret out = { 0 };
        const char *names[] = { "A", "B", "C" };
        for (size_t i = 0; i < 3; i++) {
                StoreEgressSecret in = secret(names[i], "v", "PH");
                assert_int_equal(f->ops->secret_put(f->h, "own_a", &in, STORE_EGRESS_ANY_VERSION, 3, &out), 0);
                store_egress_secret_done(&out);
        }
        StoreEgressSecret d = secret("D", "v", "PH");
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &d, STORE_EGRESS_ANY_VERSION, 3, &out), -EDQUOT);
        /* A replace is not one more; another owner has its own count. */
        StoreEgressSecret a = secret("A", "v2", "PH");
        assert_int_equal(f->ops->secret_put(f->h, "own_a", &a, STORE_EGRESS_ANY_VERSION, 3, &out), 0);
        store_egress_secret_done(&out);
        assert_int_equal(f->ops->secret_put(f->h, "own_b", &d, STORE_EGRESS_ANY_VERSION, 3, &out), 0);
        store_egress_secret_done(&out);
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
        open_store(f);
        StoreEgressAudit a = audit("one.example.com", true, "allowed by rule");
        snprintf(a.rec.rule, sizeof(a.rec.rule), "one.example.com");
        snprintf(a.rec.addr, sizeof(a.rec.addr), "203.0.113.7");
        int64_t id1 = 0, id2 = 0;
        assert_int_equal(f->ops->audit_append(f->h, "sb_1", "own_a", &a, &id1), 0);
        assert_true(id1 > 0);
        StoreEgressAudit b = audit("two.example.com", false, "not in the policy");
        assert_int_equal(f->ops->audit_append(f->h, "sb_1", "own_a", &b, &id2), 0);
        StoreEgressAudit other = audit("three.example.com", true, "ok");
        assert_int_equal(f->ops->audit_append(f->h, "sb_2", "own_b", &other, NULL), 0);

        /* The first ends. */
        a.ended = true;
        a.rec.bytes_out = 10;
        a.rec.bytes_in = 20;
        a.rec.duration_ms = 30;
        snprintf(a.rec.end, sizeof(a.rec.end), "closed");
        assert_int_equal(f->ops->audit_update(f->h, "sb_1", id1, &a), 0);
        /* Another sandbox's id is not this one's entry. */
        assert_int_equal(f->ops->audit_update(f->h, "sb_2", id1, &a), -ENOENT);

        StoreEgressAudit *list = NULL;
        size_t n = 0;
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 10, &list, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(list[0].rec.host, "two.example.com"); /* newest first */
        assert_false(list[0].ended);
        assert_false(list[0].rec.allowed);
        assert_string_equal(list[1].rec.host, "one.example.com");
        assert_true(list[1].ended);
        assert_true(list[1].rec.connect);
        assert_string_equal(list[1].kind, "connect");
        assert_string_equal(list[1].rec.rule, "one.example.com");
        assert_string_equal(list[1].rec.addr, "203.0.113.7");
        assert_int_equal(list[1].rec.bytes_in, 20);
        assert_int_equal(list[1].rec.duration_ms, 30);
        assert_string_equal(list[1].rec.end, "closed");
        assert_int_equal(list[1].at, 42);
        free(list);

        /* A start ends what its last run left open. */
        assert_int_equal(f->ops->audit_end_open(f->h, "the daemon stopped during the connection"), 0);
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 1, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_true(list[0].ended);
        assert_string_equal(list[0].rec.end, "the daemon stopped during the connection");
        free(list);

        assert_int_equal(f->ops->audit_prune(f->h, "sb_1", 1), 0);
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 10, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].rec.host, "two.example.com");
        free(list);
        assert_int_equal(f->ops->audit_list(f->h, "sb_2", 10, &list, &n), 0);
        assert_int_equal(n, 1);
        free(list);
        assert_int_equal(f->ops->audit_list(f->h, "sb_none", 0, &list, &n), 0);
        assert_int_equal(n, 0);
        free(list);
}

/* The tables as the first release made them, with one row each: its entry
 * was written when its connection ended. */
static void test_migrate_first_schema(void **state) {
        Fixture *f = *state;
        raw_sql(f->path,
                "CREATE TABLE egress_secrets (owner TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,"
                " hosts TEXT NOT NULL, placeholder TEXT NOT NULL, created_at INTEGER NOT NULL,"
                " updated_at INTEGER NOT NULL, PRIMARY KEY (owner, name));"
                "CREATE TABLE egress_log (id INTEGER PRIMARY KEY AUTOINCREMENT, sandbox TEXT NOT NULL,"
                " at INTEGER NOT NULL, host TEXT NOT NULL, port INTEGER NOT NULL, kind TEXT NOT NULL,"
                " allowed INTEGER NOT NULL, reason TEXT NOT NULL, addr TEXT, bytes_out INTEGER NOT NULL,"
                " bytes_in INTEGER NOT NULL, intercepted INTEGER NOT NULL, secrets_used INTEGER NOT NULL);"
                "INSERT INTO egress_secrets VALUES ('own_a', 'OLD_KEY', 'old-value', '[\"old.example.com\"]',"
                " 'PH-OLD', 100, 200);"
                "INSERT INTO egress_log (sandbox, at, host, port, kind, allowed, reason, addr, bytes_out, bytes_in,"
                " intercepted, secrets_used) VALUES ('sb_old', 150, 'old.example.com', 443, 'connect', 1, 'ok',"
                " '198.51.100.1', 5, 6, 0, 1);");
        open_store(f);
        StoreEgressSecret out = { 0 };
        assert_int_equal(f->ops->secret_get(f->h, "own_a", "OLD_KEY", &out), 0);
        assert_string_equal(out.placeholder, "PH-OLD");
        assert_string_equal(out.hosts, "[\"old.example.com\"]");
        assert_null(out.header);
        assert_null(out.rules);
        assert_int_equal(out.created_at, 100);
        assert_int_equal(out.updated_at, 200);
        assert_int_equal(out.version, 1);
        store_egress_secret_done(&out);
        StoreEgressSecret *list = NULL;
        size_t n = 0;
        bool more = false;
        assert_int_equal(f->ops->secret_list(f->h, "own_a", NULL, 0, true, &list, &n, &more), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].value, "old-value");
        store_egress_secrets_free(list, n);

        StoreEgressAudit *log = NULL;
        assert_int_equal(f->ops->audit_list(f->h, "sb_old", 10, &log, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(log[0].rec.host, "old.example.com");
        assert_true(log[0].ended);
        assert_string_equal(log[0].rec.end, "closed");
        assert_int_equal(log[0].rec.bytes_in, 6);
        free(log);

        /* The migrated secret takes conditional writes. */
        assert_int_equal(f->ops->secret_rotate(f->h, "own_a", "OLD_KEY", "new", 300, 1, &out), 0);
        assert_int_equal(out.version, 2);
        store_egress_secret_done(&out);
}

/* The tables as the daemon made them before the versions were kept (every
 * column but version and owner, no store_versions), with a connection left
 * open by its last run. */
static void test_migrate_unversioned_schema(void **state) {
        Fixture *f = *state;
        raw_sql(f->path,
                "CREATE TABLE egress_secrets (owner TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,"
                " hosts TEXT NOT NULL, placeholder TEXT NOT NULL, created_at INTEGER NOT NULL,"
                " updated_at INTEGER NOT NULL, header TEXT, format TEXT, rules TEXT, PRIMARY KEY (owner, name));"
                "CREATE TABLE egress_log (id INTEGER PRIMARY KEY AUTOINCREMENT, sandbox TEXT NOT NULL,"
                " at INTEGER NOT NULL, host TEXT NOT NULL, port INTEGER NOT NULL, kind TEXT NOT NULL,"
                " allowed INTEGER NOT NULL, reason TEXT NOT NULL, addr TEXT, bytes_out INTEGER NOT NULL,"
                " bytes_in INTEGER NOT NULL, intercepted INTEGER NOT NULL, secrets_used INTEGER NOT NULL, rule TEXT,"
                " duration_ms INTEGER, end_reason TEXT);"
                "CREATE INDEX egress_log_by_sandbox ON egress_log (sandbox, id);"
                "INSERT INTO egress_secrets VALUES ('own_a', 'GH_TOKEN', 'ghp-1', '[\"api.github.com\"]', 'PH-GH',"
                " 100, 200, 'Authorization', 'token {value}', '[{\"methods\":[\"GET\"]}]');"
                "INSERT INTO egress_log (sandbox, at, host, port, kind, allowed, reason, addr, bytes_out, bytes_in,"
                " intercepted, secrets_used, rule) VALUES ('sb_1', 150, 'api.github.com', 443, 'connect', 1, 'ok',"
                " NULL, 0, 0, 1, 0, 'api.github.com');");
        open_store(f);
        StoreEgressSecret out = { 0 };
        assert_int_equal(f->ops->secret_get(f->h, "own_a", "GH_TOKEN", &out), 0);
        assert_string_equal(out.header, "Authorization");
        assert_string_equal(out.format, "token {value}");
        assert_string_equal(out.rules, "[{\"methods\":[\"GET\"]}]");
        assert_int_equal(out.version, 1);
        store_egress_secret_done(&out);

        /* Open until the daemon's start says why it ended. */
        StoreEgressAudit *log = NULL;
        size_t n = 0;
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 10, &log, &n), 0);
        assert_int_equal(n, 1);
        assert_false(log[0].ended);
        assert_string_equal(log[0].rec.rule, "api.github.com");
        free(log);
        assert_int_equal(f->ops->audit_end_open(f->h, "the daemon stopped during the connection"), 0);
        assert_int_equal(f->ops->audit_list(f->h, "sb_1", 10, &log, &n), 0);
        assert_true(log[0].ended);
        free(log);
}

/* A database between the two: some of the later columns, not all. */
static void test_migrate_partial_schema(void **state) {
        Fixture *f = *state;
        raw_sql(f->path,
                "CREATE TABLE egress_secrets (owner TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,"
                " hosts TEXT NOT NULL, placeholder TEXT NOT NULL, created_at INTEGER NOT NULL,"
                " updated_at INTEGER NOT NULL, header TEXT, PRIMARY KEY (owner, name));"
                "CREATE TABLE egress_log (id INTEGER PRIMARY KEY AUTOINCREMENT, sandbox TEXT NOT NULL,"
                " at INTEGER NOT NULL, host TEXT NOT NULL, port INTEGER NOT NULL, kind TEXT NOT NULL,"
                " allowed INTEGER NOT NULL, reason TEXT NOT NULL, addr TEXT, bytes_out INTEGER NOT NULL,"
                " bytes_in INTEGER NOT NULL, intercepted INTEGER NOT NULL, secrets_used INTEGER NOT NULL, rule TEXT);"
                "INSERT INTO egress_secrets VALUES ('own_a', 'K', 'v', '[\"a.example.com\"]', 'PH-K', 1, 2, 'X-Key');"
                "INSERT INTO egress_log (sandbox, at, host, port, kind, allowed, reason, bytes_out, bytes_in,"
                " intercepted, secrets_used, rule) VALUES ('sb_p', 3, 'a.example.com', 80, 'http', 0, 'no', 0, 0, 0,"
                " 0, 'a.example.com');");
        open_store(f);
        StoreEgressSecret out = { 0 };
        assert_int_equal(f->ops->secret_get(f->h, "own_a", "K", &out), 0);
        assert_string_equal(out.header, "X-Key");
        assert_null(out.format);
        assert_int_equal(out.version, 1);
        store_egress_secret_done(&out);
        StoreEgressAudit *log = NULL;
        size_t n = 0;
        assert_int_equal(f->ops->audit_list(f->h, "sb_p", 10, &log, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(log[0].rec.rule, "a.example.com");
        assert_string_equal(log[0].kind, "http");
        assert_true(log[0].ended);
        assert_string_equal(log[0].rec.end, "closed");
        free(log);
}

static void test_refuses_newer_version(void **state) {
        Fixture *f = *state;
        open_store(f);
        f->ops->close(f->h);
        f->h = NULL;
        raw_sql(f->path, "UPDATE store_versions SET version = version + 1 WHERE kind = 'egress'");
        StoreEgress *h = NULL;
        assert_int_equal(f->ops->open(f->path, &h), -EPROTONOSUPPORT);
        assert_null(h);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_store_backend_table),
                cmocka_unit_test_setup_teardown(test_secret_round_trip, setup, teardown),
                cmocka_unit_test_setup_teardown(test_owner_scoping, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stale_version, setup, teardown),
                cmocka_unit_test_setup_teardown(test_limit_per_owner, setup, teardown),
                cmocka_unit_test_setup_teardown(test_audit_log, setup, teardown),
                cmocka_unit_test_setup_teardown(test_migrate_first_schema, setup, teardown),
                cmocka_unit_test_setup_teardown(test_migrate_unversioned_schema, setup, teardown),
                cmocka_unit_test_setup_teardown(test_migrate_partial_schema, setup, teardown),
                cmocka_unit_test_setup_teardown(test_refuses_newer_version, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
