#pragma once
/*
 * The images users build from Dockerfiles (docs/images.md). A build is
 * untrusted code: it runs in a sandbox of its owner's, started from the
 * FROM image with the build's own egress policy (none unless the request
 * gives one), each RUN an exec of the agent, each COPY the
 * build context's files (unpacked into the sandbox by the agent's bounded
 * unarchive, which refuses names and links that leave it) copied by the
 * sandbox itself. The result is a disk snapshot of the sandbox, kept with no
 * expiry and labelled with the image's id; a sandbox created from the image
 * starts from that snapshot on the namespace or gVisor driver.
 *
 * Records live in the store (store_images.h); the build log of each image
 * in state_dir/user-images/<id>.log, one JSON line per log line; the
 * context's chunks, uploaded by digest, in state_dir/image-context/<owner>/.
 *
 * Builds queue and run on BUILD_WORKERS threads; a worker takes the oldest
 * queued build of an owner that has none running, so one owner's queue
 * never holds another's back, and an owner has at most
 * USER_IMAGES_QUEUED_PER_OWNER builds queued or running (a 429 past it).
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/manager/sandbox_error.h"
#include "daemon/model/dockerfile.h"
#include "daemon/store/store.h"
#include "daemon/store/store_images.h"
#include "daemon/store/store_keys.h"

typedef struct UserImages UserImages;
typedef struct Manager Manager;
typedef struct SnapshotStore SnapshotStore;

#define USER_IMAGES_QUEUED_PER_OWNER 4
#define USER_IMAGES_CHUNK_MAX (4u * 1024u * 1024u)
/* A context's archive, compressed, as the published client bounds it. */
#define USER_IMAGES_CONTEXT_MAX (100ull * 1024 * 1024)
/* Files and bytes the context may unpack to: a tar bomb stops here. */
#define USER_IMAGES_CONTEXT_FILES 20000u
#define USER_IMAGES_CONTEXT_UNPACKED (1024ull * 1024 * 1024)
/* A build's log: past it the build fails, its log saying why. */
#define USER_IMAGES_LOG_MAX (8u * 1024u * 1024u)

/* A build as a client asks for it, validated. */
typedef struct ImageBuildRequest {
        Dockerfile dockerfile;
        char *name;        /* [a-z0-9][a-z0-9_.-]{0,63} */
        json_t *tags;      /* array of tag strings; ["latest"] when none */
        json_t *labels;    /* object string->string, or NULL */
        json_t *build_args; /* object string->string, or NULL */
        json_t *env;       /* object string->string set for every step, or NULL */
        char *target;      /* a stage's name, or NULL: the last */
        json_t *chunks;    /* the context's chunk digests in order, or NULL: no context */
        char context_sha256[65];
        int64_t context_size;
        char dockerfile_sha256[65]; /* of the Dockerfile's text: part of the cache key */
        bool no_cache;              /* "cache": false: every step runs */
        unsigned vcpu, memory_mib, disk_mib;
        int64_t timeout_seconds;
        /* The build sandbox's egress policy as a create's network is
         * normalized ({internet, allow, deny}); NULL: no network. Not part
         * of the cache key (docs/images.md, "The build's network"). */
        json_t *network;
        /* An uploaded OCI layout or docker save archive the first FROM
         * is (the file is the request's: removed with it), or NULL. */
        char *import_path;
        /* The start command (model/image_start.h) when start_given; NULL
         * then keeps none. Not given: the Dockerfile's CMD gives it. */
        json_t *start;
        bool start_given;
        /* A recipe's build: the recipe as its record keeps it
         * (model/image_recipe.h) and the Dockerfile it made, both logged
         * first; NULL: none. */
        json_t *recipe;
        char *recipe_dockerfile;
        /* The build's secrets, {id: value}: in memory for the build's RUN
         * steps that mount them, and nowhere else (docs/images.md, "Build
         * secrets"); NULL: none. */
        json_t *secrets;
} ImageBuildRequest;
#define USER_IMAGES_SECRETS_MAX 32u
/* A step's exec carries its secrets in one request of the agent's
 * protocol, whose JSON is at most 64 KiB (PROTO_MAX_JSON): the values of a
 * build's secrets together stay well under it. */
#define USER_IMAGES_SECRET_VALUE_MAX (16u * 1024u)
#define USER_IMAGES_SECRETS_TOTAL_MAX (32u * 1024u)
void image_build_request_done(ImageBuildRequest *r);

int user_images_open(const StoreBackend *b, const char *location, const char *state_dir, UserImages **ret);
struct DaemonConfig;
void user_images_set_manager(UserImages *u, const struct DaemonConfig *cfg, Manager *m, SnapshotStore *snapshots);
void user_images_set_host(UserImages *u, const char *host_id, bool fleet);
/* The key that seals the registries' secrets (egress_seal.h); without it
 * credentials cannot be stored. */
void user_images_set_seal_key(UserImages *u, const uint8_t key[32]);
/* Before the sandboxes' recovery (manager_recover): notes the sandboxes of
 * the builds this host's stop cut, which user_images_start deletes. */
int user_images_recover_sandboxes(UserImages *u);
/* Removes what the builds this host left unfinished kept (their sandboxes,
 * disks and layers without records), fails their records, then starts the
 * workers. */
int user_images_start(UserImages *u);
/* Has the builds give up (each at its next second of waiting) and the
 * workers take no more; NULL is fine. */
void user_images_stop(UserImages *u);
void user_images_close(UserImages *u);

/* A fleet (docs/fleet.md): the records' writes are this host's at epoch
 * from now on, refused once the fleet moved on without it (its epoch
 * bumped, or it was declared dead). NULL is fine. */
int user_images_set_epoch(UserImages *u, const char *host_id, int64_t epoch);
/* The sweeper's: the builds host_id left queued or building are failed
 * with error while the store has that host dead; the count in *ret_n.
 * NULL is fine. */
int user_images_fail_dead_host(UserImages *u, const char *host_id, const char *error, int64_t *ret_n);

/* Which of digests (an array of 64-hex strings) owner has not uploaded;
 * those it has are used now and held for the build that follows. */
int user_images_context_missing(UserImages *u, const char *owner, json_t *digests, json_t **ret);
/* Keeps a chunk whose SHA-256 is digest: -EBADMSG when the bytes' is
 * another; past the owner's bound the least recently used chunks nothing
 * keeps go first, -EDQUOT when what is kept fills it. */
int user_images_context_put(UserImages *u, const char *owner, const char *digest, const void *data, size_t len);
/* A build was queued naming these chunks: they are used now, and kept
 * while a build names them rather than by the `missing` query's hold. */
void user_images_context_named(UserImages *u, const char *owner, json_t *chunks);
/* The bytes of chunks one owner keeps (--image-context-max-mib-per-owner). */
uint64_t user_images_context_bound(UserImages *u);

/* Queues a build (its row in *ret, state "queued"); the request is taken. */
int user_images_build(UserImages *u, const KeyInfo *key, ImageBuildRequest *req, const char *rid, ImageRow *ret,
                      SandboxError *e);
/* owner's image: by id (a UUID), name (its "latest" tag), name:tag or
 * name@version. -ENOENT. */
int user_images_resolve(UserImages *u, const char *owner, const char *ref, ImageRow *ret);
int user_images_get(UserImages *u, const char *owner, const char *id, ImageRow *ret);
int user_images_list(UserImages *u, const char *owner, const char *name, const char *state, int64_t before_created,
                     const char *before_id, unsigned limit, StoreImageFn fn, void *userdata);
/* The image's tags, as a JSON array (new reference). */
json_t *user_images_tags(UserImages *u, const char *id);
int user_images_tag(UserImages *u, const char *owner, const char *id, const char *tag, SandboxError *e);
int user_images_untag(UserImages *u, const char *owner, const char *id, const char *tag, SandboxError *e);
/* Deletes an image that is not building, with its tags, disk and log. */
int user_images_delete(UserImages *u, const char *owner, const char *id, SandboxError *e);
/* The log lines after seq `after`, at most max, as JSON objects appended
 * to lines; *ret_next the last seq given (after when none). */
int user_images_logs(UserImages *u, const char *id, int64_t after, unsigned max, json_t *lines, int64_t *ret_next);

/* An owner's credentials of a registry (oci_pull.h's normalized name):
 * the password sealed with the owner and registry as associated data,
 * never returned. -EINVAL for a registry that is not one, -E2BIG past the
 * bounds, -EOPNOTSUPP without a key. */
#define USER_IMAGES_REGISTRIES_PER_OWNER 64
int user_images_registry_set(UserImages *u, const char *owner, const char *registry, const char *username,
                             const char *password, json_t **ret);
/* {registry, username, updatedAt} of each, by name. */
int user_images_registry_list(UserImages *u, const char *owner, json_t **ret);
int user_images_registry_delete(UserImages *u, const char *owner, const char *registry);
/* The owner's {username, password} of registry (a new reference), or NULL
 * when none is stored or it does not open. */
json_t *user_images_registry_auth(UserImages *u, const char *owner, const char *registry);

bool user_images_name_ok(const char *s);
bool user_images_tag_ok(const char *s);
