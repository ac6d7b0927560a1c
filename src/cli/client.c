#include "cli/client.h"
#include "cli/ndjson.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/client.h"
#include "common/macro.h"

/* A JSON answer (a list of 10000 file entries is a few MB) and one NDJSON
 * line (an output chunk, JSON-escaped) are bounded; so is an error body,
 * which is read only to show its message. */
#define ANSWER_MAX (64UL * 1024 * 1024)
#define LINE_MAX_BYTES (64UL * 1024 * 1024)
#define ERROR_BODY_MAX (1UL * 1024 * 1024)
#define CONNECT_TIMEOUT_S 10L
#define RECV_BUFFER (512L * 1024)

struct Client {
        CURL *curl;
        char *base;
        char *display;
        char *unix_socket;
        char *auth_header;
        volatile sig_atomic_t *interrupt;
        char errbuf[CURL_ERROR_SIZE];
};

typedef enum SinkKind {
        SINK_BUFFER,
        SINK_LINES,
        SINK_RAW,
} SinkKind;

typedef struct Transfer {
        Client *c;
        long status;
        SinkKind sink;
        ByteBuf buf;
        bool error_truncated;
        ClientLineFn line_fn;
        ClientSinkFn raw_fn;
        void *userdata;
        int cb_error;
        int upload_fd;
} Transfer;

static bool status_ok(long s) {
        return s >= 200 && s < 300;
}

void cli_error_set(CliError *err, const char *fmt, ...) {
        va_list ap;

        *err = (CliError){0};
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof(err->message), fmt, ap);
        va_end(ap);
}

static void copy_clean(char *dst, size_t dstlen, const char *src) {
        size_t i = 0;

        for (; src && *src && i + 1 < dstlen; src++) {
                unsigned char ch = (unsigned char)*src;
                dst[i++] = (ch < 0x20 && ch != '\t') || ch == 0x7f ? '?' : (char)ch;
        }
        dst[i] = '\0';
}

void cli_error_from_json(CliError *err, long status, const char *body, size_t len) {
        _cleanup_json_ json_t *j = NULL;
        json_t *e;

        *err = (CliError){.status = status};
        j = body ? json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL) : NULL;
        e = json_object_get(j, "error");
        /* An event may carry the whole error shape ({"error": {...}}) rather
         * than the object inside it; both are read. */
        if (json_is_object(e) && !json_object_get(e, "message") &&
            json_is_object(json_object_get(e, "error")))
                e = json_object_get(e, "error");
        if (!json_is_object(e) || !json_is_string(json_object_get(e, "message"))) {
                if (status > 0)
                        snprintf(err->message, sizeof(err->message),
                                 "runtimed answered HTTP %ld without an error object", status);
                else
                        snprintf(err->message, sizeof(err->message),
                                 "runtimed reported an error without a message");
                return;
        }
        copy_clean(err->code, sizeof(err->code), json_string_value(json_object_get(e, "code")));
        copy_clean(err->message, sizeof(err->message), json_string_value(json_object_get(e, "message")));
        copy_clean(err->hint, sizeof(err->hint), json_string_value(json_object_get(e, "hint")));
        copy_clean(err->request_id, sizeof(err->request_id),
                   json_string_value(json_object_get(e, "requestId")));
        if (json_is_integer(json_object_get(e, "status")))
                err->status = (long)json_integer_value(json_object_get(e, "status"));
}

int client_new(const Endpoint *ep, const char *key, Client **ret) {
        Client *c;

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->curl = curl_easy_init();
        c->base = strdup(ep->base);
        c->display = strdup(ep->display);
        c->unix_socket = ep->unix_socket ? strdup(ep->unix_socket) : NULL;
        if (key && asprintf(&c->auth_header, "Authorization: Bearer %s", key) < 0)
                c->auth_header = NULL;
        if (!c->curl || !c->base || !c->display || (ep->unix_socket && !c->unix_socket) ||
            (key && !c->auth_header)) {
                client_free(c);
                return -ENOMEM;
        }
        *ret = c;
        return 0;
}

Client *client_free(Client *c) {
        if (!c)
                return NULL;
        if (c->curl)
                curl_easy_cleanup(c->curl);
        if (c->auth_header) {
                explicit_bzero(c->auth_header, strlen(c->auth_header));
                free(c->auth_header);
        }
        free(c->base);
        free(c->display);
        free(c->unix_socket);
        free(c);
        return NULL;
}

void client_set_interrupt(Client *c, volatile sig_atomic_t *flag) {
        c->interrupt = flag;
}

char *url_escape(const char *s) {
        static const char hex[] = "0123456789ABCDEF";
        size_t n = strlen(s);
        char *out, *o;

        if (n > (SIZE_MAX - 1) / 3)
                return NULL;
        out = o = malloc(n * 3 + 1);
        if (!out)
                return NULL;
        for (; *s; s++) {
                unsigned char ch = (unsigned char)*s;
                if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                    strchr("-._~/", ch))
                        *o++ = (char)ch;
                else {
                        *o++ = '%';
                        *o++ = hex[ch >> 4];
                        *o++ = hex[ch & 15];
                }
        }
        *o = '\0';
        return out;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *userdata) {
        Transfer *t = userdata;
        size_t len = size * nmemb;
        int r = 0;

        if (t->status == 0)
                curl_easy_getinfo(t->c->curl, CURLINFO_RESPONSE_CODE, &t->status);
        if (!status_ok(t->status)) {
                /* Only the message matters; the rest is drained and dropped. */
                if (!t->error_truncated && bytebuf_append(&t->buf, data, len, ERROR_BODY_MAX) < 0)
                        t->error_truncated = true;
                return len;
        }
        switch (t->sink) {
        case SINK_BUFFER:
                r = bytebuf_append(&t->buf, data, len, ANSWER_MAX);
                break;
        case SINK_LINES:
                r = bytebuf_append(&t->buf, data, len, LINE_MAX_BYTES);
                if (r == 0)
                        r = ndjson_take_lines(&t->buf, false, t->line_fn, t->userdata);
                break;
        case SINK_RAW:
                r = t->raw_fn(data, len, t->userdata);
                break;
        }
        if (r < 0) {
                t->cb_error = r;
                return 0;
        }
        return len;
}

static size_t on_read(char *buf, size_t size, size_t nitems, void *userdata) {
        Transfer *t = userdata;
        ssize_t n;

        for (;;) {
                n = read(t->upload_fd, buf, size * nitems);
                if (n >= 0)
                        return (size_t)n;
                if (errno != EINTR)
                        break;
                if (t->c->interrupt && *t->c->interrupt)
                        break;
        }
        t->cb_error = n < 0 ? -errno : -EIO;
        return CURL_READFUNC_ABORT;
}

static int on_progress(void *userdata, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
        Transfer *t = userdata;

        return t->c->interrupt && *t->c->interrupt ? 1 : 0;
}

static const char *connect_reason(long os_errno) {
        switch (os_errno) {
        case ECONNREFUSED:
                return "connection refused";
        case ENOENT:
                return "no such socket";
        case EACCES:
        case EPERM:
                return "permission denied";
        case ETIMEDOUT:
                return "timed out";
        case ENETUNREACH:
        case EHOSTUNREACH:
                return "host unreachable";
        default:
                return NULL;
        }
}

static void transport_error(Transfer *t, CURLcode rc, CliError *err) {
        long os_errno = 0;
        const char *why;

        curl_easy_getinfo(t->c->curl, CURLINFO_OS_ERRNO, &os_errno);
        switch (rc) {
        case CURLE_COULDNT_CONNECT:
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_OPERATION_TIMEDOUT:
                if (t->status != 0 && rc == CURLE_OPERATION_TIMEDOUT) {
                        cli_error_set(err, "the connection to runtimed at %s timed out", t->c->display);
                        return;
                }
                why = rc == CURLE_COULDNT_RESOLVE_HOST ? "host not found"
                      : rc == CURLE_OPERATION_TIMEDOUT ? "timed out"
                                                       : connect_reason(os_errno);
                if (!why)
                        why = os_errno ? strerror((int)os_errno) : "cannot connect";
                cli_error_set(
                        err,
                        "cannot reach runtimed at %s (%s); start it with runtimed or the README's setup "
                        "command",
                        t->c->display, why);
                return;
        default:
                break;
        }
        if (rc == CURLE_SSL_CONNECT_ERROR || rc == CURLE_PEER_FAILED_VERIFICATION ||
            rc == CURLE_SSL_CACERT_BADFILE) {
                cli_error_set(err, "TLS with runtimed at %s failed: %s", t->c->display,
                              t->c->errbuf[0] ? t->c->errbuf : curl_easy_strerror(rc));
                return;
        }
        cli_error_set(err, "the connection to runtimed at %s broke: %s", t->c->display,
                      t->c->errbuf[0] ? t->c->errbuf : curl_easy_strerror(rc));
}

static void slist_freep(struct curl_slist **l) {
        curl_slist_free_all(*l);
}

/* The common part of every request. The caller has set up t's sink. */
static int perform(Client *c, Transfer *t, const char *method, const char *path, const char *body,
                   size_t body_len, const char *content_type, long long upload_size, CliError *err) {
        __attribute__((cleanup(slist_freep))) struct curl_slist *headers = NULL;
        _cleanup_free_ char *url = NULL, *ct = NULL;
        CURL *h = c->curl;
        CURLcode rc;
        int r;

        if (asprintf(&url, "%s%s", c->base, path) < 0)
                return -ENOMEM;
        curl_easy_reset(h);
        c->errbuf[0] = '\0';
        t->c = c;
        t->status = 0;

        if (c->auth_header)
                headers = curl_slist_append(headers, c->auth_header);
        headers = curl_slist_append(headers, "Expect:");
        if (content_type) {
                if (asprintf(&ct, "Content-Type: %s", content_type) < 0)
                        return -ENOMEM;
                headers = curl_slist_append(headers, ct);
        }
        if (!headers)
                return -ENOMEM;

        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
        /* The key goes to the daemon itself: never through a proxy that the
         * environment names (a sandbox has HTTP_PROXY set, for one). */
        curl_easy_setopt(h, CURLOPT_PROXY, "");
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
        curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
        /* Fewer, larger reads: output streams can be tens of MB. */
        curl_easy_setopt(h, CURLOPT_BUFFERSIZE, RECV_BUFFER);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
        curl_easy_setopt(h, CURLOPT_USERAGENT, "runtime-cli/" RUNTIME_VERSION);
        if (c->unix_socket)
                curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, c->unix_socket);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, t);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, t);

        if (upload_size >= -1 && t->upload_fd >= 0) {
                curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
                curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
                curl_easy_setopt(h, CURLOPT_READDATA, t);
                if (upload_size >= 0)
                        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)upload_size);
        } else if (strcmp(method, "GET") == 0) {
                curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
        } else {
                if (strcmp(method, "POST") != 0)
                        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
                if (body || strcmp(method, "POST") == 0) {
                        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
                        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
                }
        }

        rc = curl_easy_perform(h);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &t->status);
        /* The answer without a trailing newline still has a last line. */
        if (rc == CURLE_OK && t->sink == SINK_LINES && status_ok(t->status) && t->buf.len > 0) {
                r = ndjson_take_lines(&t->buf, true, t->line_fn, t->userdata);
                if (r < 0)
                        t->cb_error = r;
        }
        if (t->cb_error < 0) {
                if (t->cb_error == -EFBIG)
                        cli_error_set(err, "the answer of runtimed is larger than this client accepts");
                else if (t->upload_fd >= 0 && rc == CURLE_ABORTED_BY_CALLBACK)
                        cli_error_set(err, "reading the upload failed: %s", strerror(-t->cb_error));
                else
                        cli_error_set(err, "%s", strerror(-t->cb_error));
                return t->cb_error;
        }
        if (rc == CURLE_ABORTED_BY_CALLBACK && c->interrupt && *c->interrupt) {
                cli_error_set(err, "interrupted");
                return -EINTR;
        }
        if (rc != CURLE_OK) {
                /* A daemon that answers an error while the upload is still
                 * going may close the connection: its answer is what counts. */
                if (t->status != 0 && !status_ok(t->status) && t->buf.len > 0) {
                        cli_error_from_json(err, t->status, t->buf.data, t->buf.len);
                        return -EPROTO;
                }
                transport_error(t, rc, err);
                return rc == CURLE_COULDNT_CONNECT ? -ECONNREFUSED : -EIO;
        }
        if (!status_ok(t->status)) {
                cli_error_from_json(err, t->status, t->buf.data, t->buf.len);
                return -EPROTO;
        }
        return 0;
}

static void transfer_done(Transfer *t) {
        bytebuf_done(&t->buf);
}

static int parse_answer(Transfer *t, json_t **ret, CliError *err) {
        json_error_t jerr;
        json_t *j;

        if (!ret)
                return 0;
        j = json_loadb(t->buf.data ? t->buf.data : "", t->buf.len, JSON_REJECT_DUPLICATES, &jerr);
        if (!j) {
                cli_error_set(err, "runtimed answered something that is not JSON (%s)", jerr.text);
                return -EBADMSG;
        }
        *ret = j;
        return 0;
}

int client_json(Client *c, const char *method, const char *path, json_t *body, json_t **ret, CliError *err) {
        Transfer t = {.sink = SINK_BUFFER, .upload_fd = -1};
        _cleanup_free_ char *text = NULL;
        int r;

        if (body) {
                text = json_dumps(body, JSON_COMPACT);
                if (!text)
                        return -ENOMEM;
        }
        r = perform(c, &t, method, path, text, text ? strlen(text) : 0, text ? "application/json" : NULL, -2,
                    err);
        if (r == 0)
                r = parse_answer(&t, ret, err);
        transfer_done(&t);
        return r;
}

int client_stream_lines(Client *c, const char *method, const char *path, json_t *body, ClientLineFn fn,
                        void *userdata, CliError *err) {
        Transfer t = {.sink = SINK_LINES, .line_fn = fn, .userdata = userdata, .upload_fd = -1};
        _cleanup_free_ char *text = NULL;
        int r;

        if (body) {
                text = json_dumps(body, JSON_COMPACT);
                if (!text)
                        return -ENOMEM;
        }
        r = perform(c, &t, method, path, text, text ? strlen(text) : 0, text ? "application/json" : NULL, -2,
                    err);
        transfer_done(&t);
        return r;
}

int client_download(Client *c, const char *path, ClientSinkFn fn, void *userdata, CliError *err) {
        Transfer t = {.sink = SINK_RAW, .raw_fn = fn, .userdata = userdata, .upload_fd = -1};
        int r;

        r = perform(c, &t, "GET", path, NULL, 0, NULL, -2, err);
        transfer_done(&t);
        return r;
}

int client_upload(Client *c, const char *path, int fd, long long size, json_t **ret, CliError *err) {
        Transfer t = {.sink = SINK_BUFFER, .upload_fd = fd};
        int r;

        r = perform(c, &t, "PUT", path, NULL, 0, "application/octet-stream", size < 0 ? -1 : size, err);
        if (r == 0)
                r = parse_answer(&t, ret, err);
        transfer_done(&t);
        return r;
}

int client_raw_connect(Client *c, CliError *err) {
        CURL *h = c->curl;
        curl_easy_reset(h);
        c->errbuf[0] = '\0';
        curl_easy_setopt(h, CURLOPT_URL, c->base);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(h, CURLOPT_PROXY, "");
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
        curl_easy_setopt(h, CURLOPT_CONNECT_ONLY, 1L);
        if (c->unix_socket)
                curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, c->unix_socket);
        CURLcode rc = curl_easy_perform(h);
        if (rc != CURLE_OK) {
                cli_error_set(err, "cannot connect to the daemon at %s: %s", c->display,
                              c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc));
                return -ECONNREFUSED;
        }
        return 0;
}

const char *client_auth_header(Client *c) {
        return c->auth_header;
}

const char *client_base(Client *c) {
        return c->base;
}

int client_raw_socket(Client *c) {
        curl_socket_t s = CURL_SOCKET_BAD;
        if (curl_easy_getinfo(c->curl, CURLINFO_ACTIVESOCKET, &s) != CURLE_OK || s == CURL_SOCKET_BAD)
                return -1;
        return (int)s;
}

ssize_t client_raw_send(Client *c, const void *buf, size_t len) {
        size_t n = 0;
        CURLcode rc = curl_easy_send(c->curl, buf, len, &n);
        if (rc == CURLE_AGAIN)
                return -EAGAIN;
        return rc == CURLE_OK ? (ssize_t)n : -EPIPE;
}

ssize_t client_raw_recv(Client *c, void *buf, size_t len) {
        size_t n = 0;
        CURLcode rc = curl_easy_recv(c->curl, buf, len, &n);
        if (rc == CURLE_AGAIN)
                return -EAGAIN;
        if (rc != CURLE_OK || n == 0)
                return -EPIPE;
        return (ssize_t)n;
}
