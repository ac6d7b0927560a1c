#include "daemon/manager/watches.h"

#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/channel.h"
#include "proto/proto.h"

/* How long the agent has to say it watches (or why not). */
#define WATCH_START_MS 30000
/* The drain thread looks at the timeout and the stop this often. */
#define WATCH_POLL_MS 500
/* How long a cancelled watch's agent has to answer. */
#define WATCH_CANCEL_MS 5000
/* A line from the agent longer than this is malformed: the agent bounds
 * its own (agent/watch.h), and it runs inside the sandbox. */
#define WATCH_MAX_AGENT_LINE (64u * 1024u)
/* A path in a change, after the agent's escaping is undone. */
#define WATCH_MAX_PATH 8192u

struct Watch {
        WatchTable *t;
        Watch *next; /* in the table */
        unsigned refs;
        char id[WATCH_ID_MAX + 1];
        char sandbox_id[64];
        char owner[64];
        char *path;
        size_t path_len;
        bool recursive;
        unsigned kinds;
        json_t *include, *exclude;
        int64_t created_at;
        int64_t timeout_ms, batch_ms;
        Sandbox *sb;
        ChanStream *stream;
        pthread_t thread;
        bool thread_started;
        /* Under lock: */
        pthread_mutex_t lock;
        pthread_cond_t cond;
        json_t **ring; /* WATCHES_MAX_QUEUED entries, the oldest at first % cap */
        uint64_t first, end; /* cursors of the oldest kept entry and of the next */
        bool ended, stopping;
        int64_t ended_at; /* monotonic ms */
        char reason[32];
        char *partial; /* an agent line not yet whole */
        size_t partial_len;
};

struct WatchTable {
        pthread_mutex_t lock;
        Watch *head;
};

unsigned watch_kind_bit(const char *name) {
        static const char *const names[] = { "create", "write", "remove", "rename", "chmod" };
        for (unsigned i = 0; name && i < ELEMENTSOF(names); i++)
                if (strcmp(name, names[i]) == 0)
                        return 1u << i;
        return 0;
}

void watch_spec_done(WatchSpec *s) {
        free(s->path);
        json_decref(s->include);
        json_decref(s->exclude);
        *s = (WatchSpec){ 0 };
}

bool watch_id_ok(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > WATCH_ID_MAX)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
                if (!alnum && (i == 0 || (c != '_' && c != '.' && c != '-')))
                        return false;
        }
        return true;
}

WatchTable *watch_table_new(void) {
        WatchTable *t = calloc(1, sizeof(*t));
        if (t)
                pthread_mutex_init(&t->lock, NULL);
        return t;
}

static void watch_free(Watch *w) {
        if (w->thread_started)
                pthread_join(w->thread, NULL);
        chan_stream_free(w->stream);
        if (w->sb)
                sandbox_release(w->sb);
        if (w->ring) {
                for (uint64_t c = w->first; c < w->end; c++)
                        json_decref(w->ring[c % WATCHES_MAX_QUEUED]);
                free(w->ring);
        }
        free(w->partial);
        free(w->path);
        json_decref(w->include);
        json_decref(w->exclude);
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
        free(w);
}

int64_t watch_batch_ms(const Watch *w) {
        return w->batch_ms;
}

void watch_unref(Watch *w) {
        if (!w)
                return;
        WatchTable *t = w->t;
        pthread_mutex_lock(&t->lock);
        bool last = --w->refs == 0;
        pthread_mutex_unlock(&t->lock);
        if (last)
                watch_free(w);
}

/* Asks the drain to end; it cancels the agent's stream. */
static void watch_end_request(Watch *w) {
        pthread_mutex_lock(&w->lock);
        w->stopping = true;
        pthread_mutex_unlock(&w->lock);
}

void watch_table_free(WatchTable *t) {
        if (!t)
                return;
        pthread_mutex_lock(&t->lock);
        Watch *list = TAKE_PTR(t->head);
        pthread_mutex_unlock(&t->lock);
        while (list) {
                Watch *w = list;
                list = w->next;
                watch_end_request(w);
                watch_unref(w);
        }
        pthread_mutex_destroy(&t->lock);
        free(t);
}

/* An entry at the queue's end; the oldest goes when it is full, and a
 * reader behind it learns how many it lost. Under w->lock. */
static void push_locked(Watch *w, json_t *entry) {
        if (!entry)
                return;
        if (w->end - w->first >= WATCHES_MAX_QUEUED) {
                json_decref(w->ring[w->first % WATCHES_MAX_QUEUED]);
                w->first++;
        }
        w->ring[w->end % WATCHES_MAX_QUEUED] = entry;
        w->end++;
        pthread_cond_broadcast(&w->cond);
}

/* The path relative to the watch's root ("" for the root itself). */
static const char *relative(const Watch *w, const char *path) {
        if (strncmp(path, w->path, w->path_len) != 0)
                return path;
        const char *rel = path + w->path_len;
        while (*rel == '/')
                rel++;
        return rel;
}

/* A glob matches a path when it matches the whole relative path, its last
 * name, or (for exclude) any one of its names: "node_modules" leaves out
 * everything below such a directory. */
static bool glob_hits(json_t *globs, const char *rel, bool any_component) {
        size_t i;
        json_t *g;
        const char *base = strrchr(rel, '/');
        base = base ? base + 1 : rel;
        json_array_foreach(globs, i, g) {
                const char *p = json_string_value(g);
                if (fnmatch(p, rel, 0) == 0 || fnmatch(p, base, 0) == 0)
                        return true;
                if (!any_component)
                        continue;
                char part[256];
                for (const char *s = rel; *s;) {
                        size_t n = strcspn(s, "/");
                        if (n < sizeof part) {
                                memcpy(part, s, n);
                                part[n] = '\0';
                                if (fnmatch(p, part, 0) == 0)
                                        return true;
                        }
                        s += n;
                        while (*s == '/')
                                s++;
                }
        }
        return false;
}

/* One line of the agent's, checked (the agent runs inside the sandbox):
 * a change becomes an event if the filters keep it, a notice a notice. */
static json_t *entry_of_line(Watch *w, const char *line, size_t len) {
        _cleanup_json_ json_t *j = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
        const char *e = json_string_value(json_object_get(j, "e"));
        if (!e)
                return NULL;
        if (strcmp(e, "overflow") == 0) {
                /* The agent's walk of a new directory had more entries
                 * than it holds, or the kernel's queue overflowed. */
                const char *src = json_string_value(json_object_get(j, "source"));
                return json_pack("{s:s,s:s}", "k", "overflow", "source",
                                 src && strcmp(src, "scan") == 0 ? "scan" : "kernel");
        }
        if (strcmp(e, "limit") == 0) {
                json_t *n = json_object_get(j, "watches");
                return json_pack("{s:s,s:I}", "k", "limit", "watches",
                                 json_is_integer(n) ? json_integer_value(n) : (json_int_t)0);
        }
        unsigned bit = watch_kind_bit(e);
        json_t *p = json_object_get(j, "p");
        const char *path = json_string_value(p);
        if (!bit || !path || json_string_length(p) > WATCH_MAX_PATH || path[0] != '/' ||
            strlen(path) != json_string_length(p))
                return NULL;
        if (!(w->kinds & bit))
                return NULL;
        const char *rel = relative(w, path);
        if (w->exclude && *rel && glob_hits(w->exclude, rel, true))
                return NULL;
        if (w->include && json_array_size(w->include) && !glob_hits(w->include, rel, false))
                return NULL;
        const char *name = strrchr(path, '/');
        return json_pack("{s:s,s:s,s:s,s:b,s:I}", "type", e, "path", path, "name", name ? name + 1 : path, "isDir",
                         json_is_true(json_object_get(j, "d")), "timeMs", (json_int_t)(time_now_unix_ms()));
}

/* Takes a DATA frame of lines; false when the agent sent something malformed. */
static bool take_data(Watch *w, const uint8_t *data, size_t len) {
        if (w->partial_len + len > WATCH_MAX_AGENT_LINE + PROTO_MAX_PAYLOAD)
                return false;
        char *buf = realloc(w->partial, w->partial_len + len);
        if (!buf)
                return false;
        memcpy(buf + w->partial_len, data, len);
        w->partial = buf;
        w->partial_len += len;
        size_t off = 0;
        for (;;) {
                char *nl = memchr(buf + off, '\n', w->partial_len - off);
                if (!nl)
                        break;
                size_t n = (size_t)(nl - (buf + off));
                json_t *entry = n <= WATCH_MAX_AGENT_LINE ? entry_of_line(w, buf + off, n) : NULL;
                if (entry) {
                        pthread_mutex_lock(&w->lock);
                        push_locked(w, entry);
                        pthread_mutex_unlock(&w->lock);
                }
                off += n + 1;
        }
        memmove(buf, buf + off, w->partial_len - off);
        w->partial_len -= off;
        return w->partial_len <= WATCH_MAX_AGENT_LINE;
}

static void finish(Watch *w, const char *reason) {
        pthread_mutex_lock(&w->lock);
        if (!w->ended) {
                w->ended = true;
                w->ended_at = (int64_t)time_now_mono_ms();
                snprintf(w->reason, sizeof w->reason, "%s", w->stopping ? "stopped" : reason);
                push_locked(w, json_pack("{s:s,s:s}", "k", "end", "reason", w->reason));
        }
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
}

/* The reasons an agent's RESULT may give; anything else is "failed". */
static const char *result_reason(json_t *result) {
        static const char *const known[] = { "stopped", "root-removed", "root-moved" };
        const char *r = json_string_value(json_object_get(result, "reason"));
        for (size_t i = 0; r && i < ELEMENTSOF(known); i++)
                if (strcmp(r, known[i]) == 0)
                        return known[i];
        return "failed";
}

static void *drain(void *userdata) {
        Watch *w = userdata;
        uint64_t deadline = w->timeout_ms > 0 ? time_now_mono_ms() + (uint64_t)w->timeout_ms : 0;
        bool cancelled = false;
        uint64_t give_up = 0;
        const char *why = NULL;
        for (;;) {
                /* An agent that does not answer a cancel is not waited for. */
                if (cancelled && time_now_mono_ms() >= give_up) {
                        finish(w, why);
                        break;
                }
                pthread_mutex_lock(&w->lock);
                bool stop = w->stopping;
                pthread_mutex_unlock(&w->lock);
                if (!cancelled && (stop || (deadline && time_now_mono_ms() >= deadline))) {
                        why = stop ? "stopped" : "timeout";
                        chan_stream_cancel(w->stream);
                        cancelled = true;
                        give_up = time_now_mono_ms() + WATCH_CANCEL_MS;
                }
                ChanEvent ev;
                int r = chan_stream_next(w->stream, WATCH_POLL_MS, &ev);
                if (r == -ETIMEDOUT)
                        continue;
                if (r < 0) {
                        finish(w, why ? why : "failed");
                        break;
                }
                bool done = false;
                switch (ev.type) {
                case CHAN_EV_DATA:
                        if (!take_data(w, ev.data, ev.len)) {
                                chan_stream_cancel(w->stream);
                                cancelled = true;
                                give_up = time_now_mono_ms() + WATCH_CANCEL_MS;
                                why = "failed";
                        }
                        break;
                case CHAN_EV_RESULT:
                        finish(w, why ? why : result_reason(ev.json));
                        done = true;
                        break;
                case CHAN_EV_CLOSED:
                        finish(w, why ? why : "sandbox-stopped");
                        done = true;
                        break;
                default:
                        break;
                }
                chan_event_clear(&ev);
                if (done)
                        break;
        }
        /* Its readers need only the queue from now on: the sandbox is let go. */
        chan_stream_free(TAKE_PTR(w->stream));
        sandbox_release(TAKE_PTR(w->sb));
        return NULL;
}

/* Takes the watches that ended WATCHES_KEEP_ENDED_MS ago or more out of
 * the table (a deleted sandbox's among them) into *gone, for the caller to
 * unref once the table's lock is released. Under t->lock. */
static void prune_locked(WatchTable *t, Watch **gone) {
        int64_t now = (int64_t)time_now_mono_ms();
        for (Watch **p = &t->head; *p;) {
                Watch *w = *p;
                pthread_mutex_lock(&w->lock);
                bool old = w->ended && w->ended_at && now - w->ended_at >= WATCHES_KEEP_ENDED_MS;
                pthread_mutex_unlock(&w->lock);
                if (old) {
                        *p = w->next;
                        w->next = *gone;
                        *gone = w;
                } else
                        p = &w->next;
        }
}

static void unref_all(Watch *list) {
        while (list) {
                Watch *w = list;
                list = w->next;
                watch_unref(w);
        }
}

/* Counts the sandbox's watches and looks for the id. Under t->lock. */
static unsigned count_locked(WatchTable *t, const char *sandbox_id, const char *id, bool *ret_taken) {
        unsigned n = 0;
        *ret_taken = false;
        for (Watch *w = t->head; w; w = w->next)
                if (strcmp(w->sandbox_id, sandbox_id) == 0) {
                        n++;
                        if (id[0] && strcmp(w->id, id) == 0)
                                *ret_taken = true;
                }
        return n;
}

int watch_start(WatchTable *t, Sandbox *sb, json_t *areq, const WatchSpec *spec, Watch **ret, json_t **ret_result,
                SandboxError *e) {
        *ret_result = NULL;
        Watch *w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        pthread_mutex_init(&w->lock, NULL);
        pthread_cond_init(&w->cond, NULL);
        w->t = t;
        w->refs = 1;
        snprintf(w->sandbox_id, sizeof w->sandbox_id, "%s", sandbox_id(sb));
        snprintf(w->owner, sizeof w->owner, "%s", sandbox_owner(sb));
        w->path = strdup(spec->path);
        w->path_len = w->path ? strlen(w->path) : 0;
        while (w->path_len > 1 && w->path[w->path_len - 1] == '/')
                w->path[--w->path_len] = '\0';
        w->recursive = spec->recursive;
        w->kinds = spec->kinds ? spec->kinds : WATCH_KIND_ALL;
        w->include = json_incref(spec->include);
        w->exclude = json_incref(spec->exclude);
        w->timeout_ms = spec->timeout_ms;
        w->batch_ms = spec->batch_ms;
        w->created_at = time_now_unix();
        w->ring = calloc(WATCHES_MAX_QUEUED, sizeof(json_t *));
        if (spec->id[0])
                snprintf(w->id, sizeof w->id, "%s", spec->id);
        else {
                memcpy(w->id, "w_", 2);
                if (random_hex(w->id + 2, 8) < 0) {
                        watch_free(w);
                        return -EIO;
                }
        }
        if (!w->path || !w->ring) {
                watch_free(w);
                return -ENOMEM;
        }
        /* Claim the place first, so that two starts cannot both pass the bound. */
        Watch *gone = NULL;
        pthread_mutex_lock(&t->lock);
        prune_locked(t, &gone);
        bool taken;
        unsigned n = count_locked(t, w->sandbox_id, w->id, &taken);
        if (taken || n >= WATCHES_MAX_PER_SANDBOX) {
                pthread_mutex_unlock(&t->lock);
                unref_all(gone);
                watch_free(w);
                return taken ? -EEXIST : -EUSERS;
        }
        w->ended = true; /* not listed as running until the agent says so */
        snprintf(w->reason, sizeof w->reason, "starting");
        w->next = t->head;
        t->head = w;
        w->refs++;
        pthread_mutex_unlock(&t->lock);
        unref_all(gone);

        int r = sandbox_open_stream(sb, areq, &w->stream, e);
        ChanEvent ev = { 0 };
        if (r == 0) {
                r = chan_stream_next(w->stream, WATCH_START_MS, &ev);
                if (r == -ETIMEDOUT)
                        sandbox_error(e, SANDBOX_ERR_UNAVAILABLE, "try again", "the sandbox did not answer in time");
                else if (r < 0 || ev.type == CHAN_EV_CLOSED) {
                        r = -EPIPE;
                        sandbox_error(e, SANDBOX_ERR_CONFLICT, NULL, "the sandbox stopped");
                } else if (ev.type == CHAN_EV_RESULT) {
                        *ret_result = TAKE_PTR(ev.json);
                        r = -EPROTO;
                } else if (ev.type != CHAN_EV_EVENT) {
                        r = -EPROTO;
                        sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "the agent answered a watch out of turn");
                }
                chan_event_clear(&ev);
        }
        if (r == 0) {
                pthread_mutex_lock(&w->lock);
                w->ended = false;
                w->reason[0] = '\0';
                pthread_mutex_unlock(&w->lock);
                w->sb = sb;
                int k = pthread_create(&w->thread, NULL, drain, w);
                if (k == 0)
                        w->thread_started = true;
                else {
                        w->sb = NULL;
                        r = -k;
                        sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not start the watch");
                }
        }
        if (r < 0) {
                watch_stop(t, w);
                watch_unref(w);
                return r;
        }
        *ret = w;
        return 0;
}

Watch *watch_find(WatchTable *t, const char *owner, const char *sandbox_id, const char *id) {
        pthread_mutex_lock(&t->lock);
        Watch *w;
        for (w = t->head; w; w = w->next)
                if (strcmp(w->id, id) == 0 && strcmp(w->sandbox_id, sandbox_id) == 0 && strcmp(w->owner, owner) == 0)
                        break;
        if (w)
                w->refs++;
        pthread_mutex_unlock(&t->lock);
        return w;
}

void watch_stop(WatchTable *t, Watch *w) {
        watch_end_request(w);
        pthread_mutex_lock(&t->lock);
        bool listed = false;
        for (Watch **p = &t->head; *p; p = &(*p)->next)
                if (*p == w) {
                        *p = w->next;
                        listed = true;
                        break;
                }
        pthread_mutex_unlock(&t->lock);
        if (listed)
                watch_unref(w);
}

json_t *watch_json(Watch *w) {
        pthread_mutex_lock(&w->lock);
        char created[RFC3339_LEN];
        if (time_format_rfc3339(w->created_at, created) < 0)
                created[0] = '\0';
        json_t *j = json_pack("{s:s,s:s,s:s,s:b,s:I,s:b,s:s?,s:s,s:I}", "id", w->id, "sandboxId", w->sandbox_id,
                              "path", w->path, "recursive", w->recursive, "cursor", (json_int_t)w->end, "running",
                              !w->ended, "endReason", w->ended ? w->reason : NULL, "createdAt", created,
                              "timeoutMs", (json_int_t)w->timeout_ms);
        pthread_mutex_unlock(&w->lock);
        return j;
}

json_t *watch_list(WatchTable *t, const char *owner, const char *sandbox_id) {
        json_t *out = json_array();
        Watch *gone = NULL;
        pthread_mutex_lock(&t->lock);
        prune_locked(t, &gone);
        for (Watch *w = t->head; w && out; w = w->next)
                if (strcmp(w->sandbox_id, sandbox_id) == 0 && strcmp(w->owner, owner) == 0)
                        json_array_append_new(out, watch_json(w));
        pthread_mutex_unlock(&t->lock);
        unref_all(gone);
        return out;
}

int watch_read(Watch *w, uint64_t cursor, int wait_ms, WatchRead *ret) {
        *ret = (WatchRead){ .events = json_array(), .notices = json_array() };
        if (!ret->events || !ret->notices) {
                watch_read_done(ret);
                return -ENOMEM;
        }
        pthread_mutex_lock(&w->lock);
        if (cursor > w->end)
                cursor = w->end;
        if (wait_ms > 0 && cursor >= w->end && !w->ended) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += wait_ms / 1000;
                ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                while (cursor >= w->end && !w->ended)
                        if (pthread_cond_timedwait(&w->cond, &w->lock, &ts) == ETIMEDOUT)
                                break;
        }
        if (cursor < w->first) {
                json_array_append_new(ret->notices, json_pack("{s:s,s:s,s:I}", "k", "overflow", "source", "queue",
                                                              "lost", (json_int_t)(w->first - cursor)));
                cursor = w->first;
        }
        unsigned taken = 0;
        for (; cursor < w->end && taken < WATCHES_MAX_READ; cursor++, taken++) {
                json_t *entry = w->ring[cursor % WATCHES_MAX_QUEUED];
                json_t *k = json_object_get(entry, "k");
                json_array_append(k ? ret->notices : ret->events, entry);
        }
        ret->next = cursor;
        ret->ended = w->ended && cursor >= w->end;
        snprintf(ret->reason, sizeof ret->reason, "%s", w->reason);
        pthread_mutex_unlock(&w->lock);
        return 0;
}

void watch_read_done(WatchRead *r) {
        json_decref(r->events);
        json_decref(r->notices);
        r->events = r->notices = NULL;
}
