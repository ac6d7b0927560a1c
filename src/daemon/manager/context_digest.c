/* The digest of a COPY's sources, read from the build context's archive
 * (context_digest.h).
 *
 * Why libarchive and not the agent's tar reader (common/tar.h): that one
 * extracts into a directory, and here nothing of the archive may touch the
 * host's filesystem; libarchive reads entries from memory. Only its tar
 * format and gzip filter are enabled, and every name it gives is checked
 * here before use. */
#include "daemon/manager/context_digest.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/macro.h"
#include "common/random.h"

#define NAME_MAX_BYTES 4096u
#define COMPONENT_MAX 255u
#define READ_BUF (64u * 1024u)

typedef struct Entry {
        char *name;
        char *target; /* a link's ("" for none) */
        uint8_t type; /* 'f', 'd', 'l' (symbolic), 'h' (hard) */
        uint32_t mode;
        uint64_t size;
        uint8_t content[32];
        size_t seq;
} Entry;

typedef struct Reader {
        ContextReadFn fn;
        void *userdata;
        int error;
} Reader;

static la_ssize_t read_cb(struct archive *a, void *userdata, const void **buf) {
        Reader *r = userdata;
        ssize_t n = r->fn(r->userdata, buf);
        if (n < 0) {
                r->error = (int)n;
                archive_set_error(a, EIO, "the build context could not be read");
                return -1;
        }
        return n;
}

/* Whether the first components of path match every component of source:
 * then path is the source or below it. */
bool context_source_matches(const char *source, const char *path) {
        const char *s = source, *p = path;
        while (*s) {
                if (!*p)
                        return false;
                size_t sn = strcspn(s, "/"), pn = strcspn(p, "/");
                char sc[COMPONENT_MAX + 1], pc[COMPONENT_MAX + 1];
                if (sn > COMPONENT_MAX || pn > COMPONENT_MAX)
                        return false;
                memcpy(sc, s, sn);
                sc[sn] = '\0';
                memcpy(pc, p, pn);
                pc[pn] = '\0';
                /* The shell keeps a pattern that matches nothing as it is:
                 * a name equal to it is taken too. */
                if (strcmp(sc, pc) != 0 && fnmatch(sc, pc, FNM_PATHNAME | FNM_PERIOD) != 0)
                        return false;
                s += sn + (s[sn] == '/');
                p += pn + (p[pn] == '/');
        }
        return true;
}

/* A name of the archive, cleaned in place of a leading "./" and trailing
 * slashes; -EPERM for one that leaves the context or is odd. */
static int clean_name(const char *raw, char **ret, const char **ret_why) {
        if (!raw) {
                *ret_why = "an entry has no name";
                return -EPERM;
        }
        while (raw[0] == '.' && raw[1] == '/')
                raw += 2;
        size_t len = strlen(raw);
        while (len && raw[len - 1] == '/')
                len--;
        if (len == 0 || (len == 1 && raw[0] == '.')) {
                *ret = NULL; /* the context's root: nothing to take */
                return 0;
        }
        if (len >= NAME_MAX_BYTES) {
                *ret_why = "a name is longer than 4096 bytes";
                return -EPERM;
        }
        if (raw[0] == '/') {
                *ret_why = "a name is absolute";
                return -EPERM;
        }
        for (const char *c = raw; c < raw + len;) {
                size_t n = strcspn(c, "/");
                if (c + n > raw + len)
                        n = (size_t)(raw + len - c);
                if (n == 0 || (n == 1 && c[0] == '.')) {
                        *ret_why = "a name has an empty or \".\" component";
                        return -EPERM;
                }
                if (n == 2 && c[0] == '.' && c[1] == '.') {
                        *ret_why = "a name holds \"..\"";
                        return -EPERM;
                }
                if (n > COMPONENT_MAX) {
                        *ret_why = "a name has a component longer than 255 bytes";
                        return -EPERM;
                }
                c += n + 1;
        }
        *ret = strndup(raw, len);
        return *ret ? 0 : -ENOMEM;
}

static int entry_cmp(const void *x, const void *y) {
        const Entry *a = x, *b = y;
        int c = strcmp(a->name, b->name);
        return c ? c : a->seq < b->seq ? -1 : a->seq > b->seq;
}

static void put_u64(EVP_MD_CTX *md, uint64_t v) {
        uint8_t b[8];
        for (int i = 0; i < 8; i++)
                b[i] = (uint8_t)(v >> (56 - 8 * i));
        EVP_DigestUpdate(md, b, sizeof b);
}

static void put_bytes(EVP_MD_CTX *md, const void *p, size_t n) {
        put_u64(md, n);
        EVP_DigestUpdate(md, p, n);
}

__attribute__((format(printf, 3, 4))) static void say(char *why, size_t why_len, const char *fmt, ...) {
        if (!why_len)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
}

/* The content of the current entry hashed into e: every file's, as a
 * link may reach any of them. */
static int hash_content(struct archive *a, Entry *e, uint8_t *buf) {
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
                EVP_MD_CTX_free(md);
                return -ENOMEM;
        }
        uint64_t got = 0;
        la_ssize_t n;
        while ((n = archive_read_data(a, buf, READ_BUF)) > 0) {
                got += (uint64_t)n;
                EVP_DigestUpdate(md, buf, (size_t)n);
        }
        unsigned l = 0;
        EVP_DigestFinal_ex(md, e->content, &l);
        EVP_MD_CTX_free(md);
        return n < 0 || got != e->size ? -EBADMSG : 0;
}

/* ---- Sources through symbolic links ----
 *
 * The copy's shell follows a symbolic link that a source passes through
 * (`link/a.txt`, `link/x*`) and one that a source names when it leads to a
 * directory (`COPY link/ /dst/` copies what is below it); cp -a keeps any
 * other link a source names, and every link below a copied directory, as a
 * link. So the sources are walked over the archive's tree as the kernel
 * resolves paths: at most 40 links followed on one path (more: the path is
 * not there, as ELOOP leaves it to the shell), a link to nothing taking
 * nothing, and a link that must be followed but is absolute or climbs
 * above the context refused, as the sandbox's unpacking refuses it. What
 * a followed link reaches is hashed under the name the copy sees
 * (`link/a.txt`), with the bytes of the file it reaches. */

#define LINK_HOPS_MAX 40
/* The names the sources take, in all: through links, one archive's
 * entries may be taken under many names. */
#define TAKEN_NAME_BYTES_MAX (64u * 1024u * 1024u)

typedef struct Taken {
        char *name; /* as the copy sees it */
        const Entry *e;
} Taken;

typedef struct Walk {
        const Entry *es; /* sorted by name, then place */
        size_t n;
        Taken *taken;
        size_t n_taken, cap_taken;
        uint64_t taken_bytes;
        uint64_t budget; /* steps left before the walk is refused */
        const char *why_out; /* a link leading out, when refused for it */
        char *why;
        size_t why_len;
} Walk;

static int walk_spend(Walk *w) {
        if (w->budget == 0) {
                say(w->why, w->why_len, "its sources reach too many entries through symbolic links");
                return -EFBIG;
        }
        w->budget--;
        return 0;
}

/* The first entry whose name is not before key. */
static size_t lower_bound(const Walk *w, const char *key) {
        size_t lo = 0, hi = w->n;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (strcmp(w->es[mid].name, key) < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

/* The entries under prefix (which ends with '/'): [*lo, *hi). */
static int prefix_range(const Walk *w, const char *prefix, size_t *lo, size_t *hi) {
        size_t len = strlen(prefix);
        _cleanup_free_ char *end = strdup(prefix);
        if (!end)
                return -ENOMEM;
        end[len - 1] = '/' + 1;
        *lo = lower_bound(w, prefix);
        *hi = lower_bound(w, end);
        return 0;
}

/* What path is: the last entry of that name (NULL for a directory the
 * archive only implies, and for the root), and its type; 0: not there. */
static int node(const Walk *w, const char *path, const Entry **ret) {
        *ret = NULL;
        if (!path[0])
                return 'd';
        size_t i = lower_bound(w, path);
        const Entry *e = NULL;
        for (; i < w->n && strcmp(w->es[i].name, path) == 0; i++)
                e = &w->es[i];
        if (e) {
                *ret = e;
                return e->type;
        }
        size_t len = strlen(path);
        return i < w->n && strncmp(w->es[i].name, path, len) == 0 && w->es[i].name[len] == '/' ? 'd' : 0;
}

static char *join(const char *dir, const char *name, size_t name_len) {
        char *out = NULL;
        return asprintf(&out, "%s%s%.*s", dir, dir[0] ? "/" : "", (int)name_len, name) < 0 ? NULL : out;
}

/* path resolved as the kernel does (its last link followed only with
 * follow_last): 0 with *ret and its type, -ENOENT (not there, not a
 * directory on the way, or too many links: the copy finds nothing),
 * -EXDEV (a link out of the context). path's directory is one resolved
 * already (no link in it): the walk starts there. *hops counts the links
 * followed. */
static int resolve(Walk *w, const char *path, bool follow_last, unsigned *hops, char **ret, int *ret_type) {
        const char *slash = strrchr(path, '/');
        _cleanup_free_ char *cur = slash ? strndup(path, (size_t)(slash - path)) : strdup(""),
                            *rest = strdup(slash ? slash + 1 : path);
        if (!cur || !rest)
                return -ENOMEM;
        int type = 'd';
        const char *p = rest;
        for (;;) {
                int r = walk_spend(w);
                if (r < 0)
                        return r;
                p += strspn(p, "/");
                if (!*p)
                        break;
                size_t len = strcspn(p, "/");
                const char *after = p + len + strspn(p + len, "/");
                if (type != 'd')
                        return -ENOENT;
                if (len == 1 && p[0] == '.') {
                        p = after;
                        continue;
                }
                if (len == 2 && p[0] == '.' && p[1] == '.') {
                        if (!cur[0]) {
                                w->why_out = "..";
                                return -EXDEV;
                        }
                        char *up = strrchr(cur, '/');
                        if (up)
                                *up = '\0';
                        else
                                cur[0] = '\0';
                        p = after;
                        continue;
                }
                char *next = join(cur, p, len);
                if (!next)
                        return -ENOMEM;
                const Entry *e;
                type = node(w, next, &e);
                if (!type) {
                        free(next);
                        return -ENOENT;
                }
                if (type == 'l' && (*after || follow_last)) {
                        free(next);
                        if (++*hops > LINK_HOPS_MAX)
                                return -ENOENT;
                        if (e->target[0] == '/' || !e->target[0]) {
                                w->why_out = e->name;
                                return -EXDEV;
                        }
                        char *more = NULL;
                        if (asprintf(&more, "%s/%s", e->target, after) < 0)
                                return -ENOMEM;
                        free(rest);
                        rest = more;
                        p = rest;
                        type = 'd'; /* the link's directory, where its target starts */
                        continue;
                }
                free(cur);
                cur = next;
                p = after;
        }
        *ret_type = type;
        *ret = TAKE_PTR(cur);
        return 0;
}

static int take(Walk *w, const char *name, const Entry *e) {
        int r = walk_spend(w);
        if (r < 0)
                return r;
        size_t len = strlen(name);
        /* Longer than a path may be: the copy cannot reach it either. */
        if (len >= NAME_MAX_BYTES)
                return 0;
        if ((w->taken_bytes += len) > TAKEN_NAME_BYTES_MAX) {
                say(w->why, w->why_len, "its sources take more than %u MiB of names through symbolic links",
                    TAKEN_NAME_BYTES_MAX >> 20);
                return -EFBIG;
        }
        if (w->n_taken == w->cap_taken) {
                size_t nc = w->cap_taken ? w->cap_taken * 2 : 64;
                Taken *m = reallocarray(w->taken, nc, sizeof *m);
                if (!m)
                        return -ENOMEM;
                w->taken = m;
                w->cap_taken = nc;
        }
        char *copy = strdup(name);
        if (!copy)
                return -ENOMEM;
        w->taken[w->n_taken++] = (Taken){ .name = copy, .e = e };
        return 0;
}

/* Every entry below the directory real, named as below logical. */
static int take_below(Walk *w, const char *real, const char *logical) {
        size_t lo = 0, hi = w->n, skip = 0;
        if (real[0]) {
                _cleanup_free_ char *prefix = NULL;
                if (asprintf(&prefix, "%s/", real) < 0)
                        return -ENOMEM;
                skip = strlen(prefix);
                int r = prefix_range(w, prefix, &lo, &hi);
                if (r < 0)
                        return r;
        }
        for (size_t i = lo; i < hi; i++) {
                const char *rel = w->es[i].name + skip;
                _cleanup_free_ char *name = join(logical, rel, strlen(rel));
                int r = name ? take(w, name, &w->es[i]) : -ENOMEM;
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The node a source's last component matched: real is its path in the
 * archive, logical the copy's name for it. */
static int take_node(Walk *w, const char *real, const char *logical, unsigned hops) {
        if (!real[0])
                return take_below(w, "", logical);
        const Entry *e;
        int type = node(w, real, &e), r;
        if (type == 'l') {
                _cleanup_free_ char *to = NULL;
                int to_type;
                r = resolve(w, real, true, &hops, &to, &to_type);
                if (r == -ENOENT)
                        return 0; /* [ -e ] is false: not copied */
                if (r < 0)
                        return r;
                if ((r = take(w, logical, e)) < 0)
                        return r;
                return to_type == 'd' ? take_below(w, to, logical) : 0;
        }
        for (size_t i = lower_bound(w, real); i < w->n && strcmp(w->es[i].name, real) == 0; i++)
                if ((r = take(w, logical, &w->es[i])) < 0)
                        return r;
        return type == 'd' ? take_below(w, real, logical) : 0;
}

static int walk_source(Walk *w, const char *real, const char *logical, const char *pattern, unsigned hops);

static int walk_child(Walk *w, const char *dir, const char *logical, const char *name, size_t len,
                      const char *rest, unsigned hops) {
        _cleanup_free_ char *real = join(dir, name, len), *lname = join(logical, name, len);
        return real && lname ? walk_source(w, real, lname, rest, hops) : -ENOMEM;
}

/* The children of the directory dir whose names comp matches (as
 * context_source_matches matches a component), each walked on with rest. */
static int walk_children(Walk *w, const char *dir, const char *logical, const char *comp, const char *rest,
                         unsigned hops) {
        _cleanup_free_ char *prefix = NULL;
        if (asprintf(&prefix, "%s%s", dir, dir[0] ? "/" : "") < 0)
                return -ENOMEM;
        size_t plen = strlen(prefix), lo = 0, hi = w->n;
        int r = plen ? prefix_range(w, prefix, &lo, &hi) : 0;
        for (size_t i = lo; r == 0 && i < hi;) {
                if ((r = walk_spend(w)) < 0)
                        break;
                const char *c = w->es[i].name + plen;
                size_t len = strcspn(c, "/");
                char name[COMPONENT_MAX + 1];
                memcpy(name, c, len);
                name[len] = '\0';
                bool emit = true;
                if (c[len] == '/') {
                        /* Below a child: once for all of them, unless
                         * the child has an entry of its own. */
                        _cleanup_free_ char *child = join(dir, name, len), *end = NULL;
                        if (!child || asprintf(&end, "%s/", child) < 0)
                                return -ENOMEM;
                        const Entry *e;
                        emit = node(w, child, &e) && !e;
                        size_t sub_lo, sub_hi;
                        if ((r = prefix_range(w, end, &sub_lo, &sub_hi)) < 0)
                                break;
                        i = sub_hi;
                } else
                        for (i++; i < hi && strcmp(w->es[i].name, w->es[i - 1].name) == 0; i++)
                                ;
                if (emit && (strcmp(comp, name) == 0 || fnmatch(comp, name, FNM_PATHNAME | FNM_PERIOD) == 0))
                        r = walk_child(w, dir, logical, name, len, rest, hops);
        }
        return r;
}

/* A source's components from pattern on, matched below real. */
static int walk_source(Walk *w, const char *real, const char *logical, const char *pattern, unsigned hops) {
        int r = walk_spend(w);
        if (r < 0)
                return r;
        pattern += strspn(pattern, "/");
        if (!*pattern)
                return take_node(w, real, logical, hops);
        _cleanup_free_ char *dir = NULL;
        int type;
        r = resolve(w, real, true, &hops, &dir, &type);
        if (r == -ENOENT || (r == 0 && type != 'd'))
                return 0;
        if (r < 0)
                return r;
        size_t len = strcspn(pattern, "/");
        if (len > COMPONENT_MAX)
                return 0;
        char comp[COMPONENT_MAX + 1];
        memcpy(comp, pattern, len);
        comp[len] = '\0';
        /* A plain name is looked up, not matched against every child. */
        if (!strpbrk(comp, "*?[\\")) {
                _cleanup_free_ char *child = join(dir, comp, len);
                const Entry *e;
                if (!child)
                        return -ENOMEM;
                return node(w, child, &e) ? walk_child(w, dir, logical, comp, len, pattern + len, hops) : 0;
        }
        return walk_children(w, dir, logical, comp, pattern + len, hops);
}

static int taken_cmp(const void *x, const void *y) {
        const Taken *a = x, *b = y;
        int c = strcmp(a->name, b->name);
        return c ? c : a->e->seq < b->e->seq ? -1 : a->e->seq > b->e->seq;
}

/* The digest of what the sources take of es (all the archive's entries,
 * sorted): each taken entry once, under the copy's name for it. */
static int digest_taken(const Entry *es, size_t n_es, const char *const *sources, size_t n_sources,
                        const ContextDigestLimits *lim, char ret_hex[65], char *why, size_t why_len) {
        Walk w = { .es = es, .n = n_es, .budget = (n_sources + 16) * lim->max_entries + 4096, .why = why,
                   .why_len = why_len };
        int r = 0;
        for (size_t i = 0; i < n_sources && r == 0; i++)
                r = walk_source(&w, "", "", sources[i], 0);
        if (r == -EXDEV) {
                r = -EPERM;
                say(why, why_len, "a symbolic link a source goes through leads out of the context: %.200s",
                    w.why_out ? w.why_out : "");
        }
        EVP_MD_CTX *md = r == 0 ? EVP_MD_CTX_new() : NULL;
        if (r == 0 && (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1))
                r = -ENOMEM;
        if (r == 0) {
                if (w.n_taken > 1)
                        qsort(w.taken, w.n_taken, sizeof *w.taken, taken_cmp);
                size_t n = 0;
                for (size_t i = 0; i < w.n_taken; i++)
                        if (n == 0 || w.taken[i].e != w.taken[n - 1].e || strcmp(w.taken[i].name, w.taken[n - 1].name))
                                w.taken[n++] = w.taken[i];
                        else
                                free(w.taken[i].name);
                w.n_taken = n;
                put_bytes(md, "context sources 1", 17);
                put_u64(md, n);
                for (size_t i = 0; i < n; i++) {
                        const Entry *e = w.taken[i].e;
                        put_bytes(md, w.taken[i].name, strlen(w.taken[i].name));
                        put_bytes(md, &e->type, 1);
                        put_u64(md, e->mode);
                        put_bytes(md, e->target, strlen(e->target));
                        put_u64(md, e->size);
                        put_bytes(md, e->content, e->type == 'f' ? 32 : 0);
                }
                uint8_t d[32];
                unsigned dl = 0;
                EVP_DigestFinal_ex(md, d, &dl);
                hex_encode(d, 32, ret_hex);
                ret_hex[64] = '\0';
        }
        EVP_MD_CTX_free(md);
        for (size_t i = 0; i < w.n_taken; i++)
                free(w.taken[i].name);
        free(w.taken);
        return r;
}

int context_digest(ContextReadFn read_fn, void *userdata, const char *const *sources, size_t n_sources,
                   const ContextDigestLimits *lim, char ret_hex[65], char *why, size_t why_len) {
        Reader rd = { .fn = read_fn, .userdata = userdata };
        struct archive *a = archive_read_new();
        _cleanup_free_ uint8_t *buf = malloc(READ_BUF);
        Entry *es = NULL;
        size_t n_es = 0, cap = 0, seq = 0;
        uint64_t declared = 0;
        int r = 0;
        if (why_len)
                why[0] = '\0';
        if (!a || !buf || archive_read_support_filter_gzip(a) != ARCHIVE_OK ||
            archive_read_support_format_tar(a) != ARCHIVE_OK) {
                r = -ENOMEM;
                goto out;
        }
        if (archive_read_open(a, &rd, NULL, read_cb, NULL) != ARCHIVE_OK) {
                r = rd.error ? rd.error : -EBADMSG;
                say(why, why_len, "it is not a tar archive: %s", archive_error_string(a));
                goto out;
        }
        for (;;) {
                struct archive_entry *ae = NULL;
                int k = archive_read_next_header(a, &ae);
                if (k == ARCHIVE_EOF)
                        break;
                if (k != ARCHIVE_OK && k != ARCHIVE_WARN) {
                        r = rd.error ? rd.error : -EBADMSG;
                        say(why, why_len, "the archive is malformed: %s", archive_error_string(a));
                        goto out;
                }
                if (++seq > lim->max_entries) {
                        r = -EFBIG;
                        say(why, why_len, "it has more than %llu entries", (unsigned long long)lim->max_entries);
                        goto out;
                }
                const char *bad = NULL;
                _cleanup_free_ char *name = NULL;
                if ((r = clean_name(archive_entry_pathname(ae), &name, &bad)) < 0) {
                        say(why, why_len, "%s", bad ? bad : "out of memory");
                        goto out;
                }
                uint8_t type;
                const char *target = "";
                _cleanup_free_ char *hard = NULL;
                mode_t ft = archive_entry_filetype(ae);
                if (archive_entry_hardlink(ae)) {
                        type = 'h';
                        if ((r = clean_name(archive_entry_hardlink(ae), &hard, &bad)) < 0 || !hard) {
                                r = r < 0 ? r : -EPERM;
                                say(why, why_len, "a hard link's target: %s", bad ? bad : "the context's root");
                                goto out;
                        }
                        target = hard;
                } else if (ft == AE_IFREG)
                        type = 'f';
                else if (ft == AE_IFDIR)
                        type = 'd';
                else if (ft == AE_IFLNK) {
                        type = 'l';
                        target = archive_entry_symlink(ae);
                        if (!target || strlen(target) >= NAME_MAX_BYTES) {
                                r = -EPERM;
                                say(why, why_len, "a symbolic link's target is missing or too long");
                                goto out;
                        }
                } else {
                        r = -EPERM;
                        say(why, why_len, "%.200s is not a file, directory or link", name ? name : ".");
                        goto out;
                }
                int64_t size = type == 'f' ? archive_entry_size(ae) : 0;
                if (size < 0 || (uint64_t)size > lim->max_bytes - declared) {
                        r = -EFBIG;
                        say(why, why_len, "its files are larger than %llu bytes",
                            (unsigned long long)lim->max_bytes);
                        goto out;
                }
                declared += (uint64_t)size;
                if (!name)
                        continue;
                if (n_es == cap) {
                        size_t nc = cap ? cap * 2 : 64;
                        Entry *m = reallocarray(es, nc, sizeof *m);
                        if (!m) {
                                r = -ENOMEM;
                                goto out;
                        }
                        es = m;
                        cap = nc;
                }
                Entry *e = &es[n_es];
                *e = (Entry){ .type = type, .mode = (uint32_t)(archive_entry_perm(ae) & 07777), .size = (uint64_t)size,
                              .seq = seq };
                e->target = strdup(target);
                if (!e->target) {
                        r = -ENOMEM;
                        goto out;
                }
                e->name = TAKE_PTR(name);
                n_es++;
                if (type == 'f' && (r = hash_content(a, e, buf)) < 0) {
                        r = rd.error ? rd.error : r;
                        say(why, why_len, "%.200s is cut short: %s", e->name,
                            archive_error_string(a) ? archive_error_string(a) : "its data ends early");
                        goto out;
                }
        }
        if (n_es > 1)
                qsort(es, n_es, sizeof *es, entry_cmp);
        r = digest_taken(es, n_es, sources, n_sources, lim, ret_hex, why, why_len);
out:
        for (size_t i = 0; i < n_es; i++) {
                free(es[i].name);
                free(es[i].target);
        }
        free(es);
        if (a)
                archive_read_free(a);
        if (r == -ENOMEM && why_len && !why[0])
                say(why, why_len, "out of memory");
        return r;
}
