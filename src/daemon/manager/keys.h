#pragma once
/*
 * API keys as the guard rails see them: making, listing and revoking keys
 * (in the store's keys, store/store_keys.h, on a handle of their own), the trial key, and the shape a
 * trial key's sandboxes take. Its routes are in api_keys.c.
 *
 * Who may make which key:
 * - a full key of the `admin` owner without a daily limit (the key made at
 *   first start, and such keys made with it) makes keys for any owner, with
 *   any limit;
 * - another full key without a daily limit makes keys for its own owner;
 * - a full key with a daily limit makes read keys only (otherwise it could
 *   multiply its own limit by making keys);
 * - read and trial keys make none.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"
#include "daemon/store/store_keys.h"

#define KEYS_ADMIN_OWNER "admin"
#define KEYS_MAX_PER_OWNER 1000
/* A listing's bound: revoked keys stay listed, so an owner may have more. */
#define KEYS_MAX_LISTED 10000
#define KEYS_MAX_NAME 64
#define KEYS_MAX_OWNER 63
/* $1e9 a day: anything above is a typo, not a limit. */
#define KEYS_MAX_DAILY_LIMIT_MICROS 1000000000000000LL
#define KEYS_TRIAL_VCPU_MAX 2u
#define KEYS_TRIAL_MEMORY_DEFAULT_MIB 512u
#define KEYS_TRIAL_MEMORY_MAX_MIB 2048u
#define KEYS_TRIAL_ALLOWANCE_SECONDS (50 * 3600)

typedef struct KeyStore KeyStore;

/* Opens the key store of backend b at location. */
int keystore_open(const StoreBackend *b, const char *location, KeyStore **ret);
void keystore_close(KeyStore *k);

bool keys_is_admin(const KeyInfo *k);
/* Owner names: [a-z0-9][a-z0-9_-]{0,62}. */
bool keys_owner_ok(const char *s);

/* Frees what a record holds (not the record); NULL is fine. */
void keystore_record_done(KeyRecord *k);
/* Frees a listing of n records. */
void keystore_records_free(KeyRecord *list, size_t n);

/* A new key: the secret (once) in ret_secret and the key's record in ret.
 * keeps_awake makes a read key's requests activity (key_access_keeps_awake);
 * a full key's are already, and it is stored false for one. -EUSERS when a
 * trial key would pass max_trial; -EDQUOT when the owner has
 * KEYS_MAX_PER_OWNER keys. */
int keystore_create(KeyStore *ks, const char *name, const char *owner, KeyAccess access, bool keeps_awake,
                    int64_t daily_limit_micros, bool trial, unsigned max_trial, char ret_secret[64], KeyRecord *ret);
/* The keys of an owner (NULL: every owner), newest first, revoked ones
 * included, at most KEYS_MAX_LISTED; free them with keystore_records_free. */
int keystore_list(KeyStore *ks, const char *owner, KeyRecord **ret, size_t *ret_n);
/* Revokes a key of `owner` (NULL: any owner) as of `now`. -ENOENT when there
 * is no such unrevoked key; -EBUSY when it is the last full key of the admin
 * owner. */
int keystore_revoke(KeyStore *ks, const char *id, const char *owner, int64_t now);
/* How many keys there are, revoked ones included (0: the first start). */
int keystore_count(KeyStore *ks, int64_t *ret);
/* The admin key of a first start, whose secret the caller made and keeps
 * (its hash here). */
int keystore_add_admin(KeyStore *ks, const char *hash_hex, KeyRecord *ret);
/* The unrevoked key whose secret hashes to hash_hex: authentication.
 * -ENOENT. */
int keystore_by_hash(KeyStore *ks, const char *hash_hex, KeyInfo *ret);
