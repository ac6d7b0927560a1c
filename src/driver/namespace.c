/*
 * driver_namespace: bubblewrap in fresh user, pid, net, ipc, uts, mount and
 * cgroup namespaces, over the overlay root of rootfs.c, inside a cgroup of
 * cgroup.c, with the seccomp policy of seccomp.c. Root inside is uid 0 of a
 * user namespace whose map the daemon writes itself ("0 <shift> 65536"), so
 * it is an unprivileged uid on the host.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <linux/openat2.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/timeutil.h"
#include "driver/cgroup.h"
#include "driver/driver.h"
#include "driver/launch.h"
#include "driver/rootfs.h"
#include "driver/seccomp.h"

/* bwrap must hand over its child's pid within this time. */
#define SETUP_TIMEOUT_MS 5000

/*
 * The sandbox's cgroup has two leaves. "agent" holds bwrap and the agent,
 * with a CPU weight ten times the default, so a fork bomb or spinners in the
 * sandbox cannot starve the agent's answers to execs and heartbeats.
 * "work" holds every process the agent starts (each writes "0" to the fds
 * the agent gets with --cgroup-fds between its fork and its exec); its pids
 * and memory limits are the sandbox's less a reserve for the agent, so a
 * bomb fills work and the agent can still fork the next command, and an
 * OOM kill happens in work. The sandbox's own cgroup keeps the spec's
 * limits over both, and is the one stats, pause and the view inside read.
 */
#define NS_LEAF_AGENT "agent"
#define NS_LEAF_WORK "work"
#define NS_AGENT_CPU_SHARES 10240u /* v1; the default is 1024 */
#define NS_AGENT_CPU_WEIGHT 1000u  /* v2; the default is 100 */

/* What the work leaf leaves to the agent's: a sixteenth of the sandbox's
 * pids and memory, within bounds (the agent, bwrap, the sudo gateway and
 * its connections, and a child between its fork and its move to work). */
static uint64_t ns_pids_reserve(uint64_t pids) {
        uint64_t r = pids / 16;
        return r < 8 ? 8 : r > 64 ? 64 : r;
}

static uint64_t ns_memory_reserve(uint64_t bytes) {
        uint64_t r = bytes / 16;
        return r < (16u << 20) ? (16u << 20) : r > (64u << 20) ? (64u << 20) : r;
}

/* Moves bwrap and its child (the agent-to-be, still waiting for its uid
 * map) into the agent leaf, then gives the leaves their limits. The move
 * comes after bwrap made the cgroup namespace, whose root is then the
 * sandbox's cgroup: the agent sees itself at /agent and its commands at
 * /work, under the read-only view of the sandbox's cgroup. On v2 the
 * sandbox's cgroup may hand controllers to its children only once empty. */
static int ns_leaves_enter(Cgroup *cg, Cgroup *agent, Cgroup *work, const DriverSpec *spec, pid_t bwrap,
                           pid_t child) {
        int r = cgroup_add_pid(agent, bwrap);
        if (r >= 0)
                r = cgroup_add_pid(agent, child);
        if (r >= 0)
                r = cgroup_enable_children(cg);
        if (r < 0)
                return r;
        uint64_t pids = spec->pids_max ? spec->pids_max : LAUNCH_DEFAULT_PIDS_MAX;
        uint64_t mem = (uint64_t)spec->memory_mib << 20;
        CgroupLimits lim = {
                .memory_bytes = mem && mem > 2 * ns_memory_reserve(mem) ? mem - ns_memory_reserve(mem) : mem,
                .vcpu = spec->vcpu,
                .pids_max = pids > 2 * ns_pids_reserve(pids) ? pids - ns_pids_reserve(pids) : pids,
        };
        /* lxcfs computes a sandbox's /proc view from the cgroup of PID 1 of
         * the reader's pid namespace, the agent: its leaf has the sandbox's
         * CPU quota too, and no memory or pids limit of its own (lxcfs
         * takes the lowest memory limit above it, the sandbox's). */
        CgroupLimits agent_lim = {.vcpu = spec->vcpu};
        r = cgroup_set_limits(work, &lim);
        if (r >= 0)
                r = cgroup_set_limits(agent, &agent_lim);
        if (r >= 0)
                r = cgroup_set_cpu_weight(agent, NS_AGENT_CPU_SHARES, NS_AGENT_CPU_WEIGHT);
        return r;
}

/* Kills (kill) or removes the leaves of the sandbox's cgroup: a kill of the
 * sandbox's own cgroup finds none of their processes in its cgroup.procs,
 * and it cannot be removed while they exist. The agent first: a command
 * killed before it would be reported as ended by a signal instead of lost
 * with its sandbox (and the agent's death, as the pid namespace's init,
 * already takes every process of the sandbox). */
static int ns_leaves_end(Cgroup *cg, bool kill) {
        static const char *const leaves[] = {NS_LEAF_AGENT, NS_LEAF_WORK};
        int ret = 0;
        /* A paused sandbox: every process gets its SIGKILL while still
         * frozen, so none runs on between the thaw and its kill; the thaw
         * of the sandbox's own cgroup (the leaves' freezer follows it) lets
         * them die. */
        for (size_t i = 0; cg && kill && i < ELEMENTSOF(leaves); i++) {
                Cgroup *leaf;
                if (cgroup_new_child(cg, leaves[i], false, &leaf) >= 0) {
                        cgroup_kill_once(leaf);
                        cgroup_free(leaf);
                }
        }
        if (cg && kill)
                (void)cgroup_freeze(cg, false, 0);
        for (size_t i = 0; cg && i < ELEMENTSOF(leaves); i++) {
                Cgroup *leaf;
                int r = cgroup_new_child(cg, leaves[i], false, &leaf);
                if (r >= 0) {
                        r = kill ? cgroup_kill_all(leaf, 10000) : cgroup_remove(leaf);
                        cgroup_free(leaf);
                }
                if (r < 0 && ret == 0)
                        ret = r;
        }
        return ret;
}

/* The OOM kills of the leaves: a v1 memory cgroup counts a kill in the
 * victim's own cgroup only. */
static uint64_t ns_leaves_oom_kills(Cgroup *cg) {
        static const char *const leaves[] = {NS_LEAF_WORK, NS_LEAF_AGENT};
        uint64_t n = 0;
        for (size_t i = 0; cg && i < ELEMENTSOF(leaves); i++) {
                Cgroup *leaf;
                CgroupStats cs;
                if (cgroup_new_child(cg, leaves[i], false, &leaf) < 0)
                        continue;
                if (cgroup_read_stats(leaf, &cs) >= 0)
                        n += cs.oom_kills;
                cgroup_free(leaf);
        }
        return n;
}

static const char *find_bwrap(void) {
        static const char *const cands[] = {"/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"};
        for (size_t i = 0; i < ELEMENTSOF(cands); i++)
                if (access(cands[i], X_OK) == 0)
                        return cands[i];
        return NULL;
}

/*
 * lxcfs: a FUSE view of /proc/meminfo, /proc/cpuinfo and /proc/stat per
 * reading process's cgroup (the sandbox's memory limit and, with
 * --enable-cfs, its CPU quota), bound over those files in every sandbox so
 * that free, os.cpu_count() and programs that size themselves see the
 * sandbox, not the host. One lxcfs per host at LXCFS_DIR, shared by every
 * daemon: started here when none answers there. Without lxcfs installed,
 * sandboxes see the host's figures, as before.
 */
#define LXCFS_DIR "/var/lib/runtime-lxcfs"
#define LXCFS_BIN "/usr/bin/lxcfs"
#define LXCFS_START_TIMEOUT_MS 5000
#define FUSE_MAGIC 0x65735546

static const char *const lxcfs_files[] = {"/proc/meminfo", "/proc/cpuinfo", "/proc/stat"};
static const char *const lxcfs_sources[] = {LXCFS_DIR "/proc/meminfo", LXCFS_DIR "/proc/cpuinfo",
                                            LXCFS_DIR "/proc/stat"};

static bool lxcfs_answers(void) {
        struct statfs fs;
        if (statfs(LXCFS_DIR, &fs) < 0 || fs.f_type != FUSE_MAGIC)
                return false;
        for (size_t i = 0; i < ELEMENTSOF(lxcfs_files); i++) {
                int fd = open(lxcfs_sources[i], O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                        return false;
                char c;
                ssize_t n = read(fd, &c, 1);
                close(fd);
                if (n != 1)
                        return false;
        }
        return true;
}

/* Where lxcfs writes its complaints: the reason a start failed is read back
 * from here for `runtime doctor`. */
#define LXCFS_LOG "/run/runtime-lxcfs.log"
#define LXCFS_RETRY_AFTER_S 60

/* The child between the daemon and lxcfs: starts lxcfs and exits 0 once it
 * answers, 1 if it died first, 2 if it is still silent at the timeout. Its
 * exit reparents lxcfs to init. Forked from a threaded daemon, so only
 * system calls from here on. */
static _Noreturn void lxcfs_starter(void) {
        setsid();
        int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        int log_fd = open(LXCFS_LOG, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (null_fd >= 0) {
                dup2(null_fd, 0);
                dup2(null_fd, 1);
                dup2(log_fd >= 0 ? log_fd : null_fd, 2);
        }
        syscall(SYS_close_range, 3U, ~0U, 0U);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        pid_t pid = fork();
        if (pid < 0)
                _exit(1);
        if (pid == 0) {
                /* A host service every sandbox's /proc depends on: the OOM
                 * killer takes sandbox processes first. */
                int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
                if (fd >= 0) {
                        (void)!write(fd, "-1000", 5);
                        close(fd);
                }
                char *const argv[] = {LXCFS_BIN, "--foreground", "--enable-cfs", "--pidfile",
                                      "/run/runtime-lxcfs.pid", LXCFS_DIR, NULL};
                char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
                execve(argv[0], argv, envp);
                _exit(127);
        }
        for (int waited = 0; waited < LXCFS_START_TIMEOUT_MS; waited += 20) {
                if (waitpid(pid, NULL, WNOHANG) == pid)
                        _exit(1);
                if (lxcfs_answers())
                        _exit(0);
                struct timespec ts = {0, 20 * 1000 * 1000};
                nanosleep(&ts, NULL);
        }
        _exit(2);
}

/* The last line lxcfs wrote, for the reason a start failed. */
static void lxcfs_last_words(char *buf, size_t len) {
        buf[0] = '\0';
        _cleanup_close_ int fd = open(LXCFS_LOG, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return;
        char tail[512];
        off_t size = lseek(fd, 0, SEEK_END);
        off_t from = size > (off_t)sizeof tail - 1 ? size - (off_t)sizeof tail + 1 : 0;
        ssize_t n = pread(fd, tail, sizeof tail - 1, from);
        if (n <= 0)
                return;
        tail[n] = '\0';
        while (n > 0 && (tail[n - 1] == '\n' || tail[n - 1] == ' '))
                tail[--n] = '\0';
        const char *line = strrchr(tail, '\n');
        line = line ? line + 1 : tail;
        size_t m = strnlen(line, len - 1); /* the end of a long line is lost */
        memcpy(buf, line, m);
        buf[m] = '\0';
}

/* Starts lxcfs detached, after detaching whatever is mounted at LXCFS_DIR:
 * a dead lxcfs leaves a FUSE mount that answers ENOTCONN and on which a new
 * one cannot mount. Fails fast when lxcfs dies at start; `why` says why. */
static int lxcfs_start(char *why, size_t why_len) {
        (void)umount2(LXCFS_DIR, MNT_DETACH);
        if (mkdir(LXCFS_DIR, 0755) < 0 && errno != EEXIST) {
                int r = -errno;
                snprintf(why, why_len, "cannot make %s: %s", LXCFS_DIR, strerror(-r));
                return r;
        }
        pid_t pid = fork();
        if (pid < 0) {
                int r = -errno;
                snprintf(why, why_len, "fork: %s", strerror(-r));
                return r;
        }
        if (pid == 0)
                lxcfs_starter();
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                return 0;
        char words[256];
        lxcfs_last_words(words, sizeof words);
        bool timed_out = WIFEXITED(status) && WEXITSTATUS(status) == 2;
        snprintf(why, why_len, "%s%s%s", timed_out ? "lxcfs did not answer in time" : "lxcfs exited at start",
                 words[0] ? ": " : "", words);
        return timed_out ? -ETIMEDOUT : -EIO;
}

/* Whether sandboxes get lxcfs's view: checked at every start, so a lxcfs that
 * died is replaced by the next sandbox (sandboxes started before keep the
 * dead one's files: docs/drivers.md). After a failed start, sandboxes start
 * without the view and no start is tried for LXCFS_RETRY_AFTER_S: a host where
 * lxcfs cannot run must not make every create wait on it. */
static pthread_mutex_t lxcfs_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t lxcfs_failed_at_ms; /* 0: no failure to wait out */
static char lxcfs_failure[320];

static bool lxcfs_ready(void) {
        if (lxcfs_answers())
                return true;
        if (access(LXCFS_BIN, X_OK) < 0)
                return false;
        pthread_mutex_lock(&lxcfs_lock);
        bool ok = lxcfs_answers();
        bool may_try = lxcfs_failed_at_ms == 0 ||
                       time_now_mono_ms() - lxcfs_failed_at_ms >= LXCFS_RETRY_AFTER_S * 1000u;
        if (!ok && may_try) {
                char why[sizeof lxcfs_failure];
                ok = lxcfs_start(why, sizeof why) == 0;
                if (ok) {
                        lxcfs_failed_at_ms = 0;
                        lxcfs_failure[0] = '\0';
                } else {
                        lxcfs_failed_at_ms = time_now_mono_ms();
                        if (lxcfs_failed_at_ms == 0)
                                lxcfs_failed_at_ms = 1;
                        snprintf(lxcfs_failure, sizeof lxcfs_failure, "%s", why);
                }
        }
        pthread_mutex_unlock(&lxcfs_lock);
        return ok;
}

/* What `runtime doctor` says of lxcfs. Starts it if it is not up, so the
 * first sandbox does not wait. */
static void lxcfs_describe(char *buf, size_t len) {
        if (access(LXCFS_BIN, X_OK) < 0) {
                snprintf(buf, len, "no lxcfs (sandboxes see the host's memory and CPUs)");
                return;
        }
        if (lxcfs_ready()) {
                snprintf(buf, len, "lxcfs at " LXCFS_DIR);
                return;
        }
        pthread_mutex_lock(&lxcfs_lock);
        snprintf(buf, len, "lxcfs not running (%s; sandboxes see the host's memory and CPUs)",
                 lxcfs_failure[0] ? lxcfs_failure : "not tried yet");
        pthread_mutex_unlock(&lxcfs_lock);
}

static int ns_probe(char *why, size_t why_len) {
        const char *bwrap = find_bwrap();
        if (!bwrap) {
                if (why)
                        snprintf(why, why_len, "bubblewrap (bwrap) is not installed");
                return -ENOENT;
        }
        if (geteuid() != 0) {
                if (why)
                        snprintf(why, why_len, "the namespace driver needs root (cgroups, mounts, uid maps)");
                return -EPERM;
        }
        const CgroupLayout *l;
        int r = launch_cgroup_layout(&l);
        if (r < 0) {
                if (why)
                        snprintf(why, why_len, "no usable cgroup hierarchy under /sys/fs/cgroup");
                return r;
        }
        const uint8_t *prog;
        size_t n;
        r = seccomp_policy_bpf(&prog, &n);
        if (r < 0) {
                if (why)
                        snprintf(why, why_len, "cannot build the seccomp filter");
                return r;
        }
        if (access("/proc/self/ns/user", F_OK) < 0) {
                if (why)
                        snprintf(why, why_len, "the kernel has no user namespaces");
                return -ENOSYS;
        }
        if (why) {
                char lxcfs[400];
                lxcfs_describe(lxcfs, sizeof lxcfs);
                snprintf(why, why_len, "bubblewrap at %s, cgroup %s, seccomp filter of %zu instructions, %s", bwrap,
                         l->v2 ? "v2" : (l->hier[CGROUP_UNIFIED] ? "v1 (hybrid)" : "v1"), n / 8, lxcfs);
        }
        return 0;
}

static int write_id_map(pid_t pid, const char *file, uid_t shift) {
        char p[64], line[64];
        snprintf(p, sizeof p, "/proc/%d/%s", (int)pid, file);
        int n = snprintf(line, sizeof line, "0 %u %u\n", (unsigned)shift, LAUNCH_UID_RANGE);
        _cleanup_close_ int fd = open(p, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        if (write(fd, line, (size_t)n) != n)
                return -errno;
        return 0;
}

/* Reads bwrap's info JSON until EOF (bwrap closes it once written: closing
 * our end earlier would SIGPIPE it) and returns "child-pid". */
static int read_child_pid(int fd, pid_t *ret) {
        char buf[2048];
        size_t got = 0;
        int64_t deadline = (int64_t)time_now_mono_ms() + SETUP_TIMEOUT_MS;
        for (;;) {
                int left = (int)(deadline - (int64_t)time_now_mono_ms());
                if (left <= 0)
                        return -ETIMEDOUT;
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                int p = poll(&pfd, 1, left);
                if (p < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (p == 0)
                        return -ETIMEDOUT;
                ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        break;
                got += (size_t)n;
                if (got + 1 >= sizeof buf)
                        return -EPROTO;
        }
        buf[got] = '\0';
        const char *k = strstr(buf, "\"child-pid\":");
        if (!k)
                return -EPROTO; /* bwrap died before it forked */
        char *end;
        errno = 0;
        long v = strtol(k + strlen("\"child-pid\":"), &end, 10);
        if (errno || v <= 0 || v > INT_MAX)
                return -EPROTO;
        *ret = (pid_t)v;
        return 0;
}

static void closep_all(int *fds, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (fds[i] >= 0) {
                        close(fds[i]);
                        fds[i] = -1;
                }
}

/* In the forked child, still root on the host: oom_score_adj -1000, which
 * bwrap and the agent inherit, so the host's OOM killer passes the agent over
 * when the sandbox exhausts its memory (root in the sandbox's user namespace
 * may not lower it itself). The agent's children raise theirs back to 0
 * before they exec. Then the staged mounts. */
typedef struct NsChild {
        LaunchStage stage;
        bool pin;
        cpu_set_t cpus;
} NsChild;

static int ns_pre_exec(void *userdata) {
        NsChild *c = userdata;
        int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
                (void)!write(fd, "-1000", 5);
                close(fd);
        }
        if (c->pin && sched_setaffinity(0, sizeof c->cpus, &c->cpus) < 0)
                return -errno;
        return launch_stage_mounts(&c->stage);
}

/* What a namespace start adds to the launch plan: the agent's and the
 * commands' cgroup leaves, bwrap's info and user-namespace pipes, the
 * seccomp policy it installs, and the leaf's join files the agent keeps. */
typedef struct NsStart {
        Cgroup *agent_cg, *work_cg;
        int info[2], block[2], seccomp_fd;
        int work_fds[_CGROUP_HIER_MAX];
        size_t n_work;
        /* bwrap's and the agent's arguments that name descriptors. */
        char s_block[16], s_info[16], s_seccomp[16];
        char s_work[_CGROUP_HIER_MAX * 12 + 1]; /* the agent's "N,N,..." */
} NsStart;

static void ns_start_close(NsStart *n) {
        int fds[] = { n->info[0], n->info[1], n->block[0], n->block[1], n->seccomp_fd };
        closep_all(fds, ELEMENTSOF(fds));
        n->info[0] = n->info[1] = n->block[0] = n->block[1] = n->seccomp_fd = -1;
        cgroup_close_fds(n->work_fds, ELEMENTSOF(n->work_fds));
}

/* The leaves under the sandbox's cgroup: the agent's and its commands'. */
static int ns_plan_leaves(NsStart *n, LaunchPlan *p) {
        int r = cgroup_new_child(p->inst->cg, NS_LEAF_AGENT, true, &n->agent_cg);
        return r < 0 ? r : cgroup_new_child(p->inst->cg, NS_LEAF_WORK, true, &n->work_cg);
}

/* bwrap's pipes, the seccomp policy and the work leaf's join files, each
 * above stdio, and the arguments that name them. */
static int ns_plan_fds(NsStart *n) {
        if (pipe2(n->info, O_CLOEXEC) < 0 || pipe2(n->block, O_CLOEXEC) < 0)
                return -errno;
        int r = seccomp_policy_export_fd(&n->seccomp_fd);
        if (r < 0)
                return r;
        int *movable[] = { &n->info[0], &n->info[1], &n->block[0], &n->block[1], &n->seccomp_fd };
        for (size_t i = 0; i < ELEMENTSOF(movable); i++)
                if ((r = launch_fd_above_stdio(movable[i])) < 0)
                        return r;
        r = cgroup_open_join(n->work_cg, n->work_fds, ELEMENTSOF(n->work_fds));
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(n->work_fds) && n->work_fds[i] >= 0; i++) {
                r = launch_fd_above_stdio(&n->work_fds[i]);
                if (r < 0)
                        return r;
                size_t used = strlen(n->s_work);
                snprintf(n->s_work + used, sizeof n->s_work - used, "%s%d", n->n_work ? "," : "", n->work_fds[i]);
                n->n_work++;
        }
        snprintf(n->s_block, sizeof n->s_block, "%d", n->block[0]);
        snprintf(n->s_info, sizeof n->s_info, "%d", n->info[1]);
        snprintf(n->s_seccomp, sizeof n->s_seccomp, "%d", n->seccomp_fd);
        return 0;
}

/* lxcfs's files over /proc's, right after bwrap mounts /proc; the
 * sandbox's own cgroup directories, read-only, where programs look for
 * their limits (the JVM, Go's runtime, nproc-like sizing): on v2 the one
 * tree at /sys/fs/cgroup, on v1 one directory a controller. The cgroup
 * namespace bwrap makes roots /proc/self/cgroup there. */
static size_t ns_proc_views(const Cgroup *cg, const CgroupLayout *layout, char **argv) {
        static const struct {
                CgroupHier hier;
                const char *v1_at;
        } cgroup_views[] = {
                {CGROUP_MEMORY, "/sys/fs/cgroup/memory"}, {CGROUP_CPU, "/sys/fs/cgroup/cpu"},
                {CGROUP_CPUACCT, "/sys/fs/cgroup/cpuacct"}, {CGROUP_PIDS, "/sys/fs/cgroup/pids"},
                {CGROUP_UNIFIED, "/sys/fs/cgroup/unified"},
        };
        /* bwrap would make the mount points' parents 0700 (its umask): the
         * sandbox user reads its limits there too. */
        static const char *const cgroup_parents[] = { "--perms", "0755", "--dir", "/sys/fs",
                                                      "--perms", "0755", "--dir", "/sys/fs/cgroup" };
        size_t argc = 0;
        /* Once a start: each look reads lxcfs's files through FUSE. */
        bool lxcfs = lxcfs_ready();
        for (size_t f = 0; lxcfs && f < ELEMENTSOF(lxcfs_files); f++) {
                argv[argc++] = "--ro-bind";
                argv[argc++] = (char *)lxcfs_sources[f];
                argv[argc++] = (char *)lxcfs_files[f];
        }
        for (size_t k = 0; k < ELEMENTSOF(cgroup_parents); k++)
                argv[argc++] = (char *)cgroup_parents[k];
        for (size_t c = 0; c < ELEMENTSOF(cgroup_views); c++) {
                const char *dir = cgroup_dir(cg, cgroup_views[c].hier);
                if (!dir || (layout->v2 && cgroup_views[c].hier != CGROUP_UNIFIED))
                        continue;
                argv[argc++] = "--ro-bind";
                argv[argc++] = (char *)dir;
                argv[argc++] = layout->v2 ? "/sys/fs/cgroup" : (char *)cgroup_views[c].v1_at;
        }
        return argc;
}

/* Room for ns_proc_views' arguments. */
#define NS_PROC_VIEW_ARGS (3 * ELEMENTSOF(lxcfs_files) + 8 + 3 * 5)

/* bubblewrap's command line for the plan: its namespaces, the staged root
 * and agent, the capabilities root inside keeps, the seccomp policy, and the
 * agent as its PID 1. argv has room for NS_ARGV_MAX. */
#define NS_ARGV_MAX (96 + NS_PROC_VIEW_ARGS + 3 * DRIVER_MAX_MOUNTS)
static int ns_argv(const NsStart *n, const LaunchPlan *p, const char *bwrap, char **argv) {
        /* Capabilities root inside keeps: the ones that act only on objects
         * its user namespace owns (its files, its processes). No
         * CAP_SYS_ADMIN, NET_ADMIN, NET_RAW, MKNOD, SYS_PTRACE. */
        const char *const head[] = {
                bwrap,
                "--unshare-user", "--userns-block-fd", n->s_block, "--info-fd", n->s_info, "--uid", "0", "--gid", "0",
                "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--hostname", "sandbox",
                "--as-pid-1", "--new-session",
                "--bind", LAUNCH_STAGE_ROOT, "/",
                "--proc", "/proc",
        };
        const char *const tail[] = {
                "--dev", "/dev",
                "--ro-bind", LAUNCH_STAGE_AGENT, "/.runtime/agent",
                "--cap-drop", "ALL",
                "--cap-add", "CAP_CHOWN", "--cap-add", "CAP_DAC_OVERRIDE", "--cap-add", "CAP_FOWNER",
                "--cap-add", "CAP_FSETID", "--cap-add", "CAP_KILL", "--cap-add", "CAP_SETGID",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETPCAP", "--cap-add", "CAP_NET_BIND_SERVICE",
                "--cap-add", "CAP_SYS_CHROOT",
                "--seccomp", n->s_seccomp,
                "--clearenv",
                "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--setenv", "HOME", "/root",
                "--setenv", "LANG", "C.UTF-8",
                "--chdir", "/",
                "--", "/.runtime/agent", "--cgroup-fds", n->s_work,
        };
        const CgroupLayout *layout;
        int r = launch_cgroup_layout(&layout);
        if (r < 0)
                return r;
        size_t argc = 0;
        for (size_t i = 0; i < ELEMENTSOF(head); i++)
                argv[argc++] = (char *)head[i];
        argc += ns_proc_views(p->inst->cg, layout, argv + argc);
        /* The volumes, staged by root (launch_stage_mounts). None is under
         * /proc, /dev or /.runtime: the daemon refuses those paths. */
        for (size_t i = 0; i < p->spec->n_mounts; i++) {
                argv[argc++] = p->spec->mounts[i].read_only ? "--ro-bind" : "--bind";
                argv[argc++] = (char *)launch_stage_mounts_at[i];
                argv[argc++] = (char *)p->spec->mounts[i].dest;
        }
        for (size_t i = 0; i < ELEMENTSOF(tail); i++)
                argv[argc++] = (char *)tail[i];
        argv[argc] = NULL;
        return 0;
}

/* bwrap is started and waits on its block pipe: its child's cgroup
 * leaves, then the user namespace's uid and gid maps, then go. */
static int ns_userns(NsStart *n, LaunchPlan *p) {
        /* Only the child holds these now; EOF on info means bwrap is gone. */
        int child_ends[] = { n->info[1], n->block[0], n->seccomp_fd };
        closep_all(child_ends, ELEMENTSOF(child_ends));
        n->info[1] = n->block[0] = n->seccomp_fd = -1;
        cgroup_close_fds(n->work_fds, ELEMENTSOF(n->work_fds));
        pid_t child = -1;
        int r = read_child_pid(n->info[0], &child);
        if (r >= 0)
                r = ns_leaves_enter(p->inst->cg, n->agent_cg, n->work_cg, p->spec, p->inst->pid, child);
        if (r >= 0)
                r = write_id_map(child, "uid_map", p->shift);
        if (r >= 0)
                r = write_id_map(child, "gid_map", p->shift);
        if (r < 0)
                return r;
        return write(n->block[1], "1", 1) == 1 ? 0 : -EPIPE;
}

static void ns_after_kill(LaunchPlan *p, void *userdata) {
        if (p->inst)
                (void)ns_leaves_end(p->inst->cg, false);
}

static int ns_start(const DriverSpec *spec, int *ret_fd, DriverInstance **ret, DriverError *err) {
        LaunchPlan p;
        NsStart n = { .info = { -1, -1 }, .block = { -1, -1 }, .seccomp_fd = -1 };
        for (size_t i = 0; i < ELEMENTSOF(n.work_fds); i++)
                n.work_fds[i] = -1;
        char *argv[NS_ARGV_MAX];
        const char *bwrap = find_bwrap();
        int r = launch_plan_new(&p, &driver_namespace, spec, bwrap, "bubblewrap (bwrap) is not installed on this host",
                                err);
        if (r >= 0 && (r = launch_plan_cgroup(&p)) >= 0 && (r = ns_plan_leaves(&n, &p)) >= 0 &&
            (r = launch_plan_layer(&p)) >= 0 && (r = launch_plan_channel(&p)) >= 0 && (r = ns_plan_fds(&n)) >= 0)
                r = ns_argv(&n, &p, bwrap, argv);
        if (r >= 0) {
                int keep[3 + _CGROUP_HIER_MAX] = { n.block[0], n.info[1], n.seccomp_fd };
                size_t n_keep = 3;
                for (size_t i = 0; i < n.n_work; i++)
                        keep[n_keep++] = n.work_fds[i];
                NsChild child_setup = { .stage = launch_plan_stage(&p) };
                child_setup.pin = launch_pick_cpus(spec->vcpu, &child_setup.cpus);
                LaunchFds lf = {
                        .keep = keep, .n_keep = n_keep,
                        /* bwrap itself runs as the sandbox's unprivileged
                         * host uid: the user namespace it makes is owned by
                         * that uid, and its creds map to root inside once
                         * the daemon writes the map. */
                        .set_ids = true, .uid = p.shift, .gid = p.shift,
                        .pre_exec = ns_pre_exec, .userdata = &child_setup,
                };
                r = launch_plan_spawn(&p, argv, &lf);
        }
        if (r >= 0)
                r = ns_userns(&n, &p);
        ns_start_close(&n);
        if (r < 0 && p.inst) {
                (void)ns_leaves_end(p.inst->cg, true);
                p.after_kill = ns_after_kill;
        }
        cgroup_free(n.agent_cg);
        cgroup_free(n.work_cg);
        if (r < 0) {
                launch_plan_abort(&p);
                return r;
        }
        launch_plan_done(&p, ret_fd, ret);
        return 0;
}

static void ns_stop(DriverInstance *inst, const char **ret_reason) {
        if (ret_reason)
                *ret_reason = NULL;
        if (!inst)
                return;
        bool exited = launch_instance_exited(inst);
        const char *reason = launch_stop_reason(inst, exited);
        if (reason && strcmp(reason, "oom") != 0 && ns_leaves_oom_kills(inst->cg) > 0)
                reason = "oom";
        (void)ns_leaves_end(inst->cg, true);
        launch_kill_and_reap(inst);
        (void)ns_leaves_end(inst->cg, false);
        if (ret_reason)
                *ret_reason = reason;
        launch_release(inst);
}

static int ns_reap_orphan(const DriverSpec *spec) {
        int r = launch_spec_check(spec);
        if (r < 0)
                return r;
        Cgroup *cg;
        int ret = 0;
        if (launch_cgroup(spec, false, &cg) >= 0) {
                ret = ns_leaves_end(cg, true);
                r = ns_leaves_end(cg, false);
                if (ret == 0)
                        ret = r;
                cgroup_free(cg);
        }
        r = launch_reap_orphan(spec);
        return r < 0 ? r : ret;
}

static int ns_destroy(const DriverSpec *spec) {
        int r = launch_spec_check(spec);
        if (r < 0)
                return r;
        r = ns_reap_orphan(spec);
        int r2 = rootfs_remove(spec->sandbox_dir);
        return r < 0 ? r : r2;
}

static int ns_stats(DriverInstance *inst, DriverStats *ret) {
        int r = launch_stats(inst, ret);
        if (r >= 0 && !ret->oom_killed)
                ret->oom_killed = ns_leaves_oom_kills(inst->cg) > 0;
        return r;
}

static int ns_adopt(const DriverSpec *spec, const char *state, int *fds, size_t n, DriverInstance **ret) {
        return launch_adopt(&driver_namespace, spec, state, fds, n, ret);
}

static int mnt_ns_of(long pid, ino_t *ret) {
        char ns[64];
        struct stat st;
        snprintf(ns, sizeof ns, "/proc/%ld/ns/mnt", pid);
        if (stat(ns, &st) < 0)
                return -errno;
        *ret = st.st_ino;
        return 0;
}

static long parent_of(long pid) {
        char path[64], line[128];
        snprintf(path, sizeof path, "/proc/%ld/status", pid);
        FILE *f = fopen(path, "re");
        long ppid = -1;
        while (f && fgets(line, sizeof line, f))
                if (sscanf(line, "PPid: %ld", &ppid) == 1)
                        break;
        if (f)
                fclose(f);
        return ppid;
}

/* The agent, in the sandbox's mount namespace: of the agent leaf's
 * processes (bwrap in the host's namespace, its child in the one it set
 * the root up in, and the agent in the one bwrap makes last, which the
 * sandbox's commands share), one whose parent is in the sandbox too. */
static int ns_sandbox_pid(const DriverSpec *spec, pid_t *ret) {
        Cgroup *cg = NULL, *leaf = NULL;
        int r = launch_cgroup(spec, false, &cg);
        if (r < 0)
                return r == -ENOENT ? -ESRCH : r;
        r = cgroup_new_child(cg, NS_LEAF_AGENT, false, &leaf);
        cgroup_free(cg);
        if (r < 0)
                return -ESRCH;
        const char *dir = NULL;
        for (int h = 0; h < _CGROUP_HIER_MAX && !dir; h++)
                dir = cgroup_dir(leaf, (CgroupHier)h);
        char path[PATH_MAX];
        FILE *f = dir && snprintf(path, sizeof path, "%s/cgroup.procs", dir) < (int)sizeof path ? fopen(path, "re")
                                                                                               : NULL;
        cgroup_free(leaf);
        if (!f)
                return -ESRCH;
        ino_t self, ns, parent_ns;
        r = mnt_ns_of((long)getpid(), &self) < 0 ? -EIO : -ESRCH;
        long pid;
        while (r == -ESRCH && fscanf(f, "%ld", &pid) == 1)
                if (mnt_ns_of(pid, &ns) == 0 && ns != self && mnt_ns_of(parent_of(pid), &parent_ns) == 0 &&
                    parent_ns != self) {
                        *ret = (pid_t)pid;
                        r = 0;
                }
        fclose(f);
        return r;
}

/* In a forked child, inside the sandbox's mount namespace with its root as
 * ours: the directory at dest (made where missing, owned by root inside),
 * resolved with no symbolic link on the way and never above the root, so a
 * link the sandbox planted cannot send the mount over /proc or /.runtime. */
static int ns_live_dir(const char *dest, uid_t root_uid, bool make) {
        char part[PATH_MAX];
        const char *p = dest;
        int dfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        while (dfd >= 0 && *p == '/') {
                const char *end = strchr(p + 1, '/');
                size_t n = end ? (size_t)(end - p - 1) : strlen(p + 1);
                if (n == 0 || n >= sizeof part)
                        break;
                memcpy(part, p + 1, n);
                part[n] = 0;
                if (make && mkdirat(dfd, part, 0755) == 0 &&
                    fchownat(dfd, part, root_uid, root_uid, AT_SYMLINK_NOFOLLOW) < 0)
                        break;
                struct open_how how = { .flags = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                                        .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH };
                int next = (int)syscall(SYS_openat2, dfd, part, &how, sizeof how);
                close(dfd);
                dfd = next;
                p += n + 1;
        }
        if (dfd >= 0 && *p) {
                close(dfd);
                return -1;
        }
        return dfd;
}

typedef struct NsLive {
        const char *dest;
        char parent[PATH_MAX]; /* dest's directory, "" for / */
        const char *last;      /* dest's last name */
        int tree;       /* the volume's detached bind (mount), -1 (unmount) */
        uid_t root_uid; /* root inside, on the host */
} NsLive;

/* In the sandbox's mount namespace (launch_in_mount_ns): the bind moved to
 * dest, or the mount at dest taken away. */
static int ns_live_step(void *arg) {
        const NsLive *l = arg;
        int dfd = ns_live_dir(l->dest, l->root_uid, l->tree >= 0);
        if (dfd < 0)
                return ENOTDIR;
        if (l->tree >= 0)
                return move_mount(l->tree, "", dfd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0 ? errno
                                                                                                               : 0;
        /* The mount point itself, by no path through the sandbox's /proc:
         * its parent's directory as cwd and the last name. */
        close(dfd);
        int pfd = l->parent[0] ? ns_live_dir(l->parent, l->root_uid, false) : open("/", O_PATH | O_DIRECTORY);
        if (pfd < 0 || fchdir(pfd) < 0)
                return ENOTDIR;
        return umount2(l->last, UMOUNT_NOFOLLOW) < 0 ? errno : 0;
}

/* The mount's or the unmount's steps in the sandbox's mount namespace. */
static int ns_live(const DriverSpec *spec, NsLive *l) {
        pid_t pid = -1;
        int r = ns_sandbox_pid(spec, &pid);
        if (r < 0)
                return r;
        /* Worked out before the fork: the child only makes system calls. */
        const char *last = strrchr(l->dest, '/');
        if (!last)
                return -EINVAL;
        snprintf(l->parent, sizeof l->parent, "%.*s", (int)(last - l->dest), l->dest);
        l->last = last + 1;
        return launch_in_mount_ns(pid, ns_live_step, l);
}

static int ns_mount_live(DriverInstance *inst, const DriverSpec *spec, const DriverMount *m,
                         char name[DRIVER_LIVE_NAME_LEN + 1]) {
        (void)inst;
        driver_live_name(m->dest, name);
        uid_t shift;
        int r = launch_image_owner(spec, &shift);
        if (r < 0)
                return r;
        uid_t owner = shift + LAUNCH_SANDBOX_UID;
        /* The root of the volume is the sandbox user's, as at a start. */
        if (chown(m->source, owner, owner) < 0)
                return -errno;
        _cleanup_close_ int tree = open_tree(AT_FDCWD, m->source, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (tree < 0)
                return -errno;
        struct mount_attr attr = { .attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                               (m->read_only ? MOUNT_ATTR_RDONLY : 0) };
        if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
                return -errno;
        NsLive l = { .dest = m->dest, .tree = tree, .root_uid = shift };
        return ns_live(spec, &l);
}

static int ns_unmount_live(DriverInstance *inst, const DriverSpec *spec, const char *dest) {
        (void)inst;
        uid_t shift;
        int r = launch_image_owner(spec, &shift);
        if (r < 0)
                return r;
        NsLive l = { .dest = dest, .tree = -1, .root_uid = shift };
        return ns_live(spec, &l);
}

const Driver driver_namespace = {
        .name = "namespace",
        .probe = ns_probe,
        .start = ns_start,
        .stop = ns_stop,
        .destroy = ns_destroy,
        .reap_orphan = ns_reap_orphan,
        .stats = ns_stats,
        .alive = launch_alive,
        .handles = launch_handles,
        .adopt = ns_adopt,
        .release = launch_let_go,
        .pause = launch_pause,
        .resume = launch_resume,
        .snapshot_disk = launch_snapshot_disk,
        .restore_disk = launch_restore_disk,
        .mount_live = ns_mount_live,
        .unmount_live = ns_unmount_live,
};
