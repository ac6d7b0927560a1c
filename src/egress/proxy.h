#pragma once
/*
 * The host-side egress proxy: serves one connection a sandbox opened to its
 * agent's relay (127.0.0.1:3128 inside). It alone parses the request,
 * decides against the sandbox's policy, resolves the name once, refuses every
 * address a sandbox must not reach, and connects to the address it checked:
 * no second lookup for an attacker's DNS to rebind.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <openssl/ssl.h>

#include "egress/conn.h"

/* Parses "name=127.0.0.1:PORT" (the daemon's option). */
int egress_test_host_parse(const char *text, EgressTestHost *ret);

/* Serves one connection to its end. Returns 0 when the request was served
 * or refused with an answer to the sandbox (see *ret_record), < 0 when the
 * sandbox side failed. */
int egress_proxy_serve(const EgressIo *io, const EgressPolicy *policy, const EgressProxyConfig *cfg,
                       EgressRecord *ret_record);

/* An SSL_CTX for upstream connections: the host's trust store, plus
 * extra_ca_file when given (tests), TLS 1.2 at least. */
int egress_upstream_ctx_new(const char *extra_ca_file, SSL_CTX **ret);
