#pragma once
/* Images from OCI registries and archives: Debian's skopeo copies one into
 * an OCI layout, and umoci unpacks it into a root filesystem of the shifted
 * uid range, both as unprivileged users and bounded in time, bytes and
 * layers. A pulled tree lives at <state-dir>/oci-images/<name>/rootfs,
 * where <name> is OCI_IMAGE_PREFIX and a hash of the owner and the
 * manifest's digest: the same image pulled twice by one owner is kept once,
 * and no owner starts another's. */
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#define OCI_IMAGE_PREFIX "oci-"
/* "oci-" and 60 hex digits: an image name (images.h) of 64 bytes. */
#define OCI_IMAGE_NAME_LEN 64
#define OCI_REF_MAX 255
#define OCI_DIGEST_LEN 71 /* "sha256:" and 64 hex digits */
#define OCI_LAYERS_MAX 128
#define OCI_PULL_TIMEOUT_MS (15 * 60 * 1000)

/* A reference as `docker pull` reads it. */
typedef struct OciRef {
        char registry[256]; /* host[:port]; docker.io when the name has none */
        char repo[256];     /* library/python for python */
        char tag[129];      /* "" when a digest names it; latest when neither does */
        char digest[OCI_DIGEST_LEN + 1];
} OciRef;

/* Whether a FROM or image names a registry's image rather than a built-in
 * name or one of an owner's: it has a registry host, a tag or a digest. */
bool oci_ref_looks_remote(const char *ref);
/* -EINVAL for what is not a reference (bounded, the characters of the
 * distribution spec, no option-like leading '-'). */
int oci_ref_parse(const char *ref, OciRef *ret);
/* A registry as a client names it ("ghcr.io", "https://index.docker.io/v1/",
 * "127.0.0.1:5000") as pulls name it (host[:port], Docker Hub as docker.io);
 * -EINVAL for what is not a registry. */
int oci_registry_normalize(const char *in, char ret[256]);
/* "docker://registry/repo:tag" or "...@digest" into buf. */
int oci_ref_transport(const OciRef *ref, char *buf, size_t len);

typedef struct OciPullLimits {
        uint64_t max_bytes;              /* downloaded and unpacked, together */
        int64_t timeout_ms;              /* for the download and the unpack each */
        const char *const *insecure;     /* host:port allowed over plain HTTP */
        unsigned n_insecure;
        const char *hidden[2];           /* directories the tools never see (NULL: none) */
} OciPullLimits;

typedef struct OciPulled {
        char name[OCI_IMAGE_NAME_LEN + 1]; /* the tree's image name */
        char digest[OCI_DIGEST_LEN + 1];   /* the manifest's */
        json_t *config;                    /* env, workdir, user, cmd, entrypoint, labels, exposedPorts */
        uint64_t size_bytes;               /* of the layers, compressed */
        unsigned layers;
        bool reused;                       /* the tree was there already */
} OciPulled;

void oci_pulled_done(OciPulled *p);

/* Where pulled trees live, and an image name's directory there (NULL when
 * the name is not a pulled one). */
char *oci_images_dir(const char *state_dir);
char *oci_image_dir(const char *state_dir, const char *name);

/* Removes what pulls a stopped daemon cut left: their directories and
 * trees half moved into place. Only while no pull runs. */
void oci_pull_clean(const char *state_dir);

/* Whether a pulled tree (its image name) is used by an image, a layer, a
 * snapshot or a sandbox. */
typedef bool (*OciTreeInUseFn)(void *userdata, const char *name);
/* owner's pulled trees past max_bytes or max_trees: the least recently
 * pulled that in_use says nothing uses are removed until both hold. Trees
 * record their owner at their pull; one from before that is never taken
 * until a pull of its owner's finds it again (its name is the owner's).
 * Only while none of owner's pulls runs. */
int oci_trees_collect(const char *state_dir, const char *owner, uint64_t max_bytes, unsigned max_trees,
                      OciTreeInUseFn in_use, void *userdata);

/* Calls fn with the owner each tree names (once per tree, in no order);
 * trees that name none are passed over. */
typedef void (*OciTreeOwnerFn)(void *userdata, const char *owner);
int oci_trees_owners(const char *state_dir, OciTreeOwnerFn fn, void *userdata);

/* Pulls `ref` (or, with `archive`, reads an OCI layout archive or a
 * `docker save` archive at that path) for `owner`; `auth` is NULL or the
 * registry's {username, password}. On failure a message for the client in
 * why (no host paths), and nothing of the pull left on disk. */
int oci_pull(const char *state_dir, const OciPullLimits *lim, const char *owner, const char *ref, const char *archive,
             const json_t *auth, OciPulled *ret, char *why, size_t why_len);
