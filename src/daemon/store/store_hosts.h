#pragma once
/*
 * The hosts as a backend keeps them (store.h): one record per runtimed that
 * registered itself, by its host id. Registering again (a restart, or a
 * second runtimed given the same id) bumps the record's epoch; a heartbeat
 * names the epoch its host registered at, so that a host whose id was
 * registered since learns it is fenced instead of keeping the record alive.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/store/store.h"

/* A host's standing in the fleet. A draining host takes no new sandboxes
 * and keeps its own (and stays draining across its restarts, until
 * undrained); a dead one was declared so by the fleet's leader after its
 * heartbeat stopped, and writes nothing until it registers again. */
typedef enum HostState {
        HOST_LIVE = 0,
        HOST_DRAINING,
        HOST_DEAD,
} HostState;
const char *host_state_name(HostState s);
/* A stored name's state; an unknown one reads as dead (it writes nothing). */
HostState host_state_from_name(const char *s);

/* What a host has in use, sent with each heartbeat. */
typedef struct HostUse {
        int64_t vcpu;       /* of its sandboxes that hold processes */
        int64_t memory_mib;
        int64_t sandboxes;
} HostUse;

typedef struct HostRecord {
        char id[64];
        char *url;     /* where other hosts reach this one */
        char *drivers; /* the offered drivers' names, comma-separated */
        char *version; /* runtimed's */
        int64_t vcpu;
        int64_t memory_mib;
        int64_t epoch;        /* 1 at the first registration, bumped by each one after */
        int64_t started_at;   /* the last registration's time */
        int64_t heartbeat_at; /* the last heartbeat's (or registration's) time */
        HostState state;
        HostUse used;
        int64_t dead_at; /* when it was declared dead; 0: it is not */
} HostRecord;

/* Frees what a record holds (not the record) and zeroes it; NULL is fine. */
static inline void store_host_record_clear(HostRecord *h) {
        if (!h)
                return;
        free(h->url);
        free(h->drivers);
        free(h->version);
        *h = (HostRecord){ 0 };
}

typedef struct StoreHosts StoreHosts;

struct StoreHostOps {
        /* Opens the hosts at location, making or migrating their table;
         * -EPROTONOSUPPORT when a newer version wrote it. */
        int (*open)(const char *location, StoreHosts **ret);
        void (*close)(StoreHosts *h);
        /* Inserts or replaces the record of in->id (in's epoch, started_at
         * and heartbeat_at are not read: both times become now), its epoch
         * the stored one + 1 (1 for a new host), atomically: two hosts
         * registering one id at once get distinct epochs. */
        /* A dead host is live again; a draining one stays draining. */
        int (*register_host)(StoreHosts *h, const HostRecord *in, int64_t now, int64_t *ret_epoch);
        /* Sets id's heartbeat_at to now and its use if its epoch is still
         * `epoch` and it is not declared dead: -ESTALE when it is (the id
         * was registered again since, or the fleet gave it up: this host is
         * fenced), -ENOENT for no such host. */
        int (*heartbeat)(StoreHosts *h, const char *id, int64_t epoch, int64_t now, const HostUse *use);
        /* Declares id dead at now if it is still at epoch, not dead, and
         * its heartbeat is still heartbeat_at (what the caller saw as too
         * old): -ESTALE when any of that changed, and nothing is written. */
        int (*declare_dead)(StoreHosts *h, const char *id, int64_t epoch, int64_t heartbeat_at, int64_t now);
        /* Drains (true) or undrains a host that is not dead: -ENOENT for no
         * such host, -ESTALE for a dead one. */
        int (*set_draining)(StoreHosts *h, const char *id, bool draining);
        /* The lease `name` for holder (a host at holder_epoch) until now +
         * ttl_seconds: taken when free or expired, renewed when holder
         * holds it. Its epoch (in *ret_epoch) grows each time it changes
         * hands. -EBUSY while another holds it. */
        int (*lease)(StoreHosts *h, const char *name, const char *holder, int64_t holder_epoch, int64_t ttl_seconds,
                     int64_t now, int64_t *ret_epoch);
        /* Every host, by id: an array the caller clears record by record
         * and frees. */
        int (*list)(StoreHosts *h, HostRecord **ret, size_t *ret_n);
};

/* The SQLite backend's hosts (sqlite_hosts.c). */
extern const StoreHostOps store_sqlite_hosts;
/* The PostgreSQL backend's hosts (postgres_hosts.c). */
extern const StoreHostOps store_postgres_hosts;
