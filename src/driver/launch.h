#pragma once
/*
 * What the namespace and gVisor drivers share: spec checks, the host's
 * cgroup layout, the uid range of an image, the instance they hand to the
 * daemon, and the fork that puts a child into the sandbox's cgroup before it
 * execs.
 */
#include <limits.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct sock_fprog;

#include "driver/cgroup.h"
#include "driver/driver.h"

/* Default pids limit when the spec leaves it 0: a sandbox is never
 * without one. */
#define LAUNCH_DEFAULT_PIDS_MAX 4096u
/* The uid range root inside maps to, when the image does not say. */
#define LAUNCH_DEFAULT_UID_SHIFT 100000u
#define LAUNCH_UID_RANGE 65536u
/* The sandbox user inside (the images' `sandbox`, uid and gid 1000). */
#define LAUNCH_SANDBOX_UID 1000u

struct DriverInstance {
        const Driver *driver;
        char *id;
        char *sandbox_dir;
        Cgroup *cg;
        pid_t pid;   /* bwrap / runsc, our child */
        int pidfd;   /* -1 where the kernel has none */
        bool reaped;
        int status;  /* wait status once reaped */
        bool tmpfs_layer;
        char *runsc_root; /* gVisor: the --root state dir */
        bool adopted; /* started by an earlier daemon: pid is not our child, pidfd says when it ends */
};

/* -EINVAL unless the spec is complete and within bounds. */
int launch_spec_check(const DriverSpec *spec);
/* The host's cgroup layout, detected once ("/sys/fs/cgroup"). */
int launch_cgroup_layout(const CgroupLayout **ret);
/* Creates (or opens) the sandbox's cgroup and, when creating, writes the
 * limits of the spec. */
int launch_cgroup(const DriverSpec *spec, bool create, Cgroup **ret);
/* The CPUs a sandbox of `vcpu` CPUs runs on: `vcpu` of the daemon's own,
 * taken in turn so that sandboxes spread over the host. This is the CPU
 * count the sandbox sees (namespace: nproc and sched_getaffinity, with
 * lxcfs's view of the cgroup's quota in /proc/cpuinfo and /proc/stat;
 * gVisor: the CPUs its kernel is made with). The quota, not the affinity,
 * bounds the CPU time. false: no pinning (vcpu 0, or at least as many as
 * the host has). */
bool launch_pick_cpus(unsigned vcpu, cpu_set_t *ret);
/* The host uid that owns image_dir/rootfs: root inside maps to it. */
int launch_image_owner(const DriverSpec *spec, uid_t *ret);

/* Moves fd to a number >= 3 (so dup2 onto 0..2 in a child cannot clobber
 * it), keeping O_CLOEXEC. */
int launch_fd_above_stdio(int *fd);

typedef struct LaunchFds {
        int stdin_fd, stdout_fd, stderr_fd; /* stderr_fd -1: as pre_exec left it */
        const int *keep; /* fds passed on to the program (cloexec cleared) */
        size_t n_keep;
        const int *cgroup_fds; /* from cgroup_open_procs */
        size_t n_cgroup_fds;
        /* When set_ids: the host uid/gid the program runs as (after joining
         * the cgroup, which needs root), with no supplementary groups. */
        bool set_ids;
        /* Runs in the child, as root, after joining the cgroup and before
         * set_ids; async-signal-safe calls only. Non-zero fails the child. */
        int (*pre_exec)(void *userdata);
        void *userdata;
        uid_t uid;
        gid_t gid;
        /* With set_ids: the supplementary groups (none when n_groups is 0). */
        const gid_t *groups;
        size_t n_groups;
        /* A seccomp filter installed, with no_new_privs, as the last step
         * before exec; NULL for none. Built before the fork: building one
         * allocates, which a forked child of the threaded daemon must not. */
        const struct sock_fprog *seccomp;
} LaunchFds;

/* fork(); the child joins the cgroup, leaves the daemon's session, resets
 * signal state, sets up stdio and execs argv[0] with envp. Only
 * async-signal-safe calls between fork and exec (the daemon is threaded).
 * Whether the exec happened comes back on a status pipe: a negative errno
 * when the child failed before it, so that the program's own exit codes
 * mean only what the program says. */
int launch_spawn(char *const argv[], char *const envp[], const LaunchFds *fds, pid_t *ret_pid);

/* Waits for the child with a deadline; 0 once reaped (status in *ret),
 * -ETIMEDOUT. */
int launch_wait(pid_t pid, int timeout_ms, int *ret_status);
/* The same, but a child still there at the deadline is killed and reaped:
 * -ETIMEDOUT then. */
int launch_wait_or_kill(pid_t pid, int timeout_ms, int *ret_status);

/*
 * The child's mounts (a LaunchFds.pre_exec hook): the sandbox's layer and
 * overlay in a private mount namespace (rootfs_mount_child), then a small
 * tmpfs on LAUNCH_STAGE_DIR holding the overlay root and the agent binary.
 * bwrap and runsc's gofer run as the sandbox's unprivileged host uid and
 * resolve their sources as paths, so they could not search the daemon's 0700
 * directories; the staged copies are bound there by root. Not /tmp: bwrap
 * mounts its own tmpfs over /tmp.
 */
#define LAUNCH_STAGE_DIR "/run"
#define LAUNCH_STAGE_ROOT LAUNCH_STAGE_DIR "/root"
#define LAUNCH_STAGE_AGENT LAUNCH_STAGE_DIR "/agent"
/* Where the daemon binds a volume attached to a running gVisor sandbox
 * (gvisor_live.c): a mount of its own with shared propagation, so that what
 * is mounted under it later reaches runsc's gofer. */
#define LAUNCH_STAGE_LIVE LAUNCH_STAGE_DIR "/live"
struct RootfsLayer;
/* Where each of the spec's mounts is staged, in order. */
extern const char *const launch_stage_mounts_at[DRIVER_MAX_MOUNTS];
typedef struct LaunchStage {
        const struct RootfsLayer *layer;
        const char *agent_src;
        const DriverMount *mounts; /* the spec's: bound at launch_stage_mounts_at */
        size_t n_mounts;
        uid_t mount_owner; /* host uid of the sandbox's user, who gets each mount's root */
        bool live_dir;     /* LAUNCH_STAGE_LIVE made, a shared mount (gVisor's live volumes) */
} LaunchStage;
/* The stage of a plan's spawn (its layer, agent and mounts). */
struct LaunchPlan;
LaunchStage launch_plan_stage(const struct LaunchPlan *p);
int launch_stage_mounts(void *stage);

/* Shared stop/teardown pieces. */
DriverInstance *launch_instance_new(const Driver *d, const DriverSpec *spec);
void launch_instance_free(DriverInstance *inst);
/* The end every start failure and every stop shares, once the processes are
 * gone: waits for the layer to be let go, removes the cgroup, frees inst. */
void launch_release(DriverInstance *inst);
/* Whether the child already exited on its own (reaps it then). */
bool launch_instance_exited(DriverInstance *inst);
/* The reason string for stop(): NULL when it was alive. */
const char *launch_stop_reason(DriverInstance *inst, bool exited_before);
/* Kills the cgroup, reaps the child. */
void launch_kill_and_reap(DriverInstance *inst);
int launch_stats(DriverInstance *inst, DriverStats *ret);
/* Driver.pause/resume for drivers whose every process is in the sandbox's
 * cgroup (bwrap and its children; runsc, its Sentry and gofer): the cgroup
 * freezer. */
int launch_pause(DriverInstance *inst);
int launch_resume(DriverInstance *inst);
/* The launched process (bwrap, runsc) has not exited: its pidfd is not
 * readable. */
bool launch_alive(DriverInstance *inst);
/* Driver.handles, adopt and release for the launched process (bwrap,
 * runsc): its pidfd, its pid and whether the layer is a tmpfs. adopt checks
 * that the pidfd is still that process's, alive, and that the cgroup is
 * there. */
int launch_handles(DriverInstance *inst, int *fds, size_t *n, char *state, size_t state_len);
int launch_adopt(const Driver *d, const DriverSpec *spec, const char *state, int *fds, size_t n,
                 DriverInstance **ret);
void launch_let_go(DriverInstance *inst);
/* The pid a pidfd refers to, from its fdinfo ("Pid:"; -1 once the process
 * is gone): what a later daemon checks a kept pidfd against. */
int launch_pidfd_pid(int pidfd, pid_t *ret);
/* Kills what is left in the spec's cgroup, removes it, unmounts. */
int launch_reap_orphan(const DriverSpec *spec);
/* fn(arg) in a child that entered the mount namespace of pid with "/" as
 * its working directory (setns needs a process of one thread; a live
 * volume's mount and unmount run there). fn makes system calls only and
 * returns 0 or an errno, the child's exit code. 0 or -that errno; -ESRCH
 * when pid's namespace cannot be opened, -EIO when the child did not exit. */
int launch_in_mount_ns(pid_t pid, int (*fn)(void *arg), void *arg);
/* The driver table's snapshot_disk and restore_disk over rootfs.c's layer. */
int launch_snapshot_disk(DriverInstance *inst, const DriverSpec *spec, const char *dest_dir);
int launch_restore_disk(const DriverSpec *spec, const char *snap_dir);

/*
 * A start on the shared launcher, as the namespace and gVisor drivers make
 * it: the plan is built first (launch_plan_new: the checks, the image's
 * owner and the instance; launch_plan_cgroup: the sandbox's cgroup;
 * launch_plan_layer: its writable layer; launch_plan_channel: the agent
 * channel and the cgroup files the child joins through), then carried out
 * by each driver with its own program (bubblewrap's arguments, runsc's
 * bundle) through launch_plan_spawn, and ended by launch_plan_done or, at
 * any step, launch_plan_abort. A driver adds what is its own between the
 * steps (namespace: the agent's cgroup leaves and the user namespace's
 * maps; gVisor: the cgroup view, the bundle and the runsc state).
 */
typedef struct LaunchPlan {
        const DriverSpec *spec;
        DriverInstance *inst;      /* its cg once launch_plan_cgroup ran */
        uid_t shift;               /* the image's owner: root inside maps to it */
        char rootfs[PATH_MAX];     /* the image's root, image_dir/rootfs */
        struct RootfsLayer *layer; /* the writable layer, until the child has mounted it */
        bool layer_created;        /* a new layer: the next one is made ahead, after the start */
        int channel[2];            /* [0] the daemon's end, [1] the child's stdin and stdout */
        int cg_fds[_CGROUP_HIER_MAX]; /* the cgroup's procs files, for the child to join */
        /* Run by launch_plan_abort once the sandbox's processes are killed,
         * before the cgroup and the instance go: the driver's own undoing. */
        void (*after_kill)(struct LaunchPlan *p, void *userdata);
        void *userdata;
        bool live_dir; /* the stage has LAUNCH_STAGE_LIVE */
} LaunchPlan;

/* The checks a start makes before it touches anything: the spec, the
 * driver's program (`tool`, NULL when not installed: the client is told
 * `missing`), the agent binary, the image's owner; then the instance. */
int launch_plan_new(LaunchPlan *p, const Driver *d, const DriverSpec *spec, const char *tool, const char *missing,
                    DriverError *err);
/* The sandbox's cgroup, made with the spec's limits. */
int launch_plan_cgroup(LaunchPlan *p);
/* The sandbox's writable layer over the image's root. */
int launch_plan_layer(LaunchPlan *p);
/* The agent channel (a socketpair, both ends above stdio) and the cgroup's
 * procs files the child joins through. */
int launch_plan_channel(LaunchPlan *p);
/* Carries the plan out: argv's program, started as lf says with the
 * channel on its stdin and stdout in the sandbox's cgroup, staging the
 * layer and the agent unless lf has a pre_exec of its own; then the
 * daemon's holds on the layer and on the child's ends let go. */
int launch_plan_spawn(LaunchPlan *p, char *const argv[], LaunchFds *lf);
/* A start that succeeded: the channel's end and the instance go to the
 * caller, and the next layer is made ahead. */
void launch_plan_done(LaunchPlan *p, int *ret_fd, DriverInstance **ret);
/* A start that failed at any step: everything the plan made is undone. */
void launch_plan_abort(LaunchPlan *p);
