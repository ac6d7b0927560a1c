#include "agent/watch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/fsops.h"
#include "agent/user.h"
#include "common/macro.h"

/* What a watch asks of the kernel: the changes the API reports, and the
 * watched directory's own end. */
#define WATCH_MASK                                                                                        \
        (IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | \
         IN_MOVE_SELF | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
/* Directories deeper than this below the root are not walked: each level
 * holds a directory descriptor while the walk is in it. */
#define WATCH_MAX_DEPTH 128
#define WATCH_BUCKETS 1024u
#define WATCH_RAW_BYTES (64u * 1024u)
/* What a new directory held when its descriptor was added, waiting to be
 * reported: at most this many entries; past it an overflow line says that
 * some went unreported. */
#define WATCH_FOUND_MAX 16384u

typedef struct WatchDir {
        struct WatchDir *next;
        int wd;
        char path[]; /* absolute */
} WatchDir;

/* An entry already in a directory that appeared under a recursive watch:
 * created between the directory's own creation and its descriptor, so no
 * event of the kernel's names it. */
typedef struct WatchFound {
        struct WatchFound *next;
        bool dir;
        char path[];
} WatchFound;

struct AgentWatch {
        int fd;
        bool recursive;
        unsigned max;     /* descriptors at most */
        unsigned count;   /* held now */
        bool limited;     /* a directory went unwatched since the last limit line */
        int root_wd;
        int64_t uid, gid; /* whose rights additions take; -1: root */
        WatchDir *buckets[WATCH_BUCKETS];
        WatchFound *found, **found_tail; /* to report, oldest first */
        unsigned found_count;
        bool found_lost; /* the bound left some out since the last overflow line */
        size_t raw_len, raw_off;
        /* inotify events are aligned for struct inotify_event. */
        _Alignas(struct inotify_event) uint8_t raw[WATCH_RAW_BYTES];
};

static WatchDir **dir_slot(AgentWatch *w, int wd) {
        WatchDir **p = &w->buckets[(unsigned)wd % WATCH_BUCKETS];
        while (*p && (*p)->wd != wd)
                p = &(*p)->next;
        return p;
}

static WatchDir *dir_find(AgentWatch *w, int wd) {
        return *dir_slot(w, wd);
}

static void dir_forget(AgentWatch *w, int wd) {
        WatchDir **p = dir_slot(w, wd);
        WatchDir *d = *p;
        if (!d)
                return;
        *p = d->next;
        free(d);
        w->count--;
}

/* Watches one path; an inode already watched (a directory moved back) keeps
 * its descriptor and takes the new path. */
static int add_one(AgentWatch *w, const char *path, bool only_dir) {
        if (w->count >= w->max) {
                w->limited = true;
                return -ENOSPC;
        }
        int wd = inotify_add_watch(w->fd, path, WATCH_MASK | (only_dir ? IN_ONLYDIR : 0));
        if (wd < 0) {
                if (errno == ENOSPC)
                        w->limited = true;
                return -errno;
        }
        size_t n = strlen(path);
        WatchDir **p = dir_slot(w, wd);
        if (*p) {
                if (strcmp((*p)->path, path) == 0)
                        return wd;
                WatchDir *old = *p;
                *p = old->next;
                free(old);
                w->count--;
        }
        WatchDir *d = malloc(sizeof(*d) + n + 1);
        if (!d) {
                inotify_rm_watch(w->fd, wd);
                return -ENOMEM;
        }
        d->wd = wd;
        memcpy(d->path, path, n + 1);
        d->next = w->buckets[(unsigned)wd % WATCH_BUCKETS];
        w->buckets[(unsigned)wd % WATCH_BUCKETS] = d;
        w->count++;
        return wd;
}

static void found_add(AgentWatch *w, const char *path, size_t n, bool dir) {
        WatchFound *f = w->found_count < WATCH_FOUND_MAX ? malloc(sizeof(*f) + n + 1) : NULL;
        if (!f) {
                w->found_lost = true;
                return;
        }
        f->next = NULL;
        f->dir = dir;
        memcpy(f->path, path, n + 1);
        *w->found_tail = f;
        w->found_tail = &f->next;
        w->found_count++;
}

/* The directories below path, depth first; with report, every entry below
 * it is queued as found too. A directory that vanished or may not be read
 * is left out; the bound stops the walk. */
static int add_tree(AgentWatch *w, const char *path, unsigned depth, bool report) {
        if (depth >= WATCH_MAX_DEPTH)
                return 0;
        int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
                return 0;
        DIR *dir = fdopendir(dfd);
        if (!dir) {
                close(dfd);
                return 0;
        }
        int rc = 0;
        struct dirent *de;
        char sub[4096];
        while (rc == 0 && (de = readdir(dir))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                bool is_dir = de->d_type == DT_DIR;
                if (de->d_type == DT_UNKNOWN) {
                        struct stat st;
                        is_dir = fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                                 S_ISDIR(st.st_mode);
                }
                if (!is_dir && !report)
                        continue;
                int n = snprintf(sub, sizeof sub, "%s/%s", strcmp(path, "/") == 0 ? "" : path, de->d_name);
                if (n < 0 || (size_t)n >= sizeof sub)
                        continue;
                if (report)
                        found_add(w, sub, (size_t)n, is_dir);
                if (!is_dir)
                        continue;
                int wd = add_one(w, sub, true);
                if (wd == -ENOSPC || wd == -ENOMEM)
                        rc = wd;
                else if (wd >= 0)
                        rc = add_tree(w, sub, depth + 1, report);
        }
        closedir(dir);
        return rc;
}

/* A directory that appeared under a recursive watch, and what is below it
 * already, with the rights of the watch's user. What is below it was made
 * before its descriptor was there (a `mkdir -p a/b && touch a/b/c` races
 * the watch): it is reported as created. An entry made after the
 * descriptor but before the walk reads it is reported twice. */
static void add_new_dir(AgentWatch *w, const char *path) {
        bool as_user = w->uid >= 0;
        if (as_user && user_enter((uid_t)w->uid, (gid_t)w->gid) < 0)
                return;
        if (add_one(w, path, true) >= 0)
                (void)add_tree(w, path, 0, true);
        if (as_user)
                user_leave();
}

/* A directory moved away or deleted: its descriptors and those below it
 * would name paths that are no longer there. */
static void drop_tree(AgentWatch *w, const char *path) {
        size_t n = strlen(path);
        for (unsigned b = 0; b < WATCH_BUCKETS; b++) {
                WatchDir **p = &w->buckets[b];
                while (*p) {
                        WatchDir *d = *p;
                        if (d->wd != w->root_wd && strncmp(d->path, path, n) == 0 &&
                            (d->path[n] == '\0' || d->path[n] == '/')) {
                                inotify_rm_watch(w->fd, d->wd);
                                *p = d->next;
                                free(d);
                                w->count--;
                        } else
                                p = &d->next;
                }
        }
}

int agent_watch_open(const char *path, bool recursive, unsigned max_descriptors, int64_t uid, int64_t gid,
                     AgentWatch **ret) {
        struct stat st;
        if (lstat(path, &st) < 0)
                return -errno;
        /* A link is not followed: what it leads to may be outside what the
         * caller asked about, and its events would name other paths. */
        if (S_ISLNK(st.st_mode))
                return -ENOTDIR;
        AgentWatch *w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (w->fd < 0) {
                int k = -errno;
                free(w);
                return k;
        }
        w->recursive = recursive && S_ISDIR(st.st_mode);
        w->max = max_descriptors ? max_descriptors : WATCH_DEFAULT_DESCRIPTORS;
        w->uid = uid;
        w->gid = gid;
        w->found_tail = &w->found;
        int wd = add_one(w, path, false);
        if (wd < 0) {
                agent_watch_free(w);
                return wd;
        }
        w->root_wd = wd;
        if (w->recursive && add_tree(w, path, 0, false) == -ENOMEM) {
                agent_watch_free(w);
                return -ENOMEM;
        }
        *ret = w;
        return 0;
}

int agent_watch_fd(const AgentWatch *w) {
        return w->fd;
}

bool agent_watch_pending(const AgentWatch *w) {
        return w->raw_off < w->raw_len || w->limited || w->found || w->found_lost;
}

/* One line into buf (room >= WATCH_MAX_LINE): the bytes written. */
static size_t put_line(char *buf, size_t room, json_t *j) {
        if (!j)
                return 0;
        size_t n = json_dumpb(j, buf, room - 1, JSON_COMPACT);
        json_decref(j);
        if (n == 0 || n >= room - 1)
                return 0;
        buf[n] = '\n';
        return n + 1;
}

static const char *change_name(uint32_t mask) {
        if (mask & (IN_CREATE | IN_MOVED_TO))
                return "create";
        if (mask & IN_MODIFY)
                return "write";
        if (mask & (IN_DELETE | IN_DELETE_SELF))
                return "remove";
        if (mask & (IN_MOVED_FROM | IN_MOVE_SELF))
                return "rename";
        if (mask & IN_ATTRIB)
                return "chmod";
        return NULL;
}

/* One kernel event: a line in buf (or none), and the watch's own upkeep. */
static size_t one_event(AgentWatch *w, const struct inotify_event *ev, char *buf, size_t room, WatchEnd *end) {
        if (ev->mask & IN_Q_OVERFLOW)
                return put_line(buf, room, json_pack("{s:s,s:s}", "e", "overflow", "source", "kernel"));
        WatchDir *d = dir_find(w, ev->wd);
        if (!d)
                return 0;
        bool root = ev->wd == w->root_wd;
        if (ev->mask & IN_IGNORED) {
                if (root && *end == WATCH_RUNNING)
                        *end = WATCH_ROOT_REMOVED;
                dir_forget(w, ev->wd);
                return 0;
        }
        /* A directory below the root reports its own end in its parent's
         * event; only the root's is news. */
        if ((ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) && !root)
                return 0;
        const char *what = change_name(ev->mask);
        if (!what)
                return 0;
        char path[4096 + NAME_MAX + 2];
        size_t name_len = ev->len ? strnlen(ev->name, ev->len) : 0;
        int n = name_len ? snprintf(path, sizeof path, "%s/%.*s", strcmp(d->path, "/") == 0 ? "" : d->path,
                                    (int)name_len, ev->name)
                         : snprintf(path, sizeof path, "%s", d->path);
        if (n < 0 || (size_t)n >= sizeof path)
                return 0;
        bool is_dir = (ev->mask & IN_ISDIR) || (root && !name_len && w->recursive);
        if (w->recursive && is_dir && name_len) {
                if (ev->mask & (IN_CREATE | IN_MOVED_TO))
                        add_new_dir(w, path);
                else if (ev->mask & IN_MOVED_FROM)
                        drop_tree(w, path);
        }
        if (root && (ev->mask & IN_DELETE_SELF))
                *end = WATCH_ROOT_REMOVED;
        else if (root && (ev->mask & IN_MOVE_SELF))
                *end = WATCH_ROOT_MOVED;
        json_t *p = fsops_json_string_lossy(path, (size_t)n);
        if (!p)
                return 0;
        return put_line(buf, room, json_pack("{s:s,s:o,s:b}", "e", what, "p", p, "d", is_dir));
}

ssize_t agent_watch_read(AgentWatch *w, char *buf, size_t cap, WatchEnd *ret_end) {
        WatchEnd end = WATCH_RUNNING;
        size_t used = 0;
        if (w->raw_off >= w->raw_len) {
                ssize_t n = read(w->fd, w->raw, sizeof w->raw);
                if (n < 0 && errno != EAGAIN && errno != EINTR)
                        return -errno;
                w->raw_off = 0;
                w->raw_len = n > 0 ? (size_t)n : 0;
        }
        while (end == WATCH_RUNNING) {
                /* Room for one line and a limit line after it. */
                if (cap - used < 2 * WATCH_MAX_LINE)
                        break;
                /* What a new directory held comes before the events after
                 * its creation. */
                if (w->found) {
                        WatchFound *f = w->found;
                        w->found = f->next;
                        if (!w->found)
                                w->found_tail = &w->found;
                        w->found_count--;
                        json_t *p = fsops_json_string_lossy(f->path, strlen(f->path));
                        if (p)
                                used += put_line(buf + used, cap - used,
                                                 json_pack("{s:s,s:o,s:b}", "e", "create", "p", p, "d", f->dir));
                        free(f);
                        continue;
                }
                if (w->found_lost) {
                        w->found_lost = false;
                        used += put_line(buf + used, cap - used, json_pack("{s:s,s:s}", "e", "overflow", "source", "scan"));
                        continue;
                }
                if (w->raw_off >= w->raw_len)
                        break;
                const struct inotify_event *ev = (const struct inotify_event *)(w->raw + w->raw_off);
                size_t size = sizeof(*ev) + ev->len;
                if (w->raw_len - w->raw_off < size) {
                        w->raw_off = w->raw_len;
                        break;
                }
                w->raw_off += size;
                used += one_event(w, ev, buf + used, cap - used, &end);
                if (w->limited) {
                        w->limited = false;
                        used += put_line(buf + used, cap - used,
                                         json_pack("{s:s,s:I}", "e", "limit", "watches", (json_int_t)w->max));
                }
        }
        if (w->limited && cap - used >= WATCH_MAX_LINE) {
                w->limited = false;
                used += put_line(buf + used, cap - used,
                                 json_pack("{s:s,s:I}", "e", "limit", "watches", (json_int_t)w->max));
        }
        *ret_end = end;
        return (ssize_t)used;
}

void agent_watch_free(AgentWatch *w) {
        if (!w)
                return;
        if (w->fd >= 0)
                close(w->fd);
        for (unsigned b = 0; b < WATCH_BUCKETS; b++)
                while (w->buckets[b]) {
                        WatchDir *d = w->buckets[b];
                        w->buckets[b] = d->next;
                        free(d);
                }
        while (w->found) {
                WatchFound *f = w->found;
                w->found = f->next;
                free(f);
        }
        free(w);
}
