#pragma once
/*
 * Sandbox sessions as a backend keeps them (store.h): one row per session,
 * with its sandbox and owner, the hash of its token (never the token), the
 * hash of the key that made it (a session ends with that key), the browser
 * origins it answers CORS for (one per line), and when it ends and was
 * revoked. Every host of a fleet reads the same rows.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"

#define STORE_SESSION_ID_MAX 32
#define STORE_SESSION_HASH_MAX 65
#define STORE_SESSION_NAME_MAX 65
/* Ten origins of at most 253 bytes, one a line. */
#define STORE_SESSION_ORIGINS_MAX 2600

typedef struct StoreSession {
        char id[STORE_SESSION_ID_MAX];
        char sandbox_id[64];
        char owner[128];
        char token_hash[STORE_SESSION_HASH_MAX];
        char key_hash[STORE_SESSION_HASH_MAX];
        char name[STORE_SESSION_NAME_MAX];
        char origins[STORE_SESSION_ORIGINS_MAX];
        int64_t created_at, expires_at;
        int64_t revoked_at; /* 0: not revoked */
} StoreSession;

typedef struct StoreSessions StoreSessions;

struct StoreSessionOps {
        int (*open)(const char *location, StoreSessions **ret);
        void (*close)(StoreSessions *h);
        /* The host whose writes these are, at its epoch (a fleet). */
        int (*set_writer)(StoreSessions *h, const char *host_id, int64_t epoch);
        /* A new session; -EEXIST for an id or token hash in use. */
        int (*insert)(StoreSessions *h, const StoreSession *s);
        /* The session of a token's hash, revoked or not; -ENOENT. */
        int (*by_token)(StoreSessions *h, const char *token_hash, StoreSession *ret);
        /* The sandbox's sessions of owner (NULL: any owner's) that were
         * active at `since` or later, newest first, at most max; *ret
         * malloc'd. */
        int (*list)(StoreSessions *h, const char *sandbox_id, const char *owner, int64_t since, size_t max,
                    StoreSession **ret, size_t *ret_n);
        /* Sessions of the sandbox neither revoked nor expired at now. */
        int (*count_active)(StoreSessions *h, const char *sandbox_id, int64_t now, int64_t *ret);
        /* Revokes the owner's session of the sandbox as of now (one
         * revoked already keeps its time); *ret the row. -ENOENT. */
        int (*revoke)(StoreSessions *h, const char *id, const char *sandbox_id, const char *owner, int64_t now,
                      StoreSession *ret);
};

extern const StoreSessionOps store_sqlite_sessions;
extern const StoreSessionOps store_postgres_sessions;
