#pragma once
/*
 * The lifecycle events as a backend keeps them (store.h): append-only
 * records of what happened to an owner's sandboxes and snapshots, each with
 * the key that caused it (none for the daemon's own acts) and the host that
 * saw it, read newest first by a cursor that is the record's place in the
 * table, and pruned by age. Nothing is ever updated, so nothing carries a
 * version.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"

#define EVENT_ID_LEN 24 /* "evt_" and 20 hex digits */

typedef struct EventRecord {
        char id[EVENT_ID_LEN + 1];
        const char *owner;
        const char *type;          /* "sandbox.stopped", ... */
        const char *resource_type; /* "sandbox", "snapshot" */
        const char *resource_id;
        const char *key_id;  /* NULL or "": the daemon's own act */
        const char *host_id; /* "" when none */
        const char *data;    /* a JSON object's text, or NULL */
        int64_t at;
        int64_t seq; /* set by the store: its place, the cursor */
} EventRecord;

/* Which events a listing takes: of one owner (NULL: every owner's), of one
 * resource (NULL: any), of one type or, ending in '.', of a group of types
 * ("sandbox."; NULL: any), older than the cursor `before` (0: the newest). */
typedef struct EventFilter {
        const char *owner;
        const char *resource_id;
        const char *type;
        int64_t before;
        unsigned limit;
        /* Oldest first instead, from the event after the cursor `after` (0:
         * the first), at `until` or before (0: any time); `before` unused. */
        bool oldest_first;
        int64_t after, until;
} EventFilter;

/* Called per event of a listing, newest first; the record's strings live
 * until it returns. A negative return stops it and is returned. */
typedef int (*StoreEventFn)(void *userdata, const EventRecord *e);

typedef struct StoreEvents StoreEvents;

struct StoreEventOps {
        int (*open)(const char *location, StoreEvents **ret);
        void (*close)(StoreEvents *h);
        /* Appends e (its seq is the store's). -EEXIST for a taken id. */
        /* The host whose writes these are, at the epoch it registered at
         * (a fleet): each write from now on is made only while the host is
         * still registered at it and not declared dead, and is -EOWNERDEAD,
         * changing nothing, otherwise. Epoch 0: no condition. A backend with
         * one host ignores it. */
        int (*set_writer)(StoreEvents *h, const char *host_id, int64_t epoch);
        int (*append)(StoreEvents *h, const EventRecord *e);
        int (*list)(StoreEvents *h, const EventFilter *f, StoreEventFn fn, void *userdata);
        /* Drops the events older than `before` (unix seconds); how many went. */
        int (*prune)(StoreEvents *h, int64_t before, int64_t *ret_n);
};

extern const StoreEventOps store_sqlite_events;
extern const StoreEventOps store_postgres_events;
