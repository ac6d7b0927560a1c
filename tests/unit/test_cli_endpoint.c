/* Finding the daemon and the key: URL and unix-socket parsing, key discovery order. */
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

#include "cli/endpoint.h"
#include "cli/parse.h"

static char err[CLI_ERR_MAX];

static void test_url_http(void **state) {
        Endpoint e = {0};

        assert_int_equal(endpoint_parse("http://127.0.0.1:7878", &e, err, sizeof(err)), 0);
        assert_string_equal(e.base, "http://127.0.0.1:7878");
        assert_string_equal(e.display, "http://127.0.0.1:7878");
        assert_null(e.unix_socket);
        endpoint_done(&e);

        assert_int_equal(endpoint_parse("https://runtime.example.com/api//", &e, err, sizeof(err)), 0);
        assert_string_equal(e.base, "https://runtime.example.com/api");
        endpoint_done(&e);

        assert_int_equal(endpoint_parse("http://[::1]:7878/", &e, err, sizeof(err)), 0);
        assert_string_equal(e.base, "http://[::1]:7878");
        endpoint_done(&e);
}

static void test_url_refused(void **state) {
        Endpoint e = {0};

        /* A key never travels in a URL, and the message does not echo it. */
        assert_int_equal(endpoint_parse("http://rt_secret@127.0.0.1:7878", &e, err, sizeof(err)), -EINVAL);
        assert_null(strstr(err, "rt_secret"));
        assert_non_null(strstr(err, "credentials"));
        assert_int_equal(endpoint_parse("http://user:rt_secret@host", &e, err, sizeof(err)), -EINVAL);
        assert_null(strstr(err, "rt_secret"));
        assert_int_equal(endpoint_parse("http://host:7878/?key=rt_secret", &e, err, sizeof(err)), -EINVAL);
        assert_int_equal(endpoint_parse("http://host:7878/#x", &e, err, sizeof(err)), -EINVAL);
        assert_int_equal(endpoint_parse("ftp://host", &e, err, sizeof(err)), -EINVAL);
        assert_int_equal(endpoint_parse("127.0.0.1:7878", &e, err, sizeof(err)), -EINVAL);
        assert_int_equal(endpoint_parse("http://", &e, err, sizeof(err)), -EINVAL);
        assert_int_equal(endpoint_parse("http:///path", &e, err, sizeof(err)), -EINVAL);
        assert_int_equal(endpoint_parse("http://host\r\nX-Evil: 1", &e, err, sizeof(err)), -EINVAL);
        assert_int_equal(endpoint_parse("http://ho st", &e, err, sizeof(err)), -EINVAL);
        assert_int_equal(endpoint_parse("", &e, err, sizeof(err)), -EINVAL);
        assert_null(e.base);
}

static void test_url_unix(void **state) {
        Endpoint e = {0};
        char longpath[200];

        assert_int_equal(endpoint_parse("unix:/run/runtime/api.sock", &e, err, sizeof(err)), 0);
        assert_string_equal(e.unix_socket, "/run/runtime/api.sock");
        assert_string_equal(e.display, "unix:/run/runtime/api.sock");
        assert_string_equal(e.base, "http://localhost");
        endpoint_done(&e);

        assert_int_equal(endpoint_parse("unix:///run/x.sock", &e, err, sizeof(err)), 0);
        assert_string_equal(e.unix_socket, "/run/x.sock");
        endpoint_done(&e);

        assert_int_equal(endpoint_parse("unix:", &e, err, sizeof(err)), -EINVAL);
        memset(longpath, 'a', sizeof(longpath));
        memcpy(longpath, "unix:/", 6);
        longpath[sizeof(longpath) - 1] = '\0';
        assert_int_equal(endpoint_parse(longpath, &e, err, sizeof(err)), -EINVAL);
        assert_int_equal(endpoint_parse("unix:/tmp/a\nb", &e, err, sizeof(err)), -EINVAL);
}

static void test_url_choice(void **state) {
        unsetenv("RUNTIME_BASE_URL");
        assert_string_equal(endpoint_choose(NULL), "http://127.0.0.1:7878");
        setenv("RUNTIME_BASE_URL", "", 1);
        assert_string_equal(endpoint_choose(NULL), "http://127.0.0.1:7878");
        setenv("RUNTIME_BASE_URL", "unix:/run/r.sock", 1);
        assert_string_equal(endpoint_choose(NULL), "unix:/run/r.sock");
        assert_string_equal(endpoint_choose("http://10.0.0.1:1"), "http://10.0.0.1:1");
        unsetenv("RUNTIME_BASE_URL");
}

static void write_file(const char *path, const char *content) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(content, f);
        fclose(f);
}

static void test_key_order(void **state) {
        char dir[] = "/tmp/runtime-cli-test-XXXXXX", file[128];
        KeyInfo k;

        assert_non_null(mkdtemp(dir));
        snprintf(file, sizeof(file), "%s/admin.key", dir);
        setenv("RUNTIME_STATE_DIR", dir, 1);
        unsetenv("RUNTIME_API_KEY");

        /* Nothing anywhere. */
        assert_int_equal(key_discover(NULL, &k, err, sizeof(err)), 0);
        assert_null(k.key);
        assert_int_equal(k.source, KEY_SOURCE_NONE);
        assert_string_equal(k.file, file);
        assert_int_equal(k.file_errno, ENOENT);
        key_info_done(&k);

        /* The file, its trailing newline not part of the key. */
        write_file(file, "rt_0123456789abcdef0123456789abcdef01234567\n");
        assert_int_equal(key_discover(NULL, &k, err, sizeof(err)), 0);
        assert_string_equal(k.key, "rt_0123456789abcdef0123456789abcdef01234567");
        assert_int_equal(k.source, KEY_SOURCE_FILE);
        key_info_done(&k);

        /* The environment beats the file; an empty variable counts as unset. */
        setenv("RUNTIME_API_KEY", "rt_fromenv", 1);
        assert_int_equal(key_discover(NULL, &k, err, sizeof(err)), 0);
        assert_string_equal(k.key, "rt_fromenv");
        assert_int_equal(k.source, KEY_SOURCE_ENV);
        key_info_done(&k);
        setenv("RUNTIME_API_KEY", "", 1);
        assert_int_equal(key_discover(NULL, &k, err, sizeof(err)), 0);
        assert_int_equal(k.source, KEY_SOURCE_FILE);
        key_info_done(&k);
        setenv("RUNTIME_API_KEY", "rt_fromenv", 1);

        /* The flag beats both. */
        assert_int_equal(key_discover("rt_fromflag", &k, err, sizeof(err)), 0);
        assert_string_equal(k.key, "rt_fromflag");
        assert_int_equal(k.source, KEY_SOURCE_FLAG);
        key_info_done(&k);

        /* Malformed keys are refused without being echoed: they would forge headers. */
        assert_int_equal(key_discover("rt_x\r\nX-Evil: 1", &k, err, sizeof(err)), -EINVAL);
        assert_null(strstr(err, "rt_x"));
        setenv("RUNTIME_API_KEY", "rt_a b", 1);
        assert_int_equal(key_discover(NULL, &k, err, sizeof(err)), -EINVAL);
        assert_null(strstr(err, "rt_a"));
        assert_non_null(strstr(err, "RUNTIME_API_KEY"));
        unsetenv("RUNTIME_API_KEY");
        write_file(file, "rt_line1\nrt_line2\n");
        assert_int_equal(key_discover(NULL, &k, err, sizeof(err)), -EINVAL);
        assert_null(k.key);
        key_info_done(&k);
        write_file(file, "\n");
        assert_int_equal(key_discover(NULL, &k, err, sizeof(err)), 0);
        assert_null(k.key);
        assert_int_equal(k.file_errno, ENODATA);
        key_info_done(&k);

        /* A fifo where the key should be is refused, not waited on. */
        unlink(file);
        assert_int_equal(mkfifo(file, 0600), 0);
        assert_int_equal(key_discover(NULL, &k, err, sizeof(err)), 0);
        assert_null(k.key);
        assert_int_equal(k.file_errno, EINVAL);
        key_info_done(&k);

        unlink(file);
        rmdir(dir);
        unsetenv("RUNTIME_STATE_DIR");
}

static void test_state_dir(void **state) {
        char *d;

        setenv("RUNTIME_STATE_DIR", "/srv/rt", 1);
        d = state_dir_default();
        assert_string_equal(d, "/srv/rt");
        free(d);
        unsetenv("RUNTIME_STATE_DIR");
        d = state_dir_default();
        if (geteuid() == 0)
                assert_string_equal(d, "/var/lib/runtime");
        free(d);
}

static void test_key_check(void **state) {
        assert_int_equal(key_check("rt_0123456789abcdef0123456789abcdef01234567"), 0);
        assert_int_equal(key_check(""), -EINVAL);
        assert_int_equal(key_check("a b"), -EINVAL);
        assert_int_equal(key_check("a\tb"), -EINVAL);
        assert_int_equal(key_check("a\x7f"), -EINVAL);
        assert_int_equal(key_check("\xc3\xa9"), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_url_http),  cmocka_unit_test(test_url_refused),
                cmocka_unit_test(test_url_unix),  cmocka_unit_test(test_url_choice),
                cmocka_unit_test(test_key_order), cmocka_unit_test(test_state_dir),
                cmocka_unit_test(test_key_check),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
