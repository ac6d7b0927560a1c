/* The PostgreSQL backend's schema: one versioned history for every kind's
 * tables (the same tables and columns as the SQLite backend's; seq, a
 * serial, orders rows where SQLite's rowid does), run by the
 * first connection of a process, under an advisory lock held for the
 * transaction so that hosts starting at once on an empty or older database
 * take turns, and refused when a newer daemon wrote it. Steps are only ever
 * appended. */
#include <errno.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/macro.h"
#include "daemon/store/pgdb.h"
#include "daemon/store/store_volumes_sql.h"

static const char *const steps[] = {
        /* 1: the tables as the SQLite backend has them at its version of
         * 2026-12 (keys, sandboxes with their spec's and their own version,
         * uploads, idempotency, the ledger, snapshots, the egress state) */
        "CREATE TABLE keys ("
        "  id TEXT PRIMARY KEY, name TEXT NOT NULL, owner TEXT NOT NULL,"
        "  access TEXT NOT NULL CHECK (access IN ('full', 'read')), hash TEXT NOT NULL UNIQUE,"
        "  daily_limit_micros BIGINT, trial INTEGER NOT NULL DEFAULT 0,"
        "  created_at BIGINT NOT NULL, revoked_at BIGINT, seq BIGSERIAL);"
        "CREATE TABLE sandboxes ("
        "  id TEXT PRIMARY KEY, owner TEXT NOT NULL, key_id TEXT NOT NULL REFERENCES keys(id),"
        "  name TEXT, labels TEXT NOT NULL, spec TEXT NOT NULL, state TEXT NOT NULL, failure_reason TEXT,"
        "  created_at BIGINT NOT NULL, started_at BIGINT, stopped_at BIGINT, lease_ends_at BIGINT,"
        "  run_seconds BIGINT NOT NULL DEFAULT 0, deleted_at BIGINT,"
        "  run_as TEXT NOT NULL DEFAULT 'sandbox' CHECK (run_as IN ('sandbox', 'root')),"
        "  spec_version BIGINT NOT NULL DEFAULT 1, version BIGINT NOT NULL DEFAULT 1, seq BIGSERIAL);"
        "CREATE INDEX sandboxes_owner ON sandboxes (owner, created_at);"
        "CREATE INDEX sandboxes_live ON sandboxes (deleted_at, state);"
        "CREATE TABLE uploads ("
        "  id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, owner TEXT NOT NULL,"
        "  kind TEXT NOT NULL CHECK (kind IN ('file', 'archive')), path TEXT NOT NULL,"
        "  \"user\" TEXT NOT NULL CHECK (\"user\" IN ('default', 'sandbox', 'root')), mode BIGINT NOT NULL,"
        "  size BIGINT, sha256 BYTEA, chunk_bytes BIGINT NOT NULL, parts BIGINT NOT NULL,"
        "  created_at BIGINT NOT NULL, touched_at BIGINT NOT NULL);"
        "CREATE INDEX uploads_sandbox ON uploads (sandbox_id);"
        "CREATE TABLE upload_parts ("
        "  upload_id TEXT NOT NULL REFERENCES uploads(id) ON DELETE CASCADE, part BIGINT NOT NULL,"
        "  bytes BIGINT NOT NULL, PRIMARY KEY (upload_id, part));"
        "CREATE TABLE idempotency ("
        "  owner TEXT NOT NULL, key TEXT NOT NULL, hash TEXT NOT NULL, status INTEGER NOT NULL, body TEXT,"
        "  created_at BIGINT NOT NULL, seq BIGSERIAL, PRIMARY KEY (owner, key));"
        "CREATE INDEX idempotency_age ON idempotency (created_at);"
        "CREATE TABLE ledger ("
        "  id BIGSERIAL PRIMARY KEY, sandbox_id TEXT NOT NULL, key_id TEXT NOT NULL, owner TEXT NOT NULL,"
        "  started_at BIGINT NOT NULL, ended_at BIGINT NOT NULL, open INTEGER NOT NULL DEFAULT 1,"
        "  price_per_hour BIGINT NOT NULL CHECK (price_per_hour >= 0),"
        "  prior_seconds BIGINT NOT NULL DEFAULT 0 CHECK (prior_seconds >= 0),"
        "  seconds BIGINT NOT NULL DEFAULT 0 CHECK (seconds >= 0),"
        "  micros BIGINT NOT NULL DEFAULT 0 CHECK (micros >= 0), CHECK (ended_at >= started_at));"
        "CREATE INDEX ledger_key ON ledger (key_id, ended_at);"
        "CREATE INDEX ledger_owner ON ledger (owner, ended_at);"
        "CREATE INDEX ledger_sandbox ON ledger (sandbox_id);"
        "CREATE INDEX ledger_open ON ledger (open) WHERE open = 1;"
        "CREATE TABLE reservations ("
        "  sandbox_id TEXT PRIMARY KEY, key_id TEXT NOT NULL, owner TEXT NOT NULL,"
        "  amount_micros BIGINT NOT NULL CHECK (amount_micros >= 0), seconds BIGINT NOT NULL CHECK (seconds >= 0),"
        "  created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, settled_at BIGINT);"
        "CREATE INDEX reservations_key ON reservations (key_id, settled_at);"
        "CREATE TABLE snapshots ("
        "  id TEXT PRIMARY KEY, owner TEXT NOT NULL, key_id TEXT NOT NULL, sandbox_id TEXT NOT NULL, name TEXT,"
        "  labels TEXT NOT NULL, spec TEXT NOT NULL, mode TEXT NOT NULL, size_bytes BIGINT NOT NULL,"
        "  created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL DEFAULT 0, version BIGINT NOT NULL DEFAULT 1);"
        "CREATE INDEX snapshots_owner ON snapshots (owner, created_at, id);"
        "CREATE TABLE egress_secrets ("
        "  owner TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, hosts TEXT NOT NULL,"
        "  placeholder TEXT NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,"
        "  header TEXT, format TEXT, rules TEXT, version BIGINT NOT NULL DEFAULT 1, PRIMARY KEY (owner, name));"
        "CREATE TABLE egress_log ("
        "  id BIGSERIAL PRIMARY KEY, sandbox TEXT NOT NULL, at BIGINT NOT NULL, host TEXT NOT NULL,"
        "  port INTEGER NOT NULL, kind TEXT NOT NULL, allowed INTEGER NOT NULL, reason TEXT NOT NULL, addr TEXT,"
        "  bytes_out BIGINT NOT NULL, bytes_in BIGINT NOT NULL, intercepted INTEGER NOT NULL,"
        "  secrets_used INTEGER NOT NULL, rule TEXT, duration_ms BIGINT, end_reason TEXT, owner TEXT);"
        "CREATE INDEX egress_log_by_sandbox ON egress_log (sandbox, id);",
        /* 2: the hosts that registered themselves (store_hosts.h) */
        "CREATE TABLE hosts ("
        "  id TEXT PRIMARY KEY, url TEXT NOT NULL, drivers TEXT NOT NULL, version TEXT NOT NULL,"
        "  vcpu BIGINT NOT NULL, memory_mib BIGINT NOT NULL, epoch BIGINT NOT NULL,"
        "  started_at BIGINT NOT NULL, heartbeat_at BIGINT NOT NULL);",
        /* 3: the fleet: the host that runs a sandbox, claimed an
         * Idempotency-Key, opened a charge or keeps a snapshot; a host's standing and use;
         * the leases of the timed work done once for the fleet */
        "ALTER TABLE sandboxes ADD COLUMN host_id TEXT NOT NULL DEFAULT '';"
        "CREATE INDEX sandboxes_host ON sandboxes (host_id, state);"
        "ALTER TABLE idempotency ADD COLUMN host_id TEXT NOT NULL DEFAULT '';"
        "ALTER TABLE ledger ADD COLUMN host_id TEXT NOT NULL DEFAULT '';"
        "ALTER TABLE hosts ADD COLUMN state TEXT NOT NULL DEFAULT 'live'"
        "  CHECK (state IN ('live', 'draining', 'dead')),"
        "  ADD COLUMN used_vcpu BIGINT NOT NULL DEFAULT 0, ADD COLUMN used_memory_mib BIGINT NOT NULL DEFAULT 0,"
        "  ADD COLUMN sandboxes BIGINT NOT NULL DEFAULT 0, ADD COLUMN dead_at BIGINT;"
        "CREATE TABLE fleet_leases ("
        "  name TEXT PRIMARY KEY, holder TEXT NOT NULL, holder_epoch BIGINT NOT NULL,"
        "  epoch BIGINT NOT NULL, expires_at BIGINT NOT NULL);"
        "ALTER TABLE snapshots ADD COLUMN host_id TEXT NOT NULL DEFAULT '';",
        /* 4: the lifecycle events (store_events.h) */
        "CREATE TABLE events ("
        "  seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, type TEXT NOT NULL,"
        "  resource_type TEXT NOT NULL, resource_id TEXT NOT NULL, key_id TEXT, host_id TEXT NOT NULL,"
        "  data TEXT, at BIGINT NOT NULL);"
        "CREATE INDEX events_owner ON events (owner, seq);"
        "CREATE INDEX events_resource ON events (resource_id, seq);"
        "CREATE INDEX events_at ON events (at);",
        /* 5: webhooks and their deliveries (store_webhooks.h) */
        "CREATE TABLE webhooks ("
        "  id TEXT PRIMARY KEY, owner TEXT NOT NULL, url TEXT NOT NULL, events TEXT NOT NULL, description TEXT,"
        "  enabled INTEGER NOT NULL, secret TEXT NOT NULL, previous_secret TEXT,"
        "  previous_until BIGINT NOT NULL DEFAULT 0, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,"
        "  version BIGINT NOT NULL);"
        "CREATE INDEX webhooks_owner ON webhooks (owner, created_at);"
        "CREATE TABLE webhook_deliveries ("
        "  seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, webhook_id TEXT NOT NULL, owner TEXT NOT NULL,"
        "  event_id TEXT NOT NULL, event_type TEXT NOT NULL, body TEXT NOT NULL,"
        "  state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),"
        "  attempts INTEGER NOT NULL DEFAULT 0, next_at BIGINT NOT NULL DEFAULT 0,"
        "  response_status INTEGER NOT NULL DEFAULT 0, last_error TEXT, claimed_by TEXT,"
        "  claimed_until BIGINT NOT NULL DEFAULT 0, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL);"
        "CREATE INDEX webhook_deliveries_hook ON webhook_deliveries (webhook_id, seq);"
        "CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_at);"
        "CREATE INDEX webhook_deliveries_updated ON webhook_deliveries (updated_at);",
        /* 6: the audit trail (store_audit.h) */
        "CREATE TABLE audit ("
        "  seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, action TEXT NOT NULL,"
        "  key_id TEXT, method TEXT, path TEXT, sandbox_id TEXT, detail TEXT, status INTEGER NOT NULL DEFAULT 0,"
        "  client TEXT, request_id TEXT, host_id TEXT NOT NULL, at BIGINT NOT NULL);"
        "CREATE INDEX audit_owner ON audit (owner, seq);"
        "CREATE INDEX audit_at ON audit (at);",
        /* 7: the sandboxes' resource readings (store_samples.h) */
        "CREATE TABLE sandbox_samples ("
        "  seq BIGSERIAL PRIMARY KEY, sandbox_id TEXT NOT NULL, owner TEXT NOT NULL, at BIGINT NOT NULL,"
        "  interval_ms BIGINT NOT NULL, cpu_ns BIGINT NOT NULL, memory_bytes BIGINT NOT NULL,"
        "  disk_bytes BIGINT NOT NULL, net_in_bytes BIGINT NOT NULL, net_out_bytes BIGINT NOT NULL);"
        "CREATE INDEX sandbox_samples_sandbox ON sandbox_samples (sandbox_id, at);"
        "CREATE INDEX sandbox_samples_at ON sandbox_samples (at);"
        "CREATE INDEX sandbox_samples_owner ON sandbox_samples (owner, at);",
        /* 8: the API answers counted per key and hour (store_requests.h) */
        "CREATE TABLE request_counts ("
        "  owner TEXT NOT NULL, key_id TEXT NOT NULL, hour BIGINT NOT NULL, requests BIGINT NOT NULL,"
        "  client_errors BIGINT NOT NULL, server_errors BIGINT NOT NULL, PRIMARY KEY (owner, hour, key_id));"
        "CREATE INDEX request_counts_hour ON request_counts (hour);",
        /* 9: the owners' OpenTelemetry exports (store_otel.h) */
        "CREATE TABLE otel_exports ("
        "  id TEXT PRIMARY KEY, owner TEXT NOT NULL, endpoint TEXT NOT NULL, headers TEXT, signals TEXT NOT NULL,"
        "  enabled INTEGER NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,"
        "  events_after BIGINT NOT NULL, metrics_after BIGINT NOT NULL, next_at BIGINT NOT NULL, claimed_by TEXT,"
        "  claimed_until BIGINT NOT NULL, last_push_at BIGINT NOT NULL, last_status INTEGER NOT NULL,"
        "  last_error TEXT, sent_logs BIGINT NOT NULL, sent_points BIGINT NOT NULL, dropped BIGINT NOT NULL,"
        "  version BIGINT NOT NULL);"
        "CREATE INDEX otel_exports_owner ON otel_exports (owner, created_at);",
        /* 10: the audit trail of one sandbox (the dashboard's commands) */
        "CREATE INDEX audit_sandbox ON audit (sandbox_id, seq);",
        /* 11: whether a read key's requests are activity that keeps a
         * sandbox from its idle pause (store_keys.h); keys made before it
         * are not */
        "ALTER TABLE keys ADD COLUMN keeps_awake INTEGER NOT NULL DEFAULT 0 CHECK (keeps_awake IN (0, 1));",
        /* 12: the millisecond within a sandbox's created_at and started_at
         * second, so that sandboxes made within one second keep their
         * order; rows made before it read as whole seconds */
        "ALTER TABLE sandboxes ADD COLUMN created_msec INTEGER NOT NULL DEFAULT 0"
        "  CHECK (created_msec BETWEEN 0 AND 999);"
        "ALTER TABLE sandboxes ADD COLUMN started_msec INTEGER NOT NULL DEFAULT 0"
        "  CHECK (started_msec BETWEEN 0 AND 999);",
        /* 13: the file links' secrets and one-time uses (store_links.h) */
        "CREATE TABLE file_link_secrets ("
        "  sandbox_id TEXT PRIMARY KEY, owner TEXT NOT NULL, secret TEXT NOT NULL, rotated_at BIGINT NOT NULL);"
        "CREATE TABLE file_link_uses ("
        "  link_id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, expires_at BIGINT NOT NULL);"
        "CREATE INDEX file_link_uses_expiry ON file_link_uses (expires_at);",
        /* 14: the previews, the shared ports of sandboxes (store_previews.h) */
        "CREATE TABLE previews ("
        "  sandbox_id TEXT NOT NULL, port INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535), owner TEXT NOT NULL,"
        "  public INTEGER NOT NULL CHECK (public IN (0, 1)), secret TEXT NOT NULL, created_at BIGINT NOT NULL,"
        "  rotated_at BIGINT NOT NULL, expires_at BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (sandbox_id, port));",
        /* 15: the images users build and their tags (store_images.h) */
        "CREATE TABLE images ("
        "  id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, version BIGINT NOT NULL,"
        "  state TEXT NOT NULL, error TEXT, doc TEXT NOT NULL, created_at BIGINT NOT NULL,"
        "  finished_at BIGINT NOT NULL DEFAULT 0, host_id TEXT NOT NULL DEFAULT '',"
        "  UNIQUE (owner, name, version));"
        "CREATE INDEX images_owner ON images (owner, created_at, id);"
        "CREATE TABLE image_tags ("
        "  owner TEXT NOT NULL, name TEXT NOT NULL, tag TEXT NOT NULL, image_id TEXT NOT NULL,"
        "  PRIMARY KEY (owner, name, tag));"
        "CREATE INDEX image_tags_image ON image_tags (image_id);",
        /* 16: the volumes and their attachments to sandboxes (store_volumes.h) */
        VOLUMES_SQL_SCHEMA,
        /* 17: the sandboxes' sessions (store_sessions.h) */
        "CREATE TABLE sandbox_sessions ("
        "  id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, owner TEXT NOT NULL, token_hash TEXT NOT NULL UNIQUE,"
        "  key_hash TEXT NOT NULL, name TEXT NOT NULL DEFAULT '', origins TEXT NOT NULL DEFAULT '',"
        "  created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, revoked_at BIGINT NOT NULL DEFAULT 0);"
        "CREATE INDEX sandbox_sessions_sandbox ON sandbox_sessions (sandbox_id, created_at);",
        /* 18: the owners' registry credentials, the secret sealed (store_images.h) */
        "CREATE TABLE image_registries ("
        "  owner TEXT NOT NULL, registry TEXT NOT NULL, username TEXT NOT NULL, sealed TEXT NOT NULL,"
        "  updated_at BIGINT NOT NULL, PRIMARY KEY (owner, registry));",
        /* 19: the sites that may frame a preview, one a line (store_previews.h) */
        "ALTER TABLE previews ADD COLUMN embed_origins TEXT NOT NULL DEFAULT '';",
        /* 20: none (a number kept, never used: the steps after it were
         * numbered before it was known to be unneeded; it changes nothing) */
        "SELECT 1;",
        /* 21: the builds' per-step layers, each held by a snapshot (store_images.h) */
        "CREATE TABLE image_layers ("
        "  owner TEXT NOT NULL, key TEXT NOT NULL, snapshot_id TEXT NOT NULL, host_id TEXT NOT NULL,"
        "  size_bytes BIGINT NOT NULL, used_at BIGINT NOT NULL, PRIMARY KEY (owner, key));"
        "CREATE INDEX image_layers_used ON image_layers (owner, host_id, used_at, key);",
        /* 22: the volumes' backup policies and the backups' expiry
         * (store_volumes.h) */
        VOLUMES_SQL_SCHEDULES,
        /* 23: the volumes' cron schedules and keep counts (store_volumes.h) */
        VOLUMES_SQL_RULES,
        /* 24: a build layer's key is one host's, as its snapshot's files are
         * (store_images.h): two hosts of a fleet each keep their own */
        "ALTER TABLE image_layers DROP CONSTRAINT image_layers_pkey, ADD PRIMARY KEY (owner, host_id, key);",
};

#define KIND "postgres"

static int migrate(PGconn *pg) {
        PgConn c = { .pg = pg };
        int r;
        /* Every host takes the same lock: one migrates, the others wait and
         * find the schema done. Released with the transaction. */
        if ((r = pgdb_exec_locked(&c, "SELECT pg_advisory_xact_lock(7346921)", NULL)) < 0 ||
            (r = pgdb_exec_locked(&c, "CREATE TABLE IF NOT EXISTS store_versions ("
                                      " kind TEXT PRIMARY KEY, version BIGINT NOT NULL)",
                                  NULL)) < 0)
                return r;
        PgParams p = { 0 };
        pgp_text(&p, KIND);
        _cleanup_pgres_ PGresult *res = NULL;
        if ((r = pgdb_run_locked(&c, "SELECT version FROM store_versions WHERE kind = $1", &p, &res)) < 0)
                return r;
        int64_t version = PQntuples(res) > 0 ? pgi(res, 0, 0) : 0;
        if (version > (int64_t)ELEMENTSOF(steps))
                return -EPROTONOSUPPORT; /* a newer daemon wrote this database */
        for (size_t i = (size_t)version; i < ELEMENTSOF(steps); i++)
                if ((r = pgdb_exec_locked(&c, steps[i], NULL)) < 0)
                        return r;
        if (version == (int64_t)ELEMENTSOF(steps))
                return 0;
        PgParams q = { 0 };
        pgp_text(&q, KIND);
        pgp_int(&q, (int64_t)ELEMENTSOF(steps));
        return pgdb_exec_locked(&c,
                                "INSERT INTO store_versions (kind, version) VALUES ($1, $2) "
                                "ON CONFLICT (kind) DO UPDATE SET version = excluded.version",
                                &q);
}

int pgdb_schema(PGconn *pg) {
        PgConn c = { .pg = pg };
        int r = pgdb_exec_locked(&c, "BEGIN", NULL);
        if (r < 0)
                return r;
        if ((r = migrate(pg)) < 0 || (r = pgdb_exec_locked(&c, "COMMIT", NULL)) < 0) {
                (void)pgdb_exec_locked(&c, "ROLLBACK", NULL);
                if (r == -EPROTONOSUPPORT)
                        log_error(NULL, "the database's schema is of a newer runtimed than this one");
                return r;
        }
        return 0;
}
