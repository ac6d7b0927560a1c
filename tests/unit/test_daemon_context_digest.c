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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_matcher),
                cmocka_unit_test(test_digest_changes),
                cmocka_unit_test(test_hostile),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
