#pragma once
/* The file links kind, the same on every backend: a sandbox's secret is
 * kept once (a second add keeps the first), rotated in place, read back
 * with its owner; a one-time link's use is claimed once, by one of many
 * claimers at once, and its record goes when the link has expired. Leaves
 * h open. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_links.h"

typedef struct LinksRace {
        const StoreLinkOps *ops;
        StoreLinks *h; /* each claimer's own handle: another connection */
        int rc;
} LinksRace;

static void *links_race_claim(void *arg) {
        LinksRace *x = arg;
        x->rc = x->ops->use_once(x->h, "lnk_00000000000000aa", "sbx_race", 5000, 1000);
        return NULL;
}

/* open_other opens another handle on the same store (another connection,
 * as another thread or host has). */
static inline void links_contract(const StoreLinkOps *ops, StoreLinks *h, StoreLinks *(*open_other)(void *),
                                  void *userdata) {
        StoreLinkSecret s = { 0 };
        assert_int_equal(ops->secret_get(h, "sbx_a", &s), -ENOENT);
        assert_int_equal(ops->secret_add(h, "sbx_a", "alice", "sealed:first", 100, &s), 0);
        assert_string_equal(s.owner, "alice");
        assert_string_equal(s.secret, "sealed:first");
        store_link_secret_clear(&s);
        /* A second first link (another host at once) keeps the first secret. */
        assert_int_equal(ops->secret_add(h, "sbx_a", "alice", "sealed:second", 101, &s), 0);
        assert_string_equal(s.secret, "sealed:first");
        assert_int_equal(s.rotated_at, 100);
        store_link_secret_clear(&s);
        /* A revoke replaces it, and makes one for a sandbox without. */
        assert_int_equal(ops->secret_rotate(h, "sbx_a", "alice", "sealed:rotated", 200), 0);
        assert_int_equal(ops->secret_rotate(h, "sbx_b", "bob", "sealed:b", 200), 0);
        assert_int_equal(ops->secret_get(h, "sbx_a", &s), 0);
        assert_string_equal(s.secret, "sealed:rotated");
        assert_int_equal(s.rotated_at, 200);
        store_link_secret_clear(&s);
        assert_int_equal(ops->secret_get(h, "sbx_b", &s), 0);
        assert_string_equal(s.owner, "bob");
        store_link_secret_clear(&s);

        /* A one-time link: once, then never again while it lives. */
        assert_int_equal(ops->use_once(h, "lnk_0000000000000001", "sbx_a", 500, 100), 0);
        assert_int_equal(ops->use_once(h, "lnk_0000000000000001", "sbx_a", 500, 101), -EALREADY);
        assert_int_equal(ops->use_once(h, "lnk_0000000000000002", "sbx_a", 500, 101), 0);
        /* Expired, its record goes with the next claim (the link itself is
         * refused for its expiry before any claim): the table does not grow
         * with links long dead. */
        assert_int_equal(ops->use_once(h, "lnk_0000000000000003", "sbx_a", 900, 600), 0);
        assert_int_equal(ops->use_once(h, "lnk_0000000000000001", "sbx_a", 500, 600), 0);
        assert_int_equal(ops->use_once(h, "lnk_0000000000000003", "sbx_a", 900, 600), -EALREADY);

        /* Many claimers at once, each with its own connection: one wins. */
        enum { N = 6 };
        LinksRace x[N];
        pthread_t t[N];
        for (int i = 0; i < N; i++) {
                x[i] = (LinksRace){ .ops = ops, .h = open_other(userdata), .rc = 1 };
                assert_non_null(x[i].h);
        }
        for (int i = 0; i < N; i++)
                assert_int_equal(pthread_create(&t[i], NULL, links_race_claim, &x[i]), 0);
        int won = 0;
        for (int i = 0; i < N; i++) {
                pthread_join(t[i], NULL);
                assert_true(x[i].rc == 0 || x[i].rc == -EALREADY);
                won += x[i].rc == 0;
                ops->close(x[i].h);
        }
        assert_int_equal(won, 1);
}
