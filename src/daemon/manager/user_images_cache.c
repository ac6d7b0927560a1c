/* The image builder's build cache (docs/images.md, "The build cache"): a
 * build the owner has made before, with the same Dockerfile, context,
 * arguments and bases, becomes a new version sharing that image's disk. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/config.h"
#include "daemon/manager/images.h"
#include "daemon/manager/oci_pull.h"
#include "daemon/manager/sandbox.h"
#include "daemon/manager/snapshot.h"
#include "daemon/manager/user_images-internal.h"
#include "daemon/manager/user_images.h"

/* A field of the key: its length first, so that no two lists of fields
 * hash alike by moving bytes from one field to the next. */
static void key_field(EVP_MD_CTX *md, const char *s) {
        uint64_t n = s ? strlen(s) : UINT64_MAX;
        EVP_DigestUpdate(md, &n, sizeof n);
        if (s)
                EVP_DigestUpdate(md, s, strlen(s));
}

static void key_map(EVP_MD_CTX *md, const json_t *map) {
        _cleanup_free_ char *text = map ? json_dumps(map, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        key_field(md, text);
}

/* What a FROM starts from, as it is now: a built-in image's name and the
 * time it was built, an image of the owner's by its id (a new version is
 * a new id), a registry's image by its digest. -ENOENT (why in *ret_why)
 * for a base whose content the name does not fix: a registry's tag, an
 * imported archive, an image not ready. */
static int from_identity(Build *b, const char *from, char **ret, const char **ret_why) {
        ImageInfo info;
        if (image_name_ok(from) && strchr(from, ':') == NULL) {
                ImageRow own;
                if (user_images_resolve(b->u, b->job->key.owner, from, &own) == 0)
                        store_image_row_clear(&own);
                else if (image_info(b->u->cfg, from, &info) == 0 && info.built) {
                        if (!info.built_at[0]) {
                                *ret_why = "the built-in image of its FROM does not say when it was built";
                                return -ENOENT;
                        }
                        return asprintf(ret, "builtin:%s@%s", from, info.built_at) < 0 ? -ENOMEM : 0;
                }
        }
        ImageRow row;
        int r = user_images_resolve(b->u, b->job->key.owner, from, &row);
        if (r == 0) {
                bool ready = strcmp(row.state, "ready") == 0;
                r = ready ? (asprintf(ret, "image:%s", row.id) < 0 ? -ENOMEM : 0) : -ENOENT;
                store_image_row_clear(&row);
                *ret_why = "its FROM image is not ready";
                return r;
        }
        OciRef ref;
        if (r == -ENOENT && oci_ref_parse(from, &ref) == 0 && ref.digest[0])
                return asprintf(ret, "oci:%s/%s@%s", ref.registry, ref.repo, ref.digest) < 0 ? -ENOMEM : 0;
        *ret_why = "a FROM names a registry's tag, whose image may have changed since (name it by @sha256:digest)";
        return -ENOENT;
}

int build_image_identity(Build *b, const char *name, char **ret) {
        const char *why = NULL;
        ImageRow row;
        ImageInfo info;
        bool own = user_images_resolve(b->u, b->job->key.owner, name, &row) == 0;
        if (own)
                store_image_row_clear(&row);
        else if (!image_name_ok(name) || strchr(name, ':') || image_info(b->u->cfg, name, &info) < 0 || !info.built)
                return -ENOENT;
        return from_identity(b, name, ret, &why);
}

/* The stages a build of stage `target` runs: it and those its COPY --from
 * name, and theirs (a stage names only stages before it, so one pass from
 * the end finds them all). */
static void reached_stages(const Dockerfile *d, int target, bool reached[DOCKERFILE_MAX_STAGES]) {
        memset(reached, 0, DOCKERFILE_MAX_STAGES * sizeof *reached);
        if (target >= 0 && (unsigned)target < DOCKERFILE_MAX_STAGES)
                reached[target] = true;
        for (size_t i = d->n_steps; i-- > 0;) {
                const DockerfileStep *s = &d->steps[i];
                if (s->stage >= DOCKERFILE_MAX_STAGES || !reached[s->stage] || !s->from)
                        continue;
                int st = dockerfile_stage(d, s->from);
                if (st >= 0 && (unsigned)st < DOCKERFILE_MAX_STAGES)
                        reached[st] = true;
        }
}

/* The key of the whole build (docs/images.md, "The build cache"): the
 * owner, the Dockerfile's text, the context archive's SHA-256, the target,
 * the build args, env and labels, the driver builds run on, and what each
 * FROM names now. Run after global_args. 0 with ret_hex, or -ENOENT (why
 * in *ret_why) when the build is not one to cache. */
int build_cache_key(Build *b, char ret_hex[65], const char **ret_why) {
        const ImageBuildRequest *req = &b->job->req;
        if (req->import_path) {
                *ret_why = "an imported archive is not cached";
                return -ENOENT;
        }
        const Driver *drv = b->u->cfg->default_driver;
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
                EVP_MD_CTX_free(md);
                return -ENOMEM;
        }
        key_field(md, "runtime image build cache 1");
        key_field(md, b->job->key.owner);
        key_field(md, req->dockerfile_sha256);
        key_field(md, req->chunks ? req->context_sha256 : NULL);
        key_field(md, req->target);
        key_map(md, req->build_args);
        key_map(md, req->env);
        key_map(md, req->labels);
        key_field(md, drv ? drv->name : NULL);
        int r = 0;
        const Dockerfile *d = &req->dockerfile;
        bool reached[DOCKERFILE_MAX_STAGES];
        reached_stages(d, b->stage, reached);
        for (size_t i = 0; i < d->n_steps && r == 0; i++) {
                if (d->steps[i].op != DF_FROM || d->steps[i].stage >= DOCKERFILE_MAX_STAGES ||
                    !reached[d->steps[i].stage])
                        continue;
                _cleanup_free_ char *from = NULL, *id = NULL;
                DockerfileError e = { 0 };
                if (dockerfile_expand(d->steps[i].words[0], build_var_lookup, b, &from, &e) < 0) {
                        *ret_why = "a FROM does not expand";
                        r = -ENOENT;
                } else if ((r = from_identity(b, from, &id, ret_why)) == 0)
                        key_field(md, id);
        }
        /* What each COPY --from=IMAGE of those stages names now: a rebuilt
         * image is a new id, so the build misses. */
        for (size_t i = 0; i < d->n_steps && r == 0; i++) {
                const DockerfileStep *s = &d->steps[i];
                if (!s->from_image || s->stage >= DOCKERFILE_MAX_STAGES || !reached[s->stage])
                        continue;
                _cleanup_free_ char *from = NULL, *id = NULL;
                DockerfileError e = { 0 };
                if (dockerfile_expand(s->from, build_var_lookup, b, &from, &e) < 0 ||
                    (r = build_image_identity(b, from, &id)) == -ENOENT) {
                        *ret_why = "a COPY --from names no image ready";
                        r = -ENOENT;
                } else if (r == 0) {
                        key_field(md, "copy-from");
                        key_field(md, id);
                }
        }
        uint8_t digest[32];
        unsigned len = 0;
        if (r == 0 && EVP_DigestFinal_ex(md, digest, &len) != 1)
                r = -ENOMEM;
        EVP_MD_CTX_free(md);
        if (r == 0)
                hex_encode(digest, sizeof digest, ret_hex);
        return r;
}

/* How many of the owner's ready images a lookup reads at most: their disks
 * count against the owner's 256 snapshots, so this bounds nothing real. */
#define CACHE_SCAN_MAX 2048u

typedef struct CacheScan {
        const char *key, *host;
        unsigned seen;
        int64_t last_created;
        char last_id[IMAGE_ID_LEN + 1];
        char found[IMAGE_ID_LEN + 1];
        json_t *doc;
} CacheScan;

static int cache_scan_row(void *userdata, const ImageRow *row) {
        CacheScan *c = userdata;
        c->seen++;
        c->last_created = row->created_at;
        snprintf(c->last_id, sizeof c->last_id, "%s", row->id);
        if (c->doc || strcmp(row->host_id, c->host) != 0)
                return 0;
        json_t *doc = json_loads(row->doc ? row->doc : "", 0, NULL);
        const char *k = json_string_value(json_object_get(doc, "cacheKey"));
        if (k && strcmp(k, c->key) == 0 && json_string_value(json_object_get(doc, "snapshot"))) {
                c->doc = doc;
                snprintf(c->found, sizeof c->found, "%s", row->id);
                return 0;
        }
        json_decref(doc);
        return 0;
}

/* The newest ready image of the owner's, kept on this host, built with key:
 * its id and doc (a new reference). -ENOENT. */
static int cache_find(UserImages *u, const char *owner, const char *key, char ret_id[IMAGE_ID_LEN + 1],
                      json_t **ret_doc) {
        CacheScan c = { .key = key, .host = u->host_id };
        for (;;) {
                unsigned before = c.seen;
                int r = user_images_list(u, owner, NULL, "ready", c.last_id[0] ? c.last_created : 0,
                                         c.last_id[0] ? c.last_id : NULL, 100, cache_scan_row, &c);
                if (r < 0) {
                        json_decref(c.doc);
                        return r;
                }
                if (c.doc || c.seen - before < 100 || c.seen >= CACHE_SCAN_MAX)
                        break;
        }
        if (!c.doc)
                return -ENOENT;
        memcpy(ret_id, c.found, IMAGE_ID_LEN + 1);
        *ret_doc = c.doc;
        return 0;
}

/* The build's steps, each logged CACHED as Docker logs a step it took from
 * its cache. */
static void log_cached_steps(Build *b) {
        const Dockerfile *d = &b->job->req.dockerfile;
        bool reached[DOCKERFILE_MAX_STAGES];
        reached_stages(d, b->stage, reached);
        bool from_seen = false;
        for (size_t i = 0; i < d->n_steps; i++) {
                const DockerfileStep *s = &d->steps[i];
                from_seen = from_seen || s->op == DF_FROM;
                if (!from_seen || s->stage >= DOCKERFILE_MAX_STAGES || !reached[s->stage])
                        continue; /* the global ARGs are no step, and a stage nothing needs never ran */
                char head[160];
                snprintf(head, sizeof head, "%s", s->n_words && s->words[0] ? s->words[0] : "");
                build_log_sys(b->log, "CACHED [stage %u, line %u] %s %s", s->stage, s->line, dockerfile_op_name(s->op),
                        head);
        }
}

/* An unchanged build: a new version whose disk shares the cached image's
 * (snapshot_store_link), no sandbox started. 0 with *ret_doc, -ENOENT when
 * there is none to use (the caller builds), or the build's failure. */
int build_cache_use(Build *b, const char *key, json_t **ret_doc) {
        UserImages *u = b->u;
        Job *job = b->job;
        char from_id[IMAGE_ID_LEN + 1];
        _cleanup_json_ json_t *cached = NULL;
        int r = cache_find(u, job->key.owner, key, from_id, &cached);
        if (r < 0)
                return -ENOENT;
        const char *snap = json_string_value(json_object_get(cached, "snapshot"));
        _cleanup_json_ json_t *labels = json_pack("{s:s}", "runtime.image", job->id);
        _cleanup_free_ char *labels_text = labels ? json_dumps(labels, JSON_COMPACT) : NULL;
        if (!labels_text)
                return build_fail(b, "out of memory");
        SnapshotRow srow = { 0 };
        r = snapshot_store_link(u->snapshots, job->key.owner, snap, job->key.id, labels_text, false, &srow);
        if (r == -EDQUOT || r == -EFBIG)
                return build_fail(b, "the image's disk would pass the owner's bounds on snapshots (delete images or "
                                     "snapshots)");
        if (r < 0) {
                /* The cached image lost its disk (its snapshot deleted on
                 * its own): the build runs. */
                log_info(job->rid, "image %s: the cached image %s's disk could not be shared: %s", job->id, from_id,
                         strerror(-r));
                return -ENOENT;
        }
        log_cached_steps(b);
        build_log_sys(b->log, "using the cache: the same build as image %s", from_id);
        json_t *doc = json_deep_copy(cached);
        if (!doc || json_object_set_new(doc, "snapshot", json_string(srow.id)) < 0) {
                json_decref(doc);
                snapshot_store_delete(u->snapshots, job->key.owner, srow.id);
                snapshot_row_done(&srow);
                return build_fail(b, "out of memory");
        }
        snapshot_row_done(&srow);
        json_object_del(doc, "buildMs");
        *ret_doc = doc;
        return 0;
}

/* ---- per-step layers (docs/images.md, "Per-step layers") ---- */

/* The layers one owner's eviction reads at most: more than the owner keeps
 * (LAYER_MAX_PER_OWNER), since a build of the owner's on another worker may
 * keep one between its keep and its eviction. */
#define LAYER_SCAN_MAX (2u * SNAPSHOT_MAX_PER_OWNER)
/* The layers one owner keeps at most. Layers are the daemon's own
 * snapshots, outside the owner's snapshot bounds (store_snapshots.h:
 * SNAPSHOT_LAYER), so this and --image-layer-max-mib-per-owner are all that
 * bound them. */
#define LAYER_MAX_PER_OWNER (SNAPSHOT_MAX_PER_OWNER / 4)

static int layer_key_begin(EVP_MD_CTX **ret) {
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
                EVP_MD_CTX_free(md);
                return -ENOMEM;
        }
        key_field(md, "runtime image layer 1");
        *ret = md;
        return 0;
}

static int layer_key_end(EVP_MD_CTX *md, char ret_hex[65]) {
        uint8_t digest[32];
        unsigned len = 0;
        int r = EVP_DigestFinal_ex(md, digest, &len) == 1 ? 0 : -ENOMEM;
        EVP_MD_CTX_free(md);
        if (r == 0)
                hex_encode(digest, sizeof digest, ret_hex);
        return r;
}

int layer_chain_start(Build *b, const char **ret_why) {
        const ImageBuildRequest *req = &b->job->req;
        if (req->import_path && b->stage == 0) {
                *ret_why = "an imported archive is not cached";
                return -ENOENT;
        }
        const char *from = json_string_value(json_object_get(b->config, "from"));
        _cleanup_free_ char *id = NULL;
        int r = from ? from_identity(b, from, &id, ret_why) : -ENOENT;
        if (r < 0)
                return r;
        const Driver *drv = b->u->cfg->default_driver;
        EVP_MD_CTX *md = NULL;
        if ((r = layer_key_begin(&md)) < 0)
                return r;
        /* The owner first: no two owners' layers share a key, so a layer
         * made from one owner's context or secrets never serves another. */
        key_field(md, b->job->key.owner);
        key_field(md, drv ? drv->name : NULL);
        key_field(md, id);
        return layer_key_end(md, b->layer_key);
}

int layer_sources_memo_key(Build *b, const json_t *argv, char ret_hex[65]) {
        _cleanup_free_ char *sources = json_dumps(argv, JSON_COMPACT);
        EVP_MD_CTX *md = NULL;
        int r = sources ? layer_key_begin(&md) : -ENOMEM;
        if (r < 0)
                return r;
        key_field(md, "copy sources");
        key_field(md, b->job->key.owner);
        key_field(md, b->layer_key);
        key_field(md, b->job->req.context_sha256);
        key_field(md, sources);
        return layer_key_end(md, ret_hex);
}

/* The digest remembered under key (true), marked used. */
bool sources_memo_get(UserImages *u, const char *key, char ret_hex[65]) {
        pthread_mutex_lock(&u->lock);
        bool found = false;
        for (unsigned i = 0; i < SOURCES_MEMO_MAX && !found; i++)
                if (strcmp(u->memo[i].key, key) == 0) {
                        memcpy(ret_hex, u->memo[i].digest, 65);
                        u->memo[i].used = ++u->memo_clock;
                        found = true;
                }
        pthread_mutex_unlock(&u->lock);
        return found;
}

/* Remembers a digest, in place of the least recently used. */
void sources_memo_put(UserImages *u, const char *key, const char *hex) {
        pthread_mutex_lock(&u->lock);
        unsigned at = 0;
        for (unsigned i = 1; i < SOURCES_MEMO_MAX; i++)
                if (u->memo[i].used < u->memo[at].used)
                        at = i;
        memcpy(u->memo[at].key, key, 65);
        memcpy(u->memo[at].digest, hex, 65);
        u->memo[at].used = ++u->memo_clock;
        pthread_mutex_unlock(&u->lock);
}

bool layer_step_has_tree(const DockerfileStep *s) {
        return layer_step_keeps_layer(s) || s->op == DF_WORKDIR;
}

bool layer_step_keeps_layer(const DockerfileStep *s) {
        return s->op == DF_RUN || s->op == DF_COPY || s->op == DF_ADD;
}

int layer_chain_step(Build *b, const DockerfileStep *s) {
        EVP_MD_CTX *md = NULL;
        int r = layer_key_begin(&md);
        if (r < 0)
                return r;
        key_field(md, b->layer_key);
        key_field(md, dockerfile_op_name(s->op));
        key_field(md, s->exec ? "exec" : "shell");
        for (size_t i = 0; i < s->n_words; i++)
                key_field(md, s->words[i]);
        key_field(md, s->chown);
        key_field(md, s->chmod);
        /* A RUN's secret mounts as written (id, target, variable), never
         * their values: a changed value runs no cached step again, as in
         * Docker. A step without any keys as before they were taken. */
        for (size_t i = 0; i < s->n_secrets; i++) {
                key_field(md, "secret");
                key_field(md, s->secrets[i].id);
                key_field(md, s->secrets[i].target);
                key_field(md, s->secrets[i].env);
        }
        /* The state the step runs in: what its words expand with and the
         * environment, directory and user of a RUN. */
        key_map(md, b->vars);
        key_map(md, b->env);
        key_field(md, b->workdir);
        key_field(md, b->root ? "root" : "sandbox");
        /* What a COPY or ADD takes from the context: its sources' digest,
         * so that a change to a file no step copies is no miss. */
        if (s->op == DF_COPY || s->op == DF_ADD)
                key_field(md, b->sources_digest);
        return layer_key_end(md, b->layer_key);
}

int layer_find(Build *b, char **ret_snap) {
        UserImages *u = b->u;
        const char *owner = b->job->key.owner;
        _cleanup_free_ char *snap = NULL;
        int r = u->ops->layer_use(u->h, owner, b->layer_key, u->host_id, time_now_unix_ms(), &snap);
        if (r < 0)
                return r;
        SnapshotRow row = { 0 };
        if (snapshot_store_get_layer(u->snapshots, owner, snap, &row) < 0) {
                /* Its snapshot was deleted on its own: the layer goes. */
                u->ops->layer_delete(u->h, owner, b->layer_key, u->host_id);
                return -ENOENT;
        }
        snapshot_row_done(&row);
        *ret_snap = TAKE_PTR(snap);
        return 0;
}

typedef struct LayerScan {
        unsigned n;
        int64_t total;
        char keys[LAYER_SCAN_MAX][65];
        char snaps[LAYER_SCAN_MAX][SNAPSHOT_ID_LEN + 1];
        int64_t sizes[LAYER_SCAN_MAX];
} LayerScan;

static int layer_scan_row(void *userdata, const char *key, const char *snapshot_id, int64_t size_bytes,
                          int64_t used_at) {
        LayerScan *s = userdata;
        s->total += size_bytes;
        if (s->n >= LAYER_SCAN_MAX)
                return 0;
        snprintf(s->keys[s->n], sizeof s->keys[0], "%s", key);
        snprintf(s->snaps[s->n], sizeof s->snaps[0], "%s", snapshot_id);
        s->sizes[s->n++] = size_bytes;
        return 0;
}

/* The owner's layers past --image-layer-max-mib-per-owner or
 * LAYER_MAX_PER_OWNER: the least recently used go first, never the one
 * just kept (`kept`). */
static void layer_evict(Build *b, const char *kept) {
        UserImages *u = b->u;
        const char *owner = b->job->key.owner;
        int64_t bound = (int64_t)u->cfg->image_layer_max_mib_per_owner << 20;
        LayerScan *s = calloc(1, sizeof *s);
        if (!s || u->ops->layer_list(u->h, owner, u->host_id, layer_scan_row, s) < 0) {
                free(s);
                return;
        }
        unsigned count = s->n;
        for (unsigned i = 0; i < s->n && (s->total > bound || count > LAYER_MAX_PER_OWNER); i++) {
                if (strcmp(s->keys[i], kept) == 0)
                        continue;
                count--;
                /* The row first: a layer is never found without its snapshot. */
                if (u->ops->layer_delete(u->h, owner, s->keys[i], u->host_id) == 0)
                        snapshot_store_delete(u->snapshots, owner, s->snaps[i]);
                s->total -= s->sizes[i];
        }
        free(s);
}

/* The snapshot srow recorded as the layer of key, then the owner's layers
 * past their bounds evicted. */
static void layer_record(Build *b, const char *key, const SnapshotRow *srow) {
        UserImages *u = b->u;
        Job *job = b->job;
        int r = u->ops->layer_put(u->h, job->key.owner, key, srow->id, u->host_id, srow->size_bytes,
                                  time_now_unix_ms());
        if (r < 0) {
                /* -EEXIST: a build of the owner's kept the same layer meanwhile. */
                snapshot_store_delete(u->snapshots, job->key.owner, srow->id);
                if (r != -EEXIST)
                        log_warn(job->rid, "image %s: recording a layer: %s", job->id, strerror(-r));
        }
        layer_evict(b, key);
}

void layer_keep(Build *b, bool synced) {
        UserImages *u = b->u;
        Job *job = b->job;
        _cleanup_json_ json_t *labels = json_pack("{s:s}", "runtime.layer", b->layer_key);
        SnapshotRequest sr = { .mode = "disk", .labels = labels, .keep = true, .layer = true, .synced = synced };
        SnapshotRow srow = { 0 };
        SandboxError se;
        if (!labels)
                return;
        if (sandbox_snapshot(u->m, &job->key, b->sandbox_id, &sr, job->rid, &srow, &se) < 0) {
                build_log_sys(b->log, "this step's layer is not kept: %s", se.message);
                return;
        }
        layer_record(b, b->layer_key, &srow);
        snapshot_row_done(&srow);
}

void layer_keep_image(Build *b, const char *key, const char *image_snap) {
        UserImages *u = b->u;
        Job *job = b->job;
        _cleanup_json_ json_t *labels = json_pack("{s:s}", "runtime.layer", key);
        _cleanup_free_ char *labels_text = labels ? json_dumps(labels, JSON_COMPACT) : NULL;
        SnapshotRow srow = { 0 };
        if (!labels_text)
                return;
        int r = snapshot_store_link(u->snapshots, job->key.owner, image_snap, job->key.id, labels_text, true, &srow);
        if (r < 0) {
                build_log_sys(b->log, "the last step's layer is not kept: its link of the image's disk failed");
                log_warn(job->rid, "image %s: the last step's layer as a link of %s: %s", job->id, image_snap,
                         strerror(-r));
                return;
        }
        layer_record(b, key, &srow);
        snapshot_row_done(&srow);
}
