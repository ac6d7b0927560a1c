/* The daemon and its proxy process: framed messages bounded in length and
 * depth, connections as exactly two descriptors, audit records checked field
 * by field (a compromised proxy may send anything), secrets rebuilt only
 * when every part of them parses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "egress/wire.h"

static void pair(int type, int sv[2]) {
        assert_int_equal(socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, sv), 0);
}

static void test_message_round_trip(void **state) {
        int sv[2];
        pair(SOCK_STREAM, sv);
        json_t *msg = json_pack("{s:s,s:i}", "sandbox", "sbx_1", "n", 7);
        assert_int_equal(egress_wire_write(sv[0], msg, 1000), 0);
        json_t *got = NULL;
        assert_int_equal(egress_wire_read(sv[1], 1024, 1000, &got), 0);
        assert_true(json_equal(msg, got));
        json_decref(msg);
        json_decref(got);
        close(sv[0]);
        close(sv[1]);
}

static void raw(int fd, uint32_t len, const char *body) {
        uint8_t head[4] = { (uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len };
        assert_int_equal(write(fd, head, 4), 4);
        if (body)
                assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
}

static void test_read_refuses(void **state) {
        int sv[2];
        json_t *got = NULL;
        pair(SOCK_STREAM, sv);
        raw(sv[0], 1u << 30, NULL); /* longer than allowed: never allocated */
        assert_int_equal(egress_wire_read(sv[1], 4096, 1000, &got), -EBADMSG);
        close(sv[0]);
        close(sv[1]);

        pair(SOCK_STREAM, sv);
        raw(sv[0], 0, NULL);
        assert_int_equal(egress_wire_read(sv[1], 4096, 1000, &got), -EBADMSG);
        close(sv[0]);
        close(sv[1]);

        char deep[200]; /* nested deeper than a message may be */
        pair(SOCK_STREAM, sv);
        memset(deep, '[', 99);
        memset(deep + 99, ']', 99);
        deep[198] = '\0';
        raw(sv[0], 198, deep);
        assert_int_equal(egress_wire_read(sv[1], 4096, 1000, &got), -EBADMSG);
        close(sv[0]);
        close(sv[1]);

        pair(SOCK_STREAM, sv);
        raw(sv[0], 8, "{\"a\":1,\"");
        assert_int_equal(egress_wire_read(sv[1], 4096, 1000, &got), -EBADMSG);
        close(sv[0]);
        close(sv[1]);

        /* A peer that sends half a message and stops: a timeout, not a hang. */
        pair(SOCK_STREAM, sv);
        raw(sv[0], 100, "{\"a\":");
        assert_int_equal(egress_wire_read(sv[1], 4096, 200, &got), -ETIMEDOUT);
        close(sv[0]);
        assert_int_equal(egress_wire_read(sv[1], 4096, 200, &got), -EPIPE);
        close(sv[1]);
        assert_null(got);
}

static void test_conn_descriptors(void **state) {
        int ctl[2], a[2], b[2];
        pair(SOCK_SEQPACKET, ctl);
        pair(SOCK_STREAM, a);
        pair(SOCK_STREAM, b);
        assert_int_equal(egress_wire_send_conn(ctl[0], a[1], b[1]), 0);
        int data = -1, meta = -1;
        assert_int_equal(egress_wire_recv_conn(ctl[1], &data, &meta), 0);
        assert_true(fcntl(data, F_GETFD) & FD_CLOEXEC);
        assert_int_equal(write(data, "x", 1), 1);
        char c = 0;
        assert_int_equal(read(a[0], &c, 1), 1);
        assert_int_equal(c, 'x');
        close(data);
        close(meta);

        /* A message without descriptors, or with one, is refused and what
         * came with it closed. */
        assert_int_equal(send(ctl[0], "c", 1, 0), 1);
        assert_int_equal(egress_wire_recv_conn(ctl[1], &data, &meta), -EBADMSG);
        close(ctl[0]);
        assert_int_equal(egress_wire_recv_conn(ctl[1], &data, &meta), -EPIPE);
        close(ctl[1]);
        close(a[0]);
        close(a[1]);
        close(b[0]);
        close(b[1]);
}

static void test_record(void **state) {
        EgressRecord rec = { .port = 443, .connect = true, .allowed = true, .bytes_out = 10, .bytes_in = 20,
                             .intercepted = true, .secrets_used = 2 };
        snprintf(rec.host, sizeof(rec.host), "api.example.com");
        snprintf(rec.reason, sizeof(rec.reason), "allowed by api.example.com");
        snprintf(rec.addr, sizeof(rec.addr), "203.0.113.5:443");
        snprintf(rec.rule, sizeof(rec.rule), "allow api.example.com");
        snprintf(rec.end, sizeof(rec.end), "the upstream closed the connection");
        rec.duration_ms = 1234;
        json_t *j = egress_wire_record_json(&rec, EGRESS_WIRE_END, 99);
        EgressRecord back;
        EgressWireKind kind;
        uint64_t decided_us = 1;
        assert_int_equal(egress_wire_record_parse(j, &back, &kind, &decided_us), 0);
        assert_int_equal(kind, EGRESS_WIRE_END);
        assert_int_equal(decided_us, 0); /* an end carries no decision time */
        assert_string_equal(back.host, rec.host);
        assert_string_equal(back.reason, rec.reason);
        assert_string_equal(back.rule, rec.rule);
        assert_string_equal(back.end, rec.end);
        assert_int_equal(back.duration_ms, 1234);
        assert_int_equal(back.port, 443);
        assert_true(back.connect && back.allowed && back.intercepted);
        assert_int_equal(back.bytes_in, 20);
        assert_int_equal(back.secrets_used, 2);

        /* A decision, with the proxy's clock at the moment. */
        json_t *d = egress_wire_record_json(&rec, EGRESS_WIRE_DECISION, 123456);
        assert_int_equal(egress_wire_record_parse(d, &back, &kind, &decided_us), 0);
        assert_int_equal(kind, EGRESS_WIRE_DECISION);
        assert_int_equal(decided_us, 123456);
        json_decref(d);

        /* What a compromised proxy might send instead. */
        char big[400];
        memset(big, 'a', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        json_t *bad = json_deep_copy(j);
        json_object_set_new(bad, "reason", json_string(big));
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        bad = json_deep_copy(j);
        json_object_set_new(bad, "port", json_integer(70000));
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        bad = json_deep_copy(j);
        json_object_set_new(bad, "bytesIn", json_integer(-1));
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        bad = json_deep_copy(j);
        json_object_set_new(bad, "host", json_stringn("a\0b", 3));
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        bad = json_deep_copy(j);
        json_object_del(bad, "allowed");
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        /* Another type, a rule or an end past their bounds, no type. */
        bad = json_deep_copy(j);
        json_object_set_new(bad, "type", json_string("other"));
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        bad = json_deep_copy(j);
        json_object_del(bad, "type");
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        bad = json_deep_copy(j);
        json_object_set_new(bad, "rule", json_string(big));
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        bad = json_deep_copy(j);
        json_object_set_new(bad, "end", json_string(big));
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        bad = json_deep_copy(j);
        json_object_set_new(bad, "durationMs", json_integer(-5));
        assert_int_equal(egress_wire_record_parse(bad, &back, &kind, NULL), -EBADMSG);
        json_decref(bad);
        assert_int_equal(egress_wire_record_parse(json_null(), &back, &kind, NULL), -EBADMSG);
        json_decref(j);
}

static void test_secrets(void **state) {
        json_t *arr = json_pack("[{s:s,s:s,s:s,s:s},{s:s,s:s,s:s,s:s},{s:s,s:s,s:s,s:s,s:s}]",
                                /* good */
                                "name", "TOKEN", "value", "s3cret", "hosts", "[\"api.example.com\"]", "placeholder",
                                "runtime-secret-TOKEN-0123",
                                /* a value that could end a header line */
                                "name", "BAD", "value", "x\r\nEvil: 1", "hosts", "[\"api.example.com\"]",
                                "placeholder", "runtime-secret-BAD-0123",
                                /* a header that frames the message */
                                "name", "HDR", "value", "v", "hosts", "[\"api.example.com\"]", "placeholder",
                                "runtime-secret-HDR-0123", "header", "Content-Length");
        EgressSecret *s = NULL;
        size_t n = 0;
        assert_int_equal(egress_wire_secrets_parse(arr, &s, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(s[0].name, "TOKEN");
        assert_string_equal(s[0].value, "s3cret");
        assert_true(egress_secret_applies(&s[0], "api.example.com", 443));
        assert_false(egress_secret_applies(&s[0], "other.example.com", 443));
        egress_wire_secrets_free(s, n);
        json_decref(arr);

        json_t *many = json_array();
        for (int i = 0; i < 101; i++)
                json_array_append_new(many, json_object());
        assert_int_equal(egress_wire_secrets_parse(many, &s, &n), -EBADMSG);
        json_decref(many);
        assert_int_equal(egress_wire_secrets_parse(json_true(), &s, &n), -EBADMSG);
        assert_int_equal(egress_wire_secrets_parse(NULL, &s, &n), 0);
        assert_int_equal(n, 0);
        egress_wire_secrets_free(s, n);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_message_round_trip), cmocka_unit_test(test_read_refuses),
                cmocka_unit_test(test_conn_descriptors),   cmocka_unit_test(test_record),
                cmocka_unit_test(test_secrets),
        };
        return cmocka_run_group_tests_name("egress_wire", tests, NULL, NULL);
}
