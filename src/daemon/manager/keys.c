#include "daemon/manager/keys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/model/auth.h"

struct KeyStore {
        const StoreKeyOps *ops;
        StoreKeys *h;
};

int keystore_open(const StoreBackend *b, const char *location, KeyStore **ret) {
        if (!b || !b->keys)
                return -EPROTONOSUPPORT;
        KeyStore *k = calloc(1, sizeof(*k));
        if (!k)
                return -ENOMEM;
        k->ops = b->keys;
        int r = k->ops->open(location, &k->h);
        if (r < 0) {
                free(k);
                return r;
        }
        *ret = k;
        return 0;
}

void keystore_close(KeyStore *k) {
        if (!k)
                return;
        k->ops->close(k->h);
        free(k);
}

bool keys_is_admin(const KeyInfo *k) {
        /* A limited key of the admin owner is no admin: it could otherwise
         * mint an unlimited key for itself. */
        return k->access == KEY_ACCESS_FULL && !k->trial && k->daily_limit_micros < 0 && strcmp(k->owner, KEYS_ADMIN_OWNER) == 0;
}

bool keys_owner_ok(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > KEYS_MAX_OWNER)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && (c == '-' || c == '_'));
                if (!ok)
                        return false;
        }
        return true;
}

void keystore_record_done(KeyRecord *k) {
        store_key_record_clear(k);
}

void keystore_records_free(KeyRecord *list, size_t n) {
        for (size_t i = 0; list && i < n; i++)
                keystore_record_done(&list[i]);
        free(list);
}

int keystore_create(KeyStore *ks, const char *name, const char *owner, KeyAccess access, bool keeps_awake,
                    int64_t daily_limit_micros, bool trial, unsigned max_trial, char ret_secret[64], KeyRecord *ret) {
        char secret[AUTH_KEY_LEN + 1], hash[AUTH_HASH_HEX_LEN + 1], idhex[17], id[24];
        int r;
        if ((r = auth_generate_key(secret)) < 0 || (r = auth_hash_key(secret, hash)) < 0 ||
            (r = random_hex(idhex, 8)) < 0)
                return r;
        snprintf(id, sizeof(id), "key_%s", idhex);
        StoreKeyNew k = { .id = id, .name = name, .owner = owner, .hash = hash, .access = access,
                          .daily_limit_micros = daily_limit_micros, .trial = trial,
                          .keeps_awake = access == KEY_ACCESS_READ && keeps_awake, .created_at = time_now_unix() };
        KeyRecord made = { 0 };
        r = ks->ops->insert(ks->h, &k, max_trial, KEYS_MAX_PER_OWNER, &made);
        if (r < 0) {
                explicit_bzero(secret, sizeof(secret));
                return r;
        }
        snprintf(ret_secret, 64, "%s", secret);
        explicit_bzero(secret, sizeof(secret));
        *ret = made;
        return 0;
}

int keystore_list(KeyStore *ks, const char *owner, KeyRecord **ret, size_t *ret_n) {
        return ks->ops->list(ks->h, owner, KEYS_MAX_LISTED, ret, ret_n);
}

int keystore_count(KeyStore *ks, int64_t *ret) {
        return ks->ops->count(ks->h, ret);
}

int keystore_add_admin(KeyStore *ks, const char *hash_hex, KeyRecord *ret) {
        char idhex[17], id[24];
        int r = random_hex(idhex, 8);
        if (r < 0)
                return r;
        snprintf(id, sizeof(id), "key_%s", idhex);
        StoreKeyNew k = { .id = id, .name = "admin", .owner = KEYS_ADMIN_OWNER, .hash = hash_hex, .access = KEY_ACCESS_FULL,
                          .daily_limit_micros = -1, .created_at = time_now_unix() };
        return ks->ops->insert(ks->h, &k, 0, KEYS_MAX_PER_OWNER, ret);
}

int keystore_by_hash(KeyStore *ks, const char *hash_hex, KeyInfo *ret) {
        return ks->ops->by_hash(ks->h, hash_hex, ret);
}

int keystore_revoke(KeyStore *ks, const char *id, const char *owner, int64_t now) {
        /* Never lock the installation out: the admin owner keeps a full key. */
        return ks->ops->revoke(ks->h, id, owner, KEYS_ADMIN_OWNER, now);
}
