#pragma once
/*
 * Egress secrets: a value the sandbox never holds. It sees a placeholder in an
 * environment variable; the proxy writes the value in place of the
 * placeholder only in requests to the secret's own hosts, so the value cannot
 * be reflected out through a server the secret was not meant for.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "egress/policy.h"

#define EGRESS_SECRET_MAX_VALUE 8192
#define EGRESS_PLACEHOLDER_PREFIX "runtime-secret-"

typedef struct EgressSecret {
        char name[65];        /* an environment variable name */
        char placeholder[96]; /* EGRESS_PLACEHOLDER_PREFIX + name + '-' + 32 hex */
        char *value;
        EgressPolicy *hosts; /* {internet: true, allow: hosts} */
} EgressSecret;

/* A secret value goes into HTTP header lines, so it must not be able to
 * end one: no CR, LF or NUL, 1..EGRESS_SECRET_MAX_VALUE bytes. */
bool egress_secret_value_valid(const char *value, size_t len);
bool egress_secret_applies(const EgressSecret *s, const char *host, uint16_t port);
bool egress_any_secret_applies(const EgressSecret *secrets, size_t n, const char *host, uint16_t port);

/* Copies `in` with every placeholder of a secret that applies to host:port
 * replaced by its value. *ret is malloc'ed and NUL-terminated. Returns the
 * number of replacements, or -ENOMEM / -E2BIG (result over 64 KiB). */
int egress_substitute(const char *in, size_t len, const EgressSecret *secrets, size_t n, const char *host,
                      uint16_t port, char **ret, size_t *ret_len);
