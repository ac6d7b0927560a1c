#pragma once
/*
 * One connection the egress proxy serves, as its parts share it: the sandbox
 * side's I/O, the proxy's settings and the record of what happened. The
 * proxy (proxy.c) and the interception of a tunnel (intercept.c) both speak
 * these types, so neither needs the other's header for them.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <openssl/ssl.h>

#include "egress/ca.h"
#include "egress/cidr.h"
#include "egress/policy.h"
#include "egress/secret.h"

/* The sandbox side of the connection, over whatever carries it (the agent
 * channel in the daemon, a socket in tests). */
typedef struct EgressIo {
        void *ctx;
        /* Bytes from the sandbox: > 0, 0 at EOF, < 0 on error. Blocks at most
         * about a second, then returns -EAGAIN, so that the proxy notices when
         * the other direction has ended. */
        ssize_t (*read)(void *ctx, uint8_t *buf, size_t len);
        /* All of buf to the sandbox: 0, or < 0 once it is gone. */
        int (*write)(void *ctx, const uint8_t *buf, size_t len);
        /* No more bytes towards the sandbox. */
        void (*close_write)(void *ctx);
} EgressIo;

/* Test-only: names that resolve to a chosen loopback address and port,
 * bypassing the address checks for those names alone. Off unless the daemon
 * is started with --egress-test-upstream, which it logs loudly. */
typedef struct EgressTestHost {
        char name[EGRESS_MAX_HOST + 1];
        struct sockaddr_storage addr; /* port included */
        socklen_t addr_len;
} EgressTestHost;

/* What happened, for the audit log. */
typedef struct EgressRecord {
        char host[EGRESS_MAX_HOST + 1];
        uint16_t port;
        bool connect; /* CONNECT tunnel, else plain HTTP */
        bool allowed;
        char reason[192];
        char addr[64]; /* the address connected to */
        uint64_t bytes_out, bytes_in;
        bool intercepted;
        unsigned secrets_used; /* placeholders replaced */
        char rule[EGRESS_MAX_RULE]; /* the policy's rule that decided, "" when none matched */
        /* Filled when the connection ends: how long it was open and why it
         * ended. */
        uint64_t duration_ms;
        char end[96];
} EgressRecord;

typedef struct EgressProxyConfig {
        const EgressTestHost *test_hosts;
        size_t n_test_hosts;
        /* Operator ranges whose addresses count as public upstreams
         * (--egress-public-cidr; see egress/cidr.h for what they never open). */
        const EgressCidr *public_cidrs;
        size_t n_public_cidrs;
        int connect_timeout_ms; /* default 10000 */
        int idle_timeout_ms;    /* a tunnel with no bytes either way this long is closed; default 300000 */
        /* Secrets of the sandbox's owner. A plain-HTTP request, or a CONNECT
         * tunnel, to a host a secret applies to gets its placeholders
         * replaced in the request line and headers; such tunnels are
         * intercepted with `ca`, and the upstream is verified with
         * `upstream_ctx` (the host's trust store). Without ca/upstream_ctx,
         * tunnels are never intercepted. */
        /* Only ports 80 and 443, whatever the policy names (trial keys). */
        bool web_ports_only;
        /* Called with the record as soon as the proxy decides (and again
         * when a later step refuses what was allowed: an upstream that fails
         * verification, a request a secret's rules refuse), before a byte
         * goes upstream and before the sandbox hears a refusal, so that the
         * audit entry exists by the time the sandbox's client has an answer.
         * NULL: nobody listens. */
        void (*decided)(void *ctx, const EgressRecord *rec);
        void *decided_ctx;
        const EgressSecret *secrets;
        size_t n_secrets;
        EgressCa *ca;
        SSL_CTX *upstream_ctx;
} EgressProxyConfig;
