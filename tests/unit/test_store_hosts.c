/* The host records of the SQLite backend, through its table
 * (store_sqlite.hosts), on a real SQLite file: the contract
 * (test_store_hosts_helper.h), and the records kept across a reopen. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store.h"
#include "test_store_events_helper.h"
#include "test_store_hosts_helper.h"
#include "test_store_samples_helper.h"
#include "test_store_webhooks_helper.h"

typedef struct Fixture {
        char dir[64];
        char path[96];
        const StoreHostOps *ops;
        StoreHosts *h;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        if (!f)
                return -1;
        snprintf(f->dir, sizeof(f->dir), "/tmp/store-hosts-test-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof(f->path), "%s/runtime.db", f->dir);
        f->ops = store_sqlite.hosts;
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

static void test_contract(void **state) {
        Fixture *f = *state;
        assert_non_null(f->ops);
        assert_int_equal(f->ops->open(f->path, &f->h), 0);
        hosts_test_contract(f->ops, f->h);
}

/* The events kind of the same backend, on its own file. */
static void test_events_contract(void **state) {
        Fixture *f = *state;
        StoreEvents *ev = NULL;
        assert_int_equal(store_sqlite.events->open(f->path, &ev), 0);
        events_test_contract(store_sqlite.events, ev);
        store_sqlite.events->close(ev);
}

/* The webhooks and the audit trail of the same backend, on its own file. */
static void test_webhooks_contract(void **state) {
        Fixture *f = *state;
        StoreWebhooks *wh = NULL;
        assert_int_equal(store_sqlite.webhooks->open(f->path, &wh), 0);
        hooks_test_contract(store_sqlite.webhooks, wh);
        store_sqlite.webhooks->close(wh);
}

static void test_webhooks_races(void **state) {
        Fixture *f = *state;
        hooks_test_races(store_sqlite.webhooks, f->path);
}

static void test_audit_contract(void **state) {
        Fixture *f = *state;
        StoreAudit *a = NULL;
        assert_int_equal(store_sqlite.audit->open(f->path, &a), 0);
        audit_test_contract(store_sqlite.audit, a);
        store_sqlite.audit->close(a);
}

/* The sandboxes' readings of the same backend, on its own file. */
static void test_samples_contract(void **state) {
        Fixture *f = *state;
        StoreSamples *h = NULL;
        assert_int_equal(store_sqlite.samples->open(f->path, &h), 0);
        samples_test_contract(store_sqlite.samples, h);
        store_sqlite.samples->close(h);
}

static void test_requests_contract(void **state) {
        Fixture *f = *state;
        StoreRequests *h = NULL;
        assert_int_equal(store_sqlite.requests->open(f->path, &h), 0);
        requests_test_contract(store_sqlite.requests, h);
        store_sqlite.requests->close(h);
}

static void test_otel_contract(void **state) {
        Fixture *f = *state;
        StoreOtel *h = NULL;
        assert_int_equal(store_sqlite.otel->open(f->path, &h), 0);
        otel_test_contract(store_sqlite.otel, h);
        store_sqlite.otel->close(h);
}

/* A restart reopens the file: the epoch goes on from the stored one. */
static void test_epoch_survives_reopen(void **state) {
        Fixture *f = *state;
        HostRecord a = hosts_test_record("host_cccccccccccccccc", "http://127.0.0.1:7878");
        int64_t epoch = 0;
        assert_int_equal(f->ops->open(f->path, &f->h), 0);
        assert_int_equal(f->ops->register_host(f->h, &a, 100, &epoch), 0);
        assert_int_equal(epoch, 1);
        f->ops->close(f->h);
        f->h = NULL;
        assert_int_equal(f->ops->open(f->path, &f->h), 0);
        assert_int_equal(f->ops->heartbeat(f->h, a.id, 1, 101, NULL), 0);
        assert_int_equal(f->ops->register_host(f->h, &a, 102, &epoch), 0);
        assert_int_equal(epoch, 2);
        assert_int_equal(f->ops->heartbeat(f->h, a.id, 1, 103, NULL), -ESTALE);
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
                cmocka_unit_test_setup_teardown(test_epoch_survives_reopen, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
