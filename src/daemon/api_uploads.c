/* Uploads in parts (api_uploads.h). The registry is in memory: an upload is
 * a client's few minutes of work, and one the daemon forgets across a
 * restart is begun again by the client, whose parts are idempotent. */
#include "daemon/api_uploads.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/agent_client.h"
#include "daemon/api.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/request.h"

/* The published client's part size; a part is one request body. */
#define UPLOAD_CHUNK (1024u * 1024u)
/* Uploads in progress: per sandbox, in all, and their declared bytes in all
 * (staged files are sparse, but a client may fill every one). */
#define UPLOADS_PER_SANDBOX 8
#define UPLOADS_MAX 64
#define UPLOADS_MAX_TOTAL_MIB 4096u
/* An upload left this long without a part is dropped. */
#define UPLOAD_IDLE_S 3600
#define COMMIT_TIMEOUT_MS 120000

typedef struct Upload {
        bool used;
        bool busy; /* a part or the commit is at work on it */
        char id[HTTP_UPLOAD_ID_LEN + 1];
        char sandbox_id[ROUTE_ID_LEN + 1];
        char owner[128];
        char *path;
        unsigned mode;
        uint64_t size;
        uint8_t sha256[32];
        int fd;
        uint8_t *received; /* per part: 0 missing, 1 whole, 2 short (the last) */
        size_t parts;
        int64_t touched;
        /* An archive upload: its size is not said up front; its parts come
         * in order and the commit unpacks the whole into path. */
        bool archive;
        uint64_t max_parts;
        ReqUser user; /* who writes or unpacks it; DEFAULT: the sandbox's own user */
} Upload;

static pthread_mutex_t uploads_lock = PTHREAD_MUTEX_INITIALIZER;
static Upload uploads[UPLOADS_MAX];

static void upload_clear(Upload *u) {
        if (u->fd >= 0)
                close(u->fd);
        free(u->path);
        free(u->received);
        *u = (Upload){ .fd = -1 };
}

static char *staging_path(const DaemonConfig *cfg, const char *id) {
        char *p;
        if (asprintf(&p, "%s/uploads/%s", cfg->state_dir, id) < 0)
                return NULL;
        return p;
}

/* Drops idle uploads; the lock is held. */
static void sweep_locked(const DaemonConfig *cfg, int64_t now) {
        for (size_t i = 0; i < UPLOADS_MAX; i++) {
                Upload *u = &uploads[i];
                if (u->used && !u->busy && now - u->touched > UPLOAD_IDLE_S) {
                        _cleanup_free_ char *p = staging_path(cfg, u->id);
                        if (p)
                                unlink(p);
                        upload_clear(u);
                }
        }
}

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

/* Puts a staged upload in a free slot, within the bounds, and answers its
 * begin; on refusal its file goes. */
static enum MHD_Result upload_register(Req *r, Upload *proto, const char *id, const char *staged) {
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        int64_t now = time_now_unix();
        pthread_mutex_lock(&uploads_lock);
        sweep_locked(cfg, now);
        size_t mine = 0, free_slot = UPLOADS_MAX;
        uint64_t total = 0;
        for (size_t i = 0; i < UPLOADS_MAX; i++) {
                if (!uploads[i].used) {
                        if (free_slot == UPLOADS_MAX)
                                free_slot = i;
                        continue;
                }
                total += uploads[i].archive ? uploads[i].max_parts * UPLOAD_CHUNK : uploads[i].size;
                if (strcmp(uploads[i].sandbox_id, r->route.sandbox_id) == 0)
                        mine++;
        }
        uint64_t declared = proto->archive ? proto->max_parts * UPLOAD_CHUNK : proto->size;
        if (mine >= UPLOADS_PER_SANDBOX || free_slot == UPLOADS_MAX ||
            total + declared > (uint64_t)UPLOADS_MAX_TOTAL_MIB * 1024u * 1024u) {
                pthread_mutex_unlock(&uploads_lock);
                close(proto->fd);
                unlink(staged);
                free(proto->received);
                free(proto->path);
                api_error(&e, 429, "rate_limited", "finish or abort the uploads in progress, or try again later",
                          "too many uploads in progress");
                return reply_error(r, &e);
        }
        Upload *u = &uploads[free_slot];
        *u = *proto;
        u->touched = now;
        memcpy(u->id, id, sizeof(u->id));
        snprintf(u->sandbox_id, sizeof(u->sandbox_id), "%s", r->route.sandbox_id);
        snprintf(u->owner, sizeof(u->owner), "%s", r->key.owner);
        char octal[8];
        snprintf(octal, sizeof(octal), "%03o", u->mode);
        json_t *j = u->archive ? json_pack("{s:s,s:s,s:i}", "uploadId", id, "path", u->path, "chunkBytes",
                                           (int)UPLOAD_CHUNK)
                               : json_pack("{s:s,s:s,s:I,s:i,s:s}", "uploadId", id, "path", u->path, "size",
                                           (json_int_t)u->size, "chunkBytes", (int)UPLOAD_CHUNK, "mode", octal);
        pthread_mutex_unlock(&uploads_lock);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

/* A sparse staging file of its own for a new upload; the id in id. */
static int stage_new(Req *r, uint64_t size, char id[HTTP_UPLOAD_ID_LEN + 1], char **ret_staged, int *ret_fd) {
        const DaemonConfig *cfg = r->app->cfg;
        memcpy(id, "upl_", 5);
        if (random_hex(id + 4, 8) < 0)
                return -EIO;
        _cleanup_free_ char *dir = NULL, *staged = staging_path(cfg, id);
        if (asprintf(&dir, "%s/uploads", cfg->state_dir) < 0 || !staged)
                return -ENOMEM;
        (void)mkdir(dir, 0700);
        int fd = open(staged, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
                int k = -errno;
                log_error(r->rid, "staging an upload in %s: %s", dir, strerror(errno));
                if (fd >= 0) {
                        close(fd);
                        unlink(staged);
                }
                return k;
        }
        *ret_fd = fd;
        *ret_staged = TAKE_PTR(staged);
        return 0;
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
        uint8_t digest[32];
        if (hex_digest(json_string_value(json_object_get(r->json, "sha256")), digest) < 0) {
                api_error(&e, 400, "invalid_request", NULL, "sha256 must be the file's SHA-256 in 64 hex digits");
                return reply_error(r, &e);
        }
        unsigned mode = 0644;
        json_t *m = json_object_get(r->json, "mode");
        if (m && !json_is_null(m) && request_parse_mode(json_string_value(m), &mode, &e) < 0)
                return reply_error(r, &e);
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0)
                return reply_error(r, &e);
        sandbox_release(sb);

        uint64_t n = (uint64_t)json_integer_value(size);
        char id[HTTP_UPLOAD_ID_LEN + 1];
        _cleanup_free_ char *staged = NULL;
        int fd = -1;
        if (stage_new(r, n, id, &staged, &fd) < 0)
                return reply_internal(r);
        size_t parts = (size_t)((n + UPLOAD_CHUNK - 1) / UPLOAD_CHUNK);
        uint8_t *received = calloc(parts ? parts : 1, 1);
        if (!received) {
                close(fd);
                unlink(staged);
                return reply_internal(r);
        }
        Upload proto = { .used = true, .fd = fd, .mode = mode, .size = n, .received = received, .parts = parts,
                         .max_parts = parts, .path = TAKE_PTR(path) };
        memcpy(proto.sha256, digest, 32);
        return upload_register(r, &proto, id, staged);
}

/* Takes the named upload of the caller's sandbox for a part or the commit:
 * only one at a time works on a slot's bookkeeping, but parts write their
 * own bytes with pwrite, so the lock is held only to look. NULL: 404, or 409
 * while the commit runs. */
static Upload *upload_take(Req *r, bool exclusive, ApiError *e) {
        pthread_mutex_lock(&uploads_lock);
        for (size_t i = 0; i < UPLOADS_MAX; i++) {
                Upload *u = &uploads[i];
                if (!u->used || strcmp(u->id, r->route.upload_id) != 0 ||
                    strcmp(u->sandbox_id, r->route.sandbox_id) != 0 || strcmp(u->owner, r->key.owner) != 0)
                        continue;
                if (u->busy && exclusive) {
                        pthread_mutex_unlock(&uploads_lock);
                        api_error(e, 409, "conflict", "wait for the parts in flight", "the upload is busy");
                        return NULL;
                }
                if (exclusive)
                        u->busy = true;
                u->touched = time_now_unix();
                pthread_mutex_unlock(&uploads_lock);
                return u;
        }
        pthread_mutex_unlock(&uploads_lock);
        api_error(e, 404, "not_found", "begin the upload again", "no upload %s in progress", r->route.upload_id);
        return NULL;
}

static void upload_drop(const DaemonConfig *cfg, Upload *u) {
        pthread_mutex_lock(&uploads_lock);
        _cleanup_free_ char *p = staging_path(cfg, u->id);
        if (p)
                unlink(p);
        upload_clear(u);
        pthread_mutex_unlock(&uploads_lock);
}

/* ---- a part ---- */

typedef struct Part {
        Upload *u;
        uint64_t offset, want, got;
        int fd;
        bool failed;
        ApiError e;
} Part;

static void part_free(void *p) {
        Part *pt = p;
        if (!pt)
                return;
        if (pt->fd >= 0)
                close(pt->fd);
        free(pt);
}

static enum MHD_Result part_begin(Req *r) {
        Part *pt = calloc(1, sizeof(*pt));
        if (!pt)
                return MHD_NO;
        pt->fd = -1;
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
        Upload *u = upload_take(r, false, &pt->e);
        if (!u) {
                pt->failed = true;
                return MHD_YES;
        }
        if (u->archive) {
                if (off % UPLOAD_CHUNK != 0 || off / UPLOAD_CHUNK >= u->max_parts) {
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
        pt->u = u;
        pt->offset = off;
        pt->want = u->archive || u->size - off >= UPLOAD_CHUNK ? UPLOAD_CHUNK : u->size - off;
        /* A descriptor of its own: the commit or an abort may close the slot's. */
        pt->fd = fcntl(u->fd, F_DUPFD_CLOEXEC, 3);
        if (pt->fd < 0) {
                pt->failed = true;
                api_error(&pt->e, 500, "internal", NULL, "could not stage the part");
        }
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
                ssize_t k = pwrite(pt->fd, data, len, (off_t)(pt->offset + pt->got));
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0) {
                        pt->failed = true;
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
        if (pt->got != pt->want && !(pt->u->archive && pt->got > 0)) {
                api_error(&pt->e, 400, "invalid_request", NULL, "the part at %" PRIu64 " must be %" PRIu64 " bytes",
                          pt->offset, pt->want);
                return reply_error(r, &pt->e);
        }
        pthread_mutex_lock(&uploads_lock);
        /* The slot may have been aborted meanwhile: only mark the same upload. */
        if (pt->u->used && strcmp(pt->u->id, r->route.upload_id) == 0)
                pt->u->received[pt->offset / UPLOAD_CHUNK] = pt->got == UPLOAD_CHUNK ? 1 : 2;
        pthread_mutex_unlock(&uploads_lock);
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

static enum MHD_Result archive_commit(Req *r, Upload *u);

enum MHD_Result handle_upload_commit(Req *r) {
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        Upload *u = upload_take(r, true, &e);
        if (!u)
                return reply_error(r, &e);
        if (u->archive)
                return archive_commit(r, u);
        for (size_t i = 0; i < u->parts; i++)
                if (!u->received[i]) {
                        pthread_mutex_lock(&uploads_lock);
                        u->busy = false;
                        pthread_mutex_unlock(&uploads_lock);
                        api_error(&e, 409, "conflict", "send every part, then commit", "the part at %zu is missing",
                                  i * (size_t)UPLOAD_CHUNK);
                        return reply_error(r, &e);
                }
        uint8_t got[32];
        int rc = staged_digest(u->fd, u->size, got);
        if (rc < 0 || memcmp(got, u->sha256, 32) != 0) {
                upload_drop(cfg, u);
                if (rc < 0)
                        return reply_internal(r);
                api_error(&e, 400, "invalid_request", "begin the upload again",
                          "the parts do not have the SHA-256 given at the start");
                return reply_error(r, &e);
        }
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0) {
                upload_drop(cfg, u);
                return reply_error(r, &e);
        }
        _cleanup_json_ json_t *req = agent_req_write(u->path, u->mode, true);
        ChanStream *s = NULL;
        if (!req || api_req_set_user(req, sb, u->user) < 0 || api_open_stream(sb, req, &s, &e) < 0) {
                sandbox_release(sb);
                upload_drop(cfg, u);
                return e.code ? reply_error(r, &e) : reply_internal(r);
        }
        _cleanup_free_ uint8_t *buf = malloc(256 * 1024);
        uint64_t off = 0;
        rc = buf ? 0 : -ENOMEM;
        while (rc == 0 && off < u->size) {
                ssize_t k = pread(u->fd, buf, 256 * 1024, (off_t)off);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0) {
                        rc = -EIO;
                        break;
                }
                rc = chan_stream_write(s, buf, (size_t)k, COMMIT_TIMEOUT_MS);
                off += (uint64_t)k;
        }
        _cleanup_json_ json_t *res = NULL;
        if (rc == 0) {
                chan_stream_close_write(s);
                int sock = req_socket(r);
                rc = agent_wait_result(s, COMMIT_TIMEOUT_MS, client_left, &sock, &res);
        }
        chan_stream_free(s); /* a write without its RESULT is cancelled: the target stays as it was */
        sandbox_release(sb);
        char path[REQ_MAX_PATH + 1];
        snprintf(path, sizeof(path), "%s", u->path);
        uint64_t size = u->size;
        upload_drop(cfg, u);
        if (rc == -ECANCELED)
                return MHD_NO;
        if (rc < 0) {
                api_error(&e, 409, "conflict", "begin the upload again", "the sandbox did not take the file");
                return reply_error(r, &e);
        }
        if (agent_result_error(res, NULL)) {
                api_agent_error(res, path, &e);
                return reply_error(r, &e);
        }
        return reply_json(r, 200, json_pack("{s:s,s:I}", "path", path, "size", (json_int_t)size));
}

enum MHD_Result handle_upload_abort(Req *r) {
        ApiError e = { 0 };
        Upload *u = upload_take(r, true, &e);
        if (!u)
                return reply_error(r, &e);
        upload_drop(r->app->cfg, u);
        return reply_json(r, 200, json_pack("{s:s,s:b}", "uploadId", r->route.upload_id, "aborted", true));
}

/* ---- archives in parts ---- */

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

#define UNPACK_RATIO 4u
#define UNPACK_ENTRIES_MAX 100000u

static enum MHD_Result archive_commit(Req *r, Upload *u) {
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        /* Every part up to the last, each whole but the last. */
        size_t n = 0;
        for (size_t i = 0; i < u->max_parts; i++)
                if (u->received[i])
                        n = i + 1;
        for (size_t i = 0; i < n; i++)
                if (u->received[i] != 1 && !(i + 1 == n && u->received[i] == 2)) {
                        pthread_mutex_lock(&uploads_lock);
                        u->busy = false;
                        pthread_mutex_unlock(&uploads_lock);
                        api_error(&e, 409, "conflict", "send every part in order, then commit",
                                  "the part at %zu is missing or short", i * (size_t)UPLOAD_CHUNK);
                        return reply_error(r, &e);
                }
        struct stat st;
        if (n == 0 || fstat(u->fd, &st) < 0) {
                pthread_mutex_lock(&uploads_lock);
                u->busy = false;
                pthread_mutex_unlock(&uploads_lock);
                api_error(&e, 409, "conflict", "send the archive's parts, then commit", "no part has arrived");
                return reply_error(r, &e);
        }
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0) {
                upload_drop(cfg, u);
                return reply_error(r, &e);
        }
        uint64_t max = (uint64_t)cfg->max_file_mib * 1024u * 1024u;
        _cleanup_json_ json_t *req = agent_req_unarchive(u->path, max * UNPACK_RATIO, UNPACK_ENTRIES_MAX);
        ChanStream *s = NULL;
        if (!req || api_req_set_user(req, sb, u->user) < 0 || api_open_stream(sb, req, &s, &e) < 0) {
                sandbox_release(sb);
                upload_drop(cfg, u);
                return e.code ? reply_error(r, &e) : reply_internal(r);
        }
        /* A refused member ends the unpack before all is sent: its answer
         * still comes, so a failed send is not the error. */
        (void)send_staged(u->fd, (uint64_t)st.st_size, s);
        _cleanup_json_ json_t *res = NULL;
        int sock = req_socket(r);
        int rc = agent_wait_result(s, COMMIT_TIMEOUT_MS, client_left, &sock, &res);
        chan_stream_free(s);
        sandbox_release(sb);
        char path[REQ_MAX_PATH + 1];
        snprintf(path, sizeof(path), "%s", u->path);
        upload_drop(cfg, u);
        if (rc == -ECANCELED)
                return MHD_NO;
        if (rc < 0) {
                api_error(&e, 409, "conflict", "begin the upload again", "the sandbox did not take the archive");
                return reply_error(r, &e);
        }
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
        ReqUser as;
        if (request_parse_user(user, &as, &e) < 0)
                return reply_error(r, &e);
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0)
                return reply_error(r, &e);
        sandbox_release(sb);
        size_t max_parts = (size_t)(((uint64_t)cfg->max_file_mib * 1024u * 1024u + UPLOAD_CHUNK - 1) / UPLOAD_CHUNK);
        char id[HTTP_UPLOAD_ID_LEN + 1];
        _cleanup_free_ char *staged = NULL;
        int fd = -1;
        if (stage_new(r, 0, id, &staged, &fd) < 0)
                return reply_internal(r);
        uint8_t *received = calloc(max_parts ? max_parts : 1, 1);
        if (!received) {
                close(fd);
                unlink(staged);
                return reply_internal(r);
        }
        Upload proto = { .used = true, .fd = fd, .mode = 0644, .received = received, .max_parts = max_parts,
                         .archive = true, .user = as, .path = TAKE_PTR(path) };
        return upload_register(r, &proto, id, staged);
}
