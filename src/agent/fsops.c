#include "agent/fsops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/path.h"

/* Writeback of an incoming file is started every this many bytes, so that
 * the fsync at the end has little left to wait for: the disk works while
 * the rest of the file is still on its way. */
#define WRITEBACK_STEP (8u * 1024u * 1024u)

struct FsWrite {
        int dir_fd;
        int fd;
        char tmp_name[64];
        char *name;
        unsigned mode;
        uint64_t size;
        uint64_t flushed; /* writeback started up to here */
};

const char *fsops_error_code(int err) {
        switch (-err) {
        case ENOENT:
                return "not_found";
        case EEXIST:
                return "exists";
        case ENOTDIR:
                return "not_a_directory";
        case EISDIR:
                return "is_a_directory";
        case ENOTEMPTY:
                return "not_empty";
        case EACCES:
        case EPERM:
        case EROFS:
                return "permission_denied";
        case ENOSPC:
        case EDQUOT:
                return "no_space";
        case EFBIG:
        case E2BIG:
                return "too_large";
        case EINVAL:
        case ENAMETOOLONG:
        case ELOOP:
        case EXDEV:
                return "invalid";
        case EBUSY:
        case ETXTBSY:
                return "busy";
        case ENOMEM:
                return "internal";
        default:
                return "io";
        }
}

static void closedirp(DIR **d) {
        if (*d)
                closedir(*d);
}

/* Splits an absolute path into an fd of its parent directory and the last
 * component. Trailing slashes are ignored. "/" itself, "." and ".." as the
 * last component have no parent entry to act on: -EINVAL. */
static int open_parent(const char *path, int *ret_dir_fd, char **ret_name) {
        _cleanup_free_ char *copy = strdup(path);
        if (!copy)
                return -ENOMEM;
        size_t n = strlen(copy);
        while (n > 1 && copy[n - 1] == '/')
                copy[--n] = '\0';
        char *slash = strrchr(copy, '/');
        if (!slash || slash[1] == '\0')
                return -EINVAL;
        char *name = slash + 1;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
                return -EINVAL;
        _cleanup_free_ char *base = strdup(name);
        if (!base)
                return -ENOMEM;
        if (slash == copy)
                slash[1] = '\0';
        else
                *slash = '\0';
        int fd = open(copy, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        *ret_dir_fd = fd;
        *ret_name = TAKE_PTR(base);
        return 0;
}

static int mkdir_p_fd(const char *path, mode_t mode, int *ret_fd) {
        _cleanup_free_ char *copy = strdup(path);
        if (!copy)
                return -ENOMEM;
        _cleanup_close_ int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        char *save = NULL;
        for (char *comp = strtok_r(copy, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
                if (strcmp(comp, ".") == 0)
                        continue;
                if (mkdirat(fd, comp, mode) < 0 && errno != EEXIST)
                        return -errno;
                int next = openat(fd, comp, O_PATH | O_DIRECTORY | O_CLOEXEC);
                if (next < 0) {
                        /* Something not a directory is in the way: the last
                         * component exists (as mkdir -p says), an earlier one
                         * cannot hold anything. */
                        bool last = save == NULL || *save == '\0' || strspn(save, "/") == strlen(save);
                        return errno == ENOTDIR ? (last ? -EEXIST : -ENOTDIR) : -errno;
                }
                close(fd);
                fd = next;
        }
        if (ret_fd)
                *ret_fd = TAKE_FD(fd);
        return 0;
}

int fsops_mkdir_p(const char *path, mode_t mode) {
        return mkdir_p_fd(path, mode, NULL);
}

static const char *type_name(mode_t m) {
        if (S_ISREG(m))
                return "file";
        if (S_ISDIR(m))
                return "dir";
        if (S_ISLNK(m))
                return "symlink";
        return "other";
}

/* File names and link targets are arbitrary bytes but JSON text is UTF-8:
 * each byte that is not part of a valid sequence becomes U+FFFD. */
json_t *fsops_json_string_lossy(const char *s, size_t n) {
        _cleanup_free_ char *out = malloc(n * 3 + 1);
        if (!out)
                return NULL;
        size_t o = 0;
        const uint8_t *p = (const uint8_t *)s;
        for (size_t i = 0; i < n;) {
                uint8_t c = p[i];
                size_t len = 0;
                uint32_t cp = 0;
                if (c < 0x80)
                        len = 1, cp = c;
                else if (c >= 0xc2 && c <= 0xdf)
                        len = 2, cp = c & 0x1f;
                else if (c >= 0xe0 && c <= 0xef)
                        len = 3, cp = c & 0x0f;
                else if (c >= 0xf0 && c <= 0xf4)
                        len = 4, cp = c & 0x07;
                bool ok = len > 0 && i + len <= n && c != 0;
                for (size_t k = 1; ok && k < len; k++) {
                        if ((p[i + k] & 0xc0) != 0x80)
                                ok = false;
                        cp = (cp << 6) | (p[i + k] & 0x3f);
                }
                if (ok && ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
                           (len == 4 && (cp < 0x10000 || cp > 0x10ffff))))
                        ok = false;
                if (ok) {
                        memcpy(out + o, p + i, len);
                        o += len;
                        i += len;
                } else {
                        memcpy(out + o, "\xef\xbf\xbd", 3);
                        o += 3;
                        i++;
                }
        }
        return json_stringn(out, o);
}

int fsops_names_load(const char *passwd, const char *group, FsNames *ret) {
        FsNames n = { 0 };
        int r = user_names_load(passwd, &n.users);
        if (r < 0)
                return r;
        r = user_names_load(group, &n.groups);
        if (r < 0) {
                user_names_free(n.users);
                return r;
        }
        *ret = n;
        return 0;
}

void fsops_names_done(FsNames *n) {
        if (!n)
                return;
        user_names_free(n->users);
        user_names_free(n->groups);
        n->users = n->groups = NULL;
}

static json_t *entry_new(int dir_fd, const char *name, const char *full_path, const struct stat *st,
                         const FsNames *names) {
        char mtime[32];
        struct tm tm;
        time_t t = st->st_mtim.tv_sec;
        if (!gmtime_r(&t, &tm) || strftime(mtime, sizeof mtime, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
                snprintf(mtime, sizeof mtime, "1970-01-01T00:00:00Z");
        char owner[USER_ID_TEXT_MAX], group[USER_ID_TEXT_MAX];
        user_names_get(names ? names->users : NULL, (uint32_t)st->st_uid, owner);
        user_names_get(names ? names->groups : NULL, (uint32_t)st->st_gid, group);
        _cleanup_json_ json_t *e =
                json_pack("{s:o, s:o, s:s, s:I, s:i, s:s, s:s, s:s}", "path",
                          fsops_json_string_lossy(full_path, strlen(full_path)), "name",
                          fsops_json_string_lossy(name, strlen(name)), "type", type_name(st->st_mode), "size",
                          (json_int_t)st->st_size, "mode", (int)(st->st_mode & 07777), "mtime", mtime,
                          "owner", owner, "group", group);
        if (!e)
                return NULL;
        if (S_ISLNK(st->st_mode)) {
                char target[4097];
                ssize_t n = readlinkat(dir_fd, name, target, sizeof target - 1);
                if (n >= 0) {
                        target[n] = '\0';
                        json_t *s = fsops_json_string_lossy(target, (size_t)n);
                        if (!s || json_object_set_new(e, "target", s) < 0)
                                return NULL;
                }
                /* Followed as the kernel follows it for the agent, whose
                 * root is the sandbox's: an absolute target or ".." past /
                 * stays inside. Only looked at (no open): a FIFO or a device
                 * at the end has no say. */
                struct stat to;
                json_t *tt = fstatat(dir_fd, name, &to, 0) == 0 ? json_string(type_name(to.st_mode))
                                                                 : json_null();
                if (!tt || json_object_set_new(e, "targetType", tt) < 0)
                        return NULL;
        }
        return TAKE_PTR(e);
}

static char *join_alloc(const char *dir, const char *name) {
        char *out;
        if (asprintf(&out, "%s%s%s", dir, (dir[0] && dir[strlen(dir) - 1] == '/') ? "" : "/", name) < 0)
                return NULL;
        return out;
}

int fsops_stat(const char *path, const FsNames *names, json_t **ret_entry) {
        if (strcmp(path, "/") == 0 || strspn(path, "/") == strlen(path)) {
                struct stat st;
                if (lstat("/", &st) < 0)
                        return -errno;
                json_t *e = entry_new(AT_FDCWD, "/", "/", &st, names);
                if (!e)
                        return -ENOMEM;
                *ret_entry = e;
                return 0;
        }
        _cleanup_close_ int dir_fd = -1;
        _cleanup_free_ char *name = NULL;
        int r = open_parent(path, &dir_fd, &name);
        if (r < 0)
                return r;
        struct stat st;
        if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        json_t *e = entry_new(dir_fd, name, path, &st, names);
        if (!e)
                return -ENOMEM;
        *ret_entry = e;
        return 0;
}

/* Splits a relative path or pattern into its segments in place; "" and
 * "." segments are dropped. -E2BIG past max. */
static int split_segments(char *s, char **segs, size_t max, size_t *ret_n) {
        size_t n = 0;
        char *save = NULL;
        for (char *t = strtok_r(s, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
                if (strcmp(t, ".") == 0)
                        continue;
                if (n >= max)
                        return -E2BIG;
                segs[n++] = t;
        }
        *ret_n = n;
        return 0;
}

static int glob_match_flags(const char *pattern, const char *relpath, int flags) {
        _cleanup_free_ char *p = strdup(pattern), *r = strdup(relpath);
        if (!p || !r)
                return -ENOMEM;
        char *ps[FSOPS_MAX_GLOB_SEGMENTS], *rs[FSOPS_MAX_GLOB_SEGMENTS + 1];
        size_t np, nr;
        if (split_segments(p, ps, ELEMENTSOF(ps), &np) < 0)
                return -EINVAL;
        if (split_segments(r, rs, ELEMENTSOF(rs), &nr) < 0)
                return 0; /* deeper than any walk goes */
        /* m[i][j]: pattern segments i.. match path segments j..; a table,
         * not backtracking, so that many "**" cost no more than one. */
        bool m[FSOPS_MAX_GLOB_SEGMENTS + 1][FSOPS_MAX_GLOB_SEGMENTS + 2];
        for (size_t j = 0; j <= nr; j++)
                m[np][j] = j == nr;
        for (size_t i = np; i-- > 0;) {
                bool any = strcmp(ps[i], "**") == 0;
                for (size_t j = nr + 1; j-- > 0;) {
                        if (any)
                                m[i][j] = m[i + 1][j] || (j < nr && m[i][j + 1]);
                        else
                                m[i][j] = j < nr && m[i + 1][j + 1] && fnmatch(ps[i], rs[j], flags) == 0;
                }
        }
        return m[0][0];
}

int fsops_glob_match(const char *pattern, const char *relpath) {
        return glob_match_flags(pattern, relpath, 0);
}

typedef struct ListWalk {
        const FsListOptions *o;
        json_t *entries;
        unsigned max_depth;
        unsigned visits;
        size_t names_read;
        size_t held; /* names kept by the directories the walk is in */
        bool truncated;
} ListWalk;

/* The smallest names of a directory, at most cap: a max-heap whose top
 * gives way to a smaller name once it is full. */
typedef struct NameHeap {
        char **v;
        size_t n, alloc, cap;
        bool dropped; /* a name was left out */
} NameHeap;

static void name_heap_done(NameHeap *h) {
        for (size_t i = 0; i < h->n; i++)
                free(h->v[i]);
        free(h->v);
}

static void name_swap(char **a, char **b) {
        char *t = *a;
        *a = *b;
        *b = t;
}

static int name_heap_add(NameHeap *h, const char *name) {
        if (h->n == h->cap) {
                h->dropped = true;
                if (h->n == 0 || strcmp(name, h->v[0]) >= 0)
                        return 0;
                char *s = strdup(name);
                if (!s)
                        return -ENOMEM;
                free(h->v[0]);
                h->v[0] = s;
                for (size_t i = 0;;) {
                        size_t l = 2 * i + 1, r = l + 1, m = i;
                        if (l < h->n && strcmp(h->v[l], h->v[m]) > 0)
                                m = l;
                        if (r < h->n && strcmp(h->v[r], h->v[m]) > 0)
                                m = r;
                        if (m == i)
                                return 0;
                        name_swap(&h->v[i], &h->v[m]);
                        i = m;
                }
        }
        if (h->n == h->alloc) {
                size_t a = h->alloc ? h->alloc * 2 : 64;
                if (a > h->cap)
                        a = h->cap;
                char **v = reallocarray(h->v, a, sizeof(char *));
                if (!v)
                        return -ENOMEM;
                h->v = v;
                h->alloc = a;
        }
        char *s = strdup(name);
        if (!s)
                return -ENOMEM;
        size_t i = h->n++;
        h->v[i] = s;
        while (i > 0) {
                size_t p = (i - 1) / 2;
                if (strcmp(h->v[i], h->v[p]) <= 0)
                        break;
                name_swap(&h->v[i], &h->v[p]);
                i = p;
        }
        return 0;
}

/* strcmp compares as unsigned char: bytewise, whatever the locale. */
static int name_cmp(const void *a, const void *b) {
        return strcmp(*(char *const *)a, *(char *const *)b);
}

static int list_dir(ListWalk *w, int dir_fd, const char *prefix, const char *rel, unsigned level);

/* Whether a name read can end up in a glob's listing: it matches, or it may
 * be a directory the walk goes into. 1, 0 or a negative errno. */
static int glob_candidate(ListWalk *w, const char *rel, unsigned level, const struct dirent *de) {
        if (level < w->max_depth && (de->d_type == DT_DIR || de->d_type == DT_UNKNOWN))
                return 1;
        _cleanup_free_ char *sub_rel = rel ? join_alloc(rel, de->d_name) : strdup(de->d_name);
        if (!sub_rel)
                return -ENOMEM;
        return glob_match_flags(w->o->glob, sub_rel, w->o->hidden ? 0 : FNM_PERIOD);
}

/* The names of a directory into h. Past FSOPS_MAX_LIST_NAMES the walk is
 * truncated and h is not to be listed: it may lack smaller names. */
static int read_names(ListWalk *w, int dir_fd, const char *rel, unsigned level, NameHeap *h) {
        int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        _cleanup_(closedirp) DIR *d = fdopendir(fd);
        if (!d) {
                int k = -errno;
                close(fd);
                return k;
        }
        struct dirent *de;
        while ((errno = 0, de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                if (!w->o->hidden && de->d_name[0] == '.')
                        continue;
                if (++w->names_read > FSOPS_MAX_LIST_NAMES) {
                        w->truncated = true;
                        return 0;
                }
                if (w->o->glob) {
                        int c = glob_candidate(w, rel, level, de);
                        if (c < 0)
                                return c;
                        if (c == 0)
                                continue;
                }
                int r = name_heap_add(h, de->d_name);
                if (r < 0)
                        return r;
        }
        return errno ? -errno : 0;
}

static int list_entry(ListWalk *w, int dir_fd, const char *prefix, const char *rel, unsigned level,
                      const char *name) {
        if (++w->visits > FSOPS_MAX_LIST_VISITS) {
                w->truncated = true;
                return 0;
        }
        struct stat st;
        if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return 0; /* gone meanwhile */
        _cleanup_free_ char *full = join_alloc(prefix, name);
        _cleanup_free_ char *sub_rel = rel ? join_alloc(rel, name) : strdup(name);
        if (!full || !sub_rel)
                return -ENOMEM;
        int match = 1;
        if (w->o->glob) {
                match = glob_match_flags(w->o->glob, sub_rel, w->o->hidden ? 0 : FNM_PERIOD);
                if (match < 0)
                        return match;
        }
        if (match) {
                if (json_array_size(w->entries) >= w->o->limit) {
                        w->truncated = true;
                        return 0;
                }
                json_t *e = entry_new(dir_fd, name, full, &st, w->o->names);
                if (!e || json_array_append_new(w->entries, e) < 0)
                        return -ENOMEM;
        }
        if (S_ISDIR(st.st_mode) && level < w->max_depth) {
                _cleanup_close_ int sub =
                        openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (sub < 0)
                        return 0; /* unreadable subdirectory: listed, not entered */
                int r = list_dir(w, sub, full, sub_rel, level + 1);
                if (r == -ENOMEM)
                        return r;
        }
        return 0;
}

static int list_dir(ListWalk *w, int dir_fd, const char *prefix, const char *rel, unsigned level) {
        size_t cap = FSOPS_MAX_HELD_NAMES - w->held;
        if (cap > FSOPS_MAX_DIR_NAMES)
                cap = FSOPS_MAX_DIR_NAMES;
        /* Without a glob every name kept is listed: no more are needed
         * than the limit still allows. */
        size_t room = w->o->limit - json_array_size(w->entries);
        if (!w->o->glob && cap > room)
                cap = room;
        if (cap == 0) {
                w->truncated = true;
                return 0;
        }
        _cleanup_(name_heap_done) NameHeap h = { .cap = cap };
        int r = read_names(w, dir_fd, rel, level, &h);
        if (r < 0 || w->truncated)
                return r;
        if (h.n > 1)
                qsort(h.v, h.n, sizeof(char *), name_cmp);
        w->held += h.n;
        for (size_t i = 0; i < h.n && r >= 0 && !w->truncated; i++)
                r = list_entry(w, dir_fd, prefix, rel, level, h.v[i]);
        w->held -= h.n;
        if (r < 0)
                return r;
        /* Names past the last kept one were never looked at: what follows
         * this directory would not continue the order. */
        if (h.dropped)
                w->truncated = true;
        return 0;
}

/* How deep a glob can reach: its segment count, or the bound for "**". */
static int glob_depth(const char *glob, unsigned *ret) {
        _cleanup_free_ char *p = strdup(glob);
        if (!p)
                return -ENOMEM;
        char *ps[FSOPS_MAX_GLOB_SEGMENTS];
        size_t np;
        if (split_segments(p, ps, ELEMENTSOF(ps), &np) < 0 || np == 0)
                return -EINVAL;
        for (size_t i = 0; i < np; i++)
                if (strcmp(ps[i], "**") == 0) {
                        *ret = FSOPS_MAX_GLOB_SEGMENTS;
                        return 0;
                }
        *ret = (unsigned)np;
        return 0;
}

int fsops_list(const FsListOptions *o, json_t **ret_entries, bool *ret_truncated) {
        ListWalk w = { .o = o, .max_depth = o->depth };
        if (o->glob) {
                unsigned reach;
                int r = glob_depth(o->glob, &reach);
                if (r < 0)
                        return r;
                if (w.max_depth == 0 || w.max_depth > reach)
                        w.max_depth = reach;
        }
        if (w.max_depth == 0)
                w.max_depth = 1;
        FsListOptions bounded = *o;
        if (bounded.limit == 0 || bounded.limit > FSOPS_MAX_LIST_ENTRIES)
                bounded.limit = FSOPS_MAX_LIST_ENTRIES;
        w.o = &bounded;
        _cleanup_close_ int fd = open(o->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        _cleanup_json_ json_t *entries = json_array();
        if (!entries)
                return -ENOMEM;
        w.entries = entries;
        int r = list_dir(&w, fd, o->path, NULL, 1);
        if (r < 0)
                return r;
        *ret_entries = TAKE_PTR(entries);
        *ret_truncated = w.truncated;
        return 0;
}

int fsops_mkdir(const char *path, bool parents) {
        if (parents)
                return fsops_mkdir_p(path, 0755);
        _cleanup_close_ int dir_fd = -1;
        _cleanup_free_ char *name = NULL;
        int r = open_parent(path, &dir_fd, &name);
        if (r < 0)
                return r == -EINVAL && strspn(path, "/") == strlen(path) ? -EEXIST : r;
        if (mkdirat(dir_fd, name, 0755) < 0)
                return -errno;
        return 0;
}

int fsops_remove(const char *path, bool recursive, uint64_t *ret_count) {
        _cleanup_close_ int dir_fd = -1;
        _cleanup_free_ char *name = NULL;
        uint64_t count = 0;
        int r = open_parent(path, &dir_fd, &name);
        if (r == -ENOENT || r == -ENOTDIR)
                goto done; /* nothing there to remove */
        if (r < 0)
                return r;
        struct stat st;
        if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                if (errno == ENOENT)
                        goto done;
                return -errno;
        }
        if (!S_ISDIR(st.st_mode)) {
                if (unlinkat(dir_fd, name, 0) < 0)
                        return -errno;
                count = 1;
        } else if (!recursive) {
                if (unlinkat(dir_fd, name, AT_REMOVEDIR) < 0)
                        return errno == EEXIST ? -ENOTEMPTY : -errno;
                count = 1;
        } else {
                /* The files API stops at the first failure, answers EXDEV at
                 * a mount inside and says how much it removed. */
                PathRemove o = { .max_depth = FSOPS_MAX_REMOVE_DEPTH, .mount_error = -EXDEV,
                                 .depth_error = -E2BIG, .stop_at_first_error = true };
                r = path_remove_tree(dir_fd, name, &o);
                count = o.removed;
                if (r < 0)
                        return r;
        }
done:
        *ret_count = count;
        return 0;
}

int fsops_rename(const char *from, const char *to, bool overwrite) {
        _cleanup_close_ int from_fd = -1, to_fd = -1;
        _cleanup_free_ char *from_name = NULL, *to_name = NULL;
        int r = open_parent(from, &from_fd, &from_name);
        if (r < 0)
                return r;
        r = open_parent(to, &to_fd, &to_name);
        if (r < 0)
                return r;
        if (!overwrite) {
                if (renameat2(from_fd, from_name, to_fd, to_name, RENAME_NOREPLACE) == 0)
                        return 0;
                if (errno != EINVAL && errno != ENOSYS)
                        return -errno;
                /* A filesystem without RENAME_NOREPLACE: look first. The
                 * race left is with the sandbox's own processes only. */
                struct stat st;
                if (fstatat(to_fd, to_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
                        return -EEXIST;
        }
        if (renameat(from_fd, from_name, to_fd, to_name) < 0)
                return errno == EEXIST ? -ENOTEMPTY : -errno;
        return 0;
}

int fsops_open_read(const char *path, int *ret_fd, struct stat *ret_st) {
        struct stat st;
        /* Look before opening: opening a FIFO or a device can block or have
         * side effects. */
        if (stat(path, &st) < 0)
                return -errno;
        if (S_ISDIR(st.st_mode))
                return -EISDIR;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (S_ISDIR(st.st_mode))
                return -EISDIR;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        *ret_fd = TAKE_FD(fd);
        *ret_st = st;
        return 0;
}

int fsops_write_begin(const char *path, unsigned mode, bool mkdirs, FsWrite **ret) {
        _cleanup_close_ int dir_fd = -1;
        _cleanup_free_ char *name = NULL;
        int r = open_parent(path, &dir_fd, &name);
        if (r == -ENOENT && mkdirs) {
                _cleanup_free_ char *parent = strdup(path);
                if (!parent)
                        return -ENOMEM;
                size_t n = strlen(parent);
                while (n > 1 && parent[n - 1] == '/')
                        parent[--n] = '\0';
                char *slash = strrchr(parent, '/');
                if (slash && slash != parent)
                        *slash = '\0';
                r = mkdir_p_fd(parent, 0755, NULL);
                if (r < 0)
                        return r;
                r = open_parent(path, &dir_fd, &name);
        }
        if (r < 0)
                return r;
        struct stat st;
        if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
                return -EISDIR;

        FsWrite *w = calloc(1, sizeof(FsWrite));
        if (!w)
                return -ENOMEM;
        w->fd = -1;
        w->mode = mode;
        for (int attempt = 0; attempt < 16; attempt++) {
                uint64_t rnd;
                if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != sizeof rnd)
                        rnd = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ (uint64_t)attempt;
                snprintf(w->tmp_name, sizeof w->tmp_name, ".runtime-%016llx.tmp", (unsigned long long)rnd);
                w->fd = openat(dir_fd, w->tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                               0600);
                if (w->fd >= 0 || errno != EEXIST)
                        break;
        }
        if (w->fd < 0) {
                int k = -errno;
                free(w);
                return k;
        }
        w->dir_fd = TAKE_FD(dir_fd);
        w->name = TAKE_PTR(name);
        *ret = w;
        return 0;
}

int fsops_write_data(FsWrite *w, const void *buf, size_t n) {
        int r = io_write_all(w->fd, buf, n);
        if (r < 0)
                return r;
        w->size += n;
        if (w->size - w->flushed >= WRITEBACK_STEP) {
                /* Starts it only (no wait flags): a hint, its failure is
                 * the fsync's to report. */
                (void)sync_file_range(w->fd, (off_t)w->flushed, (off_t)(w->size - w->flushed),
                                      SYNC_FILE_RANGE_WRITE);
                w->flushed = w->size;
        }
        return 0;
}

static void fswrite_free(FsWrite *w) {
        if (w->fd >= 0)
                close(w->fd);
        if (w->dir_fd >= 0)
                close(w->dir_fd);
        free(w->name);
        free(w);
}

int fsops_write_commit(FsWrite *w, uint64_t *ret_size) {
        int r = 0;
        /* fchmod, not the open mode: the umask must not change what the client asked for. */
        if (fchmod(w->fd, w->mode) < 0 || fsync(w->fd) < 0)
                r = -errno;
        if (r == 0 && close(w->fd) < 0)
                r = -errno;
        w->fd = -1;
        if (r == 0 && renameat(w->dir_fd, w->tmp_name, w->dir_fd, w->name) < 0)
                r = -errno;
        if (r < 0) {
                unlinkat(w->dir_fd, w->tmp_name, 0);
        } else {
                /* Make the rename itself durable. */
                int d = openat(w->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (d >= 0) {
                        fsync(d);
                        close(d);
                }
                if (ret_size)
                        *ret_size = w->size;
        }
        fswrite_free(w);
        return r;
}

void fsops_write_abort(FsWrite *w) {
        if (!w)
                return;
        unlinkat(w->dir_fd, w->tmp_name, 0);
        fswrite_free(w);
}
