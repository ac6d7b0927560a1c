#pragma once
/* Keys for the unit tests, written and read through the store's keys table
 * of the SQLite backend at path (the daemon's schema made first, by
 * db_open). */
#include <stdbool.h>

#include "daemon/store/store.h"
#include "daemon/store/store_keys.h"

static inline int test_key_insert(const char *path, const char *id, const char *name, const char *owner, bool full,
                                  const char *hash, bool trial) {
        StoreKeys *h = NULL;
        int r = store_sqlite.keys->open(path, &h);
        if (r < 0)
                return r;
        StoreKeyNew k = { .id = id, .name = name, .owner = owner, .hash = hash, .access = full ? KEY_ACCESS_FULL : KEY_ACCESS_READ,
                          .daily_limit_micros = -1, .trial = trial, .created_at = 1 };
        KeyRecord rec = { 0 };
        r = store_sqlite.keys->insert(h, &k, 1000, 1000, &rec);
        store_key_record_clear(&rec);
        store_sqlite.keys->close(h);
        return r;
}

static inline int test_key_by_hash(const char *path, const char *hash, KeyInfo *ret) {
        StoreKeys *h = NULL;
        int r = store_sqlite.keys->open(path, &h);
        if (r < 0)
                return r;
        r = store_sqlite.keys->by_hash(h, hash, ret);
        store_sqlite.keys->close(h);
        return r;
}

static inline int test_key_count(const char *path, int64_t *ret) {
        StoreKeys *h = NULL;
        int r = store_sqlite.keys->open(path, &h);
        if (r < 0)
                return r;
        r = store_sqlite.keys->count(h, ret);
        store_sqlite.keys->close(h);
        return r;
}
