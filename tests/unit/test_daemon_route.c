/* Strict routing of the HTTP API. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/api/api.h"
#include "daemon/api/routes.h"

#define ID "sbx_0123456789abcdef0123"

static void expect_route(const char *method, const char *url, RouteKind kind) {
        Route r;
        int rc = route_parse(method, url, &r);
        if (rc != 0)
                fail_msg("%s %s: %d", method, url, rc);
        assert_int_equal(r.kind, kind);
}

static void expect_rc(const char *method, const char *url, int want) {
        Route r;
        int rc = route_parse(method, url, &r);
        if (rc != want)
                fail_msg("%s %s: %d, wanted %d", method, url, rc, want);
}

static void test_routes(void **state) {
        expect_route("GET", "/healthz", ROUTE_HEALTHZ);
        expect_route("GET", "/metrics", ROUTE_METRICS);
        expect_route("GET", "/v1/info", ROUTE_INFO);
        expect_route("GET", "/v1/limits", ROUTE_LIMITS);
        expect_route("GET", "/v1/images", ROUTE_IMAGES);
        expect_route("POST", "/v1/images/default:build", ROUTE_IMAGE_BUILD);
        expect_route("GET", "/v1/sandboxes", ROUTE_SANDBOX_LIST);
        expect_route("POST", "/v1/sandboxes", ROUTE_SANDBOX_CREATE);
        expect_route("GET", "/v1/sandboxes/" ID, ROUTE_SANDBOX_GET);
        expect_route("DELETE", "/v1/sandboxes/" ID, ROUTE_SANDBOX_DELETE);
        expect_route("POST", "/v1/sandboxes/" ID ":exec", ROUTE_SANDBOX_EXEC);
        expect_route("POST", "/v1/sandboxes/" ID ":stop", ROUTE_SANDBOX_STOP);
        expect_route("POST", "/v1/sandboxes/" ID ":extend", ROUTE_SANDBOX_EXTEND);
        expect_route("PUT", "/v1/sandboxes/" ID "/network", ROUTE_SANDBOX_NETWORK);
        expect_route("GET", "/v1/sandboxes/" ID "/files/content", ROUTE_FILES_READ);
        expect_route("PUT", "/v1/sandboxes/" ID "/files/content", ROUTE_FILES_WRITE);
        expect_route("GET", "/v1/sandboxes/" ID "/files/list", ROUTE_FILES_LIST);
        expect_route("GET", "/v1/sandboxes/" ID "/files/stat", ROUTE_FILES_STAT);
        expect_route("POST", "/v1/sandboxes/" ID "/files:mkdir", ROUTE_FILES_MKDIR);
        expect_route("POST", "/v1/sandboxes/" ID "/files:remove", ROUTE_FILES_REMOVE);
        expect_route("POST", "/v1/sandboxes/" ID "/files:rename", ROUTE_FILES_RENAME);
        expect_route("GET", "/v1/sandboxes/" ID "/egress", ROUTE_SANDBOX_EGRESS);
        expect_route("GET", "/v1/keys", ROUTE_KEYS_LIST);
        expect_route("POST", "/v1/keys", ROUTE_KEYS_CREATE);
        expect_route("DELETE", "/v1/keys/key_0123456789abcdef", ROUTE_KEY_REVOKE);
        expect_route("GET", "/v1/usage", ROUTE_USAGE);
        expect_route("POST", "/v1/trial", ROUTE_TRIAL);
        expect_route("GET", "/v1/egress-secrets", ROUTE_SECRETS_LIST);
        expect_route("GET", "/v1/egress-secrets/OPENAI_API_KEY", ROUTE_SECRET_GET);
        expect_route("PUT", "/v1/egress-secrets/OPENAI_API_KEY", ROUTE_SECRET_PUT);
        expect_route("DELETE", "/v1/egress-secrets/OPENAI_API_KEY", ROUTE_SECRET_DELETE);
}

static void test_process_routes(void **state) {
#define PROC "/v1/sandboxes/" ID "/processes"
        expect_route("GET", PROC, ROUTE_PROC_LIST);
        expect_route("POST", PROC, ROUTE_PROC_SPAWN);
        expect_route("GET", PROC "/proc_0123456789abcdef", ROUTE_PROC_GET);
        expect_route("GET", PROC "/proc_0123456789abcdef/output", ROUTE_PROC_OUTPUT);
        expect_route("POST", PROC "/proc_0123456789abcdef:write", ROUTE_PROC_WRITE);
        expect_route("POST", PROC "/proc_0123456789abcdef:signal", ROUTE_PROC_SIGNAL);
        expect_route("POST", PROC "/proc_0123456789abcdef:wait", ROUTE_PROC_WAIT);
        Route r;
        assert_int_equal(route_parse("GET", PROC "/proc_0123456789abcdef", &r), 0);
        assert_string_equal(r.proc_id, "proc_0123456789abcdef");
        expect_rc("DELETE", PROC, -EOPNOTSUPP);
        expect_rc("GET", PROC "/proc_0123456789abcdef:signal", -EOPNOTSUPP);
        /* Only a well-formed id: no other length, no upper case, no path tricks. */
        expect_rc("GET", PROC "/proc_0123456789abcde", -ENOENT);
        expect_rc("GET", PROC "/proc_0123456789abcdef0", -ENOENT);
        expect_rc("GET", PROC "/proc_0123456789ABCDEF", -ENOENT);
        expect_rc("GET", PROC "/proc_../../../../etc", -ENOENT);
        expect_rc("GET", PROC "/proc_0123456789abcdef/", -ENOENT);
        expect_rc("GET", PROC "/proc_0123456789abcdef/output/x", -ENOENT);
        expect_rc("POST", PROC "/proc_0123456789abcdef:kill", -ENOENT);
        expect_rc("GET", PROC "/", -ENOENT);
        assert_true(route_needs_full_access(ROUTE_PROC_SPAWN));
        assert_true(route_needs_full_access(ROUTE_PROC_WRITE));
        assert_true(route_needs_full_access(ROUTE_PROC_SIGNAL));
        assert_false(route_needs_full_access(ROUTE_PROC_OUTPUT));
#undef PROC
}

static void test_id_and_path_strictness(void **state) {
        expect_rc("GET", "/v1/sandboxes/sbx_123", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/sbx_0123456789ABCDEF0123", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/sbx_0123456789abcdef01234", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/box_0123456789abcdef0123", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/" ID "/", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/", -ENOENT);
        expect_rc("DELETE", "/v1/keys/key_0123", -ENOENT);
        expect_rc("DELETE", "/v1/keys/key_0123456789ABCDEF", -ENOENT);
        expect_rc("GET", "/v1/egress-secrets/", -ENOENT);
        expect_rc("GET", "/v1/egress-secrets/A/B", -ENOENT);
        expect_rc("POST", "/v1/egress-secrets/A", -EOPNOTSUPP);
        expect_rc("GET", "/v1/sandboxes/../healthz", -ENOENT);
        expect_rc("POST", "/v1/sandboxes/" ID ":exec/", -ENOENT);
        expect_rc("POST", "/v1/sandboxes/" ID ":run", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/" ID "/files/content/x", -ENOENT);
        expect_rc("GET", "/healthz/", -ENOENT);
        expect_rc("GET", "//healthz", -ENOENT);
        expect_rc("GET", "/V1/info", -ENOENT);
        expect_rc("GET", "", -ENOENT);
        expect_rc("POST", "/v1/images/:build", -ENOENT);
        expect_rc("POST", "/v1/images/../x:build", -ENOENT);
        expect_rc("POST", "/v1/images/default:bild", -ENOENT);
        expect_rc("POST", "/v1/images/Default:build", -ENOENT);
        char longurl[2000];
        memset(longurl, 'a', sizeof(longurl) - 1);
        longurl[0] = '/';
        longurl[sizeof(longurl) - 1] = '\0';
        expect_rc("GET", longurl, -EMSGSIZE);
        assert_true(route_sandbox_id_ok(ID));
        assert_false(route_sandbox_id_ok("sbx_"));
}

static void test_interpreter_routes(void **state) {
        Route r;
        expect_route("POST", "/v1/sandboxes/" ID "/interpreter:run", ROUTE_INTERP_RUN);
        expect_route("GET", "/v1/sandboxes/" ID "/interpreter/contexts", ROUTE_INTERP_CONTEXT_LIST);
        expect_route("POST", "/v1/sandboxes/" ID "/interpreter/contexts", ROUTE_INTERP_CONTEXT_CREATE);
        expect_route("POST", "/v1/sandboxes/" ID "/interpreter/contexts/python:restart", ROUTE_INTERP_CONTEXT_RESTART);
        expect_route("POST", "/v1/sandboxes/" ID "/interpreter/contexts/ctx-1:interrupt",
                     ROUTE_INTERP_CONTEXT_INTERRUPT);
        expect_route("DELETE", "/v1/sandboxes/" ID "/interpreter/contexts/a", ROUTE_INTERP_CONTEXT_DELETE);
        expect_route("GET", "/v1/sandboxes/" ID "/interpreter/contexts/python/results/2-1.png", ROUTE_INTERP_RESULT);
        assert_int_equal(route_parse("GET", "/v1/sandboxes/" ID "/interpreter/contexts/py/results/3-1.html", &r), 0);
        assert_string_equal(r.sandbox_id, ID);
        assert_string_equal(r.context, "py");
        assert_string_equal(r.result, "3-1.html");
        /* Context ids and result names are checked by the router. */
        expect_rc("POST", "/v1/sandboxes/" ID "/interpreter/contexts/Py:restart", -ENOENT);
        expect_rc("POST", "/v1/sandboxes/" ID "/interpreter/contexts/-a:restart", -ENOENT);
        expect_rc("POST", "/v1/sandboxes/" ID "/interpreter/contexts/../x:restart", -ENOENT);
        expect_rc("DELETE", "/v1/sandboxes/" ID "/interpreter/contexts/"
                            "a123456789012345678901234567890123456789012345678901234567890123", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/" ID "/interpreter/contexts/python/results/..", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/" ID "/interpreter/contexts/python/results/.x", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/" ID "/interpreter/contexts/python/results/a/b", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/" ID "/interpreter/contexts/python/results/", -ENOENT);
        expect_rc("GET", "/v1/sandboxes/" ID "/interpreter:run", -EOPNOTSUPP);
}

static void test_snapshot_routes(void **state) {
        Route r;
        expect_route("POST", "/v1/sandboxes/" ID ":snapshot", ROUTE_SANDBOX_SNAPSHOT);
        expect_route("POST", "/v1/sandboxes/" ID ":fork", ROUTE_SANDBOX_FORK);
        expect_route("GET", "/v1/snapshots", ROUTE_SNAPSHOT_LIST);
        expect_route("GET", "/v1/snapshots/snp_0123456789abcdef0123", ROUTE_SNAPSHOT_GET);
        expect_route("DELETE", "/v1/snapshots/snp_0123456789abcdef0123", ROUTE_SNAPSHOT_DELETE);
        expect_route("POST", "/v1/snapshots/snp_0123456789abcdef0123:update", ROUTE_SNAPSHOT_UPDATE);
        expect_route("POST", "/v1/snapshots/snp_0123456789abcdef0123:extend", ROUTE_SNAPSHOT_EXTEND);
        expect_route("POST", "/v1/snapshots/snp_0123456789abcdef0123:delete", ROUTE_SNAPSHOT_DELETE_POST);
        assert_int_equal(route_parse("GET", "/v1/snapshots/snp_0123456789abcdef0123", &r), 0);
        assert_string_equal(r.snapshot_id, "snp_0123456789abcdef0123");
        /* Only snapshot ids: no other shape reaches a handler. */
        expect_rc("GET", "/v1/snapshots/snp_0123456789ABCDEF0123", -ENOENT);
        expect_rc("GET", "/v1/snapshots/snp_0123", -ENOENT);
        expect_rc("GET", "/v1/snapshots/" ID, -ENOENT);
        expect_rc("GET", "/v1/snapshots/..", -ENOENT);
        expect_rc("GET", "/v1/snapshots/snp_0123456789abcdef01234", -ENOENT);
        expect_rc("POST", "/v1/snapshots/snp_0123456789abcdef0123:restore", -ENOENT);
        assert_true(route_needs_full_access(ROUTE_SANDBOX_SNAPSHOT));
        assert_true(route_needs_full_access(ROUTE_SANDBOX_FORK));
        assert_true(route_needs_full_access(ROUTE_SNAPSHOT_DELETE));
        assert_false(route_needs_full_access(ROUTE_SNAPSHOT_LIST));
}

static void test_methods(void **state) {
        Route r;
        assert_int_equal(route_parse("DELETE", "/v1/sandboxes", &r), -EOPNOTSUPP);
        assert_string_equal(r.allow, "GET, POST");
        assert_int_equal(route_parse("POST", "/healthz", &r), -EOPNOTSUPP);
        assert_int_equal(route_parse("GET", "/v1/sandboxes/" ID ":exec", &r), -EOPNOTSUPP);
        assert_string_equal(r.allow, "POST");
        assert_int_equal(route_parse("POST", "/v1/sandboxes/" ID "/files/content", &r), -EOPNOTSUPP);
        assert_string_equal(r.allow, "GET, PUT");
        assert_int_equal(route_parse("PATCH", "/v1/sandboxes/" ID, &r), -EOPNOTSUPP);
        assert_string_equal(r.allow, "GET, DELETE");
        assert_int_equal(route_parse("POST", "/v1/egress-secrets/A", &r), -EOPNOTSUPP);
        assert_string_equal(r.allow, "GET, PUT, DELETE");
        assert_int_equal(route_parse("GET", "/v1/trial", &r), -EOPNOTSUPP);
        assert_string_equal(r.allow, "POST");
        assert_int_equal(route_parse("get", "/healthz", &r), -EOPNOTSUPP);
}

/* Every route has a handler, a name, and a body kind that fits its method. */
static void test_table(void **state) {
        for (size_t i = 0; i < api_n_routes; i++) {
                const HttpRoute *d = &api_routes[i];
                assert_non_null(d->handler);
                assert_non_null(d->name);
                assert_int_equal(d->path[0], '/');
                if (d->body == HTTP_BODY_STREAM)
                        assert_non_null(d->upload);
                if (strcmp(d->method, "GET") == 0)
                        assert_int_equal(d->body, HTTP_BODY_NONE);
                for (size_t j = 0; j < i; j++)
                        assert_false(strcmp(d->method, api_routes[j].method) == 0 &&
                                     strcmp(d->path, api_routes[j].path) == 0);
        }
}

static void test_access(void **state) {
        assert_false(route_needs_auth(ROUTE_HEALTHZ));
        assert_true(route_needs_auth(ROUTE_METRICS));
        assert_true(route_needs_full_access(ROUTE_SANDBOX_CREATE));
        assert_true(route_needs_full_access(ROUTE_SANDBOX_EXEC));
        assert_true(route_needs_full_access(ROUTE_FILES_WRITE));
        assert_true(route_needs_full_access(ROUTE_SANDBOX_EXTEND));
        assert_true(route_needs_full_access(ROUTE_SANDBOX_DELETE));
        assert_true(route_needs_full_access(ROUTE_IMAGE_BUILD));
        assert_false(route_needs_full_access(ROUTE_SANDBOX_LIST));
        assert_false(route_needs_full_access(ROUTE_FILES_READ));
        assert_false(route_needs_full_access(ROUTE_LIMITS));
        assert_false(route_needs_auth(ROUTE_TRIAL));
        assert_true(route_needs_full_access(ROUTE_KEYS_CREATE));
        assert_true(route_needs_full_access(ROUTE_KEY_REVOKE));
        assert_true(route_needs_full_access(ROUTE_SECRET_PUT));
        assert_true(route_needs_full_access(ROUTE_SECRET_DELETE));
        assert_false(route_needs_full_access(ROUTE_SECRETS_LIST));
        assert_false(route_needs_full_access(ROUTE_SANDBOX_EGRESS));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_routes),
                cmocka_unit_test(test_process_routes),
                cmocka_unit_test(test_id_and_path_strictness),
                cmocka_unit_test(test_interpreter_routes),
                cmocka_unit_test(test_snapshot_routes),
                cmocka_unit_test(test_methods),
                cmocka_unit_test(test_table),
                cmocka_unit_test(test_access),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
