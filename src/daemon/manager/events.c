#include "daemon/manager/events.h"
#include "daemon/manager/webhooks.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"

struct Events {
        const StoreEventOps *ops;
        StoreEvents *h;
        char host_id[64];
        Webhooks *webhooks; /* told of each event recorded; NULL: none */
};

static atomic_uint_fast64_t dropped;

int events_open(const StoreBackend *b, const char *location, Events **ret) {
        Events *ev = calloc(1, sizeof(*ev));
        if (!ev)
                return -ENOMEM;
        ev->ops = b->events;
        int r = ev->ops->open(location, &ev->h);
        if (r < 0) {
                free(ev);
                return r;
        }
        *ret = ev;
        return 0;
}

void events_close(Events *ev) {
        if (!ev)
                return;
        ev->ops->close(ev->h);
        free(ev);
}

void events_set_webhooks(Events *ev, Webhooks *w) {
        ev->webhooks = w;
}

void events_set_host(Events *ev, const char *host_id) {
        snprintf(ev->host_id, sizeof(ev->host_id), "%s", host_id);
}

int events_set_epoch(Events *ev, const char *host_id, int64_t epoch) {
        return ev->ops->set_writer(ev->h, host_id, epoch);
}

uint64_t events_dropped(void) {
        return atomic_load(&dropped);
}

void events_emit(Events *ev, const char *owner, const char *type, const char *resource_type,
                 const char *resource_id, const char *key_id, json_t *data) {
        if (!ev) {
                json_decref(data);
                return;
        }
        char hex[21];
        _cleanup_free_ char *text = data ? json_dumps(data, JSON_COMPACT) : NULL;
        json_decref(data);
        EventRecord e = { .owner = owner, .type = type, .resource_type = resource_type, .resource_id = resource_id,
                          .key_id = key_id, .host_id = ev->host_id, .data = text, .at = time_now_unix() };
        int r = random_hex(hex, 10);
        if (r == 0) {
                snprintf(e.id, sizeof(e.id), "evt_%s", hex);
                r = ev->ops->append(ev->h, &e);
        }
        if (r < 0) {
                atomic_fetch_add(&dropped, 1);
                log_warn(NULL, "event %s of %s not recorded: %s", type, resource_id, strerror(-r));
                return;
        }
        webhooks_event(ev->webhooks, &e);
}

void events_spending_reached(Events *ev, const char *owner, const char *key_id, bool trial, int64_t limit,
                             int64_t used, int64_t wanted, const char *sandbox_id) {
        events_emit(ev, owner, "key.spending_limit_reached", "key", key_id, key_id,
                    json_pack("{s:s,s:I,s:I,s:I,s:s?}", "limit", trial ? "trial" : "daily", "limitMicros",
                              (json_int_t)limit, "usedMicros", (json_int_t)used, "wantedMicros", (json_int_t)wanted,
                              "sandboxId", sandbox_id));
}

#define RATE_SLOTS 1024

static struct {
        uint64_t hash;
        int64_t at;
} rate_slots[RATE_SLOTS];
static pthread_mutex_t rate_lock = PTHREAD_MUTEX_INITIALIZER;

bool events_rate_ok(const char *kind, const char *who, int64_t every_s) {
        uint64_t h = fnv1a64_str(fnv1a64_byte(fnv1a64_str(FNV1A64_INIT, kind), 0xff), who);
        int64_t now = time_now_mono_ms() / 1000;
        pthread_mutex_lock(&rate_lock);
        size_t i = (size_t)(h % RATE_SLOTS);
        bool ok = rate_slots[i].hash != h || now - rate_slots[i].at >= every_s;
        if (ok) {
                rate_slots[i].hash = h;
                rate_slots[i].at = now;
        }
        pthread_mutex_unlock(&rate_lock);
        return ok;
}

SandboxFacts sandbox_facts(const SandboxRow *r) {
        return (SandboxFacts){ .state = r->state, .started_at = r->started_at, .lease_ends_at = r->lease_ends_at,
                               .deleted_at = r->deleted_at };
}

/* The name of the change, or NULL when it is none an event is kept for. */
static const char *change_type(const SandboxFacts *b, const SandboxRow *a) {
        if (a->deleted_at && !b->deleted_at)
                return "sandbox.deleted";
        if (a->state == b->state) {
                if (a->state == SANDBOX_RUNNING && a->started_at != b->started_at)
                        return "sandbox.restarted";
                if (a->lease_ends_at > b->lease_ends_at && b->lease_ends_at)
                        return "sandbox.extended";
                return NULL;
        }
        switch (a->state) {
        case SANDBOX_STOPPED:
                return "sandbox.stopped";
        case SANDBOX_PAUSED:
                return "sandbox.paused";
        case SANDBOX_FAILED:
                return "sandbox.failed";
        case SANDBOX_LOST:
                return "sandbox.lost";
        case SANDBOX_RUNNING:
                return b->state == SANDBOX_PAUSED || b->state == SANDBOX_RESUMING ? "sandbox.woken"
                       : b->state == SANDBOX_STARTING                            ? "sandbox.started"
                                                                                 : "sandbox.restarted";
        default:
                return NULL;
        }
}

void events_sandbox_change(Events *ev, const SandboxFacts *before, const SandboxRow *after, const char *key_id,
                           const char *why) {
        const char *type = change_type(before, after);
        if (!ev || !type)
                return;
        json_t *data = json_pack("{s:s,s:s}", "state", sandbox_state_name(after->state), "from",
                                 sandbox_state_name(before->state));
        const char *reason = why ? why : after->state == SANDBOX_FAILED || after->state == SANDBOX_LOST
                                                 ? after->failure_reason
                                                 : NULL;
        if (data && reason)
                json_object_set_new(data, "reason", json_string(reason));
        if (data && after->lease_ends_at)
                json_object_set_new(data, "leaseEndsAt", json_integer(after->lease_ends_at));
        events_emit(ev, after->owner, type, "sandbox", after->id, key_id, data);
}

int events_list(Events *ev, const EventFilter *f, StoreEventFn fn, void *userdata) {
        return ev->ops->list(ev->h, f, fn, userdata);
}

int events_prune(Events *ev, int64_t days, int64_t *ret_n) {
        return ev->ops->prune(ev->h, time_now_unix() - days * 86400, ret_n);
}
