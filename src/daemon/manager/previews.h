#pragma once
/*
 * Previews: a sandbox's port shared at a host name of its own (docs/
 * previews.md). Each preview has a secret of 32 random bytes, kept sealed
 * in the store with the egress secrets' key (its sandbox and port as
 * associated data, so that a secret moved to another row does not open)
 * and shared by every host of a fleet. A private preview's token is signed
 * with it: "EXPIRY.MAC", the expiry in Unix seconds and the MAC an
 * HMAC-SHA256 over the sandbox, the port and the expiry. No token is ever
 * stored; a rotation replaces the secret, and every token signed before
 * fails. Library code: returns, logs nothing.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/egress/egress_seal.h"
#include "daemon/store/store_previews.h"

/* "EXPIRY.MAC": up to 20 digits, a dot, 64 hex digits. */
#define PREVIEW_TOKEN_MAX 96
/* A token's life when nothing shorter is asked: a day. */
#define PREVIEW_TOKEN_DEFAULT_SECONDS 86400
/* The longest life a token or a preview's TTL may ask: seven days. */
#define PREVIEW_MAX_TTL_SECONDS (7 * 86400)

/* Where previews are reached: http(s)://PORT-SANDBOX.DOMAIN[:PORT]. */
typedef struct PreviewSite {
        char domain[254];
        unsigned public_port; /* the port in the URLs; 80 or 443 is left out */
        bool https;           /* URLs say https (TLS ends at a proxy in front) */
} PreviewSite;

/* The query argument and cookie that carry a private preview's token, and
 * its header. */
#define PREVIEW_TOKEN_ARG "runtime_preview_token"
#define PREVIEW_TOKEN_HEADER "x-runtime-preview-token"

typedef struct Previews Previews;

int previews_open(const StoreBackend *b, const char *location, const uint8_t seal_key[SEAL_KEY_LEN],
                  Previews **ret);
void previews_close(Previews *pv);
int previews_set_epoch(Previews *pv, const char *host_id, int64_t epoch);

/* The sites that may frame a preview: at most this many origins. */
#define PREVIEW_EMBED_MAX_ORIGINS 16

/* Shares the port (a new secret), or changes the visibility and end of the
 * preview there; *ret is the row kept. expires_at 0: lives as long as its
 * sandbox. embed_origins (one a line, each preview_embed_origin_ok; "":
 * any site) replaces the preview's; NULL keeps them (none for a new one). */
int previews_put(Previews *pv, const char *sandbox_id, const char *owner, unsigned port, bool public,
                 int64_t expires_at, const char *embed_origins, StorePreview *ret);
int previews_get(Previews *pv, const char *sandbox_id, unsigned port, StorePreview *ret);
int previews_list(Previews *pv, const char *sandbox_id, StorePreview **ret, size_t *ret_n);
/* A new secret: every token signed before fails. */
int previews_rotate(Previews *pv, const char *sandbox_id, unsigned port);
/* port 0: every preview of the sandbox. */
int previews_remove(Previews *pv, const char *sandbox_id, unsigned port);

/* Whether origin (len bytes) may be one of a preview's embed origins:
 * scheme://host[:port] in lowercase as a session's origin is
 * (session_origin_ok), or with a first label "*" before at least two more
 * ("*.example.com" after the scheme, Content-Security-Policy's own
 * wildcard). Nothing else: no path, no "*" alone, no "null", no space, comma or semicolon
 * that would reach the header it is written into. */
bool preview_embed_origin_ok(const char *origin, size_t len);

/* Whether the preview has ended by now (its TTL). */
bool preview_expired(const StorePreview *p, int64_t now);
/* A token for the preview, valid until expires_at (capped by the
 * preview's own end). -EBADMSG when its secret does not open. */
int previews_token(Previews *pv, const StorePreview *p, int64_t expires_at, char ret[PREVIEW_TOKEN_MAX],
                   int64_t *ret_expires_at);
/* Whether token (len bytes, not NUL-terminated) is one of the preview's
 * and unexpired at now; the MAC compared in constant time. */
bool previews_token_ok(Previews *pv, const StorePreview *p, const char *token, size_t len, int64_t now);
