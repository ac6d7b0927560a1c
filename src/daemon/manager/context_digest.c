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

/* The content of the current entry hashed into e (only a taken one's is
 * read; the others are skipped by the next header). */
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
                bool take = false;
                for (size_t i = 0; i < n_sources && !take; i++)
                        take = context_source_matches(sources[i], name);
                if (!take)
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
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
                EVP_MD_CTX_free(md);
                r = -ENOMEM;
                goto out;
        }
        put_bytes(md, "context sources 1", 17);
        put_u64(md, n_es);
        for (size_t i = 0; i < n_es; i++) {
                put_bytes(md, es[i].name, strlen(es[i].name));
                put_bytes(md, &es[i].type, 1);
                put_u64(md, es[i].mode);
                put_bytes(md, es[i].target, strlen(es[i].target));
                put_u64(md, es[i].size);
                put_bytes(md, es[i].content, es[i].type == 'f' ? 32 : 0);
        }
        uint8_t d[32];
        unsigned dl = 0;
        EVP_DigestFinal_ex(md, d, &dl);
        EVP_MD_CTX_free(md);
        hex_encode(d, 32, ret_hex);
        ret_hex[64] = '\0';
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
