#include "daemon/http/preview_tls.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"

struct PreviewTls {
        SSL_CTX *ctx;
};

static const char *ssl_reason(void) {
        unsigned long e = ERR_get_error();
        ERR_clear_error();
        return e ? ERR_reason_error_string(e) ?: "unknown" : "unknown";
}

/* dir/name is a regular file; secret: runtimed's user's, read by no one
 * else. */
static int check_file(int dfd, const char *name, bool secret, char *why, size_t why_len) {
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                snprintf(why, why_len, "%s cannot be read: %s", name, strerror(errno));
                return -errno;
        }
        if (!S_ISREG(st.st_mode)) {
                snprintf(why, why_len, "%s is not a regular file", name);
                return -EINVAL;
        }
        if (secret && (st.st_uid != geteuid() || (st.st_mode & 0077))) {
                snprintf(why, why_len, "%s is not runtimed's user's with mode 0600", name);
                return -EPERM;
        }
        return 0;
}

int preview_tls_load(const char *dir, PreviewTls **ret, char *why, size_t why_len) {
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
                snprintf(why, why_len, "is not a directory that can be read: %s", strerror(errno));
                return -errno;
        }
        int r = check_file(dfd, "cert.pem", false, why, why_len);
        if (r == 0)
                r = check_file(dfd, "key.pem", true, why, why_len);
        if (r < 0)
                return r;
        PreviewTls *t = calloc(1, sizeof *t);
        if (!t || !(t->ctx = SSL_CTX_new(TLS_server_method()))) {
                free(t);
                return -ENOMEM;
        }
        SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
        SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        char cert[64], key[64];
        snprintf(cert, sizeof cert, "/proc/self/fd/%d/cert.pem", dfd);
        snprintf(key, sizeof key, "/proc/self/fd/%d/key.pem", dfd);
        if (SSL_CTX_use_certificate_chain_file(t->ctx, cert) != 1) {
                snprintf(why, why_len, "cert.pem holds no certificate: %s", ssl_reason());
                r = -EINVAL;
        } else if (SSL_CTX_use_PrivateKey_file(t->ctx, key, SSL_FILETYPE_PEM) != 1) {
                snprintf(why, why_len, "key.pem holds no private key (an encrypted one is not read): %s",
                         ssl_reason());
                r = -EINVAL;
        } else if (SSL_CTX_check_private_key(t->ctx) != 1) {
                snprintf(why, why_len, "key.pem is not cert.pem's key: %s", ssl_reason());
                r = -EINVAL;
        }
        if (r < 0) {
                preview_tls_free(t);
                return r;
        }
        *ret = t;
        return 0;
}

void preview_tls_free(PreviewTls *t) {
        if (!t)
                return;
        SSL_CTX_free(t->ctx);
        free(t);
}

void *preview_tls_ctx(const PreviewTls *t) {
        return t->ctx;
}
