/* Uploads in parts (api_uploads.h): the routes. The registry, its staging
 * files and its rows are uploads.c's; an upload survives a daemon restart,
 * and the sandbox it belongs to decides only at the commit. */
#include "daemon/api/api_uploads.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "daemon/manager/agent_client.h"
#include "daemon/api/api.h"
#include "daemon/manager/config.h"
#include "common/log.h"
#include "daemon/http/request.h"
#include "daemon/manager/uploads.h"

#define COMMIT_TIMEOUT_MS 120000

_Static_assert(UPLOAD_ID_LEN == HTTP_UPLOAD_ID_LEN, "an upload id is what the route takes");

static int hex_digest(const char *s, uint8_t out[32]) {
        if (!s || strlen(s) != 64)
                return -EINVAL;
        for (size_t i = 0; i < 32; i++) {
                unsigned v;
                char b[3] = { s[2 * i], s[2 * i + 1], 0 };
                if (!strchr("0123456789abcdefABCDEF", b[0]) || !strchr("0123456789abcdefABCDEF", b[1]) ||
                    sscanf(b, "%2x", &v) != 1)
                        return -EINVAL;
                out[i] = (uint8_t)v;
        }
        return 0;
}

/* Begins the upload and answers it. */
static enum MHD_Result upload_register(Req *r, const UploadSpec *spec) {
        ApiError e = { 0 };
        char id[UPLOAD_ID_LEN + 1];
        int rc = uploads_begin(r->app->uploads, spec, id);
        if (rc == -EMFILE) {
                unsigned max;
                uint64_t mib;
                uploads_owner_bounds(r->app->uploads, &max, &mib);
                api_error(&e, 429, "rate_limited", "finish or abort your uploads in progress, or try again later",
                          "your uploads in progress are at this daemon's bound for one owner (%u uploads, %llu MiB "
                          "declared in all: --max-uploads-per-owner, --max-upload-mib-per-owner)",
                          max, (unsigned long long)mib);
                return reply_error(r, &e);
        }
        if (rc == -EMLINK) {
                api_error(&e, 429, "rate_limited", "finish or abort this sandbox's uploads in progress",
                          "this sandbox has %d uploads in progress, the most one sandbox may have",
                          UPLOADS_PER_SANDBOX);
                return reply_error(r, &e);
        }
        if (rc == -EUSERS) {
                api_error(&e, 429, "rate_limited", "try again later",
                          "the host has as many uploads in progress as it takes (%d, %u MiB declared in all)",
                          UPLOADS_MAX, UPLOADS_MAX_TOTAL_MIB);
                return reply_error(r, &e);
        }
        if (rc < 0) {
                log_error(r->rid, "beginning an upload: %s", strerror(-rc));
                if (rc == -ENOSPC || rc == -EDQUOT) {
                        api_error(&e, 503, "unavailable", "try again later, or send a smaller file",
                                  "the host has no room to stage the upload");
                        return reply_error(r, &e);
                }
                return reply_internal(r);
        }
        char octal[8];
        snprintf(octal, sizeof(octal), "%03o", spec->mode);
        json_t *j = spec->archive ? json_pack("{s:s,s:s,s:i}", "uploadId", id, "path", spec->path, "chunkBytes",
                                              (int)UPLOAD_CHUNK)
                                  : json_pack("{s:s,s:s,s:I,s:i,s:s}", "uploadId", id, "path", spec->path, "size",
                                              (json_int_t)spec->size, "chunkBytes", (int)UPLOAD_CHUNK, "mode", octal);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_upload_begin(Req *r) {
        static const char *const fields[] = { "path", "size", "sha256", "mode", NULL };
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        for (void *it = json_object_iter(r->json); it; it = json_object_iter_next(r->json, it)) {
                const char *k = json_object_iter_key(it);
                bool known = false;
                for (size_t i = 0; fields[i] && !known; i++)
                        known = strcmp(fields[i], k) == 0;
                if (!known) {
                        api_error(&e, 400, "invalid_request", NULL, "unknown field %.64s", k);
                        return reply_error(r, &e);
                }
        }
        _cleanup_free_ char *path = NULL;
        if (request_path_field(r->json, "path", true, &path, &e) < 0)
                return reply_error(r, &e);
        json_t *size = json_object_get(r->json, "size");
        uint64_t max = (uint64_t)cfg->max_file_mib * 1024u * 1024u;
        if (!json_is_integer(size) || json_integer_value(size) < 0) {
                api_error(&e, 400, "invalid_request", NULL, "size must be the file's length in bytes");
                return reply_error(r, &e);
        }
        if ((uint64_t)json_integer_value(size) > max) {
                api_error(&e, 413, "payload_too_large", "files are limited by the daemon's --max-file-mib",
                          "the file is larger than %u MiB", cfg->max_file_mib);
                return reply_error(r, &e);
        }
        UploadSpec spec = { .sandbox_id = r->route.sandbox_id, .owner = r->key.owner, .mode = 0644,
                            .size = (uint64_t)json_integer_value(size) };
        if (hex_digest(json_string_value(json_object_get(r->json, "sha256")), spec.sha256) < 0) {
                api_error(&e, 400, "invalid_request", NULL, "sha256 must be the file's SHA-256 in 64 hex digits");
                return reply_error(r, &e);
        }
        json_t *m = json_object_get(r->json, "mode");
        if (m && !json_is_null(m) && request_parse_mode(json_string_value(m), &spec.mode, &e) < 0)
                return reply_error(r, &e);
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0)
                return reply_error(r, &e);
        sandbox_release(sb);
        spec.path = path;
        return upload_register(r, &spec);
}

/* The route's upload of the caller's sandbox: NULL and e filled (404, or
 * 409 while its commit runs). */
static int upload_take(Req *r, bool exclusive, UploadRef *ret, ApiError *e) {
        int rc = uploads_take(r->app->uploads, r->route.upload_id, r->route.sandbox_id, r->key.owner, exclusive, ret);
        if (rc == -EBUSY)
                return api_error(e, 409, "conflict", "wait for the parts in flight", "the upload is busy");
        if (rc == -ENOENT)
                return api_error(e, 404, "not_found", "begin the upload again", "no upload %s in progress",
                                 r->route.upload_id);
        if (rc < 0) {
                log_error(r->rid, "taking upload %s: %s", r->route.upload_id, strerror(-rc));
                return api_error(e, 500, "internal", NULL, "could not open the upload");
        }
        return 0;
}

/* ---- a part ---- */

typedef struct Part {
        UploadRef ref;
        uint64_t offset, want, got;
        bool taken;
        bool failed;
        ApiError e;
} Part;

static void part_free(void *p) {
        Part *pt = p;
        if (!pt)
                return;
        if (pt->taken)
                upload_ref_done(&pt->ref);
        free(pt);
}

static enum MHD_Result part_begin(Req *r) {
        Part *pt = calloc(1, sizeof(*pt));
        if (!pt)
                return MHD_NO;
        r->upload = pt;
        const char *o = req_query(r, "offset");
        char *end = NULL;
        errno = 0;
        unsigned long long off = o ? strtoull(o, &end, 10) : 0;
        if (!o || errno || !*o || *end || o[0] == '-') {
                pt->failed = true;
                api_error(&pt->e, 400, "invalid_request", NULL, "offset must be the part's byte offset");
                return MHD_YES;
        }
        if (upload_take(r, false, &pt->ref, &pt->e) < 0) {
                pt->failed = true;
                return MHD_YES;
        }
        pt->taken = true;
        const UploadRef *u = &pt->ref;
        if (u->archive) {
                if (off % UPLOAD_CHUNK != 0 || off / UPLOAD_CHUNK >= u->parts) {
                        pt->failed = true;
                        api_error(&pt->e, 413, "payload_too_large", "archives are limited by the daemon's --max-file-mib",
                                  "offset must be a multiple of %u within the archive bound", UPLOAD_CHUNK);
                        return MHD_YES;
                }
        } else if (off % UPLOAD_CHUNK != 0 || off >= u->size) {
                pt->failed = true;
                api_error(&pt->e, 400, "invalid_request", "send the parts at multiples of chunkBytes",
                          "offset must be a multiple of %u below the size", UPLOAD_CHUNK);
                return MHD_YES;
        }
        pt->offset = off;
        pt->want = u->archive || u->size - off >= UPLOAD_CHUNK ? UPLOAD_CHUNK : u->size - off;
        return MHD_YES;
}

static enum MHD_Result part_data(Req *r, const char *data, size_t len) {
        Part *pt = r->upload;
        if (!pt || pt->failed)
                return pt && pt->got + len <= 2u * UPLOAD_CHUNK ? (pt->got += len, MHD_YES) : MHD_NO;
        if (pt->got + len > pt->want) {
                pt->failed = true;
                api_error(&pt->e, 400, "invalid_request", NULL, "the part is longer than %" PRIu64 " bytes", pt->want);
                return MHD_YES;
        }
        while (len > 0) {
                ssize_t k = pwrite(pt->ref.fd, data, len, (off_t)(pt->offset + pt->got));
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0) {
                        pt->failed = true;
                        log_error(r->rid, "staging a part of %s: %s", pt->ref.id, k < 0 ? strerror(errno) : "short write");
                        if (k < 0 && (errno == ENOSPC || errno == EDQUOT))
                                api_error(&pt->e, 503, "unavailable", "send the part again later",
                                          "the host has no room for the part");
                        else
                                api_error(&pt->e, 500, "internal", NULL, "could not stage the part");
                        return MHD_YES;
                }
                data += k;
                len -= (size_t)k;
                pt->got += (uint64_t)k;
        }
        return MHD_YES;
}

enum MHD_Result handle_upload_part(Req *r) {
        Part *pt = r->upload;
        if (!pt)
                return reply_internal(r);
        if (pt->failed)
                return reply_error(r, &pt->e);
        if (pt->got != pt->want && !(pt->ref.archive && pt->got > 0)) {
                api_error(&pt->e, 400, "invalid_request", NULL, "the part at %" PRIu64 " must be %" PRIu64 " bytes",
                          pt->offset, pt->want);
                return reply_error(r, &pt->e);
        }
        /* Answered only once kept: the bytes on the disk and the part recorded. */
        int rc = uploads_part_arrived(r->app->uploads, &pt->ref, pt->offset / UPLOAD_CHUNK, pt->got);
        if (rc == -ENOENT) {
                api_error(&pt->e, 404, "not_found", "begin the upload again", "no upload %s in progress",
                          r->route.upload_id);
                return reply_error(r, &pt->e);
        }
        if (rc < 0) {
                log_error(r->rid, "keeping a part of %s: %s", pt->ref.id, strerror(-rc));
                if (rc == -ENOSPC || rc == -EDQUOT) {
                        api_error(&pt->e, 503, "unavailable", "send the part again later",
                                  "the host has no room for the part");
                        return reply_error(r, &pt->e);
                }
                return reply_internal(r);
        }
        return reply_json(r, 200, json_pack("{s:I,s:I}", "offset", (json_int_t)pt->offset, "size",
                                            (json_int_t)pt->got));
}

const HttpUpload upload_part_stream = {
        .begin = part_begin,
        .data = part_data,
        .free = part_free,
};

/* ---- commit and abort ---- */

static int staged_digest(int fd, uint64_t size, uint8_t out[32]) {
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        if (!ctx)
                return -ENOMEM;
        int r = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 ? 0 : -EIO;
        _cleanup_free_ uint8_t *buf = malloc(256 * 1024);
        uint64_t off = 0;
        while (r == 0 && buf && off < size) {
                ssize_t k = pread(fd, buf, 256 * 1024, (off_t)off);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        r = -EIO;
                else if (EVP_DigestUpdate(ctx, buf, (size_t)k) != 1)
                        r = -EIO;
                else
                        off += (uint64_t)k;
        }
        unsigned n = 0;
        if (r == 0 && (!buf || EVP_DigestFinal_ex(ctx, out, &n) != 1 || n != 32))
                r = buf ? -EIO : -ENOMEM;
        EVP_MD_CTX_free(ctx);
        return r;
}

static bool client_left(void *userdata) {
        return socket_hung_up(*(int *)userdata);
}

/* Streams the staged file into s; 0 or a negative errno. */
static int send_staged(int fd, uint64_t size, ChanStream *s) {
        _cleanup_free_ uint8_t *buf = malloc(256 * 1024);
        if (!buf)
                return -ENOMEM;
        uint64_t off = 0;
        while (off < size) {
                ssize_t k = pread(fd, buf, 256 * 1024, (off_t)off);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return -EIO;
                int rc = chan_stream_write(s, buf, (size_t)k, COMMIT_TIMEOUT_MS);
                if (rc < 0)
                        return rc;
                off += (uint64_t)k;
        }
        return chan_stream_close_write(s);
}

/* The sandbox for a commit. One that is not running (stopped by a daemon
 * restart or a :stop, still starting, a wake that failed) keeps the upload:
 * a :wake, then the commit again writes it. One that is gone drops it. */
static int commit_acquire(Req *r, UploadRef *u, Sandbox **ret, ApiError *e) {
        if (api_sandbox_acquire(r, ret, e) == 0)
                return 0;
        if (e->status == 404) {
                uploads_drop(r->app->uploads, u);
                return -EINVAL;
        }
        if (e->status == 409)
                snprintf(e->hint, sizeof(e->hint), "%s",
                         "the upload's parts are kept: wake the sandbox (POST /v1/sandboxes/{id}:wake), then commit "
                         "again");
        uploads_release(r->app->uploads, u);
        return -EINVAL;
}

/* A commit that the sandbox did not see through (its channel ended, it
 * stopped): the target is as it was, and the upload is kept for another. */
static enum MHD_Result commit_cut(Req *r, UploadRef *u, int rc, const char *what) {
        ApiError e = { 0 };
        uploads_release(r->app->uploads, u);
        if (rc == -ECANCELED)
                return MHD_NO;
        api_error(&e, 409, "conflict", "commit again once the sandbox runs: the upload's parts are kept",
                  "the sandbox did not take the %s", what);
        return reply_error(r, &e);
}

static enum MHD_Result archive_commit(Req *r, UploadRef *u);

enum MHD_Result handle_upload_commit(Req *r) {
        ApiError e = { 0 };
        UploadRef u;
        if (upload_take(r, true, &u, &e) < 0)
                return reply_error(r, &e);
        if (u.archive)
                return archive_commit(r, &u);
        _cleanup_free_ uint8_t *received = NULL;
        if (uploads_received(r->app->uploads, &u, &received) < 0) {
                uploads_release(r->app->uploads, &u);
                return reply_internal(r);
        }
        for (size_t i = 0; i < u.parts; i++)
                if (!received[i]) {
                        uploads_release(r->app->uploads, &u);
                        api_error(&e, 409, "conflict", "send every part, then commit", "the part at %zu is missing",
                                  i * (size_t)UPLOAD_CHUNK);
                        return reply_error(r, &e);
                }
        uint8_t got[32];
        int rc = staged_digest(u.fd, u.size, got);
        if (rc < 0 || memcmp(got, u.sha256, 32) != 0) {
                uploads_drop(r->app->uploads, &u);
                if (rc < 0)
                        return reply_internal(r);
                api_error(&e, 400, "invalid_request", "begin the upload again",
                          "the parts do not have the SHA-256 given at the start");
                return reply_error(r, &e);
        }
        Sandbox *sb;
        if (commit_acquire(r, &u, &sb, &e) < 0)
                return reply_error(r, &e);
        _cleanup_json_ json_t *req = agent_req_write(u.path, u.mode, true);
        ChanStream *s = NULL;
        if (!req || api_req_set_user(req, sb, u.user) < 0 || api_open_stream(sb, req, &s, &e) < 0) {
                sandbox_release(sb);
                uploads_release(r->app->uploads, &u);
                return e.status ? reply_error(r, &e) : reply_internal(r);
        }
        rc = send_staged(u.fd, u.size, s);
        _cleanup_json_ json_t *res = NULL;
        if (rc == 0) {
                int sock = req_socket(r);
                rc = agent_wait_result(s, COMMIT_TIMEOUT_MS, client_left, &sock, &res);
        }
        chan_stream_free(s); /* a write without its RESULT is cancelled: the target stays as it was */
        sandbox_release(sb);
        if (rc < 0)
                return commit_cut(r, &u, rc, "file");
        char path[REQ_MAX_PATH + 1];
        snprintf(path, sizeof(path), "%s", u.path);
        uint64_t size = u.size;
        uploads_drop(r->app->uploads, &u);
        if (agent_result_error(res, NULL)) {
                api_agent_error(res, path, &e);
                return reply_error(r, &e);
        }
        return reply_json(r, 200, json_pack("{s:s,s:I}", "path", path, "size", (json_int_t)size));
}

enum MHD_Result handle_upload_abort(Req *r) {
        ApiError e = { 0 };
        UploadRef u;
        if (upload_take(r, true, &u, &e) < 0)
                return reply_error(r, &e);
        uploads_drop(r->app->uploads, &u);
        return reply_json(r, 200, json_pack("{s:s,s:b}", "uploadId", r->route.upload_id, "aborted", true));
}

/* ---- archives in parts ---- */

#define UNPACK_RATIO 4u
#define UNPACK_ENTRIES_MAX 100000u

static enum MHD_Result archive_commit(Req *r, UploadRef *u) {
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        _cleanup_free_ uint8_t *received = NULL;
        if (uploads_received(r->app->uploads, u, &received) < 0) {
                uploads_release(r->app->uploads, u);
                return reply_internal(r);
        }
        /* Every part up to the last, each whole but the last. */
        size_t n = 0;
        for (size_t i = 0; i < u->parts; i++)
                if (received[i])
                        n = i + 1;
        for (size_t i = 0; i < n; i++)
                if (received[i] != 1 && !(i + 1 == n && received[i] == 2)) {
                        uploads_release(r->app->uploads, u);
                        api_error(&e, 409, "conflict", "send every part in order, then commit",
                                  "the part at %zu is missing or short", i * (size_t)UPLOAD_CHUNK);
                        return reply_error(r, &e);
                }
        struct stat st;
        if (n == 0 || fstat(u->fd, &st) < 0) {
                uploads_release(r->app->uploads, u);
                api_error(&e, 409, "conflict", "send the archive's parts, then commit", "no part has arrived");
                return reply_error(r, &e);
        }
        /* A part sent again shorter leaves the longer one's tail in the
         * file: the archive ends where its last part does. */
        uint64_t last = (n - 1) * (uint64_t)UPLOAD_CHUNK;
        uint64_t length = (uint64_t)st.st_size < last + UPLOAD_CHUNK ? (uint64_t)st.st_size : last + UPLOAD_CHUNK;
        Sandbox *sb;
        if (commit_acquire(r, u, &sb, &e) < 0)
                return reply_error(r, &e);
        uint64_t max = (uint64_t)cfg->max_file_mib * 1024u * 1024u;
        _cleanup_json_ json_t *req = agent_req_unarchive(u->path, max * UNPACK_RATIO, UNPACK_ENTRIES_MAX);
        ChanStream *s = NULL;
        if (!req || api_req_set_user(req, sb, u->user) < 0 || api_open_stream(sb, req, &s, &e) < 0) {
                sandbox_release(sb);
                uploads_release(r->app->uploads, u);
                return e.status ? reply_error(r, &e) : reply_internal(r);
        }
        /* A refused member ends the unpack before all is sent: its answer
         * still comes, so a failed send is not the error. */
        (void)send_staged(u->fd, length, s);
        _cleanup_json_ json_t *res = NULL;
        int sock = req_socket(r);
        int rc = agent_wait_result(s, COMMIT_TIMEOUT_MS, client_left, &sock, &res);
        chan_stream_free(s);
        sandbox_release(sb);
        if (rc < 0)
                return commit_cut(r, u, rc, "archive");
        char path[REQ_MAX_PATH + 1];
        snprintf(path, sizeof(path), "%s", u->path);
        uploads_drop(r->app->uploads, u);
        json_t *code = json_object_get(res, "exitCode");
        if (agent_result_error(res, NULL) || !json_is_integer(code) || json_integer_value(code) != 0) {
                const char *why = json_string_value(json_object_get(res, "stderrHead"));
                api_archive_error(json_is_integer(code) ? (int)json_integer_value(code) : 1, path,
                                  why ? why : "the unpack failed", &e);
                return reply_error(r, &e);
        }
        _cleanup_json_ json_t *counts = json_loads(json_string_value(json_object_get(res, "stdoutHead")) ?: "{}", 0, NULL);
        json_t *ne = json_object_get(counts, "entries"), *nb = json_object_get(counts, "bytes");
        return reply_json(r, 200, json_pack("{s:s,s:I,s:I}", "path", path, "entries",
                                            (json_int_t)(json_is_integer(ne) ? json_integer_value(ne) : 0), "bytes",
                                            (json_int_t)(json_is_integer(nb) ? json_integer_value(nb) : 0)));
}

enum MHD_Result handle_archive_upload_begin(Req *r) {
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        for (void *it = json_object_iter(r->json); it; it = json_object_iter_next(r->json, it)) {
                const char *k = json_object_iter_key(it);
                if (strcmp(k, "path") != 0 && strcmp(k, "gzip") != 0 && strcmp(k, "user") != 0) {
                        api_error(&e, 400, "invalid_request", NULL, "unknown field %.64s", k);
                        return reply_error(r, &e);
                }
        }
        _cleanup_free_ char *path = NULL;
        if (request_path_field(r->json, "path", true, &path, &e) < 0)
                return reply_error(r, &e);
        json_t *g = json_object_get(r->json, "gzip"), *user = json_object_get(r->json, "user");
        if (g && !json_is_null(g) && !json_is_boolean(g)) {
                api_error(&e, 400, "invalid_request", NULL, "gzip must be a boolean");
                return reply_error(r, &e);
        }
        UploadSpec spec = { .archive = true, .sandbox_id = r->route.sandbox_id, .owner = r->key.owner,
                            .mode = 0644 };
        if (request_parse_user(user, &spec.user, &e) < 0)
                return reply_error(r, &e);
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0)
                return reply_error(r, &e);
        sandbox_release(sb);
        spec.max_parts = ((uint64_t)cfg->max_file_mib * 1024u * 1024u + UPLOAD_CHUNK - 1) / UPLOAD_CHUNK;
        spec.path = path;
        return upload_register(r, &spec);
}
