#pragma once
/* API keys: "rt_" + 40 hex digits (160 random bits), stored as SHA-256 hex
 * and compared in constant time. */
#include <stdbool.h>
#include <stddef.h>

#define AUTH_KEY_LEN 43
#define AUTH_HASH_HEX_LEN 64

bool auth_key_format_ok(const char *key);
/* SHA-256 of the key as lowercase hex. 0 or -EIO. */
int auth_hash_key(const char *key, char out[AUTH_HASH_HEX_LEN + 1]);
/* Constant-time comparison of two hex hashes. */
bool auth_hash_equal(const char *a, const char *b);
int auth_generate_key(char out[AUTH_KEY_LEN + 1]);
/* The key of an "Authorization: Bearer <key>" header value, or NULL. */
const char *auth_parse_bearer(const char *header);
