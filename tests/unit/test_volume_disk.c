/*
 * A volume's image between the host and guest kernels (src/driver/
 * volume_disk.c): the holds a microVM's start takes (shared for reading,
 * exclusive for writing), that a duplicate of the descriptor (QEMU's) keeps
 * them, and that a host mount refuses an image a guest holds. The image is
 * a plain file: the locks are the subject, not ext4. Its directory is the
 * build tree's (O_DIRECT, which a hold asks for, is refused by some tmpfs).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "driver/volume_disk.h"

static char dir[PATH_MAX], img[PATH_MAX + 16], mnt[PATH_MAX + 16];

static int setup(void **state) {
        (void)state;
        snprintf(dir, sizeof dir, "build/tests/volume-disk-XXXXXX");
        if (!mkdtemp(dir))
                return -1;
        snprintf(img, sizeof img, "%s/v.img", dir);
        snprintf(mnt, sizeof mnt, "%s/v.mnt", dir);
        int fd = open(img, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 || ftruncate(fd, 1 << 20) < 0)
                return -1;
        close(fd);
        return 0;
}

static int teardown(void **state) {
        (void)state;
        unlink(img);
        rmdir(mnt);
        rmdir(dir);
        return 0;
}

static void test_readers_share_a_writer_excludes(void **state) {
        (void)state;
        int a = -1, b = -1, w = -1;
        assert_false(volume_disk_held(img));
        assert_int_equal(volume_disk_hold(img, true, &a), 0);
        assert_int_equal(volume_disk_hold(img, true, &b), 0);
        assert_true(volume_disk_held(img));
        assert_int_equal(volume_disk_hold(img, false, &w), -EBUSY);
        close(a);
        assert_int_equal(volume_disk_hold(img, false, &w), -EBUSY);
        close(b);
        assert_false(volume_disk_held(img));
        assert_int_equal(volume_disk_hold(img, false, &w), 0);
        assert_int_equal(volume_disk_hold(img, true, &a), -EBUSY);
        assert_int_equal(volume_disk_hold(img, false, &a), -EBUSY);
        close(w);
        assert_false(volume_disk_held(img));
}

/* The daemon closes its descriptor after the start; QEMU's duplicate keeps
 * the hold until QEMU ends. */
static void test_a_duplicate_keeps_the_hold(void **state) {
        (void)state;
        int w = -1, other = -1;
        assert_int_equal(volume_disk_hold(img, false, &w), 0);
        int vmm = fcntl(w, F_DUPFD_CLOEXEC, 3);
        assert_true(vmm >= 0);
        close(w);
        assert_true(volume_disk_held(img));
        assert_int_equal(volume_disk_hold(img, true, &other), -EBUSY);
        close(vmm);
        assert_false(volume_disk_held(img));
}

/* The host does not mount what a guest holds, even to read. */
static void test_host_mount_refused_while_held(void **state) {
        (void)state;
        int r = -1;
        assert_int_equal(volume_disk_hold(img, true, &r), 0);
        assert_int_equal(volume_disk_mount(img, mnt), -EBUSY);
        assert_false(volume_disk_mounted(mnt));
        close(r);
}

static void test_missing_image(void **state) {
        (void)state;
        char nope[PATH_MAX + 32];
        int fd = -1;
        snprintf(nope, sizeof nope, "%s/none.img", dir);
        assert_int_equal(volume_disk_hold(nope, true, &fd), -ENOENT);
        assert_false(volume_disk_held(nope));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_readers_share_a_writer_excludes),
                cmocka_unit_test(test_a_duplicate_keeps_the_hold),
                cmocka_unit_test(test_host_mount_refused_while_held),
                cmocka_unit_test(test_missing_image),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
