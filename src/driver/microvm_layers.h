#pragma once
/*
 * A microVM disk made from another driver's layers (docs/images.md, "On the
 * microVM"). An image built here is a disk snapshot of a namespace or gVisor
 * sandbox: ext4 layers (layer.img over bases/N.img, rootfs.c) whose upper/
 * holds what the build changed over the FROM image's root, owned by the
 * host uids root inside maps to. The microVM boots the same FROM image's
 * root.ext4 under a writable upper.ext4, so a create from the image boots on
 * an upper.ext4 whose upper/ is those layers flattened into one: whiteouts
 * and opaque directories kept as the guest's overlay reads them, owners
 * shifted back to the guest's ids, modes, times, extended attributes and
 * hard links kept.
 */
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* An image whose chain starts FROM a registry's image: the pulled tree is
 * the whole root, the built-in root.ext4 the guest boots beneath it shows
 * through nowhere (docs/images.md, "On the microVM"). */
typedef struct MicrovmLayersBase {
        const char *tree;      /* the tree's root directory, copied first */
        const char *boot_root; /* the root.ext4 beneath: its top-level names are hidden */
        uint64_t tree_bytes;   /* what the tree holds (its record); 0: unknown */
} MicrovmLayersBase;

/* The deepest directory of a layer a conversion copies: a tree deeper than
 * this (a sandbox's own making) is refused, not walked. */
#define MICROVM_LAYERS_MAX_DEPTH 128

/* Makes snap_dir/upper.ext4 (disk_mib, sparse) from snap_dir's layer.img
 * and bases/ (over base's tree when base is not NULL), unless it is there already (*ret_made says which; may be
 * NULL). shift: the host uid and gid that root inside maps to in those
 * layers. Written as a dot name, synced and renamed into place under a lock
 * file of snap_dir, so two callers never both convert and none ever sees
 * half a disk; a dot name a killed conversion left is removed by the next.
 * -ENOENT when snap_dir has no layer.img, -EFBIG when the files do not fit
 * disk_mib or would pass the bytes the layers hold, -ELOOP for a tree deeper
 * than MICROVM_LAYERS_MAX_DEPTH, -EOPNOTSUPP for an entry the guest's
 * overlay would not read as the host's did (a metacopy), or the errno of a
 * step. */
int microvm_layers_disk(const char *snap_dir, unsigned disk_mib, uid_t shift, const MicrovmLayersBase *base,
                       bool *ret_made);
