/* Placement over a view of the hosts (manager/fleet.h): who may take a new
 * sandbox, and that the choice spreads. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/manager/fleet.h"

#define NOW 1000000

static HostRecord host(const char *id, HostState state, const char *drivers, int64_t mem, int64_t used,
                       int64_t beat) {
        HostRecord h = { .drivers = (char *)drivers, .url = (char *)"http://x", .version = (char *)"0",
                         .memory_mib = mem, .state = state, .heartbeat_at = beat };
        h.used.memory_mib = used;
        snprintf(h.id, sizeof h.id, "%s", id);
        return h;
}

static void test_only_live_hosts_with_the_driver_and_room(void **state) {
        HostRecord v[] = {
                host("draining", HOST_DRAINING, "namespace", 16384, 0, NOW),
                host("dead", HOST_DEAD, "namespace", 16384, 0, NOW),
                host("silent", HOST_LIVE, "namespace", 16384, 0, NOW - 31),
                host("no-driver", HOST_LIVE, "gvisor,microvm", 16384, 0, NOW),
                host("full", HOST_LIVE, "namespace", 16384, 16000, NOW),
                host("fits", HOST_LIVE, "gvisor,namespace", 16384, 8192, NOW),
        };
        FleetNeed need = { .driver = "namespace", .vcpu = 1, .memory_mib = 512 };
        for (uint64_t draw = 0; draw < 50; draw++) {
                size_t i = 99;
                assert_int_equal(fleet_choose(v, 6, &need, NOW, 30, draw, &i), 0);
                assert_string_equal(v[i].id, "fits");
        }
        need.memory_mib = 9000;
        size_t i;
        assert_int_equal(fleet_choose(v, 6, &need, NOW, 30, 7, &i), -ENOSPC);
        need = (FleetNeed){ .driver = "names", .memory_mib = 1 }; /* a prefix is no driver */
        assert_int_equal(fleet_choose(v, 6, &need, NOW, 30, 7, &i), -ENOSPC);
        assert_int_equal(fleet_choose(v, 0, &need, NOW, 30, 7, &i), -ENOSPC);
}

static void test_the_choice_spreads_toward_free_memory(void **state) {
        HostRecord v[] = {
                host("a", HOST_LIVE, "namespace", 16384, 0, NOW),
                host("b", HOST_LIVE, "namespace", 16384, 4096, NOW),
                host("c", HOST_LIVE, "namespace", 16384, 12288, NOW),
        };
        FleetNeed need = { .driver = "namespace", .memory_mib = 512 };
        unsigned got[3] = { 0 };
        for (uint64_t draw = 0; draw < 600; draw++) {
                size_t i;
                assert_int_equal(fleet_choose(v, 3, &need, NOW, 30, draw * 2654435761u, &i), 0);
                got[i]++;
        }
        /* Best of two: the emptiest most often, the fullest never (it loses
         * every pair it is drawn in), and not everything to one host. */
        assert_true(got[0] > got[1]);
        assert_int_equal(got[2], 0);
        assert_true(got[1] > 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_only_live_hosts_with_the_driver_and_room),
                cmocka_unit_test(test_the_choice_spreads_toward_free_memory),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
