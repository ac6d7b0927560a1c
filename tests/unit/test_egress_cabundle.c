/* The operator's CA bundle: only CA certificates pass, nothing else reaches a
 * sandbox, and what passes is trusted for upstream verification. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <openssl/pem.h>
#include <openssl/x509_vfy.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "egress/ca.h"
#include "egress/cabundle.h"
#include "egress/proxy.h"

static char dir[200];
static EgressCa *ca;
static char ca_file[256], key_file[256];

static int setup(void **state) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof(dir), "%s/runtime-cabundle-XXXXXX", base && *base ? base : P_tmpdir);
        assert_non_null(mkdtemp(dir));
        assert_int_equal(egress_ca_load_or_create(dir, &ca), 0);
        snprintf(ca_file, sizeof(ca_file), "%s/egress-ca.crt", dir);
        snprintf(key_file, sizeof(key_file), "%s/egress-ca.key", dir);
        return 0;
}

static int teardown(void **state) {
        egress_ca_free(ca);
        char cmd[512];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *a, const char *b) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(a, f);
        if (b)
                fputs(b, f);
        fclose(f);
}

static char *slurp(const char *path) {
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        static char buf[64 * 1024];
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        return strdup(buf);
}

static int load(const char *path, char **pem, unsigned *count, char *err, size_t err_len) {
        err[0] = '\0';
        return egress_ca_bundle_load(path, pem, count, err, err_len);
}

static void test_loads_ca(void **state) {
        char *pem = NULL, err[300];
        unsigned count = 0;
        /* Comments and text around the blocks, as in the host's bundle. */
        char *cert = slurp(ca_file), path[300];
        snprintf(path, sizeof(path), "%s/two.pem", dir);
        char *twice = NULL;
        assert_true(asprintf(&twice, "# a comment\n%s\nsome text\n%s", cert, cert) > 0);
        write_file(path, twice, NULL);
        assert_int_equal(load(path, &pem, &count, err, sizeof(err)), 0);
        assert_int_equal(count, 2);
        assert_non_null(strstr(pem, egress_ca_pem(ca)));
        assert_null(strstr(pem, "comment"));
        free(pem);
        free(twice);
        free(cert);
}

static void test_refuses(void **state) {
        char *pem = NULL, err[300], path[300];
        unsigned count = 0;
        char *cert = slurp(ca_file), *key = slurp(key_file);

        /* A key next to the certificate must never reach the sandboxes. */
        snprintf(path, sizeof(path), "%s/with-key.pem", dir);
        write_file(path, cert, key);
        assert_int_equal(load(path, &pem, &count, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "PRIVATE KEY"));

        snprintf(path, sizeof(path), "%s/empty.pem", dir);
        write_file(path, "", NULL);
        assert_int_equal(load(path, &pem, &count, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "no PEM certificate"));

        snprintf(path, sizeof(path), "%s/garbage.pem", dir);
        write_file(path, "-----BEGIN CERTIFICATE-----\nnot base64 at all!!\n-----END CERTIFICATE-----\n", NULL);
        assert_int_equal(load(path, &pem, &count, err, sizeof(err)), -EINVAL);

        /* A leaf, not a CA: the daemon's CA mints one for any host. */
        SSL_CTX *leaf_ctx = NULL;
        assert_int_equal(egress_ca_server_ctx(ca, "leaf.test", &leaf_ctx), 0);
        X509 *leaf = SSL_CTX_get0_certificate(leaf_ctx);
        assert_non_null(leaf);
        snprintf(path, sizeof(path), "%s/leaf.pem", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        PEM_write_X509(f, leaf);
        fclose(f);
        assert_int_equal(load(path, &pem, &count, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "not a CA"));
        SSL_CTX_free(leaf_ctx);

        /* Not a regular file; missing; too large. */
        assert_int_equal(load(dir, &pem, &count, err, sizeof(err)), -EINVAL);
        snprintf(path, sizeof(path), "%s/missing.pem", dir);
        assert_int_equal(load(path, &pem, &count, err, sizeof(err)), -ENOENT);
        snprintf(path, sizeof(path), "%s/huge.pem", dir);
        f = fopen(path, "w");
        assert_non_null(f);
        for (unsigned i = 0; i <= EGRESS_CA_BUNDLE_MAX / strlen(cert) + 1; i++)
                fputs(cert, f);
        fclose(f);
        assert_int_equal(load(path, &pem, &count, err, sizeof(err)), -E2BIG);
        free(cert);
        free(key);
}

/* What passes is trusted upstream: a leaf of the CA verifies against a
 * context that holds the bundle, and not against one without it. */
static void test_trust(void **state) {
        char *pem = NULL, err[300];
        unsigned count = 0;
        assert_int_equal(load(ca_file, &pem, &count, err, sizeof(err)), 0);
        SSL_CTX *with = NULL, *without = NULL, *leaf_ctx = NULL;
        assert_int_equal(egress_upstream_ctx_new(NULL, &with), 0);
        assert_int_equal(egress_upstream_ctx_new(NULL, &without), 0);
        assert_int_equal(egress_ca_bundle_trust(with, pem), 0);
        assert_int_equal(egress_ca_bundle_trust(with, pem), 0); /* twice is fine */
        assert_int_equal(egress_ca_server_ctx(ca, "leaf.test", &leaf_ctx), 0);
        X509 *leaf = SSL_CTX_get0_certificate(leaf_ctx);
        SSL_CTX *ctxs[2] = { with, without };
        for (int i = 0; i < 2; i++) {
                X509_STORE_CTX *v = X509_STORE_CTX_new();
                assert_int_equal(X509_STORE_CTX_init(v, SSL_CTX_get_cert_store(ctxs[i]), leaf, NULL), 1);
                assert_int_equal(X509_verify_cert(v), i == 0 ? 1 : 0);
                X509_STORE_CTX_free(v);
        }
        SSL_CTX_free(leaf_ctx);
        SSL_CTX_free(with);
        SSL_CTX_free(without);
        free(pem);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_loads_ca),
                cmocka_unit_test(test_refuses),
                cmocka_unit_test(test_trust),
        };
        return cmocka_run_group_tests_name("egress_cabundle", tests, setup, teardown);
}
