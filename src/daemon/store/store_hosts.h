#pragma once
/*
 * The hosts as a backend keeps them (store.h): one record per runtimed that
 * registered itself, by its host id. Registering again (a restart, or a
 * second runtimed given the same id) bumps the record's epoch; a heartbeat
 * names the epoch its host registered at, so that a host whose id was
 * registered since learns it is fenced instead of keeping the record alive.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/store/store.h"

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
        int (*register_host)(StoreHosts *h, const HostRecord *in, int64_t now, int64_t *ret_epoch);
        /* Sets id's heartbeat_at to now if its epoch is still `epoch`:
         * -ESTALE when it is not (the id was registered again since: this
         * host is fenced), -ENOENT for no such host. */
        int (*heartbeat)(StoreHosts *h, const char *id, int64_t epoch, int64_t now);
        /* Every host, by id: an array the caller clears record by record
         * and frees. */
        int (*list)(StoreHosts *h, HostRecord **ret, size_t *ret_n);
};

/* The SQLite backend's hosts (sqlite_hosts.c). */
extern const StoreHostOps store_sqlite_hosts;
/* The PostgreSQL backend's hosts (postgres_hosts.c). */
extern const StoreHostOps store_postgres_hosts;
