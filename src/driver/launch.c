#include "driver/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <linux/magic.h>
#include <linux/sched.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/timeutil.h"
#include "driver/rootfs.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define MAX_VCPU 256u
#define MAX_MEMORY_MIB (1024u * 1024u) /* 1 TiB */
#define MAX_PIDS 1000000u

int launch_spec_check(const DriverSpec *spec) {
        if (!spec || !spec->id || !spec->image_dir || !spec->sandbox_dir || !spec->agent_path)
                return -EINVAL;
        size_t n = strlen(spec->id);
        if (n == 0 || n > 64)
                return -EINVAL;
        for (const char *c = spec->id; *c; c++)
                if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-'))
                        return -EINVAL;
        if (spec->sandbox_dir[0] != '/' || spec->image_dir[0] != '/' || spec->agent_path[0] != '/')
                return -EINVAL;
        if (strlen(spec->sandbox_dir) > 1024 || strlen(spec->image_dir) > 1024 || strlen(spec->agent_path) > 1024)
                return -ENAMETOOLONG;
        if (spec->cgroup_parent && *spec->cgroup_parent && !cgroup_name_valid(spec->cgroup_parent, true))
                return -EINVAL;
        if (spec->vcpu > MAX_VCPU || spec->memory_mib > MAX_MEMORY_MIB || spec->pids_max > MAX_PIDS)
                return -EINVAL;
        if (spec->n_mounts > DRIVER_MAX_MOUNTS || (spec->n_mounts && !spec->mounts))
                return -EINVAL;
        for (size_t i = 0; i < spec->n_mounts; i++) {
                const DriverMount *m = &spec->mounts[i];
                if (!m->source || !m->dest || m->source[0] != '/' || m->dest[0] != '/' || !m->dest[1])
                        return -EINVAL;
        }
        return 0;
}

static pthread_once_t layout_once = PTHREAD_ONCE_INIT;
static CgroupLayout layout;
static int layout_error;

static void layout_detect(void) {
        layout_error = cgroup_layout_detect("/sys/fs/cgroup", &layout);
}

int launch_cgroup_layout(const CgroupLayout **ret) {
        pthread_once(&layout_once, layout_detect);
        if (layout_error < 0)
                return layout_error;
        *ret = &layout;
        return 0;
}

int launch_cgroup(const DriverSpec *spec, bool create, Cgroup **ret) {
        const CgroupLayout *l;
        int r = launch_cgroup_layout(&l);
        if (r < 0)
                return r;
        Cgroup *cg;
        r = cgroup_new(l, spec->cgroup_parent ? spec->cgroup_parent : "", spec->id, create, &cg);
        if (r < 0)
                return r;
        if (create) {
                CgroupLimits lim = {
                        .memory_bytes = (uint64_t)spec->memory_mib << 20,
                        .vcpu = spec->vcpu,
                        .pids_max = spec->pids_max ? spec->pids_max : LAUNCH_DEFAULT_PIDS_MAX,
                };
                r = cgroup_set_limits(cg, &lim);
                if (r < 0) {
                        (void)cgroup_remove(cg);
                        cgroup_free(cg);
                        return r;
                }
        }
        *ret = cg;
        return 0;
}

bool launch_pick_cpus(unsigned vcpu, cpu_set_t *ret) {
        static _Atomic unsigned next;
        cpu_set_t mine;
        if (vcpu == 0 || sched_getaffinity(0, sizeof mine, &mine) < 0)
                return false;
        int allowed[CPU_SETSIZE];
        unsigned n = 0;
        for (int i = 0; i < CPU_SETSIZE; i++)
                if (CPU_ISSET(i, &mine))
                        allowed[n++] = i;
        if (vcpu >= n)
                return false;
        unsigned first = atomic_fetch_add(&next, vcpu);
        CPU_ZERO(ret);
        for (unsigned k = 0; k < vcpu; k++)
                CPU_SET(allowed[(first + k) % n], ret);
        return true;
}

int launch_image_owner(const DriverSpec *spec, uid_t *ret) {
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/rootfs", spec->image_dir) >= (int)sizeof p)
                return -ENAMETOOLONG;
        struct stat st;
        if (stat(p, &st) < 0)
                return -errno;
        if (!S_ISDIR(st.st_mode))
                return -ENOTDIR;
        /* An image built by runtime-image-build is owned by the shifted
         * range. One owned by host root would make root inside host root:
         * never; map to the default range (the files then look like
         * nobody's from inside, but the sandbox stays unprivileged). */
        *ret = st.st_uid >= LAUNCH_UID_RANGE ? st.st_uid : LAUNCH_DEFAULT_UID_SHIFT;
        return 0;
}

int launch_fd_above_stdio(int *fd) {
        if (*fd < 0 || *fd > 2)
                return 0;
        int n = fcntl(*fd, F_DUPFD_CLOEXEC, 3);
        if (n < 0)
                return -errno;
        close(*fd);
        *fd = n;
        return 0;
}

/* In the child: reports errno on the status pipe and exits. */
static _Noreturn void child_fail(int status_fd, int code) {
        int e = errno ? errno : EIO;
        (void)!write(status_fd, &e, sizeof e);
        _exit(code);
}

/*
 * How a child enters the sandbox's cgroup. Writing to a v1 cgroup.procs, or
 * to any v2 one, migrates a whole thread group under the kernel's global
 * cgroup_threadgroup_rwsem, whose write side waits for an RCU grace period:
 * about 10 ms on these hosts, the largest single cost of a sandbox start. A
 * forked child is one thread, so on v1 it joins through the "tasks" file,
 * which moves only the calling thread and skips that lock; on v2 it is
 * created inside the cgroup (clone3 with CLONE_INTO_CGROUP) and never moves.
 * Anything that does not fit (an older kernel, a plain file in the unit
 * tests) keeps the cgroup.procs write, which is correct, only slower.
 */
typedef struct CgroupJoin {
        int fds[_CGROUP_HIER_MAX]; /* written "0" by the child; -1 unused */
        bool owned[_CGROUP_HIER_MAX];
        int v2_dir;    /* for CLONE_INTO_CGROUP, or -1 */
        int v2_procs;  /* its cgroup.procs, the fallback when clone3 cannot */
} CgroupJoin;

/* The path of a cgroup.procs fd, without the file name, into dir. */
static int procs_dir(int fd, char *dir, size_t len) {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, dir, len - 1);
        if (n <= 0 || (size_t)n >= len - 1)
                return -ENAMETOOLONG;
        dir[n] = '\0';
        char *slash = strrchr(dir, '/');
        if (!slash || strcmp(slash, "/cgroup.procs") != 0)
                return -EINVAL;
        *slash = '\0';
        return 0;
}

static void cgroup_join_done(CgroupJoin *j) {
        for (size_t i = 0; i < ELEMENTSOF(j->fds); i++)
                if (j->owned[i] && j->fds[i] >= 0)
                        close(j->fds[i]);
        if (j->v2_dir >= 0)
                close(j->v2_dir);
}

static void cgroup_join_prepare(const LaunchFds *fds, CgroupJoin *j) {
        *j = (CgroupJoin){.v2_dir = -1, .v2_procs = -1};
        for (size_t i = 0; i < ELEMENTSOF(j->fds); i++)
                j->fds[i] = -1;
        size_t k = 0;
        for (size_t i = 0; i < fds->n_cgroup_fds && k < ELEMENTSOF(j->fds); i++) {
                int fd = fds->cgroup_fds[i];
                if (fd < 0)
                        continue;
                struct statfs sf;
                char dir[PATH_MAX], p[PATH_MAX + 16];
                if (fstatfs(fd, &sf) == 0 && procs_dir(fd, dir, sizeof dir) == 0) {
                        if (sf.f_type == CGROUP2_SUPER_MAGIC && j->v2_dir < 0) {
                                j->v2_dir = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                                if (j->v2_dir >= 0 && launch_fd_above_stdio(&j->v2_dir) == 0) {
                                        j->v2_procs = fd;
                                        continue;
                                }
                                if (j->v2_dir >= 0)
                                        close(j->v2_dir);
                                j->v2_dir = -1;
                        } else if (sf.f_type == CGROUP_SUPER_MAGIC) {
                                snprintf(p, sizeof p, "%s/tasks", dir);
                                int t = open(p, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
                                if (t >= 0 && launch_fd_above_stdio(&t) == 0) {
                                        j->owned[k] = true;
                                        j->fds[k++] = t;
                                        continue;
                                }
                                if (t >= 0)
                                        close(t);
                        }
                }
                j->fds[k++] = fd;
        }
}

/* fork(), or clone3() straight into the v2 cgroup. In the child, v2 is then
 * joined already, or j->v2_procs is left to write. */
static pid_t spawn_fork(CgroupJoin *j) {
        if (j->v2_dir >= 0) {
                struct clone_args ca = {
                        .flags = CLONE_INTO_CGROUP,
                        .exit_signal = SIGCHLD,
                        .cgroup = (uint64_t)j->v2_dir,
                };
                long pid = syscall(SYS_clone3, &ca, sizeof ca);
                if (pid >= 0) {
                        if (pid == 0)
                                j->v2_procs = -1;
                        return (pid_t)pid;
                }
                /* An older kernel, or a cgroup that refuses: the slow way. */
        }
        return fork();
}

int launch_spawn(char *const argv[], char *const envp[], const LaunchFds *fds, pid_t *ret_pid) {
        /* O_CLOEXEC status pipe: EOF means the exec happened, an int means
         * the child failed before it, with that errno. */
        int sp[2];
        if (pipe2(sp, O_CLOEXEC) < 0)
                return -errno;
        int r = launch_fd_above_stdio(&sp[0]);
        if (r >= 0)
                r = launch_fd_above_stdio(&sp[1]);
        if (r < 0) {
                close(sp[0]);
                close(sp[1]);
                return r;
        }
        CgroupJoin join;
        cgroup_join_prepare(fds, &join);
        sigset_t all, old;
        sigfillset(&all);
        /* No signal handler of the daemon may run in the child. */
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pid_t pid = spawn_fork(&join);
        if (pid < 0) {
                r = -errno;
                pthread_sigmask(SIG_SETMASK, &old, NULL);
                cgroup_join_done(&join);
                close(sp[0]);
                close(sp[1]);
                return r;
        }
        if (pid == 0) {
                /* Child: async-signal-safe calls only. */
                errno = 0;
                if (cgroup_join_fds(join.fds, ELEMENTSOF(join.fds)) < 0 ||
                    (join.v2_procs >= 0 && cgroup_join_fds(&join.v2_procs, 1) < 0))
                        child_fail(sp[1], 126);
                (void)setsid();
                if (fds->pre_exec && fds->pre_exec(fds->userdata) != 0)
                        child_fail(sp[1], 125);
                /* Raw syscalls: glibc's set*id wrappers synchronise threads,
                 * which a forked child of a threaded process must not. */
                if (fds->set_ids && (syscall(SYS_setgroups, fds->n_groups, fds->groups) < 0 ||
                                     syscall(SYS_setresgid, fds->gid, fds->gid, fds->gid) < 0 ||
                                     syscall(SYS_setresuid, fds->uid, fds->uid, fds->uid) < 0))
                        child_fail(sp[1], 126);
                struct sigaction dfl = {.sa_handler = SIG_DFL};
                for (int s = 1; s < NSIG; s++)
                        (void)sigaction(s, &dfl, NULL);
                if (dup2(fds->stdin_fd, 0) < 0 || dup2(fds->stdout_fd, 1) < 0 ||
                    (fds->stderr_fd >= 0 && dup2(fds->stderr_fd, 2) < 0))
                        child_fail(sp[1], 126);
                /* Whatever else the daemon has open stays behind, O_CLOEXEC
                 * or not. */
                if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
                        for (int fd = 3; fd < 4096; fd++)
                                (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
                }
                for (size_t i = 0; i < fds->n_keep; i++)
                        if (fcntl(fds->keep[i], F_SETFD, 0) < 0)
                                child_fail(sp[1], 126);
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                if (fds->seccomp && (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
                                     prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fds->seccomp, 0, 0) < 0))
                        child_fail(sp[1], 126);
                execve(argv[0], argv, envp);
                child_fail(sp[1], 127);
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        cgroup_join_done(&join);
        close(sp[1]);
        int e = 0;
        ssize_t n;
        while ((n = read(sp[0], &e, sizeof e)) < 0 && errno == EINTR)
                ;
        close(sp[0]);
        if (n == (ssize_t)sizeof e) {
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                        ;
                return e > 0 ? -e : -EIO;
        }
        *ret_pid = pid;
        return 0;
}

const char *const launch_stage_mounts_at[DRIVER_MAX_MOUNTS] = {
        LAUNCH_STAGE_DIR "/vol0", LAUNCH_STAGE_DIR "/vol1", LAUNCH_STAGE_DIR "/vol2", LAUNCH_STAGE_DIR "/vol3",
};

LaunchStage launch_plan_stage(const LaunchPlan *p) {
        return (LaunchStage){ .layer = p->layer, .agent_src = p->spec->agent_path, .mounts = p->spec->mounts,
                              .n_mounts = p->spec->n_mounts, .mount_owner = p->shift + LAUNCH_SANDBOX_UID,
                              .live_dir = p->live_dir };
}

/* Each mount's source bound at its stage path, its root given to the
 * sandbox's user, then made read-only where asked. The bind is not
 * recursive: only the volume itself, never what is mounted under it on the
 * host. nosuid and nodev: a volume carries data, not privilege. */
static int stage_volumes(const LaunchStage *st) {
        for (size_t i = 0; i < st->n_mounts && i < DRIVER_MAX_MOUNTS; i++) {
                const char *at = launch_stage_mounts_at[i];
                if (mkdir(at, 0755) < 0)
                        return -1;
                if (mount(st->mounts[i].source, at, NULL, MS_BIND, NULL) < 0)
                        return -1;
                if (chown(at, st->mount_owner, st->mount_owner) < 0)
                        return -1;
                unsigned long flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV;
                if (st->mounts[i].read_only)
                        flags |= MS_RDONLY;
                if (mount(NULL, at, NULL, flags, NULL) < 0)
                        return -1;
        }
        return 0;
}

int launch_stage_mounts(void *userdata) {
        const LaunchStage *st = userdata;
        if (rootfs_mount_child(st->layer) < 0)
                return -1;
        if (mount("runtime-stage", LAUNCH_STAGE_DIR, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755") < 0)
                return -1;
        if (mkdir(LAUNCH_STAGE_ROOT, 0755) < 0)
                return -1;
        int fd = open(LAUNCH_STAGE_AGENT, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
        if (fd < 0)
                return -1;
        close(fd);
        if (mount(st->layer->root, LAUNCH_STAGE_ROOT, NULL, MS_BIND, NULL) < 0)
                return -1;
        if (mount(st->agent_src, LAUNCH_STAGE_AGENT, NULL, MS_BIND, NULL) < 0)
                return -1;
        if (st->live_dir && (mkdir(LAUNCH_STAGE_LIVE, 0755) < 0 ||
                             mount(LAUNCH_STAGE_LIVE, LAUNCH_STAGE_LIVE, NULL, MS_BIND, NULL) < 0 ||
                             mount(NULL, LAUNCH_STAGE_LIVE, NULL, MS_SHARED, NULL) < 0))
                return -1;
        return stage_volumes(st);
}

int launch_wait(pid_t pid, int timeout_ms, int *ret_status) {
        int64_t deadline = (int64_t)time_now_mono_ms() + timeout_ms;
        for (;;) {
                int st;
                pid_t r = waitpid(pid, &st, WNOHANG);
                if (r == pid) {
                        if (ret_status)
                                *ret_status = st;
                        return 0;
                }
                if (r < 0 && errno != EINTR)
                        return -errno;
                if ((int64_t)time_now_mono_ms() >= deadline)
                        return -ETIMEDOUT;
                struct timespec ts = {0, 2000000};
                nanosleep(&ts, NULL);
        }
}

int launch_wait_or_kill(pid_t pid, int timeout_ms, int *ret_status) {
        int r = launch_wait(pid, timeout_ms, ret_status);
        if (r != -ETIMEDOUT)
                return r;
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
        return -ETIMEDOUT;
}

DriverInstance *launch_instance_new(const Driver *d, const DriverSpec *spec) {
        DriverInstance *inst = calloc(1, sizeof *inst);
        if (!inst)
                return NULL;
        inst->driver = d;
        inst->pid = -1;
        inst->pidfd = -1;
        inst->id = strdup(spec->id);
        inst->sandbox_dir = strdup(spec->sandbox_dir);
        if (!inst->id || !inst->sandbox_dir) {
                launch_instance_free(inst);
                return NULL;
        }
        return inst;
}

void launch_instance_free(DriverInstance *inst) {
        if (!inst)
                return;
        if (inst->pidfd >= 0)
                close(inst->pidfd);
        cgroup_free(inst->cg);
        free(inst->id);
        free(inst->sandbox_dir);
        free(inst->runsc_root);
        free(inst);
}

/* A pidfd's process has ended (a zombie counts). */
static bool pidfd_ended(int pidfd, int timeout_ms) {
        struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
        int r;
        while ((r = poll(&pfd, 1, timeout_ms)) < 0 && errno == EINTR)
                ;
        return r != 0;
}

bool launch_instance_exited(DriverInstance *inst) {
        if (inst->reaped)
                return true;
        if (inst->pid <= 0)
                return true;
        if (inst->adopted) {
                /* Not our child: whoever adopted it reaps it; its status is
                 * not ours to know. */
                if (inst->pidfd < 0 || pidfd_ended(inst->pidfd, 0)) {
                        inst->reaped = true;
                        inst->status = 0;
                        return true;
                }
                return false;
        }
        int st;
        pid_t r = waitpid(inst->pid, &st, WNOHANG);
        if (r == inst->pid) {
                inst->reaped = true;
                inst->status = st;
                return true;
        }
        return false;
}

const char *launch_stop_reason(DriverInstance *inst, bool exited_before) {
        if (!exited_before)
                return NULL;
        CgroupStats cs;
        if (inst->cg && cgroup_read_stats(inst->cg, &cs) >= 0 && cs.oom_kills > 0)
                return "oom";
        if (inst->reaped && WIFSIGNALED(inst->status))
                return "killed";
        return "exited";
}

void launch_release(DriverInstance *inst) {
        (void)rootfs_wait_released(inst->sandbox_dir, 2000);
        if (inst->cg)
                (void)cgroup_remove(inst->cg);
        launch_instance_free(inst);
}

void launch_kill_and_reap(DriverInstance *inst) {
        /* Killing the cgroup ends the sandbox's mount namespace, and with it
         * the layer, the overlay and the loop device. */
        if (inst->cg)
                (void)cgroup_kill_all(inst->cg, 10000);
        if (inst->pid > 0 && !inst->reaped && inst->adopted) {
                if (inst->pidfd >= 0 && !pidfd_ended(inst->pidfd, 2000)) {
                        (void)syscall(SYS_pidfd_send_signal, inst->pidfd, SIGKILL, NULL, 0);
                        (void)pidfd_ended(inst->pidfd, 2000);
                }
                inst->reaped = true;
        }
        if (inst->pid > 0 && !inst->reaped) {
                /* Normally dead already: it was in the cgroup. The pidfd
                 * says when without polling waitpid. */
                if (inst->pidfd >= 0) {
                        struct pollfd pfd = {.fd = inst->pidfd, .events = POLLIN};
                        while (poll(&pfd, 1, 2000) < 0 && errno == EINTR)
                                ;
                }
                if (launch_wait(inst->pid, 2000, &inst->status) < 0) {
                        kill(inst->pid, SIGKILL);
                        while (waitpid(inst->pid, &inst->status, 0) < 0 && errno == EINTR)
                                ;
                }
                inst->reaped = true;
        }
}

bool launch_alive(DriverInstance *inst) {
        if (!inst || inst->reaped)
                return false;
        if (inst->pidfd < 0)
                return inst->pid > 0 && kill(inst->pid, 0) == 0;
        struct pollfd pfd = {.fd = inst->pidfd, .events = POLLIN};
        return poll(&pfd, 1, 0) == 0;
}

/* A freeze waits for every task to reach a point where it can stop: one in
 * an uninterruptible sleep (disk I/O, reclaim) finishes it first, and on a
 * loaded host each must be scheduled at all (a 5 s bound was once missed
 * under a load average of 30 on 2 cores). Longer and the pause is refused. */
#define LAUNCH_FREEZE_TIMEOUT_MS 15000

int launch_pause(DriverInstance *inst) {
        if (!inst || !inst->cg)
                return -EINVAL;
        return cgroup_freeze(inst->cg, true, LAUNCH_FREEZE_TIMEOUT_MS);
}

int launch_resume(DriverInstance *inst) {
        if (!inst || !inst->cg)
                return -EINVAL;
        return cgroup_freeze(inst->cg, false, 0);
}

int launch_stats(DriverInstance *inst, DriverStats *ret) {
        if (!inst || !inst->cg)
                return -EINVAL;
        CgroupStats cs;
        int r = cgroup_read_stats(inst->cg, &cs);
        if (r < 0)
                return r;
        DriverStats s = {
                .cpu_usage_ns = cs.cpu_usage_ns,
                .memory_bytes = cs.memory_bytes,
                .memory_peak_bytes = cs.memory_peak_bytes,
                .pids_current = cs.pids_current,
                .oom_killed = cs.oom_kills > 0,
        };
        uint64_t used;
        if (inst->pid > 0 && !inst->reaped && rootfs_disk_used(inst->pid, inst->sandbox_dir, &used) >= 0)
                s.disk_used_bytes = used;
        *ret = s;
        return 0;
}

int launch_handles(DriverInstance *inst, int *fds, size_t *n, char *state, size_t state_len) {
        if (!inst || *n < 1 || inst->pidfd < 0 || inst->pid <= 0 || inst->reaped)
                return -EOPNOTSUPP;
        int fd = fcntl(inst->pidfd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return -errno;
        int w = snprintf(state, state_len, "pid=%d,tmpfs=%d", (int)inst->pid, inst->tmpfs_layer ? 1 : 0);
        if (w < 0 || (size_t)w >= state_len) {
                close(fd);
                return -ENAMETOOLONG;
        }
        fds[0] = fd;
        *n = 1;
        return 0;
}

int launch_pidfd_pid(int pidfd, pid_t *ret) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
        FILE *f = fopen(path, "re");
        if (!f)
                return -errno;
        char line[128];
        int r = -EBADF;
        while (fgets(line, sizeof line, f))
                if (strncmp(line, "Pid:", 4) == 0) {
                        *ret = (pid_t)strtol(line + 4, NULL, 10);
                        r = 0;
                        break;
                }
        fclose(f);
        return r;
}

int launch_adopt(const Driver *d, const DriverSpec *spec, const char *state, int *fds, size_t n,
                 DriverInstance **ret) {
        int pidfd = n >= 1 ? fds[0] : -1;
        for (size_t i = 1; i < n; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        int pid = 0, tmpfs = 0, used = 0;
        int r = launch_spec_check(spec);
        if (r == 0 && (pidfd < 0 || !state || sscanf(state, "pid=%d,tmpfs=%d%n", &pid, &tmpfs, &used) != 2 ||
                       state[used] != '\0' || pid <= 1 || (tmpfs != 0 && tmpfs != 1)))
                r = -EBADMSG;
        pid_t now = 0;
        if (r == 0 && (launch_pidfd_pid(pidfd, &now) < 0 || now != pid || pidfd_ended(pidfd, 0)))
                r = -ESRCH;
        DriverInstance *inst = r == 0 ? launch_instance_new(d, spec) : NULL;
        if (r == 0 && !inst)
                r = -ENOMEM;
        if (r == 0) {
                inst->pid = pid;
                inst->pidfd = TAKE_FD(pidfd);
                inst->adopted = true;
                inst->tmpfs_layer = tmpfs == 1;
                if (launch_cgroup(spec, false, &inst->cg) < 0)
                        r = -ESRCH;
        }
        if (pidfd >= 0)
                close(pidfd);
        if (r < 0) {
                launch_instance_free(inst);
                return r;
        }
        *ret = inst;
        return 0;
}

void launch_let_go(DriverInstance *inst) {
        launch_instance_free(inst);
}

int launch_reap_orphan(const DriverSpec *spec) {
        int r = launch_spec_check(spec);
        if (r < 0)
                return r;
        Cgroup *cg = NULL;
        int ret = 0;
        r = launch_cgroup(spec, false, &cg);
        if (r >= 0) {
                if (cgroup_kill_all(cg, 10000) < 0)
                        ret = -EBUSY;
                r = cgroup_remove(cg);
                if (r < 0 && ret == 0)
                        ret = r;
                cgroup_free(cg);
        } else if (r != -ENOENT)
                ret = r;
        r = rootfs_unmount(spec->sandbox_dir);
        if (r < 0 && ret == 0)
                ret = r;
        r = rootfs_wait_released(spec->sandbox_dir, 2000);
        if (r < 0 && ret == 0)
                ret = r;
        return ret;
}

int launch_snapshot_disk(DriverInstance *inst, const DriverSpec *spec, const char *dest_dir) {
        int r = launch_spec_check(spec);
        if (r < 0)
                return r;
        pid_t pid = 0;
        if (inst) {
                if (inst->tmpfs_layer)
                        return -EOPNOTSUPP;
                if (inst->pid <= 0 || inst->reaped)
                        return -ESRCH;
                pid = inst->pid;
        }
        return rootfs_snapshot(spec->sandbox_dir, pid, dest_dir);
}

int launch_restore_disk(const DriverSpec *spec, const char *snap_dir) {
        int r = launch_spec_check(spec);
        if (r < 0)
                return r;
        return rootfs_restore(snap_dir, spec->sandbox_dir);
}

int launch_plan_new(LaunchPlan *p, const Driver *d, const DriverSpec *spec, const char *tool, const char *missing,
                    DriverError *err) {
        *p = (LaunchPlan){ .spec = spec, .channel = { -1, -1 } };
        for (size_t i = 0; i < ELEMENTSOF(p->cg_fds); i++)
                p->cg_fds[i] = -1;
        int r = launch_spec_check(spec);
        if (r < 0)
                return r;
        if (!tool) {
                driver_error(err, "%s", missing);
                return -ENOENT;
        }
        if (access(spec->agent_path, X_OK) < 0)
                return -errno;
        r = launch_image_owner(spec, &p->shift);
        if (r < 0)
                return r;
        if (snprintf(p->rootfs, sizeof p->rootfs, "%s/rootfs", spec->image_dir) >= (int)sizeof p->rootfs)
                return -ENAMETOOLONG;
        p->inst = launch_instance_new(d, spec);
        return p->inst ? 0 : -ENOMEM;
}

int launch_plan_cgroup(LaunchPlan *p) {
        return launch_cgroup(p->spec, true, &p->inst->cg);
}

int launch_plan_layer(LaunchPlan *p) {
        RootfsLayer *layer = malloc(sizeof *layer);
        if (!layer)
                return -ENOMEM;
        int r = rootfs_prepare(p->rootfs, p->spec->sandbox_dir, p->spec->disk_mib, p->shift, layer);
        if (r < 0) {
                free(layer);
                return r;
        }
        p->layer = layer;
        p->inst->tmpfs_layer = layer->tmpfs;
        p->layer_created = layer->created && !layer->tmpfs;
        return 0;
}

int launch_plan_channel(LaunchPlan *p) {
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p->channel) < 0)
                return -errno;
        int r;
        for (size_t i = 0; i < ELEMENTSOF(p->channel); i++)
                if ((r = launch_fd_above_stdio(&p->channel[i])) < 0)
                        return r;
        return cgroup_open_procs(p->inst->cg, p->cg_fds, ELEMENTSOF(p->cg_fds));
}

static void plan_drop_layer(LaunchPlan *p) {
        if (p->layer) {
                rootfs_layer_done(p->layer);
                free(p->layer);
                p->layer = NULL;
        }
}

int launch_plan_spawn(LaunchPlan *p, char *const argv[], LaunchFds *lf) {
        static char *const envp[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
        LaunchStage stage = launch_plan_stage(p);
        lf->stdin_fd = lf->stdout_fd = p->channel[1];
        lf->stderr_fd = -1;
        lf->cgroup_fds = p->cg_fds;
        lf->n_cgroup_fds = ELEMENTSOF(p->cg_fds);
        if (!lf->pre_exec) {
                lf->pre_exec = launch_stage_mounts;
                lf->userdata = &stage;
        }
        int r = launch_spawn(argv, envp, lf, &p->inst->pid);
        if (r < 0)
                return r;
        /* The child holds the loop device until its mount is made. */
        plan_drop_layer(p);
        p->inst->pidfd = (int)syscall(SYS_pidfd_open, p->inst->pid, 0);
        /* Only the child holds its end now. */
        close(p->channel[1]);
        p->channel[1] = -1;
        cgroup_close_fds(p->cg_fds, ELEMENTSOF(p->cg_fds));
        return 0;
}

void launch_plan_done(LaunchPlan *p, int *ret_fd, DriverInstance **ret) {
        /* The next fresh sandbox of this size takes a ready copy of the layer. */
        if (p->layer_created)
                rootfs_replenish_async(p->spec->sandbox_dir, p->spec->disk_mib, p->shift);
        *ret_fd = TAKE_FD(p->channel[0]);
        *ret = TAKE_PTR(p->inst);
}

void launch_plan_abort(LaunchPlan *p) {
        for (size_t i = 0; i < ELEMENTSOF(p->channel); i++)
                if (p->channel[i] >= 0) {
                        close(p->channel[i]);
                        p->channel[i] = -1;
                }
        cgroup_close_fds(p->cg_fds, ELEMENTSOF(p->cg_fds));
        if (p->inst)
                launch_kill_and_reap(p->inst);
        if (p->after_kill)
                p->after_kill(p, p->userdata);
        plan_drop_layer(p);
        if (p->inst)
                launch_release(TAKE_PTR(p->inst));
}

int launch_in_mount_ns(pid_t pid, int (*fn)(void *arg), void *arg) {
        char ns[64];
        snprintf(ns, sizeof ns, "/proc/%ld/ns/mnt", (long)pid);
        _cleanup_close_ int nsfd = open(ns, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0)
                return -ESRCH;
        pid_t child = fork();
        if (child < 0)
                return -errno;
        if (child == 0) {
                if (setns(nsfd, CLONE_NEWNS) < 0 || chdir("/") < 0)
                        _exit(errno ? errno : EIO);
                int e = fn(arg);
                _exit(e > 0 && e < 256 ? e : e == 0 ? 0 : EIO);
        }
        int status = 0;
        while (waitpid(child, &status, 0) < 0 && errno == EINTR)
                ;
        if (!WIFEXITED(status))
                return -EIO;
        return -WEXITSTATUS(status);
}
