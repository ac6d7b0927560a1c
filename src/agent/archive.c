#include "agent/archive.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "agent/fsops.h"
#include "common/tar.h"
#include "common/io.h"
#include "common/macro.h"

#define IO_BUF (256u * 1024u)

typedef struct Sink {
        bool gzip;
        z_stream z;
        uint8_t *out;
} Sink;

static int sink_deflate(Sink *s, int flush) {
        do {
                s->z.next_out = s->out;
                s->z.avail_out = IO_BUF;
                int z = deflate(&s->z, flush);
                if (z == Z_STREAM_ERROR)
                        return -EIO;
                int k = io_write_all(1, s->out, IO_BUF - s->z.avail_out);
                if (k < 0)
                        return k;
        } while (s->z.avail_out == 0);
        return 0;
}

static int sink_write(void *userdata, const void *buf, size_t n) {
        Sink *s = userdata;
        if (!s->gzip)
                return io_write_all(1, buf, n);
        s->z.next_in = (Bytef *)buf;
        s->z.avail_in = (uInt)n;
        return sink_deflate(s, Z_NO_FLUSH);
}

static void say(const char *what, const char *why) {
        dprintf(2, "%s: %s\n", what, why);
}

/* The exit code of a failure that is the filesystem's answer (errno e):
 * the classes a client can act on, else FAILED. */
static int errno_code(int e) {
        switch (e) {
        case EACCES:
                return ARCHIVE_EXIT_PERMISSION;
        case ENOSPC:
        case EDQUOT:
                return ARCHIVE_EXIT_NO_SPACE;
        case ENOENT:
                return ARCHIVE_EXIT_NOT_FOUND;
        case ENOTDIR:
        case ELOOP:
        case EEXIST:
                return ARCHIVE_EXIT_NOT_A_DIRECTORY;
        default:
                return ARCHIVE_EXIT_FAILED;
        }
}

static int create(const AgentRequest *r) {
        _cleanup_close_ int fd = open(r->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
                int e = errno;
                say(r->path, strerror(e));
                return errno_code(e);
        }
        Sink s = { .gzip = r->gzip };
        if (s.gzip) {
                s.out = malloc(IO_BUF);
                if (!s.out || deflateInit2(&s.z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
                        say("gzip", "cannot start");
                        return ARCHIVE_EXIT_FAILED;
                }
        }
        int k = tar_create(fd, (const char *const *)r->argv, r->argc, sink_write, &s);
        if (k == 0 && s.gzip) {
                s.z.next_in = NULL;
                s.z.avail_in = 0;
                k = sink_deflate(&s, Z_FINISH);
        }
        if (s.gzip)
                deflateEnd(&s.z);
        free(s.out);
        if (k < 0) {
                say(r->path, strerror(-k));
                return ARCHIVE_EXIT_FAILED;
        }
        return ARCHIVE_EXIT_OK;
}

static int code_of(int k) {
        switch (k) {
        case -EACCES:
        case -ENOSPC:
        case -EDQUOT:
                return errno_code(-k);
        case -EBADMSG:
                return ARCHIVE_EXIT_MALFORMED;
        case -EPERM:
                return ARCHIVE_EXIT_REFUSED;
        case -EFBIG:
                return ARCHIVE_EXIT_TOO_LARGE;
        default:
                return ARCHIVE_EXIT_FAILED;
        }
}

static int extract(const AgentRequest *r) {
        int k = fsops_mkdir_p(r->path, 0755);
        if (k < 0) {
                say(r->path, strerror(-k));
                return errno_code(-k);
        }
        _cleanup_close_ int fd = open(r->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
                int e = errno;
                say(r->path, strerror(e));
                return errno_code(e);
        }
        TarLimits lim = { .max_bytes = r->max_bytes, .max_entries = r->max_entries };
        TarExtract *x = NULL;
        if (tar_extract_new(fd, &lim, &x) < 0) {
                say("unarchive", "out of memory");
                return ARCHIVE_EXIT_FAILED;
        }
        uint8_t *in = malloc(IO_BUF), *out = malloc(IO_BUF);
        z_stream z = { 0 };
        bool started = false, gz = false, zinit = false, zend = false;
        uint8_t head[2];
        size_t head_len = 0;
        k = in && out ? 0 : -ENOMEM;
        while (k == 0) {
                ssize_t n = read(0, in, IO_BUF);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        k = -errno;
                        break;
                }
                if (n == 0)
                        break;
                size_t off = 0;
                if (!started) {
                        /* gzip or plain tar, told by the first two bytes. */
                        while (head_len < 2 && off < (size_t)n)
                                head[head_len++] = in[off++];
                        if (head_len < 2)
                                continue;
                        started = true;
                        gz = head[0] == 0x1f && head[1] == 0x8b;
                        if (gz) {
                                if (inflateInit2(&z, 15 + 16) != Z_OK) {
                                        k = -ENOMEM;
                                        break;
                                }
                                zinit = true;
                        }
                        /* The two bytes held back go first. */
                        if (gz) {
                                z.next_in = head;
                                z.avail_in = 2;
                        } else if ((k = tar_extract_feed(x, head, 2)) < 0)
                                break;
                }
                if (!gz) {
                        k = tar_extract_feed(x, in + off, (size_t)n - off);
                        continue;
                }
                for (int pass = 0; pass < 2 && k == 0; pass++) {
                        if (pass == 1) {
                                z.next_in = in + off;
                                z.avail_in = (uInt)((size_t)n - off);
                        }
                        while (k == 0 && z.avail_in > 0 && !zend) {
                                z.next_out = out;
                                z.avail_out = IO_BUF;
                                int zr = inflate(&z, Z_NO_FLUSH);
                                if (zr != Z_OK && zr != Z_STREAM_END && !(zr == Z_BUF_ERROR && z.avail_out)) {
                                        k = -EBADMSG;
                                        snprintf((char *)out, 64, "the gzip stream is corrupt");
                                        break;
                                }
                                k = tar_extract_feed(x, out, IO_BUF - z.avail_out);
                                if (zr == Z_STREAM_END)
                                        zend = true;
                        }
                        if (pass == 0 && z.avail_in == 0)
                                continue;
                }
        }
        if (k == 0 && started && gz && !zend) {
                k = -EBADMSG;
                say("unarchive", "the gzip stream ends part way");
                tar_extract_free(x);
                inflateEnd(&z);
                free(in);
                free(out);
                return ARCHIVE_EXIT_MALFORMED;
        }
        if (k == 0)
                k = tar_extract_finish(x);
        if (k < 0) {
                const char *why = tar_extract_error(x);
                say("unarchive", why[0] ? why : k == -EBADMSG ? "the archive is malformed" : strerror(-k));
        } else
                dprintf(1, "{\"entries\":%llu,\"bytes\":%llu}\n", (unsigned long long)tar_extract_entries(x),
                        (unsigned long long)tar_extract_bytes(x));
        tar_extract_free(x);
        if (zinit)
                inflateEnd(&z);
        free(in);
        free(out);
        return k < 0 ? code_of(k) : ARCHIVE_EXIT_OK;
}

int archive_child(const AgentRequest *r) {
        return r->op == REQ_ARCHIVE ? create(r) : extract(r);
}
