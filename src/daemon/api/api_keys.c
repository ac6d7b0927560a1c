/* The guard rails' routes: keys, limits, trial. */
#include "daemon/api/api_keys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "common/log.h"

/* The API's key object, in the order clients have always seen its fields
 * (keepsAwake, newer, last). keepsAwake says what the key's requests do, so
 * a full key's is true. */
static json_t *key_json(const KeyRecord *k) {
        return json_pack("{s:s,s:s,s:s,s:s,s:o,s:b,s:o,s:o,s:b}", "id", k->id, "name", k->name, "owner", k->owner,
                         "access", key_access_name(k->access), "dailyLimitMicros",
                         k->daily_limit_micros >= 0 ? json_integer(k->daily_limit_micros) : json_null(), "trial",
                         k->trial, "createdAt", json_time_or_null(k->created_at), "revokedAt",
                         json_time_or_null(k->revoked_at), "keepsAwake",
                         key_access_keeps_awake(k->access, k->keeps_awake));
}

/* A key just made: its object with the secret, shown this once. */
static json_t *made_key_json(const KeyRecord *k, const char *secret) {
        json_t *j = key_json(k);
        if (j && json_object_set_new(j, "key", json_string(secret)) < 0) {
                json_decref(j);
                return NULL;
        }
        return j;
}

static int parse_create(Req *r, json_t *body, char **ret_name, char **ret_owner, bool *ret_full,
                        bool *ret_keeps_awake, int64_t *ret_limit, ApiError *e) {
        const KeyInfo *me = &r->key;
        const char *key;
        json_t *v;
        json_object_foreach (body, key, v)
                if (strcmp(key, "name") != 0 && strcmp(key, "access") != 0 && strcmp(key, "dailyLimitMicros") != 0 &&
                    strcmp(key, "owner") != 0 && strcmp(key, "keepsAwake") != 0)
                        return api_error(e, 400, "invalid_request",
                                         "the fields are name, access, keepsAwake, dailyLimitMicros, owner",
                                         "unknown field %.64s", key);
        v = json_object_get(body, "name");
        if (!json_is_string(v))
                return api_error(e, 400, "invalid_request", NULL, "name is required: a string of 1 to %d bytes",
                                 KEYS_MAX_NAME);
        const char *name = json_string_value(v);
        size_t len = json_string_length(v);
        if (len == 0 || len > KEYS_MAX_NAME)
                return api_error(e, 400, "invalid_request", NULL, "name must be 1 to %d bytes", KEYS_MAX_NAME);
        for (size_t i = 0; i < len; i++)
                if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
                        return api_error(e, 400, "invalid_request", NULL, "name must be printable");
        bool full = true;
        v = json_object_get(body, "access");
        if (v) {
                if (!json_is_string(v) ||
                    (strcmp(json_string_value(v), "full") != 0 && strcmp(json_string_value(v), "read") != 0))
                        return api_error(e, 400, "invalid_request", NULL, "access must be \"full\" or \"read\"");
                full = strcmp(json_string_value(v), "full") == 0;
        }
        /* A full key's requests are activity whatever it says: true is what
         * it does anyway, false would be a promise the daemon cannot keep. */
        bool keeps_awake = false;
        v = json_object_get(body, "keepsAwake");
        if (v) {
                if (!json_is_boolean(v))
                        return api_error(e, 400, "invalid_request", NULL, "keepsAwake must be true or false");
                keeps_awake = json_is_true(v);
                if (full && !keeps_awake)
                        return api_error(e, 400, "invalid_request",
                                         "leave keepsAwake out, or make a read key (\"access\": \"read\")",
                                         "keepsAwake: false is for read keys: a full key's requests always keep "
                                         "its sandboxes from their idle pause");
        }
        int64_t limit = -1;
        v = json_object_get(body, "dailyLimitMicros");
        if (v && !json_is_null(v)) {
                if (!json_is_integer(v))
                        return api_error(e, 400, "invalid_request", NULL,
                                         "dailyLimitMicros must be an integer (micro-dollars) or null");
                limit = json_integer_value(v);
                if (limit < 0 || limit > KEYS_MAX_DAILY_LIMIT_MICROS)
                        return api_error(e, 400, "invalid_request", NULL, "dailyLimitMicros must be between 0 and %lld",
                                         KEYS_MAX_DAILY_LIMIT_MICROS);
        }
        const char *owner = me->owner;
        v = json_object_get(body, "owner");
        if (v && !json_is_null(v)) {
                if (!json_is_string(v) || !keys_owner_ok(json_string_value(v)))
                        return api_error(e, 400, "invalid_request", NULL,
                                         "owner must match [a-z0-9][a-z0-9_-]* and be at most %d bytes", KEYS_MAX_OWNER);
                owner = json_string_value(v);
        }
        if (me->trial)
                return api_error(e, 403, "forbidden", "ask the daemon's administrator for a full key",
                                 "a trial key cannot make keys");
        if (!keys_is_admin(me)) {
                if (strcmp(owner, me->owner) != 0)
                        return api_error(e, 403, "forbidden", "leave owner out: keys are made for your own owner",
                                         "only an admin key makes keys for another owner");
                if (me->daily_limit_micros >= 0 && full)
                        return api_error(e, 403, "forbidden", "make a read key (\"access\": \"read\"), or ask for a key without a daily limit",
                                         "a key with a daily limit can make read keys only");
        }
        *ret_name = strdup(name);
        *ret_owner = strdup(owner);
        if (!*ret_name || !*ret_owner) {
                free(*ret_name);
                free(*ret_owner);
                return -ENOMEM;
        }
        *ret_full = full;
        *ret_keeps_awake = keeps_awake;
        *ret_limit = limit;
        return 0;
}

enum MHD_Result handle_keys_create(Req *r) {
        json_t *body = r->json;
        ApiError e = { 0 };
        _cleanup_free_ char *name = NULL, *owner = NULL;
        bool full = false, keeps_awake = false;
        int64_t limit = -1;
        int rc = parse_create(r, body, &name, &owner, &full, &keeps_awake, &limit, &e);
        if (rc < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        char secret[64];
        _cleanup_(keystore_record_done) KeyRecord k = { 0 };
        rc = keystore_create(r->app->keys, name, owner, full ? KEY_ACCESS_FULL : KEY_ACCESS_READ, keeps_awake, limit,
                             false, 0, secret, &k);
        if (rc == -EDQUOT) {
                api_error(&e, 429, "rate_limited", "revoke keys you no longer use", "the owner %s has %d keys already",
                          owner, KEYS_MAX_PER_OWNER);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return api_reply_store_error(r, rc, "make the key");
        json_t *j = made_key_json(&k, secret);
        explicit_bzero(secret, sizeof(secret));
        if (!j)
                return reply_internal(r);
        log_info(r->rid, "key %s made for owner %s by %s", k.id, owner, r->key.id);
        return reply_json(r, 201, j);
}

enum MHD_Result handle_keys_list(Req *r) {
        KeyRecord *list = NULL;
        size_t n = 0;
        int rc = keystore_list(r->app->keys, keys_is_admin(&r->key) ? NULL : r->key.owner, &list, &n);
        if (rc < 0)
                return api_reply_store_error(r, rc, "list the keys");
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < n; i++)
                if (json_array_append_new(arr, key_json(&list[i])) < 0) {
                        json_decref(arr);
                        arr = NULL;
                }
        keystore_records_free(list, n);
        json_t *j = arr ? json_pack("{s:o}", "keys", arr) : NULL;
        if (!j)
                return reply_internal(r);
        return reply_json(r, 200, j);
}

enum MHD_Result handle_key_revoke(Req *r) {
        ApiError e = { 0 };
        int64_t now = time_now_unix();
        int rc = keystore_revoke(r->app->keys, r->route.key_id, keys_is_admin(&r->key) ? NULL : r->key.owner, now);
        if (rc == -ENOENT) {
                api_error(&e, 404, "not_found", "list your keys with GET /v1/keys", "no key %s", r->route.key_id);
                return reply_error(r, &e);
        }
        if (rc == -EBUSY) {
                api_error(&e, 409, "conflict", "make another full admin key first",
                          "key %s is the last full key of the admin owner", r->route.key_id);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return api_reply_store_error(r, rc, "revoke the key");
        log_info(r->rid, "key %s revoked by %s", r->route.key_id, r->key.id);
        json_t *j = json_pack("{s:s,s:b,s:o}", "id", r->route.key_id, "revoked", 1, "revokedAt", json_time_or_null(now));
        if (!j)
                return reply_internal(r);
        return reply_json(r, 200, j);
}

/* GET /v1/limits's answer for the request's key. */
static int limits_json(Req *r, json_t **ret) {
        const KeyInfo *k = &r->key;
        int64_t now = time_now_unix();
        LedgerKeyUse u;
        int rc = ledger_key_use(r->app->ledger, k->id, now, &u);
        if (rc < 0)
                return rc;
        json_t *limit = json_null(), *remaining = json_null();
        if (k->daily_limit_micros >= 0) {
                int64_t left = k->daily_limit_micros - u.used_micros;
                limit = json_integer(k->daily_limit_micros);
                remaining = json_integer(left > 0 ? left : 0);
        }
        json_t *trial = json_null();
        if (k->trial) {
                int64_t allowance = r->app->cfg->trial_allowance_seconds;
                int64_t left = allowance - u.used_seconds;
                trial = json_pack("{s:I,s:I,s:I}", "sandboxSeconds", (json_int_t)allowance, "usedSandboxSeconds",
                                  (json_int_t)u.used_seconds, "remainingSandboxSeconds", (json_int_t)(left > 0 ? left : 0));
        }
        *ret = json_pack("{s:s,s:s,s:s,s:b,s:{s:o,s:I,s:o,s:I,s:I,s:i,s:o},s:o}", "access", key_access_name(k->access),
                         "keyId", k->id, "owner", k->owner, "trial", k->trial, "daily", "limitMicros", limit,
                         "usedMicros", (json_int_t)u.used_micros, "remainingMicros", remaining, "settledMicros",
                         (json_int_t)u.settled_micros, "reservedMicros", (json_int_t)u.reserved_micros,
                         "windowSeconds", LEDGER_WINDOW_SECONDS, "freesAt", json_time_or_null(u.frees_at),
                         "trialAllowance", trial);
        return *ret ? 0 : -ENOMEM;
}

enum MHD_Result handle_limits(Req *r) {
        json_t *j = NULL;
        int rc = limits_json(r, &j);
        if (rc < 0)
                return api_reply_store_error(r, rc, "read the key's spending");
        return reply_json(r, 200, j);
}

/* Who the key is. A self-hosted daemon is one organization: its owner names
 * it, the key is the credential, and there are no people or agents beyond
 * the key's owner. */
enum MHD_Result handle_me(Req *r) {
        const KeyInfo *k = &r->key;
        json_t *limits = NULL;
        int rc = limits_json(r, &limits);
        if (rc < 0)
                return api_reply_store_error(r, rc, "read the key's spending");
        return reply_json(r, 200,
                          json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:b,s:b,s:b,s:o}", "orgId", k->owner, "orgName",
                                    k->owner, "owner", k->owner, "principal_id", k->id, "keyId", k->id, "keyName",
                                    k->name, "access", key_access_name(k->access), "keepsAwake",
                                    key_access_keeps_awake(k->access, k->keeps_awake), "trial", k->trial,
                                    "selfHosted", 1, "limits", limits));
}

enum MHD_Result handle_trial(Req *r) {
        ApiError e = { 0 };
        const DaemonConfig *cfg = r->app->cfg;
        if (cfg->max_trial_keys == 0) {
                api_error(&e, 403, "forbidden", "ask the daemon's administrator for a key",
                          "this daemon hands out no trial keys");
                return reply_error(r, &e);
        }
        if (!req_from_this_host(r, cfg->socket_path != NULL)) {
                api_error(&e, 403, "forbidden", "ask the daemon's administrator for a key",
                          "trial keys are handed out on this machine only (loopback or the unix socket)");
                return reply_error(r, &e);
        }
        char idhex[9], owner[32], secret[64];
        if (random_hex(idhex, 4) < 0)
                return reply_internal(r);
        snprintf(owner, sizeof(owner), "trial_%s", idhex);
        _cleanup_(keystore_record_done) KeyRecord k = { 0 };
        int rc = keystore_create(r->app->keys, "trial", owner, KEY_ACCESS_FULL, false, -1, true, cfg->max_trial_keys,
                                 secret, &k);
        if (rc == -EUSERS) {
                api_error(&e, 429, "rate_limited", "ask the daemon's administrator for a full key",
                          "this daemon has handed out its %u trial keys", cfg->max_trial_keys);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return api_reply_store_error(r, rc, "make a trial key");
        json_t *j = made_key_json(&k, secret);
        explicit_bzero(secret, sizeof(secret));
        if (!j || json_object_set_new(j, "trialAllowance", json_pack("{s:I}", "sandboxSeconds",
                                                                      (json_int_t)cfg->trial_allowance_seconds)) < 0) {
                json_decref(j);
                return reply_internal(r);
        }
        log_info(r->rid, "trial key %s made (owner %s)", k.id, owner);
        return reply_json(r, 201, j);
}
