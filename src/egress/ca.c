#include "egress/ca.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "egress/addr.h"

#define CACHE_SIZE 256

typedef struct CacheEntry {
        char host[256];
        SSL_CTX *ctx;
        unsigned long used; /* tick of last use, for eviction */
} CacheEntry;

struct EgressCa {
        EVP_PKEY *key;
        X509 *cert;
        char *pem;
        EVP_PKEY *leaf_key; /* one key for every leaf: minting stays cheap */
        pthread_mutex_t lock;
        CacheEntry cache[CACHE_SIZE];
        unsigned long tick;
};

static int random_serial(X509 *x) {
        BIGNUM *bn = BN_new();
        int ok = bn && BN_rand(bn, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) &&
                 BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
        BN_free(bn);
        return ok ? 0 : -EIO;
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value) {
        X509V3_CTX ctx;
        X509V3_set_ctx_nodb(&ctx);
        X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
        X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
        if (!ext)
                return -EINVAL;
        int ok = X509_add_ext(cert, ext, -1);
        X509_EXTENSION_free(ext);
        return ok ? 0 : -EIO;
}

static X509 *make_cert(EVP_PKEY *subject_key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key, long days,
                       bool is_ca, const char *san) {
        X509 *x = X509_new();
        if (!x)
                return NULL;
        X509_set_version(x, 2);
        if (random_serial(x) < 0)
                goto fail;
        /* Back-dated a day so a sandbox whose clock lags still accepts it. */
        X509_gmtime_adj(X509_getm_notBefore(x), -86400);
        X509_gmtime_adj(X509_getm_notAfter(x), days * 86400);
        X509_set_pubkey(x, subject_key);
        X509_NAME *name = X509_get_subject_name(x);
        X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"Runtime", -1, -1, 0);
        X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0);
        X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
        X509 *iss = issuer ? issuer : x;
        if (is_ca) {
                if (add_ext(x, iss, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") < 0 ||
                    add_ext(x, iss, NID_key_usage, "critical,keyCertSign,cRLSign") < 0 ||
                    add_ext(x, iss, NID_subject_key_identifier, "hash") < 0)
                        goto fail;
        } else {
                if (add_ext(x, iss, NID_basic_constraints, "critical,CA:FALSE") < 0 ||
                    add_ext(x, iss, NID_key_usage, "critical,digitalSignature") < 0 ||
                    add_ext(x, iss, NID_ext_key_usage, "serverAuth") < 0 ||
                    add_ext(x, iss, NID_authority_key_identifier, "keyid:always") < 0 ||
                    add_ext(x, iss, NID_subject_alt_name, san) < 0)
                        goto fail;
        }
        if (!X509_sign(x, issuer_key, EVP_sha256()))
                goto fail;
        return x;
fail:
        X509_free(x);
        return NULL;
}

static int write_pem_file(const char *path, mode_t mode, EVP_PKEY *key, X509 *cert) {
        char tmp[4096];
        if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
                return -ENAMETOOLONG;
        unlink(tmp);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd < 0)
                return -errno;
        FILE *f = fdopen(fd, "w");
        if (!f) {
                close(fd);
                return -errno;
        }
        int ok = key ? PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) : PEM_write_X509(f, cert);
        ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
        fclose(f);
        if (!ok || rename(tmp, path) < 0) {
                unlink(tmp);
                return -EIO;
        }
        return 0;
}

static char *cert_pem(X509 *cert) {
        BIO *b = BIO_new(BIO_s_mem());
        if (!b || !PEM_write_bio_X509(b, cert)) {
                BIO_free(b);
                return NULL;
        }
        char *data;
        long n = BIO_get_mem_data(b, &data);
        char *out = n > 0 ? strndup(data, (size_t)n) : NULL;
        BIO_free(b);
        return out;
}

void egress_ca_free(EgressCa *ca) {
        if (!ca)
                return;
        for (size_t i = 0; i < CACHE_SIZE; i++)
                SSL_CTX_free(ca->cache[i].ctx);
        EVP_PKEY_free(ca->key);
        EVP_PKEY_free(ca->leaf_key);
        X509_free(ca->cert);
        free(ca->pem);
        pthread_mutex_destroy(&ca->lock);
        free(ca);
}

int egress_ca_load_or_create(const char *dir, EgressCa **ret) {
        char key_path[4096], crt_path[4096];
        if ((size_t)snprintf(key_path, sizeof(key_path), "%s/egress-ca.key", dir) >= sizeof(key_path) ||
            (size_t)snprintf(crt_path, sizeof(crt_path), "%s/egress-ca.crt", dir) >= sizeof(crt_path))
                return -ENAMETOOLONG;
        EgressCa *ca = calloc(1, sizeof(*ca));
        if (!ca)
                return -ENOMEM;
        pthread_mutex_init(&ca->lock, NULL);
        int r = -EIO;

        FILE *kf = fopen(key_path, "re"), *cf = fopen(crt_path, "re");
        if (kf && cf) {
                ca->key = PEM_read_PrivateKey(kf, NULL, NULL, NULL);
                ca->cert = PEM_read_X509(cf, NULL, NULL, NULL);
        }
        if (kf)
                fclose(kf);
        if (cf)
                fclose(cf);
        if (!ca->key || !ca->cert) {
                EVP_PKEY_free(ca->key);
                X509_free(ca->cert);
                ca->key = EVP_EC_gen("P-256");
                if (!ca->key)
                        goto fail;
                char host[64] = "localhost";
                gethostname(host, sizeof(host) - 1);
                char cn[128];
                snprintf(cn, sizeof(cn), "Runtime egress CA (%s)", host);
                ca->cert = make_cert(ca->key, cn, NULL, ca->key, 3650, true, NULL);
                if (!ca->cert)
                        goto fail;
                if ((r = write_pem_file(key_path, 0600, ca->key, NULL)) < 0 ||
                    (r = write_pem_file(crt_path, 0644, NULL, ca->cert)) < 0)
                        goto fail;
        }
        if (X509_check_private_key(ca->cert, ca->key) != 1) {
                r = -EINVAL;
                goto fail;
        }
        ca->leaf_key = EVP_EC_gen("P-256");
        ca->pem = cert_pem(ca->cert);
        if (!ca->leaf_key || !ca->pem) {
                r = -ENOMEM;
                goto fail;
        }
        *ret = ca;
        return 0;
fail:
        egress_ca_free(ca);
        return r;
}

const char *egress_ca_pem(const EgressCa *ca) {
        return ca->pem;
}

static SSL_CTX *mint(EgressCa *ca, const char *host) {
        struct sockaddr_storage ss;
        char san[300];
        if (egress_parse_ip_literal(host, &ss) == 1) {
                char text[64];
                if (egress_addr_format((struct sockaddr *)&ss, text, sizeof(text)) < 0)
                        return NULL;
                snprintf(san, sizeof(san), "IP:%s", text);
        } else
                snprintf(san, sizeof(san), "DNS:%.260s", host);
        X509 *leaf = make_cert(ca->leaf_key, host, ca->cert, ca->key, 30, false, san);
        if (!leaf)
                return NULL;
        SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
        if (!ctx || !SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) || !SSL_CTX_use_certificate(ctx, leaf) ||
            !SSL_CTX_add1_chain_cert(ctx, ca->cert) || !SSL_CTX_use_PrivateKey(ctx, ca->leaf_key)) {
                SSL_CTX_free(ctx);
                ctx = NULL;
        }
        X509_free(leaf);
        return ctx;
}

int egress_ca_server_ctx(EgressCa *ca, const char *host, SSL_CTX **ret) {
        if (!host || strlen(host) >= sizeof(ca->cache[0].host))
                return -EINVAL;
        pthread_mutex_lock(&ca->lock);
        ca->tick++;
        size_t victim = 0;
        for (size_t i = 0; i < CACHE_SIZE; i++) {
                if (ca->cache[i].ctx && strcmp(ca->cache[i].host, host) == 0) {
                        ca->cache[i].used = ca->tick;
                        SSL_CTX_up_ref(ca->cache[i].ctx);
                        *ret = ca->cache[i].ctx;
                        pthread_mutex_unlock(&ca->lock);
                        return 0;
                }
                if (ca->cache[i].used < ca->cache[victim].used)
                        victim = i;
        }
        SSL_CTX *ctx = mint(ca, host);
        if (!ctx) {
                pthread_mutex_unlock(&ca->lock);
                return -EIO;
        }
        SSL_CTX_free(ca->cache[victim].ctx);
        snprintf(ca->cache[victim].host, sizeof(ca->cache[victim].host), "%s", host);
        ca->cache[victim].ctx = ctx;
        ca->cache[victim].used = ca->tick;
        SSL_CTX_up_ref(ctx);
        *ret = ctx;
        pthread_mutex_unlock(&ca->lock);
        return 0;
}
