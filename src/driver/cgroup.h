#pragma once
/*
 * Cgroups managed by the daemon itself, on v2 (unified) and on v1 or hybrid
 * hosts, where crun refuses to run. One sandbox is one cgroup named
 * <parent>/<id> in every hierarchy it needs: memory, cpu, cpuacct, pids and
 * freezer on v1 (plus the v2 mount of a hybrid host, for cgroup.kill), or the
 * one v2 tree.
 *
 * Every function takes the hierarchy root as a directory path so the unit
 * tests can run against a fake tree of plain files.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum CgroupHier {
        CGROUP_MEMORY,
        CGROUP_CPU,
        CGROUP_CPUACCT,
        CGROUP_PIDS,
        CGROUP_FREEZER,
        /* v1 only: at the cpu cgroup's path, for lxcfs's CPU view (namespace.c)
         * and gVisor's CPU count (gvisor.c) */
        CGROUP_CPUSET,
        CGROUP_UNIFIED, /* v2: the whole tree; hybrid v1: the controller-less v2 mount */
        _CGROUP_HIER_MAX,
} CgroupHier;

typedef struct CgroupLayout {
        bool v2; /* pure v2: everything in hier[CGROUP_UNIFIED] */
        /* Mount point of each hierarchy, NULL when absent. */
        char *hier[_CGROUP_HIER_MAX];
} CgroupLayout;

typedef struct Cgroup Cgroup;

typedef struct CgroupLimits {
        uint64_t memory_bytes; /* 0: no limit */
        unsigned vcpu;         /* 0: no quota */
        uint64_t pids_max;     /* 0: no limit */
} CgroupLimits;

typedef struct CgroupStats {
        uint64_t cpu_usage_ns;
        uint64_t memory_bytes;
        uint64_t memory_peak_bytes;
        uint64_t pids_current;
        uint64_t oom_kills;
} CgroupStats;

/* Reads the layout under `root` ("/sys/fs/cgroup" on a real host): v2 when
 * root itself has cgroup.controllers, else v1 with one directory per
 * controller and an optional v2 mount at root/unified. -ENOENT when neither
 * a v2 root nor the v1 memory/cpu/pids hierarchies are there. */
int cgroup_layout_detect(const char *root, CgroupLayout *ret);
void cgroup_layout_done(CgroupLayout *l);

/* Whether `name` is safe as one cgroup path component (and as a parent made
 * of such components separated by '/'): [A-Za-z0-9_.-], no "." or "..". */
bool cgroup_name_valid(const char *name, bool allow_slash);

/* Creates (create=true) or opens the cgroup parent/id in every hierarchy of
 * the layout. Creating an existing cgroup is not an error (a daemon restart).
 * Opening one that does not exist gives a Cgroup whose operations find
 * nothing to do. On v2 the parent's cgroup.subtree_control gets +memory +cpu
 * +pids. */
int cgroup_new(const CgroupLayout *l, const char *parent, const char *id, bool create, Cgroup **ret);
void cgroup_free(Cgroup *cg);

/* Writes the limits: v1 memory.limit_in_bytes (+ memory.memsw.limit_in_bytes
 * when present, so no swap), cpu.cfs_period_us/cpu.cfs_quota_us, pids.max;
 * v2 memory.max, memory.swap.max=0, cpu.max, pids.max. */
int cgroup_set_limits(Cgroup *cg, const CgroupLimits *lim);

/* The CPUs the cgroup's tasks may run on, `cpus` a list ("0", "0,2-3") or
 * NULL for all of its parent's: v1 cpuset.cpus, v2 cpuset.cpus with the
 * cpuset controller enabled on every level above first. The kernel sets the
 * affinity of every member to the new set at once (v1 and v2), so a widening
 * also undoes any pinning the members did themselves. -ENOENT without a
 * cpuset controller. */
int cgroup_set_cpus(Cgroup *cg, const char *cpus);

/* Opens every cgroup.procs of the cgroup for writing (O_CLOEXEC) into fds
 * (up to n; -1 padded). A forked child joins with cgroup_join_fds(), which is
 * async-signal-safe: it only write()s "0" (the writer itself) into each. */
int cgroup_open_procs(Cgroup *cg, int *fds, size_t n);
int cgroup_join_fds(const int *fds, size_t n);
void cgroup_close_fds(int *fds, size_t n);
/* Moves pid into the cgroup (all hierarchies). */
int cgroup_add_pid(Cgroup *cg, pid_t pid);

int cgroup_read_stats(Cgroup *cg, CgroupStats *ret);
/* Whether the cgroup directory exists in any hierarchy. */
bool cgroup_exists(Cgroup *cg);
/* The sandbox's directory in hierarchy h, NULL when h is absent. */
const char *cgroup_dir(const Cgroup *cg, CgroupHier h);
/* Number of processes in the cgroup, 0 when it is gone. */
int cgroup_count_procs(Cgroup *cg);

/* Freezes (frozen) or thaws every task of the cgroup with the freezer of
 * its layout: v2 cgroup.freeze, v1 freezer.state (a hybrid host's tasks are
 * in both; the v1 freezer is the one every such host has). A freeze waits
 * until the kernel reports every task frozen, and is undone at timeout_ms
 * (-ETIMEDOUT); a thaw returns at once. -ENOENT without a freezer. */
int cgroup_freeze(Cgroup *cg, bool frozen, int timeout_ms);
/* Kills every process of the cgroup: cgroup.kill where the kernel has it,
 * else freeze, SIGKILL every pid of cgroup.procs, thaw, until it is empty or
 * timeout_ms passed (-ETIMEDOUT). A frozen cgroup is thawed after the
 * kill so that its tasks die. */
int cgroup_kill_all(Cgroup *cg, int timeout_ms);
/* rmdir in every hierarchy; retried while the kernel still reports it busy
 * (tasks exiting). Missing directories are fine. */
int cgroup_remove(Cgroup *cg);

/* Pure helpers, exported for the tests. */
/* "quota period" for v2 cpu.max, or "max 100000" for vcpu 0. */
int cgroup_format_cpu_max(unsigned vcpu, char *buf, size_t len);
/* Parses "key value" lines (cpu.stat, memory.events, memory.oom_control) for
 * `key`. -ENOENT when absent. */
int cgroup_parse_keyed(const char *text, const char *key, uint64_t *ret);

/*
 * Child cgroups of a sandbox's cgroup (the namespace driver's "agent" and
 * "work" leaves, docs/drivers.md). The sandbox's cgroup keeps its limits and
 * is what stats, freeze and the views read; kill and removal take the leaves
 * first, since a parent's cgroup.procs does not list its children's
 * processes and a parent with children cannot be removed.
 */
/* The child `name` of cg in every hierarchy cg has. With create, made (a v1
 * cpuset child gets its parent's cpuset.cpus and cpuset.mems); an existing
 * one is not an error. Without, a Cgroup whose operations find nothing to do
 * when it is absent. */
int cgroup_new_child(const Cgroup *cg, const char *name, bool create, Cgroup **ret);
/* v2: lets children of cg have their own memory, cpu and pids limits (cg's
 * cgroup.subtree_control), which the kernel allows only while cg itself
 * holds no process. v1: nothing to do. */
int cgroup_enable_children(Cgroup *cg);
/* The CPU weight of cg against its siblings: v1 cpu.shares (default 1024),
 * v2 cpu.weight (default 100). */
int cgroup_set_cpu_weight(Cgroup *cg, unsigned v1_shares, unsigned v2_weight);
/* Opens, for a process that joins cg by writing "0" from a single thread
 * (a child between fork and exec), each v1 hierarchy's "tasks" (which moves
 * the calling thread without the kernel's global threadgroup lock) and the
 * v2 cgroup.procs, O_CLOEXEC, into fds (up to n; -1 padded). */
int cgroup_open_join(Cgroup *cg, int *fds, size_t n);
/* One SIGKILL to every process of cg (cgroup.kill where the kernel has it,
 * else each pid of cgroup.procs), without waiting or thawing: a frozen
 * process dies once its freezer lets it go. */
void cgroup_kill_once(Cgroup *cg);
