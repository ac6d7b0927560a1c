#include "driver/microvm_snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "common/path.h"
#include "common/timeutil.h"
#include "driver/driver_agent.h"
#include "driver/microvm_guest.h"
#include "driver/rootfs.h"

/* A snapshot's files (in its directory) and, until the start that resumes
 * them, a new sandbox's (in its sandbox_dir). */
#define SNAP_MEMORY "memory"
#define SNAP_INITRD "initrd.cpio"
#define SNAP_MACHINE "machine"
#define SNAP_DISK "upper.ext4"
#define PENDING_MEMORY "resume.memory"
#define PENDING_INITRD "resume.initrd"
#define PENDING_MACHINE "resume.machine"

/* The longest a save or a load may take: a guest of a few GiB under
 * software emulation on a loaded host. */
#define SAVE_TIMEOUT_MS (300 * 1000)
#define RESUME_TIMEOUT_MS (60 * 1000)
/* The machine file: the hostname line and the key (a few hundred bytes). */
#define MACHINE_MAX 8192

static int copy_fd_to(int in, int dfd, const char *name, mode_t mode) {
        _cleanup_close_ int out = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
        if (out < 0)
                return -errno;
        if (lseek(in, 0, SEEK_SET) < 0)
                return -errno;
        int r = io_copy_sparse(in, out);
        if (r == 0 && fsync(out) < 0)
                r = -errno;
        return r;
}

int microvm_snapshot_save(DriverInstance *inst, const char *dest_dir, char *why, size_t why_len) {
        const char *hostname = microvm_vm_hostname(inst), *key = microvm_vm_key(inst);
        int initrd = microvm_vm_initrd_fd(inst);
        if (!hostname || !key || initrd < 0) {
                snprintf(why, why_len, "the VM's start was not recorded whole");
                return -ENODATA;
        }
        _cleanup_close_ int dfd = open(dest_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (dfd < 0)
                return -errno;
        _cleanup_close_ int state =
                openat(dfd, SNAP_MEMORY, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (state < 0)
                return -errno;
        /* The guest is stopped: one pass writes its memory and devices, and
         * its disk (cache=none, requests drained by the stop) is then the
         * disk that memory knows. */
        int r = microvm_vm_save(inst, state, (int64_t)time_now_mono_ms() + SAVE_TIMEOUT_MS, why, why_len);
        if (r < 0) {
                /* QEMU tells a full disk as a failed save: told as such. */
                struct statvfs fs;
                if (fstatvfs(state, &fs) == 0 && fs.f_bavail * fs.f_frsize < (1u << 20))
                        return -ENOSPC;
                return r;
        }
        if (fsync(state) < 0)
                return -errno;
        /* Copied as it lies, journal and all: the guest's memory holds the
         * journal's state, and replaying it here would change the disk
         * under a kernel that resumes. */
        char to[PATH_MAX];
        if (path_join(to, sizeof(to), dest_dir, SNAP_DISK) < 0)
                return -ENAMETOOLONG;
        r = rootfs_copy_sparse(microvm_vm_upper_path(inst), to);
        if (r < 0) {
                snprintf(why, why_len, "copying the disk: %s", strerror(-r));
                return r;
        }
        /* Readable by QEMU's uid, which opens it again by /proc/self/fd
         * (as every start's initramfs: the modules and the agent, no
         * secret). */
        r = copy_fd_to(initrd, dfd, SNAP_INITRD, 0644);
        if (r < 0)
                return r;
        char machine[MACHINE_MAX];
        int n = snprintf(machine, sizeof(machine), "%s\n%s", hostname, key);
        if (n < 0 || (size_t)n >= sizeof(machine))
                return -ENOBUFS;
        _cleanup_close_ int mfd = openat(dfd, SNAP_MACHINE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (mfd < 0)
                return -errno;
        r = io_write_all(mfd, machine, (size_t)n);
        if (r == 0 && fsync(mfd) < 0)
                r = -errno;
        return r;
}

bool microvm_snapshot_has_memory(const char *snap_dir) {
        char p[PATH_MAX];
        return path_join(p, sizeof(p), snap_dir, SNAP_MEMORY) == 0 && access(p, F_OK) == 0;
}

/* Linked where the snapshot's directory and the sandbox's share a
 * filesystem (both under the state directory): the memory file is as big
 * as the guest's used memory, and a start only reads it. */
static int link_or_copy(int sfd, const char *from, int dfd, const char *to) {
        if (linkat(sfd, from, dfd, to, 0) == 0)
                return 0;
        if (errno != EXDEV && errno != EPERM)
                return -errno;
        _cleanup_close_ int in = openat(sfd, from, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in < 0)
                return -errno;
        struct stat st;
        if (fstat(in, &st) < 0)
                return -errno;
        return copy_fd_to(in, dfd, to, st.st_mode & 0644);
}

int microvm_snapshot_link(const char *snap_dir, const char *sandbox_dir) {
        _cleanup_close_ int sfd = open(snap_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        _cleanup_close_ int dfd = open(sandbox_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (sfd < 0 || dfd < 0)
                return -errno;
        static const char *const from[] = { SNAP_INITRD, SNAP_MACHINE, SNAP_MEMORY };
        static const char *const to[] = { PENDING_INITRD, PENDING_MACHINE, PENDING_MEMORY };
        int r = 0;
        /* The memory last: its presence is what makes the start resume. */
        for (size_t i = 0; i < ELEMENTSOF(from) && r == 0; i++) {
                (void)unlinkat(dfd, to[i], 0);
                r = link_or_copy(sfd, from[i], dfd, to[i]);
        }
        if (r < 0)
                for (size_t i = 0; i < ELEMENTSOF(to); i++)
                        (void)unlinkat(dfd, to[i], 0);
        return r;
}

bool microvm_snapshot_pending(const char *sandbox_dir) {
        char p[PATH_MAX];
        return path_join(p, sizeof(p), sandbox_dir, PENDING_MEMORY) == 0 && access(p, F_OK) == 0;
}

void microvm_snapshot_forget(const char *sandbox_dir) {
        static const char *const names[] = { PENDING_MEMORY, PENDING_INITRD, PENDING_MACHINE };
        char p[PATH_MAX];
        for (size_t i = 0; i < ELEMENTSOF(names); i++)
                if (path_join(p, sizeof(p), sandbox_dir, names[i]) == 0)
                        (void)unlink(p);
}

int microvm_snapshot_start(const MicrovmStart *s, const char *p_upper, int *ret_fd, DriverInstance **ret, char *why,
                           size_t why_len) {
        const char *dir = s->spec->sandbox_dir;
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (dfd < 0)
                return -errno;
        _cleanup_close_ int state = openat(dfd, PENDING_MEMORY, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        _cleanup_close_ int initrd = openat(dfd, PENDING_INITRD, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        _cleanup_close_ int mfd = openat(dfd, PENDING_MACHINE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        /* Tried once: a later start (a wake of the stopped copy) boots on
         * its disk. */
        microvm_snapshot_forget(dir);
        if (state < 0 || initrd < 0 || mfd < 0) {
                snprintf(why, why_len, "the memory snapshot's files are incomplete");
                return -ENOENT;
        }
        char machine[MACHINE_MAX], key[4096];
        ssize_t n = read(mfd, machine, sizeof(machine) - 1);
        if (n <= 0)
                return n < 0 ? -errno : -EINVAL;
        machine[n] = 0;
        char *nl = strchr(machine, '\n');
        if (!nl || nl == machine || nl - machine > 64) {
                snprintf(why, why_len, "the memory snapshot's machine file is damaged");
                return -EINVAL;
        }
        *nl = 0;
        const char *hostname = machine, *saved_key = nl + 1;
        int r = microvm_saved_guest_key(s, key, sizeof(key));
        if (r < 0)
                return r;
        /* A saved guest loads only into the same QEMU, devices, kernel and
         * shape it was saved from. */
        if (strcmp(key, saved_key) != 0) {
                snprintf(why, why_len,
                         "the memory snapshot was taken with another QEMU, kernel, image, agent or shape than "
                         "this host has now");
                return -ESTALE;
        }
        DriverInstance *inst = NULL;
        _cleanup_close_ int chan = -1;
        r = microvm_vm_start(s, hostname, initrd, p_upper, -1, state, &chan, &inst);
        if (r < 0) {
                snprintf(why, why_len, "starting QEMU: %s", strerror(-r));
                return r;
        }
        int64_t deadline = (int64_t)time_now_mono_ms() + SAVE_TIMEOUT_MS;
        r = microvm_vm_finish_incoming(inst, deadline, why, why_len);
        if (r == 0)
                r = driver_agent_resume(chan, s->spec->id, (int64_t)time_now_mono_ms() + RESUME_TIMEOUT_MS, why,
                                         why_len);
        if (r < 0) {
                microvm_vm_free(inst);
                return r;
        }
        *ret_fd = TAKE_FD(chan);
        *ret = inst;
        return 0;
}
