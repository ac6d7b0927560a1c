#pragma once
/*
 * This host among the hosts that share a store (docs/fleet.md): its
 * registration with an epoch, the heartbeat that keeps it alive, the fence
 * it puts up when it cannot renew it, and the sweep of dead hosts that one
 * of the hosts (the holder of the "sweeper" lease) does for all.
 *
 * - Every beat renews this host's record with what it has in use. A beat
 *   refused because the fleet declared this host dead, or none that got
 *   through for the dead-after time less a beat, fences it: its sandboxes
 *   are stopped, the API answers 503, and it registers again (a new epoch)
 *   as soon as the store answers, marking its own rows that still claimed
 *   processes as lost. A beat refused because another runtimed registered
 *   this host's id since fences it for good: two daemons must not share one.
 * - The lease holder declares a host dead once its heartbeat is older than
 *   the dead-after time, conditionally on the record it read, and marks the
 *   dead host's sandboxes lost, billed up to its last heartbeat; every step
 *   is conditional and so idempotent: two holders for a moment do no harm.
 * With a single host (the SQLite store) the same code runs and finds no
 * other host to sweep.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/store/store_hosts.h"

/* Opaque here, so that the HTTP edge, which asks only whether this host is
 * fenced, includes nothing of the manager's sandboxes. */
typedef struct Db Db;
typedef struct Ledger Ledger;
typedef struct Manager Manager;
typedef struct Events Events;
typedef struct UserImages UserImages;

#define FLEET_DEAD_AFTER_DEFAULT_SECONDS 30
#define FLEET_DEAD_AFTER_MIN_SECONDS 3
#define FLEET_DEAD_AFTER_MAX_SECONDS 3600

typedef struct FleetConfig {
        const StoreHostOps *ops;
        StoreHosts *hosts;
        Db *db;
        Ledger *ledger; /* may be NULL */
        Manager *manager;
        /* This host: id, url, drivers, version, vcpu and memory_mib are read
         * (and copied). */
        const HostRecord *self;
        int64_t dead_after_seconds;
        Events *events;               /* may be NULL; pruned by the sweeper */
        struct SnapshotStore *snapshots; /* may be NULL; written at this host's epoch */
        struct Uploads *uploads;         /* may be NULL; written at this host's epoch */
        int64_t event_retention_days;
        struct Webhooks *webhooks;    /* may be NULL; its finished deliveries pruned with the events */
        struct Audit *audit;          /* may be NULL; host deaths recorded, pruned by the sweeper */
        int64_t audit_retention_days;
        struct Samples *samples;      /* may be NULL; pruned by the sweeper */
        int64_t sample_retention_days;
        struct RequestCounts *requests; /* may be NULL; pruned by the sweeper */
        struct FileLinks *links;        /* may be NULL; written at this host's epoch */
        struct Volumes *volumes;        /* may be NULL; written at this host's epoch */
        struct Previews *previews;      /* may be NULL; written at this host's epoch */
        struct Sessions *sessions;      /* may be NULL; written at this host's epoch */
} FleetConfig;

typedef struct Fleet Fleet;

/* Registers this host and makes every write of the store's sandboxes
 * conditional on its epoch; rows of before hosts become its own, and the
 * Idempotency-Key claims a previous run of it left pending go. Before
 * manager_recover. */
int fleet_join(const FleetConfig *c, Fleet **ret);
/* The images' records (opened after fleet_join): written at this host's
 * epoch from now on, and at each epoch it registers at later; the builds
 * a dead host left unfinished are failed by the sweeper. Before
 * fleet_start. */
int fleet_set_images(Fleet *f, UserImages *images);
/* The heartbeat and the sweep, on a thread of their own. */
int fleet_start(Fleet *f);
/* Stops the thread; the record stays (its heartbeat ages). */
void fleet_stop(Fleet *f);
void fleet_free(Fleet *f);

/* Whether this host is fenced now: it serves nothing that needs the store.
 * NULL: no fleet, never fenced. */
bool fleet_fenced(Fleet *f);
/* Whether no other host than this one is live, as of the last look: a
 * host alone never forwards. NULL: alone. */
bool fleet_alone(Fleet *f);
/* Whether this host's store is one no other host can share (SQLite): then
 * the view is always this host alone. NULL: single. */
bool fleet_single(Fleet *f);
/* Whether sandbox id runs on this host now: then no other host is asked
 * about it, whatever the view. */
bool fleet_runs_here(Fleet *f, const char *sandbox_id);
/* Whether this host is draining, as of its last look at the hosts. */
bool fleet_draining(Fleet *f);
/* Reads the hosts again now (after a drain, say) rather than at the next
 * beat. */
int fleet_refresh(Fleet *f);
/* Where host_id is reached (its advertised URL) as of the last look, in
 * buf: 0; -ENOENT for a host not seen; -EHOSTDOWN for one that is dead or
 * silent past the dead-after time. */
int fleet_host_url(Fleet *f, const char *host_id, char *buf, size_t n);
/* The hosts as of the last look: a copy the caller clears record by record
 * and frees (store_host_record_clear). */
int fleet_view(Fleet *f, HostRecord **ret, size_t *ret_n);
const char *fleet_host_id(const Fleet *f);
int64_t fleet_epoch(Fleet *f);
int64_t fleet_dead_after_seconds(const Fleet *f);
/* What a new sandbox needs of a host. */
typedef struct FleetNeed {
        const char *driver; /* a driver's name the host must offer */
        int64_t vcpu, memory_mib;
} FleetNeed;

/* Placement over a view of the hosts (pure, for tests): the index of a
 * host that is live (not draining, not dead, its heartbeat younger than
 * dead_after at now), offers the driver and has the memory free; of two
 * such drawn by `draw` (any random number), the one with more memory free,
 * so load spreads without every host piling onto the emptiest. -ENOSPC
 * when none has room. */
int fleet_choose(const HostRecord *view, size_t n, const FleetNeed *need, int64_t now, int64_t dead_after,
                 uint64_t draw, size_t *ret_index);
/* fleet_choose over this host's last look at the hosts: the chosen host's
 * id and URL; -ENOSPC when no host has room. */
int fleet_place(Fleet *f, const FleetNeed *need, char *ret_id, size_t id_len, char *ret_url, size_t url_len);

/* This host's figures and the fleet's as it last saw it, in the Prometheus
 * text format (GET /metrics, the admin key's). */
void fleet_metrics(Fleet *f, FILE *out);

/* How often a host beats for a dead-after time: six beats within it. */
int64_t fleet_beat_ms(int64_t dead_after_seconds);
