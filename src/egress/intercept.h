#pragma once
/* Interception of a CONNECT tunnel a secret applies to: TLS towards the
 * sandbox with a certificate from the daemon's CA, TLS towards the upstream
 * verified against the host's trust store, and the sandbox's requests in
 * between with their placeholders replaced. */
#include <stdint.h>

#include "egress/conn.h"

/* Called after "200 Connection established" was sent; `upstream` is the
 * connected, checked TCP socket (blocking; left open for the caller to close).
 * `early`/`early_len` are bytes the sandbox already sent after the CONNECT head. */
int egress_intercept(const EgressIo *io, int upstream, const char *host, uint16_t port,
                     const EgressProxyConfig *cfg, const uint8_t *early, size_t early_len, EgressRecord *rec);
