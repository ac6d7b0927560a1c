/* The terminal's WebSocket layer and parsers: the handshake's accept value,
 * frames in and out over a socketpair, the bound on a client's message, and
 * the route's query and control messages. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/api/api_terminal.h"
#include "daemon/api/api_tunnel.h"
#include "daemon/http/request.h"
#include "daemon/http/websocket.h"

typedef struct Got {
        int n;
        bool text;
        uint8_t data[256];
        size_t len;
} Got;

static void on_message(void *userdata, bool text, const uint8_t *data, size_t len) {
        Got *g = userdata;
        g->n++;
        g->text = text;
        g->len = len < sizeof g->data ? len : sizeof g->data;
        memcpy(g->data, data, g->len);
}

/* A client frame: FIN, masked, the length in the shortest form. */
static size_t client_frame(uint8_t *out, uint8_t opcode, const uint8_t *payload, size_t n) {
        static const uint8_t mask[4] = { 0x11, 0x22, 0x33, 0x44 };
        size_t at = 0;
        out[at++] = (uint8_t)(0x80 | opcode);
        if (n < 126)
                out[at++] = (uint8_t)(0x80 | n);
        else if (n < 65536) {
                out[at++] = 0x80 | 126;
                out[at++] = (uint8_t)(n >> 8);
                out[at++] = (uint8_t)n;
        } else {
                out[at++] = 0x80 | 127;
                for (int i = 7; i >= 0; i--)
                        out[at++] = (uint8_t)((uint64_t)n >> (8 * i));
        }
        memcpy(out + at, mask, 4);
        at += 4;
        for (size_t i = 0; i < n; i++)
                out[at + i] = payload[i] ^ mask[i % 4];
        return at + n;
}

static void test_accept_value(void **state) {
        char out[29];
        /* RFC 6455, section 1.3. */
        assert_int_equal(ws_accept_value("dGhlIHNhbXBsZSBub25jZQ==", out), 0);
        assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_false(ws_client_key_ok(NULL));
        assert_false(ws_client_key_ok(""));
        assert_false(ws_client_key_ok("dGhlIHNhbXBsZSBub25jZQ="));
        assert_false(ws_client_key_ok("dGhlIHNhbXBsZSBub25jZQ==A"));
        assert_false(ws_client_key_ok("dGhlIHNhbXBsZSBub25j\r\n=="));
        assert_int_equal(ws_accept_value("x", out), -EINVAL);
}

static void test_messages_both_ways(void **state) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        Got g = { 0 };
        WsConn *c = ws_conn_new(sv[0], TERMINAL_MAX_MESSAGE, on_message, &g);
        assert_non_null(c);
        uint8_t buf[512];
        const uint8_t keys[] = { 0x00, 0xff, 0x03, 'l', 's', '\n' };
        size_t n = client_frame(buf, 0x2, keys, sizeof keys);
        assert_int_equal(write(sv[1], buf, n), (ssize_t)n);
        assert_int_equal(ws_conn_read(c), 0);
        assert_int_equal(g.n, 1);
        assert_false(g.text);
        assert_int_equal(g.len, sizeof keys);
        assert_memory_equal(g.data, keys, sizeof keys);

        /* Server frames are not masked: opcode, length, payload. */
        assert_int_equal(ws_conn_send(c, true, "{\"type\":\"ready\"}", 16), 0);
        assert_int_equal(ws_conn_write(c), 0);
        ssize_t k = read(sv[1], buf, sizeof buf);
        assert_int_equal(k, 18);
        assert_int_equal(buf[0], 0x81);
        assert_int_equal(buf[1], 16);
        assert_memory_equal(buf + 2, "{\"type\":\"ready\"}", 16);

        /* A ping is answered with its payload. */
        n = client_frame(buf, 0x9, (const uint8_t *)"hi", 2);
        assert_int_equal(write(sv[1], buf, n), (ssize_t)n);
        assert_int_equal(ws_conn_read(c), 0);
        assert_int_equal(ws_conn_write(c), 0);
        k = read(sv[1], buf, sizeof buf);
        assert_int_equal(k, 4);
        assert_int_equal(buf[0], 0x8a);
        assert_memory_equal(buf + 2, "hi", 2);

        /* The peer hanging up is the end. */
        close(sv[1]);
        assert_int_equal(ws_conn_read(c), -EPIPE);
        ws_conn_free(c);
        close(sv[0]);
}

static void test_over_bound_and_unmasked_close(void **state) {
        static uint8_t big[TERMINAL_MAX_MESSAGE + 64];
        static uint8_t frame[TERMINAL_MAX_MESSAGE + 128];
        uint8_t buf[64];
        for (int unmasked = 0; unmasked < 2; unmasked++) {
                int sv[2];
                assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
                Got g = { 0 };
                WsConn *c = ws_conn_new(sv[0], TERMINAL_MAX_MESSAGE, on_message, &g);
                size_t n;
                if (unmasked) {
                        frame[0] = 0x82;
                        frame[1] = 3; /* no mask bit: a server must refuse it */
                        memcpy(frame + 2, "abc", 3);
                        n = 5;
                } else
                        n = client_frame(frame, 0x2, big, TERMINAL_MAX_MESSAGE + 1);
                size_t off = 0;
                /* The socket takes what it can; the reader drains as we go. */
                while (off < n) {
                        ssize_t w = send(sv[1], frame + off, n - off, MSG_DONTWAIT);
                        if (w > 0)
                                off += (size_t)w;
                        (void)ws_conn_read(c);
                        if (!ws_conn_want_read(c))
                                break;
                }
                (void)ws_conn_read(c);
                assert_int_equal(g.n, 0);
                assert_false(ws_conn_want_read(c));
                assert_int_equal(ws_conn_write(c), 0);
                ssize_t k = recv(sv[1], buf, sizeof buf, MSG_DONTWAIT);
                assert_true(k >= 4);
                assert_int_equal(buf[0], 0x88);
                uint16_t code = (uint16_t)(buf[2] << 8 | buf[3]);
                assert_int_equal(code, unmasked ? 1002 : WS_CLOSE_TOO_BIG);
                ws_conn_free(c);
                close(sv[0]);
                close(sv[1]);
        }
}

static void test_query(void **state) {
        TerminalQuery q;
        ApiError e = { 0 };
        assert_int_equal(terminal_parse_query(NULL, NULL, NULL, 0, NULL, 0, NULL, NULL, &q, &e), 0);
        assert_true(q.cols == 80 && q.rows == 24 && !q.command && q.user == REQ_AS_DEFAULT && !q.process_id[0]);
        assert_string_equal(q.cwd, "/workspace");
        terminal_query_done(&q);
        assert_int_equal(terminal_parse_query("120", "40", "top", 3, "/tmp", 4, "root", NULL, &q, &e), 0);
        assert_true(q.cols == 120 && q.rows == 40 && q.user == REQ_AS_ROOT && q.command_len == 3);
        terminal_query_done(&q);
        assert_int_equal(terminal_parse_query(NULL, NULL, NULL, 0, NULL, 0, NULL, "proc_0123456789abcdef", &q, &e), 0);
        assert_string_equal(q.process_id, "proc_0123456789abcdef");
        terminal_query_done(&q);
        assert_int_equal(terminal_parse_query(NULL, NULL, NULL, 0, NULL, 0, "sandbox", NULL, &q, &e), 0);
        assert_int_equal(q.user, REQ_AS_SANDBOX);
        terminal_query_done(&q);

        static const char *const sides[] = { "0", "1001", "-1", "", "12a", "00080", "99999999999" };
        for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++) {
                memset(&e, 0, sizeof e);
                assert_int_equal(terminal_parse_query(sides[i], NULL, NULL, 0, NULL, 0, NULL, NULL, &q, &e), -EINVAL);
                assert_int_equal(e.status, 400);
        }
        assert_int_equal(terminal_parse_query(NULL, NULL, "a\0b", 3, NULL, 0, NULL, NULL, &q, &e), -EINVAL);
        assert_int_equal(terminal_parse_query(NULL, NULL, "", 0, NULL, 0, NULL, NULL, &q, &e), -EINVAL);
        assert_int_equal(terminal_parse_query(NULL, NULL, NULL, 0, NULL, 0, "nobody", NULL, &q, &e), -EINVAL);
        assert_int_equal(terminal_parse_query(NULL, NULL, NULL, 0, NULL, 0, NULL, "proc_0123", &q, &e), -EINVAL);
        assert_int_equal(terminal_parse_query(NULL, NULL, NULL, 0, NULL, 0, NULL, "proc_0123456789ABCDEF", &q, &e),
                         -EINVAL);
        /* Attaching takes the process as it is. */
        assert_int_equal(terminal_parse_query(NULL, NULL, "sh", 2, NULL, 0, NULL, "proc_0123456789abcdef", &q, &e),
                         -EINVAL);
        assert_int_equal(terminal_parse_query(NULL, NULL, NULL, 0, "a\0b", 3, NULL, NULL, &q, &e), -EINVAL);
}

static void test_control(void **state) {
        unsigned cols = 0, rows = 0;
        const char *ok = "{\"type\":\"resize\",\"cols\":132,\"rows\":43}";
        assert_int_equal(terminal_parse_control((const uint8_t *)ok, strlen(ok), &cols, &rows), TERMINAL_CONTROL_RESIZE);
        assert_true(cols == 132 && rows == 43);
        static const char *const ignored[] = {
                "{\"type\":\"resize\",\"cols\":0,\"rows\":43}", "{\"type\":\"resize\",\"cols\":1.5,\"rows\":43}",
                "{\"type\":\"input\",\"data\":\"x\"}",        "[1,2]",
                "{\"type\":\"resize\",\"cols\":80,\"rows\":24,\"type\":\"resize\"}", "",
                "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]",
        };
        for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
                assert_int_equal(terminal_parse_control((const uint8_t *)ignored[i], strlen(ignored[i]), &cols, &rows),
                                 TERMINAL_CONTROL_IGNORED);
}

static void test_spawn_pty(void **state) {
        ApiError e = { 0 };
        ExecRequest x;
        json_t *j = json_loads("{\"command\":\"bash\",\"pty\":{\"cols\":100,\"rows\":30}}", 0, NULL);
        assert_int_equal(request_parse_spawn(j, &x, &e), 0);
        assert_true(x.pty && x.stdin_pipe && x.pty_cols == 100 && x.pty_rows == 30);
        exec_request_done(&x);
        json_decref(j);
        static const char *const bad[] = {
                "{\"command\":\"bash\",\"pty\":{\"cols\":0,\"rows\":30}}",
                "{\"command\":\"bash\",\"pty\":{\"cols\":80,\"rows\":30,\"term\":\"x\"}}",
                "{\"command\":\"bash\",\"pty\":true}",
                "{\"command\":\"bash\",\"pty\":{\"cols\":80,\"rows\":24},\"stdin\":\"x\"}",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                j = json_loads(bad[i], 0, NULL);
                assert_non_null(j);
                assert_int_equal(request_parse_spawn(j, &x, &e), -EINVAL);
                assert_int_equal(e.status, 400);
                json_decref(j);
        }
}

static void test_tunnel_frames(void **state) {
        TunnelFrame f;
        assert_int_equal(tunnel_parse_frame((const uint8_t *)"o\0\0\0\x07tcp 8000", 13, &f), 0);
        assert_true(f.kind == TUNNEL_OPEN && f.stream == 7 && f.port == 8000);
        assert_int_equal(tunnel_parse_frame((const uint8_t *)"d\0\0\x01\0abc", 8, &f), 0);
        assert_true(f.kind == TUNNEL_DATA && f.stream == 256 && f.len == 3 && memcmp(f.payload, "abc", 3) == 0);
        assert_int_equal(tunnel_parse_frame((const uint8_t *)"e\0\0\0\x01", 5, &f), 0);
        assert_int_equal(tunnel_parse_frame((const uint8_t *)"c\0\0\0\x01", 5, &f), 0);
        static const struct {
                const char *b;
                size_t n;
        } bad[] = {
                { "o\0\0\0\x01tcp 0", 10 },      { "o\0\0\0\x01tcp 65536", 14 }, { "o\0\0\0\x01tcp 080", 12 },
                { "o\0\0\0\x01udp 53", 11 },     { "o\0\0\0\x01tcp ", 9 },       { "o\0\0\0\x01tcp 8a", 11 },
                { "d\0\0\0\0abc", 8 },          { "a\0\0\0\x01\0\0\0\0\0\0\0\x01", 13 },
                { "e\0\0\0\x01x", 6 },          { "x\0\0\0\x01", 5 },            { "d\0\0\0", 4 },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                assert_int_equal(tunnel_parse_frame((const uint8_t *)bad[i].b, bad[i].n, &f), -EINVAL);
        static uint8_t big[TUNNEL_MAX_MESSAGE + 1] = { 'd', 0, 0, 0, 1 };
        assert_int_equal(tunnel_parse_frame(big, sizeof big, &f), -EINVAL);
        assert_int_equal(tunnel_parse_frame(big, sizeof big - 1, &f), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_accept_value), cmocka_unit_test(test_messages_both_ways),
                cmocka_unit_test(test_over_bound_and_unmasked_close), cmocka_unit_test(test_query),
                cmocka_unit_test(test_control), cmocka_unit_test(test_spawn_pty),
                cmocka_unit_test(test_tunnel_frames),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
