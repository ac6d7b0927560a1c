#pragma once
/* The order of an owner's sandboxes and the milliseconds of their times,
 * shared by the SQLite and the PostgreSQL tests: created_msec and
 * started_msec round trip, and STORE_SANDBOXES_OF_OWNER answers newest
 * first to the millisecond, then by id (descending), whatever the order of
 * insert, so that the list built on it is total. The caller opened the
 * sandboxes on a store with key_1 of owner alice in it. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_sandboxes.h"

typedef struct OrderSeen {
        char ids[16][32];
        int created_msec[16];
        int n;
} OrderSeen;

static inline int order_test_on_row(void *userdata, SandboxRow *row) {
        OrderSeen *s = userdata;
        assert_true(s->n < 16);
        snprintf(s->ids[s->n], sizeof s->ids[0], "%s", row->id);
        s->created_msec[s->n++] = row->created_msec;
        return 0;
}

static inline void order_test_insert(const StoreSandboxOps *ops, StoreSandboxes *h, const char *id, int64_t sec,
                                     int msec) {
        SandboxRow r = { .owner = "alice", .key_id = "key_1", .labels = "{}", .created_at = sec,
                         .created_msec = msec, .state = SANDBOX_STARTING };
        snprintf(r.id, sizeof r.id, "%s", id);
        sandbox_spec_init(&r.spec);
        r.spec.image = "default";
        r.spec.driver = SANDBOX_DRIVER_NAMESPACE;
        assert_int_equal(ops->insert(h, &r, 100, 100), 0);
}

static inline void sandbox_order_contract(const StoreSandboxOps *ops, StoreSandboxes *h) {
        /* Inserted out of order: the same second apart by milliseconds, and
         * the same millisecond apart by id only. */
        order_test_insert(ops, h, "sbx_m", 1000, 500);
        order_test_insert(ops, h, "sbx_z", 1000, 5);
        order_test_insert(ops, h, "sbx_b", 1000, 999);
        order_test_insert(ops, h, "sbx_y", 999, 999);
        order_test_insert(ops, h, "sbx_c", 1000, 500);
        order_test_insert(ops, h, "sbx_a", 1001, 0);
        order_test_insert(ops, h, "sbx_n", 1000, 500);
        static const char *const want[] = { "sbx_a", "sbx_b", "sbx_n", "sbx_m", "sbx_c", "sbx_z", "sbx_y" };
        static const int want_msec[] = { 0, 999, 500, 500, 500, 5, 999 };
        OrderSeen s = { 0 };
        assert_int_equal(ops->query(h, STORE_SANDBOXES_OF_OWNER, "alice", 0, order_test_on_row, &s), 0);
        assert_int_equal(s.n, 7);
        for (int i = 0; i < 7; i++) {
                assert_string_equal(s.ids[i], want[i]);
                assert_int_equal(s.created_msec[i], want_msec[i]);
        }

        /* started_msec is written with started_at, and none without it. */
        SandboxRow got;
        assert_int_equal(ops->get(h, "sbx_m", &got), 0);
        assert_int_equal(got.created_at, 1000);
        assert_int_equal(got.created_msec, 500);
        assert_int_equal(got.started_at, 0);
        assert_int_equal(got.started_msec, 0);
        got.state = SANDBOX_RUNNING;
        got.started_at = 1002;
        got.started_msec = 17;
        assert_int_equal(ops->update(h, &got), 0);
        sandbox_row_done(&got);
        assert_int_equal(ops->get(h, "sbx_m", &got), 0);
        assert_int_equal(got.started_at, 1002);
        assert_int_equal(got.started_msec, 17);
        assert_int_equal(got.created_msec, 500);
        got.state = SANDBOX_STOPPED;
        got.started_at = 0;
        got.started_msec = 17;
        assert_int_equal(ops->update(h, &got), 0);
        sandbox_row_done(&got);
        assert_int_equal(ops->get(h, "sbx_m", &got), 0);
        assert_int_equal(got.started_at, 0);
        assert_int_equal(got.started_msec, 0);
        sandbox_row_done(&got);
}
