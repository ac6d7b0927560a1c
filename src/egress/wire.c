#include "egress/wire.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "egress/policy.h"

#define MAX_SECRETS 100
#define MAX_DEPTH 32

static int wait_fd(int fd, short events, int64_t deadline) {
        for (;;) {
                int t = -1;
                if (deadline >= 0) {
                        int64_t left = deadline - (int64_t)time_now_mono_ms();
                        if (left <= 0)
                                return -ETIMEDOUT;
                        t = left > 60000 ? 60000 : (int)left;
                }
                struct pollfd p = { .fd = fd, .events = events };
                int r = poll(&p, 1, t);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0)
                        return -errno;
                if (r > 0)
                        return 0;
        }
}

static int write_full(int fd, const uint8_t *p, size_t n, int64_t deadline) {
        while (n > 0) {
                ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w < 0 && errno == EINTR)
                        continue;
                if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                        int r = wait_fd(fd, POLLOUT, deadline);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (w < 0)
                        return errno == ECONNRESET ? -EPIPE : -errno;
                p += w;
                n -= (size_t)w;
        }
        return 0;
}

static int read_full(int fd, uint8_t *p, size_t n, int64_t deadline) {
        while (n > 0) {
                ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
                if (got < 0 && errno == EINTR)
                        continue;
                if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                        int r = wait_fd(fd, POLLIN, deadline);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (got < 0)
                        return errno == ECONNRESET ? -EPIPE : -errno;
                if (got == 0)
                        return -EPIPE;
                p += got;
                n -= (size_t)got;
        }
        return 0;
}

int egress_wire_write(int fd, const json_t *msg, int timeout_ms) {
        char *text = json_dumps(msg, JSON_COMPACT);
        if (!text)
                return -ENOMEM;
        size_t len = strlen(text);
        int r = -E2BIG;
        if (len <= UINT32_MAX) {
                int64_t deadline = timeout_ms >= 0 ? (int64_t)time_now_mono_ms() + timeout_ms : -1;
                uint8_t head[4] = { (uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8),
                                    (uint8_t)len };
                r = write_full(fd, head, sizeof(head), deadline);
                if (r == 0)
                        r = write_full(fd, (const uint8_t *)text, len, deadline);
        }
        explicit_bzero(text, len); /* settings carry secret values */
        free(text);
        return r;
}

int egress_wire_read(int fd, size_t max, int timeout_ms, json_t **ret) {
        int64_t deadline = timeout_ms >= 0 ? (int64_t)time_now_mono_ms() + timeout_ms : -1;
        uint8_t head[4];
        int r = read_full(fd, head, sizeof(head), deadline);
        if (r < 0)
                return r;
        size_t len = (size_t)head[0] << 24 | (size_t)head[1] << 16 | (size_t)head[2] << 8 | head[3];
        if (len == 0 || len > max)
                return -EBADMSG;
        _cleanup_free_ char *buf = malloc(len + 1);
        if (!buf)
                return -ENOMEM;
        if ((r = read_full(fd, (uint8_t *)buf, len, deadline)) < 0) {
                explicit_bzero(buf, len);
                return r;
        }
        buf[len] = '\0';
        json_t *j = json_depth_ok(buf, len, MAX_DEPTH) ? json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL) : NULL;
        explicit_bzero(buf, len); /* settings carry secret values */
        if (!j)
                return -EBADMSG;
        *ret = j;
        return 0;
}

int egress_wire_send_conn(int ctl, int data, int meta) {
        char byte = 'c';
        struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(2 * sizeof(int))];
        } u;
        memset(&u, 0, sizeof(u));
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(2 * sizeof(int));
        int fds[2] = { data, meta };
        memcpy(CMSG_DATA(c), fds, sizeof(fds));
        for (;;) {
                ssize_t n = sendmsg(ctl, &mh, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return errno == ECONNRESET || errno == ECONNREFUSED || errno == ENOTCONN ? -EPIPE : -errno;
                return 0;
        }
}

int egress_wire_recv_conn(int ctl, int *ret_data, int *ret_meta) {
        char byte;
        struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(8 * sizeof(int))];
        } u;
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
        ssize_t n;
        do
                n = recvmsg(ctl, &mh, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        if (n == 0)
                return -EPIPE;
        int fds[8], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < k && nfds < 8; i++)
                        memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
        if (nfds != 2 || (mh.msg_flags & MSG_CTRUNC)) {
                for (int i = 0; i < nfds; i++)
                        close(fds[i]);
                return -EBADMSG;
        }
        *ret_data = fds[0];
        *ret_meta = fds[1];
        return 0;
}

json_t *egress_wire_record_json(const EgressRecord *rec, EgressWireKind kind, uint64_t decided_us) {
        json_t *j = json_pack("{s:s,s:s,s:i,s:b,s:b,s:s,s:s,s:s,s:I,s:I,s:b,s:i,s:I,s:s,s:I}", "type",
                              kind == EGRESS_WIRE_DECISION ? "decision" : "end", "host", rec->host, "port",
                              (int)rec->port, "connect", rec->connect, "allowed", rec->allowed, "reason", rec->reason,
                              "addr", rec->addr, "rule", rec->rule, "bytesOut", (json_int_t)rec->bytes_out, "bytesIn",
                              (json_int_t)rec->bytes_in, "intercepted", rec->intercepted, "secretsUsed",
                              (int)rec->secrets_used, "durationMs", (json_int_t)rec->duration_ms, "end", rec->end,
                              "decidedUs", (json_int_t)(kind == EGRESS_WIRE_DECISION ? decided_us : 0));
        return j;
}

static int copy_string(const json_t *j, const char *key, char *out, size_t out_len) {
        const json_t *v = json_object_get(j, key);
        if (!json_is_string(v) || json_string_length(v) >= out_len ||
            strlen(json_string_value(v)) != json_string_length(v))
                return -EBADMSG;
        memcpy(out, json_string_value(v), json_string_length(v) + 1);
        return 0;
}

static int get_uint(const json_t *j, const char *key, uint64_t max, uint64_t *ret) {
        const json_t *v = json_object_get(j, key);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
                return -EBADMSG;
        *ret = (uint64_t)json_integer_value(v);
        return 0;
}

int egress_wire_record_parse(const json_t *j, EgressRecord *ret, EgressWireKind *ret_kind, uint64_t *ret_decided_us) {
        EgressRecord rec;
        memset(&rec, 0, sizeof(rec));
        uint64_t port, used, decided_us;
        const char *type = json_string_value(json_object_get(j, "type"));
        if (!json_is_object(j) || !type || (strcmp(type, "decision") != 0 && strcmp(type, "end") != 0) ||
            copy_string(j, "host", rec.host, sizeof(rec.host)) < 0 ||
            copy_string(j, "reason", rec.reason, sizeof(rec.reason)) < 0 ||
            copy_string(j, "addr", rec.addr, sizeof(rec.addr)) < 0 ||
            copy_string(j, "rule", rec.rule, sizeof(rec.rule)) < 0 ||
            copy_string(j, "end", rec.end, sizeof(rec.end)) < 0 || get_uint(j, "port", 65535, &port) < 0 ||
            get_uint(j, "bytesOut", INT64_MAX, &rec.bytes_out) < 0 ||
            get_uint(j, "bytesIn", INT64_MAX, &rec.bytes_in) < 0 || get_uint(j, "secretsUsed", 1u << 20, &used) < 0 ||
            get_uint(j, "durationMs", INT64_MAX, &rec.duration_ms) < 0 ||
            get_uint(j, "decidedUs", INT64_MAX, &decided_us) < 0 ||
            !json_is_boolean(json_object_get(j, "connect")) || !json_is_boolean(json_object_get(j, "allowed")) ||
            !json_is_boolean(json_object_get(j, "intercepted")))
                return -EBADMSG;
        rec.port = (uint16_t)port;
        rec.secrets_used = (unsigned)used;
        rec.connect = json_is_true(json_object_get(j, "connect"));
        rec.allowed = json_is_true(json_object_get(j, "allowed"));
        rec.intercepted = json_is_true(json_object_get(j, "intercepted"));
        *ret = rec;
        *ret_kind = strcmp(type, "decision") == 0 ? EGRESS_WIRE_DECISION : EGRESS_WIRE_END;
        if (ret_decided_us)
                *ret_decided_us = decided_us;
        return 0;
}

void egress_wire_secrets_free(EgressSecret *s, size_t n) {
        if (!s)
                return;
        for (size_t i = 0; i < n; i++) {
                if (s[i].value) {
                        explicit_bzero(s[i].value, strlen(s[i].value));
                        free(s[i].value);
                }
                egress_policy_free(s[i].hosts);
                free(s[i].format);
                egress_secret_rules_free(s[i].rules, s[i].n_rules);
        }
        free(s);
}

static int hosts_policy(const char *hosts_json, EgressPolicy **ret) {
        _cleanup_json_ json_t *hosts = json_loads(hosts_json, 0, NULL);
        _cleanup_json_ json_t *net = json_pack("{s:b,s:O}", "internet", 1, "allow", hosts ? hosts : json_null());
        if (!hosts || !net)
                return -EINVAL;
        return egress_policy_parse(net, ret, NULL, 0);
}

static const char *str_or_null(const json_t *o, const char *key) {
        const json_t *v = json_object_get(o, key);
        return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v) ? json_string_value(v)
                                                                                           : NULL;
}

static bool secret_parse(const json_t *o, EgressSecret *s) {
        const char *name = str_or_null(o, "name"), *value = str_or_null(o, "value");
        const char *hosts = str_or_null(o, "hosts"), *placeholder = str_or_null(o, "placeholder");
        const char *header = str_or_null(o, "header"), *format = str_or_null(o, "format");
        const char *rules = str_or_null(o, "rules");
        memset(s, 0, sizeof(*s));
        if (!name || !value || !hosts || !placeholder || strlen(name) >= sizeof(s->name) ||
            strlen(placeholder) >= sizeof(s->placeholder) || !egress_secret_value_valid(value, strlen(value)))
                return false;
        snprintf(s->name, sizeof(s->name), "%s", name);
        snprintf(s->placeholder, sizeof(s->placeholder), "%s", placeholder);
        bool ok = (s->value = strdup(value)) && hosts_policy(hosts, &s->hosts) == 0;
        if (ok && header && egress_secret_header_valid(header))
                snprintf(s->header, sizeof(s->header), "%s", header);
        else if (ok && header)
                ok = false;
        if (ok && format && (!egress_secret_format_valid(format) || !(s->format = strdup(format))))
                ok = false;
        if (ok && rules) {
                _cleanup_json_ json_t *rj = json_loads(rules, 0, NULL);
                _cleanup_json_ json_t *norm = NULL;
                char err[64];
                ok = rj && egress_secret_rules_parse(rj, &norm, &s->rules, &s->n_rules, err, sizeof(err)) == 0;
        }
        if (!ok) {
                if (s->value) {
                        explicit_bzero(s->value, strlen(s->value));
                        free(s->value);
                }
                egress_policy_free(s->hosts);
                free(s->format);
                egress_secret_rules_free(s->rules, s->n_rules);
                memset(s, 0, sizeof(*s));
        }
        return ok;
}

int egress_wire_secrets_parse(const json_t *arr, EgressSecret **ret, size_t *ret_n) {
        if (arr && !json_is_array(arr))
                return -EBADMSG;
        size_t total = arr ? json_array_size(arr) : 0;
        if (total > MAX_SECRETS)
                return -EBADMSG;
        EgressSecret *out = calloc(total ? total : 1, sizeof(EgressSecret));
        if (!out)
                return -ENOMEM;
        size_t n = 0;
        for (size_t i = 0; i < total; i++)
                if (secret_parse(json_array_get(arr, i), &out[n]))
                        n++;
        *ret = out;
        *ret_n = n;
        return 0;
}

void egress_wire_settings_free(json_t *settings) {
        if (!settings)
                return;
        size_t i;
        json_t *secret;
        json_array_foreach(json_object_get(settings, "secrets"), i, secret) {
                json_t *v = json_object_get(secret, "value");
                if (json_is_string(v) && v->refcount == 1 && secret->refcount == 1)
                        explicit_bzero((char *)json_string_value(v), json_string_length(v));
        }
        json_decref(settings);
}
