/*
 * The gVisor driver (runsc) end to end through the Driver interface: see
 * test_driver_harness.h.
 */
#include "test_driver_harness.h"

static int setup(void **state) {
        return harness_setup(state, &driver_gvisor, "gvtest");
}

/* RLIMIT_NPROC and the host's memory limit: the pids limit, held below
 * systrap's 4095 tasks, below half the host's pids.max (two host processes
 * per process), and at one task per MiB; the host limit grows with it. */
static void test_task_bounds(void **state) {
        (void)state;
        assert_int_equal(gvisor_nproc(512, 0), 512);
        assert_int_equal(gvisor_nproc(1024, 4096), (4096 - 256) / 4);
        assert_int_equal(gvisor_nproc(8192, 4096), (4096 - 256) / 4);
        assert_int_equal(gvisor_nproc(2048, 0), (4096 - 256) / 4); /* a bomb at 1984 ended the Sentry */
        assert_int_equal(gvisor_nproc(16384, 100000), 4000);
        assert_int_equal(gvisor_nproc(2048, 600), (600 - 256) / 4);
        assert_int_equal(gvisor_nproc(2048, 300), 64); /* 300/8, raised to the floor */
        assert_int_equal(gvisor_nproc(2048, 200), 64);
        assert_int_equal(gvisor_nproc(64, 0), 64);
        assert_int_equal(gvisor_nproc(0, 0), (4096 - 256) / 4);
        /* 512 MiB: 96 + 64 MiB for the Sentry and the watch, 512 tasks at
         * 704 KiB. */
        assert_int_equal(gvisor_host_memory_mib(512, 0), 512 + 96 + 64 + 352);
        assert_true(gvisor_host_memory_mib(1024, 0) > 1024 + 96 + 128);
        assert_true(gvisor_host_memory_mib(1u << 20, 0) > (1u << 20));
}

static void test_lifecycle(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        /* gVisor shows its own identity map inside; the host-side uid is
         * checked through the files it creates instead. */
        harness_lifecycle(h, false);
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

/* The kernel the sandbox talks to is gVisor's, not the host's. */
static void test_user_space_kernel(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        Conn c;
        DriverInstance *inst;
        assert_int_equal(harness_start(h, &c, &inst, NULL), 0);
        char out[4096];
        assert_int_equal(conn_exec(&c, 1, "dmesg 2>/dev/null | head -1; uname -r", out, sizeof out), 0);
        assert_non_null(strstr(out, "gVisor"));
        assert_int_equal(conn_exec(&c, 3, "ip -o link 2>/dev/null | wc -l", out, sizeof out), 0);
        assert_true(atoi(out) <= 1);
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
        harness_concurrent(h, 3);
}

static void test_bench(void **state) {
        Harness *h = *state;
        if (harness_skip(h))
                skip();
        harness_bench(h);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_task_bounds),
                cmocka_unit_test_setup_teardown(test_lifecycle, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_orphan, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_user_space_kernel, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_bad_specs, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_bad_layer, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_concurrent, setup, harness_teardown),
                cmocka_unit_test_setup_teardown(test_bench, setup, harness_teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
