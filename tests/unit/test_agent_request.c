/* The agent's request validation (src/agent/request.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/request.h"
#include "agent/user.h"
#include "common/jsonutil.h"

static int parse_str(const char *s, AgentRequest **ret, const char **ret_error) {
        return agent_request_parse((const uint8_t *)s, strlen(s), ret, ret_error);
}

static void expect_invalid(const char *s) {
        AgentRequest *r = NULL;
        const char *msg = NULL;
        if (parse_str(s, &r, &msg) != -EINVAL)
                fail_msg("accepted: %s", s);
        assert_null(r);
        assert_non_null(msg);
}

static void test_depth(void **state) {
        char buf[200];
        /* 32 levels pass, 33 do not; brackets inside strings do not count. */
        memset(buf, 0, sizeof buf);
        memset(buf, '[', 32);
        memset(buf + 32, ']', 32);
        assert_true(json_depth_ok((uint8_t *)buf, strlen(buf), REQUEST_MAX_DEPTH));
        memset(buf, 0, sizeof buf);
        memset(buf, '[', 33);
        memset(buf + 33, ']', 33);
        assert_false(json_depth_ok((uint8_t *)buf, strlen(buf), REQUEST_MAX_DEPTH));
        const char *in_string = "{\"a\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"[[[[[[[[[[[[[[\"}";
        assert_true(json_depth_ok((const uint8_t *)in_string, strlen(in_string), 2));
        const char *sequential = "[[]][[]][[]][[]]";
        assert_true(json_depth_ok((const uint8_t *)sequential, strlen(sequential), 2));
        assert_false(json_depth_ok((const uint8_t *)sequential, strlen(sequential), 1));

        memset(buf, 0, sizeof buf);
        strcpy(buf, "{\"op\":\"stat\",\"path\":\"/\",\"x\":");
        size_t n = strlen(buf);
        memset(buf + n, '[', 40);
        memset(buf + n + 40, ']', 40);
        strcat(buf, "}");
        expect_invalid(buf);
}

static void test_paths(void **state) {
        assert_true(agent_request_path_valid("/", 1));
        assert_true(agent_request_path_valid("/workspace/a b", 14));
        assert_false(agent_request_path_valid("", 0));
        assert_false(agent_request_path_valid("a/b", 3));
        assert_false(agent_request_path_valid("/a\0b", 4));
        assert_false(agent_request_path_valid(NULL, 0));
        char *p = malloc(REQUEST_MAX_PATH + 2);
        memset(p, 'x', REQUEST_MAX_PATH + 1);
        p[0] = '/';
        assert_true(agent_request_path_valid(p, REQUEST_MAX_PATH));
        assert_false(agent_request_path_valid(p, REQUEST_MAX_PATH + 1));
        free(p);
}

static void test_exec(void **state) {
        AgentRequest *r = NULL;
        assert_int_equal(parse_str("{\"op\":\"exec\",\"command\":\"echo hi\"}", &r, NULL), 0);
        assert_int_equal(r->op, REQ_EXEC);
        assert_true(r->shell);
        assert_int_equal(r->argc, 1);
        assert_string_equal(r->argv[0], "echo hi");
        assert_null(r->argv[1]);
        assert_string_equal(r->cwd, "/workspace");
        assert_int_equal(r->envc, 0);
        assert_int_equal(r->timeout_ms, 0);
        assert_false(r->stdin_stream);
        assert_false(r->sync_after);
        agent_request_free(r);

        assert_int_equal(
                parse_str("{\"op\":\"exec\",\"argv\":[\"ls\",\"-l\",\"\"],\"cwd\":\"/tmp\","
                          "\"env\":{\"A\":\"1\",\"B\":\"x=y\"},\"timeoutMs\":86400000,\"stdin\":true,"
                          "\"syncAfter\":true}",
                          &r, NULL),
                0);
        assert_false(r->shell);
        assert_int_equal(r->argc, 3);
        assert_string_equal(r->argv[2], "");
        assert_null(r->argv[3]);
        assert_string_equal(r->cwd, "/tmp");
        assert_int_equal(r->envc, 2);
        assert_string_equal(r->env[0], "A=1");
        assert_string_equal(r->env[1], "B=x=y");
        assert_null(r->env[2]);
        assert_int_equal(r->timeout_ms, 86400000);
        assert_true(r->stdin_stream);
        assert_true(r->sync_after);
        agent_request_free(r);
        agent_request_free(NULL);

        expect_invalid("{\"op\":\"exec\"}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[]}");
        expect_invalid("{\"op\":\"exec\",\"argv\":\"ls\"}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"ls\",null]}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"ls\"],\"command\":\"ls\"}");
        expect_invalid("{\"op\":\"exec\",\"command\":7}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"cwd\":\"rel\"}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"cwd\":5}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"env\":[]}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"env\":{\"\":\"x\"}}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"env\":{\"A=B\":\"x\"}}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"env\":{\"A\":1}}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"timeoutMs\":-1}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"timeoutMs\":86400001}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"timeoutMs\":1.5}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"stdin\":1}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"ls\",\"syncAfter\":\"yes\"}");
        /* NUL inside strings never reaches execve. */
        AgentRequest *nul = NULL;
        const char *with_nul = "{\"op\":\"exec\",\"command\":\"a\\u0000b\"}";
        assert_int_equal(parse_str(with_nul, &nul, NULL), -EINVAL);
}

static void test_exec_limits(void **state) {
        /* 256 env entries pass, 257 do not. */
        for (int n = 256; n <= 257; n++) {
                size_t cap = 64 + (size_t)n * 16;
                char *s = malloc(cap);
                size_t len = (size_t)snprintf(s, cap, "{\"op\":\"exec\",\"command\":\"true\",\"env\":{");
                for (int i = 0; i < n; i++)
                        len += (size_t)snprintf(s + len, cap - len, "%s\"K%d\":\"v\"", i ? "," : "", i);
                len += (size_t)snprintf(s + len, cap - len, "}}");
                AgentRequest *r = NULL;
                int k = agent_request_parse((uint8_t *)s, len, &r, NULL);
                assert_int_equal(k, n == 256 ? 0 : -EINVAL);
                if (r)
                        assert_int_equal(r->envc, 256);
                agent_request_free(r);
                free(s);
        }
        /* 4096 argv entries pass, 4097 do not. */
        for (int n = 4096; n <= 4097; n++) {
                size_t cap = 64 + (size_t)n * 5;
                char *s = malloc(cap);
                size_t len = (size_t)snprintf(s, cap, "{\"op\":\"exec\",\"argv\":[");
                for (int i = 0; i < n; i++)
                        len += (size_t)snprintf(s + len, cap - len, "%s\"a\"", i ? "," : "");
                len += (size_t)snprintf(s + len, cap - len, "]}");
                AgentRequest *r = NULL;
                assert_int_equal(agent_request_parse((uint8_t *)s, len, &r, NULL), n == 4096 ? 0 : -EINVAL);
                if (r)
                        assert_int_equal(r->argc, 4096);
                agent_request_free(r);
                free(s);
        }
}

static void test_file_ops(void **state) {
        AgentRequest *r = NULL;
        assert_int_equal(parse_str("{\"op\":\"write\",\"path\":\"/a\"}", &r, NULL), 0);
        assert_int_equal(r->op, REQ_WRITE);
        assert_int_equal(r->mode, 0644);
        assert_false(r->flag);
        agent_request_free(r);
        assert_int_equal(
                parse_str("{\"op\":\"write\",\"path\":\"/a\",\"mode\":493,\"mkdirs\":true}", &r, NULL), 0);
        assert_int_equal(r->mode, 0755);
        assert_true(r->flag);
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"list\",\"path\":\"/\"}", &r, NULL), 0);
        assert_int_equal(r->depth, 1);
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"list\",\"path\":\"/\",\"depth\":10}", &r, NULL), 0);
        assert_int_equal(r->depth, 10);
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"rename\",\"from\":\"/a\",\"to\":\"/b\"}", &r, NULL), 0);
        assert_int_equal(r->op, REQ_RENAME);
        assert_string_equal(r->path, "/a");
        assert_string_equal(r->to, "/b");
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"remove\",\"path\":\"/a\",\"recursive\":true}", &r, NULL), 0);
        assert_true(r->flag);
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"mkdir\",\"path\":\"/a\",\"parents\":true}", &r, NULL), 0);
        assert_true(r->flag);
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"read\",\"path\":\"/a\"}", &r, NULL), 0);
        assert_int_equal(r->op, REQ_READ);
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"stat\",\"path\":\"/a\"}", &r, NULL), 0);
        assert_int_equal(r->op, REQ_STAT);
        agent_request_free(r);

        expect_invalid("{\"op\":\"write\",\"path\":\"/a\",\"mode\":4096}");
        expect_invalid("{\"op\":\"write\",\"path\":\"/a\",\"mode\":-1}");
        expect_invalid("{\"op\":\"write\",\"path\":\"/a\",\"mkdirs\":\"yes\"}");
        expect_invalid("{\"op\":\"list\",\"path\":\"/\",\"depth\":0}");
        expect_invalid("{\"op\":\"list\",\"path\":\"/\",\"depth\":11}");
        expect_invalid("{\"op\":\"rename\",\"from\":\"/a\"}");
        expect_invalid("{\"op\":\"rename\",\"from\":\"/a\",\"to\":\"/b\",\"overwrite\":1}");
        expect_invalid("{\"op\":\"list\",\"path\":\"/a\",\"glob\":\"\"}");
        expect_invalid("{\"op\":\"list\",\"path\":\"/a\",\"limit\":0}");
        expect_invalid("{\"op\":\"list\",\"path\":\"/a\",\"glob\":\"*\",\"depth\":33}");
        expect_invalid("{\"op\":\"list\",\"path\":\"/a\",\"hidden\":\"no\"}");
        expect_invalid("{\"op\":\"archive\",\"path\":\"/a\",\"exclude\":[\"/abs\"]}");
        expect_invalid("{\"op\":\"archive\",\"path\":\"/a\",\"gzip\":\"yes\"}");
        expect_invalid("{\"op\":\"unarchive\",\"path\":\"/a\",\"maxBytes\":-1}");
        expect_invalid("{\"op\":\"rename\",\"from\":\"a\",\"to\":\"/b\"}");
        expect_invalid("{\"op\":\"read\",\"path\":\"a\"}");
        expect_invalid("{\"op\":\"read\",\"path\":null}");
        expect_invalid("{\"op\":\"read\"}");
}

static void test_envelope(void **state) {
        expect_invalid("");
        expect_invalid("null");
        expect_invalid("[]");
        expect_invalid("\"exec\"");
        expect_invalid("{}");
        expect_invalid("{\"op\":1}");
        expect_invalid("{\"op\":\"EXEC\",\"command\":\"x\"}");
        expect_invalid("{\"op\":\"stat\",\"path\":\"/a\",\"path\":\"/b\"}"); /* duplicate keys */
        expect_invalid("{\"op\":\"stat\",\"path\":\"/a\"} trailing");
        expect_invalid("{\"op\":\"stat\",\"path\":\"/a\"");
        /* Not NUL-terminated input is fine: the length is what counts. */
        const char buf[] = {'{', '"', 'o', 'p', '"', ':', '"', 's', 't', 'a', 't', '"', ',',
                            '"', 'p', 'a', 't', 'h', '"', ':', '"', '/', '"', '}', 'X'};
        AgentRequest *r = NULL;
        assert_int_equal(agent_request_parse((const uint8_t *)buf, sizeof buf - 1, &r, NULL), 0);
        agent_request_free(r);
}

static void test_resume(void **state) {
        (void)state;
        char hex[129];
        for (int i = 0; i < 64; i++)
                snprintf(hex + 2 * i, 3, "%02x", (unsigned)(i * 7 + 1) & 0xff);
        char buf[512];
        snprintf(buf, sizeof buf, "{\"op\":\"resume\",\"entropy\":\"%s\",\"timeNs\":1796000000123456789,\"hostname\":\"sbx_0a1b-2\"}", hex);
        AgentRequest *r = NULL;
        const char *msg = NULL;
        assert_int_equal(parse_str(buf, &r, &msg), 0);
        assert_int_equal(r->op, REQ_RESUME);
        assert_int_equal(r->entropy[0], 1);
        assert_int_equal(r->entropy[63], (63 * 7 + 1) & 0xff);
        assert_true(r->time_ns == 1796000000123456789LL);
        assert_string_equal(r->hostname, "sbx_0a1b-2");
        agent_request_free(r);

        /* entropy: length, case, non-hex */
        snprintf(buf, sizeof buf, "{\"op\":\"resume\",\"entropy\":\"%.126s\",\"timeNs\":1796000000000000000,\"hostname\":\"a\"}", hex);
        expect_invalid(buf);
        char bad[129];
        memcpy(bad, hex, sizeof bad);
        bad[5] = 'G';
        snprintf(buf, sizeof buf, "{\"op\":\"resume\",\"entropy\":\"%s\",\"timeNs\":1796000000000000000,\"hostname\":\"a\"}", bad);
        expect_invalid(buf);
        bad[5] = 'A';
        snprintf(buf, sizeof buf, "{\"op\":\"resume\",\"entropy\":\"%s\",\"timeNs\":1796000000000000000,\"hostname\":\"a\"}", bad);
        expect_invalid(buf);
        snprintf(buf, sizeof buf, "{\"op\":\"resume\",\"entropy\":42,\"timeNs\":1796000000000000000,\"hostname\":\"a\"}");
        expect_invalid(buf);
        /* time: missing, before 2001, after 2200, not an integer */
        static const char *const times[] = { "", ",\"timeNs\":5", ",\"timeNs\":-1", ",\"timeNs\":9000000000000000000",
                                             ",\"timeNs\":1.5e18", ",\"timeNs\":\"1796000000000000000\"" };
        for (size_t i = 0; i < sizeof times / sizeof *times; i++) {
                snprintf(buf, sizeof buf, "{\"op\":\"resume\",\"entropy\":\"%s\"%s,\"hostname\":\"a\"}", hex, times[i]);
                expect_invalid(buf);
        }
        /* hostname: missing, empty, too long, characters a hostname must not have */
        static const char *const names[] = { "", ",\"hostname\":\"\"", ",\"hostname\":\"a/b\"", ",\"hostname\":\"A\"",
                                             ",\"hostname\":\"a b\"", ",\"hostname\":\"a\\u0000b\"", ",\"hostname\":7",
                                             ",\"hostname\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"" };
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
                snprintf(buf, sizeof buf, "{\"op\":\"resume\",\"entropy\":\"%s\",\"timeNs\":1796000000000000000%s}", hex, names[i]);
                expect_invalid(buf);
        }
}

/* checkpoint takes no fields that matter and no user: it is the daemon's,
 * about the agent itself. */
static void test_checkpoint(void **state) {
        (void)state;
        AgentRequest *r = NULL;
        const char *msg = NULL;
        assert_int_equal(parse_str("{\"op\":\"checkpoint\"}", &r, &msg), 0);
        assert_int_equal(r->op, REQ_CHECKPOINT);
        assert_null(r->path);
        agent_request_free(r);
        expect_invalid("{\"op\":\"checkpoint\",\"user\":\"root\"}");
        expect_invalid("{\"op\":\"checkpoint\",\"user\":\"sandbox\"}");
}

/* mount and unmount: the daemon's, about a volume it brought to the live
 * directory; a name of exactly 16 lowercase hex digits (it becomes a path
 * under that directory), an absolute path, no user. */
static void test_mount(void **state) {
        (void)state;
        AgentRequest *r = NULL;
        const char *msg = NULL;
        assert_int_equal(parse_str("{\"op\":\"mount\",\"path\":\"/mnt/d\",\"name\":\"0123456789abcdef\","
                                   "\"readOnly\":true}", &r, &msg), 0);
        assert_int_equal(r->op, REQ_MOUNT);
        assert_string_equal(r->path, "/mnt/d");
        assert_string_equal(r->mount_name, "0123456789abcdef");
        assert_true(r->flag);
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"unmount\",\"path\":\"/mnt/d\"}", &r, &msg), 0);
        assert_int_equal(r->op, REQ_UNMOUNT);
        agent_request_free(r);
        expect_invalid("{\"op\":\"mount\",\"path\":\"/d\"}");
        expect_invalid("{\"op\":\"mount\",\"path\":\"/d\",\"name\":\"../../../etc/x1234\"}");
        expect_invalid("{\"op\":\"mount\",\"path\":\"/d\",\"name\":\"0123456789ABCDEF\"}");
        expect_invalid("{\"op\":\"mount\",\"path\":\"/d\",\"name\":\"0123456789abcde\"}");
        expect_invalid("{\"op\":\"mount\",\"path\":\"/d\",\"name\":\"0123456789abcdef0\"}");
        expect_invalid("{\"op\":\"mount\",\"path\":\"/d\",\"name\":\"0123456789abcde\\u0000f\"}");
        expect_invalid("{\"op\":\"mount\",\"path\":\"/d\",\"name\":\"0123456789abcdef\",\"readOnly\":1}");
        expect_invalid("{\"op\":\"mount\",\"path\":\"d\",\"name\":\"0123456789abcdef\"}");
        expect_invalid("{\"op\":\"mount\",\"path\":\"/d\",\"name\":\"0123456789abcdef\",\"user\":\"root\"}");
        expect_invalid("{\"op\":\"unmount\"}");
        expect_invalid("{\"op\":\"unmount\",\"path\":\"/d\",\"user\":\"sandbox\"}");
}

static void test_user_and_signal(void **state) {
        AgentRequest *r = NULL;
        const char *msg = NULL;
        assert_int_equal(parse_str("{\"op\":\"exec\",\"argv\":[\"id\"]}", &r, &msg), 0);
        assert_true(r->uid == -1 && r->gid == -1);
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"exec\",\"argv\":[\"id\"],\"uid\":1000,\"gid\":1000}", &r, &msg), 0);
        assert_true(r->uid == 1000 && r->gid == 1000);
        agent_request_free(r);
        /* Only both together; never nobody, never negative, never a string. */
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"id\"],\"uid\":1000}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"id\"],\"uid\":65534,\"gid\":65534}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"id\"],\"uid\":-1,\"gid\":0}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"id\"],\"uid\":\"0\",\"gid\":0}");

        assert_int_equal(parse_str("{\"op\":\"signal\",\"stream\":7,\"signal\":15}", &r, &msg), 0);
        assert_int_equal(r->op, REQ_SIGNAL);
        assert_int_equal(r->target, 7);
        assert_int_equal(r->signo, 15);
        agent_request_free(r);
        /* An even id is an agent stream, never an exec; signals outside the
         * list (SIGSEGV, SIGCHLD, real-time) are refused. */
        expect_invalid("{\"op\":\"signal\",\"stream\":8,\"signal\":15}");
        expect_invalid("{\"op\":\"signal\",\"stream\":0,\"signal\":15}");
        expect_invalid("{\"op\":\"signal\",\"stream\":4294967297,\"signal\":15}");
        expect_invalid("{\"op\":\"signal\",\"stream\":7,\"signal\":11}");
        expect_invalid("{\"op\":\"signal\",\"stream\":7,\"signal\":17}");
        expect_invalid("{\"op\":\"signal\",\"stream\":7,\"signal\":40}");
        expect_invalid("{\"op\":\"signal\",\"stream\":7}");
        expect_invalid("{\"op\":\"signal\",\"signal\":15}");
}

static void test_pty(void **state) {
        AgentRequest *r = NULL;
        const char *msg = NULL;
        assert_int_equal(parse_str("{\"op\":\"exec\",\"argv\":[\"bash\"],\"pty\":{\"cols\":132,\"rows\":43}}", &r, &msg), 0);
        assert_true(r->pty && r->pty_cols == 132 && r->pty_rows == 43);
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"exec\",\"argv\":[\"bash\"],\"pty\":null}", &r, &msg), 0);
        assert_false(r->pty);
        agent_request_free(r);
        /* Both sides, each 1..1000, integers, in an object. */
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"bash\"],\"pty\":{\"cols\":80}}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"bash\"],\"pty\":{\"cols\":0,\"rows\":24}}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"bash\"],\"pty\":{\"cols\":80,\"rows\":1001}}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"bash\"],\"pty\":{\"cols\":\"80\",\"rows\":24}}");
        expect_invalid("{\"op\":\"exec\",\"argv\":[\"bash\"],\"pty\":[80,24]}");

        unsigned cols = 0, rows = 0;
        const char *ok = "{\"event\":\"resize\",\"cols\":200,\"rows\":50}";
        assert_int_equal(agent_request_parse_resize((const uint8_t *)ok, strlen(ok), &cols, &rows), 0);
        assert_true(cols == 200 && rows == 50);
        static const char *const bad[] = {
                "{\"event\":\"resize\",\"cols\":0,\"rows\":50}",
                "{\"event\":\"resize\",\"cols\":65536,\"rows\":50}",
                "{\"event\":\"start\",\"cols\":80,\"rows\":24}",
                "{\"event\":\"resize\",\"cols\":80}",
                "{\"event\":\"resize\",\"cols\":80,\"rows\":24,\"rows\":25}",
                "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
                "not json",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                assert_int_equal(agent_request_parse_resize((const uint8_t *)bad[i], strlen(bad[i]), &cols, &rows),
                                 -EINVAL);
}

static void test_forward(void **state) {
        AgentRequest *r = NULL;
        const char *msg = NULL;
        assert_int_equal(parse_str("{\"op\":\"forward\",\"port\":8000}", &r, &msg), 0);
        assert_true(r->op == REQ_FORWARD && r->port == 8000);
        agent_request_free(r);
        /* A port and nothing else: never a host. */
        expect_invalid("{\"op\":\"forward\"}");
        expect_invalid("{\"op\":\"forward\",\"port\":0}");
        expect_invalid("{\"op\":\"forward\",\"port\":65536}");
        expect_invalid("{\"op\":\"forward\",\"port\":\"80\"}");
}

static void test_watch(void **state) {
        AgentRequest *r = NULL;
        const char *msg = NULL;
        assert_int_equal(parse_str("{\"op\":\"watch\",\"path\":\"/w\"}", &r, &msg), 0);
        assert_true(r->op == REQ_WATCH && !r->flag && r->limit == 8192);
        assert_string_equal(r->path, "/w");
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"watch\",\"path\":\"/w\",\"recursive\":true,\"maxWatches\":3,"
                                   "\"user\":\"sandbox\"}",
                                   &r, &msg),
                         0);
        assert_true(r->flag && r->limit == 3);
        agent_request_free(r);
        expect_invalid("{\"op\":\"watch\"}");
        expect_invalid("{\"op\":\"watch\",\"path\":\"relative\"}");
        expect_invalid("{\"op\":\"watch\",\"path\":\"/w\",\"maxWatches\":0}");
        expect_invalid("{\"op\":\"watch\",\"path\":\"/w\",\"maxWatches\":65537}");
        expect_invalid("{\"op\":\"watch\",\"path\":\"/w\",\"recursive\":\"yes\"}");
}

static void test_user_names(void **state) {
        AgentRequest *r = NULL;
        const char *msg = NULL;
        assert_int_equal(parse_str("{\"op\":\"exec\",\"command\":\"id\",\"user\":\"sandbox\"}", &r, &msg), 0);
        assert_string_equal(r->user, "sandbox");
        assert_true(r->uid == -1 && r->gid == -1); /* looked up when it runs */
        agent_request_free(r);
        assert_int_equal(parse_str("{\"op\":\"write\",\"path\":\"/workspace/a\",\"user\":\"root\"}", &r, &msg), 0);
        assert_string_equal(r->user, "root");
        agent_request_free(r);
        expect_invalid("{\"op\":\"exec\",\"command\":\"id\",\"user\":\"\"}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"id\",\"user\":\"Root\"}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"id\",\"user\":\"../x\"}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"id\",\"user\":\"a:b\"}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"id\",\"user\":\"root\\u0000x\"}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"id\",\"user\":0}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"id\",\"user\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}");
        expect_invalid("{\"op\":\"exec\",\"command\":\"id\",\"user\":\"root\",\"uid\":0,\"gid\":0}");
        expect_invalid("{\"op\":\"forward\",\"port\":80,\"user\":\"root\"}");
        assert_true(user_name_valid("sandbox") && user_name_valid("_apt") && user_name_valid("a-b_1"));
        assert_false(user_name_valid("1abc") || user_name_valid("-x") || user_name_valid("a b"));
}

static void test_passwd(void **state) {
        static const char pw[] = "root:x:0:0:root:/root:/bin/bash\n"
                                 "sandboxed:x:7:7::/nope:/bin/sh\n"
                                 "sandbox:x:1000:1000::/workspace:/bin/bash\n"
                                 "big:x:70000:70000::/home/big:/bin/sh\n"
                                 "nohome:x:5:5::relative:/bin/sh\n"
                                 "short:x:6\n"
                                 "last:x:9:9::/last:/bin/sh";
        AgentUser u;
        assert_int_equal(user_parse_passwd(pw, sizeof pw - 1, "sandbox", &u), 0);
        assert_true(u.uid == 1000 && u.gid == 1000);
        assert_string_equal(u.home, "/workspace");
        assert_string_equal(u.name, "sandbox");
        assert_int_equal(user_parse_passwd(pw, sizeof pw - 1, "root", &u), 0);
        assert_true(u.uid == 0 && strcmp(u.home, "/root") == 0);
        /* The last line needs no newline; a prefix of a name is not the name. */
        assert_int_equal(user_parse_passwd(pw, sizeof pw - 1, "last", &u), 0);
        assert_int_equal(u.uid, 9);
        assert_int_equal(user_parse_passwd(pw, sizeof pw - 1, "sand", &u), -ENOENT);
        assert_int_equal(user_parse_passwd(pw, sizeof pw - 1, "nobody", &u), -ENOENT);
        /* Ids past the map, a home that is not absolute, a short line. */
        assert_int_equal(user_parse_passwd(pw, sizeof pw - 1, "big", &u), -ERANGE);
        assert_int_equal(user_parse_passwd(pw, sizeof pw - 1, "nohome", &u), -ERANGE);
        assert_int_equal(user_parse_passwd(pw, sizeof pw - 1, "short", &u), -ENOENT);
        static const char odd[] = "x:x:-1:0::/x:/bin/sh\ny:x:1e3:0::/y:/bin/sh\nz:x::0::/z:/bin/sh\n";
        assert_int_equal(user_parse_passwd(odd, sizeof odd - 1, "x", &u), -ERANGE);
        assert_int_equal(user_parse_passwd(odd, sizeof odd - 1, "y", &u), -ERANGE);
        assert_int_equal(user_parse_passwd(odd, sizeof odd - 1, "z", &u), -ERANGE);
        assert_int_equal(user_parse_passwd("", 0, "root", &u), -ENOENT);
        /* Only the bytes given are read: no NUL needed, none past len. */
        assert_int_equal(user_parse_passwd(pw, 10, "root", &u), -ENOENT);
}

/* user_lookup keeps what it found in a file that has settled; any change of
 * the file is seen: a write of another size, one of the same size at once
 * (its times), a rename over it. */
static void write_text(const char *path, const char *text) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
}

static void test_lookup_sees_changes(void **state) {
        (void)state;
        char dir[] = "/tmp/agent-passwd-XXXXXX", path[64], other[64];
        assert_non_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/passwd", dir);
        snprintf(other, sizeof other, "%s/passwd.new", dir);
        AgentUser u;
        write_text(path, "sandbox:x:1000:1000::/home/sandbox:/bin/sh\n");
        usleep(150 * 1000); /* settled: what is found is kept */
        assert_int_equal(user_lookup(path, "sandbox", &u), 0);
        assert_int_equal(u.uid, 1000);
        assert_int_equal(user_lookup(path, "sandbox", &u), 0); /* kept */
        assert_int_equal(u.uid, 1000);
        write_text(path, "sandbox:x:1001:1000::/home/sandbox:/bin/sh\n"); /* same size */
        assert_int_equal(user_lookup(path, "sandbox", &u), 0);
        assert_int_equal(u.uid, 1001);
        write_text(path, "sandbox:x:12345:1000::/home/sandbox:/bin/sh\n");
        assert_int_equal(user_lookup(path, "sandbox", &u), 0);
        assert_int_equal(u.uid, 12345);
        write_text(other, "sandbox:x:1002:1000::/home/sandbox:/bin/sh\n");
        assert_int_equal(rename(other, path), 0);
        assert_int_equal(user_lookup(path, "sandbox", &u), 0);
        assert_int_equal(u.uid, 1002);
        assert_int_equal(user_lookup(path, "root", &u), -ENOENT); /* a miss is not kept */
        write_text(path, "root:x:0:0::/root:/bin/sh\n");
        assert_int_equal(user_lookup(path, "root", &u), 0);
        assert_int_equal(user_lookup(path, "sandbox", &u), -ENOENT);
        unlink(path);
        assert_int_equal(user_lookup(path, "root", &u), -ENOENT);
        rmdir(dir);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_depth),    cmocka_unit_test(test_paths),
                cmocka_unit_test(test_exec),     cmocka_unit_test(test_exec_limits),
                cmocka_unit_test(test_file_ops), cmocka_unit_test(test_envelope),
                cmocka_unit_test(test_resume),   cmocka_unit_test(test_checkpoint),   cmocka_unit_test(test_user_and_signal),
                cmocka_unit_test(test_pty),      cmocka_unit_test(test_forward),
                cmocka_unit_test(test_watch),    cmocka_unit_test(test_mount),
                cmocka_unit_test(test_user_names), cmocka_unit_test(test_passwd), cmocka_unit_test(test_lookup_sees_changes),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
