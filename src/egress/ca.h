#pragma once
/*
 * The daemon's egress CA: made on first start (key readable only by the
 * daemon's user), trusted inside every sandbox, and used only to intercept
 * the HTTPS connections that a secret applies to, so that the proxy can put
 * the secret's value where the sandbox wrote its placeholder.
 */
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stddef.h>

typedef struct EgressCa EgressCa;

/* Loads dir/egress-ca.key and dir/egress-ca.crt, or makes them (P-256, ten
 * years, key mode 0600, written with O_EXCL then renamed). */
int egress_ca_load_or_create(const char *dir, EgressCa **ret);
void egress_ca_free(EgressCa *ca);
/* The CA certificate in PEM, for the sandboxes' trust stores. */
const char *egress_ca_pem(const EgressCa *ca);

/* A server context presenting a certificate for `host` (a DNS name or an IP
 * literal) signed by the CA. Certificates are made once per host and kept
 * (bounded cache). Returns a new reference (SSL_CTX_free it). */
int egress_ca_server_ctx(EgressCa *ca, const char *host, SSL_CTX **ret);
