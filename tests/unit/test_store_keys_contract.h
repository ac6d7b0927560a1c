#pragma once
/* The keys kind's keepsAwake, the same on every backend: a read key made
 * without it has it off, one made with it has it on, and the list and
 * authentication (by_hash) say so. Leaves h open, with the keys key_poll
 * (hash of "rt_poll") and key_watch (hash of "rt_watch") of owner. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/model/access.h"
#include "daemon/model/auth.h"
#include "daemon/store/store_keys.h"

static inline void keys_keeps_awake_contract(const StoreKeyOps *ops, StoreKeys *h, const char *owner) {
        /* Hashes as authentication compares them: 64 hex digits. */
        char hash_poll[AUTH_HASH_HEX_LEN + 1], hash_watch[AUTH_HASH_HEX_LEN + 1];
        assert_int_equal(auth_hash_key("rt_poll", hash_poll), 0);
        assert_int_equal(auth_hash_key("rt_watch", hash_watch), 0);
        KeyRecord rec = { 0 };
        StoreKeyNew k = { .id = "key_poll", .name = "key_poll", .owner = owner, .hash = hash_poll,
                          .access = KEY_ACCESS_READ, .daily_limit_micros = -1, .created_at = 1 };
        assert_int_equal(ops->insert(h, &k, 0, 10, &rec), 0);
        assert_false(rec.keeps_awake);
        store_key_record_clear(&rec);
        k.id = k.name = "key_watch";
        k.hash = hash_watch;
        k.keeps_awake = true;
        assert_int_equal(ops->insert(h, &k, 0, 10, &rec), 0);
        assert_true(rec.keeps_awake);
        assert_int_equal(rec.access, KEY_ACCESS_READ);
        store_key_record_clear(&rec);
        KeyRecord *list = NULL;
        size_t n = 0;
        assert_int_equal(ops->list(h, owner, 100, &list, &n), 0);
        assert_int_equal(n, 2);
        for (size_t i = 0; i < n; i++) {
                assert_int_equal(list[i].keeps_awake, strcmp(list[i].id, "key_watch") == 0);
                store_key_record_clear(&list[i]);
        }
        free(list);
        KeyInfo info;
        assert_int_equal(ops->by_hash(h, hash_watch, &info), 0);
        assert_string_equal(info.id, "key_watch");
        assert_true(info.keeps_awake);
        assert_true(key_access_keeps_awake(info.access, info.keeps_awake));
        assert_int_equal(ops->by_hash(h, hash_poll, &info), 0);
        assert_false(info.keeps_awake);
        assert_false(key_access_keeps_awake(info.access, info.keeps_awake));
}
