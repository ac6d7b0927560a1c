#pragma once
/*
 * The sandbox manager: lifecycle (create, stop, delete, extend), the live
 * sandboxes in memory, lease timers and recovery after a restart. The DB is
 * the truth about every sandbox; a live Sandbox exists only while one runs,
 * and is reference counted: request threads hold a reference while they use
 * its channel, so a stop never frees a channel under them.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/manager/channel.h"
#include "daemon/manager/config.h"
#include "daemon/manager/db.h"
#include "daemon/store/store_keys.h"
#include "daemon/egress/egress_service.h"
#include "daemon/manager/sandbox_error.h"
#include "daemon/model/sandbox_request.h"
#include "daemon/manager/ledger.h"
#include "daemon/manager/snapshot.h"
#include "daemon/manager/uploads.h"

typedef struct Manager Manager;
typedef struct Sandbox Sandbox;

typedef struct Events Events;
typedef struct Samples Samples;
int manager_new(const DaemonConfig *cfg, Db *db, Manager **ret);
/* After a daemon ended: every sandbox the store says was running or paused
 * on this host is re-attached through its supervisor (docs/lifecycle.md,
 * "Live restore"), with the processes its agent kept; one that cannot be
 * (no supervisor, its supervisor or sandbox gone, a wrong answer), and every
 * one caught starting or between states, gets driver->reap_orphan and
 * becomes stopped ("daemon restarted", and why); then leases already due are
 * acted on. */
int manager_recover(Manager *m);
/* Calls fn with each undeleted sandbox of this host; fn may not change
 * them (collect the ids and act after). */
int manager_each_active(Manager *m, StoreSandboxFn fn, void *userdata);
/* Whether sandbox id runs on this host now. */
bool manager_runs(Manager *m, const char *id);
/* Called by manager_recover for each process an agent kept: `kept` is one
 * member of its HELLO's attached.processes (borrowed); sb a reference the
 * callee takes over. */
typedef int (*ManagerAdoptFn)(void *userdata, Sandbox *sb, json_t *kept);
void manager_set_adopter(Manager *m, ManagerAdoptFn fn, void *userdata);
/* Called by the warm pool's thread for each sandbox it has started, before
 * the sandbox is ready to hand out: 0 when it started the sandbox's
 * interpreter kernel (docs/warm-pool.md), which sandbox_has_pool_kernel then
 * says; negative for none (an image without ipykernel). Not called with
 * --no-warm-pool-kernel or --no-interpreter-prestart. */
typedef int (*ManagerWarmFn)(void *userdata, Sandbox *sb, SandboxDriver driver, unsigned memory_mib);
void manager_set_warmer(Manager *m, ManagerWarmFn fn, void *userdata);
/* Whether sb came from the warm pool with its kernel started there, not yet
 * given its owner's env (cleared by sandbox_clear_pool_kernel). */
bool sandbox_has_pool_kernel(Sandbox *sb);
void sandbox_clear_pool_kernel(Sandbox *sb);
/* The host this manager runs sandboxes for: stamped on each new row; the
 * recovery and the lease timer see only its rows. Before manager_recover. */
void manager_set_host(Manager *m, const char *host_id);
/* Where the lifecycle events go (NULL: nowhere). */
void manager_set_events(Manager *m, Events *events);
/* Every live sandbox is read every interval_s seconds and its readings
 * kept in samples (manager/samples.h). */
void manager_set_samples(Manager *m, Samples *samples, int64_t interval_s);
/* The newest reading of each live sandbox of the owner's (NULL: of every
 * owner), at most SAMPLES_SERIES_MAX of them, in Prometheus' text format. */
void manager_render_samples(Manager *m, const char *owner, FILE *f);
/* What this host's live sandboxes hold, for its heartbeat. */
void manager_use(Manager *m, int64_t *ret_vcpu, int64_t *ret_memory_mib, int64_t *ret_sandboxes);
/* Stops every sandbox of this host without writing the store (which is
 * out of reach, or no longer this host's to write); the number stopped. */
int manager_fence(Manager *m);
/* After a fenced host registered again: its rows that still say they hold
 * processes become lost with reason; the number. */
int manager_recover_fenced(Manager *m, const char *reason);
/* The rows of another host (declared dead) that still say they hold
 * processes become lost with reason, billed up to last_seen, its last
 * heartbeat; the number this call marked (another may have marked some). */
int manager_lose_host(Manager *m, const char *host_id, int64_t last_seen, const char *reason);
/* Meters running time into the ledger and holds reservations there (before
 * manager_recover). */
void manager_set_ledger(Manager *m, Ledger *ledger);
/* Gives sandboxes egress through the proxy (before manager_start). */
void manager_set_egress(Manager *m, EgressService *egress);
/* Where snapshots are kept (before manager_start). */
void manager_set_snapshots(Manager *m, SnapshotStore *snapshots);
/* The uploads in parts, dropped with their sandbox (before manager_start). */
void manager_set_uploads(Manager *m, Uploads *uploads);
/* The volumes a create may attach (before the API serves); NULL: none. */
struct Volumes;
void manager_set_volumes(Manager *m, struct Volumes *volumes);
/* The agent heartbeat (before manager_start): a ping every interval_ms
 * (default 5 s); timeout_ms of silence fails a sandbox, for every driver
 * (default: each driver's heartbeat_timeout_ms). 0 keeps a default. */
void manager_set_heartbeat(Manager *m, int64_t interval_ms, int64_t timeout_ms);
/* Starts the thread that acts on lease ends, on sandboxes that died, and on
 * those whose supervisor or agent stopped answering. */
int manager_start(Manager *m);
/* Stops the thread and every running sandbox (state stopped, files kept). */
void manager_shutdown(Manager *m);
void manager_free(Manager *m);

/* A create with getOrCreate: the oldest undeleted sandbox of the key's
 * owner with req->name, made ready to use (a paused one woken, a stopped
 * one booted again from its disk; a failed one is a conflict), or else a
 * new one as sandbox_create makes it. Calls of one owner run one at a time,
 * so that two with one name make one sandbox; other owners' and plain
 * creates do not wait on them. *ret_reused says which it was. */
int sandbox_get_or_create(Manager *m, const KeyInfo *key, const CreateRequest *req, const char *rid,
                          SandboxRow *ret, bool *ret_reused, SandboxError *e);

/* Each call below answers the sandbox's row as it is afterwards (plain
 * data, cleared with sandbox_row_done) or fills e. */
int sandbox_create(Manager *m, const KeyInfo *key, const CreateRequest *req, const char *rid, SandboxRow *ret,
                   SandboxError *e);
int sandbox_get(Manager *m, const KeyInfo *key, const char *id, SandboxRow *ret, SandboxError *e);
/* fn for each undeleted sandbox of the key's owner, newest first. */
int sandbox_list(Manager *m, const KeyInfo *key, StoreSandboxFn fn, void *userdata, SandboxError *e);

/* What :update changes; what is left unset stays. */
typedef struct SandboxUpdate {
        bool set_name;
        const char *name;     /* NULL with set_name: no name */
        json_t *labels;       /* NULL: unchanged; replaces them all */
        json_t *network;      /* NULL: unchanged; normalised */
        const char *on_lease_end; /* "stop", "pause" or "delete"; NULL: unchanged */
        int64_t lease_end;    /* unix seconds; 0: unchanged */
        json_t *env;          /* NULL: unchanged; name -> string sets it, name -> null removes it */
        int auto_wake;        /* -1: unchanged; 0 or 1 */
        int64_t idle_pause_seconds; /* -1: unchanged; 0: never; raised to the daemon's minimum */
        bool set_max_total;
        int64_t max_total_cost_micros; /* with set_max_total; -1: no cap */
        bool set_user;
        bool run_as_root;     /* with set_user: who requests naming no user run as */
} SandboxUpdate;
/* Applies u under the sandbox's lifecycle lock, all or nothing: every
 * check first (pausable, the merged env's bounds, the cap against the
 * sandbox's life to its lease end, the state a lease needs, then a longer
 * lease's reservation against the daily limit), then one write of the row,
 * then name and labels; a live sandbox follows (env, user, autoWake, idle
 * time counted from now, network). */
int sandbox_update(Manager *m, const KeyInfo *key, const char *id, const SandboxUpdate *u, const char *rid,
                   SandboxRow *ret, SandboxError *e);
int sandbox_stop(Manager *m, const KeyInfo *key, const char *id, const char *rid, SandboxRow *ret,
                 SandboxError *e);
int sandbox_delete(Manager *m, const KeyInfo *key, const char *id, const char *rid, SandboxError *e);
int sandbox_extend(Manager *m, const KeyInfo *key, const char *id, int64_t seconds, SandboxRow *ret,
                   SandboxError *e);
/* :pause keeps memory and processes (driver->pause), ends the running
 * charge and opens the disk's; a paused sandbox's lease stands still.
 * :wake carries a paused one on (or boots a stopped or failed one again),
 * with a lease of timeout_seconds (0: what its pause left, else its
 * timeoutSeconds). :restart boots it again from its disk, stopping it
 * first when it runs or is paused. Not-allowed transitions fill e with a
 * conflict that names the state (a wake of one not paused: NOT_PAUSED). */
int sandbox_pause(Manager *m, const KeyInfo *key, const char *id, const char *rid, SandboxRow *ret, SandboxError *e);
int sandbox_wake(Manager *m, const KeyInfo *key, const char *id, int64_t timeout_seconds, const char *rid,
                 SandboxRow *ret, SandboxError *e);
int sandbox_restart(Manager *m, const KeyInfo *key, const char *id, const char *rid, SandboxRow *ret,
                    SandboxError *e);
/* sandbox_get once the sandbox is in `state` (woken by every lifecycle
 * step), or as it is when timeout_ms passes or it is deleted meanwhile. */
int sandbox_wait_state(Manager *m, const KeyInfo *key, const char *id, SandboxState state, int64_t timeout_ms,
                       SandboxRow *ret, SandboxError *e);
/* What a row's paused time has cost at the disk rate, up to now. */
uint64_t sandbox_row_paused_cost(Manager *m, const SandboxRow *row, int64_t now);
/* A volume of the owner's attached to the running (or paused) sandbox id
 * and detached again (sandbox_volumes.c): namespace driver only; a detach
 * with files open in it is refused (409), never lazy. */
int sandbox_volume_attach(Manager *m, const KeyInfo *key, const char *id, const SandboxVolume *v, const char *rid,
                          SandboxError *e);
int sandbox_volume_detach(Manager *m, const KeyInfo *key, const char *id, const char *volume_id, const char *rid,
                          SandboxError *e);
int sandbox_set_network(Manager *m, const KeyInfo *key, const char *id, json_t *network, SandboxRow *ret,
                        SandboxError *e);
/* What a sandbox of this row costs an hour, and its running time so far
 * (never past its lease). */
uint64_t sandbox_row_cost_per_hour(Manager *m, const SandboxRow *row);
int64_t sandbox_row_run_seconds(const SandboxRow *row, int64_t now);
/* What the sandbox has cost up to now: its running time at its rate and
 * its paused time at the disk rate. */
uint64_t sandbox_row_cost(Manager *m, const SandboxRow *row, int64_t now);

/* What :snapshot asks for. */
typedef struct SnapshotRequest {
        const char *mode;   /* "disk" or "memory"; NULL: disk */
        const char *name;   /* NULL: none */
        json_t *labels;     /* NULL: {} */
        int64_t retention_days; /* 0: SNAPSHOT_DEFAULT_RETENTION_DAYS */
        bool transient; /* a fork's, dropped after its copies (snapshot.h: SNAPSHOT_TRANSIENT) */
        bool keep;      /* never expires: an image's disk, kept until the image is deleted */
        bool layer;     /* a build's per-step layer: the daemon's own (store_snapshots.h: SNAPSHOT_LAYER) */
        /* The sandbox synced its files since anything last ran in it (an exec
         * with the agent's syncAfter that has ended): no sync before the
         * freeze. */
        bool synced;
} SnapshotRequest;
/* A disk snapshot of the sandbox's writable layer, under its lifecycle
 * lock: a running one is frozen (driver->pause) only while its layer is
 * synced and copied, then carries on; a paused one stays paused; a stopped
 * or failed one is copied as it lies. mode "memory" is refused where the
 * driver cannot keep a running machine (every driver of this daemon now).
 * A layer (req->layer) is not checked against the owner's snapshot bounds
 * and emits no snapshot.created. */
int sandbox_snapshot(Manager *m, const KeyInfo *key, const char *id, const SnapshotRequest *req, const char *rid,
                     SnapshotRow *ret, SandboxError *e);

/* What :fork asks for. */
typedef struct ForkRequest {
        int64_t count;      /* copies, 1..FORK_MAX_COUNT */
        const char *name;   /* NULL: none; with count > 1, NAME-1, NAME-2, ... */
        json_t *labels;     /* NULL: the source's */
        json_t *secrets;    /* the egress secrets the copies may use (validated); NULL: every one */
        const char *mode;   /* the snapshot's: "disk" or "memory"; NULL: disk */
        bool keep_snapshot; /* else the snapshot goes once the copies are made */
} ForkRequest;
typedef struct ForkResult {
        SandboxRow *copies;
        size_t n;
        char snapshot_id[SNAPSHOT_ID_LEN + 1]; /* empty unless kept */
} ForkResult;
void fork_result_done(ForkResult *f);
/* Copies of a sandbox: a snapshot of it, then `count` sandboxes made from
 * the snapshot with the source's spec. All or none against the key's daily
 * limit (every copy's first lease together, checked before any is made),
 * and all or none in the end: when one copy fails, those made go. */
int sandbox_fork(Manager *m, const KeyInfo *key, const char *id, const ForkRequest *req, const char *rid,
                 ForkResult *ret, SandboxError *e);

/* A running sandbox of this key's owner, with a reference: 404 when there is
 * none, 409 when it is not running. A paused one created with autoWake
 * (the default) is woken first (a full key's request; a read key gets
 * 409); without, 409. A full key's request marks it active (idle pause), a
 * read key's does not. */
int sandbox_acquire(Manager *m, const KeyInfo *key, const char *id, Sandbox **ret, SandboxError *e);
void sandbox_release(Sandbox *sb);
/* The sandbox stopped answering (its agent is starved or stuck): it becomes
 * failed with this reason and is stopped, as if its agent had died. */
void sandbox_fail(Sandbox *sb, const char *reason);
/* The streams open on the sandbox's channel (commands, transfers, ...). */
size_t sandbox_stream_count(Sandbox *sb);
/* Opens a stream on the sandbox's channel; fills e on failure. */
int sandbox_open_stream(Sandbox *sb, json_t *request, ChanStream **ret, SandboxError *e);
/* How long the sandbox has been paused in all (monotonic ms, the current
 * pause included): a wait on its agent does not count that time against it. */
int64_t sandbox_paused_ms(Sandbox *sb);
/* The heartbeat deadline of the sandbox's driver: its own (a slow
 * driver's), else the default (30 s); not the daemon's override, which
 * tests set to seconds. */
int64_t sandbox_driver_heartbeat_ms(Sandbox *sb);
/* The sandbox's env, a new reference (json_decref it): an :update replaces
 * the object whole, so the one handed out never changes under its reader. */
json_t *sandbox_env(Sandbox *sb);
/* Whether a request asking for u runs as root: u itself when it names a
 * user, else the sandbox's own setting (its "user"). */
bool sandbox_runs_as_root(Sandbox *sb, ReqUser u);
const char *sandbox_id(Sandbox *sb);
const char *sandbox_owner(Sandbox *sb);
/* Let go at the daemon's stop, running on for the next start: its channel's
 * end is no end of its processes. */
bool sandbox_left(Sandbox *sb);
/* A stream of a process the agent kept across a daemon's restart
 * (channel_adopt_stream). */
int sandbox_adopt_stream(Sandbox *sb, uint32_t id, ChanStream **ret);
unsigned sandbox_memory_mib(Sandbox *sb);
/* Records an event of the sandbox (resource "sandbox", its owner's): a
 * process's end, a kill for memory. data is stolen; key_id may be NULL. */
void sandbox_emit(Sandbox *sb, const char *type, const char *key_id, json_t *data);

