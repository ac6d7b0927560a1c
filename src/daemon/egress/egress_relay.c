/* Each sandbox's egress connections: the pool of workers that hands them
 * to the proxy process and relays their bytes, the refusals the daemon
 * answers itself, and the audit entry each connection leaves. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "daemon/egress/egress_internal.h"
#include "daemon/manager/audit.h"
#include "daemon/manager/events.h"
#include "egress/wire.h"

#define AUDIT_KEEP_PER_SANDBOX 10000
/* How many entries are written between two prunes of a sandbox's log. */
#define AUDIT_PRUNE_EVERY 256

/* ---- the audit log ---- */

static const char *audit_kind(const EgressRecord *rec) {
        return rec->host[0] ? (rec->connect ? "connect" : "http") : "none";
}

static StoreEgressAudit audit_entry(const EgressRecord *rec, bool ended) {
        StoreEgressAudit a = { .at = time_now_unix(), .ended = ended, .rec = *rec };
        snprintf(a.kind, sizeof(a.kind), "%s", audit_kind(rec));
        if (ended && !a.rec.end[0])
                snprintf(a.rec.end, sizeof(a.rec.end), "closed");
        return a;
}

/* A new entry: at the decision (ended false: its end, duration and counts
 * come later, into the same entry), or whole, for a connection that ended
 * before the proxy decided anything. Returns the entry's id, or 0 when it
 * could not be written. */
static int64_t audit_insert(EgressService *svc, const SandboxEgress *se, const EgressRecord *rec, bool ended) {
        StoreEgressAudit a = audit_entry(rec, ended);
        int64_t id = 0;
        if (svc->store->audit_append(svc->records, se->id, se->owner, &a, &id) < 0)
                id = 0;
        /* Bounded per sandbox: a sandbox that opens connections without end
         * cannot grow the database without end. */
        if ((atomic_fetch_add(&svc->audit_inserts, 1) + 1) % AUDIT_PRUNE_EVERY == 0)
                (void)svc->store->audit_prune(svc->records, se->id, AUDIT_KEEP_PER_SANDBOX);
        return id;
}

/* The same entry, in place: a later refusal of what was allowed (ended
 * false), or its end. The host, port, kind, address and rule stay as
 * decided. */
static void audit_update(EgressService *svc, int64_t id, const SandboxEgress *se, const EgressRecord *rec,
                         bool ended) {
        StoreEgressAudit a = audit_entry(rec, ended);
        (void)svc->store->audit_update(svc->records, se->id, id, &a);
}

int egress_audit_list(EgressService *svc, const char *sandbox_id, unsigned limit, EgressAuditEntry **ret,
                      size_t *ret_n, SandboxError *e) {
        int r = svc->store->audit_list(svc->records, sandbox_id, limit, ret, ret_n);
        if (r == -ENOMEM)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the egress log");
        return 0;
}

/* ---- per sandbox ---- */

int egress_sandbox_new(EgressService *svc, const char *sandbox_id, const char *owner, const json_t *network,
                       const json_t *scope, bool trial, SandboxEgress **ret) {
        SandboxEgress *se = calloc(1, sizeof(*se));
        if (!se)
                return -ENOMEM;
        se->svc = svc;
        atomic_init(&se->refs, 1);
        snprintf(se->id, sizeof(se->id), "%s", sandbox_id);
        snprintf(se->owner, sizeof(se->owner), "%s", owner);
        se->trial = trial;
        pthread_mutex_init(&se->lock, NULL);
        se->network = network ? json_deep_copy(network) : json_pack("{s:b}", "internet", 0);
        se->scope = scope ? json_deep_copy(scope) : NULL;
        if (!se->network || (scope && !se->scope)) {
                egress_sandbox_unref(se);
                return -ENOMEM;
        }
        *ret = se;
        return 0;
}

int egress_sandbox_set_network(SandboxEgress *se, const json_t *network) {
        json_t *copy = json_deep_copy(network);
        if (!copy)
                return -ENOMEM;
        pthread_mutex_lock(&se->lock);
        json_t *old = se->network;
        se->network = copy;
        pthread_mutex_unlock(&se->lock);
        json_decref(old);
        return 0;
}

void egress_sandbox_unref(SandboxEgress *se) {
        if (!se || atomic_fetch_sub(&se->refs, 1) != 1)
                return;
        json_decref(se->network);
        json_decref(se->scope);
        pthread_mutex_destroy(&se->lock);
        free(se);
}

void egress_sandbox_bytes(SandboxEgress *se, uint64_t *ret_in, uint64_t *ret_out) {
        *ret_in = se ? atomic_load(&se->bytes_in) : 0;
        *ret_out = se ? atomic_load(&se->bytes_out) : 0;
}

struct Conn {
        SandboxEgress *se;
        ChanStream *s;
        Conn *next;
        uint64_t queued_ms; /* when it joined the waiting room */
        bool over_total;    /* refused for the pool's waiting room, not the sandbox's */
        bool timed_out;     /* refused after waiting longer than wait_ms */
};

/* Idle workers and the refuser end after this long without work. */
#define POOL_IDLE_MS 30000
/* A connection past its sandbox's share waits for one of its own to end;
 * this many may wait per sandbox, and this many in all. */
#define WAIT_PER_SANDBOX 128u
#define WAIT_TOTAL 4096u
/* Refused connections waiting for their 503 and audit entry; past this
 * they are closed unanswered and counted into the next entry. */
#define REFUSALS_MAX 256u
#define REFUSAL_WRITE_MS 1000

/* The proxy's answers on the meta socket, and a connection's settings. */
#define SETTINGS_MS 10000
#define RECORD_MS 5000
#define PUMP_CHUNK 65536

/* A connection's audit entry, made from the proxy's records as they come
 * on the meta socket: written at the decision, completed at the end. Used
 * by the pump towards the sandbox while it runs, then by the worker. */
typedef struct ConnAudit {
        EgressService *svc;
        SandboxEgress *se;
        int fd;     /* meta */
        int64_t id; /* the entry's row; 0 before the decision */
        EgressRecord rec;
        unsigned records;
        bool ended; /* the end record came */
        bool done;  /* no more records: ended, closed, or broken */
        bool broken; /* a record over the bounds, or malformed */
        uint64_t started_ms;
} ConnAudit;

/* A refusal is an event of the sandbox and a record of the audit trail
 * too, bounded in rate: a sandbox that retries a refused host in a loop
 * makes one now and then, which counts the refusals since the last one
 * (the egress log keeps each). */
static void tell_refusal(const ConnAudit *a) {
        EgressService *svc = a->svc;
        unsigned n = atomic_fetch_add(&a->se->refusals_untold, 1) + 1;
        if ((!svc->events && !svc->audit) ||
            !events_rate_ok("egress.refused", a->se->id, EGRESS_REFUSED_EVENT_EVERY_S))
                return;
        n = atomic_exchange(&a->se->refusals_untold, 0) ?: n;
        json_t *d = json_pack("{s:s,s:i,s:s,s:s,s:s?,s:i}", "host", a->rec.host[0] ? a->rec.host : "", "port",
                              (int)a->rec.port, "kind", audit_kind(&a->rec), "reason", a->rec.reason, "rule",
                              a->rec.rule[0] ? a->rec.rule : NULL, "refusals", (int)n);
        if (!d)
                return;
        char *text = svc->audit ? json_dumps(d, JSON_COMPACT) : NULL;
        if (text) {
                AuditRecord rec = { .owner = a->se->owner, .action = "egress.refused", .sandbox_id = a->se->id,
                                    .detail = text };
                audit_record(svc->audit, &rec);
                free(text);
        }
        events_emit(svc->events, a->se->owner, "egress.refused", "sandbox", a->se->id, NULL, d);
}

static void audit_log_decision(const ConnAudit *a) {
        log_info(NULL, "egress %s %s %s:%u %s (%s%s%s)", a->se->id, a->rec.connect ? "CONNECT" : "HTTP",
                 a->rec.host[0] ? a->rec.host : "-", a->rec.port, a->rec.allowed ? "allowed" : "refused", a->rec.reason,
                 a->rec.rule[0] ? "; rule: " : "", a->rec.rule);
        if (!a->rec.allowed)
                tell_refusal(a);
}

/* One record from the proxy, into the audit log at once. -EPIPE once the
 * proxy has nothing more to say (or is gone), -EBADMSG for a record out of
 * its bounds (the connection is then ended). */
static int audit_read(ConnAudit *a, int timeout_ms) {
        if (a->done)
                return -EPIPE;
        json_t *j = NULL;
        EgressRecord rec;
        EgressWireKind kind;
        uint64_t decided_us = 0;
        int r = egress_wire_read(a->fd, EGRESS_WIRE_MAX_RECORD, timeout_ms, &j);
        if (r == 0 && (egress_wire_record_parse(j, &rec, &kind, &decided_us) < 0 ||
                       ++a->records > EGRESS_WIRE_MAX_RECORDS || (a->ended && kind == EGRESS_WIRE_END)))
                r = -EBADMSG;
        json_decref(j);
        if (r < 0) {
                a->done = true;
                a->broken = r == -EBADMSG;
                return r == -EBADMSG ? r : -EPIPE;
        }
        if (kind == EGRESS_WIRE_DECISION) {
                if (a->id == 0) {
                        a->rec = rec;
                        a->id = audit_insert(a->svc, a->se, &rec, false);
                        /* How long the entry took from the proxy's decision
                         * (both clocks are the host's CLOCK_MONOTONIC). */
                        struct timespec ts;
                        clock_gettime(CLOCK_MONOTONIC, &ts);
                        uint64_t now_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
                        if (decided_us && now_us >= decided_us && now_us - decided_us < 60000000u)
                                log_debug(NULL, "egress %s: audit entry %lld written %llu us after the decision",
                                          a->se->id, (long long)a->id, (unsigned long long)(now_us - decided_us));
                        audit_log_decision(a);
                } else if (a->rec.allowed || !rec.allowed) {
                        /* Only ever narrower: what was refused stays refused. */
                        a->rec.allowed = rec.allowed;
                        memcpy(a->rec.reason, rec.reason, sizeof(rec.reason));
                        audit_update(a->svc, a->id, a->se, &a->rec, false);
                        audit_log_decision(a);
                }
                return 0;
        }
        a->ended = true;
        a->done = true;
        if (a->id == 0) {
                /* Nothing was decided before the end (the proxy could not
                 * read the connection's settings, say): the end is the whole
                 * entry, when it says anything. */
                a->rec = rec;
                if (rec.host[0] || rec.reason[0]) {
                        a->id = audit_insert(a->svc, a->se, &rec, true);
                        audit_log_decision(a);
                }
        } else {
                if (!a->rec.allowed)
                        rec.allowed = false;
                if (!a->rec.allowed && !rec.allowed && rec.reason[0] == '\0')
                        memcpy(rec.reason, a->rec.reason, sizeof(rec.reason));
                a->rec.allowed = rec.allowed;
                memcpy(a->rec.reason, rec.reason, sizeof(rec.reason));
                a->rec.bytes_out = rec.bytes_out;
                a->rec.bytes_in = rec.bytes_in;
                a->rec.intercepted = rec.intercepted;
                a->rec.secrets_used = rec.secrets_used;
                a->rec.duration_ms = rec.duration_ms;
                memcpy(a->rec.end, rec.end, sizeof(rec.end));
                audit_update(a->svc, a->id, a->se, &a->rec, true);
        }
        atomic_fetch_add(&a->se->bytes_in, rec.bytes_in);
        atomic_fetch_add(&a->se->bytes_out, rec.bytes_out);
        log_debug(NULL, "egress %s %s:%u ended: %s (%llu bytes out, %llu in, %llu ms)", a->se->id,
                  a->rec.host[0] ? a->rec.host : "-", a->rec.port, a->rec.end, (unsigned long long)a->rec.bytes_out,
                  (unsigned long long)a->rec.bytes_in, (unsigned long long)a->rec.duration_ms);
        return 0;
}

/* Every record the proxy has already sent, without waiting for more. */
static int audit_drain(ConnAudit *a) {
        while (!a->done) {
                struct pollfd pfd = { .fd = a->fd, .events = POLLIN };
                int r = poll(&pfd, 1, 0);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return 0;
                if ((r = audit_read(a, RECORD_MS)) == -EBADMSG)
                        return r;
        }
        return 0;
}

/* The proxy gave no end (it died, or broke the protocol): the entry ends
 * here with why, one entry all the same. */
static void audit_finish(ConnAudit *a, const char *why) {
        if (a->ended)
                return;
        snprintf(a->rec.end, sizeof(a->rec.end), "%s", why);
        a->rec.duration_ms = time_now_mono_ms() - a->started_ms;
        if (a->id) {
                audit_update(a->svc, a->id, a->se, &a->rec, true);
        } else {
                memset(&a->rec, 0, sizeof(a->rec));
                snprintf(a->rec.reason, sizeof(a->rec.reason), "%s", why);
                snprintf(a->rec.end, sizeof(a->rec.end), "%s", why);
                a->rec.duration_ms = time_now_mono_ms() - a->started_ms;
                a->id = audit_insert(a->svc, a->se, &a->rec, true);
                audit_log_decision(a);
        }
        a->ended = a->done = true;
}

/* The proxy towards the sandbox: its bytes on the data socket become the
 * stream's, and its end the stream's EOF. The connection's records are
 * read here too, and always before the bytes that came after them: the
 * proxy writes a decision before it answers or relays, so a sandbox's
 * client never has an answer whose audit entry is not written yet. */
typedef struct Pump {
        ChanStream *s;
        int fd;
        ConnAudit *audit;
        atomic_bool stop;
        atomic_bool done;
} Pump;

static void *pump_to_sandbox(void *arg) {
        Pump *p = arg;
        ConnAudit *a = p->audit;
        uint8_t *buf = malloc(PUMP_CHUNK);
        while (buf && !atomic_load(&p->stop)) {
                struct pollfd pfd[2] = { { .fd = p->fd, .events = POLLIN }, { .fd = a->fd, .events = POLLIN } };
                int r = poll(pfd, a->done ? 1 : 2, 1000);
                if (r < 0 && errno != EINTR)
                        break;
                if (r <= 0)
                        continue;
                if (!a->done && pfd[1].revents && audit_read(a, RECORD_MS) == -EBADMSG)
                        break;
                if (!pfd[0].revents)
                        continue;
                ssize_t n = recv(p->fd, buf, PUMP_CHUNK, MSG_DONTWAIT);
                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                        continue;
                /* A record sent before these bytes is readable now: it goes
                 * into the log first. */
                if (audit_drain(a) < 0)
                        break;
                if (n <= 0 || chan_stream_write(p->s, buf, (size_t)n, 60000) < 0)
                        break;
        }
        free(buf);
        (void)chan_stream_close_write(p->s);
        atomic_store(&p->done, true);
        return NULL;
}

/* The sandbox towards the proxy, until the proxy is done with the
 * connection (it closed the data socket) or the sandbox is gone. A proxy
 * that stops reading (a refusal answered after the head of a request whose
 * body is still coming) has not stopped writing: what the sandbox sends
 * from then on is dropped, and the loop waits for the proxy's end, so that
 * the answer already on the data socket reaches the sandbox before its end
 * of stream. */
static void pump_to_proxy(Pump *p) {
        bool sandbox_eof = false, proxy_deaf = false;
        while (!atomic_load(&p->done)) {
                ChanEvent ev;
                if (chan_stream_next(p->s, 1000, &ev) < 0)
                        continue;
                if (ev.type == CHAN_EV_DATA && !sandbox_eof) {
                        int r = proxy_deaf ? 0 : io_send_all(p->fd, ev.data, ev.len);
                        chan_event_clear(&ev);
                        if (r < 0)
                                proxy_deaf = true;
                } else if (ev.type == CHAN_EV_EOF) {
                        sandbox_eof = true;
                        (void)shutdown(p->fd, SHUT_WR);
                } else {
                        chan_event_clear(&ev); /* the agent gave up, or the channel closed */
                        break;
                }
        }
}

/* A refusal the daemon answers itself, in the proxy's form: the entry is
 * written first, then the sandbox hears why. */
static void refuse_stream(EgressService *svc, SandboxEgress *se, ChanStream *s, int status, const char *title,
                          const EgressRecord *rec) {
        EgressRecord r = *rec;
        if (!r.end[0])
                snprintf(r.end, sizeof(r.end), "refused");
        (void)audit_insert(svc, se, &r, true);
        char body[320];
        int bl = snprintf(body, sizeof(body), "runtime egress: %s\n", rec->reason);
        if (bl < 0 || (size_t)bl >= sizeof(body))
                bl = (int)sizeof(body) - 1;
        char msg[640];
        int ml = snprintf(msg, sizeof(msg),
                          "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
                          "%sConnection: close\r\nX-Runtime-Egress: refused\r\n\r\n%.*s",
                          status, title, bl, status == 503 ? "Retry-After: 1\r\n" : "", bl, body);
        if (ml > 0 && (size_t)ml < sizeof(msg))
                (void)chan_stream_write(s, msg, (size_t)ml, REFUSAL_WRITE_MS);
        (void)chan_stream_close_write(s);
}

static void serve(EgressService *svc, Conn *conn) {
        SandboxEgress *se = conn->se;
        ConnAudit audit = { .svc = svc, .se = se, .fd = -1, .started_ms = time_now_mono_ms() };
        int data[2] = { -1, -1 }, meta[2] = { -1, -1 };
        json_t *settings = NULL;
        int r;
        pthread_mutex_lock(&se->lock);
        bool internet = json_is_true(json_object_get(se->network, "internet"));
        settings = json_pack("{s:s,s:O,s:b}", "sandbox", se->id, "network", se->network, "trial", se->trial);
        pthread_mutex_unlock(&se->lock);
        /* Secret values go to the proxy only for a sandbox that may reach a
         * host at all; the proxy writes each only towards its own hosts. */
        json_t *secrets = NULL;
        if (settings && internet && egress_secrets_for_proxy(svc, se->owner, se->scope, &secrets) == 0)
                json_object_set_new(settings, "secrets", secrets);
        if (!settings || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, data) < 0 ||
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, meta) < 0) {
                EgressRecord rec = { 0 };
                snprintf(rec.reason, sizeof(rec.reason), "the daemon is out of resources");
                refuse_stream(svc, se, conn->s, 503, "Service Unavailable", &rec);
                goto done;
        }
        r = egress_service_proxy_send(svc, data[1], meta[1]);
        close(data[1]);
        close(meta[1]);
        data[1] = meta[1] = -1;
        if (r < 0) {
                EgressRecord rec = { 0 };
                snprintf(rec.reason, sizeof(rec.reason), "the egress proxy is not running");
                refuse_stream(svc, se, conn->s, 502, "Bad Gateway", &rec);
                log_error(NULL, "egress %s: cannot hand the connection to the proxy: %s", se->id, strerror(-r));
                goto done;
        }
        audit.fd = meta[0];
        if (egress_wire_write(meta[0], settings, SETTINGS_MS) < 0) {
                audit_finish(&audit, "the egress proxy ended during the connection");
                goto done;
        }
        Pump pump = { .s = conn->s, .fd = data[0], .audit = &audit };
        pthread_t t;
        if (pthread_create(&t, NULL, pump_to_sandbox, &pump) != 0) {
                audit_finish(&audit, "the daemon is out of resources");
                goto done;
        }
        pump_to_proxy(&pump);
        atomic_store(&pump.stop, true);
        (void)shutdown(data[0], SHUT_RDWR);
        pthread_join(t, NULL);
        /* The end record follows the data socket's end. */
        while (!audit.done)
                (void)audit_read(&audit, RECORD_MS);
        if (audit.broken) {
                log_warn(NULL, "egress %s: the proxy sent a record out of bounds; the connection is ended", se->id);
                audit_finish(&audit, "the egress proxy sent a malformed record");
        } else
                audit_finish(&audit, "the egress proxy ended during the connection");
done:
        egress_wire_settings_free(settings);
        for (int i = 0; i < 2; i++) {
                if (data[i] >= 0)
                        close(data[i]);
                if (meta[i] >= 0)
                        close(meta[i]);
        }
        chan_stream_finish(conn->s, NULL);
        chan_stream_free(conn->s);
}

/* Under svc->lock: the first waiting connection whose sandbox is within its
 * share, taken off the queue. */
static Conn *queue_take(EgressService *svc) {
        for (Conn **p = &svc->queue, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
                Conn *c = *p;
                if (c->se->serving >= svc->share)
                        continue;
                *p = c->next;
                if (svc->queue_tail == c)
                        svc->queue_tail = prev;
                c->next = NULL;
                svc->n_waiting--;
                c->se->waiting--;
                c->se->serving++;
                return c;
        }
        return NULL;
}

/* Under svc->lock: one connection fewer held. */
static void conn_done_locked(EgressService *svc) {
        if (--svc->active == 0)
                pthread_cond_broadcast(&svc->idle);
}

static void deadline_in(struct timespec *dl, long ms) {
        clock_gettime(CLOCK_REALTIME, dl);
        dl->tv_sec += ms / 1000;
        dl->tv_nsec += (ms % 1000) * 1000000L;
        if (dl->tv_nsec >= 1000000000L) {
                dl->tv_sec++;
                dl->tv_nsec -= 1000000000L;
        }
}

static void *worker_main(void *arg) {
        EgressService *svc = arg;
        pthread_mutex_lock(&svc->lock);
        bool timed_out = false;
        for (;;) {
                Conn *conn = queue_take(svc);
                if (conn) {
                        timed_out = false;
                        pthread_mutex_unlock(&svc->lock);
                        SandboxEgress *se = conn->se;
                        serve(svc, conn);
                        free(conn);
                        pthread_mutex_lock(&svc->lock);
                        se->serving--;
                        conn_done_locked(svc);
                        pthread_mutex_unlock(&svc->lock);
                        egress_sandbox_unref(se);
                        pthread_mutex_lock(&svc->lock);
                        continue;
                }
                if (svc->stopping || timed_out)
                        break;
                struct timespec dl;
                deadline_in(&dl, POOL_IDLE_MS);
                svc->idle_workers++;
                int r = pthread_cond_timedwait(&svc->work, &svc->lock, &dl);
                svc->idle_workers--;
                if (svc->wakeups > 0)
                        svc->wakeups--;
                timed_out = r == ETIMEDOUT;
        }
        svc->workers--;
        pthread_cond_broadcast(&svc->idle);
        pthread_mutex_unlock(&svc->lock);
        return NULL;
}

static int thread_start(void *(*fn)(void *), void *arg) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        pthread_t t;
        int r = pthread_create(&t, &attr, fn, arg);
        pthread_attr_destroy(&attr);
        return -r;
}

/* The audit log says why, the sandbox side hears it, and the proxy never
 * reads a byte of it. */
static void refuse(EgressService *svc, Conn *conn, unsigned unlogged) {
        SandboxEgress *se = conn->se;
        char reason[150]; /* leaves room in EgressRecord.reason for the count */
        if (conn->timed_out)
                snprintf(reason, sizeof(reason),
                         "waited %u ms for an egress worker (--egress-wait-timeout-ms): %s", svc->wait_ms,
                         conn->over_total ? "all egress workers are busy"
                                          : "this sandbox's share is busy (--egress-workers-per-sandbox)");
        else if (conn->over_total)
                snprintf(reason, sizeof(reason),
                         "too many connections: all %u egress workers are busy and %u connections wait",
                         svc->max_workers, WAIT_TOTAL);
        else
                snprintf(reason, sizeof(reason),
                         "too many connections from this sandbox: %u served (--egress-workers-per-sandbox) "
                         "and %u waiting",
                         svc->share, WAIT_PER_SANDBOX);
        EgressRecord rec = { .allowed = false };
        size_t n = strlen(reason);
        memcpy(rec.reason, reason, n + 1);
        if (unlogged)
                snprintf(rec.reason + n, sizeof(rec.reason) - n, " (%u more refused unanswered)", unlogged);
        snprintf(rec.end, sizeof(rec.end), "refused");
        if (conn->timed_out)
                rec.duration_ms = time_now_mono_ms() - conn->queued_ms;
        refuse_stream(svc, se, conn->s, 503, "Service Unavailable", &rec);
        chan_stream_finish(conn->s, NULL);
        chan_stream_free(conn->s);
        log_warn(NULL, "egress %s refused: %s", se->id, rec.reason);
}

/* Under svc->lock: waiting connections past their time move from the queue
 * to the refusals. The queue is in the order connections came, so the
 * oldest is first. Returns the time (monotonic ms) the next one expires,
 * or 0 when none waits. */
static uint64_t queue_expire_locked(EgressService *svc) {
        uint64_t now = time_now_mono_ms();
        while (svc->queue && now - svc->queue->queued_ms >= svc->wait_ms) {
                Conn *c = svc->queue;
                svc->queue = c->next;
                if (!svc->queue)
                        svc->queue_tail = NULL;
                c->next = NULL;
                svc->n_waiting--;
                c->se->waiting--;
                c->timed_out = true;
                c->over_total = c->se->serving < svc->share;
                if (svc->refusals_tail)
                        svc->refusals_tail->next = c;
                else
                        svc->refusals = c;
                svc->refusals_tail = c;
                svc->n_refusals++;
        }
        return svc->queue ? svc->queue->queued_ms + svc->wait_ms : 0;
}

static void *refuser_main(void *arg) {
        EgressService *svc = arg;
        pthread_mutex_lock(&svc->lock);
        uint64_t idle_since = time_now_mono_ms();
        for (;;) {
                uint64_t next = queue_expire_locked(svc);
                Conn *conn = svc->refusals;
                if (conn) {
                        svc->refusals = conn->next;
                        if (!svc->refusals)
                                svc->refusals_tail = NULL;
                        svc->n_refusals--;
                        unsigned unlogged = conn->se->unlogged;
                        conn->se->unlogged = 0;
                        pthread_mutex_unlock(&svc->lock);
                        refuse(svc, conn, unlogged);
                        egress_sandbox_unref(conn->se);
                        free(conn);
                        pthread_mutex_lock(&svc->lock);
                        conn_done_locked(svc);
                        idle_since = time_now_mono_ms();
                        continue;
                }
                if (svc->stopping)
                        break;
                /* It also times out the waiting room: it stays while anything
                 * waits, and ends after a while with nothing to do. */
                uint64_t now = time_now_mono_ms();
                if (!next && now - idle_since >= POOL_IDLE_MS)
                        break;
                uint64_t until = next ? next : idle_since + POOL_IDLE_MS;
                struct timespec dl;
                deadline_in(&dl, until > now ? (long)(until - now) : 0);
                (void)pthread_cond_timedwait(&svc->refusal, &svc->lock, &dl);
        }
        svc->refuser = false;
        pthread_cond_broadcast(&svc->idle);
        pthread_mutex_unlock(&svc->lock);
        return NULL;
}

/* Under svc->lock: the refuser runs (it answers refusals and times out the
 * waiting room). false when no thread could be started. */
static bool refuser_ensure(EgressService *svc) {
        if (svc->refuser)
                return true;
        if (thread_start(refuser_main, svc) < 0)
                return false;
        svc->refuser = true;
        return true;
}

/* Under svc->lock. Returns false when the connection cannot even be refused
 * with an answer (it is then the caller's to close). */
static bool refusal_push(EgressService *svc, Conn *conn) {
        if (svc->n_refusals >= REFUSALS_MAX || !refuser_ensure(svc))
                return false;
        if (svc->refusals_tail)
                svc->refusals_tail->next = conn;
        else
                svc->refusals = conn;
        svc->refusals_tail = conn;
        svc->n_refusals++;
        pthread_cond_signal(&svc->refusal);
        return true;
}

/* Runs on the channel's reader thread: it queues and never blocks. */
void egress_sandbox_accept(void *userdata, ChanStream *s, json_t *request) {
        SandboxEgress *se = userdata;
        EgressService *svc = se->svc;
        const char *op = json_string_value(json_object_get(request, "op"));
        Conn *conn = op && strcmp(op, "connect") == 0 ? calloc(1, sizeof(*conn)) : NULL;
        json_decref(request);
        if (!conn) {
                chan_stream_free(s);
                return;
        }
        conn->se = se;
        conn->s = s;
        atomic_fetch_add(&se->refs, 1);
        pthread_mutex_lock(&svc->lock);
        svc->active++;
        if (svc->stopping || se->waiting >= WAIT_PER_SANDBOX || svc->n_waiting >= WAIT_TOTAL) {
                conn->over_total = se->waiting < WAIT_PER_SANDBOX;
                if (!refusal_push(svc, conn)) {
                        se->unlogged++;
                        conn_done_locked(svc);
                        pthread_mutex_unlock(&svc->lock);
                        chan_stream_free(s);
                        egress_sandbox_unref(se);
                        free(conn);
                }
                else
                        pthread_mutex_unlock(&svc->lock);
                return;
        }
        conn->queued_ms = time_now_mono_ms();
        if (svc->queue_tail)
                svc->queue_tail->next = conn;
        else {
                svc->queue = conn;
                pthread_cond_signal(&svc->refusal); /* the next to time out, now */
        }
        svc->queue_tail = conn;
        svc->n_waiting++;
        se->waiting++;
        /* Whoever waits is timed out by the refuser; should it not start,
         * the connection waits as long as its client does. */
        (void)refuser_ensure(svc);
        if (se->serving < svc->share) {
                /* Wake an idle worker not already woken, else add one. */
                if (svc->idle_workers > svc->wakeups) {
                        svc->wakeups++;
                        pthread_cond_signal(&svc->work);
                } else if (svc->workers < svc->max_workers && thread_start(worker_main, svc) == 0)
                        svc->workers++;
                /* Else a worker takes it when it ends its connection. */
        }
        pthread_mutex_unlock(&svc->lock);
}
