#pragma once
/* The lifecycle events (docs/api.md, "Events"): what happened to an owner's
 * sandboxes and snapshots, recorded in the store as it happens and listed
 * newest first. Recording never fails the act it records: an event the store
 * refuses is logged and counted, and the act goes on. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/model/sandbox_spec.h"
#include "daemon/store/store_events.h"

#define EVENTS_RETENTION_DAYS_DEFAULT 14
#define EVENTS_LIST_MAX 100

typedef struct Events Events;

int events_open(const StoreBackend *b, const char *location, Events **ret);
void events_close(Events *ev);
struct Webhooks;
/* Each event recorded is handed on to w's webhooks (webhooks.h). */
void events_set_webhooks(Events *ev, struct Webhooks *w);
/* The host the events are seen on. */
void events_set_host(Events *ev, const char *host_id);
/* The epoch this host registered at: the store's writes of events are made
 * only while the host is still registered at it and not declared dead
 * (-EOWNERDEAD otherwise). */
int events_set_epoch(Events *ev, const char *host_id, int64_t epoch);

/* Records one event; data (a JSON object, stolen, may be NULL). NULL ev:
 * nothing. */
void events_emit(Events *ev, const char *owner, const char *type, const char *resource_type,
                 const char *resource_id, const char *key_id, json_t *data);

/* The facts of a row an event is read from: taken before an act, compared
 * after it. */
typedef struct SandboxFacts {
        SandboxState state;
        int64_t started_at, lease_ends_at, deleted_at;
} SandboxFacts;
SandboxFacts sandbox_facts(const SandboxRow *r);
/* The event of a change of a sandbox from `before` to `after` (stopped,
 * paused, woken, started, restarted, extended, failed, lost, deleted), if
 * it is one; why (may be NULL) goes in its data. */
void events_sandbox_change(Events *ev, const SandboxFacts *before, const SandboxRow *after, const char *key_id,
                           const char *why);

int events_list(Events *ev, const EventFilter *f, StoreEventFn fn, void *userdata);
/* Drops what is older than days; how many went. */
int events_prune(Events *ev, int64_t days, int64_t *ret_n);
/* Whether an event of a kind that can come in floods (a key's spending
 * refusals, a sandbox's refused connections) may be recorded now for `who`:
 * at most one per `every_s` seconds per kind and who, as far as a small
 * table of recent ones tells (two that share a slot may pass more often). */
bool events_rate_ok(const char *kind, const char *who, int64_t every_s);
/* A key's key.spending_limit_reached: its daily limit (or a trial's
 * allowance), what is used and what was wanted, for sandbox_id (NULL: a new
 * one). */
void events_spending_reached(Events *ev, const char *owner, const char *key_id, bool trial, int64_t limit,
                             int64_t used, int64_t wanted, const char *sandbox_id);
/* Events the store refused since the start. */
uint64_t events_dropped(void);
