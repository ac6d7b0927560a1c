#include "proto/proto.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/io.h"

struct ProtoReader {
        uint8_t *buf;
        size_t len;      /* bytes held */
        size_t cap;      /* allocated */
        size_t start;    /* bytes before it were handed out as frames */
        size_t consumed; /* bytes of the frame handed out by the last next() */
        int error;       /* sticky -EPROTO */
};

void proto_put_u32(uint8_t out[4], uint32_t v) {
        out[0] = (uint8_t)(v >> 24);
        out[1] = (uint8_t)(v >> 16);
        out[2] = (uint8_t)(v >> 8);
        out[3] = (uint8_t)v;
}

uint32_t proto_get_u32(const uint8_t in[4]) {
        return ((uint32_t)in[0] << 24) | ((uint32_t)in[1] << 16) | ((uint32_t)in[2] << 8) | (uint32_t)in[3];
}

static uint32_t max_length_for(uint8_t type) {
        switch (type) {
        case PROTO_DATA:
                return PROTO_MAX_PAYLOAD;
        case PROTO_WINDOW:
                return 4;
        case PROTO_EOF:
        case PROTO_CANCEL:
                return 0;
        case PROTO_DETACH:
                return PROTO_MAX_DETACH_TOKEN;
        default:
                return PROTO_MAX_JSON;
        }
}

static int header_valid(const ProtoHeader *h) {
        if (h->type == 0 || h->type >= _PROTO_TYPE_MAX)
                return 0;
        if (h->type == PROTO_WINDOW) {
                if (h->length != 4)
                        return 0;
        } else if (h->length > max_length_for(h->type))
                return 0;
        if (h->type == PROTO_DATA || h->type == PROTO_EOF) {
                if (h->flags > PROTO_FD_ERR)
                        return 0;
        } else if (h->flags != 0)
                return 0;
        int channel_level = h->type == PROTO_HELLO || h->type == PROTO_PING || h->type == PROTO_PONG ||
                            h->type == PROTO_DETACH || h->type == PROTO_ATTACH;
        if (channel_level != (h->stream == 0))
                return 0;
        return 1;
}

int proto_header_encode(const ProtoHeader *h, uint8_t out[PROTO_HEADER_SIZE]) {
        if (!h || !header_valid(h))
                return -EINVAL;
        proto_put_u32(out, h->length);
        proto_put_u32(out + 4, h->stream);
        out[8] = h->type;
        out[9] = h->flags;
        out[10] = 0;
        out[11] = 0;
        return 0;
}

int proto_header_decode(const uint8_t in[PROTO_HEADER_SIZE], ProtoHeader *ret) {
        ProtoHeader h = {
                .length = proto_get_u32(in),
                .stream = proto_get_u32(in + 4),
                .type = in[8],
                .flags = in[9],
        };
        if (in[10] != 0 || in[11] != 0 || !header_valid(&h))
                return -EPROTO;
        *ret = h;
        return 0;
}

ProtoReader *proto_reader_new(void) {
        return calloc(1, sizeof(ProtoReader));
}

void proto_reader_free(ProtoReader *r) {
        if (!r)
                return;
        free(r->buf);
        free(r);
}

/* The frame handed out last is done with: past it. Nothing moves here, so
 * that a read holding many frames costs no copy per frame; once all is
 * consumed the buffer simply starts over. */
static void reader_skip_consumed(ProtoReader *r) {
        r->start += r->consumed;
        r->consumed = 0;
        if (r->start == r->len)
                r->start = r->len = 0;
}

int proto_reader_feed(ProtoReader *r, const void *buf, size_t n) {
        if (r->error)
                return r->error;
        reader_skip_consumed(r);
        if (n == 0)
                return 0;
        if (r->start > 0) {
                /* What is left of the last read is at most part of one
                 * frame: moved once, to the front. */
                memmove(r->buf, r->buf + r->start, r->len - r->start);
                r->len -= r->start;
                r->start = 0;
        }
        if (r->len + n > r->cap) {
                size_t want = r->cap ? r->cap : 4096;
                while (want < r->len + n)
                        want *= 2;
                uint8_t *nb = realloc(r->buf, want);
                if (!nb)
                        return -ENOMEM;
                r->buf = nb;
                r->cap = want;
        }
        memcpy(r->buf + r->len, buf, n);
        r->len += n;
        return 0;
}

int proto_reader_next(ProtoReader *r, ProtoHeader *ret_header, const uint8_t **ret_payload) {
        if (r->error)
                return r->error;
        reader_skip_consumed(r);
        size_t avail = r->len - r->start;
        const uint8_t *p = r->buf + r->start;
        if (avail < PROTO_HEADER_SIZE)
                return 0;
        ProtoHeader h;
        if (proto_header_decode(p, &h) < 0) {
                r->error = -EPROTO;
                return r->error;
        }
        if (avail < PROTO_HEADER_SIZE + (size_t)h.length)
                return 0;
        r->consumed = PROTO_HEADER_SIZE + h.length;
        *ret_header = h;
        *ret_payload = p + PROTO_HEADER_SIZE;
        return 1;
}

int proto_frame_build(uint8_t type, uint8_t flags, uint32_t stream, const void *payload, size_t len,
                      uint8_t **ret_buf, size_t *ret_len) {
        if (len > PROTO_MAX_PAYLOAD || (len > 0 && !payload))
                return -EINVAL;
        ProtoHeader h = { .length = (uint32_t)len, .stream = stream, .type = type, .flags = flags };
        uint8_t *buf = malloc(PROTO_HEADER_SIZE + len);
        if (!buf)
                return -ENOMEM;
        int r = proto_header_encode(&h, buf);
        if (r < 0) {
                free(buf);
                return r;
        }
        if (len)
                memcpy(buf + PROTO_HEADER_SIZE, payload, len);
        *ret_buf = buf;
        *ret_len = PROTO_HEADER_SIZE + len;
        return 0;
}

/* Header and payload in one system call; after a short write, the rest. */
static int write_two(int fd, const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
        struct iovec iov[2] = {{.iov_base = (void *)a, .iov_len = an}, {.iov_base = (void *)b, .iov_len = bn}};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
        ssize_t w;
        do {
                w = sendmsg(fd, &mh, MSG_NOSIGNAL);
                if (w < 0 && errno == ENOTSOCK)
                        w = writev(fd, iov, 2);
        } while (w < 0 && errno == EINTR);
        if (w < 0)
                return -errno;
        size_t done = (size_t)w;
        if (done < an) {
                int r = io_send_all(fd, a + done, an - done);
                if (r < 0)
                        return r;
                done = an;
        }
        return io_send_all(fd, b + (done - an), bn - (done - an));
}

int proto_write_frame(int fd, uint8_t type, uint8_t flags, uint32_t stream, const void *payload,
                      size_t len) {
        if (len > PROTO_MAX_PAYLOAD || (len > 0 && !payload))
                return -EINVAL;
        ProtoHeader h = { .length = (uint32_t)len, .stream = stream, .type = type, .flags = flags };
        uint8_t hdr[PROTO_HEADER_SIZE];
        int r = proto_header_encode(&h, hdr);
        if (r < 0)
                return r;
        /* Small frames go out in one write so that concurrent writers holding
         * the channel's lock never interleave, and so the peer sees one chunk. */
        if (len <= 4096) {
                uint8_t one[PROTO_HEADER_SIZE + 4096];
                memcpy(one, hdr, PROTO_HEADER_SIZE);
                if (len)
                        memcpy(one + PROTO_HEADER_SIZE, payload, len);
                return io_send_all(fd, one, PROTO_HEADER_SIZE + len);
        }
        return write_two(fd, hdr, PROTO_HEADER_SIZE, payload, len);
}

const char *proto_type_name(uint8_t type) {
        static const char *const names[] = {
                [PROTO_HELLO] = "HELLO",   [PROTO_OPEN] = "OPEN",     [PROTO_DATA] = "DATA",
                [PROTO_EOF] = "EOF",       [PROTO_WINDOW] = "WINDOW", [PROTO_EVENT] = "EVENT",
                [PROTO_RESULT] = "RESULT", [PROTO_CANCEL] = "CANCEL", [PROTO_PING] = "PING",
                [PROTO_PONG] = "PONG",     [PROTO_DETACH] = "DETACH", [PROTO_ATTACH] = "ATTACH",
        };
        if (type == 0 || type >= _PROTO_TYPE_MAX)
                return "?";
        return names[type];
}
