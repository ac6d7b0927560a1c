#pragma once
/* What the sandboxes table keeps for a fleet, shared by the SQLite and the
 * PostgreSQL tests: each row names its host and the host-scoped queries see
 * only that host's rows; a writer's inserts and updates hold only while the
 * hosts table has it at its epoch and not dead. The caller opened both
 * kinds on one store, with key_1 of owner alice in it. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_hosts.h"
#include "daemon/store/store_sandboxes.h"

static inline void fleet_test_row(SandboxRow *r, const char *id, const char *host) {
        *r = (SandboxRow){ .owner = "alice", .key_id = "key_1", .labels = "{}", .created_at = 1,
                           .state = SANDBOX_RUNNING };
        snprintf(r->id, sizeof r->id, "%s", id);
        snprintf(r->host_id, sizeof r->host_id, "%s", host);
        sandbox_spec_init(&r->spec);
        r->spec.image = "default";
        r->spec.driver = SANDBOX_DRIVER_NAMESPACE;
}

static inline int fleet_test_count(void *userdata, SandboxRow *row) {
        (*(int *)userdata)++;
        return 0;
}

static inline void fleet_test_contract(const StoreSandboxOps *ops, StoreSandboxes *h, const StoreHostOps *hops,
                                       StoreHosts *hosts) {
        HostRecord a = { .url = "http://10.0.0.1:1", .drivers = "namespace", .version = "0" };
        HostRecord b = { .url = "http://10.0.0.2:1", .drivers = "namespace", .version = "0" };
        snprintf(a.id, sizeof a.id, "host-a");
        snprintf(b.id, sizeof b.id, "host-b");
        int64_t ea = 0, eb = 0;
        assert_int_equal(hops->register_host(hosts, &a, 100, &ea), 0);
        assert_int_equal(hops->register_host(hosts, &b, 100, &eb), 0);

        /* Rows of before hosts are adopted by the one host that ran them. */
        SandboxRow r;
        fleet_test_row(&r, "sbx_old", "");
        assert_int_equal(ops->insert(h, &r, 100, 100), 0);
        assert_int_equal(ops->adopt(h, "host-a"), 0);
        SandboxRow got;
        assert_int_equal(ops->get(h, "sbx_old", &got), 0);
        assert_string_equal(got.host_id, "host-a");
        sandbox_row_done(&got);

        /* A writer writes its rows while it is at its epoch. */
        assert_int_equal(ops->set_writer(h, "host-b", eb), 0);
        fleet_test_row(&r, "sbx_b1", "host-b");
        assert_int_equal(ops->insert(h, &r, 100, 100), 0);
        assert_int_equal(ops->get(h, "sbx_b1", &got), 0);
        assert_string_equal(got.host_id, "host-b");
        int n = 0;
        assert_int_equal(ops->query(h, STORE_SANDBOXES_ACTIVE, "host-b", 0, fleet_test_count, &n), 0);
        assert_int_equal(n, 1);
        n = 0;
        assert_int_equal(ops->query(h, STORE_SANDBOXES_ACTIVE, "host-a", 0, fleet_test_count, &n), 0);
        assert_int_equal(n, 1);
        n = 0;
        assert_int_equal(ops->query(h, STORE_SANDBOXES_ACTIVE, NULL, 0, fleet_test_count, &n), 0);
        assert_int_equal(n, 2);

        /* b is declared dead: its writes are refused, and change nothing. */
        assert_int_equal(hops->declare_dead(hosts, "host-b", eb, 100, 200), 0);
        got.state = SANDBOX_STOPPED;
        int64_t v = got.version;
        assert_int_equal(ops->update(h, &got), -EOWNERDEAD);
        assert_int_equal(got.version, v);
        fleet_test_row(&r, "sbx_b2", "host-b");
        assert_int_equal(ops->insert(h, &r, 100, 100), -EOWNERDEAD);
        assert_int_equal(ops->get(h, "sbx_b2", &r), -ENOENT);

        /* a, live, marks b's row lost; b, registered again, writes at its
         * new epoch only, and its stale read of the row is refused. */
        assert_int_equal(ops->set_writer(h, "host-a", ea), 0);
        SandboxRow lost;
        assert_int_equal(ops->get(h, "sbx_b1", &lost), 0);
        lost.state = SANDBOX_LOST;
        assert_int_equal(ops->update(h, &lost), 0);
        n = 0;
        assert_int_equal(ops->query(h, STORE_SANDBOXES_LOST, "host-b", 0, fleet_test_count, &n), 0);
        assert_int_equal(n, 1);
        n = 0;
        assert_int_equal(ops->query(h, STORE_SANDBOXES_ACTIVE, "host-b", 0, fleet_test_count, &n), 0);
        assert_int_equal(n, 0);
        int64_t eb2 = 0;
        assert_int_equal(hops->register_host(hosts, &b, 300, &eb2), 0);
        assert_int_equal(ops->set_writer(h, "host-b", eb), 0);
        assert_int_equal(ops->update(h, &got), -EOWNERDEAD); /* the old epoch */
        assert_int_equal(ops->set_writer(h, "host-b", eb2), 0);
        assert_int_equal(ops->update(h, &got), -ESTALE); /* a's write came first */
        assert_int_equal(ops->get(h, "sbx_b1", &r), 0);
        assert_int_equal(r.state, SANDBOX_LOST);
        sandbox_row_done(&r);
        sandbox_row_done(&got);
        sandbox_row_done(&lost);

        /* A host's pending Idempotency-Key claims go with it, another's stay. */
        unsigned status = 0;
        char *body = NULL;
        assert_int_equal(ops->idem_claim(h, "alice", "k-b", "h", 300, &status, &body), STORE_IDEM_CLAIMED);
        assert_int_equal(ops->set_writer(h, "host-a", ea), 0);
        assert_int_equal(ops->idem_claim(h, "alice", "k-a", "h", 300, &status, &body), STORE_IDEM_CLAIMED);
        assert_int_equal(ops->idem_drop_pending(h, "host-b"), 0);
        assert_int_equal(ops->idem_claim(h, "alice", "k-a", "h", 301, &status, &body), STORE_IDEM_PENDING);
        assert_int_equal(ops->idem_claim(h, "alice", "k-b", "h", 301, &status, &body), STORE_IDEM_CLAIMED);
}
