#pragma once
/*
 * The initramfs of one start: /dev/console, the kernel modules the image's
 * kernel needs on QEMU's microvm machine, and the agent as /init. A newc cpio
 * archive, written fresh at each start (the agent binary may change between
 * starts of one sandbox).
 */

/* Writes the archive to fd: /dev/console, the *.ko of `modules_dir` (in name
 * order, at most 64), `agent` as /init and, unless NULL, `volumes` as the
 * file MICROVM_VOLUMES_FILE (the agent's list of the volumes' disks). */
int microvm_write_initramfs(int fd, const char *modules_dir, const char *agent, const char *volumes);

/* The same into a new file at path, readable by others: QEMU reopens it
 * through /proc/self/fd as its own uid (it holds nothing but the agent and
 * kernel modules). Removed again on failure. */
int microvm_initramfs_file(const char *path, const char *modules_dir, const char *agent, const char *volumes);
