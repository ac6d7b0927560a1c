#pragma once
/* The contract of a backend's hosts table (store_hosts.h), shared by the
 * SQLite and PostgreSQL tests: epochs from registration, fenced and
 * unknown heartbeats, the listing. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_hosts.h"

static inline HostRecord hosts_test_record(const char *id, const char *url) {
        HostRecord r = { .url = (char *)url, .drivers = (char *)"namespace,microvm", .version = (char *)"0.1.0",
                         .vcpu = 8, .memory_mib = 16384 };
        snprintf(r.id, sizeof r.id, "%s", id);
        return r;
}

static inline void hosts_test_contract(const StoreHostOps *ops, StoreHosts *h) {
        HostRecord a = hosts_test_record("host_aaaaaaaaaaaaaaaa", "http://10.0.0.1:7878");
        HostRecord b = hosts_test_record("host_bbbbbbbbbbbbbbbb", "http://10.0.0.2:7878");
        int64_t epoch = 0, again = 0, other = 0;

        /* Nothing yet. */
        HostRecord *list = NULL;
        size_t n = 99;
        assert_int_equal(ops->list(h, &list, &n), 0);
        assert_int_equal(n, 0);
        free(list);
        assert_int_equal(ops->heartbeat(h, a.id, 1, 100, NULL), -ENOENT);

        /* A new host gets epoch 1; registering again bumps it. */
        assert_int_equal(ops->register_host(h, &a, 100, &epoch), 0);
        assert_int_equal(epoch, 1);
        assert_int_equal(ops->register_host(h, &b, 105, &other), 0);
        assert_int_equal(other, 1);
        a.url = (char *)"http://10.0.0.9:7878";
        assert_int_equal(ops->register_host(h, &a, 110, &again), 0);
        assert_int_equal(again, 2);

        /* The old epoch is fenced; the new one beats. */
        assert_int_equal(ops->heartbeat(h, a.id, epoch, 120, NULL), -ESTALE);
        assert_int_equal(ops->heartbeat(h, a.id, again, 125, NULL), 0);
        assert_int_equal(ops->heartbeat(h, "host_none", 1, 125, NULL), -ENOENT);

        /* The listing, by id, with the last registration's fields. */
        assert_int_equal(ops->list(h, &list, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(list[0].id, a.id);
        assert_string_equal(list[0].url, "http://10.0.0.9:7878");
        assert_string_equal(list[0].drivers, "namespace,microvm");
        assert_string_equal(list[0].version, "0.1.0");
        assert_int_equal(list[0].vcpu, 8);
        assert_int_equal(list[0].memory_mib, 16384);
        assert_int_equal(list[0].epoch, 2);
        assert_int_equal(list[0].started_at, 110);
        assert_int_equal(list[0].heartbeat_at, 125);
        assert_string_equal(list[1].id, b.id);
        assert_int_equal(list[1].epoch, 1);
        assert_int_equal(list[1].started_at, 105);
        assert_int_equal(list[1].heartbeat_at, 105);
        assert_int_equal(list[0].state, HOST_LIVE);
        for (size_t i = 0; i < n; i++)
                store_host_record_clear(&list[i]);
        free(list);

        /* A heartbeat carries the host's use. */
        HostUse use = { .vcpu = 3, .memory_mib = 2048, .sandboxes = 2 };
        assert_int_equal(ops->heartbeat(h, b.id, other, 130, &use), 0);
        assert_int_equal(ops->list(h, &list, &n), 0);
        assert_int_equal(list[1].used.vcpu, 3);
        assert_int_equal(list[1].used.memory_mib, 2048);
        assert_int_equal(list[1].used.sandboxes, 2);
        for (size_t i = 0; i < n; i++)
                store_host_record_clear(&list[i]);
        free(list);

        /* Declaring dead is conditional on what the sweeper saw: a heartbeat
         * since, or another epoch, and nothing changes. */
        assert_int_equal(ops->declare_dead(h, b.id, other, 105, 200), -ESTALE);
        assert_int_equal(ops->declare_dead(h, b.id, other + 1, 130, 200), -ESTALE);
        assert_int_equal(ops->declare_dead(h, b.id, other, 130, 200), 0);
        assert_int_equal(ops->declare_dead(h, b.id, other, 130, 201), -ESTALE); /* once */
        /* A dead host's beats are refused; registering again makes it live
         * at a new epoch. */
        assert_int_equal(ops->heartbeat(h, b.id, other, 202, NULL), -ESTALE);
        assert_int_equal(ops->set_draining(h, b.id, true), -ESTALE);
        assert_int_equal(ops->list(h, &list, &n), 0);
        assert_int_equal(list[1].state, HOST_DEAD);
        assert_int_equal(list[1].dead_at, 200);
        for (size_t i = 0; i < n; i++)
                store_host_record_clear(&list[i]);
        free(list);
        int64_t back = 0;
        assert_int_equal(ops->register_host(h, &b, 210, &back), 0);
        assert_int_equal(back, other + 1);
        assert_int_equal(ops->heartbeat(h, b.id, back, 211, NULL), 0);

        /* Draining survives a registration, until undrained. */
        assert_int_equal(ops->set_draining(h, "host_none", true), -ENOENT);
        assert_int_equal(ops->set_draining(h, a.id, true), 0);
        assert_int_equal(ops->register_host(h, &a, 220, &again), 0);
        assert_int_equal(ops->list(h, &list, &n), 0);
        assert_int_equal(list[0].state, HOST_DRAINING);
        assert_int_equal(list[0].dead_at, 0);
        for (size_t i = 0; i < n; i++)
                store_host_record_clear(&list[i]);
        free(list);
        assert_int_equal(ops->set_draining(h, a.id, false), 0);
        assert_int_equal(ops->list(h, &list, &n), 0);
        assert_int_equal(list[0].state, HOST_LIVE);
        for (size_t i = 0; i < n; i++)
                store_host_record_clear(&list[i]);
        free(list);

        /* The lease: taken, renewed by its holder (same epoch), refused to
         * another until it expires, then taken with a new epoch; a holder
         * that registered again is another holder. */
        int64_t le = 0, le2 = 0;
        assert_int_equal(ops->lease(h, "sweeper", a.id, 3, 10, 1000, &le), 0);
        assert_int_equal(le, 1);
        assert_int_equal(ops->lease(h, "sweeper", a.id, 3, 10, 1005, &le2), 0);
        assert_int_equal(le2, 1);
        assert_int_equal(ops->lease(h, "sweeper", b.id, back, 10, 1010, &le2), -EBUSY);
        assert_int_equal(ops->lease(h, "sweeper", a.id, 4, 10, 1010, &le2), -EBUSY);
        assert_int_equal(ops->lease(h, "sweeper", b.id, back, 10, 1016, &le2), 0);
        assert_int_equal(le2, 2);
        assert_int_equal(ops->lease(h, "other", a.id, 3, 10, 1016, &le), 0);
        assert_int_equal(le, 1);
}
