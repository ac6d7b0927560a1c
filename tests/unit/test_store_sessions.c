/* The sessions kind of the SQLite backend (store_sessions.h): the contract
 * every backend keeps, kept across a reopen. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store.h"
#include "daemon/store/store_sessions.h"
#include "test_store_sessions_contract.h"

#define STORE_TMPDIR_PREFIX "/tmp/store-sessions-"
#include "test_store_tmpdir.h"

static void test_sessions_contract(void **state) {
        Fixture *f = *state;
        const StoreSessionOps *ops = store_sqlite.sessions;
        StoreSessions *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        sessions_contract(ops, h);
        ops->close(h);
        /* Kept across a reopen. */
        assert_int_equal(ops->open(f->path, &h), 0);
        StoreSession got;
        assert_int_equal(ops->by_token(h, "hash-c", &got), 0);
        assert_string_equal(got.id, "ses_c");
        ops->close(h);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_sessions_contract, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
