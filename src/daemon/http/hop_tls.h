#pragma once
/*
 * TLS for the fleet's hop (docs/fleet.md, "TLS between hosts"): a host
 * given --fleet-tls-dir serves the other hosts' forwarded requests on a
 * listener of their own (--fleet-listen) over TLS with its certificate,
 * and reaches an https:// host only when that host's certificate is
 * signed by the fleet's CA and names the host as its URL does. The fleet
 * secret still authenticates each request; TLS keeps it, and the client's
 * key and data, from the network between hosts.
 *
 * The directory holds three PEM files: cert.pem (this host's certificate,
 * its chain after it), key.pem (its private key: a regular file of
 * runtimed's user, mode 0600 or stricter) and ca.pem (the fleet's CA: the
 * only one trusted for the hop, never the system's).
 */
#include <stddef.h>

#define HOP_TLS_PEM_MAX (64 * 1024)

typedef struct HopTls HopTls;

/* Reads and checks dir's files (the key matches the certificate, the CA
 * parses). On failure *why says which file and what is wrong. */
int hop_tls_load(const char *dir, HopTls **ret, char *why, size_t why_len);
void hop_tls_free(HopTls *t);

/* The server's certificate and key, as PEM text, for the listener. */
const char *hop_tls_cert_pem(const HopTls *t);
const char *hop_tls_key_pem(const HopTls *t);
/* The client's context (an SSL_CTX): the fleet's CA, TLS 1.2 at least. */
void *hop_tls_client(const HopTls *t);
