#include "agent/user.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"

bool user_name_valid(const char *name) {
        size_t n = strlen(name);
        if (n == 0 || n > USER_NAME_MAX || !((name[0] >= 'a' && name[0] <= 'z') || name[0] == '_'))
                return false;
        for (size_t i = 1; i < n; i++) {
                char c = name[i];
                if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
                        return false;
        }
        return true;
}

/* A decimal id of a passwd field: digits only, at most USER_ID_MAX. */
static int parse_id(const char *s, size_t len, unsigned *ret) {
        if (len == 0 || len > 5)
                return -ERANGE;
        unsigned v = 0;
        for (size_t i = 0; i < len; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return -ERANGE;
                v = v * 10 + (unsigned)(s[i] - '0');
        }
        if (v > USER_ID_MAX)
                return -ERANGE;
        *ret = v;
        return 0;
}

int user_parse_passwd(const char *buf, size_t len, const char *name, AgentUser *ret) {
        size_t name_len = strlen(name);
        const char *p = buf, *end = buf + len;
        while (p < end) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                const char *line_end = nl ? nl : end;
                /* name:password:uid:gid:gecos:home:shell */
                const char *f[7];
                size_t fl[7], n = 0;
                const char *q = p;
                while (n < 7) {
                        const char *c = memchr(q, ':', (size_t)(line_end - q));
                        const char *fe = c && n < 6 ? c : line_end;
                        f[n] = q;
                        fl[n] = (size_t)(fe - q);
                        n++;
                        if (fe == line_end)
                                break;
                        q = fe + 1;
                }
                if (n >= 6 && fl[0] == name_len && memcmp(f[0], name, name_len) == 0) {
                        AgentUser u = { 0 };
                        unsigned uid, gid;
                        if (parse_id(f[2], fl[2], &uid) < 0 || parse_id(f[3], fl[3], &gid) < 0)
                                return -ERANGE;
                        if (fl[5] == 0 || fl[5] >= sizeof(u.home) || f[5][0] != '/' || memchr(f[5], '\0', fl[5]))
                                return -ERANGE;
                        memcpy(u.name, name, name_len);
                        memcpy(u.home, f[5], fl[5]);
                        u.uid = uid;
                        u.gid = gid;
                        *ret = u;
                        return 0;
                }
                p = nl ? nl + 1 : end;
        }
        return -ENOENT;
}

int user_read_db(const char *path, char **ret, size_t *ret_len) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return errno == ENOENT ? -ENOENT : -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -ENOENT;
        size_t cap = st.st_size > 0 && (uint64_t)st.st_size < USER_PASSWD_MAX ? (size_t)st.st_size : USER_PASSWD_MAX;
        _cleanup_free_ char *buf = malloc(cap);
        if (!buf)
                return -ENOMEM;
        size_t len = 0;
        int r = io_read_full(fd, buf, cap, &len);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(buf);
        *ret_len = len;
        return 0;
}

/* The entries found lately, each with what the file was when it was read:
 * every exec names its user, and a stat costs less than reading and
 * parsing the file again (in gVisor, 0.2-0.3 ms an exec). Any change of the
 * file (a write, a rename over it, a change of its metadata) changes its
 * identity, size or times (nanoseconds), and the file is read again. */
#define USER_FOUND_MAX 4
#define USER_SETTLED_MS 100
typedef struct FoundUser {
        dev_t dev;
        ino_t ino;
        off_t size;
        struct timespec mtime, ctime;
        char path[32];
        AgentUser user;
} FoundUser;
static FoundUser found[USER_FOUND_MAX];
static size_t n_found, next_found;
static pthread_mutex_t found_lock = PTHREAD_MUTEX_INITIALIZER;

static bool same_file(const FoundUser *f, const char *path, const char *name, const struct stat *st) {
        return strcmp(f->path, path) == 0 && strcmp(f->user.name, name) == 0 && f->dev == st->st_dev &&
               f->ino == st->st_ino && f->size == st->st_size && f->mtime.tv_sec == st->st_mtim.tv_sec &&
               f->mtime.tv_nsec == st->st_mtim.tv_nsec && f->ctime.tv_sec == st->st_ctim.tv_sec &&
               f->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

int user_lookup(const char *path, const char *name, AgentUser *ret) {
        struct stat st;
        bool known = strlen(path) < sizeof found[0].path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
        if (known) {
                pthread_mutex_lock(&found_lock);
                bool hit = false;
                for (size_t i = 0; i < n_found && !hit; i++)
                        if ((hit = same_file(&found[i], path, name, &st)))
                                *ret = found[i].user;
                pthread_mutex_unlock(&found_lock);
                if (hit)
                        return 0;
        }
        _cleanup_free_ char *buf = NULL;
        size_t len = 0;
        int r = user_read_db(path, &buf, &len);
        if (r < 0)
                return r;
        if ((r = user_parse_passwd(buf, len, name, ret)) < 0 || !known)
                return r;
        /* Kept with the identity stat gave before the read: a change in
         * between makes the next stat differ, and the file is read again.
         * Only a file last changed USER_SETTLED_MS ago or more is kept: a
         * file system's times may be as coarse as a clock tick, and a
         * change within the tick of an earlier one could keep its times;
         * one that comes after that time gets times of its own. */
        struct timespec now;
        if (clock_gettime(CLOCK_REALTIME, &now) < 0 ||
            (int64_t)(now.tv_sec - st.st_ctim.tv_sec) * 1000 + (now.tv_nsec - st.st_ctim.tv_nsec) / 1000000 <
                    USER_SETTLED_MS)
                return 0;
        pthread_mutex_lock(&found_lock);
        FoundUser *f = &found[n_found < USER_FOUND_MAX ? n_found++ : next_found++ % USER_FOUND_MAX];
        *f = (FoundUser){ .dev = st.st_dev, .ino = st.st_ino, .size = st.st_size, .mtime = st.st_mtim,
                          .ctime = st.st_ctim, .user = *ret };
        snprintf(f->path, sizeof f->path, "%s", path);
        pthread_mutex_unlock(&found_lock);
        return 0;
}

int user_enter(uid_t uid, gid_t gid) {
        /* Groups and gid while still root: neither is allowed after. */
        if (setgroups(1, &gid) < 0 || setresgid((gid_t)-1, gid, (gid_t)-1) < 0)
                goto fail;
        if (setresuid((uid_t)-1, uid, (uid_t)-1) < 0)
                goto fail;
        return 0;
fail: {
        int k = -errno;
        user_leave();
        return k;
}
}

void user_leave(void) {
        /* The effective uid first: root's capabilities come back with it,
         * and only they allow the rest. */
        (void)!setresuid((uid_t)-1, 0, (uid_t)-1);
        (void)!setresgid((gid_t)-1, 0, (gid_t)-1);
        (void)!setgroups(0, NULL);
}

typedef struct UserNameRow {
        uint32_t id;
        uint32_t off; /* into pool; rises with the line, so it orders ties */
} UserNameRow;

struct UserNames {
        UserNameRow *rows;
        size_t n;
        char *pool;
};

/* A name as a listing may show it; anything else stands as the number. */
static bool shown_name_valid(const char *s, size_t len) {
        if (len == 0 || len > USER_NAME_MAX || s[0] == '-')
                return false;
        for (size_t i = 0; i < len; i++) {
                char c = s[i];
                bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                          c == '.' || c == '_' || c == '-' || (c == '$' && i == len - 1);
                if (!ok)
                        return false;
        }
        return true;
}

/* Any 32-bit id, unlike parse_id: a file may belong to one past
 * USER_ID_MAX (nobody, the overflow ids) and that one has a name too. */
static bool parse_id32(const char *s, size_t len, uint32_t *ret) {
        if (len == 0 || len > 10)
                return false;
        uint64_t v = 0;
        for (size_t i = 0; i < len; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return false;
                v = v * 10 + (uint64_t)(s[i] - '0');
        }
        if (v > UINT32_MAX)
                return false;
        *ret = (uint32_t)v;
        return true;
}

static int row_cmp(const void *a, const void *b) {
        const UserNameRow *x = a, *y = b;
        if (x->id != y->id)
                return x->id < y->id ? -1 : 1;
        return x->off < y->off ? -1 : x->off > y->off;
}

void user_names_free(UserNames *n) {
        if (!n)
                return;
        free(n->rows);
        free(n->pool);
        free(n);
}

static void user_names_freep(UserNames **n) {
        user_names_free(*n);
}

int user_names_parse(const char *buf, size_t len, UserNames **ret) {
        if (len > USER_PASSWD_MAX)
                len = USER_PASSWD_MAX; /* as far as user_read_db reads; offsets fit 32 bits */
        _cleanup_(user_names_freep) UserNames *t = calloc(1, sizeof(UserNames));
        if (!t)
                return -ENOMEM;
        /* A kept name is at most its line plus a NUL, and a line is at
         * least four bytes ("a::0"): both bounds follow from len. */
        t->pool = malloc(len + 1);
        t->rows = malloc((len / 4 + 1) * sizeof(UserNameRow));
        if (!t->pool || !t->rows)
                return -ENOMEM;
        size_t used = 0;
        const char *p = buf, *end = buf + len;
        while (p < end) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                const char *line_end = nl ? nl : end;
                /* name:password:id:... in both files */
                const char *c1 = memchr(p, ':', (size_t)(line_end - p));
                const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(line_end - c1 - 1)) : NULL;
                if (c2) {
                        const char *id_end = memchr(c2 + 1, ':', (size_t)(line_end - c2 - 1));
                        if (!id_end)
                                id_end = line_end;
                        size_t name_len = (size_t)(c1 - p);
                        uint32_t id;
                        if (shown_name_valid(p, name_len) &&
                            parse_id32(c2 + 1, (size_t)(id_end - c2 - 1), &id)) {
                                t->rows[t->n++] = (UserNameRow){ .id = id, .off = (uint32_t)used };
                                memcpy(t->pool + used, p, name_len);
                                t->pool[used + name_len] = '\0';
                                used += name_len + 1;
                        }
                }
                p = nl ? nl + 1 : end;
        }
        qsort(t->rows, t->n, sizeof(UserNameRow), row_cmp);
        /* The first line of each id stays. */
        size_t k = 0;
        for (size_t i = 0; i < t->n; i++)
                if (k == 0 || t->rows[k - 1].id != t->rows[i].id)
                        t->rows[k++] = t->rows[i];
        t->n = k;
        *ret = TAKE_PTR(t);
        return 0;
}

int user_names_load(const char *path, UserNames **ret) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0;
        int r = user_read_db(path, &buf, &len);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                len = 0;
        return user_names_parse(buf ? buf : "", len, ret);
}

const char *user_names_get(const UserNames *n, uint32_t id, char buf[static USER_ID_TEXT_MAX]) {
        size_t lo = 0, hi = n ? n->n : 0;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (n->rows[mid].id == id) {
                        snprintf(buf, USER_ID_TEXT_MAX, "%s", n->pool + n->rows[mid].off);
                        return buf;
                }
                if (n->rows[mid].id < id)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        snprintf(buf, USER_ID_TEXT_MAX, "%" PRIu32, id);
        return buf;
}
