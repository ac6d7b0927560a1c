#pragma once
/*
 * Webhooks and their deliveries as a backend keeps them (store.h).
 *
 * A webhook is an owner's URL that is told of the owner's events (the
 * types it names, or all): its secret is kept sealed (the daemon seals and
 * opens it; the store sees text), with the previous secret beside it while a
 * rotation overlaps. A webhook carries a version: an update names the version
 * it read and changes nothing (-ESTALE) when another write came first.
 *
 * A delivery is one event on its way to one webhook: the body as it is sent,
 * its state ("pending", "delivered", "failed"), its attempts, and when the
 * next attempt is due. Any host of a fleet may send it: a host claims due
 * deliveries for a while (claimed_by, claimed_until), atomically for every
 * process that shares the store, so that no two hosts send one delivery at
 * once; what a host that died had claimed is due again when its claim ends.
 * A delivery's seq is its place in the table: the cursor of a listing.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"

#define WEBHOOK_ID_LEN 23  /* "wh_" and 20 hex digits */
#define DELIVERY_ID_LEN 24 /* "whd_" and 20 hex digits */
#define DELIVERY_CLAIM_SKIP_MAX 16 /* owners a claim may pass over */

typedef struct WebhookRecord {
        char id[WEBHOOK_ID_LEN + 1];
        const char *owner;
        const char *url;
        const char *events;      /* a JSON array of event types; "[]" is every type */
        const char *description; /* NULL or "": none */
        bool enabled;
        const char *secret;          /* sealed */
        const char *previous_secret; /* sealed; NULL or "": none */
        int64_t previous_until;      /* the previous secret signs until then (unix seconds) */
        int64_t created_at, updated_at;
        int64_t version; /* set by the store on put (1) and update (+1) */
} WebhookRecord;

typedef struct DeliveryRecord {
        char id[DELIVERY_ID_LEN + 1];
        const char *webhook_id;
        const char *owner;
        const char *event_id;
        const char *event_type;
        const char *body;  /* the JSON text that is sent */
        const char *state; /* "pending", "delivered", "failed" */
        int attempts;
        int64_t next_at;        /* pending: when the next attempt is due */
        int response_status;    /* the last attempt's HTTP status; 0: none */
        const char *last_error; /* the last attempt's failure; NULL or "": none */
        const char *claimed_by; /* the host that sends it now; NULL or "": none */
        int64_t claimed_until;
        int64_t created_at, updated_at;
        int64_t seq; /* set by the store: its place, the cursor */
} DeliveryRecord;

/* Called per record; its strings live until it returns. A negative return
 * stops the walk and is returned. */
typedef int (*StoreWebhookFn)(void *userdata, const WebhookRecord *w);
typedef int (*StoreDeliveryFn)(void *userdata, const DeliveryRecord *d);

/* Which deliveries a listing takes: of one webhook, in one state (NULL:
 * any), older than the cursor `before` (0: the newest), newest first. */
typedef struct DeliveryFilter {
        const char *webhook_id;
        const char *state;
        int64_t before;
        unsigned limit;
} DeliveryFilter;

typedef struct StoreWebhooks StoreWebhooks;

struct StoreWebhookOps {
        int (*open)(const char *location, StoreWebhooks **ret);
        void (*close)(StoreWebhooks *h);

        /* Adds w (its version is the store's: 1) unless its owner has
         * max_per_owner webhooks already (-EDQUOT), atomically. -EEXIST for
         * a taken id. */
        int (*put)(StoreWebhooks *h, const WebhookRecord *w, unsigned max_per_owner);
        /* The webhook id, of owner (NULL: anyone's); -ENOENT. */
        int (*get)(StoreWebhooks *h, const char *id, const char *owner, StoreWebhookFn fn, void *userdata);
        /* The webhooks of owner (NULL: every owner's), oldest first. */
        int (*list)(StoreWebhooks *h, const char *owner, StoreWebhookFn fn, void *userdata);
        /* Writes every field of w but id, owner and created_at, if the stored
         * version is w->version (then it is w->version + 1): -ESTALE if it is
         * not, -ENOENT if there is no such webhook of w->owner. */
        int (*update)(StoreWebhooks *h, const WebhookRecord *w);
        /* Removes the webhook id of owner and its deliveries; -ENOENT. */
        int (*remove)(StoreWebhooks *h, const char *id, const char *owner);

        /* Adds n deliveries (their seq is the store's), all or none, in one
         * write. -EEXIST for a taken id. */
        /* The host whose writes these are, at the epoch it registered at
         * (a fleet): each write from now on is made only while the host is
         * still registered at it and not declared dead, and is -EOWNERDEAD
         * (or, for a claim, claims nothing), changing nothing, otherwise.
         * Epoch 0: no condition. A backend with one host ignores it. */
        int (*set_writer)(StoreWebhooks *h, const char *host_id, int64_t epoch);
        int (*enqueue)(StoreWebhooks *h, const DeliveryRecord *d, size_t n);
        /* Claims up to max pending deliveries due at now (next_at <= now)
         * that no live claim holds (claimed_until < now), all of one owner:
         * the owner of the oldest due one among owners not in skip (n_skip
         * names, at most DELIVERY_CLAIM_SKIP_MAX, else -E2BIG; skip may be
         * NULL when n_skip is 0). Oldest due first, for host until `until`;
         * calls fn with each as claimed. */
        int (*claim)(StoreWebhooks *h, const char *host, int64_t now, int64_t until, unsigned max,
                     const char *const *skip, size_t n_skip, StoreDeliveryFn fn, void *userdata);
        /* Claims the delivery id of owner (NULL: anyone's) whatever its
         * state, for one attempt now (a client's retry): -ENOENT, -EBUSY
         * while another live claim holds it. */
        int (*claim_one)(StoreWebhooks *h, const char *id, const char *owner, const char *host, int64_t now,
                         int64_t until, StoreDeliveryFn fn, void *userdata);
        /* Records an attempt's outcome: state, attempts, next_at,
         * response_status, last_error and updated_at of d, and the claim
         * released; only while d->claimed_by holds the claim (-ESTALE when
         * it does not: another host took it over). */
        int (*finish)(StoreWebhooks *h, const DeliveryRecord *d);
        /* The delivery id, of owner (NULL: anyone's); -ENOENT. */
        int (*get_delivery)(StoreWebhooks *h, const char *id, const char *owner, StoreDeliveryFn fn,
                            void *userdata);
        int (*deliveries)(StoreWebhooks *h, const DeliveryFilter *f, StoreDeliveryFn fn, void *userdata);
        /* Drops the deliveries that are not pending and were last written
         * before `before` (unix seconds); how many went. */
        int (*prune)(StoreWebhooks *h, int64_t before, int64_t *ret_n);
};

extern const StoreWebhookOps store_sqlite_webhooks;
extern const StoreWebhookOps store_postgres_webhooks;
