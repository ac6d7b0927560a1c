#pragma once
/* The contract of a backend's events (store_events.h), shared by the SQLite
 * and PostgreSQL tests: appends, filters, the cursor, pruning by age. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_events.h"

typedef struct EventsSeen {
        char ids[16][EVENT_ID_LEN + 1];
        int64_t seqs[16];
        char types[16][32];
        char keys[16][32];
        int n;
} EventsSeen;

static inline int events_test_collect(void *userdata, const EventRecord *e) {
        EventsSeen *s = userdata;
        if (s->n >= 16)
                return -E2BIG;
        snprintf(s->ids[s->n], sizeof s->ids[0], "%s", e->id);
        snprintf(s->types[s->n], sizeof s->types[0], "%s", e->type);
        snprintf(s->keys[s->n], sizeof s->keys[0], "%s", e->key_id ? e->key_id : "-");
        s->seqs[s->n++] = e->seq;
        return 0;
}

static inline void events_test_add(const StoreEventOps *ops, StoreEvents *h, int i, const char *owner,
                                   const char *type, const char *resource, const char *key, int64_t at) {
        EventRecord e = { .owner = owner, .type = type, .resource_type = "sandbox", .resource_id = resource,
                          .key_id = key, .host_id = "h1", .data = "{\"state\":\"stopped\"}", .at = at };
        snprintf(e.id, sizeof e.id, "evt_%020d", i);
        assert_int_equal(ops->append(h, &e), 0);
}

static inline void events_test_contract(const StoreEventOps *ops, StoreEvents *h) {
        events_test_add(ops, h, 1, "alice", "sandbox.created", "sbx_a", "key_1", 100);
        events_test_add(ops, h, 2, "alice", "sandbox.stopped", "sbx_a", NULL, 200);
        events_test_add(ops, h, 3, "bob", "sandbox.created", "sbx_b", "key_2", 300);
        events_test_add(ops, h, 4, "alice", "snapshot.created", "snp_x", "key_1", 400);
        events_test_add(ops, h, 5, "alice", "sandbox_created", "sbx_c", "key_1", 500); /* '_' is no pattern */
        EventRecord dup = { .owner = "alice", .type = "x", .resource_type = "sandbox", .resource_id = "r",
                            .host_id = "", .at = 1 };
        snprintf(dup.id, sizeof dup.id, "evt_%020d", 1);
        assert_int_equal(ops->append(h, &dup), -EEXIST);

        /* An owner's, newest first; the daemon's own acts name no key. */
        EventsSeen s = { 0 };
        EventFilter f = { .owner = "alice", .limit = 10 };
        assert_int_equal(ops->list(h, &f, events_test_collect, &s), 0);
        assert_int_equal(s.n, 4);
        assert_string_equal(s.types[0], "sandbox_created");
        assert_string_equal(s.types[3], "sandbox.created");
        assert_string_equal(s.keys[2], "-");
        assert_true(s.seqs[0] > s.seqs[1] && s.seqs[1] > s.seqs[2]);
        /* A type, a group of types, a resource. */
        s = (EventsSeen){ 0 };
        f = (EventFilter){ .owner = "alice", .type = "sandbox.", .limit = 10 };
        assert_int_equal(ops->list(h, &f, events_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
        s = (EventsSeen){ 0 };
        f = (EventFilter){ .owner = "alice", .type = "snapshot.created", .limit = 10 };
        assert_int_equal(ops->list(h, &f, events_test_collect, &s), 0);
        assert_int_equal(s.n, 1);
        s = (EventsSeen){ 0 };
        f = (EventFilter){ .owner = "alice", .resource_id = "sbx_a", .limit = 10 };
        assert_int_equal(ops->list(h, &f, events_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
        /* Pages: the cursor is the last one's seq. */
        s = (EventsSeen){ 0 };
        f = (EventFilter){ .owner = "alice", .limit = 2 };
        assert_int_equal(ops->list(h, &f, events_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
        EventsSeen more = { 0 };
        f.before = s.seqs[1];
        assert_int_equal(ops->list(h, &f, events_test_collect, &more), 0);
        assert_int_equal(more.n, 2);
        assert_string_equal(more.types[1], "sandbox.created");
        /* Oldest first after a cursor, up to a time (what an export reads). */
        s = (EventsSeen){ 0 };
        f = (EventFilter){ .owner = "alice", .oldest_first = true, .after = more.seqs[1], .until = 400, .limit = 10 };
        assert_int_equal(ops->list(h, &f, events_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
        assert_string_equal(s.types[0], "sandbox.stopped");
        assert_string_equal(s.types[1], "snapshot.created");
        s = (EventsSeen){ 0 };
        f = (EventFilter){ .owner = "alice", .oldest_first = true, .limit = 1 };
        assert_int_equal(ops->list(h, &f, events_test_collect, &s), 0);
        assert_int_equal(s.n, 1);
        assert_string_equal(s.types[0], "sandbox.created");
        /* Every owner's (the admin's view). */
        s = (EventsSeen){ 0 };
        f = (EventFilter){ .limit = 10 };
        assert_int_equal(ops->list(h, &f, events_test_collect, &s), 0);
        assert_int_equal(s.n, 5);
        /* Pruned by age. */
        int64_t n = 0;
        assert_int_equal(ops->prune(h, 300, &n), 0);
        assert_int_equal(n, 2);
        s = (EventsSeen){ 0 };
        assert_int_equal(ops->list(h, &f, events_test_collect, &s), 0);
        assert_int_equal(s.n, 3);
}
