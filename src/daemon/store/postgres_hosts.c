/* The hosts in PostgreSQL (store_hosts.h): registering is one upsert, which
 * PostgreSQL makes atomic against another host's for the same id (the row
 * is locked, the second update sees the first's epoch); a heartbeat is one
 * conditional update. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_hosts.h"

struct StoreHosts {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_hosts_open(const char *location, StoreHosts **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_hosts_close(StoreHosts *h) {
        pgdb_handle_close(h);
}

static int pg_hosts_register(StoreHosts *h, const HostRecord *in, int64_t now, int64_t *ret_epoch) {
        PgParams p = { 0 };
        pgp_text(&p, in->id);
        pgp_text(&p, in->url ? in->url : "");
        pgp_text(&p, in->drivers ? in->drivers : "");
        pgp_text(&p, in->version ? in->version : "");
        pgp_int(&p, in->vcpu);
        pgp_int(&p, in->memory_mib);
        pgp_int(&p, now);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "INSERT INTO hosts (id, url, drivers, version, vcpu, memory_mib, epoch, started_at, "
                         "heartbeat_at) VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $7) "
                         "ON CONFLICT (id) DO UPDATE SET url = excluded.url, drivers = excluded.drivers, "
                         "version = excluded.version, vcpu = excluded.vcpu, memory_mib = excluded.memory_mib, "
                         "epoch = hosts.epoch + 1, started_at = excluded.started_at, "
                         "heartbeat_at = excluded.heartbeat_at, dead_at = NULL, "
                         "state = CASE hosts.state WHEN 'draining' THEN 'draining' ELSE 'live' END "
                         "RETURNING epoch",
                         &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) != 1)
                return -EIO;
        *ret_epoch = pgi(res, 0, 0);
        return 0;
}

static int pg_hosts_heartbeat(StoreHosts *h, const char *id, int64_t epoch, int64_t now, const HostUse *use) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_int(&p, epoch);
        pgp_int(&p, now);
        pgp_int(&p, use ? use->vcpu : 0);
        pgp_int(&p, use ? use->memory_mib : 0);
        pgp_int(&p, use ? use->sandboxes : 0);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "UPDATE hosts SET heartbeat_at = $3, used_vcpu = $4, used_memory_mib = $5, sandboxes = $6 "
                         "WHERE id = $1 AND epoch = $2 AND state <> 'dead' RETURNING 1",
                         &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) > 0)
                return 0;
        /* No live row of this epoch: a record of another epoch means a
         * later registration took the id, a dead one that the fleet gave
         * this host up. Records are never deleted, and epochs
         * only grow, so the answer cannot turn stale in between. */
        PgParams q = { 0 };
        pgp_text(&q, id);
        _cleanup_pgres_ PGresult *found = NULL;
        if ((r = pgdb_run(&h->c, "SELECT 1 FROM hosts WHERE id = $1", &q, &found)) < 0)
                return r;
        return PQntuples(found) > 0 ? -ESTALE : -ENOENT;
}

static int pg_hosts_list(StoreHosts *h, HostRecord **ret, size_t *ret_n) {
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT id, url, drivers, version, vcpu, memory_mib, epoch, started_at, heartbeat_at, "
                         "state, used_vcpu, used_memory_mib, sandboxes, dead_at FROM hosts ORDER BY id",
                         NULL, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        HostRecord *list = calloc(n > 0 ? (size_t)n : 1, sizeof(*list));
        if (!list)
                return -ENOMEM;
        for (int i = 0; i < n; i++) {
                HostRecord *rec = &list[i];
                snprintf(rec->id, sizeof rec->id, "%s", pgv(res, i, 0) ?: "");
                rec->url = strdup(pgv(res, i, 1) ?: "");
                rec->drivers = strdup(pgv(res, i, 2) ?: "");
                rec->version = strdup(pgv(res, i, 3) ?: "");
                rec->vcpu = pgi(res, i, 4);
                rec->memory_mib = pgi(res, i, 5);
                rec->epoch = pgi(res, i, 6);
                rec->started_at = pgi(res, i, 7);
                rec->heartbeat_at = pgi(res, i, 8);
                rec->state = host_state_from_name(pgv(res, i, 9));
                rec->used.vcpu = pgi(res, i, 10);
                rec->used.memory_mib = pgi(res, i, 11);
                rec->used.sandboxes = pgi(res, i, 12);
                rec->dead_at = pgi(res, i, 13);
                if (!rec->url || !rec->drivers || !rec->version) {
                        for (int j = 0; j <= i; j++)
                                store_host_record_clear(&list[j]);
                        free(list);
                        return -ENOMEM;
                }
        }
        *ret = list;
        *ret_n = (size_t)n;
        return 0;
}

static int64_t affected(const PGresult *res) {
        return strtoll(PQcmdTuples((PGresult *)res), NULL, 10);
}

static int pg_hosts_declare_dead(StoreHosts *h, const char *id, int64_t epoch, int64_t heartbeat_at, int64_t now) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_int(&p, epoch);
        pgp_int(&p, heartbeat_at);
        pgp_int(&p, now);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "UPDATE hosts SET state = 'dead', dead_at = $4 WHERE id = $1 AND epoch = $2 "
                         "AND heartbeat_at = $3 AND state <> 'dead'",
                         &p, &res);
        if (r < 0)
                return r;
        return affected(res) > 0 ? 0 : -ESTALE;
}

static int pg_hosts_set_draining(StoreHosts *h, const char *id, bool draining) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, draining ? "draining" : "live");
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "WITH u AS (UPDATE hosts SET state = $2 WHERE id = $1 AND state <> 'dead' RETURNING 1) "
                         "SELECT (SELECT count(*) FROM u), EXISTS (SELECT 1 FROM hosts WHERE id = $1)",
                         &p, &res);
        if (r < 0)
                return r;
        if (pgi(res, 0, 0) > 0)
                return 0;
        const char *found = pgv(res, 0, 1);
        return found && strcmp(found, "t") == 0 ? -ESTALE : -ENOENT;
}

static int pg_hosts_lease(StoreHosts *h, const char *name, const char *holder, int64_t holder_epoch,
                          int64_t ttl_seconds, int64_t now, int64_t *ret_epoch) {
        PgParams p = { 0 };
        pgp_text(&p, name);
        pgp_text(&p, holder);
        pgp_int(&p, holder_epoch);
        pgp_int(&p, now);
        pgp_int(&p, ttl_seconds);
        _cleanup_pgres_ PGresult *res = NULL;
        /* One statement, atomic against another host's: the conflicting
         * row is locked, and the second sees the first's holder. */
        int r = pgdb_run(&h->c,
                         "INSERT INTO fleet_leases (name, holder, holder_epoch, epoch, expires_at) "
                         "VALUES ($1, $2, $3, 1, $4::bigint + $5::bigint) ON CONFLICT (name) DO UPDATE SET "
                         "epoch = fleet_leases.epoch + CASE WHEN fleet_leases.holder = excluded.holder AND "
                         "fleet_leases.holder_epoch = excluded.holder_epoch THEN 0 ELSE 1 END, "
                         "holder = excluded.holder, holder_epoch = excluded.holder_epoch, "
                         "expires_at = excluded.expires_at "
                         "WHERE fleet_leases.expires_at < $4 OR (fleet_leases.holder = excluded.holder AND "
                         "fleet_leases.holder_epoch = excluded.holder_epoch) RETURNING epoch",
                         &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -EBUSY;
        *ret_epoch = pgi(res, 0, 0);
        return 0;
}

const StoreHostOps store_postgres_hosts = {
        .declare_dead = pg_hosts_declare_dead,
        .set_draining = pg_hosts_set_draining,
        .lease = pg_hosts_lease,
        .open = pg_hosts_open,
        .close = pg_hosts_close,
        .register_host = pg_hosts_register,
        .heartbeat = pg_hosts_heartbeat,
        .list = pg_hosts_list,
};
