#!/bin/bash
# runtime-microvm-build: what the microVM driver needs of an image, made from
# the image's root filesystem directory (docs/microvm.md).
#
#   runtime-microvm-build [--force] [--check] IMAGE_DIR NAME
#
# Writes IMAGE_DIR/NAME/microvm/:
#   vmlinuz         Debian's cloud kernel (linux-image-cloud-amd64)
#   modules/*.ko    the few modules that kernel needs on QEMU's microvm
#                   machine and that it does not have built in, named so
#                   that their order is a load order
#   kernel-release  the kernel's `uname -r`
#   root.ext4       the image's rootfs/ as an ext4 file system, owned by uid 0
#                   (the rootfs directory is uid-shifted for the namespace
#                   driver), shared read-only by every sandbox of the image
#   root.stamp      the image's built-at and this script's sha256 when
#                   root.ext4 was made
# Each part is rebuilt only when missing (the kernel) or when the image or
# this recipe changed since (root.ext4). --check exits 0 when everything is current.
#
# The kernel package is fetched with `apt-get download` from the host's
# configured Debian archive, or taken from RUNTIME_MICROVM_KERNEL_DEB (a
# linux-image-*-cloud-amd64 .deb) on hosts without an archive.
set -euo pipefail

log() { printf '%s runtime-microvm-build: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf 'runtime-microvm-build: error: %s\n' "$*" >&2; exit 2; }
usage() { echo "usage: runtime-microvm-build [--force] [--check] IMAGE_DIR NAME" >&2; exit 2; }

# Not built into Debian's cloud kernel, needed on microvm: the virtio-mmio
# transport, the disks, the channel port, the entropy source and overlayfs.
MODULES="10-virtio:drivers/virtio/virtio.ko
11-virtio_ring:drivers/virtio/virtio_ring.ko
20-virtio_mmio:drivers/virtio/virtio_mmio.ko
30-virtio_blk:drivers/block/virtio_blk.ko
31-virtio_console:drivers/char/virtio_console.ko
32-virtio-rng:drivers/char/hw_random/virtio-rng.ko
40-overlay:fs/overlayfs/overlay.ko"
KERNEL_PACKAGE=linux-image-cloud-amd64
# Free space left in the shared root beyond its content; writes go to each
# sandbox's own upper disk, so this is only for ext4's own metadata.
ROOT_SLACK_MIB=64

force=0
check=0
while [ $# -gt 0 ]; do
        case "$1" in
        --force) force=1; shift ;;
        --check) check=1; shift ;;
        -h|--help) usage ;;
        --) shift; break ;;
        -*) usage ;;
        *) break ;;
        esac
done
[ $# -eq 2 ] || usage
image_dir=$1
name=$2
case "$name" in
""|.|..|*/*) die "bad image name '$name'" ;;
esac
image="$image_dir/$name"
out="$image/microvm"
[ -d "$image/rootfs" ] || die "image '$name' has no rootfs in $image (build the image first)"

# root.ext4 is current when made from this build of the image by this
# recipe: "<image built-at> <sha256 of this script>".
recipe_sha=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)
image_stamp() {
        printf '%s %s\n' "$(cat "$image/built-at" 2>/dev/null || stat -c %Y "$image/rootfs")" "$recipe_sha"
}

kernel_current() {
        [ -s "$out/vmlinuz" ] && [ -s "$out/kernel-release" ] && [ -d "$out/modules" ] &&
                [ "$(ls "$out/modules" | wc -l)" -eq "$(printf '%s\n' "$MODULES" | wc -l)" ]
}
root_current() {
        [ -s "$out/root.ext4" ] && [ -f "$out/root.stamp" ] && [ "$(cat "$out/root.stamp")" = "$(image_stamp)" ]
}

if [ "$check" = 1 ]; then
        kernel_current && root_current && exit 0
        exit 1
fi

mkdir -p "$out"
chmod 0755 "$out"
# One builder at a time per image: sandboxes starting together wait for the
# first one's build instead of racing it.
exec 9>"$out/.lock"
flock 9

if [ "$force" = 1 ]; then
        rm -rf "$out/vmlinuz" "$out/modules" "$out/kernel-release" "$out/root.ext4" "$out/root.stamp"
fi

tmp=$(mktemp -d "$out/.build.XXXXXX")
cleanup() {
        rm -rf "$tmp"
}
trap cleanup EXIT

build_kernel() {
        local deb
        if [ -n "${RUNTIME_MICROVM_KERNEL_DEB:-}" ]; then
                deb=$RUNTIME_MICROVM_KERNEL_DEB
                [ -f "$deb" ] || die "RUNTIME_MICROVM_KERNEL_DEB=$deb: no such file"
        else
                log "fetching $KERNEL_PACKAGE"
                # The meta package names the versioned image package.
                (cd "$tmp" && apt-get download -q "$KERNEL_PACKAGE" 2>/dev/null) ||
                        die "apt-get download $KERNEL_PACKAGE failed"
                local dep
                dep=$(dpkg-deb -f "$tmp"/"$KERNEL_PACKAGE"_*.deb Depends | tr ',' '\n' |
                        sed -n 's/^ *\(linux-image-[0-9][^ ]*-cloud-amd64\).*/\1/p' | head -n1)
                [ -n "$dep" ] || die "cannot tell the kernel package from $KERNEL_PACKAGE"
                (cd "$tmp" && apt-get download -q "$dep" 2>/dev/null) || die "apt-get download $dep failed"
                deb=$(ls "$tmp"/"$dep"_*.deb)
        fi
        log "extracting $(basename "$deb")"
        dpkg-deb -x "$deb" "$tmp/k"
        local vmlinuz release
        vmlinuz=$(ls "$tmp"/k/boot/vmlinuz-* | head -n1)
        [ -f "$vmlinuz" ] || die "no kernel in $deb"
        release=${vmlinuz##*/vmlinuz-}
        local mods="$tmp/k/lib/modules/$release/kernel"
        mkdir -p "$tmp/modules"
        local line
        while IFS= read -r line; do
                local dst=${line%%:*} src=${line#*:}
                [ -f "$mods/$src" ] || die "$release has no $src"
                install -m 0644 "$mods/$src" "$tmp/modules/$dst.ko"
        done <<<"$MODULES"
        install -m 0644 "$vmlinuz" "$tmp/vmlinuz"
        printf '%s\n' "$release" >"$tmp/kernel-release"
        rm -rf "$out/modules"
        mv "$tmp/modules" "$out/modules"
        chmod 0755 "$out/modules"
        mv "$tmp/kernel-release" "$out/kernel-release"
        mv "$tmp/vmlinuz" "$out/vmlinuz"
        log "kernel $release ready"
}

# The rootfs is owned by uid/gid shift..shift+65535 (images/build.sh). mke2fs
# copies ownership as stat() reports it, so it runs in a user namespace that
# maps that range back to 0..65535: the guest's root then owns its files. The
# host never mounts the result.
build_root() {
        local shift size_kib size_mib stamp
        shift=$(cat "$image/uid-shift" 2>/dev/null || echo 0)
        case "$shift" in ''|*[!0-9]*) die "bad uid-shift in $image" ;; esac
        stamp=$(image_stamp)
        size_kib=$(du -sx --block-size=1K "$image/rootfs" | cut -f1)
        # ext4 metadata and block rounding of small files: a fifth more.
        size_mib=$(( size_kib * 6 / 5 / 1024 + ROOT_SLACK_MIB ))
        log "making root.ext4 (${size_mib} MiB) from $image/rootfs"
        truncate -s "${size_mib}M" "$tmp/root.ext4"
        local -a mkfs=(mke2fs -q -F -t ext4 -b 4096 -O ^has_journal -E root_owner=0:0 -L runtime-root
                -d "$image/rootfs" "$tmp/root.ext4")
        if [ "$shift" = 0 ]; then
                "${mkfs[@]}"
        else
                # A child that unshares its user namespace, waits for the
                # parent (root outside) to write the maps, becomes uid 0 of
                # the namespace and only then executes mke2fs, so that it
                # keeps the capabilities to read every file of the tree.
                # The image directory is root's alone (0700): mke2fs reaches
                # the tree and the output through descriptors opened here.
                local rc=0
                chown "$shift:$shift" "$tmp/root.ext4"
                python3 - "$shift" "${mkfs[@]}" <<'PY' || rc=$?
import ctypes, os, sys
shift, argv = int(sys.argv[1]), sys.argv[2:]
src = argv.index("-d") + 1
tree = os.open(argv[src], os.O_RDONLY | os.O_DIRECTORY)
out = os.open(argv[-1], os.O_RDWR)
os.set_inheritable(tree, True)
os.set_inheritable(out, True)
argv[src] = f"/proc/self/fd/{tree}"
argv[-1] = f"/proc/self/fd/{out}"
CLONE_NEWUSER = 0x10000000
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(w)
    if libc.unshare(CLONE_NEWUSER) != 0:
        os._exit(90)
    os.read(r, 1)
    try:
        os.setgroups([])
    except OSError:
        pass
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.execvp(argv[0], argv)
os.close(r)
ns = os.readlink("/proc/self/ns/user")
import time
for _ in range(1000):
    if os.readlink(f"/proc/{pid}/ns/user") != ns:
        break
    time.sleep(0.005)
for f in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{f}", "w") as m:
        m.write(f"0 {shift} 65536\n")
os.write(w, b"g")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
PY
                [ "$rc" = 0 ] || die "mke2fs failed ($rc)"
        fi
        chown 0:0 "$tmp/root.ext4"
        chmod 0644 "$tmp/root.ext4"
        mv "$tmp/root.ext4" "$out/root.ext4"
        printf '%s' "$stamp" >"$out/root.stamp"
        log "root.ext4 ready"
}

kernel_current || build_kernel
root_current || build_root
