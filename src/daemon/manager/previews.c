#include "daemon/manager/previews.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/sessions.h"

#define SECRET_LEN 32
#define MAC_HEX_LEN 64

struct Previews {
        const StorePreviewOps *ops;
        StorePreviews *h;
        uint8_t key[SEAL_KEY_LEN];
};

int previews_open(const StoreBackend *b, const char *location, const uint8_t seal_key[SEAL_KEY_LEN],
                  Previews **ret) {
        if (!b->previews)
                return -EOPNOTSUPP;
        Previews *pv = calloc(1, sizeof(*pv));
        if (!pv)
                return -ENOMEM;
        pv->ops = b->previews;
        memcpy(pv->key, seal_key, SEAL_KEY_LEN);
        int r = pv->ops->open(location, &pv->h);
        if (r < 0) {
                explicit_bzero(pv->key, sizeof pv->key);
                free(pv);
                return r;
        }
        *ret = pv;
        return 0;
}

void previews_close(Previews *pv) {
        if (!pv)
                return;
        pv->ops->close(pv->h);
        explicit_bzero(pv->key, sizeof pv->key);
        free(pv);
}

int previews_set_epoch(Previews *pv, const char *host_id, int64_t epoch) {
        return pv->ops->set_writer(pv->h, host_id, epoch);
}

/* What the seal binds a secret to: its sandbox and port. */
static void aad_of(const char *sandbox_id, unsigned port, char *buf, size_t n) {
        snprintf(buf, n, "preview:%s:%u", sandbox_id, port);
}

static int seal_new(Previews *pv, const char *sandbox_id, unsigned port, char *ret, size_t ret_len) {
        uint8_t secret[SECRET_LEN];
        char hex[2 * SECRET_LEN + 1], aad[96];
        _cleanup_free_ char *sealed = NULL;
        int r = random_bytes(secret, sizeof secret);
        if (r < 0)
                return r;
        hex_encode(secret, sizeof secret, hex);
        aad_of(sandbox_id, port, aad, sizeof aad);
        r = seal_encrypt(pv->key, aad, hex, &sealed);
        explicit_bzero(secret, sizeof secret);
        explicit_bzero(hex, sizeof hex);
        if (r < 0)
                return r;
        if (strlen(sealed) >= ret_len)
                return -ENAMETOOLONG;
        snprintf(ret, ret_len, "%s", sealed);
        return 0;
}

static int hex_nibble(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

static int unseal(Previews *pv, const StorePreview *p, uint8_t ret[SECRET_LEN]) {
        char aad[96];
        _cleanup_free_ char *hex = NULL;
        aad_of(p->sandbox_id, p->port, aad, sizeof aad);
        int r = seal_decrypt(pv->key, aad, p->secret, &hex);
        if (r < 0)
                return r;
        int bad = strlen(hex) != 2 * SECRET_LEN;
        for (size_t i = 0; !bad && i < SECRET_LEN; i++) {
                int hi = hex_nibble(hex[2 * i]), lo = hex_nibble(hex[2 * i + 1]);
                bad = hi < 0 || lo < 0;
                ret[i] = (uint8_t)(hi << 4 | lo);
        }
        explicit_bzero(hex, strlen(hex));
        return bad ? -EBADMSG : 0;
}

int previews_put(Previews *pv, const char *sandbox_id, const char *owner, unsigned port, bool public,
                 int64_t expires_at, const char *embed_origins, StorePreview *ret) {
        if (port < 1 || port > 65535 || strlen(sandbox_id) >= STORE_PREVIEW_ID_MAX ||
            strlen(owner) >= STORE_PREVIEW_OWNER_MAX ||
            (embed_origins && strlen(embed_origins) >= STORE_PREVIEW_EMBED_MAX))
                return -EINVAL;
        int64_t now = time_now_unix();
        StorePreview p = { .port = port, .public = public, .created_at = now, .rotated_at = now,
                           .expires_at = expires_at };
        snprintf(p.sandbox_id, sizeof p.sandbox_id, "%s", sandbox_id);
        snprintf(p.owner, sizeof p.owner, "%s", owner);
        snprintf(p.embed_origins, sizeof p.embed_origins, "%s", embed_origins ?: "");
        /* A secret for a new row; one there keeps its own (the store's
         * upsert leaves it), so a change of visibility keeps its tokens. */
        int r = seal_new(pv, sandbox_id, port, p.secret, sizeof p.secret);
        if (r < 0)
                return r;
        return pv->ops->put(pv->h, &p, embed_origins != NULL, ret);
}

int previews_get(Previews *pv, const char *sandbox_id, unsigned port, StorePreview *ret) {
        return pv->ops->get(pv->h, sandbox_id, port, ret);
}

int previews_list(Previews *pv, const char *sandbox_id, StorePreview **ret, size_t *ret_n) {
        return pv->ops->list(pv->h, sandbox_id, ret, ret_n);
}

int previews_rotate(Previews *pv, const char *sandbox_id, unsigned port) {
        char sealed[STORE_PREVIEW_SECRET_MAX];
        int r = seal_new(pv, sandbox_id, port, sealed, sizeof sealed);
        if (r < 0)
                return r;
        return pv->ops->rotate(pv->h, sandbox_id, port, sealed, time_now_unix());
}

int previews_remove(Previews *pv, const char *sandbox_id, unsigned port) {
        return pv->ops->remove(pv->h, sandbox_id, port);
}

bool preview_embed_origin_ok(const char *origin, size_t len) {
        const char *sep = len > 0 ? memmem(origin, len, "://", 3) : NULL;
        if (!sep || len > SESSION_ORIGIN_MAX)
                return false;
        size_t at = (size_t)(sep - origin) + 3;
        if (len - at < 2 || origin[at] != '*' || origin[at + 1] != '.')
                return session_origin_ok(origin, len);
        /* *.example.com: the origin without "*." is checked, and must name
         * a domain of two labels or more (never *.com, never an address). */
        char rest[SESSION_ORIGIN_MAX + 1];
        memcpy(rest, origin, at);
        memcpy(rest + at, origin + at + 2, len - at - 2);
        size_t n = len - 2;
        rest[n] = '\0';
        const char *host = rest + at, *colon = memchr(host, ':', n - at);
        size_t host_len = colon ? (size_t)(colon - host) : n - at;
        const char *dot = memchr(host, '.', host_len);
        return session_origin_ok(rest, n) && host[0] != '[' && dot && dot + 1 < host + host_len;
}

bool preview_expired(const StorePreview *p, int64_t now) {
        return p->expires_at > 0 && p->expires_at <= now;
}

static int mac(const uint8_t secret[SECRET_LEN], const StorePreview *p, int64_t expires_at,
               char ret[MAC_HEX_LEN + 1]) {
        char msg[160];
        uint8_t out[32];
        size_t len = 0;
        /* NUL-separated fields: no two (sandbox, port, expiry) share a text. */
        int n = snprintf(msg, sizeof msg, "runtime-preview-v1%c%s%c%u%c%" PRId64, 0, p->sandbox_id, 0, p->port, 0,
                         expires_at);
        if (n < 0 || (size_t)n >= sizeof msg)
                return -EINVAL;
        EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
        EVP_MAC_CTX *c = m ? EVP_MAC_CTX_new(m) : NULL;
        OSSL_PARAM params[] = { OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0), OSSL_PARAM_END };
        int r = c && EVP_MAC_init(c, secret, SECRET_LEN, params) == 1 &&
                                EVP_MAC_update(c, (const uint8_t *)msg, (size_t)n) == 1 &&
                                EVP_MAC_final(c, out, &len, sizeof out) == 1 && len == sizeof out
                        ? 0
                        : -EIO;
        EVP_MAC_CTX_free(c);
        EVP_MAC_free(m);
        if (r == 0)
                hex_encode(out, sizeof out, ret);
        return r;
}

int previews_token(Previews *pv, const StorePreview *p, int64_t expires_at, char ret[PREVIEW_TOKEN_MAX],
                   int64_t *ret_expires_at) {
        uint8_t secret[SECRET_LEN];
        char hex[MAC_HEX_LEN + 1];
        if (p->expires_at > 0 && (expires_at <= 0 || expires_at > p->expires_at))
                expires_at = p->expires_at;
        int r = unseal(pv, p, secret);
        if (r == 0)
                r = mac(secret, p, expires_at, hex);
        explicit_bzero(secret, sizeof secret);
        if (r < 0)
                return r;
        snprintf(ret, PREVIEW_TOKEN_MAX, "%" PRId64 ".%s", expires_at, hex);
        if (ret_expires_at)
                *ret_expires_at = expires_at;
        return 0;
}

bool previews_token_ok(Previews *pv, const StorePreview *p, const char *token, size_t len, int64_t now) {
        const char *dot = memchr(token, '.', len);
        if (!dot || dot == token || dot - token > 19 || len - (size_t)(dot - token) - 1 != MAC_HEX_LEN)
                return false;
        int64_t expires_at = 0;
        for (const char *c = token; c < dot; c++) {
                if (*c < '0' || *c > '9')
                        return false;
                expires_at = expires_at * 10 + (*c - '0');
        }
        uint8_t secret[SECRET_LEN];
        char want[MAC_HEX_LEN + 1];
        int r = unseal(pv, p, secret);
        if (r == 0)
                r = mac(secret, p, expires_at, want);
        explicit_bzero(secret, sizeof secret);
        if (r < 0)
                return false;
        bool same = CRYPTO_memcmp(want, dot + 1, MAC_HEX_LEN) == 0;
        return same && expires_at > now && !preview_expired(p, now);
}
