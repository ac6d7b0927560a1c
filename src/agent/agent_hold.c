/*
 * A daemon's restart as the agent lives it (docs/protocol.md, "Detach and
 * attach"). The sandbox's supervisor says DETACH when the daemon goes: every
 * stream but the execs ends without a frame, and each exec's output is held,
 * newest bytes kept within AGENT_HOLD_*, while its process runs on. A new
 * daemon's ATTACH is answered by a HELLO that lists the execs kept; each is
 * silent until the host's first WINDOW on it, then sends what it held first
 * and runs on as before.
 */
#include "agent/agent-internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t size_min(size_t x, size_t y) {
        return x < y ? x : y;
}

static void held_charge(Agent *a, Stream *s, uint64_t bytes, uint64_t cost) {
        s->held_bytes += bytes;
        s->held_cost += cost;
        a->held_total += cost;
}

static void held_uncharge(Agent *a, Stream *s, uint64_t bytes, uint64_t cost) {
        s->held_bytes -= bytes;
        s->held_cost -= cost;
        a->held_total -= cost;
}

/* Frees the head chunk, whatever of it is left. */
static void held_pop(Agent *a, Stream *s) {
        HeldChunk *c = s->held_head;
        size_t left = c->len - c->off;
        s->held_head = c->next;
        if (s->held_tail == c)
                s->held_tail = NULL;
        if (s->held_prev == c)
                s->held_prev = NULL;
        free(c);
        held_uncharge(a, s, left, left + HELD_CHUNK_OVERHEAD);
}

/* Drops the oldest held bytes until the stream's cost is down by `need` (a
 * chunk's overhead comes back with its last byte). A chunk dropped in part
 * keeps only its rest in memory. */
static void held_drop(Agent *a, Stream *s, uint64_t need) {
        while (need > 0 && s->held_head) {
                HeldChunk *c = s->held_head;
                size_t left = c->len - c->off;
                if (left <= need) {
                        held_pop(a, s);
                        s->held_dropped += left;
                        need = need > left + HELD_CHUNK_OVERHEAD ? need - left - HELD_CHUNK_OVERHEAD : 0;
                        continue;
                }
                size_t keep = left - (size_t)need;
                memmove(c->data, c->data + c->off + need, keep);
                c->off = 0;
                c->len = keep;
                bool tail = s->held_tail == c, prev = s->held_prev == c;
                HeldChunk *small = realloc(c, sizeof *c + keep);
                if (small) {
                        s->held_head = small;
                        if (tail)
                                s->held_tail = small;
                        if (prev)
                                s->held_prev = small;
                }
                held_uncharge(a, s, need, need);
                s->held_dropped += need;
                need = 0;
        }
}

/* Everything held is dropped, and `n` more bytes the process wrote after
 * it: what is held stays the newest bytes, contiguous. */
static void held_drop_all(Agent *a, Stream *s, size_t n) {
        while (s->held_head) {
                s->held_dropped += s->held_head->len - s->held_head->off;
                held_pop(a, s);
        }
        s->held_dropped += n;
}

/* Appends bytes of fd to the held queue, after dropping the oldest held
 * bytes as the bounds require. */
static void held_append(Agent *a, Stream *s, uint8_t fd, const uint8_t *p, size_t n) {
        uint64_t others = a->held_total - s->held_cost;
        uint64_t cap = AGENT_HOLD_TOTAL_BYTES > others ? AGENT_HOLD_TOTAL_BYTES - others : 0;
        if (cap > AGENT_HOLD_STREAM_BYTES)
                cap = AGENT_HOLD_STREAM_BYTES;
        /* The most they can cost: a new chunk per HELD_CHUNK_BYTES, and one more. */
        uint64_t cost = n + HELD_CHUNK_OVERHEAD * (n / HELD_CHUNK_BYTES + 1);
        if (cost > cap) {
                /* They alone pass the bound: only their newest part stays. */
                uint64_t overhead = HELD_CHUNK_OVERHEAD * (cap / HELD_CHUNK_BYTES + 1);
                size_t keep = cap > overhead ? (size_t)(cap - overhead) : 0;
                held_drop_all(a, s, n - keep);
                p += n - keep;
                n = keep;
        } else if (s->held_cost + cost > cap)
                held_drop(a, s, s->held_cost + cost - cap);
        while (n > 0) {
                HeldChunk *t = s->held_tail;
                if (t && t->fd == fd && t->len < HELD_CHUNK_BYTES) {
                        /* Small reads of one fd grow one chunk: a line every
                         * few ms costs its bytes, not a chunk each. */
                        size_t m = size_min(n, HELD_CHUNK_BYTES - t->len);
                        bool head = s->held_head == t;
                        HeldChunk *g = realloc(t, sizeof *t + t->len + m);
                        if (!g)
                                break;
                        if (head)
                                s->held_head = g;
                        else
                                s->held_prev->next = g;
                        s->held_tail = g;
                        memcpy(g->data + g->len, p, m);
                        g->len += m;
                        held_charge(a, s, m, m);
                        p += m;
                        n -= m;
                        continue;
                }
                size_t m = size_min(n, HELD_CHUNK_BYTES);
                HeldChunk *c = malloc(sizeof *c + m);
                if (!c)
                        break;
                *c = (HeldChunk){ .fd = fd, .len = m };
                memcpy(c->data, p, m);
                if (t)
                        t->next = c;
                else
                        s->held_head = c;
                s->held_prev = t;
                s->held_tail = c;
                held_charge(a, s, m, m + HELD_CHUNK_OVERHEAD);
                p += m;
                n -= m;
        }
        /* Out of memory: the agent goes on without them, and without what
         * came before them, so that what it holds has no hole. */
        if (n > 0)
                held_drop_all(a, s, n);
}

ssize_t agent_hold_read(Agent *a, Stream *s, int which) {
        static uint8_t buf[BIG_CHUNK];
        ssize_t n = read(s->fds[which], buf, sizeof buf);
        if (n > 0)
                held_append(a, s, (uint8_t)which, buf, (size_t)n);
        return n;
}

void agent_hold_release(Agent *a, Stream *s) {
        while (s->held_head)
                held_pop(a, s);
        s->held_eof = 0;
        s->hold = HOLD_NONE;
}

/* All held bytes are out: the EOFs that waited for them follow, and the
 * stream is back to normal. */
static void held_done(Agent *a, Stream *s) {
        for (int i = PIPE_OUT; i <= PIPE_ERR; i++)
                if (s->held_eof & (1u << i))
                        agent_send_frame(a, PROTO_EOF, (uint8_t)i, s->id, NULL, 0);
        agent_hold_release(a, s);
}

void agent_hold_pump(Agent *a, Stream *s) {
        while (s->held_head && s->credit > 0 && a->out_bytes < AGENT_OUT_SOFT_LIMIT &&
               s->queued_out < AGENT_STREAM_QUEUE_LIMIT && !a->quit) {
                /* One frame: the oldest chunks of one fd, within the credit. */
                uint8_t fd = s->held_head->fd;
                size_t want = s->credit < BIG_CHUNK ? (size_t)s->credit : BIG_CHUNK, n = 0;
                for (HeldChunk *c = s->held_head; c && c->fd == fd && n < want; c = c->next)
                        n += size_min(c->len - c->off, want - n);
                OutFrame *f = calloc(1, sizeof(OutFrame));
                uint8_t *buf = malloc(PROTO_HEADER_SIZE + n);
                if (!f || !buf) {
                        free(f);
                        free(buf);
                        agent_fatal(a, "cannot queue a frame");
                        return;
                }
                ProtoHeader h = { .length = (uint32_t)n, .stream = s->id, .type = PROTO_DATA, .flags = fd };
                (void)proto_header_encode(&h, buf);
                for (size_t k = 0; k < n;) {
                        HeldChunk *c = s->held_head;
                        size_t m = size_min(c->len - c->off, n - k);
                        memcpy(buf + PROTO_HEADER_SIZE + k, c->data + c->off, m);
                        c->off += m;
                        k += m;
                        held_uncharge(a, s, m, m);
                        if (c->off == c->len)
                                held_pop(a, s);
                }
                f->buf = buf;
                f->len = PROTO_HEADER_SIZE + n;
                agent_queue_frame(a, f, PROTO_DATA, s->id);
                s->credit -= n;
                s->out_sent += n;
        }
        if (!s->held_head && s->hold == HOLD_REPLAY)
                held_done(a, s);
}

void agent_hold_window(Agent *a, Stream *s) {
        if (s->hold != HOLD_LISTED)
                return;
        s->hold = HOLD_REPLAY;
        if (!s->held_head)
                held_done(a, s);
}

void agent_detach(Agent *a) {
        a->detached = true;
        for (size_t i = 0; i < a->n_streams; i++) {
                Stream *s = a->streams[i];
                if (s->finished || s->orphan)
                        continue;
                if (s->kind == STREAM_EXEC) {
                        s->hold = HOLD_DETACHED;
                        continue;
                }
                /* Nobody is left to answer: a file read closes, a write is
                 * dropped (its temporary file removed), a relayed or
                 * forwarded connection closes and the program sees it end.
                 * No frame: the supervisor would only discard it. */
                s->finished = true;
        }
}

static int by_id(const void *x, const void *y) {
        const Stream *s = *(Stream *const *)x, *t = *(Stream *const *)y;
        return s->id < t->id ? -1 : s->id > t->id;
}

json_t *agent_attach(Agent *a) {
        agent_detach(a);
        a->detached = false;
        Stream *kept[AGENT_MAX_STREAMS];
        size_t n = 0;
        for (size_t i = 0; i < a->n_streams; i++) {
                Stream *s = a->streams[i];
                if (!s->finished && s->hold == HOLD_DETACHED)
                        kept[n++] = s;
        }
        qsort(kept, n, sizeof kept[0], by_id);
        json_t *list = json_array();
        for (size_t i = 0; i < n && list; i++) {
                Stream *s = kept[i];
                s->hold = HOLD_LISTED;
                s->credit = 0;
                /* The new host starts with a whole window for stdin: what
                 * the last one sent that the child has not taken yet is
                 * still written, and never credited to this one. */
                uint64_t queued = 0;
                for (Chunk *c = s->in_head; c; c = c->next)
                        queued += c->len - c->off;
                s->in_stale = queued;
                s->in_held = s->in_ack = 0;
                bool stdin_open = s->fds[PIPE_IN] >= 0 && !s->in_eof;
                json_t *e = json_pack("{s:I,s:I,s:O?,s:I,s:I,s:I,s:b,s:I,s:b}", "stream",
                                      (json_int_t)s->id, "pid", (json_int_t)(s->pid > 0 ? s->pid : 0), "tag",
                                      s->tag, "sent", (json_int_t)s->out_sent, "dropped",
                                      (json_int_t)s->held_dropped, "held", (json_int_t)s->held_bytes, "exited",
                                      s->exited, "stdin", (json_int_t)s->in_total, "stdinOpen", stdin_open);
                if (!e || json_array_append_new(list, e) < 0) {
                        json_decref(list);
                        list = NULL;
                }
        }
        return list;
}
