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

/* ---- pause, wake, restart (under busy_begin(id)) ---- */

bool manager_runs(Manager *m, const char *id) {
        Sandbox *sb = live_get(m, id);
        bool runs = sb != NULL;
        sandbox_unref(sb);
        return runs;
}

Sandbox *live_get(Manager *m, const char *id) {
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

uint64_t sandbox_row_cost(Manager *m, const SandboxRow *r, int64_t now) {
        return ledger_cost(sandbox_row_cost_per_hour(m, r), sandbox_row_run_seconds(r, now)) +
               sandbox_row_paused_cost(m, r, now);
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
                return spending_refusal(m, e, &refusal, row->owner, row->key_id, row->id);
        if (r < 0) {
                log_error(rid, "sandbox %s: reserving its lease: %s", row->id, strerror(-r));
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not reserve the lease's cost");
        }
        return 0;
}

int conflict_state(SandboxError *e, const SandboxRow *row, const char *wanted, const char *hint) {
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
        const Driver *d = driver_by_name(sandbox_driver_name(row->spec.driver));
        if (!d)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the sandbox");
        const DriverOffer *o = config_driver_offer(m->cfg, d->name);
        if (!o || !o->available || !o->offered)
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "GET /v1/info lists the drivers this host runs",
                                     "driver %s cannot run on this host now", d->name);
        /* Its volumes as at a create: a start of a stopped sandbox would
         * be refused by the host otherwise, and recorded failed. */
        int r = sandbox_volumes_check_kernels(m, row->id, &row->spec, d, e);
        if (r < 0)
                return r;
        int64_t lease = next_lease(&row->spec, asked_lease);
        if (row->state == SANDBOX_RUNNING || row->state == SANDBOX_PAUSED) {
                /* The budget first, so that a refusal leaves it as it was;
                 * the stop settles this reservation, the one below opens it
                 * again. */
                r = reserve_lease(m, row, lease, rid, e);
                if (r < 0)
                        return r;
                r = do_stop_locked(m, row, SANDBOX_STOPPED, NULL);
                if (r < 0)
                        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the stop");
        }
        r = reserve_lease(m, row, lease, rid, e);
        if (r < 0)
                return r;
        row->spec.lease_left_seconds = 0;
        return boot_locked(m, row, d, lease, rid, e);
}

/* A lost sandbox's files stayed with the host that was lost: nothing of it
 * can boot here, and its host, if it comes back, does not bring it back. */
static int lost_refusal(SandboxError *e, const SandboxRow *row) {
        return conflict_state(e, row, "running, paused, stopped or failed",
                              "its host was lost with its files: create a new sandbox, or one from a snapshot");
}

static int op_wake(Manager *m, SandboxRow *row, void *arg, const char *rid, SandboxError *e) {
        int64_t asked = *(const int64_t *)arg;
        if (row->state == SANDBOX_LOST)
                return lost_refusal(e, row);
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
        int64_t now_ms = time_now_unix_ms(), now = now_ms / 1000;
        row_end_pause(m, row, now, now);
        row->started_at = now;
        row->started_msec = (int)(now_ms % 1000);
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
        if (row->state == SANDBOX_LOST)
                return lost_refusal(e, row);
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
void pause_by_daemon(Manager *m, SandboxRow *row, const char *why) {
        SandboxError e;
        SandboxFacts before = sandbox_facts(row);
        if (op_pause(m, row, NULL, NULL, &e) < 0)
                log_warn(NULL, "sandbox %s: no pause at %s: %s", row->id, why, e.message);
        else {
                log_info(NULL, "sandbox %s paused: %s", row->id, why);
                /* A lease end's pause is recorded with the lease end's own
                 * change (lease_due): once. */
                if (strcmp(why, "idle") == 0)
                        events_sandbox_change(m->events, &before, row, NULL, why);
        }
}

void idle_check(Manager *m, Sandbox *sb, int64_t now_ms) {
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
                /* Activity is what a full key does, and a read key whose
                 * owner made it keep sandboxes awake: by default a read key
                 * (a dashboard that polls) never keeps a sandbox from its
                 * idle pause. A request that runs long holds a stream open,
                 * which the idle check counts while it lasts. */
                if (key_access_keeps_awake(key->access, key->keeps_awake))
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
                /* A wake spends: a read key looks but never wakes, one that
                 * keeps sandboxes awake included. */
                if (key->access != KEY_ACCESS_FULL)
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
                              row.state == SANDBOX_STARTING ? "wait for it to start"
                              : row.state == SANDBOX_STOPPED || row.state == SANDBOX_FAILED ||
                                              row.state == SANDBOX_PAUSED
                                      ? ":wake boots it again on its files"
                                      : "create a new sandbox",
                              "sandbox %s is %s, not running", id, sandbox_state_name(row.state));
        sandbox_row_done(&row);
        return -EINVAL;
}

int sandbox_adopt_stream(Sandbox *sb, uint32_t id, ChanStream **ret) {
        return sb->channel ? channel_adopt_stream(sb->channel, id, ret) : -EPIPE;
}

size_t sandbox_stream_count(Sandbox *sb) {
        return sb->channel ? channel_stream_count(sb->channel) : 0;
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
