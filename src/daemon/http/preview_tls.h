#pragma once
/*
 * TLS on the preview listener (--preview-tls-dir, docs/previews.md): the
 * directory holds cert.pem (a certificate for *.DOMAIN, its chain after it)
 * and key.pem (its key: a regular file of runtimed's user, mode 0600 or
 * stricter). The server's context takes TLS 1.2 and later.
 */
#include <stddef.h>

typedef struct PreviewTls PreviewTls;

/* Reads and checks dir's files (the key matches the certificate). On
 * failure *why says which file and what is wrong. */
int preview_tls_load(const char *dir, PreviewTls **ret, char *why, size_t why_len);
void preview_tls_free(PreviewTls *t);
/* The server's context (an SSL_CTX). */
void *preview_tls_ctx(const PreviewTls *t);
