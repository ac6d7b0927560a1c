#include "daemon/model/auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <openssl/evp.h>
#include <string.h>
#include <strings.h>

#include "common/random.h"

bool auth_key_format_ok(const char *key) {
        if (!key || strlen(key) != AUTH_KEY_LEN || strncmp(key, "rt_", 3) != 0)
                return false;
        for (const char *p = key + 3; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

/* SHA-256 fetched from OpenSSL's provider once: EVP_sha256() makes every
 * EVP_Digest fetch it again, which cost every request more than the hash. */
static EVP_MD *sha256;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void) {
        sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
}

int auth_hash_key(const char *key, char out[AUTH_HASH_HEX_LEN + 1]) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int len = 0;
        pthread_once(&sha256_once, sha256_fetch);
        if (!sha256 || EVP_Digest(key, strlen(key), md, &len, sha256, NULL) != 1 || len != 32)
                return -EIO;
        hex_encode(md, len, out);
        return 0;
}

bool auth_hash_equal(const char *a, const char *b) {
        if (strlen(a) != AUTH_HASH_HEX_LEN || strlen(b) != AUTH_HASH_HEX_LEN)
                return false;
        return CRYPTO_memcmp(a, b, AUTH_HASH_HEX_LEN) == 0;
}

int auth_generate_key(char out[AUTH_KEY_LEN + 1]) {
        memcpy(out, "rt_", 3);
        return random_hex(out + 3, 20);
}

const char *auth_parse_bearer(const char *header) {
        if (!header || strncasecmp(header, "Bearer ", 7) != 0)
                return NULL;
        const char *k = header + 7;
        while (*k == ' ')
                k++;
        return *k ? k : NULL;
}
