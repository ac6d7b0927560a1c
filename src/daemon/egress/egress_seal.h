#pragma once
/* Values sealed with a key kept outside the database (AES-256-GCM, openssl's
 * EVP): what the store keeps of an egress secret is
 *     "sealed:v1:" base64(12-byte nonce | ciphertext | 16-byte tag)
 * with its owner and name as associated data, so that a sealed value moved
 * to another row does not open there. The key is in a file of its own
 * (--secrets-key-file), never in the database. Logs nothing. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SEAL_KEY_LEN 32
#define SEAL_PREFIX "sealed:v1:"
/* The longest value sealed: an egress secret's bound, with room. */
#define SEAL_MAX_PLAIN (64 * 1024)

/* Whether text is a sealed value (its prefix). */
bool seal_is_sealed(const char *text);
/* The sealed text of plain (malloc'ed, NUL-ended); -E2BIG past
 * SEAL_MAX_PLAIN, -ENOMEM, -EIO. */
int seal_encrypt(const uint8_t key[SEAL_KEY_LEN], const char *aad, const char *plain, char **ret);
/* The plain text of sealed (malloc'ed, NUL-ended); -EBADMSG when it is not
 * sealed text or does not open with key and aad (a wrong key, another row's
 * value, a change), -ENOMEM. */
int seal_decrypt(const uint8_t key[SEAL_KEY_LEN], const char *aad, const char *sealed, char **ret);
/* A key from its text form: 64 hex digits (a final newline allowed). */
int seal_key_parse(const char *text, uint8_t ret[SEAL_KEY_LEN]);
