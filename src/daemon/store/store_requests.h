#pragma once
/*
 * The API answers counted per key and hour as a backend keeps them
 * (store.h): each host adds what it counted since its last write, the
 * store summing (an add is atomic on its own: hosts never read before they
 * write, so no record carries a version); read back per hour and key from
 * a time on, and pruned by age.
 */
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"

typedef struct RequestCount {
        const char *owner;
        const char *key_id;
        int64_t hour;          /* unix seconds of the hour's start */
        int64_t requests;      /* answers */
        int64_t client_errors; /* of them 4xx */
        int64_t server_errors; /* of them 5xx */
} RequestCount;

/* Called per (hour, key) of a listing, by hour then key; the strings live
 * until it returns. A negative return stops it and is returned. */
typedef int (*StoreRequestFn)(void *userdata, const RequestCount *c);

typedef struct StoreRequests StoreRequests;

struct StoreRequestOps {
        int (*open)(const char *location, StoreRequests **ret);
        void (*close)(StoreRequests *h);
        /* Adds n counts (each to its owner, key and hour's) in one write. */
        /* The host whose writes these are, at the epoch it registered at
         * (a fleet): each write from now on is made only while the host is
         * still registered at it and not declared dead, and is -EOWNERDEAD
         * (or, for a claim, claims nothing), changing nothing, otherwise.
         * Epoch 0: no condition. A backend with one host ignores it. */
        int (*set_writer)(StoreRequests *h, const char *host_id, int64_t epoch);
        int (*add)(StoreRequests *h, const RequestCount *c, size_t n);
        /* The owner's counts of the hours from `since` on. */
        int (*list)(StoreRequests *h, const char *owner, int64_t since, StoreRequestFn fn, void *userdata);
        /* Drops the hours before `before` (unix seconds); how many went. */
        int (*prune)(StoreRequests *h, int64_t before, int64_t *ret_n);
};

extern const StoreRequestOps store_sqlite_requests;
extern const StoreRequestOps store_postgres_requests;
