#pragma once
#include <stddef.h>

/* Fills buf from the kernel's CSPRNG (getrandom, blocking until seeded).
 * 0 or a negative errno. */
int random_bytes(void *buf, size_t n);
/* Writes 2*nbytes lowercase hex digits and a NUL to out (2*nbytes+1 bytes). */
int random_hex(char *out, size_t nbytes);
/* Lowercase hex of n bytes into out (2*n+1 bytes). */
void hex_encode(const void *buf, size_t n, char *out);
