#pragma once
/*
 * The keys as a backend keeps them (store.h): a key's record, owned by the
 * owner it names. Keys are written by an insert and by a revocation, each
 * one atomic with the checks it makes; no write is conditional on what a
 * caller read before, so a key carries no version.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/model/access.h"
#include "daemon/store/store.h"

/* A key as its owner may see it: never its secret or its hash. */
typedef struct KeyRecord {
        char *id;
        char *name;
        char *owner;
        KeyAccess access;
        int64_t daily_limit_micros; /* -1: none */
        bool trial;
        bool keeps_awake; /* a read key's requests are activity (key_access_keeps_awake) */
        int64_t created_at;
        int64_t revoked_at; /* 0: in use */
} KeyRecord;

/* Frees what a record holds (not the record) and zeroes it; NULL is fine. */
static inline void store_key_record_clear(KeyRecord *k) {
        if (!k)
                return;
        free(k->id);
        free(k->name);
        free(k->owner);
        *k = (KeyRecord){ 0 };
}

/* A key to store: its record's fields and the hash of its secret. */
typedef struct StoreKeyNew {
        const char *id;
        const char *name;
        const char *owner;
        const char *hash;
        KeyAccess access;
        int64_t daily_limit_micros; /* -1: none */
        bool trial;
        bool keeps_awake; /* a read key's requests are activity; false for a full key */
        int64_t created_at;
} StoreKeyNew;

/* A key, as authentication needs it. */
typedef struct KeyInfo {
        char id[40];
        char name[128];
        char owner[128];
        KeyAccess access;
        int64_t daily_limit_micros; /* -1: unlimited */
        bool trial;
        bool keeps_awake; /* a read key's requests are activity (key_access_keeps_awake) */
} KeyInfo;

typedef struct StoreKeys StoreKeys;

struct StoreKeyOps {
        /* Opens the keys at location; the tables are the daemon's (made by
         * its migrations). */
        int (*open)(const char *location, StoreKeys **ret);
        void (*close)(StoreKeys *h);
        /* Inserts the key and reads its record back, atomically with the
         * counts it is checked against: -EUSERS when it is a trial key and
         * max_trial trial keys (revoked ones too) exist; -EDQUOT when its
         * owner has max_per_owner unrevoked keys. */
        int (*insert)(StoreKeys *h, const StoreKeyNew *k, unsigned max_trial, unsigned max_per_owner,
                      KeyRecord *ret);
        /* The keys of owner (NULL: all), newest first, revoked ones
         * included, at most max; an array the caller frees record by record. */
        int (*list)(StoreKeys *h, const char *owner, size_t max, KeyRecord **ret, size_t *ret_n);
        /* Sets revoked_at of the unrevoked key id of owner (NULL: any) to
         * now, atomically with the check: -ENOENT when there is no such key
         * (revoked already included); -EBUSY when it is the last full, non-trial,
         * unrevoked key of keep_owner. */
        int (*revoke)(StoreKeys *h, const char *id, const char *owner, const char *keep_owner, int64_t now);
        /* The number of keys, revoked ones included (none: the first start). */
        int (*count)(StoreKeys *h, int64_t *ret);
        /* The unrevoked key whose secret hashes to hash_hex (compared in
         * constant time); -ENOENT. */
        int (*by_hash)(StoreKeys *h, const char *hash_hex, KeyInfo *ret);
};

/* The SQLite backend's keys (sqlite_keys.c). */
extern const StoreKeyOps store_sqlite_keys;
/* The PostgreSQL backend's keys (postgres_keys.c). */
extern const StoreKeyOps store_postgres_keys;
