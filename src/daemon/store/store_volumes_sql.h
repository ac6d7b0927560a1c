#pragma once
/*
 * The volumes' statements, written once for both backends: M is the
 * placeholder's mark, "?" for SQLite's ?N and "$" for PostgreSQL's $N.
 * Whole numbers in a SELECT list are cast, as PostgreSQL takes an untyped
 * parameter there for text.
 */

/* The tables: SQLite's first migration and PostgreSQL's step 16. */
#define VOLUMES_SQL_SCHEMA                                                                                     \
        "CREATE TABLE volumes ("                                                                               \
        "  id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL DEFAULT '',"                          \
        "  labels TEXT NOT NULL DEFAULT '{}', size_mib BIGINT NOT NULL CHECK (size_mib > 0),"                 \
        "  shared INTEGER NOT NULL CHECK (shared IN (0, 1)),"                                                 \
        "  state TEXT NOT NULL CHECK (state IN ('ready', 'resizing')), created_at BIGINT NOT NULL);"         \
        "CREATE INDEX volumes_owner ON volumes (owner, created_at, id);"                                      \
        "CREATE TABLE volume_attachments ("                                                                    \
        "  volume_id TEXT NOT NULL, sandbox_id TEXT NOT NULL, path TEXT NOT NULL,"                            \
        "  read_only INTEGER NOT NULL CHECK (read_only IN (0, 1)),"                                           \
        "  exclusive INTEGER NOT NULL CHECK (exclusive IN (0, 1)), created_at BIGINT NOT NULL,"               \
        "  PRIMARY KEY (volume_id, sandbox_id));"                                                              \
        "CREATE UNIQUE INDEX volume_writer ON volume_attachments (volume_id) WHERE exclusive = 1;"            \
        "CREATE INDEX volume_attachments_sandbox ON volume_attachments (sandbox_id);"                        \
        "CREATE TABLE volume_backups ("                                                                        \
        "  id TEXT PRIMARY KEY, owner TEXT NOT NULL, volume_id TEXT NOT NULL, name TEXT NOT NULL DEFAULT '',"  \
        "  size_mib BIGINT NOT NULL CHECK (size_mib > 0), created_at BIGINT NOT NULL);"                       \
        "CREATE INDEX volume_backups_owner ON volume_backups (owner, created_at, id);"

/* The backup policies and the backups' expiry: SQLite's second migration
 * and PostgreSQL's step 22. */
#define VOLUMES_SQL_SCHEDULES                                                                                  \
        "ALTER TABLE volumes ADD COLUMN backup_every_minutes BIGINT NOT NULL DEFAULT 0;"                       \
        "ALTER TABLE volumes ADD COLUMN backup_retention_days BIGINT NOT NULL DEFAULT 0;"                      \
        "ALTER TABLE volumes ADD COLUMN backup_next_at BIGINT NOT NULL DEFAULT 0;"                             \
        "CREATE INDEX volumes_backup_due ON volumes (backup_next_at) WHERE backup_every_minutes > 0;"         \
        "ALTER TABLE volume_backups ADD COLUMN expires_at BIGINT NOT NULL DEFAULT 0;"                          \
        "CREATE INDEX volume_backups_expiry ON volume_backups (expires_at) WHERE expires_at > 0;"

/* Cron schedules and keep counts: SQLite's third migration and
 * PostgreSQL's step 23. */
#define VOLUMES_SQL_RULES                                                                                      \
        "ALTER TABLE volumes ADD COLUMN backup_cron TEXT NOT NULL DEFAULT '';"                                 \
        "ALTER TABLE volumes ADD COLUMN keep_last BIGINT NOT NULL DEFAULT 0;"                                  \
        "ALTER TABLE volumes ADD COLUMN keep_hourly BIGINT NOT NULL DEFAULT 0;"                                \
        "ALTER TABLE volumes ADD COLUMN keep_daily BIGINT NOT NULL DEFAULT 0;"                                 \
        "ALTER TABLE volumes ADD COLUMN keep_weekly BIGINT NOT NULL DEFAULT 0;"                                \
        "ALTER TABLE volumes ADD COLUMN keep_monthly BIGINT NOT NULL DEFAULT 0;"                               \
        "ALTER TABLE volumes ADD COLUMN keep_yearly BIGINT NOT NULL DEFAULT 0;"                                \
        "CREATE INDEX volumes_backup_cron_due ON volumes (backup_next_at) WHERE backup_cron <> '';"            \
        "ALTER TABLE volume_backups ADD COLUMN scheduled INTEGER NOT NULL DEFAULT 0 CHECK (scheduled IN (0, 1));"

#define VOLUME_COLUMNS "id, owner, name, labels, size_mib, shared, state, created_at"
/* What a read answers: the columns, then the policy's (8, 9, 10), its
 * cron (11) and its keep counts (12 to 17). */
#define VOLUME_READ_COLUMNS                                                                                    \
        VOLUME_COLUMNS ", backup_every_minutes, backup_retention_days, backup_next_at, backup_cron, "         \
                       "keep_last, keep_hourly, keep_daily, keep_weekly, keep_monthly, keep_yearly"
/* A schedule of either kind. */
#define VOLUME_SCHEDULED "(backup_every_minutes > 0 OR backup_cron <> '')"
#define VOLUME_ATTACHMENT_COLUMNS "volume_id, sandbox_id, path, read_only, created_at"

/* 1 id, 2 owner, 3 name, 4 labels, 5 size, 6 shared, 7 state, 8 created,
 * 9 the count bound, 10 the total bound. */
#define VOLUMES_SQL_INSERT(M)                                                                                  \
        "INSERT INTO volumes (" VOLUME_COLUMNS ") SELECT " M "1, " M "2, " M "3, " M "4, CAST(" M "5 AS BIGINT), " \
        "CAST(" M "6 AS INTEGER), " M "7, CAST(" M "8 AS BIGINT) "                                             \
        "WHERE (SELECT COUNT(*) FROM volumes WHERE owner = " M "2) < CAST(" M "9 AS BIGINT) "                 \
        "AND (SELECT COALESCE(SUM(size_mib), 0) FROM volumes WHERE owner = " M "2) + CAST(" M "5 AS BIGINT) " \
        "<= CAST(" M "10 AS BIGINT)"
/* 1 owner: how many volumes it has. */
#define VOLUMES_SQL_COUNT(M) "SELECT COUNT(*) FROM volumes WHERE owner = " M "1"
/* 1 owner, 2 id. */
#define VOLUMES_SQL_GET(M) "SELECT " VOLUME_READ_COLUMNS " FROM volumes WHERE owner = " M "1 AND id = " M "2"
/* 1 owner, 2 name ("" any), 3 after created, 4 after id ("" none), 5 limit. */
#define VOLUMES_SQL_LIST(M)                                                                                    \
        "SELECT " VOLUME_READ_COLUMNS " FROM volumes WHERE owner = " M "1 AND (" M "2 = '' OR name = " M "2) "     \
        "AND (" M "4 = '' OR created_at > CAST(" M "3 AS BIGINT) OR (created_at = CAST(" M "3 AS BIGINT) "    \
        "AND id > " M "4)) ORDER BY created_at, id LIMIT CAST(" M "5 AS BIGINT)"
/* 1 owner, 2 id, 3 new size, 4 the total bound. */
#define VOLUMES_SQL_RESIZE_BEGIN(M)                                                                            \
        "UPDATE volumes SET state = 'resizing' WHERE owner = " M "1 AND id = " M "2 AND state = 'ready' "     \
        "AND NOT EXISTS (SELECT 1 FROM volume_attachments WHERE volume_id = " M "2) "                         \
        "AND (SELECT COALESCE(SUM(size_mib), 0) FROM volumes WHERE owner = " M "1 AND id <> " M "2) "         \
        "+ CAST(" M "3 AS BIGINT) <= CAST(" M "4 AS BIGINT)"
/* 1 id, 2 size. */
#define VOLUMES_SQL_RESIZE_END(M)                                                                              \
        "UPDATE volumes SET state = 'ready', size_mib = CAST(" M "2 AS BIGINT) WHERE id = " M "1 "            \
        "AND state = 'resizing'"
/* 1 id: whether anything is attached. */
#define VOLUMES_SQL_ATTACHED(M) "SELECT COUNT(*) FROM volume_attachments WHERE volume_id = " M "1"
/* 1 owner, 2 id. */
#define VOLUMES_SQL_REMOVE(M)                                                                                  \
        "DELETE FROM volumes WHERE owner = " M "1 AND id = " M "2 "                                            \
        "AND NOT EXISTS (SELECT 1 FROM volume_attachments WHERE volume_id = " M "2)"
/* 1 owner, 2 id: a forced removal's attachments first. */
#define VOLUMES_SQL_DETACH_ALL(M)                                                                              \
        "DELETE FROM volume_attachments WHERE volume_id = " M "2 "                                             \
        "AND EXISTS (SELECT 1 FROM volumes WHERE owner = " M "1 AND id = " M "2)"
#define VOLUMES_SQL_REMOVE_FORCED(M) "DELETE FROM volumes WHERE owner = " M "1 AND id = " M "2"
/* 1 volume, 2 sandbox, 3 path, 4 read-only, 5 created, 6 owner. */
#define VOLUMES_SQL_ATTACH(M)                                                                                  \
        "INSERT INTO volume_attachments (volume_id, sandbox_id, path, read_only, exclusive, created_at) "      \
        "SELECT id, " M "2, " M "3, CAST(" M "4 AS INTEGER), "                                                 \
        "CASE WHEN shared = 0 AND CAST(" M "4 AS INTEGER) = 0 THEN 1 ELSE 0 END, CAST(" M "5 AS BIGINT) "     \
        "FROM volumes WHERE id = " M "1 AND owner = " M "6 AND state = 'ready'"
/* 1 volume, 2 sandbox. */
#define VOLUMES_SQL_DETACH(M) "DELETE FROM volume_attachments WHERE volume_id = " M "1 AND sandbox_id = " M "2"
/* 1 sandbox. */
#define VOLUMES_SQL_DETACH_SANDBOX(M) "DELETE FROM volume_attachments WHERE sandbox_id = " M "1"
/* 1 volume. */
#define VOLUMES_SQL_ATTACHMENTS(M)                                                                             \
        "SELECT " VOLUME_ATTACHMENT_COLUMNS " FROM volume_attachments WHERE volume_id = " M "1 "              \
        "ORDER BY created_at, sandbox_id"

#define VOLUME_BACKUP_COLUMNS "id, owner, volume_id, name, size_mib, created_at, expires_at, scheduled"
/* 1 id, 2 owner, 3 volume, 4 name, 5 size, 6 created, 7 the count bound,
 * 8 expires, 9 scheduled. */
#define VOLUMES_SQL_BACKUP_INSERT(M)                                                                           \
        "INSERT INTO volume_backups (" VOLUME_BACKUP_COLUMNS ") SELECT " M "1, " M "2, " M "3, " M "4, "     \
        "CAST(" M "5 AS BIGINT), CAST(" M "6 AS BIGINT), CAST(" M "8 AS BIGINT), CAST(" M "9 AS INTEGER) "                              \
        "WHERE (SELECT COUNT(*) FROM volume_backups WHERE owner = " M "2) < CAST(" M "7 AS BIGINT)"
/* 1 owner, 2 id. */
#define VOLUMES_SQL_BACKUP_GET(M)                                                                              \
        "SELECT " VOLUME_BACKUP_COLUMNS " FROM volume_backups WHERE owner = " M "1 AND id = " M "2"
/* 1 owner, 2 volume ("" any), 3 after created, 4 after id ("" none), 5 limit: newest first. */
#define VOLUMES_SQL_BACKUP_LIST(M)                                                                             \
        "SELECT " VOLUME_BACKUP_COLUMNS " FROM volume_backups WHERE owner = " M "1 "                          \
        "AND (" M "2 = '' OR volume_id = " M "2) AND (" M "4 = '' OR created_at < CAST(" M "3 AS BIGINT) "    \
        "OR (created_at = CAST(" M "3 AS BIGINT) AND id < " M "4)) ORDER BY created_at DESC, id DESC "         \
        "LIMIT CAST(" M "5 AS BIGINT)"
/* 1 owner, 2 id. */
#define VOLUMES_SQL_BACKUP_REMOVE(M) "DELETE FROM volume_backups WHERE owner = " M "1 AND id = " M "2"
/* 1 now, 2 limit. */
#define VOLUMES_SQL_BACKUPS_EXPIRED(M)                                                                         \
        "SELECT " VOLUME_BACKUP_COLUMNS " FROM volume_backups WHERE expires_at > 0 "                          \
        "AND expires_at <= CAST(" M "1 AS BIGINT) ORDER BY expires_at, id LIMIT CAST(" M "2 AS BIGINT)"
/* 1 owner, 2 id, 3 every, 4 retention, 5 next, 6 cron, 7 to 12 the keep
 * counts (last, hourly, daily, weekly, monthly, yearly). */
#define VOLUMES_SQL_SET_POLICY(M)                                                                              \
        "UPDATE volumes SET backup_every_minutes = CAST(" M "3 AS BIGINT), "                                  \
        "backup_retention_days = CAST(" M "4 AS BIGINT), backup_next_at = CAST(" M "5 AS BIGINT), "           \
        "backup_cron = " M "6, keep_last = CAST(" M "7 AS BIGINT), keep_hourly = CAST(" M "8 AS BIGINT), "    \
        "keep_daily = CAST(" M "9 AS BIGINT), keep_weekly = CAST(" M "10 AS BIGINT), "                        \
        "keep_monthly = CAST(" M "11 AS BIGINT), keep_yearly = CAST(" M "12 AS BIGINT) "                      \
        "WHERE owner = " M "1 AND id = " M "2"
/* 1 now, 2 limit. */
#define VOLUMES_SQL_BACKUPS_DUE(M)                                                                             \
        "SELECT " VOLUME_READ_COLUMNS " FROM volumes WHERE " VOLUME_SCHEDULED " "                          \
        "AND backup_next_at <= CAST(" M "1 AS BIGINT) ORDER BY backup_next_at, id LIMIT CAST(" M "2 AS BIGINT)"
/* 1 id, 2 the due time read, 3 the next one: the claim is the update of
 * the row still as it was read. */
#define VOLUMES_SQL_CLAIM_BACKUP(M)                                                                            \
        "UPDATE volumes SET backup_next_at = CAST(" M "3 AS BIGINT) WHERE id = " M "1 "                       \
        "AND " VOLUME_SCHEDULED " AND backup_next_at = CAST(" M "2 AS BIGINT)"
/* 1 after id ("" from the first), 2 limit. */
#define VOLUMES_SQL_KEPT_BY_COUNTS(M)                                                                          \
        "SELECT " VOLUME_READ_COLUMNS " FROM volumes WHERE (keep_last > 0 OR keep_hourly > 0 OR keep_daily > 0 " \
        "OR keep_weekly > 0 OR keep_monthly > 0 OR keep_yearly > 0) AND id > " M "1 ORDER BY id "               \
        "LIMIT CAST(" M "2 AS BIGINT)"
