#pragma once
/* What the files of the images module share (user_images.c: the queue and
 * the builds; user_images_records.c: the records' reads, tags and
 * deletes). */
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/egress/egress_seal.h"
#include "daemon/model/dockerfile.h"
#include "daemon/manager/user_images.h"

#define BUILD_WORKERS 2
#define LOG_LINE_MAX 4096

typedef struct Job {
        struct Job *next;
        char id[IMAGE_ID_LEN + 1];
        char rid[32];
        KeyInfo key;
        ImageBuildRequest req;
        int64_t version;
        char *name;
} Job;

typedef struct OwnerCount {
        char owner[128];
        unsigned running, queued;
} OwnerCount;

/* The COPY sources' digests remembered (user_images.c): a rebuild of the
 * same context and steps keys its COPY without a sandbox. */
#define SOURCES_MEMO_MAX 256u
typedef struct SourcesMemo {
        char key[65];
        char digest[65];
        uint64_t used; /* 0: empty */
} SourcesMemo;

/* A build's sandbox that the daemon's stop left (user_images_recover.c). */
typedef struct CutSandbox {
        char id[32];
        KeyInfo key;
} CutSandbox;

struct UserImages {
        const struct DaemonConfig *cfg;
        const StoreImageOps *ops;
        StoreImages *h;
        Manager *m;
        SnapshotStore *snapshots;
        char *dir;     /* state_dir/user-images */
        char *ctx_dir; /* state_dir/image-context */
        char host_id[64];
        bool fleet; /* hosts share the store: another host may keep an image */
        pthread_mutex_t lock;
        pthread_cond_t cond;
        Job *queue; /* oldest first */
        Job *running; /* taken from the queue by a worker, until the build's end */
        OwnerCount *owners;
        size_t n_owners;
        bool stopping;
        pthread_t workers[BUILD_WORKERS];
        unsigned n_workers;
        uint8_t seal_key[SEAL_KEY_LEN]; /* the registries' secrets' */
        bool have_seal_key;
        SourcesMemo memo[SOURCES_MEMO_MAX]; /* under lock */
        uint64_t memo_clock;
        CutSandbox *cut; /* found before the sandboxes' recovery, deleted at the start */
        size_t n_cut;
};

/* What builds cut by the daemon's stop left (user_images_recover.c): the
 * builds' sandboxes, images' disks, layers without a record and partial
 * context chunks. Before the records are marked failed. */
void user_images_recover(UserImages *u);

/* The chunks of build contexts (user_images_context.c): a job's build
 * ended, it leaves u->running (under u->lock); every owner's chunks unused
 * for --image-context-max-age-hours that no build names go (at most every
 * few minutes unless `now`). */
void user_images_running_drop(UserImages *u, Job *j);
void user_images_context_sweep(UserImages *u, bool now);

/* The owner's pulled trees past their bound that nothing uses go, least
 * recently pulled first (user_images_trees.c). While no build of the
 * owner's runs but the caller's. */
void user_images_collect_trees(UserImages *u, const char *owner);
/* The same outside the owner's builds (an image deleted): skipped while a
 * build of the owner's is queued or running, whose end collects them;
 * otherwise the owner counts as running meanwhile, so none of its builds
 * starts a pull. Not under u->lock. */
void user_images_collect_trees_idle(UserImages *u, const char *owner);
/* An owner's counts, made with make (under u->lock; NULL: none, or out of
 * memory). */
OwnerCount *owner_count(UserImages *u, const char *owner, bool make);

/* The build log's file of image id (malloc'ed; NULL on ENOMEM). */
char *user_images_log_path(UserImages *u, const char *id);
bool user_images_id_ok(const char *s);
/* The image record's "build": the sandbox a build ran in, {vcpu,
 * memoryMiB, diskMiB, timeoutSeconds, network} (user_images_records.c).
 * NULL when out of memory. */
json_t *user_images_build_json(const ImageBuildRequest *req);

/* ---- a build (user_images.c), and its cache (user_images_cache.c) ---- */

typedef struct BuildLog {
        int fd;
        int64_t seq;
        uint64_t bytes;
        bool over;
        unsigned step;
        char pending[2][LOG_LINE_MAX + 1]; /* a line of stdout and of stderr not ended yet */
        size_t pending_len[2];
        const json_t *secrets; /* the build's {id: value}, masked in every line; NULL: none */
} BuildLog;

typedef struct Build {
        UserImages *u;
        Job *job;
        BuildLog *log;      /* the image's, shared by its stages */
        struct Build **stages; /* the stages built for COPY --from, by index (shared) */
        int stage;          /* the Dockerfile's stage this one builds */
        int64_t deadline_ms;
        char sandbox_id[32];
        json_t *vars;  /* ARG values in force */
        json_t *env;   /* ENV in force */
        json_t *config; /* what the image records: env, workdir, user, cmd, entrypoint, labels, exposed */
        char *workdir;
        bool root;
        bool cmd_set; /* a CMD in this stage: an ENTRYPOINT then keeps it (Docker's rule) */
        char error[512];
        unsigned step, n_steps;
        const DockerfileStep *cur;
        char *base;      /* the stage's FROM as a sandbox starts from it */
        char *base_snap; /* and its disk when it is an image of the owner's (NULL: none) */
        /* Per-step layers (user_images_cache.c): whether this stage keeps
         * them, whether it looks them up (not with cache: false), the key of
         * its state so far and the snapshot of the last layer it found. */
        bool layers, layers_lookup;
        bool walked; /* past the last layer found: the steps run */
        char layer_key[65];
        char *layer_snap;
        char sandbox_layer[64];   /* the layer the sandbox started at ("": the FROM) */
        char image_layer_key[65]; /* the last step's layer, kept from the image's disk ("": none) */
        json_t *pending_dirs; /* WORKDIRs walked past since the last layer found: [[dir, root], ...] */
        char sources_digest[65]; /* of the COPY being keyed */
} Build;

/* A line of the daemon's own in the build's log. */
__attribute__((format(printf, 2, 3))) int build_log_sys(BuildLog *l, const char *fmt, ...);
/* A step's output in the build's log, split into lines (a partial line is
 * held until its end or build_log_flush); -EFBIG once the log is past its
 * bound. */
int build_log_output(BuildLog *l, int fd, const uint8_t *data, size_t len);
int build_log_flush(BuildLog *l);
/* The owner's directory of context chunks (named by a hash of the owner);
 * made when `make`. NULL on failure. */
char *build_owner_dir(UserImages *u, const char *owner, bool make);
/* A recipe's build: the recipe (its files as their sizes and SHA-256s)
 * and the Dockerfile made of it, the log's first lines. 0, or the build's
 * failure. */
int build_log_recipe(Build *b);
/* The environment of a step: PATH unless set, the ARGs, then ENV. */
json_t *build_step_env(Build *b);
/* Runs argv in the build's sandbox as root or the build's user, its output
 * into the log (none when `quiet`); its exit code in *ret_code. */
int build_run_in_sandbox(Build *b, json_t *argv, json_t *env, const char *cwd, bool root, bool quiet, bool sync,
                         int64_t timeout_ms, int *ret_code);
/* argv as /bin/sh -c line. */
void build_shell_form(json_t *argv, const char *line);
/* A RUN step (user_images_run.c), with the secrets it mounts present only
 * while it runs; with `sync` the agent syncs the sandbox's files once the
 * command ends (its layer's snapshot is taken next). */
int build_step_run(Build *b, const DockerfileStep *s, int64_t deadline_ms, bool sync);
/* What a FROM names, for a build (or a stage) b: a built-in image's name
 * in *ret_base, an image of the owner's (its base and disk, *ret_snapshot),
 * else a registry's, pulled; its config in *ret_config. 0, or the build's
 * failure. */
int build_resolve_from(Build *b, const char *from, char **ret_base, char **ret_snapshot, json_t **ret_config);
/* b's sandbox started from its base (or its last layer found), with the
 * build's context sent. */
int build_stage_sandbox(Build *b);
void build_drop_sandbox(Build *b);
void build_state_free(Build *b);
/* COPY --from=IMAGE (user_images_copy_from.c): the image, a built-in one
 * or the owner's (never a registry's, nor another owner's), started in a
 * sandbox of its own for the step, as a stage without steps; freed (its
 * sandbox deleted) by build_image_source_free. 0, or the build's failure. */
int build_image_source(Build *b, const char *ref, Build **ret);
void build_image_source_free(Build **o);
/* What COPY --from=IMAGE names now, for the whole build's key: a built-in
 * image's name and build time, an image of the owner's by its id. 0, or
 * -ENOENT (not ready, or none). */
int build_image_identity(Build *b, const char *name, char **ret);
/* The build fails with this message (its log's last line): the error. */
__attribute__((format(printf, 2, 3))) int build_fail(Build *b, const char *fmt, ...);
/* A variable (ARG, then ENV) for dockerfile_expand; userdata is the Build. */
const char *build_var_lookup(void *userdata, const char *name);

/* The key of the whole build (docs/images.md, "The build cache"); run after
 * the global ARGs are read. 0 with ret_hex, or -ENOENT (why in *ret_why)
 * when the build is not one to cache; -ENOMEM. */
int build_cache_key(Build *b, char ret_hex[65], const char **ret_why);
/* An unchanged build: a new version whose disk shares the cached image's,
 * no sandbox started. 0 with *ret_doc, -ENOENT when there is none to use
 * (the caller builds), or the build's failure. */
int build_cache_use(Build *b, const char *key, json_t **ret_doc);

/* The key a COPY's sources digest is remembered under: the owner, the
 * layers' chain before the step (the base and every step before it), the
 * context's archive and the sources as the step names them (argv). */
int layer_sources_memo_key(Build *b, const json_t *argv, char ret_hex[65]);
/* The memo of COPY sources' digests, the 256 used last: a digest
 * remembered under key (true, marked used), and one remembered in place of
 * the least recently used. */
bool sources_memo_get(UserImages *u, const char *key, char ret_hex[65]);
void sources_memo_put(UserImages *u, const char *key, const char *hex);
/* The digest of the sources a COPY or ADD step s takes from the context
 * (context_digest.h): remembered from an earlier build of the same context
 * and steps, else read from the context's archive by the daemon, no
 * sandbox started. 0, or the build's failure (an archive refused says
 * why). */
int build_sources_digest(Build *b, const DockerfileStep *s, char ret_hex[65]);

/* Per-step layers (docs/images.md, "Per-step layers"). layer_chain_start
 * keys the stage's FROM (after stage_run resolved it): 0, or -ENOENT (why
 * in *ret_why) when the FROM is not one to key, and the stage keeps no
 * layers. */
int layer_chain_start(Build *b, const char **ret_why);
/* Chains step s, as the state in force before it runs, onto the key. */
int layer_chain_step(Build *b, const DockerfileStep *s);
/* Whether step s changes the tree (RUN, COPY, ADD, WORKDIR), and whether
 * it keeps a layer of its own (not a WORKDIR, whose directory goes in the
 * next step's). */
bool layer_step_has_tree(const DockerfileStep *s);
bool layer_step_keeps_layer(const DockerfileStep *s);
/* The layer of the current key: its snapshot (malloc'ed) in *ret_snap, its
 * use recorded. -ENOENT. */
int layer_find(Build *b, char **ret_snap);
/* The build's sandbox as the layer of the current key: a snapshot of the
 * owner's, recorded, then the owner's layers past the bound evicted, least
 * recently used first. Never fails the build: a layer not kept is logged.
 * `synced`: the step's exec synced the sandbox's files as it ended (the
 * agent's syncAfter), and nothing ran in it since. */
void layer_keep(Build *b, bool synced);
/* The layer of key (the last step's, whose tree the image's disk is, less
 * the build's context) as a link of the image's disk image_snap: its files
 * shared, not copied. Never fails the build, as layer_keep. */
void layer_keep_image(Build *b, const char *key, const char *image_snap);
