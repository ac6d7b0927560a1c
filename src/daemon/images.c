/* The images on this host: their names, whether they are built and up to
 * date (the builder's --check), when, and their size. */
#include "daemon/images.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/macro.h"
#include "daemon/config.h"

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

/* Runs `builder --check IMAGE_DIR NAME`: exit 0 when built and up to date. */
static bool image_check(const DaemonConfig *cfg, const char *name) {
        pid_t pid = fork();
        if (pid < 0)
                return false;
        if (pid == 0) {
                int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
                if (devnull >= 0) {
                        dup2(devnull, 0);
                        dup2(devnull, 1);
                        dup2(devnull, 2);
                }
                execl(cfg->image_builder, cfg->image_builder, "--check", cfg->image_dir, name, (char *)NULL);
                _exit(127);
        }
        int status;
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return false;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
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
