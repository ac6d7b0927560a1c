/*
 * libFuzzer target for a guest console's tail: the guest writes every byte of
 * it, and the result goes into the API's JSON and the log. The first four
 * bytes of an input choose the line count (past the clamp too), partial_first
 * and the size of the output buffer (allocated to that exact size, so a write
 * past it is caught); the rest is the console. Whatever comes out must be
 * NUL-terminated at the returned length, within the buffer, valid UTF-8 by
 * RFC 3629 (checked here independently of the code under test), free of
 * control characters but '\n', and made of at most max_lines non-empty
 * lines. For printable ASCII without a crash line the output is also compared
 * with a plain reference: the last non-blank lines, trailing spaces dropped.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/manager/console_tail.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The code point of the well-formed sequence at p, its length in *len; -1 if
 * ill-formed. Decoded, then checked against the ranges, rather than matched
 * by lead byte as the code under test does. */
static long decode(const uint8_t *p, size_t n, size_t *len) {
        uint8_t b = p[0];
        size_t k;
        long cp, min;
        if (b < 0x80) {
                *len = 1;
                return b;
        } else if ((b & 0xe0) == 0xc0) {
                k = 2, cp = b & 0x1f, min = 0x80;
        } else if ((b & 0xf0) == 0xe0) {
                k = 3, cp = b & 0x0f, min = 0x800;
        } else if ((b & 0xf8) == 0xf0) {
                k = 4, cp = b & 0x07, min = 0x10000;
        } else {
                return -1;
        }
        if (n < k)
                return -1;
        for (size_t i = 1; i < k; i++) {
                if ((p[i] & 0xc0) != 0x80)
                        return -1;
                cp = (cp << 6) | (p[i] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                return -1;
        *len = k;
        return cp;
}

static void check_text(const char *out, size_t len, unsigned max_lines) {
        const uint8_t *p = (const uint8_t *)out;
        unsigned lines = len > 0;
        for (size_t i = 0; i < len;) {
                size_t k;
                long cp = decode(p + i, len - i, &k);
                if (cp < 0)
                        abort(); /* not UTF-8 */
                if (cp == '\n') {
                        /* Lines are non-empty: no break at either end, no two in a row. */
                        if (i == 0 || i + 1 == len || p[i + 1] == '\n')
                                abort();
                        lines++;
                } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) {
                        abort(); /* C0, DEL or C1 control */
                }
                i += k;
        }
        unsigned cap = max_lines < 64 ? max_lines : 64;
        if (lines > cap)
                abort();
}

static bool plain_ascii(const uint8_t *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (p[i] != '\n' && p[i] != '\r' && (p[i] < 0x20 || p[i] > 0x7e))
                        return false;
        static const char *const markers[] = {
                "Kernel panic",     "BUG: ",         "Oops", "general protection fault",
                "Unable to handle", "Out of memory",
        };
        for (size_t i = 0; i < sizeof(markers) / sizeof(markers[0]); i++)
                if (memmem(p, n, markers[i], strlen(markers[i])))
                        return false;
        return true;
}

/* The documented result for printable ASCII without a crash line, before any
 * cut for size; its length. ref has room for n + 1 bytes. */
static size_t reference(const uint8_t *in, size_t n, unsigned max_lines, bool partial_first, char *ref) {
        if (max_lines > 64)
                max_lines = 64;
        size_t pos = 0;
        if (partial_first) {
                const uint8_t *a = memchr(in, '\n', n), *b = memchr(in, '\r', n);
                const uint8_t *e = !a ? b : !b ? a : a < b ? a : b;
                if (e)
                        pos = (size_t)(e - in) + 1;
        }
        /* Walk backwards collecting the last max_lines non-blank lines. */
        size_t starts[64], lens[64], got = 0;
        size_t end = n;
        while (got < max_lines && end > pos) {
                size_t s = end;
                while (s > pos && in[s - 1] != '\n' && in[s - 1] != '\r')
                        s--;
                size_t l = end - s;
                while (l > 0 && in[s + l - 1] == ' ')
                        l--;
                bool nonblank = false;
                for (size_t i = s; i < s + l; i++)
                        if (in[i] != ' ')
                                nonblank = true;
                if (nonblank) {
                        starts[got] = s;
                        lens[got] = l;
                        got++;
                }
                if (s == pos)
                        break;
                end = s - 1;
        }
        size_t o = 0;
        for (size_t i = got; i-- > 0;) {
                if (o > 0)
                        ref[o++] = '\n';
                memcpy(ref + o, in + starts[i], lens[i]);
                o += lens[i];
        }
        return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 4 || size > 4 + 4 * CONSOLE_TAIL_READ)
                return 0;
        unsigned max_lines = data[0];
        bool partial_first = data[1] & 1;
        size_t out_size =
                (data[1] & 2) ? CONSOLE_TAIL_MAX + 1 : ((size_t)data[2] | (size_t)data[3] << 8) % 8192;
        const uint8_t *in = data + 4;
        size_t n = size - 4;

        /* The input in a buffer of its own exact size, so a read past it shows. */
        uint8_t *copy = malloc(n ? n : 1);
        char *out = malloc(out_size ? out_size : 1);
        if (!copy || !out)
                abort();
        memcpy(copy, in, n);
        memset(out, 'X', out_size ? out_size : 1);

        size_t len = console_tail_sanitize(copy, n, max_lines, partial_first, out, out_size);
        if (out_size == 0) {
                if (len != 0 || out[0] != 'X')
                        abort(); /* nothing written into no room */
        } else {
                if (len >= out_size || out[len] != '\0' || strlen(out) != len)
                        abort();
                check_text(out, len, max_lines);
        }

        if (out_size > 0 && plain_ascii(copy, n)) {
                char *ref = malloc(n + 1);
                if (!ref)
                        abort();
                size_t rlen = reference(copy, n, max_lines, partial_first, ref);
                if (rlen < out_size) {
                        if (rlen != len || memcmp(ref, out, len) != 0)
                                abort();
                } else if (len > rlen || memcmp(ref + rlen - len, out, len) != 0) {
                        abort(); /* cut: what is kept is the end */
                }
                free(ref);
        }
        free(out);
        free(copy);
        return 0;
}
