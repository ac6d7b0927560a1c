/* TLS for the fleet's hop: the files of --fleet-tls-dir, checked once. */
#include "daemon/http/hop_tls.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "common/macro.h"

struct HopTls {
        char *cert, *key; /* PEM text */
        SSL_CTX *client;
};

/* dir/name whole, at most HOP_TLS_PEM_MAX bytes; secret: a regular file
 * of runtimed's user that no one else may read or write. */
static int read_pem(int dfd, const char *name, bool secret, char **ret, char *why, size_t why_len) {
        _cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
                snprintf(why, why_len, "%s cannot be read: %s", name, strerror(errno));
                return -errno;
        }
        if (!S_ISREG(st.st_mode) || st.st_size > HOP_TLS_PEM_MAX) {
                snprintf(why, why_len, "%s is not a regular file of at most %d bytes", name, HOP_TLS_PEM_MAX);
                return -EINVAL;
        }
        if (secret && (st.st_uid != geteuid() || (st.st_mode & 0077))) {
                snprintf(why, why_len, "%s is not runtimed's user's with mode 0600", name);
                return -EPERM;
        }
        char *buf = malloc((size_t)st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        size_t got = 0;
        while (got < (size_t)st.st_size) {
                ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                got += (size_t)n;
        }
        buf[got] = '\0';
        if (got == 0 || strlen(buf) != got) {
                explicit_bzero(buf, got);
                free(buf);
                snprintf(why, why_len, "%s is empty or holds a NUL byte", name);
                return -EINVAL;
        }
        *ret = buf;
        return 0;
}

static const char *ssl_reason(void) {
        unsigned long e = ERR_get_error();
        ERR_clear_error();
        return e ? ERR_reason_error_string(e) ?: "unknown" : "unknown";
}

/* The server's certificate and key parse and belong together; the CA
 * parses into the client's store. */
static int check(HopTls *t, int dfd, char *why, size_t why_len) {
        SSL_CTX *server = SSL_CTX_new(TLS_server_method());
        if (!server)
                return -ENOMEM;
        BIO *cb = BIO_new_mem_buf(t->cert, -1), *kb = BIO_new_mem_buf(t->key, -1);
        X509 *cert = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
        EVP_PKEY *key = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
        int r = 0;
        if (!cert) {
                snprintf(why, why_len, "cert.pem holds no certificate: %s", ssl_reason());
                r = -EINVAL;
        } else if (!key) {
                snprintf(why, why_len, "key.pem holds no private key (an encrypted one is not read): %s",
                         ssl_reason());
                r = -EINVAL;
        } else if (SSL_CTX_use_certificate(server, cert) != 1 || SSL_CTX_use_PrivateKey(server, key) != 1 ||
                   SSL_CTX_check_private_key(server) != 1) {
                snprintf(why, why_len, "key.pem is not cert.pem's key: %s", ssl_reason());
                r = -EINVAL;
        }
        X509_free(cert);
        EVP_PKEY_free(key);
        BIO_free(cb);
        BIO_free(kb);
        SSL_CTX_free(server);
        if (r < 0)
                return r;
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d/ca.pem", dfd);
        t->client = SSL_CTX_new(TLS_client_method());
        if (!t->client)
                return -ENOMEM;
        SSL_CTX_set_min_proto_version(t->client, TLS1_2_VERSION);
        SSL_CTX_set_verify(t->client, SSL_VERIFY_PEER, NULL);
        /* A peer that closes without a close_notify ends the stream; the
         * HTTP framing says whether the answer was whole. */
        SSL_CTX_set_options(t->client, SSL_OP_IGNORE_UNEXPECTED_EOF);
        if (SSL_CTX_load_verify_locations(t->client, path, NULL) != 1) {
                snprintf(why, why_len, "ca.pem holds no CA certificate: %s", ssl_reason());
                return -EINVAL;
        }
        return 0;
}

int hop_tls_load(const char *dir, HopTls **ret, char *why, size_t why_len) {
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
                snprintf(why, why_len, "is not a directory that can be read: %s", strerror(errno));
                return -errno;
        }
        HopTls *t = calloc(1, sizeof *t);
        if (!t)
                return -ENOMEM;
        char *ca = NULL;
        int r = read_pem(dfd, "cert.pem", false, &t->cert, why, why_len);
        if (r == 0)
                r = read_pem(dfd, "key.pem", true, &t->key, why, why_len);
        if (r == 0)
                r = read_pem(dfd, "ca.pem", false, &ca, why, why_len);
        free(ca);
        if (r == 0)
                r = check(t, dfd, why, why_len);
        if (r < 0) {
                hop_tls_free(t);
                return r;
        }
        *ret = t;
        return 0;
}

void hop_tls_free(HopTls *t) {
        if (!t)
                return;
        if (t->key)
                explicit_bzero(t->key, strlen(t->key));
        free(t->key);
        free(t->cert);
        SSL_CTX_free(t->client);
        free(t);
}

const char *hop_tls_cert_pem(const HopTls *t) {
        return t->cert;
}

const char *hop_tls_key_pem(const HopTls *t) {
        return t->key;
}

void *hop_tls_client(const HopTls *t) {
        return t->client;
}
