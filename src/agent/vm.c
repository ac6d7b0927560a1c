/*
 * The agent as init of a microVM: stage 1 builds the root from the two
 * virtio disks and switches to it, stage 2 mounts the API filesystems
 * (vm.h). Everything here runs as PID 1 of a guest kernel, before the
 * channel exists: failures are returned to main, which writes them to the
 * serial console (the driver keeps its tail) and powers off.
 */
#include "agent/vm.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/random.h>

#include "agent/request.h"
#include "common/io.h"
#include "common/macro.h"

#define NEWROOT "/newroot"
#define LOWER "/lower"
#define UPPER "/upper"
#define AGENT_DIR "/.runtime"
#define AGENT_PATH AGENT_DIR "/agent"
/* The agent's copy in the guest: a static binary of a few MiB. */
#define AGENT_TMPFS_OPTS "size=32m,mode=0755"
#define DISK_WAIT_MS 10000
#define MAX_MODULES 32

static void sleep_ms(unsigned ms) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

/* mkdir + mount; an already mounted target (EBUSY) is fine, so stage 2 can
 * run again after a re-exec. */
static int mount_at(const char *src, const char *target, const char *type, unsigned long flags,
                    const char *data, mode_t mode) {
        if (mkdir(target, mode) < 0 && errno != EEXIST)
                return -errno;
        if (mount(src, target, type, flags, data) < 0 && errno != EBUSY)
                return -errno;
        return 0;
}

bool vm_in_initramfs(void) {
        if (getpid() != 1)
                return false;
        struct statfs sfs;
        if (statfs("/", &sfs) < 0)
                return false;
        return sfs.f_type == RAMFS_MAGIC || sfs.f_type == TMPFS_MAGIC;
}

static int cmp_names(const void *a, const void *b) {
        return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads every module of VM_MODULES_DIR. Dependencies between them are met by
 * loading in name order and retrying the failures until a round makes no
 * progress, so the driver need not ship a modules.dep. */
static int load_modules(void) {
        DIR *d = opendir(VM_MODULES_DIR);
        if (!d)
                return errno == ENOENT ? 0 : -errno;
        char *names[MAX_MODULES];
        size_t n = 0;
        struct dirent *de;
        while ((de = readdir(d)) && n < MAX_MODULES) {
                size_t l = strlen(de->d_name);
                if (l > 3 && strcmp(de->d_name + l - 3, ".ko") == 0) {
                        names[n] = strdup(de->d_name);
                        if (names[n])
                                n++;
                }
        }
        closedir(d);
        qsort(names, n, sizeof(names[0]), cmp_names);

        bool loaded[MAX_MODULES] = {false};
        size_t left = n;
        int last_err = 0;
        bool progress = true;
        while (left > 0 && progress) {
                progress = false;
                for (size_t i = 0; i < n; i++) {
                        if (loaded[i])
                                continue;
                        char path[256];
                        snprintf(path, sizeof(path), "%s/%s", VM_MODULES_DIR, names[i]);
                        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
                        if (fd < 0) {
                                last_err = -errno;
                                continue;
                        }
                        if (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST) {
                                last_err = -errno;
                                continue;
                        }
                        loaded[i] = true;
                        left--;
                        progress = true;
                        /* The module's memory is the kernel's now; the file
                         * would only hold guest RAM. */
                        unlink(path);
                }
        }
        for (size_t i = 0; i < n; i++)
                free(names[i]);
        return left == 0 ? 0 : (last_err ? last_err : -ENOEXEC);
}

/* /dev/vdX whose virtio serial is `serial`, waiting for the disk to be
 * probed. Disk names follow probe order, which the guest does not promise. */
static int find_disk(const char *serial, char *ret_path, size_t len) {
        for (unsigned waited = 0; waited <= DISK_WAIT_MS; waited += 10) {
                DIR *d = opendir("/sys/block");
                if (d) {
                        struct dirent *de;
                        while ((de = readdir(d))) {
                                if (strncmp(de->d_name, "vd", 2) != 0 || strlen(de->d_name) > 16)
                                        continue;
                                /* The precision repeats the length check for the
                                 * compiler, which cannot see it at -O1. */
                                char p[64], s[64];
                                snprintf(p, sizeof(p), "/sys/block/%.16s/serial", de->d_name);
                                if (io_read_text(p, s, sizeof(s)) == 0 && strcmp(s, serial) == 0) {
                                        snprintf(ret_path, len, "/dev/%.16s", de->d_name);
                                        closedir(d);
                                        if (access(ret_path, F_OK) == 0)
                                                return 0;
                                        goto next;
                                }
                        }
                        closedir(d);
                }
        next:
                sleep_ms(10);
        }
        return -ENODEV;
}

static int copy_file(const char *from, const char *to, mode_t mode) {
        _cleanup_close_ int in = open(from, O_RDONLY | O_CLOEXEC);
        if (in < 0)
                return -errno;
        struct stat st;
        if (fstat(in, &st) < 0)
                return -errno;
        _cleanup_close_ int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
        if (out < 0)
                return -errno;
        off_t off = 0;
        while (off < st.st_size) {
                ssize_t n = sendfile(out, in, &off, (size_t)(st.st_size - off));
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        return -EIO;
        }
        if (fchmod(out, mode) < 0)
                return -errno;
        return 0;
}

/* Stage 1: from the initramfs to the sandbox's root. */
static int stage1(char *const argv[], const char **ret_what) {
        int r;
#define STEP(what, expr)                                                                                    \
        do {                                                                                                \
                r = (expr);                                                                                 \
                if (r < 0) {                                                                                \
                        *ret_what = (what);                                                                 \
                        return r;                                                                           \
                }                                                                                           \
        } while (0)

        STEP("mount /dev", mount_at("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755", 0755));
        STEP("mount /proc", mount_at("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, 0555));
        STEP("mount /sys", mount_at("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, 0555));
        STEP("load modules", load_modules());

        char root_dev[32], upper_dev[32];
        STEP("find the root disk", find_disk(VM_DISK_ROOT, root_dev, sizeof(root_dev)));
        STEP("find the upper disk", find_disk(VM_DISK_UPPER, upper_dev, sizeof(upper_dev)));
        /* The image is shared by every sandbox and attached read-only: the
         * guest can neither change it nor replay a journal on it. */
        STEP("mount the root disk", mount_at(root_dev, LOWER, "ext4", MS_RDONLY | MS_NODEV, "noload", 0755));
        STEP("mount the upper disk", mount_at(upper_dev, UPPER, "ext4", MS_NODEV, NULL, 0755));
        if (mkdir(UPPER "/upper", 0755) < 0 && errno != EEXIST)
                STEP("mkdir upper", -errno);
        if (mkdir(UPPER "/work", 0755) < 0 && errno != EEXIST)
                STEP("mkdir work", -errno);
        STEP("mount the overlay",
             mount_at("overlay", NEWROOT, "overlay", 0,
                      "lowerdir=" LOWER ",upperdir=" UPPER "/upper,workdir=" UPPER "/work", 0755));

        /* The agent itself is not part of the disk: every start runs the
         * daemon's current binary from a read-only tmpfs, whatever the
         * sandbox wrote into its root before. A /.runtime that the sandbox
         * turned into a file or a symlink (mount would follow it) goes. */
        struct stat st;
        if (lstat(NEWROOT AGENT_DIR, &st) == 0 && !S_ISDIR(st.st_mode) && unlink(NEWROOT AGENT_DIR) < 0)
                STEP("replace /.runtime", -errno);
        STEP("mount /.runtime",
             mount_at("tmpfs", NEWROOT AGENT_DIR, "tmpfs", MS_NOSUID | MS_NODEV, AGENT_TMPFS_OPTS, 0755));
        STEP("copy the agent", copy_file("/proc/self/exe", NEWROOT AGENT_PATH, 0755));
        if (access(VM_VOLUMES_FILE, F_OK) == 0)
                STEP("keep the volumes' list", copy_file(VM_VOLUMES_FILE, NEWROOT VM_VOLUMES_KEPT, 0444));
        STEP("seal /.runtime",
             mount(NULL, NEWROOT AGENT_DIR, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0
                     ? -errno
                     : 0);

        /* The initramfs stays mounted (as the hidden old root); free what it
         * holds of guest RAM. */
        unlink("/init");
        unlink(VM_VOLUMES_FILE);
        rmdir(VM_MODULES_DIR);
        umount2("/sys", MNT_DETACH);
        umount2("/proc", MNT_DETACH);
        umount2("/dev", MNT_DETACH);

        STEP("chdir", chdir(NEWROOT) < 0 ? -errno : 0);
        STEP("move the root", mount(".", "/", NULL, MS_MOVE, NULL) < 0 ? -errno : 0);
        STEP("chroot", chroot(".") < 0 ? -errno : 0);
        STEP("chdir /", chdir("/") < 0 ? -errno : 0);
        /* argv[0] names what runs (/proc/1/cmdline), not the initramfs's
         * /init that is gone. */
        char *nargv[32];
        size_t n = 0;
        nargv[n++] = (char *)AGENT_PATH;
        for (size_t i = 1; argv[0] && argv[i] && n < ELEMENTSOF(nargv) - 1; i++)
                nargv[n++] = argv[i];
        nargv[n] = NULL;
        execv(AGENT_PATH, nargv);
        *ret_what = "exec " AGENT_PATH;
        return -errno;
#undef STEP
}

static int loopback_up(void) {
        _cleanup_close_ int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return -errno;
        struct ifreq ifr = {0};
        strcpy(ifr.ifr_name, "lo");
        if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
                return -errno;
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
                return -errno;
        return 0;
}

/* runtime.hostname=NAME from the kernel command line; the driver puts the
 * sandbox id there ([a-z0-9_-]{1,64}). */
static int set_hostname(void) {
        char cmdline[4096];
        const char *name = "sandbox";
        char buf[65];
        if (io_read_text("/proc/cmdline", cmdline, sizeof(cmdline)) == 0) {
                char *save = NULL;
                for (char *tok = strtok_r(cmdline, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
                        if (strncmp(tok, "runtime.hostname=", 17) != 0)
                                continue;
                        const char *v = tok + 17;
                        size_t l = strlen(v);
                        if (l == 0 || l >= sizeof(buf) ||
                            strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789-_") != l)
                                break;
                        memcpy(buf, v, l + 1);
                        name = buf;
                        break;
                }
        }
        return sethostname(name, strlen(name)) < 0 ? -errno : 0;
}

static int write_small_file(const char *path, const char *text) {
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        size_t n = strlen(text);
        return write(fd, text, n) == (ssize_t)n ? 0 : -errno;
}

/* runtime.pids=N from the kernel command line: everything the agent starts
 * goes into a cgroup of the guest's own with pids.max = N (each child moves
 * itself there before it execs: limits_child_defaults), so a command that
 * forks without end is refused as in the other drivers. The agent stays in
 * the root cgroup: a fork bomb that fills the leaf cannot stop it forking
 * the next command, and with the leaf's CPU weight at a tenth of the
 * default, spinners on every vCPU leave it its turn. (Root in the guest could
 * undo both: the guest's real bounds are its vCPUs and memory, which the host
 * enforces; these keep a runaway command from starving the agent.) */
#define VM_AGENT_RESERVE_KIB (32u * 1024u)

static int pids_limit(void) {
        char cmdline[4096];
        if (io_read_text("/proc/cmdline", cmdline, sizeof(cmdline)) < 0)
                return 0;
        unsigned long n = 0;
        char *save = NULL;
        for (char *tok = strtok_r(cmdline, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
                if (strcmp(tok, "--") == 0)
                        break;
                if (strncmp(tok, "runtime.pids=", 13) == 0) {
                        char *end;
                        errno = 0;
                        n = strtoul(tok + 13, &end, 10);
                        if (errno || *end || n == 0 || n > 4194304)
                                return -EINVAL;
                }
        }
        if (n == 0)
                return 0;
        if (mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0 &&
            errno != EBUSY)
                return -errno;
        int r = write_small_file("/sys/fs/cgroup/cgroup.subtree_control", "+pids");
        if (r < 0)
                return r;
        if (mkdir("/sys/fs/cgroup/sandbox", 0755) < 0 && errno != EEXIST)
                return -errno;
        char v[32];
        snprintf(v, sizeof(v), "%lu", n);
        if ((r = write_small_file("/sys/fs/cgroup/sandbox/pids.max", v)) < 0)
                return r;
        /* A guest kernel without the cpu or memory controller still gets
         * the pids limit. */
        if (write_small_file("/sys/fs/cgroup/cgroup.subtree_control", "+cpu") == 0)
                (void)write_small_file("/sys/fs/cgroup/sandbox/cpu.weight", "10");
        /* The leaf's memory.max: the guest's RAM less what the agent and
         * the kernel keep, so the guest's OOM killer acts inside the leaf,
         * where the agent is not, and programs that read their cgroup's
         * limit (the JVM, Go) size themselves to it. */
        uint64_t total_kib = 0;
        char meminfo[256];
        if (io_read_text("/proc/meminfo", meminfo, sizeof(meminfo)) == 0 &&
            sscanf(meminfo, "MemTotal: %" SCNu64 " kB", &total_kib) == 1 && total_kib > 2 * VM_AGENT_RESERVE_KIB &&
            write_small_file("/sys/fs/cgroup/cgroup.subtree_control", "+memory") == 0) {
                char max[32];
                snprintf(max, sizeof(max), "%" PRIu64, (total_kib - VM_AGENT_RESERVE_KIB) * 1024);
                (void)write_small_file("/sys/fs/cgroup/sandbox/memory.max", max);
        }
        return 0;
}

/* The directory at path under the root, made where missing (0755, root's),
 * every part a directory and none a symbolic link: what the sandbox left
 * on its disk decides nothing about where a volume lands. With ret_fd, the
 * directory opened (O_PATH): a live volume is mounted on it, never by its
 * path, which a process of the sandbox could change meanwhile. */
static int volume_dir_fd(const char *path, bool make, int *ret_fd) {
        char buf[256];
        if (path[0] != '/' || snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
                return -EINVAL;
        _cleanup_close_ int dfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        char *save = NULL;
        for (char *part = strtok_r(buf + 1, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
                if (strcmp(part, ".") == 0 || strcmp(part, "..") == 0)
                        return -EINVAL;
                if (make && mkdirat(dfd, part, 0755) < 0 && errno != EEXIST)
                        return -errno;
                int next = openat(dfd, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (next < 0)
                        return errno == ELOOP ? -ENOTDIR : -errno;
                close(dfd);
                dfd = next;
        }
        if (ret_fd)
                *ret_fd = TAKE_FD(dfd);
        return 0;
}

static int volume_dir(const char *path) {
        return volume_dir_fd(path, true, NULL);
}

/* A user namespace whose ids 100000..165535 are the guest's 0..65535: the
 * idmap of a volume's mount. A volume's files are owned on its disk as the
 * host's namespace and gVisor sandboxes own them, shifted by the image's
 * 100000 (docs/volumes.md); through this map the guest's user 1000 sees its
 * own as 1000 and writes them as 101000, so one volume moves between the
 * drivers with its owners intact. */
static int volume_userns(int *ret_fd) {
        int sync_pipe[2];
        if (pipe2(sync_pipe, O_CLOEXEC) < 0)
                return -errno;
        pid_t pid = fork();
        if (pid < 0) {
                close(sync_pipe[0]);
                close(sync_pipe[1]);
                return -errno;
        }
        if (pid == 0) {
                char c;
                close(sync_pipe[1]);
                if (unshare(CLONE_NEWUSER) < 0)
                        _exit(1);
                /* Lives until the parent has the namespace's descriptor. */
                (void)!read(sync_pipe[0], &c, 1);
                _exit(0);
        }
        close(sync_pipe[0]);
        int r = 0, fd = -1;
        char p[64], ns[64];
        snprintf(ns, sizeof ns, "/proc/%d/ns/user", (int)pid);
        struct stat self, child;
        /* The child's namespace is its own once it differs from ours. */
        for (unsigned waited = 0; r == 0; waited++) {
                if (stat("/proc/self/ns/user", &self) < 0 || stat(ns, &child) < 0)
                        r = -errno;
                else if (child.st_ino != self.st_ino)
                        break;
                else if (waited > 1000)
                        r = -ETIMEDOUT;
                else
                        sleep_ms(1);
        }
        static const char *const maps[] = { "uid_map", "gid_map" };
        for (size_t i = 0; r == 0 && i < ELEMENTSOF(maps); i++) {
                snprintf(p, sizeof p, "/proc/%d/%s", (int)pid, maps[i]);
                r = write_small_file(p, "100000 0 65536\n");
        }
        if (r == 0 && (fd = open(ns, O_RDONLY | O_CLOEXEC)) < 0)
                r = -errno;
        close(sync_pipe[1]);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
        if (r < 0)
                return r;
        *ret_fd = fd;
        return 0;
}

/* The mount at path replaced by a copy of it seen through userns_fd. */
static int idmap_mount(const char *path, int userns_fd) {
        _cleanup_close_ int tree = open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (tree < 0)
                return -errno;
        struct mount_attr attr = { .attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)userns_fd };
        if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0 || umount2(path, MNT_DETACH) < 0 ||
            move_mount(tree, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) < 0)
                return -errno;
        return 0;
}

/* One volume's disk at its path: read-only without replaying its journal
 * (another guest may read it too), or read-write with its root given to
 * the sandbox's user. Already mounted there (a second stage 2) is fine. */
static int mount_volume(const char *serial, bool ro, const char *path, int userns_fd) {
        char dev[32];
        struct stat ds, ts;
        int r = find_disk(serial, dev, sizeof dev);
        if (r < 0 || (r = volume_dir(path)) < 0)
                return r;
        if (stat(dev, &ds) < 0 || stat(path, &ts) < 0)
                return -errno;
        if (ts.st_dev == ds.st_rdev)
                return 0;
        unsigned long flags = MS_NODEV | MS_NOSUID | MS_NOATIME | (ro ? MS_RDONLY : 0);
        if (mount(dev, path, "ext4", flags, ro ? "noload" : "errors=remount-ro") < 0)
                return -errno;
        if ((r = idmap_mount(path, userns_fd)) < 0)
                return r;
        if (!ro && chown(path, VM_SANDBOX_UID, VM_SANDBOX_UID) < 0)
                return -errno;
        return 0;
}

/* The volumes the driver listed (VM_VOLUMES_KEPT), in its order. */
static int mount_volumes(void) {
        char text[4096];
        int r = io_read_text(VM_VOLUMES_KEPT, text, sizeof text);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return r;
        _cleanup_close_ int userns_fd = -1;
        if ((r = volume_userns(&userns_fd)) < 0)
                return r;
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                char *mode = strchr(line, ' ');
                char *path = mode ? strchr(mode + 1, ' ') : NULL;
                if (!path)
                        return -EINVAL;
                *mode++ = '\0';
                *path++ = '\0';
                if ((r = mount_volume(line, strcmp(mode, "ro") == 0, path, userns_fd)) < 0)
                        return r;
        }
        return 0;
}

/* Stage 2: the API filesystems of the sandbox's root. */
static int stage2(const char **ret_what) {
        int r;
#define STEP(what, expr)                                                                                    \
        do {                                                                                                \
                r = (expr);                                                                                 \
                if (r < 0) {                                                                                \
                        *ret_what = (what);                                                                 \
                        return r;                                                                           \
                }                                                                                           \
        } while (0)

        STEP("mount /proc", mount_at("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, 0555));
        STEP("mount /sys", mount_at("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, 0555));
        STEP("mount /dev", mount_at("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755", 0755));
        STEP("mount /dev/pts", mount_at("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                                        "newinstance,ptmxmode=0666,mode=0620,gid=5", 0755));
        /* devtmpfs has its own ptmx; the one of this devpts instance is the
         * one that allocates ptys in /dev/pts. */
        if (unlink("/dev/ptmx") < 0 && errno != ENOENT)
                STEP("unlink /dev/ptmx", -errno);
        if (symlink("pts/ptmx", "/dev/ptmx") < 0 && errno != EEXIST)
                STEP("link /dev/ptmx", -errno);
        STEP("mount /dev/shm",
             mount_at("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", 01777));
        STEP("mount /tmp", mount_at("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", 01777));
        STEP("mount /run", mount_at("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755", 0755));
        static const char *const links[][2] = {
                {"/proc/self/fd", "/dev/fd"},
                {"/proc/self/fd/0", "/dev/stdin"},
                {"/proc/self/fd/1", "/dev/stdout"},
                {"/proc/self/fd/2", "/dev/stderr"},
        };
        for (size_t i = 0; i < ELEMENTSOF(links); i++)
                if (symlink(links[i][0], links[i][1]) < 0 && errno != EEXIST)
                        STEP("link /dev/fd", -errno);
        /* The egress relay listens on 127.0.0.1 inside: loopback must be up,
         * and it is the only interface the guest has. */
        STEP("loopback up", loopback_up());
        STEP("set the hostname", set_hostname());
        STEP("the pids limit", pids_limit());
        STEP("mount the volumes", mount_volumes());
        return 0;
#undef STEP
}

int vm_setup(char *const argv[], const char **ret_what) {
        const char *dummy;
        if (!ret_what)
                ret_what = &dummy;
        if (getpid() != 1) {
                *ret_what = "not PID 1";
                return -EPERM;
        }
        if (vm_in_initramfs())
                return stage1(argv, ret_what);
        return stage2(ret_what);
}

/* /dev/<vportXpY> whose port name is `name`. */
static int find_port(const char *name, char *ret_path, size_t len) {
        DIR *d = opendir("/sys/class/virtio-ports");
        if (!d)
                return -errno;
        int r = -ENOENT;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.' || strlen(de->d_name) > 32)
                        continue;
                char p[96], s[128];
                snprintf(p, sizeof(p), "/sys/class/virtio-ports/%.32s/name", de->d_name);
                if (io_read_text(p, s, sizeof(s)) == 0 && strcmp(s, name) == 0) {
                        snprintf(ret_path, len, "/dev/%.32s", de->d_name);
                        r = 0;
                        break;
                }
        }
        closedir(d);
        return r;
}

int vm_open_channel(const char *path, int timeout_ms, int *ret_fd) {
        static const char prefix[] = "/dev/virtio-ports/";
        if (!path || path[0] != '/')
                return -EINVAL;
        for (int waited = 0;; waited += 10) {
                char dev[64];
                const char *p = path;
                if (access(path, F_OK) < 0 && strncmp(path, prefix, sizeof(prefix) - 1) == 0 &&
                    find_port(path + sizeof(prefix) - 1, dev, sizeof(dev)) == 0)
                        p = dev;
                int fd = open(p, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
                if (fd >= 0) {
                        *ret_fd = fd;
                        return 0;
                }
                if ((errno != ENOENT && errno != ENXIO) || waited >= timeout_ms)
                        return -errno;
                sleep_ms(10);
        }
}

_Noreturn void vm_poweroff(void) {
        sync();
        reboot(RB_POWER_OFF);
        /* Only reached when not allowed to reboot (not PID 1 of a VM). */
        _exit(1);
}

int vm_resume(const AgentRequest *r) {
        if (!r || r->op != REQ_RESUME || !r->hostname)
                return -EINVAL;
        _cleanup_close_ int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        struct {
                struct rand_pool_info info;
                uint8_t buf[REQUEST_RESUME_ENTROPY];
        } pool = { .info = { .entropy_count = REQUEST_RESUME_ENTROPY * 8, .buf_size = REQUEST_RESUME_ENTROPY } };
        memcpy(pool.buf, r->entropy, sizeof(pool.buf));
        int k = ioctl(fd, RNDADDENTROPY, &pool.info);
        explicit_bzero(&pool, sizeof(pool));
        if (k < 0)
                return -errno;
        /* Credited entropy alone reseeds only on the kernel's schedule: the
         * next getrandom() would still come from the template's key. */
        if (ioctl(fd, RNDRESEEDCRNG) < 0)
                return -errno;
        struct timespec ts = { .tv_sec = (time_t)(r->time_ns / 1000000000LL),
                               .tv_nsec = (long)(r->time_ns % 1000000000LL) };
        if (clock_settime(CLOCK_REALTIME, &ts) < 0)
                return -errno;
        if (sethostname(r->hostname, strlen(r->hostname)) < 0)
                return -errno;
        return 0;
}

/* ---- volumes given to the running guest ------------------------------------ */

#define VIRTIO_BLK_DRIVER "/sys/bus/virtio/drivers/virtio_blk"

/* The slot's disk probed again, which reads the size of the medium the
 * host put in it (a raw node's new file tells the guest nothing): its
 * virtio device unbound from virtio_blk and bound again. dev gets its
 * /dev name, which may differ from the one before. */
static int reprobe(const char *serial, char *dev, size_t len) {
        int r = find_disk(serial, dev, len);
        if (r < 0)
                return r;
        char p[64], link[PATH_MAX];
        snprintf(p, sizeof p, "/sys/block/%.16s/device", dev + strlen("/dev/"));
        ssize_t n = readlink(p, link, sizeof link - 1);
        if (n <= 0)
                return -errno;
        link[n] = 0;
        const char *vdev = strrchr(link, '/');
        vdev = vdev ? vdev + 1 : link;
        if (strncmp(vdev, "virtio", 6) != 0)
                return -ENODEV;
        if ((r = write_small_file(VIRTIO_BLK_DRIVER "/unbind", vdev)) < 0 ||
            (r = write_small_file(VIRTIO_BLK_DRIVER "/bind", vdev)) < 0)
                return r;
        return find_disk(serial, dev, len);
}

int vm_live_mount(const char *serial, const char *dest, bool read_only) {
        char dev[32];
        int r = reprobe(serial, dev, sizeof dev);
        if (r < 0)
                return r;
        _cleanup_close_ int dfd = -1, userns_fd = -1, fs = -1, mnt = -1;
        if ((r = volume_dir_fd(dest, true, &dfd)) < 0 || (r = volume_userns(&userns_fd)) < 0)
                return r;
        /* As at a boot (mount_volume): a read-only one without replaying
         * its journal, a writable one remounted read-only on an error. */
        fs = fsopen("ext4", FSOPEN_CLOEXEC);
        if (fs < 0 || fsconfig(fs, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
            (read_only ? fsconfig(fs, FSCONFIG_SET_FLAG, "ro", NULL, 0) < 0 ||
                                 fsconfig(fs, FSCONFIG_SET_FLAG, "norecovery", NULL, 0) < 0
                       : fsconfig(fs, FSCONFIG_SET_STRING, "errors", "remount-ro", 0) < 0) ||
            fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
                return errno == EINVAL ? -EIO : -errno;
        mnt = fsmount(fs, FSMOUNT_CLOEXEC,
                      MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOATIME | (read_only ? MOUNT_ATTR_RDONLY : 0));
        if (mnt < 0)
                return -errno;
        struct mount_attr attr = { .attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)userns_fd };
        if (mount_setattr(mnt, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0 ||
            move_mount(mnt, "", dfd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
                return -errno;
        /* Through the idmap: the sandbox's user owns the root as it does a
         * boot's volume. */
        if (!read_only && fchownat(mnt, "", VM_SANDBOX_UID, VM_SANDBOX_UID, AT_EMPTY_PATH) < 0) {
                r = -errno;
                (void)umount2(dest, UMOUNT_NOFOLLOW);
                return r;
        }
        return 0;
}

int vm_live_unmount(const char *dest) {
        const char *last = strrchr(dest, '/');
        char parent[256];
        if (dest[0] != '/' || !last || !last[1] || (size_t)(last - dest) >= sizeof parent)
                return -EINVAL;
        snprintf(parent, sizeof parent, "%.*s", (int)(last - dest), dest);
        _cleanup_close_ int pfd = -1, cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
        /* Nothing is made on the way: a path that is not there has nothing
         * mounted (EINVAL, as umount2 says). */
        int r = parent[0] ? volume_dir_fd(parent, false, &pfd) : 0;
        if (r == -ENOENT)
                return -EINVAL;
        if (r == 0 && !parent[0] && (pfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
                r = -errno;
        if (r < 0 || cwd < 0)
                return r < 0 ? r : -errno;
        /* The mount point by its last name from its parent, no link
         * followed; never lazily (EBUSY while a file in it is open). */
        if (fchdir(pfd) < 0)
                return -errno;
        r = umount2(last + 1, UMOUNT_NOFOLLOW) < 0 ? -errno : 0;
        (void)!fchdir(cwd);
        return r;
}
