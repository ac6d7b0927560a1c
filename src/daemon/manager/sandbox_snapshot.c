#include "daemon/manager/sandbox.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/manager/console_tail.h"
#include "daemon/manager/ledger.h"
#include "common/log.h"
#include "daemon/manager/metrics.h"

#include "daemon/manager/manager-internal.h"

/* ---- snapshots ---- */

/* Has the sandbox write what it holds in memory for its files (a guest
 * kernel's page cache, the Sentry's) to its disk before it is frozen for a
 * snapshot or a pause, so that a snapshot taken then has them. Best effort:
 * a sandbox that does not answer in time is frozen with its disk as it is;
 * the driver's own sync follows either way. */
void guest_sync(Manager *m, const char *id, const char *rid, int timeout_ms, const char *before) {
        Sandbox *sb = live_get(m, id);
        if (!sb)
                return;
        _cleanup_json_ json_t *argv = json_pack("[s]", "sync"), *env = json_object(), *res = NULL;
        json_t *req = argv && env ? agent_req_exec(NULL, argv, "/", env, timeout_ms, false) : NULL;
        ChanStream *s = NULL;
        SandboxError e;
        if (req && sandbox_open_stream(sb, req, &s, &e) == 0) {
                int r = agent_wait_result(s, timeout_ms + 5000, NULL, NULL, &res);
                if (r < 0)
                        log_warn(rid, "sandbox %s: sync before its %s: %s", id, before, strerror(-r));
                chan_stream_free(s);
        }
        json_decref(req);
        sandbox_unref(sb);
}

typedef struct SnapshotOp {
        const SnapshotRequest *req;
        SnapshotRow *out;
} SnapshotOp;

/* How long the agent has to answer a checkpoint: a guest under software
 * emulation on a loaded host can stall for tens of seconds. */
#define CHECKPOINT_TIMEOUT_MS 60000

/* A memory snapshot of a live sandbox, under its lock: its agent goes quiet
 * (the channel empty both ways, nothing written to it until the end), the
 * machine stops, the driver saves it with its disk, and it carries on (a
 * paused one runs only for the checkpoint's answer, and stays paused). */
static int snapshot_memory_locked(Sandbox *sb, const DriverSpec *ds, const char *dir, const char *rid) {
        bool was_paused = sb->paused;
        int r = was_paused ? sb->driver->resume(sb->inst) : 0;
        _cleanup_json_ json_t *req = agent_req_checkpoint();
        if (r == 0)
                r = req ? channel_checkpoint_begin(sb->channel, req, CHECKPOINT_TIMEOUT_MS) : -ENOMEM;
        bool quiet = r == 0;
        if (r == 0)
                r = sb->driver->pause(sb->inst);
        bool stopped = r == 0;
        if (r == 0)
                r = sb->driver->snapshot_memory(sb->inst, ds, dir);
        int rr = 0;
        if (was_paused && !stopped)
                rr = sb->driver->pause(sb->inst);
        else if (!was_paused && stopped)
                rr = sb->driver->resume(sb->inst);
        if (rr < 0)
                log_error(rid, "sandbox %s: %s after its memory snapshot: %s", sb->id, was_paused ? "pausing" : "resuming",
                          strerror(-rr));
        if (quiet)
                channel_checkpoint_end(sb->channel);
        channel_heartbeat_reset(sb->channel, (int64_t)time_now_mono_ms());
        return r;
}

static int too_many_snapshots(SandboxError *e) {
        return sandbox_error(e, SANDBOX_ERR_TOO_MANY, "delete snapshots you no longer need",
                             "you keep %d snapshots, the most this daemon keeps for one owner",
                             SNAPSHOT_MAX_PER_OWNER);
}

/* A size as a refusal names it. */
static void size_text(char *buf, size_t len, int64_t bytes) {
        double b = (double)(bytes > 0 ? bytes : 0);
        if (b >= 1024.0 * 1024.0 * 1024.0)
                snprintf(buf, len, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
        else
                snprintf(buf, len, "%.1f MiB", b / (1024.0 * 1024.0));
}

/* The owner's snapshots are at their bound on bytes: `size` is the
 * snapshot that would have taken them past it, 0 when none was taken. */
static int too_many_snapshot_bytes(SnapshotStore *store, const char *owner, int64_t size, SandboxError *e) {
        static const char hint[] =
                "delete snapshots you no longer need (GET /v1/snapshots lists them with their sizeBytes)";
        char held[32], max[32], made[32];
        size_text(max, sizeof max, (int64_t)(snapshot_store_owner_max_mib(store) << 20));
        StoreSnapshotUsage u;
        if (snapshot_store_usage(store, owner, &u) < 0)
                return sandbox_error(e, SANDBOX_ERR_TOO_MANY, hint,
                                     "your snapshots are at this daemon's bound for one owner, %s in all "
                                     "(--max-snapshot-mib-per-owner); nothing was kept",
                                     max);
        size_text(held, sizeof held, u.bytes);
        const char *plural = u.count == 1 ? "" : "s";
        if (size <= 0)
                return sandbox_error(e, SANDBOX_ERR_TOO_MANY, hint,
                                     "you keep %lld snapshot%s holding %s, and this daemon keeps at most %s "
                                     "of snapshots for one owner (--max-snapshot-mib-per-owner); nothing "
                                     "was kept",
                                     (long long)u.count, plural, held, max);
        size_text(made, sizeof made, size);
        return sandbox_error(e, SANDBOX_ERR_TOO_MANY, hint,
                             "this snapshot holds %s; you keep %lld snapshot%s holding %s, and this daemon "
                             "keeps at most %s of snapshots for one owner (--max-snapshot-mib-per-owner); "
                             "nothing was kept",
                             made, (long long)u.count, plural, held, max);
}

/* Refuses a snapshot that the owner's bounds leave no room for, before it
 * is taken; one that fits now but not once it is measured is refused by
 * its commit. A store that cannot answer leaves the commit to decide. */
static int snapshot_room(SnapshotStore *store, const char *owner, SandboxError *e) {
        StoreSnapshotUsage u;
        if (snapshot_store_usage(store, owner, &u) < 0)
                return 0;
        if (u.count >= SNAPSHOT_MAX_PER_OWNER)
                return too_many_snapshots(e);
        if (u.bytes >= (int64_t)(snapshot_store_owner_max_mib(store) << 20))
                return too_many_snapshot_bytes(store, owner, 0, e);
        return 0;
}

/* The record of a snapshot of `row` taken for req. */
static int snapshot_record(const SandboxRow *row, const SnapshotRequest *req, bool memory,
                           SnapshotRow *snap) {
        const SandboxSpec *spec = &row->spec;
        int64_t days = req->retention_days > 0 ? req->retention_days : SNAPSHOT_DEFAULT_RETENTION_DAYS;
        json_t *base = json_pack("{s:s,s:s,s:i,s:i,s:i,s:I,s:O?,s:O?}", "driver",
                                 sandbox_driver_name(spec->driver), "image", spec->image, "vcpu", (int)spec->vcpu,
                                 "memoryMiB", (int)spec->memory_mib, "diskMiB", (int)spec->disk_mib,
                                 "timeoutSeconds", (json_int_t)spec->timeout_seconds, "env", spec->env, "network",
                                 spec->network);
        if (base && req->transient && json_object_set_new(base, SNAPSHOT_TRANSIENT, json_true()) < 0)
                json_decref(TAKE_PTR(base));
        if (base && req->layer && json_object_set_new(base, SNAPSHOT_LAYER, json_true()) < 0)
                json_decref(TAKE_PTR(base));
        snap->layer = req->layer;
        snap->owner = strdup(row->owner);
        snap->key_id = strdup(row->key_id);
        snap->sandbox_id = strdup(row->id);
        snap->name = req->name ? strdup(req->name) : NULL;
        snap->labels = req->labels ? json_dumps(req->labels, JSON_COMPACT) : strdup("{}");
        snap->spec = base ? json_dumps(base, JSON_COMPACT) : NULL;
        json_decref(base);
        snprintf(snap->mode, sizeof snap->mode, "%s", memory ? "memory" : "disk");
        snap->created_at = time_now_unix();
        snap->expires_at = req->keep ? 0 : snap->created_at + days * 86400;
        if (!snap->owner || !snap->key_id || !snap->sandbox_id || !snap->labels || !snap->spec ||
            (req->name && !snap->name))
                return -ENOMEM;
        return 0;
}

/* The error of a snapshot of `row` that failed with r; nothing was kept. */
static int snapshot_failed(const SandboxRow *row, int r, bool memory, SandboxError *e) {
        if (r == -ENOSPC || r == -EDQUOT)
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "free disk space on the host, or delete snapshots",
                                     "the host ran out of disk space while taking the snapshot; nothing was kept");
        if (r == -ETIMEDOUT)
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "try again; a process in the sandbox may be in a long disk wait",
                                     "sandbox %s could not be frozen for its snapshot; nothing was kept", row->id);
        if (r == -E2BIG)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "snapshot the sandbox the copies came from instead",
                                     "sandbox %s is a copy of a copy too many times over to be snapshotted "
                                     "(its disk would be more than %d layers)", row->id, 8);
        if (r == -EOPNOTSUPP)
                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED, NULL,
                                     "sandbox %s keeps its files in memory only (no loop device on this host)", row->id);
        if (r == -ESRCH)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "try again", "sandbox %s stopped during the snapshot",
                                     row->id);
        if (r == -EPROTO)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, "take mode: \"disk\"",
                                     "the agent of sandbox %s refused its checkpoint; nothing was kept", row->id);
        if (r == -ESTALE && memory)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT,
                                     "close deleted files the sandbox's processes hold open (a temporary file), "
                                     "or take mode: \"disk\"",
                                     "a process in sandbox %s holds a deleted file open, which gVisor cannot keep "
                                     "in a memory snapshot; nothing was kept",
                                     row->id);
        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "the snapshot failed");
}

static int op_snapshot(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        SnapshotOp *op = arg;
        const SnapshotRequest *req = op->req;
        const SandboxSpec *spec = &row->spec;
        const Driver *d = driver_by_name(sandbox_driver_name(spec->driver));
        if (!d)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the sandbox");
        /* A snapshot holds the sandbox's own disk; a volume is no part of it
         * and may be written by others meanwhile, so a copy made from the
         * snapshot could not have it as it was: refused, not left out
         * silently (docs/volumes.md). */
        if (spec->n_volumes > 0)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT,
                                     "copy what you need into /workspace and snapshot a sandbox without volumes, or "
                                     "back the volume up on its own",
                                     "a sandbox with volumes attached cannot be snapshotted or forked");
        bool memory = req->mode && strcmp(req->mode, "memory") == 0;
        if (memory && !d->snapshot_memory)
                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED,
                                     "take mode: \"disk\", which keeps its files and /workspace, or use the microvm driver",
                                     "the %s driver cannot keep a running sandbox's memory in a snapshot", d->name);
        if (!d->snapshot_disk)
                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED, "snapshot a sandbox of the namespace or gvisor driver",
                                     "the %s driver cannot take disk snapshots yet", d->name);
        bool live = row->state == SANDBOX_RUNNING || row->state == SANDBOX_PAUSED;
        if (memory && !live)
                return conflict_state(e, row, "running or paused",
                                      "wake it, or take mode: \"disk\": a stopped sandbox has no memory to keep");
        if (!live && row->state != SANDBOX_STOPPED && row->state != SANDBOX_FAILED)
                return conflict_state(e, row, "running, paused, stopped or failed", "wait for it to settle");
        SnapshotStore *store = m->snapshots;
        if (!store)
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, NULL, "this daemon keeps no snapshots");
        int r = req->layer ? 0 : snapshot_room(store, row->owner, e);
        if (r < 0)
                return r;
        SpecPaths p = { 0 };
        if (spec_paths(m, row->id, spec->image, &p) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        DriverSpec ds;
        driver_spec_from(m, row->id, spec, &p, &ds);
        SnapshotRow snap = { 0 };
        _cleanup_free_ char *tmp = NULL;
        r = snapshot_store_begin(store, snap.id, &tmp);
        if (r < 0) {
                spec_paths_done(&p);
                log_error(rid, "snapshot of %s: %s", row->id, strerror(-r));
                if (r == -ENOSPC || r == -EDQUOT)
                        return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "free disk space on the host, or delete snapshots",
                                             "the host is out of disk space for snapshots; nothing was kept");
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not begin the snapshot");
        }
        uint64_t t0 = time_now_mono_ms(), frozen_ms = 0;
        /* A memory snapshot keeps what the guest holds for its files in
         * its memory: no sync needed. */
        if (live && row->state == SANDBOX_RUNNING && !memory && !req->synced)
                guest_sync(m, row->id, rid, 60000, "snapshot");
        if (live) {
                Sandbox *sb = live_get(m, row->id);
                if (!sb)
                        r = -ESRCH;
                else {
                        pthread_mutex_lock(&sb->lock);
                        bool froze = false;
                        uint64_t f0 = time_now_mono_ms();
                        if (!sb->running || sb->died || !sb->inst)
                                r = -ESRCH;
                        else if (memory) {
                                r = snapshot_memory_locked(sb, &ds, tmp, rid);
                                frozen_ms = time_now_mono_ms() - f0;
                        } else if (!sb->paused) {
                                /* Frozen only while its layer is synced
                                 * and copied: nothing writes to it meanwhile. */
                                r = sb->driver->pause ? sb->driver->pause(sb->inst) : -EOPNOTSUPP;
                                froze = r == 0;
                        }
                        if (r == 0 && !memory)
                                r = d->snapshot_disk(sb->inst, &ds, tmp);
                        if (froze) {
                                frozen_ms = time_now_mono_ms() - f0;
                                int rr = sb->driver->resume(sb->inst);
                                if (rr < 0)
                                        log_error(rid, "sandbox %s: resuming after its snapshot: %s", row->id,
                                                  strerror(-rr));
                                channel_heartbeat_reset(sb->channel, (int64_t)time_now_mono_ms());
                        }
                        pthread_mutex_unlock(&sb->lock);
                        sandbox_unref(sb);
                }
        } else
                r = d->snapshot_disk(NULL, &ds, tmp);
        spec_paths_done(&p);
        if (r == 0) {
                if ((r = snapshot_record(row, req, memory, &snap)) == 0)
                        r = snapshot_store_commit(store, &snap);
                else
                        snapshot_store_abort(store, snap.id);
                if (r == 0) {
                        log_info(rid, "snapshot %s of %s: %lld bytes in %llu ms, %llu ms of them frozen", snap.id,
                                 row->id, (long long)snap.size_bytes, (unsigned long long)(time_now_mono_ms() - t0),
                                 (unsigned long long)frozen_ms);
                        *op->out = snap;
                        return 0;
                }
                if (r == -EDQUOT || r == -EFBIG) {
                        /* Past one of the owner's bounds (another snapshot
                         * of the owner's came first, or this one is too
                         * big): the commit kept nothing. */
                        int64_t size = snap.size_bytes;
                        snapshot_row_done(&snap);
                        log_info(rid, "snapshot of %s (%lld bytes) refused: past its owner's bound",
                                 row->id, (long long)size);
                        return r == -EDQUOT ? too_many_snapshots(e)
                                            : too_many_snapshot_bytes(store, row->owner, size, e);
                }
        } else
                snapshot_store_abort(store, snap.id);
        snapshot_row_done(&snap);
        log_error(rid, "snapshot of %s failed: %s", row->id, strerror(-r));
        return snapshot_failed(row, r, memory, e);
}

int sandbox_snapshot(Manager *m, const KeyInfo *key, const char *id, const SnapshotRequest *req, const char *rid,
                     SnapshotRow *ret, SandboxError *e) {
        SnapshotOp op = { .req = req, .out = ret };
        int r = with_row(m, key, id, op_snapshot, &op, rid, NULL, e);
        if (r == 0 && !req->layer)
                events_emit(m->events, ret->owner, "snapshot.created", "snapshot", ret->id, key->id,
                            json_pack("{s:s,s:s,s:I}", "sandboxId", id, "mode", ret->mode, "sizeBytes",
                                      (json_int_t)ret->size_bytes));
        return r;
}

void fork_result_done(ForkResult *f) {
        for (size_t i = 0; f->copies && i < f->n; i++)
                sandbox_row_done(&f->copies[i]);
        free(f->copies);
        *f = (ForkResult){ 0 };
}

/* The create a copy of `src` is made with: the source's spec (its lease,
 * shape, env, network and lease-end policy; no cost caps), its user, and
 * the fork's name, labels and secrets. */
static int fork_create_request(const SandboxRow *src, const ForkRequest *req, int64_t i, const char *dir,
                               CreateRequest *ret) {
        CreateRequest cr = { .run_as_root = src->run_as_root, .restore_dir = dir };
        int r = sandbox_spec_copy(&src->spec, &cr.spec);
        if (r < 0)
                return r;
        cr.spec.max_cost_micros = -1;
        cr.spec.max_total_cost_micros = -1;
        cr.spec.pausable = true;
        cr.spec.trial = false; /* the key's own, set by sandbox_create */
        cr.spec.paused_at = cr.spec.lease_left_seconds = cr.spec.paused_seconds = 0;
        json_decref(cr.spec.secrets);
        cr.spec.secrets = req->secrets ? json_incref(req->secrets) : NULL;
        cr.labels = req->labels ? json_incref(req->labels) : json_loads(src->labels, 0, NULL);
        if (!cr.labels)
                cr.labels = json_object();
        if (req->name) {
                char nb[160];
                if (req->count > 1)
                        snprintf(nb, sizeof nb, "%s-%lld", req->name, (long long)i + 1);
                else
                        snprintf(nb, sizeof nb, "%s", req->name);
                cr.name = strdup(nb);
        }
        if (!cr.labels || (req->name && !cr.name)) {
                create_request_done(&cr);
                return -ENOMEM;
        }
        *ret = cr;
        return 0;
}

/* All or none against the daily limit: every copy's first lease together,
 * before any is made (each create reserves its own as well, so a race can
 * only refuse more, never overshoot). */
static int fork_check_spending(Manager *m, const KeyInfo *key, const SandboxSpec *spec, int64_t count,
                               SandboxError *e) {
        uint64_t per_hour = config_cost_per_hour(m->cfg, spec->vcpu, spec->memory_mib);
        uint64_t each = ledger_cost_ceil(per_hour, spec->timeout_seconds);
        if (!m->ledger || key->daily_limit_micros < 0)
                return 0;
        LedgerKeyUse use;
        if (ledger_key_use(m->ledger, key->id, time_now_unix(), &use) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the key's spending");
        if (use.used_micros + (int64_t)(each * (uint64_t)count) > key->daily_limit_micros) {
                LedgerRefusal f = { .limit = key->daily_limit_micros, .used = use.used_micros,
                                    .wanted = (int64_t)(each * (uint64_t)count) };
                (void)spending_refusal(m, e, &f, key->owner, key->id, NULL);
                return sandbox_error(e, SANDBOX_ERR_SPENDING, "fork fewer copies, or raise the key's daily limit",
                                     "%lld copies would cost up to %llu micro-dollars for their first lease; the key "
                                     "has %lld of its daily limit left; no copy was made",
                                     (long long)count, (unsigned long long)(each * (uint64_t)count),
                                     (long long)(key->daily_limit_micros - use.used_micros));
        }
        return 0;
}

int sandbox_fork(Manager *m, const KeyInfo *key, const char *id, const ForkRequest *req, const char *rid,
                 ForkResult *ret, SandboxError *e) {
        *ret = (ForkResult){ 0 };
        if (!m->snapshots)
                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED, NULL, "this daemon keeps no snapshots");
        SandboxRow src;
        int r = sandbox_get(m, key, id, &src, e);
        if (r < 0)
                return r;
        if ((r = fork_check_spending(m, key, &src.spec, req->count, e)) < 0) {
                sandbox_row_done(&src);
                return r;
        }
        SnapshotRequest sr = { .mode = req->mode, .retention_days = 1, .transient = !req->keep_snapshot };
        SnapshotRow snap;
        if ((r = sandbox_snapshot(m, key, id, &sr, rid, &snap, e)) < 0) {
                sandbox_row_done(&src);
                return r;
        }
        _cleanup_free_ char *dir = snapshot_store_dir(m->snapshots, snap.id);
        ForkResult out = { .copies = calloc((size_t)req->count, sizeof(SandboxRow)) };
        r = dir && out.copies ? 0 : sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        for (int64_t i = 0; i < req->count && r == 0; i++) {
                CreateRequest cr;
                if (fork_create_request(&src, req, i, dir, &cr) < 0) {
                        r = sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
                        break;
                }
                r = sandbox_create(m, key, &cr, rid, &out.copies[out.n], e);
                create_request_done(&cr);
                if (r == 0)
                        out.n++;
        }
        sandbox_row_done(&src);
        if (r < 0) {
                /* None or all: the copies made so far go. */
                for (size_t i = 0; i < out.n; i++) {
                        SandboxError de;
                        if (sandbox_delete(m, key, out.copies[i].id, rid, &de) < 0)
                                log_error(rid, "fork of %s: deleting copy %s: %s", id, out.copies[i].id, de.message);
                }
                fork_result_done(&out);
        }
        if (r == 0 && req->keep_snapshot)
                snprintf(out.snapshot_id, sizeof(out.snapshot_id), "%s", snap.id);
        else
                (void)snapshot_store_delete(m->snapshots, key->owner, snap.id);
        snapshot_row_done(&snap);
        if (r == 0) {
                json_t *ids = json_array();
                for (size_t i = 0; ids && i < out.n; i++)
                        json_array_append_new(ids, json_string(out.copies[i].id));
                events_emit(m->events, key->owner, "sandbox.forked", "sandbox", id, key->id,
                            ids ? json_pack("{s:o,s:I}", "copies", ids, "count", (json_int_t)out.n) : NULL);
                *ret = out;
        }
        return r;
}
