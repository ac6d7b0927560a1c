#include "daemon/manager/output.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int utf8_seq_len(const uint8_t *p, size_t avail) {
        uint8_t c = p[0];
        if (c < 0x80)
                return 1;
        int need;
        uint8_t lo = 0x80, hi = 0xbf; /* bounds of the second byte (RFC 3629) */
        if (c >= 0xc2 && c <= 0xdf)
                need = 2;
        else if (c >= 0xe0 && c <= 0xef) {
                need = 3;
                if (c == 0xe0)
                        lo = 0xa0; /* overlong */
                else if (c == 0xed)
                        hi = 0x9f; /* surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
                need = 4;
                if (c == 0xf0)
                        lo = 0x90; /* overlong */
                else if (c == 0xf4)
                        hi = 0x8f; /* above U+10FFFF */
        } else
                return 0;
        for (int i = 1; i < need; i++) {
                if ((size_t)i >= avail)
                        return -1;
                uint8_t b = p[i];
                if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf))
                        return 0;
        }
        return need;
}

char *utf8_sanitize(const uint8_t *buf, size_t len, size_t *ret_len) {
        /* Worst case: every byte becomes three. */
        if (len > (SIZE_MAX - 1) / 3)
                return NULL;
        char *out = malloc(len * 3 + 1);
        if (!out)
                return NULL;
        size_t o = 0;
        for (size_t i = 0; i < len;) {
                int r = utf8_seq_len(buf + i, len - i);
                if (r > 0) {
                        memcpy(out + o, buf + i, (size_t)r);
                        o += (size_t)r;
                        i += (size_t)r;
                } else {
                        out[o++] = (char)0xef;
                        out[o++] = (char)0xbf;
                        out[o++] = (char)0xbd;
                        i++;
                }
        }
        out[o] = '\0';
        if (ret_len)
                *ret_len = o;
        return out;
}

void tailbuf_init(TailBuf *t, size_t cap) {
        *t = (TailBuf){ .cap = cap };
}

static int tailbuf_reserve(TailBuf *t, size_t want) {
        if (want <= t->alloc)
                return 0;
        size_t n = t->alloc ? t->alloc : 4096;
        while (n < want)
                n = n > SIZE_MAX / 2 ? want : n * 2;
        if (n > t->cap)
                n = t->cap;
        uint8_t *b = realloc(t->buf, n);
        if (!b)
                return -ENOMEM;
        t->buf = b;
        t->alloc = n;
        return 0;
}

int tailbuf_append(TailBuf *t, const void *data, size_t n) {
        const uint8_t *p = data;
        t->total += n;
        if (t->cap == 0) {
                if (n > 0)
                        t->truncated = true;
                return 0;
        }
        if (n >= t->cap) {
                /* Only the end of this chunk survives. */
                if (tailbuf_reserve(t, t->cap) < 0)
                        return -ENOMEM;
                if (n > t->cap || t->len > 0)
                        t->truncated = true;
                memcpy(t->buf, p + (n - t->cap), t->cap);
                t->start = 0;
                t->len = t->cap;
                return 0;
        }
        if (t->len + n <= t->cap && t->start == 0) {
                /* Still linear. */
                if (tailbuf_reserve(t, t->len + n) < 0)
                        return -ENOMEM;
                memcpy(t->buf + t->len, p, n);
                t->len += n;
                return 0;
        }
        /* Ring mode at full capacity: at most two copies; what does not fit
         * in the free space overwrites the oldest bytes. */
        if (tailbuf_reserve(t, t->cap) < 0)
                return -ENOMEM;
        size_t w = (t->start + t->len) % t->cap;
        size_t first = n < t->cap - w ? n : t->cap - w;
        memcpy(t->buf + w, p, first);
        memcpy(t->buf, p + first, n - first);
        size_t room = t->cap - t->len;
        if (n <= room) {
                t->len += n;
        } else {
                t->start = (t->start + (n - room)) % t->cap;
                t->len = t->cap;
                t->truncated = true;
        }
        return 0;
}

char *tailbuf_text(const TailBuf *t, size_t *ret_len) {
        uint8_t *lin = malloc(t->len ? t->len : 1);
        if (!lin)
                return NULL;
        size_t first = t->len;
        if (t->start + t->len > t->cap && t->cap > 0)
                first = t->cap - t->start;
        if (t->len > 0) {
                memcpy(lin, t->buf + t->start, first);
                memcpy(lin + first, t->buf, t->len - first);
        }
        size_t skip = 0;
        if (t->truncated)
                while (skip < t->len && skip < 3 && (lin[skip] & 0xc0) == 0x80)
                        skip++;
        char *out = utf8_sanitize(lin + skip, t->len - skip, ret_len);
        free(lin);
        return out;
}

void tailbuf_done(TailBuf *t) {
        free(t->buf);
        *t = (TailBuf){ 0 };
}

int utf8_holder_feed(Utf8Holder *h, const uint8_t *data, size_t len, char **ret, size_t *ret_len) {
        size_t total = h->n + len;
        uint8_t *buf = malloc(total ? total : 1);
        if (!buf)
                return -ENOMEM;
        memcpy(buf, h->pending, h->n);
        if (len)
                memcpy(buf + h->n, data, len);
        size_t cut = 0;
        while (cut < total) {
                int r = utf8_seq_len(buf + cut, total - cut);
                if (r < 0)
                        break; /* an incomplete character: hold it */
                cut += r > 0 ? (size_t)r : 1;
        }
        char *out = utf8_sanitize(buf, cut, ret_len);
        if (!out) {
                free(buf);
                return -ENOMEM;
        }
        h->n = total - cut; /* at most 3: utf8_seq_len gives up within 4 bytes */
        memcpy(h->pending, buf + cut, h->n);
        free(buf);
        *ret = out;
        return 0;
}

int utf8_holder_flush(Utf8Holder *h, char **ret, size_t *ret_len) {
        char *out = utf8_sanitize(h->pending, h->n, ret_len);
        if (!out)
                return -ENOMEM;
        h->n = 0;
        *ret = out;
        return 0;
}

int line_queue_push(LineQueue *q, json_t *j) {
        char *line = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!line)
                return -ENOMEM;
        size_t len = strlen(line);
        if (q->off == q->len)
                q->off = q->len = 0;
        if (q->len + len + 1 > q->cap) {
                size_t cap = q->len + len + 1 + 4096;
                char *b = realloc(q->buf, cap);
                if (!b) {
                        free(line);
                        return -ENOMEM;
                }
                q->buf = b;
                q->cap = cap;
        }
        memcpy(q->buf + q->len, line, len);
        q->buf[q->len + len] = '\n';
        q->len += len + 1;
        free(line);
        return 0;
}
