#include "daemon/sandbox.h"

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
#include "daemon/agent_client.h"
#include "daemon/console_tail.h"
#include "daemon/ledger.h"
#include "common/log.h"
#include "daemon/metrics.h"

#define HELLO_TIMEOUT_MS 30000
/* The agent heartbeat: a ping every interval; a sandbox whose agent sends
 * nothing at all for the timeout while a ping waits is failed. */
#define HEARTBEAT_INTERVAL_MS 5000
#define HEARTBEAT_TIMEOUT_MS 30000
#define SANDBOX_PIDS_MAX 4096

/* Strings of a DriverSpec, made from a sandbox's row. */
typedef struct SpecPaths {
        char *sandbox_dir;
        char *image_dir;
} SpecPaths;

static void spec_paths_done(SpecPaths *p) {
        free(p->sandbox_dir);
        free(p->image_dir);
}

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
        bool running;  /* under lock: live and serving */
        bool stopping; /* under lock: being stopped on purpose */
        bool died;     /* under lock: queued as dead */
        bool paused;   /* under lock: frozen by driver->pause */
        int64_t paused_at_ms, paused_total_ms; /* under lock: monotonic, for sandbox_paused_ms */
        _Atomic bool auto_wake; /* a request to it while paused wakes it */
        _Atomic unsigned idle_pause_s; /* 0: never paused for idleness */
        _Atomic bool run_as_root; /* requests that name no user run as root */
        _Atomic int64_t active_ms; /* monotonic ms of the last request that used it */
        char closed_reason[128];
        /* Under lock: why the daemon itself failed the sandbox (heartbeat,
         * an exec that found its agent silent); shown to the client, and
         * never overwritten by the channel closing afterwards. */
        char fail_reason[128];
        Sandbox *next;      /* live list, under m->lock */
        Sandbox *next_dead; /* dead queue, under m->lock */
};

/* Ids with a lifecycle operation in progress: operations on one sandbox run
 * one at a time, on different sandboxes concurrently. */
typedef struct BusyId {
        char id[32];
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
};


/* ---- live objects ---- */

static void sandbox_unref(Sandbox *sb) {
        if (!sb || atomic_fetch_sub(&sb->refs, 1) != 1)
                return;
        channel_free(sb->channel);
        egress_sandbox_unref(sb->egress);
        json_decref(sb->env);
        spec_paths_done(&sb->paths);
        pthread_mutex_destroy(&sb->lock);
        free(sb);
}

void sandbox_release(Sandbox *sb) {
        if (sb)
                atomic_store(&sb->active_ms, (int64_t)time_now_mono_ms());
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

const char *sandbox_id(Sandbox *sb) {
        return sb->id;
}

int64_t sandbox_driver_heartbeat_ms(Sandbox *sb) {
        return sb->driver->heartbeat_timeout_ms ? (int64_t)sb->driver->heartbeat_timeout_ms : HEARTBEAT_TIMEOUT_MS;
}

unsigned sandbox_memory_mib(Sandbox *sb) {
        return sb->memory_mib;
}

/* Takes sb off the live list; the caller then owns the list's reference.
 * NULL when it was not live. */
static Sandbox *live_take(Manager *m, const char *id) {
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

static void busy_begin(Manager *m, const char *id) {
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

static void busy_end(Manager *m, const char *id) {
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
static void queue_dead(Sandbox *sb) {
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

static void handle_dead(Manager *m, Sandbox *sb);
static void pause_by_daemon(Manager *m, SandboxRow *row, const char *why);
static void guest_sync(Manager *m, const char *id, const char *rid, int timeout_ms, const char *before);
static void idle_check(Manager *m, Sandbox *sb, int64_t now_ms);

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

static void on_channel_closed(void *userdata, const char *reason) {
        Sandbox *sb = userdata;
        pthread_mutex_lock(&sb->lock);
        snprintf(sb->closed_reason, sizeof(sb->closed_reason), "%s", reason ? reason : "closed");
        pthread_mutex_unlock(&sb->lock);
        queue_dead(sb);
}

/* Kills the sandbox's processes (driver->stop). The reason the driver saw, if
 * the sandbox had died on its own. */
static const char *live_stop(Sandbox *sb) {
        const char *why = NULL;
        pthread_mutex_lock(&sb->lock);
        sb->stopping = true;
        sb->running = false;
        sb->paused = false;
        if (sb->inst) {
                sb->driver->stop(sb->inst, &why);
                sb->inst = NULL;
        }
        pthread_mutex_unlock(&sb->lock);
        return why;
}

/* ---- rows and JSON ---- */

static int spec_paths(Manager *m, const char *id, const char *image, SpecPaths *ret) {
        SpecPaths p = { 0 };
        if (asprintf(&p.sandbox_dir, "%s/sandboxes/%s", m->cfg->state_dir, id) < 0) {
                p.sandbox_dir = NULL;
                return -ENOMEM;
        }
        if (asprintf(&p.image_dir, "%s/%s", m->cfg->image_dir, image) < 0) {
                p.image_dir = NULL;
                spec_paths_done(&p);
                return -ENOMEM;
        }
        *ret = p;
        return 0;
}

static void driver_spec_from(Manager *m, const char *id, const SandboxSpec *spec, const SpecPaths *p,
                             DriverSpec *ds) {
        *ds = (DriverSpec){
                .id = id,
                .vcpu = spec->vcpu,
                .memory_mib = spec->memory_mib,
                .disk_mib = spec->disk_mib,
                .pids_max = SANDBOX_PIDS_MAX,
                .image_dir = p->image_dir,
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
static int own_row(Manager *m, const KeyInfo *key, const char *id, SandboxRow *ret, SandboxError *e) {
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

static int set_reason(SandboxRow *r, const char *reason) {
        if (reason == r->failure_reason)
                return 0;
        free(r->failure_reason);
        r->failure_reason = reason ? strdup(reason) : NULL;
        return reason && !r->failure_reason ? -ENOMEM : 0;
}

/* The ledger keeps a paused sandbox's disk charge apart from its running
 * charges, under this name: each series prices its seconds at one rate. */
static void disk_series(const char *id, char *buf, size_t n) {
        snprintf(buf, n, "%s" LEDGER_DISK_SUFFIX, id);
}

/* Closes a paused sandbox's disk charge at `end` and adds its paused time to
 * the row; the row's pausedAt goes. */
static void row_end_pause(Manager *m, SandboxRow *r, int64_t end, int64_t now) {
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
static int row_finish(Manager *m, SandboxRow *r, SandboxState state, const char *reason) {
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

static const char *failure_text(const char *driver_why, const char *fail_reason, const char *channel_reason,
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

static int do_stop_locked(Manager *m, SandboxRow *row, SandboxState state, const char *reason) {
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

static int do_delete_locked(Manager *m, SandboxRow *row, const char *rid) {
        int r = do_stop_locked(m, row, SANDBOX_STOPPED, row->failure_reason);
        if (r < 0)
                return r;
        const Driver *d = driver_by_name(row->spec.driver);
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
        /* After the row: an upload the next start finds of a deleted
         * sandbox goes then. */
        if (r == 0)
                uploads_drop_sandbox(m->uploads, row->id);
        return r;
}

/* Appends the last lines of the driver's console log, if it keeps one, to a
 * failure text: what a guest kernel printed as it died (a panic, an oops) is
 * the first thing anyone debugging it needs. text stays as it is otherwise. */
static void append_console_tail(const Sandbox *sb, char *text, size_t n) {
        if (!sb->driver->console_log || !sb->paths.sandbox_dir)
                return;
        char tail[CONSOLE_TAIL_MAX + 1];
        if (console_tail_read(sb->paths.sandbox_dir, sb->driver->console_log, tail, sizeof(tail)) < 0 || !*tail)
                return;
        size_t len = strlen(text);
        if (len + 1 < n)
                snprintf(text + len, n - len, "; console:\n%s", tail);
}

static void handle_dead(Manager *m, Sandbox *sb) {
        busy_begin(m, sb->id);
        Sandbox *was_live = live_take(m, sb->id);
        if (was_live) {
                const char *why = live_stop(sb);
                char buf[160], reason[128], fail[128];
                pthread_mutex_lock(&sb->lock);
                snprintf(reason, sizeof(reason), "%s", sb->closed_reason);
                snprintf(fail, sizeof(fail), "%s", sb->fail_reason);
                pthread_mutex_unlock(&sb->lock);
                /* After driver->stop: the console's writer is done with it. */
                char text[sizeof(buf) + 16 + CONSOLE_TAIL_MAX];
                snprintf(text, sizeof(text), "%s", failure_text(why, fail, reason, buf, sizeof(buf)));
                append_console_tail(sb, text, sizeof(text));
                SandboxRow row;
                if (db_sandbox_get(m->db, sb->id, &row) == 0) {
                        if (row.state == SANDBOX_RUNNING) {
                                int r = row_finish(m, &row, SANDBOX_FAILED, text);
                                if (r < 0)
                                        log_error(NULL, "recording the failure of %s: %s", sb->id, strerror(-r));
                        }
                        sandbox_row_done(&row);
                }
                log_warn(NULL, "sandbox %s failed: %s (driver: %s, channel: %s)", sb->id, text, why ? why : "alive",
                         reason);
                sandbox_unref(was_live);
        }
        busy_end(m, sb->id);
}

static int lease_due(void *userdata, SandboxRow *row) {
        Manager *m = userdata;
        char id[32];
        snprintf(id, sizeof(id), "%s", row->id);
        busy_begin(m, id);
        SandboxRow cur;
        /* Re-read under the id's lock: an :extend may have won the race. */
        if (db_sandbox_get(m->db, id, &cur) == 0) {
                bool del = cur.spec.on_lease_end == LEASE_END_DELETE;
                bool pause = cur.spec.on_lease_end == LEASE_END_PAUSE;
                if (pause && cur.lease_ends_at && cur.lease_ends_at <= time_now_unix() && cur.state == SANDBOX_RUNNING) {
                        pause_by_daemon(m, &cur, "its lease ended");
                        /* One that cannot pause is stopped, as a lease end must end its spending. */
                        if (cur.state == SANDBOX_RUNNING && do_stop_locked(m, &cur, SANDBOX_STOPPED, NULL) == 0)
                                log_info(NULL, "lease of sandbox %s ended: stopped", id);
                } else if (cur.lease_ends_at && cur.lease_ends_at <= time_now_unix() &&
                    (cur.state == SANDBOX_RUNNING || (del && cur.state != SANDBOX_STARTING))) {
                        int r = del ? do_delete_locked(m, &cur, NULL) : do_stop_locked(m, &cur, SANDBOX_STOPPED, NULL);
                        if (r < 0)
                                log_error(NULL, "lease end of %s: %s", id, strerror(-r));
                        else
                                log_info(NULL, "lease of sandbox %s ended: %s", id, del ? "deleted" : "stopped");
                }
                sandbox_row_done(&cur);
        }
        busy_end(m, id);
        return 0;
}

static void format_seconds(char *buf, size_t n, int64_t ms) {
        if (ms % 1000 == 0)
                snprintf(buf, n, "%lld s", (long long)(ms / 1000));
        else
                snprintf(buf, n, "%.1f s", (double)ms / 1000.0);
}

/* One live sandbox's health: its driver's supervisor still there (one killed
 * from outside leaves an agent that may answer but is no longer contained as
 * started), and its agent still answering the heartbeat (a hung guest kernel,
 * a stopped agent, a frozen cgroup: alive processes, nothing said). */
static void check_one(Manager *m, Sandbox *sb, int64_t now_ms) {
        pthread_mutex_lock(&sb->lock);
        bool live = sb->running && !sb->stopping && !sb->died;
        bool paused = sb->paused;
        bool gone = live && sb->inst && sb->driver->alive && !sb->driver->alive(sb->inst);
        if (gone)
                snprintf(sb->closed_reason, sizeof(sb->closed_reason), "%s",
                         "the sandbox's supervisor process was killed");
        pthread_mutex_unlock(&sb->lock);
        if (gone) {
                log_warn(NULL, "sandbox %s: its %s supervisor exited; marking it failed", sb->id, sb->driver->name);
                queue_dead(sb);
                return;
        }
        /* A paused agent is silent on purpose. */
        if (!live || !sb->channel || paused)
                return;
        int64_t timeout = m->hb_timeout_ms ? m->hb_timeout_ms
                          : sb->driver->heartbeat_timeout_ms ? (int64_t)sb->driver->heartbeat_timeout_ms
                                                              : HEARTBEAT_TIMEOUT_MS;
        /* -EPIPE: the channel closed, and its reader queues the sandbox. */
        if (channel_heartbeat(sb->channel, now_ms, m->hb_interval_ms, timeout) != -ETIMEDOUT)
                return;
        char secs[32];
        format_seconds(secs, sizeof(secs), timeout);
        pthread_mutex_lock(&sb->lock);
        /* Unless it died, was stopped or paused meanwhile. */
        live = sb->running && !sb->stopping && !sb->died && !sb->paused;
        if (live) {
                snprintf(sb->fail_reason, sizeof(sb->fail_reason), "the agent stopped answering (no reply for %s)",
                         secs);
                snprintf(sb->closed_reason, sizeof(sb->closed_reason), "%s", sb->fail_reason);
        }
        pthread_mutex_unlock(&sb->lock);
        if (!live)
                return;
        log_warn(NULL, "sandbox %s: its agent sent nothing for %s while a ping waited; marking it failed", sb->id,
                 secs);
        queue_dead(sb);
}

static void check_live(Manager *m) {
        enum { BATCH = 64 };
        Sandbox *stack[BATCH];
        pthread_mutex_lock(&m->lock);
        size_t count = 0;
        for (Sandbox *sb = m->live; sb; sb = sb->next)
                count++;
        /* Every live sandbox, every round: a heartbeat skipped is a sandbox
         * never found dead. Without memory, the first BATCH this round. */
        Sandbox **held = count > BATCH ? malloc(count * sizeof(*held)) : NULL;
        size_t cap = held ? count : BATCH;
        if (!held)
                held = stack;
        size_t n = 0;
        for (Sandbox *sb = m->live; sb && n < cap; sb = sb->next) {
                atomic_fetch_add(&sb->refs, 1);
                held[n++] = sb;
        }
        pthread_mutex_unlock(&m->lock);
        int64_t now = (int64_t)time_now_mono_ms();
        for (size_t i = 0; i < n; i++) {
                check_one(m, held[i], now);
                idle_check(m, held[i], now);
                sandbox_unref(held[i]);
        }
        if (held != stack)
                free(held);
}

static void *maintenance_thread(void *userdata) {
        Manager *m = userdata;
        pthread_mutex_lock(&m->lock);
        while (!m->quit) {
                Sandbox *dead = m->dead;
                m->dead = NULL;
                pthread_mutex_unlock(&m->lock);
                while (dead) {
                        Sandbox *next = dead->next_dead;
                        handle_dead(m, dead);
                        sandbox_unref(dead);
                        dead = next;
                }
                check_live(m);
                int r = db_sandbox_query(m->db, STORE_SANDBOXES_LEASE_DUE, NULL, time_now_unix(), lease_due, m);
                if (r < 0)
                        log_error(NULL, "checking leases: %s", strerror(-r));
                pthread_mutex_lock(&m->lock);
                if (m->quit || m->dead)
                        continue;
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&m->cond, &m->lock, &ts);
        }
        pthread_mutex_unlock(&m->lock);
        return NULL;
}

/* ---- manager ---- */

int manager_new(const DaemonConfig *cfg, Db *db, Manager **ret) {
        Manager *m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->cfg = cfg;
        m->db = db;
        m->hb_interval_ms = HEARTBEAT_INTERVAL_MS;
        pthread_mutex_init(&m->lock, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_cond_init(&m->cond, &ca);
        pthread_condattr_destroy(&ca);
        *ret = m;
        return 0;
}

static int recover_one(void *userdata, SandboxRow *row) {
        Manager *m = userdata;
        const Driver *d = driver_by_name(row->spec.driver);
        SpecPaths p = { 0 };
        if (d && spec_paths(m, row->id, row->spec.image, &p) == 0) {
                DriverSpec ds;
                driver_spec_from(m, row->id, &row->spec, &p, &ds);
                int r = d->reap_orphan(&ds);
                if (r < 0)
                        log_error(NULL, "cleaning up after sandbox %s: %s", row->id, strerror(-r));
        } else
                log_error(NULL, "sandbox %s: unknown driver, nothing to clean up", row->id);
        spec_paths_done(&p);
        /* Nobody could use the sandbox once the daemon was gone: bill it up
         * to the last heartbeat the ledger has (at most the lease end), the
         * same seconds in the ledger and in the row. Without an open charge
         * there is nothing to bill. */
        int64_t now = time_now_unix();
        int64_t cap = row->lease_ends_at && row->lease_ends_at < now ? row->lease_ends_at : now;
        int64_t end = row->started_at;
        if (m->ledger) {
                int lr = ledger_settle_at_heartbeat(m->ledger, row->id, cap, now, &end);
                if (lr == -ENOENT)
                        end = row->started_at;
                else if (lr < 0)
                        log_error(NULL, "sandbox %s: settling its charge: %s", row->id, strerror(-lr));
        } else
                end = cap;
        if (row->started_at && (row->state == SANDBOX_RUNNING || row->state == SANDBOX_PAUSING)) {
                if (end > row->started_at)
                        row->run_seconds += end - row->started_at;
        }
        /* A paused one (or one between pause and wake) had its disk's charge
         * open: closed at the same heartbeat. Its memory is gone with its
         * processes; it boots again from its files. */
        if (row->state == SANDBOX_PAUSED || row->state == SANDBOX_RESUMING) {
                int64_t disk_end = now;
                if (m->ledger) {
                        char series[48];
                        disk_series(row->id, series, sizeof(series));
                        int lr = ledger_settle_at_heartbeat(m->ledger, series, now, now, &disk_end);
                        if (lr < 0 && lr != -ENOENT)
                                log_error(NULL, "sandbox %s: settling its paused disk: %s", row->id, strerror(-lr));
                        if (lr == -ENOENT)
                                disk_end = now;
                }
                int64_t at = row->spec.paused_at;
                if (at > 0 && disk_end > at)
                        row->spec.paused_seconds += disk_end - at;
                row->spec.paused_at = 0;
        }
        row->state = SANDBOX_STOPPED;
        row->stopped_at = time_now_unix();
        set_reason(row, "daemon restarted");
        int r = db_sandbox_update(m->db, row);
        log_info(NULL, "sandbox %s was running when the daemon stopped: now stopped", row->id);
        return r;
}

int manager_recover(Manager *m) {
        int r = db_sandbox_query(m->db, STORE_SANDBOXES_ACTIVE, NULL, 0, recover_one, m);
        if (r < 0)
                return r;
        if (m->ledger && (r = ledger_settle_orphans(m->ledger, time_now_unix())) < 0)
                log_error(NULL, "settling reservations left by a crash: %s", strerror(-r));
        return db_sandbox_query(m->db, STORE_SANDBOXES_LEASE_DUE, NULL, time_now_unix(), lease_due, m);
}

/* Moves the ledger's heartbeat every LEDGER_HEARTBEAT_SECONDS: after a
 * crash, running sandboxes are billed up to the last beat. */
static void *heartbeat_thread(void *userdata) {
        Manager *m = userdata;
        int64_t last = 0;
        pthread_mutex_lock(&m->lock);
        while (!m->quit) {
                int64_t now = time_now_unix();
                if (now - last >= LEDGER_HEARTBEAT_SECONDS || now < last) {
                        pthread_mutex_unlock(&m->lock);
                        int r = ledger_heartbeat(m->ledger, now);
                        if (r < 0)
                                log_error(NULL, "ledger heartbeat: %s", strerror(-r));
                        last = now;
                        pthread_mutex_lock(&m->lock);
                        continue;
                }
                /* m->cond is also broadcast by every lifecycle step: wake,
                 * check the time, sleep again. */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&m->cond, &m->lock, &ts);
        }
        pthread_mutex_unlock(&m->lock);
        return NULL;
}

void manager_set_ledger(Manager *m, Ledger *ledger) {
        m->ledger = ledger;
}

void manager_set_heartbeat(Manager *m, int64_t interval_ms, int64_t timeout_ms) {
        if (interval_ms > 0)
                m->hb_interval_ms = interval_ms;
        if (timeout_ms > 0)
                m->hb_timeout_ms = timeout_ms;
}

void manager_set_snapshots(Manager *m, SnapshotStore *snapshots) {
        m->snapshots = snapshots;
}

void manager_set_uploads(Manager *m, Uploads *uploads) {
        m->uploads = uploads;
}

void manager_set_egress(Manager *m, EgressService *egress) {
        m->egress = egress;
}

int manager_start(Manager *m) {
        int r = pthread_create(&m->thread, NULL, maintenance_thread, m);
        if (r != 0)
                return -r;
        m->thread_started = true;
        if (m->ledger) {
                r = pthread_create(&m->beat_thread, NULL, heartbeat_thread, m);
                if (r != 0)
                        return -r;
                m->beat_started = true;
        }
        return 0;
}

void manager_shutdown(Manager *m) {
        pthread_mutex_lock(&m->lock);
        m->quit = true;
        pthread_cond_broadcast(&m->cond);
        pthread_mutex_unlock(&m->lock);
        if (m->thread_started) {
                pthread_join(m->thread, NULL);
                m->thread_started = false;
        }
        if (m->beat_started) {
                pthread_join(m->beat_thread, NULL);
                m->beat_started = false;
        }
        for (;;) {
                pthread_mutex_lock(&m->lock);
                Sandbox *sb = m->live;
                char id[32] = "";
                if (sb)
                        snprintf(id, sizeof(id), "%s", sb->id);
                pthread_mutex_unlock(&m->lock);
                if (!sb)
                        break;
                busy_begin(m, id);
                SandboxRow row;
                if (db_sandbox_get(m->db, id, &row) == 0) {
                        do_stop_locked(m, &row, SANDBOX_STOPPED, NULL);
                        sandbox_row_done(&row);
                } else {
                        Sandbox *t = live_take(m, id);
                        if (t) {
                                live_stop(t);
                                sandbox_unref(t);
                        }
                }
                busy_end(m, id);
                log_info(NULL, "sandbox %s stopped for shutdown", id);
        }
        /* Sandboxes that died while shutting down. */
        pthread_mutex_lock(&m->lock);
        Sandbox *dead = m->dead;
        m->dead = NULL;
        pthread_mutex_unlock(&m->lock);
        while (dead) {
                Sandbox *next = dead->next_dead;
                sandbox_unref(dead);
                dead = next;
        }
}

void manager_free(Manager *m) {
        if (!m)
                return;
        pthread_mutex_destroy(&m->lock);
        pthread_cond_destroy(&m->cond);
        free(m);
}

/* ---- API operations ---- */

static int check_image(Manager *m, const char *image, SandboxError *e) {
        _cleanup_free_ char *rootfs = NULL;
        if (asprintf(&rootfs, "%s/%s/rootfs", m->cfg->image_dir, image) < 0) {
                rootfs = NULL;
                return -ENOMEM;
        }
        struct stat st;
        if (stat(rootfs, &st) < 0 || !S_ISDIR(st.st_mode))
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "build it with: runtime image build",
                                 "the image %s is not built", image);
        return 0;
}

static void dollars(char *buf, size_t n, int64_t micros) {
        snprintf(buf, n, "$%lld.%06lld", (long long)(micros / 1000000), (long long)(micros % 1000000));
}

/* 409 budget_exceeded: the price of `seconds` more of the sandbox and how to
 * fit under the cap, with numbers. `spent` is what it cost already. */
static int budget_refusal(SandboxError *e, uint64_t per_hour, int64_t seconds, uint64_t spent, uint64_t cap,
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
static int spending_refusal(SandboxError *e, const LedgerRefusal *f, const char *key_id) {
        char when[160] = "";
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
static json_t *spec_sandbox_env(Manager *m, const char *owner, const SandboxSpec *spec) {
        json_t *env = spec->env;
        if (!m->egress)
                return env ? json_deep_copy(env) : json_object();
        /* The egress secrets it may use: none named in the spec is every one. */
        json_t *all = egress_service_sandbox_env(m->egress, owner, spec->secrets);
        if (all && env && json_object_update(all, env) < 0)
                json_decref(TAKE_PTR(all));
        return all;
}

/* Starts the sandbox of `row` on driver d, with a lease of lease_seconds:
 * a new one, or a stopped one again on its own files (its memory is not
 * kept). Everything it needs besides comes from the row. Under
 * busy_begin(row->id), with the row's reservation held. On success the row
 * is running; on failure it is recorded failed and e is filled. */
static int boot_locked(Manager *m, SandboxRow *row, const Driver *d, int64_t lease_seconds, const char *rid,
                       SandboxError *e) {
        const DaemonConfig *cfg = m->cfg;
        const SandboxSpec *spec = &row->spec;
        _cleanup_json_ json_t *hello = NULL;
        Sandbox *sb = calloc(1, sizeof(*sb));
        const char *fail = NULL;
        DriverError start_err = { .reason = "" }; /* the driver's words, for failureReason */
        int fail_status = 503;
        int r;
        row->state = SANDBOX_STARTING;
        if (!sb || spec_paths(m, row->id, spec->image, &sb->paths) < 0) {
                free(sb);
                sb = NULL;
                fail = "out of memory";
                goto failed;
        }
        if ((r = db_sandbox_update(m->db, row)) < 0) {
                free(sb->paths.sandbox_dir);
                free(sb->paths.image_dir);
                free(sb);
                sb = NULL;
                fail = "could not record the sandbox";
                fail_status = 500;
                goto failed;
        }
        bool trial = spec->trial;
        json_t *network = spec->network;
        /* The egress secrets it may use: none named in the spec is every one. */
        const json_t *scope = spec->secrets;
        uint64_t per_hour = config_cost_per_hour(cfg, spec->vcpu, spec->memory_mib);
        sb->m = m;
        atomic_init(&sb->refs, 1);
        atomic_init(&sb->active_ms, (int64_t)time_now_mono_ms());
        pthread_mutex_init(&sb->lock, NULL);
        snprintf(sb->id, sizeof(sb->id), "%s", row->id);
        snprintf(sb->owner, sizeof(sb->owner), "%s", row->owner);
        sb->driver = d;
        atomic_init(&sb->auto_wake, spec->auto_wake);
        atomic_init(&sb->idle_pause_s, spec->idle_pause_seconds > 0 && spec->idle_pause_seconds < UINT32_MAX
                                               ? (unsigned)spec->idle_pause_seconds : 0);
        atomic_init(&sb->run_as_root, row->run_as_root);
        sb->env = spec_sandbox_env(m, row->owner, spec);
        {
                _cleanup_free_ char *parent = NULL;
                if (asprintf(&parent, "%s/sandboxes", cfg->state_dir) >= 0)
                        (void)mkdir(parent, 0700);
                else
                        parent = NULL;
        }
        DriverSpec ds;
        driver_spec_from(m, sb->id, spec, &sb->paths, &ds);
        sb->memory_mib = ds.memory_mib;
        uint64_t t0 = time_now_mono_ms();
        int fd = -1;
        r = d->start(&ds, &fd, &sb->inst, &start_err);
        if (r < 0) {
                log_error(rid, "sandbox %s: driver %s failed to start: %s%s%s", row->id, d->name, strerror(-r),
                          start_err.reason[0] ? ": " : "", start_err.reason);
                fail = start_err.reason[0]   ? start_err.reason
                       : r == -ENOENT        ? "the image is missing or incomplete"
                       : r == -ENOSPC        ? "the host is out of disk space"
                       : r == -EPERM || r == -EACCES ? "the driver lacks a privilege it needs on this host"
                                                    : "the sandbox failed to start";
                sb->inst = NULL;
                goto failed;
        }
        sb->channel = channel_new(fd, on_channel_closed, sb);
        if (!sb->channel || !sb->env) {
                log_error(rid, "sandbox %s: cannot set up the agent channel", row->id);
                fail = "the sandbox failed to start";
                goto failed;
        }
        if (m->egress) {
                if (egress_sandbox_new(m->egress, sb->id, row->owner, network, scope, trial, &sb->egress) < 0) {
                        fail = "out of memory";
                        goto failed;
                }
                channel_set_acceptor(sb->channel, egress_sandbox_accept, sb->egress);
        }
        int hello_ms = d->hello_timeout_ms ? (int)d->hello_timeout_ms : HELLO_TIMEOUT_MS;
        r = channel_wait_hello(sb->channel, hello_ms, &hello);
        if (r < 0) {
                log_error(rid, "sandbox %s: no hello from the agent: %s", row->id, strerror(-r));
                fail = r == -ETIMEDOUT ? "the sandbox's agent did not answer in time"
                                       : "the sandbox's agent exited while starting";
                goto failed;
        }
        /* The egress CA in the sandbox's trust store, so that HTTPS to hosts a
         * secret applies to verifies; without it only those connections fail. */
        if (m->egress && (r = egress_service_install_ca(m->egress, sb->channel, sb->paths.image_dir)) < 0)
                log_warn(rid, "sandbox %s: could not add the egress CA to its trust store: %s", row->id,
                         strerror(-r));
        int64_t now = time_now_unix();
        row->started_at = now;
        row->lease_ends_at = now + lease_seconds;
        set_reason(row, NULL);
        row->state = SANDBOX_RUNNING;
        if ((r = db_sandbox_update(m->db, row)) < 0) {
                log_error(rid, "sandbox %s: recording the start: %s", row->id, strerror(-r));
                fail = "could not record the sandbox";
                fail_status = 500;
                goto failed;
        }
        /* No sandbox runs without its charge open: nothing is ever free by accident. */
        if (m->ledger && (r = ledger_begin(m->ledger, row->id, row->key_id, row->owner, now, per_hour,
                                                row->lease_ends_at)) < 0) {
                log_error(rid, "sandbox %s: opening its charge: %s", row->id, strerror(-r));
                fail = "could not record the sandbox's charge";
                fail_status = 500;
                goto failed;
        }
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
        log_info(rid, "sandbox %s running (driver %s, %llu ms)", row->id, d->name,
                 (unsigned long long)(time_now_mono_ms() - t0));
        sandbox_unref(sb);
        return 0;

failed:;
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
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "%s", fail);
        return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "GET /v1/info shows what this host can run; the daemon's log has details",
                         "%s", fail);
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
        int r = d->restore_disk(&ds, snap_dir);
        spec_paths_done(&p);
        if (r < 0) {
                log_error(rid, "sandbox %s: making its disk from a snapshot: %s", row->id, strerror(-r));
                if (r == -ENOSPC)
                        return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "free disk space on the host, or delete snapshots",
                                             "the host has no room for the sandbox's disk");
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not make the sandbox's disk from the snapshot");
        }
        return 0;
}

int sandbox_create(Manager *m, const KeyInfo *key, const CreateRequest *req, const char *rid, SandboxRow *ret,
                   SandboxError *e) {
        const DaemonConfig *cfg = m->cfg;
        const Driver *d;
        if (req->spec.driver) {
                const DriverOffer *o = config_driver_offer(cfg, req->spec.driver);
                if (!o)
                        return sandbox_error(e, SANDBOX_ERR_INVALID, "GET /v1/info lists the drivers",
                                         "driver must be one of the daemon's drivers; %s is not", req->spec.driver);
                if (!o->available)
                        return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "GET /v1/info lists the drivers this host runs",
                                         "driver %s cannot run on this host: %s", req->spec.driver, o->reason);
                if (!o->offered)
                        return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "GET /v1/info lists the drivers this host runs",
                                         "driver %s is not offered by this daemon", req->spec.driver);
                d = o->driver;
        } else if (!(d = cfg->default_driver))
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "run runtimed --doctor to see what this host lacks",
                                 "no driver can run sandboxes on this host");
        int r = check_image(m, req->spec.image, e);
        if (r < 0)
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

        char hex[21];
        if ((r = random_hex(hex, 10)) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not make an id");
        SandboxRow row = { 0 };
        snprintf(row.id, sizeof(row.id), "sbx_%s", hex);
        row.owner = strdup(key->owner);
        row.key_id = strdup(key->id);
        row.name = req->name ? strdup(req->name) : NULL;
        row.labels = json_dumps(req->labels, JSON_COMPACT);
        r = sandbox_spec_copy(&req->spec, &row.spec);
        if (r == 0) {
                free(row.spec.driver);
                row.spec.driver = strdup(d->name);
                if (row.spec.idle_pause_seconds > 0 && row.spec.idle_pause_seconds < (int64_t)cfg->idle_pause_min_seconds)
                        row.spec.idle_pause_seconds = cfg->idle_pause_min_seconds;
                /* A trial key's sandbox says so: its egress is to be narrower. */
                row.spec.trial = key->trial;
                row.spec.paused_at = row.spec.lease_left_seconds = row.spec.paused_seconds = 0;
        }
        row.state = SANDBOX_STARTING;
        row.created_at = time_now_unix();
        row.run_as_root = req->run_as_root;
        if (r < 0 || !row.owner || !row.key_id || !row.labels || !row.spec.driver || (req->name && !row.name)) {
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
                        sandbox_row_done(&row);
                        return spending_refusal(e, &refusal, key->id);
                }
                if (r < 0) {
                        log_error(rid, "reserving for sandbox %s: %s", row.id, strerror(-r));
                        sandbox_row_done(&row);
                        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not reserve the sandbox's cost");
                }
        }
        busy_begin(m, row.id);
        r = db_sandbox_insert(m->db, &row, cfg->max_sandboxes, cfg->max_sandboxes_per_key);
        if (r < 0 && m->ledger)
                ledger_release(m->ledger, row.id, time_now_unix());
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
        if (r < 0) {
                busy_end(m, row.id);
                log_error(rid, "inserting sandbox: %s", strerror(-r));
                sandbox_row_done(&row);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the sandbox");
        }
        metrics_sandbox_created();
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
        r = boot_locked(m, &row, d, req->spec.timeout_seconds, rid, e);
        busy_end(m, row.id);
        if (r < 0) {
                sandbox_row_done(&row);
                return r;
        }
        *ret = row;
        return 0;
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

/* Runs op on the row of an owned sandbox under the id's lifecycle lock and
 * answers the sandbox afterwards. */
typedef int (*RowOp)(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e);

static int with_row(Manager *m, const KeyInfo *key, const char *id, RowOp op, void *arg, const char *rid,
                    SandboxRow *ret, SandboxError *e) {
        busy_begin(m, id);
        SandboxRow row;
        int r = own_row(m, key, id, &row, e);
        if (r < 0) {
                busy_end(m, id);
                return r;
        }
        r = op(m, &row, arg, rid, e);
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
static int reserve_life(Manager *m, SandboxRow *row, uint64_t per_hour, int64_t life, int64_t new_end, int64_t now,
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
                return spending_refusal(e, &refusal, row->key_id);
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

/* ---- pause, wake, restart (under busy_begin(id)) ---- */

static Sandbox *live_get(Manager *m, const char *id) {
        Sandbox *found = NULL;
        pthread_mutex_lock(&m->lock);
        for (Sandbox *s = m->live; s; s = s->next)
                if (strcmp(s->id, id) == 0) {
                        found = s;
                        atomic_fetch_add(&s->refs, 1);
                        break;
                }
        pthread_mutex_unlock(&m->lock);
        return found;
}

static uint64_t disk_cost_per_hour(Manager *m, const SandboxSpec *spec) {
        return ledger_cost(m->cfg->price_disk_gib_hour_micros * 3600u, (int64_t)spec->disk_mib) / 1024u;
}

uint64_t sandbox_row_paused_cost(Manager *m, const SandboxRow *r, int64_t now) {
        int64_t secs = r->spec.paused_seconds;
        int64_t at = r->spec.paused_at;
        if (r->state == SANDBOX_PAUSED && at > 0 && now > at)
                secs += now - at;
        return ledger_cost(disk_cost_per_hour(m, &r->spec), secs);
}

/* The lease a woken or restarted sandbox gets: the one asked for, else
 * what its pause left of the old one, else its timeoutSeconds afresh. */
static int64_t next_lease(const SandboxSpec *spec, int64_t asked) {
        if (asked > 0)
                return asked;
        if (spec->lease_left_seconds > 0)
                return spec->lease_left_seconds;
        return spec->timeout_seconds;
}

/* Holds the next lease's worst case against the key's budget: a woken or
 * restarted sandbox spends again. */
static int reserve_lease(Manager *m, SandboxRow *row, int64_t lease, const char *rid, SandboxError *e) {
        const SandboxSpec *spec = &row->spec;
        uint64_t per_hour = config_cost_per_hour(m->cfg, spec->vcpu, spec->memory_mib);
        int64_t max = spec->max_total_cost_micros;
        int64_t life = row->run_seconds + lease;
        if (max >= 0 && ledger_cost(per_hour, life) > (uint64_t)max)
                return budget_refusal(e, per_hour, life, 0, (uint64_t)max, "maxTotalCostMicros",
                                      "sandbox with this lease");
        if (!m->ledger)
                return 0;
        int64_t now = time_now_unix();
        LedgerBudget budget;
        LedgerRefusal refusal;
        int r = ledger_key_budget(m->ledger, row->key_id, m->cfg->trial_allowance_seconds, &budget);
        if (r == 0)
                r = ledger_reserve(m->ledger, row->key_id, row->owner, row->id, &budget,
                                   (int64_t)ledger_cost_ceil(per_hour, lease), lease,
                                   now + lease + HELLO_TIMEOUT_MS / 1000, now, &refusal);
        if (r == -EDQUOT)
                return spending_refusal(e, &refusal, row->key_id);
        if (r < 0) {
                log_error(rid, "sandbox %s: reserving its lease: %s", row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not reserve the lease's cost");
        }
        return 0;
}

static int conflict_state(SandboxError *e, const SandboxRow *row, const char *wanted, const char *hint) {
        return sandbox_error(e, SANDBOX_ERR_CONFLICT, hint, "sandbox %s is %s, not %s", row->id, sandbox_state_name(row->state), wanted);
}

static int op_pause(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        if (row->state == SANDBOX_PAUSED)
                return 0; /* already where it was asked to be */
        if (row->state != SANDBOX_RUNNING)
                return conflict_state(e, row, "running",
                                      row->state == SANDBOX_STOPPED || row->state == SANDBOX_FAILED
                                              ? "a stopped sandbox keeps no memory to pause; :wake or :restart boots it"
                                              : NULL);
        if (!row->spec.pausable)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "stop it instead, or create it with pausable: true",
                                     "sandbox %s was created with pausable: false", row->id);
        Sandbox *sb = live_get(m, row->id);
        if (!sb)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "create a new sandbox",
                                     "sandbox %s has stopped; its failure is being recorded", row->id);
        if (!sb->driver->pause) {
                sandbox_unref(sb);
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "stop it to keep its files",
                                     "the %s driver cannot pause a sandbox", sb->driver->name);
        }
        /* A paused sandbox cannot sync any more, and a snapshot of it is
         * taken as its disk is: what a guest kernel or the Sentry still held
         * for its files must reach the disk first (the namespace driver's
         * writes are in the host's page cache, which the snapshot syncs). */
        guest_sync(m, row->id, rid, 20000, "pause");
        row->state = SANDBOX_PAUSING;
        int r = db_sandbox_update(m->db, row);
        if (r == 0) {
                pthread_mutex_lock(&sb->lock);
                r = sb->running && !sb->died && sb->inst ? sb->driver->pause(sb->inst) : -ESRCH;
                if (r == 0) {
                        sb->paused = true;
                        sb->paused_at_ms = (int64_t)time_now_mono_ms();
                }
                pthread_mutex_unlock(&sb->lock);
        }
        if (r < 0) {
                row->state = SANDBOX_RUNNING;
                (void)db_sandbox_update(m->db, row);
                log_error(rid, "pausing %s: %s", row->id, strerror(-r));
                sandbox_unref(sb);
                if (r == -ESRCH)
                        return sandbox_error(e, SANDBOX_ERR_CONFLICT, "create a new sandbox",
                                             "sandbox %s has stopped; its failure is being recorded", row->id);
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "try again; a process in the sandbox may be in a long disk wait",
                                     "sandbox %s could not be paused", row->id);
        }
        sandbox_unref(sb);
        /* Its running charge ends here; its disk's begins. */
        int64_t now = time_now_unix();
        int64_t end = now;
        if (row->lease_ends_at && end > row->lease_ends_at)
                end = row->lease_ends_at;
        if (row->started_at && end > row->started_at)
                row->run_seconds += end - row->started_at;
        int64_t left = row->lease_ends_at > now ? row->lease_ends_at - now : 0;
        if (m->ledger) {
                int lr = ledger_settle(m->ledger, row->id, end, now);
                if (lr < 0)
                        log_error(rid, "sandbox %s: settling its charge: %s", row->id, strerror(-lr));
                char series[48];
                disk_series(row->id, series, sizeof(series));
                lr = ledger_begin(m->ledger, series, row->key_id, row->owner, now, disk_cost_per_hour(m, &row->spec), 0);
                if (lr < 0)
                        log_error(rid, "sandbox %s: opening its paused disk's charge: %s", row->id, strerror(-lr));
        }
        row->spec.paused_at = now;
        row->spec.lease_left_seconds = left;
        /* A paused sandbox's lease does not run: no timer fires on it. */
        row->lease_ends_at = 0;
        row->state = SANDBOX_PAUSED;
        if ((r = db_sandbox_update(m->db, row)) < 0) {
                log_error(rid, "pausing %s: %s", row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the pause");
        }
        log_info(rid, "sandbox %s paused", row->id);
        return 0;
}

int sandbox_pause(Manager *m, const KeyInfo *key, const char *id, const char *rid, SandboxRow *ret, SandboxError *e) {
        return with_row(m, key, id, op_pause, NULL, rid, ret, e);
}

/* A stopped or failed sandbox again, on its own files; a running or paused
 * one is stopped first (restart). */
static int reboot_locked(Manager *m, SandboxRow *row, int64_t asked_lease, const char *rid, SandboxError *e) {
        const Driver *d = driver_by_name(row->spec.driver);
        if (!d)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the sandbox");
        const DriverOffer *o = config_driver_offer(m->cfg, d->name);
        if (!o || !o->available || !o->offered)
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "GET /v1/info lists the drivers this host runs",
                                     "driver %s cannot run on this host now", d->name);
        int64_t lease = next_lease(&row->spec, asked_lease);
        if (row->state == SANDBOX_RUNNING || row->state == SANDBOX_PAUSED) {
                /* The budget first, so that a refusal leaves it as it was;
                 * the stop settles this reservation, the one below opens it
                 * again. */
                int r = reserve_lease(m, row, lease, rid, e);
                if (r < 0)
                        return r;
                r = do_stop_locked(m, row, SANDBOX_STOPPED, NULL);
                if (r < 0)
                        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the stop");
        }
        int r = reserve_lease(m, row, lease, rid, e);
        if (r < 0)
                return r;
        row->spec.lease_left_seconds = 0;
        return boot_locked(m, row, d, lease, rid, e);
}

static int op_wake(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        int64_t asked = *(const int64_t *)arg;
        if (row->state == SANDBOX_STOPPED || row->state == SANDBOX_FAILED)
                return reboot_locked(m, row, asked, rid, e);
        if (row->state != SANDBOX_PAUSED)
                return sandbox_error(e, SANDBOX_ERR_NOT_PAUSED, NULL, "sandbox %s is %s, not paused", row->id,
                                     sandbox_state_name(row->state));
        int64_t lease = next_lease(&row->spec, asked);
        int r = reserve_lease(m, row, lease, rid, e);
        if (r < 0)
                return r;
        Sandbox *sb = live_get(m, row->id);
        row->state = SANDBOX_RESUMING;
        r = sb ? db_sandbox_update(m->db, row) : -ESRCH;
        if (r == 0) {
                pthread_mutex_lock(&sb->lock);
                r = sb->paused && sb->inst ? sb->driver->resume(sb->inst) : -ESRCH;
                if (r == 0) {
                        sb->paused = false;
                        sb->paused_total_ms += (int64_t)time_now_mono_ms() - sb->paused_at_ms;
                        /* Its silence while paused was ours. */
                        channel_heartbeat_reset(sb->channel, (int64_t)time_now_mono_ms());
                        atomic_store(&sb->active_ms, (int64_t)time_now_mono_ms());
                }
                pthread_mutex_unlock(&sb->lock);
        }
        if (r < 0) {
                /* It cannot carry on: what is left of it is stopped, its
                 * files kept, and it boots again from them. */
                log_error(rid, "resuming %s: %s; booting it again from its disk", row->id, strerror(-r));
                if (sb)
                        sandbox_unref(sb);
                row->state = SANDBOX_PAUSED;
                return reboot_locked(m, row, asked, rid, e);
        }
        sandbox_unref(sb);
        int64_t now = time_now_unix();
        row_end_pause(m, row, now, now);
        row->started_at = now;
        row->lease_ends_at = now + lease;
        row->state = SANDBOX_RUNNING;
        if ((r = db_sandbox_update(m->db, row)) < 0) {
                log_error(rid, "waking %s: %s", row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the wake");
        }
        if (m->ledger) {
                uint64_t per_hour = config_cost_per_hour(m->cfg, row->spec.vcpu, row->spec.memory_mib);
                int lr = ledger_begin(m->ledger, row->id, row->key_id, row->owner, now, per_hour, row->lease_ends_at);
                if (lr < 0)
                        log_error(rid, "sandbox %s: opening its charge: %s", row->id, strerror(-lr));
        }
        log_info(rid, "sandbox %s woken", row->id);
        return 0;
}

int sandbox_wake(Manager *m, const KeyInfo *key, const char *id, int64_t timeout_seconds, const char *rid,
                 SandboxRow *ret, SandboxError *e) {
        return with_row(m, key, id, op_wake, &timeout_seconds, rid, ret, e);
}

static int op_restart(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        if (row->state != SANDBOX_RUNNING && row->state != SANDBOX_PAUSED && row->state != SANDBOX_STOPPED &&
            row->state != SANDBOX_FAILED)
                return conflict_state(e, row, "running, paused, stopped or failed", NULL);
        return reboot_locked(m, row, 0, rid, e);
}

int sandbox_restart(Manager *m, const KeyInfo *key, const char *id, const char *rid, SandboxRow *ret,
                    SandboxError *e) {
        return with_row(m, key, id, op_restart, NULL, rid, ret, e);
}

/* A pause the daemon decides on (lease end with onLeaseEnd "pause", idle
 * time), under busy_begin(id). */
static void pause_by_daemon(Manager *m, SandboxRow *row, const char *why) {
        SandboxError e;
        if (op_pause(m, row, NULL, NULL, &e) < 0)
                log_warn(NULL, "sandbox %s: no pause at %s: %s", row->id, why, e.message);
        else
                log_info(NULL, "sandbox %s paused: %s", row->id, why);
}

static void idle_check(Manager *m, Sandbox *sb, int64_t now_ms) {
        pthread_mutex_lock(&sb->lock);
        unsigned idle_s = atomic_load(&sb->idle_pause_s);
        bool candidate = idle_s > 0 && sb->running && !sb->paused && !sb->stopping && !sb->died;
        pthread_mutex_unlock(&sb->lock);
        if (!candidate || now_ms - atomic_load(&sb->active_ms) < (int64_t)idle_s * 1000)
                return;
        /* An open stream (a command, a process, a transfer) is activity. */
        if (sb->channel && channel_stream_count(sb->channel) > 0) {
                atomic_store(&sb->active_ms, now_ms);
                return;
        }
        busy_begin(m, sb->id);
        SandboxRow row;
        if (db_sandbox_get(m->db, sb->id, &row) == 0) {
                if (row.state == SANDBOX_RUNNING &&
                    (int64_t)time_now_mono_ms() - atomic_load(&sb->active_ms) >=
                            (int64_t)atomic_load(&sb->idle_pause_s) * 1000)
                        pause_by_daemon(m, &row, "idle");
                sandbox_row_done(&row);
        }
        busy_end(m, sb->id);
}

/* ---- :update's settings (api_sandboxes.c) ---- */

/* The spec's env with u's changes: a string sets a variable, null removes
 * it. The whole must stay within a create's bounds, since it travels with
 * every exec. */
static int merged_env(const SandboxSpec *spec, json_t *changes, json_t **ret, SandboxError *e) {
        json_t *cur = spec->env;
        _cleanup_json_ json_t *env = json_is_object(cur) ? json_deep_copy(cur) : json_object();
        if (!env)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        const char *k;
        json_t *v;
        json_object_foreach(changes, k, v) {
                if (json_is_null(v))
                        json_object_del(env, k);
                else if (json_object_set(env, k, v) < 0)
                        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        }
        size_t total = 0;
        json_object_foreach(env, k, v)
                total += strlen(k) + json_string_length(v);
        if (json_object_size(env) > SANDBOX_MAX_ENV || total > SANDBOX_MAX_ENV_TOTAL)
                return sandbox_error(e, SANDBOX_ERR_INVALID, "remove variables with null, or pass large values in a file",
                                     "env would have %zu variables of %zu bytes with this change; a sandbox's env "
                                     "holds at most %u variables of %u bytes in total",
                                     json_object_size(env), total, SANDBOX_MAX_ENV, SANDBOX_MAX_ENV_TOTAL);
        *ret = TAKE_PTR(env);
        return 0;
}

static int op_update(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        const SandboxUpdate *u = arg;
        int64_t now = time_now_unix();
        SandboxSpec *spec = &row->spec;
        bool running = row->state == SANDBOX_RUNNING, paused = row->state == SANDBOX_PAUSED;

        /* Every check first: a refused field changes nothing. */
        LeaseEnd on_end = spec->on_lease_end;
        if (u->on_lease_end && lease_end_from_name(u->on_lease_end, &on_end) < 0)
                return sandbox_error(e, SANDBOX_ERR_INVALID, NULL, "onLeaseEnd must be \"stop\", \"pause\" or \"delete\"");
        if (!spec->pausable && ((u->on_lease_end && on_end == LEASE_END_PAUSE) || u->idle_pause_seconds > 0))
                return sandbox_error(e, SANDBOX_ERR_INVALID, "create a pausable sandbox for that",
                                     "sandbox %s was created with pausable: false: it cannot pause at its lease end "
                                     "or when idle", row->id);
        _cleanup_json_ json_t *env = NULL;
        if (u->env) {
                int r = merged_env(spec, u->env, &env, e);
                if (r < 0)
                        return r;
        }
        /* A paused sandbox's lease does not run: the new one is what its
         * wake gives it, counted from then and reserved then. */
        int64_t paused_lease = 0, new_end = row->lease_ends_at;
        if (u->lease_end > 0 && paused)
                paused_lease = u->lease_end > now ? u->lease_end - now : 1;
        else if (u->lease_end > 0) {
                if (!running)
                        return sandbox_error(e, SANDBOX_ERR_CONFLICT, "a lease runs only while the sandbox does",
                                             "sandbox %s is %s, not running or paused", row->id, sandbox_state_name(row->state));
                new_end = u->lease_end;
        }
        uint64_t per_hour = config_cost_per_hour(m->cfg, spec->vcpu, spec->memory_mib);
        int64_t cap = u->set_max_total ? u->max_total_cost_micros : spec->max_total_cost_micros;
        /* The worst case of the sandbox's whole life as the update leaves it:
         * what it ran, and a running one's lease to its end (what is held for
         * it against the daily limit); a paused one's new lease counts from
         * its wake, which checks the cap again. */
        int64_t life = row->run_seconds;
        if (running)
                life += row->started_at ? new_end - row->started_at : (new_end > now ? new_end - now : 0);
        else if (paused)
                life += paused_lease;
        if ((u->set_max_total || u->lease_end > 0) && cap >= 0 && ledger_cost(per_hour, life) > (uint64_t)cap)
                return budget_refusal(e, per_hour, life, 0, (uint64_t)cap, "maxTotalCostMicros",
                                      u->lease_end > 0 ? "sandbox with this lease" : "sandbox to the end of its lease");
        /* Last, the one check that holds something: a longer lease of a
         * running sandbox is reserved as an :extend is. */
        if (running && u->lease_end > row->lease_ends_at) {
                int r = reserve_life(m, row, per_hour, life, new_end, now, rid, e);
                if (r < 0)
                        return r;
        }

        /* Then every change, in one write of the row. A shorter lease: the
         * timer acts on the new end; what was reserved for the longer one is
         * settled when it ends. */
        if (running && u->lease_end > 0)
                row->lease_ends_at = new_end;
        int64_t idle = u->idle_pause_seconds;
        if (idle > 0 && idle < (int64_t)m->cfg->idle_pause_min_seconds)
                idle = m->cfg->idle_pause_min_seconds;
        if (paused_lease > 0)
                spec->lease_left_seconds = paused_lease;
        spec->on_lease_end = on_end;
        if (env) {
                json_decref(spec->env);
                spec->env = json_incref(env);
        }
        if (u->auto_wake >= 0)
                spec->auto_wake = u->auto_wake != 0;
        if (idle >= 0)
                spec->idle_pause_seconds = idle;
        if (u->set_max_total)
                spec->max_total_cost_micros = cap >= 0 ? cap : -1;
        if (u->network) {
                json_decref(spec->network);
                spec->network = json_incref(u->network);
        }
        if (u->set_user)
                row->run_as_root = u->run_as_root;
        int r = db_sandbox_update(m->db, row);
        if (r < 0) {
                log_error(rid, "updating %s: %s", row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the update");
        }
        if (u->set_name || u->labels) {
                char *labels = u->labels ? json_dumps(u->labels, JSON_COMPACT) : strdup(row->labels ? row->labels : "{}");
                const char *name = u->set_name ? u->name : row->name;
                r = labels ? db_sandbox_set_meta(m->db, row->id, name, labels) : -ENOMEM;
                if (r == 0) {
                        char *n = name ? strdup(name) : NULL;
                        free(row->name);
                        row->name = n;
                        free(row->labels);
                        row->labels = TAKE_PTR(labels);
                }
                free(labels);
                if (r < 0) {
                        log_error(rid, "updating %s: %s", row->id, strerror(-r));
                        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the update");
                }
        }

        /* A live sandbox follows: commands started from now on see the env
         * and the user, the next connection the network, and its idle time
         * counts from now. */
        Sandbox *sb = live_get(m, row->id);
        if (!sb)
                return 0;
        if (env) {
                json_t *all = spec_sandbox_env(m, row->owner, spec);
                if (all) {
                        pthread_mutex_lock(&sb->lock);
                        json_t *old = sb->env;
                        sb->env = all;
                        pthread_mutex_unlock(&sb->lock);
                        json_decref(old);
                } else
                        r = -ENOMEM;
        }
        if (u->set_user)
                atomic_store(&sb->run_as_root, u->run_as_root);
        if (u->auto_wake >= 0)
                atomic_store(&sb->auto_wake, u->auto_wake != 0);
        if (idle >= 0) {
                atomic_store(&sb->active_ms, (int64_t)time_now_mono_ms());
                atomic_store(&sb->idle_pause_s, (unsigned)idle);
        }
        if (u->network && sb->egress && egress_sandbox_set_network(sb->egress, u->network) < 0)
                r = -ENOMEM;
        sandbox_unref(sb);
        if (r < 0) {
                log_error(rid, "updating %s: the live sandbox: out of memory", row->id);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        }
        return 0;
}

int sandbox_update(Manager *m, const KeyInfo *key, const char *id, const SandboxUpdate *u, const char *rid,
                   SandboxRow *ret, SandboxError *e) {
        return with_row(m, key, id, op_update, (void *)u, rid, ret, e);
}

int sandbox_acquire(Manager *m, const KeyInfo *key, const char *id, Sandbox **ret, SandboxError *e) {
        Sandbox *found = NULL;
        pthread_mutex_lock(&m->lock);
        for (Sandbox *s = m->live; s; s = s->next)
                if (strcmp(s->id, id) == 0 && strcmp(s->owner, key->owner) == 0) {
                        found = s;
                        atomic_fetch_add(&s->refs, 1);
                        break;
                }
        pthread_mutex_unlock(&m->lock);
        if (found) {
                pthread_mutex_lock(&found->lock);
                bool paused = found->paused;
                pthread_mutex_unlock(&found->lock);
                atomic_store(&found->active_ms, (int64_t)time_now_mono_ms());
                if (!paused) {
                        *ret = found;
                        return 0;
                }
                bool wake = atomic_load(&found->auto_wake);
                sandbox_unref(found);
                if (!wake)
                        return sandbox_error(e, SANDBOX_ERR_CONFLICT, "wake it: POST /v1/sandboxes/{id}:wake",
                                             "sandbox %s is paused (created with autoWake: false)", id);
                /* A wake spends: a read key looks but never wakes. */
                if (!key->full)
                        return sandbox_error(e, SANDBOX_ERR_CONFLICT, "wake it with a full key",
                                             "sandbox %s is paused, and a read key cannot wake it", id);
                /* Woken first, then served; one more look at the live list. */
                SandboxRow row;
                int64_t asked = 0;
                int r = with_row(m, key, id, op_wake, &asked, NULL, &row, e);
                /* Not paused any more: another request woke it first. */
                if (r < 0 && e->kind != SANDBOX_ERR_NOT_PAUSED)
                        return r;
                if (r == 0)
                        sandbox_row_done(&row);
                return sandbox_acquire(m, key, id, ret, e);
        }
        SandboxRow row;
        int r = own_row(m, key, id, &row, e);
        if (r < 0)
                return r;
        /* Recorded as running but no longer live: it ended a moment ago and
         * its failure is being recorded. Never "is running, not running". */
        if (row.state == SANDBOX_RUNNING)
                sandbox_error(e, SANDBOX_ERR_CONFLICT, "create a new sandbox",
                              "sandbox %s has stopped; its failure is being recorded", id);
        else
                sandbox_error(e, SANDBOX_ERR_CONFLICT,
                              row.state == SANDBOX_STARTING ? "wait for it to start" : "create a new sandbox",
                              "sandbox %s is %s, not running", id, sandbox_state_name(row.state));
        sandbox_row_done(&row);
        return -EINVAL;
}

int sandbox_open_stream(Sandbox *sb, json_t *request, ChanStream **ret, SandboxError *e) {
        int r = channel_open_stream(sb->channel, request, ret);
        if (r == 0)
                return 0;
        if (r == -E2BIG)
                return sandbox_error(e, SANDBOX_ERR_TOO_LARGE, "pass large inputs through stdin or a file",
                                 "the command, arguments and environment are too large together");
        if (r == -EMFILE)
                return sandbox_error(e, SANDBOX_ERR_TOO_MANY, "wait for running commands to finish",
                                 "too many concurrent operations on sandbox %s", sb->id);
        return sandbox_error(e, SANDBOX_ERR_CONFLICT, "create a new sandbox", "sandbox %s is no longer running", sb->id);
}

/* ---- snapshots ---- */

/* Has the sandbox write what it holds in memory for its files (a guest
 * kernel's page cache, the Sentry's) to its disk before it is frozen for a
 * snapshot or a pause, so that a snapshot taken then has them. Best effort:
 * a sandbox that does not answer in time is frozen with its disk as it is;
 * the driver's own sync follows either way. */
static void guest_sync(Manager *m, const char *id, const char *rid, int timeout_ms, const char *before) {
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

static int op_snapshot(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        SnapshotOp *op = arg;
        const SnapshotRequest *req = op->req;
        const SandboxSpec *spec = &row->spec;
        const Driver *d = driver_by_name(spec->driver);
        if (!d)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the sandbox");
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
        int64_t kept = 0;
        if (snapshot_store_count(store, row->owner, &kept) == 0 && kept >= SNAPSHOT_MAX_PER_OWNER)
                return sandbox_error(e, SANDBOX_ERR_TOO_MANY, "delete snapshots you no longer need",
                                     "you keep %d snapshots, the most this daemon keeps for one owner",
                                     SNAPSHOT_MAX_PER_OWNER);
        SpecPaths p = { 0 };
        if (spec_paths(m, row->id, spec->image, &p) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        DriverSpec ds;
        driver_spec_from(m, row->id, spec, &p, &ds);
        SnapshotRow snap = { 0 };
        _cleanup_free_ char *tmp = NULL;
        int r = snapshot_store_begin(store, snap.id, &tmp);
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
        if (live && row->state == SANDBOX_RUNNING && !memory)
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
                int64_t days = req->retention_days > 0 ? req->retention_days : SNAPSHOT_DEFAULT_RETENTION_DAYS;
                json_t *base = json_pack("{s:s,s:s,s:i,s:i,s:i,s:I,s:O?,s:O?}", "driver", spec->driver, "image",
                                         spec->image, "vcpu", (int)spec->vcpu, "memoryMiB", (int)spec->memory_mib,
                                         "diskMiB", (int)spec->disk_mib, "timeoutSeconds",
                                         (json_int_t)spec->timeout_seconds, "env", spec->env, "network", spec->network);
                if (base && req->transient && json_object_set_new(base, SNAPSHOT_TRANSIENT, json_true()) < 0)
                        json_decref(TAKE_PTR(base));
                snap.owner = strdup(row->owner);
                snap.key_id = strdup(row->key_id);
                snap.sandbox_id = strdup(row->id);
                snap.name = req->name ? strdup(req->name) : NULL;
                snap.labels = req->labels ? json_dumps(req->labels, JSON_COMPACT) : strdup("{}");
                snap.spec = base ? json_dumps(base, JSON_COMPACT) : NULL;
                json_decref(base);
                snprintf(snap.mode, sizeof snap.mode, "%s", memory ? "memory" : "disk");
                snap.created_at = time_now_unix();
                snap.expires_at = snap.created_at + days * 86400;
                if (!snap.owner || !snap.key_id || !snap.sandbox_id || !snap.labels || !snap.spec ||
                    (req->name && !snap.name))
                        r = -ENOMEM;
                else
                        r = snapshot_store_commit(store, &snap);
                if (r == 0) {
                        log_info(rid, "snapshot %s of %s: %lld bytes in %llu ms, %llu ms of them frozen", snap.id,
                                 row->id, (long long)snap.size_bytes, (unsigned long long)(time_now_mono_ms() - t0),
                                 (unsigned long long)frozen_ms);
                        *op->out = snap;
                        return 0;
                }
        } else
                snapshot_store_abort(store, snap.id);
        snapshot_row_done(&snap);
        log_error(rid, "snapshot of %s failed: %s", row->id, strerror(-r));
        if (r == -ENOSPC)
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

int sandbox_snapshot(Manager *m, const KeyInfo *key, const char *id, const SnapshotRequest *req, const char *rid,
                     SnapshotRow *ret, SandboxError *e) {
        SnapshotOp op = { .req = req, .out = ret };
        return with_row(m, key, id, op_snapshot, &op, rid, NULL, e);
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
        if (use.used_micros + (int64_t)(each * (uint64_t)count) > key->daily_limit_micros)
                return sandbox_error(e, SANDBOX_ERR_SPENDING, "fork fewer copies, or raise the key's daily limit",
                                     "%lld copies would cost up to %llu micro-dollars for their first lease; the key "
                                     "has %lld of its daily limit left; no copy was made",
                                     (long long)count, (unsigned long long)(each * (uint64_t)count),
                                     (long long)(key->daily_limit_micros - use.used_micros));
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
        if (r == 0)
                *ret = out;
        return r;
}
