/*
 * libFuzzer target for a signed file link's query, which anyone holding a
 * URL controls: the input is a query, split at '&' and then at the first
 * '=' of each argument (a value's bytes as they are, NULs too), fed to the
 * parser one argument at a time as the server hands them over. Whatever it
 * takes must then sign, verify under the same secret and not under another,
 * and come back from its own query (percent-decoded here, independently of
 * the code under test) as a link with the same signature.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/file_link.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t SECRET[FILE_LINK_SECRET_LEN] = { 1, 2, 3 };
static const uint8_t OTHER[FILE_LINK_SECRET_LEN] = { 1, 2, 4 };

static int hexval(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

/* Feeds text[0..n) as a query; decode: %XX escapes turned into bytes in
 * place. 0 when every argument was taken and the link is whole. */
static int feed(char *text, size_t n, bool decode, FileLinkParse *p) {
        size_t at = 0;
        while (at <= n) {
                char *arg = text + at;
                char *amp = memchr(arg, '&', n - at);
                size_t len = amp ? (size_t)(amp - arg) : n - at;
                arg[len] = '\0';
                char *eq = memchr(arg, '=', len);
                if (!eq)
                        return -1;
                *eq = '\0';
                char *value = eq + 1;
                size_t vlen = len - (size_t)(value - arg);
                if (decode) {
                        size_t o = 0;
                        for (size_t i = 0; i < vlen; i++) {
                                int hi, lo;
                                if (value[i] == '%' && i + 2 < vlen && (hi = hexval(value[i + 1])) >= 0 &&
                                    (lo = hexval(value[i + 2])) >= 0) {
                                        value[o++] = (char)(hi << 4 | lo);
                                        i += 2;
                                } else
                                        value[o++] = value[i];
                        }
                        vlen = o;
                        value[vlen] = '\0';
                }
                if (file_link_parse_arg(p, arg, value, vlen) < 0)
                        return -1;
                at += len + 1;
        }
        return file_link_parse_done(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 65536)
                return 0;
        char *text = malloc(size + 1);
        if (!text)
                return 0;
        memcpy(text, data, size);
        text[size] = '\0';
        FileLinkParse p;
        file_link_parse_init(&p);
        if (feed(text, size, false, &p) == 0) {
                FileLink *l = &p.link;
                snprintf(l->sandbox_id, sizeof l->sandbox_id, "sbx_00000000000000000001");
                l->op = (FileLinkOp)(size % 3);
                char sig[FILE_LINK_SIG_HEX_LEN + 1];
                if (file_link_sign(SECRET, l, sig) == 0) {
                        if (!file_link_verify(SECRET, l, sig) || file_link_verify(OTHER, l, sig))
                                abort();
                        char *query = NULL;
                        if (file_link_query(l, sig, &query) == 0) {
                                FileLinkParse back;
                                file_link_parse_init(&back);
                                if (feed(query, strlen(query), true, &back) != 0)
                                        abort();
                                snprintf(back.link.sandbox_id, sizeof back.link.sandbox_id, "%s", l->sandbox_id);
                                back.link.op = l->op;
                                if (!file_link_verify(SECRET, &back.link, back.sig))
                                        abort();
                                free(query);
                        }
                }
        }
        free(text);
        return 0;
}
