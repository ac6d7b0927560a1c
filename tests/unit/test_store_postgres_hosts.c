/* The host records of the PostgreSQL backend, through its table
 * (store_postgres.hosts), against a real server: the contract
 * (test_store_hosts_helper.h), and several hosts registering one id at
 * once, each on its own connection, getting distinct epochs. */
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

#include "daemon/store/store.h"
#include "test_pg_harness.h"
#include "test_store_events_helper.h"
#include "test_store_webhooks_helper.h"
#include "test_store_hosts_helper.h"
#include "test_store_samples_helper.h"

typedef struct Fixture {
        char *url;
        const StoreHostOps *ops;
        StoreHosts *h;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        if (!f)
                return -1;
        f->ops = store_postgres.hosts;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        if (f->h)
                f->ops->close(f->h);
        free(f->url);
        free(f);
        return 0;
}

static void test_contract(void **state) {
        Fixture *f = *state;
        assert_non_null(f->ops);
        f->url = pg_fresh("hosts_contract");
        assert_int_equal(f->ops->open(f->url, &f->h), 0);
        hosts_test_contract(f->ops, f->h);
}

/* The events kind of the same backend. */
static void test_events_contract(void **state) {
        Fixture *f = *state;
        f->url = pg_fresh("events_contract");
        StoreEvents *ev = NULL;
        assert_int_equal(store_postgres.events->open(f->url, &ev), 0);
        events_test_contract(store_postgres.events, ev);
        store_postgres.events->close(ev);
}

/* The webhooks and the audit trail of the same backend. */
static void test_webhooks_contract(void **state) {
        Fixture *f = *state;
        f->url = pg_fresh("webhooks_contract");
        StoreWebhooks *wh = NULL;
        assert_int_equal(store_postgres.webhooks->open(f->url, &wh), 0);
        hooks_test_contract(store_postgres.webhooks, wh);
        store_postgres.webhooks->close(wh);
}

static void test_webhooks_races(void **state) {
        Fixture *f = *state;
        f->url = pg_fresh("webhooks_races");
        hooks_test_races(store_postgres.webhooks, f->url);
}

static void test_audit_contract(void **state) {
        Fixture *f = *state;
        f->url = pg_fresh("audit_contract");
        StoreAudit *a = NULL;
        assert_int_equal(store_postgres.audit->open(f->url, &a), 0);
        audit_test_contract(store_postgres.audit, a);
        store_postgres.audit->close(a);
}

static void test_samples_contract(void **state) {
        Fixture *f = *state;
        f->url = pg_fresh("samples_contract");
        StoreSamples *h = NULL;
        assert_int_equal(store_postgres.samples->open(f->url, &h), 0);
        samples_test_contract(store_postgres.samples, h);
        store_postgres.samples->close(h);
}

static void test_requests_contract(void **state) {
        Fixture *f = *state;
        f->url = pg_fresh("requests_contract");
        StoreRequests *h = NULL;
        assert_int_equal(store_postgres.requests->open(f->url, &h), 0);
        requests_test_contract(store_postgres.requests, h);
        store_postgres.requests->close(h);
}

static int count_delivery(void *userdata, const DeliveryRecord *d) {
        (*(int *)userdata)++;
        return 0;
}

/* A host's webhook deliveries, audit entries, samples and request counts
 * are written at its epoch: declared dead, it enqueues, claims and records
 * nothing more. */
static void test_writes_need_a_live_epoch(void **state) {
        Fixture *f = *state;
        f->url = pg_fresh("hosts_epoch_writes");
        assert_int_equal(f->ops->open(f->url, &f->h), 0);
        HostRecord rec = hosts_test_record("host_epochepochepoch", "http://10.0.0.1:7878");
        int64_t epoch = 0;
        assert_int_equal(f->ops->register_host(f->h, &rec, 100, &epoch), 0);
        const StoreWebhookOps *wops = store_postgres.webhooks;
        const StoreAuditOps *aops = store_postgres.audit;
        const StoreSampleOps *sops = store_postgres.samples;
        const StoreRequestOps *rops = store_postgres.requests;
        StoreWebhooks *wh = NULL;
        StoreAudit *au = NULL;
        StoreSamples *sa = NULL;
        StoreRequests *rq = NULL;
        assert_int_equal(wops->open(f->url, &wh), 0);
        assert_int_equal(aops->open(f->url, &au), 0);
        assert_int_equal(sops->open(f->url, &sa), 0);
        assert_int_equal(rops->open(f->url, &rq), 0);
        assert_int_equal(wops->set_writer(wh, rec.id, epoch), 0);
        assert_int_equal(aops->set_writer(au, rec.id, epoch), 0);
        assert_int_equal(sops->set_writer(sa, rec.id, epoch), 0);
        assert_int_equal(rops->set_writer(rq, rec.id, epoch), 0);

        WebhookRecord hook = hooks_test_hook("whk_epoch", "alice");
        assert_int_equal(wops->put(wh, &hook, 10), 0);
        hooks_test_enqueue(wops, wh, "dlv_epoch_1", "whk_epoch", 100);
        AuditRecord a = { .owner = "alice", .action = "sandbox.exec", .method = "POST", .path = "/v1/x",
                          .status = 200, .host_id = rec.id, .at = 100 };
        snprintf(a.id, sizeof a.id, "aud_%020d", 1);
        assert_int_equal(aops->append(au, &a, 1), 0);
        SampleRecord s = { .sandbox_id = "sbx_aaaaaaaaaaaaaaaaaaaa", .owner = "alice", .at = 1000 };
        assert_int_equal(sops->append(sa, &s, 1), 0);
        RequestCount c = { .owner = "alice", .key_id = "key_a", .hour = 3600, .requests = 1 };
        assert_int_equal(rops->add(rq, &c, 1), 0);

        assert_int_equal(f->ops->declare_dead(f->h, rec.id, epoch, 100, 200), 0);
        DeliveryRecord d = { .webhook_id = "whk_epoch", .owner = "alice", .event_id = "evt_2",
                             .event_type = "sandbox.stopped", .body = "{}", .state = "pending", .next_at = 100,
                             .created_at = 100, .updated_at = 100 };
        snprintf(d.id, sizeof d.id, "dlv_epoch_2");
        assert_int_equal(wops->enqueue(wh, &d, 1), -EOWNERDEAD);
        int n = 0;
        assert_int_equal(wops->claim(wh, rec.id, 300, 400, 10, NULL, 0, count_delivery, &n), 0);
        assert_int_equal(n, 0); /* the pending delivery stays for a live host */
        snprintf(a.id, sizeof a.id, "aud_%020d", 2);
        assert_int_equal(aops->append(au, &a, 1), -EOWNERDEAD);
        assert_int_equal(sops->append(sa, &s, 1), -EOWNERDEAD);
        assert_int_equal(rops->add(rq, &c, 1), -EOWNERDEAD);

        /* Another host, live, claims it. */
        StoreWebhooks *other = NULL;
        assert_int_equal(wops->open(f->url, &other), 0);
        assert_int_equal(wops->claim(other, "host_other", 300, 400, 10, NULL, 0, count_delivery, &n), 0);
        assert_int_equal(n, 1);
        wops->close(other);
        rops->close(rq);
        sops->close(sa);
        aops->close(au);
        wops->close(wh);
}

static void test_otel_contract(void **state) {
        Fixture *f = *state;
        f->url = pg_fresh("otel_contract");
        StoreOtel *h = NULL;
        assert_int_equal(store_postgres.otel->open(f->url, &h), 0);
        otel_test_contract(store_postgres.otel, h);
        store_postgres.otel->close(h);
}

#define RACERS 8
#define ROUNDS 5

typedef struct Race {
        const StoreHostOps *ops;
        StoreHosts *h;
        pthread_barrier_t *start;
        int64_t epochs[ROUNDS];
        int failed;
} Race;

static void *race_one(void *userdata) {
        Race *a = userdata;
        HostRecord rec = hosts_test_record("host_racedracedraced", "http://10.0.0.1:7878");
        pthread_barrier_wait(a->start);
        for (int i = 0; i < ROUNDS; i++)
                if (a->ops->register_host(a->h, &rec, 100 + i, &a->epochs[i]) < 0)
                        a->failed++;
        return NULL;
}

static int cmp_epoch(const void *x, const void *y) {
        int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
        return (a > b) - (a < b);
}

static void test_register_race(void **state) {
        Fixture *f = *state;
        f->url = pg_fresh("hosts_race");
        Race races[RACERS] = { 0 };
        pthread_t t[RACERS];
        pthread_barrier_t start;
        assert_int_equal(pthread_barrier_init(&start, NULL, RACERS), 0);
        for (int i = 0; i < RACERS; i++) {
                races[i] = (Race){ .ops = f->ops, .start = &start };
                assert_int_equal(f->ops->open(f->url, &races[i].h), 0);
        }
        for (int i = 0; i < RACERS; i++)
                assert_int_equal(pthread_create(&t[i], NULL, race_one, &races[i]), 0);
        for (int i = 0; i < RACERS; i++)
                pthread_join(t[i], NULL);
        int64_t all[RACERS * ROUNDS];
        for (int i = 0; i < RACERS; i++) {
                assert_int_equal(races[i].failed, 0);
                memcpy(&all[i * ROUNDS], races[i].epochs, sizeof(races[i].epochs));
                f->ops->close(races[i].h);
        }
        pthread_barrier_destroy(&start);
        /* Every registration got its own epoch: exactly 1 .. RACERS * ROUNDS. */
        qsort(all, RACERS * ROUNDS, sizeof(all[0]), cmp_epoch);
        for (int i = 0; i < RACERS * ROUNDS; i++)
                assert_int_equal(all[i], i + 1);
        /* Only the last one's heartbeat is not fenced. */
        assert_int_equal(f->ops->open(f->url, &f->h), 0);
        assert_int_equal(f->ops->heartbeat(f->h, "host_racedracedraced", RACERS * ROUNDS, 200, NULL), 0);
        assert_int_equal(f->ops->heartbeat(f->h, "host_racedracedraced", RACERS * ROUNDS - 1, 200, NULL), -ESTALE);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_contract, setup, teardown),
                cmocka_unit_test_setup_teardown(test_events_contract, setup, teardown),
                cmocka_unit_test_setup_teardown(test_webhooks_contract, setup, teardown),
                cmocka_unit_test_setup_teardown(test_webhooks_races, setup, teardown),
                cmocka_unit_test_setup_teardown(test_audit_contract, setup, teardown),
                cmocka_unit_test_setup_teardown(test_samples_contract, setup, teardown),
                cmocka_unit_test_setup_teardown(test_requests_contract, setup, teardown),
                cmocka_unit_test_setup_teardown(test_otel_contract, setup, teardown),
                cmocka_unit_test_setup_teardown(test_writes_need_a_live_epoch, setup, teardown),
                cmocka_unit_test_setup_teardown(test_register_race, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
