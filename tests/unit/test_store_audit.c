/* The audit kind of the SQLite backend (store_audit.h): records written one
 * at a time through the statement the handle keeps prepared and in batches,
 * read back newest first with every field as written (an absent field of a
 * record never takes the value of the record before it), a taken id refused,
 * and all of it kept across a reopen. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store.h"
#include "daemon/store/store_audit.h"

#define STORE_TMPDIR_PREFIX "/tmp/store-audit-"
#include "test_store_tmpdir.h"

#define MAX_SEEN 16

typedef struct Seen {
        size_t n;
        AuditRecord rec[MAX_SEEN];
        char *text[MAX_SEEN][10];
} Seen;

static const char *keep(Seen *s, int field, const char *v) {
        return v ? (s->text[s->n][field] = strdup(v)) : NULL;
}

static int collect(void *userdata, const AuditRecord *a) {
        Seen *s = userdata;
        assert_true(s->n < MAX_SEEN);
        AuditRecord *r = &s->rec[s->n];
        *r = *a;
        r->owner = keep(s, 0, a->owner);
        r->action = keep(s, 1, a->action);
        r->key_id = keep(s, 2, a->key_id);
        r->method = keep(s, 3, a->method);
        r->path = keep(s, 4, a->path);
        r->sandbox_id = keep(s, 5, a->sandbox_id);
        r->detail = keep(s, 6, a->detail);
        r->client = keep(s, 7, a->client);
        r->request_id = keep(s, 8, a->request_id);
        r->host_id = keep(s, 9, a->host_id);
        s->n++;
        return 0;
}

static void seen_free(Seen *s) {
        for (size_t i = 0; i < s->n; i++)
                for (size_t j = 0; j < 10; j++)
                        free(s->text[i][j]);
        memset(s, 0, sizeof(*s));
}

static void list_all(const StoreAuditOps *ops, StoreAudit *h, Seen *s) {
        AuditFilter f = { .limit = MAX_SEEN };
        memset(s, 0, sizeof(*s));
        assert_int_equal(ops->list(h, &f, collect, s), 0);
}

static AuditRecord full(const char *id, int64_t at) {
        AuditRecord a = { .owner = "alice", .action = "sandbox.exec", .key_id = "key_1", .method = "POST",
                          .path = "/v1/sandboxes/sbx_1:exec", .sandbox_id = "sbx_1",
                          .detail = "{\"argv\":[\"true\"]}", .status = 200, .client = "127.0.0.1",
                          .request_id = "req_1", .host_id = "host-a", .at = at };
        snprintf(a.id, sizeof a.id, "%s", id);
        return a;
}

static AuditRecord bare(const char *id, int64_t at) {
        AuditRecord a = { .owner = "daemon", .action = "host.dead", .host_id = "", .at = at };
        snprintf(a.id, sizeof a.id, "%s", id);
        return a;
}

static void assert_bare(const AuditRecord *a, const char *id) {
        assert_string_equal(a->id, id);
        assert_string_equal(a->owner, "daemon");
        assert_string_equal(a->action, "host.dead");
        assert_null(a->key_id);
        assert_null(a->method);
        assert_null(a->path);
        assert_null(a->sandbox_id);
        assert_null(a->detail);
        assert_null(a->client);
        assert_null(a->request_id);
        assert_int_equal(a->status, 0);
}

static void assert_full(const AuditRecord *a, const char *id, int64_t at) {
        assert_string_equal(a->id, id);
        assert_string_equal(a->owner, "alice");
        assert_string_equal(a->key_id, "key_1");
        assert_string_equal(a->path, "/v1/sandboxes/sbx_1:exec");
        assert_string_equal(a->detail, "{\"argv\":[\"true\"]}");
        assert_string_equal(a->request_id, "req_1");
        assert_string_equal(a->host_id, "host-a");
        assert_int_equal(a->status, 200);
        assert_int_equal(a->at, at);
}

static void test_audit_records(void **state) {
        Fixture *f = *state;
        const StoreAuditOps *ops = store_sqlite.audit;
        StoreAudit *h = NULL;
        assert_int_equal(ops->open(f->path, &h), 0);

        /* One at a time: the kept statement, a full record then a bare one
         * then a full one again. */
        AuditRecord a = full("aud_1", 100), b = bare("aud_2", 101), c = full("aud_3", 102);
        assert_int_equal(ops->append(h, &a, 1), 0);
        assert_int_equal(ops->append(h, &b, 1), 0);
        assert_int_equal(ops->append(h, &c, 1), 0);
        /* A taken id is refused and leaves the statement usable. */
        AuditRecord again = bare("aud_1", 103);
        assert_int_equal(ops->append(h, &again, 1), -EEXIST);
        /* A batch, through the same statement. */
        AuditRecord batch[3] = { bare("aud_4", 104), full("aud_5", 105), bare("aud_6", 106) };
        assert_int_equal(ops->append(h, batch, 3), 0);
        /* A batch with a taken id writes none of it. */
        AuditRecord bad[2] = { bare("aud_7", 107), bare("aud_3", 108) };
        assert_int_equal(ops->append(h, bad, 2), -EEXIST);

        Seen s;
        list_all(ops, h, &s);
        assert_int_equal(s.n, 6);
        assert_bare(&s.rec[0], "aud_6");
        assert_full(&s.rec[1], "aud_5", 105);
        assert_bare(&s.rec[2], "aud_4");
        assert_full(&s.rec[3], "aud_3", 102);
        assert_bare(&s.rec[4], "aud_2");
        assert_full(&s.rec[5], "aud_1", 100);
        for (size_t i = 1; i < s.n; i++)
                assert_true(s.rec[i - 1].seq > s.rec[i].seq);
        seen_free(&s);
        ops->close(h);

        /* Kept across a reopen, and the new handle writes after them. */
        assert_int_equal(ops->open(f->path, &h), 0);
        AuditRecord d = bare("aud_8", 109);
        assert_int_equal(ops->append(h, &d, 1), 0);
        list_all(ops, h, &s);
        assert_int_equal(s.n, 7);
        assert_bare(&s.rec[0], "aud_8");
        assert_full(&s.rec[2], "aud_5", 105);
        seen_free(&s);
        int64_t pruned = 0;
        assert_int_equal(ops->prune(h, 105, &pruned), 0);
        assert_int_equal(pruned, 4); /* aud_1 to aud_4 */
        list_all(ops, h, &s);
        assert_int_equal(s.n, 3);
        assert_full(&s.rec[2], "aud_5", 105);
        seen_free(&s);
        ops->close(h);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_audit_records, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
