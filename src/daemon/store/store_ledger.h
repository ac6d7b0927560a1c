#pragma once
/*
 * The ledger as a backend keeps it (store.h): charges (one run interval of
 * a series, a sandbox or its paused disk, each naming its key and owner)
 * and reservations (a sandbox's worst case held against its key's budget,
 * naming its key and owner). Every write is one of the operations below,
 * each atomic on its own and reading what it changes inside itself; none is
 * conditional on what a caller read before, so no record carries a version.
 * What a charge costs is the caller's arithmetic (ledger.c), handed in
 * where a backend must price a closing interval.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"

/* A paused sandbox's disk is charged as a series of its own, "<id>:disk",
 * priced at the disk rate: every series prices its seconds at one rate.
 * Its seconds are not sandbox-seconds of a trial's allowance. */
#define LEDGER_DISK_SUFFIX ":disk"
#define LEDGER_ORPHAN_GRACE_SECONDS 600

/* What a key may spend: a rolling daily limit (-1: none) and, for a trial key,
 * a lifetime allowance of sandbox-seconds (-1: none). */
typedef struct LedgerBudget {
        int64_t daily_limit_micros;
        int64_t allowance_seconds;
} LedgerBudget;

/* A key's limits as the keys table has them. */
typedef struct StoreLedgerKey {
        int64_t daily_limit_micros; /* -1: none */
        bool trial;
} StoreLedgerKey;

/* What a key has used, as the store counts it. */
typedef struct StoreLedgerUse {
        int64_t settled_micros;    /* closed charges that ended after `since` */
        int64_t oldest_charge_end; /* the earliest end of such a charge of micros > 0; 0: none */
        int64_t settled_seconds;   /* every closed charge, disk series excepted */
        int64_t reserved_micros;   /* open reservations */
        int64_t reserved_seconds;
        int64_t reservations_end;  /* the earliest end of an open reservation; 0: none */
} StoreLedgerUse;

/* A sandbox's reservation: its worst case so far, not an increment. */
typedef struct StoreReservation {
        const char *sandbox_id;
        const char *key_id;
        const char *owner;
        int64_t amount_micros;
        int64_t seconds;
        int64_t expires_at;
} StoreReservation;

/* A charge as a listing hands it over; the strings live until the callback
 * returns. */
typedef struct StoreLedgerInterval {
        const char *sandbox_id;
        const char *key_id;
        const char *key_name; /* "" when the key is gone (an owner's listing only) */
        int64_t started_at;
        int64_t ended_at; /* the heartbeat while open */
        bool open;
        int64_t price_per_hour;
        int64_t prior_seconds; /* the series' seconds charged before it */
        int64_t seconds;       /* a closed charge's */
        int64_t micros;        /* a closed charge's */
        int64_t reservation_expires_at; /* its series' reservation's end; 0: none */
} StoreLedgerInterval;

/* Called per charge of a listing; a negative return stops it and is
 * returned. It must not call back into the store. */
typedef int (*StoreLedgerEach)(const StoreLedgerInterval *iv, void *userdata);
/* floor(per_hour * seconds / 3600): what a charge of a series costs. */
typedef uint64_t (*StoreLedgerCost)(uint64_t per_hour, int64_t seconds);

typedef struct StoreLedger StoreLedger;

struct StoreLedgerOps {
        /* Opens the ledger at location, making its tables when missing. */
        int (*open)(const char *location, StoreLedger **ret);
        void (*close)(StoreLedger *h);
        /* The host this handle writes for: charges it opens name it, and
         * heartbeat and settle_orphans touch only its own (with those that
         * name no host, written before hosts were kept). "" until set. */
        int (*set_host)(StoreLedger *h, const char *host_id);
        /* The epoch the host registered at (a fleet): from now on every
         * write (reserve, release, begin, settle, heartbeat, settle_orphans)
         * is made only while the host is still registered at it and not
         * declared dead, and is -EOWNERDEAD, changing nothing, otherwise. 0
         * (the default): no condition. A backend with one host ignores it. */
        int (*set_epoch)(StoreLedger *h, int64_t epoch);
        /* The limits of a key, revoked or not. -ENOENT when there is none. */
        int (*key_budget)(StoreLedger *h, const char *key_id, StoreLedgerKey *ret);
        /* Atomically: counts what res->key_id used (its charges ended after
         * since, every reservation but res->sandbox_id's own) into *ret_use
         * and, when settled + reserved + res's stay within budget (micros and
         * seconds, each limit -1 for none), sets the sandbox's reservation
         * to res, opening a settled one again; -EDQUOT changes nothing. */
        int (*reserve)(StoreLedger *h, const StoreReservation *res, const LedgerBudget *budget, int64_t since,
                       int64_t now, StoreLedgerUse *ret_use);
        /* Settles the sandbox's open reservation as of now (0 when none). */
        int (*release)(StoreLedger *h, const char *sandbox_id, int64_t now);
        /* Atomically: moves the end of its open reservation to lease_ends_at
         * and opens a charge at started_at, its prior seconds being those
         * of its series' closed charges. */
        int (*begin)(StoreLedger *h, const char *sandbox_id, const char *key_id, const char *owner,
                     int64_t started_at, uint64_t per_hour, int64_t lease_ends_at);
        /* Atomically: closes the series' open charges at end (at_heartbeat:
         * at their heartbeat, no later than end), priced by cost, and
         * settles its reservation. *ret_end is where the last one closed;
         * -ENOENT when none was open (the reservation settled all the same). */
        int (*settle)(StoreLedger *h, const char *sandbox_id, int64_t end, bool at_heartbeat, int64_t now,
                      StoreLedgerCost cost, int64_t *ret_end);
        /* Moves the heartbeat of the host's open charges forward to now:
         * another host's charges stop at its own last beat if it dies. */
        int (*heartbeat)(StoreLedger *h, int64_t now);
        /* Settles the reservations of the host's sandboxes that are not
         * starting or running, and those of no sandbox at all that are
         * older than LEDGER_ORPHAN_GRACE_SECONDS (a create that never got
         * its row; younger ones may be another host's create in flight). */
        int (*settle_orphans)(StoreLedger *h, int64_t now);
        /* What key_id used (see reserve), read in one snapshot. */
        int (*key_use)(StoreLedger *h, const char *key_id, int64_t since, StoreLedgerUse *ret);
        /* The owner's charges open or ended at or after since and started at
         * or before until, in the order they started. */
        int (*owner_intervals)(StoreLedger *h, const char *owner, int64_t since, int64_t until,
                               StoreLedgerEach each, void *userdata);
        /* Every charge of one series. */
        int (*sandbox_intervals)(StoreLedger *h, const char *sandbox_id, StoreLedgerEach each, void *userdata);
};

/* The SQLite backend's ledger (sqlite_ledger.c). */
extern const StoreLedgerOps store_sqlite_ledger;
/* The PostgreSQL backend's ledger (postgres_ledger.c). */
extern const StoreLedgerOps store_postgres_ledger;
