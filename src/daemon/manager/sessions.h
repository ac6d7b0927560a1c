#pragma once
/*
 * Sandbox sessions (docs/sessions.md): a short-lived token a backend makes
 * for its own frontend, which then uses one sandbox directly (its commands,
 * processes, files, terminals, watches and previews; the route table says
 * which routes, http.h's HttpRoute.session) and nothing else. A token is
 * "rtsess_" and 48 hex digits (192 random bits); the store keeps its SHA-256
 * only, and the hash of the key that made it: a session ends with its key,
 * at its expiry, or when revoked. Library code: returns, logs nothing.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store_sessions.h"

#define SESSION_TOKEN_PREFIX "rtsess_"
#define SESSION_TOKEN_LEN (7 + 48)
/* A session's life: an hour unless asked, a minute at least, a day at most. */
#define SESSION_TTL_DEFAULT 3600
#define SESSION_TTL_MIN 60
#define SESSION_TTL_MAX 86400
/* Browser origins one session answers CORS for, and an origin's length. */
#define SESSION_MAX_ORIGINS 10
#define SESSION_ORIGIN_MAX 253
/* Sessions one sandbox may have active at once. */
#define SESSIONS_MAX_ACTIVE 100
/* A listing's bound, and how long an ended session stays listed. */
#define SESSIONS_MAX_LISTED 1000
#define SESSIONS_LISTED_AFTER_END 86400

typedef struct Sessions Sessions;

int sessions_open(const StoreBackend *b, const char *location, Sessions **ret);
void sessions_close(Sessions *s);
int sessions_set_epoch(Sessions *s, const char *host_id, int64_t epoch);

/* Whether token has a session token's shape (the prefix and 48 lowercase hex). */
bool session_token_format_ok(const char *token);
/* An origin as a browser sends it: http or https, "://", a lowercase host
 * (letters, digits, '.', '-'; or an IPv6 address in brackets) and an
 * optional port, nothing after. */
bool session_origin_ok(const char *origin, size_t len);
/* Whether origins (one a line, as stored) holds origin exactly. */
bool session_origin_listed(const char *origins, const char *origin);

/* A new session of sandbox_id for owner, made by the key whose hash is
 * key_hash, ending ttl seconds after now, answering CORS for origins (one a
 * line, checked by the caller): the token (shown once) in ret_token and the
 * row in ret. -EUSERS past SESSIONS_MAX_ACTIVE. */
int sessions_create(Sessions *s, const char *sandbox_id, const char *owner, const char *key_hash, const char *name,
                    int64_t ttl, const char *origins, int64_t now, char ret_token[SESSION_TOKEN_LEN + 1],
                    StoreSession *ret);
/* The session of a token, active at now: -ENOENT for none (or a token of
 * another shape), -EKEYREVOKED, -EKEYEXPIRED. */
int sessions_by_token(Sessions *s, const char *token, int64_t now, StoreSession *ret);
/* The sandbox's sessions of owner (NULL: any owner's) active now or ended
 * in the last SESSIONS_LISTED_AFTER_END seconds, newest first. */
int sessions_list(Sessions *s, const char *sandbox_id, const char *owner, int64_t now, StoreSession **ret,
                  size_t *ret_n);
int sessions_revoke(Sessions *s, const char *id, const char *sandbox_id, const char *owner, int64_t now,
                    StoreSession *ret);
/* Whether a session is active at now. */
bool session_active(const StoreSession *row, int64_t now);
