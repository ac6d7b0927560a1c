#include "agent/exec.h"

#include "agent/archive.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include "agent/limits.h"
#include "common/macro.h"
#include "common/timeutil.h"

const char *const exec_base_env[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        "LANG=C.UTF-8",
        "TERM=dumb",
        NULL,
};

char **exec_build_env(const char *const user_env[], char *const extra[], size_t n_extra) {
        size_t n_base = ELEMENTSOF(exec_base_env) - 1, n_user = 0;
        while (user_env && user_env[n_user])
                n_user++;
        char **env = calloc(n_base + n_user + n_extra + 1, sizeof(char *));
        if (!env)
                return NULL;
        size_t n = 0;
        for (size_t i = 0; i < n_base; i++)
                env[n++] = (char *)exec_base_env[i];
        for (size_t i = 0; i < n_user + n_extra; i++) {
                char *v = i < n_user ? (char *)user_env[i] : extra[i - n_user];
                size_t klen = strcspn(v, "=") + 1;
                size_t j;
                for (j = 0; j < n; j++)
                        if (strncmp(env[j], v, klen) == 0)
                                break;
                env[j] = v;
                if (j == n)
                        n++;
        }
        env[n] = NULL;
        return env;
}

static void child_fail(const char *what, int err) {
        char msg[512];
        int n = snprintf(msg, sizeof msg, "runtime: %s: %s\n", what, strerror(err));
        if (n > 0)
                (void)!write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
}

static void child_fail_cwd(const char *cwd, int err) {
        char msg[4200];
        int n = snprintf(msg, sizeof msg, "runtime: cd: %s: %s\n", cwd, strerror(err));
        if (n > 0)
                (void)!write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        _exit(127);
}

/* The child's defaults: signals, its own session, the agent's limits. The
 * dispositions first, with the agent's mask still blocking everything it
 * takes from its signalfd: a command's child runs on the agent's memory
 * until its execve (spawn below). */
static void child_reset(void) {
        /* The agent ignores some signals and blocks the rest for its own
         * loop; a child must start with defaults (ignored signals and the
         * mask survive execve). */
        signal(SIGPIPE, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setsid();
        limits_child_defaults();
}

/* The rest of a child once fds 0..2 are set: the user, the directory, the
 * program. Never returns. */
/* In a child: every descriptor from 3 up closed, by close_range or, where
 * it is missing, one by one as /proc/self/fd lists them. */
static void close_from_3(void) {
        if (syscall(SYS_close_range, 3U, ~0U, 0U) == 0)
                return;
        DIR *d = opendir("/proc/self/fd");
        if (!d)
                return;
        int self = dirfd(d);
        struct dirent *de;
        while ((de = readdir(d))) {
                int fd = atoi(de->d_name);
                if (fd >= 3 && fd != self)
                        close(fd);
        }
        closedir(d);
}

static void child_exec(const AgentRequest *r, char **env) {
        /* Whatever launched the agent may have leaked descriptors. */
        syscall(SYS_close_range, 3U, ~0U, 0U);
        /* Groups first: once the uid is not root, setgroups and
         * setgid are refused. Each one checked: a child that kept root's
         * groups or gid would run with more than it was given. */
        if (r->uid >= 0) {
                /* The system calls themselves: libc's wrappers may signal
                 * every thread they believe the process has, and this child
                 * shares the agent's memory until its execve. */
                gid_t g = (gid_t)r->gid;
                if (syscall(SYS_setgroups, 1, &g) < 0)
                        child_fail("setgroups", errno);
                if (syscall(SYS_setgid, g) < 0)
                        child_fail("setgid", errno);
                if (syscall(SYS_setuid, (uid_t)r->uid) < 0)
                        child_fail("setuid", errno);
                if (r->uid != 0 && (syscall(SYS_setuid, 0) == 0 || geteuid() == 0))
                        child_fail("setuid", EPERM);
        }
        if (chdir(r->cwd) < 0)
                child_fail_cwd(r->cwd, errno);
        if (r->op == REQ_ARCHIVE || r->op == REQ_UNARCHIVE) {
                /* No execve closes the agent's descriptors here: where
                 * close_range is missing (gVisor), the stdin pipe's own
                 * write end would keep its read from ever ending. */
                close_from_3();
                _exit(archive_child(r));
        }
        if (r->shell) {
                char *const bash[] = {"bash", "-c", r->argv[0], NULL};
                execve("/bin/bash", bash, env);
                execvpe("bash", bash, env);
                char *const sh[] = {"sh", "-c", r->argv[0], NULL};
                execve("/bin/sh", sh, env);
                child_fail("sh", errno);
        }
        execvpe(r->argv[0], r->argv, env);
        child_fail(r->argv[0], errno);
}

static int pipe_pair(int fds[2], int nonblock_end) {
        if (pipe2(fds, O_CLOEXEC) < 0)
                return -errno;
        if (fcntl(fds[nonblock_end], F_SETFL, O_NONBLOCK) < 0) {
                int k = -errno;
                close(fds[0]);
                close(fds[1]);
                return k;
        }
        return 0;
}

static void close_pair(int fds[2]) {
        for (int i = 0; i < 2; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
}

void exec_kill_group(pid_t pid) {
        /* The leader first: until its setsid() has run there is no group to
         * signal, and a leader with a fatal signal pending can no longer fork.
         * Then the group, for everything it started. */
        kill(pid, SIGKILL);
        kill(-pid, SIGKILL);
}

int exec_pty_resize(int master_fd, unsigned cols, unsigned rows) {
        struct winsize ws = { .ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols };
        return ioctl(master_fd, TIOCSWINSZ, &ws) < 0 ? -errno : 0;
}

/* A new pty: the master non-blocking (two descriptors of it, for input and
 * output) and its slave, opened here so that it is open from before the fork
 * on: gVisor reports a master whose slave is not open yet as hung up. The
 * agent closes its slave once the child has its own copy; the last close by
 * the child's processes is then the master's EOF. */
static int pty_open(const AgentRequest *r, int ret_master[2], int *ret_slave) {
        int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (m < 0)
                return -errno;
        int k;
        char name[64];
        if (grantpt(m) < 0 || unlockpt(m) < 0 || ptsname_r(m, name, sizeof name) != 0 ||
            (k = exec_pty_resize(m, r->pty_cols, r->pty_rows)) < 0 || fcntl(m, F_SETFL, O_NONBLOCK) < 0) {
                k = -errno;
                close(m);
                return k ? k : -EIO;
        }
        int m2 = fcntl(m, F_DUPFD_CLOEXEC, 3);
        if (m2 < 0) {
                k = -errno;
                close(m);
                return k;
        }
        int sl = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (sl < 0) {
                k = -errno;
                close(m);
                close(m2);
                return k;
        }
        ret_master[0] = m2;
        ret_master[1] = m;
        *ret_slave = sl;
        return 0;
}

/* In the child of a pty exec, after its setsid(): the slave becomes its
 * controlling terminal, on fds 0..2 (login_tty). Child-only: it exits on
 * failure. */
static void pty_child(int fd, const AgentRequest *r) {
        if (ioctl(fd, TIOCSCTTY, 0) < 0)
                _exit(126);
        if (dup2(fd, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
                _exit(126);
        /* The slave of a user's command is owned by that user, as a login
         * would leave it. */
        if (r->uid >= 0)
                (void)!fchown(0, (uid_t)r->uid, (gid_t)r->gid);
}

/* What a child needs to start: it reads it from the agent's memory. */
typedef struct SpawnArgs {
        const AgentRequest *r;
        char **env;
        int stdio[3];  /* onto fds 0..2; stdin -1: /dev/null */
        int pty_slave; /* >= 0: a pty exec, its terminal instead */
} SpawnArgs;

static int spawn_child(void *p) {
        const SpawnArgs *a = p;
        child_reset();
        if (a->pty_slave >= 0)
                pty_child(a->pty_slave, a->r);
        else {
                int in = a->stdio[0];
                if (in < 0 && (in = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
                        _exit(126);
                /* dup2 over fds 0..2 (the agent's own channel when it uses stdio). */
                if (dup2(in, 0) < 0 || dup2(a->stdio[1], 1) < 0 || dup2(a->stdio[2], 2) < 0)
                        _exit(126);
        }
        child_exec(a->r, a->env);
        _exit(126);
}

/* The stack of a command's child until its execve: one mapping, made at the
 * first command and kept, above a guard page. */
#define SPAWN_STACK_BYTES (256u * 1024u)

/* Under AddressSanitizer (the test build) a child's frames leave their
 * markings in the shadow of that stack, shared with the agent, when it
 * execs; the next child starts on a clean one. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define SPAWN_STACK_CLEAN(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define SPAWN_STACK_CLEAN(p, n) ((void)(p), (void)(n))
#endif

/*
 * The launcher (namespace driver, where the agent has a work leaf): a process
 * of the agent's that joined the work leaf once and starts the commands from
 * there. A child it clones is born in every hierarchy of the leaf, so no
 * cgroup.procs write comes between a command's request and its exec: that
 * write takes the kernel's cgroup_threadgroup_rwsem for writing, which after
 * a quiet spell waits for an RCU grace period, 10-20 ms of an exec that
 * otherwise costs 1-2 ms (docs/drivers.md). CLONE_PARENT makes the child the
 * agent's own, reaped and signalled as before.
 *
 * The launcher is a fork, not a thread or a CLONE_VM process: it shares
 * nothing with the agent but a shared mapping, the arena, into which the
 * agent copies what a child reads (the request's argv, cwd and ids, the
 * environment) at the same address in both, and a socket that carries the
 * child's stdio and the pid back. A sandbox's root may stop or kill it
 * (it is not the pid namespace's init); the agent then waits at most
 * LAUNCH_WAIT_MS and starts the command itself, as it does when the
 * launcher's fork is refused (a fork bomb at the leaf's pids.max: a move is
 * not held to pids.max, so the next command still starts). The state word
 * decides which of the two starts it, never both.
 */
#define LAUNCH_ARENA_BYTES (256u * 1024u)
#define LAUNCH_WAIT_MS 100
/* How long a launcher that took a request may take to answer (its clone
 * returns once the child has exec'd): past it, it was stopped or is stuck,
 * and it is killed. */
#define LAUNCH_TAKEN_WAIT_MS 5000
/* A launcher that is gone (killed, or stopped and killed) is started again
 * after the next command, at most this often: the sandbox's root may kill
 * each new one, and a fork bomb may refuse its fork. */
#define LAUNCH_RESTART_MS 1000

/* The arena's state word: a request's number times 4 plus its phase. The
 * number ties a message to the arena's contents: a message the agent gave
 * up on may still be queued when the next request fills the arena. */
enum { LAUNCH_IDLE, LAUNCH_PENDING, LAUNCH_TAKEN, LAUNCH_CANCELLED };
#define LAUNCH_STATE(seq, phase) ((seq) * 4u + (phase))

/* One message a command: its number and which stdio rides along. */
typedef struct LaunchMsg {
        uint32_t seq;
        char kind; /* 'p' a pty's slave; 'i' stdin, stdout, stderr; 'o' stdout, stderr */
} LaunchMsg;

typedef struct LaunchArena {
        _Atomic uint32_t state;
        AgentRequest r; /* the fields a child reads; pointers into data */
        char **env;
        size_t used;
        _Alignas(16) char data[];
} LaunchArena;

static LaunchArena *launch_arena;
static int launch_sock = -1;
static pid_t launch_pid;
static uint32_t launch_seq;
static bool launch_wanted;          /* the agent has a work leaf: it runs a launcher */
static uint64_t launch_restart_at;  /* monotonic ms: no new launcher before */
/* Set in the launcher: what it clones is the agent's child. */
static bool in_launcher;

static void *arena_alloc(size_t n) {
        size_t cap = LAUNCH_ARENA_BYTES - offsetof(LaunchArena, data);
        n = (n + 15) & ~(size_t)15;
        if (n > cap - launch_arena->used)
                return NULL;
        void *p = launch_arena->data + launch_arena->used;
        launch_arena->used += n;
        return p;
}

static char *arena_strdup(const char *s) {
        size_t n = strlen(s) + 1;
        char *d = arena_alloc(n);
        return d ? memcpy(d, s, n) : NULL;
}

/* A NULL-terminated copy of v in the arena, or NULL when it does not fit. */
static char **arena_strv(char *const *v) {
        size_t n = 0;
        while (v[n])
                n++;
        char **d = arena_alloc((n + 1) * sizeof(char *));
        if (!d)
                return NULL;
        for (size_t i = 0; i < n; i++)
                if (!(d[i] = arena_strdup(v[i])))
                        return NULL;
        d[n] = NULL;
        return d;
}

static int arena_fill(const AgentRequest *r, char **env) {
        launch_arena->used = 0;
        launch_arena->r = (AgentRequest){
                .op = r->op, .shell = r->shell, .uid = r->uid, .gid = r->gid,
                .pty = r->pty, .pty_cols = r->pty_cols, .pty_rows = r->pty_rows,
        };
        if (!(launch_arena->r.argv = arena_strv(r->argv)) || !(launch_arena->r.cwd = arena_strdup(r->cwd)) ||
            !(launch_arena->env = arena_strv(env)))
                return -E2BIG;
        return 0;
}

static void launch_stop(void) {
        if (launch_sock >= 0)
                close(launch_sock);
        launch_sock = -1;
        /* The agent reaps it with its other children. */
        if (launch_pid > 0)
                kill(launch_pid, SIGKILL);
        launch_pid = 0;
        /* The next launcher gets an arena of its own: nothing the old one
         * may still write reaches it. */
        if (launch_arena)
                munmap(launch_arena, LAUNCH_ARENA_BYTES);
        launch_arena = NULL;
        launch_restart_at = time_now_mono_ms() + LAUNCH_RESTART_MS;
}

static pid_t spawn_here(SpawnArgs *a);

/* The launcher's loop: one message a command (its stdio as SCM_RIGHTS, the
 * rest in the arena), one pid or -errno back. Never returns. */
static _Noreturn void launcher_main(int sock) {
        for (;;) {
                LaunchMsg msg;
                union {
                        struct cmsghdr h;
                        char buf[CMSG_SPACE(3 * sizeof(int))];
                } u;
                struct iovec iov = {.iov_base = &msg, .iov_len = sizeof msg};
                struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                                   .msg_controllen = sizeof u.buf};
                ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
                if (n <= 0)
                        _exit(0);
                int fds[3] = {-1, -1, -1};
                size_t nfds = 0;
                struct cmsghdr *c = CMSG_FIRSTHDR(&m);
                if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                        nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                        if (nfds > 3)
                                nfds = 3;
                        memcpy(fds, CMSG_DATA(c), nfds * sizeof(int));
                }
                uint32_t expected = LAUNCH_STATE(msg.seq, LAUNCH_PENDING);
                if (n != sizeof msg ||
                    !atomic_compare_exchange_strong(&launch_arena->state, &expected,
                                                    LAUNCH_STATE(msg.seq, LAUNCH_TAKEN))) {
                        /* The agent gave up on it and started it itself. */
                        for (size_t i = 0; i < nfds; i++)
                                close(fds[i]);
                        continue;
                }
                SpawnArgs a = {.r = &launch_arena->r, .env = launch_arena->env, .stdio = {-1, -1, -1},
                               .pty_slave = -1};
                bool ok = true;
                if (msg.kind == 'p' && nfds == 1)
                        a.pty_slave = fds[0];
                else if (msg.kind == 'i' && nfds == 3)
                        memcpy(a.stdio, fds, sizeof a.stdio);
                else if (msg.kind == 'o' && nfds == 2) {
                        a.stdio[1] = fds[0];
                        a.stdio[2] = fds[1];
                } else
                        ok = false;
                int reply = ok ? spawn_here(&a) : -EINVAL;
                for (size_t i = 0; i < nfds; i++)
                        close(fds[i]);
                if (send(sock, &reply, sizeof reply, MSG_NOSIGNAL) != sizeof reply)
                        _exit(0);
        }
}

void exec_launcher_start(void) {
        launch_wanted = true;
        if (launch_sock >= 0)
                return;
        launch_restart_at = time_now_mono_ms() + LAUNCH_RESTART_MS;
        void *m = mmap(NULL, LAUNCH_ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
                return;
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
                munmap(m, LAUNCH_ARENA_BYTES);
                return;
        }
        launch_arena = m;
        atomic_store(&launch_arena->state, LAUNCH_IDLE);
        pid_t pid = fork();
        if (pid < 0) {
                close(sv[0]);
                close(sv[1]);
                munmap(m, LAUNCH_ARENA_BYTES);
                launch_arena = NULL;
                return;
        }
        if (pid == 0) {
                /* Nothing of the agent's but the socket and the leaf's join
                 * files (its channel may be on fds 0..2); no signal but a
                 * kill reaches it. */
                sigset_t all;
                sigfillset(&all);
                sigprocmask(SIG_SETMASK, &all, NULL);
                (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
                (void)prctl(PR_SET_NAME, "runtime-launch");
                /* A session of its own: a stop of the launcher must not
                 * make the agent's process group a stopped, orphaned one,
                 * which the kernel sends SIGHUP. */
                (void)setsid();
                in_launcher = true;
                int null = open("/dev/null", O_RDWR | O_CLOEXEC);
                if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
                        _exit(1);
                limits_close_fds_keeping_cgroup(3, sv[1]);
                /* The one move into the leaf, paid here, before any request
                 * waits for it. */
                if (limits_join_child_cgroup() < 0)
                        _exit(1);
                launcher_main(sv[1]);
        }
        close(sv[1]);
        launch_sock = sv[0];
        launch_pid = pid;
}

/* The child started by the launcher: its pid, -EAGAIN when the agent must
 * start it itself (no launcher, a request too large for the arena, the
 * launcher's fork refused, the launcher gone or too slow), or another
 * -errno. */
static pid_t launch_spawn(SpawnArgs *a) {
        if (launch_sock < 0 || a->r->op != REQ_EXEC || arena_fill(a->r, a->env) < 0)
                return -EAGAIN;
        int fds[3];
        size_t nfds = 0;
        uint32_t seq = ++launch_seq & 0x3fffffffu;
        LaunchMsg msg = {.seq = seq};
        if (a->pty_slave >= 0) {
                msg.kind = 'p';
                fds[nfds++] = a->pty_slave;
        } else {
                msg.kind = a->stdio[0] >= 0 ? 'i' : 'o';
                for (size_t i = a->stdio[0] >= 0 ? 0 : 1; i < 3; i++)
                        fds[nfds++] = a->stdio[i];
        }
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(3 * sizeof(int))];
        } u;
        memset(&u, 0, sizeof u);
        struct iovec iov = {.iov_base = &msg, .iov_len = sizeof msg};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                           .msg_controllen = CMSG_SPACE(nfds * sizeof(int))};
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
        atomic_store(&launch_arena->state, LAUNCH_STATE(seq, LAUNCH_PENDING));
        if (sendmsg(launch_sock, &m, MSG_NOSIGNAL) != (ssize_t)sizeof msg) {
                launch_stop();
                return -EAGAIN;
        }
        struct pollfd p = {.fd = launch_sock, .events = POLLIN};
        int n;
        do
                n = poll(&p, 1, LAUNCH_WAIT_MS);
        while (n < 0 && errno == EINTR);
        if (n == 0) {
                uint32_t expected = LAUNCH_STATE(seq, LAUNCH_PENDING);
                if (atomic_compare_exchange_strong(&launch_arena->state, &expected,
                                                   LAUNCH_STATE(seq, LAUNCH_CANCELLED)))
                        return -EAGAIN;
                /* Taken already: its clone answers soon, whatever the load
                 * (a fork, or a refusal), unless the launcher was stopped
                 * (by the sandbox's root): then it is killed, and whether
                 * the command started is unknown, so it is not started
                 * again. */
                do
                        n = poll(&p, 1, LAUNCH_TAKEN_WAIT_MS);
                while (n < 0 && errno == EINTR);
                if (n <= 0) {
                        launch_stop();
                        return -EIO;
                }
        }
        int reply;
        ssize_t got = recv(launch_sock, &reply, sizeof reply, 0);
        if (got != sizeof reply) {
                bool taken = atomic_load(&launch_arena->state) == LAUNCH_STATE(seq, LAUNCH_TAKEN);
                launch_stop();
                /* Gone after it took the request: whether the command
                 * started is unknown, so it is not started again. */
                return taken ? -EIO : -EAGAIN;
        }
        atomic_store(&launch_arena->state, LAUNCH_STATE(seq, LAUNCH_IDLE));
        return reply >= 0 ? (pid_t)reply : -EAGAIN;
}

/* Starts the child: the pid, or -errno. A command's child runs on the agent's
 * memory, the agent stopped, until its execve or _exit (CLONE_VM |
 * CLONE_VFORK, as posix_spawn does): a fork copies the agent's address space
 * and then takes a fault for each page either side writes, which costs a
 * gVisor sandbox ~20 ms a command on a host with nested paging
 * (docs/benchmarks.md). The child makes only system calls and writes only
 * its own stack; its libc calls are ones posix_spawn's child makes too. An
 * archive's child does its work before exiting, so it forks. */
static pid_t spawn_here(SpawnArgs *a) {
        static uint8_t *stack;
        if (a->r->op != REQ_EXEC) {
                pid_t pid = fork();
                if (pid == 0)
                        spawn_child(a);
                return pid < 0 ? -errno : pid;
        }
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        if (!stack) {
                void *m = mmap(NULL, page + SPAWN_STACK_BYTES, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
                if (m == MAP_FAILED)
                        return -errno;
                if (mprotect(m, page, PROT_NONE) < 0) {
                        int k = -errno;
                        munmap(m, page + SPAWN_STACK_BYTES);
                        return k;
                }
                stack = m;
        }
        SPAWN_STACK_CLEAN(stack + page, SPAWN_STACK_BYTES);
        /* In the launcher the child is the agent's (CLONE_PARENT). */
        int parent = in_launcher ? CLONE_PARENT : 0;
        pid_t pid = clone(spawn_child, stack + page + SPAWN_STACK_BYTES, CLONE_VM | CLONE_VFORK | parent | SIGCHLD,
                          a);
        return pid < 0 ? -errno : pid;
}

/* Through the launcher where there is one, else here; a launcher that is
 * gone is started again once this command runs (its fork is off this
 * command's start; its move into the leaf is its own). */
static pid_t spawn(SpawnArgs *a) {
        pid_t pid = launch_spawn(a);
        if (pid != -EAGAIN)
                return pid;
        pid = spawn_here(a);
        if (launch_wanted && launch_sock < 0 && a->r->op == REQ_EXEC && time_now_mono_ms() >= launch_restart_at)
                exec_launcher_start();
        return pid;
}

static int exec_spawn_pty(const AgentRequest *r, char **env, ExecChild *ret);


int exec_spawn(const AgentRequest *r, ExecChild *ret) {
        int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
        int k;
        /* The user's own HOME, USER and LOGNAME, as a login sets them; the
         * request's env may still say otherwise. */
        _cleanup_free_ char *home = NULL, *user = NULL, *logname = NULL;
        if (r->user && r->home &&
            (asprintf(&home, "HOME=%s", r->home) < 0 || asprintf(&user, "USER=%s", r->user) < 0 ||
             asprintf(&logname, "LOGNAME=%s", r->user) < 0))
                return -ENOMEM;
        const char *const user_env[] = { home, user, logname, NULL };
        _cleanup_free_ char **env = exec_build_env(home ? user_env : NULL, r->env, r->envc);
        if (!env)
                return -ENOMEM;
        if (r->pty)
                return exec_spawn_pty(r, env, ret);
        if ((k = pipe_pair(out, 0)) < 0)
                return k;
        if ((k = pipe_pair(err, 0)) < 0) {
                close_pair(out);
                return k;
        }
        if (r->stdin_stream && (k = pipe_pair(in, 1)) < 0) {
                close_pair(out);
                close_pair(err);
                return k;
        }

        SpawnArgs args = {.r = r, .env = env, .stdio = {in[0], out[1], err[1]}, .pty_slave = -1};
        pid_t pid = spawn(&args);
        if (pid < 0) {
                close_pair(in);
                close_pair(out);
                close_pair(err);
                return pid;
        }

        if (in[0] >= 0)
                close(in[0]);
        close(out[1]);
        close(err[1]);
        *ret = (ExecChild){.pid = pid, .stdin_fd = in[1], .stdout_fd = out[0], .stderr_fd = err[0]};
        return 0;
}

static int exec_spawn_pty(const AgentRequest *r, char **env, ExecChild *ret) {
        int master[2] = {-1, -1}, slave = -1;
        int k = pty_open(r, master, &slave);
        if (k < 0)
                return k;
        SpawnArgs args = {.r = r, .env = env, .stdio = {-1, -1, -1}, .pty_slave = slave};
        pid_t pid = spawn(&args);
        if (pid < 0) {
                close(master[0]);
                close(master[1]);
                close(slave);
                return pid;
        }
        close(slave);
        *ret = (ExecChild){.pid = pid, .stdin_fd = master[0], .stdout_fd = master[1], .stderr_fd = -1};
        return 0;
}
