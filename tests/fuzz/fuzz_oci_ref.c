/*
 * libFuzzer target for image references of registries
 * (daemon/manager/oci_pull.h), which any client with a key sends as a FROM
 * or an image: whatever is taken has a registry that is a host[:port], a
 * repository of the distribution spec's characters, a tag or a digest
 * (never both, never neither), and a skopeo source that fits and starts
 * with docker://; nothing taken could reach skopeo as an option. The
 * registry normalizer's answers are hosts too.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/manager/oci_pull.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_host(const char *h) {
        if (!h[0] || h[0] == '-' || strpbrk(h, "/@ \t\n"))
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 1024)
                return 0;
        char *s = malloc(size + 1);
        if (!s)
                return 0;
        memcpy(s, data, size);
        s[size] = '\0';
        OciRef r;
        if (oci_ref_parse(s, &r) == 0) {
                check_host(r.registry);
                if (!r.repo[0] || r.repo[0] == '/' || r.repo[0] == '-' || strpbrk(r.repo, ":@ \t\n"))
                        abort();
                if ((r.tag[0] != 0) == (r.digest[0] != 0))
                        abort();
                if (r.digest[0] && (strncmp(r.digest, "sha256:", 7) != 0 || strlen(r.digest) != OCI_DIGEST_LEN))
                        abort();
                if (s[0] == '-')
                        abort();
                char t[1024];
                if (oci_ref_transport(&r, t, sizeof t) < 0 || strncmp(t, "docker://", 9) != 0 || strpbrk(t, " \t\n"))
                        abort();
        }
        char host[256];
        if (oci_registry_normalize(s, host) == 0)
                check_host(host);
        free(s);
        return 0;
}
