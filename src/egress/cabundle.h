#pragma once
/*
 * An operator's extra CA bundle (--egress-trust-ca): the roots of a network
 * whose upstreams present certificates that no public CA issued (a registry
 * gateway, TLS inspection). Trusted by the proxy for the upstreams it
 * verifies and added to every sandbox's trust store.
 */
#include <openssl/ssl.h>
#include <stddef.h>

#define EGRESS_CA_BUNDLE_MAX (1024u * 1024u)
#define EGRESS_CA_BUNDLE_MAX_CERTS 1000

/* Reads a PEM file of CA certificates: a regular file of at most
 * EGRESS_CA_BUNDLE_MAX bytes holding 1..EGRESS_CA_BUNDLE_MAX_CERTS
 * certificates, each a CA, and nothing else (a private key is refused: it
 * would end up in every sandbox). Answers the certificates re-encoded as PEM,
 * so that nothing but them reaches a sandbox. -errno with err filled. */
int egress_ca_bundle_load(const char *path, char **ret_pem, unsigned *ret_count, char *err, size_t err_len);
/* Adds every certificate of a PEM text to ctx's trust store. */
int egress_ca_bundle_trust(SSL_CTX *ctx, const char *pem);
