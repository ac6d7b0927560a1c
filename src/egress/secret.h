#pragma once
/*
 * Egress secrets: a value the sandbox never holds. It sees a placeholder in an
 * environment variable; the proxy writes the value in place of the
 * placeholder only in requests to the secret's own hosts, so the value cannot
 * be reflected out through a server the secret was not meant for.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "egress/policy.h"

#define EGRESS_SECRET_MAX_VALUE 8192
#define EGRESS_PLACEHOLDER_PREFIX "runtime-secret-"
#define EGRESS_SECRET_MAX_HEADER 64  /* a header name's bytes */
#define EGRESS_SECRET_MAX_FORMAT 256 /* a format's bytes, {value} included */
#define EGRESS_SECRET_MAX_RULES 16
#define EGRESS_SECRET_MAX_RULE_METHODS 16
#define EGRESS_SECRET_MAX_RULE_PATHS 32
#define EGRESS_SECRET_MAX_RULE_PATH 512

typedef struct EgressSecretRule {
        unsigned n_methods; /* 0: every method */
        char methods[EGRESS_SECRET_MAX_RULE_METHODS][16];
        unsigned n_paths;
        char *paths[EGRESS_SECRET_MAX_RULE_PATHS]; /* exact, or a prefix: "/a/" then a star */
} EgressSecretRule;

typedef struct EgressSecret {
        char name[65];        /* an environment variable name */
        char placeholder[96]; /* EGRESS_PLACEHOLDER_PREFIX + name + '-' + 32 hex */
        char *value;
        EgressPolicy *hosts; /* {internet: true, allow: hosts} */
        /* With a header, the proxy sets it, as format with {value} replaced,
         * on every request to the hosts (a header of that name the sandbox
         * sent is dropped first). */
        char header[EGRESS_SECRET_MAX_HEADER + 1]; /* "" : none */
        char *format;                               /* NULL: "{value}" */
        EgressSecretRule *rules;                    /* NULL: every request to the hosts */
        unsigned n_rules;
} EgressSecret;

/* A secret value goes into HTTP header lines, so it must not be able to
 * end one: visible ASCII and spaces only, 1..EGRESS_SECRET_MAX_VALUE bytes. */
bool egress_secret_value_valid(const char *value, size_t len);
/* A secret's name: an environment variable name ([A-Za-z_][A-Za-z0-9_]{0,63})
 * that is not one the daemon sets itself (the proxy's, PATH, ...). */
bool egress_secret_name_ok(const char *name);
/* A header name: an RFC 9110 token of 1..EGRESS_SECRET_MAX_HEADER bytes, and
 * not one that frames the message or steers the connection (Host,
 * Content-Length, Transfer-Encoding, Connection, Upgrade, Proxy-*, ...). */
bool egress_secret_header_valid(const char *name);
/* A format: visible ASCII and spaces, at most EGRESS_SECRET_MAX_FORMAT bytes,
 * holding "{value}" exactly once. */
bool egress_secret_format_valid(const char *format);
/* Parses a rules array strictly (1..EGRESS_SECRET_MAX_RULES objects of
 * "methods" (optional) and "paths"), see docs/egress.md. On success *ret is
 * the normalized JSON (methods upper case) and, when ret_rules is not NULL,
 * the parsed rules (free with egress_secret_rules_free). -EINVAL with err. */
int egress_secret_rules_parse(const json_t *rules, json_t **ret, EgressSecretRule **ret_rules, unsigned *ret_n,
                              char *err, size_t err_len);
void egress_secret_rules_free(EgressSecretRule *rules, unsigned n);
/* Whether a rule of s allows method on target (origin form, query
 * included). A target that is not canonical (dot segments, encoded slashes
 * or dots, ';', '\\', "//") is allowed by no rule. True without rules. */
bool egress_secret_rules_allow(const EgressSecret *s, const char *method, const char *target);
bool egress_secret_applies(const EgressSecret *s, const char *host, uint16_t port);
bool egress_any_secret_applies(const EgressSecret *secrets, size_t n, const char *host, uint16_t port);

/* Copies `in` with every placeholder of a secret that applies to host:port
 * replaced by its value. *ret is malloc'ed and NUL-terminated. Returns the
 * number of replacements, or -ENOMEM / -E2BIG (result over 64 KiB). */
int egress_substitute(const char *in, size_t len, const EgressSecret *secrets, size_t n, const char *host,
                      uint16_t port, char **ret, size_t *ret_len);

/* What the proxy sends upstream for one request head (origin form, as the
 * parser made it) to host:port: the secrets that apply are checked against
 * their rules first, then placeholders replaced and header secrets set.
 * A secret is used by a request that holds its placeholder or, for a header
 * secret, by every request to its hosts; when a used secret's rules refuse
 * the request, nothing is sent: -EACCES, and `why` names the secret and the
 * request (never the value). Otherwise the number of values written, with
 * *ret malloc'ed. -ENOMEM, -E2BIG (over 64 KiB), -EINVAL (no request line). */
int egress_secret_prepare_head(const char *head, size_t len, const EgressSecret *secrets, size_t n,
                               const char *host, uint16_t port, char **ret, size_t *ret_len, char *why,
                               size_t why_len);
