/* Validation of every JSON body the daemon takes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/base64.h"
#include "common/jsonutil.h"
#include "daemon/http/request.h"

static const ReqLimits lim = { .max_vcpu = 8, .max_memory_mib = 16384, .max_disk_mib = 65536 };

static json_t *parse(const char *text) {
        json_t *j = NULL;
        ApiError e = { 0 };
        assert_int_equal(request_body_parse(text, strlen(text), true, &j, &e), 0);
        return j;
}

/* Expects a create body to be refused with a message containing `needle`. */
static void create_refused(const char *text, const char *needle) {
        json_t *j = parse(text);
        CreateRequest c;
        ApiError e = { 0 };
        int r = request_parse_create(j, &lim, &c, &e);
        if (r == 0)
                fail_msg("accepted: %s", text);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.code, "invalid_request");
        if (!strstr(e.message, needle))
                fail_msg("'%s' does not name '%s' (body %s)", e.message, needle, text);
        json_decref(j);
}

static void body_refused(const char *text) {
        json_t *j = NULL;
        ApiError e = { 0 };
        assert_int_not_equal(request_body_parse(text, strlen(text), true, &j, &e), 0);
        assert_int_equal(e.status, 400);
}

static void test_body_parse(void **state) {
        json_t *j = NULL;
        ApiError e = { 0 };
        assert_int_equal(request_body_parse("", 0, true, &j, &e), 0);
        assert_true(json_is_object(j));
        json_decref(j);
        assert_int_not_equal(request_body_parse("", 0, false, &j, &e), 0);
        assert_int_not_equal(request_body_parse("{", 1, true, &j, &e), 0);
        assert_string_equal(e.code, "invalid_request");
        assert_int_not_equal(request_body_parse("[]", 2, true, &j, &e), 0);
        assert_int_not_equal(request_body_parse("{\"a\":1,\"a\":2}", 13, true, &j, &e), 0);
        assert_non_null(strstr(e.message, "duplicate"));
        assert_int_not_equal(request_body_parse("\"x\"", 3, true, &j, &e), 0);
}

static void test_depth(void **state) {
        char buf[200];
        for (int depth = 30; depth <= 34; depth++) {
                /* {"a":[[...]]} with `depth` levels in all. */
                size_t n = 0;
                memcpy(buf, "{\"a\":", 5);
                n = 5;
                for (int i = 1; i < depth; i++)
                        buf[n++] = '[';
                for (int i = 1; i < depth; i++)
                        buf[n++] = ']';
                buf[n++] = '}';
                json_t *j = NULL;
                ApiError e = { 0 };
                int r = request_body_parse(buf, n, true, &j, &e);
                if (depth <= 32) {
                        assert_int_equal(r, 0);
                        json_decref(j);
                } else {
                        assert_int_not_equal(r, 0);
                        assert_non_null(strstr(e.message, "32"));
                }
        }
        /* Brackets inside strings do not count. */
        assert_true(json_depth_ok("{\"a\":\"[[[[[[[[[[[[\\\"[[[[\"}", 25, 2));
        assert_false(json_depth_ok("[[[", 3, 2));
}

static void test_body_too_large(void **state) {
        /* The parser's own bound; each route's smaller one is the HTTP layer's. */
        size_t n = REQ_MAX_EXEC_BODY + 1;
        char *big = malloc(n);
        memset(big, ' ', n);
        json_t *j = NULL;
        ApiError e = { 0 };
        assert_int_not_equal(request_body_parse(big, n, true, &j, &e), 0);
        assert_int_equal(e.status, 413);
        free(big);
}

static void test_create_defaults(void **state) {
        json_t *j = parse("{}");
        CreateRequest c;
        ApiError e = { 0 };
        assert_int_equal(request_parse_create(j, &lim, &c, &e), 0);
        assert_int_equal(c.spec.timeout_seconds, 300);
        assert_true(c.spec.on_lease_end != LEASE_END_DELETE);
        assert_true(c.spec.on_lease_end != LEASE_END_PAUSE);
        assert_int_equal(c.spec.idle_pause_seconds, 0);
        assert_true(c.spec.auto_wake);
        assert_true(c.spec.pausable);
        assert_int_equal(c.spec.vcpu, 1);
        assert_int_equal(c.spec.memory_mib, 1024);
        assert_int_equal(c.spec.disk_mib, 2048);
        assert_string_equal(c.spec.image, "default");
        assert_int_equal(c.spec.driver, SANDBOX_DRIVER_NONE);
        assert_null(c.name);
        assert_int_equal(c.spec.max_cost_micros, -1);
        assert_false(json_is_true(json_object_get(c.spec.network, "internet")));
        assert_int_equal(json_array_size(json_object_get(c.spec.network, "allow")), 0);
        create_request_done(&c);
        json_decref(j);
}

static void test_create_lifecycle(void **state) {
        json_t *j = parse("{\"onLeaseEnd\":\"pause\",\"idlePauseSeconds\":600,\"autoWake\":false}");
        CreateRequest c;
        ApiError e = { 0 };
        assert_int_equal(request_parse_create(j, &lim, &c, &e), 0);
        assert_int_equal(c.spec.on_lease_end, LEASE_END_PAUSE);
        assert_true(c.spec.on_lease_end != LEASE_END_DELETE);
        assert_int_equal(c.spec.idle_pause_seconds, 600);
        assert_false(c.spec.auto_wake);
        create_request_done(&c);
        json_decref(j);
}

/* The published client's create fields: user and persistent: false are
 * taken; the ones this daemon has no counterpart for are refused by name,
 * with what to do instead, never as an unknown field or in silence. */
static void test_create_client_fields(void **state) {
        CreateRequest c;
        ApiError e = { 0 };
        json_t *j = parse("{\"user\":\"root\",\"persistent\":false}");
        assert_int_equal(request_parse_create(j, &lim, &c, &e), 0);
        assert_true(c.run_as_root);
        create_request_done(&c);
        json_decref(j);
        const char *defaults[] = { "{}", "{\"user\":\"sandbox\"}", "{\"user\":null,\"persistent\":null}" };
        for (size_t i = 0; i < sizeof defaults / sizeof *defaults; i++) {
                j = parse(defaults[i]);
                assert_int_equal(request_parse_create(j, &lim, &c, &e), 0);
                assert_false(c.run_as_root);
                create_request_done(&c);
                json_decref(j);
        }
        create_refused("{\"user\":\"nobody\"}", "user");
        create_refused("{\"user\":1}", "user");
        create_refused("{\"persistent\":1}", "persistent");
        static const char *const unsupported[][2] = {
                { "{\"persistent\":true}", "persistent" },   { "{\"funding\":\"credit\"}", "funding" },
                { "{\"region\":\"eu\"}", "region" },         { "{\"spreadFrom\":[\"sbx_1\"]}", "spreadFrom" },
                { "{\"cpu\":\"fast\"}", "cpu" },             { "{\"cpuFloorMillis\":500}", "cpuFloorMillis" },
                { "{\"tailscale\":{}}", "tailscale" },
        };
        for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
                j = parse(unsupported[i][0]);
                e = (ApiError){ 0 };
                assert_int_equal(request_parse_create(j, &lim, &c, &e), -EINVAL);
                assert_int_equal(e.status, 501);
                assert_string_equal(e.code, "not_implemented");
                if (strncmp(e.message, unsupported[i][1], strlen(unsupported[i][1])) != 0 || !e.hint[0])
                        fail_msg("%s: %s (hint %s)", unsupported[i][0], e.message, e.hint);
                json_decref(j);
        }
}

/* volumes: the typed list a create attaches, and the paths and lists refused. */
static void test_create_volumes(void **state) {
        CreateRequest c;
        ApiError e = { 0 };
        json_t *j = parse("{\"volumes\":[{\"volumeId\":\"vol_a\",\"path\":\"/data\"},"
                          "{\"volume\":\"vol_b\",\"path\":\"/mnt/b\",\"readOnly\":true},"
                          "{\"volumeId\":\"vol_c\",\"path\":\"/c\",\"mode\":\"ro\"}]}");
        assert_int_equal(request_parse_create(j, &lim, &c, &e), 0);
        assert_int_equal(c.spec.n_volumes, 3);
        assert_string_equal(c.spec.volumes[1].volume_id, "vol_b");
        assert_string_equal(c.spec.volumes[1].path, "/mnt/b");
        assert_false(c.spec.volumes[0].read_only);
        assert_true(c.spec.volumes[1].read_only);
        assert_true(c.spec.volumes[2].read_only);
        /* The stored spec keeps them (a stored spec names its driver). */
        assert_int_equal(sandbox_driver_from_name("namespace", &c.spec.driver), 0);
        char *text = sandbox_spec_encode(&c.spec);
        assert_non_null(text);
        SandboxSpec back;
        sandbox_spec_init(&back);
        assert_int_equal(sandbox_spec_decode(text, SANDBOX_SPEC_VERSION, &back, NULL, 0), 0);
        assert_int_equal(back.n_volumes, 3);
        assert_string_equal(back.volumes[2].path, "/c");
        assert_true(back.volumes[2].read_only);
        sandbox_spec_done(&back);
        free(text);
        create_request_done(&c);
        json_decref(j);
        static const char *const bad[] = {
                "{\"volumes\":{}}", "{\"volumes\":[1]}", "{\"volumes\":[{\"path\":\"/a\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"a\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/a/../b\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/a//b\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/proc/1\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/sys\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/dev/x\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/.runtime\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/a\",\"x\":1}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/a\",\"mode\":\"rx\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/a\"},{\"volumeId\":\"v\",\"path\":\"/b\"}]}",
                "{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/a\"},{\"volumeId\":\"w\",\"path\":\"/a/b\"}]}",
                "{\"volumes\":[{\"volumeId\":\"a\",\"path\":\"/a\"},{\"volumeId\":\"b\",\"path\":\"/b\"},"
                "{\"volumeId\":\"c\",\"path\":\"/c\"},{\"volumeId\":\"d\",\"path\":\"/d\"},"
                "{\"volumeId\":\"e\",\"path\":\"/e\"}]}",
        };
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
                j = parse(bad[i]);
                e = (ApiError){ 0 };
                assert_int_equal(request_parse_create(j, &lim, &c, &e), -EINVAL);
                if (e.status != 400)
                        fail_msg("%s: %d %s", bad[i], e.status, e.message);
                json_decref(j);
        }
        j = parse("{\"volumes\":[{\"volumeId\":\"v\",\"path\":\"/a\",\"mode\":\"snapshot\"}]}");
        assert_int_equal(request_parse_create(j, &lim, &c, &e), -EINVAL);
        assert_int_equal(e.status, 501);
        json_decref(j);
}

static void test_wake_body(void **state) {
        int64_t t = -1;
        ApiError e = { 0 };
        json_t *j = parse("{}");
        assert_int_equal(request_parse_wake(j, &t, &e), 0);
        assert_int_equal(t, 0);
        json_decref(j);
        j = parse("{\"timeoutSeconds\":60}");
        assert_int_equal(request_parse_wake(j, &t, &e), 0);
        assert_int_equal(t, 60);
        json_decref(j);
        const char *bad[] = { "{\"timeoutSeconds\":0}", "{\"timeoutSeconds\":86401}", "{\"timeoutSeconds\":\"60\"}",
                              "{\"seconds\":60}" };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                j = parse(bad[i]);
                assert_int_not_equal(request_parse_wake(j, &t, &e), 0);
                assert_int_equal(e.status, 400);
                json_decref(j);
        }
        SandboxState wstate;
        int64_t ms = 0;
        assert_int_equal(request_parse_wait_for("paused", NULL, &wstate, &ms, &e), 0);
        assert_int_equal(wstate, SANDBOX_PAUSED);
        assert_int_equal(ms, 60000);
        assert_int_equal(request_parse_wait_for("running", "0", &wstate, &ms, &e), 0);
        assert_int_equal(ms, 0);
        const char *bad_wait[][2] = { { "asleep", NULL }, { NULL, NULL }, { "deleted", NULL }, { "paused", "121" }, { "paused", "" },
                                      { "paused", "-1" }, { "paused", "1e3" }, { "paused", "99999999999999999999" } };
        for (size_t i = 0; i < sizeof(bad_wait) / sizeof(bad_wait[0]); i++) {
                assert_int_not_equal(request_parse_wait_for(bad_wait[i][0], bad_wait[i][1], &wstate, &ms, &e), 0);
                assert_int_equal(e.status, 400);
        }
        j = parse("{\"x\":1}");
        assert_int_not_equal(request_parse_no_fields(j, &e), 0);
        assert_non_null(strstr(e.message, "x"));
        json_decref(j);
}

static void test_create_full(void **state) {
        json_t *j = parse("{\"timeoutSeconds\":86400,\"onLeaseEnd\":\"delete\",\"vcpu\":8,\"memoryMiB\":64,"
                          "\"diskMiB\":65536,\"network\":{\"internet\":true,\"allow\":[\"PyPI.org\",\"*.github.com\"],"
                          "\"deny\":[]},\"env\":{\"A_1\":\"x\"},\"image\":\"default\",\"driver\":\"namespace\","
                          "\"name\":\"demo\",\"labels\":{\"team\":\"a\"},\"maxCostMicros\":0}");
        CreateRequest c;
        ApiError e = { 0 };
        assert_int_equal(request_parse_create(j, &lim, &c, &e), 0);
        assert_int_equal(c.spec.on_lease_end, LEASE_END_DELETE);
        assert_int_equal(c.spec.vcpu, 8);
        assert_int_equal(c.spec.driver, SANDBOX_DRIVER_NAMESPACE);
        assert_string_equal(c.name, "demo");
        assert_int_equal(c.spec.max_cost_micros, 0);
        assert_string_equal(json_string_value(json_array_get(json_object_get(c.spec.network, "allow"), 0)), "pypi.org");
        create_request_done(&c);
        json_decref(j);
}

static void test_create_bounds(void **state) {
        create_refused("{\"timeoutSeconds\":0}", "timeoutSeconds");
        create_refused("{\"timeoutSeconds\":86401}", "timeoutSeconds");
        create_refused("{\"timeoutSeconds\":1.5}", "timeoutSeconds");
        create_refused("{\"timeoutSeconds\":\"10\"}", "timeoutSeconds");
        create_refused("{\"onLeaseEnd\":\"hibernate\"}", "onLeaseEnd");
        create_refused("{\"idlePauseSeconds\":-1}", "idlePauseSeconds");
        create_refused("{\"idlePauseSeconds\":86401}", "idlePauseSeconds");
        create_refused("{\"idlePauseSeconds\":1.5}", "idlePauseSeconds");
        create_refused("{\"autoWake\":1}", "autoWake");
        create_refused("{\"pausable\":\"no\"}", "pausable");
        create_refused("{\"pausable\":false,\"onLeaseEnd\":\"pause\"}", "pausable");
        create_refused("{\"pausable\":false,\"idlePauseSeconds\":60}", "pausable");
        create_refused("{\"onLeaseEnd\":1}", "onLeaseEnd");
        create_refused("{\"vcpu\":0}", "vcpu");
        create_refused("{\"vcpu\":9}", "vcpu");
        create_refused("{\"vcpu\":true}", "vcpu");
        create_refused("{\"memoryMiB\":63}", "memoryMiB");
        create_refused("{\"memoryMiB\":16385}", "memoryMiB");
        create_refused("{\"diskMiB\":63}", "diskMiB");
        create_refused("{\"diskMiB\":65537}", "diskMiB");
        create_refused("{\"maxCostMicros\":-1}", "maxCostMicros");
        create_refused("{\"image\":\"../etc\"}", "image");
        create_refused("{\"image\":\"\"}", "image");
        create_refused("{\"image\":5}", "image");
        create_refused("{\"driver\":\"Name Space\"}", "driver");
        create_refused("{\"name\":\"a\\nb\"}", "name");
        create_refused("{\"name\":\"0123456789012345678901234567890123456789012345678901234567890123456789\"}", "name");
        body_refused("{\"name\":\"a\\u0000b\"}"); /* jansson refuses \u0000 */
        create_refused("{\"labels\":[]}", "labels");
        create_refused("{\"labels\":{\"a\":1}}", "labels.a");
        create_refused("{\"labels\":{\"\":\"x\"}}", "labels");
        create_refused("{\"env\":{\"1A\":\"x\"}}", "env");
        create_refused("{\"env\":{\"A-B\":\"x\"}}", "env");
        create_refused("{\"env\":{\"A\":1}}", "env.A");
        body_refused("{\"env\":{\"A\":\"a\\u0000\"}}"); /* jansson refuses \u0000 */
        create_refused("{\"env\":\"A=1\"}", "env");
        create_refused("{\"network\":{\"internet\":1}}", "network.internet");
        create_refused("{\"network\":{\"allow\":[\"a b\"]}}", "network.allow[0]");
        create_refused("{\"network\":{\"deny\":[\"ok.com\",\"*\"]}}", "network.deny[1]");
        create_refused("{\"network\":{\"allow\":[\"a..b\"]}}", "network.allow[0]");
        create_refused("{\"network\":{\"allow\":\"x\"}}", "network.allow");
        create_refused("{\"network\":{\"proxy\":true}}", "network.proxy");
        create_refused("{\"network\":[]}", "network");
        create_refused("{\"vCPU\":1}", "vCPU");
}

static void test_create_counts(void **state) {
        /* 33 labels, 129 env vars, 257 host patterns. */
        char *buf = malloc(1 << 16);
        size_t n = (size_t)sprintf(buf, "{\"labels\":{");
        for (int i = 0; i < 33; i++)
                n += (size_t)sprintf(buf + n, "%s\"k%d\":\"v\"", i ? "," : "", i);
        sprintf(buf + n, "}}");
        create_refused(buf, "labels");
        n = (size_t)sprintf(buf, "{\"env\":{");
        for (int i = 0; i < 129; i++)
                n += (size_t)sprintf(buf + n, "%s\"K%d\":\"v\"", i ? "," : "", i);
        sprintf(buf + n, "}}");
        create_refused(buf, "env");
        n = (size_t)sprintf(buf, "{\"network\":{\"allow\":[");
        for (int i = 0; i < 257; i++)
                n += (size_t)sprintf(buf + n, "%s\"h%d.com\"", i ? "," : "", i);
        sprintf(buf + n, "]}}");
        create_refused(buf, "network.allow");
        /* One env value over 32 KiB. */
        n = (size_t)sprintf(buf, "{\"env\":{\"A\":\"");
        memset(buf + n, 'x', 32 * 1024 + 1);
        n += 32 * 1024 + 1;
        sprintf(buf + n, "\"}}");
        create_refused(buf, "env.A");
        free(buf);
}

/* A build's network is read by the same parser under its own name: every
 * message names build.network..., never the create's field. */
static void network_refused(const char *text, const char *needle) {
        json_t *j = parse(text), *ret = NULL;
        ApiError e = { 0 };
        if (request_parse_network(j, "build.network", &ret, &e) == 0)
                fail_msg("accepted: %s", text);
        assert_int_equal(e.status, 400);
        if (!strstr(e.message, needle))
                fail_msg("'%s' does not name '%s' (body %s)", e.message, needle, text);
        if (strstr(e.message, " network") || strncmp(e.message, "network", 7) == 0)
                fail_msg("'%s' names the create's field", e.message);
        assert_null(ret);
        json_decref(j);
}

static void test_network_under_another_field(void **state) {
        network_refused("{\"internet\":1}", "build.network.internet must be a boolean");
        network_refused("{\"allow\":[\"a b\"]}", "build.network.allow[0] is not a host pattern");
        network_refused("{\"deny\":[\"ok.com\",\"*\"]}", "build.network.deny[1]");
        network_refused("{\"allow\":\"x\"}", "build.network.allow must be");
        network_refused("{\"proxy\":true}", "unknown field build.network.proxy");
        json_t *j = json_array(), *ret = NULL;
        ApiError e = { 0 };
        assert_int_equal(request_parse_network(j, "build.network", &ret, &e), -EINVAL);
        assert_string_equal(e.message, "build.network must be an object, not an array");
        json_decref(j);
        j = parse("{\"allow\":[\"PyPI.org\"]}");
        assert_int_equal(request_parse_network(j, "build.network", &ret, &e), 0);
        assert_true(json_is_true(json_object_get(ret, "internet")));
        assert_string_equal(json_string_value(json_array_get(json_object_get(ret, "allow"), 0)), "pypi.org");
        json_decref(ret);
        json_decref(j);
        /* None given: no network, in the stored form. */
        assert_int_equal(request_parse_network(NULL, "build.network", &ret, &e), 0);
        assert_false(json_is_true(json_object_get(ret, "internet")));
        assert_int_equal(json_array_size(json_object_get(ret, "allow")), 0);
        json_decref(ret);
}

static void exec_refused(const char *text, const char *needle) {
        json_t *j = parse(text);
        ExecRequest x;
        ApiError e = { 0 };
        if (request_parse_exec(j, &x, &e) == 0)
                fail_msg("accepted: %s", text);
        if (!strstr(e.message, needle))
                fail_msg("'%s' does not name '%s'", e.message, needle);
        json_decref(j);
}

static void test_exec(void **state) {
        json_t *j = parse("{\"command\":\"echo hi\"}");
        ExecRequest x;
        ApiError e = { 0 };
        assert_int_equal(request_parse_exec(j, &x, &e), 0);
        assert_string_equal(x.command, "echo hi");
        assert_string_equal(x.cwd, "/workspace");
        assert_int_equal(x.timeout_ms, 60000);
        assert_int_equal(x.max_output_bytes, 65536);
        assert_false(x.stream);
        assert_false(x.has_stdin);
        exec_request_done(&x);
        json_decref(j);

        j = parse("{\"argv\":[\"ls\",\"-l\"],\"cwd\":\"sub/dir\",\"stdinBase64\":\"aGk=\",\"timeoutMs\":1,"
                  "\"stream\":true,\"maxOutputBytes\":0,\"env\":{\"X\":\"1\"}}");
        assert_int_equal(request_parse_exec(j, &x, &e), 0);
        assert_string_equal(x.cwd, "/workspace/sub/dir");
        assert_true(x.has_stdin);
        assert_int_equal(x.stdin_len, 2);
        assert_memory_equal(x.stdin_data, "hi", 2);
        assert_int_equal(x.max_output_bytes, 0);
        assert_true(x.stream);
        exec_request_done(&x);
        json_decref(j);

        exec_refused("{}", "exactly one");
        exec_refused("{\"command\":\"a\",\"argv\":[\"a\"]}", "exactly one");
        exec_refused("{\"command\":\"\"}", "command");
        exec_refused("{\"command\":1}", "command");
        exec_refused("{\"argv\":[]}", "argv");
        exec_refused("{\"argv\":\"ls\"}", "argv");
        exec_refused("{\"argv\":[\"ls\",1]}", "argv[1]");
        exec_refused("{\"argv\":[\"\"]}", "argv[0]");
        body_refused("{\"argv\":[\"a\\u0000\"]}"); /* jansson refuses \u0000 */
        exec_refused("{\"command\":\"x\",\"timeoutMs\":0}", "timeoutMs");
        exec_refused("{\"command\":\"x\",\"timeoutMs\":86400001}", "timeoutMs");
        exec_refused("{\"command\":\"x\",\"maxOutputBytes\":16777217}", "maxOutputBytes");
        exec_refused("{\"command\":\"x\",\"maxOutputBytes\":-1}", "maxOutputBytes");
        exec_refused("{\"command\":\"x\",\"stream\":\"yes\"}", "stream");
        exec_refused("{\"command\":\"x\",\"stdin\":\"a\",\"stdinBase64\":\"YQ==\"}", "stdin");
        exec_refused("{\"command\":\"x\",\"stdinBase64\":\"YQ=\"}", "stdinBase64");
        exec_refused("{\"command\":\"x\",\"stdinBase64\":\"Y===\"}", "stdinBase64");
        exec_refused("{\"command\":\"x\",\"stdin\":5}", "stdin");
        exec_refused("{\"command\":\"x\",\"cwd\":\"\"}", "cwd");
        body_refused("{\"command\":\"x\",\"cwd\":\"a\\u0000b\"}"); /* jansson refuses \u0000 */
        exec_refused("{\"command\":\"x\",\"env\":{\"A B\":\"1\"}}", "env");
        exec_refused("{\"command\":\"x\",\"shell\":\"sh\"}", "shell");
}

static void test_paths(void **state) {
        char *p = NULL;
        ApiError e = { 0 };
        assert_int_equal(request_resolve_path("a.txt", 5, "path", &p, &e), 0);
        assert_string_equal(p, "/workspace/a.txt");
        free(p);
        assert_int_equal(request_resolve_path("/etc/x", 6, "path", &p, &e), 0);
        assert_string_equal(p, "/etc/x");
        free(p);
        assert_int_not_equal(request_resolve_path("", 0, "path", &p, &e), 0);
        assert_int_not_equal(request_resolve_path("a\0b", 3, "path", &p, &e), 0);
        char *long_path = malloc(REQ_MAX_PATH + 2);
        memset(long_path, 'a', REQ_MAX_PATH + 1);
        long_path[0] = '/';
        assert_int_not_equal(request_resolve_path(long_path, REQ_MAX_PATH + 1, "path", &p, &e), 0);
        assert_int_equal(request_resolve_path(long_path, REQ_MAX_PATH, "path", &p, &e), 0);
        free(p);
        /* Relative: the /workspace prefix counts toward the limit. */
        memset(long_path, 'a', REQ_MAX_PATH);
        assert_int_not_equal(request_resolve_path(long_path, REQ_MAX_PATH - 5, "path", &p, &e), 0);
        free(long_path);
}

static void test_file_ops(void **state) {
        char *path = NULL, *to = NULL;
        bool flag;
        ApiError e = { 0 };
        json_t *j = parse("{\"path\":\"d\"}");
        assert_int_equal(request_parse_mkdir(j, &path, &flag, &e), 0);
        assert_true(flag);
        free(path);
        assert_int_equal(request_parse_remove(j, &path, &flag, &e), 0);
        assert_false(flag);
        free(path);
        json_decref(j);
        j = parse("{\"path\":\"d\",\"parents\":\"no\"}");
        assert_int_not_equal(request_parse_mkdir(j, &path, &flag, &e), 0);
        json_decref(j);
        j = parse("{\"parents\":true}");
        assert_int_not_equal(request_parse_mkdir(j, &path, &flag, &e), 0);
        assert_non_null(strstr(e.message, "path"));
        json_decref(j);
        bool overwrite = false;
        j = parse("{\"from\":\"a\",\"to\":\"/b\"}");
        assert_int_equal(request_parse_rename(j, &path, &to, &overwrite, &e), 0);
        assert_string_equal(path, "/workspace/a");
        assert_string_equal(to, "/b");
        assert_true(overwrite); /* absent: replace, as before the field */
        free(path);
        free(to);
        json_decref(j);
        j = parse("{\"from\":\"/a\",\"to\":\"/b\",\"overwrite\":false}");
        assert_int_equal(request_parse_rename(j, &path, &to, &overwrite, &e), 0);
        assert_false(overwrite);
        free(path);
        free(to);
        json_decref(j);
        j = parse("{\"from\":\"/a\",\"to\":\"/b\",\"overwrite\":\"yes\"}");
        assert_int_not_equal(request_parse_rename(j, &path, &to, &overwrite, &e), 0);
        json_decref(j);
        j = parse("{\"from\":\"a\"}");
        assert_int_not_equal(request_parse_rename(j, &path, &to, &overwrite, &e), 0);
        json_decref(j);
        UpdateRequest u;
        j = parse("{\"name\":null,\"labels\":{\"a\":\"b\"},\"timeoutSeconds\":600,\"onTimeout\":\"delete\"}");
        assert_int_equal(request_parse_update(j, &u, &e), 0);
        assert_true(u.set_name);
        assert_null(u.name);
        assert_string_equal(json_string_value(json_object_get(u.labels, "a")), "b");
        assert_int_equal(u.timeout_seconds, 600);
        assert_string_equal(u.on_lease_end, "delete");
        update_request_done(&u);
        json_decref(j);
        /* The published client's other settings. */
        j = parse("{\"env\":{\"A\":\"1\",\"B\":null},\"autoWake\":false,\"user\":\"root\","
                  "\"idlePauseSeconds\":5,\"maxTotalCostMicros\":null,\"onLeaseEnd\":\"pause\",\"persistent\":false}");
        assert_int_equal(request_parse_update(j, &u, &e), 0);
        assert_string_equal(json_string_value(json_object_get(u.env, "A")), "1");
        assert_true(json_is_null(json_object_get(u.env, "B")));
        assert_int_equal(u.auto_wake, 0);
        assert_true(u.set_user && u.run_as_root);
        assert_int_equal(u.idle_pause_seconds, 5);
        assert_true(u.set_max_total);
        assert_int_equal(u.max_total_cost_micros, -1);
        assert_string_equal(u.on_lease_end, "pause");
        assert_false(u.set_name);
        assert_null(u.labels);
        update_request_done(&u);
        json_decref(j);
        /* Left out: unchanged; user null: back to the sandbox user. */
        j = parse("{\"user\":null,\"maxTotalCostMicros\":7}");
        assert_int_equal(request_parse_update(j, &u, &e), 0);
        assert_true(u.set_user && !u.run_as_root);
        assert_int_equal(u.auto_wake, -1);
        assert_int_equal(u.idle_pause_seconds, -1);
        assert_null(u.env);
        assert_int_equal(u.max_total_cost_micros, 7);
        update_request_done(&u);
        json_decref(j);
        static const struct {
                const char *body;
                int status;
                const char *mentions;
        } bad_updates[] = {
                { "{\"timeoutSeconds\":0}", 400, "lease" },
                { "{\"timeoutSeconds\":86401}", 400, "timeoutSeconds" },
                { "{\"name\":\"\"}", 400, "name" },
                { "{\"labels\":[]}", 400, "labels" },
                { "{\"x\":1}", 400, "unknown field x" },
                { "{\"onTimeout\":\"explode\"}", 400, "onTimeout" },
                { "{\"onTimeout\":\"stop\",\"onLeaseEnd\":\"delete\"}", 400, "onLeaseEnd" },
                { "{\"env\":[]}", 400, "env" },
                { "{\"env\":null}", 400, "env" },
                { "{\"env\":{\"1A\":\"x\"}}", 400, "env" },
                { "{\"env\":{\"A-B\":null}}", 400, "env" },
                { "{\"env\":{\"A\":1}}", 400, "env.A" },
                { "{\"autoWake\":\"yes\"}", 400, "autoWake" },
                { "{\"autoWake\":null}", 400, "autoWake" },
                { "{\"idlePauseSeconds\":-1}", 400, "idlePauseSeconds" },
                { "{\"idlePauseSeconds\":86401}", 400, "idlePauseSeconds" },
                { "{\"maxTotalCostMicros\":-5}", 400, "maxTotalCostMicros" },
                { "{\"maxTotalCostMicros\":\"5\"}", 400, "maxTotalCostMicros" },
                { "{\"user\":\"nobody\"}", 400, "user" },
                { "{\"user\":0}", 400, "user" },
                { "{\"persistent\":true}", 501, "persistent" },
                { "{\"persistent\":\"yes\"}", 400, "persistent" },
                /* A create-only field of the client is not an update's. */
                { "{\"region\":\"x\"}", 400, "unknown field region" },
        };
        for (size_t i = 0; i < sizeof(bad_updates) / sizeof(bad_updates[0]); i++) {
                j = parse(bad_updates[i].body);
                e = (ApiError){ 0 };
                assert_int_not_equal(request_parse_update(j, &u, &e), 0);
                assert_int_equal(e.status, bad_updates[i].status);
                if (!strstr(e.message, bad_updates[i].mentions))
                        fail_msg("%s: %s", bad_updates[i].body, e.message);
                json_decref(j);
        }
        /* An env value past a create's bound. */
        json_t *big = json_pack("{s:{s:s%}}", "env", "A", "", (size_t)0);
        char *value = calloc(1, REQ_MAX_ENV_VALUE + 2);
        memset(value, 'v', REQ_MAX_ENV_VALUE + 1);
        json_object_set_new(json_object_get(big, "env"), "A", json_string(value));
        free(value);
        assert_int_equal(request_parse_update(big, &u, &e), -EINVAL);
        json_decref(big);
        int64_t s;
        j = parse("{\"seconds\":60}");
        assert_int_equal(request_parse_extend(j, &s, &e), 0);
        assert_int_equal(s, 60);
        json_decref(j);
        j = parse("{\"seconds\":0}");
        assert_int_not_equal(request_parse_extend(j, &s, &e), 0);
        json_decref(j);
        j = parse("{}");
        assert_int_not_equal(request_parse_extend(j, &s, &e), 0);
        json_decref(j);
        unsigned v;
        assert_int_equal(request_parse_mode("644", &v, &e), 0);
        assert_int_equal(v, 0644);
        assert_int_not_equal(request_parse_mode("999", &v, &e), 0);
        assert_int_not_equal(request_parse_mode("1777", &v, &e), 0);
        assert_int_not_equal(request_parse_mode("", &v, &e), 0);
        assert_int_equal(request_parse_depth("10", &v, &e), 0);
        assert_int_not_equal(request_parse_depth("11", &v, &e), 0);
        assert_int_not_equal(request_parse_depth("0", &v, &e), 0);
        assert_int_not_equal(request_parse_depth("1x", &v, &e), 0);
}

static void test_base64(void **state) {
        uint8_t *out;
        size_t n;
        assert_int_equal(base64_decode("", 0, 10, &out, &n), 0);
        assert_int_equal(n, 0);
        free(out);
        assert_int_equal(base64_decode("aGVsbG8=", 8, 10, &out, &n), 0);
        assert_int_equal(n, 5);
        assert_memory_equal(out, "hello", 5);
        free(out);
        assert_int_equal(base64_decode("aGVsbG8h", 8, 10, &out, &n), 0);
        assert_int_equal(n, 6);
        free(out);
        assert_int_equal(base64_decode("aGVsbG8=", 8, 4, &out, &n), -E2BIG);
        assert_int_equal(base64_decode("aGVsbG8", 7, 10, &out, &n), -EINVAL);
        assert_int_equal(base64_decode("a=Vs", 4, 10, &out, &n), -EINVAL);
        assert_int_equal(base64_decode("aG=sbG8=", 8, 10, &out, &n), -EINVAL);
        assert_int_equal(base64_decode("aG!s", 4, 10, &out, &n), -EINVAL);
}

static void test_process_parsers(void **state) {
        ApiError e = { 0 };
        ExecRequest x;
        json_t *j = parse("{\"command\":\"cat\",\"stdinMode\":\"pipe\",\"outputEncoding\":\"base64\",\"user\":\"root\"}");
        assert_int_equal(request_parse_spawn(j, &x, &e), 0);
        assert_true(x.stdin_pipe && x.base64 && x.user == REQ_AS_ROOT);
        assert_int_equal(x.timeout_ms, REQ_MAX_EXEC_TIMEOUT_MS);
        exec_request_done(&x);
        json_decref(j);
        static const char *const bad_spawn[] = {
                "{\"command\":\"x\",\"stream\":true}", "{\"command\":\"x\",\"pty\":{\"cols\":0}}",
                "{\"command\":\"x\",\"stdinMode\":\"tty\"}", "{\"command\":\"x\",\"user\":\"nobody\"}",
                "{\"command\":\"x\",\"stdin\":\"a\",\"stdinMode\":\"pipe\"}",
                "{\"command\":\"x\",\"outputEncoding\":\"hex\"}", "{\"command\":\"x\",\"traceFiles\":true}",
        };
        for (size_t i = 0; i < sizeof bad_spawn / sizeof *bad_spawn; i++) {
                j = parse(bad_spawn[i]);
                assert_int_equal(request_parse_spawn(j, &x, &e), -EINVAL);
                json_decref(j);
        }
        /* exec takes the published client's user too, but not a spawn's stdinMode. */
        j = parse("{\"command\":\"x\",\"user\":\"root\",\"timeoutMs\":5}");
        assert_int_equal(request_parse_exec(j, &x, &e), 0);
        exec_request_done(&x);
        json_decref(j);
        j = parse("{\"command\":\"x\",\"stdinMode\":\"pipe\"}");
        assert_int_equal(request_parse_exec(j, &x, &e), -EINVAL);
        json_decref(j);
        /* user: the sandbox's own when left out or null, else the one named, nothing else. */
        static const struct { const char *body; ReqUser user; } users[] = {
                { "{\"command\":\"x\"}", REQ_AS_DEFAULT }, { "{\"command\":\"x\",\"user\":null}", REQ_AS_DEFAULT },
                { "{\"command\":\"x\",\"user\":\"sandbox\"}", REQ_AS_SANDBOX },
                { "{\"command\":\"x\",\"user\":\"root\"}", REQ_AS_ROOT },
        };
        for (size_t i = 0; i < sizeof users / sizeof *users; i++) {
                j = parse(users[i].body);
                assert_int_equal(request_parse_exec(j, &x, &e), 0);
                assert_int_equal(x.user, users[i].user);
                exec_request_done(&x);
                json_decref(j);
        }
        static const char *const bad_users[] = {
                "{\"command\":\"x\",\"user\":\"nobody\"}", "{\"command\":\"x\",\"user\":\"\"}",
                "{\"command\":\"x\",\"user\":\"Root\"}", "{\"command\":\"x\",\"user\":0}",
                "{\"command\":\"x\",\"user\":true}", "{\"command\":\"x\",\"user\":[\"root\"]}",
                "{\"command\":\"x\",\"user\":{}}",
        };
        for (size_t i = 0; i < sizeof bad_users / sizeof *bad_users; i++) {
                j = parse(bad_users[i]);
                assert_int_equal(request_parse_exec(j, &x, &e), -EINVAL);
                assert_int_equal(e.status, 400);
                json_decref(j);
        }
        /* A NUL inside is refused by the body's parser already; the field's
         * own check holds without it. */
        json_t *nul = json_pack("{s:s,s:s%}", "command", "x", "user", "root\0x", (size_t)6);
        assert_int_equal(request_parse_exec(nul, &x, &e), -EINVAL);
        json_decref(nul);
        char long_user[5000];
        memset(long_user, 'a', sizeof long_user - 1);
        long_user[sizeof long_user - 1] = '\0';
        ReqUser who;
        assert_int_equal(request_parse_user_text(long_user, &who, &e), -EINVAL);
        assert_int_equal(request_parse_user_text(NULL, &who, &e), 0);
        assert_int_equal(who, REQ_AS_DEFAULT);
        assert_int_equal(request_parse_user_text("root", &who, &e), 0);
        assert_int_equal(who, REQ_AS_ROOT);

        uint64_t c;
        assert_int_equal(request_parse_cursor(NULL, &c, &e), 0);
        assert_int_equal(c, 0);
        assert_int_equal(request_parse_cursor("1048576", &c, &e), 0);
        assert_int_equal(c, 1048576);
        static const char *const bad_cursor[] = { "-1", "x", "1.0", " 1", "+1", "99999999999999999", "0x10" };
        for (size_t i = 0; i < sizeof bad_cursor / sizeof *bad_cursor; i++)
                assert_int_equal(request_parse_cursor(bad_cursor[i], &c, &e), -EINVAL);

        int sig;
        j = parse("{\"signal\":\"SIGKILL\"}");
        assert_int_equal(request_parse_signal(j, &sig, &e), 0);
        assert_int_equal(sig, 9);
        json_decref(j);
        j = parse("{\"signal\":\"INT\"}");
        assert_int_equal(request_parse_signal(j, &sig, &e), 0);
        assert_int_equal(sig, 2);
        json_decref(j);
        j = parse("{}");
        assert_int_equal(request_parse_signal(j, &sig, &e), 0);
        assert_int_equal(sig, 15);
        json_decref(j);
        static const char *const bad_sig[] = { "{\"signal\":11}", "{\"signal\":\"SIGSEGV\"}", "{\"signal\":0}",
                                               "{\"signal\":true}", "{\"signal\":15,\"x\":1}" };
        for (size_t i = 0; i < sizeof bad_sig / sizeof *bad_sig; i++) {
                j = parse(bad_sig[i]);
                assert_int_equal(request_parse_signal(j, &sig, &e), -EINVAL);
                json_decref(j);
        }

        uint8_t *d;
        size_t n;
        int64_t off;
        bool eof;
        j = parse("{\"base64\":\"aGk=\",\"offset\":4,\"eof\":true}");
        assert_int_equal(request_parse_proc_write(j, &d, &n, &off, &eof, &e), 0);
        assert_true(n == 2 && memcmp(d, "hi", 2) == 0 && off == 4 && eof);
        free(d);
        json_decref(j);
        static const char *const bad_write[] = { "{\"base64\":\"*\"}", "{\"data\":1}", "{\"offset\":-5}",
                                                 "{\"data\":\"a\",\"base64\":\"YQ==\"}", "{\"eof\":1}" };
        for (size_t i = 0; i < sizeof bad_write / sizeof *bad_write; i++) {
                j = parse(bad_write[i]);
                assert_int_equal(request_parse_proc_write(j, &d, &n, &off, &eof, &e), -EINVAL);
                json_decref(j);
        }

        assert_true(request_idempotency_key_ok("a-b_c.d:e"));
        assert_false(request_idempotency_key_ok(""));
        assert_false(request_idempotency_key_ok("a b"));
        assert_false(request_idempotency_key_ok("a\nb"));
        char longkey[130];
        memset(longkey, 'k', 129);
        longkey[129] = '\0';
        assert_false(request_idempotency_key_ok(longkey));
        longkey[128] = '\0';
        assert_true(request_idempotency_key_ok(longkey));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_body_parse),   cmocka_unit_test(test_depth),
                cmocka_unit_test(test_body_too_large), cmocka_unit_test(test_create_defaults),
                cmocka_unit_test(test_create_full),
                cmocka_unit_test(test_create_lifecycle),
                cmocka_unit_test(test_create_client_fields),
                cmocka_unit_test(test_create_volumes),
                cmocka_unit_test(test_wake_body),  cmocka_unit_test(test_create_bounds),
                cmocka_unit_test(test_create_counts), cmocka_unit_test(test_network_under_another_field),
                cmocka_unit_test(test_exec),
                cmocka_unit_test(test_paths),        cmocka_unit_test(test_file_ops),
                cmocka_unit_test(test_base64),       cmocka_unit_test(test_process_parsers),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
