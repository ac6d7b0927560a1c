#include "egress/addr.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct V4Range {
        uint32_t net;
        uint8_t prefix;
        EgressAddrClass cls;
} V4Range;

/* IANA's IPv4 special-purpose registry, minus the globally reachable ones. */
static const V4Range v4_ranges[] = {
        { 0x00000000, 8, EGRESS_ADDR_UNSPECIFIED }, /* 0.0.0.0/8 "this network" */
        { 0x0a000000, 8, EGRESS_ADDR_PRIVATE },     /* 10/8 */
        { 0x64400000, 10, EGRESS_ADDR_CGNAT },      /* 100.64/10 */
        { 0x7f000000, 8, EGRESS_ADDR_LOOPBACK },    /* 127/8 */
        { 0xa9fe0000, 16, EGRESS_ADDR_LINK_LOCAL }, /* 169.254/16, cloud metadata */
        { 0xac100000, 12, EGRESS_ADDR_PRIVATE },    /* 172.16/12 */
        { 0xc0000000, 24, EGRESS_ADDR_RESERVED },   /* 192.0.0/24 protocol assignments */
        { 0xc0000200, 24, EGRESS_ADDR_RESERVED },   /* 192.0.2/24 TEST-NET-1 */
        { 0xc0586300, 24, EGRESS_ADDR_RESERVED },   /* 192.88.99/24 6to4 relay anycast */
        { 0xc0a80000, 16, EGRESS_ADDR_PRIVATE },    /* 192.168/16 */
        { 0xc6120000, 15, EGRESS_ADDR_RESERVED },   /* 198.18/15 benchmarking */
        { 0xc6336400, 24, EGRESS_ADDR_RESERVED },   /* 198.51.100/24 TEST-NET-2 */
        { 0xcb007100, 24, EGRESS_ADDR_RESERVED },   /* 203.0.113/24 TEST-NET-3 */
        { 0xe0000000, 4, EGRESS_ADDR_MULTICAST },   /* 224/4 */
        { 0xf0000000, 4, EGRESS_ADDR_RESERVED },    /* 240/4 and 255.255.255.255 */
};

static EgressAddrClass classify_v4(uint32_t a) {
        for (size_t i = 0; i < sizeof(v4_ranges) / sizeof(v4_ranges[0]); i++) {
                uint32_t mask = v4_ranges[i].prefix == 0 ? 0 : 0xffffffffu << (32 - v4_ranges[i].prefix);
                if ((a & mask) == v4_ranges[i].net)
                        return v4_ranges[i].cls;
        }
        return EGRESS_ADDR_PUBLIC;
}

static uint32_t v4_at(const uint8_t *p) {
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static bool prefix_eq(const uint8_t *a, const uint8_t *b, unsigned bits) {
        unsigned bytes = bits / 8, rest = bits % 8;
        if (memcmp(a, b, bytes) != 0)
                return false;
        if (rest == 0)
                return true;
        uint8_t mask = (uint8_t)(0xff << (8 - rest));
        return (a[bytes] & mask) == (b[bytes] & mask);
}

static EgressAddrClass classify_v6(const uint8_t a[16]) {
        static const uint8_t zero[16] = { 0 };
        static const uint8_t loop[16] = { [15] = 1 };
        static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };
        static const uint8_t nat64[12] = { 0x00, 0x64, 0xff, 0x9b };
        static const uint8_t sixto4[2] = { 0x20, 0x02 };

        if (memcmp(a, zero, 16) == 0)
                return EGRESS_ADDR_UNSPECIFIED;
        if (memcmp(a, loop, 16) == 0)
                return EGRESS_ADDR_LOOPBACK;
        /* Forms that carry an IPv4 address are as dangerous as that address. */
        if (memcmp(a, mapped, 12) == 0 || memcmp(a, nat64, 12) == 0)
                return classify_v4(v4_at(a + 12));
        if (memcmp(a, zero, 12) == 0) /* deprecated IPv4-compatible ::a.b.c.d */
                return classify_v4(v4_at(a + 12));
        if (memcmp(a, sixto4, 2) == 0) {
                EgressAddrClass c = classify_v4(v4_at(a + 2));
                return c == EGRESS_ADDR_PUBLIC ? EGRESS_ADDR_RESERVED : c;
        }
        if (a[0] == 0xff)
                return EGRESS_ADDR_MULTICAST;
        if ((a[0] & 0xfe) == 0xfc) /* fc00::/7 unique local */
                return EGRESS_ADDR_PRIVATE;
        if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) /* fe80::/10 */
                return EGRESS_ADDR_LINK_LOCAL;
        if (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0) /* fec0::/10 site local, deprecated */
                return EGRESS_ADDR_PRIVATE;
        static const struct {
                uint8_t net[16];
                unsigned bits;
        } reserved[] = {
                { { 0x00, 0x64, 0xff, 0x9b, 0x00, 0x01 }, 48 }, /* 64:ff9b:1::/48 local NAT64 */
                { { 0x01, 0x00 }, 64 },                         /* 100::/64 discard */
                { { 0x20, 0x01, 0x00, 0x00 }, 23 },             /* 2001::/23 incl. Teredo */
                { { 0x20, 0x01, 0x0d, 0xb8 }, 32 },             /* 2001:db8::/32 documentation */
                { { 0x3f, 0xff }, 20 },                         /* 3fff::/20 documentation */
                { { 0x5f, 0x00 }, 16 },                         /* 5f00::/16 SRv6 */
        };
        for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
                if (prefix_eq(a, reserved[i].net, reserved[i].bits))
                        return EGRESS_ADDR_RESERVED;
        /* Only 2000::/3 is allocated as global unicast. */
        if ((a[0] & 0xe0) != 0x20)
                return EGRESS_ADDR_RESERVED;
        return EGRESS_ADDR_PUBLIC;
}

EgressAddrClass egress_addr_classify(const struct sockaddr *sa) {
        if (!sa)
                return EGRESS_ADDR_RESERVED;
        if (sa->sa_family == AF_INET) {
                const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
                return classify_v4(ntohl(in->sin_addr.s_addr));
        }
        if (sa->sa_family == AF_INET6) {
                const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
                return classify_v6(in6->sin6_addr.s6_addr);
        }
        return EGRESS_ADDR_RESERVED;
}

const char *egress_addr_class_name(EgressAddrClass c) {
        switch (c) {
        case EGRESS_ADDR_PUBLIC:
                return "public";
        case EGRESS_ADDR_UNSPECIFIED:
                return "unspecified";
        case EGRESS_ADDR_LOOPBACK:
                return "loopback";
        case EGRESS_ADDR_PRIVATE:
                return "private";
        case EGRESS_ADDR_LINK_LOCAL:
                return "link-local";
        case EGRESS_ADDR_CGNAT:
                return "carrier-grade NAT";
        case EGRESS_ADDR_MULTICAST:
                return "multicast";
        case EGRESS_ADDR_RESERVED:
                return "reserved";
        }
        return "reserved";
}

/* The WHATWG URL rule: a host whose last label is a number (decimal, or hex
 * with 0x) is an IPv4 address, however it is spelled. */
static bool ends_in_number(const char *host, size_t len) {
        if (len > 0 && host[len - 1] == '.')
                len--;
        size_t start = len;
        while (start > 0 && host[start - 1] != '.')
                start--;
        const char *l = host + start;
        size_t n = len - start;
        if (n == 0)
                return false;
        size_t i = 0;
        bool hex = n >= 2 && l[0] == '0' && (l[1] == 'x' || l[1] == 'X');
        if (hex)
                i = 2;
        for (; i < n; i++)
                if (hex ? !isxdigit((unsigned char)l[i]) : !isdigit((unsigned char)l[i]))
                        return false;
        return true;
}

int egress_parse_ip_literal(const char *host, struct sockaddr_storage *ret) {
        if (!host || !ret)
                return -EINVAL;
        size_t len = strlen(host);
        if (len == 0 || len > 255)
                return -EINVAL;
        for (size_t i = 0; i < len; i++)
                if (isspace((unsigned char)host[i]) || host[i] == '%' || host[i] == '\0')
                        return -EINVAL; /* no host has these; zones are refused */

        char buf[256];
        memcpy(buf, host, len + 1);
        if (buf[0] == '[') {
                if (len < 3 || buf[len - 1] != ']')
                        return -EINVAL;
                buf[len - 1] = '\0';
                memmove(buf, buf + 1, len - 1);
        }
        if (strchr(buf, ':')) {
                struct sockaddr_in6 in6 = { .sin6_family = AF_INET6 };
                if (inet_pton(AF_INET6, buf, &in6.sin6_addr) != 1)
                        return -EINVAL;
                memset(ret, 0, sizeof(*ret));
                memcpy(ret, &in6, sizeof(in6));
                return 1;
        }
        if (!ends_in_number(buf, strlen(buf)))
                return 0;
        size_t blen = strlen(buf);
        if (blen > 0 && buf[blen - 1] == '.')
                buf[blen - 1] = '\0';
        /* inet_aton accepts every historical spelling: 127.1, 0x7f.1,
         * 0177.0.0.1, 2130706433. That is exactly the set to recognise,
         * since resolvers and HTTP clients accept them too. */
        struct in_addr a;
        if (inet_aton(buf, &a) == 0)
                return -EINVAL;
        struct sockaddr_in in = { .sin_family = AF_INET, .sin_addr = a };
        memset(ret, 0, sizeof(*ret));
        memcpy(ret, &in, sizeof(in));
        return 1;
}

int egress_addr_format(const struct sockaddr *sa, char *buf, size_t len) {
        const void *src;
        if (sa->sa_family == AF_INET)
                src = &((const struct sockaddr_in *)sa)->sin_addr;
        else if (sa->sa_family == AF_INET6)
                src = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        else
                return -EAFNOSUPPORT;
        if (!inet_ntop(sa->sa_family, src, buf, (socklen_t)len))
                return -errno;
        return 0;
}
