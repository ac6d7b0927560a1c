#pragma once
/*
 * Webhooks (docs/api.md, "Webhooks"): an owner's URLs told of the owner's
 * events, each delivery a signed POST.
 *
 * An event that a webhook takes is queued in the store as a delivery (one
 * per webhook) when it is recorded; worker threads of every host claim due
 * deliveries and send them, so a slow or dead receiver holds a worker for
 * at most its timeout and never a sandbox operation; a failed attempt is
 * tried again later, with the wait doubling, and given up after
 * WEBHOOK_MAX_ATTEMPTS. Deliveries are records, so a daemon restart loses
 * none: a claim of a host that stopped ends and the delivery is due again.
 *
 * A receiver is reached only at a public address, or one in a range the
 * operator allowed (--webhook-allow-cidr); link-local (cloud metadata),
 * multicast and unspecified addresses never. The address is checked as the
 * connection is made (after DNS, so a name that resolves elsewhere later is
 * checked then), redirects are not followed, and no proxy of the daemon's
 * environment is used.
 *
 * Each delivery carries Runtime-Signature: t=<unix seconds>,v1=<hex>, the
 * HMAC-SHA256 of "<t>.<body>" keyed with the webhook's secret; while a
 * rotation overlaps, a second v1 made with the previous secret. Secrets are
 * sealed at rest with the daemon's secrets key (egress_seal.h).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"
#include "daemon/store/store_events.h"
#include "daemon/store/store_webhooks.h"
#include "egress/cidr.h"

#define WEBHOOKS_MAX_PER_OWNER 20
#define WEBHOOK_URL_MAX 2048
#define WEBHOOK_DESCRIPTION_MAX 256
#define WEBHOOK_EVENT_TYPES_MAX 32
#define WEBHOOK_KEEP_PREVIOUS_DEFAULT 86400
#define WEBHOOK_KEEP_PREVIOUS_MAX (7 * 86400)
#define WEBHOOK_MAX_ATTEMPTS 8
#define WEBHOOK_RETRY_SECONDS_DEFAULT 10
#define WEBHOOK_RETRY_MAX_SECONDS 3600
#define WEBHOOK_WORKERS_DEFAULT 4
#define WEBHOOK_WORKERS_MAX 16
#define WEBHOOK_MAX_ALLOW_CIDRS 32
#define WEBHOOK_TIMEOUT_SECONDS 10
#define WEBHOOK_SECRET_LEN 70 /* "whsec_" and 64 hex digits */

typedef struct Webhooks Webhooks;

/* The epoch this host registered at: the store's writes of webhook deliveries are made
 * only while the host is still registered at it and not declared dead. */
int webhooks_set_epoch(Webhooks *w, const char *host_id, int64_t epoch);

typedef struct WebhooksConfig {
        const StoreBackend *store;
        const char *location;
        const uint8_t *seal_key;  /* SEAL_KEY_LEN bytes, copied */
        const EgressCidr *allow;  /* ranges a receiver may be in although not public */
        unsigned n_allow;
        unsigned retry_seconds;   /* the wait after a first failed attempt; 0: the default */
        unsigned workers;         /* 0: the default */
        unsigned per_owner;       /* workers one owner's deliveries may hold at once; 0: half, at least 1 */
} WebhooksConfig;

int webhooks_open(const WebhooksConfig *c, Webhooks **ret);
/* One POST of the JSON body to url with the header lines given (and
 * Content-Type), under a webhook's rules: only an address a receiver may
 * be at, checked as it is connected to; no redirect, no proxy;
 * WEBHOOK_TIMEOUT_SECONDS; stopped when the webhooks stop. delivered when
 * it was answered 2xx. (The OpenTelemetry exports push with it too.) */
struct curl_slist;
typedef struct WebhookAttempt WebhookAttempt;
void webhooks_post(Webhooks *w, const char *url, struct curl_slist *headers, const char *body, WebhookAttempt *out);
void webhooks_set_host(Webhooks *w, const char *host_id);
/* The worker threads; webhooks_stop ends them (an attempt in flight ends
 * with its timeout at most). A worker claims a batch of one owner's due
 * deliveries and sends them in turn; at most per_owner workers hold one
 * owner's batches at once, so that an owner whose receivers hang (each
 * attempt lasting WEBHOOK_TIMEOUT_SECONDS) never holds the workers the
 * other owners' deliveries need. */
int webhooks_start(Webhooks *w);
void webhooks_stop(Webhooks *w);
void webhooks_close(Webhooks *w);

/* An event recorded: a delivery queued for each enabled webhook of its
 * owner that takes its type. Never fails the act the event is of. */
void webhooks_event(Webhooks *w, const EventRecord *e);

/* What a client asks of a webhook; NULL fields are left as they are (on
 * update) or defaulted (on create). events is a JSON array's text. */
typedef struct WebhookInput {
        const char *url;
        const char *events;
        const char *description;
        int enabled; /* -1: as it is */
} WebhookInput;

/* Whether a URL may be a webhook's: 0, or -EINVAL with why. */
int webhooks_check_url(const Webhooks *w, const char *url, char *why, size_t n);
/* Whether types (a JSON array's text) names known event types or groups
 * ("sandbox."); 0, or -EINVAL with why. */
int webhooks_check_events(const char *types, char *why, size_t n);

/* A new webhook of owner; fn sees it, with its secret (plain, shown once)
 * in *ret_secret (WEBHOOK_SECRET_LEN + 1 bytes). -EDQUOT at the limit. */
int webhooks_create(Webhooks *w, const char *owner, const WebhookInput *in, char *ret_secret, StoreWebhookFn fn,
                    void *userdata);
int webhooks_get(Webhooks *w, const char *id, const char *owner, StoreWebhookFn fn, void *userdata);
int webhooks_list(Webhooks *w, const char *owner, StoreWebhookFn fn, void *userdata);
int webhooks_update(Webhooks *w, const char *id, const char *owner, const WebhookInput *in, StoreWebhookFn fn,
                    void *userdata);
/* A new secret (in ret_secret); the old one signs beside it for keep
 * seconds (0: not at all). */
int webhooks_rotate(Webhooks *w, const char *id, const char *owner, int64_t keep, char *ret_secret,
                    StoreWebhookFn fn, void *userdata);
int webhooks_delete(Webhooks *w, const char *id, const char *owner);

/* How one attempt went. */
struct WebhookAttempt {
        bool delivered;
        bool interrupted; /* the daemon stopped during it: it does not count */
        int status;       /* the receiver's HTTP status; 0: none */
        char error[256];  /* why it failed; "" when delivered */
        int64_t duration_ms;
};

/* Sends a signed webhook.test event to the webhook now. */
int webhooks_test(Webhooks *w, const char *id, const char *owner, WebhookAttempt *ret);
/* Sends the delivery id again, once, now; fn sees it afterwards. -EBUSY
 * while another attempt of it is in flight. */
int webhooks_retry(Webhooks *w, const char *id, const char *owner, StoreDeliveryFn fn, void *userdata);
int webhooks_deliveries(Webhooks *w, const char *webhook_id, const char *owner, const DeliveryFilter *f,
                        StoreDeliveryFn fn, void *userdata);
/* Drops the finished deliveries older than days; how many went. */
int webhooks_prune(Webhooks *w, int64_t days, int64_t *ret_n);

/* Figures for /metrics: deliveries made, failed attempts, given up. */
void webhooks_counts(uint64_t *delivered, uint64_t *failed_attempts, uint64_t *given_up);
