#include "driver/microvm_template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "common/path.h"
#include "common/timeutil.h"
#include "driver/driver_agent.h"
#include "driver/microvm_disk.h"
#include "driver/microvm_guest.h"
#include "driver/microvm_initramfs.h"
#include "driver/microvm_qmp.h"
#include "proto/proto.h"

#define TEMPLATE_MAX 16        /* per image */
#define TEMPLATE_IDLE_S 600    /* a template restored within this is in use: never evicted */
#define TEMPLATE_RETRY_S 600   /* a build that failed is not tried again before this */
#define TEMPLATE_LOCK_MS 15000 /* the longest a start waits for somebody else's build */
#define TEMPLATE_MIGRATE_MS (120 * 1000)
#define RESUME_TIMEOUT_MS (60 * 1000)

bool microvm_templates_enabled(void) {
        const char *e = getenv("RUNTIME_MICROVM_SNAPSHOTS");
        return !e || strcmp(e, "0") != 0;
}


/* templates/<name>, opened, when its key file says exactly `key` (a
 * directory is renamed into place only once complete); -1 when not. Every
 * part of a template is then opened through this one descriptor, so that
 * all of them come from the same build even if the directory is replaced
 * meanwhile. */
static int template_open(int tfd, const char *name, const char *key) {
        _cleanup_close_ int dfd = openat(tfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (dfd < 0)
                return -1;
        _cleanup_close_ int kfd = openat(dfd, "key", O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        char have[4096];
        ssize_t got = kfd < 0 ? -1 : read(kfd, have, sizeof(have));
        size_t n = strlen(key);
        if (got < 0 || (size_t)got != n || memcmp(have, key, n) != 0)
                return -1;
        return TAKE_FD(dfd);
}

/* flock with a deadline. */
static int lock_until(int fd, int64_t deadline) {
        for (;;) {
                if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                        return 0;
                if (errno != EWOULDBLOCK && errno != EINTR)
                        return -errno;
                if ((int64_t)time_now_mono_ms() >= deadline)
                        return -EBUSY;
                usleep(50 * 1000);
        }
}

/* Removes templates/<name> (if dfd >= 0, only while it is still that
 * directory: a build may have replaced it since). Renamed away first, so
 * that a crash half-way never leaves a directory with a key. The caller
 * holds the templates directory's lock. */
static void template_discard_locked(int tfd, const char *name, int dfd) {
        struct stat a, b;
        if (dfd >= 0 && (fstat(dfd, &a) < 0 || fstatat(tfd, name, &b, AT_SYMLINK_NOFOLLOW) < 0 ||
                         a.st_dev != b.st_dev || a.st_ino != b.st_ino))
                return;
        char dead[80];
        if (snprintf(dead, sizeof(dead), "%s.dead", name) >= (int)sizeof(dead))
                return;
        (void)path_remove_tree_at(tfd, dead);
        if (renameat(tfd, name, tfd, dead) < 0)
                return;
        (void)fsync(tfd);
        (void)path_remove_tree_at(tfd, dead);
}

static void template_discard(int tfd, const char *name, int dfd) {
        if (lock_until(tfd, (int64_t)time_now_mono_ms() + TEMPLATE_LOCK_MS) == 0) {
                template_discard_locked(tfd, name, dfd);
                flock(tfd, LOCK_UN);
        }
}

/* The templates of an image, for the room check and eviction: how many, and
 * the least recently used one not used for TEMPLATE_IDLE_S (a restore touches
 * its template's key file), if any. */
static size_t templates_scan(int tfd, char *idlest, size_t idlest_len) {
        _cleanup_close_ int fd = fcntl(tfd, F_DUPFD_CLOEXEC, 3);
        DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
        if (!d)
                return 0;
        fd = -1;
        rewinddir(d);
        idlest[0] = 0;
        struct timespec idlest_t = { 0 }, now;
        clock_gettime(CLOCK_REALTIME, &now);
        size_t n = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l != 16 || strspn(de->d_name, "0123456789abcdef") != 16)
                        continue; /* <hash>.new, .dead, .lock */
                n++;
                char p[32];
                struct stat st;
                snprintf(p, sizeof(p), "%.16s/key", de->d_name /* 16 hex digits, checked above */);
                if (fstatat(dirfd(d), p, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        st.st_mtim = (struct timespec){ 0 };
                if (st.st_mtim.tv_sec > now.tv_sec - TEMPLATE_IDLE_S)
                        continue;
                if (!idlest[0] || st.st_mtim.tv_sec < idlest_t.tv_sec ||
                    (st.st_mtim.tv_sec == idlest_t.tv_sec && st.st_mtim.tv_nsec < idlest_t.tv_nsec)) {
                        snprintf(idlest, idlest_len, "%s", de->d_name);
                        idlest_t = st.st_mtim;
                }
        }
        closedir(d);
        return n;
}

/* Keys whose template could not be made lately, so that each first start
 * does not pay for a failing build again: in memory, for TEMPLATE_RETRY_S. */
static pthread_mutex_t failed_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
        uint64_t hash;
        int64_t until_ms;
} failed[16];

static bool template_failed_lately(uint64_t h) {
        bool r = false;
        pthread_mutex_lock(&failed_lock);
        for (size_t i = 0; i < ELEMENTSOF(failed); i++)
                if (failed[i].hash == h && failed[i].until_ms > (int64_t)time_now_mono_ms())
                        r = true;
        pthread_mutex_unlock(&failed_lock);
        return r;
}

static void template_failed(uint64_t h) {
        pthread_mutex_lock(&failed_lock);
        size_t slot = ELEMENTSOF(failed);
        for (size_t i = 0; i < ELEMENTSOF(failed) && slot == ELEMENTSOF(failed); i++)
                if (failed[i].hash == h)
                        slot = i;
        if (slot == ELEMENTSOF(failed)) {
                slot = 0;
                for (size_t i = 1; i < ELEMENTSOF(failed); i++)
                        if (failed[i].until_ms < failed[slot].until_ms)
                                slot = i;
        }
        failed[slot].hash = h;
        failed[slot].until_ms = (int64_t)time_now_mono_ms() + TEMPLATE_RETRY_S * 1000LL;
        pthread_mutex_unlock(&failed_lock);
}

/* Boots the template VM in the sandbox's cgroup (the sandbox that needs it
 * pays for it), waits for its agent's HELLO, saves the running guest with
 * QMP `migrate` to dir/state and keeps its disk as dir/upper.ext4. */
static int template_build(const MicrovmStart *s, const char *tmpdir, const char *tpl_name, char *why, size_t why_len) {
        char p_upper[PATH_MAX], p_initrd[PATH_MAX], p_state[PATH_MAX];
        if (path_join(p_upper, sizeof(p_upper), tmpdir, "upper.ext4") < 0 ||
            path_join(p_initrd, sizeof(p_initrd), tmpdir, "initrd.cpio") < 0 ||
            path_join(p_state, sizeof(p_state), tmpdir, "state") < 0)
                return -ENAMETOOLONG;
        int r = microvm_disk_make(p_upper, s->disk, s->log_fd);
        if (r < 0) {
                snprintf(why, why_len, "making the template's disk: %s", strerror(-r));
                return r;
        }
        r = microvm_initramfs_file(p_initrd, s->p_modules, s->spec->agent_path, NULL);
        if (r < 0) {
                snprintf(why, why_len, "writing the template's initramfs: %s", strerror(-r));
                return r;
        }
        _cleanup_close_ int initrd_fd = open(p_initrd, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        _cleanup_close_ int state_fd = open(p_state, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (initrd_fd < 0 || state_fd < 0)
                return -errno;
        int mv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, mv) < 0)
                return -errno;
        _cleanup_close_ int mon_host = mv[0];
        _cleanup_close_ int mon_vmm = mv[1];
        DriverInstance *inst = NULL;
        _cleanup_close_ int chan = -1;
        r = microvm_vm_start(s, tpl_name, initrd_fd, p_upper, mon_vmm, -1, &chan, &inst);
        if (r < 0) {
                snprintf(why, why_len, "starting QEMU: %s", strerror(-r));
                return r;
        }
        closep(&mon_vmm);
        mon_vmm = -1;
        int64_t deadline = (int64_t)time_now_mono_ms() + (int64_t)driver_microvm.hello_timeout_ms;
        r = driver_agent_read_frame(chan, PROTO_HELLO, 0, deadline, NULL);
        if (r < 0)
                snprintf(why, why_len, "the template's agent did not say HELLO: %s", strerror(-r));
        MicrovmQmp q = { .fd = mon_host };
        deadline = (int64_t)time_now_mono_ms() + TEMPLATE_MIGRATE_MS;
        if (r == 0)
                r = microvm_qmp_exec(&q, "{\"execute\":\"qmp_capabilities\"}\n", -1, deadline, NULL, why, why_len);
        /* Not stopped first: a guest saved while paused would stay paused
         * when restored. An idle guest's live save converges at once. */
        if (r == 0)
                r = microvm_qmp_save(&q, state_fd, deadline, why, why_len);
        if (r == -ETIMEDOUT && !why[0])
                snprintf(why, why_len, "QMP did not answer in time");
        else if (r < 0 && !why[0])
                snprintf(why, why_len, "QMP: %s", strerror(-r));
        /* The source is paused once the save completed: its disk and the
         * saved memory agree. */
        microvm_vm_free(inst);
        if (r < 0)
                return r;
        _cleanup_close_ int upper_fd = open(p_upper, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fsync(state_fd) < 0 || upper_fd < 0 || fsync(upper_fd) < 0)
                return -errno;
        return 0;
}

/* Makes sure the template for this start's key exists: its directory,
 * opened (template_open), and its name. A start never waits long for
 * somebody else's build, and never evicts a template in use: it boots
 * instead. */
static int template_get(const MicrovmStart *s, int tfd, char *name, size_t name_len, char *tpl_name, size_t tpl_len,
                        int *ret_dfd, char *why, size_t why_len) {
        char key[4096];
        int r = microvm_saved_guest_key(s, key, sizeof(key));
        if (r < 0) {
                snprintf(why, why_len, "template key: %s", strerror(-r));
                return r;
        }
        uint64_t h = fnv1a64_str(FNV1A64_INIT, key);
        snprintf(name, name_len, "%016llx", (unsigned long long)h);
        snprintf(tpl_name, tpl_len, "tpl-%016llx", (unsigned long long)h);
        if ((*ret_dfd = template_open(tfd, name, key)) >= 0)
                return 0;
        if (template_failed_lately(h)) {
                snprintf(why, why_len, "the template of this shape could not be made lately");
                return -EAGAIN;
        }
        /* One build per key at a time; other shapes build alongside. */
        char lockname[48], tmpname[48];
        snprintf(lockname, sizeof(lockname), "%.16s.lock", name);
        snprintf(tmpname, sizeof(tmpname), "%.16s.new", name);
        _cleanup_close_ int lfd = openat(tfd, lockname, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (lfd < 0)
                return -errno;
        r = lock_until(lfd, (int64_t)time_now_mono_ms() + TEMPLATE_LOCK_MS);
        if (r < 0) {
                snprintf(why, why_len, "the template of this shape is being made");
                return r;
        }
        if ((*ret_dfd = template_open(tfd, name, key)) >= 0)
                return 0; /* made while we waited */
        /* Room: at most TEMPLATE_MAX per image, and one in use (restored
         * from within TEMPLATE_IDLE_S) is never evicted for another. */
        char idlest[32];
        r = lock_until(tfd, (int64_t)time_now_mono_ms() + TEMPLATE_LOCK_MS);
        if (r < 0)
                return r;
        size_t n = templates_scan(tfd, idlest, sizeof(idlest));
        if (n >= TEMPLATE_MAX && !idlest[0]) {
                flock(tfd, LOCK_UN);
                snprintf(why, why_len, "%zu templates of this image in use, no room for another", n);
                return -ENOSPC;
        }
        flock(tfd, LOCK_UN);

        (void)path_remove_tree_at(tfd, tmpname);
        if (mkdirat(tfd, tmpname, 0700) < 0)
                return -errno;
        _cleanup_close_ int nfd = openat(tfd, tmpname, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (nfd < 0)
                return -errno;
        char p_tmp[PATH_MAX];
        if (snprintf(p_tmp, sizeof(p_tmp), "%s/microvm/templates/%s", microvm_boot_dir(s->spec), tmpname) >=
            (int)sizeof(p_tmp))
                return -ENAMETOOLONG;
        int64_t t0 = (int64_t)time_now_mono_ms();
        r = template_build(s, p_tmp, tpl_name, why, why_len);
        if (r == 0)
                r = io_write_text_at(nfd, "key", key, false, 0600);
        if (r == 0 && fsync(nfd) < 0)
                r = -errno;
        if (r == 0)
                r = lock_until(tfd, (int64_t)time_now_mono_ms() + TEMPLATE_LOCK_MS);
        if (r < 0) {
                (void)path_remove_tree_at(tfd, tmpname);
                template_failed(h);
                return r;
        }
        template_discard_locked(tfd, name, -1);
        if (renameat(tfd, tmpname, tfd, name) < 0) {
                r = -errno;
                flock(tfd, LOCK_UN);
                (void)path_remove_tree_at(tfd, tmpname);
                return r;
        }
        (void)fsync(tfd);
        /* Over the bound: the idlest goes (never one in use, nor this one). */
        while (templates_scan(tfd, idlest, sizeof(idlest)) > TEMPLATE_MAX && idlest[0] && strcmp(idlest, name) != 0) {
                template_discard_locked(tfd, idlest, -1);
                char gone[48];
                snprintf(gone, sizeof(gone), "%.16s.lock", idlest);
                (void)unlinkat(tfd, gone, 0);
        }
        flock(tfd, LOCK_UN);
        dprintf(s->log_fd, "runtimed: template %s made in %lld ms\n", name, (long long)((int64_t)time_now_mono_ms() - t0));
        *ret_dfd = template_open(tfd, name, key);
        return *ret_dfd >= 0 ? 0 : -ENOENT;
}

/* A sandbox's first start from its shape's template: its disk a copy of the
 * template's, its memory the template's saved guest, then `resume`. */
int microvm_template_start(const MicrovmStart *s, const char *p_upper, int *ret_fd, DriverInstance **ret, char *why,
                           size_t why_len) {
        char tdir[PATH_MAX], tmp[PATH_MAX];
        if (path_join(tdir, sizeof(tdir), microvm_boot_dir(s->spec), "microvm/templates") < 0 ||
            snprintf(tmp, sizeof(tmp), "%s.new", p_upper) >= (int)sizeof(tmp))
                return -ENAMETOOLONG;
        if (mkdir(tdir, 0700) < 0 && errno != EEXIST)
                return -errno;
        _cleanup_close_ int tfd = open(tdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (tfd < 0)
                return -errno;
        char name[32], tpl_name[48];
        _cleanup_close_ int dfd = -1;
        int r = template_get(s, tfd, name, sizeof(name), tpl_name, sizeof(tpl_name), &dfd, why, why_len);
        if (r < 0)
                return r;
        /* A template missing a part (a crash while it was removed) goes,
         * rather than being tried at every start. */
        _cleanup_close_ int in = openat(dfd, "upper.ext4", O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        _cleanup_close_ int initrd_fd = openat(dfd, "initrd.cpio", O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        _cleanup_close_ int state_fd = openat(dfd, "state", O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in < 0 || initrd_fd < 0 || state_fd < 0) {
                r = -errno;
                snprintf(why, why_len, "template %s incomplete: %s", name, strerror(-r));
                template_discard(tfd, name, dfd);
                return r;
        }
        {
                (void)unlink(tmp);
                _cleanup_close_ int out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (out < 0)
                        return -errno;
                r = io_copy_sparse(in, out);
                /* Durable before it is named: a later start boots on it. */
                if (r == 0 && fsync(out) < 0)
                        r = -errno;
                if (r == 0 && rename(tmp, p_upper) < 0)
                        r = -errno;
                if (r < 0) {
                        (void)unlink(tmp);
                        snprintf(why, why_len, "copying the template's disk: %s", strerror(-r));
                        return r;
                }
        }
        dprintf(s->log_fd, "runtimed: restoring from template %s\n", name);
        DriverInstance *inst = NULL;
        _cleanup_close_ int chan = -1;
        r = microvm_vm_start(s, tpl_name, initrd_fd, p_upper, -1, state_fd, &chan, &inst);
        if (r < 0) {
                snprintf(why, why_len, "starting QEMU: %s", strerror(-r));
                return r;
        }
        r = driver_agent_resume(chan, s->spec->id, (int64_t)time_now_mono_ms() + RESUME_TIMEOUT_MS, why, why_len);
        if (r < 0) {
                microvm_vm_free(inst);
                /* A template that does not come back (damaged, or from a
                 * QEMU that changed under the same file) is made anew by
                 * the next start rather than tried again and again; one a
                 * build replaced meanwhile is left alone. */
                template_discard(tfd, name, dfd);
                return r;
        }
        (void)utimensat(dfd, "key", NULL, 0); /* in use: not to be evicted */
        *ret_fd = TAKE_FD(chan);
        *ret = inst;
        return 0;
}
