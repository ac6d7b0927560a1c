#pragma once
/*
 * Addresses a sandbox may never reach through the egress proxy, and the
 * parsing of IP literals in every spelling an attacker may try.
 */
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

typedef enum EgressAddrClass {
        EGRESS_ADDR_PUBLIC = 0,
        EGRESS_ADDR_UNSPECIFIED,
        EGRESS_ADDR_LOOPBACK,
        EGRESS_ADDR_PRIVATE,    /* RFC 1918, IPv6 unique local */
        EGRESS_ADDR_LINK_LOCAL, /* 169.254/16 (cloud metadata), fe80::/10 */
        EGRESS_ADDR_CGNAT,      /* 100.64/10 */
        EGRESS_ADDR_MULTICAST,
        EGRESS_ADDR_RESERVED,   /* documentation, benchmarking, 240/4, broadcast, ... */
} EgressAddrClass;

/* Classifies an AF_INET or AF_INET6 address. IPv4-mapped, IPv4-compatible,
 * NAT64 (64:ff9b::/96) and 6to4 (2002::/16) IPv6 forms are judged by the
 * IPv4 address they carry. Other families are EGRESS_ADDR_RESERVED. */
EgressAddrClass egress_addr_classify(const struct sockaddr *sa);
const char *egress_addr_class_name(EgressAddrClass c);

/* Whether `host` is an IP literal in any spelling a resolver or a URL parser
 * would accept: dotted quad, decimal ("2130706433"), octal ("0177.0.0.1"), hex
 * ("0x7f.1"), short forms ("127.1"), IPv6 with or without brackets, with a
 * zone ("fe80::1%eth0") refused outright. On 1 the address is written to
 * *ret (port 0). 0 when it is a name; -EINVAL when it looks numeric but is
 * malformed (a name cannot be all digits and dots, so such a host is
 * refused rather than resolved). */
int egress_parse_ip_literal(const char *host, struct sockaddr_storage *ret);

/* Canonical text of an address (no brackets), for logs and comparisons. */
int egress_addr_format(const struct sockaddr *sa, char *buf, size_t len);
