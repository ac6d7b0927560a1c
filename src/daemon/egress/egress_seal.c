#include "daemon/egress/egress_seal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#define NONCE_LEN 12
#define TAG_LEN 16

bool seal_is_sealed(const char *text) {
        return text && strncmp(text, SEAL_PREFIX, strlen(SEAL_PREFIX)) == 0;
}

static int crypt_gcm(bool enc, const uint8_t *key, const uint8_t *nonce, const char *aad, const uint8_t *in,
                     size_t n, uint8_t *out, uint8_t *tag) {
        EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
        if (!c)
                return -ENOMEM;
        int len = 0, ok = EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL, enc) &&
                          EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, NONCE_LEN, NULL) &&
                          EVP_CipherInit_ex(c, NULL, NULL, key, nonce, enc) &&
                          EVP_CipherUpdate(c, NULL, &len, (const uint8_t *)aad, (int)strlen(aad)) &&
                          EVP_CipherUpdate(c, out, &len, in, (int)n);
        if (ok && !enc)
                ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG_LEN, tag);
        if (ok)
                ok = EVP_CipherFinal_ex(c, out + len, &len); /* decrypting: the tag is checked here */
        if (ok && enc)
                ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG_LEN, tag);
        EVP_CIPHER_CTX_free(c);
        return ok ? 0 : -EBADMSG;
}

int seal_encrypt(const uint8_t key[SEAL_KEY_LEN], const char *aad, const char *plain, char **ret) {
        size_t n = strlen(plain);
        if (n > SEAL_MAX_PLAIN)
                return -E2BIG;
        size_t raw_len = NONCE_LEN + n + TAG_LEN;
        uint8_t *raw = malloc(raw_len);
        size_t prefix = strlen(SEAL_PREFIX), b64 = 4 * ((raw_len + 2) / 3);
        char *out = malloc(prefix + b64 + 1);
        int r = raw && out ? 0 : -ENOMEM;
        if (r == 0 && RAND_bytes(raw, NONCE_LEN) != 1)
                r = -EIO;
        if (r == 0)
                r = crypt_gcm(true, key, raw, aad, (const uint8_t *)plain, n, raw + NONCE_LEN, raw + NONCE_LEN + n);
        if (r == 0) {
                memcpy(out, SEAL_PREFIX, prefix);
                EVP_EncodeBlock((unsigned char *)out + prefix, raw, (int)raw_len);
                *ret = out;
                out = NULL;
        }
        if (raw)
                OPENSSL_cleanse(raw, raw_len);
        free(raw);
        free(out);
        return r == -EBADMSG ? -EIO : r;
}

int seal_decrypt(const uint8_t key[SEAL_KEY_LEN], const char *aad, const char *sealed, char **ret) {
        if (!seal_is_sealed(sealed))
                return -EBADMSG;
        const char *b64 = sealed + strlen(SEAL_PREFIX);
        size_t blen = strlen(b64);
        if (blen % 4 != 0 || blen > 4 * ((SEAL_MAX_PLAIN + NONCE_LEN + TAG_LEN + 2) / 3))
                return -EBADMSG;
        uint8_t *raw = malloc(blen / 4 * 3 + 1);
        if (!raw)
                return -ENOMEM;
        int got = EVP_DecodeBlock(raw, (const unsigned char *)b64, (int)blen);
        /* DecodeBlock counts the padding's bytes as data: take them off. */
        if (got >= 0 && blen >= 2 && b64[blen - 1] == '=')
                got -= b64[blen - 2] == '=' ? 2 : 1;
        if (got < NONCE_LEN + TAG_LEN) {
                free(raw);
                return -EBADMSG;
        }
        size_t n = (size_t)got - NONCE_LEN - TAG_LEN;
        char *plain = malloc(n + 1);
        int r = plain ? crypt_gcm(false, key, raw, aad, raw + NONCE_LEN, n, (uint8_t *)plain, raw + NONCE_LEN + n)
                      : -ENOMEM;
        free(raw);
        if (r < 0) {
                if (plain)
                        OPENSSL_cleanse(plain, n + 1);
                free(plain);
                return r;
        }
        plain[n] = '\0';
        if (strlen(plain) != n) { /* a NUL inside: no value this daemon sealed */
                OPENSSL_cleanse(plain, n);
                free(plain);
                return -EBADMSG;
        }
        *ret = plain;
        return 0;
}

static int hexval(char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int seal_key_parse(const char *text, uint8_t ret[SEAL_KEY_LEN]) {
        size_t n = strlen(text);
        if (n == 2 * SEAL_KEY_LEN + 1 && text[n - 1] == '\n')
                n--;
        if (n != 2 * SEAL_KEY_LEN)
                return -EINVAL;
        uint8_t k[SEAL_KEY_LEN];
        for (size_t i = 0; i < SEAL_KEY_LEN; i++) {
                int hi = hexval(text[2 * i]), lo = hexval(text[2 * i + 1]);
                if (hi < 0 || lo < 0)
                        return -EINVAL;
                k[i] = (uint8_t)(hi << 4 | lo);
        }
        memcpy(ret, k, SEAL_KEY_LEN);
        OPENSSL_cleanse(k, sizeof(k));
        return 0;
}
