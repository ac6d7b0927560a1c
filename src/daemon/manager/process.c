#include "daemon/manager/process.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/manager/channel.h"
#include "daemon/manager/output.h"
#include "proto/proto.h"

#define CHUNK_MIN (32u * 1024u)
/* A chunk grows while one stream keeps writing, up to this: fewer, larger
 * events for a reader, which under load costs far less than many small. */
#define CHUNK_MAX (1024u * 1024u)
/* Output bytes in one event: its JSON text takes up to six times that while
 * it is written, per reader. */
#define EVENT_MAX (256u * 1024u)
#define MAX_FOLLOWERS 8
/* How long the drain waits for a reader that is behind before the ring
 * drops what it has not read: long enough for a reader that keeps up to
 * lose nothing, short enough that a reader gone quiet cannot stall the
 * process for good. */
#define FOLLOWER_GRACE_MS 2000

typedef struct Chunk {
        struct Chunk *next;
        uint64_t off;
        size_t len, cap;
        int fd;
        uint8_t data[];
} Chunk;

struct Proc {
        ProcTable *t;
        Proc *next;
        int refs; /* under t->lock */
        char id[PROC_ID_LEN + 1];
        char sandbox_id[PROC_SANDBOX_ID_MAX];
        char owner[128];
        char *command;
        uint64_t created_mono;
        int64_t started_unix, ended_unix;

        Sandbox *sb; /* while the drain runs */
        ChanStream *stream;
        pthread_t thread;
        bool thread_started;
        bool base64;
        bool stdin_pipe;
        bool pty;
        unsigned pty_cols, pty_rows; /* under write_lock */
        uint8_t *stdin_data;
        size_t stdin_len, stdin_sent;

        /* output, under t->lock */
        Chunk *head, *tail;
        Chunk **tail_link; /* the pointer that points at tail */
        size_t kept; /* bytes allocated for chunks */
        uint64_t start, end;
        const ProcCursor *followers[MAX_FOLLOWERS];

        int pid;
        char user[16]; /* as asked for, then as the agent's start event says */
        bool ended;
        uint64_t ended_mono;
        ProcExit exit;

        pthread_mutex_t write_lock;
        uint64_t stdin_off;
        bool stdin_closed;
};

/* A start under way, between the check of the bounds and the process's
 * entry into the table: counted as running meanwhile. It lives on the
 * starting thread's stack. */
typedef struct ProcPending {
        struct ProcPending *next;
        char sandbox_id[PROC_SANDBOX_ID_MAX];
        char owner[128];
} ProcPending;

struct ProcTable {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        Proc *procs; /* oldest first */
        ProcPending *pending;
        size_t bytes;
        unsigned owner_max;
        atomic_bool closing;
};

ProcTable *proc_table_new(void) {
        ProcTable *t = calloc(1, sizeof(*t));
        if (!t)
                return NULL;
        pthread_mutex_init(&t->lock, NULL);
        (void)time_cond_init_mono(&t->cond);
        t->owner_max = PROC_OWNER_RUNNING_DEFAULT;
        atomic_init(&t->closing, false);
        return t;
}

int proc_table_set_owner_max(ProcTable *t, unsigned max) {
        if (max < 1 || max > PROC_OWNER_RUNNING_MAX)
                return -ERANGE;
        pthread_mutex_lock(&t->lock);
        t->owner_max = max;
        pthread_mutex_unlock(&t->lock);
        return 0;
}

unsigned proc_table_owner_max(ProcTable *t) {
        pthread_mutex_lock(&t->lock);
        unsigned max = t->owner_max;
        pthread_mutex_unlock(&t->lock);
        return max;
}

static void drop_chunks(Proc *p) {
        while (p->head) {
                Chunk *c = p->head;
                p->head = c->next;
                p->kept -= c->cap;
                p->t->bytes -= c->cap;
                free(c);
        }
        p->tail = NULL;
        p->tail_link = &p->head;
        p->start = p->end;
}

static void proc_free(Proc *p) {
        if (p->thread_started)
                pthread_join(p->thread, NULL);
        chan_stream_free(p->stream);
        sandbox_release(p->sb);
        while (p->head) {
                Chunk *c = p->head;
                p->head = c->next;
                free(c);
        }
        free(p->command);
        free(p->stdin_data);
        pthread_mutex_destroy(&p->write_lock);
        free(p);
}

void proc_table_free(ProcTable *t) {
        if (!t)
                return;
        atomic_store(&t->closing, true);
        pthread_mutex_lock(&t->lock);
        for (Proc *p = t->procs; p; p = p->next)
                if (!p->ended && p->stream)
                        chan_stream_cancel(p->stream);
        Proc *all = t->procs;
        t->procs = NULL;
        pthread_mutex_unlock(&t->lock);
        while (all) {
                Proc *n = all->next;
                proc_free(all);
                all = n;
        }
        pthread_cond_destroy(&t->cond);
        pthread_mutex_destroy(&t->lock);
        free(t);
}

static void unref_locked(Proc *p) {
        if (--p->refs == 0)
                proc_free(p);
}

void proc_unref(Proc *p) {
        if (!p)
                return;
        ProcTable *t = p->t;
        pthread_mutex_lock(&t->lock);
        bool last = --p->refs == 0;
        pthread_mutex_unlock(&t->lock);
        if (last)
                proc_free(p);
}

const char *proc_id(Proc *p) {
        return p->id;
}

/* Under t->lock: forgets finished processes past their retention, and the
 * oldest finished ones of `sandbox_id` while it keeps PROC_MAX_KEPT. */
static void sweep_locked(ProcTable *t, const char *sandbox_id) {
        uint64_t now = time_now_mono_ms();
        size_t kept = 0;
        for (Proc *p = t->procs; p; p = p->next)
                if (sandbox_id && strcmp(p->sandbox_id, sandbox_id) == 0)
                        kept++;
        Proc **pp = &t->procs;
        while (*pp) {
                Proc *p = *pp;
                bool mine = sandbox_id && strcmp(p->sandbox_id, sandbox_id) == 0;
                bool expired = p->ended && now - p->ended_mono > PROC_RETAIN_MS;
                bool crowded = p->ended && mine && kept >= PROC_MAX_KEPT;
                if (expired || crowded) {
                        *pp = p->next;
                        if (mine)
                                kept--;
                        drop_chunks(p);
                        unref_locked(p);
                        continue;
                }
                pp = &p->next;
        }
}

static void command_text(json_t *request, char **ret) {
        const char *cmd = json_string_value(json_object_get(request, "command"));
        if (cmd) {
                *ret = strndup(cmd, 1024);
                return;
        }
        /* argv joined by spaces, cut at 1 KiB: for listing, not for running. */
        char buf[1025];
        size_t n = 0;
        size_t i;
        json_t *a;
        json_array_foreach(json_object_get(request, "argv"), i, a) {
                const char *s = json_string_value(a);
                for (; s && *s && n < sizeof(buf) - 1; s++)
                        buf[n++] = *s;
                if (n < sizeof(buf) - 1)
                        buf[n++] = ' ';
        }
        if (n > 0 && buf[n - 1] == ' ')
                n--;
        buf[n] = '\0';
        *ret = strdup(buf);
}

/* ---- the drain: channel stream -> ring ---- */

static uint64_t slowest_follower_locked(Proc *p) {
        uint64_t low = UINT64_MAX;
        for (size_t i = 0; i < MAX_FOLLOWERS; i++)
                if (p->followers[i] && p->followers[i]->at < low)
                        low = p->followers[i]->at;
        return low;
}

/* Under t->lock: frees the output of the oldest finished processes of the
 * same sandbox (or of any, for the daemon's bound) until `need` more bytes fit. */
static void evict_others_locked(Proc *self, size_t need) {
        ProcTable *t = self->t;
        size_t sandbox_bytes = 0;
        for (Proc *p = t->procs; p; p = p->next)
                if (strcmp(p->sandbox_id, self->sandbox_id) == 0)
                        sandbox_bytes += p->kept;
        for (Proc *p = t->procs; p && (sandbox_bytes + need > PROC_SANDBOX_BYTES || t->bytes + need > PROC_TABLE_BYTES);
             p = p->next) {
                if (p == self || !p->ended || !p->head)
                        continue;
                bool same = strcmp(p->sandbox_id, self->sandbox_id) == 0;
                if (!same && t->bytes + need <= PROC_TABLE_BYTES)
                        continue;
                if (same)
                        sandbox_bytes -= p->kept;
                drop_chunks(p);
        }
}

static bool over_bounds_locked(Proc *p, size_t need) {
        if (p->kept + need > PROC_RING_BYTES)
                return true;
        if (p->t->bytes + need > PROC_TABLE_BYTES)
                return true;
        size_t sandbox_bytes = 0;
        for (Proc *q = p->t->procs; q; q = q->next)
                if (strcmp(q->sandbox_id, p->sandbox_id) == 0)
                        sandbox_bytes += q->kept;
        return sandbox_bytes + need > PROC_SANDBOX_BYTES;
}

static void append_output(Proc *p, int fd, const uint8_t *data, size_t len) {
        ProcTable *t = p->t;
        pthread_mutex_lock(&t->lock);
        Chunk *c = p->tail;
        if (c && c->fd == fd && c->cap - c->len < len && c->len + len <= CHUNK_MAX) {
                size_t cap = c->cap * 2 > c->len + len ? c->cap * 2 : c->len + len;
                if (cap > CHUNK_MAX)
                        cap = CHUNK_MAX;
                if (!over_bounds_locked(p, cap - c->cap)) {
                        Chunk *g = realloc(c, sizeof(Chunk) + cap);
                        if (g) {
                                *p->tail_link = g;
                                p->tail = g;
                                p->kept += cap - g->cap;
                                t->bytes += cap - g->cap;
                                g->cap = cap;
                                c = g;
                        }
                }
        }
        if (c && c->fd == fd && c->cap - c->len >= len) {
                memcpy(c->data + c->len, data, len);
                c->len += len;
                p->end += len;
                pthread_cond_broadcast(&t->cond);
                pthread_mutex_unlock(&t->lock);
                return;
        }
        size_t cap = len > CHUNK_MIN ? len : CHUNK_MIN;
        evict_others_locked(p, cap);
        /* Room is made from the start of this process's own ring; a reader
         * still behind that start gets a while to catch up first. */
        struct timespec dl;
        time_mono_deadline(&dl, FOLLOWER_GRACE_MS);
        bool waited_out = false;
        while (p->head && over_bounds_locked(p, cap)) {
                Chunk *h = p->head;
                if (!waited_out && slowest_follower_locked(p) < h->off + h->len && !atomic_load(&t->closing)) {
                        if (pthread_cond_timedwait(&t->cond, &t->lock, &dl) == ETIMEDOUT)
                                waited_out = true;
                        continue;
                }
                p->head = h->next;
                if (p->tail_link == &h->next)
                        p->tail_link = &p->head;
                if (!p->head) {
                        p->tail = NULL;
                        p->tail_link = &p->head;
                }
                p->kept -= h->cap;
                t->bytes -= h->cap;
                p->start = p->head ? p->head->off : p->end;
                free(h);
        }
        c = malloc(sizeof(Chunk) + cap);
        if (!c) {
                /* Out of memory: the bytes are lost, and a reader is told. */
                p->end += len;
                if (!p->head)
                        p->start = p->end;
                pthread_mutex_unlock(&t->lock);
                return;
        }
        *c = (Chunk){ .off = p->end, .len = len, .cap = cap, .fd = fd };
        memcpy(c->data, data, len);
        if (p->tail) {
                p->tail->next = c;
                p->tail_link = &p->tail->next;
        } else {
                p->head = c;
                p->tail_link = &p->head;
        }
        p->tail = c;
        if (p->start == p->end && p->head == c)
                p->start = c->off;
        p->end += len;
        p->kept += cap;
        t->bytes += cap;
        pthread_cond_broadcast(&t->cond);
        pthread_mutex_unlock(&t->lock);
}

/* The drain's last touch of the table: once `ended` is set the process may
 * be forgotten (and its thread joined) by anyone holding the lock, so the
 * sandbox's reference is taken out in the same critical section. */
static void finish(Proc *p, const ProcExit *x) {
        ProcTable *t = p->t;
        pthread_mutex_lock(&t->lock);
        p->exit = *x;
        if (p->sb)
                p->exit.memory_mib = sandbox_memory_mib(p->sb);
        if (p->exit.state == PROC_LOST && sandbox_left(p->sb))
                p->exit.detached = true;
        p->ended = true;
        p->ended_mono = time_now_mono_ms();
        p->ended_unix = time_now_unix();
        Sandbox *sb = TAKE_PTR(p->sb);
        ProcExit end = p->exit;
        pthread_cond_broadcast(&t->cond);
        pthread_mutex_unlock(&t->lock);
        /* Its end is an event of its sandbox (after the readers are woken:
         * the store's write is not theirs to wait for); one killed for
         * memory is one more. */
        /* A sandbox let go at the daemon's stop runs on: its processes did
         * not end, whatever the channel's end made of them here. */
        if (sb && !sandbox_left(sb)) {
                sandbox_emit(sb, "process.exited", NULL,
                             json_pack("{s:s,s:s,s:o,s:b,s:I,s:I}", "processId", p->id, "state",
                                       proc_state_name(end.state), "exitCode",
                                       end.has_exit_code ? json_integer(end.exit_code) : json_null(), "timedOut",
                                       end.timed_out, "durationMs", (json_int_t)end.duration_ms, "outOfMemory",
                                       (json_int_t)end.oom_killed));
                if (end.oom_killed > 0)
                        sandbox_emit(sb, "sandbox.oom_killed", NULL,
                                     json_pack("{s:s,s:I,s:I}", "processId", p->id, "processesKilled",
                                               (json_int_t)end.oom_killed, "memoryMiB", (json_int_t)end.memory_mib));
        }
        /* The sandbox's reference goes with the process's end: a stop or a
         * delete need not wait for readers of its output. */
        sandbox_release(sb);
}

static const char *const proc_states[] = {
        [PROC_RUNNING] = "running", [PROC_EXITED] = "exited", [PROC_KILLED] = "killed",
        [PROC_TIMED_OUT] = "timed_out", [PROC_LOST] = "lost", [PROC_FAILED] = "failed",
};

const char *proc_state_name(ProcState s) {
        return (size_t)s < ELEMENTSOF(proc_states) ? proc_states[s] : "unknown";
}

static void exit_from_result(json_t *res, ProcExit *x) {
        *x = (ProcExit){ 0 };
        const char *msg = NULL;
        if (agent_result_error(res, &msg)) {
                x->state = PROC_FAILED;
                snprintf(x->reason, sizeof(x->reason), "%s", msg ? msg : "the command could not run");
                return;
        }
        x->timed_out = json_is_true(json_object_get(res, "timedOut"));
        x->state = x->timed_out ? PROC_TIMED_OUT : json_is_integer(json_object_get(res, "signal")) ? PROC_KILLED
                                                                                                  : PROC_EXITED;
        json_t *ec = json_object_get(res, "exitCode");
        x->has_exit_code = json_is_integer(ec);
        x->exit_code = (int)json_integer_value(ec);
        x->duration_ms = (int64_t)json_integer_value(json_object_get(res, "durationMs"));
        json_int_t oom = json_integer_value(json_object_get(res, "outOfMemory"));
        x->oom_killed = oom > 0 && oom <= 1000000 ? oom : 0;
}

static void *drain(void *userdata) {
        Proc *p = userdata;
        bool closed_write = false;
        for (;;) {
                if (p->stdin_sent < p->stdin_len) {
                        ssize_t n = chan_stream_write_some(p->stream, p->stdin_data + p->stdin_sent,
                                                           p->stdin_len - p->stdin_sent, 0);
                        if (n > 0)
                                p->stdin_sent += (size_t)n;
                        else if (n < 0)
                                p->stdin_sent = p->stdin_len;
                }
                if (!closed_write && p->stdin_sent == p->stdin_len && !p->stdin_pipe) {
                        closed_write = true;
                        if (p->stdin_len > 0)
                                chan_stream_close_write(p->stream);
                }
                ChanEvent ev;
                int rc = chan_stream_next(p->stream, p->stdin_sent < p->stdin_len ? 20 : 1000, &ev);
                if (rc == -ETIMEDOUT) {
                        if (atomic_load(&p->t->closing))
                                chan_stream_cancel(p->stream);
                        continue;
                }
                if (rc < 0 || ev.type == CHAN_EV_CLOSED) {
                        if (rc == 0)
                                chan_event_clear(&ev);
                        ProcExit x = { .state = PROC_LOST };
                        snprintf(x.reason, sizeof(x.reason), "sandbox %s stopped while the process ran",
                                 p->sandbox_id);
                        finish(p, &x);
                        break;
                }
                if (ev.type == CHAN_EV_DATA && (ev.fd == PROTO_FD_OUT || ev.fd == PROTO_FD_ERR))
                        append_output(p, ev.fd, ev.data, ev.len);
                else if (ev.type == CHAN_EV_EVENT) {
                        json_t *pid = json_object_get(ev.json, "pid");
                        const char *user = json_string_value(json_object_get(ev.json, "user"));
                        pthread_mutex_lock(&p->t->lock);
                        if (json_is_integer(pid))
                                p->pid = (int)json_integer_value(pid);
                        /* An image without the sandbox user runs it as root. */
                        if (user && (strcmp(user, "root") == 0 || strcmp(user, "sandbox") == 0))
                                snprintf(p->user, sizeof(p->user), "%s", user);
                        pthread_cond_broadcast(&p->t->cond);
                        pthread_mutex_unlock(&p->t->lock);
                } else if (ev.type == CHAN_EV_RESULT) {
                        ProcExit x;
                        exit_from_result(ev.json, &x);
                        chan_event_clear(&ev);
                        finish(p, &x);
                        break;
                }
                chan_event_clear(&ev);
        }
        return NULL;
}

/* ---- start, find, list ---- */

/* A new process holding the table's reference and sb's (released when the
 * allocation fails). */
static Proc *proc_alloc(ProcTable *t, Sandbox *sb) {
        Proc *p = calloc(1, sizeof(*p));
        if (!p) {
                sandbox_release(sb);
                return NULL;
        }
        p->t = t;
        p->tail_link = &p->head;
        p->refs = 1; /* the table's */
        p->sb = sb;
        pthread_mutex_init(&p->write_lock, NULL);
        return p;
}

/* Under t->lock: whether one more process of `me` fits, the owner's bound
 * checked before the sandbox's so that an owner at its own is told so. */
static int room_locked(ProcTable *t, const ProcPending *me, SandboxError *e) {
        unsigned owners = 0, sandboxes = 0;
        for (Proc *q = t->procs; q; q = q->next) {
                if (q->ended || strcmp(q->owner, me->owner) != 0)
                        continue;
                owners++;
                if (strcmp(q->sandbox_id, me->sandbox_id) == 0)
                        sandboxes++;
        }
        for (ProcPending *q = t->pending; q; q = q->next) {
                if (strcmp(q->owner, me->owner) != 0)
                        continue;
                owners++;
                if (strcmp(q->sandbox_id, me->sandbox_id) == 0)
                        sandboxes++;
        }
        if (owners >= t->owner_max)
                return sandbox_error(e, SANDBOX_ERR_TOO_MANY, "wait for a process to end, or kill one",
                                     "your sandboxes on this host already run %u process%s, the most this "
                                     "daemon runs at once for one owner (--max-processes-per-owner)",
                                     t->owner_max, t->owner_max == 1 ? "" : "es");
        if (sandboxes >= PROC_MAX_RUNNING)
                return sandbox_error(e, SANDBOX_ERR_TOO_MANY, "wait for a process to end, or kill one",
                                     "sandbox %s already runs %d processes", me->sandbox_id,
                                     PROC_MAX_RUNNING);
        return 0;
}

/* The process made and its drain started, not yet in the table. */
static int proc_launch(ProcTable *t, Sandbox *sb, json_t *request, const ProcSpec *spec, Proc **ret,
                       SandboxError *e) {
        Proc *p = proc_alloc(t, sb);
        if (!p)
                return -ENOMEM;
        memcpy(p->id, "proc_", 5);
        snprintf(p->sandbox_id, sizeof(p->sandbox_id), "%s", sandbox_id(sb));
        snprintf(p->owner, sizeof(p->owner), "%s", spec->owner);
        p->base64 = spec->base64;
        p->stdin_pipe = spec->stdin_pipe;
        p->pty = spec->pty;
        p->pty_cols = spec->pty_cols;
        p->pty_rows = spec->pty_rows;
        snprintf(p->user, sizeof(p->user), "%s", spec->user ? spec->user : "root");
        p->exit.state = PROC_RUNNING;
        p->created_mono = time_now_mono_ms();
        p->started_unix = time_now_unix();
        command_text(request, &p->command);
        int r = random_hex(p->id + 5, 8);
        if (r == 0 && spec->stdin_len > 0) {
                p->stdin_data = malloc(spec->stdin_len);
                if (p->stdin_data) {
                        memcpy(p->stdin_data, spec->stdin_data, spec->stdin_len);
                        p->stdin_len = spec->stdin_len;
                } else
                        r = -ENOMEM;
        }
        if (r == 0 && !p->command)
                r = -ENOMEM;
        if (r < 0) {
                proc_free(p);
                return r;
        }
        /* What a later daemon makes it again from, should this one end
         * while it runs: the agent keeps it and gives it back, unread. */
        _cleanup_json_ json_t *tagged = json_copy(request);
        json_t *tag = json_pack("{s:s,s:s,s:s,s:b,s:b,s:b,s:i,s:i,s:I}", "id", p->id, "command", p->command, "user",
                                p->user, "base64", p->base64, "stdinPipe", p->stdin_pipe, "pty", p->pty, "cols",
                                (int)p->pty_cols, "rows", (int)p->pty_rows, "started", (json_int_t)p->started_unix);
        if (!tagged || !tag || json_object_set_new(tagged, "tag", tag) < 0) {
                proc_free(p);
                return -ENOMEM;
        }
        if ((r = sandbox_open_stream(sb, tagged, &p->stream, e)) < 0) {
                proc_free(p);
                return r;
        }
        p->stdin_off = p->stdin_len;
        r = pthread_create(&p->thread, NULL, drain, p);
        if (r != 0) {
                proc_free(p);
                return -r;
        }
        p->thread_started = true;
        *ret = p;
        return 0;
}

int proc_start(ProcTable *t, Sandbox *sb, json_t *request, const ProcSpec *spec, Proc **ret, SandboxError *e) {
        /* What a failure that names no cause of its own (out of memory) answers. */
        (void)sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not start the process");
        ProcPending me = { 0 };
        snprintf(me.sandbox_id, sizeof(me.sandbox_id), "%s", sandbox_id(sb));
        snprintf(me.owner, sizeof(me.owner), "%s", spec->owner);
        pthread_mutex_lock(&t->lock);
        sweep_locked(t, me.sandbox_id);
        int r = room_locked(t, &me, e);
        if (r == 0) {
                me.next = t->pending;
                t->pending = &me;
        }
        pthread_mutex_unlock(&t->lock);
        if (r < 0) {
                sandbox_release(sb);
                return r;
        }
        Proc *p = NULL;
        r = proc_launch(t, sb, request, spec, &p, e);
        /* Out of the pending starts and into the table in one step: the
         * bounds never see it in neither or in both. */
        pthread_mutex_lock(&t->lock);
        ProcPending **pp = &t->pending;
        while (*pp != &me)
                pp = &(*pp)->next;
        *pp = me.next;
        if (r == 0) {
                Proc **tail = &t->procs;
                while (*tail)
                        tail = &(*tail)->next;
                *tail = p;
                p->refs++; /* the caller's */
        }
        pthread_mutex_unlock(&t->lock);
        if (r < 0)
                return r;
        *ret = p;
        return 0;
}

static bool tag_string(json_t *tag, const char *key, size_t max, const char **ret) {
        const char *v = json_string_value(json_object_get(tag, key));
        if (!v || strlen(v) > max)
                return false;
        *ret = v;
        return true;
}

int proc_adopt(ProcTable *t, Sandbox *sb, json_t *kept) {
        /* The listing comes from the sandbox: every member is checked, and
         * the owner is the sandbox's, never the listing's. */
        json_t *tag = json_object_get(kept, "tag");
        json_t *jstream = json_object_get(kept, "stream"), *jsent = json_object_get(kept, "sent"),
               *jdropped = json_object_get(kept, "dropped"), *jstdin = json_object_get(kept, "stdin"),
               *jpid = json_object_get(kept, "pid");
        const char *id = NULL, *command = NULL, *user = NULL;
        json_int_t stream = json_integer_value(jstream), sent = json_integer_value(jsent),
                   dropped = json_integer_value(jdropped), stdin_bytes = json_integer_value(jstdin),
                   pid = json_integer_value(jpid), started = json_integer_value(json_object_get(tag, "started"));
        json_int_t cols = json_integer_value(json_object_get(tag, "cols")),
                   rows = json_integer_value(json_object_get(tag, "rows"));
        bool ok = json_is_object(tag) && json_is_integer(jstream) && stream > 0 && stream < UINT32_MAX &&
                  json_is_integer(jsent) && sent >= 0 && json_is_integer(jdropped) && dropped >= 0 &&
                  sent <= INT64_MAX / 2 && dropped <= INT64_MAX / 2 && json_is_integer(jstdin) && stdin_bytes >= 0 &&
                  json_is_integer(jpid) && pid >= 0 && pid <= INT32_MAX && tag_string(tag, "id", PROC_ID_LEN, &id) &&
                  strlen(id) == PROC_ID_LEN && strncmp(id, "proc_", 5) == 0 &&
                  strspn(id + 5, "0123456789abcdef") == PROC_ID_LEN - 5 && tag_string(tag, "command", 1024, &command) &&
                  tag_string(tag, "user", 15, &user) && cols >= 0 && cols <= 10000 && rows >= 0 && rows <= 10000 &&
                  started >= 0;
        if (!ok) {
                sandbox_release(sb);
                return -EBADMSG;
        }
        const char *sid = sandbox_id(sb);
        pthread_mutex_lock(&t->lock);
        bool taken = false;
        for (Proc *q = t->procs; q; q = q->next)
                if (strcmp(q->id, id) == 0)
                        taken = true;
        pthread_mutex_unlock(&t->lock);
        if (taken) {
                sandbox_release(sb);
                return -EEXIST;
        }
        Proc *p = proc_alloc(t, sb);
        if (!p)
                return -ENOMEM;
        snprintf(p->id, sizeof(p->id), "%s", id);
        snprintf(p->sandbox_id, sizeof(p->sandbox_id), "%s", sid);
        snprintf(p->owner, sizeof(p->owner), "%s", sandbox_owner(sb));
        snprintf(p->user, sizeof(p->user), "%s", user);
        p->command = strdup(command);
        p->base64 = json_is_true(json_object_get(tag, "base64"));
        p->stdin_pipe = json_is_true(json_object_get(tag, "stdinPipe"));
        p->pty = json_is_true(json_object_get(tag, "pty"));
        p->pty_cols = (unsigned)cols;
        p->pty_rows = (unsigned)rows;
        p->pid = (int)pid;
        p->exit.state = PROC_RUNNING;
        p->created_mono = time_now_mono_ms();
        p->started_unix = started;
        /* What came before the gap was in the old daemon's ring: a reader
         * from there is told it was dropped. */
        p->start = p->end = (uint64_t)sent + (uint64_t)dropped;
        p->stdin_off = (uint64_t)stdin_bytes;
        p->stdin_closed = !json_is_true(json_object_get(kept, "stdinOpen"));
        int r = p->command ? sandbox_adopt_stream(sb, (uint32_t)stream, &p->stream) : -ENOMEM;
        if (r == 0)
                r = -pthread_create(&p->thread, NULL, drain, p);
        if (r < 0) {
                proc_free(p);
                return r;
        }
        p->thread_started = true;
        pthread_mutex_lock(&t->lock);
        Proc **pp = &t->procs;
        while (*pp)
                pp = &(*pp)->next;
        *pp = p;
        pthread_mutex_unlock(&t->lock);
        return 0;
}

Proc *proc_find(ProcTable *t, const char *owner, const char *sandbox_id, const char *id) {
        pthread_mutex_lock(&t->lock);
        sweep_locked(t, NULL);
        Proc *found = NULL;
        for (Proc *p = t->procs; p; p = p->next)
                if (strcmp(p->id, id) == 0 && strcmp(p->sandbox_id, sandbox_id) == 0 && strcmp(p->owner, owner) == 0) {
                        found = p;
                        p->refs++;
                        break;
                }
        pthread_mutex_unlock(&t->lock);
        return found;
}

static void snapshot_locked(Proc *p, ProcInfo *ret) {
        *ret = (ProcInfo){ .exit = p->exit, .pid = p->pid, .started_unix = p->started_unix,
                           .ended_unix = p->ended ? p->ended_unix : 0, .output_bytes = p->end,
                           .stdin_offset = p->stdin_off, .stdin_open = p->stdin_pipe && !p->stdin_closed && !p->ended,
                           .base64 = p->base64, .pty = p->pty, .pty_cols = p->pty_cols,
                           .pty_rows = p->pty_rows };
        snprintf(ret->id, sizeof(ret->id), "%s", p->id);
        snprintf(ret->command, sizeof(ret->command), "%s", p->command);
        snprintf(ret->user, sizeof(ret->user), "%s", p->user);
}

void proc_info(Proc *p, ProcInfo *ret) {
        pthread_mutex_lock(&p->t->lock);
        snapshot_locked(p, ret);
        pthread_mutex_unlock(&p->t->lock);
}

int proc_list(ProcTable *t, const char *owner, const char *sandbox_id, ProcInfoFn fn, void *userdata) {
        /* Copied under the lock, handed out after: fn may take its time. */
        size_t n = 0, i = 0;
        pthread_mutex_lock(&t->lock);
        sweep_locked(t, NULL);
        for (Proc *p = t->procs; p; p = p->next)
                n += strcmp(p->sandbox_id, sandbox_id) == 0 && strcmp(p->owner, owner) == 0;
        ProcInfo *all = calloc(n ? n : 1, sizeof(ProcInfo));
        for (Proc *p = t->procs; all && p; p = p->next)
                if (strcmp(p->sandbox_id, sandbox_id) == 0 && strcmp(p->owner, owner) == 0)
                        snapshot_locked(p, &all[i++]);
        pthread_mutex_unlock(&t->lock);
        if (!all)
                return -ENOMEM;
        int r = 0;
        for (i = 0; i < n && r == 0; i++)
                r = fn(userdata, &all[i]);
        free(all);
        return r;
}

bool proc_ended(Proc *p) {
        pthread_mutex_lock(&p->t->lock);
        bool ended = p->ended;
        pthread_mutex_unlock(&p->t->lock);
        return ended;
}

static bool wait_for(Proc *p, int timeout_ms, bool for_pid) {
        ProcTable *t = p->t;
        uint64_t end = time_now_mono_ms() + (uint64_t)timeout_ms;
        pthread_mutex_lock(&t->lock);
        while (!p->ended && !(for_pid && p->pid > 0) && time_now_mono_ms() < end) {
                struct timespec dl;
                time_mono_deadline(&dl, 200);
                pthread_cond_timedwait(&t->cond, &t->lock, &dl);
        }
        bool done = p->ended || (for_pid && p->pid > 0);
        pthread_mutex_unlock(&t->lock);
        return done;
}

bool proc_wait(Proc *p, int timeout_ms) {
        return wait_for(p, timeout_ms, false);
}

bool proc_wait_started(Proc *p, int timeout_ms) {
        return wait_for(p, timeout_ms, true);
}

/* ---- input and signals ---- */

int proc_write(Proc *p, const uint8_t *data, size_t len, int64_t offset, bool eof, uint64_t *ret_offset,
               SandboxError *e) {
        pthread_mutex_lock(&p->write_lock);
        int r = 0;
        if (!p->stdin_pipe || p->stdin_closed) {
                r = sandbox_error(e, SANDBOX_ERR_CONFLICT, "spawn it with stdin \"pipe\" to write to it", "%s",
                                  p->stdin_pipe ? "the process's stdin is closed" : "the process's stdin is not a pipe");
                goto out;
        }
        if (proc_ended(p)) {
                r = sandbox_error(e, SANDBOX_ERR_CONFLICT, NULL, "the process has ended");
                goto out;
        }
        size_t skip = 0;
        if (offset >= 0) {
                if ((uint64_t)offset > p->stdin_off) {
                        r = sandbox_error(e, SANDBOX_ERR_CONFLICT, "resend from the offset the last write returned",
                                          "offset %lld is past the %llu bytes written so far", (long long)offset,
                                          (unsigned long long)p->stdin_off);
                        goto out;
                }
                skip = p->stdin_off - (uint64_t)offset;
                if (skip > len)
                        skip = len;
        }
        /* Within a short wait, as much as the process takes: the caller
         * learns the new offset and sends the rest again. */
        uint64_t deadline = time_now_mono_ms() + 1000;
        size_t done = skip;
        while (done < len) {
                uint64_t now = time_now_mono_ms();
                if (now >= deadline)
                        break;
                ssize_t n = chan_stream_write_some(p->stream, data + done, len - done, (int)(deadline - now));
                if (n < 0) {
                        r = sandbox_error(e, SANDBOX_ERR_CONFLICT, NULL, "the process has ended");
                        goto out;
                }
                if (n == 0)
                        break;
                done += (size_t)n;
                p->stdin_off += (uint64_t)n;
        }
        if (eof && done == len) {
                chan_stream_close_write(p->stream);
                p->stdin_closed = true;
        }
        *ret_offset = p->stdin_off;
out:
        pthread_mutex_unlock(&p->write_lock);
        return r;
}

int proc_resize(Proc *p, unsigned cols, unsigned rows, SandboxError *e) {
        if (!p->pty)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "spawn it with pty to resize it",
                                     "process %s has no terminal", p->id);
        pthread_mutex_lock(&p->write_lock);
        int r = 0;
        _cleanup_json_ json_t *ev = json_pack("{s:s,s:i,s:i}", "event", "resize", "cols", (int)cols, "rows", (int)rows);
        if (!ev)
                r = -ENOMEM;
        else if (proc_ended(p) || chan_stream_send_event(p->stream, ev) < 0)
                r = sandbox_error(e, SANDBOX_ERR_CONFLICT, NULL, "process %s has ended", p->id);
        else {
                p->pty_cols = cols;
                p->pty_rows = rows;
        }
        pthread_mutex_unlock(&p->write_lock);
        return r;
}

int proc_signal(Proc *p, int signo, SandboxError *e) {
        ProcTable *t = p->t;
        pthread_mutex_lock(&t->lock);
        Sandbox *sb = p->sb;
        /* The drain holds the sandbox until the process ends; the signal
         * stream is opened under the lock so that it cannot be released
         * between. */
        ChanStream *s = NULL;
        int r = 0;
        if (p->ended || !sb)
                r = sandbox_error(e, SANDBOX_ERR_CONFLICT, NULL, "process %s has ended", p->id);
        else {
                json_t *req = agent_req_signal(chan_stream_id(p->stream), signo);
                r = req ? sandbox_open_stream(sb, req, &s, e) : -ENOMEM;
                json_decref(req);
        }
        pthread_mutex_unlock(&t->lock);
        if (r < 0)
                return r;
        _cleanup_json_ json_t *res = NULL;
        r = agent_wait_result(s, 10000, NULL, NULL, &res);
        chan_stream_free(s);
        if (r == -ETIMEDOUT)
                return sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "try again",
                                     "the sandbox did not answer the signal in time");
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "create a new sandbox", "the sandbox stopped");
        if (agent_result_error(res, NULL))
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, NULL, "process %s has ended", p->id);
        return 0;
}

/* ---- reading ---- */

static void follow_locked(Proc *p, const ProcCursor *c, bool on) {
        for (size_t i = 0; i < MAX_FOLLOWERS; i++) {
                if (on && !p->followers[i]) {
                        p->followers[i] = c;
                        return;
                }
                if (!on && p->followers[i] == c) {
                        p->followers[i] = NULL;
                        return;
                }
        }
}

int proc_next_event(Proc *p, ProcCursor *c, int timeout_ms, ProcEvent *ret) {
        ProcTable *t = p->t;
        uint64_t end = time_now_mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
        pthread_mutex_lock(&t->lock);
        follow_locked(p, c, true);
        int r;
        for (;;) {
                if (c->ended) {
                        r = -ENODATA;
                        break;
                }
                if (c->at < p->start) {
                        *ret = (ProcEvent){ .kind = PROC_EV_TRUNCATED, .dropped = p->start - c->at,
                                            .resume_at = p->start };
                        c->at = p->start;
                        r = 0;
                        break;
                }
                if (c->at < p->end) {
                        Chunk *k = p->head;
                        while (k && k->off + k->len <= c->at)
                                k = k->next;
                        if (!k) { /* bytes lost to a failed allocation */
                                *ret = (ProcEvent){ .kind = PROC_EV_TRUNCATED, .dropped = p->end - c->at,
                                                    .resume_at = p->end };
                                c->at = p->end;
                                r = 0;
                                break;
                        }
                        if (k->off > c->at) {
                                *ret = (ProcEvent){ .kind = PROC_EV_TRUNCATED, .dropped = k->off - c->at,
                                                    .resume_at = k->off };
                                c->at = k->off;
                                r = 0;
                                break;
                        }
                        size_t from = (size_t)(c->at - k->off);
                        size_t n = k->len - from;
                        size_t cap = c->max_bytes && c->max_bytes < EVENT_MAX ? c->max_bytes : EVENT_MAX;
                        if (n > cap)
                                n = cap;
                        const uint8_t *b = k->data + from;
                        /* A character cut by the end of what arrived so far
                         * waits for its last bytes, unless nothing more can come. */
                        bool more = k->next || !p->ended;
                        size_t whole = n;
                        if (more) {
                                size_t i = n > 3 ? n - 3 : 0;
                                for (; i < n; i++) {
                                        int sl = utf8_seq_len(b + i, n - i);
                                        if (sl < 0) {
                                                whole = i;
                                                break;
                                        }
                                        if (sl > 0)
                                                i += (size_t)sl - 1;
                                }
                        }
                        if (whole == 0 && !k->next && !p->ended) {
                                /* only a partial character so far: wait for more */
                        } else {
                                if (whole == 0)
                                        whole = n;
                                /* Copied out: the caller formats it without the lock. */
                                uint8_t *copy = malloc(whole);
                                if (!copy) {
                                        r = -ENOMEM;
                                        break;
                                }
                                memcpy(copy, b, whole);
                                *ret = (ProcEvent){ .kind = PROC_EV_OUTPUT, .fd = k->fd, .offset = c->at,
                                                    .data = copy, .len = whole, .base64 = p->base64 };
                                c->at += whole;
                                r = 0;
                                break;
                        }
                }
                if (p->ended && c->at >= p->end) {
                        *ret = (ProcEvent){ .kind = PROC_EV_EXIT, .exit = p->exit };
                        c->ended = true;
                        r = 0;
                        break;
                }
                uint64_t now = time_now_mono_ms();
                if (now >= end) {
                        r = -EAGAIN;
                        break;
                }
                struct timespec dl;
                time_mono_deadline(&dl, (int64_t)(end - now));
                pthread_cond_timedwait(&t->cond, &t->lock, &dl);
        }
        if (c->ended)
                follow_locked(p, c, false);
        else
                pthread_cond_broadcast(&t->cond); /* a drain waiting for this reader */
        pthread_mutex_unlock(&t->lock);
        return r;
}

void proc_cursor_done(Proc *p, ProcCursor *c) {
        pthread_mutex_lock(&p->t->lock);
        follow_locked(p, c, false);
        pthread_cond_broadcast(&p->t->cond);
        pthread_mutex_unlock(&p->t->lock);
}
