/* The snapshot records of the SQLite backend, through its table
 * (store_sqlite.snapshots): round trip, owner scoping, transient records,
 * conditional updates, the per-owner limits (count and bytes), and the
 * migration of a database written before the versions were kept. On a real
 * SQLite file. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "daemon/store/store.h"
#include "daemon/store/store_snapshots.h"

typedef struct Fixture {
        char dir[64];
        char path[96];
        const StoreSnapshotOps *ops;
        StoreSnapshots *h;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        snprintf(f->dir, sizeof(f->dir), "/tmp/store-snapshots-test-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof(f->path), "%s/runtime.db", f->dir);
        f->ops = store_sqlite.snapshots;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        char cmd[128];
        if (f->h)
                f->ops->close(f->h);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
        if (system(cmd) != 0)
                return -1;
        free(f);
        return 0;
}

static void open_store(Fixture *f) {
        assert_non_null(f->ops);
        assert_int_equal(f->ops->open(f->path, &f->h), 0);
}

/* SQL run on the file directly, as an older daemon (or another tool) would. */
static void raw_sql(const char *path, const char *text) {
        sqlite3 *db = NULL;
        assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
        char *msg = NULL;
        int rc = sqlite3_exec(db, text, NULL, NULL, &msg);
        if (rc != SQLITE_OK)
                fail_msg("%s: %s", text, msg ? msg : "?");
        sqlite3_close(db);
}

#define ID_A "snp_aaaaaaaaaaaaaaaaaaaa"
#define ID_B "snp_bbbbbbbbbbbbbbbbbbbb"
#define ID_C "snp_cccccccccccccccccccc"
#define ID_T "snp_dddddddddddddddddddd"

static SnapshotRow row(const char *id, const char *owner, const char *spec, int64_t created_at) {
        SnapshotRow r = { .owner = (char *)owner,
                          .key_id = (char *)"key_1",
                          .sandbox_id = (char *)"sb_1",
                          .name = NULL,
                          .labels = (char *)"{}",
                          .spec = (char *)spec,
                          .size_bytes = 4096,
                          .created_at = created_at,
                          .expires_at = created_at + 100 };
        snprintf(r.id, sizeof r.id, "%s", id);
        snprintf(r.mode, sizeof r.mode, "disk");
        return r;
}

/* An insert's bound on the owner's bytes when the test is not about it. */
#define NO_BYTES_BOUND INT64_MAX

#define SPEC "{\"driver\":\"namespace\",\"image\":\"base\"}"
#define SPEC_TRANSIENT "{\"driver\":\"namespace\",\"image\":\"base\",\"transient\":true}"
#define SPEC_LAYER "{\"driver\":\"namespace\",\"image\":\"base\",\"layer\":true}"

/* How many snapshots owner keeps, as the store's usage says. */
static int64_t count_of(const StoreSnapshotOps *ops, StoreSnapshots *h, const char *owner) {
        StoreSnapshotUsage u = { .count = -1 };
        assert_int_equal(ops->usage(h, owner, &u), 0);
        return u.count;
}

static void test_store_backend_table(void **state) {
        (void)state;
        assert_ptr_equal(store_backend_for("/tmp/x.db"), &store_sqlite);
        assert_ptr_equal(store_sqlite.snapshots, &store_sqlite_snapshots);
}

static void test_round_trip(void **state) {
        Fixture *f = *state;
        open_store(f);
        SnapshotRow in = row(ID_A, "own_a", SPEC, 1000);
        in.name = (char *)"first";
        in.labels = (char *)"{\"team\":\"x\"}";
        snprintf(in.mode, sizeof in.mode, "memory");
        assert_int_equal(f->ops->insert(f->h, &in, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(f->ops->insert(f->h, &in, 10, NO_BYTES_BOUND), -EEXIST);

        SnapshotRow out;
        assert_int_equal(f->ops->get(f->h, "own_a", ID_A, &out), 0);
        assert_string_equal(out.id, ID_A);
        assert_string_equal(out.owner, "own_a");
        assert_string_equal(out.key_id, "key_1");
        assert_string_equal(out.sandbox_id, "sb_1");
        assert_string_equal(out.name, "first");
        assert_string_equal(out.labels, "{\"team\":\"x\"}");
        assert_string_equal(out.spec, SPEC);
        assert_string_equal(out.mode, "memory");
        assert_string_equal(out.state, "ready");
        assert_int_equal(out.size_bytes, 4096);
        assert_int_equal(out.created_at, 1000);
        assert_int_equal(out.expires_at, 1100);
        assert_int_equal(out.version, 1);
        store_snapshot_row_clear(&out);

        /* A second, then the listing: oldest first, after the cursor, by filter. */
        SnapshotRow b = row(ID_B, "own_a", SPEC, 2000);
        b.sandbox_id = (char *)"sb_2";
        assert_int_equal(f->ops->insert(f->h, &b, 10, NO_BYTES_BOUND), 0);
        SnapshotRow *list = NULL;
        size_t n = 0;
        StoreSnapshotFilter all = { .owner = "own_a", .limit = 10 };
        assert_int_equal(f->ops->list(f->h, &all, &list, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(list[0].id, ID_A);
        assert_string_equal(list[1].id, ID_B);
        assert_null(list[1].name);
        for (size_t i = 0; i < n; i++)
                store_snapshot_row_clear(&list[i]);
        free(list);
        StoreSnapshotFilter after = { .owner = "own_a", .cursor_at = 1000, .cursor_id = ID_A, .limit = 10 };
        assert_int_equal(f->ops->list(f->h, &after, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_B);
        store_snapshot_row_clear(&list[0]);
        free(list);
        StoreSnapshotFilter by_name = { .owner = "own_a", .name = "first", .limit = 10 };
        assert_int_equal(f->ops->list(f->h, &by_name, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_A);
        store_snapshot_row_clear(&list[0]);
        free(list);
        StoreSnapshotFilter by_source = { .owner = "own_a", .sandbox_id = "sb_2", .limit = 1 };
        assert_int_equal(f->ops->list(f->h, &by_source, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_B);
        store_snapshot_row_clear(&list[0]);
        free(list);

        /* An update: name cleared, labels and expiry replaced, version bumped. */
        StoreSnapshotChange c = { .set_name = true, .name = NULL, .labels = "{\"k\":\"v\"}", .expires_at = 5000 };
        assert_int_equal(f->ops->update(f->h, "own_a", ID_A, 1, &c, &out), 0);
        assert_null(out.name);
        assert_string_equal(out.labels, "{\"k\":\"v\"}");
        assert_int_equal(out.expires_at, 5000);
        assert_int_equal(out.version, 2);
        store_snapshot_row_clear(&out);
        /* Only the expiry: the rest is kept. */
        StoreSnapshotChange extend = { .expires_at = 6000 };
        assert_int_equal(f->ops->update(f->h, "own_a", ID_A, STORE_SNAPSHOT_ANY_VERSION, &extend, &out), 0);
        assert_string_equal(out.labels, "{\"k\":\"v\"}");
        assert_int_equal(out.expires_at, 6000);
        assert_int_equal(out.version, 3);
        store_snapshot_row_clear(&out);

        int64_t count = count_of(f->ops, f->h, "own_a");
        assert_int_equal(count, 2);
        assert_int_equal(f->ops->delete(f->h, "own_a", ID_A), 0);
        assert_int_equal(f->ops->delete(f->h, "own_a", ID_A), -ENOENT);
        assert_int_equal(f->ops->get(f->h, "own_a", ID_A, &out), -ENOENT);
        count = count_of(f->ops, f->h, "own_a");
        assert_int_equal(count, 1);
}

static void test_owner_scoping(void **state) {
        Fixture *f = *state;
        open_store(f);
        SnapshotRow a = row(ID_A, "own_a", SPEC, 1000);
        assert_int_equal(f->ops->insert(f->h, &a, 10, NO_BYTES_BOUND), 0);
        SnapshotRow out;
        assert_int_equal(f->ops->get(f->h, "own_b", ID_A, &out), -ENOENT);
        StoreSnapshotChange c = { .labels = "{\"x\":\"y\"}" };
        assert_int_equal(f->ops->update(f->h, "own_b", ID_A, STORE_SNAPSHOT_ANY_VERSION, &c, &out), -ENOENT);
        assert_int_equal(f->ops->update(f->h, "own_b", ID_A, 1, &c, &out), -ENOENT);
        assert_int_equal(f->ops->delete(f->h, "own_b", ID_A), -ENOENT);
        SnapshotRow *list = NULL;
        size_t n = 5;
        StoreSnapshotFilter other = { .owner = "own_b", .limit = 10 };
        assert_int_equal(f->ops->list(f->h, &other, &list, &n), 0);
        assert_int_equal(n, 0);
        free(list);
        int64_t count = count_of(f->ops, f->h, "own_b");
        assert_int_equal(count, 0);

        /* Untouched, and still its owner's. */
        assert_int_equal(f->ops->get(f->h, "own_a", ID_A, &out), 0);
        assert_string_equal(out.labels, "{}");
        assert_int_equal(out.version, 1);
        store_snapshot_row_clear(&out);
        /* The daemon's own upkeep reaches any owner's. */
        assert_int_equal(f->ops->get_any(f->h, ID_A, &out), 0);
        assert_string_equal(out.owner, "own_a");
        store_snapshot_row_clear(&out);
        assert_int_equal(f->ops->delete(f->h, NULL, ID_A), 0);
        assert_int_equal(f->ops->get_any(f->h, ID_A, &out), -ENOENT);
}

static void test_transient_hidden(void **state) {
        Fixture *f = *state;
        open_store(f);
        SnapshotRow kept = row(ID_A, "own_a", SPEC, 1000), fork = row(ID_T, "own_a", SPEC_TRANSIENT, 1500);
        assert_int_equal(f->ops->insert(f->h, &kept, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(f->ops->insert(f->h, &fork, 10, NO_BYTES_BOUND), 0);

        SnapshotRow out;
        assert_int_equal(f->ops->get(f->h, "own_a", ID_T, &out), -ENOENT);
        StoreSnapshotChange c = { .labels = "{\"x\":\"y\"}" };
        assert_int_equal(f->ops->update(f->h, "own_a", ID_T, STORE_SNAPSHOT_ANY_VERSION, &c, &out), -ENOENT);
        SnapshotRow *list = NULL;
        size_t n = 0;
        StoreSnapshotFilter all = { .owner = "own_a", .limit = 10 };
        assert_int_equal(f->ops->list(f->h, &all, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_A);
        store_snapshot_row_clear(&list[0]);
        free(list);

        /* Counted against the owner's limit, and seen by the upkeep. */
        int64_t count = count_of(f->ops, f->h, "own_a");
        assert_int_equal(count, 2);
        char(*ids)[SNAPSHOT_ID_LEN + 1] = NULL;
        assert_int_equal(f->ops->ids(f->h, STORE_SNAPSHOT_IDS_TRANSIENT, NULL, 0, SIZE_MAX, &ids, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(ids[0], ID_T);
        free(ids);
        assert_int_equal(f->ops->ids(f->h, STORE_SNAPSHOT_IDS_ALL, NULL, 0, SIZE_MAX, &ids, &n), 0);
        assert_int_equal(n, 2);
        free(ids);
        assert_int_equal(f->ops->get_any(f->h, ID_T, &out), 0);
        assert_string_equal(out.spec, SPEC_TRANSIENT);
        store_snapshot_row_clear(&out);
        /* Its owner (the fork) deletes it. */
        assert_int_equal(f->ops->delete(f->h, "own_a", ID_T), 0);
}

/* A build's layer: the daemon's own, hidden from its owner, outside the
 * owner's bounds (inserted past them), read back as a layer by the upkeep. */
static void test_layer_hidden(void **state) {
        Fixture *f = *state;
        open_store(f);
        SnapshotRow kept = row(ID_A, "own_a", SPEC, 1000), layer = row(ID_T, "own_a", SPEC_LAYER, 1500);
        layer.layer = true;
        assert_int_equal(f->ops->insert(f->h, &kept, 1, 4096), 0);
        assert_int_equal(f->ops->insert(f->h, &layer, 1, 4096), 0);
        StoreSnapshotUsage u;
        assert_int_equal(f->ops->usage(f->h, "own_a", &u), 0);
        assert_int_equal(u.count, 1);
        assert_int_equal(u.bytes, 4096);

        SnapshotRow out;
        assert_int_equal(f->ops->get(f->h, "own_a", ID_T, &out), -ENOENT);
        StoreSnapshotChange c = { .labels = "{\"x\":\"y\"}" };
        assert_int_equal(f->ops->update(f->h, "own_a", ID_T, STORE_SNAPSHOT_ANY_VERSION, &c, &out), -ENOENT);
        SnapshotRow *list = NULL;
        size_t n = 0;
        StoreSnapshotFilter all = { .owner = "own_a", .limit = 10 };
        assert_int_equal(f->ops->list(f->h, &all, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].id, ID_A);
        assert_false(list[0].layer);
        store_snapshot_row_clear(&list[0]);
        free(list);

        assert_int_equal(f->ops->get_any(f->h, ID_T, &out), 0);
        assert_true(out.layer);
        store_snapshot_row_clear(&out);
        assert_int_equal(f->ops->delete(f->h, "own_a", ID_T), 0);
}

static void test_expired_ids(void **state) {
        Fixture *f = *state;
        open_store(f);
        SnapshotRow a = row(ID_A, "own_a", SPEC, 1000), b = row(ID_B, "own_b", SPEC, 2000),
                    never = row(ID_C, "own_a", SPEC, 100);
        never.expires_at = 0;
        assert_int_equal(f->ops->insert(f->h, &a, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(f->ops->insert(f->h, &b, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(f->ops->insert(f->h, &never, 10, NO_BYTES_BOUND), 0);
        char(*ids)[SNAPSHOT_ID_LEN + 1] = NULL;
        size_t n = 0;
        assert_int_equal(f->ops->ids(f->h, STORE_SNAPSHOT_IDS_EXPIRED, NULL, 1100, 64, &ids, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(ids[0], ID_A);
        free(ids);
        assert_int_equal(f->ops->ids(f->h, STORE_SNAPSHOT_IDS_EXPIRED, NULL, 1000000, 1, &ids, &n), 0);
        assert_int_equal(n, 1);
        free(ids);
        assert_int_equal(f->ops->ids(f->h, STORE_SNAPSHOT_IDS_EXPIRED, NULL, 1000000, 64, &ids, &n), 0);
        assert_int_equal(n, 2);
        free(ids);
}

static void test_stale_update(void **state) {
        Fixture *f = *state;
        open_store(f);
        SnapshotRow a = row(ID_A, "own_a", SPEC, 1000);
        assert_int_equal(f->ops->insert(f->h, &a, 10, NO_BYTES_BOUND), 0);

        /* Two writers read version 1; the first wins, the second is stale. */
        SnapshotRow out;
        StoreSnapshotChange first = { .labels = "{\"by\":\"first\"}" }, second = { .labels = "{\"by\":\"second\"}" };
        assert_int_equal(f->ops->update(f->h, "own_a", ID_A, 1, &first, &out), 0);
        assert_int_equal(out.version, 2);
        store_snapshot_row_clear(&out);
        assert_int_equal(f->ops->update(f->h, "own_a", ID_A, 1, &second, &out), -ESTALE);

        /* Nothing changed. */
        assert_int_equal(f->ops->get(f->h, "own_a", ID_A, &out), 0);
        assert_string_equal(out.labels, "{\"by\":\"first\"}");
        assert_int_equal(out.version, 2);
        store_snapshot_row_clear(&out);

        /* The current version is accepted; a row that is gone is -ENOENT. */
        assert_int_equal(f->ops->update(f->h, "own_a", ID_A, 2, &second, &out), 0);
        assert_int_equal(out.version, 3);
        store_snapshot_row_clear(&out);
        assert_int_equal(f->ops->delete(f->h, "own_a", ID_A), 0);
        assert_int_equal(f->ops->update(f->h, "own_a", ID_A, 3, &second, &out), -ENOENT);
}

static void test_limit_per_owner(void **state) {
        Fixture *f = *state;
        open_store(f);
        SnapshotRow a = row(ID_A, "own_a", SPEC, 1000), t = row(ID_T, "own_a", SPEC_TRANSIENT, 1100),
                    b = row(ID_B, "own_a", SPEC, 1200), other = row(ID_C, "own_b", SPEC, 1300);
        assert_int_equal(f->ops->insert(f->h, &a, 2, NO_BYTES_BOUND), 0);
        assert_int_equal(f->ops->insert(f->h, &t, 2, NO_BYTES_BOUND), 0);
        assert_int_equal(f->ops->insert(f->h, &b, 2, NO_BYTES_BOUND), -EDQUOT);
        assert_int_equal(f->ops->insert(f->h, &other, 2, NO_BYTES_BOUND), 0);
        SnapshotRow out;
        assert_int_equal(f->ops->get(f->h, "own_a", ID_B, &out), -ENOENT);
        assert_int_equal(f->ops->delete(f->h, "own_a", ID_T), 0);
        assert_int_equal(f->ops->insert(f->h, &b, 2, NO_BYTES_BOUND), 0);
}

/* The bytes an owner keeps: their sum, transient ones included, and the
 * insert that would take them past the bound refused with nothing kept;
 * another owner's are their own, and a delete makes room again. */
static void test_bytes_per_owner(void **state) {
        Fixture *f = *state;
        open_store(f);
        StoreSnapshotUsage u = { .count = -1, .bytes = -1 };
        assert_int_equal(f->ops->usage(f->h, "own_a", &u), 0);
        assert_int_equal(u.count, 0);
        assert_int_equal(u.bytes, 0);
        SnapshotRow a = row(ID_A, "own_a", SPEC, 1000), t = row(ID_T, "own_a", SPEC_TRANSIENT, 1100),
                    b = row(ID_B, "own_a", SPEC, 1200), other = row(ID_C, "own_b", SPEC, 1300);
        a.size_bytes = 3000;
        t.size_bytes = 1000;
        b.size_bytes = 1001;
        other.size_bytes = 5000;
        assert_int_equal(f->ops->insert(f->h, &a, 10, 5000), 0);
        assert_int_equal(f->ops->insert(f->h, &t, 10, 5000), 0);
        assert_int_equal(f->ops->usage(f->h, "own_a", &u), 0);
        assert_int_equal(u.count, 2);
        assert_int_equal(u.bytes, 4000);
        /* 4000 + 1001 > 5000: refused, nothing inserted. */
        assert_int_equal(f->ops->insert(f->h, &b, 10, 5000), -EFBIG);
        SnapshotRow out;
        assert_int_equal(f->ops->get_any(f->h, ID_B, &out), -ENOENT);
        assert_int_equal(f->ops->usage(f->h, "own_a", &u), 0);
        assert_int_equal(u.count, 2);
        assert_int_equal(u.bytes, 4000);
        /* Exactly at the bound fits; another owner's bytes are not A's. */
        b.size_bytes = 1000;
        assert_int_equal(f->ops->insert(f->h, &other, 10, 5000), 0);
        assert_int_equal(f->ops->insert(f->h, &b, 10, 5000), 0);
        assert_int_equal(f->ops->usage(f->h, "own_a", &u), 0);
        assert_int_equal(u.bytes, 5000);
        assert_int_equal(f->ops->usage(f->h, "own_b", &u), 0);
        assert_int_equal(u.count, 1);
        assert_int_equal(u.bytes, 5000);
        assert_int_equal(f->ops->usage(f->h, "own_none", &u), 0);
        assert_int_equal(u.count, 0);
        assert_int_equal(u.bytes, 0);
        /* The count is checked first; a snapshot bigger than the whole
         * bound never fits, and no sum overflows near INT64_MAX. */
        SnapshotRow c = row("snp_eeeeeeeeeeeeeeeeeeee", "own_a", SPEC, 1400);
        c.size_bytes = 1;
        assert_int_equal(f->ops->insert(f->h, &c, 3, 5000), -EDQUOT);
        c.size_bytes = 6000;
        assert_int_equal(f->ops->insert(f->h, &c, 10, 5000), -EFBIG);
        c.size_bytes = INT64_MAX;
        assert_int_equal(f->ops->insert(f->h, &c, 10, INT64_MAX), -EFBIG);
        /* A delete makes room. */
        assert_int_equal(f->ops->delete(f->h, "own_a", ID_T), 0);
        c.size_bytes = 1000;
        assert_int_equal(f->ops->insert(f->h, &c, 10, 5000), 0);
        assert_int_equal(f->ops->usage(f->h, "own_a", &u), 0);
        assert_int_equal(u.count, 3);
        assert_int_equal(u.bytes, 5000);
}

/* The table as the daemon made it before the versions were kept (CREATE
 * TABLE IF NOT EXISTS on each start, no version column, no store_versions),
 * with a kept snapshot and a fork's transient one in it. */
static void test_migrate_unversioned_schema(void **state) {
        Fixture *f = *state;
        raw_sql(f->path,
                "CREATE TABLE IF NOT EXISTS snapshots (id TEXT PRIMARY KEY, owner TEXT NOT NULL,"
                " key_id TEXT NOT NULL, sandbox_id TEXT NOT NULL, name TEXT, labels TEXT NOT NULL,"
                " spec TEXT NOT NULL, mode TEXT NOT NULL, size_bytes INTEGER NOT NULL,"
                " created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL DEFAULT 0);"
                "CREATE INDEX IF NOT EXISTS snapshots_owner ON snapshots (owner, created_at, id);"
                "INSERT INTO snapshots VALUES ('" ID_A "', 'own_a', 'key_old', 'sb_old', 'old', '{\"a\":\"b\"}',"
                " '" SPEC "', 'disk', 8192, 100, 200);"
                "INSERT INTO snapshots VALUES ('" ID_T "', 'own_a', 'key_old', 'sb_old', NULL, '{}',"
                " '" SPEC_TRANSIENT "', 'disk', 1, 150, 0);");
        open_store(f);
        SnapshotRow out;
        assert_int_equal(f->ops->get(f->h, "own_a", ID_A, &out), 0);
        assert_string_equal(out.key_id, "key_old");
        assert_string_equal(out.sandbox_id, "sb_old");
        assert_string_equal(out.name, "old");
        assert_string_equal(out.labels, "{\"a\":\"b\"}");
        assert_int_equal(out.size_bytes, 8192);
        assert_int_equal(out.created_at, 100);
        assert_int_equal(out.expires_at, 200);
        assert_int_equal(out.version, 1);
        store_snapshot_row_clear(&out);
        assert_int_equal(f->ops->get(f->h, "own_a", ID_T, &out), -ENOENT);
        char(*ids)[SNAPSHOT_ID_LEN + 1] = NULL;
        size_t n = 0;
        assert_int_equal(f->ops->ids(f->h, STORE_SNAPSHOT_IDS_TRANSIENT, NULL, 0, SIZE_MAX, &ids, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(ids[0], ID_T);
        free(ids);

        /* The migrated record takes conditional updates. */
        StoreSnapshotChange c = { .set_name = true, .name = "renamed" };
        assert_int_equal(f->ops->update(f->h, "own_a", ID_A, 1, &c, &out), 0);
        assert_string_equal(out.name, "renamed");
        assert_int_equal(out.version, 2);
        store_snapshot_row_clear(&out);
        assert_int_equal(f->ops->update(f->h, "own_a", ID_A, 1, &c, &out), -ESTALE);

        /* Opened again: at its version, nothing run twice, nothing lost. */
        f->ops->close(f->h);
        f->h = NULL;
        open_store(f);
        assert_int_equal(f->ops->get(f->h, "own_a", ID_A, &out), 0);
        assert_string_equal(out.name, "renamed");
        assert_int_equal(out.version, 2);
        store_snapshot_row_clear(&out);
}

/* The other kinds' versions are their own: the egress tables at a version
 * of theirs do not stop the snapshots' migration. */
static void test_versions_per_kind(void **state) {
        Fixture *f = *state;
        raw_sql(f->path, "CREATE TABLE store_versions (kind TEXT PRIMARY KEY, version INTEGER NOT NULL);"
                         "INSERT INTO store_versions VALUES ('egress', 99);");
        open_store(f);
        SnapshotRow a = row(ID_A, "own_a", SPEC, 1000), out;
        assert_int_equal(f->ops->insert(f->h, &a, 10, NO_BYTES_BOUND), 0);
        assert_int_equal(f->ops->get(f->h, "own_a", ID_A, &out), 0);
        assert_int_equal(out.version, 1);
        store_snapshot_row_clear(&out);
}

static void test_refuses_newer_version(void **state) {
        Fixture *f = *state;
        open_store(f);
        f->ops->close(f->h);
        f->h = NULL;
        raw_sql(f->path, "UPDATE store_versions SET version = version + 1 WHERE kind = 'snapshots'");
        StoreSnapshots *h = NULL;
        assert_int_equal(f->ops->open(f->path, &h), -EPROTONOSUPPORT);
        assert_null(h);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_store_backend_table),
                cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
                cmocka_unit_test_setup_teardown(test_owner_scoping, setup, teardown),
                cmocka_unit_test_setup_teardown(test_transient_hidden, setup, teardown),
                cmocka_unit_test_setup_teardown(test_layer_hidden, setup, teardown),
                cmocka_unit_test_setup_teardown(test_expired_ids, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stale_update, setup, teardown),
                cmocka_unit_test_setup_teardown(test_limit_per_owner, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bytes_per_owner, setup, teardown),
                cmocka_unit_test_setup_teardown(test_migrate_unversioned_schema, setup, teardown),
                cmocka_unit_test_setup_teardown(test_versions_per_kind, setup, teardown),
                cmocka_unit_test_setup_teardown(test_refuses_newer_version, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
