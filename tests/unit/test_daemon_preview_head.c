/* The preview listener's strict request heads and chunked bodies
 * (http/preview_head.h), and the previews' tokens (manager/previews.h). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/macro.h"
#include "daemon/http/preview_head.h"
#include "daemon/manager/previews.h"
#include "daemon/store/store.h"

static int parse(const char *text, PreviewHead *h, const char **why) {
        return preview_head_parse(text, strlen(text), h, why);
}

static void test_a_good_head(void **state) {
        PreviewHead h;
        const char *why = NULL;
        const char *text = "POST /a?b=1 HTTP/1.1\r\nHost: 8000-sbx_x.localhost:7879\r\nContent-Length: 5\r\n"
                           "x-runtime-preview-token:  tok \r\nConnection: keep-alive\r\n\r\nhello";
        assert_int_equal(parse(text, &h, &why), 0);
        assert_int_equal(h.head_len, strlen(text) - 5);
        assert_int_equal(h.method.n, 4);
        assert_memory_equal(h.target.p, "/a?b=1", 6);
        assert_memory_equal(h.host.p, "8000-sbx_x.localhost:7879", h.host.n);
        assert_int_equal(h.content_length, 5);
        assert_false(h.chunked);
        assert_false(h.close);
        assert_int_equal(h.token.n, 3);
        assert_memory_equal(h.token.p, "tok", 3);
        assert_int_equal(h.n_fields, 4);
        assert_true(preview_field_is(h.fields[1], "content-length"));

        assert_int_equal(parse("GET / HTTP/1.0\r\nHost: a\r\n\r\n", &h, &why), 0);
        assert_true(h.close && h.http10);
        assert_int_equal(parse("GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                               &h, &why),
                         0);
        assert_true(h.upgrade);
        assert_int_equal(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n", &h, &why), 0);
        assert_true(h.chunked);
        /* Not whole yet. */
        assert_int_equal(parse("GET / HTTP/1.1\r\nHost: a\r\n", &h, &why), -EAGAIN);
}

static void test_what_is_refused(void **state) {
        static const char *const refused[] = {
                "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1234567890123456\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n folded\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nContent-Length : 1\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\nX: 1\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nX: a\x01\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                "GET / HTTP/1.1\r\nX: a\r\n\r\n",
                "GET http://b/ HTTP/1.1\r\nHost: a\r\n\r\n",
                "GET * HTTP/1.1\r\nHost: a\r\n\r\n",
                "GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
                "G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
                "GET / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\nx-runtime-preview-token: a\r\nx-runtime-preview-token: b\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: a\r\n: empty\r\n\r\n",
        };
        for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
                PreviewHead h;
                const char *why = NULL;
                int r = parse(refused[i], &h, &why);
                if (r != -EINVAL)
                        fail_msg("head %zu: %d, not -EINVAL", i, r);
                assert_non_null(why);
        }
        PreviewHead h;
        const char *why = NULL;
        assert_int_equal(parse("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", &h, &why),
                         -ENOTSUP);
        assert_int_equal(parse("GET / HTTP/2.0\r\nHost: a\r\n\r\n", &h, &why), -ENOTSUP);
        /* A bare LF is refused before the head could end. */
        assert_int_equal(parse("GET / HTTP/1.1\nHost: a", &h, &why), -EINVAL);
        /* Too long, whole or not. */
        size_t n = PREVIEW_HEAD_MAX + 64;
        char *big = malloc(n + 1);
        assert_non_null(big);
        memset(big, 'a', n);
        memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
        big[n] = '\0';
        assert_int_equal(preview_head_parse(big, n, &h, &why), -EMSGSIZE);
        memcpy(big + n - 4, "\r\n\r\n", 4);
        assert_int_equal(preview_head_parse(big, n, &h, &why), -EMSGSIZE);
        free(big);
}

static void test_chunked_bodies(void **state) {
        const char *body = "3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nTrailer: 1\r\n\r\nNEXT";
        PreviewChunked c = { 0 };
        ssize_t k = preview_chunked_feed(&c, body, strlen(body));
        assert_int_equal(k, strlen(body) - 4);
        assert_int_equal(c.state, CHUNK_DONE);
        /* Byte by byte, the same end. */
        PreviewChunked d = { 0 };
        size_t i = 0;
        for (; i < strlen(body) && d.state != CHUNK_DONE; i++)
                assert_true(preview_chunked_feed(&d, body + i, 1) >= 0);
        assert_int_equal(i, strlen(body) - 4);
        static const char *const bad[] = { "zz\r\n", "3\nabc", "3\r\nabcX\r\n", "\r\n", "1234567890123456\r\n",
                                           "0\r\n folded\r\n\r\n" };
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
                PreviewChunked e = { 0 };
                if (preview_chunked_feed(&e, bad[j], strlen(bad[j])) != -EINVAL)
                        fail_msg("body %zu was taken", j);
        }
}

/* The sites that may frame a preview: origins only, since each is
 * written into a Content-Security-Policy header as it is. */
static void test_embed_origins(void **state) {
        static const char *const good[] = {
                "https://app.example.com", "http://localhost:3000", "https://*.example.com",
                "https://*.example.com:8443", "http://127.0.0.1:8080", "https://[::1]:8443",
        };
        static const char *const bad[] = {
                "*", "null", "javascript:alert(1)", "https://app.example.com/", "https://app.example.com/x",
                "https://app.example.com:0", "https://app.example.com:99999", "https://a.example.com https://b.com",
                "https://a.example.com,https://b.com", "https://a.example.com;script-src *", "https://a.example.com\r\nX: y",
                "ftp://example.com", "https://*.com", "https://*", "https://*.", "https://*.*.example.com",
                "https://a.*.example.com", "https://*.[::1]", "HTTPS://APP.EXAMPLE.COM", "https://", "'self'",
                "https://app.example.com:*", "data:", "https://app.example.com?x", "https://app.example.com#x",
                "https://user@app.example.com", "",
        };
        for (size_t i = 0; i < ELEMENTSOF(good); i++)
                assert_true(preview_embed_origin_ok(good[i], strlen(good[i])));
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                if (preview_embed_origin_ok(bad[i], strlen(bad[i])))
                        fail_msg("taken: %s", bad[i]);
        }
        char nul[] = "https://a.example.com\0.evil";
        assert_false(preview_embed_origin_ok(nul, sizeof nul - 1));
        char longest[300];
        snprintf(longest, sizeof longest, "https://%0250d.com", 0);
        assert_false(preview_embed_origin_ok(longest, strlen(longest)));
}

static void test_tokens(void **state) {
        char dir[] = "/tmp/preview-tokens-XXXXXX", path[96];
        assert_non_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/runtime.db", dir);
        uint8_t key[SEAL_KEY_LEN] = { 1, 2, 3 };
        Previews *pv = NULL;
        assert_int_equal(previews_open(&store_sqlite, path, key, &pv), 0);
        StorePreview p, q;
        assert_int_equal(previews_put(pv, "sbx_0123456789abcdef0123", "alice", 8000, false, 0, NULL, &p), 0);
        assert_int_equal(previews_put(pv, "sbx_0123456789abcdef0123", "alice", 8001, false, 0, NULL, &q), 0);
        char tok[PREVIEW_TOKEN_MAX];
        int64_t end = 0;
        assert_int_equal(previews_token(pv, &p, 2000000000, tok, &end), 0);
        assert_int_equal(end, 2000000000);
        assert_true(previews_token_ok(pv, &p, tok, strlen(tok), 1000));
        /* Past its expiry; on another port; changed; cut short. */
        assert_false(previews_token_ok(pv, &p, tok, strlen(tok), 2000000000));
        assert_false(previews_token_ok(pv, &q, tok, strlen(tok), 1000));
        char changed[PREVIEW_TOKEN_MAX];
        memcpy(changed, tok, sizeof changed);
        changed[0] = '3';
        assert_false(previews_token_ok(pv, &p, changed, strlen(changed), 1000));
        assert_false(previews_token_ok(pv, &p, tok, strlen(tok) - 1, 1000));
        assert_false(previews_token_ok(pv, &p, "", 0, 1000));
        /* A rotation ends it; a new one works. */
        assert_int_equal(previews_rotate(pv, p.sandbox_id, 8000), 0);
        assert_int_equal(previews_get(pv, p.sandbox_id, 8000, &p), 0);
        assert_false(previews_token_ok(pv, &p, tok, strlen(tok), 1000));
        assert_int_equal(previews_token(pv, &p, 2000000000, tok, NULL), 0);
        assert_true(previews_token_ok(pv, &p, tok, strlen(tok), 1000));
        /* A preview with an end caps its tokens. */
        assert_int_equal(previews_put(pv, p.sandbox_id, "alice", 8000, false, 1500, NULL, &p), 0);
        assert_int_equal(previews_token(pv, &p, 2000000000, tok, &end), 0);
        assert_int_equal(end, 1500);
        assert_true(preview_expired(&p, 1500));
        assert_false(previews_token_ok(pv, &p, tok, strlen(tok), 1600));
        /* Another key does not open the secret. */
        Previews *other = NULL;
        uint8_t key2[SEAL_KEY_LEN] = { 9 };
        assert_int_equal(previews_open(&store_sqlite, path, key2, &other), 0);
        assert_int_equal(previews_token(other, &p, 1400, tok, NULL), -EBADMSG);
        previews_close(other);
        previews_close(pv);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        assert_int_equal(system(cmd), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_a_good_head),
                cmocka_unit_test(test_what_is_refused),
                cmocka_unit_test(test_chunked_bodies),
                cmocka_unit_test(test_tokens),
                cmocka_unit_test(test_embed_origins),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
