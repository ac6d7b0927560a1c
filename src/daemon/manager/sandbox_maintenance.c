#include "daemon/manager/sandbox.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
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

/* Appends the last lines of the driver's console log, if it keeps one, to a
 * failure text: what a guest kernel printed as it died (a panic, an oops) is
 * the first thing anyone debugging it needs. text stays as it is otherwise. */
void append_console_tail(const Sandbox *sb, char *text, size_t n) {
        if (!sb->driver->console_log || !sb->paths.sandbox_dir)
                return;
        char tail[CONSOLE_TAIL_MAX + 1];
        if (console_tail_read(sb->paths.sandbox_dir, sb->driver->console_log, tail, sizeof(tail)) < 0 || !*tail)
                return;
        size_t len = strlen(text);
        if (len + 1 < n)
                snprintf(text + len, n - len, "; console:\n%s", tail);
}

void handle_dead(Manager *m, Sandbox *sb) {
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
                                SandboxFacts before = sandbox_facts(&row);
                                int r = row_finish(m, &row, SANDBOX_FAILED, text);
                                if (r < 0)
                                        log_error(NULL, "recording the failure of %s: %s", sb->id, strerror(-r));
                                else
                                        events_sandbox_change(m->events, &before, &row, NULL, NULL);
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
                SandboxFacts before = sandbox_facts(&cur);
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
                events_sandbox_change(m->events, &before, &cur, NULL, "its lease ended");
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

/* One live sandbox's reading into rec: false when it has none now (it is
 * not running, or its driver reads nothing). The deltas are from its
 * reading before; its first has none (interval_ms 0). */
static bool sample_one(Sandbox *sb, int64_t now_ms, int64_t now_unix, SampleRecord *rec) {
        DriverStats st = { 0 };
        pthread_mutex_lock(&sb->lock);
        bool live = sb->running && !sb->stopping && !sb->died && sb->inst && sb->driver->stats;
        int r = live ? sb->driver->stats(sb->inst, &st) : -ENOENT;
        pthread_mutex_unlock(&sb->lock);
        if (r < 0)
                return false;
        uint64_t in, out;
        egress_sandbox_bytes(sb->egress, &in, &out);
        *rec = (SampleRecord){ .sandbox_id = sb->id, .owner = sb->owner, .at = now_unix,
                               .memory_bytes = (int64_t)st.memory_bytes, .disk_bytes = (int64_t)st.disk_used_bytes };
        if (sb->sample_mono_ms && now_ms > sb->sample_mono_ms) {
                rec->interval_ms = now_ms - sb->sample_mono_ms;
                rec->cpu_ns = st.cpu_usage_ns > sb->sample_cpu_ns ? (int64_t)(st.cpu_usage_ns - sb->sample_cpu_ns) : 0;
                rec->net_in_bytes = in > sb->sample_net_in ? (int64_t)(in - sb->sample_net_in) : 0;
                rec->net_out_bytes = out > sb->sample_net_out ? (int64_t)(out - sb->sample_net_out) : 0;
        }
        sb->sample_mono_ms = now_ms;
        sb->sample_cpu_ns = st.cpu_usage_ns;
        sb->sample_net_in = in;
        sb->sample_net_out = out;
        atomic_store(&sb->last_cpu_ns, st.cpu_usage_ns);
        atomic_store(&sb->last_memory, st.memory_bytes);
        atomic_store(&sb->last_disk, st.disk_used_bytes);
        atomic_store(&sb->last_net_in, in);
        atomic_store(&sb->last_net_out, out);
        atomic_store(&sb->sampled, true);
        return true;
}

/* A round of readings of the n held sandboxes, kept in one write. */
static void sample_round(Manager *m, Sandbox **held, size_t n, int64_t now_ms) {
        SampleRecord *recs = n ? calloc(n, sizeof(*recs)) : NULL;
        if (!recs)
                return;
        int64_t now_unix = time_now_unix();
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
                if (sample_one(held[i], now_ms, now_unix, &recs[k]))
                        k++;
        (void)samples_append(m->samples, recs, k);
        free(recs);
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
        }
        if (m->samples && (!m->last_sample_ms || now - m->last_sample_ms >= m->sample_interval_ms)) {
                m->last_sample_ms = now;
                sample_round(m, held, n, now);
        }
        for (size_t i = 0; i < n; i++)
                sandbox_unref(held[i]);
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
                int r = db_sandbox_query(m->db, STORE_SANDBOXES_LEASE_DUE, m->host_id, time_now_unix(), lease_due, m);
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

/* A sandbox whose processes are gone without its row being told (the daemon
 * stopped, or its host was lost): billed up to the last heartbeat the
 * ledger has (at most `cap`), the same seconds in the ledger and in the
 * row, and left in `state` with `reason`. Without an open charge there is
 * nothing to bill. */
static int row_gone(Manager *m, SandboxRow *row, int64_t cap, SandboxState state, const char *reason) {
        SandboxFacts before = sandbox_facts(row);
        int64_t now = time_now_unix();
        if (row->lease_ends_at && row->lease_ends_at < cap)
                cap = row->lease_ends_at;
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
                int64_t disk_end = cap;
                if (m->ledger) {
                        char series[48];
                        disk_series(row->id, series, sizeof(series));
                        int lr = ledger_settle_at_heartbeat(m->ledger, series, cap, now, &disk_end);
                        if (lr < 0 && lr != -ENOENT)
                                log_error(NULL, "sandbox %s: settling its paused disk: %s", row->id, strerror(-lr));
                        if (lr == -ENOENT)
                                disk_end = cap;
                }
                int64_t at = row->spec.paused_at;
                if (at > 0 && disk_end > at)
                        row->spec.paused_seconds += disk_end - at;
                row->spec.paused_at = 0;
        }
        row->state = state;
        row->stopped_at = state == SANDBOX_LOST ? cap : now;
        set_reason(row, reason);
        int r = db_sandbox_update(m->db, row);
        if (r == 0)
                events_sandbox_change(m->events, &before, row, NULL, reason);
        return r;
}

static int recover_one(void *userdata, SandboxRow *row) {
        Manager *m = userdata;
        const Driver *d = driver_by_name(sandbox_driver_name(row->spec.driver));
        char why[160] = "";
        if (d && d->adopt && row->spec.supervisor_nonce[0] &&
            (row->state == SANDBOX_RUNNING || row->state == SANDBOX_PAUSED)) {
                if (!m->cfg->supervisor_path)
                        snprintf(why, sizeof why, "live restore is off");
                else if (sandbox_reattach(m, row, d, why, sizeof why) == 0)
                        return 0;
                log_warn(NULL, "sandbox %s could not be re-attached: %s", row->id, why);
        }
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
        char reason[200];
        snprintf(reason, sizeof reason, "daemon restarted%s%s", why[0] ? "; " : "", why);
        int r = row_gone(m, row, time_now_unix(), SANDBOX_STOPPED, reason);
        log_info(NULL, "sandbox %s was running when the daemon stopped: now stopped", row->id);
        return r;
}

typedef struct LoseHost {
        Manager *m;
        int64_t last_seen;
        const char *reason;
        int done;
} LoseHost;

static int lose_one(void *userdata, SandboxRow *row) {
        LoseHost *a = userdata;
        int r = row_gone(a->m, row, a->last_seen, SANDBOX_LOST, a->reason);
        /* Another leader, or the host itself coming back, got there first. */
        if (r == -ESTALE || r == -ENOENT)
                return 0;
        if (r < 0)
                return r;
        log_info(NULL, "sandbox %s is lost: %s", row->id, a->reason);
        a->done++;
        return 0;
}

int manager_lose_host(Manager *m, const char *host_id, int64_t last_seen, const char *reason) {
        LoseHost a = { .m = m, .last_seen = last_seen, .reason = reason };
        int r = db_sandbox_query(m->db, STORE_SANDBOXES_ACTIVE, host_id, 0, lose_one, &a);
        return r < 0 ? r : a.done;
}

void manager_set_events(Manager *m, Events *events) {
        m->events = events;
}

void manager_set_samples(Manager *m, Samples *samples, int64_t interval_s) {
        m->samples = samples;
        m->sample_interval_ms = (interval_s > 0 ? interval_s : SAMPLES_INTERVAL_SECONDS_DEFAULT) * 1000;
}

typedef struct SeriesRow {
        char id[32];
        uint64_t cpu_ns, memory, disk, net_in, net_out;
} SeriesRow;

static void series_family(FILE *f, const SeriesRow *rows, size_t n, const char *name, const char *type,
                          const char *help, size_t field, bool seconds) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
        for (size_t i = 0; i < n; i++) {
                uint64_t v = *(const uint64_t *)((const char *)&rows[i] + field);
                if (seconds) /* the field counts nanoseconds */
                        fprintf(f, "%s{sandbox=\"%s\"} %.3f\n", name, rows[i].id, (double)v / 1e9);
                else
                        fprintf(f, "%s{sandbox=\"%s\"} %llu\n", name, rows[i].id, (unsigned long long)v);
        }
}

void manager_render_samples(Manager *m, const char *owner, FILE *f) {
        SeriesRow *rows = calloc(SAMPLES_SERIES_MAX, sizeof(*rows));
        if (!rows)
                return;
        size_t n = 0, omitted = 0;
        pthread_mutex_lock(&m->lock);
        for (Sandbox *sb = m->live; sb; sb = sb->next) {
                if ((owner && strcmp(sb->owner, owner) != 0) || !atomic_load(&sb->sampled))
                        continue;
                if (n == SAMPLES_SERIES_MAX) {
                        omitted++;
                        continue;
                }
                SeriesRow *r = &rows[n++];
                snprintf(r->id, sizeof r->id, "%s", sb->id);
                r->cpu_ns = atomic_load(&sb->last_cpu_ns);
                r->memory = atomic_load(&sb->last_memory);
                r->disk = atomic_load(&sb->last_disk);
                r->net_in = atomic_load(&sb->last_net_in);
                r->net_out = atomic_load(&sb->last_net_out);
        }
        pthread_mutex_unlock(&m->lock);
        series_family(f, rows, n, "runtime_sandbox_cpu_seconds_total", "counter",
                      "CPU time a live sandbox has used, at its newest reading.", offsetof(SeriesRow, cpu_ns), true);
        series_family(f, rows, n, "runtime_sandbox_memory_bytes", "gauge",
                      "Memory a live sandbox holds, at its newest reading.", offsetof(SeriesRow, memory), false);
        series_family(f, rows, n, "runtime_sandbox_disk_bytes", "gauge",
                      "What a live sandbox's writable layer holds, at its newest reading.", offsetof(SeriesRow, disk), false);
        series_family(f, rows, n, "runtime_sandbox_network_receive_bytes_total", "counter",
                      "Bytes a live sandbox received through the egress proxy, at its newest reading.",
                      offsetof(SeriesRow, net_in), false);
        series_family(f, rows, n, "runtime_sandbox_network_transmit_bytes_total", "counter",
                      "Bytes a live sandbox sent through the egress proxy, at its newest reading.",
                      offsetof(SeriesRow, net_out), false);
        fprintf(f, "# HELP runtime_sandbox_series_omitted Live sandboxes left out of the per-sandbox series "
                   "(at most %d are shown).\n# TYPE runtime_sandbox_series_omitted gauge\n"
                   "runtime_sandbox_series_omitted %zu\n",
                SAMPLES_SERIES_MAX, omitted);
        free(rows);
}

void manager_set_host(Manager *m, const char *host_id) {
        snprintf(m->host_id, sizeof(m->host_id), "%s", host_id);
}

void manager_use(Manager *m, int64_t *ret_vcpu, int64_t *ret_memory_mib, int64_t *ret_sandboxes) {
        int64_t vcpu = 0, mem = 0, n = 0;
        pthread_mutex_lock(&m->lock);
        for (Sandbox *sb = m->live; sb; sb = sb->next) {
                vcpu += sb->vcpu;
                mem += sb->memory_mib;
                n++;
        }
        pthread_mutex_unlock(&m->lock);
        *ret_vcpu = vcpu;
        *ret_memory_mib = mem;
        *ret_sandboxes = n;
}

/* The id of a live sandbox, if there is one: for loops that end each in
 * turn (and take it off the live list). */
static bool first_live_id(Manager *m, char *id, size_t n) {
        pthread_mutex_lock(&m->lock);
        Sandbox *sb = m->live;
        if (sb)
                snprintf(id, n, "%s", sb->id);
        pthread_mutex_unlock(&m->lock);
        return sb != NULL;
}

int manager_fence(Manager *m) {
        int n = 0;
        char id[32];
        while (first_live_id(m, id, sizeof(id))) {
                /* The store is out of reach or no longer this host's to
                 * write: the processes go, the rows are the fleet's to mark
                 * (the leader's sweep, or this host's own recovery when it
                 * registers again). */
                busy_begin(m, id);
                Sandbox *t = live_take(m, id);
                if (t) {
                        live_stop(t);
                        sandbox_unref(t);
                        n++;
                }
                busy_end(m, id);
                log_info(NULL, "sandbox %s stopped: this host is fenced", id);
        }
        return n;
}

/* A lost sandbox of this host whose files are still here (the host was
 * killed, or fenced, and its sandboxes declared lost): nothing brings it
 * back, so what is left of it goes: processes that outlived the daemon,
 * then its files. Once they are gone this is one stat per lost row. */
static int reap_lost(void *userdata, SandboxRow *row) {
        Manager *m = userdata;
        const Driver *d = driver_by_name(sandbox_driver_name(row->spec.driver));
        SpecPaths p = { 0 };
        struct stat st;
        if (d && spec_paths(m, row->id, row->spec.image, &p) == 0 && stat(p.sandbox_dir, &st) == 0) {
                DriverSpec ds;
                driver_spec_from(m, row->id, &row->spec, &p, &ds);
                int r = d->destroy(&ds);
                if (r < 0)
                        log_error(NULL, "removing what is left of lost sandbox %s: %s", row->id, strerror(-r));
                else
                        log_info(NULL, "lost sandbox %s: what was left of it here is removed", row->id);
        }
        spec_paths_done(&p);
        return 0;
}

int manager_recover_fenced(Manager *m, const char *reason) {
        LoseHost a = { .m = m, .last_seen = time_now_unix(), .reason = reason };
        int r = db_sandbox_query(m->db, STORE_SANDBOXES_ACTIVE, m->host_id, 0, lose_one, &a);
        if (r < 0)
                return r;
        r = db_sandbox_query(m->db, STORE_SANDBOXES_LOST, m->host_id, 0, reap_lost, m);
        return r < 0 ? r : a.done;
}

int manager_recover(Manager *m) {
        int r = db_sandbox_query(m->db, STORE_SANDBOXES_ACTIVE, m->host_id, 0, recover_one, m);
        if (r < 0)
                return r;
        /* After the rows: a pool sandbox handed out has one, and its marker
         * only goes. */
        warm_pool_recover(m);
        if ((r = db_sandbox_query(m->db, STORE_SANDBOXES_LOST, m->host_id, 0, reap_lost, m)) < 0)
                return r;
        if (m->ledger && (r = ledger_settle_orphans(m->ledger, time_now_unix())) < 0)
                log_error(NULL, "settling reservations left by a crash: %s", strerror(-r));
        return db_sandbox_query(m->db, STORE_SANDBOXES_LEASE_DUE, m->host_id, time_now_unix(), lease_due, m);
}

int manager_each_active(Manager *m, StoreSandboxFn fn, void *userdata) {
        return db_sandbox_query(m->db, STORE_SANDBOXES_ACTIVE, m->host_id, 0, fn, userdata);
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

void manager_set_volumes(Manager *m, struct Volumes *volumes) {
        m->volumes = volumes;
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
        /* The pool's sandboxes are no one's: they go, never left running. */
        warm_pool_shutdown(m);
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
        char id[32];
        while (first_live_id(m, id, sizeof(id))) {
                busy_begin(m, id);
                /* A supervised sandbox runs on for the next start. */
                Sandbox *kept = live_get(m, id);
                bool let_go = kept && sandbox_let_go(m, kept);
                sandbox_unref(kept);
                if (let_go) {
                        sandbox_unref(live_take(m, id));
                        busy_end(m, id);
                        log_info(NULL, "sandbox %s left running for the next start", id);
                        continue;
                }
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
        warm_pool_free(m->pool);
        pthread_mutex_destroy(&m->lock);
        pthread_cond_destroy(&m->cond);
        free(m);
}
