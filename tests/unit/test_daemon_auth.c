/* Key format, hashing, and lookup through the daemon's database; time
 * formatting. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/timeutil.h"
#include "daemon/model/auth.h"
#include "daemon/manager/db.h"
#include "test_store_keys_helper.h"
#include "daemon/store/sqldb.h"

static void test_key_format(void **state) {
        char key[AUTH_KEY_LEN + 1];
        assert_int_equal(auth_generate_key(key), 0);
        assert_int_equal(strlen(key), 43);
        assert_true(auth_key_format_ok(key));
        char other[AUTH_KEY_LEN + 1];
        auth_generate_key(other);
        assert_string_not_equal(key, other);
        assert_false(auth_key_format_ok("rt_0123"));
        assert_false(auth_key_format_ok("xx_0123456789abcdef0123456789abcdef01234567"));
        assert_false(auth_key_format_ok("rt_0123456789ABCDEF0123456789abcdef01234567"));
        assert_false(auth_key_format_ok("rt_0123456789abcdef0123456789abcdef012345678"));
        assert_false(auth_key_format_ok(NULL));
        assert_string_equal(auth_parse_bearer("Bearer abc"), "abc");
        assert_string_equal(auth_parse_bearer("bearer  abc"), "abc");
        assert_null(auth_parse_bearer("Basic abc"));
        assert_null(auth_parse_bearer("Bearer "));
        assert_null(auth_parse_bearer(NULL));
}

static void test_hash(void **state) {
        char h[AUTH_HASH_HEX_LEN + 1];
        assert_int_equal(auth_hash_key("abc", h), 0);
        assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_true(auth_hash_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
        assert_false(auth_hash_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ae"));
        assert_false(auth_hash_equal(h, "ba78"));
}

static void test_lookup(void **state) {
        char dir[] = "/tmp/runtime-test-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char path[256];
        snprintf(path, sizeof(path), "%s/runtime.db", dir);
        Db *db = NULL;
        assert_int_equal(db_open(&store_sqlite, path, &db), 0);
        int64_t n = -1;
        assert_int_equal(test_key_count(path, &n), 0);
        assert_int_equal(n, 0);
        char key[AUTH_KEY_LEN + 1], hash[AUTH_HASH_HEX_LEN + 1];
        auth_generate_key(key);
        auth_hash_key(key, hash);
        assert_int_equal(test_key_insert(path, "key_1", "admin", "alice", true, hash, false), 0);
        /* The same hash twice is refused. */
        assert_int_not_equal(test_key_insert(path, "key_2", "dup", "bob", false, hash, false), 0);
        char rkey[AUTH_KEY_LEN + 1], rhash[AUTH_HASH_HEX_LEN + 1];
        auth_generate_key(rkey);
        auth_hash_key(rkey, rhash);
        assert_int_equal(test_key_insert(path, "key_3", "viewer", "alice", false, rhash, true), 0);
        KeyInfo k;
        assert_int_equal(test_key_by_hash(path, hash, &k), 0);
        assert_string_equal(k.id, "key_1");
        assert_string_equal(k.owner, "alice");
        assert_int_equal(k.access, KEY_ACCESS_FULL);
        assert_false(k.trial);
        assert_int_equal(k.daily_limit_micros, -1);
        assert_int_equal(test_key_by_hash(path, rhash, &k), 0);
        assert_int_equal(k.access, KEY_ACCESS_READ);
        assert_true(k.trial);
        char unknown[AUTH_HASH_HEX_LEN + 1];
        auth_hash_key("rt_0000000000000000000000000000000000000000", unknown);
        assert_int_equal(test_key_by_hash(path, unknown, &k), -ENOENT);
        assert_int_equal(test_key_count(path, &n), 0);
        assert_int_equal(n, 2);
        db_close(db);
        /* Reopening keeps the keys and does not re-run migrations. */
        assert_int_equal(db_open(&store_sqlite, path, &db), 0);
        assert_int_equal(test_key_by_hash(path, hash, &k), 0);
        db_close(db);
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
}

/* A state directory of the first schema (before a sandbox had a user of
 * its own) passes through the migration: its sandboxes keep running
 * requests as the sandbox user, and the new column takes root and nothing
 * else. */
static void test_migration_adds_the_user(void **state) {
        char dir[] = "/tmp/runtime-test-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char path[256];
        snprintf(path, sizeof(path), "%s/runtime.db", dir);
        sqlite3 *raw = NULL;
        assert_int_equal(sqldb_open(path, &raw), 0);
        /* The first migration as it shipped, and a sandbox made under it. */
        assert_int_equal(sqldb_exec(raw,
                                    "CREATE TABLE schema_version (version INTEGER NOT NULL);"
                                    "INSERT INTO schema_version (version) VALUES (1);"
                                    "CREATE TABLE keys (id TEXT PRIMARY KEY, name TEXT NOT NULL, owner TEXT NOT NULL,"
                                    "  access TEXT NOT NULL CHECK (access IN ('full', 'read')), hash TEXT NOT NULL UNIQUE,"
                                    "  daily_limit_micros INTEGER, trial INTEGER NOT NULL DEFAULT 0,"
                                    "  created_at INTEGER NOT NULL, revoked_at INTEGER);"
                                    "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, owner TEXT NOT NULL,"
                                    "  key_id TEXT NOT NULL REFERENCES keys(id), name TEXT, labels TEXT NOT NULL,"
                                    "  spec TEXT NOT NULL, state TEXT NOT NULL, failure_reason TEXT,"
                                    "  created_at INTEGER NOT NULL, started_at INTEGER, stopped_at INTEGER,"
                                    "  lease_ends_at INTEGER, run_seconds INTEGER NOT NULL DEFAULT 0, deleted_at INTEGER);"
                                    "CREATE INDEX sandboxes_owner ON sandboxes (owner, created_at);"
                                    "CREATE INDEX sandboxes_live ON sandboxes (deleted_at, state);"
                                    "INSERT INTO keys VALUES ('key_1', 'k', 'alice', 'full', '00', NULL, 0, 1, NULL);"
                                    "INSERT INTO sandboxes (id, owner, key_id, labels, spec, state, created_at) VALUES"
                                    "  ('sbx_old', 'alice', 'key_1', '{}',"
                                    "   '{\"image\":\"default\",\"driver\":\"namespace\",\"vcpu\":1}',"
                                    "   'stopped', 1);"),
                         0);
        sqlite3_close(raw);
        Db *db = NULL;
        assert_int_equal(db_open(&store_sqlite, path, &db), 0);
        SandboxRow row;
        assert_int_equal(db_sandbox_get(db, "sbx_old", &row), 0);
        assert_false(row.run_as_root);
        assert_int_equal(row.version, 1);
        assert_int_equal(row.spec.vcpu, 1);
        assert_int_equal(row.spec.timeout_seconds, SANDBOX_DEFAULT_TIMEOUT_SECONDS);
        /* Its time is read as the whole second it was kept as. */
        assert_int_equal(row.created_at, 1);
        assert_int_equal(row.created_msec, 0);
        row.run_as_root = true;
        assert_int_equal(db_sandbox_update(db, &row), 0);
        sandbox_row_done(&row);
        db_close(db);
        /* Reopened: kept, and the migration does not run again. */
        assert_int_equal(db_open(&store_sqlite, path, &db), 0);
        assert_int_equal(db_sandbox_get(db, "sbx_old", &row), 0);
        assert_true(row.run_as_root);
        sandbox_row_done(&row);
        db_close(db);
        assert_int_equal(sqldb_open(path, &raw), 0);
        assert_int_not_equal(sqldb_exec(raw, "UPDATE sandboxes SET run_as = 'admin'"), 0);
        assert_int_equal(sqldb_exec(raw, "SELECT 1 FROM schema_version WHERE version = 2"), 0);
        sqlite3_stmt *st = NULL;
        assert_int_equal(sqlite3_prepare_v2(raw, "SELECT count(*) FROM schema_version", -1, &st, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        /* each migration once: run_as, uploads, the versions, the hosts,
         * the keys' keeps_awake, then the sandboxes' milliseconds */
        assert_int_equal(sqlite3_column_int(st, 0), 7);
        sqlite3_finalize(st);
        /* The key of the first migration's time keeps its setting off. */
        assert_int_equal(sqlite3_prepare_v2(raw, "SELECT keeps_awake FROM keys WHERE id = 'key_1'", -1, &st, NULL),
                         SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_int_equal(sqlite3_column_int(st, 0), 0);
        sqlite3_finalize(st);
        sqlite3_close(raw);
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
}

static void test_sandbox_limits(void **state) {
        char dir[] = "/tmp/runtime-test-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char path[256];
        snprintf(path, sizeof(path), "%s/runtime.db", dir);
        Db *db = NULL;
        assert_int_equal(db_open(&store_sqlite, path, &db), 0);
        assert_int_equal(test_key_insert(path, "key_1", "k", "alice", true, "00", false), 0);
        SandboxRow row = { .owner = "alice", .key_id = "key_1", .labels = "{}", .created_at = 1,
                           .state = SANDBOX_RUNNING };
        sandbox_spec_init(&row.spec);
        row.spec.image = "default";
        row.spec.driver = SANDBOX_DRIVER_NAMESPACE;
        row.spec.on_lease_end = LEASE_END_DELETE;
        for (int i = 0; i < 3; i++) {
                snprintf(row.id, sizeof(row.id), "sbx_%020d", i);
                assert_int_equal(db_sandbox_insert(db, &row, 10, 3), 0);
        }
        snprintf(row.id, sizeof(row.id), "sbx_%020d", 9);
        assert_int_equal(db_sandbox_insert(db, &row, 10, 3), -EDQUOT);
        assert_int_equal(db_sandbox_insert(db, &row, 3, 10), -EUSERS);
        SandboxRow got;
        assert_int_equal(db_sandbox_get(db, "sbx_00000000000000000001", &got), 0);
        assert_int_equal(got.state, SANDBOX_RUNNING);
        assert_int_equal(got.spec.on_lease_end, LEASE_END_DELETE);
        got.deleted_at = 5;
        assert_int_equal(db_sandbox_update(db, &got), 0);
        sandbox_row_done(&got);
        assert_int_equal(db_sandbox_get(db, "sbx_00000000000000000001", &got), -ENOENT);
        /* A deleted one no longer counts. */
        assert_int_equal(db_sandbox_insert(db, &row, 10, 3), 0);
        db_close(db);
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
}

static void test_time(void **state) {
        char buf[RFC3339_LEN];
        assert_int_equal(time_format_rfc3339(0, buf), 0);
        assert_string_equal(buf, "1970-01-01T00:00:00Z");
        assert_int_equal(time_format_rfc3339(1796029200, buf), 0);
        assert_string_equal(buf, "2026-11-30T09:00:00Z");
        assert_int_equal(time_format_rfc3339(951782400, buf), 0); /* leap day */
        assert_string_equal(buf, "2000-02-29T00:00:00Z");
        assert_int_equal(time_format_rfc3339(253402300799LL, buf), 0);
        assert_string_equal(buf, "9999-12-31T23:59:59Z");
        assert_int_equal(time_format_rfc3339(253402300800LL, buf), -EINVAL);
        assert_int_equal(time_format_rfc3339(INT64_MIN, buf), -EINVAL);
        assert_true(time_now_unix() > 1700000000);
        char ms[RFC3339_MS_LEN];
        assert_int_equal(time_format_rfc3339_ms(1796029200, 123, ms), 0);
        assert_string_equal(ms, "2026-11-30T09:00:00.123Z");
        assert_int_equal(time_format_rfc3339_ms(1796029200, 0, ms), 0);
        assert_string_equal(ms, "2026-11-30T09:00:00.000Z");
        assert_int_equal(time_format_rfc3339_ms(253402300799LL, 999, ms), 0);
        assert_string_equal(ms, "9999-12-31T23:59:59.999Z");
        assert_int_equal(time_format_rfc3339_ms(1796029200, 1000, ms), -EINVAL);
        assert_int_equal(time_format_rfc3339_ms(1796029200, -1, ms), -EINVAL);
        assert_int_equal(time_format_rfc3339_ms(253402300800LL, 0, ms), -EINVAL);
        int64_t before = time_now_unix(), now_ms = time_now_unix_ms();
        assert_true(now_ms / 1000 >= before && now_ms / 1000 <= time_now_unix());
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_key_format), cmocka_unit_test(test_hash),
                cmocka_unit_test(test_lookup),     cmocka_unit_test(test_sandbox_limits),
                cmocka_unit_test(test_time),       cmocka_unit_test(test_migration_adds_the_user),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
