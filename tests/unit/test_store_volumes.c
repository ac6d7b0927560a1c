/* The volumes kind of the SQLite backend (store_volumes.h): the contract
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
#include "daemon/store/store_volumes.h"
#include "test_store_volumes_contract.h"

#define STORE_TMPDIR_PREFIX "/tmp/store-volumes-"
#include "test_store_tmpdir.h"

static void test_volumes_contract(void **state) {
        Fixture *f = *state;
        const StoreVolumeOps *ops = store_sqlite.volumes;
        StoreVolumes *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);
        volumes_contract(ops, h);
        ops->close(h);
        /* Kept across a reopen. */
        assert_int_equal(ops->open(f->path, &h), 0);
        StoreVolume got;
        assert_int_equal(ops->get(h, "alice", "vol_2", &got), 0);
        assert_true(got.shared);
        ops->close(h);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_volumes_contract, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
