/*
 * The namespace driver (bubblewrap) end to end through the Driver
 * interface: see test_driver_harness.h. Also: what the sandbox cannot do.
 */
#include "test_driver_harness.h"

static int setup(void **state) {
        return harness_setup(state, &driver_namespace, "nstest");
}

static void test_lifecycle(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        harness_lifecycle(h, true);
}

static void test_orphan(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        harness_orphan(h);
}

static void test_bad_specs(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        harness_bad_specs(h);
}

/* The walls: no new user namespace, no mount, no network beyond lo, no
 * host processes in sight, root's capabilities limited. */
static void test_walls(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        Conn c;
        DriverInstance *inst;
        assert_int_equal(harness_start(h, &c, &inst, NULL), 0);
        char out[4096];
        assert_int_equal(conn_exec(&c, 1, "unshare -U true 2>/dev/null; echo $?", out, sizeof out), 0);
        assert_string_equal(out, "1\n");
        assert_int_equal(conn_exec(&c, 3, "mount -t tmpfs x /mnt 2>/dev/null; echo $?", out, sizeof out), 0);
        assert_string_not_equal(out, "0\n");
        assert_int_equal(conn_exec(&c, 5, "ls /sys/class/net 2>/dev/null | tr '\\n' ' '; ip -o link | wc -l", out,
                                   sizeof out),
                         0);
        assert_non_null(strstr(out, "1\n")); /* lo only */
        assert_int_equal(conn_exec(&c, 7, "ls /proc | grep -c '^[0-9]'", out, sizeof out), 0);
        assert_true(atoi(out) < 10);
        assert_int_equal(conn_exec(&c, 9, "grep -E 'NoNewPrivs|Seccomp:' /proc/self/status | tr -s '\\t' ' '", out,
                                   sizeof out),
                         0);
        assert_non_null(strstr(out, "NoNewPrivs: 1"));
        assert_non_null(strstr(out, "Seccomp: 2"));
        assert_int_equal(conn_exec(&c, 11, "hostname", out, sizeof out), 0);
        assert_string_equal(out, "sandbox\n");
        h->drv->stop(inst, NULL);
        conn_close(&c);
}

static void test_bad_layer(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        harness_bad_layer(h);
}

static void test_concurrent(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        harness_concurrent(h, 6);
}

static void test_bench(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        harness_bench(h);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_lifecycle, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_orphan, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_walls, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_bad_specs, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_bad_layer, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_concurrent, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_bench, setup, harness_teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
