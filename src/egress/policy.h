#pragma once
/*
 * A sandbox's egress policy: {internet, allow: [patterns], deny: [patterns]}.
 * A pattern is a host name ("pypi.org"), a wildcard ("*.pythonhosted.org":
 * sub-domains only, not the bare domain), or an IP literal, each optionally
 * with ":port" (default: 80 and 443). Matching is case-insensitive and
 * ignores a trailing dot; deny wins over allow.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EGRESS_MAX_PATTERNS 256
#define EGRESS_MAX_HOST 253
/* "allow " or "deny " and a pattern as given (a host, "*.", ":port"). */
#define EGRESS_MAX_RULE 288

typedef struct EgressPolicy EgressPolicy;

typedef enum EgressVerdict {
        EGRESS_ALLOW = 0,
        EGRESS_DENY_NO_INTERNET, /* internet: false */
        EGRESS_DENY_NOT_ALLOWED, /* an allow list exists and nothing in it matches */
        EGRESS_DENY_DENIED,      /* a deny pattern matches */
        EGRESS_DENY_PORT,        /* the host matches, the port does not */
        EGRESS_DENY_BAD_HOST,    /* not a valid host name */
} EgressVerdict;

/* Parses and validates a `network` object (NULL means {internet: false}).
 * On error returns -EINVAL and writes a message naming the bad field or
 * pattern to err. */
int egress_policy_parse(const json_t *network, EgressPolicy **ret, char *err, size_t err_len);
void egress_policy_free(EgressPolicy *p);
/* The normalised object: {"internet", "allow", "deny"}; a new reference. */
json_t *egress_policy_to_json(const EgressPolicy *p);

/* The decision for a connection to host:port. `host` is as the client wrote
 * it (a name or an IP literal, brackets allowed for IPv6). */
EgressVerdict egress_policy_check(const EgressPolicy *p, const char *host, uint16_t port);
/* The same, and the rule that decided into rule (rule_len bytes, at most
 * EGRESS_MAX_RULE needed): "allow PATTERN", "deny PATTERN", "internet: any
 * public host on 80 and 443", "internet: false", or "" when no rule matched
 * (a host outside the allow list, a port no pattern of the host names). */
EgressVerdict egress_policy_check_rule(const EgressPolicy *p, const char *host, uint16_t port, char *rule,
                                       size_t rule_len);
const char *egress_verdict_reason(EgressVerdict v);

/* Normalises a host name into out (lower case, no trailing dot) and checks
 * its syntax: labels of [a-z0-9_-]{1,63} not starting or ending with '-',
 * at most 253 bytes in all; or an IP literal. -EINVAL otherwise. */
int egress_host_normalize(const char *host, char *out, size_t out_len);
