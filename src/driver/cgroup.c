#include "driver/cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "common/timeutil.h"

#define CPU_PERIOD_US 100000u

struct Cgroup {
        bool v2;
        char *dir[_CGROUP_HIER_MAX]; /* NULL when the hierarchy is absent */
};

static const char *const v1_names[_CGROUP_HIER_MAX] = {
        [CGROUP_MEMORY] = "memory",   [CGROUP_CPU] = "cpu",         [CGROUP_CPUACCT] = "cpuacct",
        [CGROUP_PIDS] = "pids",       [CGROUP_FREEZER] = "freezer", [CGROUP_CPUSET] = "cpuset",
        [CGROUP_UNIFIED] = "unified",
};

static bool file_exists_in(const char *dir, const char *name) {
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p)
                return false;
        return access(p, F_OK) == 0;
}

static int write_in(const char *dir, const char *name, const char *value) {
        return io_write_knob(dir, name, value);
}

/* Reads a small control file (at most len-1 bytes), NUL-terminated. */
static int read_in(const char *dir, const char *name, char *buf, size_t len) {
        char p[PATH_MAX];
        if (!dir)
                return -ENOENT;
        if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p)
                return -ENAMETOOLONG;
        _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        size_t got = 0;
        while (got + 1 < len) {
                ssize_t r = read(fd, buf + got, len - 1 - got);
                if (r < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (r == 0)
                        break;
                got += (size_t)r;
        }
        buf[got] = '\0';
        return 0;
}

static int read_u64_in(const char *dir, const char *name, uint64_t *ret) {
        char buf[64];
        int r = read_in(dir, name, buf, sizeof buf);
        if (r < 0)
                return r;
        if (strncmp(buf, "max", 3) == 0) {
                *ret = UINT64_MAX;
                return 0;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(buf, &end, 10);
        if (errno || end == buf)
                return -EINVAL;
        *ret = v;
        return 0;
}

int cgroup_parse_keyed(const char *text, const char *key, uint64_t *ret) {
        size_t kl = strlen(key);
        for (const char *l = text; l && *l;) {
                if (strncmp(l, key, kl) == 0 && (l[kl] == ' ' || l[kl] == '\t')) {
                        char *end;
                        errno = 0;
                        unsigned long long v = strtoull(l + kl + 1, &end, 10);
                        if (errno || end == l + kl + 1)
                                return -EINVAL;
                        *ret = v;
                        return 0;
                }
                l = strchr(l, '\n');
                if (l)
                        l++;
        }
        return -ENOENT;
}

int cgroup_format_cpu_max(unsigned vcpu, char *buf, size_t len) {
        int n;
        if (vcpu == 0)
                n = snprintf(buf, len, "max %u", CPU_PERIOD_US);
        else
                n = snprintf(buf, len, "%" PRIu64 " %u", (uint64_t)vcpu * CPU_PERIOD_US, CPU_PERIOD_US);
        return n < 0 || (size_t)n >= len ? -ENOBUFS : 0;
}

bool cgroup_name_valid(const char *name, bool allow_slash) {
        if (!name || !*name || strlen(name) > 200)
                return false;
        const char *comp = name;
        for (const char *c = name;; c++) {
                if (*c == '/' || *c == '\0') {
                        size_t cl = (size_t)(c - comp);
                        if (cl == 0 || (cl == 1 && comp[0] == '.') || (cl == 2 && comp[0] == '.' && comp[1] == '.'))
                                return false;
                        if (*c == '\0')
                                return true;
                        if (!allow_slash)
                                return false;
                        comp = c + 1;
                        continue;
                }
                if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                      *c == '_' || *c == '-' || *c == '.'))
                        return false;
        }
}

void cgroup_layout_done(CgroupLayout *l) {
        if (!l)
                return;
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++) {
                free(l->hier[i]);
                l->hier[i] = NULL;
        }
}

int cgroup_layout_detect(const char *root, CgroupLayout *ret) {
        CgroupLayout l = {};
        char p[PATH_MAX];

        if (file_exists_in(root, "cgroup.controllers")) {
                l.v2 = true;
                l.hier[CGROUP_UNIFIED] = strdup(root);
                if (!l.hier[CGROUP_UNIFIED])
                        return -ENOMEM;
                *ret = l;
                return 0;
        }
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++) {
                if (snprintf(p, sizeof p, "%s/%s", root, v1_names[i]) >= (int)sizeof p) {
                        cgroup_layout_done(&l);
                        return -ENAMETOOLONG;
                }
                /* A mounted hierarchy always has cgroup.procs. */
                if (!file_exists_in(p, "cgroup.procs"))
                        continue;
                if (i == CGROUP_UNIFIED && !file_exists_in(p, "cgroup.controllers"))
                        continue;
                l.hier[i] = strdup(p);
                if (!l.hier[i]) {
                        cgroup_layout_done(&l);
                        return -ENOMEM;
                }
        }
        if (!l.hier[CGROUP_MEMORY] || !l.hier[CGROUP_CPU] || !l.hier[CGROUP_PIDS]) {
                cgroup_layout_done(&l);
                return -ENOENT;
        }
        *ret = l;
        return 0;
}

void cgroup_free(Cgroup *cg) {
        if (!cg)
                return;
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++)
                free(cg->dir[i]);
        free(cg);
}

/* Enables the controllers a sandbox needs on every level from the v2 root
 * down to (and including) `parent`. Errors are left to set_limits, which
 * finds the knob missing. */
static void v2_enable_controllers(const char *root, const char *parent) {
        char p[PATH_MAX];
        static const char *const ctrls[] = {"+memory", "+cpu", "+pids"};
        size_t rl = strlen(root);
        if (rl + 1 + strlen(parent) >= sizeof p)
                return;
        memcpy(p, root, rl + 1);
        for (size_t k = 0; k < ELEMENTSOF(ctrls); k++)
                (void)write_in(p, "cgroup.subtree_control", ctrls[k]);
        const char *s = parent;
        while (*s) {
                const char *e = strchr(s, '/');
                size_t n = e ? (size_t)(e - s) : strlen(s);
                size_t cur = strlen(p);
                p[cur] = '/';
                memcpy(p + cur + 1, s, n);
                p[cur + 1 + n] = '\0';
                for (size_t k = 0; k < ELEMENTSOF(ctrls); k++)
                        (void)write_in(p, "cgroup.subtree_control", ctrls[k]);
                s += n;
                if (*s == '/')
                        s++;
        }
}

static int mkdir_parents(char *path, mode_t mode) {
        for (char *s = strchr(path + 1, '/'); s; s = strchr(s + 1, '/')) {
                *s = '\0';
                int r = mkdir(path, mode);
                *s = '/';
                if (r < 0 && errno != EEXIST)
                        return -errno;
        }
        if (mkdir(path, mode) < 0 && errno != EEXIST)
                return -errno;
        return 0;
}

/* A v1 cpuset cgroup takes no task until cpuset.cpus and cpuset.mems are
 * set: each level made below the hierarchy's root gets its parent's. */
static int cpuset_inherit(const char *root, const char *dir) {
        size_t root_len = strlen(root), len = strlen(dir);
        if (len >= PATH_MAX || strncmp(dir, root, root_len) != 0 || dir[root_len] != '/')
                return -EINVAL;
        static const char *const files[] = {"cpuset.cpus", "cpuset.mems"};
        size_t parent_end = root_len; /* dir[0..parent_end) is the level above */
        for (size_t i = root_len + 1; i <= len; i++) {
                if (dir[i] != '/' && dir[i] != '\0')
                        continue;
                char parent[PATH_MAX], child[PATH_MAX];
                memcpy(parent, dir, parent_end);
                parent[parent_end] = '\0';
                memcpy(child, dir, i);
                child[i] = '\0';
                for (size_t f = 0; f < ELEMENTSOF(files); f++) {
                        char value[1024];
                        if (read_in(child, files[f], value, sizeof value) >= 0 && value[0] && value[0] != '\n')
                                continue;
                        int r = read_in(parent, files[f], value, sizeof value);
                        if (r >= 0)
                                r = write_in(child, files[f], value);
                        if (r < 0)
                                return r;
                }
                parent_end = i;
        }
        return 0;
}

int cgroup_new(const CgroupLayout *l, const char *parent, const char *id, bool create, Cgroup **ret) {
        if (!cgroup_name_valid(id, false) || (parent && *parent && !cgroup_name_valid(parent, true)))
                return -EINVAL;
        Cgroup *cg = calloc(1, sizeof *cg);
        if (!cg)
                return -ENOMEM;
        cg->v2 = l->v2;
        if (l->v2 && create)
                v2_enable_controllers(l->hier[CGROUP_UNIFIED], parent ? parent : "");
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++) {
                if (!l->hier[i])
                        continue;
                char *d;
                if (asprintf(&d, "%s/%s%s%s", l->hier[i], parent && *parent ? parent : "",
                             parent && *parent ? "/" : "", id) < 0) {
                        cgroup_free(cg);
                        return -ENOMEM;
                }
                cg->dir[i] = d;
                if (create) {
                        int r = mkdir_parents(d, 0755);
                        if (r >= 0 && i == CGROUP_CPUSET)
                                r = cpuset_inherit(l->hier[i], d);
                        if (r < 0) {
                                (void)cgroup_remove(cg);
                                cgroup_free(cg);
                                return r;
                        }
                }
        }
        *ret = cg;
        return 0;
}

int cgroup_set_limits(Cgroup *cg, const CgroupLimits *lim) {
        char buf[64];
        int r;
        if (cg->v2) {
                const char *d = cg->dir[CGROUP_UNIFIED];
                if (lim->memory_bytes)
                        snprintf(buf, sizeof buf, "%" PRIu64, lim->memory_bytes);
                else
                        snprintf(buf, sizeof buf, "max");
                r = write_in(d, "memory.max", buf);
                if (r < 0)
                        return r;
                /* No swap: a sandbox's memory limit is its memory. */
                r = write_in(d, "memory.swap.max", "0");
                if (r < 0 && r != -ENOENT)
                        return r;
                r = cgroup_format_cpu_max(lim->vcpu, buf, sizeof buf);
                if (r < 0)
                        return r;
                r = write_in(d, "cpu.max", buf);
                if (r < 0)
                        return r;
                if (lim->pids_max)
                        snprintf(buf, sizeof buf, "%" PRIu64, lim->pids_max);
                else
                        snprintf(buf, sizeof buf, "max");
                return write_in(d, "pids.max", buf);
        }

        const char *mem = cg->dir[CGROUP_MEMORY];
        if (lim->memory_bytes)
                snprintf(buf, sizeof buf, "%" PRIu64, lim->memory_bytes);
        else
                snprintf(buf, sizeof buf, "-1");
        bool memsw = file_exists_in(mem, "memory.memsw.limit_in_bytes");
        r = write_in(mem, "memory.limit_in_bytes", buf);
        if (r == -EINVAL && memsw) {
                /* Raising the limit above the current memsw limit: memsw first. */
                r = write_in(mem, "memory.memsw.limit_in_bytes", buf);
                if (r >= 0)
                        r = write_in(mem, "memory.limit_in_bytes", buf);
        }
        if (r < 0)
                return r;
        if (memsw) {
                r = write_in(mem, "memory.memsw.limit_in_bytes", buf);
                if (r < 0)
                        return r;
        }
        /* Keep the kernel's OOM killer on: a sandbox over its limit loses a
         * process, it is not left hanging in the OOM wait queue. */
        if (file_exists_in(mem, "memory.oom_control"))
                (void)write_in(mem, "memory.oom_control", "0");

        const char *cpu = cg->dir[CGROUP_CPU];
        snprintf(buf, sizeof buf, "%u", CPU_PERIOD_US);
        r = write_in(cpu, "cpu.cfs_period_us", buf);
        if (r < 0)
                return r;
        if (lim->vcpu)
                snprintf(buf, sizeof buf, "%" PRIu64, (uint64_t)lim->vcpu * CPU_PERIOD_US);
        else
                snprintf(buf, sizeof buf, "-1");
        r = write_in(cpu, "cpu.cfs_quota_us", buf);
        if (r < 0)
                return r;

        if (lim->pids_max)
                snprintf(buf, sizeof buf, "%" PRIu64, lim->pids_max);
        else
                snprintf(buf, sizeof buf, "max");
        return write_in(cg->dir[CGROUP_PIDS], "pids.max", buf);
}

/* v2: "+cpuset" in cgroup.subtree_control of every level above dir that is
 * in the cgroup tree (has cgroup.controllers), from the top down. */
static int v2_enable_cpuset_above(const char *dir) {
        size_t len = strlen(dir);
        if (len >= PATH_MAX)
                return -ENAMETOOLONG;
        int ret = -ENOENT;
        for (size_t i = 1; i < len; i++) {
                if (dir[i] != '/')
                        continue;
                char level[PATH_MAX];
                memcpy(level, dir, i);
                level[i] = '\0';
                if (!file_exists_in(level, "cgroup.controllers"))
                        continue;
                int r = write_in(level, "cgroup.subtree_control", "+cpuset");
                if (r < 0)
                        return r;
                ret = 0;
        }
        return ret;
}

int cgroup_set_cpus(Cgroup *cg, const char *cpus) {
        const char *d = cg->v2 ? cg->dir[CGROUP_UNIFIED] : cg->dir[CGROUP_CPUSET];
        if (!d)
                return -ENOENT;
        if (cg->v2) {
                int r = v2_enable_cpuset_above(d);
                if (r < 0)
                        return r;
        }
        char parent_cpus[1024];
        if (!cpus) {
                char parent[PATH_MAX];
                const char *slash = strrchr(d, '/');
                if (!slash || slash == d || (size_t)(slash - d) >= sizeof parent)
                        return -EINVAL;
                memcpy(parent, d, (size_t)(slash - d));
                parent[slash - d] = '\0';
                /* v2's cpuset.cpus of a level may be empty (all of its
                 * parent's); the effective set is what its members get. */
                int r = read_in(parent, cg->v2 ? "cpuset.cpus.effective" : "cpuset.cpus", parent_cpus,
                                sizeof parent_cpus);
                if (r < 0)
                        return r;
                parent_cpus[strcspn(parent_cpus, "\n")] = '\0';
                if (!parent_cpus[0])
                        return -ENOENT;
                cpus = parent_cpus;
        }
        if (!cpus[0] || strspn(cpus, "0123456789,-") != strlen(cpus))
                return -EINVAL;
        return write_in(d, "cpuset.cpus", cpus);
}

/* Opens for writing, in each hierarchy of cg, the file that takes a pid:
 * cgroup.procs, or with tasks set the v1 hierarchies' tasks file (the v2
 * tree, or a hybrid host's v2 mount, has none). */
static int open_in_each(Cgroup *cg, int *fds, size_t n, bool tasks) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
                fds[i] = -1;
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++) {
                if (!cg->dir[i])
                        continue;
                if (k >= n) {
                        cgroup_close_fds(fds, n);
                        return -ENOBUFS;
                }
                const char *file = tasks && i != CGROUP_UNIFIED ? "tasks" : "cgroup.procs";
                char p[PATH_MAX];
                if (snprintf(p, sizeof p, "%s/%s", cg->dir[i], file) >= (int)sizeof p) {
                        cgroup_close_fds(fds, n);
                        return -ENAMETOOLONG;
                }
                fds[k] = open(p, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
                if (fds[k] < 0) {
                        int r = -errno;
                        cgroup_close_fds(fds, n);
                        return r;
                }
                k++;
        }
        return 0;
}

int cgroup_open_procs(Cgroup *cg, int *fds, size_t n) {
        return open_in_each(cg, fds, n, false);
}

int cgroup_join_fds(const int *fds, size_t n) {
        for (size_t i = 0; i < n; i++) {
                if (fds[i] < 0)
                        continue;
                if (write(fds[i], "0", 1) != 1)
                        return -errno;
        }
        return 0;
}

void cgroup_close_fds(int *fds, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (fds[i] >= 0) {
                        close(fds[i]);
                        fds[i] = -1;
                }
}

int cgroup_add_pid(Cgroup *cg, pid_t pid) {
        char buf[32];
        snprintf(buf, sizeof buf, "%d", (int)pid);
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++) {
                if (!cg->dir[i])
                        continue;
                int r = write_in(cg->dir[i], "cgroup.procs", buf);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The hierarchy whose cgroup.procs is read to find members. */
static const char *procs_dir(Cgroup *cg) {
        static const CgroupHier order[] = {CGROUP_UNIFIED, CGROUP_PIDS, CGROUP_MEMORY, CGROUP_FREEZER, CGROUP_CPU};
        for (size_t i = 0; i < ELEMENTSOF(order); i++)
                if (cg->dir[order[i]] && access(cg->dir[order[i]], F_OK) == 0)
                        return cg->dir[order[i]];
        return NULL;
}

/* Calls fn for every pid in cgroup.procs of every present hierarchy (a
 * process may have been moved into only some of them). Returns the count. */
static int for_each_proc(Cgroup *cg, void (*fn)(pid_t)) {
        int count = 0;
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++) {
                if (!cg->dir[i])
                        continue;
                char p[PATH_MAX];
                if (snprintf(p, sizeof p, "%s/cgroup.procs", cg->dir[i]) >= (int)sizeof p)
                        continue;
                _cleanup_fclose_ FILE *f = fopen(p, "re");
                if (!f)
                        continue;
                char line[32];
                while (fgets(line, sizeof line, f)) {
                        long v = strtol(line, NULL, 10);
                        if (v <= 0 || v > INT_MAX)
                                continue;
                        count++;
                        if (fn)
                                fn((pid_t)v);
                }
                if (i == CGROUP_UNIFIED && cg->v2)
                        break;
        }
        return count;
}

int cgroup_count_procs(Cgroup *cg) {
        return for_each_proc(cg, NULL);
}

static void kill_pid(pid_t pid) {
        (void)kill(pid, SIGKILL);
}

static void sleep_ms(long ms) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

static int set_frozen(Cgroup *cg, bool frozen) {
        if (cg->v2)
                return write_in(cg->dir[CGROUP_UNIFIED], "cgroup.freeze", frozen ? "1" : "0");
        if (cg->dir[CGROUP_FREEZER])
                return write_in(cg->dir[CGROUP_FREEZER], "freezer.state", frozen ? "FROZEN" : "THAWED");
        return -ENOENT;
}

/* Whether the freezer says every task is frozen: v2's cgroup.events
 * "frozen 1", v1's freezer.state "FROZEN" (it reads FREEZING while a task
 * is still on its way, e.g. in an uninterruptible sleep). */
static bool is_frozen(Cgroup *cg) {
        char buf[512];
        uint64_t v;
        if (cg->v2)
                return read_in(cg->dir[CGROUP_UNIFIED], "cgroup.events", buf, sizeof buf) >= 0 &&
                       cgroup_parse_keyed(buf, "frozen", &v) >= 0 && v == 1;
        return read_in(cg->dir[CGROUP_FREEZER], "freezer.state", buf, sizeof buf) >= 0 &&
               strncmp(buf, "FROZEN", 6) == 0;
}

int cgroup_freeze(Cgroup *cg, bool frozen, int timeout_ms) {
        int r = set_frozen(cg, frozen);
        if (r < 0 || !frozen)
                return r;
        int64_t deadline = (int64_t)time_now_mono_ms() + timeout_ms;
        for (unsigned round = 0; !is_frozen(cg); round++) {
                if ((int64_t)time_now_mono_ms() >= deadline) {
                        (void)set_frozen(cg, false);
                        return -ETIMEDOUT;
                }
                sleep_ms(round < 20 ? 1 : 10);
        }
        return 0;
}

int cgroup_kill_all(Cgroup *cg, int timeout_ms) {
        int64_t deadline = (int64_t)time_now_mono_ms() + timeout_ms;
        const char *u = cg->dir[CGROUP_UNIFIED];
        bool have_kill = u && file_exists_in(u, "cgroup.kill");

        for (unsigned round = 0;; round++) {
                if (cgroup_count_procs(cg) == 0)
                        return 0;
                if ((int64_t)time_now_mono_ms() >= deadline)
                        return -ETIMEDOUT;
                if (have_kill && write_in(u, "cgroup.kill", "1") >= 0) {
                        /* cgroup.kill reaches every member atomically,
                         * forks in flight included. A v1 hierarchy may
                         * still hold a process that joined only there. */
                        (void)for_each_proc(cg, kill_pid);
                        /* A paused sandbox's tasks sleep in the freezer
                         * with the SIGKILL pending until thawed. */
                        (void)set_frozen(cg, false);
                } else {
                        /* Frozen, nobody can fork between reading
                         * cgroup.procs and the kill; SIGKILL takes effect
                         * once thawed. */
                        bool frozen = set_frozen(cg, true) >= 0;
                        (void)for_each_proc(cg, kill_pid);
                        if (frozen)
                                (void)set_frozen(cg, false);
                }
                sleep_ms(round < 10 ? 2 : 10);
        }
}

int cgroup_remove(Cgroup *cg) {
        int ret = 0;
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++) {
                if (!cg->dir[i])
                        continue;
                int r = 0;
                /* An rmdir right after the last task died can see EBUSY
                 * while the kernel finishes the exit. */
                for (int tries = 0; tries < 200; tries++) {
                        r = rmdir(cg->dir[i]) < 0 ? -errno : 0;
                        if (r != -EBUSY)
                                break;
                        sleep_ms(5);
                }
                if (r < 0 && r != -ENOENT && ret == 0)
                        ret = r;
        }
        return ret;
}

int cgroup_read_stats(Cgroup *cg, CgroupStats *ret) {
        CgroupStats s = {};
        char buf[4096];
        uint64_t v;

        if (cg->v2) {
                const char *d = cg->dir[CGROUP_UNIFIED];
                if (access(d, F_OK) < 0)
                        return -errno;
                if (read_in(d, "cpu.stat", buf, sizeof buf) >= 0 && cgroup_parse_keyed(buf, "usage_usec", &v) >= 0)
                        s.cpu_usage_ns = v * 1000;
                if (read_u64_in(d, "memory.current", &v) >= 0)
                        s.memory_bytes = v;
                if (read_u64_in(d, "memory.peak", &v) >= 0)
                        s.memory_peak_bytes = v;
                if (read_u64_in(d, "pids.current", &v) >= 0)
                        s.pids_current = v;
                if (read_in(d, "memory.events", buf, sizeof buf) >= 0 && cgroup_parse_keyed(buf, "oom_kill", &v) >= 0)
                        s.oom_kills = v;
        } else {
                if (!cg->dir[CGROUP_MEMORY] || access(cg->dir[CGROUP_MEMORY], F_OK) < 0)
                        return -ENOENT;
                if (read_u64_in(cg->dir[CGROUP_CPUACCT], "cpuacct.usage", &v) >= 0)
                        s.cpu_usage_ns = v;
                if (read_u64_in(cg->dir[CGROUP_MEMORY], "memory.usage_in_bytes", &v) >= 0)
                        s.memory_bytes = v;
                if (read_u64_in(cg->dir[CGROUP_MEMORY], "memory.max_usage_in_bytes", &v) >= 0)
                        s.memory_peak_bytes = v;
                if (read_u64_in(cg->dir[CGROUP_PIDS], "pids.current", &v) >= 0)
                        s.pids_current = v;
                if (read_in(cg->dir[CGROUP_MEMORY], "memory.oom_control", buf, sizeof buf) >= 0 &&
                    cgroup_parse_keyed(buf, "oom_kill", &v) >= 0)
                        s.oom_kills = v;
        }
        if (s.memory_peak_bytes < s.memory_bytes)
                s.memory_peak_bytes = s.memory_bytes;
        *ret = s;
        return 0;
}

bool cgroup_exists(Cgroup *cg) {
        return procs_dir(cg) != NULL;
}

const char *cgroup_dir(const Cgroup *cg, CgroupHier h) {
        return h >= 0 && h < _CGROUP_HIER_MAX ? cg->dir[h] : NULL;
}

int cgroup_new_child(const Cgroup *cg, const char *name, bool create, Cgroup **ret) {
        if (!cgroup_name_valid(name, false))
                return -EINVAL;
        Cgroup *child = calloc(1, sizeof *child);
        if (!child)
                return -ENOMEM;
        child->v2 = cg->v2;
        for (size_t i = 0; i < _CGROUP_HIER_MAX; i++) {
                if (!cg->dir[i])
                        continue;
                if (asprintf(&child->dir[i], "%s/%s", cg->dir[i], name) < 0) {
                        child->dir[i] = NULL;
                        cgroup_free(child);
                        return -ENOMEM;
                }
                if (!create)
                        continue;
                int r = mkdir(child->dir[i], 0755) < 0 && errno != EEXIST ? -errno : 0;
                if (r >= 0 && i == CGROUP_CPUSET)
                        r = cpuset_inherit(cg->dir[i], child->dir[i]);
                if (r < 0) {
                        (void)cgroup_remove(child);
                        cgroup_free(child);
                        return r;
                }
        }
        *ret = child;
        return 0;
}

int cgroup_enable_children(Cgroup *cg) {
        if (!cg->v2)
                return 0;
        static const char *const ctrls[] = {"+memory", "+cpu", "+pids"};
        for (size_t k = 0; k < ELEMENTSOF(ctrls); k++) {
                int r = write_in(cg->dir[CGROUP_UNIFIED], "cgroup.subtree_control", ctrls[k]);
                if (r < 0)
                        return r;
        }
        return 0;
}

int cgroup_set_cpu_weight(Cgroup *cg, unsigned v1_shares, unsigned v2_weight) {
        char buf[32];
        if (cg->v2) {
                snprintf(buf, sizeof buf, "%u", v2_weight);
                return write_in(cg->dir[CGROUP_UNIFIED], "cpu.weight", buf);
        }
        snprintf(buf, sizeof buf, "%u", v1_shares);
        return write_in(cg->dir[CGROUP_CPU], "cpu.shares", buf);
}

int cgroup_open_join(Cgroup *cg, int *fds, size_t n) {
        return open_in_each(cg, fds, n, true);
}

void cgroup_kill_once(Cgroup *cg) {
        const char *u = cg->dir[CGROUP_UNIFIED];
        if (!(u && file_exists_in(u, "cgroup.kill") && write_in(u, "cgroup.kill", "1") >= 0) || !cg->v2)
                (void)for_each_proc(cg, kill_pid);
}
