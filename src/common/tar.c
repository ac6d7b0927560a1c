#include "common/tar.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"

#define BLOCK 512
/* A pax or long-name header's body: a path is at most PATH_MAX anyway. */
#define META_MAX (64u * 1024u)
#define NAME_MAX_BYTES 4096
/* Symbolic links wait for the end of the archive (a link made early could
 * be written through by a later member); at most this many. */
#define LINKS_MAX 100000
#define WALK_DEPTH_MAX 256

typedef enum { ST_HEADER, ST_BODY, ST_PAD, ST_END } State;
typedef enum { BODY_SKIP, BODY_FILE, BODY_META } BodyKind;

typedef struct PendingLink {
        char *path;   /* relative, normalised */
        char *target; /* as the archive says */
} PendingLink;

struct TarExtract {
        int root_fd;
        TarLimits lim;
        State state;
        uint8_t block[BLOCK];
        size_t block_len;
        unsigned zero_blocks;
        BodyKind body;
        uint64_t left, pad;
        int fd; /* the file being written */
        unsigned mode;
        char meta_kind;
        uint8_t *meta;
        size_t meta_len;
        char *pax_path, *pax_link;
        bool pax_has_size;
        uint64_t pax_size;
        PendingLink *links;
        size_t n_links;
        uint64_t entries, bytes;
        char error[256];
};

__attribute__((format(printf, 3, 4))) static int fail(TarExtract *x, int err, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->error, sizeof(x->error), fmt, ap);
        va_end(ap);
        return err;
}

int tar_extract_new(int root_fd, const TarLimits *lim, TarExtract **ret) {
        TarExtract *x = calloc(1, sizeof(*x));
        if (!x)
                return -ENOMEM;
        x->root_fd = root_fd;
        x->lim = *lim;
        x->fd = -1;
        *ret = x;
        return 0;
}

void tar_extract_free(TarExtract *x) {
        if (!x)
                return;
        if (x->fd >= 0)
                close(x->fd);
        free(x->meta);
        free(x->pax_path);
        free(x->pax_link);
        for (size_t i = 0; i < x->n_links; i++) {
                free(x->links[i].path);
                free(x->links[i].target);
        }
        free(x->links);
        free(x);
}

const char *tar_extract_error(const TarExtract *x) {
        return x->error;
}

uint64_t tar_extract_entries(const TarExtract *x) {
        return x->entries;
}

uint64_t tar_extract_bytes(const TarExtract *x) {
        return x->bytes;
}

/* A NUL-or-end terminated field, copied. */
static char *field(const uint8_t *p, size_t n) {
        size_t len = strnlen((const char *)p, n);
        return strndup((const char *)p, len);
}

static int octal(const uint8_t *p, size_t n, uint64_t *ret) {
        if (p[0] & 0x80) {
                /* GNU base-256, for sizes of 8 GiB and more: positive only. */
                if (p[0] != 0x80)
                        return -EBADMSG;
                uint64_t v = 0;
                for (size_t i = 1; i < n; i++) {
                        if (v >> 56)
                                return -EBADMSG;
                        v = (v << 8) | p[i];
                }
                *ret = v;
                return 0;
        }
        size_t i = 0;
        while (i < n && p[i] == ' ')
                i++;
        uint64_t v = 0;
        bool any = false;
        for (; i < n && p[i] >= '0' && p[i] <= '7'; i++) {
                if (v >> 60)
                        return -EBADMSG;
                v = v * 8 + (uint64_t)(p[i] - '0');
                any = true;
        }
        for (; i < n; i++)
                if (p[i] != ' ' && p[i] != '\0')
                        return -EBADMSG;
        *ret = any ? v : 0;
        return 0;
}

static bool checksum_ok(const uint8_t *h) {
        uint64_t want;
        if (octal(h + 148, 8, &want) < 0)
                return false;
        unsigned long u = 0;
        long s = 0;
        for (size_t i = 0; i < BLOCK; i++) {
                uint8_t c = i >= 148 && i < 156 ? ' ' : h[i];
                u += c;
                s += (int8_t)c;
        }
        return want == u || (long)want == s;
}

/* Normalises a member name into "a/b/c": no leading "./" or "/", no empty
 * or "." parts. -EPERM for an absolute name or a ".." part. An empty
 * result is the root itself. */
static int normalise(const char *in, char **ret) {
        if (in[0] == '/')
                return -EPERM;
        size_t n = strlen(in);
        if (n > NAME_MAX_BYTES)
                return -EBADMSG;
        char *out = malloc(n + 1);
        if (!out)
                return -ENOMEM;
        size_t o = 0;
        const char *p = in;
        while (*p) {
                const char *e = strchr(p, '/');
                size_t len = e ? (size_t)(e - p) : strlen(p);
                if (len == 2 && p[0] == '.' && p[1] == '.') {
                        free(out);
                        return -EPERM;
                }
                if (len > 0 && !(len == 1 && p[0] == '.')) {
                        if (o)
                                out[o++] = '/';
                        memcpy(out + o, p, len);
                        o += len;
                }
                p += len;
                if (*p == '/')
                        p++;
        }
        out[o] = '\0';
        *ret = out;
        return 0;
}

/* Opens the directory that holds rel's last part, walking from the root
 * without following any link; with create, missing directories are made.
 * *ret_last points into rel. */
static int open_parent_nofollow(int root_fd, char *rel, bool create, int *ret_fd, const char **ret_last) {
        int fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return -errno;
        char *p = rel;
        for (;;) {
                char *slash = strchr(p, '/');
                if (!slash)
                        break;
                *slash = '\0';
                if (create && mkdirat(fd, p, 0755) < 0 && errno != EEXIST) {
                        int k = -errno;
                        *slash = '/';
                        close(fd);
                        return k;
                }
                int next = openat(fd, p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                int k = next < 0 ? -errno : 0;
                *slash = '/';
                close(fd);
                if (k < 0)
                        /* A link or a file in the way: never written through. */
                        return k == -ELOOP || k == -ENOTDIR ? -EPERM : k;
                fd = next;
                p = slash + 1;
        }
        *ret_fd = fd;
        *ret_last = p;
        return 0;
}

/* Removes what is at name unless it is a directory (kept and merged). */
static int clear_entry(int dir_fd, const char *name, bool *ret_is_dir) {
        struct stat st;
        *ret_is_dir = false;
        if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (S_ISDIR(st.st_mode)) {
                *ret_is_dir = true;
                return 0;
        }
        return unlinkat(dir_fd, name, 0) < 0 ? -errno : 0;
}

static int member(TarExtract *x, char type, const char *name_in, const char *link_in, uint64_t size) {
        _cleanup_free_ char *rel = NULL;
        int k = normalise(name_in, &rel);
        if (k == -EPERM)
                return fail(x, k, "refusing a member outside the target: %.160s", name_in);
        if (k < 0)
                return k == -EBADMSG ? fail(x, k, "a member's name is too long") : k;
        if (++x->entries > x->lim.max_entries)
                return fail(x, -EFBIG, "the archive has more members than allowed");
        if (type == '3' || type == '4' || type == '6')
                return fail(x, -EPERM, "refusing a device or FIFO member: %.160s", name_in);
        if (type != '0' && type != '7' && type != '5' && type != '1' && type != '2')
                return fail(x, -EBADMSG, "unsupported member type for %.160s", name_in);
        if (rel[0] == '\0') {
                if (type == '5')
                        return 0; /* the target itself */
                return fail(x, -EPERM, "refusing a member that replaces the target: %.160s", name_in);
        }
        if (type == '2') {
                if (x->n_links >= LINKS_MAX)
                        return fail(x, -EFBIG, "the archive has more links than allowed");
                if (!(x->n_links & (x->n_links + 1))) {
                        PendingLink *l = realloc(x->links, (x->n_links * 2 + 1) * sizeof(*l));
                        if (!l)
                                return -ENOMEM;
                        x->links = l;
                }
                char *target = strdup(link_in);
                if (!target)
                        return -ENOMEM;
                x->links[x->n_links++] = (PendingLink){ .path = TAKE_PTR(rel), .target = target };
                return 0;
        }
        int dir_fd;
        const char *last;
        k = open_parent_nofollow(x->root_fd, rel, true, &dir_fd, &last);
        if (k == -EPERM)
                return fail(x, k, "refusing a member that passes through a link: %.160s", name_in);
        if (k < 0)
                return k;
        _cleanup_close_ int dfd = dir_fd;
        bool is_dir;
        if ((k = clear_entry(dfd, last, &is_dir)) < 0)
                return k;
        if (type == '5') {
                if (!is_dir && mkdirat(dfd, last, (x->mode & 0777) | 0700) < 0 && errno != EEXIST)
                        return -errno;
                return 0;
        }
        if (is_dir)
                return fail(x, -EPERM, "refusing a file where the target has a directory: %.160s", name_in);
        if (type == '1') {
                _cleanup_free_ char *src = NULL;
                k = normalise(link_in, &src);
                if (k < 0 || src[0] == '\0')
                        return k == -ENOMEM ? k : fail(x, -EPERM, "refusing a hard link that leads outside: %.160s", name_in);
                int sdir;
                const char *slast;
                k = open_parent_nofollow(x->root_fd, src, false, &sdir, &slast);
                if (k < 0)
                        return fail(x, -EPERM, "refusing a hard link to a file the archive does not carry: %.160s",
                                    name_in);
                _cleanup_close_ int sfd = sdir;
                struct stat st;
                if (fstatat(sfd, slast, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
                        return fail(x, -EPERM, "refusing a hard link to a file the archive does not carry: %.160s",
                                    name_in);
                return linkat(sfd, slast, dfd, last, 0) < 0 ? -errno : 0;
        }
        if (size > x->lim.max_bytes || x->bytes + size > x->lim.max_bytes)
                return fail(x, -EFBIG, "the archive's files are larger than allowed");
        x->fd = openat(dfd, last, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (x->fd < 0)
                return -errno;
        x->body = BODY_FILE;
        return 0;
}

/* "len key=value\n" records; path, linkpath and size are kept. */
static int pax_parse(TarExtract *x, const uint8_t *p, size_t n) {
        size_t i = 0;
        while (i < n) {
                size_t len = 0, j = i;
                while (j < n && p[j] >= '0' && p[j] <= '9' && len < META_MAX)
                        len = len * 10 + (size_t)(p[j++] - '0');
                if (j >= n || p[j] != ' ' || len == 0 || len > n - i || p[i + len - 1] != '\n')
                        return fail(x, -EBADMSG, "the archive has a malformed pax header");
                const uint8_t *kv = p + j + 1, *end = p + i + len - 1;
                const uint8_t *eq = memchr(kv, '=', (size_t)(end - kv));
                if (!eq)
                        return fail(x, -EBADMSG, "the archive has a malformed pax header");
                size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
                char **slot = NULL;
                if (klen == 4 && memcmp(kv, "path", 4) == 0)
                        slot = &x->pax_path;
                else if (klen == 8 && memcmp(kv, "linkpath", 8) == 0)
                        slot = &x->pax_link;
                else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
                        uint64_t v = 0;
                        if (vlen == 0 || vlen > 19)
                                return fail(x, -EBADMSG, "the archive has a malformed pax size");
                        for (size_t q = 0; q < vlen; q++) {
                                if (eq[1 + q] < '0' || eq[1 + q] > '9')
                                        return fail(x, -EBADMSG, "the archive has a malformed pax size");
                                v = v * 10 + (uint64_t)(eq[1 + q] - '0');
                        }
                        x->pax_size = v;
                        x->pax_has_size = true;
                }
                if (slot) {
                        if (memchr(eq + 1, '\0', vlen))
                                return fail(x, -EBADMSG, "the archive has a NUL in a pax name");
                        free(*slot);
                        *slot = strndup((const char *)eq + 1, vlen);
                        if (!*slot)
                                return -ENOMEM;
                }
                i += len;
        }
        return 0;
}

static int header(TarExtract *x, const uint8_t *h) {
        if (!checksum_ok(h))
                return fail(x, -EBADMSG, "the archive has a header with a bad checksum");
        uint64_t size, mode;
        if (octal(h + 124, 12, &size) < 0 || octal(h + 100, 8, &mode) < 0)
                return fail(x, -EBADMSG, "the archive has a malformed header");
        char type = h[156] ? (char)h[156] : '0';
        if (x->pax_has_size && type != 'x' && type != 'g' && type != 'L' && type != 'K')
                size = x->pax_size;
        x->left = size;
        x->pad = (BLOCK - size % BLOCK) % BLOCK;
        x->body = BODY_SKIP;
        x->mode = (unsigned)mode;
        if (type == 'x' || type == 'L' || type == 'K') {
                if (size > META_MAX)
                        return fail(x, -EFBIG, "the archive has oversized name metadata");
                x->body = BODY_META;
                x->meta_kind = type;
                x->meta_len = 0;
                free(x->meta);
                x->meta = malloc(size + 1);
                return x->meta ? 0 : -ENOMEM;
        }
        if (type == 'g')
                return size > META_MAX ? fail(x, -EFBIG, "the archive has oversized metadata") : 0;
        _cleanup_free_ char *name = NULL, *link = NULL;
        if (x->pax_path)
                name = TAKE_PTR(x->pax_path);
        else {
                _cleanup_free_ char *base = field(h, 100), *prefix = NULL;
                if (!base)
                        return -ENOMEM;
                if (memcmp(h + 257, "ustar", 5) == 0 && h[345]) {
                        prefix = field(h + 345, 155);
                        if (!prefix || asprintf(&name, "%s/%s", prefix, base) < 0)
                                return -ENOMEM;
                } else
                        name = TAKE_PTR(base);
        }
        link = x->pax_link ? TAKE_PTR(x->pax_link) : field(h + 157, 100);
        x->pax_has_size = false;
        if (!name || !link)
                return -ENOMEM;
        int k = member(x, type, name, link, size);
        if (k < 0)
                return k;
        if (x->body == BODY_FILE)
                x->bytes += size;
        return 0;
}

static int body_done(TarExtract *x) {
        if (x->body == BODY_FILE) {
                int k = 0;
                if (fchmod(x->fd, x->mode & 0777) < 0)
                        k = -errno;
                if (close(x->fd) < 0 && k == 0)
                        k = -errno;
                x->fd = -1;
                return k;
        }
        if (x->body == BODY_META) {
                x->meta[x->meta_len] = '\0';
                int k = 0;
                if (x->meta_kind == 'x')
                        k = pax_parse(x, x->meta, x->meta_len);
                else {
                        char **slot = x->meta_kind == 'L' ? &x->pax_path : &x->pax_link;
                        free(*slot);
                        *slot = strndup((const char *)x->meta, x->meta_len);
                        if (!*slot)
                                k = -ENOMEM;
                }
                free(x->meta);
                x->meta = NULL;
                return k;
        }
        return 0;
}

int tar_extract_feed(TarExtract *x, const uint8_t *buf, size_t n) {
        while (n > 0) {
                switch (x->state) {
                case ST_END:
                        return 0; /* what follows the end (a record's padding) is not read */
                case ST_HEADER: {
                        size_t take = BLOCK - x->block_len < n ? BLOCK - x->block_len : n;
                        memcpy(x->block + x->block_len, buf, take);
                        x->block_len += take;
                        buf += take;
                        n -= take;
                        if (x->block_len < BLOCK)
                                return 0;
                        x->block_len = 0;
                        bool zero = true;
                        for (size_t i = 0; i < BLOCK && zero; i++)
                                zero = x->block[i] == 0;
                        if (zero) {
                                if (++x->zero_blocks == 2)
                                        x->state = ST_END;
                                continue;
                        }
                        if (x->zero_blocks)
                                return fail(x, -EBADMSG, "the archive has data after its end");
                        int k = header(x, x->block);
                        if (k < 0)
                                return k;
                        x->state = ST_BODY;
                        if (x->left == 0) {
                                if ((k = body_done(x)) < 0)
                                        return k;
                                x->state = x->pad ? ST_PAD : ST_HEADER;
                        }
                        break;
                }
                case ST_BODY: {
                        size_t take = x->left < n ? (size_t)x->left : n;
                        if (x->body == BODY_FILE) {
                                const uint8_t *p = buf;
                                size_t m = take;
                                while (m > 0) {
                                        ssize_t w = write(x->fd, p, m);
                                        if (w < 0 && errno == EINTR)
                                                continue;
                                        if (w <= 0)
                                                return w < 0 ? -errno : -EIO;
                                        p += w;
                                        m -= (size_t)w;
                                }
                        } else if (x->body == BODY_META) {
                                memcpy(x->meta + x->meta_len, buf, take);
                                x->meta_len += take;
                        }
                        buf += take;
                        n -= take;
                        x->left -= take;
                        if (x->left == 0) {
                                int k = body_done(x);
                                if (k < 0)
                                        return k;
                                x->state = x->pad ? ST_PAD : ST_HEADER;
                        }
                        break;
                }
                case ST_PAD: {
                        size_t take = x->pad < n ? (size_t)x->pad : n;
                        buf += take;
                        n -= take;
                        x->pad -= take;
                        if (x->pad == 0)
                                x->state = ST_HEADER;
                        break;
                }
                }
        }
        return 0;
}

/* Whether a link at path (relative, normalised) to target stays inside the
 * root: not absolute, never above the root, and no part of the way before
 * its last step a link (links are checked once all exist). */
static int link_stays_inside(int root_fd, const char *path, const char *target) {
        if (target[0] == '/' || target[0] == '\0')
                return 0;
        _cleanup_free_ char *walk = NULL;
        size_t cap = strlen(path) + strlen(target) + 2;
        walk = malloc(cap);
        if (!walk)
                return -ENOMEM;
        /* The link's directory. */
        snprintf(walk, cap, "%s", path);
        char *slash = strrchr(walk, '/');
        if (slash)
                *slash = '\0';
        else
                walk[0] = '\0';
        const char *p = target;
        while (*p) {
                const char *e = strchr(p, '/');
                size_t len = e ? (size_t)(e - p) : strlen(p);
                bool last = !e || e[1 + strspn(e + 1, "/")] == '\0';
                if (len == 2 && p[0] == '.' && p[1] == '.') {
                        if (walk[0] == '\0')
                                return 0;
                        char *s = strrchr(walk, '/');
                        if (s)
                                *s = '\0';
                        else
                                walk[0] = '\0';
                } else if (len > 0 && !(len == 1 && p[0] == '.')) {
                        size_t w = strlen(walk);
                        if (w)
                                walk[w++] = '/';
                        memcpy(walk + w, p, len);
                        walk[w + len] = '\0';
                        if (!last) {
                                struct stat st;
                                if (fstatat(root_fd, walk, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
                                        return 0;
                        }
                }
                p += len;
                while (*p == '/')
                        p++;
        }
        return 1;
}

static void unlink_links(TarExtract *x, size_t made) {
        for (size_t i = 0; i < made; i++)
                (void)unlinkat(x->root_fd, x->links[i].path, 0);
}

int tar_extract_finish(TarExtract *x) {
        if (x->state != ST_END && !(x->state == ST_HEADER && x->zero_blocks == 1 && x->block_len == 0))
                return fail(x, -EBADMSG, "the archive ends part way");
        /* Links are all made or none: each is checked before any is made,
         * and again once all exist (one may lead through another). */
        for (size_t i = 0; i < x->n_links; i++) {
                int k = link_stays_inside(x->root_fd, x->links[i].path, x->links[i].target);
                if (k < 0)
                        return k;
                if (k == 0)
                        return fail(x, -EPERM, "refusing a link that leads outside the target: %.160s",
                                    x->links[i].path);
        }
        size_t made = 0;
        int k = 0;
        for (; made < x->n_links && k == 0; made++) {
                _cleanup_free_ char *rel = strdup(x->links[made].path);
                if (!rel) {
                        k = -ENOMEM;
                        break;
                }
                int dir_fd;
                const char *last;
                k = open_parent_nofollow(x->root_fd, rel, true, &dir_fd, &last);
                if (k == -EPERM)
                        k = fail(x, k, "refusing a member that passes through a link: %.160s", x->links[made].path);
                if (k < 0)
                        break;
                _cleanup_close_ int dfd = dir_fd;
                bool is_dir;
                if ((k = clear_entry(dfd, last, &is_dir)) < 0)
                        break;
                if (is_dir) {
                        k = fail(x, -EPERM, "refusing a link where the target has a directory: %.160s",
                                 x->links[made].path);
                        break;
                }
                if (symlinkat(x->links[made].target, dfd, last) < 0) {
                        k = -errno;
                        break;
                }
        }
        for (size_t i = 0; k == 0 && i < x->n_links; i++) {
                k = link_stays_inside(x->root_fd, x->links[i].path, x->links[i].target);
                if (k == 0)
                        k = fail(x, -EPERM, "refusing a link that leads outside the target: %.160s", x->links[i].path);
                else if (k > 0)
                        k = 0;
        }
        if (k < 0)
                unlink_links(x, made);
        return k;
}

/* ---- the writer ---- */

typedef struct HardLink {
        dev_t dev;
        ino_t ino;
        char *name;
} HardLink;

typedef struct Writer {
        TarWriteFn write_fn;
        void *userdata;
        const char *const *exclude;
        size_t n_exclude;
        HardLink *links;
        size_t n_links, cap_links;
        uint8_t *buf;
} Writer;

#define COPY_BUF (256u * 1024u)
#define HARDLINKS_MAX 100000

static void put_octal(uint8_t *p, size_t n, uint64_t v) {
        /* n-1 digits and a NUL. */
        p[n - 1] = '\0';
        for (size_t i = n - 1; i-- > 0;) {
                p[i] = (uint8_t)('0' + (v & 7));
                v >>= 3;
        }
}

static int emit_header(Writer *w, const char *name, char type, unsigned mode, uint64_t size, int64_t mtime,
                       const char *link) {
        /* Names and links longer than their fields, and sizes past the
         * octal field, go in a pax header before the member. */
        size_t nlen = strlen(name), llen = link ? strlen(link) : 0;
        bool big = size > 077777777777ULL;
        if (nlen > 100 || llen > 100 || big) {
                char rec[3 * (NAME_MAX_BYTES + 32)];
                size_t o = 0;
                const char *keys[3] = { nlen > 100 ? "path" : NULL, llen > 100 ? "linkpath" : NULL,
                                        big ? "size" : NULL };
                char sizebuf[24];
                snprintf(sizebuf, sizeof(sizebuf), "%llu", (unsigned long long)size);
                const char *vals[3] = { name, link, sizebuf };
                for (int i = 0; i < 3; i++) {
                        if (!keys[i])
                                continue;
                        size_t body = strlen(keys[i]) + strlen(vals[i]) + 3; /* ' ', '=', '\n' */
                        size_t len = body + 1;
                        while (len != body + (size_t)snprintf(NULL, 0, "%zu", len))
                                len = body + (size_t)snprintf(NULL, 0, "%zu", len);
                        if (o + len >= sizeof(rec))
                                return -ENAMETOOLONG;
                        o += (size_t)snprintf(rec + o, sizeof(rec) - o, "%zu %s=%s\n", len, keys[i], vals[i]);
                }
                int k = emit_header(w, "././@PaxHeader", 'x', 0644, o, mtime, NULL);
                if (k < 0)
                        return k;
                uint8_t pad[BLOCK] = { 0 };
                if ((k = w->write_fn(w->userdata, rec, o)) < 0)
                        return k;
                if (o % BLOCK && (k = w->write_fn(w->userdata, pad, BLOCK - o % BLOCK)) < 0)
                        return k;
        }
        uint8_t h[BLOCK] = { 0 };
        memcpy(h, name, nlen > 100 ? 100 : nlen);
        put_octal(h + 100, 8, mode & 07777);
        put_octal(h + 108, 8, 0);
        put_octal(h + 116, 8, 0);
        put_octal(h + 124, 12, big ? 0 : size);
        put_octal(h + 136, 12, mtime > 0 ? (uint64_t)mtime : 0);
        h[156] = (uint8_t)type;
        if (link)
                memcpy(h + 157, link, llen > 100 ? 100 : llen);
        memcpy(h + 257, "ustar", 6);
        memcpy(h + 263, "00", 2);
        memset(h + 148, ' ', 8);
        unsigned sum = 0;
        for (size_t i = 0; i < BLOCK; i++)
                sum += h[i];
        snprintf((char *)h + 148, 8, "%06o", sum);
        h[155] = ' ';
        return w->write_fn(w->userdata, h, BLOCK);
}

static bool excluded(const Writer *w, const char *rel) {
        for (size_t i = 0; i < w->n_exclude; i++)
                if (strcmp(w->exclude[i], rel) == 0)
                        return true;
        return false;
}

static int emit_file(Writer *w, int dir_fd, const char *name, const char *arc, const struct stat *st) {
        _cleanup_close_ int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOENT ? 0 : -errno; /* gone meanwhile */
        int k = emit_header(w, arc, '0', st->st_mode, (uint64_t)st->st_size, st->st_mtim.tv_sec, NULL);
        if (k < 0)
                return k;
        /* The header said the size: a file that shrinks as it is read is
         * padded with zeros, one that grows is cut, so the stream stays whole. */
        uint64_t left = (uint64_t)st->st_size;
        while (left > 0) {
                size_t want = left < COPY_BUF ? (size_t)left : COPY_BUF;
                ssize_t n = read(fd, w->buf, want);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0) {
                        memset(w->buf, 0, want);
                        n = (ssize_t)want;
                }
                if ((k = w->write_fn(w->userdata, w->buf, (size_t)n)) < 0)
                        return k;
                left -= (uint64_t)n;
        }
        uint8_t pad[BLOCK] = { 0 };
        size_t rest = (size_t)((uint64_t)st->st_size % BLOCK);
        return rest ? w->write_fn(w->userdata, pad, BLOCK - rest) : 0;
}

static int walk(Writer *w, int dir_fd, const char *rel, unsigned depth) {
        if (depth > WALK_DEPTH_MAX)
                return -ELOOP;
        int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        DIR *d = fdopendir(fd);
        if (!d) {
                int k = -errno;
                close(fd);
                return k;
        }
        int k = 0;
        struct dirent *de;
        while (k == 0 && (errno = 0, de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                _cleanup_free_ char *sub = NULL;
                if (asprintf(&sub, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name) < 0) {
                        k = -ENOMEM;
                        break;
                }
                if (excluded(w, sub))
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                _cleanup_free_ char *arc = NULL;
                if (asprintf(&arc, "./%s%s", sub, S_ISDIR(st.st_mode) ? "/" : "") < 0) {
                        k = -ENOMEM;
                        break;
                }
                if (S_ISDIR(st.st_mode)) {
                        k = emit_header(w, arc, '5', st.st_mode, 0, st.st_mtim.tv_sec, NULL);
                        int sfd = k == 0 ? openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                                         : -1;
                        if (sfd >= 0) {
                                k = walk(w, sfd, sub, depth + 1);
                                close(sfd);
                        }
                } else if (S_ISLNK(st.st_mode)) {
                        char target[NAME_MAX_BYTES + 1];
                        ssize_t n = readlinkat(dirfd(d), de->d_name, target, sizeof(target) - 1);
                        if (n < 0)
                                continue;
                        target[n] = '\0';
                        k = emit_header(w, arc, '2', 0777, 0, st.st_mtim.tv_sec, target);
                } else if (S_ISREG(st.st_mode)) {
                        const char *first = NULL;
                        if (st.st_nlink > 1)
                                for (size_t i = 0; i < w->n_links && !first; i++)
                                        if (w->links[i].dev == st.st_dev && w->links[i].ino == st.st_ino)
                                                first = w->links[i].name;
                        if (first) {
                                k = emit_header(w, arc, '1', st.st_mode, 0, st.st_mtim.tv_sec, first);
                                continue;
                        }
                        if (st.st_nlink > 1 && w->n_links < HARDLINKS_MAX) {
                                if (w->n_links == w->cap_links) {
                                        size_t cap = w->cap_links ? w->cap_links * 2 : 64;
                                        HardLink *l = realloc(w->links, cap * sizeof(*l));
                                        if (!l) {
                                                k = -ENOMEM;
                                                break;
                                        }
                                        w->links = l;
                                        w->cap_links = cap;
                                }
                                char *copy = strdup(arc);
                                if (!copy) {
                                        k = -ENOMEM;
                                        break;
                                }
                                w->links[w->n_links++] = (HardLink){ st.st_dev, st.st_ino, copy };
                        }
                        k = emit_file(w, dirfd(d), de->d_name, arc, &st);
                }
                /* Sockets, FIFOs and devices are not carried. */
        }
        if (k == 0 && errno)
                k = -errno;
        closedir(d);
        return k;
}

int tar_create(int dir_fd, const char *const *exclude, size_t n_exclude, TarWriteFn write_fn, void *userdata) {
        Writer w = { .write_fn = write_fn, .userdata = userdata, .exclude = exclude, .n_exclude = n_exclude };
        struct stat st;
        if (fstat(dir_fd, &st) < 0)
                return -errno;
        w.buf = malloc(COPY_BUF);
        if (!w.buf)
                return -ENOMEM;
        int k = emit_header(&w, "./", '5', st.st_mode, 0, st.st_mtim.tv_sec, NULL);
        if (k == 0)
                k = walk(&w, dir_fd, "", 0);
        if (k == 0) {
                uint8_t end[2 * BLOCK] = { 0 };
                k = write_fn(userdata, end, sizeof(end));
        }
        for (size_t i = 0; i < w.n_links; i++)
                free(w.links[i].name);
        free(w.links);
        free(w.buf);
        return k;
}

int tar_write_entry(TarWriteFn write_fn, void *userdata, const char *name, char type, unsigned mode, const void *data,
                    size_t len) {
        if ((type != '0' && type != '5') || (type == '5' && len) || strlen(name) > NAME_MAX_BYTES)
                return -EINVAL;
        Writer w = { .write_fn = write_fn, .userdata = userdata };
        int k = emit_header(&w, name, type, mode, len, 0, NULL);
        if (k == 0 && len)
                k = write_fn(userdata, data, len);
        if (k == 0 && len % BLOCK) {
                uint8_t pad[BLOCK] = { 0 };
                k = write_fn(userdata, pad, BLOCK - len % BLOCK);
        }
        return k;
}

int tar_write_end(TarWriteFn write_fn, void *userdata) {
        uint8_t end[2 * BLOCK] = { 0 };
        return write_fn(userdata, end, sizeof(end));
}
