#pragma once
/* Base64 (RFC 4648's alphabet, libc only). */
#include <stddef.h>
#include <stdint.h>

/* Strict base64: padded, no blanks, '=' only at the end. A malloc'd buffer
 * in *ret (never NULL, even for no bytes) and its length in *ret_len;
 * -EINVAL for text that is not base64, -E2BIG when it decodes to more than
 * max bytes, -ENOMEM. */
int base64_decode(const char *in, size_t len, size_t max, uint8_t **ret, size_t *ret_len);
