#pragma once
/*
 * Operator-declared public upstreams: address ranges (CIDRs) that the egress
 * proxy treats as public although the IANA registry calls them private or
 * reserved, for networks where the package index or a corporate proxy
 * answers from such an address (split-horizon DNS, a registry gateway, TLS
 * inspection). Off unless the daemon is started with --egress-public-cidr.
 *
 * Such a range can never open what a sandbox must not reach: loopback,
 * link-local (cloud metadata), the unspecified address, multicast, broadcast,
 * IPv6 forms that carry an IPv4 address, or an address of this host. Those
 * are refused when the range is declared, and again per connection.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define EGRESS_MAX_PUBLIC_CIDRS 32

typedef struct EgressCidr {
        int family;       /* AF_INET or AF_INET6 */
        uint8_t net[16];  /* host bits zero; IPv4 in the first 4 bytes */
        unsigned prefix;  /* 0..32 or 0..128 */
} EgressCidr;

/* Parses "a.b.c.d/n" or an IPv6 "x:y::z/n" strictly: dotted-quad IPv4 only
 * (no short, octal or hex forms), no brackets, no zone, a decimal prefix
 * without leading zeros, host bits all zero. A bare address is a single host
 * (/32, /128). -EINVAL otherwise. */
int egress_cidr_parse(const char *text, EgressCidr *ret);
/* "203.0.113.0/24", "2001:db8::/32". */
int egress_cidr_format(const EgressCidr *c, char *buf, size_t len);
/* Whether an AF_INET/AF_INET6 address lies in the range. An IPv4 range
 * matches AF_INET addresses only, an IPv6 range AF_INET6 ones only. */
bool egress_cidr_contains(const EgressCidr *c, const struct sockaddr *sa);

/* Whether a range may be declared public: 0, or -EPERM with the reason in
 * err (the range it overlaps). `own` are this host's addresses. */
int egress_cidr_check_public(const EgressCidr *c, const struct sockaddr_storage *own, size_t n_own, char *err,
                             size_t err_len);
/* The addresses of this host's interfaces, up to `max`. */
int egress_host_addrs(struct sockaddr_storage *ret, size_t max, size_t *ret_n);

/* The range among `cidrs` that admits `sa` as a public upstream, or NULL.
 * Never admits a loopback, link-local, unspecified, multicast or metadata
 * address, nor one of this host's addresses at the time of the call, whatever
 * the ranges say. */
const EgressCidr *egress_cidr_admit(const EgressCidr *cidrs, size_t n, const struct sockaddr *sa);
