#include "cli/ndjson.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int bytebuf_append(ByteBuf *b, const void *data, size_t len, size_t limit) {
        if (len > limit || b->len > limit - len)
                return -EFBIG;
        if (b->len + len + 1 > b->cap) {
                size_t cap = b->cap ? b->cap : 4096;
                char *n;
                while (cap < b->len + len + 1)
                        cap *= 2;
                n = realloc(b->data, cap);
                if (!n)
                        return -ENOMEM;
                b->data = n;
                b->cap = cap;
        }
        if (len > 0)
                memcpy(b->data + b->len, data, len);
        b->len += len;
        b->data[b->len] = '\0';
        return 0;
}

void bytebuf_done(ByteBuf *b) {
        free(b->data);
        *b = (ByteBuf){0};
}

int ndjson_take_lines(ByteBuf *b, bool final, LineFn fn, void *userdata) {
        size_t start = 0;
        int r = 0;

        while (start < b->len) {
                size_t from = b->scanned > start ? b->scanned : start;
                char *nl = memchr(b->data + from, '\n', b->len - from);
                size_t end = nl ? (size_t)(nl - b->data) : b->len;

                if (!nl && !final) {
                        b->scanned = b->len;
                        break;
                }
                if (end > start && !(end == start + 1 && b->data[start] == '\r')) {
                        r = fn(b->data + start, end - start, userdata);
                        if (r < 0)
                                break;
                }
                start = nl ? end + 1 : end;
        }
        if (start > 0) {
                memmove(b->data, b->data + start, b->len - start);
                b->len -= start;
                b->scanned = b->scanned > start ? b->scanned - start : 0;
                b->data[b->len] = '\0';
        }
        return r < 0 ? r : 0;
}
