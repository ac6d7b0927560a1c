#include "daemon/manager/webhooks.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/egress/egress_seal.h"
#include "egress/addr.h"

/* How long a host holds a delivery it claimed: past an attempt's timeout,
 * so that no other host sends it meanwhile; a host that died holds it no
 * longer than this. */
#define CLAIM_SECONDS 60
/* How often an idle worker looks for deliveries that fell due (a retry's
 * time, another host's queue); one queued here wakes it at once. */
#define IDLE_POLL_MS 1000
#define CONNECT_TIMEOUT_SECONDS 5
/* Deliveries a worker claims at once: fewer writes of the store while many
 * are due, and within the claim's time however slow each attempt is
 * (CLAIM_BATCH attempts of WEBHOOK_TIMEOUT_SECONDS < CLAIM_SECONDS). */
#define CLAIM_BATCH 4

struct Webhooks {
        const StoreWebhookOps *ops;
        StoreWebhooks *h;
        uint8_t key[SEAL_KEY_LEN];
        EgressCidr allow[WEBHOOK_MAX_ALLOW_CIDRS];
        unsigned n_allow;
        unsigned retry_seconds, workers, per_owner;
        char host_id[64];
        pthread_mutex_t lock;
        pthread_cond_t cond;
        bool stop;
        unsigned kicks; /* deliveries queued here since a worker last looked */
        /* One claim at a time on this host, so that an owner's count of
         * workers is exact when the next claim skips it. */
        pthread_mutex_t claim_lock;
        /* The owners whose batches workers hold, under lock: one slot per
         * worker at most. */
        struct {
                char *owner;
                unsigned n;
        } holding[WEBHOOK_WORKERS_MAX];
        pthread_t threads[WEBHOOK_WORKERS_MAX];
        unsigned started;
};

static atomic_uint_fast64_t n_delivered, n_failed_attempts, n_given_up;

void webhooks_counts(uint64_t *delivered, uint64_t *failed_attempts, uint64_t *given_up) {
        *delivered = atomic_load(&n_delivered);
        *failed_attempts = atomic_load(&n_failed_attempts);
        *given_up = atomic_load(&n_given_up);
}

/* The types a webhook may name: every event type there is (docs/api.md,
 * "Events"), and the test's. A name ending in '.' is a group. */
static const char *const TYPES[] = {
        "sandbox.created", "sandbox.started", "sandbox.paused", "sandbox.woken",   "sandbox.restarted",
        "sandbox.extended", "sandbox.stopped", "sandbox.failed", "sandbox.lost",   "sandbox.deleted",
        "sandbox.forked",  "sandbox.oom_killed", "process.exited", "egress.refused", "key.spending_limit_reached",
        "snapshot.created", "host.dead",      "webhook.test",   "sandbox.",        "snapshot.",
        "host.",           "process.",       "egress.",        "key.",
};

static bool type_known(const char *t) {
        for (size_t i = 0; i < ELEMENTSOF(TYPES); i++)
                if (strcmp(TYPES[i], t) == 0)
                        return true;
        return false;
}

int webhooks_check_events(const char *types, char *why, size_t n) {
        _cleanup_json_ json_t *a = json_loads(types, 0, NULL);
        if (!json_is_array(a) || json_array_size(a) > WEBHOOK_EVENT_TYPES_MAX) {
                snprintf(why, n, "events must be an array of at most %d event types", WEBHOOK_EVENT_TYPES_MAX);
                return -EINVAL;
        }
        size_t i;
        json_t *v;
        json_array_foreach(a, i, v) {
                const char *t = json_string_value(v);
                if (!t || !type_known(t)) {
                        snprintf(why, n, "events: %s%.64s%s is not an event type (docs/api.md lists them; "
                                         "a group such as \"sandbox.\" takes all of its kind)",
                                 t ? "\"" : "", t ? t : "a non-string", t ? "\"" : "");
                        return -EINVAL;
                }
        }
        return 0;
}

/* Whether a webhook whose events are `types` takes an event of `type`. */
static bool takes(const char *types, const char *type) {
        _cleanup_json_ json_t *a = json_loads(types ? types : "[]", 0, NULL);
        if (!json_is_array(a))
                return false;
        if (json_array_size(a) == 0)
                return strcmp(type, "webhook.test") != 0;
        size_t i;
        json_t *v;
        json_array_foreach(a, i, v) {
                const char *t = json_string_value(v);
                size_t l = t ? strlen(t) : 0;
                if (l && (strcmp(t, type) == 0 || (t[l - 1] == '.' && strncmp(t, type, l) == 0)))
                        return true;
        }
        return false;
}

/* ---- addresses ---- */

/* Whether a receiver at sa may be reached: a public address, or one in a
 * range the operator allowed; link-local, multicast and unspecified never. */
static bool address_allowed(const Webhooks *w, const struct sockaddr *sa, char *why, size_t n) {
        EgressAddrClass c = egress_addr_classify(sa);
        if (c == EGRESS_ADDR_PUBLIC)
                return true;
        bool never = c == EGRESS_ADDR_LINK_LOCAL || c == EGRESS_ADDR_MULTICAST || c == EGRESS_ADDR_UNSPECIFIED;
        if (!never)
                for (unsigned i = 0; i < w->n_allow; i++)
                        if (egress_cidr_contains(&w->allow[i], sa))
                                return true;
        char text[64] = "?";
        (void)egress_addr_format(sa, text, sizeof text);
        snprintf(why, n, "the receiver's address %s is %s%s", text, egress_addr_class_name(c),
                 never ? "" : " (runtimed --webhook-allow-cidr allows a range)");
        return false;
}

int webhooks_check_url(const Webhooks *w, const char *url, char *why, size_t n) {
        size_t len = strlen(url);
        if (len == 0 || len > WEBHOOK_URL_MAX) {
                snprintf(why, n, "url must be 1 to %d characters", WEBHOOK_URL_MAX);
                return -EINVAL;
        }
        for (const char *p = url; *p; p++)
                if ((unsigned char)*p <= ' ' || *p == 0x7f) {
                        snprintf(why, n, "url has a space or a control character");
                        return -EINVAL;
                }
        CURLU *u = curl_url();
        char *scheme = NULL, *host = NULL, *user = NULL;
        int r = -EINVAL;
        if (!u)
                return -ENOMEM;
        if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
            curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
            curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK)
                snprintf(why, n, "url is not an absolute http or https URL");
        else if (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0)
                snprintf(why, n, "url must be http or https, not %.16s", scheme);
        else if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK)
                snprintf(why, n, "url may not carry a user name or password; the signature authenticates");
        else {
                /* A literal address is judged now; a name each time it is
                 * connected to. */
                struct sockaddr_storage ss;
                char bare[256];
                size_t hl = strlen(host);
                if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']' && hl - 2 < sizeof bare) {
                        memcpy(bare, host + 1, hl - 2);
                        bare[hl - 2] = '\0';
                } else
                        snprintf(bare, sizeof bare, "%s", host);
                int lit = egress_parse_ip_literal(bare, &ss);
                if (lit < 0)
                        snprintf(why, n, "url's host %.64s is not a valid address", host);
                else if (lit == 1 && !address_allowed(w, (struct sockaddr *)&ss, why, n))
                        ;
                else
                        r = 0;
        }
        curl_free(scheme);
        curl_free(host);
        curl_free(user);
        curl_url_cleanup(u);
        return r;
}

/* ---- set-up ---- */

int webhooks_open(const WebhooksConfig *c, Webhooks **ret) {
        if (!c->store->webhooks)
                return -EPROTONOSUPPORT;
        if (c->n_allow > WEBHOOK_MAX_ALLOW_CIDRS)
                return -E2BIG;
        /* Not thread-safe: once, here, before any worker runs. */
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
                return -EIO;
        Webhooks *w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        w->ops = c->store->webhooks;
        memcpy(w->key, c->seal_key, SEAL_KEY_LEN);
        for (unsigned i = 0; i < c->n_allow; i++)
                w->allow[i] = c->allow[i];
        w->n_allow = c->n_allow;
        w->retry_seconds = c->retry_seconds ? c->retry_seconds : WEBHOOK_RETRY_SECONDS_DEFAULT;
        w->workers = c->workers ? c->workers : WEBHOOK_WORKERS_DEFAULT;
        if (w->workers > WEBHOOK_WORKERS_MAX)
                w->workers = WEBHOOK_WORKERS_MAX;
        w->per_owner = c->per_owner ? c->per_owner : w->workers / 2;
        if (w->per_owner < 1)
                w->per_owner = 1;
        if (w->per_owner > w->workers)
                w->per_owner = w->workers;
        pthread_mutex_init(&w->lock, NULL);
        pthread_mutex_init(&w->claim_lock, NULL);
        pthread_cond_init(&w->cond, NULL);
        int r = w->ops->open(c->location, &w->h);
        if (r < 0) {
                webhooks_close(w);
                return r;
        }
        *ret = w;
        return 0;
}

void webhooks_set_host(Webhooks *w, const char *host_id) {
        snprintf(w->host_id, sizeof w->host_id, "%s", host_id);
}

void webhooks_close(Webhooks *w) {
        if (!w)
                return;
        webhooks_stop(w);
        if (w->h)
                w->ops->close(w->h);
        explicit_bzero(w->key, sizeof w->key);
        for (unsigned i = 0; i < WEBHOOK_WORKERS_MAX; i++)
                free(w->holding[i].owner);
        pthread_mutex_destroy(&w->lock);
        pthread_mutex_destroy(&w->claim_lock);
        pthread_cond_destroy(&w->cond);
        free(w);
}

static void kick(Webhooks *w) {
        pthread_mutex_lock(&w->lock);
        w->kicks++;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
}

/* ---- queueing ---- */

/* The event as a delivery's body: what GET /v1/events lists. */
static char *event_body(const EventRecord *e) {
        json_t *data = e->data ? json_loads(e->data, 0, NULL) : NULL;
        _cleanup_json_ json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s?,s:s,s:o,s:o}", "id", e->id, "type", e->type,
                                             "resourceType", e->resource_type, "resourceId", e->resource_id,
                                             "keyId", e->key_id && *e->key_id ? e->key_id : NULL, "hostId",
                                             e->host_id ? e->host_id : "", "time", json_time_or_null(e->at), "data",
                                             data ? data : json_object());
        return j ? json_dumps(j, JSON_COMPACT) : NULL;
}

typedef struct Takers {
        const char *type;
        char (*ids)[WEBHOOK_ID_LEN + 1];
        size_t n;
} Takers;

static int collect_taker(void *userdata, const WebhookRecord *wh) {
        Takers *t = userdata;
        if (!wh->enabled || !takes(wh->events, t->type) || t->n == WEBHOOKS_MAX_PER_OWNER)
                return 0;
        snprintf(t->ids[t->n++], WEBHOOK_ID_LEN + 1, "%s", wh->id);
        return 0;
}

void webhooks_event(Webhooks *w, const EventRecord *e) {
        if (!w || !e->owner)
                return;
        char ids[WEBHOOKS_MAX_PER_OWNER][WEBHOOK_ID_LEN + 1];
        Takers t = { .type = e->type, .ids = ids };
        /* Ids first, deliveries after: a backend may hold its connection
         * through a listing's callbacks. */
        int r = w->ops->list(w->h, e->owner, collect_taker, &t);
        if (r < 0) {
                log_warn(NULL, "event %s: its webhooks not read: %s", e->id, strerror(-r));
                return;
        }
        if (t.n == 0)
                return;
        _cleanup_free_ char *body = event_body(e);
        if (!body)
                return;
        /* One write for them all: an event costs its act one round trip to
         * the store, however many webhooks take it. */
        int64_t now = time_now_unix();
        DeliveryRecord d[WEBHOOKS_MAX_PER_OWNER];
        for (size_t i = 0; i < t.n; i++) {
                char hex[21];
                d[i] = (DeliveryRecord){ .webhook_id = ids[i], .owner = e->owner, .event_id = e->id,
                                         .event_type = e->type, .body = body, .state = "pending", .next_at = now,
                                         .created_at = now, .updated_at = now };
                if ((r = random_hex(hex, 10)) < 0)
                        break;
                snprintf(d[i].id, sizeof d[i].id, "whd_%s", hex);
        }
        if (r == 0)
                r = w->ops->enqueue(w->h, d, t.n);
        if (r < 0) {
                log_warn(NULL, "event %s: its %zu deliver%s not queued: %s", e->id, t.n, t.n == 1 ? "y" : "ies",
                         strerror(-r));
                return;
        }
        kick(w);
}

/* ---- one attempt ---- */

typedef struct Target {
        char *url;
        char *secret, *previous; /* plain; previous NULL when it signs no more */
        bool enabled, found;
} Target;

static void target_done(Target *t) {
        free(t->url);
        if (t->secret)
                explicit_bzero(t->secret, strlen(t->secret));
        if (t->previous)
                explicit_bzero(t->previous, strlen(t->previous));
        free(t->secret);
        free(t->previous);
        *t = (Target){ 0 };
}

typedef struct TargetRead {
        Webhooks *w;
        Target *t;
        int r;
} TargetRead;

static int read_target(void *userdata, const WebhookRecord *wh) {
        TargetRead *tr = userdata;
        Target *t = tr->t;
        char aad[64];
        snprintf(aad, sizeof aad, "webhook-secret/%s", wh->id);
        t->found = true;
        t->enabled = wh->enabled;
        t->url = strdup(wh->url);
        if (!t->url)
                return tr->r = -ENOMEM;
        if ((tr->r = seal_decrypt(tr->w->key, aad, wh->secret, &t->secret)) < 0)
                return tr->r;
        if (wh->previous_secret && *wh->previous_secret && wh->previous_until > time_now_unix() &&
            (tr->r = seal_decrypt(tr->w->key, aad, wh->previous_secret, &t->previous)) < 0)
                return tr->r;
        return 0;
}

static int load_target(Webhooks *w, const char *id, const char *owner, Target *t) {
        TargetRead tr = { .w = w, .t = t };
        int r = w->ops->get(w->h, id, owner, read_target, &tr);
        if (r == 0 && tr.r < 0)
                r = tr.r;
        if (r < 0)
                target_done(t);
        return r;
}

static void hmac_hex(const char *secret, const char *stamp, const char *body, char out[65]) {
        unsigned char mac[EVP_MAX_MD_SIZE];
        unsigned int len = 0;
        size_t sl = strlen(stamp), bl = strlen(body);
        _cleanup_free_ char *msg = malloc(sl + 1 + bl);
        out[0] = '\0';
        if (!msg)
                return;
        memcpy(msg, stamp, sl);
        msg[sl] = '.';
        memcpy(msg + sl + 1, body, bl);
        if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), (unsigned char *)msg, sl + 1 + bl, mac, &len))
                return;
        for (unsigned i = 0; i < len && i < 32; i++)
                snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

typedef struct Check {
        const Webhooks *w;
        char why[160];
} Check;

static curl_socket_t open_checked(void *clientp, curlsocktype purpose, struct curl_sockaddr *a) {
        Check *k = clientp;
        if (purpose != CURLSOCKTYPE_IPCXN || !address_allowed(k->w, &a->addr, k->why, sizeof k->why))
                return CURL_SOCKET_BAD;
        int fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
        return fd < 0 ? CURL_SOCKET_BAD : fd;
}

/* An attempt in flight ends at once when the daemon stops. */
static int on_progress(void *clientp, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
        Check *k = clientp;
        Webhooks *w = (Webhooks *)k->w;
        pthread_mutex_lock(&w->lock);
        bool stop = w->stop;
        pthread_mutex_unlock(&w->lock);
        return stop ? 1 : 0;
}

/* The answer's body is not kept; the timeout bounds how much comes. */
static size_t discard(char *p, size_t size, size_t n, void *userdata) {
        return size * n;
}

static void slist_freep(struct curl_slist **l) {
        curl_slist_free_all(*l);
}

/* One signed POST of body to t's URL. */
static void attempt(Webhooks *w, const Target *t, const char *webhook_id, const char *delivery_id,
                    const char *type, const char *body, WebhookAttempt *out) {
        *out = (WebhookAttempt){ 0 };
        char stamp[24], sig[65], prev[65] = "", header[256];
        snprintf(stamp, sizeof stamp, "%lld", (long long)time_now_unix());
        hmac_hex(t->secret, stamp, body, sig);
        if (t->previous)
                hmac_hex(t->previous, stamp, body, prev);
        if (!sig[0]) {
                snprintf(out->error, sizeof out->error, "signing failed");
                return;
        }
        __attribute__((cleanup(slist_freep))) struct curl_slist *hs = NULL;
        snprintf(header, sizeof header, "Runtime-Signature: t=%s,v1=%s%s%s", stamp, sig, prev[0] ? ",v1=" : "", prev);
        hs = curl_slist_append(hs, header);
        snprintf(header, sizeof header, "Runtime-Webhook-Id: %s", webhook_id);
        hs = hs ? curl_slist_append(hs, header) : NULL;
        snprintf(header, sizeof header, "Runtime-Delivery-Id: %s", delivery_id);
        hs = hs ? curl_slist_append(hs, header) : NULL;
        snprintf(header, sizeof header, "Runtime-Event-Type: %s", type);
        hs = hs ? curl_slist_append(hs, header) : NULL;
        if (!hs) {
                snprintf(out->error, sizeof out->error, "out of memory");
                return;
        }
        webhooks_post(w, t->url, hs, body, out);
}

void webhooks_post(Webhooks *w, const char *url, struct curl_slist *headers, const char *body, WebhookAttempt *out) {
        *out = (WebhookAttempt){ 0 };
        char errbuf[CURL_ERROR_SIZE] = "";
        __attribute__((cleanup(slist_freep))) struct curl_slist *hs = NULL;
        for (struct curl_slist *h = headers; h; h = h->next)
                if (!(hs = curl_slist_append(hs, h->data)))
                        break;
        hs = hs || !headers ? curl_slist_append(hs, "Content-Type: application/json") : NULL;
        hs = hs ? curl_slist_append(hs, "Expect:") : NULL;
        CURL *c = hs ? curl_easy_init() : NULL;
        if (!c) {
                snprintf(out->error, sizeof out->error, "out of memory");
                return;
        }
        Check k = { .w = w };
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
        /* Never a proxy of the daemon's environment: the address check is
         * of the receiver itself. */
        curl_easy_setopt(c, CURLOPT_PROXY, "");
        curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)CONNECT_TIMEOUT_SECONDS);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)WEBHOOK_TIMEOUT_SECONDS);
        curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_checked);
        curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &k);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, &k);
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
        curl_easy_setopt(c, CURLOPT_USERAGENT, "runtimed/" RUNTIME_VERSION);
        uint64_t t0 = time_now_mono_ms();
        CURLcode rc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(c);
        out->duration_ms = (int64_t)(time_now_mono_ms() - t0);
        out->status = (int)status;
        if (rc == CURLE_OK && status >= 200 && status < 300) {
                out->delivered = true;
                return;
        }
        out->interrupted = rc == CURLE_ABORTED_BY_CALLBACK;
        if (rc != CURLE_OK)
                snprintf(out->error, sizeof out->error, "%s", k.why[0] ? k.why : errbuf[0] ? errbuf : curl_easy_strerror(rc));
        else if (status >= 300 && status < 400)
                snprintf(out->error, sizeof out->error, "the receiver answered %ld (a redirect is not followed)", status);
        else
                snprintf(out->error, sizeof out->error, "the receiver answered %ld", status);
}

/* ---- deliveries ---- */

/* A claimed delivery, copied out of the store's callback. */
typedef struct Job {
        char id[DELIVERY_ID_LEN + 1];
        char *webhook_id, *owner, *event_type, *body, *state;
        int attempts;
        int64_t next_at, created_at;
        bool taken;
} Job;

static void job_done(Job *j) {
        free(j->webhook_id);
        free(j->owner);
        free(j->event_type);
        free(j->body);
        free(j->state);
        *j = (Job){ 0 };
}

static int job_fill(Job *j, const DeliveryRecord *d);

static int take_job(void *userdata, const DeliveryRecord *d) {
        Job *j = userdata;
        if (j->taken)
                return 0;
        return job_fill(j, d);
}

/* A claim's deliveries, each into the next free Job of the batch. */
typedef struct Batch {
        Job jobs[CLAIM_BATCH];
        unsigned n;
} Batch;

static int take_batch(void *userdata, const DeliveryRecord *d) {
        Batch *b = userdata;
        return b->n < CLAIM_BATCH ? job_fill(&b->jobs[b->n++], d) : 0;
}

static int job_fill(Job *j, const DeliveryRecord *d) {
        snprintf(j->id, sizeof j->id, "%s", d->id);
        j->webhook_id = strdup(d->webhook_id);
        j->owner = strdup(d->owner);
        j->event_type = strdup(d->event_type);
        j->body = strdup(d->body);
        j->state = strdup(d->state);
        j->attempts = d->attempts;
        j->next_at = d->next_at;
        j->created_at = d->created_at;
        j->taken = true;
        return j->webhook_id && j->owner && j->event_type && j->body && j->state ? 0 : -ENOMEM;
}

static int64_t backoff(const Webhooks *w, int attempts) {
        int64_t s = w->retry_seconds;
        for (int i = 1; i < attempts && s < WEBHOOK_RETRY_MAX_SECONDS; i++)
                s *= 2;
        return s > WEBHOOK_RETRY_MAX_SECONDS ? WEBHOOK_RETRY_MAX_SECONDS : s;
}

/* Sends a claimed delivery and records how it went. once: a client's retry,
 * which leaves a given-up delivery given up when it fails again. */
static int run_job(Webhooks *w, const Job *j, bool once) {
        Target t = { 0 };
        WebhookAttempt a = { 0 };
        bool disabled = false;
        int r = load_target(w, j->webhook_id, NULL, &t);
        if (r == -ENOENT)
                return 0; /* removed with its deliveries meanwhile */
        if (r < 0)
                snprintf(a.error, sizeof a.error, "the webhook could not be read: %s", strerror(-r));
        else if (!t.enabled) {
                snprintf(a.error, sizeof a.error, "the webhook is disabled");
                disabled = true;
        } else
                attempt(w, &t, j->webhook_id, j->id, j->event_type, j->body, &a);
        target_done(&t);
        int64_t now = time_now_unix();
        DeliveryRecord d = { .webhook_id = j->webhook_id, .owner = j->owner, .event_type = j->event_type,
                             .body = j->body, .attempts = j->attempts + 1, .response_status = a.status,
                             .last_error = a.delivered ? NULL : a.error, .claimed_by = w->host_id,
                             .created_at = j->created_at, .updated_at = now };
        snprintf(d.id, sizeof d.id, "%s", j->id);
        bool gave_up = false;
        if (a.interrupted) {
                /* Due again at once, for the next start or another host. */
                d.state = j->state;
                d.attempts = j->attempts;
                d.next_at = now;
                d.last_error = "the daemon stopped during an attempt";
        } else if (a.delivered) {
                d.state = "delivered";
                atomic_fetch_add(&n_delivered, 1);
        } else {
                atomic_fetch_add(&n_failed_attempts, 1);
                bool was_pending = strcmp(j->state, "pending") == 0;
                if ((once && !was_pending) || (!once && d.attempts >= WEBHOOK_MAX_ATTEMPTS) || disabled) {
                        d.state = "failed";
                        gave_up = !once || was_pending;
                } else {
                        d.state = "pending";
                        d.next_at = now + backoff(w, d.attempts);
                }
        }
        if (gave_up) {
                atomic_fetch_add(&n_given_up, 1);
                log_warn(NULL, "webhook %s: delivery %s given up after %d attempts: %s", j->webhook_id, j->id,
                         d.attempts, a.error);
        }
        r = w->ops->finish(w->h, &d);
        if (r < 0 && r != -ESTALE && r != -ENOENT)
                log_warn(NULL, "webhook %s: delivery %s: recording the attempt: %s", j->webhook_id, j->id,
                         strerror(-r));
        return 0;
}

/* The owners whose batches per_owner workers hold already, into skip;
 * how many. Under claim_lock. */
static size_t owners_at_share(Webhooks *w, char *skip[static WEBHOOK_WORKERS_MAX]) {
        size_t n = 0;
        pthread_mutex_lock(&w->lock);
        for (unsigned i = 0; i < WEBHOOK_WORKERS_MAX; i++)
                if (w->holding[i].owner && w->holding[i].n >= w->per_owner)
                        skip[n++] = w->holding[i].owner;
        pthread_mutex_unlock(&w->lock);
        return n;
}

/* A worker takes (+1) or leaves (-1) a batch of owner's. Its slot is free
 * again when no worker holds one of the owner's. */
static void owner_hold(Webhooks *w, const char *owner, int delta) {
        pthread_mutex_lock(&w->lock);
        int at = -1, free_slot = -1;
        for (int i = 0; i < WEBHOOK_WORKERS_MAX; i++) {
                if (w->holding[i].owner && strcmp(w->holding[i].owner, owner) == 0)
                        at = i;
                else if (!w->holding[i].owner && free_slot < 0)
                        free_slot = i;
        }
        if (delta > 0 && at < 0 && free_slot >= 0) {
                /* Without memory the owner goes uncounted; the claim still works. */
                w->holding[free_slot].owner = strdup(owner);
                at = w->holding[free_slot].owner ? free_slot : -1;
        }
        if (at >= 0) {
                if (delta > 0)
                        w->holding[at].n++;
                else if (w->holding[at].n > 0 && --w->holding[at].n == 0) {
                        free(w->holding[at].owner);
                        w->holding[at].owner = NULL;
                }
        }
        pthread_mutex_unlock(&w->lock);
}

/* Claims a batch of one owner's due deliveries, passing over the owners
 * at their share, and counts it as the owner's: 0 with b->n 0 when none
 * is due. */
static int claim_batch(Webhooks *w, Batch *b) {
        char *skip[WEBHOOK_WORKERS_MAX];
        int64_t now = time_now_unix();
        pthread_mutex_lock(&w->claim_lock);
        size_t n_skip = owners_at_share(w, skip);
        int r = w->ops->claim(w->h, w->host_id, now, now + CLAIM_SECONDS, CLAIM_BATCH, (const char *const *)skip,
                              n_skip, take_batch, b);
        if (b->n > 0 && b->jobs[0].owner)
                owner_hold(w, b->jobs[0].owner, +1);
        pthread_mutex_unlock(&w->claim_lock);
        return r;
}

static void *worker(void *userdata) {
        Webhooks *w = userdata;
        unsigned failures = 0;
        for (;;) {
                pthread_mutex_lock(&w->lock);
                bool stop = w->stop;
                w->kicks = 0;
                pthread_mutex_unlock(&w->lock);
                if (stop)
                        break;
                Batch b = { 0 };
                int r = claim_batch(w, &b);
                for (unsigned i = 0; i < b.n; i++) {
                        if (r == 0)
                                run_job(w, &b.jobs[i], false);
                }
                if (b.n > 0 && b.jobs[0].owner)
                        owner_hold(w, b.jobs[0].owner, -1);
                for (unsigned i = 0; i < b.n; i++)
                        job_done(&b.jobs[i]);
                if (r == 0 && b.n > 0) {
                        failures = 0;
                        continue;
                }
                if (r < 0 && failures++ % 60 == 0)
                        log_warn(NULL, "webhooks: claiming deliveries: %s", strerror(-r));
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                ts.tv_nsec += (long)IDLE_POLL_MS * 1000000L;
                ts.tv_sec += ts.tv_nsec / 1000000000L;
                ts.tv_nsec %= 1000000000L;
                pthread_mutex_lock(&w->lock);
                while (!w->stop && w->kicks == 0)
                        if (pthread_cond_timedwait(&w->cond, &w->lock, &ts) == ETIMEDOUT)
                                break;
                pthread_mutex_unlock(&w->lock);
        }
        return NULL;
}

int webhooks_start(Webhooks *w) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_destroy(&w->cond);
        pthread_cond_init(&w->cond, &ca);
        pthread_condattr_destroy(&ca);
        for (unsigned i = 0; i < w->workers; i++) {
                int r = pthread_create(&w->threads[i], NULL, worker, w);
                if (r != 0) {
                        webhooks_stop(w);
                        return -r;
                }
                w->started++;
        }
        return 0;
}

void webhooks_stop(Webhooks *w) {
        pthread_mutex_lock(&w->lock);
        w->stop = true;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
        for (unsigned i = 0; i < w->started; i++)
                pthread_join(w->threads[i], NULL);
        w->started = 0;
}

/* ---- what clients drive ---- */

static int new_secret(char out[WEBHOOK_SECRET_LEN + 1]) {
        char hex[65];
        int r = random_hex(hex, 32);
        if (r < 0)
                return r;
        snprintf(out, WEBHOOK_SECRET_LEN + 1, "whsec_%s", hex);
        explicit_bzero(hex, sizeof hex);
        return 0;
}

static int seal_secret(Webhooks *w, const char *id, const char *plain, char **ret) {
        char aad[64];
        snprintf(aad, sizeof aad, "webhook-secret/%s", id);
        return seal_encrypt(w->key, aad, plain, ret);
}

int webhooks_create(Webhooks *w, const char *owner, const WebhookInput *in, char *ret_secret, StoreWebhookFn fn,
                    void *userdata) {
        char hex[21];
        WebhookRecord rec = { .owner = owner, .url = in->url, .events = in->events ? in->events : "[]",
                              .description = in->description, .enabled = in->enabled != 0 };
        int r = random_hex(hex, 10);
        if (r < 0 || (r = new_secret(ret_secret)) < 0)
                return r;
        snprintf(rec.id, sizeof rec.id, "wh_%s", hex);
        _cleanup_free_ char *sealed = NULL;
        if ((r = seal_secret(w, rec.id, ret_secret, &sealed)) < 0)
                return r;
        rec.secret = sealed;
        rec.created_at = rec.updated_at = time_now_unix();
        if ((r = w->ops->put(w->h, &rec, WEBHOOKS_MAX_PER_OWNER)) < 0)
                return r;
        return w->ops->get(w->h, rec.id, owner, fn, userdata);
}

int webhooks_get(Webhooks *w, const char *id, const char *owner, StoreWebhookFn fn, void *userdata) {
        return w->ops->get(w->h, id, owner, fn, userdata);
}

int webhooks_list(Webhooks *w, const char *owner, StoreWebhookFn fn, void *userdata) {
        return w->ops->list(w->h, owner, fn, userdata);
}

/* A stored webhook, copied out of the store's callback for a change. */
typedef struct Held {
        char id[WEBHOOK_ID_LEN + 1];
        char *owner, *url, *events, *description, *secret, *previous;
        bool enabled;
        int64_t previous_until, created_at, version;
} Held;

static void held_done(Held *h) {
        free(h->owner);
        free(h->url);
        free(h->events);
        free(h->description);
        free(h->secret);
        free(h->previous);
        *h = (Held){ 0 };
}

static char *dup_opt(const char *s) {
        return s && *s ? strdup(s) : NULL;
}

static int hold(void *userdata, const WebhookRecord *wh) {
        Held *h = userdata;
        snprintf(h->id, sizeof h->id, "%s", wh->id);
        h->owner = strdup(wh->owner);
        h->url = strdup(wh->url);
        h->events = strdup(wh->events);
        h->secret = strdup(wh->secret);
        h->description = dup_opt(wh->description);
        h->previous = dup_opt(wh->previous_secret);
        h->enabled = wh->enabled;
        h->previous_until = wh->previous_until;
        h->created_at = wh->created_at;
        h->version = wh->version;
        return h->owner && h->url && h->events && h->secret ? 0 : -ENOMEM;
}

static WebhookRecord held_record(const Held *h) {
        WebhookRecord rec = { .owner = h->owner, .url = h->url, .events = h->events, .description = h->description,
                              .enabled = h->enabled, .secret = h->secret, .previous_secret = h->previous,
                              .previous_until = h->previous_until, .created_at = h->created_at,
                              .updated_at = time_now_unix(), .version = h->version };
        snprintf(rec.id, sizeof rec.id, "%s", h->id);
        return rec;
}

/* Reads, changes and writes back a webhook, again when another write came
 * between (its version). */
typedef int (*ChangeFn)(Webhooks *w, WebhookRecord *rec, void *userdata);

static int change(Webhooks *w, const char *id, const char *owner, ChangeFn fn, void *change_data) {
        for (int tries = 0; tries < 8; tries++) {
                Held h = { 0 };
                int r = w->ops->get(w->h, id, owner, hold, &h);
                if (r == 0) {
                        WebhookRecord rec = held_record(&h);
                        r = fn(w, &rec, change_data);
                        if (r == 0)
                                r = w->ops->update(w->h, &rec);
                }
                held_done(&h);
                if (r != -ESTALE)
                        return r;
        }
        return -EBUSY;
}

static int apply_input(Webhooks *w, WebhookRecord *rec, void *userdata) {
        const WebhookInput *in = userdata;
        if (in->url)
                rec->url = in->url;
        if (in->events)
                rec->events = in->events;
        if (in->description)
                rec->description = in->description;
        if (in->enabled >= 0)
                rec->enabled = in->enabled;
        return 0;
}

int webhooks_update(Webhooks *w, const char *id, const char *owner, const WebhookInput *in, StoreWebhookFn fn,
                    void *userdata) {
        int r = change(w, id, owner, apply_input, (void *)in);
        return r < 0 ? r : w->ops->get(w->h, id, owner, fn, userdata);
}

typedef struct Rotation {
        int64_t keep;
        char *secret; /* the new one, plain */
        char *sealed; /* of the last try */
} Rotation;

static int apply_rotation(Webhooks *w, WebhookRecord *rec, void *userdata) {
        Rotation *ro = userdata;
        free(ro->sealed);
        ro->sealed = NULL;
        int r = seal_secret(w, rec->id, ro->secret, &ro->sealed);
        if (r < 0)
                return r;
        int64_t now = time_now_unix();
        rec->previous_secret = ro->keep > 0 ? rec->secret : NULL;
        rec->previous_until = ro->keep > 0 ? now + ro->keep : 0;
        rec->secret = ro->sealed;
        return 0;
}

int webhooks_rotate(Webhooks *w, const char *id, const char *owner, int64_t keep, char *ret_secret,
                    StoreWebhookFn fn, void *userdata) {
        int r = new_secret(ret_secret);
        if (r < 0)
                return r;
        Rotation ro = { .keep = keep, .secret = ret_secret };
        r = change(w, id, owner, apply_rotation, &ro);
        free(ro.sealed);
        return r < 0 ? r : w->ops->get(w->h, id, owner, fn, userdata);
}

int webhooks_delete(Webhooks *w, const char *id, const char *owner) {
        return w->ops->remove(w->h, id, owner);
}

int webhooks_test(Webhooks *w, const char *id, const char *owner, WebhookAttempt *ret) {
        Target t = { 0 };
        int r = load_target(w, id, owner, &t);
        if (r < 0)
                return r;
        char hex[21], did[DELIVERY_ID_LEN + 1];
        EventRecord e = { .owner = owner, .type = "webhook.test", .resource_type = "webhook", .resource_id = id,
                          .at = time_now_unix() };
        if ((r = random_hex(hex, 10)) < 0) {
                target_done(&t);
                return r;
        }
        snprintf(e.id, sizeof e.id, "evt_%s", hex);
        snprintf(did, sizeof did, "whd_%s", hex);
        _cleanup_free_ char *body = event_body(&e);
        if (!body) {
                target_done(&t);
                return -ENOMEM;
        }
        attempt(w, &t, id, did, e.type, body, ret);
        target_done(&t);
        return 0;
}

int webhooks_retry(Webhooks *w, const char *id, const char *owner, StoreDeliveryFn fn, void *userdata) {
        Job j = { 0 };
        int64_t now = time_now_unix();
        int r = w->ops->claim_one(w->h, id, owner, w->host_id, now, now + CLAIM_SECONDS, take_job, &j);
        if (r == 0 && !j.taken)
                r = -ENOENT;
        if (r == 0)
                r = run_job(w, &j, true);
        job_done(&j);
        return r < 0 ? r : w->ops->get_delivery(w->h, id, owner, fn, userdata);
}

typedef struct Owned {
        bool found;
} Owned;

static int note_found(void *userdata, const WebhookRecord *wh) {
        ((Owned *)userdata)->found = true;
        return 0;
}

int webhooks_deliveries(Webhooks *w, const char *webhook_id, const char *owner, const DeliveryFilter *f,
                        StoreDeliveryFn fn, void *userdata) {
        Owned o = { 0 };
        int r = w->ops->get(w->h, webhook_id, owner, note_found, &o);
        if (r < 0)
                return r;
        DeliveryFilter g = *f;
        g.webhook_id = webhook_id;
        return w->ops->deliveries(w->h, &g, fn, userdata);
}

int webhooks_prune(Webhooks *w, int64_t days, int64_t *ret_n) {
        return w->ops->prune(w->h, time_now_unix() - days * 86400, ret_n);
}

int webhooks_set_epoch(Webhooks *w, const char *host_id, int64_t epoch) {
        return w->ops->set_writer(w->h, host_id, epoch);
}
