#pragma once
/*
 * The per-sandbox root filesystem: the image's rootfs read-only as the lower
 * layer of an overlayfs whose upper layer lives on a writable layer bounded
 * by diskMiB. In sandbox_dir:
 *
 *   layer.img  sparse ext4 file of diskMiB (copied from a pre-made empty
 *              template, so no mkfs per sandbox); kept across stop
 *   layer/     its loop mount: upper/, work/, agent.log (not visible inside)
 *   root/      the overlay, the sandbox's "/"
 *
 * All of it is mounted inside the sandbox's own mount namespace, never on
 * the host. Where loop devices are unusable the layer is a tmpfs of diskMiB
 * instead, and the files then do not outlive a stop (RootfsLayer.tmpfs).
 */
#include <stdbool.h>
#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

/* A sandbox started from a snapshot reads the snapshot's layers as lower
 * layers of its overlay, read-only and shared by every copy (hard links of
 * the snapshot's files: no data is copied): sandbox_dir/bases/0.img (the
 * oldest) .. N.img, each mounted at sandbox_dir/bN. At most this many
 * generations (a snapshot of a copy of a snapshot ...). */
#define ROOTFS_MAX_BASES 8

typedef struct RootfsLayer {
        bool tmpfs;   /* no usable loop device: a tmpfs layer, gone at stop */
        bool created; /* the layer is new (a fresh sandbox) */
        int loop_fd;  /* the attached loop device, -1 for tmpfs */
        char loop_dev[64];
        unsigned disk_mib;
        uid_t owner;
        char layer[PATH_MAX], root[PATH_MAX], upper[PATH_MAX], work[PATH_MAX], log[PATH_MAX];
        char overlay_opts[3 * PATH_MAX + 64];
        unsigned nbase;                    /* lower layers from a snapshot */
        int base_fd[ROOTFS_MAX_BASES];     /* their read-only loop devices */
        char base_dev[ROOTFS_MAX_BASES][64];
        char base_mnt[ROOTFS_MAX_BASES][PATH_MAX];
        char tmpfs_opts[96];
} RootfsLayer;

/* In the daemon, before fork: makes sandbox_dir (0700) and its layer file if
 * missing (a sparse copy of an empty ext4 template made once per size), and
 * attaches it to a loop device (autoclear: it detaches itself when the last
 * mount of it goes). `owner` is the host uid/gid that root inside maps to:
 * the overlay's root and the upper layer belong to it. -ENOENT when
 * image_rootfs is missing, -EINVAL for paths overlayfs cannot take, -EBUSY
 * while the previous run's filesystem is still being released. */
int rootfs_prepare(const char *image_rootfs, const char *sandbox_dir, unsigned disk_mib, uid_t owner,
                   RootfsLayer *ret);
/* Makes the synced copy of the empty layer that the next rootfs_prepare of
 * this size and owner takes instead of copying (0 when one is there
 * already, -EBUSY while another thread makes it). */
int rootfs_replenish(const char *sandbox_dir, unsigned disk_mib, uid_t owner);
/* The same on a detached thread: best effort, never waited for. A copy cut
 * short by the daemon's exit is found stale and redone later. */
void rootfs_replenish_async(const char *sandbox_dir, unsigned disk_mib, uid_t owner);
/* Closes the daemon's hold on the loop device; call right after fork (the
 * child keeps its own until it has mounted). */
void rootfs_layer_done(RootfsLayer *l);
/* In the forked child, before exec (async-signal-safe): unshares a private
 * mount namespace, mounts the layer and the overlay there, and points fd 2
 * at layer/agent.log. The host never sees these mounts: they go, and the
 * loop device with them, when the sandbox's last process exits, so a stop
 * or a crash cannot leak them. -1 on failure (errno set). */
int rootfs_mount_child(const RootfsLayer *l);
/* After the sandbox's processes are gone: waits until its loop device has
 * detached. -EBUSY after timeout_ms. */
int rootfs_wait_released(const char *sandbox_dir, int timeout_ms);

/* Unmounts root/ and layer/ from the daemon's own namespace, where only an
 * older daemon would have mounted them (lazily as a last resort). Idempotent. */
int rootfs_unmount(const char *sandbox_dir);
/* Unmounts, then removes sandbox_dir and everything in it, never crossing
 * into another filesystem. Idempotent. */
int rootfs_remove(const char *sandbox_dir);
/* Bytes used on the writable layer, seen through a process of the sandbox
 * (pid: bwrap / runsc, which live in the sandbox's mount namespace). */
int rootfs_disk_used(pid_t pid, const char *sandbox_dir, uint64_t *ret);
/* Whether anything is still mounted at or below sandbox_dir. */
bool rootfs_is_mounted(const char *sandbox_dir);
/* A disk snapshot of a sandbox's layer into dest_dir/layer.img (sparse,
 * synced), with the sandbox's own lower layers linked in as bases/N.img. pid > 0: a process of the running sandbox, whose processes are
 * frozen: the layer's filesystem is synced through it first, and the copy's
 * journal replayed so that it mounts clean. pid 0: a stopped sandbox, whose
 * loop device must have detached. -EOPNOTSUPP without a layer file (tmpfs). */
int rootfs_snapshot(const char *sandbox_dir, pid_t pid, const char *dest_dir);
/* A sparse, synced copy of an ext4 image (a new file, O_EXCL) whose journal
 * is then replayed: a copy of one mounted at the time mounts clean. */
int rootfs_copy_image(const char *from, const char *to);
/* A sparse, synced copy of a file (a new file, O_EXCL). */
int rootfs_copy_sparse(const char *from, const char *to);
/* A new sandbox's lower layers from a snapshot: its bases/N.img and its
 * layer.img hard-linked into sandbox_dir/bases/ as 0.img .. (nothing
 * copied; the directory appears whole, by one rename);
 * the sandbox then gets a fresh empty layer of its own on top. -EEXIST when
 * the sandbox has a layer already; -E2BIG past ROOTFS_MAX_BASES. */
int rootfs_restore(const char *snap_dir, const char *sandbox_dir);
/* Removes a directory tree without following symlinks or crossing mounts. */

/* Runs argv (stdio on /dev/null) and waits: 0 when it exits with a status
 * up to max_ok_status (e2fsck's 1 is "fixed"), else -EIO. */
int rootfs_run(char *const argv[], int max_ok_status);
/* The path of an e2fsprogs tool (mkfs.ext4, e2fsck, resize2fs) in buf, or
 * NULL when not installed. */
const char *rootfs_find_tool(const char *name, char *buf, size_t n);
/* A new sparse file img of mib MiB made an empty ext4 whose root belongs to
 * owner. */
int rootfs_mkfs(const char *img, unsigned mib, uid_t owner);
/* Attaches file to a free loop device (autoclear: it detaches with its last
 * unmount); the device's fd and path. */
int rootfs_loop_attach(const char *file, bool ro, int *ret_fd, char *ret_path, size_t ret_len);
/* Whether some loop device is backed by img. */
bool rootfs_loop_backed(const char *img);
/* The name ("loopN") of a loop device backed by img; -ENOENT when none. */
int rootfs_loop_device(const char *img, char *ret_name, size_t len);
