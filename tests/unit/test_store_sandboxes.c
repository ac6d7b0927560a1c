/* The sandbox model's codec and the SQLite backend's sandboxes table,
 * through the store's interface: versions, conditional writes, rows that
 * cannot be read. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/model/sandbox_spec.h"
#include "daemon/store/sqldb.h"
#include "daemon/store/store_sandboxes.h"
#include "test_store_fleet_helper.h"
#include "test_store_keys_helper.h"
#include "test_store_sandbox_order_helper.h"

static void test_codec_round_trip(void **state) {
        SandboxSpec s;
        sandbox_spec_init(&s);
        assert_int_equal(s.timeout_seconds, SANDBOX_DEFAULT_TIMEOUT_SECONDS);
        s.image = strdup("default");
        s.driver = SANDBOX_DRIVER_GVISOR;
        s.vcpu = 2;
        s.memory_mib = 512;
        s.disk_mib = 4096;
        s.timeout_seconds = 3600;
        s.on_lease_end = LEASE_END_PAUSE;
        s.max_total_cost_micros = 77;
        s.idle_pause_seconds = 600;
        s.auto_wake = false;
        s.trial = true;
        s.paused_at = 1700000000;
        s.lease_left_seconds = 12;
        s.paused_seconds = 5;
        s.network = json_pack("{s:b,s:[s],s:[]}", "internet", 0, "allow", "pypi.org", "deny");
        s.env = json_pack("{s:s}", "A", "1");
        s.secrets = json_pack("[s]", "GH");
        char *text = sandbox_spec_encode(&s);
        assert_non_null(text);
        SandboxSpec d;
        char why[128];
        assert_int_equal(sandbox_spec_decode(text, SANDBOX_SPEC_VERSION, &d, why, sizeof why), 0);
        assert_string_equal(d.image, "default");
        assert_int_equal(d.driver, SANDBOX_DRIVER_GVISOR);
        assert_int_equal(d.vcpu, 2);
        assert_int_equal(d.memory_mib, 512);
        assert_int_equal(d.disk_mib, 4096);
        assert_int_equal(d.timeout_seconds, 3600);
        assert_int_equal(d.on_lease_end, LEASE_END_PAUSE);
        assert_int_equal(d.max_cost_micros, -1);
        assert_int_equal(d.max_total_cost_micros, 77);
        assert_int_equal(d.idle_pause_seconds, 600);
        assert_false(d.auto_wake);
        assert_true(d.pausable);
        assert_true(d.trial);
        assert_int_equal(d.paused_at, 1700000000);
        assert_int_equal(d.lease_left_seconds, 12);
        assert_int_equal(d.paused_seconds, 5);
        assert_true(json_equal(d.network, s.network));
        assert_true(json_equal(d.env, s.env));
        assert_true(json_equal(d.secrets, s.secrets));
        SandboxSpec c;
        assert_int_equal(sandbox_spec_copy(&d, &c), 0);
        assert_true(json_equal(c.env, s.env));
        sandbox_spec_done(&c);
        sandbox_spec_done(&d);
        sandbox_spec_done(&s);
        free(text);
}

static void test_codec_refuses(void **state) {
        SandboxSpec d;
        char why[160];
        /* What the daemon wrote before the version existed reads as 1. */
        assert_int_equal(sandbox_spec_decode("{\"image\":\"default\",\"driver\":\"namespace\",\"maxCostMicros\":null,"
                                             "\"secrets\":null,\"onLeaseEnd\":\"delete\"}",
                                             1, &d, why, sizeof why),
                         0);
        assert_int_equal(d.on_lease_end, LEASE_END_DELETE);
        assert_null(d.secrets);
        sandbox_spec_done(&d);
        assert_int_equal(sandbox_spec_decode("{}", SANDBOX_SPEC_VERSION + 1, &d, why, sizeof why), -EPROTONOSUPPORT);
        assert_non_null(strstr(why, "newer"));
        static const char *const bad[] = {
                "", "not json", "[]", "{\"driver\":\"namespace\"}", "{\"image\":\"d\",\"driver\":\"namespace\",\"vcpu\":-1}",
                "{\"image\":\"d\",\"driver\":\"namespace\",\"onLeaseEnd\":\"explode\"}",
                "{\"image\":\"d\",\"driver\":\"namespace\",\"env\":[1]}", "{\"image\":\"d\",\"driver\":\"namespace\",\"autoWake\":1}",
                "{\"image\":\"d\",\"driver\":\"namespace\",\"timeoutSeconds\":0}",
                "{\"image\":\"d\",\"driver\":\"namespace\",\"image\":\"e\"}",
                "{\"image\":\"d\",\"driver\":\"firecracker\"}",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                assert_int_equal(sandbox_spec_decode(bad[i], 1, &d, why, sizeof why), -EBADMSG);
        assert_int_equal(sandbox_spec_decode(NULL, 1, &d, why, sizeof why), -EBADMSG);
        assert_int_equal(sandbox_spec_decode("{}", 0, &d, why, sizeof why), -EBADMSG);
        SandboxState st;
        assert_int_equal(sandbox_state_from_name("paused", &st), 0);
        assert_int_equal(st, SANDBOX_PAUSED);
        assert_string_equal(sandbox_state_name(SANDBOX_RESUMING), "resuming");
        assert_int_equal(sandbox_state_from_name("asleep", &st), -EINVAL);
}

typedef struct Fixture {
        char dir[64];
        char path[128];
        StoreSandboxes *h;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        snprintf(f->dir, sizeof f->dir, "/tmp/runtime-store-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof f->path, "%s/runtime.db", f->dir);
        if (store_sqlite.sandboxes->open(f->path, &f->h) < 0)
                return -1;
        if (test_key_insert(f->path, "key_1", "k", "alice", true, "00", false) < 0)
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        store_sqlite.sandboxes->close(f->h);
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
        int r = system(cmd);
        free(f);
        return r == 0 ? 0 : -1;
}

static void make_row(SandboxRow *r, const char *id) {
        *r = (SandboxRow){ .owner = "alice", .key_id = "key_1", .labels = "{}", .created_at = 1,
                           .state = SANDBOX_STARTING };
        snprintf(r->id, sizeof r->id, "%s", id);
        sandbox_spec_init(&r->spec);
        r->spec.image = "default";
        r->spec.driver = SANDBOX_DRIVER_NAMESPACE;
}

static void test_conditional_update(void **state) {
        Fixture *f = *state;
        const StoreSandboxOps *ops = store_sqlite.sandboxes;
        SandboxRow row;
        make_row(&row, "sbx_a");
        assert_int_equal(ops->insert(f->h, &row, 10, 10), 0);
        assert_int_equal(row.version, 1);
        SandboxRow a, b;
        assert_int_equal(ops->get(f->h, "sbx_a", &a), 0);
        assert_int_equal(ops->get(f->h, "sbx_a", &b), 0);
        a.state = SANDBOX_RUNNING;
        a.spec.timeout_seconds = 60;
        assert_int_equal(ops->update(f->h, &a), 0);
        assert_int_equal(a.version, 2);
        /* b read version 1: its write would lose a's. */
        b.state = SANDBOX_STOPPED;
        assert_int_equal(ops->update(f->h, &b), -ESTALE);
        SandboxRow c;
        assert_int_equal(ops->get(f->h, "sbx_a", &c), 0);
        assert_int_equal(c.state, SANDBOX_RUNNING);
        assert_int_equal(c.spec.timeout_seconds, 60);
        assert_int_equal(c.version, 2);
        /* Name and labels are their own columns: no version taken. */
        assert_int_equal(ops->set_meta(f->h, "sbx_a", "n", "{\"x\":\"y\"}"), 0);
        assert_int_equal(ops->update(f->h, &c), 0);
        sandbox_row_done(&c);
        snprintf(b.id, sizeof b.id, "sbx_none");
        assert_int_equal(ops->update(f->h, &b), -ENOENT);
        sandbox_row_done(&a);
        sandbox_row_done(&b);
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

static void test_unreadable_rows_are_named(void **state) {
        Fixture *f = *state;
        const StoreSandboxOps *ops = store_sqlite.sandboxes;
        SandboxRow row;
        make_row(&row, "sbx_good");
        assert_int_equal(ops->insert(f->h, &row, 10, 10), 0);
        make_row(&row, "sbx_future");
        assert_int_equal(ops->insert(f->h, &row, 10, 10), 0);
        make_row(&row, "sbx_corrupt");
        assert_int_equal(ops->insert(f->h, &row, 10, 10), 0);
        make_row(&row, "sbx_gone");
        assert_int_equal(ops->insert(f->h, &row, 10, 10), 0);
        sqlite3 *raw = NULL;
        assert_int_equal(sqldb_open(f->path, &raw), 0);
        assert_int_equal(sqldb_exec(raw, "UPDATE sandboxes SET spec_version = 99 WHERE id = 'sbx_future';"
                                         "UPDATE sandboxes SET spec = '{\"image\":' WHERE id = 'sbx_corrupt';"
                                         "UPDATE sandboxes SET spec = 'x', deleted_at = 5 WHERE id = 'sbx_gone';"),
                         0);
        sqlite3_close(raw);
        Bad b = { 0 };
        assert_int_equal(ops->check(f->h, on_bad, &b), 2);
        assert_int_equal(b.n, 2);
        for (int i = 0; i < 2; i++) {
                if (strcmp(b.ids[i], "sbx_future") == 0)
                        assert_int_equal(b.errors[i], -EPROTONOSUPPORT);
                else {
                        assert_string_equal(b.ids[i], "sbx_corrupt");
                        assert_int_equal(b.errors[i], -EBADMSG);
                }
        }
        SandboxRow got;
        assert_int_equal(ops->get(f->h, "sbx_good", &got), 0);
        sandbox_row_done(&got);
        assert_int_equal(ops->get(f->h, "sbx_future", &got), -EPROTONOSUPPORT);
        assert_int_equal(ops->get(f->h, "sbx_corrupt", &got), -EBADMSG);
}

/* The per-kind versions every SQLite table of the store migrates by. */
static void test_kind_migrations(void **state) {
        Fixture *f = *state;
        sqlite3 *raw = NULL;
        assert_int_equal(sqldb_open(f->path, &raw), 0);
        /* A table as an older daemon left it, with one of the later columns. */
        assert_int_equal(sqldb_exec(raw, "CREATE TABLE t (a TEXT); ALTER TABLE t ADD COLUMN c TEXT;"
                                         "INSERT INTO t (a, c) VALUES ('kept', 'x');"),
                         0);
        static const SqlMigration steps[] = {
                { NULL, NULL, "CREATE TABLE IF NOT EXISTS t (a TEXT)" },
                { "t", "b", "ALTER TABLE t ADD COLUMN b TEXT" },
                { "t", "c", "ALTER TABLE t ADD COLUMN c TEXT" },
                { NULL, NULL, "UPDATE t SET b = 'new'" },
        };
        assert_int_equal(sqldb_migrate(raw, "test", steps, 4), 0);
        assert_int_equal(sqldb_exec(raw, "SELECT a, b, c FROM t"), 0);
        /* Done once: the UPDATE of step 4 is not run again. */
        assert_int_equal(sqldb_exec(raw, "UPDATE t SET b = 'later'"), 0);
        assert_int_equal(sqldb_migrate(raw, "test", steps, 4), 0);
        sqlite3_stmt *st = NULL;
        assert_int_equal(sqlite3_prepare_v2(raw, "SELECT a, b, c FROM t", -1, &st, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_string_equal((const char *)sqlite3_column_text(st, 0), "kept");
        assert_string_equal((const char *)sqlite3_column_text(st, 1), "later");
        assert_string_equal((const char *)sqlite3_column_text(st, 2), "x");
        sqlite3_finalize(st);
        /* A daemon that knows fewer steps than the file has: refused. */
        assert_int_equal(sqldb_migrate(raw, "test", steps, 3), -EPROTONOSUPPORT);
        /* Another kind's version is its own. */
        assert_int_equal(sqldb_migrate(raw, "other", steps, 1), 0);
        sqlite3_close(raw);
}

static void test_order_and_milliseconds(void **state) {
        Fixture *f = *state;
        sandbox_order_contract(store_sqlite.sandboxes, f->h);
}

/* A database of before the milliseconds were kept: its rows come through
 * the upgrade, their times whole seconds. */
static void test_milliseconds_upgrade(void **state) {
        Fixture *f = *state;
        const StoreSandboxOps *ops = store_sqlite.sandboxes;
        SandboxRow row;
        make_row(&row, "sbx_old");
        row.created_at = 1796029200;
        assert_int_equal(ops->insert(f->h, &row, 10, 10), 0);
        SandboxRow got;
        assert_int_equal(ops->get(f->h, "sbx_old", &got), 0);
        got.state = SANDBOX_RUNNING;
        got.started_at = 1796029201;
        assert_int_equal(ops->update(f->h, &got), 0);
        sandbox_row_done(&got);
        ops->close(f->h);
        f->h = NULL;
        sqlite3 *raw = NULL;
        assert_int_equal(sqldb_open(f->path, &raw), 0);
        assert_int_equal(sqldb_exec(raw, "ALTER TABLE sandboxes DROP COLUMN created_msec;"
                                         "ALTER TABLE sandboxes DROP COLUMN started_msec;"
                                         "DELETE FROM schema_version WHERE version = 7;"),
                         0);
        sqlite3_close(raw);
        assert_int_equal(ops->open(f->path, &f->h), 0);
        assert_int_equal(ops->get(f->h, "sbx_old", &got), 0);
        assert_int_equal(got.created_at, 1796029200);
        assert_int_equal(got.created_msec, 0);
        assert_int_equal(got.started_at, 1796029201);
        assert_int_equal(got.started_msec, 0);
        assert_int_equal(got.state, SANDBOX_RUNNING);
        sandbox_row_done(&got);
        /* And new rows keep theirs next to it. */
        make_row(&row, "sbx_new");
        row.created_at = 1796029200;
        row.created_msec = 1;
        assert_int_equal(ops->insert(f->h, &row, 10, 10), 0);
        OrderSeen seen = { 0 };
        assert_int_equal(ops->query(f->h, STORE_SANDBOXES_OF_OWNER, "alice", 0, order_test_on_row, &seen), 0);
        assert_int_equal(seen.n, 2);
        assert_string_equal(seen.ids[0], "sbx_new");
        assert_string_equal(seen.ids[1], "sbx_old");
}

static void test_fleet(void **state) {
        Fixture *f = *state;
        StoreHosts *hosts = NULL;
        assert_int_equal(store_sqlite.hosts->open(f->path, &hosts), 0);
        fleet_test_contract(store_sqlite.sandboxes, f->h, store_sqlite.hosts, hosts);
        store_sqlite.hosts->close(hosts);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_codec_round_trip),
                cmocka_unit_test(test_codec_refuses),
                cmocka_unit_test_setup_teardown(test_conditional_update, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fleet, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unreadable_rows_are_named, setup, teardown),
                cmocka_unit_test_setup_teardown(test_kind_migrations, setup, teardown),
                cmocka_unit_test_setup_teardown(test_order_and_milliseconds, setup, teardown),
                cmocka_unit_test_setup_teardown(test_milliseconds_upgrade, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
