/* The images on this host: their names, whether they are built and up to
 * date (the builder's --check), when, and their size. */
#include "daemon/manager/images.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "daemon/manager/config.h"

bool image_name_ok(const char *s) {
        size_t len = strlen(s);
        if (len == 0 || len > IMAGE_MAX_NAME)
                return false;
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)s[i];
                bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && (c == '-' || c == '_'));
                if (!ok)
                        return false;
        }
        return true;
}

/* Starts the image builder with argv, its stdout and stderr on out_fd
 * (/dev/null when out_fd < 0), stdin on /dev/null. posix_spawn puts it in a
 * process group of its own before this returns, so that a kill(-pid) can
 * never race a setpgid in the child, and gives it an empty signal mask and
 * default dispositions: the daemon's threads block SIGTERM (main waits for
 * it with sigwait) and ignore SIGPIPE, and a forked child would keep both, so
 * the builder could not be stopped by SIGTERM and would not die of a closed
 * pipe. */
static int builder_spawn(const char *builder, char *const argv[], int out_fd, pid_t *ret) {
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t attr;
        sigset_t none, all;
        int r = posix_spawn_file_actions_init(&fa);
        if (r != 0)
                return -r;
        if ((r = posix_spawnattr_init(&attr)) != 0) {
                posix_spawn_file_actions_destroy(&fa);
                return -r;
        }
        sigemptyset(&none);
        sigfillset(&all);
        if (!r)
                r = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        if (!r && out_fd >= 0)
                r = posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
        else if (!r)
                r = posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        if (!r)
                r = posix_spawn_file_actions_adddup2(&fa, 1, 2);
        if (!r)
                r = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                            POSIX_SPAWN_SETSIGDEF);
        if (!r)
                r = posix_spawnattr_setpgroup(&attr, 0);
        if (!r)
                r = posix_spawnattr_setsigmask(&attr, &none);
        if (!r)
                r = posix_spawnattr_setsigdefault(&attr, &all);
        pid_t pid = -1;
        if (!r)
                r = posix_spawn(&pid, builder, &fa, &attr, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);
        if (r != 0)
                return -r;
        *ret = pid;
        return 0;
}

/* Runs `builder --check IMAGE_DIR NAME`: exit 0 when built and up to date. */
static bool image_check(const DaemonConfig *cfg, const char *name) {
        char *argv[] = { (char *)cfg->image_builder, "--check", (char *)cfg->image_dir, (char *)name, NULL };
        pid_t pid;
        if (builder_spawn(cfg->image_builder, argv, -1, &pid) < 0)
                return false;
        int status;
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return false;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int image_build_start(const DaemonConfig *cfg, const char *name, bool force, const char *then, int out_fd,
                      pid_t *ret) {
        if (!image_name_ok(name))
                return -EINVAL;
        if (mkdir(cfg->image_dir, 0755) < 0 && errno != EEXIST)
                return -errno;
        char *flag = force ? "--force" : "--";
        if (then) {
                /* Both builders in the one process group, the second only
                 * after the first succeeded. */
                char *argv[] = { "/bin/sh", "-c", "\"$1\" \"$2\" \"$4\" \"$5\" && exec \"$3\" \"$2\" \"$4\" \"$5\"",
                                 "sh", (char *)cfg->image_builder, flag, (char *)then, (char *)cfg->image_dir,
                                 (char *)name, NULL };
                return builder_spawn("/bin/sh", argv, out_fd, ret);
        }
        char *argv[] = { (char *)cfg->image_builder, flag, (char *)cfg->image_dir, (char *)name, NULL };
        return builder_spawn(cfg->image_builder, argv, out_fd, ret);
}

int image_build_stop(pid_t pid, int grace_ms) {
        int status = 0;
        bool reaped = false;
        /* The builder's trap stops mmdebstrap (a session of its own) and
         * removes the partial tree; give the whole group that long before
         * SIGKILL (the leader may be a shell that exits first). */
        kill(-pid, SIGTERM);
        for (int waited = 0;; waited += 50) {
                if (!reaped) {
                        pid_t w = waitpid(pid, &status, WNOHANG);
                        if (w == pid)
                                reaped = true;
                        else if (w < 0 && errno != EINTR)
                                return -errno;
                }
                if (reaped && kill(-pid, 0) < 0 && errno == ESRCH)
                        return status;
                if (waited >= grace_ms)
                        break;
                struct timespec ts = { 0, 50 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
        kill(-pid, SIGKILL);
        while (!reaped && waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        return status;
}

/* Size of a tree: cached per (image, mtime), since walking a root
 * filesystem takes a while. */
static pthread_mutex_t size_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
        char name[65];
        int64_t mtime;
        uint64_t size;
} size_cache[16];
static __thread uint64_t walk_total;

static int walk_add(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        if (flag == FTW_F || flag == FTW_SL)
                walk_total += (uint64_t)st->st_blocks * 512u;
        return 0;
}

static uint64_t tree_size(const char *name, const char *dir, int64_t mtime) {
        pthread_mutex_lock(&size_lock);
        for (size_t i = 0; i < ELEMENTSOF(size_cache); i++)
                if (strcmp(size_cache[i].name, name) == 0 && size_cache[i].mtime == mtime) {
                        uint64_t s = size_cache[i].size;
                        pthread_mutex_unlock(&size_lock);
                        return s;
                }
        pthread_mutex_unlock(&size_lock);
        walk_total = 0;
        nftw(dir, walk_add, 32, FTW_PHYS | FTW_MOUNT);
        uint64_t s = walk_total;
        pthread_mutex_lock(&size_lock);
        size_t slot = 0;
        for (size_t i = 0; i < ELEMENTSOF(size_cache); i++)
                if (strcmp(size_cache[i].name, name) == 0 || !size_cache[i].name[0]) {
                        slot = i;
                        break;
                }
        snprintf(size_cache[slot].name, sizeof(size_cache[slot].name), "%s", name);
        size_cache[slot].mtime = mtime;
        size_cache[slot].size = s;
        pthread_mutex_unlock(&size_lock);
        return s;
}

/* The builder's built-at file: one RFC 3339 UTC time. */
static bool read_built_at(const char *dir, char out[RFC3339_LEN]) {
        _cleanup_free_ char *path = NULL;
        if (asprintf(&path, "%s/built-at", dir) < 0) {
                path = NULL;
                return false;
        }
        _cleanup_fclose_ FILE *f = fopen(path, "re");
        char line[64];
        if (!f || !fgets(line, sizeof(line), f))
                return false;
        line[strcspn(line, "\n")] = '\0';
        if (strlen(line) != RFC3339_LEN - 1 || line[4] != '-' || line[10] != 'T' || line[19] != 'Z')
                return false;
        for (size_t i = 0; i < RFC3339_LEN - 1; i++)
                if (!strchr("0123456789-T:Z", line[i]))
                        return false;
        memcpy(out, line, RFC3339_LEN);
        return true;
}

int image_info(const DaemonConfig *cfg, const char *name, ImageInfo *ret) {
        _cleanup_free_ char *dir = NULL;
        if (asprintf(&dir, "%s/%s", cfg->image_dir, name) < 0) {
                dir = NULL;
                return -ENOMEM;
        }
        _cleanup_free_ char *rootfs = NULL;
        if (asprintf(&rootfs, "%s/rootfs", dir) < 0) {
                rootfs = NULL;
                return -ENOMEM;
        }
        struct stat st;
        bool present = stat(rootfs, &st) == 0 && S_ISDIR(st.st_mode);
        bool built = present && image_check(cfg, name);
        ImageInfo info = { .built = built };
        snprintf(info.name, sizeof(info.name), "%s", name);
        if (present) {
                if (!read_built_at(dir, info.built_at) && time_format_rfc3339(st.st_mtim.tv_sec, info.built_at) < 0)
                        info.built_at[0] = '\0';
                info.size_bytes = tree_size(name, dir, st.st_mtim.tv_sec);
        }
        *ret = info;
        return 0;
}

int images_list(const DaemonConfig *cfg, ImageFn fn, void *userdata) {
        bool have_default = false;
        ImageInfo info;
        int r = 0;
        DIR *d = opendir(cfg->image_dir);
        if (d) {
                struct dirent *de;
                while (r >= 0 && (de = readdir(d))) {
                        if (!image_name_ok(de->d_name))
                                continue;
                        if (strcmp(de->d_name, "default") == 0)
                                have_default = true;
                        if (image_info(cfg, de->d_name, &info) == 0)
                                r = fn(userdata, &info);
                }
                closedir(d);
        }
        if (r >= 0 && !have_default && image_info(cfg, "default", &info) == 0)
                r = fn(userdata, &info);
        return r;
}
