#pragma once
/*
 * The ledger: what sandboxes cost, in the store's ledger (store/store_ledger.h)
 * on a handle of its own.
 *
 * - A charge is one run interval of a sandbox (started, ended, seconds,
 *   micros). While it runs the interval is open and its `ended_at` is a
 *   heartbeat the daemon moves forward every LEDGER_HEARTBEAT_SECONDS; after
 *   a crash the interval is closed at its last heartbeat, so a sandbox is
 *   billed at most that long short of the daemon's death, never twice.
 * - Micros are exact on totals: the charge of an interval is
 *   floor(p * (P + s) / 3600) - floor(p * P / 3600), with p the price per
 *   hour, P the sandbox's seconds billed before it and s its own, so that the
 *   charges of a sandbox always add up to floor(p * seconds / 3600).
 * - A reservation holds a sandbox's worst case (its whole lease, priced as
 *   busy) against its key's daily limit and trial allowance until it settles
 *   at stop, delete or failure. The check and the insert are one atomic
 *   operation of the store, so concurrent creates never overshoot, also
 *   across processes sharing it.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"
#include "daemon/store/store_ledger.h"

#define LEDGER_HEARTBEAT_SECONDS 2
#define LEDGER_WINDOW_SECONDS 86400

typedef struct Ledger Ledger;

/* Opens the ledger of backend b at location. */
int ledger_open(const StoreBackend *b, const char *location, Ledger **ret);
void ledger_close(Ledger *l);

/* floor(per_hour * seconds / 3600) and its ceiling, without overflow for any
 * price the daemon accepts. */
uint64_t ledger_cost(uint64_t per_hour, int64_t seconds);
uint64_t ledger_cost_ceil(uint64_t per_hour, int64_t seconds);

/* The budget of a key as the keys table has it (revoked or not: a sandbox
 * outlives its key's revocation until its lease ends). -ENOENT. */
int ledger_key_budget(Ledger *l, const char *key_id, int64_t trial_allowance_seconds, LedgerBudget *ret);

/* Why a reservation was refused, for the 402 message. */
typedef struct LedgerRefusal {
        bool allowance;          /* the trial allowance, not the daily limit */
        int64_t limit;           /* micros, or seconds when allowance */
        int64_t used;            /* settled charges in the window + open reservations (or seconds) */
        int64_t wanted;          /* what this request would add */
        int64_t frees_at;        /* unix time when the oldest charge leaves the window; 0: none */
        int64_t reservations_end; /* the earliest end of an open reservation; 0: none */
} LedgerRefusal;

/* Sets the sandbox's reservation to `amount` micros and `seconds` of lease
 * (the whole worst case of its life so far, not an increment), ending at
 * expires_at, if the key's budget holds it. A settled reservation (a
 * sandbox paused or stopped) is opened again, for what its next lease may
 * cost beyond the charges already settled. -EDQUOT with *ret_refusal when it
 * does not; the reservation is then unchanged. */
int ledger_reserve(Ledger *l, const char *key_id, const char *owner, const char *sandbox_id,
                   const LedgerBudget *budget, int64_t amount, int64_t seconds, int64_t expires_at, int64_t now,
                   LedgerRefusal *ret_refusal);
/* Settles the sandbox's reservation without a charge (a create that failed
 * before it ran). */
int ledger_release(Ledger *l, const char *sandbox_id, int64_t now);

/* Opens the sandbox's run interval at started_at; its reservation now ends
 * with the lease. */
int ledger_begin(Ledger *l, const char *sandbox_id, const char *key_id, const char *owner, int64_t started_at,
                 uint64_t per_hour, int64_t lease_ends_at);
/* Closes its open interval at `end` and settles its reservation, in one
 * transaction. 0 also when nothing was open. */
int ledger_settle(Ledger *l, const char *sandbox_id, int64_t end, int64_t now);
/* After a crash: closes its open interval at the last heartbeat (at most
 * `cap`), settles the reservation; *ret_end is where the interval was closed
 * (-ENOENT when none was open). */
int ledger_settle_at_heartbeat(Ledger *l, const char *sandbox_id, int64_t cap, int64_t now, int64_t *ret_end);
/* The host this daemon is: its charges are its own (store_ledger.h). */
int ledger_set_host(Ledger *l, const char *host_id);
/* The epoch the host registered at: the ledger's writes are made only while
 * it is still registered at it and not declared dead (-EOWNERDEAD). */
int ledger_set_epoch(Ledger *l, int64_t epoch);
/* Moves the heartbeat of this host's open intervals to now. */
int ledger_heartbeat(Ledger *l, int64_t now);
/* Settles reservations of this host's sandboxes that are not starting or
 * running any more (left by a crash between two steps). */
int ledger_settle_orphans(Ledger *l, int64_t now);

typedef struct LedgerKeyUse {
        int64_t used_micros;     /* settled in the window + reserved */
        int64_t settled_micros;  /* settled in the window */
        int64_t reserved_micros; /* open reservations */
        int64_t used_seconds;    /* all time, settled + reserved (for the trial allowance) */
        int64_t frees_at;        /* see LedgerRefusal */
} LedgerKeyUse;

int ledger_key_use(Ledger *l, const char *key_id, int64_t now, LedgerKeyUse *ret);

/* A usage listing keeps at most this many sandboxes; the rest count in the
 * totals and their keys' sums only. */
#define LEDGER_USAGE_MAX_SANDBOXES 10000

/* A series' (a sandbox's, or its paused disk's) share of a usage window. */
typedef struct LedgerUsageSandbox {
        char *sandbox_id;
        char *key_id;   /* the key of its latest interval */
        int64_t seconds;
        int64_t micros;
        bool running;   /* its latest interval is still open */
} LedgerUsageSandbox;

/* A key's share of a usage window. */
typedef struct LedgerUsageKey {
        char *key_id;
        char *name;     /* "" when the key is gone from the keys table */
        int64_t seconds;
        int64_t micros;
} LedgerUsageKey;

/* Both lists are in the order of each one's first interval in the window. */
typedef struct LedgerUsage {
        int64_t total_seconds;
        int64_t total_micros;
        LedgerUsageSandbox *sandboxes;
        size_t n_sandboxes;
        LedgerUsageKey *keys;
        size_t n_keys;
        bool truncated; /* more than LEDGER_USAGE_MAX_SANDBOXES sandboxes */
} LedgerUsage;

/* Usage of an owner's sandboxes in [since, until): charges prorated to the
 * second, per sandbox and per key; open intervals count up to now (and no
 * further than their reservation). Free it with ledger_usage_done. */
int ledger_usage(Ledger *l, const char *owner, int64_t since, int64_t until, int64_t now, LedgerUsage *ret);
/* Frees what a usage holds (not the struct); a zeroed one is fine. */
void ledger_usage_done(LedgerUsage *u);
/* An export's rows: the owner's settled (closed) charges, one row each, in
 * the order of their end, their series and their start. */
#define LEDGER_EXPORT_MAX_ROWS 1000
#define LEDGER_SERIES_MAX 48 /* a series' id: a sandbox's, or "<id>:disk" */

typedef struct LedgerExportPlace {
        int64_t ended_at;
        char series[LEDGER_SERIES_MAX];
        int64_t started_at;
} LedgerExportPlace;

/* A row of an export: a settled charge's part in one UTC day. at.ended_at
 * is when the charge settled, at.started_at the part's start, ended_at its
 * end (the charge's end, or the midnight that cut it). */
typedef struct LedgerExportRow {
        LedgerExportPlace at;
        int64_t ended_at;
        char key_id[32];
        char key_name[128]; /* "" when the key is gone */
        int64_t seconds;
        int64_t micros;
        int64_t price_per_hour;
} LedgerExportRow;

/* One page of the owner's charges settled in [since, until) after `after`
 * (NULL: from the first), at most limit (1..LEDGER_EXPORT_MAX_ROWS) of them
 * into rows; *ret_more when more follow. *ret_final_through: no charge
 * that ends before it can still appear or change (now, or the earliest
 * heartbeat of an open charge, no later than until). */
int ledger_export(Ledger *l, const char *owner, int64_t since, int64_t until, const LedgerExportPlace *after,
                  size_t limit, int64_t now, LedgerExportRow *rows, size_t *ret_n, bool *ret_more,
                  int64_t *ret_final_through);

/* Seconds and micros billed to one sandbox so far (open interval up to now,
 * at most `cap` when cap > 0). */
int ledger_sandbox_total(Ledger *l, const char *sandbox_id, int64_t now, int64_t cap, int64_t *ret_seconds,
                         int64_t *ret_micros);
