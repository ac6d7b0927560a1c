#pragma once
/* The manager's own parts, shared by its files (sandbox.c: live objects,
 * create, get, stop, delete; sandbox_lifecycle.c: pause, wake, restart,
 * :update, acquire; sandbox_snapshot.c: snapshots and fork;
 * sandbox_maintenance.c: the maintenance and heartbeat threads, recovery;
 * warm_pool.c: the sandboxes started ahead).
 * Nothing outside those files includes it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/manager/events.h"
#include "daemon/manager/samples.h"
#include "daemon/manager/sandbox.h"

#define HELLO_TIMEOUT_MS 30000
/* A key's key.spending_limit_reached events: at most one this often. */
#define SPENDING_EVENT_EVERY_S 60
/* How long a getOrCreate waits for another of the same name (any host's):
 * longer than a create takes, shorter than a client's patience. */
#define GET_OR_CREATE_WAIT_MS 120000
/* The agent heartbeat: a ping every interval; a sandbox whose agent sends
 * nothing at all for the timeout while a ping waits is failed. */
#define HEARTBEAT_INTERVAL_MS 5000
#define HEARTBEAT_TIMEOUT_MS 30000
#define SANDBOX_PIDS_MAX 4096

/* Strings of a DriverSpec, made from a sandbox's row. */
typedef struct SpecPaths {
        char *sandbox_dir;
        char *image_dir;
        char *boot_image_dir; /* a pulled tree's: the built-in default (DriverSpec) */
} SpecPaths;

struct Sandbox {
        Manager *m;
        SpecPaths paths; /* the driver may keep pointers into its spec */
        char id[32];
        char owner[128];
        atomic_int refs;
        pthread_mutex_t lock;
        const Driver *driver;
        DriverInstance *inst; /* under lock */
        Channel *channel;     /* set before the sandbox is live; freed with the last reference */
        SandboxEgress *egress; /* its policy for the proxy; NULL without egress */
        json_t *env; /* under lock: replaced whole by an :update, never changed in place */
        unsigned memory_mib; /* the spec's, for exec results that ran out of it */
        unsigned vcpu;       /* the spec's, for the host's reported use */
        bool running;  /* under lock: live and serving */
        bool stopping; /* under lock: being stopped on purpose */
        bool died;     /* under lock: queued as dead */
        bool paused;   /* under lock: frozen by driver->pause */
        int64_t paused_at_ms, paused_total_ms; /* under lock: monotonic, for sandbox_paused_ms */
        _Atomic bool auto_wake; /* a request to it while paused wakes it */
        _Atomic unsigned idle_pause_s; /* 0: never paused for idleness */
        _Atomic bool run_as_root; /* requests that name no user run as root */
        _Atomic bool pool_kernel; /* its kernel started in the warm pool, not yet handed its owner's env */
        _Atomic int64_t active_ms; /* monotonic ms of the last request that used it */
        pid_t sup_pid;      /* its supervisor's, 0 without one */
        /* Under lock: the connection to a supervisor of version 2 (-1 for
         * none, or version 1's, whose connection is the channel): open while
         * attached, closed to let the agent be detached. */
        int sup_conn;
        _Atomic bool left;  /* let go at the daemon's stop: running on without it */
        char closed_reason[128];
        /* Under lock: why the daemon itself failed the sandbox (heartbeat,
         * an exec that found its agent silent); shown to the client, and
         * never overwritten by the channel closing afterwards. */
        char fail_reason[128];
        /* The sampler's, touched by the maintenance thread alone: its
         * reading before (sample_mono_ms 0: none yet). */
        int64_t sample_mono_ms;
        uint64_t sample_cpu_ns, sample_net_in, sample_net_out;
        /* Its newest reading, for /metrics (sampled: there is one). */
        _Atomic bool sampled;
        _Atomic uint64_t last_cpu_ns, last_memory, last_disk, last_net_in, last_net_out;
        Sandbox *next;      /* live list, under m->lock */
        Sandbox *next_dead; /* dead queue, under m->lock */
};


typedef struct WarmPool WarmPool;
typedef struct PoolEntry PoolEntry;

/* Ids with a lifecycle operation in progress: operations on one sandbox run
 * one at a time, on different sandboxes concurrently. */
typedef struct BusyId {
        char id[160]; /* a sandbox's id, or "owner/<owner>" for a get-or-create of that owner */
        struct BusyId *next;
} BusyId;


struct Manager {
        const DaemonConfig *cfg;
        Db *db;
        Ledger *ledger; /* metering, reservations; NULL: nothing is billed */
        EgressService *egress; /* NULL: sandboxes have no egress at all */
        SnapshotStore *snapshots; /* NULL: no snapshots */
        Uploads *uploads;         /* NULL: none kept */
        pthread_mutex_t lock; /* live, dead, busy, quit */
        pthread_cond_t cond;  /* busy ids released; the maintenance thread woken */
        Sandbox *live;
        Sandbox *dead;
        BusyId *busy;
        bool quit;
        bool thread_started;
        pthread_t thread;
        bool beat_started;
        pthread_t beat_thread; /* the ledger's heartbeat, apart so that no slow stop delays it */
        int64_t hb_interval_ms;
        int64_t hb_timeout_ms; /* 0: each driver's own */
        char host_id[64];      /* the host whose sandboxes these are (manager_set_host) */
        Events *events;        /* NULL: none recorded */
        Samples *samples;      /* NULL: no readings kept */
        ManagerAdoptFn adopt_fn; /* the kept processes of re-attached sandboxes */
        void *adopt_userdata;
        ManagerWarmFn warm_fn; /* the warm pool's kernel start; NULL: none */
        void *warm_userdata;
        int64_t sample_interval_ms;
        int64_t last_sample_ms; /* monotonic; the maintenance thread's */
        WarmPool *pool;         /* NULL: no --warm-pool; set before the API serves */
        struct Volumes *volumes; /* NULL: no volumes */
};


/* Runs op on the row of an owned sandbox under the id's lifecycle lock and
 * answers the sandbox afterwards. */
typedef int (*RowOp)(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e);
void spec_paths_done(SpecPaths *p);
void sandbox_unref(Sandbox *sb);
Sandbox *live_take(Manager *m, const char *id);
void busy_begin(Manager *m, const char *id);
void busy_end(Manager *m, const char *id);
void queue_dead(Sandbox *sb);
const char *live_stop(Sandbox *sb);
int spec_paths(Manager *m, const char *id, const char *image, SpecPaths *ret);
void driver_spec_from(Manager *m, const char *id, const SandboxSpec *spec, const SpecPaths *p,
        DriverSpec *ds);
int own_row(Manager *m, const KeyInfo *key, const char *id, SandboxRow *ret, SandboxError *e);
int set_reason(SandboxRow *r, const char *reason);
void disk_series(const char *id, char *buf, size_t n);
void row_end_pause(Manager *m, SandboxRow *r, int64_t end, int64_t now);
int row_finish(Manager *m, SandboxRow *r, SandboxState state, const char *reason);
const char *failure_text(const char *driver_why, const char *fail_reason, const char *channel_reason,
        char *buf, size_t n);
int do_stop_locked(Manager *m, SandboxRow *row, SandboxState state, const char *reason);
int do_delete_locked(Manager *m, SandboxRow *row, const char *rid);
void dollars(char *buf, size_t n, int64_t micros);
int budget_refusal(SandboxError *e, uint64_t per_hour, int64_t seconds, uint64_t spent, uint64_t cap,
        const char *cap_name, const char *what);
/* The 402 of a refused reservation, and the key's event that it reached its
 * limit (at most one a minute per key: a client retrying in a loop makes
 * no flood of them). sandbox_id: what it was for, or NULL. */
int spending_refusal(Manager *m, SandboxError *e, const LedgerRefusal *f, const char *owner, const char *key_id,
                     const char *sandbox_id);
json_t *spec_sandbox_env(Manager *m, const char *owner, const SandboxSpec *spec);
int boot_locked(Manager *m, SandboxRow *row, const Driver *d, int64_t lease_seconds, const char *rid,
        SandboxError *e);
int with_row(Manager *m, const KeyInfo *key, const char *id, RowOp op, void *arg, const char *rid,
        SandboxRow *ret, SandboxError *e);
int reserve_life(Manager *m, SandboxRow *row, uint64_t per_hour, int64_t life, int64_t new_end, int64_t now,
        const char *rid, SandboxError *e);
void append_console_tail(const Sandbox *sb, char *text, size_t n);
void handle_dead(Manager *m, Sandbox *sb);
Sandbox *live_get(Manager *m, const char *id);
int conflict_state(SandboxError *e, const SandboxRow *row, const char *wanted, const char *hint);
void pause_by_daemon(Manager *m, SandboxRow *row, const char *why);
void idle_check(Manager *m, Sandbox *sb, int64_t now_ms);
void guest_sync(Manager *m, const char *id, const char *rid, int timeout_ms, const char *before);
/* sandbox_volumes.c: 0 when the spec's volumes may go to sandbox_id on
 * driver d beside the sandboxes whose drivers hold them now; a 409 naming
 * the volume and the holder when a guest kernel and the host's would have
 * one at once, or two guests with a writer among them (volumes.md, "On the
 * microVM"). The store's one-writer claim is apart from this. */
int sandbox_volumes_check_kernels(Manager *m, const char *sandbox_id, const SandboxSpec *spec, const Driver *d,
                                  SandboxError *e);
/* Sandbox objects made the same way by a boot and a re-attach. */
Sandbox *sandbox_alloc(Manager *m, const SandboxRow *row, const Driver *d);
void live_add(Manager *m, Sandbox *sb);
void on_channel_closed(void *userdata, const char *reason);
/* sandbox_restore.c: takes a sandbox an earlier daemon left running over
 * from its supervisor (0), or says why not (and leaves nothing of it live);
 * lets a supervised sandbox go at the daemon's stop (false: it is stopped
 * instead). */
int sandbox_reattach(Manager *m, SandboxRow *row, const Driver *d, char *why, size_t why_len);
bool sandbox_let_go(Manager *m, Sandbox *sb);
/* What a sandbox object takes from its row besides its id and paths (its
 * owner, env, user, autoWake and idle time): at its allocation, and when a
 * warm pool's sandbox is handed out. -ENOMEM. */
int sandbox_take_row(Sandbox *sb, const SandboxRow *row);
/* The parts of a boot (sandbox.c), shared with the warm pool's starts and
 * hand-outs. */
int sandbox_launch(Manager *m, Sandbox *sb, const SandboxRow *row, const Driver *d, bool supervised,
                   const char *rid, DriverError *start_err, const char **ret_fail);
int sandbox_go_live(Manager *m, SandboxRow *row, Sandbox *sb, int64_t lease_seconds, const char *rid,
                    const char **ret_fail, int *ret_status);
int sandbox_boot_failed(Manager *m, SandboxRow *row, Sandbox *sb, const char *fail, int fail_status,
                        const char *rid, SandboxError *e);

/* warm_pool.c. A ready sandbox of the pool with driver d and spec's image
 * and shape, out of the pool (a hit), or NULL (a miss when a class has that
 * driver, image and shape; nothing at all without one). */
/* kernel_ok: the caller hands a pool kernel its owner's env (CreateRequest's
 * pool_kernel_ok); without it, sandboxes with one are passed over. */
PoolEntry *warm_pool_take(Manager *m, const Driver *d, const SandboxSpec *spec, bool kernel_ok);
const char *warm_pool_entry_id(const PoolEntry *en);
/* A taken sandbox the create refused before any of it was the owner's (a
 * reservation or a bound said no): ready again, and no hit. NULL: nothing. */
void warm_pool_put_back(Manager *m, PoolEntry *en);
/* Makes a taken sandbox the row's, as boot_locked makes a new one (the row
 * inserted, under busy_begin(row->id), its reservation held): the row's
 * env, user, network policy, secrets and lease given to it, then running
 * and charged from now. en is taken over; on failure the row is failed. */
int warm_pool_hand_out_locked(Manager *m, SandboxRow *row, PoolEntry *en, int64_t lease_seconds, const char *rid,
                              SandboxError *e);
/* Around each client's create: the pool's refills wait for none to run. */
void warm_pool_create_begin(Manager *m);
void warm_pool_create_end(Manager *m);
void warm_pool_marker_remove(Manager *m, const char *id);
/* At recovery: what pool sandboxes a daemon killed mid-way left (their
 * markers) is removed; any there is of this run's pool too. */
void warm_pool_recover(Manager *m);
/* Stops the pool's thread and removes every sandbox it keeps. */
void warm_pool_shutdown(Manager *m);
void warm_pool_free(WarmPool *p);
