#include "agent/limits.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"

static void write_text(const char *path, const char *text) {
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return;
        (void)!write(fd, text, strlen(text));
        close(fd);
}

/* The join files of the cgroup every command runs in: the namespace
 * driver's work leaf (--cgroup-fds), or gVisor's commands cgroup
 * (limits_make_command_cgroup). */
static int child_cgroup_fds[LIMITS_CGROUP_FDS_MAX];
static size_t n_child_cgroup_fds;
/* Set in the launcher once it is in the leaf: what it forks is born there. */
static bool child_cgroup_joined;

int limits_set_child_cgroup_fds(const char *list) {
        int fds[LIMITS_CGROUP_FDS_MAX];
        size_t n = 0;
        for (const char *c = list; *c;) {
                char *end;
                errno = 0;
                long fd = strtol(c, &end, 10);
                if (errno || end == c || fd < 3 || fd > LIMITS_FD_TOP || (*end && (*end != ',' || !end[1])) ||
                    n >= ELEMENTSOF(fds))
                        return -EINVAL;
                /* Open, and not passed on to what the children exec. */
                if (fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0)
                        return -EBADF;
                fds[n++] = (int)fd;
                c = *end ? end + 1 : end;
        }
        if (n == 0)
                return -EINVAL;
        memcpy(child_cgroup_fds, fds, n * sizeof fds[0]);
        n_child_cgroup_fds = n;
        return 0;
}

void limits_close_fds_keeping_cgroup(int from, int also) {
        /* Ascending, as the gaps between them are closed in turn. */
        int keep[LIMITS_CGROUP_FDS_MAX + 1];
        size_t n = 0;
        for (size_t i = 0; i <= n_child_cgroup_fds; i++) {
                int fd = i < n_child_cgroup_fds ? child_cgroup_fds[i] : also;
                if (fd < from)
                        continue;
                size_t j = n++;
                for (; j > 0 && keep[j - 1] > fd; j--)
                        keep[j] = keep[j - 1];
                keep[j] = fd;
        }
        unsigned lo = (unsigned)from;
        for (size_t i = 0; i < n; i++) {
                if ((unsigned)keep[i] > lo)
                        syscall(SYS_close_range, lo, (unsigned)keep[i] - 1, 0U);
                lo = (unsigned)keep[i] + 1;
        }
        syscall(SYS_close_range, lo, ~0U, 0U);
}

int limits_join_child_cgroup(void) {
        if (n_child_cgroup_fds == 0)
                return -ENOENT;
        for (size_t i = 0; i < n_child_cgroup_fds; i++) {
                ssize_t n = write(child_cgroup_fds[i], "0", 1);
                if (n != 1)
                        return n < 0 ? -errno : -EIO;
        }
        child_cgroup_joined = true;
        return 0;
}

void limits_protect_agent(void) {
        write_text("/proc/self/oom_score_adj", "-1000");
}

void limits_child_defaults(void) {
        /* Above the agent's, by a raise, which needs no privilege: where
         * nobody could lower the agent's (a host whose root lacks
         * CAP_SYS_RESOURCE, as in many containers) the agent and the
         * sandbox's launcher stay at 0 and the kernel still takes the
         * commands first. A child that lowers it again harms only its own
         * sandbox. */
        write_text("/proc/self/oom_score_adj", LIMITS_CHILD_OOM_SCORE_ADJ);
        write_text(LIMITS_CHILD_CGROUP "/cgroup.procs", "0");
        /* "0" is the writer itself: this child, one thread, which a v1
         * tasks file moves alone. A command never runs in the agent's leaf:
         * a child that cannot leave it does not exec. */
        for (size_t i = 0; !child_cgroup_joined && i < n_child_cgroup_fds; i++)
                if (write(child_cgroup_fds[i], "0", 1) != 1)
                        _exit(126);
}

/* A /proc file the agent reads again and again (each exec's vmstat, the
 * memory watch's meminfo), kept open: a read from its start makes its text
 * again, where opening it by name walks the path each time (in gVisor with
 * shared file access, asking the host about "/" and "/proc" at every look:
 * three host calls a look, about four looks a second in an idle sandbox).
 * Only the agent's own process reads these; a child that closes every
 * descriptor it has closes its copy, never the agent's. */
typedef struct ProcText {
        const char *path;
        int fd; /* -1: not open; PROC_ABSENT: the kernel has no such file */
} ProcText;

#define PROC_ABSENT (-2)

static ProcText proc_vmstat = { "/proc/vmstat", -1 }, proc_meminfo = { "/proc/meminfo", -1 };

/* The file's whole text into buf, NUL-terminated: its length, -ENOBUFS when
 * it does not fit, or a negative errno. A read that fails closes the kept
 * descriptor and the next call opens the file again. */
static ssize_t proc_text(ProcText *p, char *buf, size_t size) {
        if (p->fd == PROC_ABSENT)
                return -ENOENT;
        if (p->fd < 0 && (p->fd = open(p->path, O_RDONLY | O_CLOEXEC)) < 0) {
                int e = errno;
                /* A kernel without the file (gVisor has no /proc/vmstat)
                 * never gains it: not looked for again. */
                p->fd = e == ENOENT ? PROC_ABSENT : -1;
                return -e;
        }
        size_t n = 0;
        int r = lseek(p->fd, 0, SEEK_SET) < 0 ? -errno : io_read_full(p->fd, buf, size - 1, &n);
        if (r < 0) {
                close(p->fd);
                p->fd = -1;
                return r;
        }
        if (n == size - 1)
                return -ENOBUFS;
        buf[n] = '\0';
        return (ssize_t)n;
}

/* The number after "\nNAME" (NAME with its separator) in text, or
 * UINT64_MAX. */
static uint64_t proc_field(const char *text, const char *name) {
        size_t len = strlen(name);
        for (const char *at = text; at && *at; at = strchr(at, '\n'), at = at ? at + 1 : NULL)
                if (strncmp(at, name, len) == 0) {
                        const char *v = at + len;
                        while (*v == ' ')
                                v++;
                        char *end;
                        errno = 0;
                        unsigned long long n = strtoull(v, &end, 10);
                        return errno == 0 && end != v ? (uint64_t)n : UINT64_MAX;
                }
        return UINT64_MAX;
}

/* The numbers of names' lines of the file into vals: 0, or a negative
 * errno (-ENODATA when one is missing). A kept descriptor whose text lacks
 * one is let go and the file opened again, once: one that a snapshot's
 * restore left reading nothing does not silence the look for good. */
static int proc_numbers(ProcText *p, const char *const *names, uint64_t *vals, size_t n) {
        for (int attempt = 0;; attempt++) {
                bool kept = p->fd >= 0;
                char text[16384];
                ssize_t len = proc_text(p, text, sizeof text);
                if (len < 0)
                        return (int)len;
                size_t found = 0;
                for (size_t i = 0; i < n; i++)
                        found += (vals[i] = proc_field(text, names[i])) != UINT64_MAX;
                if (found == n)
                        return 0;
                if (!kept || attempt > 0)
                        return -ENODATA;
                close(p->fd);
                p->fd = -1;
        }
}

uint64_t limits_oom_kills(void) {
        static const char *const names[] = { "oom_kill " };
        uint64_t v;
        return proc_numbers(&proc_vmstat, names, &v, 1) < 0 ? UINT64_MAX : v;
}

bool limits_was_oom_kill(int status, bool killed_by_agent, uint64_t before) {
        if (killed_by_agent || before == UINT64_MAX || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
                return false;
        uint64_t now = limits_oom_kills();
        return now != UINT64_MAX && now > before;
}

int limits_memory_used(uint64_t *ret) {
        static const char *const names[] = { "MemTotal:", "MemAvailable:" };
        uint64_t v[2];
        int r = proc_numbers(&proc_meminfo, names, v, 2);
        if (r < 0)
                return r;
        *ret = v[0] > v[1] ? (v[0] - v[1]) * 1024 : 0;
        return 0;
}

int limits_largest_process(pid_t *ret_pid, pid_t *ret_pgid) {
        DIR *d = opendir("/proc");
        if (!d)
                return -errno;
        pid_t self = getpid(), best = 0;
        unsigned long long best_rss = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                char *end;
                long pid = strtol(de->d_name, &end, 10);
                if (*end || pid <= 1 || pid == self)
                        continue;
                char path[64];
                snprintf(path, sizeof path, "/proc/%ld/statm", pid);
                FILE *f = fopen(path, "re");
                if (!f)
                        continue;
                unsigned long long size, rss;
                if (fscanf(f, "%llu %llu", &size, &rss) == 2 && rss > best_rss) {
                        best_rss = rss;
                        best = (pid_t)pid;
                }
                fclose(f);
        }
        closedir(d);
        if (!best)
                return -ESRCH;
        pid_t pgid = getpgid(best);
        if (pgid < 0)
                return -errno;
        *ret_pid = best;
        *ret_pgid = pgid;
        return 0;
}

static int parse_field(const char **p, char stop, uint64_t min, uint64_t max, uint64_t *ret) {
        const char *s = *p;
        if (*s < '0' || *s > '9')
                return -EINVAL;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || *end != stop || v < min || v > max)
                return -EINVAL;
        *ret = v;
        *p = stop ? end + 1 : end;
        return 0;
}

int limits_parse_cgroup_view(const char *text, LimitsView *ret) {
        uint64_t mem, vcpu, pids;
        const char *p = text;
        if (!text || parse_field(&p, ':', 16, 1ull << 22, &mem) < 0 ||
            parse_field(&p, ':', 0, 256, &vcpu) < 0 || parse_field(&p, '\0', 1, 1ull << 22, &pids) < 0)
                return -EINVAL;
        *ret = (LimitsView){.memory_mib = mem, .vcpu = (unsigned)vcpu, .pids_max = pids};
        return 0;
}

/* The view's files under root/<controller>/<sub>/ (sub "" for the
 * controllers' own directories). */
static int write_view(const char *root, const char *sub, const LimitsView *v) {
        char mem[32], quota[32], pids[32];
        snprintf(mem, sizeof mem, "%llu", (unsigned long long)(v->memory_mib << 20));
        if (v->vcpu)
                snprintf(quota, sizeof quota, "%u", v->vcpu * 100000u);
        else
                snprintf(quota, sizeof quota, "-1");
        snprintf(pids, sizeof pids, "%llu", (unsigned long long)v->pids_max);
        const char *const files[][3] = {
                {"memory", "memory.limit_in_bytes", mem},
                {"cpu", "cpu.cfs_period_us", "100000"},
                {"cpu", "cpu.cfs_quota_us", quota},
                {"pids", "pids.max", pids},
        };
        for (size_t i = 0; i < ELEMENTSOF(files); i++) {
                char name[PATH_MAX];
                int n = snprintf(name, sizeof name, "%s/%s%s%s", files[i][0], sub, *sub ? "/" : "", files[i][1]);
                if (n < 0 || (size_t)n >= sizeof name)
                        return -ENAMETOOLONG;
                int r = io_write_knob(root, name, files[i][2]);
                if (r < 0)
                        return r;
        }
        return 0;
}

int limits_write_cgroup_view(const char *root, const LimitsView *v) {
        return write_view(root, "", v);
}

int limits_make_command_cgroup(const char *root, const LimitsView *v) {
        static const char *const controllers[] = {"memory", "cpu", "pids"};
        if (n_child_cgroup_fds + ELEMENTSOF(controllers) > LIMITS_CGROUP_FDS_MAX)
                return -E2BIG;
        char path[PATH_MAX];
        for (size_t i = 0; i < ELEMENTSOF(controllers); i++) {
                int n = snprintf(path, sizeof path, "%s/%s/%s", root, controllers[i], LIMITS_VIEW_COMMANDS);
                if (n < 0 || (size_t)n >= sizeof path)
                        return -ENAMETOOLONG;
                /* A copy restored from a memory snapshot has it already. */
                if (mkdir(path, 0755) < 0 && errno != EEXIST)
                        return -errno;
        }
        LimitsView commands = *v;
        uint64_t keep = LIMITS_VIEW_AGENT_PIDS(v->pids_max);
        commands.pids_max = v->pids_max > keep ? v->pids_max - keep : 1;
        int r = write_view(root, LIMITS_VIEW_COMMANDS, &commands);
        if (r < 0)
                return r;
        int fds[ELEMENTSOF(controllers)];
        for (size_t i = 0; i < ELEMENTSOF(controllers); i++) {
                snprintf(path, sizeof path, "%s/%s/%s/cgroup.procs", root, controllers[i], LIMITS_VIEW_COMMANDS);
                fds[i] = open(path, O_WRONLY | O_CLOEXEC);
                if (fds[i] < 0) {
                        r = -errno;
                        while (i > 0)
                                close(fds[--i]);
                        return r;
                }
        }
        for (size_t i = 0; i < ELEMENTSOF(controllers); i++)
                child_cgroup_fds[n_child_cgroup_fds++] = fds[i];
        return 0;
}
