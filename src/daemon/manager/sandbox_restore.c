/*
 * Live restore (docs/lifecycle.md): a daemon that starts finds the sandboxes
 * an earlier one left running, each held by its supervisor, and takes them
 * over: the driver's instance from the handles the supervisor kept, the
 * channel through the supervisor's socket, the agent's kept processes on
 * their old streams. The charge a running sandbox had open stays open: the
 * time the daemon was away is billed once, when the charge is settled.
 */
#include "daemon/manager/sandbox.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/supervise.h"

#include "daemon/manager/manager-internal.h"

/* How long a restarting daemon waits for a supervisor's answer, and for the
 * agent's to the ATTACH; a silent one is not taken over. */
#define RESTORE_SUPERVISOR_TIMEOUT_MS 5000

void manager_set_warmer(Manager *m, ManagerWarmFn fn, void *userdata) {
        m->warm_fn = fn;
        m->warm_userdata = userdata;
}

void manager_set_adopter(Manager *m, ManagerAdoptFn fn, void *userdata) {
        m->adopt_fn = fn;
        m->adopt_userdata = userdata;
}

/* A stream the agent kept that is not taken back as a process: a plain
 * exec whose client left with the last daemon (it has no process tag), or
 * one whose listing did not check. It is ended as a client's leaving ends
 * an exec (CANCEL: the agent kills its group), and linked for that moment
 * so that the ids this daemon opens start past it: an OPEN under an id the
 * agent still holds would be ignored, and its caller wait for ever. */
static void end_kept_stream(Sandbox *sb, json_t *p) {
        json_t *jid = json_object_get(p, "stream");
        json_int_t id = json_integer_value(jid);
        ChanStream *s = NULL;
        /* An even id is the agent's own: never one this daemon opens. */
        if (!json_is_integer(jid) || id <= 0 || id >= UINT32_MAX || (id & 1) == 0)
                return;
        int r = sandbox_adopt_stream(sb, (uint32_t)id, &s);
        if (r < 0) {
                log_warn(NULL, "sandbox %s: stream %lld that its agent kept could not be ended: %s", sb->id,
                         (long long)id, strerror(-r));
                return;
        }
        chan_stream_cancel(s);
        chan_stream_free(s);
}

static int kept_processes(Manager *m, Sandbox *sb, json_t *hello, size_t *ret_kept, size_t *ret_ended) {
        json_t *attached = json_object_get(hello, "attached");
        json_t *list = json_object_get(attached, "processes");
        if (!json_is_object(attached) || !json_is_array(list))
                return -EBADMSG;
        size_t i, kept = 0, ended = 0;
        json_t *p;
        json_array_foreach(list, i, p) {
                /* Untagged: an exec, not a process; nobody waits for it. */
                bool exec = json_is_null(json_object_get(p, "tag"));
                int r = -ENOSYS;
                if (m->adopt_fn && !exec) {
                        atomic_fetch_add(&sb->refs, 1); /* the process's */
                        r = m->adopt_fn(m->adopt_userdata, sb, p);
                }
                if (r == 0) {
                        kept++;
                        continue;
                }
                if (!exec && r != -ENOSYS)
                        log_warn(NULL, "sandbox %s: a process its agent kept was not taken back: %s", sb->id,
                                 strerror(-r));
                end_kept_stream(sb, p);
                ended++;
        }
        *ret_kept = kept;
        *ret_ended = ended;
        return 0;
}

int sandbox_reattach(Manager *m, SandboxRow *row, const Driver *d, char *why, size_t why_len) {
        bool paused = row->state == SANDBOX_PAUSED;
        _cleanup_json_ json_t *hello = NULL;
        int r = -ENOMEM;
        Sandbox *sb = sandbox_alloc(m, row, d);
        snprintf(why, why_len, "out of memory");
        if (!sb || !sb->env)
                goto fail;
        DriverSpec ds;
        driver_spec_from(m, sb->id, &row->spec, &sb->paths, &ds);
        sb->memory_mib = ds.memory_mib;
        sb->vcpu = ds.vcpu;
        int chan = -1;
        SuperviseHandles h;
        if ((r = supervise_attach(sb->paths.sandbox_dir, row->id, row->spec.supervisor_nonce,
                                  RESTORE_SUPERVISOR_TIMEOUT_MS, &chan, &sb->sup_conn, &h, why, why_len)) < 0)
                goto fail;
        /* From here a failure stops what is left of it, its supervisor too. */
        sb->sup_pid = h.pid;
        if ((r = d->adopt(&ds, h.state, h.fds, h.n, &sb->inst)) < 0) { /* the fds are taken */
                close(chan);
                sb->inst = NULL;
                snprintf(why, why_len, "%s",
                         r == -ESRCH     ? "its processes are gone"
                         : r == -EBADMSG ? "its supervisor kept no handles of its driver's"
                                         : "its driver could not take it over");
                goto fail;
        }
        r = -ENOMEM;
        /* Version 2 hands the agent's channel over; version 1's connection
         * relays its frames. */
        sb->channel = h.version >= 2 ? channel_take_over(chan, on_channel_closed, sb)
                                     : channel_new(chan, on_channel_closed, sb);
        if (!sb->channel)
                goto fail;
        if (m->egress) {
                if (egress_sandbox_new(m->egress, sb->id, row->owner, row->spec.network, row->spec.secrets,
                                       row->spec.trial, &sb->egress) < 0)
                        goto fail;
                channel_set_acceptor(sb->channel, egress_sandbox_accept, sb->egress);
        }
        /* A paused sandbox's agent is frozen: it answers once thawed, and is
         * frozen again at once. A running one may be frozen too: the daemon
         * died in the middle of a snapshot's copy (resume of one that is not
         * frozen does nothing). */
        if (d->resume && d->resume(sb->inst) < 0 && paused) {
                r = -EIO;
                snprintf(why, why_len, "it could not be thawed to be re-attached");
                goto fail;
        }
        int hello_ms = d->hello_timeout_ms ? (int)d->hello_timeout_ms : HELLO_TIMEOUT_MS;
        if (hello_ms > RESTORE_SUPERVISOR_TIMEOUT_MS * 2)
                hello_ms = RESTORE_SUPERVISOR_TIMEOUT_MS * 2;
        r = channel_attach(sb->channel, hello_ms, &hello);
        if (r == 0 && !json_is_object(json_object_get(hello, "attached")))
                r = -EBADMSG;
        if (r < 0) {
                snprintf(why, why_len, "%s",
                         r == -EBADMSG    ? "its agent answered without the processes it kept"
                         : r == -ETIMEDOUT ? "its agent did not answer"
                                           : "its agent's channel closed");
                goto fail;
        }
        if (paused) {
                pthread_mutex_lock(&sb->lock);
                r = d->pause(sb->inst);
                if (r == 0) {
                        sb->paused = true;
                        sb->paused_at_ms = (int64_t)time_now_mono_ms();
                }
                pthread_mutex_unlock(&sb->lock);
                if (r < 0) {
                        snprintf(why, why_len, "it could not be paused again");
                        goto fail;
                }
        }
        channel_heartbeat_reset(sb->channel, (int64_t)time_now_mono_ms());
        live_add(m, sb);
        size_t kept = 0, ended = 0;
        if (kept_processes(m, sb, hello, &kept, &ended) < 0)
                log_warn(NULL, "sandbox %s: its agent listed no processes", sb->id);
        log_info(NULL, "sandbox %s re-attached (driver %s, supervisor %d, %zu process%s kept, %zu exec%s ended%s)",
                 sb->id, d->name, (int)sb->sup_pid, kept, kept == 1 ? "" : "es", ended, ended == 1 ? "" : "s",
                 paused ? ", paused" : "");
        sandbox_unref(sb);
        return 0;

fail:
        if (sb) {
                live_stop(sb);
                sandbox_unref(sb);
        }
        return r;
}

/* At the daemon's stop: a supervised sandbox is let go, not stopped. Its
 * channel is shut so that its supervisor detaches the agent at once (the
 * processes keep running, their output held); no process of it is
 * recorded ended, and its row stays as it is for the next start. */
bool sandbox_let_go(Manager *m, Sandbox *sb) {
        pthread_mutex_lock(&sb->lock);
        bool can = sb->sup_pid && sb->inst && sb->driver->release && !sb->died && !m->cfg->stop_sandboxes_on_exit;
        int conn = -1;
        if (can) {
                atomic_store(&sb->left, true);
                sb->stopping = true; /* the channel's end is not a death */
                sb->running = false;
                sb->driver->release(sb->inst);
                sb->inst = NULL;
                sb->sup_pid = 0;
                conn = sb->sup_conn;
                sb->sup_conn = -1;
        }
        pthread_mutex_unlock(&sb->lock);
        if (!can)
                return false;
        /* Version 2: the channel stops, the socket stays as it is, and the
         * connection's end makes the supervisor detach the agent. Version 1:
         * the connection is the channel, shut down for the same. */
        if (conn >= 0) {
                channel_let_go(sb->channel);
                close(conn);
        } else
                channel_shutdown(sb->channel);
        return true;
}

bool sandbox_left(Sandbox *sb) {
        return sb && atomic_load(&sb->left);
}
