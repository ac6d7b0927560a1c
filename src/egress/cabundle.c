#include "egress/cabundle.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"

static int read_bounded(const char *path, char **ret, size_t *ret_len) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        if (st.st_size > (off_t)EGRESS_CA_BUNDLE_MAX)
                return -E2BIG;
        _cleanup_free_ char *buf = malloc(EGRESS_CA_BUNDLE_MAX + 2);
        if (!buf)
                return -ENOMEM;
        size_t len = 0;
        int r = io_read_full(fd, buf, EGRESS_CA_BUNDLE_MAX + 1, &len);
        if (r < 0)
                return r;
        if (len > EGRESS_CA_BUNDLE_MAX)
                return -E2BIG; /* grew while we read */
        buf[len] = '\0';
        *ret = TAKE_PTR(buf);
        *ret_len = len;
        return 0;
}

int egress_ca_bundle_load(const char *path, char **ret_pem, unsigned *ret_count, char *err, size_t err_len) {
        _cleanup_free_ char *text = NULL;
        size_t len = 0;
        int r = read_bounded(path, &text, &len);
        if (r < 0) {
                snprintf(err, err_len, "cannot read %.200s: %s", path,
                         r == -E2BIG    ? "larger than 1 MiB"
                         : r == -EINVAL ? "not a regular file"
                                        : strerror(-r));
                return r;
        }
        BIO *in = BIO_new_mem_buf(text, (int)len);
        BIO *out = BIO_new(BIO_s_mem());
        unsigned count = 0;
        r = 0;
        while (in && out && r == 0) {
                char *name = NULL, *header = NULL;
                unsigned char *data = NULL;
                long dlen = 0;
                if (!PEM_read_bio(in, &name, &header, &data, &dlen)) {
                        unsigned long e = ERR_peek_last_error();
                        if (ERR_GET_REASON(e) != PEM_R_NO_START_LINE) {
                                snprintf(err, err_len, "%.200s: a PEM block is malformed", path);
                                r = -EINVAL;
                        }
                        ERR_clear_error();
                        break;
                }
                if (strcmp(name, "CERTIFICATE") != 0) {
                        snprintf(err, err_len, "%.200s holds a %.60s block; only CA certificates belong in it%s",
                                 path, name, strstr(name, "PRIVATE KEY") ? " (a key would reach every sandbox)" : "");
                        r = -EINVAL;
                } else {
                        const unsigned char *p = data;
                        X509 *x = d2i_X509(NULL, &p, dlen);
                        if (!x || p != data + dlen) {
                                snprintf(err, err_len, "%.200s: certificate %u does not parse", path, count + 1);
                                r = -EINVAL;
                        } else if (X509_check_ca(x) < 1) {
                                snprintf(err, err_len, "%.200s: certificate %u is not a CA certificate", path,
                                         count + 1);
                                r = -EINVAL;
                        } else if (++count > EGRESS_CA_BUNDLE_MAX_CERTS) {
                                snprintf(err, err_len, "%.200s: more than %u certificates", path,
                                         EGRESS_CA_BUNDLE_MAX_CERTS);
                                r = -E2BIG;
                        } else if (!PEM_write_bio_X509(out, x))
                                r = -ENOMEM;
                        X509_free(x);
                }
                OPENSSL_free(name);
                OPENSSL_free(header);
                OPENSSL_free(data);
        }
        if (!in || !out)
                r = -ENOMEM;
        if (r == 0 && count == 0) {
                snprintf(err, err_len, "%.200s holds no PEM certificate", path);
                r = -EINVAL;
        }
        char *pem = NULL;
        if (r == 0) {
                char *mem = NULL;
                long n = BIO_get_mem_data(out, &mem);
                pem = n > 0 ? strndup(mem, (size_t)n) : NULL;
                if (!pem)
                        r = -ENOMEM;
        }
        BIO_free(in);
        BIO_free(out);
        ERR_clear_error();
        if (r < 0) {
                if (r == -ENOMEM)
                        snprintf(err, err_len, "out of memory reading %.200s", path);
                return r;
        }
        *ret_pem = pem;
        *ret_count = count;
        return 0;
}

int egress_ca_bundle_trust(SSL_CTX *ctx, const char *pem) {
        X509_STORE *store = SSL_CTX_get_cert_store(ctx);
        BIO *in = BIO_new_mem_buf(pem, -1);
        if (!store || !in) {
                BIO_free(in);
                return -ENOMEM;
        }
        int r = 0;
        X509 *x;
        while ((x = PEM_read_bio_X509(in, NULL, NULL, NULL))) {
                /* Already there (the host's store has it): not an error. */
                if (!X509_STORE_add_cert(store, x) &&
                    ERR_GET_REASON(ERR_peek_last_error()) != X509_R_CERT_ALREADY_IN_HASH_TABLE)
                        r = -EIO;
                X509_free(x);
        }
        ERR_clear_error();
        BIO_free(in);
        return r;
}
