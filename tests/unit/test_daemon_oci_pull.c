/* Image references of registries (daemon/manager/oci_pull.h): read as
 * `docker pull` reads them (Docker Hub's default registry and library/,
 * a host with a port, tags, digests); what could reach skopeo as an option,
 * a path or a second argument is refused; pulled trees' names map to the
 * state directory only in their own shape. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/manager/oci_pull.h"

#define D64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void test_references(void **state) {
        (void)state;
        OciRef r;
        char t[512];
        assert_int_equal(oci_ref_parse("python:3.12-slim", &r), 0);
        assert_string_equal(r.registry, "docker.io");
        assert_string_equal(r.repo, "library/python");
        assert_string_equal(r.tag, "3.12-slim");
        assert_string_equal(r.digest, "");
        assert_int_equal(oci_ref_transport(&r, t, sizeof t), 0);
        assert_string_equal(t, "docker://docker.io/library/python:3.12-slim");

        assert_int_equal(oci_ref_parse("alpine", &r), 0);
        assert_string_equal(r.tag, "latest");

        assert_int_equal(oci_ref_parse("127.0.0.1:5000/team/app:v1", &r), 0);
        assert_string_equal(r.registry, "127.0.0.1:5000");
        assert_string_equal(r.repo, "team/app");
        assert_string_equal(r.tag, "v1");

        assert_int_equal(oci_ref_parse("localhost/app@sha256:" D64, &r), 0);
        assert_string_equal(r.registry, "localhost");
        assert_string_equal(r.repo, "app");
        assert_string_equal(r.tag, "");
        assert_string_equal(r.digest, "sha256:" D64);
        assert_int_equal(oci_ref_transport(&r, t, sizeof t), 0);
        assert_string_equal(t, "docker://localhost/app@sha256:" D64);

        /* A tag and a digest: the digest decides, as Docker's. */
        assert_int_equal(oci_ref_parse("ghcr.io/o/r:v2@sha256:" D64, &r), 0);
        assert_string_equal(r.tag, "");
        assert_string_equal(r.digest, "sha256:" D64);

        /* user/repo on Docker Hub keeps its own namespace. */
        assert_int_equal(oci_ref_parse("someone/tool", &r), 0);
        assert_string_equal(r.registry, "docker.io");
        assert_string_equal(r.repo, "someone/tool");
}

static void test_refusals(void **state) {
        (void)state;
        OciRef r;
        const char *bad[] = {
                "",
                "-v",                              /* an option of skopeo's */
                "--src-creds=x:y/app",
                "Upper/Case",
                "app:",
                "app:bad tag",
                "app@sha256:" "0123",              /* a short digest */
                "app@sha512:" D64,
                "app@sha256:" D64 "X",
                "app@1",                           /* a version of an owner's image, not a digest */
                "a//b",
                "/abs/path",
                "app/",
                "host:99999999/app",
                "ho st:1/app",
                "app\nFROM x",
                "oci:layout:img",
                "docker://x/y",
                "../../etc/passwd",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                assert_int_equal(oci_ref_parse(bad[i], &r), -EINVAL);
        char longref[400];
        memset(longref, 'a', sizeof longref - 1);
        longref[sizeof longref - 1] = '\0';
        assert_int_equal(oci_ref_parse(longref, &r), -EINVAL);
        assert_int_equal(oci_ref_parse(NULL, &r), -EINVAL);
}

static void test_tree_names(void **state) {
        (void)state;
        char *p = oci_image_dir("/state", "oci-" "0123456789abcdef0123456789abcdef0123456789abcdef0123456789ab");
        assert_non_null(p);
        assert_string_equal(p, "/state/oci-images/oci-0123456789abcdef0123456789abcdef0123456789abcdef0123456789ab");
        free(p);
        assert_null(oci_image_dir("/state", "default"));
        assert_null(oci_image_dir("/state", "oci-short"));
        assert_null(oci_image_dir("/state", "oci-" "0123456789abcdef0123456789abcdef0123456789abcdef0123456789aZ"));
        assert_null(oci_image_dir("/state", "oci-../../../../../../../../../../../../../../../../../../../etc"));
        assert_null(oci_image_dir("/state", NULL));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_references),
                cmocka_unit_test(test_refusals),
                cmocka_unit_test(test_tree_names),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
