#pragma once
/* What every backend's sessions kind keeps (store_sessions.h), run on a
 * fresh handle by each backend's test. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_sessions.h"

static inline StoreSession session_row(const char *id, const char *sandbox_id, const char *token_hash,
                                       int64_t created_at, int64_t expires_at) {
        StoreSession s = { .created_at = created_at, .expires_at = expires_at };
        snprintf(s.id, sizeof s.id, "%s", id);
        snprintf(s.sandbox_id, sizeof s.sandbox_id, "%s", sandbox_id);
        snprintf(s.owner, sizeof s.owner, "%s", "alice");
        snprintf(s.token_hash, sizeof s.token_hash, "%s", token_hash);
        snprintf(s.key_hash, sizeof s.key_hash, "%s", "keyhash");
        snprintf(s.name, sizeof s.name, "%s", "front");
        snprintf(s.origins, sizeof s.origins, "%s", "https://app.example.com\nhttp://localhost:5173");
        return s;
}

static inline void sessions_contract(const StoreSessionOps *ops, StoreSessions *h) {
        StoreSession got, a = session_row("ses_a", "sbx_1", "hash-a", 100, 1000);
        assert_int_equal(ops->by_token(h, "hash-a", &got), -ENOENT);
        assert_int_equal(ops->insert(h, &a), 0);
        assert_int_equal(ops->by_token(h, "hash-a", &got), 0);
        assert_string_equal(got.id, "ses_a");
        assert_string_equal(got.sandbox_id, "sbx_1");
        assert_string_equal(got.owner, "alice");
        assert_string_equal(got.key_hash, "keyhash");
        assert_string_equal(got.name, "front");
        assert_string_equal(got.origins, "https://app.example.com\nhttp://localhost:5173");
        assert_int_equal(got.expires_at, 1000);
        assert_int_equal(got.revoked_at, 0);
        /* An id or a token's hash is never used twice. */
        StoreSession dup_id = session_row("ses_a", "sbx_1", "hash-x", 100, 1000);
        StoreSession dup_hash = session_row("ses_x", "sbx_1", "hash-a", 100, 1000);
        assert_int_equal(ops->insert(h, &dup_id), -EEXIST);
        assert_int_equal(ops->insert(h, &dup_hash), -EEXIST);
        StoreSession b = session_row("ses_b", "sbx_1", "hash-b", 200, 300);
        StoreSession c = session_row("ses_c", "sbx_2", "hash-c", 200, 1000);
        assert_int_equal(ops->insert(h, &b), 0);
        assert_int_equal(ops->insert(h, &c), 0);
        int64_t n = 0;
        assert_int_equal(ops->count_active(h, "sbx_1", 250, &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(ops->count_active(h, "sbx_1", 500, &n), 0); /* b expired */
        assert_int_equal(n, 1);
        /* Newest first; one ended before `since` is left out. */
        StoreSession *all = NULL;
        size_t k = 0;
        assert_int_equal(ops->list(h, "sbx_1", "alice", 0, 10, &all, &k), 0);
        assert_int_equal(k, 2);
        assert_string_equal(all[0].id, "ses_b");
        assert_string_equal(all[1].id, "ses_a");
        free(all);
        assert_int_equal(ops->list(h, "sbx_1", "alice", 400, 10, &all, &k), 0);
        assert_int_equal(k, 1);
        free(all);
        assert_int_equal(ops->list(h, "sbx_1", "bob", 0, 10, &all, &k), 0);
        assert_int_equal(k, 0);
        free(all);
        assert_int_equal(ops->list(h, "sbx_1", NULL, 0, 10, &all, &k), 0); /* any owner's */
        assert_int_equal(k, 2);
        free(all);
        /* Revoked: by its owner, of its sandbox only, once. */
        assert_int_equal(ops->revoke(h, "ses_a", "sbx_2", "alice", 150, &got), -ENOENT);
        assert_int_equal(ops->revoke(h, "ses_a", "sbx_1", "bob", 150, &got), -ENOENT);
        assert_int_equal(ops->revoke(h, "ses_a", "sbx_1", "alice", 150, &got), 0);
        assert_int_equal(got.revoked_at, 150);
        assert_int_equal(ops->revoke(h, "ses_a", "sbx_1", "alice", 160, &got), 0);
        assert_int_equal(got.revoked_at, 150);
        assert_int_equal(ops->by_token(h, "hash-a", &got), 0);
        assert_int_equal(got.revoked_at, 150);
        assert_int_equal(ops->count_active(h, "sbx_1", 250, &n), 0);
        assert_int_equal(n, 1);
        assert_int_equal(ops->revoke(h, "ses_nope", "sbx_1", "alice", 150, &got), -ENOENT);
}
