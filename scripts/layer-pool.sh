#!/usr/bin/env bash
# Puts a runtimed state directory on a filesystem whose files can share blocks, so that a snapshot,
# a fork and a create from a snapshot clone the sandbox's layer (FICLONE) instead of copying it.
#
#   scripts/layer-pool.sh STATE_DIR [SIZE_MIB]        make (or mount again) the pool at STATE_DIR
#   scripts/layer-pool.sh --release STATE_DIR         unmount it and delete its image
#
# Where STATE_DIR already is on such a filesystem (XFS with reflink, btrfs) there is nothing to do.
# Otherwise the pool is a sparse file, STATE_DIR.layer-pool.img beside the directory, formatted XFS
# with reflink and loop-mounted at STATE_DIR with discard, so blocks freed in the pool go back to
# the host's filesystem. SIZE_MIB (default RUNTIME_LAYER_POOL_MIB, else 65536) bounds what all
# sandboxes and snapshots of that daemon may hold together; the file takes only what is written.
# Idempotent: a pool already mounted is left as it is, an existing image is mounted again.
# It refuses a STATE_DIR that has files and is not yet a pool: its contents would be hidden.
# Needs root, mkfs.xfs (xfsprogs) and loop devices; exits 0 with the pool in place, 3 when the
# host cannot have one (runtimed then copies sparse, and says so in its log and --doctor).
set -euo pipefail

die() { echo "layer-pool: $1" >&2; exit "${2:-1}"; }

reflinks() {
  # Whether two files in $1 can share blocks: cp --reflink=always fails where FICLONE does.
  local a b ok=1
  a=$(mktemp -p "$1" .reflink-probe.XXXXXX) || return 1
  b="$a.clone"
  head -c 4096 /dev/zero >"$a"
  cp --reflink=always "$a" "$b" 2>/dev/null && ok=0
  rm -f "$a" "$b"
  return $ok
}

release=0
if [ "${1:-}" = "--release" ]; then
  release=1
  shift
fi
[ $# -ge 1 ] || die "usage: layer-pool.sh STATE_DIR [SIZE_MIB] | --release STATE_DIR" 2
dir=${1%/}
size=${2:-${RUNTIME_LAYER_POOL_MIB:-65536}}
img="$dir.layer-pool.img"

if [ "$release" = 1 ]; then
  if mountpoint -q "$dir" && [ "$(findmnt -n -o SOURCE --target "$dir" | xargs -r losetup -n -O BACK-FILE 2>/dev/null)" = "$(realpath "$img" 2>/dev/null)" ]; then
    umount "$dir" 2>/dev/null || umount -l "$dir"
  fi
  rm -f "$img"
  exit 0
fi

[[ "$size" =~ ^[0-9]+$ ]] && [ "$size" -ge 512 ] || die "SIZE_MIB must be a whole number >= 512, not '$size'" 2
[ "$(id -u)" -eq 0 ] || die "run as root (it mounts the pool)" 3

mkdir -p "$dir"
if reflinks "$dir"; then
  echo "layer-pool: $dir already shares blocks ($(stat -f -c %T "$dir")); nothing to do"
  exit 0
fi
command -v mkfs.xfs >/dev/null || die "mkfs.xfs is missing (Debian's xfsprogs; scripts/install-deps.sh installs it)" 3
if [ -n "$(ls -A "$dir")" ]; then
  die "$dir has files and is not on a filesystem that shares blocks; a pool mounted there would hide them. Stop runtimed, move them out, run this again and move them into the pool (cp --reflink=auto -a)" 3
fi
if [ ! -e "$img" ]; then
  truncate -s "${size}M" "$img.part"
  mkfs.xfs -q -m reflink=1,crc=1 "$img.part" || { rm -f "$img.part"; die "mkfs.xfs failed" 3; }
  sync "$img.part"
  mv "$img.part" "$img"
fi
mount -o loop,discard,noatime "$img" "$dir" || die "cannot loop-mount $img at $dir (no loop device?)" 3
chmod 0700 "$dir"
reflinks "$dir" || { umount "$dir"; die "the pool at $dir does not share blocks after all" 3; }
echo "layer-pool: $dir is an XFS pool with reflink ($img, ${size} MiB at most)"
