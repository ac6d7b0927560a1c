/*
 * The microVM driver: QEMU's `microvm` machine, one guest kernel per sandbox
 * (docs/microvm.md has the reasons for every choice made here).
 *
 *   host                                    guest
 *   runtimed -- socketpair -- QEMU -------- virtio-serial port --- runtime-agent (PID 1)
 *   image/microvm/root.ext4 (shared, ro) -- virtio-blk "root"  -\
 *   sandbox_dir/upper.ext4 (diskMiB)   ---- virtio-blk "upper" --+- overlayfs = /
 *   sandbox_dir/initrd.cpio (agent + modules), the kernel of the image
 *   serial console -- socketpair -- console thread -> sandbox_dir/console.log (bounded)
 *
 * QEMU runs in the sandbox's cgroup, as an unprivileged uid of its own, with
 * no_new_privs, the sandbox seccomp policy and QEMU's own -sandbox, with no
 * NIC and nothing of the host open but the descriptors it is handed: it
 * never opens a path of the sandbox or of the image itself.
 */
#include "driver/microvm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <jansson.h>
#include <limits.h>
#include <linux/close_range.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "driver/cgroup.h"
#include "driver/seccomp.h"
#include "proto/proto.h"

#define CGROUP_ROOT "/sys/fs/cgroup"
#define CHANNEL_PORT "org.runtime.agent.0"
#define CHANNEL_PATH "/dev/virtio-ports/" CHANNEL_PORT
#define BUILDER_NAME "runtime-microvm-build"
/* The kernel probe: a guest kernel gets this long under KVM to boot and
 * panic for want of a root (which, with panic=-1 and -no-reboot, ends QEMU).
 * A working KVM needs well under a second. */
#define PROBE_KERNEL_MS 4000
#define PROBE_FIRMWARE_MS 2000
#define BUILDER_TIMEOUT_MS (10 * 60 * 1000)
#define KILL_TIMEOUT_MS 5000
/* A 4096-byte page of the guest's mke2fs input: the upper disk is at least
 * this big, whatever diskMiB says. */
#define MIN_DISK_MIB 16u
#define MAX_DISK_MIB (1024u * 1024u)
/* Under TCG, with tsc_early_khz and lpj (microvm_kernel_cmdline): with no
 * calibration reference on microvm (no PIT, HPET or PM timer to calibrate
 * against) the kernel would otherwise spin. */
#define TCG_KERNEL_OPTS "tsc=reliable no_timer_check"

struct DriverInstance {
        char *id;
        char *sandbox_dir;
        char *upper_path;
        pid_t pid;
        int pidfd;
        bool exited;
        int wait_status;
        CgroupLayout layout;
        Cgroup *cg;
        int console_fd; /* our end of the serial console's socket */
        int console_log_fd;
        int vmm_err_fd; /* read end of QEMU's stderr */
        int vmm_log_fd;
        pthread_t console_thread;
        bool console_running;
};

/* ---- small helpers ------------------------------------------------------ */

static int64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int path_join(char *buf, size_t len, const char *a, const char *b) {
        int n = snprintf(buf, len, "%s/%s", a, b);
        return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int write_all(int fd, const void *buf, size_t n) {
        const uint8_t *p = buf;
        while (n > 0) {
                ssize_t w = write(fd, p, n);
                if (w < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += w;
                n -= (size_t)w;
        }
        return 0;
}

static int read_text(const char *path, char *buf, size_t len) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        ssize_t n = read(fd, buf, len - 1);
        if (n < 0)
                return -errno;
        buf[n] = 0;
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
                buf[--n] = 0;
        return 0;
}

/* Waits for pid with a deadline; kills it when the deadline passes. 0 and
 * the wait status, or -ETIMEDOUT (the child was killed and reaped). */
static int wait_deadline(pid_t pid, int timeout_ms, int *ret_status) {
        _cleanup_close_ int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        int64_t end = now_ms() + timeout_ms;
        for (;;) {
                int status;
                pid_t r = waitpid(pid, &status, WNOHANG);
                if (r == pid) {
                        *ret_status = status;
                        return 0;
                }
                if (r < 0 && errno != EINTR)
                        return -errno;
                int64_t left = end - now_ms();
                if (left <= 0)
                        break;
                if (pidfd >= 0) {
                        struct pollfd p = { .fd = pidfd, .events = POLLIN };
                        poll(&p, 1, (int)(left > 1000 ? 1000 : left));
                } else {
                        usleep(10000);
                }
        }
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
        return -ETIMEDOUT;
}

static const char *qemu_binary(void) {
        static const char *const candidates[] = { "/usr/bin/qemu-system-x86_64",
                                                  "/usr/local/bin/qemu-system-x86_64" };
        for (size_t i = 0; i < ELEMENTSOF(candidates); i++)
                if (access(candidates[i], X_OK) == 0)
                        return candidates[i];
        return NULL;
}

uint32_t microvm_uid_for(const char *id) {
        /* FNV-1a: stable across restarts, so a restarted daemon's reap finds
         * the same uid; uniqueness is the cgroup's job, this only keeps
         * VMMs of different sandboxes apart in the common case. */
        uint32_t h = 2166136261u;
        for (const char *p = id; *p; p++) {
                h ^= (uint8_t)*p;
                h *= 16777619u;
        }
        return MICROVM_UID_BASE + h % MICROVM_UID_COUNT;
}

/* ---- the child: from the daemon's fork to QEMU -------------------------- */

typedef struct ChildSetup {
        const char *qemu;
        char **argv;
        int cgroup_fds[_CGROUP_HIER_MAX];
        int keep_fds[9]; /* kept open across exec, at their own numbers */
        size_t n_keep;
        int log_fd; /* stdout and stderr */
        uid_t uid;
        gid_t gid;
        gid_t extra_gid; /* (gid_t)-1 when none: the group of /dev/kvm */
        bool join_cgroup;
        /* The sandbox seccomp policy, built before the fork (building it
         * allocates, which a forked child of a threaded daemon must not). */
        const uint8_t *seccomp_prog;
        size_t seccomp_len;
} ChildSetup;

/* Runs in the forked child: async-signal-safe calls only. */
_Noreturn static void child_exec(const ChildSetup *c) {
        sigset_t none;
        sigemptyset(&none);
        if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
                _exit(119);
        if (c->join_cgroup && cgroup_join_fds(c->cgroup_fds, _CGROUP_HIER_MAX) < 0)
                _exit(120);
        int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (devnull < 0 || dup2(devnull, STDIN_FILENO) < 0)
                _exit(121);
        if (dup2(c->log_fd, STDOUT_FILENO) < 0 || dup2(c->log_fd, STDERR_FILENO) < 0)
                _exit(121);
        /* Only the handed descriptors survive exec, whatever another thread
         * of the daemon opened without O_CLOEXEC. */
        if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
                _exit(122);
        for (size_t i = 0; i < c->n_keep; i++) {
                int fl = fcntl(c->keep_fds[i], F_GETFD);
                if (fl < 0 || fcntl(c->keep_fds[i], F_SETFD, fl & ~FD_CLOEXEC) < 0)
                        _exit(122);
        }
        if (setsid() < 0)
                _exit(123);
        gid_t groups[1] = { c->extra_gid };
        if (setgroups(c->extra_gid == (gid_t)-1 ? 0 : 1, groups) < 0)
                _exit(124);
        if (setresgid(c->gid, c->gid, c->gid) < 0 || setresuid(c->uid, c->uid, c->uid) < 0)
                _exit(125);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                _exit(126);
        if (c->seccomp_prog) {
                struct sock_fprog fp = { .len = (unsigned short)(c->seccomp_len / sizeof(struct sock_filter)),
                                         .filter = (struct sock_filter *)(uintptr_t)c->seccomp_prog };
                if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fp, 0, 0) < 0)
                        _exit(127);
        }
        static char *const env[] = { "PATH=/usr/bin:/bin", "LC_ALL=C", NULL };
        execve(c->qemu, c->argv, env);
        _exit(127);
}

/* ---- acceleration -------------------------------------------------------- */

typedef enum AccelState {
        ACCEL_UNKNOWN,
        ACCEL_KVM_FIRMWARE, /* KVM ran the firmware blob; no kernel tried yet */
        ACCEL_KVM,
        ACCEL_TCG,
} AccelState;

static pthread_mutex_t accel_lock = PTHREAD_MUTEX_INITIALIZER;
static AccelState accel_state = ACCEL_UNKNOWN;
static char accel_why[256];

/* 64 KiB of firmware: at the reset vector, write 0x21 to the isa-debug-exit
 * port (QEMU exits with status 0x43) and halt. */
static int write_probe_firmware(int fd) {
        static uint8_t fw[65536];
        memset(fw, 0xf4, sizeof(fw)); /* hlt */
        static const uint8_t code[] = { 0xb0, 0x21, 0xe6, 0xf4, 0xf4, 0xeb, 0xfe };
        memcpy(fw + 0xfff0, code, sizeof(code));
        if (write_all(fd, fw, sizeof(fw)) < 0)
                return -EIO;
        return 0;
}

static gid_t kvm_group(void) {
        struct stat st;
        if (stat("/dev/kvm", &st) < 0 || (st.st_mode & 0060) != 0060)
                return (gid_t)-1;
        return st.st_gid;
}

/* Runs QEMU under KVM as the unprivileged VMM user with a deadline: the
 * firmware blob (kernel NULL) or the kernel with no root, which panics and,
 * with panic=-1 and -no-reboot, ends QEMU with status 0. 0 when the guest
 * got to its end; else -errno and a reason in why. */
static int kvm_try(const char *kernel, char *why, size_t why_len) {
        const char *qemu = qemu_binary();
        if (!qemu) {
                snprintf(why, why_len, "qemu-system-x86_64 not found");
                return -ENOENT;
        }
        _cleanup_close_ int log_fd = memfd_create("microvm-probe-log", MFD_CLOEXEC);
        _cleanup_close_ int img_fd = -1;
        if (log_fd < 0)
                return -errno;
        if (kernel) {
                img_fd = open(kernel, O_RDONLY | O_CLOEXEC);
        } else {
                img_fd = memfd_create("microvm-probe-fw", MFD_CLOEXEC);
                if (img_fd >= 0 && write_probe_firmware(img_fd) < 0)
                        return -EIO;
        }
        if (img_fd < 0)
                return -errno;
        char img_path[64];
        snprintf(img_path, sizeof(img_path), "/proc/self/fd/%d", img_fd);
        char *argv[40];
        size_t n = 0;
        argv[n++] = "qemu-system-x86_64";
        argv[n++] = "-M";
        argv[n++] = "microvm,accel=kvm,x-option-roms=off,rtc=off";
        argv[n++] = "-cpu";
        argv[n++] = "host";
        argv[n++] = "-m";
        argv[n++] = "128";
        argv[n++] = "-smp";
        argv[n++] = "1";
        argv[n++] = "-nodefaults";
        argv[n++] = "-no-user-config";
        argv[n++] = "-display";
        argv[n++] = "none";
        argv[n++] = "-no-reboot";
        argv[n++] = "-sandbox";
        argv[n++] = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";
        if (kernel) {
                argv[n++] = "-kernel";
                argv[n++] = img_path;
                argv[n++] = "-append";
                argv[n++] = "panic=-1 reboot=t quiet console=none";
        } else {
                argv[n++] = "-bios";
                argv[n++] = img_path;
                argv[n++] = "-device";
                argv[n++] = "isa-debug-exit,iobase=0xf4,iosize=1";
        }
        argv[n] = NULL;

        ChildSetup c = {
                .qemu = qemu,
                .argv = argv,
                .keep_fds = { img_fd },
                .n_keep = 1,
                .log_fd = log_fd,
                .uid = microvm_uid_for("kvm-probe"),
                .gid = microvm_uid_for("kvm-probe"),
                .extra_gid = kvm_group(),
                .join_cgroup = false,
        };
        if (seccomp_policy_bpf(&c.seccomp_prog, &c.seccomp_len) < 0)
                c.seccomp_prog = NULL;
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0)
                child_exec(&c);
        int status;
        int r = wait_deadline(pid, kernel ? PROBE_KERNEL_MS : PROBE_FIRMWARE_MS, &status);
        if (r == -ETIMEDOUT) {
                snprintf(why, why_len, "a guest %s under KVM did not finish within %d ms (KVM present but hangs guests)",
                         kernel ? "kernel" : "firmware", kernel ? PROBE_KERNEL_MS : PROBE_FIRMWARE_MS);
                return r;
        }
        if (r < 0)
                return r;
        int want = kernel ? 0 : 0x43;
        if (WIFEXITED(status) && WEXITSTATUS(status) == want)
                return 0;
        /* The first line QEMU wrote says why (no access to /dev/kvm, an MSR
         * the nested hypervisor refuses, ...). */
        char msg[160] = "";
        ssize_t got = pread(log_fd, msg, sizeof(msg) - 1, 0);
        if (got > 0) {
                msg[got] = 0;
                msg[strcspn(msg, "\n")] = 0;
        }
        if (WIFEXITED(status))
                snprintf(why, why_len, "QEMU under KVM exited %d%s%s", WEXITSTATUS(status), msg[0] ? ": " : "", msg);
        else
                snprintf(why, why_len, "QEMU under KVM died of signal %d%s%s", WTERMSIG(status), msg[0] ? ": " : "",
                         msg);
        return -ENODEV;
}

MicrovmAccel microvm_accel(const char *kernel, char *why, size_t why_len) {
        pthread_mutex_lock(&accel_lock);
        const char *force = getenv("RUNTIME_MICROVM_ACCEL");
        if (accel_state == ACCEL_UNKNOWN && force && (strcmp(force, "tcg") == 0 || strcmp(force, "kvm") == 0)) {
                accel_state = strcmp(force, "kvm") == 0 ? ACCEL_KVM : ACCEL_TCG;
                snprintf(accel_why, sizeof(accel_why), "%s, forced by RUNTIME_MICROVM_ACCEL",
                         accel_state == ACCEL_KVM ? "KVM" : "TCG");
        }
        bool have_kernel = kernel && access(kernel, R_OK) == 0;
        if (accel_state == ACCEL_UNKNOWN || (accel_state == ACCEL_KVM_FIRMWARE && have_kernel)) {
                char reason[200] = "";
                if (access("/dev/kvm", F_OK) < 0) {
                        accel_state = ACCEL_TCG;
                        snprintf(accel_why, sizeof(accel_why), "TCG: no /dev/kvm");
                } else if (kvm_try(have_kernel ? kernel : NULL, reason, sizeof(reason)) == 0) {
                        accel_state = have_kernel ? ACCEL_KVM : ACCEL_KVM_FIRMWARE;
                        snprintf(accel_why, sizeof(accel_why), "KVM: a guest %s booted under it",
                                 have_kernel ? "kernel" : "firmware");
                } else {
                        accel_state = ACCEL_TCG;
                        snprintf(accel_why, sizeof(accel_why), "TCG: %s", reason);
                }
        }
        MicrovmAccel a = accel_state == ACCEL_TCG ? MICROVM_ACCEL_TCG : MICROVM_ACCEL_KVM;
        if (why)
                snprintf(why, why_len, "%s", accel_why);
        pthread_mutex_unlock(&accel_lock);
        return a;
}

/* ---- the image's parts --------------------------------------------------- */

/* The builder script: next to the daemon, in ../libexec/runtime, or next to
 * the build directory of a test binary. */
static int find_builder(char *buf, size_t len) {
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n <= 0)
                return -ENOENT;
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (!slash)
                return -ENOENT;
        *slash = 0;
        static const char *const rel[] = { BUILDER_NAME, "../libexec/runtime/" BUILDER_NAME, "../" BUILDER_NAME };
        for (size_t i = 0; i < ELEMENTSOF(rel); i++) {
                int m = snprintf(buf, len, "%s/%s", exe, rel[i]);
                if (m > 0 && (size_t)m < len && access(buf, X_OK) == 0)
                        return 0;
        }
        return -ENOENT;
}

static bool image_parts_current(const char *image_dir) {
        char p[PATH_MAX], stamp[160], built[64];
        static const char *const parts[] = { "microvm/vmlinuz", "microvm/root.ext4", "microvm/modules" };
        for (size_t i = 0; i < ELEMENTSOF(parts); i++)
                if (path_join(p, sizeof(p), image_dir, parts[i]) < 0 || access(p, R_OK) < 0)
                        return false;
        if (path_join(p, sizeof(p), image_dir, "microvm/root.stamp") < 0 || read_text(p, stamp, sizeof(stamp)) < 0)
                return false;
        if (path_join(p, sizeof(p), image_dir, "built-at") < 0 || read_text(p, built, sizeof(built)) < 0)
                return true; /* an image without a stamp: the builder's own check decides */
        /* root.stamp is "<built-at> <recipe>": a rebuilt image needs a new
         * root.ext4 (a changed recipe is the builder's to notice). */
        size_t l = strlen(built);
        return strncmp(stamp, built, l) == 0 && (stamp[l] == ' ' || stamp[l] == 0);
}

/* Runs the builder for image_dir (.../<images>/<name>), its output to log_fd. */
static int build_image_parts(const char *image_dir, int log_fd) {
        char builder[PATH_MAX];
        if (find_builder(builder, sizeof(builder)) < 0)
                return -ENOENT;
        _cleanup_free_ char *root = strdup(image_dir);
        if (!root)
                return -ENOMEM;
        size_t l = strlen(root);
        while (l > 1 && root[l - 1] == '/')
                root[--l] = 0;
        char *slash = strrchr(root, '/');
        if (!slash || slash == root || !slash[1])
                return -EINVAL;
        *slash = 0;
        const char *name = slash + 1;
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0)
                        _exit(127);
                execl(builder, BUILDER_NAME, root, name, (char *)NULL);
                _exit(127);
        }
        int status;
        int r = wait_deadline(pid, BUILDER_TIMEOUT_MS, &status);
        if (r < 0)
                return r;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

/* ---- the initramfs of one start ----------------------------------------- */

typedef struct CpioWriter {
        int fd;
        uint32_t ino;
        uint64_t off;
} CpioWriter;

static int cpio_pad(CpioWriter *w, size_t align) {
        static const uint8_t zeros[512];
        size_t pad = (align - w->off % align) % align;
        if (pad == 0)
                return 0;
        w->off += pad;
        return write_all(w->fd, zeros, pad);
}

/* One newc entry; the body comes from body_fd (size bytes) or is empty. */
static int cpio_entry(CpioWriter *w, const char *name, uint32_t mode, uint32_t rmaj, uint32_t rmin, int body_fd,
                      uint64_t size) {
        if (size > UINT32_MAX)
                return -EFBIG;
        size_t namesize = strlen(name) + 1;
        if (namesize > 4096)
                return -ENAMETOOLONG;
        char hdr[128];
        snprintf(hdr, sizeof(hdr), "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", ++w->ino, mode, 0u,
                 0u, 1u, 0u, (uint32_t)size, 0u, 0u, rmaj, rmin, (uint32_t)namesize, 0u);
        int r = write_all(w->fd, hdr, 110);
        if (r < 0)
                return r;
        r = write_all(w->fd, name, namesize);
        if (r < 0)
                return r;
        w->off += 110 + namesize;
        r = cpio_pad(w, 4);
        if (r < 0)
                return r;
        uint8_t buf[65536];
        uint64_t left = size;
        while (left > 0) {
                ssize_t n = read(body_fd, buf, left < sizeof(buf) ? left : sizeof(buf));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return n < 0 ? -errno : -EIO; /* the file shrank under us */
                r = write_all(w->fd, buf, (size_t)n);
                if (r < 0)
                        return r;
                left -= (uint64_t)n;
                w->off += (uint64_t)n;
        }
        return cpio_pad(w, 4);
}

static int cpio_file(CpioWriter *w, const char *name, const char *path, uint32_t perm) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        return cpio_entry(w, name, S_IFREG | perm, 0, 0, fd, (uint64_t)st.st_size);
}

static int cmp_str(const void *a, const void *b) {
        return strcmp(*(char *const *)a, *(char *const *)b);
}

int microvm_write_initramfs(int fd, const char *modules_dir, const char *agent) {
        CpioWriter w = { .fd = fd };
        int r;
        if ((r = cpio_entry(&w, "dev", S_IFDIR | 0755, 0, 0, -1, 0)) < 0 ||
            (r = cpio_entry(&w, "dev/console", S_IFCHR | 0600, 5, 1, -1, 0)) < 0 ||
            (r = cpio_entry(&w, "lib", S_IFDIR | 0755, 0, 0, -1, 0)) < 0 ||
            (r = cpio_entry(&w, "lib/runtime-modules", S_IFDIR | 0755, 0, 0, -1, 0)) < 0)
                return r;

        DIR *d = opendir(modules_dir);
        if (!d)
                return -errno;
        char *names[64];
        size_t n = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l < 4 || l > 64 || strcmp(de->d_name + l - 3, ".ko") != 0)
                        continue;
                if (n == ELEMENTSOF(names))
                        break;
                names[n] = strdup(de->d_name);
                if (!names[n]) {
                        r = -ENOMEM;
                        break;
                }
                n++;
        }
        closedir(d);
        if (r == 0)
                qsort(names, n, sizeof(names[0]), cmp_str);
        for (size_t i = 0; i < n && r == 0; i++) {
                char src[PATH_MAX], dst[128];
                snprintf(dst, sizeof(dst), "lib/runtime-modules/%s", names[i]);
                r = path_join(src, sizeof(src), modules_dir, names[i]);
                if (r == 0)
                        r = cpio_file(&w, dst, src, 0644);
        }
        for (size_t i = 0; i < n; i++)
                free(names[i]);
        if (r < 0)
                return r;
        if ((r = cpio_file(&w, "init", agent, 0755)) < 0 ||
            (r = cpio_entry(&w, "TRAILER!!!", 0, 0, 0, -1, 0)) < 0)
                return r;
        return cpio_pad(&w, 512);
}

/* ---- the sandbox's disk ---------------------------------------------------- */

/* sandbox_dir/upper.ext4: a sparse file of diskMiB with an empty ext4, made
 * once (a stopped sandbox starts again on its own files). The host only ever
 * writes it with mke2fs before the guest has seen it and never mounts it. */
static int ensure_upper_disk(const char *path, unsigned disk_mib, int log_fd) {
        if (access(path, F_OK) == 0)
                return 0;
        char tmp[PATH_MAX];
        if (snprintf(tmp, sizeof(tmp), "%s.new", path) >= (int)sizeof(tmp))
                return -ENAMETOOLONG;
        unlink(tmp);
        {
                _cleanup_close_ int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (fd < 0)
                        return -errno;
                if (ftruncate(fd, (off_t)disk_mib * 1024 * 1024) < 0) {
                        int e = -errno;
                        unlink(tmp);
                        return e;
                }
        }
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0)
                        _exit(127);
                /* lazy_*_init: nothing but metadata is written, the file stays
                 * sparse; the guest's ext4 zeroes inode tables in the
                 * background. */
                execlp("mke2fs", "mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0", "-L", "runtime-upper",
                       "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", tmp, (char *)NULL);
                _exit(127);
        }
        int status;
        int r = wait_deadline(pid, 60000, &status);
        if (r < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                unlink(tmp);
                return r < 0 ? r : -EIO;
        }
        if (rename(tmp, path) < 0) {
                r = -errno;
                unlink(tmp);
                return r;
        }
        return 0;
}

/* ---- the console ----------------------------------------------------------- */

/* QEMU's own messages (stderr) kept in vmm.log: a guest may be able to make
 * QEMU complain repeatedly; what is past this is dropped. */
#define VMM_LOG_MAX (64u * 1024u)

typedef struct ConsoleRing {
        uint8_t *ring; /* the newest MICROVM_CONSOLE_KEEP bytes */
        size_t len, pos;
        uint64_t file_len;
} ConsoleRing;

/* Appends to console.log; at MICROVM_CONSOLE_MAX the file is rewritten from
 * the ring, so it stays bounded and always ends with the newest output. */
static int console_append(ConsoleRing *c, int fd, const uint8_t *buf, size_t n) {
        static const size_t keep = MICROVM_CONSOLE_KEEP;
        for (size_t i = 0; i < n; i++) {
                c->ring[c->pos] = buf[i];
                c->pos = (c->pos + 1) % keep;
        }
        c->len = c->len + n > keep ? keep : c->len + n;
        if (c->file_len + n <= MICROVM_CONSOLE_MAX) {
                if (pwrite(fd, buf, n, (off_t)c->file_len) < 0)
                        return -errno;
                c->file_len += n;
                return 0;
        }
        if (ftruncate(fd, 0) < 0)
                return -errno;
        size_t start = (c->pos + keep - c->len) % keep;
        size_t first = c->len < keep - start ? c->len : keep - start;
        if (pwrite(fd, c->ring + start, first, 0) < 0 || pwrite(fd, c->ring, c->len - first, (off_t)first) < 0)
                return -errno;
        c->file_len = c->len;
        return 0;
}

/* The supervisor thread of one VM: copies the guest's serial console into
 * console.log and QEMU's stderr into vmm.log, both bounded, until QEMU (which
 * holds the other ends) is gone. */
static void *console_main(void *userdata) {
        DriverInstance *inst = userdata;
        ConsoleRing c = { .ring = malloc(MICROVM_CONSOLE_KEEP) };
        uint64_t vmm_len = 0;
        struct pollfd p[2] = {
                { .fd = inst->console_fd, .events = POLLIN },
                { .fd = inst->vmm_err_fd, .events = POLLIN },
        };
        uint8_t buf[4096];
        while (p[0].fd >= 0 || p[1].fd >= 0) {
                if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                for (int i = 0; i < 2; i++) {
                        if (p[i].fd < 0 || !p[i].revents)
                                continue;
                        ssize_t n = read(p[i].fd, buf, sizeof(buf));
                        if (n < 0 && (errno == EINTR || errno == EAGAIN))
                                continue;
                        if (n <= 0) {
                                p[i].fd = -1; /* negative fds are ignored by poll */
                                continue;
                        }
                        if (i == 0) {
                                /* Without the ring (no memory) nothing is kept:
                                 * the bound matters more than the log. */
                                if (c.ring)
                                        (void)console_append(&c, inst->console_log_fd, buf, (size_t)n);
                        } else if (vmm_len < VMM_LOG_MAX) {
                                size_t w = (size_t)n < VMM_LOG_MAX - vmm_len ? (size_t)n : VMM_LOG_MAX - vmm_len;
                                if (write(inst->vmm_log_fd, buf, w) > 0)
                                        vmm_len += w;
                        }
                }
        }
        free(c.ring);
        return NULL;
}

/* ---- the QEMU command line --------------------------------------------------- */

/* The host's TSC rate in kHz, rounded to whole MHz so that it reads the same
 * at every start of the daemon (a template's command line depends on it).
 * Under TCG the guest's TSC is the host's own counter: a guest told another
 * rate runs its clock that much fast or slow. 0 when it cannot be measured. */
unsigned microvm_host_tsc_khz(void) {
#if defined(__x86_64__)
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        static unsigned khz;
        pthread_mutex_lock(&lock);
        if (khz == 0) {
                unsigned best = 0;
                /* Three 20 ms samples, the median: a preempted sample is off. */
                unsigned samples[3];
                for (int i = 0; i < 3; i++) {
                        struct timespec a, b, d = { .tv_nsec = 20 * 1000 * 1000 };
                        unsigned lo, hi, lo2, hi2;
                        clock_gettime(CLOCK_MONOTONIC_RAW, &a);
                        __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
                        nanosleep(&d, NULL);
                        __asm__ volatile("rdtsc" : "=a"(lo2), "=d"(hi2));
                        clock_gettime(CLOCK_MONOTONIC_RAW, &b);
                        uint64_t ticks = ((uint64_t)hi2 << 32 | lo2) - ((uint64_t)hi << 32 | lo);
                        int64_t ns = (int64_t)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
                        samples[i] = ns > 0 ? (unsigned)((double)ticks / (double)ns * 1000.0 + 0.5) : 0; /* MHz */
                }
                unsigned x = samples[0], y = samples[1], z = samples[2];
                best = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
                /* Plausible rates only; anything else keeps the old guess. */
                khz = best >= 100 && best <= 10000 ? best * 1000 : 2000000;
        }
        unsigned r = khz;
        pthread_mutex_unlock(&lock);
        return r;
#else
        return 0;
#endif
}

int microvm_kernel_cmdline(const char *id, MicrovmAccel accel, unsigned pids_max, char *buf, size_t len) {
        /* quiet: every console byte costs a VM exit (or, under TCG, an
         * emulated UART write); errors and panics still print. panic=-1 and
         * QEMU's -no-reboot turn a guest panic into QEMU's exit, which the
         * daemon sees as the channel's end. Under TCG the guest is told the
         * TSC's rate (there is nothing on microvm to calibrate it against)
         * and the delay loop's (lpj at the kernel's HZ=250). */
        char tcg[160] = "";
        unsigned khz = microvm_host_tsc_khz();
        if (khz == 0)
                khz = 2000000;
        if (accel == MICROVM_ACCEL_TCG)
                snprintf(tcg, sizeof(tcg), " tsc_early_khz=%u lpj=%u " TCG_KERNEL_OPTS, khz, khz * 4);
        char pids[32] = "";
        if (pids_max > 0)
                snprintf(pids, sizeof(pids), " runtime.pids=%u", pids_max);
        int n = snprintf(buf, len,
                         "console=ttyS0 quiet panic=-1 reboot=t 8250.nr_uarts=1 rdinit=/init "
                         "runtime.hostname=%s%s%s -- --vm --channel %s",
                         id, pids, tcg, CHANNEL_PATH);
        return n < 0 || (size_t)n >= len ? -ENOBUFS : 0;
}

typedef struct Args {
        char *v[96];
        size_t n;
        char store[64][128];
        size_t ns;
} Args;

static void arg(Args *a, const char *s) {
        if (a->n < ELEMENTSOF(a->v) - 1)
                a->v[a->n++] = (char *)s;
        a->v[a->n] = NULL;
}

__attribute__((format(printf, 2, 3))) static int argf(Args *a, const char *fmt, ...) {
        if (a->ns == ELEMENTSOF(a->store))
                return -E2BIG;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(a->store[a->ns], sizeof(a->store[0]), fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t)n >= sizeof(a->store[0]))
                return -E2BIG;
        arg(a, a->store[a->ns++]);
        return 0;
}

/* ---- the driver ---------------------------------------------------------- */

static int microvm_probe(char *why, size_t why_len) {
        if (!qemu_binary()) {
                if (why)
                        snprintf(why, why_len, "qemu-system-x86_64 not found (Debian: qemu-system-x86)");
                return -ENOENT;
        }
        if (access("/usr/sbin/mke2fs", X_OK) < 0 && access("/sbin/mke2fs", X_OK) < 0) {
                if (why)
                        snprintf(why, why_len, "mke2fs not found (Debian: e2fsprogs)");
                return -ENOENT;
        }
        char reason[256];
        char kernel[PATH_MAX];
        /* The default image's kernel, when it is built, makes the probe a
         * real boot; start() re-checks with each image's own kernel. */
        const char *k = NULL;
        const char *root = getenv("RUNTIME_IMAGE_DIR");
        if (snprintf(kernel, sizeof(kernel), "%s/default/microvm/vmlinuz", root ? root : "/var/cache/runtime/images") <
                    (int)sizeof(kernel) &&
            access(kernel, R_OK) == 0)
                k = kernel;
        MicrovmAccel accel = microvm_accel(k, reason, sizeof(reason));
        if (why)
                snprintf(why, why_len, "QEMU microvm, %s", reason);
        /* Under TCG it works, but far too slowly to be anybody's default:
         * offered when asked for by name only. */
        return accel == MICROVM_ACCEL_KVM ? 0 : 1;
}

static void instance_free(DriverInstance *inst) {
        if (!inst)
                return;
        if (inst->pidfd >= 0)
                close(inst->pidfd);
        if (inst->console_fd >= 0)
                close(inst->console_fd);
        if (inst->console_log_fd >= 0)
                close(inst->console_log_fd);
        if (inst->vmm_err_fd >= 0)
                close(inst->vmm_err_fd);
        if (inst->vmm_log_fd >= 0)
                close(inst->vmm_log_fd);
        cgroup_free(inst->cg);
        cgroup_layout_done(&inst->layout);
        free(inst->id);
        free(inst->sandbox_dir);
        free(inst->upper_path);
        free(inst);
}

static void remove_start_files(const char *sandbox_dir) {
        char p[PATH_MAX];
        if (path_join(p, sizeof(p), sandbox_dir, "initrd.cpio") == 0)
                unlink(p);
}

/* Kills QEMU (and anything else in the cgroup), reaps it, ends the console
 * thread, removes the cgroup. */
static void instance_kill(DriverInstance *inst) {
        if (inst->pid > 0 && !inst->exited) {
                kill(inst->pid, SIGKILL);
                /* What it reads as when it cannot be waited for (reaped
                 * elsewhere): killed by us. */
                int status = SIGKILL;
                while (waitpid(inst->pid, &status, 0) < 0 && errno == EINTR)
                        ;
                inst->exited = true;
                inst->wait_status = status;
        }
        if (inst->cg) {
                (void)cgroup_kill_all(inst->cg, KILL_TIMEOUT_MS);
                (void)cgroup_remove(inst->cg);
        }
        if (inst->console_running) {
                /* QEMU held the only other end: its death ends the thread. */
                pthread_join(inst->console_thread, NULL);
                inst->console_running = false;
        }
}

/* ---- one QEMU process ----------------------------------------------------- */

/* What one QEMU process is started with. Every start of a sandbox uses the
 * same devices; a template adds a QMP monitor, a restore the incoming
 * migration stream. */
typedef struct VmLaunch {
        const DriverSpec *spec;
        const char *qemu;
        MicrovmAccel accel;
        unsigned vcpu, mem;
        const char *cmdline;
        const char *console_path; /* truncated */
        const char *upper_path;   /* for stats */
        int log_fd;               /* vmm.log, dup'ed */
        int kernel_fd, initrd_fd, root_fd, upper_fd, upper_ro_fd;
        int monitor_fd;  /* QEMU's end of a QMP socket, or -1 */
        int incoming_fd; /* a saved state to start from, or -1 */
} VmLaunch;

static int vm_launch(const VmLaunch *l, int *ret_fd, DriverInstance **ret) {
        const DriverSpec *spec = l->spec;
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
                return -errno;
        _cleanup_close_ int chan_host = sv[0];
        _cleanup_close_ int chan_vmm = sv[1];
        /* A socket, not a pipe: QEMU takes a socket chardev by descriptor,
         * while a file chardev would reopen a path as QEMU's uid. Our end
         * is never written, and never shut down either: QEMU takes EOF on
         * its end for a disconnect and stops writing. */
        int cp[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, cp) < 0)
                return -errno;
        _cleanup_close_ int console_r = cp[0];
        _cleanup_close_ int console_w = cp[1];
        _cleanup_close_ int console_log =
                open(l->console_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (console_log < 0)
                return -errno;
        int ep[2];
        if (pipe2(ep, O_CLOEXEC) < 0)
                return -errno;
        _cleanup_close_ int vmm_err_r = ep[0];
        _cleanup_close_ int vmm_err_w = ep[1];
        _cleanup_close_ int log_fd = fcntl(l->log_fd, F_DUPFD_CLOEXEC, 3);
        if (log_fd < 0)
                return -errno;

        Args a = { 0 };
        int r = 0;
        arg(&a, "qemu-system-x86_64");
        arg(&a, "-name");
        r |= argf(&a, "sandbox-%s", spec->id);
        arg(&a, "-M");
        arg(&a, "microvm,x-option-roms=off,rtc=on,isa-serial=on,pcie=off");
        /* Under TCG, QEMU's default translation cache is 1 GiB: bound it, it
         * counts against the sandbox's memory. */
        arg(&a, "-accel");
        arg(&a, l->accel == MICROVM_ACCEL_KVM ? "kvm" : "tcg,tb-size=64");
        arg(&a, "-cpu");
        arg(&a, l->accel == MICROVM_ACCEL_KVM ? "host" : "max");
        arg(&a, "-smp");
        r |= argf(&a, "%u", l->vcpu);
        arg(&a, "-m");
        r |= argf(&a, "%u", l->mem);
        arg(&a, "-nodefaults");
        arg(&a, "-no-user-config");
        arg(&a, "-display");
        arg(&a, "none");
        arg(&a, "-no-reboot");
        arg(&a, "-sandbox");
        arg(&a, "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
        arg(&a, "-kernel");
        r |= argf(&a, "/proc/self/fd/%d", l->kernel_fd);
        arg(&a, "-initrd");
        r |= argf(&a, "/proc/self/fd/%d", l->initrd_fd);
        arg(&a, "-append");
        arg(&a, l->cmdline);
        arg(&a, "-add-fd");
        r |= argf(&a, "fd=%d,set=1", l->root_fd);
        arg(&a, "-drive");
        arg(&a, "id=root,if=none,file=/dev/fdset/1,format=raw,readonly=on,aio=threads");
        arg(&a, "-device");
        arg(&a, "virtio-blk-device,drive=root,serial=root");
        arg(&a, "-add-fd");
        r |= argf(&a, "fd=%d,set=2", l->upper_fd);
        arg(&a, "-add-fd");
        r |= argf(&a, "fd=%d,set=2", l->upper_ro_fd);
        arg(&a, "-drive");
        arg(&a, "id=upper,if=none,file=/dev/fdset/2,format=raw,cache=none,aio=threads");
        arg(&a, "-device");
        arg(&a, "virtio-blk-device,drive=upper,serial=upper");
        arg(&a, "-device");
        arg(&a, "virtio-serial-device,max_ports=2");
        arg(&a, "-chardev");
        r |= argf(&a, "socket,id=chan,fd=%d", chan_vmm);
        arg(&a, "-device");
        arg(&a, "virtserialport,chardev=chan,name=" CHANNEL_PORT ",nr=1");
        /* The guest's entropy from the host's; rate-bounded so that a guest
         * cannot drain the host's pool for everybody else. */
        arg(&a, "-object");
        arg(&a, "rng-random,id=rng,filename=/dev/urandom");
        arg(&a, "-device");
        arg(&a, "virtio-rng-device,rng=rng,max-bytes=65536,period=1000");
        arg(&a, "-chardev");
        r |= argf(&a, "socket,id=console,fd=%d", console_w);
        arg(&a, "-serial");
        arg(&a, "chardev:console");
        if (l->monitor_fd >= 0) {
                arg(&a, "-chardev");
                r |= argf(&a, "socket,id=mon,fd=%d", l->monitor_fd);
                arg(&a, "-mon");
                arg(&a, "chardev=mon,mode=control");
        }
        if (l->incoming_fd >= 0) {
                arg(&a, "-incoming");
                r |= argf(&a, "fd:%d", l->incoming_fd);
        }
        if (r != 0 || a.n >= ELEMENTSOF(a.v) - 1)
                return -E2BIG;

        _cleanup_(freep) DriverInstance *inst = calloc(1, sizeof(*inst));
        if (!inst)
                return -ENOMEM;
        inst->pidfd = inst->console_fd = inst->console_log_fd = inst->vmm_err_fd = inst->vmm_log_fd = -1;
        inst->id = strdup(spec->id);
        inst->sandbox_dir = strdup(spec->sandbox_dir);
        inst->upper_path = strdup(l->upper_path);
        if (!inst->id || !inst->sandbox_dir || !inst->upper_path) {
                free(inst->id);
                free(inst->sandbox_dir);
                free(inst->upper_path);
                return -ENOMEM;
        }

        r = cgroup_layout_detect(CGROUP_ROOT, &inst->layout);
        if (r >= 0)
                r = cgroup_new(&inst->layout, spec->cgroup_parent, spec->id, true, &inst->cg);
        uint32_t overhead = l->accel == MICROVM_ACCEL_KVM ? MICROVM_OVERHEAD_MIB_KVM : MICROVM_OVERHEAD_MIB_TCG;
        CgroupLimits lim = {
                .memory_bytes = ((uint64_t)l->mem + overhead) * 1024 * 1024,
                .vcpu = l->vcpu,
                .pids_max = MICROVM_PIDS_MAX,
        };
        if (r >= 0)
                r = cgroup_set_limits(inst->cg, &lim);
        ChildSetup c = {
                .qemu = l->qemu,
                .argv = a.v,
                .keep_fds = { l->kernel_fd, l->initrd_fd, l->root_fd, l->upper_fd, l->upper_ro_fd, chan_vmm,
                              console_w },
                .n_keep = 7,
                .log_fd = vmm_err_w,
                .uid = microvm_uid_for(spec->id),
                .gid = microvm_uid_for(spec->id),
                .extra_gid = l->accel == MICROVM_ACCEL_KVM ? kvm_group() : (gid_t)-1,
                .join_cgroup = true,
        };
        if (l->monitor_fd >= 0)
                c.keep_fds[c.n_keep++] = l->monitor_fd;
        if (l->incoming_fd >= 0)
                c.keep_fds[c.n_keep++] = l->incoming_fd;
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++)
                c.cgroup_fds[i] = -1;
        if (r >= 0)
                r = seccomp_policy_bpf(&c.seccomp_prog, &c.seccomp_len);
        if (r >= 0)
                r = cgroup_open_procs(inst->cg, c.cgroup_fds, _CGROUP_HIER_MAX);
        if (r < 0)
                goto fail;

        pid_t pid = fork();
        if (pid < 0) {
                r = -errno;
                cgroup_close_fds(c.cgroup_fds, _CGROUP_HIER_MAX);
                goto fail;
        }
        if (pid == 0)
                child_exec(&c);
        cgroup_close_fds(c.cgroup_fds, _CGROUP_HIER_MAX);
        inst->pid = pid;
        inst->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);

        inst->console_fd = TAKE_FD(console_r);
        inst->console_log_fd = TAKE_FD(console_log);
        inst->vmm_err_fd = TAKE_FD(vmm_err_r);
        inst->vmm_log_fd = TAKE_FD(log_fd);
        closep(&console_w);
        console_w = -1;
        closep(&vmm_err_w);
        vmm_err_w = -1;
        if (pthread_create(&inst->console_thread, NULL, console_main, inst) == 0) {
                inst->console_running = true;
        } else {
                /* Nobody would drain them: closed, QEMU's writes fail
                 * instead of blocking the guest. */
                close(TAKE_FD(inst->console_fd));
                close(TAKE_FD(inst->vmm_err_fd));
        }

        *ret_fd = TAKE_FD(chan_host);
        *ret = TAKE_PTR(inst);
        return 0;

fail:
        instance_kill(inst);
        instance_free(TAKE_PTR(inst));
        return r;
}

/* ---- talking to a VM before the daemon does ---------------------------------- */

/* Reads exactly n bytes by the deadline (a monotonic ms time). */
static int read_exact(int fd, void *buf, size_t n, int64_t deadline) {
        uint8_t *p = buf;
        while (n > 0) {
                int64_t left = deadline - now_ms();
                if (left <= 0)
                        return -ETIMEDOUT;
                struct pollfd pf = { .fd = fd, .events = POLLIN };
                int k = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
                if (k < 0 && errno != EINTR)
                        return -errno;
                if (k <= 0)
                        continue;
                ssize_t got = read(fd, p, n);
                if (got < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (got < 0)
                        return -errno;
                if (got == 0)
                        return -EPIPE;
                p += got;
                n -= (size_t)got;
        }
        return 0;
}

/* Reads exactly one frame of the channel (never a byte more: what follows is
 * the daemon's), which must be of type `type` on `stream`. Its JSON payload,
 * when ret is not NULL. */
static int read_frame(int fd, uint8_t type, uint32_t stream, int64_t deadline, json_t **ret) {
        uint8_t hdr[PROTO_HEADER_SIZE];
        ProtoHeader h;
        int r = read_exact(fd, hdr, sizeof(hdr), deadline);
        if (r < 0)
                return r;
        if (proto_header_decode(hdr, &h) < 0 || h.type != type || h.stream != stream || h.length > PROTO_MAX_JSON)
                return -EPROTO;
        _cleanup_free_ char *payload = malloc(h.length + 1);
        if (!payload)
                return -ENOMEM;
        r = read_exact(fd, payload, h.length, deadline);
        if (r < 0)
                return r;
        if (ret) {
                *ret = json_loadb(payload, h.length, 0, NULL);
                if (!*ret)
                        return -EPROTO;
        }
        return 0;
}

/* A QMP connection: one JSON object per line. */
typedef struct Qmp {
        int fd;
        char buf[65536];
        size_t len;
} Qmp;

/* The next reply (not an event) as a JSON object, by the deadline. */
static int qmp_reply(Qmp *q, int64_t deadline, json_t **ret) {
        for (;;) {
                char *nl = memchr(q->buf, '\n', q->len);
                if (nl) {
                        size_t line = (size_t)(nl - q->buf) + 1;
                        json_t *o = json_loadb(q->buf, line - 1, 0, NULL);
                        memmove(q->buf, q->buf + line, q->len - line);
                        q->len -= line;
                        if (!o || !json_is_object(o)) {
                                json_decref(o);
                                return -EPROTO;
                        }
                        if (json_object_get(o, "event") || json_object_get(o, "QMP")) {
                                json_decref(o);
                                continue;
                        }
                        *ret = o;
                        return 0;
                }
                if (q->len == sizeof(q->buf))
                        return -EPROTO;
                int64_t left = deadline - now_ms();
                if (left <= 0)
                        return -ETIMEDOUT;
                struct pollfd pf = { .fd = q->fd, .events = POLLIN };
                int k = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
                if (k < 0 && errno != EINTR)
                        return -errno;
                if (k <= 0)
                        continue;
                ssize_t got = read(q->fd, q->buf + q->len, sizeof(q->buf) - q->len);
                if (got < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (got <= 0)
                        return got < 0 ? -errno : -EPIPE;
                q->len += (size_t)got;
        }
}

/* Runs one command; pass_fd (or -1) goes along by SCM_RIGHTS. 0 and the
 * "return" value (when ret), -EIO with the error's text in why. */
static int qmp_exec(Qmp *q, const char *cmd, int pass_fd, int64_t deadline, json_t **ret, char *why, size_t why_len) {
        struct iovec iov = { .iov_base = (void *)cmd, .iov_len = strlen(cmd) };
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } ctl;
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        if (pass_fd >= 0) {
                memset(&ctl, 0, sizeof(ctl));
                msg.msg_control = ctl.buf;
                msg.msg_controllen = sizeof(ctl.buf);
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
        }
        ssize_t w;
        do
                w = sendmsg(q->fd, &msg, MSG_NOSIGNAL);
        while (w < 0 && errno == EINTR);
        if (w != (ssize_t)iov.iov_len)
                return w < 0 ? -errno : -EIO;
        json_t *o = NULL;
        int r = qmp_reply(q, deadline, &o);
        if (r < 0)
                return r;
        json_t *err = json_object_get(o, "error");
        if (err) {
                snprintf(why, why_len, "%s", json_string_value(json_object_get(err, "desc")) ?: "QMP error");
                json_decref(o);
                return -EIO;
        }
        if (ret)
                *ret = json_incref(json_object_get(o, "return"));
        json_decref(o);
        return 0;
}

/* ---- fast start: a template VM per image, agent and shape ------------------- */

/* A sandbox's first start restores a running guest saved once per image,
 * agent binary and shape (vcpu, memory, disk, accelerator) instead of booting
 * a kernel: the template. docs/microvm.md has the why and the measurements. */
static int remove_tree_at(int dfd, const char *name, unsigned depth);

#define TEMPLATE_FORMAT 1
#define TEMPLATE_MAX 16        /* per image */
#define TEMPLATE_IDLE_S 600    /* a template restored within this is in use: never evicted */
#define TEMPLATE_RETRY_S 600   /* a build that failed is not tried again before this */
#define TEMPLATE_LOCK_MS 15000 /* the longest a start waits for somebody else's build */
#define TEMPLATE_MIGRATE_MS (120 * 1000)
#define RESUME_TIMEOUT_MS (60 * 1000)

static bool snapshots_enabled(void) {
        const char *e = getenv("RUNTIME_MICROVM_SNAPSHOTS");
        return !e || strcmp(e, "0") != 0;
}

static int stat_of(const char *path, struct stat *st) {
        return stat(path, st) < 0 ? -errno : 0;
}

/* The host's kernel release and a hash of its CPU's feature flags: under
 * KVM a restored guest keeps the code paths its kernel chose for the CPU it
 * booted on. */
static int host_cpu_id(char *buf, size_t len) {
        struct utsname u;
        if (uname(&u) < 0)
                return -errno;
        _cleanup_close_ int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        char text[16384];
        ssize_t n = read(fd, text, sizeof(text) - 1);
        if (n < 0)
                return -errno;
        text[n] = 0;
        char *flags = strstr(text, "\nflags");
        uint64_t h = 14695981039346656037ull;
        for (const char *p = flags; p && *p && (p == flags || *p != '\n'); p++) {
                h ^= (uint8_t)*p;
                h *= 1099511628211ull;
        }
        int m = snprintf(buf, len, "%s:%016llx", u.release, (unsigned long long)h);
        return m < 0 || (size_t)m >= len ? -ENOBUFS : 0;
}

/* The description of everything a saved guest depends on; equal keys mean
 * the same devices, command line, kernel, root, modules, agent and QEMU. */
static int template_key(const char *qemu, const char *image_dir, const char *agent, MicrovmAccel accel, unsigned vcpu,
                        unsigned mem, unsigned disk, unsigned pids, char *buf, size_t len) {
        char p[PATH_MAX];
        struct stat q, k, root, mods, ag;
        int r;
        if ((r = stat_of(qemu, &q)) < 0 || (r = path_join(p, sizeof(p), image_dir, "microvm/vmlinuz")) < 0 ||
            (r = stat_of(p, &k)) < 0 || (r = path_join(p, sizeof(p), image_dir, "microvm/root.ext4")) < 0 ||
            (r = stat_of(p, &root)) < 0 || (r = path_join(p, sizeof(p), image_dir, "microvm/modules")) < 0 ||
            (r = stat_of(p, &mods)) < 0 || (r = stat_of(agent, &ag)) < 0)
                return r;
        /* The command line as a template's (its name aside: it derives
         * from the key) and, under KVM, the host's CPU. */
        char cmdline[1024], cpu[128] = "-";
        if ((r = microvm_kernel_cmdline("tpl", accel, pids, cmdline, sizeof(cmdline))) < 0)
                return r;
        if (accel == MICROVM_ACCEL_KVM && (r = host_cpu_id(cpu, sizeof(cpu))) < 0)
                return r;
#define ST(s) (unsigned long long)(s).st_dev, (unsigned long long)(s).st_ino, (long long)(s).st_size, \
              (long long)(s).st_mtim.tv_sec, (long)(s).st_mtim.tv_nsec
        int n = snprintf(buf, len,
                         "format=%d accel=%s vcpu=%u mem=%u disk=%u pids=%u\n"
                         "cmdline=%s\ncpu=%s\n"
                         "qemu=%llu:%llu:%lld:%lld.%09ld\nkernel=%llu:%llu:%lld:%lld.%09ld\n"
                         "root=%llu:%llu:%lld:%lld.%09ld\nmodules=%llu:%llu:%lld:%lld.%09ld\n"
                         "agent=%llu:%llu:%lld:%lld.%09ld\n",
                         TEMPLATE_FORMAT, accel == MICROVM_ACCEL_KVM ? "kvm" : "tcg", vcpu, mem, disk, pids, cmdline,
                         cpu, ST(q), ST(k), ST(root), ST(mods), ST(ag));
#undef ST
        return n < 0 || (size_t)n >= len ? -ENOBUFS : 0;
}

static uint64_t fnv1a64(const char *s) {
        uint64_t h = 14695981039346656037ull;
        for (; *s; s++) {
                h ^= (uint8_t)*s;
                h *= 1099511628211ull;
        }
        return h;
}

/* Copies a sparse file's data, leaving its holes holes. */
static int copy_sparse(int in, int out) {
        struct stat st;
        if (fstat(in, &st) < 0)
                return -errno;
        if (ftruncate(out, st.st_size) < 0)
                return -errno;
        /* On the heap: a static or thread-local buffer would cost every
         * thread of the daemon. */
        const size_t buf_size = 1 << 16;
        _cleanup_free_ uint8_t *buf = malloc(buf_size);
        if (!buf)
                return -ENOMEM;
        off_t off = 0;
        while (off < st.st_size) {
                off_t data = lseek(in, off, SEEK_DATA);
                if (data < 0)
                        return errno == ENXIO ? 0 : -errno;
                off_t hole = lseek(in, data, SEEK_HOLE);
                if (hole < 0)
                        return -errno;
                for (off_t o = data; o < hole;) {
                        size_t want = (size_t)(hole - o) < buf_size ? (size_t)(hole - o) : buf_size;
                        ssize_t n = pread(in, buf, want, o);
                        if (n < 0 && errno == EINTR)
                                continue;
                        if (n <= 0)
                                return n < 0 ? -errno : -EIO;
                        for (ssize_t done = 0; done < n;) {
                                ssize_t w = pwrite(out, buf + done, (size_t)(n - done), o + done);
                                if (w < 0 && errno == EINTR)
                                        continue;
                                if (w <= 0)
                                        return w < 0 ? -errno : -EIO;
                                done += w;
                        }
                        o += n;
                }
                off = hole;
        }
        return 0;
}

static int write_file_at(int dfd, const char *name, const char *text, mode_t mode) {
        _cleanup_close_ int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd < 0)
                return -errno;
        int r = write_all(fd, text, strlen(text));
        if (r == 0 && fsync(fd) < 0)
                r = -errno;
        return r;
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
                if (now_ms() >= deadline)
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
        (void)remove_tree_at(tfd, dead, 0);
        if (renameat(tfd, name, tfd, dead) < 0)
                return;
        (void)fsync(tfd);
        (void)remove_tree_at(tfd, dead, 0);
}

static void template_discard(int tfd, const char *name, int dfd) {
        if (lock_until(tfd, now_ms() + TEMPLATE_LOCK_MS) == 0) {
                template_discard_locked(tfd, name, dfd);
                flock(tfd, LOCK_UN);
        }
}

/* The templates of an image, for the room check and eviction: how many, and
 * the least recently used one not used for TEMPLATE_IDLE_S (a restore touches
 * its template's key file), if any. */
static size_t templates_scan(int tfd, char *idlest, size_t idlest_len) {
        _cleanup_close_ int fd = dup(tfd);
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
                snprintf(p, sizeof(p), "%s/key", de->d_name);
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
                if (failed[i].hash == h && failed[i].until_ms > now_ms())
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
        failed[slot].until_ms = now_ms() + TEMPLATE_RETRY_S * 1000LL;
        pthread_mutex_unlock(&failed_lock);
}

/* Everything a start needs that does not depend on the way it starts. */
typedef struct StartCtx {
        const DriverSpec *spec;
        const char *qemu;
        MicrovmAccel accel;
        unsigned vcpu, mem, disk, pids;
        int log_fd;
        const char *p_kernel, *p_root, *p_modules, *p_console;
} StartCtx;

/* Writes the initramfs of a start (the agent and the modules) to path.
 * QEMU reads it through /proc/self/fd, which reopens the file as QEMU's
 * uid: it must be readable by others (it holds nothing but the agent and
 * kernel modules). */
static int write_initrd(const StartCtx *s, const char *path) {
        _cleanup_close_ int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
                return -errno;
        int r = microvm_write_initramfs(fd, s->p_modules, s->spec->agent_path);
        if (r == 0 && (fchmod(fd, 0644) < 0 || fsync(fd) < 0))
                r = -errno;
        if (r < 0)
                unlink(path);
        return r;
}

/* One QEMU process of a start, the same devices whichever way it starts:
 * a cold boot, a template (monitor_fd: QMP) or a restore (incoming_fd: the
 * saved state). hostname goes on the kernel's command line. */
static int start_qemu(const StartCtx *s, const char *hostname, int initrd_fd, const char *upper, int monitor_fd,
                      int incoming_fd, int *ret_fd, DriverInstance **ret) {
        char cmdline[1024];
        int r = microvm_kernel_cmdline(hostname, s->accel, s->pids, cmdline, sizeof(cmdline));
        if (r < 0)
                return r;
        /* The descriptors QEMU gets; it opens nothing of ours by path. */
        _cleanup_close_ int kernel_fd = open(s->p_kernel, O_RDONLY | O_CLOEXEC);
        _cleanup_close_ int root_fd = open(s->p_root, O_RDONLY | O_CLOEXEC);
        /* O_DIRECT to match cache=none (QEMU picks a descriptor of an fdset
         * by its flags): the guest caches its own disk, the host should not
         * hold a second copy. The shared root stays in the host's page
         * cache, where every sandbox of the image shares it. */
        _cleanup_close_ int upper_fd = open(upper, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
        /* The block layer also opens the image read-only (probing, locks):
         * the fdset holds a descriptor of each access mode. */
        _cleanup_close_ int upper_ro_fd = open(upper, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
        if (kernel_fd < 0 || root_fd < 0 || upper_fd < 0 || upper_ro_fd < 0)
                return -errno;
        VmLaunch l = {
                .spec = s->spec, .qemu = s->qemu, .accel = s->accel, .vcpu = s->vcpu, .mem = s->mem,
                .cmdline = cmdline, .console_path = s->p_console, .upper_path = upper, .log_fd = s->log_fd,
                .kernel_fd = kernel_fd, .initrd_fd = initrd_fd, .root_fd = root_fd, .upper_fd = upper_fd,
                .upper_ro_fd = upper_ro_fd, .monitor_fd = monitor_fd, .incoming_fd = incoming_fd,
        };
        return vm_launch(&l, ret_fd, ret);
}

/* Boots the template VM in the sandbox's cgroup (the sandbox that needs it
 * pays for it), waits for its agent's HELLO, saves the running guest with
 * QMP `migrate` to dir/state and keeps its disk as dir/upper.ext4. */
static int template_build(const StartCtx *s, const char *tmpdir, const char *tpl_name, char *why, size_t why_len) {
        char p_upper[PATH_MAX], p_initrd[PATH_MAX], p_state[PATH_MAX];
        if (path_join(p_upper, sizeof(p_upper), tmpdir, "upper.ext4") < 0 ||
            path_join(p_initrd, sizeof(p_initrd), tmpdir, "initrd.cpio") < 0 ||
            path_join(p_state, sizeof(p_state), tmpdir, "state") < 0)
                return -ENAMETOOLONG;
        int r = ensure_upper_disk(p_upper, s->disk, s->log_fd);
        if (r < 0) {
                snprintf(why, why_len, "making the template's disk: %s", strerror(-r));
                return r;
        }
        r = write_initrd(s, p_initrd);
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
        r = start_qemu(s, tpl_name, initrd_fd, p_upper, mon_vmm, -1, &chan, &inst);
        if (r < 0) {
                snprintf(why, why_len, "starting QEMU: %s", strerror(-r));
                return r;
        }
        closep(&mon_vmm);
        mon_vmm = -1;
        int64_t deadline = now_ms() + (int64_t)driver_microvm.hello_timeout_ms;
        r = read_frame(chan, PROTO_HELLO, 0, deadline, NULL);
        if (r < 0)
                snprintf(why, why_len, "the template's agent did not say HELLO: %s", strerror(-r));
        Qmp q = { .fd = mon_host };
        json_t *ret = NULL;
        deadline = now_ms() + TEMPLATE_MIGRATE_MS;
        if (r == 0)
                r = qmp_exec(&q, "{\"execute\":\"qmp_capabilities\"}\n", -1, deadline, NULL, why, why_len);
        /* The default bandwidth cap (128 MiB/s) would make a big guest's
         * save take seconds for nothing: it goes to a local file. */
        if (r == 0)
                r = qmp_exec(&q,
                             "{\"execute\":\"migrate-set-parameters\",\"arguments\":{\"max-bandwidth\":17179869184}}\n",
                             -1, deadline, NULL, why, why_len);
        if (r == 0)
                r = qmp_exec(&q, "{\"execute\":\"getfd\",\"arguments\":{\"fdname\":\"state\"}}\n", state_fd, deadline,
                             NULL, why, why_len);
        if (r == 0)
                r = qmp_exec(&q, "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:state\"}}\n", -1, deadline, NULL,
                             why, why_len);
        /* Not stopped first: a guest saved while paused would stay paused
         * when restored. An idle guest's live save converges at once. */
        while (r == 0) {
                r = qmp_exec(&q, "{\"execute\":\"query-migrate\"}\n", -1, deadline, &ret, why, why_len);
                if (r < 0)
                        break;
                const char *status = json_string_value(json_object_get(ret, "status"));
                if (status && strcmp(status, "completed") == 0) {
                        json_decref(ret);
                        break;
                }
                if (!status || strcmp(status, "failed") == 0 || strcmp(status, "cancelled") == 0) {
                        snprintf(why, why_len, "saving the template: %s",
                                 json_string_value(json_object_get(ret, "error-desc")) ?: status ?: "no status");
                        r = -EIO;
                }
                json_decref(ret);
                ret = NULL;
                if (r == 0) {
                        if (now_ms() > deadline) {
                                snprintf(why, why_len, "saving the template took over %d s", TEMPLATE_MIGRATE_MS / 1000);
                                r = -ETIMEDOUT;
                        } else
                                usleep(20000);
                }
        }
        if (r == -ETIMEDOUT && !why[0])
                snprintf(why, why_len, "QMP did not answer in time");
        else if (r < 0 && !why[0])
                snprintf(why, why_len, "QMP: %s", strerror(-r));
        /* The source is paused once the save completed: its disk and the
         * saved memory agree. */
        instance_kill(inst);
        instance_free(inst);
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
static int template_get(const StartCtx *s, int tfd, char *name, size_t name_len, char *tpl_name, size_t tpl_len,
                        int *ret_dfd, char *why, size_t why_len) {
        char key[4096];
        int r = template_key(s->qemu, s->spec->image_dir, s->spec->agent_path, s->accel, s->vcpu, s->mem, s->disk,
                             s->pids, key, sizeof(key));
        if (r < 0) {
                snprintf(why, why_len, "template key: %s", strerror(-r));
                return r;
        }
        uint64_t h = fnv1a64(key);
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
        r = lock_until(lfd, now_ms() + TEMPLATE_LOCK_MS);
        if (r < 0) {
                snprintf(why, why_len, "the template of this shape is being made");
                return r;
        }
        if ((*ret_dfd = template_open(tfd, name, key)) >= 0)
                return 0; /* made while we waited */
        /* Room: at most TEMPLATE_MAX per image, and one in use (restored
         * from within TEMPLATE_IDLE_S) is never evicted for another. */
        char idlest[32];
        r = lock_until(tfd, now_ms() + TEMPLATE_LOCK_MS);
        if (r < 0)
                return r;
        size_t n = templates_scan(tfd, idlest, sizeof(idlest));
        if (n >= TEMPLATE_MAX && !idlest[0]) {
                flock(tfd, LOCK_UN);
                snprintf(why, why_len, "%zu templates of this image in use, no room for another", n);
                return -ENOSPC;
        }
        flock(tfd, LOCK_UN);

        (void)remove_tree_at(tfd, tmpname, 0);
        if (mkdirat(tfd, tmpname, 0700) < 0)
                return -errno;
        _cleanup_close_ int nfd = openat(tfd, tmpname, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (nfd < 0)
                return -errno;
        char p_tmp[PATH_MAX];
        if (snprintf(p_tmp, sizeof(p_tmp), "%s/microvm/templates/%s", s->spec->image_dir, tmpname) >=
            (int)sizeof(p_tmp))
                return -ENAMETOOLONG;
        int64_t t0 = now_ms();
        r = template_build(s, p_tmp, tpl_name, why, why_len);
        if (r == 0)
                r = write_file_at(nfd, "key", key, 0600);
        if (r == 0 && fsync(nfd) < 0)
                r = -errno;
        if (r == 0)
                r = lock_until(tfd, now_ms() + TEMPLATE_LOCK_MS);
        if (r < 0) {
                (void)remove_tree_at(tfd, tmpname, 0);
                template_failed(h);
                return r;
        }
        template_discard_locked(tfd, name, -1);
        if (renameat(tfd, tmpname, tfd, name) < 0) {
                r = -errno;
                flock(tfd, LOCK_UN);
                (void)remove_tree_at(tfd, tmpname, 0);
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
        dprintf(s->log_fd, "runtimed: template %s made in %lld ms\n", name, (long long)(now_ms() - t0));
        *ret_dfd = template_open(tfd, name, key);
        return *ret_dfd >= 0 ? 0 : -ENOENT;
}

/* The resume request: the guest's kernel gets fresh entropy and is reseeded,
 * its clock set, its hostname made the sandbox's. */
static int vm_resume(int chan, const char *id, int64_t deadline, char *why, size_t why_len) {
        uint8_t seed[64];
        if (getrandom(seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
                return -EIO;
        char hex[2 * sizeof(seed) + 1];
        for (size_t i = 0; i < sizeof(seed); i++)
                snprintf(hex + 2 * i, 3, "%02x", seed[i]);
        explicit_bzero(seed, sizeof(seed));
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        char req[512];
        int n = snprintf(req, sizeof(req), "{\"op\":\"resume\",\"entropy\":\"%s\",\"timeNs\":%lld,\"hostname\":\"%s\"}",
                         hex, (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, id);
        explicit_bzero(hex, sizeof(hex));
        if (n < 0 || (size_t)n >= sizeof(req))
                return -ENOBUFS;
        int r = proto_write_frame(chan, PROTO_OPEN, 0, 1, req, (size_t)n);
        explicit_bzero(req, sizeof(req));
        if (r < 0) {
                snprintf(why, why_len, "sending resume: %s", strerror(-r));
                return r;
        }
        json_t *res = NULL;
        r = read_frame(chan, PROTO_RESULT, 1, deadline, &res);
        if (r < 0) {
                snprintf(why, why_len, "the restored agent did not answer resume: %s", strerror(-r));
                return r;
        }
        json_t *err = json_object_get(res, "error");
        if (err) {
                snprintf(why, why_len, "resume refused: %s",
                         json_string_value(json_object_get(err, "message")) ?: "no message");
                json_decref(res);
                return -EIO;
        }
        json_decref(res);
        return 0;
}

/* A sandbox's first start from its shape's template: its disk a copy of the
 * template's, its memory the template's saved guest, then `resume`. */
static int start_restored(const StartCtx *s, const char *p_upper, int *ret_fd, DriverInstance **ret, char *why,
                          size_t why_len) {
        char tdir[PATH_MAX], tmp[PATH_MAX];
        if (path_join(tdir, sizeof(tdir), s->spec->image_dir, "microvm/templates") < 0 ||
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
                r = copy_sparse(in, out);
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
        r = start_qemu(s, tpl_name, initrd_fd, p_upper, -1, state_fd, &chan, &inst);
        if (r < 0) {
                snprintf(why, why_len, "starting QEMU: %s", strerror(-r));
                return r;
        }
        r = vm_resume(chan, s->spec->id, now_ms() + RESUME_TIMEOUT_MS, why, why_len);
        if (r < 0) {
                instance_kill(inst);
                instance_free(inst);
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

static int microvm_start(const DriverSpec *spec, int *ret_fd, DriverInstance **ret) {
        if (!spec || !spec->id || !cgroup_name_valid(spec->id, false) || strlen(spec->id) > 64 || !spec->image_dir ||
            !spec->sandbox_dir || !spec->agent_path || !spec->cgroup_parent ||
            !cgroup_name_valid(spec->cgroup_parent, true))
                return -EINVAL;
        for (const char *p = spec->id; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
                        return -EINVAL;
        unsigned vcpu = spec->vcpu ? spec->vcpu : 1;
        unsigned mem = spec->memory_mib;
        unsigned disk = spec->disk_mib ? spec->disk_mib : 1024;
        if (vcpu > MICROVM_MAX_VCPU || mem < MICROVM_MIN_MEMORY_MIB || mem > 1024u * 1024u || disk > MAX_DISK_MIB)
                return -EINVAL;
        if (disk < MIN_DISK_MIB)
                disk = MIN_DISK_MIB;
        const char *qemu = qemu_binary();
        if (!qemu)
                return -ENOENT;

        char rootfs[PATH_MAX];
        if (path_join(rootfs, sizeof(rootfs), spec->image_dir, "rootfs") < 0)
                return -ENAMETOOLONG;
        if (access(rootfs, F_OK) < 0)
                return -ENOENT;
        if (mkdir(spec->sandbox_dir, 0700) < 0 && errno != EEXIST)
                return -errno;

        char p_log[PATH_MAX], p_console[PATH_MAX], p_upper[PATH_MAX], p_initrd[PATH_MAX], p_kernel[PATH_MAX],
                p_root[PATH_MAX], p_modules[PATH_MAX];
        if (path_join(p_log, sizeof(p_log), spec->sandbox_dir, "vmm.log") < 0 ||
            path_join(p_console, sizeof(p_console), spec->sandbox_dir, "console.log") < 0 ||
            path_join(p_upper, sizeof(p_upper), spec->sandbox_dir, "upper.ext4") < 0 ||
            path_join(p_initrd, sizeof(p_initrd), spec->sandbox_dir, "initrd.cpio") < 0 ||
            path_join(p_kernel, sizeof(p_kernel), spec->image_dir, "microvm/vmlinuz") < 0 ||
            path_join(p_root, sizeof(p_root), spec->image_dir, "microvm/root.ext4") < 0 ||
            path_join(p_modules, sizeof(p_modules), spec->image_dir, "microvm/modules") < 0)
                return -ENAMETOOLONG;

        /* QEMU's own messages and the builders': the daemon's log gets the
         * reason of a failure from here. Truncated at each start. */
        _cleanup_close_ int log_fd =
                open(p_log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (log_fd < 0)
                return -errno;
        int r;
        if (!image_parts_current(spec->image_dir)) {
                r = build_image_parts(spec->image_dir, log_fd);
                if (r < 0)
                        return r == -ENOENT ? -ENOENT : -EIO;
        }
        MicrovmAccel accel = microvm_accel(p_kernel, NULL, 0);
        StartCtx s = {
                .spec = spec, .qemu = qemu, .accel = accel, .vcpu = vcpu, .mem = mem, .disk = disk,
                .pids = spec->pids_max, .log_fd = log_fd, .p_kernel = p_kernel, .p_root = p_root, .p_modules = p_modules,
                .p_console = p_console,
        };

        /* The first start restores its shape's template; a stopped sandbox
         * starts again by booting on its own disk. */
        if (snapshots_enabled() && access(p_upper, F_OK) < 0 && errno == ENOENT) {
                char why[256] = "";
                int64_t t0 = now_ms();
                r = start_restored(&s, p_upper, ret_fd, ret, why, sizeof(why));
                if (r == 0) {
                        dprintf(log_fd, "runtimed: restored from a template in %lld ms\n", (long long)(now_ms() - t0));
                        return 0;
                }
                dprintf(log_fd, "runtimed: no fast start (%s); booting\n", why[0] ? why : strerror(-r));
                unlink(p_upper);
        }

        r = ensure_upper_disk(p_upper, disk, log_fd);
        if (r < 0)
                return r;

        r = write_initrd(&s, p_initrd);
        if (r < 0)
                return r;
        _cleanup_close_ int initrd_fd = open(p_initrd, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (initrd_fd < 0)
                return -errno;
        r = start_qemu(&s, spec->id, initrd_fd, p_upper, -1, -1, ret_fd, ret);
        if (r < 0)
                remove_start_files(spec->sandbox_dir);
        return r;
}

static void microvm_stop(DriverInstance *inst, const char **ret_reason) {
        if (ret_reason)
                *ret_reason = NULL;
        if (!inst)
                return;
        bool died_before = false;
        if (inst->pid > 0 && !inst->exited) {
                int status;
                if (waitpid(inst->pid, &status, WNOHANG) == inst->pid) {
                        inst->exited = true;
                        inst->wait_status = status;
                        died_before = true;
                }
        }
        instance_kill(inst);
        /* QEMU exits 0 on a guest power-off or panic (-no-reboot, panic=-1).
         * One caught half-way through its exit ignores our SIGKILL and still
         * reports its own exit: that counts as having died on its own too. A
         * SIGKILL is ours unless QEMU was already gone before we sent it. */
        const char *reason = NULL;
        int st = inst->wait_status;
        if (WIFEXITED(st))
                reason = "exited";
        else if (WIFSIGNALED(st) && (died_before || WTERMSIG(st) != SIGKILL))
                reason = "killed";
        if (reason && inst->cg) {
                CgroupStats cs;
                if (cgroup_read_stats(inst->cg, &cs) == 0 && cs.oom_kills > 0)
                        reason = "oom";
        }
        remove_start_files(inst->sandbox_dir);
        if (ret_reason)
                *ret_reason = reason;
        instance_free(inst);
}

/* Kills whatever is left in the sandbox's cgroup and removes it, from the
 * spec alone. */
static int kill_cgroup_of(const DriverSpec *spec) {
        if (!spec || !spec->id || !cgroup_name_valid(spec->id, false) || !spec->cgroup_parent ||
            !cgroup_name_valid(spec->cgroup_parent, true))
                return -EINVAL;
        CgroupLayout layout;
        int r = cgroup_layout_detect(CGROUP_ROOT, &layout);
        if (r < 0)
                return r;
        Cgroup *cg = NULL;
        r = cgroup_new(&layout, spec->cgroup_parent, spec->id, false, &cg);
        if (r >= 0) {
                r = cgroup_kill_all(cg, KILL_TIMEOUT_MS);
                int r2 = cgroup_remove(cg);
                if (r >= 0)
                        r = r2;
                cgroup_free(cg);
        }
        cgroup_layout_done(&layout);
        return r;
}

static int remove_tree_at(int dfd, const char *name, unsigned depth) {
        if (depth > 16)
                return -ELOOP;
        if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
                return 0;
        if (errno != EISDIR)
                return -errno;
        int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        DIR *d = fdopendir(fd);
        if (!d) {
                close(fd);
                return -errno;
        }
        int r = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                int q = remove_tree_at(dirfd(d), de->d_name, depth + 1);
                if (q < 0 && r == 0)
                        r = q;
        }
        closedir(d);
        if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && r == 0)
                r = -errno;
        return r;
}

static int microvm_destroy(const DriverSpec *spec) {
        int r = kill_cgroup_of(spec);
        if (r == -EINVAL)
                return r;
        if (spec->sandbox_dir && spec->sandbox_dir[0] == '/') {
                int q = remove_tree_at(AT_FDCWD, spec->sandbox_dir, 0);
                if (q < 0 && r >= 0)
                        r = q;
        }
        return r < 0 && r != -ENOENT ? r : 0;
}

static int microvm_reap_orphan(const DriverSpec *spec) {
        int r = kill_cgroup_of(spec);
        if (r == -EINVAL)
                return r;
        if (spec->sandbox_dir)
                remove_start_files(spec->sandbox_dir);
        return r < 0 && r != -ENOENT ? r : 0;
}

static bool microvm_alive(DriverInstance *inst) {
        if (!inst || inst->exited || inst->pid <= 0)
                return false;
        if (inst->pidfd < 0)
                return kill(inst->pid, 0) == 0;
        struct pollfd p = { .fd = inst->pidfd, .events = POLLIN };
        return poll(&p, 1, 0) == 0;
}

static int microvm_stats(DriverInstance *inst, DriverStats *ret) {
        if (!inst || !ret)
                return -EINVAL;
        DriverStats s = { 0 };
        CgroupStats cs;
        int r = inst->cg ? cgroup_read_stats(inst->cg, &cs) : -ENOENT;
        if (r < 0)
                return r;
        s.cpu_usage_ns = cs.cpu_usage_ns;
        s.memory_bytes = cs.memory_bytes;
        s.memory_peak_bytes = cs.memory_peak_bytes;
        s.pids_current = cs.pids_current;
        s.oom_killed = cs.oom_kills > 0;
        struct stat st;
        if (stat(inst->upper_path, &st) == 0)
                s.disk_used_bytes = (uint64_t)st.st_blocks * 512;
        *ret = s;
        return 0;
}

const Driver driver_microvm = {
        .name = "microvm",
        .probe = microvm_probe,
        .start = microvm_start,
        .stop = microvm_stop,
        .destroy = microvm_destroy,
        .reap_orphan = microvm_reap_orphan,
        .hello_timeout_ms = 120000,
        .heartbeat_timeout_ms = 90000,
        .console_log = "console.log",
        .stats = microvm_stats,
        .alive = microvm_alive,
};
