#include "daemon/manager/console_tail.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"

/* Lines remembered while scanning; max_lines is clamped to this. */
#define TAIL_MAX_LINES 64u

typedef struct Span {
        size_t start, len;
} Span;

static bool is_break(uint8_t b) {
        return b == '\n' || b == '\r';
}

static bool blank(const uint8_t *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (p[i] != ' ' && p[i] != '\t')
                        return false;
        return true;
}

static bool cont(uint8_t b) {
        return (b & 0xc0) == 0x80;
}

/* Length of the valid UTF-8 sequence at p (n bytes left), 0 if invalid:
 * no overlong form, no surrogate, nothing past U+10FFFF (RFC 3629), as a
 * JSON encoder demands. */
static size_t utf8_seq(const uint8_t *p, size_t n) {
        uint8_t b = p[0];
        if (b < 0x80)
                return 1;
        if (b >= 0xc2 && b <= 0xdf)
                return n >= 2 && cont(p[1]) ? 2 : 0;
        if (b >= 0xe0 && b <= 0xef) {
                if (n < 3 || !cont(p[1]) || !cont(p[2]))
                        return 0;
                if ((b == 0xe0 && p[1] < 0xa0) || (b == 0xed && p[1] > 0x9f))
                        return 0;
                return 3;
        }
        if (b >= 0xf0 && b <= 0xf4) {
                if (n < 4 || !cont(p[1]) || !cont(p[2]) || !cont(p[3]))
                        return 0;
                if ((b == 0xf0 && p[1] < 0x90) || (b == 0xf4 && p[1] > 0x8f))
                        return 0;
                return 4;
        }
        return 0;
}

/* One line, sanitized, appended at out (room for 3 bytes per input byte). */
static size_t sanitize_line(const uint8_t *p, size_t n, char *out) {
        size_t o = 0;
        for (size_t i = 0; i < n;) {
                size_t k = utf8_seq(p + i, n - i);
                if (k == 0) {
                        memcpy(out + o, "\xef\xbf\xbd", 3); /* U+FFFD */
                        o += 3;
                        i++;
                } else if (k == 1) {
                        uint8_t b = p[i++];
                        out[o++] = b == '\t' ? ' ' : b < 0x20 || b == 0x7f ? '?' : (char)b;
                } else if (k == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0) {
                        out[o++] = '?'; /* C1 control, U+0080..U+009F */
                        i += 2;
                } else {
                        memcpy(out + o, p + i, k);
                        o += k;
                        i += k;
                }
        }
        while (o > 0 && out[o - 1] == ' ')
                o--;
        return o;
}

/* Lines that name why a kernel died; the register dump after them fills the
 * last lines, so the newest of these is kept in front of them. */
static const char *const headline_markers[] = {
        "Kernel panic", "BUG: ", "Oops", "general protection fault", "Unable to handle", "Out of memory",
};

static bool is_headline(const uint8_t *p, size_t n) {
        for (size_t i = 0; i < ELEMENTSOF(headline_markers); i++)
                if (memmem(p, n, headline_markers[i], strlen(headline_markers[i])))
                        return true;
        return false;
}

/* Sanitized lines joined with '\n' into out (room for 3 bytes per input byte
 * plus one per line); the length. */
static size_t join_lines(const uint8_t *in, const Span *ring, size_t ring_n, size_t first, size_t kept, char *out) {
        size_t len = 0;
        for (size_t i = 0; i < kept; i++) {
                const Span *s = &ring[(first + i) % ring_n];
                if (len > 0)
                        out[len++] = '\n';
                len += sanitize_line(in + s->start, s->len, out + len);
        }
        return len;
}

/* The start of the last `room` bytes of buf, moved to a character boundary
 * and, if one follows, past a line break. */
static size_t cut_front(const char *buf, size_t len, size_t room) {
        if (len <= room)
                return 0;
        size_t from = len - room;
        while (from < len && cont((uint8_t)buf[from]))
                from++;
        const char *nl = memchr(buf + from, '\n', len - from);
        if (nl && nl + 1 < buf + len)
                from = (size_t)(nl + 1 - buf);
        return from;
}

size_t console_tail_sanitize(const uint8_t *in, size_t n, unsigned max_lines, bool partial_first, char *out,
                             size_t out_size) {
        if (out_size == 0)
                return 0;
        out[0] = '\0';
        if (max_lines == 0 || !in || n == 0)
                return 0;
        if (max_lines > TAIL_MAX_LINES)
                max_lines = TAIL_MAX_LINES;

        size_t pos = 0;
        if (partial_first) {
                size_t i = 0;
                while (i < n && !is_break(in[i]))
                        i++;
                if (i < n)
                        pos = i + 1;
        }
        /* The last max_lines non-blank lines, in a ring, and the newest
         * headline with its line number. */
        Span ring[TAIL_MAX_LINES];
        size_t count = 0;
        Span head = {0, 0};
        size_t head_no = SIZE_MAX;
        while (pos < n) {
                size_t end = pos;
                while (end < n && !is_break(in[end]))
                        end++;
                if (!blank(in + pos, end - pos)) {
                        if (is_headline(in + pos, end - pos)) {
                                head = (Span){pos, end - pos};
                                head_no = count;
                        }
                        ring[count++ % max_lines] = (Span){pos, end - pos};
                }
                pos = end + 1;
        }
        size_t kept = count < max_lines ? count : max_lines;
        if (kept == 0)
                return 0;
        /* A headline already among the last lines needs no place of its own. */
        bool with_head = head_no != SIZE_MAX && head_no < count - kept && max_lines > 1;
        if (with_head)
                kept--;
        size_t first = count - kept;

        size_t total_in = head.len;
        for (size_t i = 0; i < kept; i++)
                total_in += ring[(first + i) % max_lines].len;
        _cleanup_free_ char *tmp = malloc(3 * total_in + kept + 2);
        if (!tmp)
                return 0;
        size_t room = out_size - 1, o = 0;
        if (with_head) {
                /* At most a quarter of the room, so the lines after it show. */
                size_t hlen = sanitize_line(in + head.start, head.len, tmp);
                size_t hroom = room / 4;
                if (hlen > hroom) {
                        hlen = hroom;
                        while (hlen > 0 && cont((uint8_t)tmp[hlen]))
                                hlen--;
                }
                if (hlen > 0 && hlen + 1 < room) {
                        memcpy(out, tmp, hlen);
                        o = hlen;
                        room -= hlen + 1;
                }
        }
        size_t len = join_lines(in, ring, max_lines, first, kept, tmp);
        size_t from = cut_front(tmp, len, room);
        if (o > 0 && len > from)
                out[o++] = '\n';
        memcpy(out + o, tmp + from, len - from);
        o += len - from;
        out[o] = '\0';
        return o;
}

int console_tail_read(const char *dir, const char *name, char *out, size_t out_size) {
        if (out_size == 0)
                return -EINVAL;
        out[0] = '\0';
        if (!dir || !name || !*name || strchr(name, '/'))
                return -EINVAL;
        _cleanup_close_ int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        _cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        off_t off = st.st_size > (off_t)CONSOLE_TAIL_READ ? st.st_size - (off_t)CONSOLE_TAIL_READ : 0;
        uint8_t buf[CONSOLE_TAIL_READ];
        size_t got = 0;
        while (got < sizeof buf) {
                ssize_t k = pread(fd, buf + got, sizeof buf - got, off + (off_t)got);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                if (k == 0)
                        break;
                got += (size_t)k;
        }
        console_tail_sanitize(buf, got, CONSOLE_TAIL_LINES, off > 0, out, out_size);
        return 0;
}
