/* The registry of uploads in parts, on a real SQLite file and staging
 * directory: what a restart takes back (the parts recorded, nothing more),
 * what it drops (a deleted sandbox's upload, a row without its file, a file
 * without its row, an idle one, one past a lowered bound, a part row that
 * cannot be), the bounds before and after, and a part that arrives for an
 * upload dropped meanwhile. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/timeutil.h"
#include "daemon/manager/db.h"
#include "daemon/store/sqldb.h"
#include "daemon/manager/uploads.h"

#define MIB (1024u * 1024u)

typedef struct Fixture {
        char dir[64];
        char db_path[96];
        Db *db;
        Uploads *u;
} Fixture;

static void sql(Fixture *f, const char *text) {
        sqlite3 *s = NULL;
        assert_int_equal(sqldb_open(f->db_path, &s), 0);
        assert_int_equal(sqldb_exec(s, text), 0);
        sqlite3_close(s);
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        snprintf(f->dir, sizeof(f->dir), "/tmp/uploads-test-XXXXXX");
        if (!f || !mkdtemp(f->dir))
                return -1;
        snprintf(f->db_path, sizeof(f->db_path), "%s/runtime.db", f->dir);
        if (db_open(&store_sqlite, f->db_path, &f->db) < 0 ||
            uploads_open(&store_sqlite, f->db_path, f->dir, &f->u) < 0)
                return -1;
        sql(f, "INSERT INTO keys (id, name, owner, access, hash, created_at) VALUES ('key_a', 'a', 'own_a', 'full', "
               "'11', 0);"
               "INSERT INTO sandboxes (id, owner, key_id, labels, spec, state, created_at) VALUES "
               "('sbx_a', 'own_a', 'key_a', '{}', '{}', 'running', 0), "
               "('sbx_b', 'own_a', 'key_a', '{}', '{}', 'running', 0);");
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        uploads_close(f->u);
        db_close(f->db);
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
        if (system(cmd) != 0)
                return -1;
        free(f);
        return 0;
}

/* Closes the registry and opens it again as a restarted daemon does, taking
 * the uploads ours says are its own. */
static void restart_ours(Fixture *f, uint64_t max_bytes, UploadsOurs ours, unsigned want_kept,
                         unsigned want_dropped) {
        uploads_close(f->u);
        f->u = NULL;
        assert_int_equal(uploads_open(&store_sqlite, f->db_path, f->dir, &f->u), 0);
        unsigned kept = 99, dropped = 99;
        assert_int_equal(uploads_restore(f->u, max_bytes, ours, NULL, &kept, &dropped), 0);
        assert_int_equal(kept, want_kept);
        assert_int_equal(dropped, want_dropped);
}

static void restart(Fixture *f, uint64_t max_bytes, unsigned want_kept, unsigned want_dropped) {
        restart_ours(f, max_bytes, NULL, want_kept, want_dropped);
}

static void begin_file(Fixture *f, const char *sandbox, uint64_t size, char id[UPLOAD_ID_LEN + 1]) {
        UploadSpec s = { .sandbox_id = sandbox, .owner = "own_a", .path = "/workspace/f", .mode = 0640,
                         .size = size, .user = REQ_AS_ROOT };
        memset(s.sha256, 0xab, 32);
        assert_int_equal(uploads_begin(f->u, &s, id), 0);
}

/* Writes part `index` through a shared ref as a part's request does. */
static int send_part(Fixture *f, const char *id, const char *sandbox, uint64_t index, uint64_t bytes) {
        UploadRef r;
        int rc = uploads_take(f->u, id, sandbox, "own_a", false, &r);
        if (rc < 0)
                return rc;
        char *buf = malloc(bytes);
        memset(buf, (int)('a' + index), bytes);
        assert_int_equal(pwrite(r.fd, buf, bytes, (off_t)(index * UPLOAD_CHUNK)), (ssize_t)bytes);
        free(buf);
        rc = uploads_part_arrived(f->u, &r, index, bytes);
        upload_ref_done(&r);
        return rc;
}

static bool staged(Fixture *f, const char *id) {
        char p[160];
        snprintf(p, sizeof(p), "%s/uploads/%s", f->dir, id);
        return access(p, F_OK) == 0;
}

static bool not_sbx_b(void *userdata, const char *sandbox_id) {
        return strcmp(sandbox_id, "sbx_b") != 0;
}

/* In a shared store, another host's uploads are neither taken nor dropped. */
static void test_another_hosts_uploads_are_left_alone(void **state) {
        Fixture *f = *state;
        char a[UPLOAD_ID_LEN + 1], b[UPLOAD_ID_LEN + 1];
        begin_file(f, "sbx_a", MIB, a);
        begin_file(f, "sbx_b", MIB, b);
        restart_ours(f, 8 * MIB, not_sbx_b, 1, 0);
        UploadRef r;
        assert_int_equal(uploads_take(f->u, b, "sbx_b", "own_a", true, &r), -ENOENT);
        /* Its row is still there: a restart that takes every upload finds it
         * (without the staging file this host never had, so it goes). */
        restart(f, 8 * MIB, 1, 1);
}

static void test_parts_survive_a_restart(void **state) {
        Fixture *f = *state;
        char id[UPLOAD_ID_LEN + 1];
        begin_file(f, "sbx_a", 3 * MIB + 5, id);
        assert_true(staged(f, id));
        assert_int_equal(send_part(f, id, "sbx_a", 0, MIB), 0);
        assert_int_equal(send_part(f, id, "sbx_a", 3, 5), 0);
        /* A part of the wrong place or length is never recorded. */
        UploadRef r;
        assert_int_equal(uploads_take(f->u, id, "sbx_a", "own_a", false, &r), 0);
        assert_int_equal(uploads_part_arrived(f->u, &r, 4, MIB), -EINVAL);
        upload_ref_done(&r);
        restart(f, 8 * MIB, 1, 0);
        /* Another sandbox or owner does not find it. */
        assert_int_equal(uploads_take(f->u, id, "sbx_b", "own_a", true, &r), -ENOENT);
        assert_int_equal(uploads_take(f->u, id, "sbx_a", "own_b", true, &r), -ENOENT);
        assert_int_equal(uploads_take(f->u, id, "sbx_a", "own_a", true, &r), 0);
        assert_false(r.archive);
        assert_int_equal(r.size, 3 * MIB + 5);
        assert_int_equal(r.parts, 4);
        assert_int_equal(r.mode, 0640);
        assert_int_equal(r.user, REQ_AS_ROOT);
        assert_string_equal(r.path, "/workspace/f");
        uint8_t sha[32];
        memset(sha, 0xab, 32);
        assert_memory_equal(r.sha256, sha, 32);
        uint8_t *got = NULL;
        assert_int_equal(uploads_received(f->u, &r, &got), 0);
        uint8_t want[4] = { 1, 0, 0, 2 };
        assert_memory_equal(got, want, 4);
        free(got);
        /* The bytes are where the part put them. */
        char c = 0;
        assert_int_equal(pread(r.fd, &c, 1, 3 * MIB), 1);
        assert_int_equal(c, 'd');
        /* One at a time for a commit. */
        UploadRef again;
        assert_int_equal(uploads_take(f->u, id, "sbx_a", "own_a", true, &again), -EBUSY);
        uploads_drop(f->u, &r);
        assert_false(staged(f, id));
        restart(f, 8 * MIB, 0, 0);
}

static void test_restart_drops_what_cannot_be_kept(void **state) {
        Fixture *f = *state;
        char deleted[UPLOAD_ID_LEN + 1], nofile[UPLOAD_ID_LEN + 1], idle[UPLOAD_ID_LEN + 1],
                big[UPLOAD_ID_LEN + 1], badpart[UPLOAD_ID_LEN + 1], fine[UPLOAD_ID_LEN + 1];
        begin_file(f, "sbx_b", 10, deleted);
        begin_file(f, "sbx_a", 10, nofile);
        begin_file(f, "sbx_a", 10, idle);
        begin_file(f, "sbx_a", 4 * MIB, big);
        begin_file(f, "sbx_a", 10, badpart);
        begin_file(f, "sbx_a", 2 * MIB, fine);
        assert_int_equal(send_part(f, fine, "sbx_a", 1, MIB), 0);
        char q[512], p[160];
        snprintf(q, sizeof(q),
                 "UPDATE sandboxes SET deleted_at = 1, state = 'deleted' WHERE id = 'sbx_b';"
                 "UPDATE uploads SET touched_at = touched_at - %d WHERE id = '%s';"
                 "INSERT INTO upload_parts (upload_id, part, bytes) VALUES ('%s', 0, 11);",
                 UPLOAD_IDLE_S + 10, idle, badpart);
        sql(f, q);
        snprintf(p, sizeof(p), "%s/uploads/%s", f->dir, nofile);
        assert_int_equal(unlink(p), 0);
        snprintf(p, sizeof(p), "%s/uploads/upl_00000000000000ff", f->dir);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        close(fd);
        /* --max-file-mib lowered to 3: the 4 MiB one goes. */
        restart(f, 3 * MIB, 1, 5);
        assert_false(access(p, F_OK) == 0);
        const char *gone[] = { deleted, nofile, idle, big, badpart };
        for (size_t i = 0; i < 5; i++) {
                UploadRef r;
                assert_int_equal(uploads_take(f->u, gone[i], i == 0 ? "sbx_b" : "sbx_a", "own_a", true, &r), -ENOENT);
                assert_false(staged(f, gone[i]));
        }
        UploadRef r;
        assert_int_equal(uploads_take(f->u, fine, "sbx_a", "own_a", false, &r), 0);
        upload_ref_done(&r);
        sqlite3 *s = NULL;
        assert_int_equal(sqldb_open(f->db_path, &s), 0);
        sqlite3_stmt *st = NULL;
        assert_int_equal(sqlite3_prepare_v2(s, "SELECT (SELECT count(*) FROM uploads), (SELECT count(*) FROM "
                                               "upload_parts)", -1, &st, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_int_equal(sqlite3_column_int(st, 0), 1);
        assert_int_equal(sqlite3_column_int(st, 1), 1);
        sqlite3_finalize(st);
        sqlite3_close(s);
}

static void test_bounds_hold_across_a_restart(void **state) {
        Fixture *f = *state;
        char ids[UPLOADS_PER_SANDBOX][UPLOAD_ID_LEN + 1], extra[UPLOAD_ID_LEN + 1];
        for (int i = 0; i < UPLOADS_PER_SANDBOX; i++)
                begin_file(f, "sbx_a", MIB, ids[i]);
        /* The sandbox's bound. */
        UploadSpec s = { .sandbox_id = "sbx_a", .owner = "own_a", .path = "/w", .size = 1 };
        assert_int_equal(uploads_begin(f->u, &s, extra), -EMLINK);
        restart(f, 8 * MIB, UPLOADS_PER_SANDBOX, 0);
        assert_int_equal(uploads_begin(f->u, &s, extra), -EMLINK);
        assert_int_equal(uploads_count(f->u), UPLOADS_PER_SANDBOX);
        /* The owner's bytes (1 GiB by default): own_a has 8 MiB declared;
         * another owner's upload is not counted against it. */
        UploadSpec mine = { .sandbox_id = "sbx_b", .owner = "own_a", .path = "/w",
                            .size = (uint64_t)UPLOADS_PER_OWNER_MIB_DEFAULT * MIB };
        assert_int_equal(uploads_begin(f->u, &mine, extra), -EMFILE);
        UploadSpec theirs = { .sandbox_id = "sbx_c", .owner = "own_b", .path = "/w",
                              .size = (uint64_t)UPLOADS_PER_OWNER_MIB_DEFAULT * MIB };
        assert_int_equal(uploads_begin(f->u, &theirs, extra), 0);
        /* The declared bytes in all: 4 GiB, whatever the owners' shares. */
        uploads_set_owner_bounds(f->u, UPLOADS_MAX, UPLOADS_MAX_TOTAL_MIB);
        UploadSpec huge = { .sandbox_id = "sbx_d", .owner = "own_a", .path = "/w",
                            .size = (uint64_t)(UPLOADS_MAX_TOTAL_MIB - UPLOADS_PER_OWNER_MIB_DEFAULT) * MIB };
        assert_int_equal(uploads_begin(f->u, &huge, extra), -EUSERS);
        huge.size -= UPLOADS_PER_SANDBOX * MIB;
        assert_int_equal(uploads_begin(f->u, &huge, extra), 0);
}

static void test_sandbox_deletion_and_a_late_part(void **state) {
        Fixture *f = *state;
        char a[UPLOAD_ID_LEN + 1], b[UPLOAD_ID_LEN + 1], arch[UPLOAD_ID_LEN + 1];
        begin_file(f, "sbx_a", 2 * MIB, a);
        begin_file(f, "sbx_b", 2 * MIB, b);
        UploadSpec s = { .archive = true, .sandbox_id = "sbx_a", .owner = "own_a", .path = "/workspace/t",
                         .mode = 0644, .max_parts = 4, .user = REQ_AS_SANDBOX };
        assert_int_equal(uploads_begin(f->u, &s, arch), 0);
        assert_int_equal(send_part(f, arch, "sbx_a", 0, MIB), 0);
        assert_int_equal(send_part(f, arch, "sbx_a", 1, 7), 0);
        /* A part in flight when its sandbox goes is not kept. */
        UploadRef late;
        assert_int_equal(uploads_take(f->u, a, "sbx_a", "own_a", false, &late), 0);
        uploads_drop_sandbox(f->u, "sbx_a");
        assert_int_equal(uploads_part_arrived(f->u, &late, 0, MIB), -ENOENT);
        upload_ref_done(&late);
        assert_false(staged(f, a));
        assert_false(staged(f, arch));
        assert_true(staged(f, b));
        /* A commit holding one when its sandbox goes: not found again, gone when given back. */
        UploadRef held, other;
        assert_int_equal(uploads_take(f->u, b, "sbx_b", "own_a", true, &held), 0);
        uploads_drop_sandbox(f->u, "sbx_b");
        assert_int_equal(uploads_take(f->u, b, "sbx_b", "own_a", false, &other), -ENOENT);
        uploads_release(f->u, &held);
        assert_false(staged(f, b));
        restart(f, 8 * MIB, 0, 0);
}

static void test_archive_restored_within_a_lowered_bound(void **state) {
        Fixture *f = *state;
        char arch[UPLOAD_ID_LEN + 1], over[UPLOAD_ID_LEN + 1];
        UploadSpec s = { .archive = true, .sandbox_id = "sbx_a", .owner = "own_a", .path = "/workspace/t",
                         .mode = 0644, .max_parts = 8, .user = REQ_AS_SANDBOX };
        assert_int_equal(uploads_begin(f->u, &s, arch), 0);
        assert_int_equal(uploads_begin(f->u, &s, over), 0);
        assert_int_equal(send_part(f, arch, "sbx_a", 0, MIB), 0);
        assert_int_equal(send_part(f, over, "sbx_a", 0, MIB), 0);
        assert_int_equal(send_part(f, over, "sbx_a", 2, MIB), 0);
        /* Restored under a bound of 2 parts: the one with a part past it goes. */
        restart(f, 2 * MIB, 1, 1);
        UploadRef r;
        assert_int_equal(uploads_take(f->u, arch, "sbx_a", "own_a", true, &r), 0);
        assert_true(r.archive);
        assert_int_equal(r.parts, 2);
        assert_int_equal(r.user, REQ_AS_SANDBOX);
        uploads_release(f->u, &r);
        assert_int_equal(uploads_take(f->u, over, "sbx_a", "own_a", true, &r), -ENOENT);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_parts_survive_a_restart, setup, teardown),
                cmocka_unit_test_setup_teardown(test_another_hosts_uploads_are_left_alone, setup, teardown),
                cmocka_unit_test_setup_teardown(test_restart_drops_what_cannot_be_kept, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bounds_hold_across_a_restart, setup, teardown),
                cmocka_unit_test_setup_teardown(test_sandbox_deletion_and_a_late_part, setup, teardown),
                cmocka_unit_test_setup_teardown(test_archive_restored_within_a_lowered_bound, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
