#include "daemon/manager/otel.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/egress/egress_seal.h"
#include "daemon/manager/audit.h"
#include "daemon/manager/events.h"
#include "daemon/manager/samples.h"
#include "daemon/manager/webhooks.h"

struct Otel {
        const StoreOtelOps *ops;
        StoreOtel *h;
        uint8_t key[SEAL_KEY_LEN];
        struct Webhooks *poster;
        struct Events *events;
        struct Samples *samples;
        int64_t interval_s;
        char host_id[64];
        pthread_mutex_t lock; /* stop */
        pthread_cond_t cond;
        bool stop;
        bool started;
        pthread_t thread;
};

static atomic_uint_fast64_t n_pushes, n_failed, n_dropped;

void otel_counts(uint64_t *pushes, uint64_t *failed, uint64_t *dropped) {
        *pushes = atomic_load(&n_pushes);
        *failed = atomic_load(&n_failed);
        *dropped = atomic_load(&n_dropped);
}

/* ---- input ---- */

/* An HTTP header's name: a token (RFC 9110), and none the push sets itself. */
static bool header_name_ok(const char *s) {
        static const char *const own[] = { "content-type", "content-length", "host", "expect", "transfer-encoding",
                                           "connection" };
        size_t len = strlen(s);
        if (len == 0 || len > 128 || strspn(s, "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                                               "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != len)
                return false;
        for (size_t i = 0; i < ELEMENTSOF(own); i++)
                if (strcasecmp(s, own[i]) == 0)
                        return false;
        return true;
}

/* A header's value: visible characters and spaces, no line break. */
static bool header_value_ok(const char *s) {
        for (const unsigned char *p = (const unsigned char *)s; *p; p++)
                if ((*p < 0x20 && *p != '\t') || *p == 0x7f)
                        return false;
        return true;
}

int otel_check_input(Otel *o, const OtelInput *in, bool create, char *why, size_t n) {
        if (create && !in->endpoint) {
                snprintf(why, n, "endpoint is required: the collector's OTLP/HTTP base URL");
                return -EINVAL;
        }
        if (in->endpoint) {
                if (strlen(in->endpoint) > OTEL_ENDPOINT_MAX) {
                        snprintf(why, n, "endpoint is longer than %d characters", OTEL_ENDPOINT_MAX);
                        return -EINVAL;
                }
                char inner[192];
                if (webhooks_check_url(o->poster, in->endpoint, inner, sizeof inner) < 0) {
                        /* The webhooks' words for a URL, said of an endpoint. */
                        snprintf(why, n, "endpoint: %s", strncmp(inner, "url ", 4) == 0 ? inner + 4 : inner);
                        return -EINVAL;
                }
        }
        if (in->headers) {
                if (!json_is_object(in->headers) || json_object_size(in->headers) > OTEL_HEADERS_MAX) {
                        snprintf(why, n, "headers must be an object of at most %d names and values", OTEL_HEADERS_MAX);
                        return -EINVAL;
                }
                const char *k;
                json_t *v;
                size_t bytes = 0;
                json_object_foreach((json_t *)in->headers, k, v) {
                        const char *s = json_string_value(v);
                        if (!header_name_ok(k) || !s || !header_value_ok(s)) {
                                snprintf(why, n, "headers: %.64s must be a header name with a text value on one line",
                                         k);
                                return -EINVAL;
                        }
                        bytes += strlen(k) + strlen(s) + 4;
                }
                if (bytes > OTEL_HEADER_BYTES_MAX) {
                        snprintf(why, n, "headers are longer than %d bytes together", OTEL_HEADER_BYTES_MAX);
                        return -EINVAL;
                }
        }
        if (in->signals) {
                size_t i;
                json_t *v;
                bool bad = !json_is_array(in->signals) || json_array_size(in->signals) == 0 ||
                           json_array_size(in->signals) > 2;
                if (!bad)
                        json_array_foreach((json_t *)in->signals, i, v) {
                                const char *s = json_string_value(v);
                                if (!s || (strcmp(s, "logs") != 0 && strcmp(s, "metrics") != 0))
                                        bad = true;
                        }
                if (bad) {
                        snprintf(why, n, "signals must name logs, metrics or both");
                        return -EINVAL;
                }
        }
        return 0;
}

static bool takes(const char *signals, const char *signal) {
        _cleanup_json_ json_t *a = json_loads(signals ? signals : "[]", 0, NULL);
        size_t i;
        json_t *v;
        json_array_foreach(a, i, v) if (json_string_value(v) && strcmp(json_string_value(v), signal) == 0) return true;
        return false;
}

/* ---- headers, sealed ---- */

static int seal_headers(Otel *o, const char *id, const json_t *headers, char **ret) {
        *ret = NULL;
        if (!headers || json_object_size(headers) == 0)
                return 0;
        _cleanup_free_ char *text = json_dumps(headers, JSON_COMPACT | JSON_SORT_KEYS);
        if (!text)
                return -ENOMEM;
        char aad[64];
        snprintf(aad, sizeof aad, "otel-headers/%s", id);
        int r = seal_encrypt(o->key, aad, text, ret);
        explicit_bzero(text, strlen(text));
        return r;
}

static json_t *open_headers(Otel *o, const OtelExportRecord *x) {
        if (!x->headers || !*x->headers)
                return json_object();
        char aad[64];
        _cleanup_free_ char *plain = NULL;
        snprintf(aad, sizeof aad, "otel-headers/%s", x->id);
        if (seal_decrypt(o->key, aad, x->headers, &plain) < 0)
                return NULL;
        json_t *j = json_loads(plain, 0, NULL);
        explicit_bzero(plain, strlen(plain));
        return json_is_object(j) ? j : (json_decref(j), NULL);
}

json_t *otel_header_names(Otel *o, const OtelExportRecord *x) {
        json_t *names = json_array();
        _cleanup_json_ json_t *h = open_headers(o, x);
        const char *k;
        json_t *v;
        if (names && h)
                json_object_foreach(h, k, v) json_array_append_new(names, json_string(k));
        return names;
}

/* ---- OTLP's JSON ---- */

static json_t *attr_str(const char *key, const char *value) {
        return json_pack("{s:s,s:{s:s}}", "key", key, "value", "stringValue", value ? value : "");
}

static json_t *nanos(int64_t unix_s) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld000000000", (long long)unix_s);
        return json_string(buf);
}

static json_t *resource(const Otel *o, const char *owner) {
        return json_pack("{s:[o,o,o]}", "attributes", attr_str("service.name", "runtimed"),
                         attr_str("runtime.owner", owner), attr_str("runtime.host.id", o->host_id));
}

typedef struct Batch {
        json_t *items;    /* log records, or readings as metrics' points */
        int64_t last;     /* the cursor after the batch */
        int64_t oldest;   /* records older than this are dropped */
        int64_t dropped;
        size_t n;
} Batch;

static int add_log(void *userdata, const EventRecord *e) {
        Batch *b = userdata;
        b->last = e->seq;
        if (e->at < b->oldest) {
                b->dropped++;
                return 0;
        }
        json_t *attrs = json_pack("[o,o,o,o,o]", attr_str("event.name", e->type), attr_str("runtime.event.id", e->id),
                                  attr_str("runtime.resource.type", e->resource_type),
                                  attr_str("runtime.resource.id", e->resource_id),
                                  attr_str("runtime.host.id", e->host_id));
        if (attrs && e->key_id && *e->key_id)
                json_array_append_new(attrs, attr_str("runtime.key.id", e->key_id));
        if (attrs && e->data)
                json_array_append_new(attrs, attr_str("runtime.event.data", e->data));
        json_t *rec = attrs ? json_pack("{s:o,s:o,s:i,s:s,s:{s:s},s:o}", "timeUnixNano", nanos(e->at),
                                        "observedTimeUnixNano", nanos(e->at), "severityNumber", 9, "severityText",
                                        "INFO", "body", "stringValue", e->type, "attributes", attrs)
                            : NULL;
        if (!rec || json_array_append_new(b->items, rec) < 0)
                return -ENOMEM;
        b->n++;
        return 0;
}

/* The readings of one batch, kept until they are turned into metrics. */
typedef struct Reading {
        char sandbox_id[40];
        SampleRecord r;
} Reading;

typedef struct Readings {
        Reading *list;
        size_t n;
        int64_t oldest;
        int64_t dropped;
} Readings;

static int add_reading(void *userdata, const SampleRecord *s) {
        Readings *rs = userdata;
        if (s->at < rs->oldest) {
                rs->dropped++;
                return 0;
        }
        Reading *x = &rs->list[rs->n++];
        snprintf(x->sandbox_id, sizeof x->sandbox_id, "%s", s->sandbox_id);
        x->r = *s;
        x->r.sandbox_id = x->sandbox_id;
        x->r.owner = NULL;
        return 0;
}

static json_t *int_text(int64_t v) {
        char buf[24];
        snprintf(buf, sizeof buf, "%lld", (long long)v);
        return json_string(buf);
}

/* One metric of every reading: a gauge of `field`, or (delta) a sum over
 * each reading's interval. */
static json_t *metric(const Readings *rs, const char *name, const char *unit, const char *desc, size_t field,
                      bool delta, bool cores) {
        json_t *points = json_array();
        for (size_t i = 0; points && i < rs->n; i++) {
                const SampleRecord *r = &rs->list[i].r;
                if ((delta || cores) && r->interval_ms <= 0)
                        continue; /* a first reading has no interval */
                int64_t v = *(const int64_t *)((const char *)r + field);
                json_t *p = json_pack("{s:o,s:[o]}", "timeUnixNano", nanos(r->at), "attributes",
                                      attr_str("runtime.sandbox.id", r->sandbox_id));
                if (p && cores)
                        json_object_set_new(p, "asDouble", json_real((double)v / ((double)r->interval_ms * 1e6)));
                else if (p)
                        json_object_set_new(p, "asInt", int_text(v));
                if (p && delta) {
                        int64_t start_ms = r->at * 1000 - r->interval_ms;
                        char buf[32];
                        snprintf(buf, sizeof buf, "%lld000000", (long long)start_ms);
                        json_object_set_new(p, "startTimeUnixNano", json_string(buf));
                }
                if (!p || json_array_append_new(points, p) < 0) {
                        json_decref(points);
                        return NULL;
                }
        }
        if (!points)
                return NULL;
        if (delta)
                return json_pack("{s:s,s:s,s:s,s:{s:o,s:i,s:b}}", "name", name, "unit", unit, "description", desc,
                                 "sum", "dataPoints", points, "aggregationTemporality", 1, "isMonotonic", true);
        return json_pack("{s:s,s:s,s:s,s:{s:o}}", "name", name, "unit", unit, "description", desc, "gauge",
                         "dataPoints", points);
}

static json_t *metrics_body(const Otel *o, const char *owner, const Readings *rs) {
        json_t *list = json_pack(
                "[o,o,o,o,o]",
                metric(rs, "runtime.sandbox.cpu.usage", "{cpu}", "CPU in use, in cores, over the reading's interval",
                       offsetof(SampleRecord, cpu_ns), false, true),
                metric(rs, "runtime.sandbox.memory.usage", "By", "Memory the sandbox holds",
                       offsetof(SampleRecord, memory_bytes), false, false),
                metric(rs, "runtime.sandbox.disk.usage", "By", "What the sandbox's writable layer holds",
                       offsetof(SampleRecord, disk_bytes), false, false),
                metric(rs, "runtime.sandbox.network.receive", "By", "Bytes received through the egress proxy",
                       offsetof(SampleRecord, net_in_bytes), true, false),
                metric(rs, "runtime.sandbox.network.transmit", "By", "Bytes sent through the egress proxy",
                       offsetof(SampleRecord, net_out_bytes), true, false));
        return list ? json_pack("{s:[{s:o,s:[{s:{s:s},s:o}]}]}", "resourceMetrics", "resource", resource(o, owner),
                                "scopeMetrics", "scope", "name", "runtime", "metrics", list)
                    : NULL;
}

/* ---- a push ---- */

/* The endpoint's signal path: base + "/v1/logs", one slash between. */
static char *signal_url(const char *endpoint, const char *path) {
        size_t len = strlen(endpoint);
        while (len && endpoint[len - 1] == '/')
                len--;
        char *url = NULL;
        return asprintf(&url, "%.*s%s", (int)len, endpoint, path) < 0 ? NULL : url;
}

typedef struct Progress {
        int64_t events_after, metrics_after, next_at, sent_logs, sent_points, dropped, at;
        int status;
        char error[256];
        bool attempted; /* a POST was made (or could not be): the last push's fields change */
        bool failed;
} Progress;

/* One POST of body to the endpoint's path: whether it was taken (2xx);
 * the status, and the failure, into p. */
static bool sent(Otel *o, const char *endpoint, const char *path, struct curl_slist *hs, json_t *body,
                 Progress *p) {
        _cleanup_free_ char *url = signal_url(endpoint, path);
        _cleanup_free_ char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        WebhookAttempt a = { 0 };
        if (!url || !text)
                snprintf(a.error, sizeof a.error, "out of memory");
        else
                webhooks_post(o->poster, url, hs, text, &a);
        atomic_fetch_add(&n_pushes, 1);
        p->attempted = true;
        p->status = a.status;
        if (a.delivered)
                return true;
        atomic_fetch_add(&n_failed, 1);
        p->failed = true;
        snprintf(p->error, sizeof p->error, "%s: %.200s", path, a.error[0] ? a.error : "not sent");
        return false;
}

static void slist_freep(struct curl_slist **l) {
        curl_slist_free_all(*l);
}

/* Pushes what x has waiting, a batch of each of its signals, into p. */
static void push(Otel *o, const OtelExportRecord *x, Progress *p) {
        int64_t now = time_now_unix();
        *p = (Progress){ .events_after = x->events_after, .metrics_after = x->metrics_after,
                         .next_at = now + o->interval_s, .at = now };
        _cleanup_json_ json_t *headers = open_headers(o, x);
        if (!headers) {
                p->attempted = p->failed = true;
                snprintf(p->error, sizeof p->error, "the export's headers cannot be opened (the secrets key changed?)");
                return;
        }
        __attribute__((cleanup(slist_freep))) struct curl_slist *hs = NULL;
        const char *k;
        json_t *v;
        json_object_foreach(headers, k, v) {
                _cleanup_free_ char *line = NULL;
                if (asprintf(&line, "%s: %s", k, json_string_value(v)) < 0 || !(hs = curl_slist_append(hs, line)))
                        return;
                explicit_bzero(line, strlen(line));
        }
        int64_t oldest = now - OTEL_MAX_AGE_SECONDS, until = now - OTEL_SETTLE_SECONDS;
        bool full = false;
        if (takes(x->signals, "logs") && o->events) {
                Batch b = { .items = json_array(), .last = x->events_after, .oldest = oldest };
                EventFilter f = { .owner = x->owner, .oldest_first = true, .after = x->events_after, .until = until,
                                  .limit = OTEL_BATCH_LOGS };
                int r = b.items ? events_list(o->events, &f, add_log, &b) : -ENOMEM;
                if (r < 0) {
                        p->attempted = p->failed = true;
                        snprintf(p->error, sizeof p->error, "reading the events: %s", strerror(-r));
                } else {
                        full = b.n + (size_t)b.dropped == OTEL_BATCH_LOGS;
                        bool ok = true;
                        if (b.n) {
                                json_t *body = json_pack("{s:[{s:o,s:[{s:{s:s},s:O}]}]}", "resourceLogs", "resource",
                                                         resource(o, x->owner), "scopeLogs", "scope", "name",
                                                         "runtime", "logRecords", b.items);
                                ok = sent(o, x->endpoint, "/v1/logs", hs, body, p);
                                json_decref(body);
                        }
                        /* What was sent, and what was too old to, is behind the cursor. */
                        if (ok) {
                                p->events_after = b.last;
                                p->sent_logs += (int64_t)b.n;
                                p->dropped += b.dropped;
                        }
                }
                json_decref(b.items);
        }
        if (takes(x->signals, "metrics") && o->samples) {
                Readings rs = { .list = calloc(OTEL_BATCH_READINGS, sizeof(Reading)), .oldest = oldest };
                int r = rs.list ? samples_readings(o->samples, x->owner, x->metrics_after, until, OTEL_BATCH_READINGS,
                                                   add_reading, &rs)
                                : -ENOMEM;
                if (r < 0) {
                        p->attempted = p->failed = true;
                        snprintf(p->error, sizeof p->error, "reading the sandbox metrics: %s", strerror(-r));
                } else {
                        size_t got = rs.n + (size_t)rs.dropped;
                        int64_t last = rs.n ? rs.list[rs.n - 1].r.at : x->metrics_after;
                        /* A full batch may end inside a second: that second
                         * is the next push's, whole (unless it is all there is). */
                        if (got == OTEL_BATCH_READINGS && rs.n && rs.list[0].r.at != last) {
                                while (rs.n && rs.list[rs.n - 1].r.at == last)
                                        rs.n--;
                                last = rs.list[rs.n - 1].r.at;
                                full = true;
                        }
                        bool ok = true;
                        if (rs.n) {
                                json_t *body = metrics_body(o, x->owner, &rs);
                                ok = sent(o, x->endpoint, "/v1/metrics", hs, body, p);
                                json_decref(body);
                        }
                        if (ok) {
                                if (rs.n || got)
                                        p->metrics_after = rs.n ? last : until;
                                p->sent_points += (int64_t)rs.n;
                                p->dropped += rs.dropped;
                        }
                }
                free(rs.list);
        }
        atomic_fetch_add(&n_dropped, (uint64_t)p->dropped);
        if (full && !p->failed)
                p->next_at = now; /* more waits: again at once */
}

/* ---- claims ---- */

/* A record's strings copied, so that it outlives the store's callback. */
typedef struct Held {
        OtelExportRecord x;
        char *owner, *endpoint, *headers, *signals, *claimed_by, *last_error;
        bool found;
} Held;

static void held_done(Held *h) {
        free(h->owner);
        free(h->endpoint);
        if (h->headers)
                explicit_bzero(h->headers, strlen(h->headers));
        free(h->headers);
        free(h->signals);
        free(h->claimed_by);
        free(h->last_error);
        *h = (Held){ 0 };
}

static char *dup_opt(const char *s) {
        return s ? strdup(s) : NULL;
}

static int hold(void *userdata, const OtelExportRecord *x) {
        Held *h = userdata;
        held_done(h);
        h->x = *x;
        h->owner = dup_opt(x->owner);
        h->endpoint = dup_opt(x->endpoint);
        h->headers = dup_opt(x->headers);
        h->signals = dup_opt(x->signals);
        h->claimed_by = dup_opt(x->claimed_by);
        h->last_error = dup_opt(x->last_error);
        h->x.owner = h->owner;
        h->x.endpoint = h->endpoint;
        h->x.headers = h->headers;
        h->x.signals = h->signals;
        h->x.claimed_by = h->claimed_by;
        h->x.last_error = h->last_error;
        h->found = true;
        return 0;
}

/* Claims the export held in h for this host until now + OTEL_CLAIM_SECONDS:
 * -EBUSY while another live claim holds it, -ESTALE when another write won. */
static int claim(Otel *o, Held *h, int64_t now) {
        if (h->x.claimed_until >= now && h->x.claimed_by && *h->x.claimed_by)
                return -EBUSY;
        OtelExportRecord c = h->x;
        c.claimed_by = o->host_id;
        c.claimed_until = now + OTEL_CLAIM_SECONDS;
        int r = o->ops->update(o->h, &c);
        if (r == 0)
                h->x.version++;
        return r;
}

/* Writes p onto the export with the claim released; another write since
 * the claim (a client's update) is read again and p written onto it. */
static void finish(Otel *o, Held *h, const Progress *p) {
        for (int tries = 0; tries < 4; tries++) {
                OtelExportRecord c = h->x;
                c.events_after = p->events_after;
                c.metrics_after = p->metrics_after;
                c.next_at = p->next_at;
                c.claimed_by = NULL;
                c.claimed_until = 0;
                /* A round with nothing to send leaves the last push's word. */
                if (p->attempted) {
                        c.last_push_at = p->at;
                        c.last_status = p->status;
                        c.last_error = p->failed ? p->error : NULL;
                }
                c.sent_logs += p->sent_logs;
                c.sent_points += p->sent_points;
                c.dropped += p->dropped;
                int r = o->ops->update(o->h, &c);
                if (r != -ESTALE) {
                        if (r < 0 && r != -ENOENT)
                                log_warn(NULL, "otel export %s: its progress not written: %s", h->x.id, strerror(-r));
                        return;
                }
                Held again = { 0 };
                if (o->ops->get(o->h, h->x.id, NULL, hold, &again) < 0) {
                        held_done(&again);
                        return;
                }
                held_done(h);
                *h = again;
        }
}

/* Claims, pushes and finishes one export held in h. */
static int run_one(Otel *o, Held *h) {
        int64_t now = time_now_unix();
        int r = claim(o, h, now);
        if (r < 0)
                return r;
        Progress p;
        push(o, &h->x, &p);
        if (p.failed)
                log_info(NULL, "otel export %s of %s: %s", h->x.id, h->x.owner, p.error);
        finish(o, h, &p);
        return 0;
}

typedef struct Due {
        char (*ids)[OTEL_EXPORT_ID_LEN + 1];
        size_t n, cap;
        int64_t now;
} Due;

static int note_due(void *userdata, const OtelExportRecord *x) {
        Due *d = userdata;
        if (!x->enabled || x->next_at > d->now || (x->claimed_until >= d->now && x->claimed_by && *x->claimed_by))
                return 0;
        if (d->n == d->cap) {
                size_t cap = d->cap ? d->cap * 2 : 16;
                void *p = reallocarray(d->ids, cap, sizeof(*d->ids));
                if (!p)
                        return -ENOMEM;
                d->ids = p;
                d->cap = cap;
        }
        snprintf(d->ids[d->n++], OTEL_EXPORT_ID_LEN + 1, "%s", x->id);
        return 0;
}

static bool stopping(Otel *o) {
        pthread_mutex_lock(&o->lock);
        bool stop = o->stop;
        pthread_mutex_unlock(&o->lock);
        return stop;
}

static void round_of_pushes(Otel *o) {
        Due d = { .now = time_now_unix() };
        if (o->ops->list(o->h, NULL, note_due, &d) < 0) {
                free(d.ids);
                return;
        }
        for (size_t i = 0; i < d.n && !stopping(o); i++) {
                Held h = { 0 };
                if (o->ops->get(o->h, d.ids[i], NULL, hold, &h) == 0)
                        (void)run_one(o, &h);
                held_done(&h);
        }
        free(d.ids);
}

static void *worker(void *userdata) {
        Otel *o = userdata;
        /* Background work: a call being served comes first. */
        (void)setpriority(PRIO_PROCESS, (id_t)gettid(), AUDIT_WRITER_NICE);
        pthread_mutex_lock(&o->lock);
        while (!o->stop) {
                pthread_mutex_unlock(&o->lock);
                round_of_pushes(o);
                pthread_mutex_lock(&o->lock);
                struct timespec deadline;
                time_mono_deadline(&deadline, 1000);
                while (!o->stop && pthread_cond_timedwait(&o->cond, &o->lock, &deadline) != ETIMEDOUT)
                        ;
        }
        pthread_mutex_unlock(&o->lock);
        return NULL;
}

/* ---- set-up ---- */

int otel_open(const OtelConfig *c, Otel **ret) {
        if (!c->store->otel)
                return -EPROTONOSUPPORT;
        Otel *o = calloc(1, sizeof(*o));
        if (!o)
                return -ENOMEM;
        o->ops = c->store->otel;
        memcpy(o->key, c->seal_key, SEAL_KEY_LEN);
        o->poster = c->poster;
        o->events = c->events;
        o->samples = c->samples;
        o->interval_s = c->interval_seconds ? c->interval_seconds : OTEL_INTERVAL_SECONDS_DEFAULT;
        pthread_mutex_init(&o->lock, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&o->cond, &ca);
        pthread_condattr_destroy(&ca);
        int r = o->ops->open(c->location, &o->h);
        if (r < 0) {
                otel_close(o);
                return r;
        }
        *ret = o;
        return 0;
}

void otel_set_host(Otel *o, const char *host_id) {
        snprintf(o->host_id, sizeof o->host_id, "%s", host_id);
}

int otel_start(Otel *o) {
        int r = -pthread_create(&o->thread, NULL, worker, o);
        o->started = r == 0;
        return r;
}

void otel_stop(Otel *o) {
        if (!o || !o->started)
                return;
        pthread_mutex_lock(&o->lock);
        o->stop = true;
        pthread_cond_broadcast(&o->cond);
        pthread_mutex_unlock(&o->lock);
        pthread_join(o->thread, NULL);
        o->started = false;
}

void otel_close(Otel *o) {
        if (!o)
                return;
        otel_stop(o);
        if (o->h)
                o->ops->close(o->h);
        explicit_bzero(o->key, sizeof o->key);
        pthread_cond_destroy(&o->cond);
        pthread_mutex_destroy(&o->lock);
        free(o);
}

/* ---- what clients drive ---- */

static char *signals_text(const json_t *signals) {
        return signals ? json_dumps(signals, JSON_COMPACT) : strdup("[\"logs\",\"metrics\"]");
}

typedef struct Newest {
        int64_t seq;
} Newest;

static int note_newest(void *userdata, const EventRecord *e) {
        ((Newest *)userdata)->seq = e->seq;
        return 0;
}

int otel_create(Otel *o, const char *owner, const OtelInput *in, StoreOtelFn fn, void *userdata) {
        char hex[21];
        int r = random_hex(hex, 10);
        if (r < 0)
                return r;
        OtelExportRecord x = { .owner = owner, .endpoint = in->endpoint, .enabled = in->enabled != 0 };
        snprintf(x.id, sizeof x.id, "otx_%s", hex);
        _cleanup_free_ char *sealed = NULL, *signals = signals_text(in->signals);
        if (!signals)
                return -ENOMEM;
        if ((r = seal_headers(o, x.id, in->headers, &sealed)) < 0)
                return r;
        x.headers = sealed;
        x.signals = signals;
        /* From now on: the owner's newest event and this second. */
        Newest newest = { 0 };
        EventFilter f = { .owner = owner, .limit = 1 };
        if (o->events && (r = events_list(o->events, &f, note_newest, &newest)) < 0)
                return r;
        x.events_after = newest.seq;
        x.created_at = x.updated_at = x.metrics_after = x.next_at = time_now_unix();
        if ((r = o->ops->put(o->h, &x, OTEL_EXPORTS_MAX_PER_OWNER)) < 0)
                return r;
        return o->ops->get(o->h, x.id, owner, fn, userdata);
}

int otel_get(Otel *o, const char *id, const char *owner, StoreOtelFn fn, void *userdata) {
        return o->ops->get(o->h, id, owner, fn, userdata);
}

int otel_list(Otel *o, const char *owner, StoreOtelFn fn, void *userdata) {
        return o->ops->list(o->h, owner, fn, userdata);
}

int otel_update(Otel *o, const char *id, const char *owner, const OtelInput *in, StoreOtelFn fn, void *userdata) {
        for (int tries = 0; tries < 4; tries++) {
                _cleanup_(held_done) Held h = { 0 };
                int r = o->ops->get(o->h, id, owner, hold, &h);
                if (r < 0)
                        return r;
                OtelExportRecord x = h.x;
                _cleanup_free_ char *sealed = NULL, *signals = in->signals ? signals_text(in->signals) : NULL;
                if (in->endpoint)
                        x.endpoint = in->endpoint;
                if (in->headers) {
                        if ((r = seal_headers(o, x.id, in->headers, &sealed)) < 0)
                                return r;
                        x.headers = sealed;
                }
                if (signals)
                        x.signals = signals;
                if (in->enabled >= 0)
                        x.enabled = in->enabled != 0;
                x.updated_at = time_now_unix();
                r = o->ops->update(o->h, &x);
                if (r == 0)
                        return o->ops->get(o->h, id, owner, fn, userdata);
                if (r != -ESTALE)
                        return r;
        }
        return -EBUSY;
}

int otel_delete(Otel *o, const char *id, const char *owner) {
        return o->ops->remove(o->h, id, owner);
}

int otel_flush(Otel *o, const char *id, const char *owner, StoreOtelFn fn, void *userdata) {
        _cleanup_(held_done) Held h = { 0 };
        int r = o->ops->get(o->h, id, owner, hold, &h);
        if (r < 0)
                return r;
        if ((r = run_one(o, &h)) < 0)
                return r == -ESTALE ? -EBUSY : r;
        return o->ops->get(o->h, id, owner, fn, userdata);
}
