/* The images kind of the SQLite backend (store_images.h): the contract
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
#include "daemon/store/store_images.h"
#include "test_store_images_contract.h"

static void test_images_contract(void **state) {
        char dir[] = "/tmp/store-images-XXXXXX", path[96];
        assert_non_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/runtime.db", dir);
        const StoreImageOps *ops = store_sqlite.images;
        StoreImages *h = NULL;
        assert_int_equal(ops->open(path, &h), 0);
        images_contract(ops, h);
        ops->close(h);
        assert_int_equal(ops->open(path, &h), 0);
        ImageRow got;
        assert_int_equal(ops->get(h, "alice", IMG(1), &got), 0);
        assert_string_equal(got.doc, IMAGE_READY_DOC);
        store_image_row_clear(&got);
        ops->close(h);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        assert_int_equal(system(cmd), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_images_contract),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
