/* The images users build (user_images.h): each build's log, and the chunks
 * of build contexts clients upload ahead of a build, and their collection
 * (docs/images.md, "How a build runs"): a chunk is kept while a queued or
 * running build names it, or for CHUNK_HOLD_SECONDS after a `missing` query
 * reported it present or a PUT received it (the build that follows names
 * it); past the owner's bound an upload removes the least recently used
 * others first, and a chunk unused for --image-context-max-age-hours goes. */
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
#include <pthread.h>
#include <sys/time.h>

#include "common/io.h"
#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/config.h"
#include "proto/proto.h"

/* ---- the log ---- */


char *user_images_log_path(UserImages *u, const char *id) {
        char *p = NULL;
        return asprintf(&p, "%s/%s.log", u->dir, id) < 0 ? NULL : p;
}

/* Each line of 4 bytes or more of each build secret's value, where the
 * text has it, becomes "****" (never longer than what it replaces); a
 * shorter one would mask ordinary words. A value a step transforms (split,
 * encoded) is not found: the log only never echoes one as it is. */
#define MASK "****"
static size_t mask_secrets(const json_t *secrets, const char *text, size_t len, char *out) {
        memcpy(out, text, len);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)secrets, k, v) {
                const char *val = json_string_value(v);
                for (const char *p = val; p && *p;) {
                        size_t pl = strcspn(p, "\n");
                        if (pl >= strlen(MASK)) {
                                size_t o = 0;
                                for (size_t i = 0; i < len;) {
                                        if (i + pl <= len && memcmp(out + i, p, pl) == 0) {
                                                memcpy(out + o, MASK, strlen(MASK));
                                                o += strlen(MASK);
                                                i += pl;
                                        } else
                                                out[o++] = out[i++];
                                }
                                len = o;
                        }
                        p += pl;
                        if (*p == '\n')
                                p++;
                }
        }
        return len;
}

/* One line of the log; -EFBIG once the log is past its bound (the line
 * saying so is the last written). */
static int log_line(BuildLog *l, const char *stream, const char *text, size_t len) {
        if (l->over)
                return -EFBIG;
        char masked[LOG_LINE_MAX + 1];
        if (l->secrets && len <= LOG_LINE_MAX) {
                len = mask_secrets(l->secrets, text, len, masked);
                text = masked;
        }
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

/* What a `missing` query reported present, or a PUT received, is kept this
 * long for the build that names it (its create drops the hold). */
#define CHUNK_HOLD_SECONDS (30 * 60)
/* Holds kept at most (all owners): past it a chunk is not held, only used. */
#define CHUNK_HOLDS_MAX 65536u
/* The chunks of one owner's directory one pass reads at most. */
#define CHUNK_SCAN_MAX 16384u
/* The sweep of every owner's chunks by age runs at most this often. */
#define CHUNK_SWEEP_EVERY_SECONDS (5 * 60)

/* Holds, the bound's check and the removals: one at a time. The holds are
 * {"<owner hash>/<digest>": until}. */
static pthread_mutex_t chunks_lock = PTHREAD_MUTEX_INITIALIZER;
static json_t *chunk_holds;
static int64_t chunks_swept_at;
/* When this process's holds began (its start's sweep). The holds of the
 * process before it are gone with it: a chunk last used before then is
 * held for CHUNK_HOLD_SECONDS after that use, read from its time of use
 * (the file's mtime, which a `missing` query and a PUT set). Seconds: a
 * chunk used in the second the process started counts as used before it
 * (holding one more chunk is safe, freeing a named one is not). */
static int64_t holds_since;

static bool digest_ok(const char *s) {
        if (!s || strlen(s) != 64)
                return false;
        for (size_t i = 0; i < 64; i++)
                if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
                        return false;
        return true;
}

/* The name of the owner's chunk directory: owners are names a path may not
 * hold as they are, so it is a hash of the owner (32 hex digits). */
static int owner_hash(const char *owner, char hex[33]) {
        uint8_t md[32];
        unsigned len = 0;
        if (EVP_Digest(owner, strlen(owner), md, &len, EVP_sha256(), NULL) != 1)
                return -ENOMEM;
        hex_encode(md, 16, hex);
        return 0;
}

char *build_owner_dir(UserImages *u, const char *owner, bool make) {
        char hex[33];
        char *p = NULL;
        if (owner_hash(owner, hex) < 0 || asprintf(&p, "%s/%s", u->ctx_dir, hex) < 0)
                return NULL;
        if (make && mkdir(p, 0700) < 0 && errno != EEXIST) {
                free(p);
                return NULL;
        }
        return p;
}

/* Under chunks_lock. */
static void holds_prune(int64_t now) {
        const char *k;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(chunk_holds, tmp, k, v) {
                if (json_integer_value(v) <= now)
                        json_object_del(chunk_holds, k);
        }
}

static void hold_set(const char *ohash, const char *digest, int64_t until) {
        char k[100];
        snprintf(k, sizeof k, "%.32s/%.64s", ohash, digest);
        if (!chunk_holds && !(chunk_holds = json_object()))
                return;
        if (until <= 0) {
                json_object_del(chunk_holds, k);
                return;
        }
        if (json_object_size(chunk_holds) >= CHUNK_HOLDS_MAX && !json_object_get(chunk_holds, k)) {
                holds_prune(time_now_unix());
                if (json_object_size(chunk_holds) >= CHUNK_HOLDS_MAX)
                        return;
        }
        json_object_set_new(chunk_holds, k, json_integer(until));
}

static bool held(const char *key, int64_t mtime, int64_t now) {
        if (mtime <= holds_since && mtime > now - CHUNK_HOLD_SECONDS)
                return true;
        return json_integer_value(json_object_get(chunk_holds, key)) > now;
}

/* The running builds move from the queue to u->running (under u->lock):
 * this one's ended. */
void user_images_running_drop(UserImages *u, Job *j) {
        for (Job **p = &u->running; *p; p = &(*p)->next)
                if (*p == j) {
                        *p = j->next;
                        j->next = NULL;
                        return;
                }
}

/* The chunks queued and running builds name, {"<owner hash>/<digest>":
 * true}, of owner or of all owners (NULL); NULL when out of memory. */
static json_t *named_by_builds(UserImages *u, const char *owner) {
        json_t *set = json_object();
        bool failed = !set;
        pthread_mutex_lock(&u->lock);
        Job *lists[2] = { u->queue, u->running };
        for (unsigned l = 0; l < 2 && !failed; l++)
                for (Job *j = lists[l]; j && !failed; j = j->next) {
                        char hex[33], k[100];
                        if (!j->req.chunks || (owner && strcmp(j->key.owner, owner) != 0))
                                continue;
                        failed = owner_hash(j->key.owner, hex) < 0;
                        size_t i;
                        json_t *v;
                        json_array_foreach(j->req.chunks, i, v) {
                                snprintf(k, sizeof k, "%.32s/%.64s", hex, json_string_value(v));
                                if (!failed && json_object_set_new(set, k, json_true()) < 0)
                                        failed = true;
                        }
                }
        pthread_mutex_unlock(&u->lock);
        if (failed) {
                json_decref(set);
                return NULL;
        }
        return set;
}

typedef struct ChunkFile {
        char name[65];
        int64_t size;
        int64_t mtime;
        bool kept; /* named by a build or held */
} ChunkFile;

static int chunk_file_cmp(const void *a, const void *b) {
        const ChunkFile *x = a, *y = b;
        return x->mtime < y->mtime ? -1 : x->mtime > y->mtime ? 1 : strcmp(x->name, y->name);
}

/* The owner's chunks (named by their digest; a name starting with "." is
 * one being written, and neither counted nor removed), oldest use first.
 * Under chunks_lock. */
static int chunk_files(int dfd, const char *ohash, json_t *named, int64_t now, ChunkFile **ret, size_t *ret_n) {
        *ret = NULL;
        *ret_n = 0;
        int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 3);
        DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
        if (!d) {
                int r = -errno;
                if (fd >= 0)
                        close(fd);
                return r;
        }
        ChunkFile *f = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        struct stat st;
        int r = 0;
        while (r == 0 && (e = readdir(d)) && n < CHUNK_SCAN_MAX) {
                if (!digest_ok(e->d_name) || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
                    !S_ISREG(st.st_mode))
                        continue;
                if (n == cap) {
                        ChunkFile *g = realloc(f, (cap = cap ? cap * 2 : 64) * sizeof *f);
                        if (!g) {
                                r = -ENOMEM;
                                break;
                        }
                        f = g;
                }
                char k[100];
                snprintf(k, sizeof k, "%.32s/%.64s", ohash, e->d_name);
                snprintf(f[n].name, sizeof f[n].name, "%.64s", e->d_name);
                f[n].size = st.st_size;
                f[n].mtime = st.st_mtim.tv_sec;
                f[n].kept = json_object_get(named, k) || held(k, f[n].mtime, now);
                n++;
        }
        closedir(d);
        if (r < 0) {
                free(f);
                return r;
        }
        if (n)
                qsort(f, n, sizeof *f, chunk_file_cmp);
        *ret = f;
        *ret_n = n;
        return 0;
}

/* Removes the owner's chunks unused since before `before` that nothing
 * keeps, then, while the chunks and `need` bytes pass `bound`, the least
 * recently used that nothing keeps. -EDQUOT when what is kept fills the
 * bound. Under chunks_lock. */
static int collect_owner(UserImages *u, const char *ohash, json_t *named, int64_t before, uint64_t need,
                         uint64_t bound) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", u->ctx_dir, ohash);
        _cleanup_close_ int dfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (dfd < 0)
                return errno == ENOENT ? 0 : -errno;
        _cleanup_free_ ChunkFile *f = NULL;
        size_t n = 0;
        int64_t now = time_now_unix();
        int r = chunk_files(dfd, ohash, named, now, &f, &n);
        if (r < 0)
                return r;
        uint64_t total = 0, kept = 0;
        for (size_t i = 0; i < n; i++) {
                total += (uint64_t)f[i].size;
                kept += f[i].kept ? (uint64_t)f[i].size : 0;
        }
        /* Nothing is removed for room that removing all it may would not make. */
        bool room = kept + need <= bound;
        unsigned aged = 0, evicted = 0;
        for (size_t i = 0; i < n; i++) {
                if (f[i].kept || (f[i].mtime >= before && (!room || total + need <= bound)))
                        continue;
                if (unlinkat(dfd, f[i].name, 0) < 0 && errno != ENOENT) {
                        log_warn(NULL, "removing a build-context chunk: %s", strerror(errno));
                        continue;
                }
                total -= (uint64_t)f[i].size;
                if (f[i].mtime < before)
                        aged++;
                else
                        evicted++;
        }
        if (aged || evicted)
                log_info(NULL, "build-context chunks of owner %s removed: %u unused too long, %u to make room",
                         ohash, aged, evicted);
        return total + need > bound ? -EDQUOT : 0;
}

static int64_t chunk_age_bound(UserImages *u) {
        return time_now_unix() - (int64_t)u->cfg->image_context_max_age_hours * 3600;
}

static uint64_t chunk_bound(UserImages *u) {
        return (uint64_t)u->cfg->image_context_max_mib_per_owner << 20;
}

void user_images_context_sweep(UserImages *u, bool now) {
        int64_t t = time_now_unix();
        pthread_mutex_lock(&chunks_lock);
        if (!now && t - chunks_swept_at < CHUNK_SWEEP_EVERY_SECONDS) {
                pthread_mutex_unlock(&chunks_lock);
                return;
        }
        chunks_swept_at = t;
        if (!holds_since)
                holds_since = t;
        holds_prune(t);
        json_t *named = named_by_builds(u, NULL);
        DIR *d = named ? opendir(u->ctx_dir) : NULL;
        struct dirent *e;
        while (d && (e = readdir(d)))
                if (strlen(e->d_name) == 32 && strspn(e->d_name, "0123456789abcdef") == 32)
                        (void)collect_owner(u, e->d_name, named, chunk_age_bound(u), 0, UINT64_MAX);
        if (d)
                closedir(d);
        json_decref(named);
        pthread_mutex_unlock(&chunks_lock);
}

int user_images_context_missing(UserImages *u, const char *owner, json_t *digests, json_t **ret) {
        char ohash[33];
        _cleanup_json_ json_t *missing = json_array();
        if (!missing || owner_hash(owner, ohash) < 0)
                return -ENOMEM;
        size_t i;
        json_t *v;
        json_array_foreach(digests, i, v)
                if (!digest_ok(json_string_value(v)))
                        return -EINVAL;
        int64_t now = time_now_unix();
        pthread_mutex_lock(&chunks_lock);
        json_array_foreach(digests, i, v) {
                const char *d = json_string_value(v);
                char p[PATH_MAX];
                snprintf(p, sizeof p, "%s/%s/%s", u->ctx_dir, ohash, d);
                /* Present: used now, and kept for the build that follows. */
                if (utimensat(AT_FDCWD, p, NULL, AT_SYMLINK_NOFOLLOW) == 0)
                        hold_set(ohash, d, now + CHUNK_HOLD_SECONDS);
                else
                        json_array_append_new(missing, json_string(d));
        }
        pthread_mutex_unlock(&chunks_lock);
        *ret = json_incref(missing);
        return 0;
}

void user_images_context_named(UserImages *u, const char *owner, json_t *chunks) {
        char ohash[33];
        if (!chunks || owner_hash(owner, ohash) < 0)
                return;
        size_t i;
        json_t *v;
        pthread_mutex_lock(&chunks_lock);
        json_array_foreach(chunks, i, v) {
                char p[PATH_MAX];
                snprintf(p, sizeof p, "%s/%s/%s", u->ctx_dir, ohash, json_string_value(v));
                (void)utimensat(AT_FDCWD, p, NULL, AT_SYMLINK_NOFOLLOW);
                hold_set(ohash, json_string_value(v), 0);
        }
        pthread_mutex_unlock(&chunks_lock);
}

uint64_t user_images_context_bound(UserImages *u) {
        return chunk_bound(u);
}

int user_images_context_put(UserImages *u, const char *owner, const char *digest, const void *data, size_t len) {
        if (!digest_ok(digest))
                return -EINVAL;
        if (len > USER_IMAGES_CHUNK_MAX)
                return -EFBIG;
        uint8_t md[32];
        unsigned mdlen = 0;
        char hex[65], ohash[33], rnd[17];
        if (EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) != 1)
                return -EIO;
        hex_encode(md, 32, hex);
        if (strcmp(hex, digest) != 0)
                return -EBADMSG;
        _cleanup_free_ char *dir = build_owner_dir(u, owner, true);
        if (!dir || owner_hash(owner, ohash) < 0 || random_hex(rnd, 8) < 0)
                return -ENOMEM;
        char path[PATH_MAX], tmp[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, digest);
        /* A name of its own: two PUTs of one chunk never write one file, and
         * a name starting with "." is neither counted nor removed. */
        snprintf(tmp, sizeof tmp, "%s/.%s.%s.part", dir, digest, rnd);
        _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        int r = io_write_all(fd, data, len);
        int64_t now = time_now_unix();
        pthread_mutex_lock(&chunks_lock);
        struct stat st;
        /* Kept already whole (its name is its bytes' hash): used now. */
        if (r == 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size == len &&
            utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW) == 0)
                r = 1;
        json_t *named = r == 0 ? named_by_builds(u, owner) : NULL;
        if (r == 0)
                r = named ? collect_owner(u, ohash, named, chunk_age_bound(u), len, chunk_bound(u)) : -ENOMEM;
        if (r == 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r >= 0)
                hold_set(ohash, digest, now + CHUNK_HOLD_SECONDS);
        pthread_mutex_unlock(&chunks_lock);
        json_decref(named);
        if (r != 0)
                unlink(tmp);
        return r < 0 ? r : 0;
}
