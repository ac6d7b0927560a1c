#include "driver/driver_agent.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/timeutil.h"
#include "proto/proto.h"

/* Reads exactly n bytes by the deadline (a monotonic ms time). */
static int read_exact(int fd, void *buf, size_t n, int64_t deadline) {
        uint8_t *p = buf;
        while (n > 0) {
                int64_t left = deadline - (int64_t)time_now_mono_ms();
                if (left <= 0)
                        return -ETIMEDOUT;
                struct pollfd pf = { .fd = fd, .events = POLLIN };
                int k = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
                if (k < 0 && errno != EINTR)
                        return -errno;
                if (k <= 0)
                        continue;
                ssize_t got = read(fd, p, n);
                if (got < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (got < 0)
                        return -errno;
                if (got == 0)
                        return -EPIPE;
                p += got;
                n -= (size_t)got;
        }
        return 0;
}

int driver_agent_read_frame(int fd, uint8_t type, uint32_t stream, int64_t deadline, json_t **ret) {
        uint8_t hdr[PROTO_HEADER_SIZE];
        ProtoHeader h;
        int r = read_exact(fd, hdr, sizeof(hdr), deadline);
        if (r < 0)
                return r;
        if (proto_header_decode(hdr, &h) < 0 || h.type != type || h.stream != stream || h.length > PROTO_MAX_JSON)
                return -EPROTO;
        _cleanup_free_ char *payload = malloc(h.length + 1);
        if (!payload)
                return -ENOMEM;
        r = read_exact(fd, payload, h.length, deadline);
        if (r < 0)
                return r;
        if (ret) {
                *ret = json_loadb(payload, h.length, 0, NULL);
                if (!*ret)
                        return -EPROTO;
        }
        return 0;
}

int driver_agent_resume(int chan, const char *id, int64_t deadline, char *why, size_t why_len) {
        uint8_t seed[64];
        if (getrandom(seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
                return -EIO;
        char hex[2 * sizeof(seed) + 1];
        for (size_t i = 0; i < sizeof(seed); i++)
                snprintf(hex + 2 * i, 3, "%02x", seed[i]);
        explicit_bzero(seed, sizeof(seed));
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        char req[512];
        int n = snprintf(req, sizeof(req), "{\"op\":\"resume\",\"entropy\":\"%s\",\"timeNs\":%lld,\"hostname\":\"%s\"}",
                         hex, (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, id);
        explicit_bzero(hex, sizeof(hex));
        if (n < 0 || (size_t)n >= sizeof(req))
                return -ENOBUFS;
        int r = proto_write_frame(chan, PROTO_OPEN, 0, 1, req, (size_t)n);
        explicit_bzero(req, sizeof(req));
        if (r < 0) {
                snprintf(why, why_len, "sending resume: %s", strerror(-r));
                return r;
        }
        json_t *res = NULL;
        r = driver_agent_read_frame(chan, PROTO_RESULT, 1, deadline, &res);
        if (r < 0) {
                snprintf(why, why_len, "the restored agent did not answer resume: %s", strerror(-r));
                return r;
        }
        json_t *err = json_object_get(res, "error");
        if (err) {
                snprintf(why, why_len, "resume refused: %s",
                         json_string_value(json_object_get(err, "message")) ?: "no message");
                json_decref(res);
                return -EIO;
        }
        json_decref(res);
        return 0;
}
