/*
 * libFuzzer target for the preview listener's request heads and chunked
 * bodies, which any client of a preview controls. Whatever the head parser
 * takes must lie inside the input, end with the blank line, have one Host,
 * never both a length and chunked framing, and hold no CR or LF inside a
 * header; the bytes after it, read as a chunked body, are framed the same
 * whether fed whole or one byte at a time.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/http/preview_head.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char *buf = malloc(size + 1);
        if (!buf)
                return 0;
        memcpy(buf, data, size);
        buf[size] = '\0';
        PreviewHead h;
        const char *why = NULL;
        int r = preview_head_parse(buf, size, &h, &why);
        if (r == 0) {
                if (h.head_len > size || h.head_len > PREVIEW_HEAD_MAX || h.head_len < 4 ||
                    memcmp(buf + h.head_len - 4, "\r\n\r\n", 4) != 0)
                        abort();
                if (h.chunked && h.content_length >= 0)
                        abort();
                if (!h.host.p || h.host.p < buf || h.host.p + h.host.n > buf + h.head_len)
                        abort();
                for (size_t i = 0; i < h.n_fields; i++) {
                        PreviewSpan f = h.fields[i];
                        if (f.p < buf || f.p + f.n > buf + h.head_len || memchr(f.p, '\r', f.n) ||
                            memchr(f.p, '\n', f.n))
                                abort();
                }
        } else if (!why && r != -EAGAIN && r != -EMSGSIZE)
                abort();
        size_t off = r == 0 ? h.head_len : 0;
        PreviewChunked whole = { 0 }, bytes = { 0 };
        ssize_t k = preview_chunked_feed(&whole, buf + off, size - off);
        if (k > (ssize_t)(size - off))
                abort();
        ssize_t taken = 0;
        bool bad = false;
        for (size_t i = off; i < size && bytes.state != CHUNK_DONE; i++) {
                ssize_t one = preview_chunked_feed(&bytes, buf + i, 1);
                if (one < 0) {
                        bad = true;
                        break;
                }
                taken += one;
        }
        if ((k < 0) != bad || (k >= 0 && (k != taken || whole.state != bytes.state)))
                abort();
        free(buf);
        return 0;
}
