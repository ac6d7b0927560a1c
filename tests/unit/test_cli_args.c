/* Argument parsing of the sandbox verbs, the request bodies they make, and
 * the exit codes of the command line as a whole. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/cli.h"
#include "cli/files.h"
#include "cli/parse.h"
#include "cli/run.h"
#include "cli/sandbox.h"

#define ARGV(...) ((char *[]){__VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){__VA_ARGS__}) / sizeof(char *)))
#define PARSE(verb, ret, ...)                                                                               \
        sandbox_args_parse(verb, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), ret, err, sizeof(err))

static char err[CLI_ERR_MAX];

static void test_run_full(void **state) {
        SandboxArgs a;
        json_t *b;

        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--timeout", "10s", "--vcpu", "2", "--memory",
                               "2G", "--disk", "4096", "--driver", "namespace", "--image", "default", "-e",
                               "A=1", "--env", "B=x y", "--cwd", "/tmp", "--name", "demo", "--keep", "-i",
                               "--", "bash", "-c", "echo $A; exit 3"),
                         0);
        assert_int_equal(a.timeout_ms, 10000);
        assert_int_equal(a.vcpu, 2);
        assert_int_equal(a.memory_mib, 2048);
        assert_int_equal(a.disk_mib, 4096);
        assert_true(a.keep);
        assert_true(a.interactive);
        assert_int_equal(a.command_len, 3);
        assert_string_equal(a.command[0], "bash");
        assert_string_equal(a.command[2], "echo $A; exit 3");

        /* Lease: max(300, timeout + 60). */
        assert_int_equal(sandbox_run_lease(&a), 300);
        b = sandbox_create_body(&a, SANDBOX_VERB_RUN);
        assert_int_equal(json_integer_value(json_object_get(b, "timeoutSeconds")), 300);
        assert_string_equal(json_string_value(json_object_get(b, "onLeaseEnd")), "stop"); /* --keep */
        assert_int_equal(json_integer_value(json_object_get(b, "vcpu")), 2);
        assert_int_equal(json_integer_value(json_object_get(b, "memoryMiB")), 2048);
        assert_string_equal(json_string_value(json_object_get(b, "name")), "demo");
        assert_string_equal(json_string_value(json_object_get(json_object_get(b, "env"), "B")), "x y");
        assert_null(json_object_get(b, "network"));
        json_decref(b);

        b = sandbox_exec_body(&a, SANDBOX_VERB_RUN);
        assert_int_equal(json_array_size(json_object_get(b, "argv")), 3);
        assert_true(json_is_true(json_object_get(b, "stream")));
        assert_int_equal(json_integer_value(json_object_get(b, "timeoutMs")), 10000);
        assert_string_equal(json_string_value(json_object_get(b, "cwd")), "/tmp");
        assert_null(json_object_get(b, "env")); /* run: on the sandbox */
        assert_null(json_object_get(b, "command"));
        json_decref(b);
        sandbox_args_done(&a);
}

static void test_run_defaults(void **state) {
        SandboxArgs a;
        json_t *b;

        /* Without "--", the first non-option starts the command and its own options stay its own. */
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "ls", "-l", "--timeout", "5"), 0);
        assert_int_equal(a.command_len, 4);
        assert_string_equal(a.command[1], "-l");
        assert_int_equal(a.timeout_ms, -1);
        assert_int_equal(sandbox_run_lease(&a), 300);
        b = sandbox_create_body(&a, SANDBOX_VERB_RUN);
        assert_string_equal(json_string_value(json_object_get(b, "onLeaseEnd")), "delete");
        assert_null(json_object_get(b, "vcpu"));
        assert_null(json_object_get(b, "driver"));
        json_decref(b);
        b = sandbox_exec_body(&a, SANDBOX_VERB_RUN);
        assert_int_equal(json_integer_value(json_object_get(b, "timeoutMs")), CLI_EXEC_TIMEOUT_MAX_MS);
        assert_null(json_object_get(b, "cwd"));
        json_decref(b);
        sandbox_args_done(&a);

        /* A long timeout stretches the lease; the API caps it. */
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--timeout", "1h", "true"), 0);
        assert_int_equal(sandbox_run_lease(&a), 3660);
        sandbox_args_done(&a);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--timeout", "1d", "true"), 0);
        assert_int_equal(sandbox_run_lease(&a), 86400);
        sandbox_args_done(&a);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--timeout", "1500ms", "--lease", "90", "true"),
                         0);
        assert_int_equal(a.timeout_ms, 1500);
        assert_int_equal(sandbox_run_lease(&a), 90);
        sandbox_args_done(&a);

        /* Egress flags make a network object. */
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--allow", "pypi.org", "--allow",
                               "*.pythonhosted.org", "--deny", "evil.example", "true"),
                         0);
        b = sandbox_create_body(&a, SANDBOX_VERB_RUN);
        assert_true(json_is_true(json_object_get(json_object_get(b, "network"), "internet")));
        assert_int_equal(json_array_size(json_object_get(json_object_get(b, "network"), "allow")), 2);
        assert_int_equal(json_array_size(json_object_get(json_object_get(b, "network"), "deny")), 1);
        json_decref(b);
        sandbox_args_done(&a);

        /* Only what was given goes out: no nulls. */
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--allow", "pypi.org", "true"), 0);
        b = sandbox_create_body(&a, SANDBOX_VERB_RUN);
        assert_null(json_object_get(json_object_get(b, "network"), "deny"));
        json_decref(b);
        sandbox_args_done(&a);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--deny", "x.org", "true"), 0);
        b = sandbox_create_body(&a, SANDBOX_VERB_RUN);
        assert_false(json_is_true(json_object_get(json_object_get(b, "network"), "internet")));
        assert_null(json_object_get(json_object_get(b, "network"), "allow"));
        json_decref(b);
        sandbox_args_done(&a);
}

static void test_run_refused(void **state) {
        SandboxArgs a;

        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run"), -EINVAL);
        assert_non_null(strstr(err, "command is required"));
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--", ""), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--timeout", "-5", "true"), -EINVAL);
        assert_non_null(strstr(err, "negative"));
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--timeout", "soon", "true"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--memory", "lots", "true"), -EINVAL);
        assert_non_null(strstr(err, "--memory"));
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--vcpu", "0", "true"), -ERANGE);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--env", "NOVALUE", "true"), -EINVAL);
        assert_non_null(strstr(err, "K=V"));
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--bogus", "true"), -EINVAL);
        assert_non_null(strstr(err, "unknown option '--bogus'"));
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "-z", "true"), -EINVAL);
        assert_non_null(strstr(err, "'-z'"));
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--timeout"), -EINVAL);
        assert_non_null(strstr(err, "needs a value"));
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--on-lease-end", "stop", "true"), -EINVAL);
        assert_non_null(strstr(err, "--on-lease-end is not an option of sandbox run"));
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--name", "a\nb", "true"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--image", "../x", "true"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--allow", "http://x/", "true"), -EINVAL);
        /* A failed parse leaves nothing allocated (ASan's leak check runs these). */
        assert_int_equal(
                PARSE(SANDBOX_VERB_RUN, &a, "run", "-e", "A=1", "--label", "x=1", "--vcpu", "x", "true"),
                -EINVAL);

        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--help"), 0);
        assert_true(a.help);
        sandbox_args_done(&a);
}

static void test_create(void **state) {
        SandboxArgs a;
        json_t *b;

        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--lease", "1h", "--on-lease-end",
                               "delete", "--label", "team=a", "--label", "env=dev", "--memory", "512"),
                         0);
        b = sandbox_create_body(&a, SANDBOX_VERB_CREATE);
        assert_int_equal(json_integer_value(json_object_get(b, "timeoutSeconds")), 3600);
        assert_string_equal(json_string_value(json_object_get(b, "onLeaseEnd")), "delete");
        assert_int_equal(json_object_size(json_object_get(b, "labels")), 2);
        assert_int_equal(json_integer_value(json_object_get(b, "memoryMiB")), 512);
        json_decref(b);
        sandbox_args_done(&a);

        /* --timeout is the lease for create, as the API's timeoutSeconds. */
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--timeout", "600"), 0);
        assert_int_equal(a.lease_s, 600);
        sandbox_args_done(&a);

        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create"), 0);
        b = sandbox_create_body(&a, SANDBOX_VERB_CREATE);
        assert_int_equal(json_object_size(b), 0); /* the daemon's defaults */
        json_decref(b);
        sandbox_args_done(&a);

        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--on-lease-end", "explode"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "extra"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--keep"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "-i"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--lease", "0"), -ERANGE);
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--lease", "25h"), -ERANGE);
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--label", "novalue"), -EINVAL);

        /* --snapshot: a snapshot id, sent as the create's snapshot; create only. */
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--snapshot", "snp_4b1e9c0d2a7f3e5c8d10"), 0);
        b = sandbox_create_body(&a, SANDBOX_VERB_CREATE);
        assert_string_equal(json_string_value(json_object_get(b, "snapshot")), "snp_4b1e9c0d2a7f3e5c8d10");
        assert_int_equal(json_object_size(b), 1);
        json_decref(b);
        sandbox_args_done(&a);
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--snapshot", "snp_4b1e9c0d2a7f3e5c8d1"), -EINVAL);
        assert_non_null(strstr(err, "not a snapshot id"));
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--snapshot", "snp_4b1e9c0d2a7f3e5c8d1G"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_CREATE, &a, "create", "--snapshot", "../../v1/keys"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_RUN, &a, "run", "--snapshot", "snp_4b1e9c0d2a7f3e5c8d10", "true"), -EINVAL);
        assert_non_null(strstr(err, "--snapshot is not an option of sandbox run"));
        assert_int_equal(PARSE(SANDBOX_VERB_EXEC, &a, "exec", "--snapshot", "snp_4b1e9c0d2a7f3e5c8d10",
                               "sbx_9f2c4e1a7b3d5c6e8f01", "true"),
                         -EINVAL);
}

static void test_exec(void **state) {
        SandboxArgs a;
        json_t *b;

        assert_int_equal(PARSE(SANDBOX_VERB_EXEC, &a, "exec", "--timeout", "2m", "-e", "X=1", "--cwd", "sub",
                               "sbx_1", "--", "ls", "-l"),
                         0);
        assert_string_equal(a.id, "sbx_1");
        assert_int_equal(a.command_len, 2);
        assert_string_equal(a.command[0], "ls");
        b = sandbox_exec_body(&a, SANDBOX_VERB_EXEC);
        assert_int_equal(json_integer_value(json_object_get(b, "timeoutMs")), 120000);
        assert_string_equal(json_string_value(json_object_get(json_object_get(b, "env"), "X")), "1");
        assert_string_equal(json_string_value(json_object_get(b, "cwd")), "sub");
        json_decref(b);
        sandbox_args_done(&a);

        assert_int_equal(PARSE(SANDBOX_VERB_EXEC, &a, "exec", "sbx_1", "echo", "--", "x"), 0);
        assert_int_equal(a.command_len, 3);
        assert_string_equal(a.command[1], "--");
        sandbox_args_done(&a);

        assert_int_equal(PARSE(SANDBOX_VERB_EXEC, &a, "exec", "sbx_1"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_EXEC, &a, "exec", "sbx_1", "--"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_EXEC, &a, "exec"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_EXEC, &a, "exec", "../keys", "--", "true"), -EINVAL);
        assert_int_equal(PARSE(SANDBOX_VERB_EXEC, &a, "exec", "sbx_1", "--timeout", "5", "--", "true"),
                         -EINVAL);
        assert_non_null(strstr(err, "before the sandbox id"));
        assert_int_equal(PARSE(SANDBOX_VERB_EXEC, &a, "exec", "--vcpu", "2", "sbx_1", "true"), -EINVAL);
        assert_non_null(strstr(err, "--vcpu is not an option of sandbox exec"));
}

static void test_exit_codes(void **state) {
        assert_int_equal(run_exit_code(0, false), 0);
        assert_int_equal(run_exit_code(3, false), 3);
        assert_int_equal(run_exit_code(137, true), 124);
        assert_int_equal(run_exit_code(137, false), 137);
        assert_int_equal(run_exit_code(300, false), 255);
        assert_int_equal(run_exit_code(-1, false), 255);
}

#define MAIN(...) cli_main(ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

static void test_cli_main_usage(void **state) {
        /* Usage errors are 2 and never reach the network; --help and --version are 0. */
        setenv("RUNTIME_BASE_URL", "http://127.0.0.1:1", 1);
        assert_int_equal(MAIN("runtime"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "--bogus", "sandbox", "ls"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "frobnicate"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "sandbox"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "sandbox", "frob"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "sandbox", "get"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "sandbox", "get", "a", "b"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "sandbox", "get", "../../v1/keys"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "sandbox", "extend", "sbx_1", "-5"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "sandbox", "extend", "sbx_1", "forever"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "sandbox", "run", "--memory", "x", "--", "true"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "files", "get", "sbx_1"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "files", "ls", "--depth", "11", "sbx_1"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "files", "put", "--mode", "999", "sbx_1", "-", "x"),
                         CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "image", "build", "Bad/Name"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "--url", "http://k@h", "sandbox", "ls"), CLI_EXIT_USAGE);
        assert_int_equal(MAIN("runtime", "--key", "a b", "sandbox", "ls"), CLI_EXIT_USAGE);

        assert_int_equal(MAIN("runtime", "--help"), CLI_EXIT_OK);
        assert_int_equal(MAIN("runtime", "--version"), CLI_EXIT_OK);
        assert_int_equal(MAIN("runtime", "sandbox", "--help"), CLI_EXIT_OK);
        assert_int_equal(MAIN("runtime", "sandbox", "run", "--help"), CLI_EXIT_OK);
        assert_int_equal(MAIN("runtime", "sandbox", "exec", "--help"), CLI_EXIT_OK);
        assert_int_equal(MAIN("runtime", "sandbox", "create", "--help"), CLI_EXIT_OK);
        assert_int_equal(MAIN("runtime", "sandbox", "rm", "--help"), CLI_EXIT_OK);
        assert_int_equal(MAIN("runtime", "files", "put", "--help"), CLI_EXIT_OK);
        assert_int_equal(MAIN("runtime", "image", "build", "--help"), CLI_EXIT_OK);
        assert_int_equal(MAIN("runtime", "doctor", "--help"), CLI_EXIT_OK);

        /* Nobody listens on port 1: an error, not a usage error. */
        assert_int_equal(MAIN("runtime", "--key", "rt_x", "sandbox", "ls"), CLI_EXIT_FAILURE);
        unsetenv("RUNTIME_BASE_URL");
        fflush(stdout);
}

static void test_local_target(void **state) {
        char dir[] = "/tmp/runtime-cli-target-XXXXXX", expect[128];
        char *t;
        int e = 0;

        assert_non_null(mkdtemp(dir));
        t = files_local_target("out.txt", "/workspace/a.txt", &e);
        assert_string_equal(t, "out.txt");
        free(t);
        t = files_local_target(dir, "/workspace/sub/a.txt", &e);
        snprintf(expect, sizeof(expect), "%s/a.txt", dir);
        assert_string_equal(t, expect);
        free(t);
        t = files_local_target(dir, "rel.txt/", &e);
        snprintf(expect, sizeof(expect), "%s/rel.txt", dir);
        assert_string_equal(t, expect);
        free(t);
        /* No name to give: "..", "/" must not become the directory itself or its parent. */
        assert_null(files_local_target(dir, "/workspace/..", &e));
        assert_int_equal(e, EISDIR);
        assert_null(files_local_target(dir, "/", &e));
        rmdir(dir);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_run_full),       cmocka_unit_test(test_run_defaults),
                cmocka_unit_test(test_run_refused),    cmocka_unit_test(test_create),
                cmocka_unit_test(test_exec),           cmocka_unit_test(test_exit_codes),
                cmocka_unit_test(test_cli_main_usage), cmocka_unit_test(test_local_target),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
