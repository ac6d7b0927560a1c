/*
 * A microVM disk made of another driver's layers (src/driver/microvm_layers.c),
 * without a guest: two ext4 layers made here with mke2fs -d (as a namespace
 * sandbox's would hold them: owners of the host's shifted range, whiteouts,
 * opaque directories, an ACL and a file capability of the shifted root), the
 * disk made from them, then read back through a read-only mount of it. Also:
 * two callers at once make it once, a dot name a killed conversion left goes,
 * a tree too deep is refused and leaves nothing; a registry's tree beneath
 * the layers is the whole root, the built-in root hidden. Needs root, mke2fs and loop
 * devices; skips with the reason otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/macro.h"
#include "common/path.h"
#include "driver/microvm_layers.h"
#include "driver/rootfs.h"

#define SHIFT 100000u

static char work[256];

static bool usable(void) {
        if (geteuid() != 0) {
                print_message("skipped: needs root (loop devices, mounts)\n");
                return false;
        }
        if (access("/usr/sbin/mke2fs", X_OK) < 0 && access("/sbin/mke2fs", X_OK) < 0) {
                print_message("skipped: mke2fs is not installed\n");
                return false;
        }
        if (access("/dev/loop-control", F_OK) < 0) {
                print_message("skipped: no /dev/loop-control\n");
                return false;
        }
        return true;
}

static void put(const char *dir, const char *name, const char *text, uid_t uid, mode_t mode) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, name);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        assert_int_equal(fchown(fd, uid, uid), 0);
        assert_int_equal(fchmod(fd, mode), 0);
        close(fd);
}

static void dir_at(const char *dir, const char *name, bool opaque) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, name);
        assert_int_equal(mkdir(p, 0755), 0);
        assert_int_equal(chown(p, SHIFT, SHIFT), 0);
        if (opaque)
                assert_int_equal(setxattr(p, "trusted.overlay.opaque", "y", 1, 0), 0);
}

static void whiteout(const char *dir, const char *name) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, name);
        assert_int_equal(mknod(p, S_IFCHR, makedev(0, 0)), 0);
        assert_int_equal(lchown(p, SHIFT, SHIFT), 0);
}

/* tree (its upper/ made by fill) as the ext4 file img. */
static void mkfs_from(const char *tree, const char *img) {
        char cmd[3 * PATH_MAX];
        snprintf(cmd, sizeof cmd, "mke2fs -q -F -t ext4 -d '%s' '%s' 64M >/dev/null 2>&1", tree, img);
        assert_int_equal(system(cmd), 0);
}

/* A snapshot's directory of an image whose build made two layers. */
static void two_layers(const char *snap) {
        char tree[600], up[1024], img[1024];
        assert_int_equal(mkdir(snap, 0700), 0);
        snprintf(img, sizeof img, "%s/bases", snap);
        assert_int_equal(mkdir(img, 0700), 0);

        /* The older layer: what the first steps made. */
        snprintf(tree, sizeof tree, "%s-tree0", snap);
        snprintf(up, sizeof up, "%s/upper", tree);
        assert_int_equal(mkdir(tree, 0755), 0);
        assert_int_equal(mkdir(up, 0755), 0);
        dir_at(up, "opt", false);
        dir_at(up, "etc", false);
        put(up, "opt/a.txt", "a\n", SHIFT + 1000, 0640);
        put(up, "opt/gone.txt", "gone\n", SHIFT, 0644);
        put(up, "opt/h1", "linked\n", SHIFT, 04755);
        char p1[PATH_MAX], p2[PATH_MAX];
        snprintf(p1, sizeof p1, "%s/opt/h1", up);
        snprintf(p2, sizeof p2, "%s/opt/h2", up);
        assert_int_equal(link(p1, p2), 0);
        dir_at(up, "opt/dir", false);
        put(up, "opt/dir/old", "old\n", SHIFT, 0644);
        whiteout(up, "etc/deleted");
        dir_at(up, "etc/opq", true);
        put(up, "etc/opq/x", "x\n", SHIFT, 0644);
        /* An ACL naming the sandbox user (host uid SHIFT + 1000) and a
         * capability of the shifted root (version 3, rootid SHIFT). */
        struct __attribute__((packed)) {
                uint32_t version;
                struct { uint16_t tag, perm; uint32_t id; } e[5];
        } acl = { 2, { { 0x01, 6, UINT32_MAX }, { 0x02, 4, SHIFT + 1000 }, { 0x04, 4, UINT32_MAX },
                       { 0x10, 4, UINT32_MAX }, { 0x20, 0, UINT32_MAX } } };
        assert_int_equal(setxattr(up, "user.mark", "m", 1, 0), 0);
        snprintf(p1, sizeof p1, "%s/opt/a.txt", up);
        assert_int_equal(setxattr(p1, "system.posix_acl_access", &acl, sizeof acl, 0), 0);
        uint32_t caps[6] = { 0x03000001u, 1u << 13, 0, 0, 0, SHIFT }; /* cap_net_raw, effective */
        snprintf(p1, sizeof p1, "%s/opt/h1", up);
        assert_int_equal(setxattr(p1, "security.capability", caps, sizeof caps, 0), 0);
        snprintf(img, sizeof img, "%s/bases/0.img", snap);
        mkfs_from(tree, img);

        /* The newer layer: a step that deleted and replaced the older's files. */
        snprintf(tree, sizeof tree, "%s-tree1", snap);
        snprintf(up, sizeof up, "%s/upper", tree);
        assert_int_equal(mkdir(tree, 0755), 0);
        assert_int_equal(mkdir(up, 0755), 0);
        dir_at(up, "opt", false);
        whiteout(up, "opt/gone.txt");
        dir_at(up, "opt/dir", true);
        put(up, "opt/dir/new", "new\n", SHIFT, 0644);
        put(up, "opt/stranger", "s\n", 5, 0600);
        snprintf(p1, sizeof p1, "%s/opt/escape", up);
        assert_int_equal(symlink("/etc/shadow", p1), 0);
        snprintf(img, sizeof img, "%s/layer.img", snap);
        mkfs_from(tree, img);
}

static int mount_ro(const char *img) {
        int loop = -1;
        char dev[64];
        assert_int_equal(rootfs_loop_attach(img, true, &loop, dev, sizeof dev), 0);
        int fs = fsopen("ext4", FSOPEN_CLOEXEC);
        assert_true(fs >= 0);
        assert_int_equal(fsconfig(fs, FSCONFIG_SET_STRING, "source", dev, 0), 0);
        assert_int_equal(fsconfig(fs, FSCONFIG_SET_FLAG, "ro", NULL, 0), 0);
        assert_int_equal(fsconfig(fs, FSCONFIG_SET_FLAG, "noload", NULL, 0), 0);
        assert_int_equal(fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0), 0);
        int m = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY);
        assert_true(m >= 0);
        close(fs);
        close(loop);
        int root = openat(m, "upper", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(root >= 0);
        close(m);
        return root;
}

static void expect_text(int dir, const char *name, const char *want) {
        char buf[64] = "";
        int fd = openat(dir, name, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        assert_true(n >= 0);
        assert_string_equal(buf, want);
}

static void test_flattened(void **state) {
        (void)state;
        if (!usable())
                skip();
        char snap[512], disk[1024];
        snprintf(snap, sizeof snap, "%s/snap", work);
        two_layers(snap);
        bool made = false;
        assert_int_equal(microvm_layers_disk(snap, 64, SHIFT, NULL, &made), 0);
        assert_true(made);
        snprintf(disk, sizeof disk, "%s/upper.ext4", snap);
        struct stat d1, d2, st, st2;
        assert_int_equal(stat(disk, &d1), 0);
        assert_int_equal(d1.st_size, 64 << 20);
        /* Made once: a second call finds it. */
        assert_int_equal(microvm_layers_disk(snap, 64, SHIFT, NULL, &made), 0);
        assert_false(made);
        assert_int_equal(stat(disk, &d2), 0);
        assert_int_equal(d1.st_ino, d2.st_ino);

        int up = mount_ro(disk);
        expect_text(up, "opt/a.txt", "a\n");
        assert_int_equal(fstatat(up, "opt/a.txt", &st, 0), 0);
        assert_int_equal(st.st_uid, 1000);
        assert_int_equal(st.st_gid, 1000);
        assert_int_equal(st.st_mode & 07777, 0640);
        uint32_t acl[11];
        int fd = openat(up, "opt/a.txt", O_RDONLY | O_CLOEXEC);
        assert_int_equal(fgetxattr(fd, "system.posix_acl_access", acl, sizeof acl), 44);
        close(fd);
        assert_int_equal(acl[4], 1000); /* the named user, shifted */
        /* The newer layer's whiteout over the older's file, and its opaque
         * directory over the older's. */
        assert_int_equal(fstatat(up, "opt/gone.txt", &st, AT_SYMLINK_NOFOLLOW), 0);
        assert_true(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
        assert_int_equal(fstatat(up, "opt/dir/old", &st, AT_SYMLINK_NOFOLLOW), -1);
        expect_text(up, "opt/dir/new", "new\n");
        char v[4] = "";
        fd = openat(up, "opt/dir", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_int_equal(fgetxattr(fd, "trusted.overlay.opaque", v, sizeof v), 1);
        close(fd);
        assert_int_equal(v[0], 'y');
        /* The older layer's whiteout over the image's file, and its opaque
         * directory, kept for the image beneath. */
        assert_int_equal(fstatat(up, "etc/deleted", &st, AT_SYMLINK_NOFOLLOW), 0);
        assert_true(S_ISCHR(st.st_mode) && st.st_uid == 0);
        fd = openat(up, "etc/opq", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_int_equal(fgetxattr(fd, "trusted.overlay.opaque", v, sizeof v), 1);
        close(fd);
        expect_text(up, "etc/opq/x", "x\n");
        /* Hard links, set-id bits and the capability, now the guest root's. */
        assert_int_equal(fstatat(up, "opt/h1", &st, 0), 0);
        assert_int_equal(fstatat(up, "opt/h2", &st2, 0), 0);
        assert_int_equal(st.st_ino, st2.st_ino);
        assert_int_equal(st.st_nlink, 2);
        assert_int_equal(st.st_mode & 07777, 04755);
        uint32_t caps[6] = { 0 };
        fd = openat(up, "opt/h1", O_RDONLY | O_CLOEXEC);
        assert_int_equal(fgetxattr(fd, "security.capability", caps, sizeof caps), 20);
        close(fd);
        assert_int_equal(caps[0], 0x02000001u);
        assert_int_equal(caps[1], 1u << 13);
        /* An id outside the image's range is nobody's; a link out stays a link. */
        assert_int_equal(fstatat(up, "opt/stranger", &st, 0), 0);
        assert_int_equal(st.st_uid, 65534);
        char target[64] = "";
        assert_int_equal(readlinkat(up, "opt/escape", target, sizeof target - 1), 11);
        assert_string_equal(target, "/etc/shadow");
        close(up);
}

typedef struct Call {
        bool made;
        const char *snap;
        int r;
} Call;

static void *call(void *arg) {
        Call *c = arg;
        c->r = microvm_layers_disk(c->snap, 64, SHIFT, NULL, &c->made);
        return NULL;
}

static void test_at_once_and_after_a_kill(void **state) {
        (void)state;
        if (!usable())
                skip();
        char snap[512], part[1024];
        snprintf(snap, sizeof snap, "%s/once", work);
        two_layers(snap);
        /* What a conversion killed in the middle left. */
        snprintf(part, sizeof part, "%s/.upper.ext4.part", snap);
        put(snap, ".upper.ext4.part", "half a disk", 0, 0600);
        Call a = { .snap = snap }, b = { .snap = snap };
        pthread_t ta, tb;
        assert_int_equal(pthread_create(&ta, NULL, call, &a), 0);
        assert_int_equal(pthread_create(&tb, NULL, call, &b), 0);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        assert_int_equal(a.r, 0);
        assert_int_equal(b.r, 0);
        assert_true(a.made != b.made);
        assert_int_equal(access(part, F_OK), -1);
}

static void test_too_deep(void **state) {
        (void)state;
        if (!usable())
                skip();
        char snap[512], tree[512], p[PATH_MAX], img[1024];
        snprintf(snap, sizeof snap, "%s/deep", work);
        snprintf(tree, sizeof tree, "%s/treedeep", work);
        assert_int_equal(mkdir(snap, 0700), 0);
        snprintf(p, sizeof p, "%s/upper", tree);
        assert_int_equal(mkdir(tree, 0755), 0);
        for (int i = 0; i <= MICROVM_LAYERS_MAX_DEPTH + 2; i++) {
                assert_int_equal(mkdir(p, 0755), 0);
                strcat(p, "/d");
        }
        snprintf(img, sizeof img, "%s/layer.img", snap);
        mkfs_from(tree, img);
        assert_int_equal(microvm_layers_disk(snap, 64, SHIFT, NULL, NULL), -ELOOP);
        snprintf(p, sizeof p, "%s/upper.ext4", snap);
        assert_int_equal(access(p, F_OK), -1);
        snprintf(p, sizeof p, "%s/.upper.ext4.part", snap);
        assert_int_equal(access(p, F_OK), -1);
        /* No layer at all: nothing to make a disk of. */
        snprintf(p, sizeof p, "%s/empty", work);
        assert_int_equal(mkdir(p, 0700), 0);
        assert_int_equal(microvm_layers_disk(p, 64, SHIFT, NULL, NULL), -ENOENT);
}

/* A registry's tree under the image's layers: the tree's whole root, the
 * built-in root beneath hidden (opaque top-level directories, whiteouts for
 * its other names), the agent's mount points directories whatever the tree
 * had there, its own directory not taken from the tree; and the bytes bound
 * counting the tree's record. */
static void test_registry_root(void **state) {
        (void)state;
        if (!usable())
                skip();
        char snap[512], tree[512], boot[512], img[1024], p[PATH_MAX];
        snprintf(snap, sizeof snap, "%s/reg", work);
        two_layers(snap);
        /* The built-in root beneath: names the tree has and names it lacks. */
        snprintf(boot, sizeof boot, "%s/boot", work);
        assert_int_equal(mkdir(boot, 0755), 0);
        dir_at(boot, "etc", false);
        put(boot, "etc/debian_version", "12\n", SHIFT, 0644);
        dir_at(boot, "srv", false);
        dir_at(boot, "usr", false);
        put(boot, "marker", "built-in\n", SHIFT, 0644);
        snprintf(img, sizeof img, "%s/root.ext4", work);
        mkfs_from(boot, img);
        /* The tree: an os-release, /bin a link, and hostile entries. */
        snprintf(tree, sizeof tree, "%s/regtree", work);
        assert_int_equal(mkdir(tree, 0700), 0);
        dir_at(tree, "etc", false);
        put(tree, "etc/os-release", "ID=registry\n", SHIFT, 0644);
        dir_at(tree, "usr", false);
        dir_at(tree, "usr/bin", false);
        put(tree, "usr/bin/sh", "sh\n", SHIFT, 0755);
        snprintf(p, sizeof p, "%s/bin", tree);
        assert_int_equal(symlink("usr/bin", p), 0);
        snprintf(p, sizeof p, "%s/run", tree);
        assert_int_equal(symlink("../../../etc", p), 0);
        put(tree, "proc", "not a directory\n", SHIFT, 0644);
        dir_at(tree, ".runtime", false);
        put(tree, ".runtime/agent", "#!/bin/sh\n", SHIFT, 0755);
        MicrovmLayersBase base = { .tree = tree, .boot_root = img, .tree_bytes = 1 << 20 };
        bool made = false;
        assert_int_equal(microvm_layers_disk(snap, 64, SHIFT, &base, &made), 0);
        assert_true(made);

        snprintf(p, sizeof p, "%s/upper.ext4", snap);
        int up = mount_ro(p);
        struct stat st;
        expect_text(up, "etc/os-release", "ID=registry\n");
        assert_int_equal(fstatat(up, "etc/os-release", &st, 0), 0);
        assert_int_equal(st.st_uid, 0);
        expect_text(up, "opt/a.txt", "a\n"); /* the layers over the tree */
        char v[4] = "";
        for (const char *const *d = (const char *const[]){ "etc", "usr", "opt", "run", "proc", "tmp", NULL }; *d; d++) {
                int fd = openat(up, *d, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                assert_true(fd >= 0);
                assert_int_equal(fgetxattr(fd, "trusted.overlay.opaque", v, sizeof v), 1);
                assert_int_equal(v[0], 'y');
                close(fd);
        }
        assert_int_equal(fstatat(up, "tmp", &st, AT_SYMLINK_NOFOLLOW), 0);
        assert_int_equal(st.st_mode & 07777, 01777);
        for (const char *const *w = (const char *const[]){ "srv", "marker", "lost+found", NULL }; *w; w++) {
                assert_int_equal(fstatat(up, *w, &st, AT_SYMLINK_NOFOLLOW), 0);
                assert_true(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
        }
        char target[64] = "";
        assert_int_equal(readlinkat(up, "bin", target, sizeof target - 1), 7);
        assert_string_equal(target, "usr/bin");
        assert_int_equal(fstatat(up, ".runtime", &st, AT_SYMLINK_NOFOLLOW), -1);
        assert_int_equal(errno, ENOENT);
        close(up);

        /* More than the tree recorded: refused, nothing left. */
        snprintf(snap, sizeof snap, "%s/regbig", work);
        two_layers(snap);
        int fd = open(tree, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(fd >= 0);
        int big = openat(fd, "big", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        assert_true(big >= 0);
        static char chunk[1 << 20];
        memset(chunk, 'x', sizeof chunk);
        for (int i = 0; i < 16; i++)
                assert_int_equal(write(big, chunk, sizeof chunk), (ssize_t)sizeof chunk);
        close(big);
        close(fd);
        base.tree_bytes = 4096;
        assert_int_equal(microvm_layers_disk(snap, 64, SHIFT, &base, NULL), -EFBIG);
        snprintf(p, sizeof p, "%s/upper.ext4", snap);
        assert_int_equal(access(p, F_OK), -1);
        snprintf(p, sizeof p, "%s/.upper.ext4.part", snap);
        assert_int_equal(access(p, F_OK), -1);
}

static int setup(void **state) {
        (void)state;
        snprintf(work, sizeof work, "/var/tmp/test-microvm-layers-XXXXXX");
        return mkdtemp(work) ? 0 : -1;
}

static int teardown(void **state) {
        (void)state;
        return path_remove_tree_at(AT_FDCWD, work) < 0 ? -1 : 0;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_flattened),
                cmocka_unit_test(test_at_once_and_after_a_kill),
                cmocka_unit_test(test_too_deep),
                cmocka_unit_test(test_registry_root),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
