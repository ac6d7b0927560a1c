#pragma once
/*
 * The agent's own protection inside its sandbox, and what its children start
 * with. A command that exhausts the sandbox's memory or pids must end that
 * command, never the agent: the agent asks the kernel to pass it over when
 * choosing an OOM victim, and its children leave that setting (and, in a
 * microVM, the agent's cgroup) behind before they exec.
 */
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The microVM guest's cgroup for everything the agent starts (vm.c makes it
 * with the sandbox's pids limit); the agent stays outside it. */
#define LIMITS_CHILD_CGROUP "/sys/fs/cgroup/sandbox"

/* In the agent at start: oom_score_adj -1000. Where the agent may not lower
 * it (the namespace driver's user namespace) the driver has set it already. */
void limits_protect_agent(void);

/* What every command starts with: the OOM killer takes commands before the
 * agent even where the agent could not lower its own. */
#define LIMITS_CHILD_OOM_SCORE_ADJ "500"

/* At most this many hierarchies (v1 controllers and the v2 mount). */
#define LIMITS_CGROUP_FDS_MAX 16
/* The highest fd number --cgroup-fds takes: the kernel's default ceiling on
 * any process's descriptors (fs.nr_open). The driver hands the agent fds
 * as the daemon numbered them, and a daemon with a few hundred sandboxes
 * holds well over a thousand. */
#define LIMITS_FD_TOP (1 << 20)

/* The namespace driver's "work" cgroup leaf, as fds of its join files open
 * for writing (one per hierarchy, "N,N,..." from --cgroup-fds): every child
 * joins it before it exec's, and the agent stays in its own leaf
 * (docs/drivers.md). Marks them close-on-exec. -EINVAL for a malformed
 * list, -EBADF for an fd that is not open. */
int limits_set_child_cgroup_fds(const char *list);

/* In a forked process that keeps running commands (the sudo gateway):
 * closes every descriptor from `from` up but `keep` (-1: none) and the work
 * leaf's join files, which its own children still need
 * (async-signal-safe). */
void limits_close_fds_keeping_cgroup(int from, int keep);

/* In a process that stays in the work leaf and starts the commands from
 * there (exec.c's launcher): joins the leaf once, as a command would, so
 * that its children are born in it and limits_child_defaults moves them no
 * more. -ENOENT without a leaf, or the first write's error. */
int limits_join_child_cgroup(void);

/* In a forked child before exec (async-signal-safe): oom_score_adj
 * LIMITS_CHILD_OOM_SCORE_ADJ, into LIMITS_CHILD_CGROUP where it exists, and
 * into the work leaf where the agent was given one and the caller is not in
 * it already (_exit(126) when that fails). */
void limits_child_defaults(void);

/* The kernel's count of OOM kills (/proc/vmstat oom_kill), or UINT64_MAX
 * when it cannot be read. */
uint64_t limits_oom_kills(void);

/* Whether a child that ended with wait status `status` was an OOM kill:
 * SIGKILL while the count went up between `before` and now, and not a kill
 * of the agent's own (timeout). */
bool limits_was_oom_kill(int status, bool killed_by_agent, uint64_t before);

/* Memory in use in the whole sandbox as its kernel counts it (/proc/meminfo
 * MemTotal - MemAvailable), in bytes; a negative errno when unreadable. */
int limits_memory_used(uint64_t *ret);

/* The process with the largest resident set, other than the agent (pid 1
 * and the caller), and its process group; -ESRCH when there is none. */
int limits_largest_process(pid_t *ret_pid, pid_t *ret_pgid);

/* The limits a gVisor sandbox shows in gVisor's own cgroupfs, from the
 * driver's --cgroup-view "MEMORY_MIB:VCPU:PIDS" (vcpu 0: no quota). */
typedef struct LimitsView {
        uint64_t memory_mib;
        unsigned vcpu;
        uint64_t pids_max;
} LimitsView;

/* -EINVAL unless `text` is three decimal fields within bounds (memory
 * 16..4194304 MiB, vcpu 0..256, pids 1..4194304). */
int limits_parse_cgroup_view(const char *text, LimitsView *ret);

/* Writes the view into the cgroup directories under `root`
 * ("/sys/fs/cgroup", the container's own cgroups in gVisor's cgroupfs):
 * memory/memory.limit_in_bytes, cpu/cpu.cfs_period_us and cpu.cfs_quota_us,
 * pids/pids.max. What programs read there (the JVM, Go's runtime) is then
 * the sandbox's size; the files are the Sentry's bookkeeping and reach no
 * host cgroup. The first error (-ENOENT where a file is missing). */
int limits_write_cgroup_view(const char *root, const LimitsView *v);

/* gVisor's cgroupfs counts every task of the sandbox against pids.max, the
 * agent's among them: commands run in a cgroup of their own below the view
 * (root/<controller>/LIMITS_VIEW_COMMANDS for memory, cpu and pids, made
 * here), with the view's limits but pids, of which the agent keeps
 * LIMITS_VIEW_AGENT_PIDS for itself and the sudo gateway. A fork bomb at the
 * limit then leaves the agent a fork for the next command. Every child
 * joins it before it execs (limits_child_defaults). The first error; -E2BIG
 * when the join files would not fit. */
#define LIMITS_VIEW_COMMANDS "sandbox"
#define LIMITS_VIEW_AGENT_PIDS(pids) ((pids) / 16 > 16 ? (pids) / 16 : 16)
int limits_make_command_cgroup(const char *root, const LimitsView *v);
