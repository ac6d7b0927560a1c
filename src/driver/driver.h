#pragma once
/*
 * An isolation driver: a small table of functions behind which the daemon
 * never asks which driver it holds (crun's cgroup managers, kvmtool's virtio
 * ops). Every driver ends in the same place: runtime-agent running as the
 * sandbox's init with a connected channel.
 *
 * Threading: start/stop/destroy/stats of one instance are called by the
 * daemon under that sandbox's lock; different sandboxes run concurrently, so
 * drivers keep no unlocked global state.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A directory of the host bound into the sandbox: a volume (docs/
 * volumes.md), already mounted on the host by the daemon. dest is checked
 * by the daemon (absolute, normalized, not /, /proc, /sys, /dev, /.runtime).
 * The bind is of source itself, so nothing under it (a symbolic link
 * included) reaches outside it. A driver whose sandbox has a kernel of its
 * own (Driver.volume_images) is given the volume's image file instead, as
 * source, never mounted on the host: the guest's kernel alone parses it. */
typedef struct DriverMount {
        const char *source;
        const char *dest;
        bool read_only;
        /* For a volume_images driver: the image open (read-write unless
         * read_only) holding the volume's lock (volume_disk_hold); the
         * driver hands its VMM a duplicate, which keeps the lock. -1 else. */
        int image_fd;
} DriverMount;

/* The most mounts a sandbox has. */
#define DRIVER_MAX_MOUNTS 4

typedef struct DriverSpec {
        const char *id;          /* sandbox id, [a-z0-9_-]{1,64}; names the cgroup and the dir */
        unsigned vcpu;           /* CPU limit in whole CPUs (cgroup quota) */
        unsigned memory_mib;     /* memory limit (cgroup memory.max / limit_in_bytes) */
        unsigned disk_mib;       /* size bound of the writable layer */
        unsigned pids_max;       /* pids limit */
        const char *image_dir;   /* the image: image_dir/rootfs is the read-only root filesystem */
        /* The microVM: the built-in image whose kernel and root disk boot a
         * tree that has neither (a registry's, whose whole root the
         * sandbox's disk then holds); NULL for image_dir's own. */
        const char *boot_image_dir;
        const char *sandbox_dir; /* per-sandbox dir owned by the driver: writable layer, bundle, logs */
        const char *agent_path;  /* the static runtime-agent binary on the host */
        const char *cgroup_parent; /* cgroup path under each hierarchy, e.g. "runtime" */
        /* Directories bound into the sandbox, up to DRIVER_MAX_MOUNTS; their
         * roots are given to the sandbox's user (uid 1000 inside). A driver
         * that cannot bind them refuses a start with any. */
        const DriverMount *mounts;
        size_t n_mounts;
} DriverSpec;

typedef struct DriverStats {
        uint64_t cpu_usage_ns;
        uint64_t memory_bytes;
        uint64_t memory_peak_bytes;
        uint64_t pids_current;
        uint64_t disk_used_bytes;
        bool oom_killed; /* the cgroup's OOM killer fired at least once */
} DriverStats;

typedef struct DriverInstance DriverInstance; /* opaque, defined by each driver */

/* Why a start failed, in words an API client may read: it becomes the
 * sandbox's failureReason and the create error's message. One short
 * sentence, with what to do where there is something to do; never a host
 * path or an errno string (those belong in the daemon's log). */
typedef struct DriverError {
        char reason[240];
} DriverError;

/* Sets err's reason unless one is set already: the first cause found is the
 * most precise one. err may be NULL. */
__attribute__((format(printf, 2, 3))) void driver_error(DriverError *err, const char *fmt, ...);

/* The name under which a live volume's dest reaches the agent: 16 hex
 * digits of FNV-1a over dest (a sandbox's paths are apart, so their names
 * are too). */
#define DRIVER_LIVE_NAME_LEN 16
static inline void driver_live_name(const char *dest, char out[DRIVER_LIVE_NAME_LEN + 1]) {
        uint64_t h = 14695981039346656037ull;
        for (const unsigned char *p = (const unsigned char *)dest; *p; p++)
                h = (h ^ *p) * 1099511628211ull;
        static const char hex[] = "0123456789abcdef";
        for (int i = DRIVER_LIVE_NAME_LEN - 1; i >= 0; i--, h >>= 4)
                out[i] = hex[h & 15];
        out[DRIVER_LIVE_NAME_LEN] = 0;
}

typedef struct Driver {
        const char *name;
        /* The sandbox's mounts are volume image files, attached as disks of
         * its own kernel, rather than host directories bound in. */
        bool volume_images;
        /* How long a start may take to the agent's HELLO; 0 means 30 s. A
         * guest kernel under software emulation on a loaded host needs more. */
        unsigned hello_timeout_ms;
        /* How long a running sandbox's agent may stay silent while the
         * daemon's heartbeat ping waits for an answer before the sandbox is
         * failed; 0 means 30 s. A guest under software emulation on a loaded
         * host can stall for tens of seconds and still recover, and so can
         * gVisor's agent beside a fork bomb's dying tasks. It is also how long
         * past a command's timeout the agent has to send the command's
         * result (api_exec.c). */
        unsigned heartbeat_timeout_ms;
        /* A file in sandbox_dir where the driver keeps the sandbox's console
         * (a guest kernel's serial output), or NULL. Its last lines end the
         * reason recorded when the sandbox fails. */
        const char *console_log;
        /* Whether this host can run the driver. 0 when usable; 1 when usable
         * only when asked for by name, not by `auto` (the microVM without a
         * working KVM: correct, but software emulation is too slow to be a
         * default); a negative errno when not. `why` (may be NULL) gets a one-line human reason either way,
         * e.g. "runsc 20240212 found, ptrace platform". Must not take longer than
         * a few seconds (the microVM's probe boots a tiny guest with a deadline). */
        int (*probe)(char *why, size_t why_len);
        /* Prepares the writable layer (kept if it exists: a stopped sandbox is
         * started again on its own files), the cgroup, and starts the agent.
         * On success *ret_fd is one bidirectional, blocking, O_CLOEXEC fd (a
         * socket) carrying the channel, and *ret an instance. Errors: -ENOENT
         * image missing, -ENOSPC, -EPERM, ... ; on failure nothing is left running
         * and *err (may be NULL) says why where the driver knows better than
         * the errno. */
        int (*start)(const DriverSpec *spec, int *ret_fd, DriverInstance **ret, DriverError *err);
        /* Kills every process of the sandbox (cgroup-wide), reaps them,
         * unmounts what start mounted, removes the cgroup, frees the instance.
         * Keeps the writable layer. *ret_reason (may be NULL) gets a static
         * string when the sandbox had died on its own: "oom", "exited",
         * "killed", or NULL when it was alive. Never fails; idempotent with
         * NULL. */
        void (*stop)(DriverInstance *inst, const char **ret_reason);
        /* Removes everything the sandbox left on the host, from the spec alone
         * (it works after a daemon restart, when no instance exists): kills any
         * process still in its cgroup, unmounts, removes the cgroup and
         * sandbox_dir. Idempotent. */
        int (*destroy)(const DriverSpec *spec);
        /* Cleans up after a daemon that died: kills processes and removes the
         * cgroup and mounts of a sandbox that was running, keeping its files.
         * Idempotent. */
        int (*reap_orphan)(const DriverSpec *spec);
        int (*stats)(DriverInstance *inst, DriverStats *ret);
        /* Pause: every process of the sandbox stops where it stands, its
         * memory and processes kept, no CPU used, until resume carries on
         * the same processes. The channel stays connected but silent. A
         * pause that cannot finish (a task that will not freeze) is undone
         * and fails (-ETIMEDOUT); resume of a running sandbox is a no-op.
         * stop works on a paused sandbox. NULL where the driver cannot. */
        int (*pause)(DriverInstance *inst);
        int (*resume)(DriverInstance *inst);
        /* Whether the driver's own supervising process (bwrap, runsc, QEMU)
         * is still there. Cheap: the daemon asks every second. A sandbox
         * whose supervisor was killed from outside may still answer on its
         * channel, but it is no longer contained as started: it is failed. */
        bool (*alive)(DriverInstance *inst);
        /* Disk snapshot: writes the sandbox's writable layer (with
         * /workspace) into dest_dir, a new empty directory, as files that
         * restore_disk takes back. inst is the running instance, its
         * processes frozen by pause for the moment of the copy, or NULL for
         * a stopped sandbox. The copy is complete and synced when this
         * returns 0; -ENOSPC when the host's disk fills (dest_dir is then
         * the caller's to remove), -EOPNOTSUPP when the layer cannot be
         * kept (a tmpfs layer). NULL where the driver cannot. */
        int (*snapshot_disk)(DriverInstance *inst, const DriverSpec *spec, const char *dest_dir);
        /* Before the first start of a new sandbox: makes its writable layer
         * from a snapshot's dest_dir, so that start boots on those files
         * (or, from a memory snapshot, resumes the saved machine on them).
         * 0, or DRIVER_DISK_CONVERTED when it first made the snapshot's
         * disk for this driver from another driver's layers (an image built
         * here, on the microVM). */
        int (*restore_disk)(const DriverSpec *spec, const char *snap_dir);
        /* Memory snapshot: writes the running machine (its memory, its
         * devices' state) and its disk, as they stand together, into
         * dest_dir, a new empty directory, as files that restore_disk takes
         * back and the next start resumes. inst is stopped by pause, and
         * its agent's channel is empty both ways (a checkpoint, see
         * channel_checkpoint_begin); it stays stopped. Errors as
         * snapshot_disk's. NULL where the driver cannot. */
        int (*snapshot_memory)(DriverInstance *inst, const DriverSpec *spec, const char *dest_dir);
        /* Live restore (docs/lifecycle.md). What the sandbox's supervisor
         * keeps for a later daemon: up to *n fds (new ones, the caller's to
         * close; the instance keeps its own; *n becomes the count) and a
         * short printable state without spaces. NULL where the driver cannot
         * hand a running sandbox over: its sandboxes stop with the daemon. */
        int (*handles)(DriverInstance *inst, int *fds, size_t *n, char *state, size_t state_len);
        /* A later daemon's instance of a sandbox that kept running, from its
         * spec and what handles gave (the fds are taken over, also on
         * failure). -ESRCH when the sandbox is gone after all, -EBADMSG for
         * a state that is not the driver's. */
        int (*adopt)(const DriverSpec *spec, const char *state, int *fds, size_t n, DriverInstance **ret);
        /* Frees the daemon's part of the instance and leaves the sandbox
         * running, for a later daemon to adopt. */
        void (*release)(DriverInstance *inst);
        /* A volume attached to the running sandbox of spec (inst, under the
         * sandbox's lock): m->source (a host directory) bound at m->dest
         * inside, as a start binds it, its root given to the sandbox's
         * user; for a volume_images driver m->image_fd given to its guest
         * as a disk. name gets the name under which the volume reaches the
         * agent where live_bind_by_agent (16 hex digits, DRIVER_LIVE_NAME_LEN).
         * -ENOTDIR when dest is not a directory there (or a symbolic link
         * is on its way), -ESRCH when the sandbox runs no more, -ENOSPC when
         * the sandbox has no room for another, -ENOSYS when it was started
         * without the means to. unmount_live takes it away again: -EBUSY
         * while files in it are open (never lazily: the volume's one writer
         * must be gone when it returns). NULL where the driver cannot change
         * a running sandbox's mounts. */
        int (*mount_live)(DriverInstance *inst, const DriverSpec *spec, const DriverMount *m,
                          char name[DRIVER_LIVE_NAME_LEN + 1]);
        int (*unmount_live)(DriverInstance *inst, const DriverSpec *spec, const char *dest);
        /* mount_live only brings the volume to the sandbox, under its name;
         * the daemon then asks the agent to put it at dest ("mount"), and
         * to undo that ("unmount") before unmount_live (gVisor, whose kernel
         * is the Sentry's; the microVM, whose kernel is the guest's). */
        bool live_bind_by_agent;
        /* For such a driver: 1 when the volume at dest came through
         * mount_live, 0 when it was given at the start (the driver cannot
         * take that one away while the sandbox runs), or a negative errno. */
        int (*live_held)(DriverInstance *inst, const DriverSpec *spec, const char *dest);
} Driver;


#define DRIVER_DISK_CONVERTED 1

/* The most fds a driver's handles gives (the microVM keeps 5). */
#define DRIVER_MAX_HANDLES 8
#define DRIVER_STATE_MAX 256

extern const Driver driver_namespace;
extern const Driver driver_gvisor;
extern const Driver driver_microvm; /* may be absent until the microVM driver lands */

/* NULL-terminated list of the drivers this build has, in `auto` order of
 * preference (microvm, gvisor, namespace). */
const Driver *const *driver_all(void);
const Driver *driver_by_name(const char *name);
/* The first driver whose probe succeeds, in preference order; *why says why
 * it was chosen and why the ones before it were not. */
const Driver *driver_pick_auto(char *why, size_t why_len);
