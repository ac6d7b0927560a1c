/*
 * runtimed's option table (daemon/options.c): the flags, the config file,
 * which of the two wins, and what each refuses (unknown names, bad values,
 * values past the bounds, over-long lines, a missing file), by name and line.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/options.h"
#include "driver/driver.h"
#include "daemon/manager/keys.h"
#include "daemon/manager/warm_pool.h"

typedef struct Fixture {
        char dir[256];
        char path[320]; /* the config file of the test */
        DaemonOptions o;
        char why[2048];
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof *f);
        if (!f)
                return -1;
        const char *tmp = getenv("TMPDIR");
        snprintf(f->dir, sizeof f->dir, "%s/options-test-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof f->path, "%s/runtimed.conf", f->dir);
        if (options_init(&f->o) < 0)
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        options_done(&f->o);
        unlink(f->path);
        rmdir(f->dir);
        free(f);
        return 0;
}

static void write_file(Fixture *f, const char *text, size_t len) {
        FILE *fp = fopen(f->path, "we");
        assert_non_null(fp);
        assert_int_equal(fwrite(text, 1, len, fp), len);
        assert_int_equal(fclose(fp), 0);
}

static void write_text(Fixture *f, const char *text) {
        write_file(f, text, strlen(text));
}

/* Parses a NULL-terminated list of arguments after "runtimed". */
static int parse(Fixture *f, ...) {
        char *argv[64] = { "runtimed" };
        int argc = 1;
        va_list ap;
        va_start(ap, f);
        for (char *a; (a = va_arg(ap, char *)) != NULL;) {
                assert_true(argc < 63);
                argv[argc++] = a;
        }
        va_end(ap);
        f->why[0] = '\0';
        return options_parse(&f->o, argc, argv, f->why, sizeof f->why);
}

static void assert_refused(Fixture *f, int r, const char *mentions) {
        assert_true(r < 0);
        if (!strstr(f->why, mentions))
                fail_msg("'%s' does not mention '%s'", f->why, mentions);
}

static void test_defaults(void **state) {
        Fixture *f = *state;
        assert_int_equal(parse(f, NULL), 0);
        assert_int_equal(f->o.action, OPTIONS_RUN);
        assert_string_equal(f->o.cfg.listen_addr, "127.0.0.1:7878");
        assert_string_equal(f->o.cfg.cgroup_parent, "runtime");
        assert_string_equal(f->o.driver, "auto");
        assert_null(f->o.drivers);
        assert_null(f->o.cfg.state_dir);
        assert_null(f->o.cfg.socket_path);
        assert_int_equal(f->o.cfg.max_sandboxes, 256);
        assert_int_equal(f->o.cfg.max_sandboxes_per_key, 128);
        assert_int_equal(f->o.cfg.max_vcpu, 8);
        assert_int_equal(f->o.cfg.max_memory_mib, 16384);
        assert_int_equal(f->o.cfg.max_disk_mib, 65536);
        assert_int_equal(f->o.cfg.max_file_mib, 1024);
        assert_int_equal(f->o.cfg.max_connections, 512);
        assert_int_equal(f->o.cfg.price_vcpu_hour_micros, 9375);
        assert_int_equal(f->o.cfg.price_gib_hour_micros, 3125);
        assert_int_equal(f->o.cfg.price_disk_gib_hour_micros, 100);
        assert_int_equal(f->o.cfg.idle_pause_min_seconds, 60);
        assert_int_equal(f->o.cfg.trial_allowance_seconds, KEYS_TRIAL_ALLOWANCE_SECONDS);
        assert_int_equal(f->o.cfg.max_trial_keys, 100);
        /* 0: the part's own default (the manager's, the egress service's). */
        assert_int_equal(f->o.heartbeat_interval_ms, 0);
        assert_int_equal(f->o.cfg.egress_workers, 0);
        assert_int_equal(f->o.egress_wait_timeout_ms, 0);
        assert_int_equal(f->o.log_level, LOG_INFO);
        assert_false(f->o.doctor);
}

static void test_flags(void **state) {
        Fixture *f = *state;
        assert_int_equal(parse(f, "--listen", "127.0.0.1:9999", "--max-vcpu=4", "--trial-hours", "2",
                               "--egress-public-cidr", "203.0.113.0/24", "--egress-public-cidr", "198.51.100.7/32",
                               "--log-level", "debug", "--drivers", "namespace", "--driver", "namespace",
                               "--heartbeat-interval-ms", "2000", "--price-vcpu-hour-micros", "1000000000000",
                               "--state-dir", "/srv/runtime", "--egress-wait-timeout-ms", "100", "--doctor",
                               "--json", NULL),
                         0);
        assert_string_equal(f->o.cfg.listen_addr, "127.0.0.1:9999");
        assert_int_equal(f->o.cfg.max_vcpu, 4);
        assert_int_equal(f->o.cfg.trial_allowance_seconds, 7200);
        assert_int_equal(f->o.cfg.n_egress_public_cidrs, 2);
        assert_string_equal(f->o.cfg.egress_public_cidrs[0], "203.0.113.0/24");
        assert_string_equal(f->o.cfg.egress_public_cidrs[1], "198.51.100.7/32");
        assert_int_equal(f->o.log_level, LOG_DEBUG);
        assert_string_equal(f->o.drivers, "namespace");
        assert_string_equal(f->o.driver, "namespace");
        assert_int_equal(f->o.heartbeat_interval_ms, 2000);
        assert_int_equal(f->o.cfg.price_vcpu_hour_micros, 1000000000000ULL);
        assert_string_equal(f->o.cfg.state_dir, "/srv/runtime");
        assert_int_equal(f->o.egress_wait_timeout_ms, 100);
        assert_true(f->o.doctor && f->o.json);
}

/* getopt_long's ways stay: an unambiguous abbreviation, --name=value, -h. */
static void test_flag_spellings(void **state) {
        Fixture *f = *state;
        assert_int_equal(parse(f, "--max-sandboxes-p", "5", "--cgroup-parent=rt-test", NULL), 0);
        assert_int_equal(f->o.cfg.max_sandboxes_per_key, 5);
        assert_string_equal(f->o.cfg.cgroup_parent, "rt-test");
        assert_refused(f, parse(f, "--max-sand", "5", NULL), "--max-sand");
        assert_int_equal(parse(f, "-h", NULL), 0);
        assert_int_equal(f->o.action, OPTIONS_HELP);
}

/* --help and --version end the parse where they stand, as before: a bad
 * value before them is refused, one after them is not read. */
static void test_help_and_version_stop_the_parse(void **state) {
        Fixture *f = *state;
        assert_int_equal(parse(f, "--version", "--max-vcpu", "x", NULL), 0);
        assert_int_equal(f->o.action, OPTIONS_VERSION);
        f->o.action = OPTIONS_RUN;
        assert_refused(f, parse(f, "--heartbeat-timeout-ms", "999", "--version", NULL), "--heartbeat-timeout-ms");
        assert_int_equal(f->o.action, OPTIONS_RUN);
        assert_int_equal(parse(f, "--help", "--config", "/nonexistent", NULL), 0);
        assert_int_equal(f->o.action, OPTIONS_HELP);
}

static void test_bad_flags(void **state) {
        Fixture *f = *state;
        static const char *const bad[][2] = {
                { "--max-vcpu", "0" },
                { "--max-vcpu", "1025" },
                { "--max-vcpu", "-1" },
                { "--max-vcpu", "1e3" },
                { "--max-vcpu", "" },
                { "--max-vcpu", "4x" },
                { "--max-memory-mib", "63" },
                { "--max-connections", "0" },
                { "--price-gib-hour-micros", "1000000000001" },
                { "--price-gib-hour-micros", "99999999999999999999" },
                { "--trial-hours", "-1" },
                { "--max-trial-keys", "many" },
                { "--heartbeat-interval-ms", "999" },
                { "--heartbeat-timeout-ms", "600001" },
                { "--egress-workers", "0" },
                { "--egress-workers", "4097" },
                { "--egress-workers-per-sandbox", "0" },
                { "--egress-wait-timeout-ms", "99" },
                { "--egress-wait-timeout-ms", "600001" },
                { "--log-level", "loud" },
                { "--driver", "qemu" },
                { "--drivers", "namespace,nope" },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                int r = parse(f, bad[i][0], bad[i][1], NULL);
                assert_int_equal(r, -EINVAL);
                if (!strstr(f->why, bad[i][0]))
                        fail_msg("%s %s: '%s' does not name the flag", bad[i][0], bad[i][1], f->why);
        }
        assert_refused(f, parse(f, "--no-such-flag", NULL), "--no-such-flag");
        assert_refused(f, parse(f, "--listen", NULL), "--listen wants a value");
        assert_refused(f, parse(f, "serve", NULL), "unexpected argument 'serve'");
}

/* The bounds are inclusive, and the drivers this build has are taken. */
static void test_bounds(void **state) {
        Fixture *f = *state;
        assert_int_equal(parse(f, "--max-vcpu", "1", "--max-memory-mib", "64", "--max-disk-mib", "67108864",
                               "--heartbeat-timeout-ms", "600000", "--egress-workers", "4096", "--max-sandboxes",
                               "0", NULL),
                         0);
        assert_int_equal(f->o.cfg.max_vcpu, 1);
        assert_int_equal(f->o.cfg.max_memory_mib, 64);
        assert_int_equal(f->o.cfg.max_disk_mib, 64u * 1024 * 1024);
        assert_int_equal(f->o.heartbeat_timeout_ms, 600000);
        assert_int_equal(f->o.cfg.egress_workers, 4096);
        assert_int_equal(f->o.cfg.max_sandboxes, 0);
        char all[256] = "";
        for (const Driver *const *d = driver_all(); *d; d++)
                snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", all[0] ? "," : "", (*d)->name);
        assert_int_equal(parse(f, "--drivers", all, NULL), 0);
        assert_string_equal(f->o.drivers, all);
}

/* A repeatable option holds at most its array's room. */
static void test_list_capacity(void **state) {
        Fixture *f = *state;
        char *argv[2 + 2 * 33] = { "runtimed" };
        int argc = 1;
        for (int i = 0; i < 33; i++) {
                argv[argc++] = "--egress-test-upstream";
                argv[argc++] = "a.test=127.0.0.1:1";
        }
        int r = options_parse(&f->o, argc, argv, f->why, sizeof f->why);
        assert_refused(f, r, "--egress-test-upstream is given more than 32 times");
        assert_int_equal(f->o.cfg.n_egress_test_upstreams, 32);
}

/* --warm-pool: each class checked where it is given, the shape defaulting
 * to a create's, a driver the pool does not serve refused by name. */
static void test_warm_pool(void **state) {
        Fixture *f = *state;
        char *argv[] = { "runtimed", "--warm-pool", "namespace:default=2", "--warm-pool",
                         "gvisor:analysis:2x2048x4096=1" };
        int r = options_parse(&f->o, 5, argv, f->why, sizeof f->why);
        assert_int_equal(r, 0);
        assert_int_equal(f->o.cfg.n_warm_pools, 2);
        WarmPoolSpec s;
        assert_int_equal(warm_pool_spec_parse(f->o.cfg.warm_pools[0], &s, f->why, sizeof f->why), 0);
        assert_int_equal(s.driver, SANDBOX_DRIVER_NAMESPACE);
        assert_string_equal(s.image, "default");
        assert_int_equal(s.vcpu, 1);
        assert_int_equal(s.memory_mib, 1024);
        assert_int_equal(s.disk_mib, 2048);
        assert_int_equal(s.size, 2);
        assert_int_equal(warm_pool_spec_parse(f->o.cfg.warm_pools[1], &s, f->why, sizeof f->why), 0);
        assert_int_equal(s.driver, SANDBOX_DRIVER_GVISOR);
        assert_string_equal(s.image, "analysis");
        assert_int_equal(s.vcpu, 2);
        assert_int_equal(s.memory_mib, 2048);
        assert_int_equal(s.disk_mib, 4096);
        char shape[32];
        warm_pool_spec_shape(&s, shape, sizeof shape);
        assert_string_equal(shape, "2x2048x4096");
        static const char *const bad[][2] = {
                { "namespace:default", "no =N" },
                { "namespace:default=0", "a size that is not 1..32" },
                { "namespace:default=33", "a size that is not 1..32" },
                { "nosuch:default=1", "a driver that is not namespace, gvisor or microvm" },
                { "namespace:Bad=1", "an image name that is not one" },
                { "namespace:=1", "no image" },
                { "namespace:default:1x32x2048=1", "a shape that is not" },
                { "namespace:default:1x1024=1", "a shape that is not" },
                { "namespace:default:0x1024x2048=1", "a shape that is not" },
                { "namespace:default:1x1024x2048x=1", "a shape that is not" },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                f->why[0] = '\0';
                assert_int_equal(warm_pool_spec_parse(bad[i][0], &s, f->why, sizeof f->why), -EINVAL);
                if (!strstr(f->why, bad[i][1]))
                        fail_msg("%s: '%s' does not say '%s'", bad[i][0], f->why, bad[i][1]);
        }
        char *wrong[] = { "runtimed", "--warm-pool", "firecracker:default=1" };
        options_done(&f->o);
        assert_int_equal(options_init(&f->o), 0);
        r = options_parse(&f->o, 3, wrong, f->why, sizeof f->why);
        assert_refused(f, r, "--warm-pool");
        assert_refused(f, r, "a driver that is not namespace, gvisor or microvm");
        /* The microVM's pool keeps restored VMs. */
        assert_int_equal(warm_pool_spec_parse("microvm:default=1", &s, f->why, sizeof f->why), 0);
}

static void test_file(void **state) {
        Fixture *f = *state;
        write_text(f, "# runtimed's settings\n"
                      "\n"
                      "listen = 127.0.0.1:8123\n"
                      "  max-vcpu\t=  3   # three, a trailing comment\n"
                      "state-dir = /srv/state#1\n"
                      "egress-test-upstream = a.test=127.0.0.1:4000\n"
                      "egress-test-upstream = b.test=127.0.0.1:4001\r\n"
                      "trial-hours = 1\n"
                      "log-level = warn\n"
                      "   # an indented comment\n"
                      "price-disk-gib-hour-micros = 7"); /* no newline at the end */
        assert_int_equal(parse(f, "--config", f->path, NULL), 0);
        assert_string_equal(f->o.cfg.listen_addr, "127.0.0.1:8123");
        assert_int_equal(f->o.cfg.max_vcpu, 3);
        /* A '#' inside a value is the value's. */
        assert_string_equal(f->o.cfg.state_dir, "/srv/state#1");
        assert_int_equal(f->o.cfg.n_egress_test_upstreams, 2);
        assert_string_equal(f->o.cfg.egress_test_upstreams[0], "a.test=127.0.0.1:4000");
        assert_string_equal(f->o.cfg.egress_test_upstreams[1], "b.test=127.0.0.1:4001");
        assert_int_equal(f->o.cfg.trial_allowance_seconds, 3600);
        assert_int_equal(f->o.log_level, LOG_WARN);
        assert_int_equal(f->o.cfg.price_disk_gib_hour_micros, 7);
        /* What the file leaves out keeps its default. */
        assert_int_equal(f->o.cfg.max_memory_mib, 16384);
        assert_string_equal(f->o.cfg.cgroup_parent, "runtime");
}

/* A flag wins over the file, wherever --config stands; a repeatable flag
 * replaces the file's values rather than adding to them. */
static void test_flags_win_over_the_file(void **state) {
        Fixture *f = *state;
        write_text(f, "max-vcpu = 3\n"
                      "listen = 127.0.0.1:8123\n"
                      "egress-public-cidr = 203.0.113.0/24\n"
                      "egress-public-cidr = 198.51.100.0/24\n"
                      "max-disk-mib = 128\n");
        assert_int_equal(parse(f, "--max-vcpu", "5", "--config", f->path, "--egress-public-cidr", "192.0.2.0/24",
                               "--max-disk-mib", "256", NULL),
                         0);
        assert_int_equal(f->o.cfg.max_vcpu, 5);
        assert_int_equal(f->o.cfg.max_disk_mib, 256);
        assert_string_equal(f->o.cfg.listen_addr, "127.0.0.1:8123");
        assert_int_equal(f->o.cfg.n_egress_public_cidrs, 1);
        assert_string_equal(f->o.cfg.egress_public_cidrs[0], "192.0.2.0/24");
}

/* A value the flags override is checked all the same: the file is wrong
 * whatever the command line says. */
static void test_overridden_value_still_checked(void **state) {
        Fixture *f = *state;
        write_text(f, "listen = 127.0.0.1:8123\nmax-vcpu = lots\n");
        char want[512];
        snprintf(want, sizeof want, "%s:2: max-vcpu wants a number 1..1024, not 'lots'", f->path);
        assert_refused(f, parse(f, "--max-vcpu", "5", "--config", f->path, NULL), want);
}

static void test_file_refusals(void **state) {
        Fixture *f = *state;
        static const struct {
                const char *text;
                const char *mentions;
        } cases[] = {
                { "listen = 127.0.0.1:1\nno-such-key = 1\n", ":2: unknown key 'no-such-key'" },
                { "# two\n\nmax-vcpu = 0\n", ":3: max-vcpu wants a number 1..1024, not '0'" },
                { "max-memory-mib = 16777217\n", ":1: max-memory-mib wants a number 64..16777216" },
                { "heartbeat-timeout-ms = 999\n", ":1: heartbeat-timeout-ms wants a number 1000..600000" },
                { "egress-workers = 5000\n", ":1: egress-workers wants a number 1..4096" },
                { "driver = qemu\n", ":1: driver names no driver 'qemu'" },
                { "log-level = loud\n", ":1: log-level is error, warn, info or debug" },
                { "max-vcpu 4\n", ":1: 'max-vcpu 4' is not `key = value`" },
                { "socket =\n", ":1: socket has no value" },
                { "socket = # none\n", ":1: socket has no value" },
                { " = 4\n", ":1: unknown key ''" },
                { "--max-vcpu = 4\n", ":1: unknown key '--max-vcpu'" },
                { "MAX-VCPU = 4\n", ":1: unknown key 'MAX-VCPU'" },
                { "doctor = yes\n", ":1: doctor is given on the command line only" },
                { "config = /etc/other.conf\n", ":1: config is given on the command line only" },
                { "max-vcpu = 2\nlisten = 127.0.0.1:1\nmax-vcpu = 3\n", ":3: max-vcpu is set again (first on line 1)" },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                options_done(&f->o);
                assert_int_equal(options_init(&f->o), 0);
                write_text(f, cases[i].text);
                int r = parse(f, "--config", f->path, NULL);
                assert_int_equal(r, -EINVAL);
                if (!strstr(f->why, f->path) || !strstr(f->why, cases[i].mentions))
                        fail_msg("case %zu: '%s' does not name the file and '%s'", i, f->why, cases[i].mentions);
        }
}

static void test_nul_byte(void **state) {
        Fixture *f = *state;
        static const char text[] = "max-vcpu = 4\nlisten = 127.0.0.1:1\0:2\n";
        write_file(f, text, sizeof text - 1);
        assert_refused(f, parse(f, "--config", f->path, NULL), ":2: the line holds a NUL byte");
}

/* A line of OPTIONS_MAX_LINE bytes is read; one byte more is refused with
 * its number, before the rest of the file. */
static void test_line_bound(void **state) {
        Fixture *f = *state;
        size_t n = OPTIONS_MAX_LINE;
        char *text = malloc(2 * n + 64);
        assert_non_null(text);
        int head = snprintf(text, 64, "max-vcpu = 2\n");
        memset(text + head, 'x', n);
        text[head] = '#';
        text[head + n] = '\n';
        int tail = snprintf(text + head + n + 1, 64, "max-vcpu = 3\n");
        write_file(f, text, head + n + 1 + tail);
        assert_refused(f, parse(f, "--config", f->path, NULL), ":3: max-vcpu is set again");

        options_done(&f->o);
        assert_int_equal(options_init(&f->o), 0);
        memset(text + head, 'x', n + 1);
        text[head] = '#';
        text[head + n + 1] = '\n';
        write_file(f, text, head + n + 2);
        char want[64];
        snprintf(want, sizeof want, ":2: the line is longer than %u bytes", OPTIONS_MAX_LINE);
        assert_refused(f, parse(f, "--config", f->path, NULL), want);
        free(text);
}

static void test_line_count_bound(void **state) {
        Fixture *f = *state;
        size_t n = (size_t)OPTIONS_MAX_LINES + 1;
        char *text = malloc(2 * n);
        assert_non_null(text);
        for (size_t i = 0; i < n; i++) {
                text[2 * i] = '#';
                text[2 * i + 1] = '\n';
        }
        write_file(f, text, 2 * n - 2);
        assert_int_equal(parse(f, "--config", f->path, NULL), 0);
        write_file(f, text, 2 * n);
        char want[64];
        snprintf(want, sizeof want, "more than %u lines", OPTIONS_MAX_LINES);
        assert_refused(f, parse(f, "--config", f->path, NULL), want);
        free(text);
}

static void test_missing_file(void **state) {
        Fixture *f = *state;
        char missing[300];
        snprintf(missing, sizeof missing, "%s/absent.conf", f->dir);
        int r = parse(f, "--config", missing, NULL);
        assert_int_equal(r, -ENOENT);
        assert_refused(f, r, missing);
        assert_refused(f, parse(f, "--config", f->dir, NULL), "is not a regular file");
        /* An empty file is a file without settings. */
        write_text(f, "");
        assert_int_equal(parse(f, "--config", f->path, NULL), 0);
}

/* --help lists every option the parser takes, with its default. */
static void test_help_lists_every_option(void **state) {
        (void)state;
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        assert_non_null(m);
        options_help(m);
        assert_int_equal(fclose(m), 0);
        static const char *const names[] = { "--listen ADDR:PORT", "--socket PATH", "--state-dir DIR", "--config FILE",
                                             "--max-vcpu N", "--trial-hours N", "--egress-test-upstream",
                                             "--log-level", "--doctor", "--version", "(default 127.0.0.1:7878)",
                                             "(default 8; 1..1024)", "(default 50; 0..100000)" };
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
                if (!strstr(buf, names[i]))
                        fail_msg("--help lacks '%s'", names[i]);
        free(buf);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
                cmocka_unit_test_setup_teardown(test_flags, setup, teardown),
                cmocka_unit_test_setup_teardown(test_flag_spellings, setup, teardown),
                cmocka_unit_test_setup_teardown(test_help_and_version_stop_the_parse, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_flags, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bounds, setup, teardown),
                cmocka_unit_test_setup_teardown(test_list_capacity, setup, teardown),
                cmocka_unit_test_setup_teardown(test_warm_pool, setup, teardown),
                cmocka_unit_test_setup_teardown(test_file, setup, teardown),
                cmocka_unit_test_setup_teardown(test_flags_win_over_the_file, setup, teardown),
                cmocka_unit_test_setup_teardown(test_overridden_value_still_checked, setup, teardown),
                cmocka_unit_test_setup_teardown(test_file_refusals, setup, teardown),
                cmocka_unit_test_setup_teardown(test_nul_byte, setup, teardown),
                cmocka_unit_test_setup_teardown(test_line_bound, setup, teardown),
                cmocka_unit_test_setup_teardown(test_line_count_bound, setup, teardown),
                cmocka_unit_test_setup_teardown(test_missing_file, setup, teardown),
                cmocka_unit_test(test_help_lists_every_option),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
