/* The images users build (user_images.h): each build's log, and the chunks
 * of build contexts clients upload ahead of a build. */
#include "daemon/manager/user_images.h"
#include "daemon/manager/user_images-internal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
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
#include "proto/proto.h"

/* ---- the log ---- */


char *user_images_log_path(UserImages *u, const char *id) {
        char *p = NULL;
        return asprintf(&p, "%s/%s.log", u->dir, id) < 0 ? NULL : p;
}

/* One line of the log; -EFBIG once the log is past its bound (the line
 * saying so is the last written). */
static int log_line(BuildLog *l, const char *stream, const char *text, size_t len) {
        if (l->over)
                return -EFBIG;
        char clean[LOG_LINE_MAX + 1];
        size_t o = 0;
        for (size_t i = 0; i < len && o < LOG_LINE_MAX; i++) {
                unsigned char c = (unsigned char)text[i];
                /* Keep the JSON valid whatever the step printed. */
                clean[o++] = c == '\t' || (c >= 0x20 && c != 0x7f) ? (char)c : '?';
        }
        clean[o] = '\0';
        json_t *j = json_pack("{s:s,s:I,s:s,s:s,s:i,s:I}", "type", "line", "seq", (json_int_t)(l->seq + 1), "stream",
                              stream, "line", clean, "step", (int)l->step, "time", (json_int_t)time_now_unix());
        /* Invalid UTF-8 makes jansson refuse the string: keep ASCII then. */
        if (!j) {
                for (size_t i = 0; i < o; i++)
                        if ((unsigned char)clean[i] >= 0x80)
                                clean[i] = '?';
                j = json_pack("{s:s,s:I,s:s,s:s,s:i,s:I}", "type", "line", "seq", (json_int_t)(l->seq + 1), "stream",
                              stream, "line", clean, "step", (int)l->step, "time", (json_int_t)time_now_unix());
        }
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!s)
                return -ENOMEM;
        size_t n = strlen(s);
        s[n] = '\n';
        int r = 0;
        if (l->bytes + n + 1 > USER_IMAGES_LOG_MAX) {
                l->over = true;
                free(s);
                static const char over[] = "the build log passed its bound of 8 MiB: the build stops here";
                json_t *last = json_pack("{s:s,s:I,s:s,s:s,s:i,s:I}", "type", "line", "seq", (json_int_t)(l->seq + 1),
                                         "stream", "system", "line", over, "step", (int)l->step, "time",
                                         (json_int_t)time_now_unix());
                s = last ? json_dumps(last, JSON_COMPACT) : NULL;
                json_decref(last);
                if (s) {
                        n = strlen(s);
                        s[n] = '\n';
                        if (io_write_all(l->fd, s, n + 1) == 0)
                                l->seq++;
                }
                free(s);
                return -EFBIG;
        }
        r = io_write_all(l->fd, s, n + 1);
        free(s);
        if (r == 0) {
                l->seq++;
                l->bytes += n + 1;
        }
        return r;
}

int build_log_sys(BuildLog *l, const char *fmt, ...) {
        char buf[LOG_LINE_MAX];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        return log_line(l, "system", buf, n < 0 ? 0 : (size_t)n >= sizeof buf ? sizeof buf - 1 : (size_t)n);
}

/* Bytes of a step's output: whole lines go to the log, a line longer than
 * LOG_LINE_MAX in pieces. */
int build_log_output(BuildLog *l, int fd, const uint8_t *data, size_t len) {
        int k = fd == PROTO_FD_ERR ? 1 : 0;
        const char *stream = k ? "stderr" : "stdout";
        int r = 0;
        for (size_t i = 0; i < len && r == 0; i++) {
                if (data[i] == '\n' || l->pending_len[k] == LOG_LINE_MAX) {
                        r = log_line(l, stream, l->pending[k], l->pending_len[k]);
                        l->pending_len[k] = 0;
                        if (data[i] == '\n')
                                continue;
                }
                l->pending[k][l->pending_len[k]++] = (char)data[i];
        }
        return r;
}

int build_log_flush(BuildLog *l) {
        int r = 0;
        for (int k = 0; k < 2 && r == 0; k++)
                if (l->pending_len[k]) {
                        r = log_line(l, k ? "stderr" : "stdout", l->pending[k], l->pending_len[k]);
                        l->pending_len[k] = 0;
                }
        return r;
}

int build_log_recipe(Build *b) {
        const ImageBuildRequest *req = &b->job->req;
        if (!req->recipe || !req->recipe_dockerfile)
                return 0;
        _cleanup_free_ char *text = json_dumps(req->recipe, JSON_COMPACT | JSON_SORT_KEYS);
        if (!text)
                return build_fail(b, "out of memory");
        /* A line of the log is at most LOG_LINE_MAX: a long recipe is cut
         * there (the image's record keeps all of it). */
        int r = build_log_sys(b->log, "recipe: %s", text);
        if (r == 0)
                r = build_log_sys(b->log, "the recipe's Dockerfile:");
        for (const char *l = req->recipe_dockerfile; r == 0 && *l;) {
                size_t n = strcspn(l, "\n");
                r = build_log_sys(b->log, "  %.*s", (int)n, l);
                l += n + (l[n] == '\n');
        }
        return r == -EFBIG ? build_fail(b, "the build log passed its bound of %u MiB", USER_IMAGES_LOG_MAX >> 20) : 0;
}

int user_images_logs(UserImages *u, const char *id, int64_t after, unsigned max, json_t *lines, int64_t *ret_next) {
        _cleanup_free_ char *p = user_images_log_path(u, id);
        if (!p)
                return -ENOMEM;
        _cleanup_fclose_ FILE *f = fopen(p, "re");
        *ret_next = after;
        if (!f)
                return errno == ENOENT ? 0 : -errno;
        char *line = NULL;
        size_t cap = 0;
        unsigned n = 0;
        while (n < max && getline(&line, &cap, f) > 0) {
                json_t *j = json_loads(line, 0, NULL);
                int64_t seq = json_integer_value(json_object_get(j, "seq"));
                if (j && seq > after) {
                        json_array_append_new(lines, j);
                        *ret_next = seq;
                        n++;
                } else
                        json_decref(j);
        }
        free(line);
        return 0;
}

/* ---- context chunks ---- */

static bool digest_ok(const char *s) {
        if (!s || strlen(s) != 64)
                return false;
        for (size_t i = 0; i < 64; i++)
                if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
                        return false;
        return true;
}

/* The owner's chunk directory: owners are names a path may not hold as they
 * are, so it is named by a hash of the owner. */
char *build_owner_dir(UserImages *u, const char *owner, bool make) {
        uint8_t md[32];
        unsigned len = 0;
        if (EVP_Digest(owner, strlen(owner), md, &len, EVP_sha256(), NULL) != 1)
                return NULL;
        char hex[65];
        hex_encode(md, 16, hex);
        char *p = NULL;
        if (asprintf(&p, "%s/%s", u->ctx_dir, hex) < 0)
                return NULL;
        if (make && mkdir(p, 0700) < 0 && errno != EEXIST) {
                free(p);
                return NULL;
        }
        return p;
}

int user_images_context_missing(UserImages *u, const char *owner, json_t *digests, json_t **ret) {
        _cleanup_free_ char *dir = build_owner_dir(u, owner, false);
        json_t *missing = json_array();
        if (!dir || !missing) {
                json_decref(missing);
                return -ENOMEM;
        }
        size_t i;
        json_t *v;
        json_array_foreach(digests, i, v) {
                const char *d = json_string_value(v);
                if (!digest_ok(d)) {
                        json_decref(missing);
                        return -EINVAL;
                }
                char p[PATH_MAX];
                snprintf(p, sizeof p, "%s/%s", dir, d);
                if (access(p, F_OK) < 0)
                        json_array_append_new(missing, json_string(d));
        }
        *ret = missing;
        return 0;
}

static int64_t dir_bytes(const char *dir) {
        DIR *d = opendir(dir);
        if (!d)
                return 0;
        int64_t sum = 0;
        struct dirent *e;
        struct stat st;
        while ((e = readdir(d)))
                if (e->d_name[0] != '.' && fstatat(dirfd(d), e->d_name, &st, 0) == 0)
                        sum += st.st_size;
        closedir(d);
        return sum;
}

int user_images_context_put(UserImages *u, const char *owner, const char *digest, const void *data, size_t len) {
        if (!digest_ok(digest))
                return -EINVAL;
        if (len > USER_IMAGES_CHUNK_MAX)
                return -EFBIG;
        uint8_t md[32];
        unsigned mdlen = 0;
        char hex[65];
        if (EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) != 1)
                return -EIO;
        hex_encode(md, 32, hex);
        if (strcmp(hex, digest) != 0)
                return -EBADMSG;
        _cleanup_free_ char *dir = build_owner_dir(u, owner, true);
        if (!dir)
                return -ENOMEM;
        if (dir_bytes(dir) + (int64_t)len > (int64_t)USER_IMAGES_CHUNKS_PER_OWNER)
                return -EDQUOT;
        char path[PATH_MAX], tmp[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, digest);
        snprintf(tmp, sizeof tmp, "%s/.%s.part", dir, digest);
        _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        int r = io_write_all(fd, data, len);
        if (r == 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0)
                unlink(tmp);
        return r;
}
