/* The previews kind of the SQLite backend (store_previews.h): the contract
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
#include "daemon/store/store_previews.h"
#include "test_store_previews_contract.h"

#define STORE_TMPDIR_PREFIX "/tmp/store-previews-"
#include "test_store_tmpdir.h"

static void test_previews_contract(void **state) {
        Fixture *f = *state;
        const StorePreviewOps *ops = store_sqlite.previews;
        StorePreviews *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        previews_contract(ops, h);
        ops->close(h);
        /* Kept across a reopen. */
        assert_int_equal(ops->open(f->path, &h), 0);
        StorePreview got;
        assert_int_equal(ops->get(h, "sbx_b", 8000, &got), 0);
        assert_string_equal(got.secret, "sealed-4");
        ops->close(h);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_previews_contract, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
