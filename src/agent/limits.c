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

uint64_t limits_oom_kills(void) {
        FILE *f = fopen("/proc/vmstat", "re");
        if (!f)
                return UINT64_MAX;
        char line[128];
        uint64_t v = UINT64_MAX;
        while (fgets(line, sizeof line, f))
                if (strncmp(line, "oom_kill ", 9) == 0) {
                        char *end;
                        errno = 0;
                        unsigned long long n = strtoull(line + 9, &end, 10);
                        if (errno == 0 && end != line + 9)
                                v = (uint64_t)n;
                        break;
                }
        fclose(f);
        return v;
}

bool limits_was_oom_kill(int status, bool killed_by_agent, uint64_t before) {
        if (killed_by_agent || before == UINT64_MAX || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
                return false;
        uint64_t now = limits_oom_kills();
        return now != UINT64_MAX && now > before;
}

int limits_memory_used(uint64_t *ret) {
        FILE *f = fopen("/proc/meminfo", "re");
        if (!f)
                return -errno;
        char line[128];
        unsigned long long total = 0, avail = 0;
        bool have_total = false, have_avail = false;
        while (fgets(line, sizeof line, f) && !(have_total && have_avail)) {
                if (sscanf(line, "MemTotal: %llu kB", &total) == 1)
                        have_total = true;
                else if (sscanf(line, "MemAvailable: %llu kB", &avail) == 1)
                        have_avail = true;
        }
        fclose(f);
        if (!have_total || !have_avail)
                return -ENODATA;
        *ret = total > avail ? (uint64_t)(total - avail) * 1024 : 0;
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
