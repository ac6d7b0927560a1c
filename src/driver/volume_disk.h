#pragma once
/*
 * A volume's disk on the host (docs/volumes.md): an ext4 filesystem in a
 * sparse image file of a fixed size, so that what a sandbox writes into it
 * is bounded by the volume's size and never by the host's free space. The
 * daemon mounts it once on the host (through a loop device) and each
 * sandbox that attaches it gets a bind of that mount's root. Library code:
 * returns, logs nothing.
 */
#include <stdbool.h>
#include <sys/types.h>

/* A new image at img (which must not exist) of mib MiB, an empty ext4 whose
 * root belongs to the sandbox user of the default uid shift (each start
 * gives it to its own sandbox's user). */
int volume_disk_create(const char *img, unsigned mib);
/* Mounts img on dir (made 0700 if missing) unless it is mounted there
 * already. A loop device that still holds img without it being mounted at
 * dir (a sandbox of an earlier daemon's mount namespace) is mounted again,
 * the same filesystem: a second device, and so a second ext4, on the same
 * file would corrupt it. -EBUSY when a guest holds img, or that device
 * cannot be mounted. */
int volume_disk_mount(const char *img, const char *dir);
/* Detaches dir's mount (lazily: a sandbox still holding it keeps it until
 * it ends); 0 when nothing was mounted. */
int volume_disk_unmount(const char *dir);
/* Grows the unmounted img to mib MiB: the file, then the filesystem
 * (e2fsck, resize2fs). */
int volume_disk_grow(const char *img, unsigned mib);
/* Whether a filesystem is mounted at dir. */
bool volume_disk_mounted(const char *dir);

/* A descriptor of img for a guest kernel to use as a disk (O_DIRECT), read
 * only or read-write, holding an open file description lock on it: shared
 * for reading, exclusive for writing. The lock lasts as long as any
 * duplicate of the descriptor (a VMM's). -EBUSY when the image is mounted
 * on the host (held by a loop device) or another holder's lock conflicts. */
int volume_disk_hold(const char *img, bool read_only, int *ret_fd);
/* The host lets go of img for a guest: the daemon's mount at dir is taken
 * down, and the loop device under it gone. -EBUSY, with the daemon's mount
 * put back, while a sandbox's bind of it keeps the filesystem in use. */
int volume_disk_release_host(const char *img, const char *dir);
/* Whether some guest holds img (volume_disk_hold). */
bool volume_disk_held(const char *img);
