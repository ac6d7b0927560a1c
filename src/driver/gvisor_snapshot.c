#include "driver/gvisor_snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "common/path.h"
#include "driver/launch.h"

/* The snapshot's files beside the disk's, and a new sandbox's until its
 * first start. */
#define SNAP_MACHINE "machine"
#define PENDING_DIR "resume"
#define PENDING_MACHINE "resume.machine"
/* What runsc checkpoint writes into its image directory: one file here
 * (release 20240729, compressed); later releases split the memory into
 * pages files, which go along the same way. */
static const char *const image_files[] = { "checkpoint.img", "pages_meta.img", "pages.img" };

#define FORMAT 1
#define MACHINE_MAX 4096
/* runsc pause and resume answer at once; a checkpoint writes every page the
 * sandbox's processes touched, compressed (a few hundred MiB on a loaded
 * host takes tens of seconds). */
#define RUNSC_QUICK_MS 30000
#define RUNSC_CHECKPOINT_MS (300 * 1000)

/* What runsc checkpoint says of a file a process holds open after it was
 * deleted: the Sentry cannot save it (its restore opens files by name). */
#define RUNSC_DELETED_OPEN "deleted and invalidated dentries can't be restored"

/* `runsc --root state args...` with a deadline; on failure why gets the
 * first line runsc printed (its error; a stack trace may follow), and
 * -ESTALE is a deleted file held open. */
static int runsc_cmd(const GvisorRunsc *rs, const char *state, const char *const args[], int timeout_ms, char *why,
                     size_t why_len) {
        char *argv[16];
        size_t n = 0;
        argv[n++] = (char *)rs->path;
        argv[n++] = "--root";
        argv[n++] = (char *)state;
        for (size_t i = 0; args[i] && n < ELEMENTSOF(argv) - 1; i++)
                argv[n++] = (char *)args[i];
        argv[n] = NULL;
        /* Its output in a file of no name: a pipe could fill before it ends. */
        _cleanup_close_ int out = memfd_create("runsc-output", MFD_CLOEXEC);
        _cleanup_close_ int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (out < 0 || null_fd < 0)
                return -errno;
        int r = launch_fd_above_stdio(&out);
        if (r == 0)
                r = launch_fd_above_stdio(&null_fd);
        if (r < 0)
                return r;
        char *const envp[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
        LaunchFds lf = { .stdin_fd = null_fd, .stdout_fd = out, .stderr_fd = out };
        pid_t pid;
        r = launch_spawn(argv, envp, &lf, &pid);
        if (r < 0)
                return r;
        int st;
        r = launch_wait_or_kill(pid, timeout_ms, &st);
        if (r == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
                return 0;
        if (r == 0)
                r = -EIO;
        char buf[2048];
        ssize_t got = pread(out, buf, sizeof(buf) - 1, 0);
        buf[got > 0 ? got : 0] = '\0';
        buf[strcspn(buf, "\n")] = '\0';
        if (r != -ETIMEDOUT && strstr(buf, RUNSC_DELETED_OPEN))
                r = -ESTALE;
        snprintf(why, why_len, "runsc %s: %s", args[0],
                 r == -ETIMEDOUT ? "did not finish in time" : buf[0] ? buf : "failed");
        return r;
}

/* Everything a saved kernel needs to be the same where it is restored: the
 * runsc that saved it (its state format) and its platform, the agent that
 * runs in it (its pages are mapped from the host's file), the image (every
 * program's are), and the sandbox's shape. */
static int machine_key(const DriverSpec *spec, const GvisorRunsc *rs, char *buf, size_t len) {
        char rootfs[PATH_MAX], bin[PATH_IDENTITY_MAX], agent[PATH_IDENTITY_MAX], root[PATH_IDENTITY_MAX];
        int r;
        if ((r = path_join(rootfs, sizeof(rootfs), spec->image_dir, "rootfs")) < 0 ||
            (r = path_identity(rs->path, bin, sizeof(bin))) < 0 ||
            (r = path_identity(spec->agent_path, agent, sizeof(agent))) < 0 ||
            (r = path_identity(rootfs, root, sizeof(root))) < 0)
                return r;
        int n = snprintf(buf, len,
                         "format=%d platform=%s version=%s vcpu=%u mem=%u disk=%u pids=%u\n"
                         "runsc=%s\nagent=%s\nimage=%s\n",
                         FORMAT, rs->platform, rs->version, spec->vcpu, spec->memory_mib, spec->disk_mib,
                         spec->pids_max, bin, agent, root);
        return n < 0 || (size_t)n >= len ? -ENOBUFS : 0;
}

/* runsc writes its image as root, readable by all; the snapshot's files are
 * the daemon's alone, and synced before the snapshot is recorded. */
static int seal_image(int dfd) {
        bool any = false;
        for (size_t i = 0; i < ELEMENTSOF(image_files); i++) {
                _cleanup_close_ int fd = openat(dfd, image_files[i], O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (fd < 0) {
                        if (errno == ENOENT)
                                continue;
                        return -errno;
                }
                if (fchmod(fd, 0600) < 0 || fsync(fd) < 0)
                        return -errno;
                any = true;
        }
        return any ? 0 : -ENOENT;
}

int gvisor_snapshot_save(DriverInstance *inst, const DriverSpec *spec, const GvisorRunsc *rs, const char *dest_dir,
                         char *why, size_t why_len) {
        if (!inst || !inst->runsc_root || !launch_alive(inst))
                return -ESRCH;
        if (inst->tmpfs_layer)
                return -EOPNOTSUPP;
        char machine[MACHINE_MAX];
        int r = machine_key(spec, rs, machine, sizeof(machine));
        if (r < 0) {
                snprintf(why, why_len, "describing the sandbox: %s", strerror(-r));
                return r;
        }
        _cleanup_close_ int dfd = open(dest_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (dfd < 0)
                return -errno;
        /* Stopped inside its Sentry by the daemon (gvisor_runsc_pause), with
         * the channel quiet. The disk first, then the kernel, both at the
         * same stop: every write the Sentry made went to the layer through
         * the gofer (--overlay2=none, shared file access), so the layer
         * synced now holds the files the saved kernel has open, at their
         * sizes. */
        r = launch_snapshot_disk(inst, spec, dest_dir);
        if (r < 0)
                snprintf(why, why_len, "copying the disk: %s", strerror(-r));
        if (r == 0) {
                const char *const ck[] = { "checkpoint", "--leave-running", "--image-path", dest_dir, inst->id, NULL };
                r = runsc_cmd(rs, inst->runsc_root, ck, RUNSC_CHECKPOINT_MS, why, why_len);
                if (r < 0) {
                        /* runsc tells a full disk as a failed write. */
                        struct statvfs fs;
                        if (fstatvfs(dfd, &fs) == 0 && fs.f_bavail * fs.f_frsize < (1u << 20))
                                r = -ENOSPC;
                }
        }
        if (r == 0)
                r = seal_image(dfd);
        if (r == 0)
                r = io_write_text_at(dfd, SNAP_MACHINE, machine, true, 0600);
        /* Left as it was found: stopped, for the daemon to resume. */
        return r;
}

int gvisor_runsc_pause(DriverInstance *inst, const GvisorRunsc *rs, bool pause) {
        if (!inst || !inst->runsc_root || !launch_alive(inst))
                return -ESRCH;
        const char *const args[] = { pause ? "pause" : "resume", inst->id, NULL };
        char why[256];
        return runsc_cmd(rs, inst->runsc_root, args, RUNSC_QUICK_MS, why, sizeof(why));
}

bool gvisor_snapshot_has_memory(const char *snap_dir) {
        char p[PATH_MAX];
        return path_join(p, sizeof(p), snap_dir, SNAP_MACHINE) == 0 && access(p, F_OK) == 0;
}

/* Hard links: the image is as big as the memory the sandbox's processes
 * touched, and a restore only reads it. The snapshot and the sandbox share
 * the state directory's filesystem. */
static int link_image(int sfd, int pfd) {
        bool any = false;
        for (size_t i = 0; i < ELEMENTSOF(image_files); i++) {
                if (linkat(sfd, image_files[i], pfd, image_files[i], 0) == 0) {
                        any = true;
                        continue;
                }
                if (errno != ENOENT)
                        return -errno;
        }
        return any ? 0 : -ENOENT;
}

void gvisor_snapshot_forget(const char *sandbox_dir) {
        char p[PATH_MAX];
        if (path_join(p, sizeof(p), sandbox_dir, PENDING_MACHINE) == 0)
                (void)unlink(p);
        if (path_join(p, sizeof(p), sandbox_dir, PENDING_DIR) == 0)
                (void)path_remove_tree_at(AT_FDCWD, p);
}

int gvisor_snapshot_link(const char *snap_dir, const char *sandbox_dir) {
        _cleanup_close_ int sfd = open(snap_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        _cleanup_close_ int dfd = open(sandbox_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (sfd < 0 || dfd < 0)
                return -errno;
        gvisor_snapshot_forget(sandbox_dir);
        if (mkdirat(dfd, PENDING_DIR, 0700) < 0)
                return -errno;
        _cleanup_close_ int pfd = openat(dfd, PENDING_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (pfd < 0)
                return -errno;
        /* The machine file last: its presence is what makes the start
         * restore. */
        int r = link_image(sfd, pfd);
        if (r == 0 && linkat(sfd, SNAP_MACHINE, dfd, PENDING_MACHINE, 0) < 0)
                r = -errno;
        if (r == 0 && fsync(dfd) < 0)
                r = -errno;
        if (r < 0)
                gvisor_snapshot_forget(sandbox_dir);
        return r;
}

bool gvisor_snapshot_pending(const char *sandbox_dir, char *ret_dir, size_t len) {
        char p[PATH_MAX];
        if (path_join(p, sizeof(p), sandbox_dir, PENDING_MACHINE) < 0 || access(p, F_OK) < 0)
                return false;
        return path_join(ret_dir, len, sandbox_dir, PENDING_DIR) == 0;
}

int gvisor_snapshot_check(const DriverSpec *spec, const GvisorRunsc *rs, char *why, size_t why_len) {
        char p[PATH_MAX], saved[MACHINE_MAX], now[MACHINE_MAX];
        if (path_join(p, sizeof(p), spec->sandbox_dir, PENDING_MACHINE) < 0)
                return -ENAMETOOLONG;
        _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        ssize_t n = read(fd, saved, sizeof(saved) - 1);
        if (n < 0)
                return -errno;
        saved[n] = '\0';
        int r = machine_key(spec, rs, now, sizeof(now));
        if (r < 0)
                return r;
        if (strcmp(saved, now) != 0) {
                snprintf(why, why_len, "the memory snapshot was taken with another runsc, agent, image or shape");
                return -ESTALE;
        }
        return 0;
}
