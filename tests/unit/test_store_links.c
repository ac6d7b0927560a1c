/* The file links kind of the SQLite backend (store_links.h): the contract
 * every backend keeps, and a store of before the kind migrated to it. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/sqldb.h"
#include "daemon/store/store.h"
#include "daemon/store/store_links.h"
#include "test_store_links_contract.h"

#define STORE_TMPDIR_PREFIX "/tmp/store-links-"
#include "test_store_tmpdir.h"

static StoreLinks *open_other(void *userdata) {
        Fixture *f = userdata;
        StoreLinks *h = NULL;
        return store_sqlite.links->open(f->path, &h) == 0 ? h : NULL;
}

static void test_links_contract(void **state) {
        Fixture *f = *state;
        const StoreLinkOps *ops = store_sqlite.links;
        StoreLinks *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        links_contract(ops, h, open_other, f);
        ops->close(h);
        /* Kept across a reopen: the secrets outlive the process. */
        assert_int_equal(ops->open(f->path, &h), 0);
        StoreLinkSecret s = { 0 };
        assert_int_equal(ops->secret_get(h, "sbx_a", &s), 0);
        assert_string_equal(s.secret, "sealed:rotated");
        store_link_secret_clear(&s);
        ops->close(h);
}

/* A database of a daemon before the links (other kinds' tables there, no
 * links tables): opened, it gains them at version 1 and keeps the rest. */
static void test_links_on_an_older_store(void **state) {
        Fixture *f = *state;
        sqlite3 *s = NULL;
        assert_int_equal(sqldb_open(f->path, &s), 0);
        assert_int_equal(sqldb_exec(s, "CREATE TABLE store_versions (kind TEXT PRIMARY KEY, version INTEGER NOT NULL);"
                                       "INSERT INTO store_versions VALUES ('requests', 1);"),
                         0);
        sqlite3_close(s);
        StoreLinks *h = NULL;
        assert_int_equal(store_sqlite.links->open(f->path, &h), 0);
        assert_int_equal(store_sqlite.links->use_once(h, "lnk_0000000000000009", "sbx_x", 10, 1), 0);
        store_sqlite.links->close(h);
        assert_int_equal(sqldb_open(f->path, &s), 0);
        sqlite3_stmt *st = NULL;
        assert_int_equal(sqlite3_prepare_v2(s, "SELECT version FROM store_versions WHERE kind = 'links'", -1, &st, NULL),
                         SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_int_equal(sqlite3_column_int(st, 0), 1);
        sqlite3_finalize(st);
        sqlite3_close(s);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_links_contract, setup, teardown),
                cmocka_unit_test_setup_teardown(test_links_on_an_older_store, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
