/* The images users build: the HTTP edge of user_images.h. JSON becomes an
 * ImageBuildRequest here and an ImageRow becomes JSON here; the build is
 * the image module's. */
#include "daemon/api/api_user_images.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>
#include <openssl/evp.h>

#include "common/io.h"
#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/http/request.h"
#include "daemon/manager/fleet.h"
#include "daemon/manager/images.h"
#include "daemon/manager/keys.h"
#include "daemon/manager/oci_pull.h"
#include "daemon/manager/user_images.h"
#include "daemon/model/image_recipe.h"
#include "daemon/model/image_start.h"

#define BUILD_DEFAULT_VCPU 1u
#define BUILD_DEFAULT_MEMORY_MIB 1024u
#define BUILD_DEFAULT_DISK_MIB 4096u
#define BUILD_DEFAULT_TIMEOUT_S 1800
#define BUILD_MAX_TIMEOUT_S 7200
#define MAX_TAGS 16
#define LOG_PAGE 1000
#define LIST_PAGE_MAX 100

static int offered(Req *r, ApiError *e) {
        if (!r->app->user_images)
                return api_error(e, 501, "not_implemented", NULL, "this daemon builds no images");
        return 0;
}

static json_t *time_json(int64_t t) {
        char buf[RFC3339_LEN];
        return t > 0 && time_format_rfc3339(t, buf) == 0 ? json_string(buf) : json_null();
}

static json_t *image_json(Req *r, const ImageRow *row) {
        _cleanup_json_ json_t *doc = json_loads(row->doc ? row->doc : "{}", 0, NULL);
        json_t *tags = user_images_tags(r->app->user_images, row->id);
        json_t *config = json_object_get(doc, "config");
        json_t *labels = json_object_get(config, "labels");
        if (!labels)
                labels = json_object_get(doc, "labels");
        json_t *size = json_object_get(doc, "sizeBytes");
        return json_pack("{s:s,s:s,s:I,s:s,s:s?,s:o,s:O,s:O,s:O?,s:O?,s:O?,s:o,s:o,s:O?,s:O?,s:O*,s:O*,s:O*}", "id", row->id,
                         "name",
                         row->name, "version", (json_int_t)row->version, "state", row->state, "error", row->error,
                         "tags", tags ? tags : json_array(), "labels", labels ? labels : json_object(), "config",
                         config ? config : json_object(), "from", json_object_get(doc, "from"), "base",
                         json_object_get(doc, "base"), "snapshotId", json_object_get(doc, "snapshot"), "createdAt",
                         time_json(row->created_at), "finishedAt", time_json(row->finished_at), "sizeBytes", size,
                         "buildMs", json_object_get(doc, "buildMs"), "start", json_object_get(doc, "start"), "build",
                         json_object_get(doc, "build"), "recipe", json_object_get(doc, "recipe"));
}

static int not_found(const char *what, ApiError *e) {
        return api_error(e, 404, "image_not_found", "GET /v1/images lists yours", "no image %.128s", what);
}

/* An image kept by another host of a fleet (its disk and its build's log
 * are that host's files, docs/fleet.md): the request goes on to that host
 * (1, *ret its answer) as one about a sandbox does, runs here (0: this
 * host keeps it, or there is no other host to ask), or is refused (-1, e)
 * when that host does not answer and here_if_down is false. */
static int image_elsewhere(Req *r, const ImageRow *row, bool here_if_down, enum MHD_Result *ret, ApiError *e) {
        Fleet *fleet = r->app->fleet;
        if (r->forwarded || !row->host_id[0] || fleet_single(fleet) || strcmp(row->host_id, fleet_host_id(fleet)) == 0)
                return 0;
        char url[512];
        if (http_forwards(r) && fleet_host_url(fleet, row->host_id, url, sizeof url) == 0 &&
            http_forward_whole(r, url, ret) == 0) {
                log_info(r->rid, "image %s: the request went on to host %s", row->id, row->host_id);
                return 1;
        }
        if (here_if_down)
                return 0;
        return api_error(e, 503, "host_unavailable",
                         "try again when that host is back, or build the image again (a build runs on the host it is "
                         "sent to)",
                         "image %s is kept by host %s, which does not answer", row->id, row->host_id);
}

/* ---- the context ---- */

enum MHD_Result handle_image_context_missing(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        json_t *digests = json_object_get(r->json, "digests");
        if (!json_is_array(digests) || json_array_size(digests) > 1024) {
                api_error(&e, 400, "invalid_request", NULL, "digests must be an array of at most 1024 SHA-256s");
                return reply_error(r, &e);
        }
        json_t *missing = NULL;
        int rc = user_images_context_missing(r->app->user_images, r->key.owner, digests, &missing);
        if (rc == -EINVAL) {
                api_error(&e, 400, "invalid_request", NULL, "each digest is a SHA-256 in 64 lowercase hex digits");
                return reply_error(r, &e);
        }
        if (rc < 0)
                return reply_internal(r);
        return reply_json(r, 200, json_pack("{s:o}", "missing", missing));
}

typedef struct ChunkUpload {
        char *buf;
        size_t len;
        bool too_large;
} ChunkUpload;

static enum MHD_Result chunk_begin(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        ChunkUpload *u = calloc(1, sizeof(*u));
        if (!u)
                return reply_internal(r);
        r->upload = u;
        return MHD_YES;
}

static enum MHD_Result chunk_data(Req *r, const char *data, size_t len) {
        ChunkUpload *u = r->upload;
        if (!u)
                return MHD_NO;
        if (u->too_large || u->len + len > USER_IMAGES_CHUNK_MAX) {
                u->too_large = true;
                return MHD_YES;
        }
        char *n = realloc(u->buf, u->len + len);
        if (!n)
                return MHD_NO;
        u->buf = n;
        memcpy(u->buf + u->len, data, len);
        u->len += len;
        return MHD_YES;
}

static void chunk_free(void *p) {
        ChunkUpload *u = p;
        if (u)
                free(u->buf);
        free(u);
}

const HttpUpload image_context_upload = { .begin = chunk_begin, .data = chunk_data, .free = chunk_free };

/* The owner's chunks that builds name or that were just reported present
 * fill the bound: a 429 naming it. */
static int chunks_full(Req *r, ApiError *e) {
        return api_error(e, 429, "rate_limited", "wait for one of your queued or running builds to end, then send again",
                         "your context chunks are at their bound of %llu MiB, and your queued and running builds "
                         "name (or a missing query just reported) all of them",
                         (unsigned long long)(user_images_context_bound(r->app->user_images) >> 20));
}

enum MHD_Result handle_image_context_put(Req *r) {
        ChunkUpload *u = r->upload;
        ApiError e = { 0 };
        if (!u)
                return reply_internal(r);
        if (u->too_large) {
                api_error(&e, 413, "payload_too_large", "send the context in chunks of 1 MiB",
                          "a context chunk is at most %u MiB", USER_IMAGES_CHUNK_MAX >> 20);
                return reply_error(r, &e);
        }
        int rc = user_images_context_put(r->app->user_images, r->key.owner, r->route.digest, u->buf ? u->buf : "",
                                         u->len);
        if (rc == -EBADMSG)
                api_error(&e, 400, "invalid_request", "send the chunk's bytes under their own SHA-256",
                          "the chunk's SHA-256 is not %s", r->route.digest);
        else if (rc == -EDQUOT)
                chunks_full(r, &e);
        else if (rc < 0)
                return reply_internal(r);
        if (e.code)
                return reply_error(r, &e);
        return reply_json(r, 200, json_pack("{s:s,s:I}", "digest", r->route.digest, "size", (json_int_t)u->len));
}

/* ---- a build ---- */

static int string_map(json_t *v, const char *field, json_t **ret, ApiError *e) {
        *ret = NULL;
        if (!v || json_is_null(v))
                return 0;
        const char *k;
        json_t *x;
        if (!json_is_object(v) || json_object_size(v) > 256)
                return api_error(e, 400, "invalid_request", NULL, "%s must be an object of strings", field);
        json_object_foreach(v, k, x) if (!json_is_string(x) || strlen(k) > 256 || json_string_length(x) > 16384)
                return api_error(e, 400, "invalid_request", NULL, "%s.%.64s must be a string", field, k);
        *ret = json_incref(v);
        return 0;
}

static int uint_field(json_t *obj, const char *field, unsigned lo, unsigned hi, unsigned *v, ApiError *e) {
        json_t *x = json_object_get(obj, field);
        if (!x || json_is_null(x))
                return 0;
        if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
                return api_error(e, 400, "invalid_request", NULL, "build.%s must be an integer from %u to %u", field, lo,
                                 hi);
        *v = (unsigned)json_integer_value(x);
        return 0;
}

/* The build's secrets, {id: value} (docs/images.md, "Build secrets"):
 * bounded, and every secret a RUN mounts with required=true given. The
 * values are copied for the build alone: never logged, stored or echoed. */
static int parse_secrets(json_t *v, ImageBuildRequest *q, ApiError *e) {
        if (v && !json_is_null(v)) {
                if (!json_is_object(v) || json_object_size(v) > USER_IMAGES_SECRETS_MAX)
                        return api_error(e, 400, "invalid_request", "{id: value}, as RUN --mount=type=secret,id=... "
                                         "names them", "secrets must be an object of at most %u strings",
                                         USER_IMAGES_SECRETS_MAX);
                const char *k;
                json_t *x;
                size_t total = 0;
                json_object_foreach(v, k, x) {
                        size_t kl = strlen(k);
                        bool id_ok = kl >= 1 && kl <= DOCKERFILE_SECRET_ID_MAX && strcmp(k, ".") && strcmp(k, "..") &&
                                     strspn(k, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == kl;
                        if (!id_ok)
                                return api_error(e, 400, "invalid_request", NULL, "secrets: an id must be 1 to %u of "
                                                 "letters, digits, _ . -", DOCKERFILE_SECRET_ID_MAX);
                        if (!json_is_string(x) || json_string_length(x) > USER_IMAGES_SECRET_VALUE_MAX ||
                            memchr(json_string_value(x), '\0', json_string_length(x)))
                                return api_error(e, 400, "invalid_request", NULL, "secrets.%s must be a string of at "
                                                 "most %u KiB without NUL", k, USER_IMAGES_SECRET_VALUE_MAX >> 10);
                        total += json_string_length(x);
                }
                if (total > USER_IMAGES_SECRETS_TOTAL_MAX)
                        return api_error(e, 400, "invalid_request", NULL, "secrets' values are more than %u KiB "
                                         "together", USER_IMAGES_SECRETS_TOTAL_MAX >> 10);
                if (!(q->secrets = json_deep_copy(v)))
                        return api_error(e, 500, "internal", NULL, "out of memory");
        }
        for (size_t i = 0; i < q->dockerfile.n_steps; i++) {
                const DockerfileStep *s = &q->dockerfile.steps[i];
                for (size_t j = 0; j < s->n_secrets; j++)
                        if (s->secrets[j].required && !json_object_get(q->secrets, s->secrets[j].id))
                                return api_error(e, 400, "invalid_request", "give it in secrets ({id: value}), or "
                                                 "mount it with required=false", "Dockerfile line %u: RUN mounts "
                                                 "secret %s with required=true, and the request has no such secret",
                                                 s->line, s->secrets[j].id);
        }
        return 0;
}

/* Each COPY --from=IMAGE names a built-in image or one of the owner's, as
 * the resolve route finds them (another owner's is 404); a name with a
 * variable is resolved by the build, once expanded. */
static int copy_from_images(Req *r, ImageBuildRequest *q, ApiError *e) {
        for (size_t i = 0; i < q->dockerfile.n_steps; i++) {
                const DockerfileStep *s = &q->dockerfile.steps[i];
                if (!s->from_image || strchr(s->from, '$'))
                        continue;
                ImageRow row;
                ImageInfo info;
                if (user_images_resolve(r->app->user_images, r->key.owner, s->from, &row) == 0) {
                        store_image_row_clear(&row);
                        continue;
                }
                if (image_name_ok(s->from) && !strchr(s->from, ':') && image_info(r->app->cfg, s->from, &info) == 0 &&
                    info.built)
                        continue;
                return api_error(e, 404, "image_not_found", "GET /v1/images lists yours; COPY --from takes a "
                                 "built-in image, one of yours or an earlier stage",
                                 "Dockerfile line %u: COPY --from=%.128s names no stage and no image", s->line, s->from);
        }
        return 0;
}

/* The build's context: its archive's SHA-256, size and chunks, as the
 * client uploaded them. */
static int parse_context(json_t *ctx, ImageBuildRequest *q, ApiError *e) {
        json_t *archive = json_object_get(ctx, "archive");
        const char *sha = json_string_value(json_object_get(archive, "sha256"));
        json_t *size = json_object_get(archive, "size"), *chunks = json_object_get(archive, "chunks");
        if (!sha || strlen(sha) != 64 || strspn(sha, "0123456789abcdef") != 64 || !json_is_integer(size) ||
            !json_is_array(chunks) || json_array_size(chunks) == 0)
                return api_error(e, 400, "invalid_request", "upload it with POST /v1/images/context/missing and "
                                 "PUT /v1/images/context/{digest}",
                                 "context.archive must have sha256, size and chunks");
        if (json_integer_value(size) < 0 || (uint64_t)json_integer_value(size) > USER_IMAGES_CONTEXT_MAX)
                return api_error(e, 413, "context_too_large", "leave files out with a .dockerignore",
                                 "the build context is over %llu MiB compressed",
                                 (unsigned long long)(USER_IMAGES_CONTEXT_MAX >> 20));
        if (json_array_size(chunks) > USER_IMAGES_CONTEXT_MAX / (1024 * 1024) + 1)
                return api_error(e, 400, "invalid_request", NULL, "context.archive has too many chunks");
        size_t i;
        json_t *c;
        json_array_foreach(chunks, i, c) {
                const char *d = json_string_value(c);
                if (!d || strlen(d) != 64 || strspn(d, "0123456789abcdef") != 64)
                        return api_error(e, 400, "invalid_request", NULL, "context.archive.chunks[%zu] is not a "
                                         "SHA-256", i);
        }
        snprintf(q->context_sha256, sizeof q->context_sha256, "%s", sha);
        q->context_size = json_integer_value(size);
        q->chunks = json_incref(chunks);
        return 0;
}

/* The build's sandbox: its shape, its time and its egress policy, within
 * what a sandbox of the key may have. The network is a create's, read by
 * the create's own parser: none unless given. */
static int parse_build_shape(Req *r, json_t *build, ImageBuildRequest *q, ApiError *e) {
        static const char *const fields[] = { "vcpu", "memoryMiB", "diskMiB", "timeoutSeconds", "network", NULL };
        const DaemonConfig *cfg = r->app->cfg;
        /* A trial key's build is a trial sandbox: no larger than its create
         * may ask for (and its egress, web ports only, the proxy's). */
        unsigned max_vcpu = cfg->max_vcpu, max_memory = cfg->max_memory_mib;
        if (r->key.trial && max_vcpu > KEYS_TRIAL_VCPU_MAX)
                max_vcpu = KEYS_TRIAL_VCPU_MAX;
        if (r->key.trial && max_memory > KEYS_TRIAL_MEMORY_MAX_MIB)
                max_memory = KEYS_TRIAL_MEMORY_MAX_MIB;
        q->vcpu = BUILD_DEFAULT_VCPU;
        q->memory_mib = BUILD_DEFAULT_MEMORY_MIB < max_memory ? BUILD_DEFAULT_MEMORY_MIB : max_memory;
        q->disk_mib = BUILD_DEFAULT_DISK_MIB < cfg->max_disk_mib ? BUILD_DEFAULT_DISK_MIB : cfg->max_disk_mib;
        unsigned timeout = BUILD_DEFAULT_TIMEOUT_S;
        json_t *net = NULL;
        if (build && !json_is_null(build)) {
                const char *k;
                json_t *v;
                if (!json_is_object(build))
                        return api_error(e, 400, "invalid_request", NULL, "build must be an object");
                json_object_foreach(build, k, v) {
                        bool ok = false;
                        for (size_t i = 0; fields[i] && !ok; i++)
                                ok = strcmp(k, fields[i]) == 0;
                        if (!ok)
                                return api_error(e, 400, "invalid_request", "build takes vcpu, memoryMiB, diskMiB, "
                                                 "timeoutSeconds and network", "unknown field build.%.64s", k);
                }
                if (uint_field(build, "vcpu", 1, max_vcpu, &q->vcpu, e) < 0 ||
                    uint_field(build, "memoryMiB", 128, max_memory, &q->memory_mib, e) < 0 ||
                    uint_field(build, "diskMiB", 256, cfg->max_disk_mib, &q->disk_mib, e) < 0 ||
                    uint_field(build, "timeoutSeconds", 10, BUILD_MAX_TIMEOUT_S, &timeout, e) < 0)
                        return -EINVAL;
                net = json_object_get(build, "network");
                if (json_is_null(net))
                        net = NULL;
        }
        q->timeout_seconds = timeout;
        int rc = request_parse_network(net, "build.network", &q->network, e);
        if (rc == -ENOMEM)
                return api_error(e, 500, "internal", NULL, "out of memory");
        return rc < 0 ? -EINVAL : 0;
}

/* A recipe (its Dockerfile made) or a Dockerfile's inline files, checked;
 * one source of files only. */
static int parse_inline(Req *r, ImageRecipe *recipe, ImageFiles *files, ApiError *e) {
        json_t *rv = json_object_get(r->json, "recipe"), *fv = json_object_get(r->json, "files");
        json_t *ctx = json_object_get(r->json, "context"), *image = json_object_get(r->json, "image");
        bool has_recipe = rv && !json_is_null(rv), has_files = fv && !json_is_null(fv);
        bool has_ctx = ctx && !json_is_null(ctx), has_image = image && !json_is_null(image);
        json_t *dockerfile = json_object_get(r->json, "dockerfile");
        char why[512] = "";
        int rc = 0;
        if (has_recipe && ((dockerfile && !json_is_null(dockerfile)) || has_image))
                return api_error(e, 400, "invalid_request", NULL, "give one of image, dockerfile and recipe");
        if (has_recipe && has_files)
                return api_error(e, 400, "invalid_request", "put them in recipe.files",
                                 "files go with a dockerfile; a recipe's files are its own");
        if (has_files && has_image)
                return api_error(e, 400, "invalid_request", NULL, "files go with a dockerfile or a recipe, not an image");
        if (has_ctx && has_files)
                return api_error(e, 400, "invalid_request", "send small files inline, or a folder as the context",
                                 "give files or context, not both");
        if (has_ctx && has_recipe)
                return api_error(e, 400, "invalid_request", "send small files inline, or a folder as the context",
                                 "a recipe takes its files in recipe.files, not a context: give files or context, "
                                 "not both");
        if (has_recipe)
                rc = image_recipe_parse(rv, recipe, why, sizeof why);
        else if (has_files)
                rc = image_files_parse(fv, "files", files, why, sizeof why);
        if (rc == -ENOMEM)
                return api_error(e, 500, "internal", NULL, "out of memory");
        if (rc < 0)
                return api_error(e, 400, "invalid_request", "docs/images.md, \"Recipes and inline files\"", "%s", why);
        return 0;
}

/* Inline files as the build's context: their archive kept as the owner's
 * chunks, as an uploaded context is, and named by the request. */
static int store_inline(Req *r, ImageBuildRequest *q, const ImageFiles *files, ApiError *e) {
        _cleanup_free_ uint8_t *tar = NULL;
        size_t len = 0;
        _cleanup_json_ json_t *chunks = json_array();
        if (!chunks || image_files_archive(files, &tar, &len) < 0)
                return api_error(e, 500, "internal", NULL, "out of memory");
        uint8_t md[32];
        unsigned mdl = 0;
        char hex[65];
        for (size_t off = 0; off < len; off += 1024 * 1024) {
                size_t n = len - off < 1024 * 1024 ? len - off : 1024 * 1024;
                if (EVP_Digest(tar + off, n, md, &mdl, EVP_sha256(), NULL) != 1)
                        return api_error(e, 500, "internal", NULL, "out of memory");
                hex_encode(md, sizeof md, hex);
                int rc = user_images_context_put(r->app->user_images, r->key.owner, hex, tar + off, n);
                if (rc == -EDQUOT)
                        return chunks_full(r, e);
                if (rc < 0 || json_array_append_new(chunks, json_string(hex)) < 0)
                        return api_error(e, 500, "internal", NULL, "could not keep the files");
        }
        if (EVP_Digest(tar, len, md, &mdl, EVP_sha256(), NULL) != 1)
                return api_error(e, 500, "internal", NULL, "out of memory");
        hex_encode(md, sizeof md, q->context_sha256);
        q->context_size = (int64_t)len;
        q->chunks = json_incref(chunks);
        return 0;
}

static int parse_build(Req *r, ImageBuildRequest *q, ApiError *e) {
        static const char *const known[] = { "dockerfile", "context",  "dockerignore", "target", "buildArgs", "name",
                                             "tags",       "labels",   "env",          "build",  "cache",     "region",
                                             "start",      "image",    "recipe",       "files",  "secrets",
                                             NULL };
        const char *k;
        json_t *v;
        json_object_foreach(r->json, k, v) {
                bool ok = false;
                for (size_t i = 0; known[i] && !ok; i++)
                        ok = strcmp(k, known[i]) == 0;
                if (!ok)
                        return api_error(e, 400, "invalid_request", NULL, "unknown field %.64s", k);
        }
        _cleanup_(image_recipe_done) ImageRecipe recipe = { 0 };
        _cleanup_(image_files_done) ImageFiles files = { 0 };
        if (parse_inline(r, &recipe, &files, e) < 0)
                return -EINVAL;
        v = json_object_get(r->json, "region");
        if (v && !json_is_null(v))
                return api_error(e, 400, "invalid_request", NULL, "a self-hosted daemon has no regions: leave region out");
        v = json_object_get(r->json, "start");
        if (v) {
                /* null keeps no start command, not even the Dockerfile's CMD. */
                char why_start[256] = "";
                q->start_given = true;
                int sr = json_is_null(v) ? 0 : image_start_parse(v, &q->start, why_start, sizeof why_start);
                if (sr == -ENOMEM)
                        return api_error(e, 500, "internal", NULL, "out of memory");
                if (sr < 0)
                        return api_error(e, 400, "invalid_request", "{command, readyPort | readyCommand, "
                                         "readyTimeoutSeconds}, or null for none", "%s", why_start);
        }
        const char *text = recipe.dockerfile ? recipe.dockerfile : json_string_value(json_object_get(r->json, "dockerfile"));
        v = json_object_get(r->json, "image");
        _cleanup_free_ char *from_image = NULL;
        char default_name[256] = "";
        if (v && !json_is_null(v)) {
                /* An image of a registry as it is: a Dockerfile of its FROM. */
                OciRef ref;
                const char *ref_s = json_string_value(v);
                if (text)
                        return api_error(e, 400, "invalid_request", NULL, "give image or dockerfile, not both");
                if (!ref_s || oci_ref_parse(ref_s, &ref) < 0)
                        return api_error(e, 400, "invalid_request", "registry/repository:tag or repository@sha256:digest",
                                         "image must be an image reference of a registry");
                /* Unnamed, it is named as its repository's last part. */
                const char *last = strrchr(ref.repo, '/');
                snprintf(default_name, sizeof default_name, "%s", last ? last + 1 : ref.repo);
                if (asprintf(&from_image, "FROM %s\n", ref_s) < 0)
                        return api_error(e, 500, "internal", NULL, "out of memory");
                text = from_image;
        }
        if (!text)
                return api_error(e, 400, "invalid_request", "send the Dockerfile's text as dockerfile, or a registry's "
                                 "image as image", "dockerfile or image is required");
        DockerfileError de;
        int rc = dockerfile_parse(text, strlen(text), &q->dockerfile, &de);
        if (rc == -ENOMEM)
                return api_error(e, 500, "internal", NULL, "out of memory");
        if (rc < 0 && recipe.dockerfile)
                return api_error(e, 400, "invalid_request", NULL, "%s: %s", image_recipe_field_of_line(&recipe, de.line),
                                 de.message);
        if (rc < 0)
                return de.line ? api_error(e, 400, "invalid_dockerfile", NULL, "Dockerfile line %u: %s", de.line,
                                           de.message)
                               : api_error(e, 400, "invalid_dockerfile", NULL, "Dockerfile: %s", de.message);
        uint8_t md[32];
        unsigned md_len = 0;
        if (EVP_Digest(text, strlen(text), md, &md_len, EVP_sha256(), NULL) != 1)
                return api_error(e, 500, "internal", NULL, "out of memory");
        hex_encode(md, sizeof md, q->dockerfile_sha256);
        v = json_object_get(r->json, "cache");
        if (v && !json_is_null(v) && !json_is_boolean(v))
                return api_error(e, 400, "invalid_request", "false runs every step", "cache must be true or false");
        q->no_cache = json_is_false(v);
        if (recipe.dockerfile)
                /* Unnamed, a recipe is named by what it makes. */
                snprintf(default_name, sizeof default_name, "recipe-%.12s", q->dockerfile_sha256);
        const char *name = json_string_value(json_object_get(r->json, "name"));
        if (!name && !json_object_get(r->json, "name") && default_name[0])
                name = default_name;
        if (!name || !user_images_name_ok(name))
                return api_error(e, 400, "invalid_request", "lowercase letters, digits, _ . - and / (up to 128)",
                                 "name must be an image name%s", name ? ", not that" : "");
        q->name = strdup(name);
        v = json_object_get(r->json, "tags");
        if (v && !json_is_null(v)) {
                if (!json_is_array(v) || json_array_size(v) > MAX_TAGS)
                        return api_error(e, 400, "invalid_request", NULL, "tags must be an array of at most %d tags",
                                         MAX_TAGS);
                size_t i;
                json_t *t;
                json_array_foreach(v, i, t) if (!user_images_tag_ok(json_string_value(t)))
                        return api_error(e, 400, "invalid_request", "letters, digits, _ . - (up to 128)",
                                         "tags[%zu] is not a tag", i);
                q->tags = json_incref(v);
        }
        if (!q->tags || json_array_size(q->tags) == 0) {
                json_decref(q->tags);
                q->tags = json_pack("[s]", "latest");
        }
        if (string_map(json_object_get(r->json, "labels"), "labels", &q->labels, e) < 0 ||
            string_map(json_object_get(r->json, "buildArgs"), "buildArgs", &q->build_args, e) < 0 ||
            string_map(json_object_get(r->json, "env"), "env", &q->env, e) < 0)
                return -EINVAL;
        v = json_object_get(r->json, "target");
        if (v && !json_is_null(v)) {
                if (!json_is_string(v) || dockerfile_stage(&q->dockerfile, json_string_value(v)) < 0)
                        return api_error(e, 400, "invalid_request", NULL, "target names no stage of the Dockerfile");
                q->target = strdup(json_string_value(v));
        }
        json_t *ctx = json_object_get(r->json, "context");
        if (ctx && !json_is_null(ctx) && parse_context(ctx, q, e) < 0)
                return -EINVAL;
        if (parse_build_shape(r, json_object_get(r->json, "build"), q, e) < 0 ||
            parse_secrets(json_object_get(r->json, "secrets"), q, e) < 0 || copy_from_images(r, q, e) < 0)
                return -EINVAL;
        if (!q->name || !q->tags)
                return api_error(e, 500, "internal", NULL, "out of memory");
        if (recipe.dockerfile && (!(q->recipe = json_incref(recipe.record)) ||
                                  !(q->recipe_dockerfile = strdup(recipe.dockerfile))))
                return api_error(e, 500, "internal", NULL, "out of memory");
        return files.n || recipe.files.n ? store_inline(r, q, files.n ? &files : &recipe.files, e) : 0;
}

/* The request queued (taken, whatever the outcome); 201 with the image. */
static enum MHD_Result queue_build(Req *r, ImageBuildRequest *q) {
        ImageRow row;
        SandboxError se;
        ApiError e = { 0 };
        _cleanup_json_ json_t *chunks = json_incref(q->chunks);
        int rc = user_images_build(r->app->user_images, &r->key, q, r->rid, &row, &se);
        image_build_request_done(q);
        /* Queued: its chunks are kept while it is, not by a hold. */
        if (rc == 0)
                user_images_context_named(r->app->user_images, r->key.owner, chunks);
        if (rc < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        log_info(r->rid, "image %s (%s v%lld) queued", row.id, row.name, (long long)row.version);
        json_t *j = image_json(r, &row);
        store_image_row_clear(&row);
        return j ? reply_json(r, 201, j) : reply_internal(r);
}

enum MHD_Result handle_image_create(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        ImageBuildRequest q = { 0 };
        if (parse_build(r, &q, &e) < 0) {
                image_build_request_done(&q);
                return reply_error(r, &e);
        }
        return queue_build(r, &q);
}

/* ---- an import: an OCI layout or docker save archive ---- */

typedef struct ImportUpload {
        char *path; /* NULL once the build request took it */
        int fd;
        uint64_t len, max;
        bool too_large, failed;
} ImportUpload;

static enum MHD_Result import_begin(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        ImportUpload *u = calloc(1, sizeof(*u));
        if (!u)
                return reply_internal(r);
        u->fd = -1;
        u->max = (uint64_t)r->app->cfg->image_pull_max_mib << 20;
        r->upload = u;
        /* Beside the pulls, on the state directory's filesystem. */
        char *dir = NULL;
        if (asprintf(&dir, "%s/oci-pull", r->app->cfg->state_dir) < 0 || (mkdir(dir, 0711) < 0 && errno != EEXIST) ||
            asprintf(&u->path, "%s/import-XXXXXX", dir) < 0 || (u->fd = mkostemp(u->path, O_CLOEXEC)) < 0) {
                free(dir);
                return reply_internal(r);
        }
        free(dir);
        return MHD_YES;
}

static enum MHD_Result import_data(Req *r, const char *data, size_t len) {
        ImportUpload *u = r->upload;
        if (!u)
                return MHD_NO;
        if (u->too_large || u->failed || u->len + len > u->max) {
                u->too_large = u->too_large || u->len + len > u->max;
                return MHD_YES;
        }
        if (io_write_all(u->fd, data, len) < 0)
                u->failed = true;
        u->len += len;
        return MHD_YES;
}

static void import_free(void *p) {
        ImportUpload *u = p;
        if (!u)
                return;
        if (u->fd >= 0)
                close(u->fd);
        if (u->path)
                unlink(u->path);
        free(u->path);
        free(u);
}

const HttpUpload image_import_upload = { .begin = import_begin, .data = import_data, .free = import_free };

enum MHD_Result handle_image_import(Req *r) {
        ImportUpload *u = r->upload;
        ApiError e = { 0 };
        if (!u)
                return reply_internal(r);
        if (u->too_large) {
                api_error(&e, 413, "payload_too_large", "the operator sets --image-pull-max-mib",
                          "an imported archive is at most %u MiB", r->app->cfg->image_pull_max_mib);
                return reply_error(r, &e);
        }
        if (u->failed)
                return reply_internal(r);
        const char *name = req_query(r, "name"), *tag = req_query(r, "tag");
        /* The build's own parser reads it as a request of a one-line
         * Dockerfile whose FROM is the archive. */
        json_decref(r->json);
        r->json = json_pack("{s:s,s:s?,s:[s]}", "dockerfile", "FROM imported\n", "name", name, "tags",
                            tag && *tag ? tag : "latest");
        ImageBuildRequest q = { 0 };
        if (!r->json)
                return reply_internal(r);
        if (parse_build(r, &q, &e) < 0) {
                image_build_request_done(&q);
                return reply_error(r, &e);
        }
        close(u->fd);
        u->fd = -1;
        q.import_path = u->path;
        u->path = NULL;
        log_info(r->rid, "an archive of %llu bytes to import", (unsigned long long)u->len);
        return queue_build(r, &q);
}

/* ---- reads ---- */

enum MHD_Result handle_image_get(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        ImageRow row;
        int rc = user_images_resolve(r->app->user_images, r->key.owner, r->route.image, &row);
        if (rc == -ENOENT) {
                not_found(r->route.image, &e);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return reply_internal(r);
        json_t *j = image_json(r, &row);
        store_image_row_clear(&row);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_image_resolve(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        const char *ref = req_query(r, "ref");
        if (!ref || !*ref || strlen(ref) > 200) {
                api_error(&e, 400, "invalid_request", NULL, "ref must name an image: id, name, name:tag or name@version");
                return reply_error(r, &e);
        }
        ImageRow row;
        int rc = user_images_resolve(r->app->user_images, r->key.owner, ref, &row);
        if (rc == -ENOENT) {
                not_found(ref, &e);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return reply_internal(r);
        json_t *j = image_json(r, &row);
        store_image_row_clear(&row);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

typedef struct Page {
        Req *r;
        json_t *data;
        int64_t last_created;
        char last_id[IMAGE_ID_LEN + 1];
} Page;

static int page_add(void *userdata, const ImageRow *row) {
        Page *p = userdata;
        json_t *j = image_json(p->r, row);
        if (!j || json_array_append_new(p->data, j) < 0)
                return -ENOMEM;
        p->last_created = row->created_at;
        snprintf(p->last_id, sizeof p->last_id, "%s", row->id);
        return 0;
}

int api_user_images_page(Req *r, json_t *body, ApiError *e) {
        if (!r->app->user_images)
                return 0;
        const char *limit_s = req_query(r, "limit"), *cursor = req_query(r, "cursor");
        const char *name = req_query(r, "name"), *state = req_query(r, "state");
        unsigned limit = 50;
        if (limit_s) {
                char *end;
                long l = strtol(limit_s, &end, 10);
                if (*end || l < 1 || l > LIST_PAGE_MAX)
                        return api_error(e, 400, "invalid_request", NULL, "limit must be from 1 to %d", LIST_PAGE_MAX);
                limit = (unsigned)l;
        }
        int64_t before = 0;
        char before_id[IMAGE_ID_LEN + 1] = "";
        if (cursor && *cursor) {
                /* The cursor is the last row's created_at and id. */
                char *dot = strchr(cursor, '.');
                if (!dot || strlen(dot + 1) != IMAGE_ID_LEN)
                        return api_error(e, 400, "invalid_request", NULL, "cursor is not one this daemon gave");
                before = strtoll(cursor, NULL, 10);
                snprintf(before_id, sizeof before_id, "%s", dot + 1);
        }
        Page p = { .r = r, .data = json_array() };
        if (!p.data)
                return api_error(e, 500, "internal", NULL, "out of memory");
        int rc = user_images_list(r->app->user_images, r->key.owner, name && *name ? name : NULL,
                                  state && *state ? state : NULL, before, before_id, limit, page_add, &p);
        if (rc < 0) {
                json_decref(p.data);
                return api_error(e, 500, "internal", NULL, "could not list the images");
        }
        json_t *next = json_null();
        if (json_array_size(p.data) == limit) {
                char buf[64];
                snprintf(buf, sizeof buf, "%lld.%s", (long long)p.last_created, p.last_id);
                next = json_string(buf);
        }
        json_object_set_new(body, "data", p.data);
        json_object_set_new(body, "nextCursor", next);
        return 0;
}

/* ---- logs ---- */

static bool build_ended(Req *r, bool *ret_ready, json_t **ret_image) {
        ImageRow row;
        if (user_images_get(r->app->user_images, r->key.owner, r->route.image, &row) < 0)
                return true;
        bool ended = strcmp(row.state, "queued") != 0 && strcmp(row.state, "building") != 0;
        *ret_ready = strcmp(row.state, "ready") == 0;
        if (ended && ret_image)
                *ret_image = image_json(r, &row);
        store_image_row_clear(&row);
        return ended;
}

typedef struct Follow {
        App *app;
        Req *r; /* only until the handler returns: what the reader needs is copied */
        char owner[128];
        char id[IMAGE_ID_LEN + 1];
        char rid[32];
        int64_t after;
        int sock;
        char *out;
        size_t len, off;
        bool done;
        int64_t started_ms;
} Follow;

static void follow_push(Follow *f, json_t *j) {
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!s)
                return;
        size_t n = strlen(s);
        if (f->off == f->len)
                f->off = f->len = 0;
        char *m = realloc(f->out, f->len + n + 1);
        if (m) {
                f->out = m;
                memcpy(f->out + f->len, s, n);
                f->out[f->len + n] = '\n';
                f->len += n + 1;
        }
        free(s);
}

/* A stream is answered in pieces of at most this long; the client goes on
 * from the last seq with the "continue" event. */
#define FOLLOW_MAX_MS (10 * 60 * 1000)

static ssize_t follow_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        Follow *f = cls;
        for (;;) {
                if (f->off < f->len) {
                        size_t n = f->len - f->off < max ? f->len - f->off : max;
                        memcpy(buf, f->out + f->off, n);
                        f->off += n;
                        return (ssize_t)n;
                }
                if (f->done)
                        return MHD_CONTENT_READER_END_OF_STREAM;
                UserImages *u = f->app->user_images;
                ImageRow row;
                bool ended = true, ready = false;
                if (user_images_get(u, f->owner, f->id, &row) == 0) {
                        ended = strcmp(row.state, "queued") != 0 && strcmp(row.state, "building") != 0;
                        ready = strcmp(row.state, "ready") == 0;
                }
                json_t *lines = json_array();
                int64_t next = f->after;
                if (lines)
                        user_images_logs(u, f->id, f->after, LOG_PAGE, lines, &next);
                size_t i;
                json_t *l;
                json_array_foreach(lines, i, l) follow_push(f, json_incref(l));
                f->after = next;
                size_t got = json_array_size(lines);
                json_decref(lines);
                if (got)
                        goto next;
                if (ended) {
                        if (ready) {
                                /* image_json needs a request only for its app. */
                                Req fake = { .app = f->app };
                                follow_push(f, json_pack("{s:s,s:o}", "type", "done", "image", image_json(&fake, &row)));
                        } else {
                                ApiError e;
                                api_error(&e, 422, "image_build_failed", "read the log lines above", "%s",
                                          row.error ? row.error : "the build failed");
                                follow_push(f, json_pack("{s:s,s:o}", "type", "error", "error",
                                                         api_error_json(&e, f->rid)));
                        }
                        f->done = true;
                } else if ((int64_t)time_now_mono_ms() - f->started_ms > FOLLOW_MAX_MS) {
                        follow_push(f, json_pack("{s:s,s:I}", "type", "continue", "after", (json_int_t)f->after));
                        f->done = true;
                } else {
                        struct pollfd p = { .fd = f->sock, .events = 0 };
                        poll(&p, 1, 250);
                        if (socket_hung_up(f->sock)) {
                                if (row.id[0])
                                        store_image_row_clear(&row);
                                return MHD_CONTENT_READER_END_WITH_ERROR;
                        }
                }
        next:
                if (row.id[0])
                        store_image_row_clear(&row);
        }
}

static void follow_free(void *cls) {
        Follow *f = cls;
        free(f->out);
        free(f);
}

enum MHD_Result handle_image_logs(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        ImageRow row;
        int rc = user_images_get(r->app->user_images, r->key.owner, r->route.image, &row);
        if (rc == -ENOENT) {
                not_found(r->route.image, &e);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return reply_internal(r);
        /* The log is a file of the host that builds the image. */
        enum MHD_Result sent = MHD_NO;
        rc = image_elsewhere(r, &row, false, &sent, &e);
        store_image_row_clear(&row);
        if (rc < 0)
                return reply_error(r, &e);
        if (rc > 0)
                return sent;
        const char *after_s = req_query(r, "after"), *follow = req_query(r, "follow");
        int64_t after = after_s ? strtoll(after_s, NULL, 10) : 0;
        if (after < 0)
                after = 0;
        if (follow && (strcmp(follow, "true") == 0 || strcmp(follow, "1") == 0)) {
                Follow *f = calloc(1, sizeof(*f));
                if (!f)
                        return reply_internal(r);
                f->app = r->app;
                snprintf(f->owner, sizeof f->owner, "%s", r->key.owner);
                snprintf(f->id, sizeof f->id, "%.36s", r->route.image);
                snprintf(f->rid, sizeof f->rid, "%s", r->rid);
                f->after = after;
                f->sock = req_socket(r);
                f->started_ms = (int64_t)time_now_mono_ms();
                struct MHD_Response *resp =
                        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, follow_reader, f, follow_free);
                if (!resp) {
                        follow_free(f);
                        return reply_internal(r);
                }
                return reply_response(r, 200, resp, "application/x-ndjson");
        }
        json_t *lines = json_array();
        int64_t next = after;
        if (!lines || user_images_logs(r->app->user_images, r->route.image, after, LOG_PAGE, lines, &next) < 0) {
                json_decref(lines);
                return reply_internal(r);
        }
        bool ready = false;
        bool done = json_array_size(lines) < LOG_PAGE && build_ended(r, &ready, NULL);
        return reply_json(r, 200, json_pack("{s:o,s:I,s:b}", "lines", lines, "nextAfter", (json_int_t)next, "done", done));
}

/* ---- tags and delete ---- */

static enum MHD_Result tag_op(Req *r, bool add) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        const char *tag = json_string_value(json_object_get(r->json, "tag"));
        if (!tag) {
                api_error(&e, 400, "invalid_request", NULL, "tag is required");
                return reply_error(r, &e);
        }
        SandboxError se;
        UserImages *u = r->app->user_images;
        int rc = add ? user_images_tag(u, r->key.owner, r->route.image, tag, &se)
                     : user_images_untag(u, r->key.owner, r->route.image, tag, &se);
        if (rc < 0) {
                api_sandbox_error(&se, &e);
                if (e.status == 404 && strstr(e.message, "no image"))
                        e.code = "image_not_found";
                return reply_error(r, &e);
        }
        ImageRow row;
        if (user_images_get(u, r->key.owner, r->route.image, &row) < 0)
                return reply_internal(r);
        json_t *j = image_json(r, &row);
        store_image_row_clear(&row);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_image_tag(Req *r) {
        return tag_op(r, true);
}

enum MHD_Result handle_image_untag(Req *r) {
        return tag_op(r, false);
}

enum MHD_Result handle_image_delete(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        /* Its disk is removed by the host that keeps it; one that does not
         * answer removes the files at its next start (they have no record
         * then), so the records go here. */
        ImageRow row;
        if (user_images_get(r->app->user_images, r->key.owner, r->route.image, &row) == 0) {
                enum MHD_Result sent = MHD_NO;
                int rc = image_elsewhere(r, &row, true, &sent, &e);
                store_image_row_clear(&row);
                if (rc > 0)
                        return sent;
        }
        SandboxError se;
        if (user_images_delete(r->app->user_images, r->key.owner, r->route.image, &se) < 0) {
                api_sandbox_error(&se, &e);
                if (e.status == 404)
                        e.code = "image_not_found";
                return reply_error(r, &e);
        }
        log_info(r->rid, "image %s deleted", r->route.image);
        return reply_json(r, 200, json_pack("{s:s,s:b}", "id", r->route.image, "deleted", true));
}

/* ---- registry credentials ---- */

enum MHD_Result handle_image_registries(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        json_t *data = NULL;
        if (user_images_registry_list(r->app->user_images, r->key.owner, &data) < 0)
                return reply_internal(r);
        return reply_json(r, 200, json_pack("{s:o}", "data", data));
}

static const char *registry_field(Req *r, const char *field) {
        json_t *v = json_object_get(r->json, field);
        return json_is_string(v) ? json_string_value(v) : NULL;
}

enum MHD_Result handle_image_registry_set(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        const char *k;
        json_t *v;
        json_object_foreach(r->json, k, v) if (strcmp(k, "registry") != 0 && strcmp(k, "username") != 0 &&
                                               strcmp(k, "password") != 0 && strcmp(k, "accessKeyId") != 0 &&
                                               strcmp(k, "secretAccessKey") != 0) {
                api_error(&e, 400, "invalid_request", NULL, "unknown field %.64s", k);
                return reply_error(r, &e);
        }
        if (json_object_get(r->json, "accessKeyId") || json_object_get(r->json, "secretAccessKey")) {
                api_error(&e, 501, "not_implemented", "store a username and a token or password",
                          "access keys (Amazon ECR) are not supported: this daemon does not exchange them for a "
                          "registry token");
                return reply_error(r, &e);
        }
        const char *registry = registry_field(r, "registry"), *user = registry_field(r, "username"),
                   *password = registry_field(r, "password");
        if (!registry || !user || !*user || !password || !*password) {
                api_error(&e, 400, "invalid_request", "send registry, username and password",
                          "registry, username and password are required strings");
                return reply_error(r, &e);
        }
        json_t *out = NULL;
        int rc = user_images_registry_set(r->app->user_images, r->key.owner, registry, user, password, &out);
        if (rc == -EINVAL)
                api_error(&e, 400, "invalid_request", "a host, host:port or https://host", "registry must name a registry");
        else if (rc == -E2BIG)
                api_error(&e, 400, "invalid_request", NULL, "username is at most 256 bytes, password 16 KiB");
        else if (rc == -EDQUOT)
                api_error(&e, 429, "rate_limited", "delete one with POST /v1/images/registries:delete",
                          "you have credentials of %d registries, the most one owner may keep",
                          USER_IMAGES_REGISTRIES_PER_OWNER);
        else if (rc == -EOPNOTSUPP)
                api_error(&e, 503, "unavailable", "the operator sets --secrets-key-file",
                          "this daemon has no key to seal secrets with");
        else if (rc < 0)
                return reply_internal(r);
        if (e.code)
                return reply_error(r, &e);
        log_info(r->rid, "registry credentials of %s stored", json_string_value(json_object_get(out, "registry")));
        return reply_json(r, 200, out);
}

enum MHD_Result handle_image_registry_delete(Req *r) {
        ApiError e = { 0 };
        if (offered(r, &e) < 0)
                return reply_error(r, &e);
        const char *registry = registry_field(r, "registry");
        if (!registry) {
                api_error(&e, 400, "invalid_request", NULL, "registry is required");
                return reply_error(r, &e);
        }
        int rc = user_images_registry_delete(r->app->user_images, r->key.owner, registry);
        if (rc == -ENOENT) {
                api_error(&e, 404, "not_found", "GET /v1/images/registries lists yours",
                          "you have no credentials of registry %.128s", registry);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return reply_internal(r);
        return reply_json(r, 200, json_pack("{s:s,s:b}", "registry", registry, "deleted", true));
}

/* ---- a sandbox from an image ---- */

int api_user_image_to_create(Req *r, bool *ret_from_image, json_t **ret_start, ApiError *e) {
        *ret_from_image = false;
        *ret_start = NULL;
        UserImages *u = r->app->user_images;
        json_t *image = json_object_get(r->json, "image");
        const char *ref = json_string_value(image);
        if (!u || !ref || strncmp(ref, "snp_", 4) == 0)
                return 0;
        ImageInfo info;
        /* A built-in image's name is the built-in image, unless the owner
         * has one of that name. */
        ImageRow row;
        int rc = user_images_resolve(u, r->key.owner, ref, &row);
        /* A pulled tree's name is the daemon's own, never a client's. */
        if (rc == -ENOENT && strncmp(ref, OCI_IMAGE_PREFIX, strlen(OCI_IMAGE_PREFIX)) == 0)
                return not_found(ref, e);
        if (rc == -ENOENT)
                return 0;
        (void)info;
        if (rc < 0)
                return api_error(e, 500, "internal", NULL, "could not read the image");
        int ret = 0;
        _cleanup_json_ json_t *doc = json_loads(row.doc, 0, NULL);
        const char *snap = json_string_value(json_object_get(doc, "snapshot"));
        json_t *config = json_object_get(doc, "config");
        if (strcmp(row.state, "ready") != 0 || !snap) {
                ret = api_error(e, 409, "conflict", "wait for its build to end (GET /v1/images/{id})",
                                "image %.128s is %s, not ready", ref, row.state);
                goto done;
        }
        /* The image's env under the create's own. */
        json_t *ienv = json_object_get(config, "env"), *env = json_object_get(r->json, "env");
        if (json_is_object(ienv) && json_object_size(ienv)) {
                json_t *merged = json_deep_copy(ienv);
                if (json_is_object(env))
                        json_object_update(merged, env);
                json_object_set_new(r->json, "env", merged);
        }
        const char *user = json_string_value(json_object_get(config, "user"));
        if (user && strcmp(user, "root") == 0 && !json_object_get(r->json, "user"))
                json_object_set_new(r->json, "user", json_string("root"));
        json_t *start = json_object_get(doc, "start");
        const char *workdir = json_string_value(json_object_get(config, "workdir"));
        if (json_is_object(start) &&
            !(*ret_start = json_pack("{s:O,s:s}", "start", start, "workdir", workdir ? workdir : "/"))) {
                ret = api_error(e, 500, "internal", NULL, "out of memory");
                goto done;
        }
        json_object_set_new(r->json, "snapshot", json_string(snap));
        json_object_del(r->json, "image");
        *ret_from_image = true;
done:
        store_image_row_clear(&row);
        return ret;
}
