/*
 * One QEMU process (docs/microvm.md has the reasons for every choice here).
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
 *
 * A VM outlives the daemon that started it (live restore): the sandbox's
 * supervisor keeps what the next daemon takes it over with (the end of this
 * file).
 */
#include "driver/microvm_vmm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "driver/cgroup.h"
#include "common/timeutil.h"
#include "driver/microvm_kvm.h"
#include "driver/microvm_qmp.h"
#include "driver/microvm_guest.h"
#include "driver/microvm_spawn.h"

#define KILL_TIMEOUT_MS 5000
/* QEMU's own messages (stderr) kept in vmm.log: a guest may be able to make
 * QEMU complain repeatedly; what is past this is dropped. */
#define VMM_LOG_MAX (64u * 1024u)
/* What the serial console's socket holds while no daemon reads it (live
 * restore: between a daemon's end and the next one's take-over). QEMU writes
 * the console a byte at a time, and a unix socket charges each write a whole
 * buffer (about 768 bytes here), so this holds about 5 KiB of console output
 * (a panic's trace); past that the guest's serial port waits (docs/microvm.md,
 * "Live restore"). */
#define CONSOLE_SOCKET_BUF (2u * 1024u * 1024u)
/* How long a daemon taking a VM over waits for its monitor to answer. */
#define QMP_ADOPT_TIMEOUT_MS 10000

struct DriverInstance {
        char *id;
        char *sandbox_dir;
        char *upper_path;
        pid_t pid;
        int pidfd;
        /* Started by an earlier daemon (live restore): QEMU is not our
         * child, its pidfd says when it ends, and its wait status is
         * nobody's to read. */
        bool adopted;
        MicrovmAccel accel;
        bool exited;
        bool died_before_stop;
        int wait_status;
        Cgroup *cg;
        int console_fd; /* our end of the serial console's socket */
        int console_log_fd;
        int vmm_err_fd; /* read end of QEMU's stderr */
        int vmm_log_fd;
        pthread_t console_thread;
        bool console_running;
        int stop_fd; /* eventfd: the console thread drains what waits, then ends */
        /* What console.log and vmm.log held when the thread began (a VM
         * taken over: their bounds count what an earlier daemon wrote). */
        uint64_t console_log_len, vmm_log_len;
        /* QEMU's monitor, for pause and resume; NULL when the caller kept
         * the monitor (a template being made). qmp_ready once negotiated. */
        MicrovmQmp *qmp;
        bool qmp_ready;
        /* What a memory snapshot of it must keep to be restored: the name
         * on its kernel's command line, its initramfs (a descriptor of the
         * file it started with) and the key of what the saved guest depends
         * on (microvm_saved_guest_key). */
        char *hostname;
        int initrd_fd;
        char *key;
};

/* ---- the console ----------------------------------------------------------- */

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

/* A console.log an earlier daemon wrote: the ring starts with its last
 * bytes, so that its rewrite at the bound keeps them. */
static void console_seed(ConsoleRing *c, int fd) {
        static const size_t keep = MICROVM_CONSOLE_KEEP;
        size_t want = c->file_len < keep ? (size_t)c->file_len : keep;
        ssize_t n = want ? pread(fd, c->ring, want, (off_t)(c->file_len - want)) : 0;
        c->len = n > 0 ? (size_t)n : 0;
        c->pos = c->len % keep;
}

/* The supervisor thread of one VM: copies the guest's serial console into
 * console.log and QEMU's stderr into vmm.log, both bounded, until QEMU (which
 * holds the other ends) is gone, or until stop_fd says so: then what waits
 * in both (up to a bound: a guest may go on printing) is copied first. */
static void *console_main(void *userdata) {
        DriverInstance *inst = userdata;
        ConsoleRing c = { .ring = malloc(MICROVM_CONSOLE_KEEP), .file_len = inst->console_log_len };
        if (c.ring)
                console_seed(&c, inst->console_log_fd);
        uint64_t vmm_len = inst->vmm_log_len;
        struct pollfd p[3] = {
                { .fd = inst->console_fd, .events = POLLIN },
                { .fd = inst->vmm_err_fd, .events = POLLIN },
                { .fd = inst->stop_fd, .events = POLLIN },
        };
        uint8_t buf[4096];
        bool stopping = false;
        size_t drained = 0;
        while (p[0].fd >= 0 || p[1].fd >= 0) {
                int k = poll(p, 3, stopping ? 0 : -1);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                if (k == 0 || drained > MICROVM_CONSOLE_MAX)
                        break; /* told to stop, and nothing more waits */
                if (p[2].fd >= 0 && p[2].revents) {
                        stopping = true;
                        p[2].fd = -1;
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
                        if (stopping)
                                drained += (size_t)n;
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

typedef struct Args {
        char *v[192];
        size_t n;
        char store[96][128];
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

/* ---- one VM ----------------------------------------------------------------- */

/* What one QEMU process is started with. */
typedef struct VmLaunch {
        const MicrovmStart *s;
        const char *cmdline;
        const char *upper_path; /* for stats */
        int kernel_fd, initrd_fd, root_fd, upper_fd, upper_ro_fd;
        /* The volumes' disks (s->volumes): the spec's held descriptor and,
         * for a writable one, a read-only one for the block layer's probes. */
        size_t n_vols;
        int vol_fd[DRIVER_MAX_MOUNTS], vol_ro_fd[DRIVER_MAX_MOUNTS];
        int monitor_fd;  /* QEMU's end of a QMP socket, or -1 */
        int incoming_fd; /* a saved state to start from, or -1 */
} VmLaunch;

static int vm_args(const VmLaunch *l, int chan_vmm, int console_w, Args *a) {
        const MicrovmStart *s = l->s;
        int r = 0;
        arg(a, s->qemu);
        arg(a, "-name");
        r |= argf(a, "sandbox-%s", s->spec->id);
        arg(a, "-M");
        arg(a, "microvm,x-option-roms=off,rtc=on,isa-serial=on,pcie=off");
        /* Under TCG, QEMU's default translation cache is 1 GiB: bound it, it
         * counts against the sandbox's memory. */
        arg(a, "-accel");
        arg(a, s->accel == MICROVM_ACCEL_KVM ? "kvm" : "tcg,tb-size=64");
        arg(a, "-cpu");
        arg(a, s->accel == MICROVM_ACCEL_KVM ? "host" : "max");
        arg(a, "-smp");
        r |= argf(a, "%u", s->vcpu);
        arg(a, "-m");
        r |= argf(a, "%u", s->mem);
        arg(a, "-nodefaults");
        arg(a, "-no-user-config");
        arg(a, "-display");
        arg(a, "none");
        arg(a, "-no-reboot");
        arg(a, "-sandbox");
        arg(a, "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
        arg(a, "-kernel");
        r |= argf(a, "/proc/self/fd/%d", l->kernel_fd);
        arg(a, "-initrd");
        r |= argf(a, "/proc/self/fd/%d", l->initrd_fd);
        arg(a, "-append");
        arg(a, l->cmdline);
        arg(a, "-add-fd");
        r |= argf(a, "fd=%d,set=1", l->root_fd);
        arg(a, "-drive");
        arg(a, "id=root,if=none,file=/dev/fdset/1,format=raw,readonly=on,aio=threads");
        arg(a, "-device");
        arg(a, "virtio-blk-device,drive=root,serial=root");
        arg(a, "-add-fd");
        r |= argf(a, "fd=%d,set=2", l->upper_fd);
        arg(a, "-add-fd");
        r |= argf(a, "fd=%d,set=2", l->upper_ro_fd);
        /* No image locks: the daemon alone hands the disk to this one QEMU,
         * and after a save QEMU takes its own locks again through the other
         * descriptor of the set and fails ("Failed to get shared write
         * lock"), which would keep the guest from running on. */
        arg(a, "-drive");
        arg(a, "id=upper,if=none,file=/dev/fdset/2,format=raw,cache=none,aio=threads,file.locking=off");
        arg(a, "-device");
        arg(a, "virtio-blk-device,drive=upper,serial=upper");
        /* A volume's lock is the daemon's (volume_disk_hold), on the
         * descriptor QEMU holds; QEMU's own would only repeat it. */
        for (size_t i = 0; i < l->n_vols; i++) {
                const DriverMount *m = &s->spec->mounts[i];
                arg(a, "-add-fd");
                r |= argf(a, "fd=%d,set=%zu", l->vol_fd[i], 3 + i);
                if (l->vol_ro_fd[i] >= 0) {
                        arg(a, "-add-fd");
                        r |= argf(a, "fd=%d,set=%zu", l->vol_ro_fd[i], 3 + i);
                }
                arg(a, "-drive");
                r |= argf(a, "id=vol%zu,if=none,file=/dev/fdset/%zu,format=raw,cache=none,aio=threads,"
                             "file.locking=off%s", i, 3 + i, m->read_only ? ",readonly=on" : "");
                arg(a, "-device");
                r |= argf(a, "virtio-blk-device,drive=vol%zu,serial=" MICROVM_VOLUME_SERIAL "%zu", i, i);
        }
        /* The empty slots (a template's guest has them too): a null
         * medium of no size each, read-only for the read-only ones. */
        for (unsigned j = 0; j < MICROVM_SLOTS; j++) {
                const char *ro = j >= MICROVM_SLOTS_RW ? ",read-only=on" : "";
                arg(a, "-blockdev");
                r |= argf(a, "driver=null-co,node-name=slotnull%u,size=0%s", j, ro);
                arg(a, "-blockdev");
                r |= argf(a, "driver=raw,node-name=slot%u,file=slotnull%u%s", j, j, ro);
                arg(a, "-device");
                r |= argf(a, "virtio-blk-device,drive=slot%u,serial=" MICROVM_SLOT_SERIAL_FMT, j, j);
        }
        arg(a, "-device");
        arg(a, "virtio-serial-device,max_ports=2");
        arg(a, "-chardev");
        r |= argf(a, "socket,id=chan,fd=%d", chan_vmm);
        arg(a, "-device");
        arg(a, "virtserialport,chardev=chan,name=" MICROVM_CHANNEL_PORT ",nr=1");
        /* The guest's entropy from the host's; rate-bounded so that a guest
         * cannot drain the host's pool for everybody else. */
        arg(a, "-object");
        arg(a, "rng-random,id=rng,filename=/dev/urandom");
        arg(a, "-device");
        arg(a, "virtio-rng-device,rng=rng,max-bytes=65536,period=1000");
        arg(a, "-chardev");
        r |= argf(a, "socket,id=console,fd=%d", console_w);
        arg(a, "-serial");
        arg(a, "chardev:console");
        if (l->monitor_fd >= 0) {
                arg(a, "-chardev");
                r |= argf(a, "socket,id=mon,fd=%d", l->monitor_fd);
                arg(a, "-mon");
                arg(a, "chardev=mon,mode=control");
        }
        if (l->incoming_fd >= 0) {
                arg(a, "-incoming");
                r |= argf(a, "fd:%d", l->incoming_fd);
        }
        return r != 0 || a->n >= ELEMENTSOF(a->v) - 1 ? -E2BIG : 0;
}

static void instance_release(DriverInstance *inst) {
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
        if (inst->stop_fd >= 0)
                close(inst->stop_fd);
        if (inst->qmp) {
                close(inst->qmp->fd);
                free(inst->qmp);
        }
        if (inst->initrd_fd >= 0)
                close(inst->initrd_fd);
        free(inst->hostname);
        free(inst->key);
        cgroup_free(inst->cg);
        free(inst->id);
        free(inst->sandbox_dir);
        free(inst->upper_path);
        free(inst);
}

static DriverInstance *instance_new(const DriverSpec *spec, const char *upper_path) {
        DriverInstance *inst = calloc(1, sizeof(*inst));
        if (!inst)
                return NULL;
        inst->pid = -1;
        inst->pidfd = inst->console_fd = inst->console_log_fd = inst->vmm_err_fd = inst->vmm_log_fd = -1;
        inst->initrd_fd = inst->stop_fd = -1;
        inst->id = strdup(spec->id);
        inst->sandbox_dir = strdup(spec->sandbox_dir);
        inst->upper_path = strdup(upper_path);
        if (!inst->id || !inst->sandbox_dir || !inst->upper_path) {
                instance_release(inst);
                return NULL;
        }
        return inst;
}

static void console_start(DriverInstance *inst) {
        inst->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (inst->stop_fd >= 0 && pthread_create(&inst->console_thread, NULL, console_main, inst) == 0) {
                inst->console_running = true;
                return;
        }
        /* Nobody would drain them: closed, QEMU's writes fail instead of
         * blocking the guest (unless a supervisor holds them too). */
        close(TAKE_FD(inst->console_fd));
        close(TAKE_FD(inst->vmm_err_fd));
}

/* The console thread copies what waits, then ends: at once when QEMU is
 * gone (it reads to the end), or leaving the rest in the socket for a later
 * daemon when QEMU runs on. */
static void console_stop(DriverInstance *inst) {
        if (!inst->console_running)
                return;
        uint64_t one = 1;
        (void)!write(inst->stop_fd, &one, sizeof(one));
        pthread_join(inst->console_thread, NULL);
        inst->console_running = false;
}

/* A pidfd's process has ended (a zombie counts), within timeout_ms. */
static bool pidfd_gone(int pidfd, int timeout_ms) {
        struct pollfd p = { .fd = pidfd, .events = POLLIN };
        int r;
        while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
                ;
        return r != 0;
}

/* An adopted QEMU is not our child: no waitpid, and no status to read. One
 * that ended before the kill ended on its own, which for QEMU is an exit (a
 * guest's power-off or panic); otherwise it reads as killed by us. */
static int adopted_kill(DriverInstance *inst) {
        if (!pidfd_gone(inst->pidfd, 0)) {
                if (syscall(SYS_pidfd_send_signal, inst->pidfd, SIGKILL, NULL, 0) == 0 || errno != ESRCH) {
                        (void)pidfd_gone(inst->pidfd, KILL_TIMEOUT_MS);
                        return SIGKILL;
                }
        }
        inst->died_before_stop = true;
        return 0;
}

static void instance_kill(DriverInstance *inst) {
        if (inst->pid > 0 && !inst->exited && inst->adopted) {
                inst->wait_status = adopted_kill(inst);
                inst->exited = true;
        }
        if (inst->pid > 0 && !inst->exited) {
                int status;
                if (waitpid(inst->pid, &status, WNOHANG) == inst->pid) {
                        inst->died_before_stop = true;
                } else {
                        kill(inst->pid, SIGKILL);
                        /* What it reads as when it cannot be waited for
                         * (reaped elsewhere): killed by us. */
                        status = SIGKILL;
                        while (waitpid(inst->pid, &status, 0) < 0 && errno == EINTR)
                                ;
                }
                inst->exited = true;
                inst->wait_status = status;
        }
        if (inst->cg) {
                (void)cgroup_kill_all(inst->cg, KILL_TIMEOUT_MS);
                (void)cgroup_remove(inst->cg);
        }
        /* QEMU held the only other ends: the thread reads them to their
         * end. */
        console_stop(inst);
}

static int vm_launch(const VmLaunch *l, int *ret_fd, DriverInstance **ret) {
        const MicrovmStart *s = l->s;
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
        /* A unix stream socket queues against its writer's send buffer:
         * QEMU's end is given room for the output of a guest whose daemon
         * is away (root may exceed the system's bound; best effort). */
        int sndbuf = CONSOLE_SOCKET_BUF;
        (void)setsockopt(console_w, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof(sndbuf));
        _cleanup_close_ int console_log =
                open(s->p_console, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (console_log < 0)
                return -errno;
        int ep[2];
        if (pipe2(ep, O_CLOEXEC) < 0)
                return -errno;
        _cleanup_close_ int vmm_err_r = ep[0];
        _cleanup_close_ int vmm_err_w = ep[1];
        /* QEMU's end only (the two ends are separate open files): with no
         * daemon to drain it, a full pipe drops QEMU's messages rather than
         * stopping QEMU in a write a guest may have provoked. What it holds
         * (64 KiB) is as much as vmm.log keeps. */
        if (fcntl(vmm_err_w, F_SETFL, O_NONBLOCK) < 0)
                return -errno;
        _cleanup_close_ int log_fd = fcntl(s->log_fd, F_DUPFD_CLOEXEC, 3);
        if (log_fd < 0)
                return -errno;

        Args a = { 0 };
        int r = vm_args(l, chan_vmm, console_w, &a);
        if (r < 0)
                return r;

        DriverInstance *inst = instance_new(s->spec, l->upper_path);
        if (!inst)
                return -ENOMEM;
        inst->accel = s->accel;
        int cgroup_fds[_CGROUP_HIER_MAX];
        for (size_t i = 0; i < ELEMENTSOF(cgroup_fds); i++)
                cgroup_fds[i] = -1;
        r = microvm_vmm_cgroup(s->spec, s->accel, s->mem, s->vcpu, &inst->cg);
        if (r >= 0)
                r = cgroup_open_procs(inst->cg, cgroup_fds, ELEMENTSOF(cgroup_fds));
        if (r < 0) {
                microvm_vm_free(inst);
                return r;
        }
        int keep[9 + 2 * DRIVER_MAX_MOUNTS] = { l->kernel_fd, l->initrd_fd, l->root_fd, l->upper_fd,
                                                l->upper_ro_fd, chan_vmm, console_w };
        size_t n_keep = 7;
        for (size_t i = 0; i < l->n_vols; i++) {
                keep[n_keep++] = l->vol_fd[i];
                if (l->vol_ro_fd[i] >= 0)
                        keep[n_keep++] = l->vol_ro_fd[i];
        }
        if (l->monitor_fd >= 0)
                keep[n_keep++] = l->monitor_fd;
        if (l->incoming_fd >= 0)
                keep[n_keep++] = l->incoming_fd;
        MicrovmSpawn sp = {
                .argv = a.v,
                .keep = keep,
                .n_keep = n_keep,
                .log_fd = vmm_err_w,
                .uid_name = s->spec->id,
                .extra_gid = s->accel == MICROVM_ACCEL_KVM ? microvm_kvm_group() : (gid_t)-1,
                .cgroup_fds = cgroup_fds,
                .n_cgroup_fds = ELEMENTSOF(cgroup_fds),
        };
        r = microvm_spawn_qemu(&sp, &inst->pid);
        cgroup_close_fds(cgroup_fds, ELEMENTSOF(cgroup_fds));
        if (r < 0) {
                inst->pid = -1;
                microvm_vm_free(inst);
                return r;
        }
        inst->pidfd = (int)syscall(SYS_pidfd_open, inst->pid, 0);

        inst->console_fd = TAKE_FD(console_r);
        inst->console_log_fd = TAKE_FD(console_log);
        inst->vmm_err_fd = TAKE_FD(vmm_err_r);
        inst->vmm_log_fd = TAKE_FD(log_fd);
        /* QEMU has them now: ours would keep the console thread's reads
         * from ever seeing the end. */
        closep(&console_w);
        console_w = -1;
        closep(&vmm_err_w);
        vmm_err_w = -1;
        console_start(inst);
        *ret_fd = TAKE_FD(chan_host);
        *ret = inst;
        return 0;
}

static void volume_fds_close(VmLaunch *l) {
        for (size_t i = 0; i < l->n_vols; i++)
                if (l->vol_ro_fd[i] >= 0)
                        close(l->vol_ro_fd[i]);
        l->n_vols = 0;
}

/* The volumes' descriptors of a boot: the held ones are the daemon's
 * (closed by it after the start), the read-only companions ours. */
static int volume_fds(const MicrovmStart *s, VmLaunch *l) {
        if (!s->volumes)
                return 0;
        for (size_t i = 0; i < s->spec->n_mounts && i < DRIVER_MAX_MOUNTS; i++) {
                const DriverMount *m = &s->spec->mounts[i];
                if (m->image_fd < 0) {
                        volume_fds_close(l);
                        return -EBADF;
                }
                l->vol_fd[i] = m->image_fd;
                l->vol_ro_fd[i] = -1;
                l->n_vols = i + 1;
                if (!m->read_only) {
                        char p[64];
                        snprintf(p, sizeof p, "/proc/self/fd/%d", m->image_fd);
                        l->vol_ro_fd[i] = open(p, O_RDONLY | O_CLOEXEC | O_DIRECT);
                        if (l->vol_ro_fd[i] < 0) {
                                int r = -errno;
                                volume_fds_close(l);
                                return r;
                        }
                }
        }
        return 0;
}

int microvm_vm_start(const MicrovmStart *s, const char *hostname, int initrd_fd, const char *upper, int monitor_fd,
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
                .s = s, .cmdline = cmdline, .upper_path = upper, .kernel_fd = kernel_fd, .initrd_fd = initrd_fd,
                .root_fd = root_fd, .upper_fd = upper_fd, .upper_ro_fd = upper_ro_fd, .incoming_fd = incoming_fd,
        };
        r = volume_fds(s, &l);
        if (r < 0)
                return r;
        /* Without a caller's monitor, the daemon keeps one: pause and
         * resume are QMP's stop and cont. */
        int mon[2] = { -1, -1 };
        MicrovmQmp *qmp = NULL;
        if (monitor_fd < 0) {
                qmp = calloc(1, sizeof(*qmp));
                if (!qmp || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, mon) < 0) {
                        r = qmp ? -errno : -ENOMEM;
                        free(qmp);
                        volume_fds_close(&l);
                        return r;
                }
                monitor_fd = mon[1];
        }
        l.monitor_fd = monitor_fd;
        r = vm_launch(&l, ret_fd, ret);
        volume_fds_close(&l);
        if (mon[1] >= 0)
                close(mon[1]);
        if (r == 0) {
                char key[4096];
                DriverInstance *inst = *ret;
                inst->hostname = strdup(hostname);
                inst->initrd_fd = fcntl(initrd_fd, F_DUPFD_CLOEXEC, 3);
                /* Without them it runs, but cannot be saved. */
                if (microvm_saved_guest_key(s, key, sizeof(key)) == 0)
                        inst->key = strdup(key);
        }
        if (r < 0 || !qmp) {
                if (mon[0] >= 0)
                        close(mon[0]);
                free(qmp);
                return r;
        }
        qmp->fd = mon[0];
        (*ret)->qmp = qmp;
        return 0;
}

/* QMP's stop and cont, by a deadline: QEMU under TCG on a loaded host can be
 * slow to answer its monitor. */
#define QMP_TIMEOUT_MS 20000

/* The daemon's monitor of the VM, negotiated once. */
static int vm_monitor(DriverInstance *inst, int64_t deadline, MicrovmQmp **ret, char *why, size_t why_len) {
        if (!inst || !inst->qmp || inst->exited)
                return -EINVAL;
        if (!inst->qmp_ready) {
                int r = microvm_qmp_exec(inst->qmp, "{\"execute\":\"qmp_capabilities\"}\n", -1, deadline, NULL, why,
                                         why_len);
                if (r < 0)
                        return r;
                inst->qmp_ready = true;
        }
        *ret = inst->qmp;
        return 0;
}

static int vm_qmp(DriverInstance *inst, const char *cmd) {
        int64_t deadline = (int64_t)time_now_mono_ms() + QMP_TIMEOUT_MS;
        char why[256] = "";
        MicrovmQmp *q;
        int r = vm_monitor(inst, deadline, &q, why, sizeof(why));
        return r < 0 ? r : microvm_qmp_exec(q, cmd, -1, deadline, NULL, why, sizeof(why));
}

int microvm_vm_qmp(DriverInstance *inst, const char *cmd, int pass_fd, char *why, size_t why_len) {
        int64_t deadline = (int64_t)time_now_mono_ms() + QMP_TIMEOUT_MS;
        MicrovmQmp *q;
        int r = vm_monitor(inst, deadline, &q, why, why_len);
        return r < 0 ? r : microvm_qmp_exec(q, cmd, pass_fd, deadline, NULL, why, why_len);
}

int microvm_vm_save(DriverInstance *inst, int state_fd, int64_t deadline, char *why, size_t why_len) {
        MicrovmQmp *q;
        int r = vm_monitor(inst, deadline, &q, why, why_len);
        return r < 0 ? r : microvm_qmp_save(q, state_fd, deadline, why, why_len);
}

int microvm_vm_finish_incoming(DriverInstance *inst, int64_t deadline, char *why, size_t why_len) {
        MicrovmQmp *q;
        int r = vm_monitor(inst, deadline, &q, why, why_len);
        for (bool loading = true; r == 0 && loading;) {
                json_t *ret = NULL;
                r = microvm_qmp_exec(q, "{\"execute\":\"query-status\"}\n", -1, deadline, &ret, why, why_len);
                if (r < 0)
                        break;
                const char *status = json_string_value(json_object_get(ret, "status"));
                loading = status && strcmp(status, "inmigrate") == 0;
                bool running = status && strcmp(status, "running") == 0;
                if (!loading && !running && status && strcmp(status, "paused") != 0 &&
                    strcmp(status, "postmigrate") != 0 && strcmp(status, "prelaunch") != 0) {
                        snprintf(why, why_len, "the restored guest is %s", status);
                        r = -EIO;
                }
                json_decref(ret);
                if (r == 0 && loading) {
                        if ((int64_t)time_now_mono_ms() > deadline) {
                                snprintf(why, why_len, "loading the saved guest ran past its deadline");
                                r = -ETIMEDOUT;
                        } else
                                usleep(20000);
                } else if (r == 0 && !running)
                        r = microvm_qmp_exec(q, "{\"execute\":\"cont\"}\n", -1, deadline, NULL, why, why_len);
        }
        return r;
}

const char *microvm_vm_hostname(const DriverInstance *inst) {
        return inst->hostname;
}

int microvm_vm_initrd_fd(const DriverInstance *inst) {
        return inst->initrd_fd;
}

const char *microvm_vm_key(const DriverInstance *inst) {
        return inst->key;
}

const char *microvm_vm_upper_path(const DriverInstance *inst) {
        return inst->upper_path;
}

int microvm_vm_pause(DriverInstance *inst) {
        return vm_qmp(inst, "{\"execute\":\"stop\"}\n");
}

int microvm_vm_resume(DriverInstance *inst) {
        return vm_qmp(inst, "{\"execute\":\"cont\"}\n");
}

const char *microvm_vm_stop(DriverInstance *inst) {
        if (!inst)
                return NULL;
        bool was_exited = inst->exited;
        /* Read before the kill: the cgroup goes with it. */
        CgroupStats cs;
        bool oom = !was_exited && inst->cg && cgroup_read_stats(inst->cg, &cs) == 0 && cs.oom_kills > 0;
        instance_kill(inst);
        if (was_exited && !inst->died_before_stop)
                return NULL; /* stopped before: its reason was told then */
        /* QEMU exits 0 on a guest power-off or panic (-no-reboot, panic=-1).
         * One caught half-way through its exit ignores our SIGKILL and still
         * reports its own exit: that counts as having died on its own too. A
         * SIGKILL is ours unless QEMU was already gone before we sent it. */
        const char *reason = NULL;
        int st = inst->wait_status;
        if (WIFEXITED(st))
                reason = "exited";
        else if (WIFSIGNALED(st) && (inst->died_before_stop || WTERMSIG(st) != SIGKILL))
                reason = "killed";
        return reason && oom ? "oom" : reason;
}

void microvm_vm_free(DriverInstance *inst) {
        if (!inst)
                return;
        (void)microvm_vm_stop(inst);
        instance_release(inst);
}

const char *microvm_vm_sandbox_dir(const DriverInstance *inst) {
        return inst->sandbox_dir;
}

bool microvm_vm_alive(DriverInstance *inst) {
        if (!inst || inst->exited || inst->pid <= 0)
                return false;
        if (inst->pidfd < 0)
                return kill(inst->pid, 0) == 0;
        struct pollfd p = { .fd = inst->pidfd, .events = POLLIN };
        return poll(&p, 1, 0) == 0;
}

int microvm_vm_stats(DriverInstance *inst, DriverStats *ret) {
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

/* ---- live restore ------------------------------------------------------------ */

/* The kept descriptors, in this order. */
enum { HANDLE_PIDFD, HANDLE_MONITOR, HANDLE_CONSOLE, HANDLE_VMM_ERR, HANDLE_INITRD };

static bool name_valid(const char *s, size_t max) {
        size_t n = strlen(s);
        return n > 0 && n <= max &&
               strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == n;
}

int microvm_vm_handles(DriverInstance *inst, int *fds, size_t *n, char *state, size_t state_len) {
        if (!inst || *n < MICROVM_VM_HANDLES || !inst->qmp || inst->pidfd < 0 || inst->pid <= 1 || inst->exited ||
            inst->console_fd < 0 || inst->vmm_err_fd < 0 || inst->initrd_fd < 0 || !inst->hostname ||
            !name_valid(inst->hostname, MICROVM_HOSTNAME_MAX))
                return -EOPNOTSUPP;
        /* Negotiated now, once and for good (QMP has no way back), so that
         * the state, which is written once, stays true. */
        char why[256] = "";
        MicrovmQmp *q;
        int r = vm_monitor(inst, (int64_t)time_now_mono_ms() + QMP_TIMEOUT_MS, &q, why, sizeof(why));
        if (r < 0)
                return r;
        char key[17] = "-";
        if (inst->key)
                snprintf(key, sizeof(key), "%016llx", (unsigned long long)fnv1a64_str(FNV1A64_INIT, inst->key));
        int w = snprintf(state, state_len, "v=%d,pid=%d,qmp=1,accel=%s,host=%s,key=%s", MICROVM_VM_STATE_VERSION,
                         (int)inst->pid, inst->accel == MICROVM_ACCEL_KVM ? "kvm" : "tcg", inst->hostname, key);
        if (w < 0 || (size_t)w >= state_len)
                return -ENAMETOOLONG;
        const int mine[MICROVM_VM_HANDLES] = {
                [HANDLE_PIDFD] = inst->pidfd,         [HANDLE_MONITOR] = inst->qmp->fd,
                [HANDLE_CONSOLE] = inst->console_fd,  [HANDLE_VMM_ERR] = inst->vmm_err_fd,
                [HANDLE_INITRD] = inst->initrd_fd,
        };
        for (size_t i = 0; i < MICROVM_VM_HANDLES; i++) {
                fds[i] = fcntl(mine[i], F_DUPFD_CLOEXEC, 3);
                if (fds[i] < 0) {
                        r = -errno;
                        while (i > 0)
                                close(fds[--i]);
                        return r;
                }
        }
        *n = MICROVM_VM_HANDLES;
        return 0;
}

/* The state's parts, each "name=value" and ',' between: strict, every
 * field in its place, numbers in decimal without sign or leading zero. */
static const char *take_lit(const char *p, const char *lit) {
        size_t n = strlen(lit);
        return p && strncmp(p, lit, n) == 0 ? p + n : NULL;
}

static const char *take_uint(const char *p, uint64_t max, uint64_t *ret) {
        if (!p || *p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
                return NULL;
        uint64_t v = 0;
        for (; *p >= '0' && *p <= '9'; p++) {
                v = v * 10 + (uint64_t)(*p - '0');
                if (v > max)
                        return NULL;
        }
        *ret = v;
        return p;
}

/* Up to the next ',' or the end: at most len - 1 characters. */
static const char *take_word(const char *p, char *buf, size_t len) {
        if (!p)
                return NULL;
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= len)
                return NULL;
        memcpy(buf, p, n);
        buf[n] = '\0';
        return p + n;
}

int microvm_vm_state_parse(const char *state, MicrovmVmState *ret) {
        if (!state || strlen(state) > DRIVER_STATE_MAX)
                return -EBADMSG;
        uint64_t version = 0, pid = 0, qmp = 0;
        char accel[8], host[MICROVM_HOSTNAME_MAX + 1], key[17];
        const char *p = take_uint(take_lit(state, "v="), 1000, &version);
        p = take_uint(take_lit(p, ",pid="), INT32_MAX, &pid);
        p = take_uint(take_lit(p, ",qmp="), 1, &qmp);
        p = take_word(take_lit(p, ",accel="), accel, sizeof(accel));
        p = take_word(take_lit(p, ",host="), host, sizeof(host));
        p = take_word(take_lit(p, ",key="), key, sizeof(key));
        if (!p || *p != '\0' || version != MICROVM_VM_STATE_VERSION || pid <= 1 || !name_valid(host, sizeof(host) - 1))
                return -EBADMSG;
        MicrovmVmState st = { .pid = (pid_t)pid, .qmp_ready = qmp == 1 };
        if (strcmp(accel, "tcg") == 0)
                st.accel = MICROVM_ACCEL_TCG;
        else if (strcmp(accel, "kvm") == 0)
                st.accel = MICROVM_ACCEL_KVM;
        else
                return -EBADMSG;
        if (strcmp(key, "-") != 0) {
                if (strlen(key) != 16 || strspn(key, "0123456789abcdef") != 16)
                        return -EBADMSG;
                st.has_key = true;
                st.key_hash = strtoull(key, NULL, 16);
        }
        memcpy(st.hostname, host, strlen(host) + 1);
        *ret = st;
        return 0;
}

/* Whether pid is a QEMU running as the sandbox's own VMM uid (every uid of
 * /proc's Uid: line): a kept pidfd of anything else is not ours to take. */
static bool vmm_process_is(pid_t pid, uid_t uid) {
        char path[64], line[256];
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        _cleanup_fclose_ FILE *f = fopen(path, "re");
        if (!f)
                return false;
        bool name = false, ids = false;
        while (fgets(line, sizeof(line), f)) {
                unsigned u[4];
                if (strncmp(line, "Name:", 5) == 0)
                        name = strcmp(line + 5 + strspn(line + 5, " \t"), "qemu-system-x86\n") == 0;
                else if (sscanf(line, "Uid: %u %u %u %u", &u[0], &u[1], &u[2], &u[3]) == 4)
                        ids = u[0] == uid && u[1] == uid && u[2] == uid && u[3] == uid;
        }
        return name && ids;
}

static int adopt_check(DriverInstance *inst, const MicrovmVmState *st, const DriverSpec *spec) {
        pid_t now = 0;
        if (microvm_pidfd_pid(inst->pidfd, &now) < 0 || now != st->pid || pidfd_gone(inst->pidfd, 0))
                return -ESRCH;
        if (!vmm_process_is(st->pid, microvm_uid_for(spec->id)))
                return -EBADMSG;
        /* Still alive after the look: the pid was not another's meanwhile. */
        if (pidfd_gone(inst->pidfd, 0))
                return -ESRCH;
        struct stat mon, con, err, initrd;
        if (fstat(inst->qmp->fd, &mon) < 0 || fstat(inst->console_fd, &con) < 0 || fstat(inst->vmm_err_fd, &err) < 0 ||
            fstat(inst->initrd_fd, &initrd) < 0 || !S_ISSOCK(mon.st_mode) || !S_ISSOCK(con.st_mode) ||
            !S_ISFIFO(err.st_mode) || !S_ISREG(initrd.st_mode))
                return -EBADMSG;
        return microvm_vmm_cgroup_open(spec, &inst->cg) < 0 ? -ESRCH : 0;
}

int microvm_vm_adopt(const MicrovmStart *s, const MicrovmVmState *st, const char *upper, const char *key, int *fds,
                     size_t n, DriverInstance **ret) {
        DriverInstance *inst = n == MICROVM_VM_HANDLES ? instance_new(s->spec, upper) : NULL;
        MicrovmQmp *qmp = inst ? calloc(1, sizeof(*qmp)) : NULL;
        int r = n != MICROVM_VM_HANDLES ? -EBADMSG : !qmp ? -ENOMEM : 0;
        for (size_t i = 0; i < n; i++)
                if (fds[i] < 0)
                        r = -EBADMSG;
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        if (fds[i] >= 0)
                                close(fds[i]);
                free(qmp);
                instance_release(inst);
                return r;
        }
        inst->pidfd = fds[HANDLE_PIDFD];
        qmp->fd = fds[HANDLE_MONITOR];
        inst->qmp = qmp;
        inst->console_fd = fds[HANDLE_CONSOLE];
        inst->vmm_err_fd = fds[HANDLE_VMM_ERR];
        inst->initrd_fd = fds[HANDLE_INITRD];
        inst->pid = st->pid;
        inst->adopted = true;
        inst->accel = st->accel;
        r = adopt_check(inst, st, s->spec);
        /* Appended to, never truncated: what the earlier daemons wrote
         * stays, and counts against the bounds. */
        struct stat cl, vl;
        if (r == 0) {
                inst->console_log_fd = open(s->p_console, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
                inst->vmm_log_fd = fcntl(s->log_fd, F_DUPFD_CLOEXEC, 3);
                if (inst->console_log_fd < 0 || inst->vmm_log_fd < 0 || fstat(inst->console_log_fd, &cl) < 0 ||
                    fstat(inst->vmm_log_fd, &vl) < 0)
                        r = -errno;
        }
        if (r == 0) {
                inst->console_log_len = (uint64_t)cl.st_size;
                inst->vmm_log_len = (uint64_t)vl.st_size;
                inst->hostname = strdup(st->hostname);
                inst->key = key ? strdup(key) : NULL;
                if (!inst->hostname || (key && !inst->key))
                        r = -ENOMEM;
        }
        /* The earlier daemon may have died in the middle of a command:
         * whatever of its answer waits is dropped. Negotiated already
         * (handles saw to it); a state that says otherwise gets the
         * negotiation, which answers either way. */
        if (r == 0)
                r = microvm_qmp_resync(qmp, st->qmp_ready ? "query-status" : "qmp_capabilities",
                                       (int64_t)time_now_mono_ms() + QMP_ADOPT_TIMEOUT_MS);
        if (r < 0) {
                instance_release(inst); /* QEMU runs on: a failed take-over is the caller's to end */
                return r;
        }
        inst->qmp_ready = true;
        console_start(inst);
        *ret = inst;
        return 0;
}

void microvm_vm_release(DriverInstance *inst) {
        if (!inst)
                return;
        /* What the console thread read is written; the rest waits in the
         * socket and the pipe, which the supervisor holds open, for the
         * next daemon. */
        console_stop(inst);
        instance_release(inst);
}
