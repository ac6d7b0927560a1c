#include "egress/httphead.h"

#include <errno.h>
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct Buf {
        char *p;
        size_t len, cap;
} Buf;

typedef struct Header {
        char *name;
        char *value;
} Header;

struct EgressParser {
        http_parser hp;
        http_parser_settings settings;
        Buf url;
        Buf field, value;
        bool in_value;
        Header headers[EGRESS_MAX_HEADERS];
        size_t n_headers;
        size_t head_bytes;
        bool head_done, message_done, replay_lf, too_many;
        bool tunnel; /* origin-form requests inside an intercepted tunnel */
        char tunnel_host[256];
        uint16_t tunnel_port;
        int error;
        char err[160];
        EgressHead head;
};

static int buf_append(Buf *b, const char *at, size_t n) {
        if (b->len + n + 1 > EGRESS_MAX_HEAD + 1)
                return -E2BIG;
        if (b->len + n + 1 > b->cap) {
                size_t cap = b->cap ? b->cap * 2 : 128;
                while (cap < b->len + n + 1)
                        cap *= 2;
                char *np = realloc(b->p, cap);
                if (!np)
                        return -ENOMEM;
                b->p = np;
                b->cap = cap;
        }
        memcpy(b->p + b->len, at, n);
        b->len += n;
        b->p[b->len] = '\0';
        return 0;
}

static void buf_reset(Buf *b) {
        b->len = 0;
        if (b->p)
                b->p[0] = '\0';
}

static EgressParser *of(http_parser *hp) {
        return hp->data;
}

static int flush_header(EgressParser *p) {
        if (p->field.len == 0)
                return 0;
        if (p->n_headers >= EGRESS_MAX_HEADERS) {
                p->too_many = true;
                return -1;
        }
        Header *h = &p->headers[p->n_headers];
        h->name = strndup(p->field.p, p->field.len);
        h->value = strndup(p->value.p ? p->value.p : "", p->value.len);
        if (!h->name || !h->value) {
                free(h->name);
                free(h->value);
                return -1;
        }
        p->n_headers++;
        buf_reset(&p->field);
        buf_reset(&p->value);
        p->in_value = false;
        return 0;
}

static int on_url(http_parser *hp, const char *at, size_t n) {
        return buf_append(&of(hp)->url, at, n) < 0 ? -1 : 0;
}

static int on_header_field(http_parser *hp, const char *at, size_t n) {
        EgressParser *p = of(hp);
        if (p->in_value && flush_header(p) < 0)
                return -1;
        return buf_append(&p->field, at, n) < 0 ? -1 : 0;
}

static int on_header_value(http_parser *hp, const char *at, size_t n) {
        EgressParser *p = of(hp);
        p->in_value = true;
        return buf_append(&p->value, at, n) < 0 ? -1 : 0;
}

static bool header_named_in(const char *name, const char *list) {
        /* list is a Connection header value: comma-separated tokens. */
        size_t nl = strlen(name);
        const char *s = list;
        while (*s) {
                while (*s == ' ' || *s == '\t' || *s == ',')
                        s++;
                const char *e = s;
                while (*e && *e != ',' && *e != ' ' && *e != '\t')
                        e++;
                if ((size_t)(e - s) == nl && strncasecmp(s, name, nl) == 0)
                        return true;
                s = e;
        }
        return false;
}

static bool hop_by_hop(const EgressParser *p, const char *name) {
        static const char *const drop[] = { "host",       "connection",    "proxy-connection", "proxy-authorization",
                                            "keep-alive", "upgrade",       "te",               "trailer",
                                            "proxy-authenticate" };
        for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++)
                if (strcasecmp(name, drop[i]) == 0)
                        return true;
        for (size_t i = 0; i < p->n_headers; i++)
                if (strcasecmp(p->headers[i].name, "connection") == 0 && header_named_in(name, p->headers[i].value))
                        return true;
        return false;
}

static int fail(EgressParser *p, int error, const char *msg) {
        p->error = error;
        snprintf(p->err, sizeof(p->err), "%s", msg);
        return -1;
}

static int build_plain_head(EgressParser *p, const struct http_parser_url *u) {
        const char *url = p->url.p;
        Buf out = { 0 };
        const char *path = "/";
        size_t path_len = 1;
        if (u->field_set & (1 << UF_PATH)) {
                path = url + u->field_data[UF_PATH].off;
                path_len = u->field_data[UF_PATH].len;
        }
        char line[64];
        int r = 0;
        r |= buf_append(&out, p->head.method, strlen(p->head.method));
        r |= buf_append(&out, " ", 1);
        r |= buf_append(&out, path, path_len);
        if (u->field_set & (1 << UF_QUERY)) {
                r |= buf_append(&out, "?", 1);
                r |= buf_append(&out, url + u->field_data[UF_QUERY].off, u->field_data[UF_QUERY].len);
        }
        snprintf(line, sizeof(line), " HTTP/%u.%u\r\nHost: ", p->hp.http_major, p->hp.http_minor);
        r |= buf_append(&out, line, strlen(line));
        bool v6 = strchr(p->head.host, ':') != NULL;
        if (v6)
                r |= buf_append(&out, "[", 1);
        r |= buf_append(&out, p->head.host, strlen(p->head.host));
        if (v6)
                r |= buf_append(&out, "]", 1);
        if (p->head.port != (p->tunnel && p->tunnel_port == 443 ? 443 : 80)) {
                snprintf(line, sizeof(line), ":%u", p->head.port);
                r |= buf_append(&out, line, strlen(line));
        }
        r |= buf_append(&out, "\r\n", 2);
        for (size_t i = 0; i < p->n_headers; i++) {
                if (hop_by_hop(p, p->headers[i].name))
                        continue;
                r |= buf_append(&out, p->headers[i].name, strlen(p->headers[i].name));
                r |= buf_append(&out, ": ", 2);
                r |= buf_append(&out, p->headers[i].value, strlen(p->headers[i].value));
                r |= buf_append(&out, "\r\n", 2);
        }
        if (p->tunnel) {
                /* Kept alive unless the client asked otherwise: then the
                 * upstream must close too, or a client reading to the end
                 * would wait for ever. */
                bool close = p->hp.http_major == 1 && p->hp.http_minor == 0;
                for (size_t i = 0; i < p->n_headers; i++)
                        if (strcasecmp(p->headers[i].name, "connection") == 0)
                                close = close || header_named_in("close", p->headers[i].value);
                if (close)
                        r |= buf_append(&out, "Connection: close\r\n", 19);
                r |= buf_append(&out, "\r\n", 2);
        } else
                r |= buf_append(&out, "Connection: close\r\n\r\n", 21);
        if (r != 0) {
                free(out.p);
                return fail(p, -E2BIG, "request head too large");
        }
        p->head.forward = out.p;
        p->head.forward_len = out.len;
        return 0;
}

static int on_headers_complete(http_parser *hp) {
        EgressParser *p = of(hp);
        if (p->in_value && flush_header(p) < 0)
                return p->too_many ? fail(p, -E2BIG, "too many headers") : -1;
        snprintf(p->head.method, sizeof(p->head.method), "%s", http_method_str(hp->method));
        p->head.is_connect = hp->method == HTTP_CONNECT;
        if (!p->url.p)
                return fail(p, -EINVAL, "no request target");

        struct http_parser_url u;
        http_parser_url_init(&u);
        if (p->tunnel) {
                if (p->head.is_connect || p->url.p[0] != '/' ||
                    http_parser_parse_url(p->url.p, p->url.len, 0, &u) != 0)
                        return fail(p, -EINVAL, "requests in a tunnel must be in origin form (GET /path)");
                snprintf(p->head.host, sizeof(p->head.host), "%s", p->tunnel_host);
                p->head.port = p->tunnel_port;
                if (build_plain_head(p, &u) < 0)
                        return -1;
                p->head_done = true;
                p->replay_lf = true;
                http_parser_pause(hp, 1);
                return 0;
        }
        if (http_parser_parse_url(p->url.p, p->url.len, p->head.is_connect, &u) != 0)
                return fail(p, -EINVAL, "the request target is not a URL");
        if (!p->head.is_connect) {
                if (!(u.field_set & (1 << UF_SCHEMA)) || !(u.field_set & (1 << UF_HOST)))
                        return fail(p, -EINVAL, "a proxy request needs an absolute URL (http://host/path) or CONNECT");
                if (u.field_data[UF_SCHEMA].len != 4 || strncasecmp(p->url.p + u.field_data[UF_SCHEMA].off, "http", 4))
                        return fail(p, -EINVAL, "only http:// URLs go without CONNECT; use CONNECT for https");
                if (u.field_set & (1 << UF_USERINFO))
                        return fail(p, -EINVAL, "credentials in the URL are not forwarded");
        }
        if (!(u.field_set & (1 << UF_HOST)) || u.field_data[UF_HOST].len == 0 ||
            u.field_data[UF_HOST].len >= sizeof(p->head.host))
                return fail(p, -EINVAL, "the request has no valid host");
        memcpy(p->head.host, p->url.p + u.field_data[UF_HOST].off, u.field_data[UF_HOST].len);
        p->head.host[u.field_data[UF_HOST].len] = '\0';
        if (u.field_set & (1 << UF_PORT))
                p->head.port = u.port;
        else if (p->head.is_connect)
                return fail(p, -EINVAL, "CONNECT needs host:port");
        else
                p->head.port = 80;
        if (p->head.port == 0)
                return fail(p, -EINVAL, "port 0 is not a port");
        if (!p->head.is_connect && build_plain_head(p, &u) < 0)
                return -1;

        p->head_done = true;
        /* Stop here so the caller learns where the head ends. http-parser
         * reports the position of the head's last LF, which it must see once
         * more when parsing resumes: replay_lf. */
        p->replay_lf = !p->head.is_connect;
        http_parser_pause(hp, 1);
        return 0;
}

static int on_message_complete(http_parser *hp) {
        EgressParser *p = of(hp);
        p->message_done = true;
        http_parser_pause(hp, 1);
        return 0;
}

EgressParser *egress_parser_new(void) {
        EgressParser *p = calloc(1, sizeof(*p));
        if (!p)
                return NULL;
        http_parser_init(&p->hp, HTTP_REQUEST);
        p->hp.data = p;
        http_parser_settings_init(&p->settings);
        p->settings.on_url = on_url;
        p->settings.on_header_field = on_header_field;
        p->settings.on_header_value = on_header_value;
        p->settings.on_headers_complete = on_headers_complete;
        p->settings.on_message_complete = on_message_complete;
        return p;
}

void egress_parser_free(EgressParser *p) {
        if (!p)
                return;
        free(p->url.p);
        free(p->field.p);
        free(p->value.p);
        for (size_t i = 0; i < p->n_headers; i++) {
                free(p->headers[i].name);
                free(p->headers[i].value);
        }
        free(p->head.forward);
        free(p);
}

EgressParser *egress_parser_new_tunnel(const char *host, uint16_t port) {
        if (!host || strlen(host) >= sizeof(((EgressParser *)0)->tunnel_host) || port == 0)
                return NULL;
        EgressParser *p = egress_parser_new();
        if (!p)
                return NULL;
        p->tunnel = true;
        snprintf(p->tunnel_host, sizeof(p->tunnel_host), "%s", host);
        p->tunnel_port = port;
        return p;
}

const EgressHead *egress_parser_head(const EgressParser *p) {
        return p->head_done ? &p->head : NULL;
}

static int parser_error(EgressParser *p, char *err, size_t err_len) {
        if (p->error == 0) {
                p->error = p->too_many || HTTP_PARSER_ERRNO(&p->hp) == HPE_HEADER_OVERFLOW ? -E2BIG : -EINVAL;
                snprintf(p->err, sizeof(p->err), "malformed request: %s",
                         http_errno_description(HTTP_PARSER_ERRNO(&p->hp)));
        }
        if (err && err_len)
                snprintf(err, err_len, "%s", p->err);
        return p->error;
}

int egress_parser_feed(EgressParser *p, const uint8_t *buf, size_t len, size_t *ret_used, char *err,
                       size_t err_len) {
        *ret_used = 0;
        if (p->error)
                return parser_error(p, err, err_len);
        if (p->message_done || (p->head_done && p->head.is_connect))
                return p->message_done ? EGRESS_PARSE_DONE : EGRESS_PARSE_HEAD;
        if (len == 0)
                return EGRESS_PARSE_MORE;

        if (p->replay_lf) {
                p->replay_lf = false;
                http_parser_pause(&p->hp, 0);
                http_parser_execute(&p->hp, &p->settings, "\n", 1);
                enum http_errno e = HTTP_PARSER_ERRNO(&p->hp);
                if (p->message_done)
                        return EGRESS_PARSE_DONE; /* a message without a body */
                if (e != HPE_OK)
                        return parser_error(p, err, err_len);
        }
        bool body_mode = p->head_done;
        http_parser_pause(&p->hp, 0);
        size_t n = http_parser_execute(&p->hp, &p->settings, (const char *)buf, len);
        enum http_errno e = HTTP_PARSER_ERRNO(&p->hp);

        if (p->message_done) {
                *ret_used = n;
                return EGRESS_PARSE_DONE;
        }
        if (body_mode) {
                /* Body bytes of a plain request. */
                if (e != HPE_OK && e != HPE_PAUSED)
                        return parser_error(p, err, err_len);
                *ret_used = n;
                return EGRESS_PARSE_MORE;
        }
        if (p->head_done) {
                if (p->error)
                        return parser_error(p, err, err_len);
                /* Paused on the head's last LF, which counts as used. */
                *ret_used = n + 1 > len ? len : n + 1;
                p->head_bytes += *ret_used;
                if (p->head_bytes > EGRESS_MAX_HEAD) {
                        fail(p, -E2BIG, "request head too large");
                        return parser_error(p, err, err_len);
                }
                return EGRESS_PARSE_HEAD;
        }
        if (e != HPE_OK || p->error)
                return parser_error(p, err, err_len);
        p->head_bytes += n;
        *ret_used = n;
        if (p->head_bytes > EGRESS_MAX_HEAD) {
                fail(p, -E2BIG, "request head too large");
                return parser_error(p, err, err_len);
        }
        return EGRESS_PARSE_MORE;
}
