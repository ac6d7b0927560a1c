#include "daemon/http/preview_head.h"

#include <errno.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>

/* RFC 9110's tchar. */
static bool tchar(unsigned char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* A field value's byte: visible, space, tab or obs-text; never CR, LF, NUL
 * or another control. */
static bool vchar(unsigned char c) {
        return c == '\t' || (c >= 0x20 && c != 0x7f);
}

bool preview_field_is(PreviewSpan f, const char *name) {
        size_t n = strlen(name);
        return f.n > n && f.p[n] == ':' && strncasecmp(f.p, name, n) == 0;
}

PreviewSpan preview_field_value(PreviewSpan f) {
        const char *colon = memchr(f.p, ':', f.n);
        const char *v = colon ? colon + 1 : f.p + f.n, *end = f.p + f.n;
        while (v < end && (*v == ' ' || *v == '\t'))
                v++;
        while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
                end--;
        return (PreviewSpan){ v, (size_t)(end - v) };
}

/* Whether a comma-separated value has the token, case-insensitively. */
static bool list_has(PreviewSpan v, const char *token) {
        size_t n = strlen(token);
        const char *p = v.p, *end = v.p + v.n;
        while (p < end) {
                while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
                        p++;
                const char *s = p;
                while (p < end && *p != ',' && *p != ' ' && *p != '\t')
                        p++;
                if ((size_t)(p - s) == n && strncasecmp(s, token, n) == 0)
                        return true;
        }
        return false;
}

#define REFUSE(why)                  \
        do {                         \
                *ret_why = (why);    \
                return -EINVAL;      \
        } while (0)

int preview_head_parse(const char *buf, size_t len, PreviewHead *ret, const char **ret_why) {
        *ret_why = NULL;
        const char *end = NULL;
        for (size_t i = 3; i < len; i++)
                if (buf[i] == '\n' && buf[i - 1] == '\r' && buf[i - 2] == '\n' && buf[i - 3] == '\r') {
                        end = buf + i + 1;
                        break;
                }
        if (!end) {
                /* A bare LF or CR is refused now, not after a wait for a
                 * blank line that such a head may never have. */
                for (size_t i = 0; i < len; i++)
                        if ((buf[i] == '\n' && (i == 0 || buf[i - 1] != '\r')) ||
                            (buf[i] == '\r' && i + 1 < len && buf[i + 1] != '\n')) {
                                *ret_why = "a line does not end with CRLF";
                                return -EINVAL;
                        }
                return len >= PREVIEW_HEAD_MAX ? -EMSGSIZE : -EAGAIN;
        }
        if ((size_t)(end - buf) > PREVIEW_HEAD_MAX)
                return -EMSGSIZE;
        PreviewHead h = { .head_len = (size_t)(end - buf), .content_length = -1 };
        /* Every LF ends a CRLF, every CR starts one. */
        for (const char *p = buf; p < end; p++)
                if ((*p == '\n' && (p == buf || p[-1] != '\r')) || (*p == '\r' && p[1] != '\n'))
                        REFUSE("a line does not end with CRLF");
        /* The request line: METHOD SP TARGET SP HTTP/1.x CRLF. */
        const char *p = buf, *eol = memmem(buf, (size_t)(end - buf), "\r\n", 2);
        const char *m = p;
        while (p < eol && tchar((unsigned char)*p))
                p++;
        if (p == m || p - m > 32 || *p != ' ')
                REFUSE("the request line's method is not a token");
        h.method = (PreviewSpan){ m, (size_t)(p - m) };
        const char *t = ++p;
        while (p < eol && *p > 0x20 && *p < 0x7f)
                p++;
        if (p == t || *p != ' ')
                REFUSE("the request target is empty or has a control character");
        if (*t != '/')
                REFUSE("the request target is not a path (origin form)");
        h.target = (PreviewSpan){ t, (size_t)(p - t) };
        p++;
        if ((size_t)(eol - p) != 8 || strncmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1')) {
                *ret_why = "only HTTP/1.1 and HTTP/1.0 are served";
                return -ENOTSUP;
        }
        h.http10 = p[7] == '0';
        bool keep_alive = false, conn_upgrade = false, has_upgrade = false, has_te = false;
        unsigned hosts = 0, lengths = 0;
        for (p = eol + 2; p < end - 2; p = eol + 2) {
                eol = memmem(p, (size_t)(end - p), "\r\n", 2);
                if (*p == ' ' || *p == '\t')
                        REFUSE("a header is folded over lines (obs-fold)");
                const char *n = p;
                while (p < eol && tchar((unsigned char)*p))
                        p++;
                if (p == n || *p != ':')
                        REFUSE("a header's name is not a token followed by a colon");
                for (const char *v = p + 1; v < eol; v++)
                        if (!vchar((unsigned char)*v))
                                REFUSE("a header's value has a control character");
                if (h.n_fields == PREVIEW_HEAD_MAX_FIELDS)
                        REFUSE("more than 100 headers");
                PreviewSpan f = { n, (size_t)(eol - n) };
                h.fields[h.n_fields++] = f;
                PreviewSpan v = preview_field_value(f);
                if (preview_field_is(f, "host")) {
                        hosts++;
                        h.host = v;
                } else if (preview_field_is(f, "content-length")) {
                        lengths++;
                        if (v.n == 0 || v.n > 15)
                                REFUSE("Content-Length is not a plain number");
                        int64_t cl = 0;
                        for (size_t i = 0; i < v.n; i++) {
                                if (v.p[i] < '0' || v.p[i] > '9')
                                        REFUSE("Content-Length is not a plain number");
                                cl = cl * 10 + (v.p[i] - '0');
                        }
                        h.content_length = cl;
                } else if (preview_field_is(f, "transfer-encoding")) {
                        if (has_te)
                                REFUSE("Transfer-Encoding is given twice");
                        has_te = true;
                        if (v.n != 7 || strncasecmp(v.p, "chunked", 7) != 0) {
                                *ret_why = "the only transfer coding served is a lone chunked";
                                return -ENOTSUP;
                        }
                        h.chunked = true;
                } else if (preview_field_is(f, "connection")) {
                        if (list_has(v, "close"))
                                h.close = true;
                        if (list_has(v, "keep-alive"))
                                keep_alive = true;
                        if (list_has(v, "upgrade"))
                                conn_upgrade = true;
                } else if (preview_field_is(f, "upgrade")) {
                        has_upgrade = v.n > 0;
                } else if (preview_field_is(f, "x-runtime-preview-token")) {
                        if (h.token.n)
                                REFUSE("the preview token is given twice");
                        h.token = v;
                }
        }
        if (hosts != 1)
                REFUSE(hosts ? "Host is given more than once" : "the request has no Host");
        if (lengths > 1)
                REFUSE("Content-Length is given more than once");
        if (has_te && lengths)
                REFUSE("the request has both Transfer-Encoding and Content-Length");
        if (has_te && h.http10)
                REFUSE("Transfer-Encoding in an HTTP/1.0 request");
        h.upgrade = has_upgrade && conn_upgrade && !h.http10;
        if (h.http10 && !keep_alive)
                h.close = true;
        *ret = h;
        return 0;
}

static int hexval(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

/* A chunk-size line's extension or a trailer line: at most this long. */
#define LINE_MAX_BYTES 4096

ssize_t preview_chunked_feed(PreviewChunked *c, const char *buf, size_t len) {
        size_t i = 0;
        while (i < len && c->state != CHUNK_DONE) {
                char ch = buf[i];
                switch (c->state) {
                case CHUNK_SIZE: {
                        int v = hexval(ch);
                        if (v >= 0) {
                                if (++c->digits > 15)
                                        return -EINVAL;
                                c->size = c->size * 16 + (uint64_t)v;
                        } else if (c->digits && ch == ';') {
                                c->state = CHUNK_EXT;
                                c->line = 0;
                        } else if (c->digits && ch == '\r')
                                c->state = CHUNK_SIZE_LF;
                        else
                                return -EINVAL;
                        i++;
                        break;
                }
                case CHUNK_EXT:
                        if (ch == '\r')
                                c->state = CHUNK_SIZE_LF;
                        else if (ch == '\n' || ++c->line > LINE_MAX_BYTES || !vchar((unsigned char)ch))
                                return -EINVAL;
                        i++;
                        break;
                case CHUNK_SIZE_LF:
                        if (ch != '\n')
                                return -EINVAL;
                        i++;
                        c->state = c->size ? CHUNK_DATA : CHUNK_TRAILER;
                        break;
                case CHUNK_DATA: {
                        size_t take = len - i;
                        if (take > c->size)
                                take = (size_t)c->size;
                        c->size -= take;
                        i += take;
                        if (c->size == 0)
                                c->state = CHUNK_DATA_CR;
                        break;
                }
                case CHUNK_DATA_CR:
                        if (ch != '\r')
                                return -EINVAL;
                        i++;
                        c->state = CHUNK_DATA_LF;
                        break;
                case CHUNK_DATA_LF:
                        if (ch != '\n')
                                return -EINVAL;
                        i++;
                        c->state = CHUNK_SIZE;
                        c->size = 0;
                        c->digits = 0;
                        break;
                case CHUNK_TRAILER:
                        i++;
                        if (ch == '\r')
                                c->state = CHUNK_END_LF;
                        else if (ch == ' ' || ch == '\t' || ch == '\n' || !vchar((unsigned char)ch))
                                return -EINVAL;
                        else {
                                c->state = CHUNK_TRAILER_LINE;
                                c->line = 1;
                        }
                        break;
                case CHUNK_TRAILER_LINE:
                        i++;
                        if (ch == '\r')
                                c->state = CHUNK_TRAILER_LF;
                        else if (ch == '\n' || ++c->line > LINE_MAX_BYTES || !vchar((unsigned char)ch))
                                return -EINVAL;
                        break;
                case CHUNK_TRAILER_LF:
                        if (ch != '\n')
                                return -EINVAL;
                        i++;
                        c->state = CHUNK_TRAILER;
                        break;
                case CHUNK_END_LF:
                        if (ch != '\n')
                                return -EINVAL;
                        i++;
                        c->state = CHUNK_DONE;
                        break;
                case CHUNK_DONE:
                        break;
                }
        }
        return (ssize_t)i;
}
