#include "driver/microvm_qmp.h"

#include <errno.h>
#include <stdbool.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdint.h>

#include "common/timeutil.h"

/* Reads what the monitor has, waiting up to a second for it: 0 (call again),
 * -ETIMEDOUT past the deadline, -EPIPE at its end, or a negative errno. */
static int qmp_fill(MicrovmQmp *q, int64_t deadline) {
        int64_t left = deadline - (int64_t)time_now_mono_ms();
        if (left <= 0)
                return -ETIMEDOUT;
        struct pollfd pf = { .fd = q->fd, .events = POLLIN };
        int k = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
        if (k < 0 && errno != EINTR)
                return -errno;
        if (k <= 0)
                return 0;
        ssize_t got = read(q->fd, q->buf + q->len, sizeof(q->buf) - q->len);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
                return 0;
        if (got <= 0)
                return got < 0 ? -errno : -EPIPE;
        q->len += (size_t)got;
        return 0;
}

/* The next reply (not an event) as a JSON object, by the deadline. */
static int qmp_reply(MicrovmQmp *q, int64_t deadline, json_t **ret) {
        for (;;) {
                char *nl = memchr(q->buf, '\n', q->len);
                if (nl) {
                        size_t line = (size_t)(nl - q->buf) + 1;
                        json_t *o = json_loadb(q->buf, line - 1, 0, NULL);
                        memmove(q->buf, q->buf + line, q->len - line);
                        q->len -= line;
                        if (!o || !json_is_object(o)) {
                                json_decref(o);
                                return -EPROTO;
                        }
                        if (json_object_get(o, "event") || json_object_get(o, "QMP")) {
                                json_decref(o);
                                continue;
                        }
                        *ret = o;
                        return 0;
                }
                if (q->len == sizeof(q->buf))
                        return -EPROTO;
                int r = qmp_fill(q, deadline);
                if (r < 0)
                        return r;
        }
}

int microvm_qmp_exec(MicrovmQmp *q, const char *cmd, int pass_fd, int64_t deadline, json_t **ret, char *why,
                     size_t why_len) {
        struct iovec iov = { .iov_base = (void *)cmd, .iov_len = strlen(cmd) };
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } ctl;
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        if (pass_fd >= 0) {
                memset(&ctl, 0, sizeof(ctl));
                msg.msg_control = ctl.buf;
                msg.msg_controllen = sizeof(ctl.buf);
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
        }
        ssize_t w;
        do
                w = sendmsg(q->fd, &msg, MSG_NOSIGNAL);
        while (w < 0 && errno == EINTR);
        if (w != (ssize_t)iov.iov_len)
                return w < 0 ? -errno : -EIO;
        json_t *o = NULL;
        int r = qmp_reply(q, deadline, &o);
        if (r < 0)
                return r;
        json_t *err = json_object_get(o, "error");
        if (err) {
                snprintf(why, why_len, "%s", json_string_value(json_object_get(err, "desc")) ?: "QMP error");
                json_decref(o);
                return -EIO;
        }
        if (ret)
                *ret = json_incref(json_object_get(o, "return"));
        json_decref(o);
        return 0;
}

int microvm_qmp_resync(MicrovmQmp *q, const char *execute, int64_t deadline) {
        /* Unique enough: only a reply to this very command may carry it. */
        char id[64], cmd[160];
        snprintf(id, sizeof(id), "runtimed-resync-%d-%lld", (int)getpid(), (long long)time_now_mono_ms());
        int n = snprintf(cmd, sizeof(cmd), "{\"execute\":\"%s\",\"id\":\"%s\"}\n", execute, id);
        if (n < 0 || (size_t)n >= sizeof(cmd))
                return -EINVAL;
        q->len = 0;
        ssize_t w;
        do
                w = send(q->fd, cmd, (size_t)n, MSG_NOSIGNAL);
        while (w < 0 && errno == EINTR);
        if (w != n)
                return w < 0 ? -errno : -EIO;
        for (;;) {
                char *nl;
                while ((nl = memchr(q->buf, '\n', q->len))) {
                        size_t line = (size_t)(nl - q->buf) + 1;
                        json_t *o = json_loadb(q->buf, line - 1, 0, NULL);
                        const char *got = json_string_value(json_object_get(o, "id"));
                        bool ours = got && strcmp(got, id) == 0;
                        json_decref(o);
                        memmove(q->buf, q->buf + line, q->len - line);
                        q->len -= line;
                        if (ours)
                                return 0;
                }
                /* A line longer than the buffer is nobody's reply to us:
                 * dropped, its end is dropped with the next newline. */
                if (q->len == sizeof(q->buf))
                        q->len = 0;
                int r = qmp_fill(q, deadline);
                if (r < 0)
                        return r;
        }
}

int microvm_qmp_save(MicrovmQmp *q, int state_fd, int64_t deadline, char *why, size_t why_len) {
        /* The default bandwidth cap (128 MiB/s) would make a big guest's
         * save take seconds for nothing: it goes to a local file. */
        int r = microvm_qmp_exec(q,
                                 "{\"execute\":\"migrate-set-parameters\",\"arguments\":{\"max-bandwidth\":17179869184}}\n",
                                 -1, deadline, NULL, why, why_len);
        if (r == 0)
                r = microvm_qmp_exec(q, "{\"execute\":\"getfd\",\"arguments\":{\"fdname\":\"state\"}}\n", state_fd,
                                     deadline, NULL, why, why_len);
        if (r == 0)
                r = microvm_qmp_exec(q, "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:state\"}}\n", -1,
                                     deadline, NULL, why, why_len);
        while (r == 0) {
                json_t *ret = NULL;
                r = microvm_qmp_exec(q, "{\"execute\":\"query-migrate\"}\n", -1, deadline, &ret, why, why_len);
                if (r < 0)
                        break;
                const char *status = json_string_value(json_object_get(ret, "status"));
                if (status && strcmp(status, "completed") == 0) {
                        json_decref(ret);
                        return 0;
                }
                if (!status || strcmp(status, "failed") == 0 || strcmp(status, "cancelled") == 0) {
                        snprintf(why, why_len, "saving the guest: %s",
                                 json_string_value(json_object_get(ret, "error-desc")) ?: status ?: "no status");
                        r = -EIO;
                }
                json_decref(ret);
                if (r == 0) {
                        if ((int64_t)time_now_mono_ms() > deadline) {
                                snprintf(why, why_len, "saving the guest ran past its deadline");
                                r = -ETIMEDOUT;
                        } else
                                usleep(20000);
                }
        }
        return r;
}
