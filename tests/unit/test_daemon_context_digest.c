/* The digest of a COPY's sources read from a build context's archive
 * (context_digest.h): the matcher, what changes the digest and what does
 * not, and hostile archives refused. The archives are made here, a ustar
 * header at a time. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/manager/context_digest.h"

/* A number in octal filling a field of width bytes (its last a NUL). */
static void octal(uint8_t *field, size_t width, unsigned long long v) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "%0*llo", (int)width - 1, v);
        memcpy(field, tmp, width - 1);
}

typedef struct Tar {
        uint8_t buf[64 * 1024];
        size_t len;
} Tar;

/* One member: type '0' (file), '5' (directory), '2' (symbolic link), '3'
 * (character device); data is the file's (NULL: size bytes declared, none
 * written). */
static void tar_add(Tar *t, const char *name, char type, unsigned mode, const char *link, const char *data,
                    unsigned long long size) {
        uint8_t *h = t->buf + t->len;
        memset(h, 0, 512);
        snprintf((char *)h, 100, "%s", name);
        octal(h + 100, 8, mode);
        octal(h + 108, 8, 0);
        octal(h + 116, 8, 0);
        octal(h + 124, 12, size);
        octal(h + 136, 12, 0);
        h[156] = (uint8_t)type;
        if (link)
                snprintf((char *)h + 157, 100, "%s", link);
        memcpy(h + 257, "ustar", 6);
        memcpy(h + 263, "00", 2);
        memset(h + 148, ' ', 8);
        unsigned sum = 0;
        for (int i = 0; i < 512; i++)
                sum += h[i];
        octal(h + 148, 7, sum);
        t->len += 512;
        if (data) {
                memcpy(t->buf + t->len, data, size);
                t->len += (size + 511) / 512 * 512;
        }
}

static void tar_end(Tar *t) {
        memset(t->buf + t->len, 0, 1024);
        t->len += 1024;
}

typedef struct Feed {
        const uint8_t *p;
        size_t len, at;
} Feed;

/* The archive in pieces of 100 bytes, as chunks come. */
static ssize_t feed(void *userdata, const void **ret_buf) {
        Feed *f = userdata;
        size_t n = f->len - f->at < 100 ? f->len - f->at : 100;
        *ret_buf = f->p + f->at;
        f->at += n;
        return (ssize_t)n;
}

static const ContextDigestLimits LIM = { .max_bytes = 1024ull * 1024 * 1024, .max_entries = 20000 };

static int digest_of(const Tar *t, const char *const *src, size_t n, const ContextDigestLimits *lim, char hex[65],
                     char *why) {
        Feed f = { .p = t->buf, .len = t->len };
        return context_digest(feed, &f, src, n, lim ? lim : &LIM, hex, why, 256);
}

static void test_matcher(void **state) {
        assert_true(context_source_matches("", "a/b"));
        assert_true(context_source_matches("app", "app"));
        assert_true(context_source_matches("app", "app/x/y"));
        assert_false(context_source_matches("app", "apple"));
        assert_false(context_source_matches("app/x", "app"));
        assert_true(context_source_matches("*.txt", "a.txt"));
        assert_false(context_source_matches("*.txt", "d/a.txt"));
        assert_true(context_source_matches("*/a.txt", "d/a.txt"));
        assert_false(context_source_matches("*", ".hidden"));
        assert_true(context_source_matches(".*", ".hidden"));
        assert_true(context_source_matches("d/?", "d/a/f"));
        assert_false(context_source_matches("d/?", "d/ab"));
        assert_true(context_source_matches("[ab]*", "bz"));
        assert_false(context_source_matches("[ab]*", "cz"));
        /* A pattern matching nothing is the name itself, as the shell keeps it. */
        assert_true(context_source_matches("x[", "x["));
}

/* The context: a.txt, b.txt, d/x, a link l; variant changes one thing. */
static void context(Tar *t, int variant) {
        t->len = 0;
        if (variant == 4)
                tar_add(t, "b.txt", '0', 0644, NULL, "bee", 3);
        tar_add(t, "./a.txt", '0', variant == 2 ? 0755 : 0644, NULL, variant == 1 ? "AAA" : "aaa", 3);
        if (variant != 4)
                tar_add(t, "b.txt", '0', 0644, NULL, variant == 3 ? "BEE" : "bee", 3);
        tar_add(t, "d/x", '0', 0600, NULL, "x", 1);
        tar_add(t, "l", '2', 0777, variant == 5 ? "b.txt" : "a.txt", NULL, 0);
        tar_end(t);
}

static void test_digest_changes(void **state) {
        static Tar t;
        char base[65], hex[65], why[256];
        const char *a[] = { "a.txt", "l" };
        context(&t, 0);
        assert_int_equal(digest_of(&t, a, 2, NULL, base, why), 0);
        assert_int_equal(strlen(base), 64);
        /* Content, mode and link target of a taken entry: a miss. */
        for (int v = 1; v <= 5; v++) {
                context(&t, v);
                assert_int_equal(digest_of(&t, a, 2, NULL, hex, why), 0);
                if (v == 1 || v == 2 || v == 5)
                        assert_string_not_equal(hex, base);
                else /* b.txt changed, or the archive's order: the same */
                        assert_string_equal(hex, base);
        }
        /* Other sources, other digests; a directory takes what is below it. */
        const char *d[] = { "d" }, *dx[] = { "d/x" }, *all[] = { "" };
        context(&t, 0);
        char hd[65], hdx[65], hall[65];
        assert_int_equal(digest_of(&t, d, 1, NULL, hd, why), 0);
        assert_int_equal(digest_of(&t, dx, 1, NULL, hdx, why), 0);
        assert_string_equal(hd, hdx);
        assert_int_equal(digest_of(&t, all, 1, NULL, hall, why), 0);
        assert_string_not_equal(hall, hd);
        assert_string_not_equal(hall, base);
        /* b.txt is in the whole context. */
        context(&t, 3);
        assert_int_equal(digest_of(&t, all, 1, NULL, hex, why), 0);
        assert_string_not_equal(hex, hall);
}

static void refused(Tar *t, int want, const char *why_has) {
        char hex[65], why[256];
        const char *all[] = { "" };
        assert_int_equal(digest_of(t, all, 1, NULL, hex, why), want);
        if (!strstr(why, why_has))
                fail_msg("why: \"%s\" lacks \"%s\"", why, why_has);
}

static void test_hostile(void **state) {
        static Tar t;
        t.len = 0;
        tar_add(&t, "../x", '0', 0644, NULL, "x", 1);
        tar_end(&t);
        refused(&t, -EPERM, "..");
        t.len = 0;
        tar_add(&t, "a/../../x", '0', 0644, NULL, "x", 1);
        tar_end(&t);
        refused(&t, -EPERM, "..");
        t.len = 0;
        tar_add(&t, "/etc/passwd", '0', 0644, NULL, "x", 1);
        tar_end(&t);
        refused(&t, -EPERM, "absolute");
        t.len = 0;
        tar_add(&t, "a//b", '0', 0644, NULL, "x", 1);
        tar_end(&t);
        refused(&t, -EPERM, "empty");
        t.len = 0;
        tar_add(&t, "dev", '3', 0644, NULL, NULL, 0);
        tar_end(&t);
        refused(&t, -EPERM, "not a file");
        /* A size past the bound, declared, nothing behind it. */
        t.len = 0;
        tar_add(&t, "big", '0', 0644, NULL, NULL, 2ull * 1024 * 1024 * 1024);
        refused(&t, -EFBIG, "larger than");
        /* Data cut short: of a taken file, and of one skipped. */
        t.len = 0;
        tar_add(&t, "cut", '0', 0644, NULL, NULL, 5000);
        memset(t.buf + t.len, 'z', 1000);
        t.len += 1000;
        refused(&t, -EBADMSG, "cut");
        char hex[65], why[256];
        const char *other[] = { "other" };
        assert_int_equal(digest_of(&t, other, 1, NULL, hex, why), -EBADMSG);
        /* Not an archive. */
        t.len = 0;
        memset(t.buf, 'q', 2048);
        t.len = 2048;
        refused(&t, -EBADMSG, "");
        /* Too many entries. */
        t.len = 0;
        for (int i = 0; i < 5; i++) {
                char n[16];
                snprintf(n, sizeof n, "f%d", i);
                tar_add(&t, n, '0', 0644, NULL, "x", 1);
        }
        tar_end(&t);
        const ContextDigestLimits few = { .max_bytes = 1024, .max_entries = 4 };
        const char *all[] = { "" };
        assert_int_equal(digest_of(&t, all, 1, &few, hex, why), -EFBIG);
        assert_non_null(strstr(why, "more than 4 entries"));
}

/* real/a.txt, real/sub/b, link -> real, file -> real/a.txt; variant 1
 * changes real/a.txt, 2 real/sub/b, 3 the link's target (real2, the same
 * files), 4 other.txt (not reached). */
static void linked(Tar *t, int variant) {
        t->len = 0;
        tar_add(t, "link", '2', 0777, variant == 3 ? "real2" : "real", NULL, 0);
        tar_add(t, "file", '2', 0777, "real/a.txt", NULL, 0);
        const char *dirs[] = { "real", "real2" };
        for (int i = 0; i < 2; i++) {
                char n[64];
                snprintf(n, sizeof n, "%s/a.txt", dirs[i]);
                tar_add(t, n, '0', 0644, NULL, variant == 1 ? "AAA" : "aaa", 3);
                snprintf(n, sizeof n, "%s/sub/b", dirs[i]);
                tar_add(t, n, '0', 0644, NULL, variant == 2 ? "B" : "b", 1);
        }
        tar_add(t, "other.txt", '0', 0644, NULL, variant == 4 ? "O" : "o", 1);
        tar_end(t);
}

/* Which of linked()'s variants change the digest of src: a bit each. */
static unsigned linked_changes(const char *src) {
        static Tar t;
        char base[65], hex[65], why[256];
        const char *s[] = { src };
        linked(&t, 0);
        if (digest_of(&t, s, 1, NULL, base, why) != 0)
                fail_msg("%s: %s", src, why);
        unsigned out = 0;
        for (int v = 1; v <= 4; v++) {
                linked(&t, v);
                assert_int_equal(digest_of(&t, s, 1, NULL, hex, why), 0);
                out |= (unsigned)(strcmp(hex, base) != 0) << v;
        }
        return out;
}

/* A link a source goes through is followed as the copy's shell follows
 * it; a link the copy keeps as a link is hashed as its target. */
static void test_links_followed(void **state) {
        /* Through a directory's link: its files' bytes (real2 holds the
         * same: a link passed through is not itself copied). */
        assert_int_equal(linked_changes("link/a.txt"), 1u << 1);
        assert_int_equal(linked_changes("link"), 1u << 1 | 1u << 2 | 1u << 3);
        assert_int_equal(linked_changes("link/*"), 1u << 1 | 1u << 2);
        assert_int_equal(linked_changes("l*/s?b/b"), 1u << 2);
        /* A link to a file is copied as a link: its target's bytes are not
         * what is copied. */
        assert_int_equal(linked_changes("file"), 0);
        /* The whole context: every file once, links as links. */
        assert_int_equal(linked_changes(""), 1u << 1 | 1u << 2 | 1u << 3 | 1u << 4);
        /* The name the copy sees is hashed: link/a.txt is not real/a.txt. */
        static Tar t;
        char h1[65], h2[65], why[256];
        const char *a[] = { "link/a.txt" }, *b[] = { "real/a.txt" };
        linked(&t, 0);
        assert_int_equal(digest_of(&t, a, 1, NULL, h1, why), 0);
        assert_int_equal(digest_of(&t, b, 1, NULL, h2, why), 0);
        assert_string_not_equal(h1, h2);
}

/* A chain of links, a loop, links to nothing, out of the context. */
static void test_links_hostile(void **state) {
        static Tar t;
        char hex[65], empty[65], h2[65], why[256];
        const char *none[] = { "missing" };
        t.len = 0;
        tar_add(&t, "real/a.txt", '0', 0644, NULL, "aaa", 3);
        tar_add(&t, "c1", '2', 0777, "c2", NULL, 0);
        tar_add(&t, "c2", '2', 0777, "d/c3", NULL, 0);
        tar_add(&t, "d/c3", '2', 0777, "../real", NULL, 0);
        tar_add(&t, "loop1", '2', 0777, "loop2", NULL, 0);
        tar_add(&t, "loop2", '2', 0777, "loop1", NULL, 0);
        tar_add(&t, "self", '2', 0777, ".", NULL, 0);
        tar_add(&t, "dangling", '2', 0777, "nothing", NULL, 0);
        tar_end(&t);
        assert_int_equal(digest_of(&t, none, 1, NULL, empty, why), 0);
        /* A chain: followed to real's bytes. */
        const char *chain[] = { "c1/a.txt" }, *real[] = { "real/a.txt" };
        assert_int_equal(digest_of(&t, chain, 1, NULL, hex, why), 0);
        assert_string_not_equal(hex, empty);
        assert_int_equal(digest_of(&t, real, 1, NULL, h2, why), 0);
        assert_string_not_equal(hex, h2);
        /* A loop, and a link to nothing: the copy finds nothing there. */
        const char *loop[] = { "loop1/a.txt" }, *dangling[] = { "dangling" }, *dangling_in[] = { "dangling/x" };
        assert_int_equal(digest_of(&t, loop, 1, NULL, hex, why), 0);
        assert_string_equal(hex, empty);
        assert_int_equal(digest_of(&t, dangling, 1, NULL, hex, why), 0);
        assert_string_equal(hex, empty);
        assert_int_equal(digest_of(&t, dangling_in, 1, NULL, hex, why), 0);
        assert_string_equal(hex, empty);
        /* self/self/... : 40 links on one path at most, as the kernel. */
        char deep[256] = "", deeper[sizeof deep + 16];
        for (int i = 0; i < 40; i++)
                strcat(deep, "self/");
        snprintf(deeper, sizeof deeper, "%sself/real/a.txt", deep);
        strcat(deep, "real/a.txt");
        const char *d40[] = { deep }, *d41[] = { deeper };
        assert_int_equal(digest_of(&t, d40, 1, NULL, hex, why), 0);
        assert_string_not_equal(hex, empty);
        assert_int_equal(digest_of(&t, d41, 1, NULL, hex, why), 0);
        assert_string_equal(hex, empty);
        /* Globs over a loop end within their bound. */
        const char *globs[] = { "*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*" };
        int r = digest_of(&t, globs, 1, NULL, hex, why);
        assert_true(r == 0 || r == -EFBIG);
        /* Out of the context, absolute or above it: refused when followed,
         * as the sandbox's unpacking refuses them; hashed as links when
         * the copy keeps them as links. */
        const char *targets[] = { "/etc", "..", "../..", "d/../../x" };
        for (size_t i = 0; i < 4; i++) {
                t.len = 0;
                tar_add(&t, "d/x", '0', 0644, NULL, "x", 1);
                tar_add(&t, "out", '2', 0777, targets[i], NULL, 0);
                tar_end(&t);
                const char *through[] = { "out/passwd" }, *as_dir[] = { "out" }, *glob[] = { "o*/*" };
                assert_int_equal(digest_of(&t, through, 1, NULL, hex, why), -EPERM);
                if (!strstr(why, "leads out of the context"))
                        fail_msg("%s: why: %s", targets[i], why);
                assert_int_equal(digest_of(&t, as_dir, 1, NULL, hex, why), -EPERM);
                assert_int_equal(digest_of(&t, glob, 1, NULL, hex, why), -EPERM);
                const char *d[] = { "d" };
                assert_int_equal(digest_of(&t, d, 1, NULL, hex, why), 0);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_matcher),
                cmocka_unit_test(test_digest_changes),
                cmocka_unit_test(test_hostile),
                cmocka_unit_test(test_links_followed),
                cmocka_unit_test(test_links_hostile),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
