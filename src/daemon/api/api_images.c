/* GET /v1/images and POST /v1/images/{name}:build (the image builder runs as
 * a child process; its output is streamed as NDJSON). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/manager/images.h"
#include "daemon/api/api_images.h"
#include "common/log.h"
#include "daemon/http/request.h"

#define MAX_LINE 4096

/* The built-in images as "images", and the owner's own as a page of
 * "data" with its "nextCursor" (the published client's list). */
enum MHD_Result handle_images(Req *r) {
        json_t *images = api_images_json(r->app->cfg);
        json_t *body = images ? json_pack("{s:o}", "images", images) : NULL;
        if (!body)
                return reply_internal(r);
        ApiError e = { 0 };
        if (api_user_images_page(r, body, &e) < 0) {
                json_decref(body);
                return reply_error(r, &e);
        }
        return reply_json(r, 200, body);
}

typedef struct Build {
        char rid[24];
        App *app;
        char name[65];
        pid_t pid;
        int fd; /* the builder's stdout+stderr */
        int sock;
        char line[MAX_LINE + 1];
        size_t line_len;
        char *out;
        size_t out_len, out_off;
        bool done;
        bool reaped;
} Build;

static void push(Build *b, json_t *j) {
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!s)
                return;
        size_t len = strlen(s);
        if (b->out_off == b->out_len)
                b->out_off = b->out_len = 0;
        char *n = realloc(b->out, b->out_len + len + 1);
        if (n) {
                b->out = n;
                memcpy(b->out + b->out_len, s, len);
                b->out[b->out_len + len] = '\n';
                b->out_len += len + 1;
        }
        free(s);
}

static void push_log(Build *b, const char *text, size_t len) {
        char *clean = malloc(len * 3 + 1);
        if (!clean)
                return;
        /* Builder output is ours but may hold any bytes: keep JSON valid. */
        size_t o = 0;
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)text[i];
                clean[o++] = c >= 0x20 && c < 0x7f ? (char)c : (c == '\t' ? ' ' : '?');
        }
        clean[o] = '\0';
        push(b, json_pack("{s:s,s:s}", "type", "log", "line", clean));
        free(clean);
}

static void build_finish(Build *b) {
        int status = 0;
        while (waitpid(b->pid, &status, 0) < 0 && errno == EINTR)
                ;
        b->reaped = true;
        b->done = true;
        if (b->line_len)
                push_log(b, b->line, b->line_len);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
                log_info(b->rid, "image %s built", b->name);
                ImageInfo info;
                json_t *img = image_info(b->app->cfg, b->name, &info) == 0 ? api_image_json(&info) : NULL;
                push(b, json_pack("{s:s,s:o}", "type", "done", "image", img ? img : json_null()));
        } else {
                log_warn(b->rid, "image build of %s failed (status %d)", b->name, status);
                ApiError e;
                api_error(&e, 503, "unavailable", "the log lines above say what failed",
                          "building the image %s failed", b->name);
                push(b, json_pack("{s:s,s:o}", "type", "error", "error", api_error_json(&e, b->rid)));
        }
}

static ssize_t build_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        Build *b = cls;
        for (;;) {
                if (b->out_off < b->out_len) {
                        size_t n = b->out_len - b->out_off;
                        if (n > max)
                                n = max;
                        memcpy(buf, b->out + b->out_off, n);
                        b->out_off += n;
                        return (ssize_t)n;
                }
                if (b->done)
                        return MHD_CONTENT_READER_END_OF_STREAM;
                struct pollfd p = { .fd = b->fd, .events = POLLIN };
                int n = poll(&p, 1, 500);
                if (n == 0) {
                        if (socket_hung_up(b->sock))
                                return MHD_CONTENT_READER_END_WITH_ERROR;
                        continue;
                }
                char tmp[4096];
                ssize_t got = read(b->fd, tmp, sizeof(tmp));
                if (got < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (got <= 0) {
                        build_finish(b);
                        continue;
                }
                for (ssize_t i = 0; i < got; i++) {
                        if (tmp[i] == '\n' || b->line_len == MAX_LINE) {
                                push_log(b, b->line, b->line_len);
                                b->line_len = 0;
                                if (tmp[i] == '\n')
                                        continue;
                        }
                        b->line[b->line_len++] = tmp[i];
                }
        }
}

/* Seconds the builder gets to clean up after a SIGTERM before SIGKILL. */
#define BUILD_STOP_GRACE_MS 5000

static void build_free(void *cls) {
        Build *b = cls;
        if (!b->reaped && b->pid > 0) {
                /* The client left: stop the build (its process group). */
                log_info(b->rid, "client left during the build of %s: stopping it", b->name);
                int st = image_build_stop(b->pid, BUILD_STOP_GRACE_MS);
                log_info(b->rid, "build of %s stopped (status %d)", b->name, st);
        }
        if (b->fd >= 0)
                close(b->fd);
        atomic_store(&b->app->building, false);
        free(b->out);
        free(b);
}

enum MHD_Result handle_image_build(Req *r) {
        ApiError e = { 0 };
        const char *force = req_query(r, "force");
        bool forced = force && (strcmp(force, "1") == 0 || strcmp(force, "true") == 0);
        if (force && !forced && strcmp(force, "0") != 0 && strcmp(force, "false") != 0) {
                api_error(&e, 400, "invalid_request", NULL, "force must be 1 or 0");
                return reply_error(r, &e);
        }
        if (strcmp(r->route.image, "default") != 0 && strcmp(r->route.image, "analysis") != 0 &&
            strcmp(r->route.image, "minimal") != 0 && strcmp(r->route.image, "desktop") != 0) {
                api_error(&e, 404, "not_found",
                          "the image recipes are \"default\", \"minimal\", \"analysis\" and \"desktop\"",
                          "no image recipe %s",
                          r->route.image);
                return reply_error(r, &e);
        }
        if (atomic_exchange(&r->app->building, true)) {
                api_error(&e, 409, "conflict", "wait for the running build to finish", "an image build is running");
                return reply_error(r, &e);
        }
        Build *b = calloc(1, sizeof(*b));
        int pipefd[2] = { -1, -1 };
        if (!b || pipe2(pipefd, O_CLOEXEC) < 0) {
                free(b);
                atomic_store(&r->app->building, false);
                return reply_internal(r);
        }
        b->app = r->app;
        b->fd = pipefd[0];
        b->sock = req_socket(r);
        snprintf(b->rid, sizeof(b->rid), "%s", r->rid);
        snprintf(b->name, sizeof(b->name), "%s", r->route.image);
        const DaemonConfig *cfg = r->app->cfg;
        /* The microVM's parts after the root filesystem: a create never
         * builds them (docs/microvm.md). The desktop image gets none: its
         * browser and desktop are not offered on the microVM
         * (docs/computer-use.md). */
        bool microvm = false;
        for (unsigned i = 0; i < cfg->n_drivers; i++)
                microvm = microvm || (cfg->drivers[i].driver == &driver_microvm && cfg->drivers[i].offered);
        if (strcmp(b->name, "desktop") == 0)
                microvm = false;
        pid_t pid;
        int rc = image_build_start(cfg, b->name, forced, microvm ? cfg->microvm_builder : NULL, pipefd[1], &pid);
        if (rc < 0) {
                log_error(r->rid, "starting the image builder %s: %s", cfg->image_builder, strerror(-rc));
                close(pipefd[0]);
                close(pipefd[1]);
                free(b);
                atomic_store(&r->app->building, false);
                return reply_internal(r);
        }
        close(pipefd[1]);
        b->pid = pid;
        log_info(r->rid, "building image %s%s (pid %d)", b->name, forced ? " (forced)" : "", (int)pid);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, build_reader, b, build_free);
        if (!resp) {
                build_free(b);
                return reply_internal(r);
        }
        return reply_response(r, 200, resp, "application/x-ndjson");
}
