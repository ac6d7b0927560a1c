#include "daemon/manager/sandbox.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/manager/console_tail.h"
#include "daemon/manager/ledger.h"
#include "common/log.h"
#include "daemon/manager/metrics.h"
#include "daemon/manager/oci_pull.h"

#include "daemon/manager/supervise.h"

#include "daemon/manager/manager-internal.h"
#include "daemon/manager/volumes.h"

void spec_paths_done(SpecPaths *p) {
        free(p->sandbox_dir);
        free(p->image_dir);
        free(p->boot_image_dir);
}

/* ---- live objects ---- */

void sandbox_unref(Sandbox *sb) {
        if (!sb || atomic_fetch_sub(&sb->refs, 1) != 1)
                return;
        channel_free(sb->channel);
        if (sb->sup_conn >= 0)
                close(sb->sup_conn);
        egress_sandbox_unref(sb->egress);
        json_decref(sb->env);
        spec_paths_done(&sb->paths);
        pthread_mutex_destroy(&sb->lock);
        free(sb);
}

void sandbox_release(Sandbox *sb) {
        sandbox_unref(sb);
}

int64_t sandbox_paused_ms(Sandbox *sb) {
        pthread_mutex_lock(&sb->lock);
        int64_t ms = sb->paused_total_ms;
        if (sb->paused)
                ms += (int64_t)time_now_mono_ms() - sb->paused_at_ms;
        pthread_mutex_unlock(&sb->lock);
        return ms;
}

json_t *sandbox_env(Sandbox *sb) {
        pthread_mutex_lock(&sb->lock);
        json_t *env = json_incref(sb->env);
        pthread_mutex_unlock(&sb->lock);
        return env;
}

bool sandbox_runs_as_root(Sandbox *sb, ReqUser u) {
        if (u != REQ_AS_DEFAULT)
                return u == REQ_AS_ROOT;
        return atomic_load(&sb->run_as_root);
}

bool sandbox_has_pool_kernel(Sandbox *sb) {
        return atomic_load(&sb->pool_kernel);
}

void sandbox_clear_pool_kernel(Sandbox *sb) {
        atomic_store(&sb->pool_kernel, false);
}

const char *sandbox_id(Sandbox *sb) {
        return sb->id;
}

const char *sandbox_owner(Sandbox *sb) {
        return sb->owner;
}

void sandbox_emit(Sandbox *sb, const char *type, const char *key_id, json_t *data) {
        events_emit(sb->m->events, sb->owner, type, "sandbox", sb->id, key_id, data);
}

int64_t sandbox_driver_heartbeat_ms(Sandbox *sb) {
        return sb->driver->heartbeat_timeout_ms ? (int64_t)sb->driver->heartbeat_timeout_ms : HEARTBEAT_TIMEOUT_MS;
}

unsigned sandbox_memory_mib(Sandbox *sb) {
        return sb->memory_mib;
}

/* Takes sb off the live list; the caller then owns the list's reference.
 * NULL when it was not live. */
Sandbox *live_take(Manager *m, const char *id) {
        pthread_mutex_lock(&m->lock);
        Sandbox *found = NULL;
        for (Sandbox **p = &m->live; *p; p = &(*p)->next)
                if (strcmp((*p)->id, id) == 0) {
                        found = *p;
                        *p = found->next;
                        found->next = NULL;
                        break;
                }
        pthread_mutex_unlock(&m->lock);
        return found;
}

void busy_begin(Manager *m, const char *id) {
        BusyId *b = calloc(1, sizeof(*b));
        pthread_mutex_lock(&m->lock);
        for (;;) {
                bool taken = false;
                for (BusyId *x = m->busy; x; x = x->next)
                        if (strcmp(x->id, id) == 0)
                                taken = true;
                if (!taken)
                        break;
                pthread_cond_wait(&m->cond, &m->lock);
        }
        /* Without memory the operation still runs, only unserialized. */
        if (b) {
                snprintf(b->id, sizeof(b->id), "%s", id);
                b->next = m->busy;
                m->busy = b;
        }
        pthread_mutex_unlock(&m->lock);
}

void busy_end(Manager *m, const char *id) {
        pthread_mutex_lock(&m->lock);
        for (BusyId **p = &m->busy; *p; p = &(*p)->next)
                if (strcmp((*p)->id, id) == 0) {
                        BusyId *b = *p;
                        *p = b->next;
                        free(b);
                        break;
                }
        pthread_cond_broadcast(&m->cond);
        pthread_mutex_unlock(&m->lock);
}

/* Queues a sandbox whose agent went away for the maintenance thread, which
 * may call driver->stop and channel_free (the channel's reader thread, which
 * reports the close, must not). */
void queue_dead(Sandbox *sb) {
        Manager *m = sb->m;
        pthread_mutex_lock(&sb->lock);
        bool queue = sb->running && !sb->stopping && !sb->died;
        if (queue)
                sb->died = true;
        pthread_mutex_unlock(&sb->lock);
        if (!queue)
                return;
        atomic_fetch_add(&sb->refs, 1);
        pthread_mutex_lock(&m->lock);
        sb->next_dead = m->dead;
        m->dead = sb;
        pthread_cond_broadcast(&m->cond);
        pthread_mutex_unlock(&m->lock);
}

/* Synchronous, so that the caller's answer and the sandbox's state agree;
 * the caller holds a reference. */
void sandbox_fail(Sandbox *sb, const char *reason) {
        pthread_mutex_lock(&sb->lock);
        bool act = sb->running && !sb->stopping && !sb->died;
        if (act) {
                sb->died = true;
                snprintf(sb->closed_reason, sizeof(sb->closed_reason), "%s", reason);
                snprintf(sb->fail_reason, sizeof(sb->fail_reason), "%s", reason);
        }
        pthread_mutex_unlock(&sb->lock);
        if (act)
                handle_dead(sb->m, sb);
}

void on_channel_closed(void *userdata, const char *reason) {
        Sandbox *sb = userdata;
        pthread_mutex_lock(&sb->lock);
        snprintf(sb->closed_reason, sizeof(sb->closed_reason), "%s", reason ? reason : "closed");
        pthread_mutex_unlock(&sb->lock);
        queue_dead(sb);
}

/* Kills the sandbox's processes (driver->stop). The reason the driver saw, if
 * the sandbox had died on its own. */
const char *live_stop(Sandbox *sb) {
        const char *why = NULL;
        pthread_mutex_lock(&sb->lock);
        sb->stopping = true;
        sb->running = false;
        sb->paused = false;
        if (sb->inst) {
                sb->driver->stop(sb->inst, &why);
                sb->inst = NULL;
        }
        pid_t sup = sb->sup_pid;
        sb->sup_pid = 0;
        int conn = sb->sup_conn;
        sb->sup_conn = -1;
        pthread_mutex_unlock(&sb->lock);
        /* Its supervisor ends with its agent's end of the channel. */
        if (sup)
                supervise_wait_end(sup, 2000, true);
        if (conn >= 0)
                close(conn);
        return why;
}

Sandbox *sandbox_alloc(Manager *m, const SandboxRow *row, const Driver *d) {
        const SandboxSpec *spec = &row->spec;
        Sandbox *sb = calloc(1, sizeof(*sb));
        if (!sb)
                return NULL;
        if (spec_paths(m, row->id, spec->image, &sb->paths) < 0) {
                free(sb);
                return NULL;
        }
        sb->m = m;
        sb->sup_conn = -1;
        atomic_init(&sb->refs, 1);
        atomic_init(&sb->active_ms, (int64_t)time_now_mono_ms());
        pthread_mutex_init(&sb->lock, NULL);
        snprintf(sb->id, sizeof(sb->id), "%s", row->id);
        sb->driver = d;
        atomic_init(&sb->auto_wake, true);
        atomic_init(&sb->idle_pause_s, 0);
        atomic_init(&sb->run_as_root, false);
        /* Without an env its start fails (sandbox_launch). */
        (void)sandbox_take_row(sb, row);
        return sb;
}

int sandbox_take_row(Sandbox *sb, const SandboxRow *row) {
        const SandboxSpec *spec = &row->spec;
        json_t *env = spec_sandbox_env(sb->m, row->owner, spec);
        if (!env)
                return -ENOMEM;
        pthread_mutex_lock(&sb->lock);
        json_decref(sb->env);
        sb->env = env;
        pthread_mutex_unlock(&sb->lock);
        snprintf(sb->owner, sizeof(sb->owner), "%s", row->owner);
        atomic_store(&sb->auto_wake, spec->auto_wake);
        atomic_store(&sb->idle_pause_s, spec->idle_pause_seconds > 0 && spec->idle_pause_seconds < UINT32_MAX
                                                ? (unsigned)spec->idle_pause_seconds : 0);
        atomic_store(&sb->run_as_root, row->run_as_root);
        atomic_store(&sb->active_ms, (int64_t)time_now_mono_ms());
        return 0;
}

void live_add(Manager *m, Sandbox *sb) {
        pthread_mutex_lock(&sb->lock);
        sb->running = true;
        pthread_mutex_unlock(&sb->lock);
        atomic_fetch_add(&sb->refs, 1); /* the live list's */
        pthread_mutex_lock(&m->lock);
        sb->next = m->live;
        m->live = sb;
        pthread_mutex_unlock(&m->lock);
        /* The agent may have gone between its hello and now. */
        if (!channel_is_open(sb->channel))
                queue_dead(sb);
}

/* The sandbox's supervisor, which shares *fd (the driver's end of the
 * channel) with the daemon, and keeps it and the driver's handles while no
 * daemon is there. *fd is closed on failure. */
static int supervise(Manager *m, Sandbox *sb, const SandboxRow *row, int *fd) {
        SuperviseHandles h = { .n = 0 };
        for (size_t i = 0; i < DRIVER_MAX_HANDLES; i++)
                h.fds[i] = -1;
        size_t n = DRIVER_MAX_HANDLES;
        pthread_mutex_lock(&sb->lock);
        int r = sb->driver->handles(sb->inst, h.fds, &n, h.state, sizeof h.state);
        pthread_mutex_unlock(&sb->lock);
        if (r < 0) {
                close(*fd);
                *fd = -1;
                return r;
        }
        h.n = n;
        int conn = -1;
        r = supervise_start(m->cfg->supervisor_path, sb->paths.sandbox_dir, sb->id, row->spec.supervisor_nonce, *fd,
                            &h, &conn);
        if (r < 0) {
                close(*fd);
                *fd = -1;
                return r;
        }
        sb->sup_pid = h.pid;
        sb->sup_conn = conn;
        return 0;
}

/* ---- rows and JSON ---- */

int spec_paths(Manager *m, const char *id, const char *image, SpecPaths *ret) {
        SpecPaths p = { 0 };
        if (asprintf(&p.sandbox_dir, "%s/sandboxes/%s", m->cfg->state_dir, id) < 0) {
                p.sandbox_dir = NULL;
                return -ENOMEM;
        }
        /* An image pulled from a registry lives under the state directory. */
        p.image_dir = oci_image_dir(m->cfg->state_dir, image);
        /* Which has no microVM kernel nor root disk: the microVM boots the
         * built-in default's under a disk holding the tree's whole root. */
        if (p.image_dir && asprintf(&p.boot_image_dir, "%s/default", m->cfg->image_dir) < 0) {
                p.boot_image_dir = NULL;
                spec_paths_done(&p);
                return -ENOMEM;
        }
        if (!p.image_dir && asprintf(&p.image_dir, "%s/%s", m->cfg->image_dir, image) < 0) {
                p.image_dir = NULL;
                spec_paths_done(&p);
                return -ENOMEM;
        }
        *ret = p;
        return 0;
}

void driver_spec_from(Manager *m, const char *id, const SandboxSpec *spec, const SpecPaths *p,
                             DriverSpec *ds) {
        *ds = (DriverSpec){
                .id = id,
                .vcpu = spec->vcpu,
                .memory_mib = spec->memory_mib,
                .disk_mib = spec->disk_mib,
                .pids_max = SANDBOX_PIDS_MAX,
                .image_dir = p->image_dir,
                .boot_image_dir = p->boot_image_dir,
                .sandbox_dir = p->sandbox_dir,
                .agent_path = m->cfg->agent_path,
                .cgroup_parent = m->cfg->cgroup_parent,
        };
}

uint64_t sandbox_row_cost_per_hour(Manager *m, const SandboxRow *r) {
        return config_cost_per_hour(m->cfg, r->spec.vcpu, r->spec.memory_mib);
}

int64_t sandbox_row_run_seconds(const SandboxRow *r, int64_t now) {
        int64_t s = r->run_seconds;
        if (r->lease_ends_at && now > r->lease_ends_at)
                now = r->lease_ends_at; /* never billed past its lease */
        if (r->state == SANDBOX_RUNNING && r->started_at && now > r->started_at)
                s += now - r->started_at;
        return s;
}

/* The row of a sandbox of this key's owner; 404 otherwise. */
int own_row(Manager *m, const KeyInfo *key, const char *id, SandboxRow *ret, SandboxError *e) {
        int r = db_sandbox_get(m->db, id, ret);
        if (r == -ENOENT || (r == 0 && strcmp(ret->owner, key->owner) != 0)) {
                if (r == 0)
                        sandbox_row_done(ret);
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "list your sandboxes with GET /v1/sandboxes",
                                 "no sandbox %s", id);
        }
        if (r < 0) {
                log_error(NULL, "reading sandbox %s: %s", id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the sandbox");
        }
        return 0;
}

int set_reason(SandboxRow *r, const char *reason) {
        if (reason == r->failure_reason)
                return 0;
        free(r->failure_reason);
        r->failure_reason = reason ? strdup(reason) : NULL;
        return reason && !r->failure_reason ? -ENOMEM : 0;
}

/* The ledger keeps a paused sandbox's disk charge apart from its running
 * charges, under this name: each series prices its seconds at one rate. */
void disk_series(const char *id, char *buf, size_t n) {
        snprintf(buf, n, "%s" LEDGER_DISK_SUFFIX, id);
}

/* Closes a paused sandbox's disk charge at `end` and adds its paused time to
 * the row; the row's pausedAt goes. */
void row_end_pause(Manager *m, SandboxRow *r, int64_t end, int64_t now) {
        int64_t at = r->spec.paused_at;
        if (m->ledger) {
                char series[48];
                disk_series(r->id, series, sizeof(series));
                int lr = ledger_settle(m->ledger, series, end, now);
                if (lr < 0)
                        log_error(NULL, "sandbox %s: settling its paused disk: %s", r->id, strerror(-lr));
        }
        if (at > 0 && end > at)
                r->spec.paused_seconds += end - at;
        r->spec.paused_at = 0;
        r->spec.lease_left_seconds = 0;
}

/* Accounts run time and writes a stopped or failed state. */
int row_finish(Manager *m, SandboxRow *r, SandboxState state, const char *reason) {
        int64_t now = time_now_unix();
        int64_t end = now;
        if (r->state == SANDBOX_PAUSED || r->state == SANDBOX_RESUMING)
                row_end_pause(m, r, now, now);
        if (r->state == SANDBOX_RUNNING && r->started_at) {
                /* Never billed past its lease: the reservation covers the
                 * lease and no more. */
                if (r->lease_ends_at && end > r->lease_ends_at)
                        end = r->lease_ends_at;
                if (end < r->started_at)
                        end = r->started_at;
                r->run_seconds += end - r->started_at;
        }
        if (m->ledger) {
                int lr = ledger_settle(m->ledger, r->id, end, now);
                if (lr < 0)
                        log_error(NULL, "sandbox %s: settling its charge: %s", r->id, strerror(-lr));
        }
        r->state = state;
        r->stopped_at = now;
        set_reason(r, reason);
        return db_sandbox_update(m->db, r);
}

const char *failure_text(const char *driver_why, const char *fail_reason, const char *channel_reason,
                                char *buf, size_t n) {
        if (driver_why && strcmp(driver_why, "oom") == 0)
                return "oom";
        /* The daemon's own verdict: the driver only saw the kill that followed. */
        if (fail_reason && *fail_reason) {
                snprintf(buf, n, "%s", fail_reason);
                return buf;
        }
        if (driver_why && strcmp(driver_why, "exited") == 0)
                return "agent exited";
        if (driver_why && strcmp(driver_why, "killed") == 0)
                return "agent killed";
        if (driver_why) {
                snprintf(buf, n, "%s", driver_why);
                return buf;
        }
        /* The driver saw nothing wrong: the agent went away on its own. The
         * channel's reason goes to the log. */
        (void)channel_reason;
        snprintf(buf, n, "agent exited");
        return buf;
}

/* ---- lifecycle, every step under busy_begin(id) ---- */

int do_stop_locked(Manager *m, SandboxRow *row, SandboxState state, const char *reason) {
        Sandbox *sb = live_take(m, row->id);
        if (sb) {
                live_stop(sb);
                sandbox_unref(sb);
        }
        if (row->state != SANDBOX_RUNNING && row->state != SANDBOX_STARTING && row->state != SANDBOX_PAUSED &&
            row->state != SANDBOX_PAUSING && row->state != SANDBOX_RESUMING && row->state != SANDBOX_STOPPING)
                return 0;
        return row_finish(m, row, state, reason);
}

int do_delete_locked(Manager *m, SandboxRow *row, const char *rid) {
        int r = do_stop_locked(m, row, SANDBOX_STOPPED, row->failure_reason);
        if (r < 0)
                return r;
        const Driver *d = driver_by_name(sandbox_driver_name(row->spec.driver));
        SpecPaths p = { 0 };
        if (d && spec_paths(m, row->id, row->spec.image, &p) == 0) {
                DriverSpec ds;
                driver_spec_from(m, row->id, &row->spec, &p, &ds);
                int dr = d->destroy(&ds);
                if (dr < 0)
                        log_error(rid, "destroying sandbox %s left files behind: %s", row->id, strerror(-dr));
        } else
                log_error(rid, "cannot destroy sandbox %s: unknown driver or spec", row->id);
        spec_paths_done(&p);
        row->state = SANDBOX_DELETED;
        row->deleted_at = time_now_unix();
        r = db_sandbox_update(m->db, row);
        /* Its processes are gone: its volumes are free for others. */
        if (r == 0 && row->spec.n_volumes > 0 && m->volumes) {
                int vr = volumes_release(m->volumes, row->id);
                if (vr < 0)
                        log_error(rid, "sandbox %s: releasing its volumes: %s", row->id, strerror(-vr));
        }
        /* After the row: an upload the next start finds of a deleted
         * sandbox goes then. */
        if (r == 0)
                uploads_drop_sandbox(m->uploads, row->id);
        return r;
}

/* ---- API operations ---- */

/* A volume's refusal at create, as the client is to read it. */
static int volume_refusal(SandboxError *e, int r, const SandboxVolume *v) {
        switch (r) {
        case -ENOENT:
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "GET /v1/volumes lists your volumes",
                                     "volume %s not found", v->volume_id);
        case -EBUSY:
                return sandbox_error(e, SANDBOX_ERR_CONFLICT,
                                     "delete the sandbox that has it, attach it with readOnly: true, or make the "
                                     "volume shared",
                                     "volume %s is written by another sandbox: one writer at a time", v->volume_id);
        case -EAGAIN:
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "try again once the resize is done",
                                     "volume %s is being resized", v->volume_id);
        default:
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not attach volume %s", v->volume_id);
        }
}

/* Whether driver d can take the create's volumes. */
static int volumes_allowed(Manager *m, const Driver *d, const CreateRequest *req, SandboxError *e) {
        if (req->spec.n_volumes == 0)
                return 0;
        if (!m->volumes)
                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED, NULL, "this daemon keeps no volumes");
        if (strcmp(d->name, "namespace") != 0 && strcmp(d->name, "gvisor") != 0 && !d->volume_images)
                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED,
                                     "create it with driver \"namespace\", \"gvisor\" or \"microvm\"",
                                     "the %s driver does not attach volumes", d->name);
        if (req->restore_dir)
                return sandbox_error(e, SANDBOX_ERR_INVALID, "attach volumes to a sandbox made without a snapshot",
                                     "a sandbox made from a snapshot takes no volumes");
        return 0;
}

static int check_image(Manager *m, const char *image, SandboxError *e) {
        _cleanup_free_ char *rootfs = NULL, *pulled = oci_image_dir(m->cfg->state_dir, image);
        if (asprintf(&rootfs, "%s/%s/rootfs", pulled ? pulled : m->cfg->image_dir, pulled ? "." : image) < 0) {
                rootfs = NULL;
                return -ENOMEM;
        }
        struct stat st;
        if (stat(rootfs, &st) < 0 || !S_ISDIR(st.st_mode))
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "build it with: runtime image build",
                                 "the image %s is not built", image);
        return 0;
}

void dollars(char *buf, size_t n, int64_t micros) {
        snprintf(buf, n, "$%lld.%06lld", (long long)(micros / 1000000), (long long)(micros % 1000000));
}

/* 409 budget_exceeded: the price of `seconds` more of the sandbox and how to
 * fit under the cap, with numbers. `spent` is what it cost already. */
int budget_refusal(SandboxError *e, uint64_t per_hour, int64_t seconds, uint64_t spent, uint64_t cap,
                          const char *cap_name, const char *what) {
        uint64_t cost = spent + ledger_cost(per_hour, seconds);
        int64_t fit = 0;
        if (per_hour > 0 && cap > spent) {
                unsigned __int128 v = (unsigned __int128)(cap - spent) * 3600u / per_hour;
                fit = v > SANDBOX_MAX_LEASE_SECONDS ? SANDBOX_MAX_LEASE_SECONDS : (int64_t)v;
        }
        char c[32], p[32], k[32];
        dollars(c, sizeof(c), (int64_t)cost);
        dollars(p, sizeof(p), (int64_t)per_hour);
        dollars(k, sizeof(k), (int64_t)cap);
        char hint[256];
        if (fit > 0)
                snprintf(hint, sizeof(hint),
                         "at most %lld seconds fit at this size; or make the sandbox smaller (vcpu, memoryMiB), "
                         "or raise %s",
                         (long long)fit, cap_name);
        else
                snprintf(hint, sizeof(hint), "make the sandbox smaller (vcpu, memoryMiB) or raise %s", cap_name);
        return sandbox_error(e, SANDBOX_ERR_OVER_BUDGET, hint,
                         "the %s would cost %llu micro-dollars (%s: %lld seconds at %llu micro-dollars, %s, an "
                         "hour), above %s %llu (%s)",
                         what, (unsigned long long)cost, c, (long long)seconds, (unsigned long long)per_hour, p,
                         cap_name, (unsigned long long)cap, k);
}

/* 402 spending_limit_reached: the limit, what is used and when room frees up. */
int spending_refusal(Manager *m, SandboxError *e, const LedgerRefusal *f, const char *owner, const char *key_id,
                     const char *sandbox_id) {
        char when[160] = "";
        if (events_rate_ok("spending", key_id, SPENDING_EVENT_EVERY_S))
                events_spending_reached(m->events, owner, key_id, f->allowance, f->limit, f->used, f->wanted,
                                        sandbox_id);
        if (f->allowance) {
                return sandbox_error(e, SANDBOX_ERR_SPENDING,
                                 "this was a trial key: ask the daemon's administrator for a full key (runtime keys "
                                 "create NAME, with the admin key) and set RUNTIME_API_KEY to it",
                                 "the trial's free sandbox time is used up: %lld of %lld sandbox-seconds (%lld hours) "
                                 "used or reserved, and this needs %lld more",
                                 (long long)f->used, (long long)f->limit, (long long)(f->limit / 3600),
                                 (long long)f->wanted);
        }
        char t[RFC3339_LEN];
        if (f->frees_at && time_format_rfc3339(f->frees_at, t) == 0)
                snprintf(when, sizeof(when), "room frees up at %s, when the oldest charge leaves the 24-hour window",
                         t);
        else if (f->reservations_end && time_format_rfc3339(f->reservations_end, t) == 0)
                snprintf(when, sizeof(when), "room frees up as running sandboxes stop (the first lease ends by %s)",
                         t);
        else
                snprintf(when, sizeof(when), "nothing is held: this request alone is above the limit");
        char l[32], u[32], w[32];
        dollars(l, sizeof(l), f->limit);
        dollars(u, sizeof(u), f->used);
        dollars(w, sizeof(w), f->wanted);
        return sandbox_error(e, SANDBOX_ERR_SPENDING,
                         "stop or delete running sandboxes to settle their reservations, use a shorter lease or a "
                         "smaller sandbox, or ask for a higher dailyLimitMicros on a new key",
                         "key %s has a daily limit of %lld micro-dollars (%s); %lld (%s) are used or reserved in the "
                         "last 24 hours and this needs %lld (%s); %s",
                         key_id, (long long)f->limit, l, (long long)f->used, u, (long long)f->wanted, w, when);
}

/* What every command of the sandbox gets in its environment: the egress
 * proxy's variables and the placeholders of the secrets it may use, then the
 * spec's env (the creator's, as :update left it) on top. A new object. */
json_t *spec_sandbox_env(Manager *m, const char *owner, const SandboxSpec *spec) {
        json_t *env = spec->env;
        if (!m->egress)
                return env ? json_deep_copy(env) : json_object();
        /* The egress secrets it may use: none named in the spec is every one. */
        json_t *all = egress_service_sandbox_env(m->egress, owner, spec->secrets);
        if (all && env && json_object_update(all, env) < 0)
                json_decref(TAKE_PTR(all));
        return all;
}

/* Starts sb's processes on driver d as its row says (id, image, shape, the
 * supervisor's nonce when supervised) and waits for its agent's hello: what
 * a boot and a warm pool's start share. The egress policy sb has (may be
 * none yet) takes the agent's connections from the first frame on. On
 * failure *ret_fail says why in a client's words (in start_err when the
 * driver said it) and the caller stops sb. */
/* The host mounts of the row's volumes, for its driver to bind. */
static int launch_volumes(Manager *m, const Driver *d, const SandboxRow *row, VolumeMountPaths *ret,
                          const char *rid, DriverError *err) {
        size_t failed = 0;
        int r = m->volumes ? volumes_mounts(m->volumes, &row->spec, d->volume_images, ret, &failed) : -EOPNOTSUPP;
        if (r == 0)
                return 0;
        const char *id = row->spec.volumes[failed].volume_id;
        log_error(rid, "sandbox %s: mounting volume %s: %s", row->id, id, strerror(-r));
        if (r == -ENOENT)
                driver_error(err, "volume %s is not on this host: deleted, or made on another host", id);
        else if (r == -EBUSY && d->volume_images)
                driver_error(err, "volume %s is in use by another sandbox: a microVM takes a volume only while no "
                                  "other sandbox writes it, and reads it only beside other microVMs' reads", id);
        else if (r == -EBUSY)
                driver_error(err, "volume %s is still held by a sandbox that has not ended", id);
        else
                driver_error(err, "volume %s could not be mounted", id);
        return r;
}

int sandbox_launch(Manager *m, Sandbox *sb, const SandboxRow *row, const Driver *d, bool supervised,
                   const char *rid, DriverError *start_err, const char **ret_fail) {
        const DaemonConfig *cfg = m->cfg;
        _cleanup_json_ json_t *hello = NULL;
        int r;
        {
                _cleanup_free_ char *parent = NULL;
                if (asprintf(&parent, "%s/sandboxes", cfg->state_dir) >= 0)
                        (void)mkdir(parent, 0700);
                else
                        parent = NULL;
        }
        DriverSpec ds;
        driver_spec_from(m, sb->id, &row->spec, &sb->paths, &ds);
        sb->memory_mib = ds.memory_mib;
        sb->vcpu = ds.vcpu;
        VolumeMountPaths vmp = { .n = 0 };
        if (row->spec.n_volumes > 0 && (r = launch_volumes(m, d, row, &vmp, rid, start_err)) < 0) {
                *ret_fail = start_err->reason;
                return r;
        }
        ds.mounts = vmp.mounts;
        ds.n_mounts = row->spec.n_volumes;
        int fd = -1;
        r = d->start(&ds, &fd, &sb->inst, start_err);
        /* A guest's VMM holds its own duplicates of the images now. */
        volumes_mounts_close(&vmp);
        if (r < 0) {
                log_error(rid, "sandbox %s: driver %s failed to start: %s%s%s", row->id, d->name, strerror(-r),
                          start_err->reason[0] ? ": " : "", start_err->reason);
                *ret_fail = start_err->reason[0]   ? start_err->reason
                       : r == -ENOENT        ? "the image is missing or incomplete"
                       : r == -ENOSPC        ? "the host is out of disk space"
                       : r == -EPERM || r == -EACCES ? "the driver lacks a privilege it needs on this host"
                                                    : "the sandbox failed to start";
                sb->inst = NULL;
                return r;
        }
        if (supervised && (r = supervise(m, sb, row, &fd)) < 0) {
                log_error(rid, "sandbox %s: starting its supervisor: %s", row->id, strerror(-r));
                *ret_fail = "the sandbox's supervisor could not start";
                return r;
        }
        sb->channel = channel_new(fd, on_channel_closed, sb);
        if (!sb->channel || !sb->env) {
                log_error(rid, "sandbox %s: cannot set up the agent channel", row->id);
                *ret_fail = "the sandbox failed to start";
                return -ENOMEM;
        }
        if (sb->egress)
                channel_set_acceptor(sb->channel, egress_sandbox_accept, sb->egress);
        int hello_ms = d->hello_timeout_ms ? (int)d->hello_timeout_ms : HELLO_TIMEOUT_MS;
        r = channel_wait_hello(sb->channel, hello_ms, &hello);
        if (r < 0) {
                log_error(rid, "sandbox %s: no hello from the agent: %s", row->id, strerror(-r));
                *ret_fail = r == -ETIMEDOUT ? "the sandbox's agent did not answer in time"
                                            : "the sandbox's agent exited while starting";
                return r;
        }
        /* The egress CA in the sandbox's trust store, so that HTTPS to hosts a
         * secret applies to verifies; without it only those connections fail. */
        if (m->egress && (r = egress_service_install_ca(m->egress, sb->channel, sb->paths.image_dir)) < 0)
                log_warn(rid, "sandbox %s: could not add the egress CA to its trust store: %s", row->id,
                         strerror(-r));
        return 0;
}

/* The row of a sandbox whose agent answered becomes running with a lease of
 * lease_seconds from now, its charge opens, and sb goes live (the caller's
 * reference stays the caller's). On failure *ret_fail and *ret_status say
 * why. */
int sandbox_go_live(Manager *m, SandboxRow *row, Sandbox *sb, int64_t lease_seconds, const char *rid,
                    const char **ret_fail, int *ret_status) {
        int64_t now_ms = time_now_unix_ms(), now = now_ms / 1000;
        uint64_t per_hour = config_cost_per_hour(m->cfg, row->spec.vcpu, row->spec.memory_mib);
        row->started_at = now;
        row->started_msec = (int)(now_ms % 1000);
        row->lease_ends_at = now + lease_seconds;
        set_reason(row, NULL);
        row->state = SANDBOX_RUNNING;
        int r = db_sandbox_update(m->db, row);
        if (r < 0) {
                log_error(rid, "sandbox %s: recording the start: %s", row->id, strerror(-r));
                *ret_fail = "could not record the sandbox";
                *ret_status = 500;
                return r;
        }
        /* No sandbox runs without its charge open: nothing is ever free by accident. */
        if (m->ledger && (r = ledger_begin(m->ledger, row->id, row->key_id, row->owner, now, per_hour,
                                           row->lease_ends_at)) < 0) {
                log_error(rid, "sandbox %s: opening its charge: %s", row->id, strerror(-r));
                *ret_fail = "could not record the sandbox's charge";
                *ret_status = 500;
                return r;
        }
        live_add(m, sb);
        return 0;
}

/* A start that failed: sb (may be NULL) stopped, the row recorded failed
 * with the reason and the console's last lines, e filled. */
int sandbox_boot_failed(Manager *m, SandboxRow *row, Sandbox *sb, const char *fail, int fail_status,
                        const char *rid, SandboxError *e) {
        /* The row's reason gets the console's last lines (a guest that never
         * reached its agent says why there); the client's 503 does not. */
        char text[256 + 16 + CONSOLE_TAIL_MAX];
        snprintf(text, sizeof(text), "%s", fail ? fail : "the sandbox failed to start");
        if (sb) {
                live_stop(sb);
                append_console_tail(sb, text, sizeof(text));
                sandbox_unref(sb);
        }
        int fr = row_finish(m, row, SANDBOX_FAILED, text);
        if (fr < 0)
                log_error(rid, "sandbox %s: recording the failure: %s", row->id, strerror(-fr));
        if (fail_status == 500)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "%s", fail ? fail : "the sandbox failed to start");
        return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "GET /v1/info shows what this host can run; the daemon's log has details",
                         "%s", fail ? fail : "the sandbox failed to start");
}

/* Starts the sandbox of `row` on driver d, with a lease of lease_seconds:
 * a new one, or a stopped one again on its own files (its memory is not
 * kept). Everything it needs besides comes from the row. Under
 * busy_begin(row->id), with the row's reservation held. On success the row
 * is running; on failure it is recorded failed and e is filled. */
int boot_locked(Manager *m, SandboxRow *row, const Driver *d, int64_t lease_seconds, const char *rid,
                       SandboxError *e) {
        const DaemonConfig *cfg = m->cfg;
        const SandboxSpec *spec = &row->spec;
        Sandbox *sb = NULL;
        const char *fail = NULL;
        DriverError start_err = { .reason = "" }; /* the driver's words, for failureReason */
        int fail_status = 503;
        int r;
        row->state = SANDBOX_STARTING;
        /* Each boot its own nonce: a supervisor of an earlier boot never
         * passes for this one's. */
        bool supervised = cfg->supervisor_path && d->handles && d->adopt;
        row->spec.supervisor_nonce[0] = '\0';
        if (supervised && supervise_nonce(row->spec.supervisor_nonce) < 0)
                return sandbox_boot_failed(m, row, NULL, "out of memory", fail_status, rid, e);
        sb = sandbox_alloc(m, row, d);
        if (!sb)
                return sandbox_boot_failed(m, row, NULL, "out of memory", fail_status, rid, e);
        if ((r = db_sandbox_update(m->db, row)) < 0) {
                sandbox_unref(sb);
                return sandbox_boot_failed(m, row, NULL, "could not record the sandbox", 500, rid, e);
        }
        /* The egress secrets it may use: none named in the spec is every one. */
        if (m->egress && egress_sandbox_new(m->egress, sb->id, row->owner, spec->network, spec->secrets, spec->trial,
                                            &sb->egress) < 0)
                return sandbox_boot_failed(m, row, sb, "out of memory", fail_status, rid, e);
        uint64_t t0 = time_now_mono_ms();
        if (sandbox_launch(m, sb, row, d, supervised, rid, &start_err, &fail) < 0 ||
            sandbox_go_live(m, row, sb, lease_seconds, rid, &fail, &fail_status) < 0)
                return sandbox_boot_failed(m, row, sb, fail, fail_status, rid, e);
        log_info(rid, "sandbox %s running (driver %s, %llu ms%s)", row->id, d->name,
                 (unsigned long long)(time_now_mono_ms() - t0), sb->sup_pid ? ", supervised" : "");
        sandbox_unref(sb);
        return 0;
}

static int restore_disk(Manager *m, SandboxRow *row, const Driver *d, const char *snap_dir, const char *rid,
                        SandboxError *e) {
        if (!d->restore_disk)
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "create it on a driver that keeps disk snapshots",
                                     "the %s driver cannot start from a snapshot", d->name);
        const SandboxSpec *spec = &row->spec;
        SpecPaths p = { 0 };
        if (spec_paths(m, row->id, spec->image, &p) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        {
                _cleanup_free_ char *parent = NULL;
                if (asprintf(&parent, "%s/sandboxes", m->cfg->state_dir) >= 0)
                        (void)mkdir(parent, 0700);
                else
                        parent = NULL;
        }
        DriverSpec ds;
        driver_spec_from(m, row->id, spec, &p, &ds);
        uint64_t t0 = time_now_mono_ms();
        int r = d->restore_disk(&ds, snap_dir);
        spec_paths_done(&p);
        if (r == DRIVER_DISK_CONVERTED)
                log_info(rid, "sandbox %s: the image's %s disk made from its layers (%llu ms)", row->id, d->name,
                         (unsigned long long)(time_now_mono_ms() - t0));
        if (r < 0) {
                log_error(rid, "sandbox %s: making its disk from a snapshot: %s", row->id, strerror(-r));
                if (r == -ENOSPC)
                        return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "free disk space on the host, or delete snapshots",
                                             "the host has no room for the sandbox's disk");
                /* Another driver's layers made into this one's disk (an
                 * image built here, on the microVM) and refused. */
                if (r == -EFBIG || r == -ELOOP || r == -EOPNOTSUPP)
                        return sandbox_error(e, SANDBOX_ERR_CONFLICT, "create it on the driver it was built on",
                                             "the image's files cannot be made into a %s disk: %s", d->name,
                                             r == -EFBIG  ? "they do not fit its diskMiB"
                                             : r == -ELOOP ? "its tree is too deep"
                                                           : "a file's data is in a layer it does not have");
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not make the sandbox's disk from the snapshot");
        }
        return 0;
}

/* A create from the warm pool when one of its sandboxes has the driver,
 * image and shape asked for and the create needs nothing else at its start
 * (a disk from a snapshot does); else a boot. Everything but the boot is
 * the same either way. */
/* The driver a create asked for, or the daemon's default. */
static int pick_driver(const DaemonConfig *cfg, const CreateRequest *req, const Driver **ret, SandboxError *e) {
        const char *asked = sandbox_driver_name(req->spec.driver);
        if (!asked) {
                if (!(*ret = cfg->default_driver))
                        return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE,
                                             "run runtimed --doctor to see what this host lacks",
                                             "no driver can run sandboxes on this host");
                return 0;
        }
        const DriverOffer *o = config_driver_offer(cfg, asked);
        if (!o)
                return sandbox_error(e, SANDBOX_ERR_INVALID, "GET /v1/info lists the drivers",
                                     "driver must be one of the daemon's drivers; %s is not", asked);
        if (!o->available)
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "GET /v1/info lists the drivers this host runs",
                                     "driver %s cannot run on this host: %s", asked, o->reason);
        if (!o->offered)
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "GET /v1/info lists the drivers this host runs",
                                     "driver %s is not offered by this daemon", asked);
        *ret = o->driver;
        return 0;
}

/* The volumes are claimed before the row exists: of two creates racing
 * for one volume, the store lets one in. A guest's kernel and the host's
 * never have one volume at once: refused here, before anything starts,
 * rather than by the start. */
static int claim_volumes(Manager *m, const char *owner, SandboxRow *row, const Driver *d, SandboxError *e) {
        if (row->spec.n_volumes == 0)
                return 0;
        size_t failed = 0;
        int r = volumes_attach_spec(m->volumes, owner, row->id, &row->spec, &failed);
        if (r < 0)
                return volume_refusal(e, r, &row->spec.volumes[failed]);
        r = sandbox_volumes_check_kernels(m, row->id, &row->spec, d, e);
        if (r < 0)
                (void)volumes_release(m->volumes, row->id);
        return r;
}

static int create(Manager *m, const KeyInfo *key, const CreateRequest *req, const char *rid, SandboxRow *ret,
                  SandboxError *e) {
        const DaemonConfig *cfg = m->cfg;
        const Driver *d = NULL;
        int r = pick_driver(cfg, req, &d, e);
        if (r < 0 || (r = check_image(m, req->spec.image, e)) < 0)
                return r;
        if ((r = volumes_allowed(m, d, req, e)) < 0)
                return r;
        uint64_t per_hour = config_cost_per_hour(cfg, req->spec.vcpu, req->spec.memory_mib);
        uint64_t lease_cost = ledger_cost(per_hour, req->spec.timeout_seconds);
        int64_t cap = req->spec.max_cost_micros;
        const char *cap_name = "maxCostMicros";
        if (req->spec.max_total_cost_micros >= 0 && (cap < 0 || req->spec.max_total_cost_micros < cap)) {
                cap = req->spec.max_total_cost_micros;
                cap_name = "maxTotalCostMicros";
        }
        if (cap >= 0 && lease_cost > (uint64_t)cap)
                return budget_refusal(e, per_hour, req->spec.timeout_seconds, 0, (uint64_t)cap, cap_name, "first lease");

        /* The pool's sandboxes started without volumes. */
        PoolEntry *pooled = req->restore_dir || req->spec.n_volumes ? NULL : warm_pool_take(m, d, &req->spec, req->pool_kernel_ok);
        char hex[21];
        if (!pooled && (r = random_hex(hex, 10)) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not make an id");
        SandboxRow row = { 0 };
        if (pooled)
                snprintf(row.id, sizeof(row.id), "%s", warm_pool_entry_id(pooled));
        else
                snprintf(row.id, sizeof(row.id), "sbx_%s", hex);
        row.owner = strdup(key->owner);
        row.key_id = strdup(key->id);
        row.name = req->name ? strdup(req->name) : NULL;
        row.labels = json_dumps(req->labels, JSON_COMPACT);
        r = sandbox_spec_copy(&req->spec, &row.spec);
        if (r == 0) {
                if (sandbox_driver_from_name(d->name, &row.spec.driver) < 0)
                        r = -EINVAL;
                if (row.spec.idle_pause_seconds > 0 && row.spec.idle_pause_seconds < (int64_t)cfg->idle_pause_min_seconds)
                        row.spec.idle_pause_seconds = cfg->idle_pause_min_seconds;
                /* A trial key's sandbox says so: its egress is to be narrower. */
                row.spec.trial = key->trial;
                row.spec.paused_at = row.spec.lease_left_seconds = row.spec.paused_seconds = 0;
        }
        row.state = SANDBOX_STARTING;
        int64_t created_ms = time_now_unix_ms();
        row.created_at = created_ms / 1000;
        row.created_msec = (int)(created_ms % 1000);
        row.run_as_root = req->run_as_root;
        snprintf(row.host_id, sizeof(row.host_id), "%s", m->host_id);
        if (r < 0 || !row.owner || !row.key_id || !row.labels || (req->name && !row.name)) {
                warm_pool_put_back(m, pooled);
                sandbox_row_done(&row);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        }
        /* Hold the whole first lease, priced as busy, against the key's
         * budget before anything runs. */
        if (m->ledger) {
                LedgerBudget budget = { key->daily_limit_micros,
                                        key->trial ? cfg->trial_allowance_seconds : -1 };
                LedgerRefusal refusal;
                r = ledger_reserve(m->ledger, key->id, key->owner, row.id, &budget,
                                   (int64_t)ledger_cost_ceil(per_hour, req->spec.timeout_seconds), req->spec.timeout_seconds,
                                   row.created_at + req->spec.timeout_seconds + HELLO_TIMEOUT_MS / 1000, row.created_at,
                                   &refusal);
                if (r == -EDQUOT) {
                        warm_pool_put_back(m, pooled);
                        sandbox_row_done(&row);
                        return spending_refusal(m, e, &refusal, key->owner, key->id, NULL);
                }
                if (r < 0) {
                        log_error(rid, "reserving for sandbox %s: %s", row.id, strerror(-r));
                        warm_pool_put_back(m, pooled);
                        sandbox_row_done(&row);
                        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not reserve the sandbox's cost");
                }
        }
        busy_begin(m, row.id);
        if ((r = claim_volumes(m, key->owner, &row, d, e)) < 0) {
                if (m->ledger)
                        ledger_release(m->ledger, row.id, time_now_unix());
                busy_end(m, row.id);
                sandbox_row_done(&row);
                return r;
        }
        r = db_sandbox_insert(m->db, &row, cfg->max_sandboxes, cfg->max_sandboxes_per_key);
        if (r < 0 && row.spec.n_volumes > 0)
                (void)volumes_release(m->volumes, row.id);
        if (r < 0 && m->ledger)
                ledger_release(m->ledger, row.id, time_now_unix());
        /* A sandbox of the pool that no row took is no one's yet: back it goes. */
        if (r < 0)
                warm_pool_put_back(m, TAKE_PTR(pooled));
        if (r == -EUSERS || r == -EDQUOT) {
                busy_end(m, row.id);
                sandbox_row_done(&row);
                if (r == -EUSERS)
                        return sandbox_error(e, SANDBOX_ERR_TOO_MANY, "delete sandboxes you no longer need",
                                         "the daemon has its maximum of %u sandboxes", cfg->max_sandboxes);
                return sandbox_error(e, SANDBOX_ERR_TOO_MANY, "delete sandboxes you no longer need",
                                 "this key has its maximum of %u sandboxes (stopped ones count until deleted)",
                                 cfg->max_sandboxes_per_key);
        }
        if (r == -EOWNERDEAD || r == -ENOTCONN || r == -ETIMEDOUT) {
                busy_end(m, row.id);
                sandbox_row_done(&row);
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "try again, or another host of the service",
                                     "this host is cut off from the service's store");
        }
        if (r < 0) {
                busy_end(m, row.id);
                log_error(rid, "inserting sandbox: %s", strerror(-r));
                sandbox_row_done(&row);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the sandbox");
        }
        metrics_sandbox_created();
        events_emit(m->events, row.owner, "sandbox.created", "sandbox", row.id, key->id,
                    json_pack("{s:s,s:s,s:I}", "driver", sandbox_driver_name(row.spec.driver), "image",
                              row.spec.image, "timeoutSeconds", (json_int_t)row.spec.timeout_seconds));
        SandboxFacts created = sandbox_facts(&row);
        if (req->restore_dir) {
                /* Its disk starts as the snapshot's: made before the first
                 * start, which then finds a layer and keeps it. */
                r = restore_disk(m, &row, d, req->restore_dir, rid, e);
                if (r < 0) {
                        (void)row_finish(m, &row, SANDBOX_FAILED, "its disk could not be made from the snapshot");
                        if (m->ledger)
                                ledger_release(m->ledger, row.id, time_now_unix());
                        busy_end(m, row.id);
                        sandbox_row_done(&row);
                        return r;
                }
        }
        r = pooled ? warm_pool_hand_out_locked(m, &row, TAKE_PTR(pooled), req->spec.timeout_seconds, rid, e)
                   : boot_locked(m, &row, d, req->spec.timeout_seconds, rid, e);
        events_sandbox_change(m->events, &created, &row, key->id, NULL);
        busy_end(m, row.id);
        if (r < 0) {
                sandbox_row_done(&row);
                return r;
        }
        *ret = row;
        return 0;
}

int sandbox_create(Manager *m, const KeyInfo *key, const CreateRequest *req, const char *rid, SandboxRow *ret,
                   SandboxError *e) {
        /* The pool's refills wait while a client's create runs. */
        warm_pool_create_begin(m);
        int r = create(m, key, req, rid, ret, e);
        warm_pool_create_end(m);
        return r;
}

typedef struct Named {
        const char *name;
        char id[32];
        SandboxState state;
        int64_t created_ms;
} Named;

/* The oldest undeleted sandbox of the owner with the name. */
static int find_named(void *userdata, SandboxRow *row) {
        Named *c = userdata;
        if (!row->name || strcmp(row->name, c->name) != 0)
                return 0;
        int64_t created_ms = row->created_at * 1000 + row->created_msec;
        if (c->id[0] && created_ms > c->created_ms)
                return 0;
        snprintf(c->id, sizeof(c->id), "%s", row->id);
        c->state = row->state;
        c->created_ms = created_ms;
        return 0;
}

int sandbox_get_or_create(Manager *m, const KeyInfo *key, const CreateRequest *req, const char *rid,
                          SandboxRow *ret, bool *ret_reused, SandboxError *e) {
        if (!req->name)
                return sandbox_error(e, SANDBOX_ERR_INVALID, "give the sandbox a name to find it by",
                                     "getOrCreate needs a name");
        char lock[160];
        snprintf(lock, sizeof(lock), "owner/%s", key->owner);
        busy_begin(m, lock);
        /* The same name asked of two hosts at once: one claim in the shared
         * store (a record no client key can name: theirs have no '/') lets
         * one find-or-create run at a time for the owner's name, fleet-wide;
         * a host that dies holding it has it dropped with its claims. */
        char claim[300];
        snprintf(claim, sizeof(claim), "get-or-create/%s", req->name);
        uint64_t until = time_now_mono_ms() + GET_OR_CREATE_WAIT_MS;
        int r;
        for (;;) {
                unsigned status = 0;
                char *body = NULL;
                r = db_idem_claim(m->db, key->owner, claim, "get-or-create", time_now_unix(), &status, &body);
                free(body);
                if (r != STORE_IDEM_PENDING || time_now_mono_ms() >= until)
                        break;
                struct timespec ts = { .tv_sec = 0, .tv_nsec = 50 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
        if (r != STORE_IDEM_CLAIMED) {
                busy_end(m, lock);
                if (r < 0)
                        log_error(rid, "claiming the name %s: %s", req->name, strerror(-r));
                return r == STORE_IDEM_PENDING
                               ? sandbox_error(e, SANDBOX_ERR_CONFLICT, "send it again once it is done",
                                               "a getOrCreate of this name is still being served")
                               : sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "try again", "the store did not answer");
        }
        Named c = { .name = req->name };
        r = sandbox_list(m, key, find_named, &c, e);
        if (r == 0 && !c.id[0]) {
                *ret_reused = false;
                r = sandbox_create(m, key, req, rid, ret, e);
        } else if (r == 0) {
                *ret_reused = true;
                if (c.state == SANDBOX_FAILED || c.state == SANDBOX_LOST)
                        r = sandbox_error(e, SANDBOX_ERR_CONFLICT, "delete it, or create one under another name",
                                          "sandbox %s of that name has %s", c.id,
                                          c.state == SANDBOX_LOST ? "been lost with its host" : "failed");
                else if (c.state == SANDBOX_PAUSED)
                        r = sandbox_wake(m, key, c.id, 0, rid, ret, e);
                else if (c.state == SANDBOX_STOPPED)
                        r = sandbox_restart(m, key, c.id, rid, ret, e);
                else
                        r = sandbox_get(m, key, c.id, ret, e);
        }
        /* An answer of 500 is never kept: the claim goes. */
        (void)db_idem_finish(m->db, key->owner, claim, 500, NULL);
        busy_end(m, lock);
        return r;
}

int sandbox_get(Manager *m, const KeyInfo *key, const char *id, SandboxRow *ret, SandboxError *e) {
        return own_row(m, key, id, ret, e);
}

int sandbox_wait_state(Manager *m, const KeyInfo *key, const char *id, SandboxState state, int64_t timeout_ms,
                       SandboxRow *ret, SandboxError *e) {
        int64_t deadline = (int64_t)time_now_mono_ms() + timeout_ms;
        for (;;) {
                SandboxRow row;
                int r = own_row(m, key, id, &row, e);
                if (r < 0)
                        return r;
                if (row.state == state || (int64_t)time_now_mono_ms() >= deadline) {
                        *ret = row;
                        return 0;
                }
                sandbox_row_done(&row);
                /* Every lifecycle step ends with busy_end's broadcast; the
                 * bound catches the steps that do not pass there. */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 200 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                pthread_mutex_lock(&m->lock);
                pthread_cond_timedwait(&m->cond, &m->lock, &ts);
                pthread_mutex_unlock(&m->lock);
        }
}

int sandbox_list(Manager *m, const KeyInfo *key, StoreSandboxFn fn, void *userdata, SandboxError *e) {
        int r = db_sandbox_query(m->db, STORE_SANDBOXES_OF_OWNER, key->owner, 0, fn, userdata);
        if (r < 0) {
                log_error(NULL, "listing sandboxes: %s", strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not list sandboxes");
        }
        return 0;
}

int with_row(Manager *m, const KeyInfo *key, const char *id, RowOp op, void *arg, const char *rid,
                    SandboxRow *ret, SandboxError *e) {
        busy_begin(m, id);
        SandboxRow row;
        int r = own_row(m, key, id, &row, e);
        if (r < 0) {
                busy_end(m, id);
                return r;
        }
        /* Another host's drivers run it: a request about it reaches this
         * host only past the forwarding (a get-or-create that found it, an
         * old client of a moved sandbox). A lost one is the fleet's: its
         * row can be read and deleted anywhere. */
        if (row.host_id[0] && m->host_id[0] && strcmp(row.host_id, m->host_id) != 0 && row.state != SANDBOX_LOST)
                r = sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "send it to that host, or to any host with "
                                  "forwarding on (docs/fleet.md)", "sandbox %s runs on host %s", row.id, row.host_id);
        else {
                SandboxFacts before = sandbox_facts(&row);
                r = op(m, &row, arg, rid, e);
                if (r == 0)
                        events_sandbox_change(m->events, &before, &row, key->id, NULL);
        }
        busy_end(m, id);
        if (r == 0 && ret)
                *ret = row;
        else
                sandbox_row_done(&row);
        return r;
}

static int op_stop(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        if (row->state != SANDBOX_RUNNING && row->state != SANDBOX_PAUSED)
                return 0; /* stopping a stopped or failed sandbox is a no-op */
        int r = do_stop_locked(m, row, SANDBOX_STOPPED, NULL);
        if (r < 0) {
                log_error(rid, "stopping %s: %s", row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the stop");
        }
        log_info(rid, "sandbox %s stopped", row->id);
        return 0;
}

int sandbox_stop(Manager *m, const KeyInfo *key, const char *id, const char *rid, SandboxRow *ret,
                 SandboxError *e) {
        return with_row(m, key, id, op_stop, NULL, rid, ret, e);
}

static int op_delete(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        int r = do_delete_locked(m, row, rid);
        if (r < 0) {
                log_error(rid, "deleting %s: %s", row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the deletion");
        }
        log_info(rid, "sandbox %s deleted", row->id);
        return 0;
}

int sandbox_delete(Manager *m, const KeyInfo *key, const char *id, const char *rid, SandboxError *e) {
        return with_row(m, key, id, op_delete, NULL, rid, NULL, e);
}

/* Holds the running sandbox's whole life to new_end, priced as busy,
 * against its key's daily limit (what :extend and a longer lease do). */
int reserve_life(Manager *m, SandboxRow *row, uint64_t per_hour, int64_t life, int64_t new_end, int64_t now,
                        const char *rid, SandboxError *e) {
        if (!m->ledger)
                return 0;
        LedgerBudget budget;
        LedgerRefusal refusal;
        int r = ledger_key_budget(m->ledger, row->key_id, m->cfg->trial_allowance_seconds, &budget);
        if (r == 0)
                r = ledger_reserve(m->ledger, row->key_id, row->owner, row->id, &budget,
                                   (int64_t)ledger_cost_ceil(per_hour, life), life, new_end, now, &refusal);
        if (r == -EDQUOT)
                return spending_refusal(m, e, &refusal, row->owner, row->key_id, row->id);
        if (r < 0) {
                log_error(rid, "sandbox %s: reserving its new lease: %s", row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not reserve the new lease's cost");
        }
        return 0;
}

typedef struct ExtendArg {
        int64_t seconds;
} ExtendArg;

static int op_extend(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        int64_t seconds = ((const ExtendArg *)arg)->seconds;
        if (row->state != SANDBOX_RUNNING)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "create a new sandbox", "sandbox %s is %s, not running",
                                 row->id, sandbox_state_name(row->state));
        int64_t now = time_now_unix();
        int64_t base = row->lease_ends_at > now ? row->lease_ends_at : now;
        int64_t new_end = base + seconds;
        uint64_t per_hour = config_cost_per_hour(m->cfg, row->spec.vcpu, row->spec.memory_mib);
        /* The worst case of the sandbox's whole life with the new lease. */
        int64_t life = row->run_seconds + (row->started_at ? new_end - row->started_at : seconds);
        int64_t max = row->spec.max_total_cost_micros;
        if (max >= 0 && ledger_cost(per_hour, life) > (uint64_t)max)
                return budget_refusal(e, per_hour, life, 0, (uint64_t)max, "maxTotalCostMicros",
                                      "sandbox with this extension");
        int r = reserve_life(m, row, per_hour, life, new_end, now, rid, e);
        if (r < 0)
                return r;
        row->lease_ends_at = new_end;
        r = db_sandbox_update(m->db, row);
        if (r < 0) {
                log_error(rid, "extending %s: %s", row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the new lease");
        }
        return 0;
}

int sandbox_extend(Manager *m, const KeyInfo *key, const char *id, int64_t seconds, SandboxRow *ret,
                   SandboxError *e) {
        ExtendArg a = { seconds };
        return with_row(m, key, id, op_extend, &a, NULL, ret, e);
}

static int op_network(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        json_decref(row->spec.network);
        row->spec.network = json_incref((json_t *)arg);
        int r = db_sandbox_update(m->db, row);
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the network policy");
        /* Live: the next connection the sandbox opens follows the new policy. */
        pthread_mutex_lock(&m->lock);
        for (Sandbox *sb = m->live; sb; sb = sb->next)
                if (strcmp(sb->id, row->id) == 0 && sb->egress)
                        r = egress_sandbox_set_network(sb->egress, (json_t *)arg);
        pthread_mutex_unlock(&m->lock);
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        return 0;
}

int sandbox_set_network(Manager *m, const KeyInfo *key, const char *id, json_t *network, SandboxRow *ret,
                        SandboxError *e) {
        return with_row(m, key, id, op_network, network, NULL, ret, e);
}
