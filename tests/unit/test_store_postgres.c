/* The PostgreSQL backend's tables through the store's interface, against a
 * real server: the schema and its version, the keys and the file links. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/model/auth.h"
#include "daemon/store/pgdb.h"
#include "daemon/store/store.h"
#include "daemon/store/store_hosts.h"
#include "daemon/store/store_keys.h"
#include "test_pg_harness.h"
#include "test_store_keys_contract.h"
#include "test_store_links_contract.h"
#include "test_store_previews_contract.h"
#include "test_store_sessions_contract.h"
#include "test_store_volumes_contract.h"
#include "test_store_images_contract.h"

static void test_schema_is_made_once_and_a_newer_one_refused(void **state) {
        char *url = pg_fresh("t_schema");
        PgConn a, b;
        assert_int_equal(pgdb_open(url, &a), 0);
        /* A second connection finds it done. */
        assert_int_equal(pgdb_open(url, &b), 0);
        PGresult *res = NULL;
        assert_int_equal(pgdb_run(&b, "SELECT version FROM store_versions WHERE kind = 'postgres'", NULL, &res), 0);
        assert_int_equal(PQntuples(res), 1);
        PQclear(res);
        /* A database a newer daemon migrated: refused, never guessed at. */
        assert_int_equal(pgdb_exec(&a, "UPDATE store_versions SET version = version + 1", NULL), 0);
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), -EPROTONOSUPPORT);
        pgdb_close(&a);
        pgdb_close(&b);
        free(url);
        assert_true(pgdb_is_url("postgresql://h/db"));
        assert_true(pgdb_is_url("postgres:///db"));
        assert_false(pgdb_is_url("/var/lib/runtime/runtime.db"));
        assert_ptr_equal(store_backend_for("postgresql:///x"), &store_postgres);
        assert_ptr_equal(store_backend_for("/x/runtime.db"), &store_sqlite);
}

static void test_errors_are_errnos(void **state) {
        char *url = pg_fresh("t_errors");
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), 0);
        assert_int_equal(pgdb_exec(&c, "INSERT INTO keys (id, name, owner, access, hash, created_at) "
                                       "VALUES ('k1', 'n', 'o', 'full', 'h', 1)", NULL), 0);
        assert_int_equal(pgdb_exec(&c, "INSERT INTO keys (id, name, owner, access, hash, created_at) "
                                       "VALUES ('k2', 'n', 'o', 'full', 'h', 1)", NULL), -EEXIST);
        assert_int_equal(pgdb_exec(&c, "INSERT INTO keys (id, name, owner, access, hash, created_at) "
                                       "VALUES ('k3', 'n', 'o', 'admin', 'h3', 1)", NULL), -EINVAL);
        assert_int_equal(pgdb_exec(&c, "SELECT * FROM no_such_table", NULL), -EIO);
        /* Parameters travel as text, never spliced into the statement. */
        PgParams p = { 0 };
        pgp_text(&p, "'); DROP TABLE keys; --");
        PGresult *res = NULL;
        assert_int_equal(pgdb_run(&c, "SELECT count(*) FROM keys WHERE owner = $1", &p, &res), 0);
        assert_string_equal(pgv(res, 0, 0), "0");
        PQclear(res);
        pgdb_close(&c);
        free(url);
}

static StoreKeyNew key(const char *id, const char *owner, const char *hash, bool full, bool trial) {
        return (StoreKeyNew){ .id = id, .name = id, .owner = owner, .hash = hash, .access = full ? KEY_ACCESS_FULL : KEY_ACCESS_READ,
                              .daily_limit_micros = -1, .trial = trial, .created_at = 100 };
}

static void test_keys(void **state) {
        char *url = pg_fresh("t_keys");
        const StoreKeyOps *ops = store_postgres.keys;
        StoreKeys *h;
        assert_int_equal(ops->open(url, &h), 0);
        int64_t n = -1;
        assert_int_equal(ops->count(h, &n), 0);
        assert_int_equal(n, 0);
        char secret[AUTH_KEY_LEN + 1], hash[AUTH_HASH_HEX_LEN + 1];
        assert_int_equal(auth_generate_key(secret), 0);
        assert_int_equal(auth_hash_key(secret, hash), 0);
        KeyRecord rec = { 0 };
        StoreKeyNew k = key("key_admin", "admin", hash, true, false);
        assert_int_equal(ops->insert(h, &k, 10, 10, &rec), 0);
        assert_string_equal(rec.id, "key_admin");
        assert_int_equal(rec.access, KEY_ACCESS_FULL);
        assert_int_equal(rec.daily_limit_micros, -1);
        store_key_record_clear(&rec);
        /* The same secret's hash twice: refused. */
        k = key("key_dup", "bob", hash, true, false);
        assert_int_equal(ops->insert(h, &k, 10, 10, &rec), -EEXIST);
        KeyInfo info;
        assert_int_equal(ops->by_hash(h, hash, &info), 0);
        assert_string_equal(info.owner, "admin");
        assert_int_equal(info.access, KEY_ACCESS_FULL);
        assert_int_equal(ops->by_hash(h, "0000000000000000000000000000000000000000000000000000000000000000", &info),
                         -ENOENT);
        /* An owner's bound and the trials' bound. */
        k = key("key_b1", "bob", "h_b1", false, false);
        assert_int_equal(ops->insert(h, &k, 1, 2, &rec), 0);
        store_key_record_clear(&rec);
        k = key("key_b2", "bob", "h_b2", true, false);
        assert_int_equal(ops->insert(h, &k, 1, 2, &rec), 0);
        store_key_record_clear(&rec);
        k = key("key_b3", "bob", "h_b3", true, false);
        assert_int_equal(ops->insert(h, &k, 1, 2, &rec), -EDQUOT);
        k = key("key_t1", "trial-1", "h_t1", true, true);
        assert_int_equal(ops->insert(h, &k, 1, 2, &rec), 0);
        store_key_record_clear(&rec);
        k = key("key_t2", "trial-2", "h_t2", true, true);
        assert_int_equal(ops->insert(h, &k, 1, 2, &rec), -EUSERS);
        /* A listing, newest first, one owner's or all. */
        KeyRecord *list = NULL;
        size_t len = 0;
        assert_int_equal(ops->list(h, "bob", 100, &list, &len), 0);
        assert_int_equal(len, 2);
        assert_string_equal(list[0].id, "key_b2");
        for (size_t i = 0; i < len; i++)
                store_key_record_clear(&list[i]);
        free(list);
        assert_int_equal(ops->list(h, NULL, 100, &list, &len), 0);
        assert_int_equal(len, 4);
        for (size_t i = 0; i < len; i++)
                store_key_record_clear(&list[i]);
        free(list);
        /* Revocation: another owner's is not found, the admin owner's last full key stays. */
        assert_int_equal(ops->revoke(h, "key_b1", "alice", NULL, 200), -ENOENT);
        assert_int_equal(ops->revoke(h, "key_b1", "bob", "admin", 200), 0);
        assert_int_equal(ops->revoke(h, "key_b1", "bob", "admin", 201), -ENOENT);
        assert_int_equal(ops->revoke(h, "key_admin", NULL, "admin", 200), -EBUSY);
        assert_int_equal(ops->count(h, &n), 0);
        assert_int_equal(n, 4);
        ops->close(h);
        free(url);
}

/* Whether a read key's requests keep a sandbox awake: stored with the key,
 * read back by the insert, a listing and authentication; off unless set;
 * the column takes 0 and 1 only. */
static void test_keys_keeps_awake(void **state) {
        char *url = pg_fresh("t_keys_awake");
        const StoreKeyOps *ops = store_postgres.keys;
        StoreKeys *h;
        assert_int_equal(ops->open(url, &h), 0);
        keys_keeps_awake_contract(ops, h, "carol");
        ops->close(h);
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), 0);
        assert_int_equal(pgdb_exec(&c, "UPDATE keys SET keeps_awake = 2 WHERE id = 'key_poll'", NULL), -EINVAL);
        pgdb_close(&c);
        free(url);
}

/* A database of the daemon before the setting (schema version 10, its keys
 * table without the column): opened by this one, its keys are kept and have
 * it off; new keys take it. */
static void test_keys_keeps_awake_after_an_upgrade(void **state) {
        char *url = pg_fresh("t_keys_upgrade");
        /* Hashes as authentication compares them: 64 hex digits. */
        char hash_old_read[AUTH_HASH_HEX_LEN + 1], hash_old_full[AUTH_HASH_HEX_LEN + 1],
                hash_new[AUTH_HASH_HEX_LEN + 1];
        assert_int_equal(auth_hash_key("rt_old_read", hash_old_read), 0);
        assert_int_equal(auth_hash_key("rt_old_full", hash_old_full), 0);
        assert_int_equal(auth_hash_key("rt_new", hash_new), 0);
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), 0);
        assert_int_equal(pgdb_exec(&c, "ALTER TABLE keys DROP COLUMN keeps_awake", NULL), 0);
        assert_int_equal(pgdb_exec(&c, "ALTER TABLE sandboxes DROP COLUMN created_msec, DROP COLUMN started_msec",
                                   NULL),
                         0);
        /* And what the steps after 10 made (13: the file links; 14: the
         * previews; 15: the images; 16: the volumes; 17: the sessions; 18: the registries' credentials; 21: the build layers). */
        assert_int_equal(pgdb_exec(&c, "DROP TABLE file_link_secrets, file_link_uses, previews, images, image_tags, "
                                       "sandbox_sessions, image_registries, image_layers, volumes, volume_attachments, volume_backups",
                                   NULL),
                         0);
        assert_int_equal(pgdb_exec(&c, "UPDATE store_versions SET version = 10 WHERE kind = 'postgres'", NULL), 0);
        PgParams p = { 0 };
        pgp_text(&p, hash_old_read);
        pgp_text(&p, hash_old_full);
        assert_int_equal(pgdb_exec(&c, "INSERT INTO keys (id, name, owner, access, hash, created_at) VALUES "
                                       "('key_old_read', 'dashboard', 'dave', 'read', $1, 1), "
                                       "('key_old_full', 'agent', 'dave', 'full', $2, 2)",
                                   &p),
                         0);
        pgdb_close(&c);

        const StoreKeyOps *ops = store_postgres.keys;
        StoreKeys *h;
        assert_int_equal(ops->open(url, &h), 0); /* the migration runs here */
        KeyInfo info;
        assert_int_equal(ops->by_hash(h, hash_old_read, &info), 0);
        assert_string_equal(info.id, "key_old_read");
        assert_int_equal(info.access, KEY_ACCESS_READ);
        assert_false(info.keeps_awake);
        assert_false(key_access_keeps_awake(info.access, info.keeps_awake));
        assert_int_equal(ops->by_hash(h, hash_old_full, &info), 0);
        assert_true(key_access_keeps_awake(info.access, info.keeps_awake));
        KeyRecord *list = NULL;
        size_t len = 0;
        assert_int_equal(ops->list(h, "dave", 100, &list, &len), 0);
        assert_int_equal(len, 2);
        for (size_t i = 0; i < len; i++) {
                assert_false(list[i].keeps_awake);
                store_key_record_clear(&list[i]);
        }
        free(list);
        KeyRecord rec = { 0 };
        StoreKeyNew k = key("key_new", "dave", hash_new, false, false);
        k.keeps_awake = true;
        assert_int_equal(ops->insert(h, &k, 0, 10, &rec), 0);
        assert_true(rec.keeps_awake);
        store_key_record_clear(&rec);
        ops->close(h);
        /* The version is the last step's again. */
        assert_int_equal(pgdb_open(url, &c), 0);
        PGresult *res = NULL;
        assert_int_equal(pgdb_run(&c, "SELECT version > 10 FROM store_versions WHERE kind = 'postgres'", NULL, &res),
                         0);
        assert_string_equal(pgv(res, 0, 0), "t");
        PQclear(res);
        pgdb_close(&c);
        free(url);
}

typedef struct Race {
        const char *url;
        int index;
        int result;
} Race;

static void *race_one(void *userdata) {
        Race *a = userdata;
        StoreKeys *h;
        a->result = store_postgres.keys->open(a->url, &h);
        if (a->result < 0)
                return NULL;
        char id[32], hash[32];
        snprintf(id, sizeof id, "key_r%d", a->index);
        snprintf(hash, sizeof hash, "h_r%d", a->index);
        StoreKeyNew k = key(id, "racer", hash, true, false);
        KeyRecord rec = { 0 };
        a->result = store_postgres.keys->insert(h, &k, 0, 5, &rec);
        store_key_record_clear(&rec);
        store_postgres.keys->close(h);
        return NULL;
}

/* Twelve connections (as many hosts) race for an owner's bound of 5:
 * exactly 5 win, by the serializable transactions, with no lock of this
 * process between them. */
static void test_keys_race_across_connections(void **state) {
        char *url = pg_fresh("t_race");
        StoreKeys *h;
        assert_int_equal(store_postgres.keys->open(url, &h), 0); /* the schema, before the race */
        Race races[12];
        pthread_t t[12];
        for (int i = 0; i < 12; i++) {
                races[i] = (Race){ .url = url, .index = i };
                assert_int_equal(pthread_create(&t[i], NULL, race_one, &races[i]), 0);
        }
        int won = 0;
        for (int i = 0; i < 12; i++) {
                pthread_join(t[i], NULL);
                if (races[i].result == 0)
                        won++;
                else
                        assert_int_equal(races[i].result, -EDQUOT);
        }
        assert_int_equal(won, 5);
        store_postgres.keys->close(h);
        free(url);
}

static StoreLinks *links_open_other(void *userdata) {
        StoreLinks *h = NULL;
        return store_postgres.links->open(userdata, &h) == 0 ? h : NULL;
}

/* The file links' contract, the one-time claims racing over connections of
 * their own as hosts do; a database of schema 12 gains the tables. */
static void test_links(void **state) {
        char *url = pg_fresh("t_links");
        const StoreLinkOps *ops = store_postgres.links;
        StoreLinks *h;
        assert_int_equal(ops->open(url, &h), 0);
        links_contract(ops, h, links_open_other, url);
        ops->close(h);
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), 0);
        assert_int_equal(pgdb_exec(&c, "DROP TABLE file_link_secrets; DROP TABLE file_link_uses; DROP TABLE previews; "
                                       "DROP TABLE images, image_tags, sandbox_sessions, image_registries, image_layers, volumes, volume_attachments, volume_backups; "
                                       "UPDATE store_versions SET version = 12 WHERE kind = 'postgres'", NULL), 0);
        pgdb_close(&c);
        assert_int_equal(ops->open(url, &h), 0);
        assert_int_equal(ops->use_once(h, "lnk_0000000000000009", "sbx_x", 10, 1), 0);
        ops->close(h);
        free(url);
}

/* The previews' contract; a database of schema 13 gains their table (and
 * the images' after it). */
static void test_previews(void **state) {
        char *url = pg_fresh("t_previews");
        const StorePreviewOps *ops = store_postgres.previews;
        StorePreviews *h;
        assert_int_equal(ops->open(url, &h), 0);
        previews_contract(ops, h);
        ops->close(h);
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), 0);
        assert_int_equal(pgdb_exec(&c, "DROP TABLE previews, images, image_tags, sandbox_sessions, image_registries, image_layers, volumes, volume_attachments, volume_backups; UPDATE store_versions SET version = 13 "
                                       "WHERE kind = 'postgres'",
                                   NULL),
                         0);
        pgdb_close(&c);
        assert_int_equal(ops->open(url, &h), 0);
        StorePreview none;
        assert_int_equal(ops->get(h, "sbx_x", 80, &none), -ENOENT);
        ops->close(h);
        free(url);
}

/* The sessions' contract (step 17); a database of schema 15 gains their
 * table (and the steps after 15 run again). */
static void test_sessions(void **state) {
        char *url = pg_fresh("t_sessions");
        const StoreSessionOps *ops = store_postgres.sessions;
        StoreSessions *h;
        assert_int_equal(ops->open(url, &h), 0);
        sessions_contract(ops, h);
        ops->close(h);
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), 0);
        assert_int_equal(pgdb_exec(&c, "DROP TABLE volumes, volume_attachments, volume_backups, sandbox_sessions, "
                                       "image_registries, image_layers; ALTER TABLE previews DROP COLUMN embed_origins; "
                                       "UPDATE store_versions SET version = 15 WHERE kind = 'postgres'",
                                   NULL),
                         0);
        pgdb_close(&c);
        assert_int_equal(ops->open(url, &h), 0);
        StoreSession none;
        assert_int_equal(ops->by_token(h, "hash-a", &none), -ENOENT);
        ops->close(h);
        free(url);
}

/* The volumes' contract (step 16); a database of schema 15 gains their
 * tables (and the steps after 15 run again). */
static void test_volumes(void **state) {
        char *url = pg_fresh("t_volumes");
        const StoreVolumeOps *ops = store_postgres.volumes;
        StoreVolumes *h;
        assert_int_equal(ops->open(url, &h), 0);
        volumes_contract(ops, h);
        ops->close(h);
        PgConn c;
        assert_int_equal(pgdb_open(url, &c), 0);
        assert_int_equal(pgdb_exec(&c, "DROP TABLE volumes, volume_attachments, volume_backups, sandbox_sessions, "
                                       "image_registries, image_layers; ALTER TABLE previews DROP COLUMN embed_origins; "
                                       "UPDATE store_versions SET version = 15 WHERE kind = 'postgres'",
                                   NULL),
                         0);
        pgdb_close(&c);
        assert_int_equal(ops->open(url, &h), 0);
        StoreVolume none;
        assert_int_equal(ops->get(h, "alice", "vol_2", &none), -ENOENT);
        ops->close(h);
        free(url);
}

/* The images' contract on a real server. */
static void test_images(void **state) {
        char *url = pg_fresh("t_images");
        const StoreImageOps *ops = store_postgres.images;
        StoreImages *h = NULL;
        assert_int_equal(ops->open(url, &h), 0);
        images_contract(ops, h);
        ops->close(h);
        free(url);
}

/* A fleet: the images' writes are the writer's at its epoch. Once the
 * epoch moved on (another registration of its id) or the host was
 * declared dead, a build's start, end, record, tags and delete are refused
 * and change nothing; the sweeper fails a dead host's builds, and only
 * while it is dead. */
static void test_images_fenced_by_the_epoch(void **state) {
        char *url = pg_fresh("t_images_fence");
        const StoreImageOps *ops = store_postgres.images;
        const StoreHostOps *hops = store_postgres.hosts;
        StoreImages *a = NULL, *b = NULL;
        StoreHosts *hosts = NULL;
        assert_int_equal(ops->open(url, &a), 0);
        assert_int_equal(ops->open(url, &b), 0);
        assert_int_equal(hops->open(url, &hosts), 0);
        HostRecord ra = { .url = "http://10.0.0.1:1", .drivers = "namespace", .version = "0" };
        HostRecord rb = { .url = "http://10.0.0.2:1", .drivers = "namespace", .version = "0" };
        snprintf(ra.id, sizeof ra.id, "host-a");
        snprintf(rb.id, sizeof rb.id, "host-b");
        int64_t ea = 0, eb = 0;
        assert_int_equal(hops->register_host(hosts, &ra, 100, &ea), 0);
        assert_int_equal(hops->register_host(hosts, &rb, 100, &eb), 0);
        assert_int_equal(ops->set_writer(a, "host-a", ea), 0);
        assert_int_equal(ops->set_writer(b, "host-b", eb), 0);

        ImageRow row = { .owner = "alice", .name = "app", .doc = "{}", .created_at = 100 };
        snprintf(row.state, sizeof row.state, "queued");
        snprintf(row.host_id, sizeof row.host_id, "host-a");
        snprintf(row.id, sizeof row.id, "%s", IMG(1));
        assert_int_equal(ops->insert(a, &row), 0);
        snprintf(row.id, sizeof row.id, "%s", IMG(2));
        assert_int_equal(ops->insert(a, &row), 0);
        assert_int_equal(ops->finish(a, IMG(1), "building", NULL, NULL, 0), 0);
        assert_int_equal(ops->finish(a, IMG(2), "ready", NULL, "{\"snapshot\":\"snp_1\"}", 101), 0);
        assert_int_equal(ops->tag(a, "alice", "app", "v1", IMG(2)), 0);

        /* Another runtimed registers host-a's id: the first's epoch is gone. */
        int64_t again = 0;
        assert_int_equal(hops->register_host(hosts, &ra, 110, &again), 0);
        assert_true(again > ea);
        assert_int_equal(ops->finish(a, IMG(1), "ready", NULL, "{\"snapshot\":\"snp_2\"}", 111), -EOWNERDEAD);
        assert_int_equal(ops->finish(a, IMG(1), "failed", "late", NULL, 111), -EOWNERDEAD);
        snprintf(row.id, sizeof row.id, "%s", IMG(3));
        assert_int_equal(ops->insert(a, &row), -EOWNERDEAD);
        assert_int_equal(ops->tag(a, "alice", "app", "v1", IMG(1)), -EOWNERDEAD);
        assert_int_equal(ops->delete(a, "alice", IMG(2)), -EOWNERDEAD);
        ImageRow got;
        assert_int_equal(ops->get(b, "alice", IMG(1), &got), 0);
        assert_string_equal(got.state, "building");
        assert_string_equal(got.doc, "{}");
        store_image_row_clear(&got);
        assert_int_equal(ops->get(b, NULL, IMG(3), &got), -ENOENT);
        char id[IMAGE_ID_LEN + 1];
        assert_int_equal(ops->resolve(b, "alice", "app", "v1", 0, id), 0);
        assert_string_equal(id, IMG(2));

        /* The sweeper fails host-a's build only once host-a is dead. */
        int64_t n = -1;
        assert_int_equal(ops->fail_dead_host(b, "host-a", "its host host-a stopped answering", 120, &n), 0);
        assert_int_equal(n, 0);
        assert_int_equal(hops->declare_dead(hosts, "host-a", again, 110, 130), 0);
        assert_int_equal(ops->fail_dead_host(b, "host-a", "its host host-a stopped answering", 130, &n), 0);
        assert_int_equal(n, 1);
        assert_int_equal(ops->get(b, "alice", IMG(1), &got), 0);
        assert_string_equal(got.state, "failed");
        assert_string_equal(got.error, "its host host-a stopped answering");
        store_image_row_clear(&got);
        /* A writer at the new epoch writes again; an end stays written. */
        assert_int_equal(hops->register_host(hosts, &ra, 140, &again), 0);
        assert_int_equal(ops->set_writer(a, "host-a", again), 0);
        assert_int_equal(ops->finish(a, IMG(1), "ready", NULL, "{}", 141), -ENOENT);
        assert_int_equal(ops->delete(a, "alice", IMG(2)), 0);
        ops->close(a);
        ops->close(b);
        hops->close(hosts);
        free(url);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_schema_is_made_once_and_a_newer_one_refused),
                cmocka_unit_test(test_errors_are_errnos),
                cmocka_unit_test(test_keys),
                cmocka_unit_test(test_keys_keeps_awake),
                cmocka_unit_test(test_keys_keeps_awake_after_an_upgrade),
                cmocka_unit_test(test_keys_race_across_connections),
                cmocka_unit_test(test_links),
                cmocka_unit_test(test_previews),
                cmocka_unit_test(test_images),
                cmocka_unit_test(test_images_fenced_by_the_epoch),
                cmocka_unit_test(test_sessions),
                cmocka_unit_test(test_volumes),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
