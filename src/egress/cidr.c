#include "egress/cidr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "egress/addr.h"

#define MAX_CIDR_TEXT 64

typedef struct Forbidden {
        const char *text;
        const char *what;
} Forbidden;

/* Ranges no operator setting may open. Metadata services that live outside
 * link-local are named one by one: AWS's IPv6 endpoint and Alibaba Cloud's,
 * which sits in the carrier-grade NAT range. IPv6 forms that carry an IPv4
 * address would reach that IPv4 address by another spelling: a range of
 * IPv4 upstreams is declared as IPv4. */
static const Forbidden forbidden[] = {
        { "0.0.0.0/8", "the unspecified address (\"this network\")" },
        { "127.0.0.0/8", "loopback" },
        { "169.254.0.0/16", "link-local (cloud metadata)" },
        { "100.100.100.200/32", "a cloud metadata address" },
        { "224.0.0.0/4", "multicast" },
        { "255.255.255.255/32", "broadcast" },
        { "::/128", "the unspecified address" },
        { "::1/128", "loopback" },
        { "::/96", "IPv4-compatible addresses (they carry an IPv4 address)" },
        { "::ffff:0:0/96", "IPv4-mapped addresses (they carry an IPv4 address)" },
        { "64:ff9b::/96", "NAT64 (it carries an IPv4 address)" },
        { "64:ff9b:1::/48", "local-use NAT64 (it carries an IPv4 address)" },
        { "2001::/32", "Teredo (it carries an IPv4 address)" },
        { "2002::/16", "6to4 (it carries an IPv4 address)" },
        { "fe80::/10", "link-local" },
        { "fd00:ec2::254/128", "a cloud metadata address" },
        { "ff00::/8", "multicast" },
};

static bool is_decimal(const char *s, size_t n) {
        if (n == 0)
                return false;
        for (size_t i = 0; i < n; i++)
                if (s[i] < '0' || s[i] > '9')
                        return false;
        return true;
}

int egress_cidr_parse(const char *text, EgressCidr *ret) {
        if (!text || !ret)
                return -EINVAL;
        size_t len = strnlen(text, MAX_CIDR_TEXT + 1);
        if (len == 0 || len > MAX_CIDR_TEXT)
                return -EINVAL;
        char addr[MAX_CIDR_TEXT + 1];
        memcpy(addr, text, len + 1);

        EgressCidr c = { 0 };
        bool v6 = strchr(addr, ':') != NULL;
        unsigned max = v6 ? 128 : 32;
        c.prefix = max;
        char *slash = strchr(addr, '/');
        if (slash) {
                *slash = '\0';
                const char *p = slash + 1;
                size_t pl = strlen(p);
                /* One slash, 1-3 digits, no leading zero ("/08" is refused:
                 * some parsers read it as octal). */
                if (!is_decimal(p, pl) || pl > 3 || (pl > 1 && p[0] == '0'))
                        return -EINVAL;
                unsigned v = 0;
                for (size_t i = 0; i < pl; i++)
                        v = v * 10 + (unsigned)(p[i] - '0');
                if (v > max)
                        return -EINVAL;
                c.prefix = v;
        }
        /* Only the characters an address of the family is written with: no
         * brackets, zones, spaces or signs for inet_pton to be lenient about. */
        for (const char *p = addr; *p; p++) {
                bool ok = (*p >= '0' && *p <= '9') || *p == '.' ||
                          (v6 && (*p == ':' || (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F')));
                if (!ok)
                        return -EINVAL;
        }
        if (!v6) {
                /* inet_pton takes only the dotted quad, but glibc's accepts
                 * leading zeros ("010.0.0.1"), which other parsers read as
                 * octal: refuse them. */
                const char *p = addr;
                for (int part = 0; part < 4; part++) {
                        const char *dot = strchr(p, '.');
                        size_t n = dot ? (size_t)(dot - p) : strlen(p);
                        if (n == 0 || n > 3 || (n > 1 && p[0] == '0'))
                                return -EINVAL;
                        if (!dot)
                                break;
                        p = dot + 1;
                }
                if (inet_pton(AF_INET, addr, c.net) != 1)
                        return -EINVAL;
                c.family = AF_INET;
        } else {
                if (inet_pton(AF_INET6, addr, c.net) != 1)
                        return -EINVAL;
                c.family = AF_INET6;
        }
        /* Host bits set ("203.0.113.80/24") is a typo or a misunderstanding;
         * guessing which would widen or narrow what the operator meant. */
        for (unsigned bit = c.prefix; bit < max; bit++)
                if (c.net[bit / 8] & (0x80u >> (bit % 8)))
                        return -EINVAL;
        *ret = c;
        return 0;
}

int egress_cidr_format(const EgressCidr *c, char *buf, size_t len) {
        char a[INET6_ADDRSTRLEN];
        if (!inet_ntop(c->family, c->net, a, sizeof(a)))
                return -errno;
        int n = snprintf(buf, len, "%s/%u", a, c->prefix);
        return n < 0 || (size_t)n >= len ? -ENOSPC : 0;
}

static bool prefix_match(const uint8_t *a, const uint8_t *b, unsigned bits) {
        unsigned bytes = bits / 8, rest = bits % 8;
        if (memcmp(a, b, bytes) != 0)
                return false;
        if (rest == 0)
                return true;
        uint8_t mask = (uint8_t)(0xff << (8 - rest));
        return (a[bytes] & mask) == (b[bytes] & mask);
}

/* The family and address bytes of a socket address, or false. */
static bool addr_bytes(const struct sockaddr *sa, int *ret_family, const uint8_t **ret) {
        if (!sa)
                return false;
        if (sa->sa_family == AF_INET) {
                *ret = (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
                *ret_family = AF_INET;
                return true;
        }
        if (sa->sa_family == AF_INET6) {
                *ret = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
                *ret_family = AF_INET6;
                return true;
        }
        return false;
}

bool egress_cidr_contains(const EgressCidr *c, const struct sockaddr *sa) {
        int family;
        const uint8_t *a;
        if (!c || !addr_bytes(sa, &family, &a) || family != c->family)
                return false;
        return prefix_match(a, c->net, c->prefix);
}

static bool overlaps(const EgressCidr *a, const EgressCidr *b) {
        if (a->family != b->family)
                return false;
        return prefix_match(a->net, b->net, a->prefix < b->prefix ? a->prefix : b->prefix);
}

int egress_cidr_check_public(const EgressCidr *c, const struct sockaddr_storage *own, size_t n_own, char *err,
                             size_t err_len) {
        char text[MAX_CIDR_TEXT + 8] = "?";
        egress_cidr_format(c, text, sizeof(text));
        for (size_t i = 0; i < sizeof(forbidden) / sizeof(forbidden[0]); i++) {
                EgressCidr f;
                if (egress_cidr_parse(forbidden[i].text, &f) < 0)
                        return -EINVAL; /* the table is ours: cannot happen */
                if (overlaps(c, &f)) {
                        snprintf(err, err_len, "%s overlaps %s, %s, which a sandbox may never reach", text,
                                 forbidden[i].text, forbidden[i].what);
                        return -EPERM;
                }
        }
        for (size_t i = 0; i < n_own; i++)
                if (egress_cidr_contains(c, (const struct sockaddr *)&own[i])) {
                        char a[64] = "?";
                        egress_addr_format((const struct sockaddr *)&own[i], a, sizeof(a));
                        snprintf(err, err_len, "%s holds %s, an address of this host, which a sandbox may never reach",
                                 text, a);
                        return -EPERM;
                }
        return 0;
}

int egress_host_addrs(struct sockaddr_storage *ret, size_t max, size_t *ret_n) {
        struct ifaddrs *ifa = NULL;
        if (getifaddrs(&ifa) < 0)
                return -errno;
        size_t n = 0;
        for (struct ifaddrs *i = ifa; i && n < max; i = i->ifa_next) {
                if (!i->ifa_addr)
                        continue;
                size_t sz = i->ifa_addr->sa_family == AF_INET    ? sizeof(struct sockaddr_in)
                            : i->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                 : 0;
                if (sz == 0)
                        continue;
                memset(&ret[n], 0, sizeof(ret[n]));
                memcpy(&ret[n], i->ifa_addr, sz);
                n++;
        }
        freeifaddrs(ifa);
        *ret_n = n;
        return 0;
}

static bool is_host_address(const struct sockaddr *sa) {
        int family;
        const uint8_t *a;
        if (!addr_bytes(sa, &family, &a))
                return true;
        struct ifaddrs *ifa = NULL;
        if (getifaddrs(&ifa) < 0)
                return true; /* cannot tell: fail closed */
        bool found = false;
        for (struct ifaddrs *i = ifa; i && !found; i = i->ifa_next) {
                int f;
                const uint8_t *b;
                if (i->ifa_addr && addr_bytes(i->ifa_addr, &f, &b) && f == family)
                        found = memcmp(a, b, family == AF_INET ? 4 : 16) == 0;
        }
        freeifaddrs(ifa);
        return found;
}

const EgressCidr *egress_cidr_admit(const EgressCidr *cidrs, size_t n, const struct sockaddr *sa) {
        if (n == 0)
                return NULL;
        switch (egress_addr_classify(sa)) {
        case EGRESS_ADDR_UNSPECIFIED:
        case EGRESS_ADDR_LOOPBACK:
        case EGRESS_ADDR_LINK_LOCAL:
        case EGRESS_ADDR_MULTICAST:
                return NULL;
        default:
                break;
        }
        const EgressCidr *hit = NULL;
        for (size_t i = 0; i < n && !hit; i++)
                if (egress_cidr_contains(&cidrs[i], sa))
                        hit = &cidrs[i];
        if (!hit)
                return NULL;
        /* The start-up check already refused such ranges; this holds should
         * one have slipped through, and for interfaces that came up since. */
        for (size_t i = 0; i < sizeof(forbidden) / sizeof(forbidden[0]); i++) {
                EgressCidr f;
                if (egress_cidr_parse(forbidden[i].text, &f) < 0 || egress_cidr_contains(&f, sa))
                        return NULL;
        }
        if (is_host_address(sa))
                return NULL;
        return hit;
}
