#pragma once
/* The contract of a backend's sandbox readings (store_samples.h) and API
 * answer counts (store_requests.h), shared by the SQLite and PostgreSQL
 * tests: a round appended in one write, steps that sum time, CPU and
 * network and take the largest memory and disk, the range's start, one
 * sandbox's readings only, the newest reading (and none for a sandbox
 * without), pruning by age; counts that add up per owner, key and hour,
 * listed by hour then key, an owner's own, pruned by age; OpenTelemetry
 * exports under an owner's limit, read by owner, written only at the
 * version read (a claim two hosts never both win), removed. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_otel.h"
#include "daemon/store/store_requests.h"
#include "daemon/store/store_samples.h"

typedef struct SamplesSeen {
        SampleStep steps[16];
        int n;
} SamplesSeen;

static inline int samples_test_collect(void *userdata, const SampleStep *s) {
        SamplesSeen *seen = userdata;
        if (seen->n >= 16)
                return -E2BIG;
        seen->steps[seen->n++] = *s;
        return 0;
}

static inline void samples_test_contract(const StoreSampleOps *ops, StoreSamples *h) {
        /* Two sandboxes, a reading of each every 10 s from 1000 to 1050. */
        SampleRecord round[12];
        for (int i = 0; i < 6; i++) {
                for (int k = 0; k < 2; k++) {
                        SampleRecord *r = &round[i * 2 + k];
                        *r = (SampleRecord){ .sandbox_id = k ? "sbx_bbbbbbbbbbbbbbbbbbbb" : "sbx_aaaaaaaaaaaaaaaaaaaa",
                                             .owner = k ? "bob" : "alice", .at = 1000 + i * 10,
                                             .interval_ms = i ? 10000 : 0, .cpu_ns = i ? 5000000000LL : 0,
                                             .memory_bytes = 100 + i, .disk_bytes = 200 - i, .net_in_bytes = i,
                                             .net_out_bytes = 2 * i };
                }
        }
        assert_int_equal(ops->append(h, round, 12), 0);
        assert_int_equal(ops->append(h, round, 0), 0);

        /* Steps of 20 s from 1000: [1000, 1020) [1020, 1040) [1040, 1060). */
        SamplesSeen s = { 0 };
        assert_int_equal(ops->series(h, "sbx_aaaaaaaaaaaaaaaaaaaa", 1000, 20, samples_test_collect, &s), 0);
        assert_int_equal(s.n, 3);
        assert_int_equal(s.steps[0].at, 1000);
        assert_int_equal(s.steps[0].n, 2);
        assert_int_equal(s.steps[0].interval_ms, 10000);
        assert_int_equal(s.steps[0].cpu_ns, 5000000000LL);
        assert_int_equal(s.steps[0].memory_bytes, 101); /* the largest */
        assert_int_equal(s.steps[0].disk_bytes, 200);
        assert_int_equal(s.steps[0].net_in_bytes, 1);
        assert_int_equal(s.steps[2].at, 1040);
        assert_int_equal(s.steps[2].cpu_ns, 10000000000LL); /* summed past 32 bits */
        assert_int_equal(s.steps[2].net_out_bytes, 18);

        /* The range's start; another sandbox's readings never; none at all. */
        s = (SamplesSeen){ 0 };
        assert_int_equal(ops->series(h, "sbx_aaaaaaaaaaaaaaaaaaaa", 1030, 10, samples_test_collect, &s), 0);
        assert_int_equal(s.n, 3);
        assert_int_equal(s.steps[0].at, 1030);
        s = (SamplesSeen){ 0 };
        assert_int_equal(ops->series(h, "sbx_cccccccccccccccccccc", 0, 60, samples_test_collect, &s), 0);
        assert_int_equal(s.n, 0);
        assert_int_equal(ops->series(h, "sbx_aaaaaaaaaaaaaaaaaaaa", 0, 0, samples_test_collect, &s), -EINVAL);

        /* The newest reading. */
        s = (SamplesSeen){ 0 };
        assert_int_equal(ops->latest(h, "sbx_bbbbbbbbbbbbbbbbbbbb", samples_test_collect, &s), 0);
        assert_int_equal(s.n, 1);
        assert_int_equal(s.steps[0].at, 1050);
        assert_int_equal(s.steps[0].memory_bytes, 105);
        assert_int_equal(s.steps[0].n, 1);
        assert_int_equal(ops->latest(h, "sbx_cccccccccccccccccccc", samples_test_collect, &s), -ENOENT);

        /* Pruning by age, every sandbox's. */
        int64_t n = -1;
        assert_int_equal(ops->prune(h, 1020, &n), 0);
        assert_int_equal(n, 4);
        s = (SamplesSeen){ 0 };
        assert_int_equal(ops->series(h, "sbx_aaaaaaaaaaaaaaaaaaaa", 0, 3600, samples_test_collect, &s), 0);
        assert_int_equal(s.n, 1);
        assert_int_equal(s.steps[0].at, 0);
        assert_int_equal(s.steps[0].n, 4);
}

typedef struct CountsSeen {
        char keys[8][24];
        int64_t hours[8], requests[8], client[8], server[8];
        int n;
} CountsSeen;

static inline int requests_test_collect(void *userdata, const RequestCount *c) {
        CountsSeen *s = userdata;
        if (s->n >= 8)
                return -E2BIG;
        snprintf(s->keys[s->n], sizeof s->keys[0], "%s", c->key_id);
        s->hours[s->n] = c->hour;
        s->requests[s->n] = c->requests;
        s->client[s->n] = c->client_errors;
        s->server[s->n++] = c->server_errors;
        return 0;
}

static inline void requests_test_contract(const StoreRequestOps *ops, StoreRequests *h) {
        RequestCount first[] = {
                { .owner = "alice", .key_id = "key_b", .hour = 7200, .requests = 5, .client_errors = 1 },
                { .owner = "alice", .key_id = "key_a", .hour = 7200, .requests = 2, .server_errors = 2 },
                { .owner = "alice", .key_id = "key_a", .hour = 3600, .requests = 1 },
                { .owner = "bob", .key_id = "key_c", .hour = 7200, .requests = 9 },
        };
        assert_int_equal(ops->add(h, first, 4), 0);
        assert_int_equal(ops->add(h, first, 0), 0);
        /* A second host's counts of the same hour and key add up. */
        RequestCount more = { .owner = "alice", .key_id = "key_b", .hour = 7200, .requests = 3, .client_errors = 2,
                              .server_errors = 1 };
        assert_int_equal(ops->add(h, &more, 1), 0);

        CountsSeen s = { 0 };
        assert_int_equal(ops->list(h, "alice", 0, requests_test_collect, &s), 0);
        assert_int_equal(s.n, 3);
        assert_string_equal(s.keys[0], "key_a");
        assert_int_equal(s.hours[0], 3600);
        assert_string_equal(s.keys[1], "key_a");
        assert_int_equal(s.server[1], 2);
        assert_string_equal(s.keys[2], "key_b");
        assert_int_equal(s.requests[2], 8);
        assert_int_equal(s.client[2], 3);
        assert_int_equal(s.server[2], 1);
        s = (CountsSeen){ 0 };
        assert_int_equal(ops->list(h, "alice", 7200, requests_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
        s = (CountsSeen){ 0 };
        assert_int_equal(ops->list(h, "carol", 0, requests_test_collect, &s), 0);
        assert_int_equal(s.n, 0);

        int64_t n = -1;
        assert_int_equal(ops->prune(h, 7200, &n), 0);
        assert_int_equal(n, 1);
        s = (CountsSeen){ 0 };
        assert_int_equal(ops->list(h, "alice", 0, requests_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
}

typedef struct OtelSeen {
        char ids[8][OTEL_EXPORT_ID_LEN + 1];
        int64_t versions[8], events_after[8];
        char claimed_by[8][16];
        int n;
} OtelSeen;

static inline int otel_test_collect(void *userdata, const OtelExportRecord *x) {
        OtelSeen *s = userdata;
        if (s->n >= 8)
                return -E2BIG;
        snprintf(s->ids[s->n], sizeof s->ids[0], "%s", x->id);
        snprintf(s->claimed_by[s->n], sizeof s->claimed_by[0], "%s", x->claimed_by ? x->claimed_by : "");
        s->events_after[s->n] = x->events_after;
        s->versions[s->n++] = x->version;
        return 0;
}

static inline void otel_test_contract(const StoreOtelOps *ops, StoreOtel *h) {
        OtelExportRecord x = { .owner = "alice", .endpoint = "https://otel.example.com", .signals = "[\"logs\"]",
                               .enabled = true, .created_at = 100, .updated_at = 100 };
        for (int i = 0; i < 2; i++) {
                snprintf(x.id, sizeof x.id, "otx_%020d", i);
                assert_int_equal(ops->put(h, &x, 2), 0);
        }
        snprintf(x.id, sizeof x.id, "otx_%020d", 9);
        assert_int_equal(ops->put(h, &x, 2), -EDQUOT);
        x.owner = "bob";
        snprintf(x.id, sizeof x.id, "otx_%020d", 0);
        assert_int_equal(ops->put(h, &x, 2), -EEXIST);

        OtelSeen s = { 0 };
        assert_int_equal(ops->list(h, "alice", otel_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
        assert_int_equal(s.versions[0], 1);
        s = (OtelSeen){ 0 };
        assert_int_equal(ops->list(h, "bob", otel_test_collect, &s), 0);
        assert_int_equal(s.n, 0);
        assert_int_equal(ops->get(h, "otx_00000000000000000000", "bob", otel_test_collect, &s), -ENOENT);

        /* Two hosts claim with the version they read: one wins. */
        OtelExportRecord a = x, b = x;
        a.owner = b.owner = "alice";
        a.version = b.version = 1;
        a.claimed_by = "host-a";
        b.claimed_by = "host-b";
        a.claimed_until = b.claimed_until = 200;
        assert_int_equal(ops->update(h, &a), 0);
        assert_int_equal(ops->update(h, &b), -ESTALE);
        a.version = 2;
        a.claimed_by = NULL;
        a.claimed_until = 0;
        a.events_after = 42;
        assert_int_equal(ops->update(h, &a), 0);
        s = (OtelSeen){ 0 };
        assert_int_equal(ops->get(h, a.id, NULL, otel_test_collect, &s), 0);
        assert_int_equal(s.versions[0], 3);
        assert_int_equal(s.events_after[0], 42);
        assert_string_equal(s.claimed_by[0], "");
        a.owner = "bob";
        assert_int_equal(ops->update(h, &a), -ENOENT);

        assert_int_equal(ops->remove(h, "otx_00000000000000000000", "bob"), -ENOENT);
        assert_int_equal(ops->remove(h, "otx_00000000000000000000", "alice"), 0);
        assert_int_equal(ops->remove(h, "otx_00000000000000000000", "alice"), -ENOENT);
}
