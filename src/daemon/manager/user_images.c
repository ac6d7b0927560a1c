/* The images users build (user_images.h): records, context chunks, the
 * queue and the builds themselves. */
#include "daemon/manager/user_images.h"
#include "daemon/manager/user_images-internal.h"
#include "daemon/manager/context_digest.h"

#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/io.h"
#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/manager/images.h"
#include "daemon/model/image_start.h"
#include "daemon/manager/oci_pull.h"
#include "daemon/manager/sandbox.h"
#include "daemon/manager/snapshot.h"
#include "proto/proto.h"

/* Where the context is unpacked inside the build's sandbox; removed before
 * the image's disk is taken. */
#define CONTEXT_IN_SANDBOX "/.runtime-build-context"
/* A COPY --from's files: gathered in the earlier stage's sandbox, then
 * unpacked in this one; both removed before a disk is taken. */
#define STAGE_OUT "/.runtime-stage-out"
#define FROM_IN_SANDBOX "/.runtime-build-from"
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

void image_build_request_done(ImageBuildRequest *r) {
        if (!r)
                return;
        dockerfile_done(&r->dockerfile);
        free(r->name);
        free(r->target);
        json_decref(r->tags);
        json_decref(r->labels);
        json_decref(r->build_args);
        json_decref(r->env);
        json_decref(r->chunks);
        json_decref(r->start);
        json_decref(r->network);
        json_decref(r->recipe);
        free(r->recipe_dockerfile);
        json_decref(r->secrets);
        if (r->import_path)
                unlink(r->import_path);
        free(r->import_path);
        *r = (ImageBuildRequest){ 0 };
}

bool user_images_name_ok(const char *s) {
        if (!s || !(islower((unsigned char)s[0]) || isdigit((unsigned char)s[0])))
                return false;
        size_t n = 0;
        for (; s[n]; n++)
                if (!islower((unsigned char)s[n]) && !isdigit((unsigned char)s[n]) && !strchr("_.-/", s[n]))
                        return false;
        return n <= 128 && !strstr(s, "//") && s[n - 1] != '/';
}

bool user_images_tag_ok(const char *s) {
        if (!s || !(isalnum((unsigned char)s[0]) || s[0] == '_'))
                return false;
        size_t n = 0;
        for (; s[n]; n++)
                if (!isalnum((unsigned char)s[n]) && !strchr("_.-", s[n]))
                        return false;
        return n <= 128;
}

bool user_images_id_ok(const char *s) {
        if (strlen(s) != IMAGE_ID_LEN)
                return false;
        for (size_t i = 0; i < IMAGE_ID_LEN; i++) {
                bool dash = i == 8 || i == 13 || i == 18 || i == 23;
                if (dash ? s[i] != '-' : !isxdigit((unsigned char)s[i]))
                        return false;
        }
        return true;
}

static int new_uuid(char ret[IMAGE_ID_LEN + 1]) {
        uint8_t b[16];
        int r = random_bytes(b, sizeof b);
        if (r < 0)
                return r;
        b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
        b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
        char hex[33];
        hex_encode(b, sizeof b, hex);
        snprintf(ret, IMAGE_ID_LEN + 1, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16, hex + 20);
        return 0;
}

int user_images_open(const StoreBackend *b, const char *location, const char *state_dir, UserImages **ret) {
        if (!b->images)
                return -EOPNOTSUPP;
        UserImages *u = calloc(1, sizeof(*u));
        if (!u)
                return -ENOMEM;
        u->ops = b->images;
        pthread_mutex_init(&u->lock, NULL);
        pthread_cond_init(&u->cond, NULL);
        int r = -ENOMEM;
        if (asprintf(&u->dir, "%s/user-images", state_dir) < 0 || asprintf(&u->ctx_dir, "%s/image-context", state_dir) < 0)
                goto fail;
        if ((mkdir(u->dir, 0700) < 0 && errno != EEXIST) || (mkdir(u->ctx_dir, 0700) < 0 && errno != EEXIST)) {
                r = -errno;
                goto fail;
        }
        if ((r = u->ops->open(location, &u->h)) < 0)
                goto fail;
        *ret = u;
        return 0;
fail:
        free(u->dir);
        free(u->ctx_dir);
        free(u);
        return r;
}

void user_images_set_manager(UserImages *u, const struct DaemonConfig *cfg, Manager *m, SnapshotStore *snapshots) {
        u->cfg = cfg;
        u->m = m;
        u->snapshots = snapshots;
}

void user_images_set_host(UserImages *u, const char *host_id, bool fleet) {
        snprintf(u->host_id, sizeof u->host_id, "%s", host_id ? host_id : "");
        u->fleet = fleet;
}

/* ---- the owners' counts (under lock) ---- */

OwnerCount *owner_count(UserImages *u, const char *owner, bool make) {
        for (size_t i = 0; i < u->n_owners; i++)
                if (strcmp(u->owners[i].owner, owner) == 0)
                        return &u->owners[i];
        if (!make)
                return NULL;
        OwnerCount *n = realloc(u->owners, (u->n_owners + 1) * sizeof(*n));
        if (!n)
                return NULL;
        u->owners = n;
        OwnerCount *c = &u->owners[u->n_owners++];
        *c = (OwnerCount){ 0 };
        snprintf(c->owner, sizeof c->owner, "%s", owner);
        return c;
}

/* ---- a build ---- */


int build_fail(Build *b, const char *fmt, ...) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (b->cur)
                snprintf(b->error, sizeof b->error, "step %u/%u (line %u, %s): %s", b->step, b->n_steps, b->cur->line,
                         dockerfile_op_name(b->cur->op), msg);
        else
                snprintf(b->error, sizeof b->error, "%s", msg);
        return -EINVAL;
}

const char *build_var_lookup(void *userdata, const char *name) {
        Build *b = userdata;
        const char *v = json_string_value(json_object_get(b->env, name));
        return v ? v : json_string_value(json_object_get(b->vars, name));
}

static int expand(Build *b, const char *word, char **ret) {
        DockerfileError e = { 0 };
        int r = dockerfile_expand(word, build_var_lookup, b, ret, &e);
        return r < 0 ? build_fail(b, "%s", e.message) : 0;
}

json_t *build_step_env(Build *b) {
        json_t *env = json_pack("{s:s}", "PATH", DEFAULT_PATH);
        if (!env)
                return NULL;
        json_object_update(env, b->vars);
        json_object_update(env, b->env);
        return env;
}

/* Whether the daemon is stopping: a build in progress gives up at its next
 * second of waiting, so that a stop never waits for a build's end. */
static bool stopping(UserImages *u) {
        pthread_mutex_lock(&u->lock);
        bool s = u->stopping;
        pthread_mutex_unlock(&u->lock);
        return s;
}

int build_run_in_sandbox(Build *b, json_t *argv, json_t *env, const char *cwd, bool root, bool quiet, bool sync,
                          int64_t timeout_ms, int *ret_code) {
        Sandbox *sb = NULL;
        SandboxError se;
        if (sandbox_acquire(b->u->m, &b->job->key, b->sandbox_id, &sb, &se) < 0)
                return build_fail(b, "the build's sandbox is gone: %s", se.message);
        /* Under the step's env, the sandbox's own (the egress proxy's
         * variables), as under an exec's: its network is the build's. */
        _cleanup_json_ json_t *base = sandbox_env(sb);
        _cleanup_json_ json_t *all = base ? json_deep_copy(base) : json_object();
        _cleanup_json_ json_t *req = all && json_object_update(all, env) == 0
                                             ? agent_req_exec(NULL, argv, cwd, all, timeout_ms, false) : NULL;
        ChanStream *s = NULL;
        int r = req ? agent_req_set_user(req, root) : -ENOMEM;
        if (r == 0 && sync && json_object_set_new(req, "syncAfter", json_true()) < 0)
                r = -ENOMEM;
        if (r == 0 && sandbox_open_stream(sb, req, &s, &se) < 0)
                r = build_fail(b, "could not run it: %s", se.message);
        int code = -1;
        bool timed_out = false;
        while (r == 0) {
                ChanEvent ev;
                int n = chan_stream_next(s, 1000, &ev);
                if (n == -ETIMEDOUT) {
                        if (stopping(b->u)) {
                                r = build_fail(b, "the daemon stopped during the build");
                                break;
                        }
                        continue;
                }
                if (n < 0 || ev.type == CHAN_EV_CLOSED) {
                        if (n == 0)
                                chan_event_clear(&ev);
                        r = stopping(b->u) ? build_fail(b, "the daemon stopped during the build")
                                           : build_fail(b, "the build's sandbox stopped answering");
                        break;
                }
                if (ev.type == CHAN_EV_DATA && (ev.fd == PROTO_FD_OUT || ev.fd == PROTO_FD_ERR) && !quiet) {
                        if (build_log_output(b->log, ev.fd, ev.data, ev.len) == -EFBIG)
                                r = build_fail(b, "the build log passed its bound of %u MiB", USER_IMAGES_LOG_MAX >> 20);
                } else if (ev.type == CHAN_EV_RESULT) {
                        const char *msg = NULL;
                        const char *err = agent_result_error(ev.json, &msg);
                        if (err)
                                r = build_fail(b, "%s", msg ? msg : err);
                        code = (int)json_integer_value(json_object_get(ev.json, "exitCode"));
                        timed_out = json_is_true(json_object_get(ev.json, "timedOut"));
                        chan_event_clear(&ev);
                        break;
                }
                chan_event_clear(&ev);
        }
        chan_stream_free(s);
        sandbox_release(sb);
        if (r == 0 && build_log_flush(b->log) == -EFBIG)
                r = build_fail(b, "the build log passed its bound of %u MiB", USER_IMAGES_LOG_MAX >> 20);
        if (r == 0 && timed_out)
                r = build_fail(b, "the build's time ran out");
        if (r == 0)
                *ret_code = code;
        return r;
}

/* The context's chunks, joined and checked against its digest and size,
 * unpacked into the sandbox by its agent (bounded; names and links that
 * leave it refused). */
static int send_context(Build *b) {
        const ImageBuildRequest *req = &b->job->req;
        if (!req->chunks)
                return 0;
        _cleanup_free_ char *dir = build_owner_dir(b->u, b->job->key.owner, false);
        if (!dir)
                return build_fail(b, "out of memory");
        Sandbox *sb = NULL;
        SandboxError se;
        if (sandbox_acquire(b->u->m, &b->job->key, b->sandbox_id, &sb, &se) < 0)
                return build_fail(b, "the build's sandbox is gone: %s", se.message);
        _cleanup_json_ json_t *un = agent_req_unarchive(CONTEXT_IN_SANDBOX, USER_IMAGES_CONTEXT_UNPACKED,
                                                       USER_IMAGES_CONTEXT_FILES);
        ChanStream *s = NULL;
        int r = un ? agent_req_set_user(un, true) : -ENOMEM;
        if (r == 0 && sandbox_open_stream(sb, un, &s, &se) < 0)
                r = build_fail(b, "could not send the build context: %s", se.message);
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        if (r == 0 && (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1))
                r = build_fail(b, "out of memory");
        int64_t total = 0;
        size_t i;
        json_t *v;
        char *buf = r == 0 ? malloc(USER_IMAGES_CHUNK_MAX) : NULL;
        if (r == 0 && !buf)
                r = build_fail(b, "out of memory");
        json_array_foreach(req->chunks, i, v) {
                if (r < 0)
                        break;
                char p[PATH_MAX];
                snprintf(p, sizeof p, "%s/%s", dir, json_string_value(v));
                _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC);
                if (fd < 0) {
                        r = build_fail(b, "the build context's chunk %.16s... was never uploaded", json_string_value(v));
                        break;
                }
                ssize_t n = read(fd, buf, USER_IMAGES_CHUNK_MAX);
                if (n < 0) {
                        r = build_fail(b, "could not read the build context");
                        break;
                }
                total += n;
                if (total > req->context_size || total > (int64_t)USER_IMAGES_CONTEXT_MAX) {
                        r = build_fail(b, "the build context is larger than it said (%lld bytes)",
                                       (long long)req->context_size);
                        break;
                }
                EVP_DigestUpdate(md, buf, (size_t)n);
                if (chan_stream_write(s, buf, (size_t)n, 60000) < 0)
                        r = build_fail(b, "the build's sandbox took no more of the build context");
        }
        free(buf);
        if (r == 0) {
                uint8_t d[32];
                unsigned dl = 0;
                char hex[65];
                EVP_DigestFinal_ex(md, d, &dl);
                hex_encode(d, 32, hex);
                if (total != req->context_size || strcmp(hex, req->context_sha256) != 0)
                        r = build_fail(b, "the build context's chunks do not make the archive it names (its sha256 "
                                          "or size differs)");
        }
        EVP_MD_CTX_free(md);
        if (r == 0 && chan_stream_close_write(s) < 0)
                r = build_fail(b, "the build's sandbox took no more of the build context");
        if (r == 0) {
                _cleanup_json_ json_t *res = NULL;
                if (agent_wait_result(s, 300000, NULL, NULL, &res) < 0)
                        r = build_fail(b, "the build's sandbox did not unpack the build context");
                else {
                        const char *msg = NULL;
                        /* An unarchive answers like an exec: a refusal is
                         * its exit code, the reason its stderr. */
                        if (agent_result_error(res, &msg) || json_integer_value(json_object_get(res, "exitCode")) != 0) {
                                const char *why = json_string_value(json_object_get(res, "stderrHead"));
                                r = build_fail(b, "the build context was refused: %s",
                                               why && *why ? why : msg ? msg : "it is not a tar archive");
                        }
                }
        }
        chan_stream_free(s);
        sandbox_release(sb);
        return r;
}

static char *path_join(const char *dir, const char *p) {
        char *out = NULL;
        if (p[0] == '/')
                return strdup(p);
        return asprintf(&out, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", p) < 0 ? NULL : out;
}

/* COPY and ADD from the context: the sources (cleaned, never out of the
 * context; wildcards matched by the sandbox's shell) copied by the sandbox
 * as Docker copies them, then given --chown and --chmod. */
static const char COPY_SCRIPT[] =
        "set -e\n"
        "d=$1; dir=$2; shift 2\n"
        "IFS='\n'\n"
        "n=0\n"
        "for s in \"$@\"; do found=0; for f in $s; do [ -e \"$f\" ] || continue; found=1; n=$((n+1)); done\n"
        "  [ $found = 1 ] || { echo \"${s#" CONTEXT_IN_SANDBOX "/}: no such file in the build context\" >&2; exit 3; }\n"
        "done\n"
        "own() { if [ -n \"$CHOWN\" ]; then chown -R -- \"$CHOWN\" \"$1\"; fi;"
        " if [ -n \"$CHMOD\" ]; then chmod -R \"$CHMOD\" \"$1\"; fi; }\n"
        "into() { mkdir -p \"$2\"; for e in \"$1\"/* \"$1\"/.[!.]* \"$1\"/..?*; do [ -e \"$e\" ] || continue;"
        " cp -a \"$e\" \"$2\"/; own \"$2/${e##*/}\"; done; }\n"
        "for s in \"$@\"; do for f in $s; do [ -e \"$f\" ] || continue\n"
        "  if [ -d \"$f\" ]; then into \"$f\" \"$d\"\n"
        "  elif [ \"$dir\" = 1 ] || [ $n -gt 1 ]; then mkdir -p \"$d\"; cp -a \"$f\" \"$d\"/; own \"$d/${f##*/}\"\n"
        "  else mkdir -p \"$(dirname \"$d\")\"; if [ -d \"$d\" ]; then cp -a \"$f\" \"$d\"/; own \"$d/${f##*/}\";"
        " else cp -a \"$f\" \"$d\"; own \"$d\"; fi\n"
        "  fi\n"
        "done; done\n";

static int stage_run(Build *b);
static void global_args(Build *b);

void build_drop_sandbox(Build *b) {
        SandboxError se;
        if (b->sandbox_id[0] && sandbox_delete(b->u->m, &b->job->key, b->sandbox_id, b->job->rid, &se) < 0)
                log_warn(b->job->rid, "image %s: deleting the build's sandbox %s: %s", b->job->id, b->sandbox_id,
                         se.message);
        b->sandbox_id[0] = '\0';
}

void build_state_free(Build *b) {
        json_decref(b->vars);
        json_decref(b->env);
        json_decref(b->config);
        free(b->workdir);
        free(b->base);
        free(b->base_snap);
        free(b->layer_snap);
        json_decref(b->pending_dirs);
}

/* The earlier stage st, built once (in a sandbox of its own, kept until
 * the image's end) the first time a COPY --from names it. */
static int stage_built(Build *b, int st, Build **ret) {
        if (b->stages[st]) {
                *ret = b->stages[st];
                return 0;
        }
        Build *o = calloc(1, sizeof(*o));
        if (!o)
                return build_fail(b, "out of memory");
        *o = (Build){ .u = b->u, .job = b->job, .log = b->log, .stages = b->stages, .stage = st,
                      .deadline_ms = b->deadline_ms };
        o->vars = json_object();
        o->env = json_object();
        o->config = json_pack("{s:{},s:[]}", "labels", "exposedPorts");
        o->workdir = strdup("/");
        b->stages[st] = o;
        if (!o->vars || !o->env || !o->config || !o->workdir)
                return build_fail(b, "out of memory");
        global_args(o);
        int r = stage_run(o);
        build_log_sys(b->log, "stage %d %s", st, r < 0 ? "failed" : "built");
        if (r < 0) {
                snprintf(b->error, sizeof b->error, "%s", o->error);
                return r;
        }
        *ret = o;
        return 0;
}

/* What `from` gathered in STAGE_OUT, as a tar from its agent to the agent
 * of `to`, unpacked in FROM_IN_SANDBOX (bounded as a context is). */
static int stage_transfer(Build *b, Build *from) {
        Sandbox *src = NULL, *dst = NULL;
        SandboxError se;
        if (sandbox_acquire(b->u->m, &b->job->key, from->sandbox_id, &src, &se) < 0 ||
            sandbox_acquire(b->u->m, &b->job->key, b->sandbox_id, &dst, &se) < 0) {
                if (src)
                        sandbox_release(src);
                return build_fail(b, "a build's sandbox is gone: %s", se.message);
        }
        _cleanup_json_ json_t *none = json_array();
        _cleanup_json_ json_t *ar = none ? agent_req_archive(STAGE_OUT, false, none) : NULL;
        _cleanup_json_ json_t *un = agent_req_unarchive(FROM_IN_SANDBOX, USER_IMAGES_CONTEXT_UNPACKED,
                                                       USER_IMAGES_CONTEXT_FILES);
        ChanStream *out = NULL, *in = NULL;
        int r = ar && un && agent_req_set_user(ar, true) == 0 && agent_req_set_user(un, true) == 0 ? 0 : -ENOMEM;
        if (r == 0 && (sandbox_open_stream(src, ar, &out, &se) < 0 || sandbox_open_stream(dst, un, &in, &se) < 0))
                r = build_fail(b, "could not copy from stage %d: %s", from->stage, se.message);
        else if (r < 0)
                r = build_fail(b, "out of memory");
        bool ended = false;
        while (r == 0 && !ended) {
                ChanEvent ev;
                int n = chan_stream_next(out, 1000, &ev);
                if (n == -ETIMEDOUT) {
                        if ((int64_t)time_now_mono_ms() > b->deadline_ms)
                                r = build_fail(b, "the build's time ran out");
                        continue;
                }
                if (n < 0 || ev.type == CHAN_EV_CLOSED)
                        r = build_fail(b, "stage %d's sandbox stopped answering", from->stage);
                else if (ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_OUT) {
                        if (chan_stream_write(in, ev.data, ev.len, 60000) < 0)
                                r = build_fail(b, "the build's sandbox took no more of stage %d's files", from->stage);
                } else if (ev.type == CHAN_EV_RESULT) {
                        ended = true;
                        if (agent_result_error(ev.json, NULL) || json_integer_value(json_object_get(ev.json, "exitCode")))
                                r = build_fail(b, "stage %d's files could not be read", from->stage);
                }
                if (n == 0)
                        chan_event_clear(&ev);
        }
        if (r == 0 && chan_stream_close_write(in) < 0)
                r = build_fail(b, "the build's sandbox took no more of stage %d's files", from->stage);
        if (r == 0) {
                _cleanup_json_ json_t *res = NULL;
                if (agent_wait_result(in, 300000, NULL, NULL, &res) < 0 || agent_result_error(res, NULL) ||
                    json_integer_value(json_object_get(res, "exitCode")))
                        r = build_fail(b, "stage %d's files could not be unpacked", from->stage);
        }
        chan_stream_free(out);
        chan_stream_free(in);
        sandbox_release(src);
        sandbox_release(dst);
        return r;
}

/* COPY --from=stage: each source gathered in that stage's sandbox under
 * STAGE_OUT/<n>/ (its wildcards matched there), moved here, then copied
 * as a copy from the context is. The sources' paths: cleaned of "..". */
static const char GATHER_SCRIPT[] = "set -e\n"
                                    "rm -rf " STAGE_OUT "\n"
                                    "n=0\n"
                                    "for s in \"$@\"; do mkdir -p " STAGE_OUT "/$n\n"
                                    "  found=0; for f in $s; do [ -e \"$f\" ] || continue; found=1;"
                                    " cp -a \"$f\" " STAGE_OUT "/$n/; done\n"
                                    "  [ $found = 1 ] || { echo \"$s: no such file in the stage\" >&2; exit 3; }\n"
                                    "  n=$((n+1))\n"
                                    "done\n";

static int copy_from_stage(Build *b, const DockerfileStep *s, json_t *argv) {
        int st = dockerfile_stage(&b->job->req.dockerfile, s->from);
        _cleanup_(build_image_source_free) Build *img = NULL;
        Build *o = NULL;
        int r = s->from_image ? build_image_source(b, s->from, &img)
                : st < 0      ? build_fail(b, "COPY --from=%.64s names no stage", s->from)
                              : stage_built(b, st, &o);
        if (r < 0)
                return r;
        o = img ? img : o;
        _cleanup_json_ json_t *gather = json_pack("[s,s,s,s]", "/bin/sh", "-c", GATHER_SCRIPT, "gather");
        if (!gather)
                return -ENOMEM;
        for (size_t i = 0; i + 1 < s->n_words; i++) {
                _cleanup_free_ char *src = NULL, *clean = NULL, *full = NULL, *here = NULL;
                if ((r = expand(b, s->words[i], &src)) < 0)
                        return r;
                /* An absolute path of the stage's: ".." above its root stays at its root. */
                if (dockerfile_context_path(src, &clean) < 0)
                        return build_fail(b, "%.200s leaves the stage's root", src);
                const char *base = strrchr(clean, '/') ? strrchr(clean, '/') + 1 : clean;
                bool wild = strpbrk(clean, "*?[") != NULL;
                if (asprintf(&full, "/%s", clean) < 0 ||
                    asprintf(&here, "%s/%zu/%s", FROM_IN_SANDBOX, i, wild || !*base ? "*" : base) < 0)
                        return -ENOMEM;
                json_array_append_new(gather, json_string(full));
                json_array_append_new(argv, json_string(here));
        }
        _cleanup_json_ json_t *env = json_pack("{s:s}", "PATH", DEFAULT_PATH);
        int code = 0;
        /* The gathering runs in the stage's sandbox, its output in this log. */
        if ((r = build_run_in_sandbox(o, gather, env, "/", true, false, false, 600000, &code)) < 0) {
                snprintf(b->error, sizeof b->error, "%s", o->error);
                return r;
        }
        if (code != 0)
                return build_fail(b, "COPY --from=%.64s: a source is not in the %s (exit code %d)", s->from,
                                  img ? "image" : "stage", code);
        _cleanup_json_ json_t *rm = json_pack("[s,s,s]", "rm", "-rf", FROM_IN_SANDBOX);
        if ((r = build_run_in_sandbox(b, rm, env, "/", true, true, false, 60000, &code)) < 0)
                return r;
        return stage_transfer(b, o);
}

/* The sources of a COPY or ADD from the context, expanded and cleaned,
 * as paths of the sandbox, appended to argv. */
static int context_sources(Build *b, const DockerfileStep *s, json_t *argv) {
        for (size_t i = 0; i + 1 < s->n_words; i++) {
                _cleanup_free_ char *src = NULL, *clean = NULL, *full = NULL;
                int r = expand(b, s->words[i], &src);
                if (r < 0)
                        return r;
                r = dockerfile_context_path(src, &clean);
                if (r == -EPERM)
                        return build_fail(b, "%.200s is outside the build context", src);
                if (r < 0 || asprintf(&full, "%s%s%s", CONTEXT_IN_SANDBOX, clean[0] ? "/" : "", clean) < 0)
                        return -ENOMEM;
                if (json_array_append_new(argv, json_string(full)) < 0)
                        return -ENOMEM;
        }
        return 0;
}

/* The context's archive, chunk by chunk as the client uploaded it, its
 * size and SHA-256 checked as it is read. */
typedef struct ChunkReader {
        const char *dir;
        const ImageBuildRequest *req;
        size_t next;
        uint8_t *buf;
        int64_t total;
        EVP_MD_CTX *md;
} ChunkReader;

static ssize_t chunk_read(void *userdata, const void **ret_buf) {
        ChunkReader *c = userdata;
        if (c->next >= json_array_size(c->req->chunks)) {
                uint8_t d[32];
                unsigned dl = 0;
                char hex[65];
                if (EVP_DigestFinal_ex(c->md, d, &dl) != 1)
                        return -EIO;
                hex_encode(d, 32, hex);
                return c->total == c->req->context_size && strcmp(hex, c->req->context_sha256) == 0 ? 0 : -EBADMSG;
        }
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", c->dir, json_string_value(json_array_get(c->req->chunks, c->next++)));
        _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -ENOENT;
        ssize_t n = read(fd, c->buf, USER_IMAGES_CHUNK_MAX);
        if (n < 0)
                return -EIO;
        c->total += n;
        if (c->total > c->req->context_size || c->total > (int64_t)USER_IMAGES_CONTEXT_MAX)
                return -EFBIG;
        EVP_DigestUpdate(c->md, c->buf, (size_t)n);
        *ret_buf = c->buf;
        return n;
}

int build_sources_digest(Build *b, const DockerfileStep *s, char ret_hex[65]) {
        _cleanup_json_ json_t *argv = json_array();
        if (!argv)
                return -ENOMEM;
        int r = context_sources(b, s, argv);
        if (r < 0)
                return r;
        /* Known from an earlier build of the same context and steps: the
         * archive is not read again. */
        char memo[65];
        if ((r = layer_sources_memo_key(b, argv, memo)) < 0)
                return r;
        if (sources_memo_get(b->u, memo, ret_hex))
                return 0;
        /* The sources as paths of the context (context_sources' less its
         * directory in the sandbox). */
        size_t n = json_array_size(argv), skip = strlen(CONTEXT_IN_SANDBOX);
        _cleanup_free_ const char **srcs = calloc(n ? n : 1, sizeof *srcs);
        if (!srcs)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const char *full = json_string_value(json_array_get(argv, i));
                srcs[i] = full + skip + (full[skip] == '/');
        }
        _cleanup_free_ char *dir = build_owner_dir(b->u, b->job->key.owner, false);
        ChunkReader c = { .dir = dir, .req = &b->job->req, .buf = malloc(USER_IMAGES_CHUNK_MAX), .md = EVP_MD_CTX_new() };
        r = dir && c.buf && c.md && EVP_DigestInit_ex(c.md, EVP_sha256(), NULL) == 1 ? 0 : -ENOMEM;
        char why[256] = "";
        const ContextDigestLimits lim = { .max_bytes = USER_IMAGES_CONTEXT_UNPACKED,
                                          .max_entries = USER_IMAGES_CONTEXT_FILES };
        if (r == 0)
                r = context_digest(chunk_read, &c, srcs, n, &lim, ret_hex, why, sizeof why);
        free(c.buf);
        EVP_MD_CTX_free(c.md);
        if (r == -ENOMEM)
                return r;
        if (r == -ENOENT)
                return build_fail(b, "a chunk of the build context was never uploaded");
        if (r < 0)
                return build_fail(b, "the build context was refused: %s",
                                  r == -EBADMSG && !why[0] ? "its chunks do not make the archive it names" : why);
        sources_memo_put(b->u, memo, ret_hex);
        return 0;
}

static int step_copy(Build *b, const DockerfileStep *s) {
        if (!s->from && !b->job->req.chunks)
                return build_fail(b, "the build has no context to copy from (send context_dir)");
        _cleanup_json_ json_t *argv = json_pack("[s,s,s,s]", "/bin/sh", "-c", COPY_SCRIPT, "copy");
        _cleanup_free_ char *dest_x = NULL;
        int r = argv ? expand(b, s->words[s->n_words - 1], &dest_x) : -ENOMEM;
        if (r < 0)
                return r;
        _cleanup_free_ char *dest = path_join(b->workdir, dest_x);
        size_t dl = dest ? strlen(dest_x) : 0;
        if (!dest || json_array_append_new(argv, json_string(dest)) < 0 ||
            json_array_append_new(argv, json_string(dl && dest_x[dl - 1] == '/' ? "1" : "0")) < 0)
                return -ENOMEM;
        if (s->from) {
                if ((r = copy_from_stage(b, s, argv)) < 0)
                        return r;
        } else if ((r = context_sources(b, s, argv)) < 0)
                return r;
        _cleanup_json_ json_t *env = json_pack("{s:s}", "PATH", DEFAULT_PATH);
        _cleanup_free_ char *chown_x = NULL;
        if (s->chown && (r = expand(b, s->chown, &chown_x)) < 0)
                return r;
        if (!env || json_object_set_new(env, "CHOWN", json_string(chown_x ? chown_x : "")) < 0 ||
            json_object_set_new(env, "CHMOD", json_string(s->chmod ? s->chmod : "")) < 0)
                return -ENOMEM;
        int code = 0;
        if ((r = build_run_in_sandbox(b, argv, env, "/", true, false, false, 600000, &code)) < 0)
                return r;
        return code == 0 ? 0 : build_fail(b, "the copy failed (exit code %d); the log says why", code);
}

/* Docker's shell form: /bin/sh -c and the command line. */
void build_shell_form(json_t *argv, const char *line) {
        json_array_append_new(argv, json_string("/bin/sh"));
        json_array_append_new(argv, json_string("-c"));
        json_array_append_new(argv, json_string(line));
}

static int set_words_array(json_t *config, const char *key, const DockerfileStep *s) {
        json_t *a = json_array();
        if (!a)
                return -ENOMEM;
        if (s->exec)
                for (size_t i = 0; i < s->n_words; i++)
                        json_array_append_new(a, json_string(s->words[i]));
        else if (s->n_words)
                build_shell_form(a, s->words[0]);
        return json_object_set_new(config, key, a);
}

/* The build's sandbox at the last layer found (or at the FROM): one
 * started at another layer is replaced. */
static int sandbox_at_layer(Build *b) {
        const char *want = b->layer_snap ? b->layer_snap : "";
        if (b->sandbox_id[0] && strcmp(b->sandbox_layer, want) == 0)
                return 0;
        build_drop_sandbox(b);
        return build_stage_sandbox(b);
}

/* A WORKDIR step: the build's workdir joined with its path. */
static int take_workdir(Build *b, const DockerfileStep *s) {
        _cleanup_free_ char *w = NULL;
        int r = expand(b, s->words[0], &w);
        if (r < 0)
                return r;
        char *full = path_join(b->workdir, w);
        if (!full)
                return -ENOMEM;
        free(b->workdir);
        b->workdir = full;
        return 0;
}

/* A WORKDIR's directory, made as the user in force at that step. */
static int make_workdir(Build *b, const char *dir, bool root) {
        _cleanup_json_ json_t *argv = json_pack("[s,s,s]", "mkdir", "-p", dir);
        _cleanup_json_ json_t *env = json_pack("{s:s}", "PATH", DEFAULT_PATH);
        int code = 0;
        if (!argv || !env)
                return -ENOMEM;
        int r = build_run_in_sandbox(b, argv, env, "/", root, false, false, 60000, &code);
        if (r == 0 && code != 0)
                r = build_fail(b, "could not make %s", dir);
        return r;
}

/* The walk past the layers found ends: the sandbox at the last one, and
 * the WORKDIRs walked past since it made there. */
static int walk_end(Build *b) {
        b->walked = true;
        int r = sandbox_at_layer(b);
        size_t i;
        json_t *d;
        json_array_foreach(b->pending_dirs, i, d) {
                if (r < 0)
                        break;
                r = make_workdir(b, json_string_value(json_array_get(d, 0)), json_is_true(json_array_get(d, 1)));
        }
        json_array_clear(b->pending_dirs);
        return r;
}

/* Step s against the layers: its key chained on; a step with a layer
 * that is found is logged CACHED (1: the caller skips it). A WORKDIR has
 * no layer of its own (a directory is not worth a snapshot): walked past
 * (1), its directory is in the next layer found, or is made once the
 * sandbox starts at the last one (walk_end). At the first layer not found
 * the sandbox is at the last one found. A COPY --from ends the layers of
 * the stage (what it copies is another stage's), and so does a COPY whose
 * sources have no digest. 0: the caller runs the step. */
static int layer_step(Build *b, const DockerfileStep *s, const char *head) {
        if (b->layers && (s->from || ((s->op == DF_COPY || s->op == DF_ADD) && !b->job->req.chunks)))
                b->layers = false;
        int r;
        if (!b->layers || b->walked) {
                if ((r = walk_end(b)) < 0 || !b->layers)
                        return r;
        }
        if (s->op == DF_COPY || s->op == DF_ADD) {
                if ((r = build_sources_digest(b, s, b->sources_digest)) < 0)
                        return r;
        }
        if ((r = layer_chain_step(b, s)) < 0 || b->walked)
                return r;
        if (s->op == DF_WORKDIR) {
                if (!b->pending_dirs && !(b->pending_dirs = json_array()))
                        return -ENOMEM;
                if ((r = take_workdir(b, s)) < 0)
                        return r;
                return json_array_append_new(b->pending_dirs, json_pack("[s,b]", b->workdir, b->root)) < 0 ? -ENOMEM
                                                                                                           : 1;
        }
        if (!layer_step_keeps_layer(s))
                return 0;
        _cleanup_free_ char *snap = NULL;
        if (b->layers_lookup && layer_find(b, &snap) == 0) {
                build_log_sys(b->log, "CACHED step %u/%u: %s %s", b->step, b->n_steps, dockerfile_op_name(s->op), head);
                free(b->layer_snap);
                b->layer_snap = TAKE_PTR(snap);
                /* The layer holds the directories of the WORKDIRs before it. */
                json_array_clear(b->pending_dirs);
                return 1;
        }
        return walk_end(b);
}

static int run_steps(Build *b, int64_t deadline_ms) {
        const Dockerfile *d = &b->job->req.dockerfile;
        int stage = b->stage;
        /* The steps of the stage, counted for "step N/M". */
        size_t first = 0;
        b->n_steps = 0;
        for (size_t i = 0; i < d->n_steps; i++)
                if (d->steps[i].op == DF_FROM && d->steps[i].stage == (unsigned)stage)
                        first = i;
        size_t last_tree = 0;
        for (size_t i = first; i < d->n_steps && d->steps[i].stage == (unsigned)stage; i++) {
                if (i == first || d->steps[i].op != DF_FROM)
                        b->n_steps++;
                if (i > first && layer_step_has_tree(&d->steps[i]))
                        last_tree = i;
        }
        b->step = 1;
        for (size_t i = first + 1; i < d->n_steps && d->steps[i].stage == (unsigned)stage; i++) {
                const DockerfileStep *s = &d->steps[i];
                b->cur = s;
                b->step++;
                if (stopping(b->u))
                        return build_fail(b, "the daemon stopped during the build");
                b->log->step = b->step;
                char head[160];
                snprintf(head, sizeof head, "%s", s->n_words && s->words[0] ? s->words[0] : "");
                int r = layer_step(b, s, head);
                if (r == 1)
                        continue;
                if (r < 0)
                        return r == -ENOMEM ? build_fail(b, "out of memory") : r;
                build_log_sys(b->log, "step %u/%u: %s %s", b->step, b->n_steps, dockerfile_op_name(s->op), head);
                /* Whether this step keeps a layer of its own, a snapshot
                 * taken after it (the last one's is the image's disk). */
                bool keep = b->layers && layer_step_keeps_layer(s) && i != last_tree;
                switch (s->op) {
                case DF_RUN:
                        r = build_step_run(b, s, deadline_ms, keep);
                        break;
                case DF_COPY:
                case DF_ADD:
                        r = step_copy(b, s);
                        break;
                case DF_ENV:
                case DF_LABEL:
                        for (size_t k = 0; k + 1 < s->n_words && r == 0; k += 2) {
                                _cleanup_free_ char *name = NULL, *value = NULL;
                                if ((r = expand(b, s->words[k], &name)) < 0 || (r = expand(b, s->words[k + 1], &value)) < 0)
                                        break;
                                json_t *into = s->op == DF_ENV ? b->env : json_object_get(b->config, "labels");
                                r = json_object_set_new(into, name, json_string(value)) < 0 ? -ENOMEM : 0;
                        }
                        break;
                case DF_ARG: {
                        const char *given = json_string_value(json_object_get(b->job->req.build_args, s->words[0]));
                        _cleanup_free_ char *def = NULL;
                        if (!given && s->words[1] && (r = expand(b, s->words[1], &def)) < 0)
                                break;
                        const char *v = given ? given : def;
                        if (v && json_object_set_new(b->vars, s->words[0], json_string(v)) < 0)
                                r = -ENOMEM;
                        break;
                }
                case DF_WORKDIR:
                        if ((r = take_workdir(b, s)) == 0)
                                r = make_workdir(b, b->workdir, b->root);
                        break;
                case DF_USER: {
                        _cleanup_free_ char *user = NULL;
                        if ((r = expand(b, s->words[0], &user)) < 0)
                                break;
                        if (strcmp(user, "root") == 0 || strcmp(user, "0") == 0 || strcmp(user, "0:0") == 0)
                                b->root = true;
                        else if (strcmp(user, "sandbox") == 0)
                                b->root = false;
                        else
                                r = build_fail(b, "USER %.64s: a build runs as root or sandbox (the image's users)",
                                               user);
                        if (r == 0)
                                json_object_set_new(b->config, "user", json_string(b->root ? "root" : "sandbox"));
                        break;
                }
                case DF_CMD:
                        r = set_words_array(b->config, "cmd", s);
                        b->cmd_set = true;
                        break;
                case DF_ENTRYPOINT:
                        /* As Docker: an ENTRYPOINT drops a CMD the base
                         * image gave, and a shell-form one takes no CMD. */
                        r = set_words_array(b->config, "entrypoint", s);
                        if (r == 0 && !b->cmd_set)
                                json_object_del(b->config, "cmd");
                        if (r == 0)
                                r = json_object_set_new(b->config, "entrypointShell", json_boolean(!s->exec));
                        break;
                case DF_HEALTHCHECK:
                        /* NONE (no words) drops one the FROM image gave. */
                        if (s->n_words)
                                r = set_words_array(b->config, "healthcheck", s);
                        else
                                json_object_del(b->config, "healthcheck");
                        break;
                case DF_EXPOSE: {
                        json_t *ports = json_object_get(b->config, "exposedPorts");
                        for (size_t k = 0; k < s->n_words && r == 0; k++) {
                                _cleanup_free_ char *p = NULL;
                                if ((r = expand(b, s->words[k], &p)) == 0)
                                        json_array_append_new(ports, json_string(p));
                        }
                        break;
                }
                case DF_FROM:
                        break;
                }
                if (r == -ENOMEM)
                        return build_fail(b, "out of memory");
                if (r < 0)
                        return r;
                /* The last step that changes the tree leaves the tree the
                 * image's disk is taken of, less the context (which a
                 * build restarting from a layer removes and sends again):
                 * its layer is kept as a link of that disk (build_run),
                 * not as a snapshot of its own. Only the target stage
                 * keeps layers. */
                if (b->layers && i == last_tree && layer_step_keeps_layer(s))
                        memcpy(b->image_layer_key, b->layer_key, sizeof b->image_layer_key);
                else if (keep)
                        layer_keep(b, s->op == DF_RUN);
        }
        b->cur = NULL;
        /* Every step found: the sandbox at the last layer, for the image's
         * disk. */
        return walk_end(b);
}

/* FROM an image of a registry: pulled (oci_pull.h), its tree the
 * sandbox's base and its config the parent's. */
static int pull_from(Build *b, const char *from, const char *archive, char **ret_base, json_t **ret_config) {
        const DaemonConfig *cfg = b->u->cfg;
        OciPullLimits lim = { .max_bytes = (uint64_t)cfg->image_pull_max_mib << 20,
                              .timeout_ms = OCI_PULL_TIMEOUT_MS,
                              .insecure = cfg->image_insecure_registries,
                              .n_insecure = cfg->n_image_insecure_registries,
                              .hidden = { cfg->state_dir, cfg->image_dir } };
        int64_t left = b->deadline_ms - (int64_t)time_now_mono_ms();
        if (left < lim.timeout_ms)
                lim.timeout_ms = left > 1000 ? left : 1000;
        OciRef ref;
        if (!archive && oci_ref_parse(from, &ref) < 0)
                return build_fail(b, "FROM %.128s is not an image reference", from);
        _cleanup_json_ json_t *auth = archive ? NULL : user_images_registry_auth(b->u, b->job->key.owner, ref.registry);
        build_log_sys(b->log, "%s %s%s", archive ? "reading" : "pulling", archive ? "the imported archive" : from,
                auth ? " with your credentials of its registry" : "");
        OciPulled p = { 0 };
        char why[512];
        int r = oci_pull(cfg->state_dir, &lim, b->job->key.owner, from, archive, auth, &p, why, sizeof why);
        if (r < 0)
                return build_fail(b, "FROM %s", why);
        build_log_sys(b->log, "%s %s: %s, %u layers, %.1f MiB%s", archive ? "read" : "pulled", from, p.digest, p.layers,
                (double)p.size_bytes / 1048576.0, p.reused ? " (its tree was here already)" : "");
        *ret_base = strdup(p.name);
        *ret_config = json_incref(p.config);
        json_object_set_new(b->config, "digest", json_string(p.digest));
        oci_pulled_done(&p);
        return *ret_base ? 0 : -ENOMEM;
}

/* What FROM names: a built-in image, one of the owner's own (its disk,
 * its config), or an image of a registry. */
int build_resolve_from(Build *b, const char *from, char **ret_base, char **ret_snapshot, json_t **ret_config) {
        *ret_snapshot = NULL;
        *ret_config = NULL;
        /* An import's first FROM is its archive. */
        if (b->job->req.import_path && b->stage == 0)
                return pull_from(b, from, b->job->req.import_path, ret_base, ret_config);
        ImageInfo info;
        if (image_name_ok(from) && strchr(from, ':') == NULL) {
                /* A built-in name, unless the owner has an image of that name. */
                ImageRow own;
                if (user_images_resolve(b->u, b->job->key.owner, from, &own) == 0) {
                        store_image_row_clear(&own);
                } else if (image_info(b->u->cfg, from, &info) == 0 && info.built) {
                        *ret_base = strdup(from);
                        return *ret_base ? 0 : -ENOMEM;
                }
        }
        ImageRow row;
        int r = user_images_resolve(b->u, b->job->key.owner, from, &row);
        OciRef ref;
        if (r == -ENOENT && oci_ref_parse(from, &ref) == 0)
                return pull_from(b, from, NULL, ret_base, ret_config);
        if (r == -ENOENT)
                return build_fail(b, "FROM %.128s: no such image (the built-in images are default, "
                                     "minimal and analysis, or name one you built, or an image of a registry)", from);
        if (r < 0)
                return build_fail(b, "FROM %.128s: could not read the image", from);
        if (strcmp(row.state, "ready") != 0) {
                store_image_row_clear(&row);
                return build_fail(b, "FROM %.128s: that image is %s, not ready", from, row.state);
        }
        /* In a fleet its disk is a file of the host that built it: a build
         * elsewhere cannot start from it (its context's chunks are here). */
        if (b->u->fleet && row.host_id[0] && strcmp(row.host_id, b->u->host_id) != 0) {
                char host[sizeof row.host_id];
                snprintf(host, sizeof host, "%s", row.host_id);
                store_image_row_clear(&row);
                return build_fail(b, "%.128s: that image is kept by host %s, where its disk is; send the build to "
                                     "that host", from, host);
        }
        _cleanup_json_ json_t *doc = json_loads(row.doc, 0, NULL);
        store_image_row_clear(&row);
        const char *base = json_string_value(json_object_get(doc, "base"));
        const char *snap = json_string_value(json_object_get(doc, "snapshot"));
        if (!base || !snap)
                return build_fail(b, "FROM %.128s: that image has no disk", from);
        *ret_base = strdup(base);
        *ret_snapshot = strdup(snap);
        *ret_config = json_incref(json_object_get(doc, "config"));
        return *ret_base && *ret_snapshot ? 0 : -ENOMEM;
}

/* The build of one job, from its sandbox's create to its snapshot; the
 * image's doc in *ret_doc on success, b->error on failure. */
/* The global ARGs (before the first FROM): what every FROM expands with. */
static void global_args(Build *b) {
        const ImageBuildRequest *req = &b->job->req;
        const Dockerfile *d = &req->dockerfile;
        for (size_t i = 0; i < d->n_steps && d->steps[i].op == DF_ARG; i++) {
                const DockerfileStep *s = &d->steps[i];
                const char *given = json_string_value(json_object_get(req->build_args, s->words[0]));
                const char *v = given ? given : s->words[1];
                if (v)
                        json_object_set_new(b->vars, s->words[0], json_string(v));
        }
}

/* The stage's sandbox: started from the last layer found, else from its
 * FROM, with the build's network and shape; the context sent. */
int build_stage_sandbox(Build *b) {
        UserImages *u = b->u;
        Job *job = b->job;
        const ImageBuildRequest *req = &job->req;
        const char *snap = b->layer_snap ? b->layer_snap : b->base_snap;
        int r;
        /* The sandbox: the FROM image, the build's egress policy (none
         * unless asked for) and shape. The owner's egress secrets are not
         * its: a step's output is kept in layers and images that any later
         * build of the owner's reuses, so no step sees a placeholder or
         * has a value written into its requests. */
        CreateRequest cr = { 0 };
        sandbox_spec_init(&cr.spec);
        free(cr.spec.image);
        cr.spec.image = strdup(b->base);
        cr.spec.vcpu = req->vcpu;
        cr.spec.memory_mib = req->memory_mib;
        cr.spec.disk_mib = req->disk_mib;
        cr.spec.timeout_seconds = req->timeout_seconds + 300;
        cr.spec.on_lease_end = LEASE_END_DELETE;
        cr.spec.pausable = false;
        cr.spec.network = req->network ? json_deep_copy(req->network)
                                       : json_pack("{s:b,s:[],s:[]}", "internet", false, "allow", "deny");
        cr.spec.secrets = json_array();
        cr.labels = json_pack("{s:s}", "runtime.imageBuild", job->id);
        cr.run_as_root = true;
        _cleanup_free_ char *restore = snap ? snapshot_store_dir(u->snapshots, snap) : NULL;
        cr.restore_dir = restore;
        SandboxRow row;
        SandboxError se;
        if (!cr.spec.image || !cr.spec.network || !cr.spec.secrets || !cr.labels || (snap && !restore)) {
                create_request_done(&cr);
                return build_fail(b, "out of memory");
        }
        r = sandbox_create(u->m, &job->key, &cr, job->rid, &row, &se);
        create_request_done(&cr);
        if (r < 0)
                return build_fail(b, "the build's sandbox could not start: %s", se.message);
        snprintf(b->sandbox_id, sizeof b->sandbox_id, "%s", row.id);
        snprintf(b->sandbox_layer, sizeof b->sandbox_layer, "%s", b->layer_snap ? b->layer_snap : "");
        SandboxDriver driver = row.spec.driver;
        sandbox_row_done(&row);
        json_object_set_new(b->config, "driver", json_string(sandbox_driver_name(driver)));
        build_log_sys(b->log, "stage %d: building in sandbox %s (%s)", b->stage, b->sandbox_id,
                sandbox_driver_name(driver));
        if (driver == SANDBOX_DRIVER_MICROVM)
                return build_fail(b, "builds run on the namespace or gVisor driver, and this daemon's default is "
                                     "the microVM");
        /* A layer holds the context of the build that made it: this
         * build's replaces it whole, so that no file of the earlier one
         * stays for a wildcard to find. */
        if (b->layer_snap) {
                _cleanup_json_ json_t *rm = json_pack("[s,s,s]", "rm", "-rf", CONTEXT_IN_SANDBOX);
                _cleanup_json_ json_t *env = json_pack("{s:s}", "PATH", DEFAULT_PATH);
                int code = 0;
                if (!rm || !env)
                        return build_fail(b, "out of memory");
                if ((r = build_run_in_sandbox(b, rm, env, "/", true, true, false, 120000, &code)) < 0)
                        return r;
                build_log_sys(b->log, "stage %d: restarted from the last layer found", b->stage);
        }
        return send_context(b);
}

/* One stage: its sandbox started from its FROM, the context sent, its
 * steps run. The sandbox stays for the caller (b->sandbox_id). */
static int stage_run(Build *b) {
        Job *job = b->job;
        const ImageBuildRequest *req = &job->req;
        const Dockerfile *d = &req->dockerfile;
        const DockerfileStep *from = NULL;
        for (size_t i = 0; i < d->n_steps; i++)
                if (d->steps[i].op == DF_FROM && d->steps[i].stage == (unsigned)b->stage)
                        from = &d->steps[i];
        b->cur = from;
        b->step = 1;
        _cleanup_free_ char *from_name = NULL, *base = NULL, *snap = NULL;
        _cleanup_json_ json_t *parent = NULL;
        int r = expand(b, from->words[0], &from_name);
        if (r < 0)
                return r;
        b->n_steps = 1;
        build_log_sys(b->log, "stage %d, step 1: FROM %s", b->stage, from_name);
        if ((r = build_resolve_from(b, from_name, &base, &snap, &parent)) < 0)
                return r == -ENOMEM ? build_fail(b, "out of memory") : r;
        json_t *penv = json_object_get(parent, "env");
        if (json_is_object(penv))
                json_object_update(b->env, penv);
        if (json_is_object(req->env))
                json_object_update(b->env, req->env);
        const char *pwd = json_string_value(json_object_get(parent, "workdir"));
        free(b->workdir);
        b->workdir = strdup(pwd ? pwd : "/");
        b->root = true; /* as Docker: root until a USER says otherwise */
        const char *puser = json_string_value(json_object_get(parent, "user"));
        if (puser)
                b->root = strcmp(puser, "root") == 0;
        json_t *plabels = json_object_get(parent, "labels");
        if (json_is_object(plabels))
                json_object_update(json_object_get(b->config, "labels"), plabels);
        if (json_is_object(req->labels))
                json_object_update(json_object_get(b->config, "labels"), req->labels);
        for (const char *const *k = (const char *const[]){ "cmd", "entrypoint", "entrypointShell", "healthcheck", NULL }; *k; k++)
                if (json_object_get(parent, *k))
                        json_object_set(b->config, *k, json_object_get(parent, *k));
        json_object_set_new(b->config, "base", json_string(base));
        json_object_set_new(b->config, "from", json_string(from_name));
        b->base = TAKE_PTR(base);
        b->base_snap = TAKE_PTR(snap);
        if (b->layers) {
                const char *why = NULL;
                r = layer_chain_start(b, &why);
                if (r == -ENOMEM)
                        return build_fail(b, "out of memory");
                if (r < 0) {
                        build_log_sys(b->log, "no layers kept: %s", why);
                        b->layers = false;
                }
        }
        /* With layers the sandbox starts at the first step not found. */
        if (!b->layers && (r = build_stage_sandbox(b)) < 0)
                return r;
        return run_steps(b, b->deadline_ms);
}

static int build_run(Build *b, json_t **ret_doc) {
        UserImages *u = b->u;
        Job *job = b->job;
        const ImageBuildRequest *req = &job->req;
        const Dockerfile *d = &req->dockerfile;
        b->deadline_ms = (int64_t)time_now_mono_ms() + req->timeout_seconds * 1000;
        global_args(b);
        b->stage = req->target ? dockerfile_stage(d, req->target) : (int)d->n_stages - 1;
        if (b->stage < 0)
                return build_fail(b, "the target %.64s names no stage", req->target);
        char key[65] = "";
        const char *why = NULL;
        int r = build_cache_key(b, key, &why);
        if (r == -ENOMEM)
                return build_fail(b, "out of memory");
        if (r < 0) {
                build_log_sys(b->log, "not cached: %s", why);
                key[0] = '\0';
        } else if (req->no_cache)
                build_log_sys(b->log, "the cache is not used (cache: false): every step runs");
        else if ((r = build_cache_use(b, key, ret_doc)) != -ENOENT)
                return r;
        /* --image-layer-max-mib-per-owner 0: no layers kept or found. */
        b->layers = u->cfg->image_layer_max_mib_per_owner > 0;
        b->layers_lookup = b->layers && !req->no_cache;
        if (!b->layers)
                build_log_sys(b->log, "no layers kept: this daemon keeps none (--image-layer-max-mib-per-owner 0)");
        r = stage_run(b);
        if (r < 0)
                return r;
        _cleanup_free_ char *base = strdup(json_string_value(json_object_get(b->config, "base")) ?: "");
        _cleanup_free_ char *from_name = strdup(json_string_value(json_object_get(b->config, "from")) ?: "");
        _cleanup_free_ char *drv = strdup(json_string_value(json_object_get(b->config, "driver")) ?: "");
        json_object_del(b->config, "base");
        json_object_del(b->config, "from");
        json_object_del(b->config, "driver");
        _cleanup_json_ json_t *base_digest = json_incref(json_object_get(b->config, "digest"));
        json_object_del(b->config, "digest");
        SandboxError se;
        SandboxDriver driver = SANDBOX_DRIVER_NONE;
        sandbox_driver_from_name(drv, &driver);
        if (!base || !from_name || !drv)
                return build_fail(b, "out of memory");
        /* The context goes before the disk is taken, and the sandbox's
         * files are synced as that ends: the last thing that runs in it. */
        _cleanup_json_ json_t *rm = json_pack("[s,s,s,s,s]", "rm", "-rf", CONTEXT_IN_SANDBOX, FROM_IN_SANDBOX,
                                               STAGE_OUT);
        _cleanup_json_ json_t *env = json_pack("{s:s}", "PATH", DEFAULT_PATH);
        int code = 0;
        if ((r = build_run_in_sandbox(b, rm, env, "/", true, true, true, 120000, &code)) < 0)
                return r;
        build_log_sys(b->log, "taking the image's disk");
        _cleanup_json_ json_t *labels = json_pack("{s:s}", "runtime.image", job->id);
        SnapshotRequest sr = { .mode = "disk", .labels = labels, .keep = true, .synced = true };
        SnapshotRow srow = { 0 };
        if (sandbox_snapshot(u->m, &job->key, b->sandbox_id, &sr, job->rid, &srow, &se) < 0)
                return build_fail(b, "taking the image's disk failed: %s", se.message);
        if (b->image_layer_key[0])
                layer_keep_image(b, b->image_layer_key, srow.id);
        json_object_set_new(b->config, "env", json_deep_copy(b->env));
        json_object_set_new(b->config, "workdir", json_string(b->workdir));
        if (!json_object_get(b->config, "user"))
                json_object_set_new(b->config, "user", json_string(b->root ? "root" : "sandbox"));
        json_t *doc = json_pack("{s:s,s:s,s:s,s:I,s:O,s:s}", "base", base, "from", from_name, "snapshot", srow.id,
                                "sizeBytes", (json_int_t)srow.size_bytes, "config", b->config, "driver",
                                sandbox_driver_name(driver));
        snapshot_row_done(&srow);
        if (doc && base_digest)
                json_object_set(doc, "baseDigest", base_digest);
        if (doc && key[0])
                json_object_set_new(doc, "cacheKey", json_string(key));
        if (!doc)
                return build_fail(b, "out of memory");
        *ret_doc = doc;
        return 0;
}

/* The image's start command into its doc: the build's own, none for a
 * start of null, else what its CMD and ENTRYPOINT give. */
static int image_start_of(const ImageBuildRequest *req, json_t *doc) {
        json_t *start = NULL;
        if (req->start_given)
                start = json_incref(req->start);
        else if (image_start_from_config(json_object_get(doc, "config"), &start) < 0)
                return -ENOMEM;
        return json_object_set_new(doc, "start", start ? start : json_null()) < 0 ? -ENOMEM : 0;
}

static void build_job(UserImages *u, Job *job) {
        BuildLog log = { .fd = -1, .secrets = job->req.secrets };
        Build *stages[DOCKERFILE_MAX_STAGES] = { 0 };
        Build b = { .u = u, .job = job, .log = &log, .stages = stages };
        b.vars = json_object();
        b.env = json_object();
        b.config = json_pack("{s:{},s:[]}", "labels", "exposedPorts");
        b.workdir = strdup("/");
        _cleanup_free_ char *lp = user_images_log_path(u, job->id);
        if (lp)
                b.log->fd = open(lp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        int64_t t0 = (int64_t)time_now_mono_ms();
        u->ops->finish(u->h, job->id, "building", NULL, NULL, 0);
        log_info(job->rid, "image %s (%s v%lld): building", job->id, job->name, (long long)job->version);
        json_t *doc = NULL;
        /* A recipe's build logs it first. */
        int r = (!b.vars || !b.env || !b.config || !b.workdir || b.log->fd < 0) ? build_fail(&b, "out of memory")
                : (build_log_recipe(&b) ?: build_run(&b, &doc));
        for (unsigned i = 0; i < DOCKERFILE_MAX_STAGES; i++)
                if (stages[i] && stages[i] != &b) {
                        build_drop_sandbox(stages[i]);
                        build_state_free(stages[i]);
                        free(stages[i]);
                }
        build_drop_sandbox(&b);
        int64_t ms = (int64_t)time_now_mono_ms() - t0;
        /* A cache hit's doc is the earlier build's: the record says what
         * this one asked for. */
        if (r == 0 && (image_start_of(&job->req, doc) < 0 ||
                       json_object_set_new(doc, "build", user_images_build_json(&job->req)) < 0 ||
                       (job->req.recipe && json_object_set(doc, "recipe", job->req.recipe) < 0))) {
                r = -ENOMEM;
                snprintf(b.error, sizeof b.error, "out of memory");
        }
        if (r == 0) {
                json_object_set_new(doc, "buildMs", json_integer(ms));
                _cleanup_free_ char *text = json_dumps(doc, JSON_COMPACT);
                int rr = text ? u->ops->finish(u->h, job->id, "ready", NULL, text, time_now_unix()) : -ENOMEM;
                size_t i;
                json_t *t;
                json_array_foreach(job->req.tags, i, t)
                        if (rr == 0)
                                rr = u->ops->tag(u->h, job->key.owner, job->name, json_string_value(t), job->id);
                if (rr < 0) {
                        /* The disk is there but the record could not say so: it goes. */
                        const char *snap = json_string_value(json_object_get(doc, "snapshot"));
                        if (snap)
                                snapshot_store_delete(u->snapshots, job->key.owner, snap);
                        snprintf(b.error, sizeof b.error, "recording the image failed");
                        r = rr;
                } else {
                        build_log_sys(b.log, "image %s ready in %.1f s", job->id, (double)ms / 1000.0);
                        log_info(job->rid, "image %s ready in %lld ms", job->id, (long long)ms);
                }
        }
        if (r < 0) {
                if (!b.error[0])
                        snprintf(b.error, sizeof b.error, "the build failed");
                build_log_sys(b.log, "the build failed: %s", b.error);
                log_info(job->rid, "image %s failed: %s", job->id, b.error);
                u->ops->finish(u->h, job->id, "failed", b.error, NULL, time_now_unix());
        }
        json_decref(doc);
        if (b.log->fd >= 0)
                close(b.log->fd);
        build_state_free(&b);
}

/* ---- the queue ---- */

static void job_free(Job *j) {
        if (!j)
                return;
        image_build_request_done(&j->req);
        free(j->name);
        free(j);
}

/* The oldest queued job of an owner with none running, now running (under lock). */
static Job *take_job(UserImages *u) {
        for (Job **p = &u->queue; *p; p = &(*p)->next) {
                OwnerCount *c = owner_count(u, (*p)->key.owner, false);
                if (c && c->running > 0)
                        continue;
                Job *j = *p;
                *p = j->next;
                j->next = u->running;
                return u->running = j;
        }
        return NULL;
}

static void *worker(void *arg) {
        UserImages *u = arg;
        pthread_mutex_lock(&u->lock);
        while (!u->stopping) {
                Job *j = take_job(u);
                if (!j) {
                        pthread_cond_wait(&u->cond, &u->lock);
                        continue;
                }
                OwnerCount *c = owner_count(u, j->key.owner, true);
                if (c) {
                        c->queued--;
                        c->running++;
                }
                pthread_mutex_unlock(&u->lock);
                build_job(u, j);
                /* Still counted running: no other build of the owner's
                 * pulls while its trees are collected. */
                user_images_collect_trees(u, j->key.owner);
                pthread_mutex_lock(&u->lock);
                c = owner_count(u, j->key.owner, false);
                if (c)
                        c->running--;
                user_images_running_drop(u, j);
                job_free(j);
                /* Another owner's job may wait for this one's end. */
                pthread_cond_broadcast(&u->cond);
        }
        pthread_mutex_unlock(&u->lock);
        return NULL;
}

int user_images_start(UserImages *u) {
        int64_t n = 0;
        oci_pull_clean(u->cfg->state_dir);
        user_images_recover(u);
        int r = u->ops->fail_unfinished(u->h, u->host_id, "the daemon stopped during the build", time_now_unix(), &n);
        if (r < 0)
                return r;
        if (n)
                log_info(NULL, "%lld image builds cut by the daemon's stop marked failed", (long long)n);
        for (unsigned i = 0; i < BUILD_WORKERS; i++) {
                if (pthread_create(&u->workers[i], NULL, worker, u) != 0)
                        return -EAGAIN;
                u->n_workers++;
        }
        return 0;
}

void user_images_stop(UserImages *u) {
        if (!u)
                return;
        pthread_mutex_lock(&u->lock);
        u->stopping = true;
        pthread_cond_broadcast(&u->cond);
        pthread_mutex_unlock(&u->lock);
}

void user_images_close(UserImages *u) {
        if (!u)
                return;
        user_images_stop(u);
        for (unsigned i = 0; i < u->n_workers; i++)
                pthread_join(u->workers[i], NULL);
        while (u->queue) {
                Job *j = u->queue;
                u->queue = j->next;
                job_free(j);
        }
        if (u->h)
                u->ops->close(u->h);
        free(u->owners);
        free(u->cut);
        free(u->dir);
        free(u->ctx_dir);
        pthread_mutex_destroy(&u->lock);
        pthread_cond_destroy(&u->cond);
        free(u);
}

int user_images_build(UserImages *u, const KeyInfo *key, ImageBuildRequest *req, const char *rid, ImageRow *ret,
                      SandboxError *e) {
        Job *j = calloc(1, sizeof(*j));
        if (!j)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        j->key = *key;
        j->req = *req;
        *req = (ImageBuildRequest){ 0 };
        snprintf(j->rid, sizeof j->rid, "%s", rid ? rid : "");
        j->name = strdup(j->req.name);
        if (!j->name || new_uuid(j->id) < 0) {
                job_free(j);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        }
        pthread_mutex_lock(&u->lock);
        OwnerCount *c = owner_count(u, key->owner, true);
        if (!c || c->queued + c->running >= USER_IMAGES_QUEUED_PER_OWNER) {
                pthread_mutex_unlock(&u->lock);
                job_free(j);
                return sandbox_error(e, SANDBOX_ERR_TOO_MANY, "wait for one of your builds to end",
                                     "you have %u image builds queued or running, the most one owner may have",
                                     USER_IMAGES_QUEUED_PER_OWNER);
        }
        c->queued++;
        pthread_mutex_unlock(&u->lock);
        _cleanup_json_ json_t *doc = json_pack("{s:O?,s:O?,s:o,s:O*}", "labels", j->req.labels, "buildArgs",
                                               j->req.build_args, "build", user_images_build_json(&j->req), "recipe",
                                               j->req.recipe);
        _cleanup_free_ char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
        ImageRow row = { .owner = (char *)key->owner, .name = j->name, .doc = text, .created_at = time_now_unix() };
        snprintf(row.id, sizeof row.id, "%s", j->id);
        snprintf(row.state, sizeof row.state, "queued");
        snprintf(row.host_id, sizeof row.host_id, "%s", u->host_id);
        int r = text ? u->ops->insert(u->h, &row) : -ENOMEM;
        pthread_mutex_lock(&u->lock);
        if (r < 0) {
                c = owner_count(u, key->owner, false);
                if (c)
                        c->queued--;
                pthread_mutex_unlock(&u->lock);
                job_free(j);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not record the image");
        }
        j->version = row.version;
        Job **p = &u->queue;
        while (*p)
                p = &(*p)->next;
        *p = j;
        pthread_cond_broadcast(&u->cond);
        pthread_mutex_unlock(&u->lock);
        return user_images_get(u, key->owner, row.id, ret) < 0
                       ? sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the image back")
                       : 0;
}
