#!/bin/bash
# runtime-image-build: builds a sandbox root filesystem from Debian's archive.
#
#   runtime-image-build [--force] [--check] IMAGE_DIR NAME
#
# The image lands in IMAGE_DIR/NAME: rootfs/ (the read-only lower layer of
# every sandbox), recipe.sha256 (the recipe it was built from) and built-at.
# An image that is up to date with this recipe is reused unless --force;
# --check only answers: exit 0 when IMAGE_DIR/NAME is built with the current
# recipe, 1 otherwise.
#
# The rootfs is owned by a shifted uid range (RUNTIME_UID_SHIFT, 100000):
# uid 0 of the image is 100000 on the host. The namespace driver maps root
# inside a sandbox to that range, so root inside owns its files while being
# an unprivileged uid outside (docs/drivers.md).
set -euo pipefail

RUNTIME_UID_SHIFT=100000
SUITE=bookworm
# The recipes (docs/images.md):
#   minimal   a shell, Python with pip and venv, git, curl and sudo; cells of
#             the interpreter run on its fallback loop (docs/interpreter.md).
#   default   minimal plus what agents expect of a general-purpose machine:
#             Jupyter kernels for the interpreter (Python, Bash, and Deno's
#             for JavaScript and TypeScript), Node.js with npm, numpy and
#             pillow.
#   analysis  default plus the data stack the interpreter's charts and tables
#             use, and R with its Jupyter kernel (IRkernel).
#   desktop   default plus a browser and an X desktop (below).
# mmdebstrap lays down Debian's minbase and every package of the recipe in
# one run of apt, which resolves them as apt does everywhere (no
# Recommends, as with apt-get --no-install-recommends).
PACKAGES="python3 python3-pip python3-venv bash coreutils ca-certificates curl git procps iproute2 sudo"
# python3-ipykernel and python3-jupyter-client make each interpreter context a
# Jupyter kernel; python3-filetype and python3-pexpect are bash_kernel's
# dependencies (bash_kernel itself is not packaged by Debian: below).
DEFAULT_PACKAGES="python3-ipykernel python3-jupyter-client python3-filetype python3-pexpect nodejs npm python3-numpy python3-pil"
# R is the analysis image's alone: r-base-core and its kernel add about
# 100 MB that the default image's users do not need.
ANALYSIS_PACKAGES="python3-pandas python3-matplotlib r-cran-irkernel"
# Bash cells run on bash_kernel from PyPI, pinned by version and by the hash
# of its wheel: pip refuses any other file. Installed without dependencies,
# which are Debian's packages above.
PIP_PACKAGES="bash_kernel==0.10.0 --hash=sha256:da28513230f5307c7a49e87352366304dc52b66faa207d6caed1b2bdec03c1fa"
# JavaScript and TypeScript cells run on Deno's own Jupyter kernel (deno
# jupyter --kernel). Debian does not package Deno; its release binary is on
# npm as @deno/linux-x64-glibc, fetched from the registry pinned by version
# and by the SHA-512 of the tarball (npm's dist.integrity
# sha512-3md4TKLCuzsLDmfOoC5KN7NAZaxSVkMgm64vg6foD00JBADCpYS2/5QqXfzgnP5ZQz3iLP9vBQJtEgc116OAoQ==,
# here in hex): any other file is refused. The binary is self-contained
# (glibc only) and lands in /usr/local/bin/deno.
DENO_PACKAGE="@deno/linux-x64-glibc 2.9.6 de67784ca2c2bb3b0b0e67cea02e4a37b34065ac525643209bae2f83a7e80f4d090400c2a584b6ff942a5dfce09cfe59433de22cff6f05026d120735d7a380a1"
# MCP servers a sandbox runs (docs/mcp.md, "Inside a sandbox"): the catalog's
# stdio servers from npm, installed with `npm ci` from images/mcp's
# package-lock.json, which pins every package of the tree by version and
# SHA-512 (npm refuses a tarball that differs), into /opt/runtime-mcp/servers;
# and the gateway that serves them over streamable HTTP, mcp-proxy from PyPI,
# with each of its dependencies pinned by version and wheel hash in
# images/mcp/requirements.txt, in a venv of its own (/opt/runtime-mcp/venv),
# apart from the Python packages the sandbox's user installs.
MCP_RECIPES=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/mcp
# The registry the tarball comes from; npm's own variable, so a host that
# points npm at a mirror points this build there too.
NPM_REGISTRY=${NPM_CONFIG_REGISTRY:-https://registry.npmjs.org/}
# Commands run as this unprivileged user by default (docs/api.md, Users):
# a fixed uid and gid, so that the drivers' id maps and the files API agree
# on them, home /workspace, and passwordless sudo (the sandbox is the
# boundary, not root inside it).
SANDBOX_USER=sandbox
SANDBOX_UID=1000
# The desktop recipe: the default one plus a browser and an X desktop that the
# browser and desktop APIs drive (docs/computer-use.md): Chromium, a virtual
# framebuffer X server, a light window manager, xdotool and wmctrl for input
# and windows, ffmpeg for screenshots and recordings, x11vnc with noVNC for
# the live view, xterm and fonts. dbus-x11 gives dconf-service, which GTK pulls
# in, its session bus.
DESKTOP_PACKAGES="chromium dbus-x11 xvfb openbox x11vnc xdotool wmctrl ffmpeg fonts-dejavu-core xterm x11-utils xdg-utils novnc python3-websockify"

log() { printf '%s runtime-image-build: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf 'runtime-image-build: error: %s\n' "$*" >&2; exit 2; }
usage() { echo "usage: runtime-image-build [--force] [--check] IMAGE_DIR NAME" >&2; exit 2; }

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
minimal) EXTRA=""; PIP_PACKAGES=""; DENO_PACKAGE=""; MCP_RECIPES="" ;;
default) EXTRA="$DEFAULT_PACKAGES" ;;
analysis) EXTRA="$DEFAULT_PACKAGES $ANALYSIS_PACKAGES" ;;
desktop) EXTRA="$DEFAULT_PACKAGES $DESKTOP_PACKAGES" ;;
*) die "unknown image '$name' (the recipes are 'minimal', 'default', 'analysis' and 'desktop')" ;;
esac

# The recipe is this script plus its package lists: change either and the
# image is rebuilt.
recipe_sha=$( { cat "${BASH_SOURCE[0]}"; printf '%s\n' "$PACKAGES" "$EXTRA" "$PIP_PACKAGES" "$DENO_PACKAGE"
        [ -z "$MCP_RECIPES" ] || cat "$MCP_RECIPES/requirements.txt" "$MCP_RECIPES/package-lock.json"; } 2>/dev/null | sha256sum | cut -d' ' -f1)
target="$image_dir/$name"

is_current() {
        [ -d "$target/rootfs" ] && [ -f "$target/recipe.sha256" ] &&
                [ "$(cat "$target/recipe.sha256")" = "$recipe_sha" ]
}

if [ "$check" = 1 ]; then
        is_current && exit 0
        exit 1
fi

[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap's chroot and the uid shift need it)"
command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed"
MERGED_USR_HOOK=/usr/share/mmdebstrap/hooks/merged-usr
[ -d "$MERGED_USR_HOOK" ] || die "mmdebstrap's merged-usr hook is missing ($MERGED_USR_HOOK)"
[ -z "$PIP_PACKAGES" ] || python3 -m pip --version >/dev/null 2>&1 || die "python3-pip is not installed"
[ -z "$DENO_PACKAGE" ] || command -v curl >/dev/null || die "curl is not installed"
[ -z "$MCP_RECIPES" ] || command -v npm >/dev/null || die "npm is not installed"
[ -z "$MCP_RECIPES" ] || { [ -f "$MCP_RECIPES/package-lock.json" ] && [ -f "$MCP_RECIPES/requirements.txt" ]; } ||
        die "the MCP servers' pins are missing (looked for $MCP_RECIPES/package-lock.json and requirements.txt)"

mkdir -p "$image_dir"
# One builder per image at a time: a second one waits, then finds the image
# current and exits.
exec 9>"$image_dir/.$name.lock"
flock 9

if [ "$force" = 0 ] && is_current; then
        log "image $name is up to date ($target)"
        exit 0
fi

# The machine's configured Debian mirror: the first main-archive URI from the
# deb822 .sources files, else from sources.list. No host is hard-coded.
find_mirror() {
        local f
        for f in /etc/apt/sources.list.d/*.sources; do
                [ -f "$f" ] || continue
                awk '
                        function flush() {
                                if (uri != "" && suites ~ /(^| )'"$SUITE"'( |$)/ && types ~ /(^| )deb( |$)/) { print uri; found = 1; exit }
                                uri = ""; suites = ""; types = ""
                        }
                        /^[ \t]*$/ { flush(); next }
                        /^[ \t]*#/ { next }
                        tolower($1) == "uris:" { uri = $2 }
                        tolower($1) == "suites:" { $1 = ""; suites = $0 " " }
                        tolower($1) == "types:" { $1 = ""; types = $0 " " }
                        END { if (!found) flush() }
                ' "$f" | head -n1
        done | head -n1
        if [ -f /etc/apt/sources.list ]; then
                awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($(i+1) == "'"$SUITE"'") { print $i; exit } break } }' \
                        /etc/apt/sources.list
        fi
}
mirror=$(find_mirror | head -n1)
[ -n "$mirror" ] || die "no Debian mirror for $SUITE found in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources"

work="$image_dir/$name.tmp-$$"
aside=""
helper=""
cleanup() {
        local rc=$?
        if [ -n "$helper" ]; then
                kill -TERM -- "-$helper" 2>/dev/null || true
                wait "$helper" 2>/dev/null || true
        fi
        if [ -n "${work:-}" ] && [ -d "$work" ]; then
                # A failed mmdebstrap can leave proc/sys/dev mounted inside.
                for m in $(awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r); do
                        umount -l "$m" 2>/dev/null || true
                done
                rm -rf --one-file-system "$work"
        fi
        [ -n "$aside" ] && [ -d "$aside" ] && rm -rf --one-file-system "$aside"
        [ $rc -ne 0 ] && log "build failed (exit $rc); partial build removed"
        exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building $name from $mirror ($SUITE, minbase + $PACKAGES${EXTRA:+ $EXTRA}) into $work"
mkdir -p "$work"
# dpkg syncs every file it unpacks, thousands of fsyncs per image: on the
# build's own unfinished tree they buy nothing, since a build cut short is
# removed whole. mmdebstrap's setup hook writes the option into the new tree
# before dpkg first runs there; it is removed before the image is finished,
# and one syncfs of the whole tree comes before the image is moved into place.
UNSAFE_IO="$work/rootfs/etc/dpkg/dpkg.cfg.d/runtime-build-unsafe-io"
inc=$(echo $PACKAGES $EXTRA | tr ' ' ',')
# mmdebstrap's steps as progress on the build's output, and with them every
# 50th package dpkg unpacks and every 50th it sets up, so that a client sees
# the build move without a line per package. Its whole log stays in the work
# directory. The filter is shell builtins, which read a pipe line by line
# (awk would hold lines back in its input buffer).
run_mmdebstrap='set -o pipefail
unpacked=0 set_up=0
mmdebstrap "$@" 2>&1 | tee "$LOG" | while IFS= read -r line; do
        case $line in
        "I: "*) echo "mmdebstrap: ${line#I: }" ;;
        "W: "* | "E: "*) echo "mmdebstrap: $line" ;;
        "Unpacking "*)
                unpacked=$((unpacked + 1))
                if [ $((unpacked % 50)) = 0 ]; then echo "mmdebstrap: ${line%% (*} ($unpacked unpacked so far)"; fi ;;
        "Setting up "*)
                set_up=$((set_up + 1))
                if [ $((set_up % 50)) = 0 ]; then echo "mmdebstrap: ${line%% (*} ($set_up set up so far)"; fi ;;
        esac
done'
# In its own process group and waited for in the background, so that a
# signal to this script stops it at once and the trap takes mmdebstrap down.
# The merged-usr hook makes /usr merged as debootstrap does for bookworm
# (with Debian's usr-is-merged, not the usrmerge converter).
LOG="$work/mmdebstrap.log" setsid bash -c "$run_mmdebstrap" mmdebstrap \
        --mode=root --format=directory --variant=minbase --verbose \
        --include="$inc" --hook-dir="$MERGED_USR_HOOK" \
        --setup-hook='mkdir -p "$1/etc/dpkg/dpkg.cfg.d" && echo force-unsafe-io >"$1/etc/dpkg/dpkg.cfg.d/runtime-build-unsafe-io"' \
        "$SUITE" "$work/rootfs" "$mirror" &
helper=$!
wait "$helper" || { helper=""; tail -n 20 "$work/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
helper=""
[ -f "$UNSAFE_IO" ] || die "mmdebstrap's setup hook did not run"
grep -c '^Setting up ' "$work/mmdebstrap.log" | while read -r n; do log "mmdebstrap: $n packages set up"; done

root="$work/rootfs"
if [ -n "$EXTRA" ]; then
        # A /proc for what the image's own pip and python run below (the
        # cleanup unmounts it should a step fail).
        mount -t proc proc "$root/proc"
        if [ -n "$PIP_PACKAGES" ]; then
                # The host's pip fetches (with the host's certificate
                # authorities and proxy settings), the image's pip installs
                # that file offline; both check the pinned hash.
                log "installing from PyPI: ${PIP_PACKAGES%% *}"
                mkdir -p "$root/tmp/wheels"
                printf '%s\n' "$PIP_PACKAGES" >"$root/tmp/wheels/requirements.txt"
                python3 -m pip download -q --no-deps --require-hashes --no-cache-dir -d "$root/tmp/wheels" \
                        -r "$root/tmp/wheels/requirements.txt"
                chroot "$root" python3 -m pip install -q --no-deps --require-hashes --no-index --no-cache-dir \
                        --root-user-action=ignore --break-system-packages --find-links /tmp/wheels \
                        -r /tmp/wheels/requirements.txt
        fi
        if [ -n "$DENO_PACKAGE" ]; then
                read -r deno_name deno_version deno_sha512 <<<"$DENO_PACKAGE"
                deno_url="${NPM_REGISTRY%/}/$deno_name/-/${deno_name#*/}-$deno_version.tgz"
                log "installing from npm: $deno_name@$deno_version"
                curl -fsSL --proto '=https' --max-filesize 200000000 -o "$work/deno.tgz" "$deno_url" ||
                        die "fetching $deno_url failed"
                echo "$deno_sha512  $work/deno.tgz" | sha512sum -c --quiet - ||
                        die "$deno_name@$deno_version does not match its pinned SHA-512"
                tar -xzf "$work/deno.tgz" -C "$work" --no-same-owner package/deno
                install -m 0755 "$work/package/deno" "$root/usr/local/bin/deno"
                rm -rf "$work/deno.tgz" "$work/package"
        fi
        if [ -n "$MCP_RECIPES" ]; then
                log "installing the MCP gateway (mcp-proxy) and the catalog's servers"
                mkdir -p "$root/tmp/mcp-wheels" "$root/opt/runtime-mcp/servers"
                python3 -m pip download -q --no-deps --require-hashes --no-cache-dir -d "$root/tmp/mcp-wheels" \
                        -r "$MCP_RECIPES/requirements.txt"
                cp "$MCP_RECIPES/requirements.txt" "$root/tmp/mcp-wheels/"
                chroot "$root" python3 -m venv /opt/runtime-mcp/venv
                chroot "$root" /opt/runtime-mcp/venv/bin/pip install -q --no-deps --require-hashes --no-index \
                        --no-cache-dir --find-links /tmp/mcp-wheels -r /tmp/mcp-wheels/requirements.txt
                # As with pip above, the host's npm fetches (its certificate
                # authorities and proxy); npm ci checks every tarball against
                # the lock's SHA-512 and runs no package's scripts. The tree
                # is plain JavaScript, run by the image's Node.js.
                mkdir -p "$work/mcp-servers"
                cp "$MCP_RECIPES/package.json" "$MCP_RECIPES/package-lock.json" "$work/mcp-servers/"
                (cd "$work/mcp-servers" && npm ci --ignore-scripts --omit=dev --no-audit --no-fund --engine-strict=false \
                        --cache "$work/npm-cache" --registry "$NPM_REGISTRY") >"$work/npm.log" 2>&1 ||
                        { tail -n 20 "$work/npm.log" >&2; die "npm ci of the MCP servers failed"; }
                cp -a "$work/mcp-servers/." "$root/opt/runtime-mcp/servers/"
                chown -R 0:0 "$root/opt/runtime-mcp"
                chmod -R a+rX,go-w "$root/opt/runtime-mcp"
                rm -rf "$work/mcp-servers" "$work/npm-cache"
                rm -f "$work/npm.log"
        fi
        umount "$root/proc"
fi
# Make the tree sane for a sandbox.
chroot "$root" apt-get clean
rm -f "$UNSAFE_IO"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log \
        "$root"/var/cache/debconf/*-old "$root"/tmp/* "$root"/var/tmp/*
mkdir -p "$root/var/lib/apt/lists/partial"
# The sandbox has no network device: name resolution happens in the host's
# egress proxy. A resolv.conf that names no server cannot leak the host's.
rm -f "$root/etc/resolv.conf"
printf '# Sandboxes resolve names through the egress proxy (HTTP_PROXY).\n' >"$root/etc/resolv.conf"
echo sandbox >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
# PEP 668: Debian marks its Python "externally managed", so `pip install`
# outside a venv stops with externally-managed-environment. A sandbox is a
# throwaway machine of its own and is the isolation, so installing into it is
# what its user means: drop the marker (pip, uv and every other installer
# read it) and say so in pip's own configuration too, should a python3
# upgrade inside the sandbox bring the marker back. pip installs as root into
# /usr/local/lib/python3*/dist-packages, apart from the files dpkg owns.
rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
printf '[global]\nbreak-system-packages = true\n' >"$root/etc/pip.conf"
install -d -m 0755 "$root/workspace" "$root/.runtime"
chroot "$root" groupadd --gid "$SANDBOX_UID" "$SANDBOX_USER"
chroot "$root" useradd --uid "$SANDBOX_UID" --gid "$SANDBOX_UID" --groups sudo --home-dir /workspace \
        --no-create-home --shell /bin/bash "$SANDBOX_USER"
chown "$SANDBOX_UID:$SANDBOX_UID" "$root/workspace"
printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\n' "$SANDBOX_USER" >"$root/etc/sudoers.d/$SANDBOX_USER"
chmod 0440 "$root/etc/sudoers.d/$SANDBOX_USER"
# Bind-mount target of the agent binary.
install -m 0755 /dev/null "$root/.runtime/agent"
install -d -m 1777 "$root/tmp"
# Device nodes come from the driver (bwrap --dev, gVisor's own /dev).
find "$root/dev" -mindepth 1 -delete
chmod 0700 "$root/root"

log "shifting ownership to uid/gid $RUNTIME_UID_SHIFT + n"
# chown clears set-id bits: put the mode back afterwards. Runs the image's
# own python3 so the host needs none.
chroot "$root" /usr/bin/python3 - "$RUNTIME_UID_SHIFT" <<'EOF'
import os, stat, sys
shift = int(sys.argv[1])
def fix(p):
    st = os.lstat(p)
    if st.st_uid >= shift:
        return
    os.lchown(p, st.st_uid + shift, st.st_gid + shift)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(p, stat.S_IMODE(st.st_mode))
for d, dirs, files in os.walk("/", topdown=True):
    dirs[:] = [x for x in dirs if not os.path.ismount(os.path.join(d, x))]
    for x in files + dirs:
        fix(os.path.join(d, x))
fix("/")
EOF

# Set-id binaries of the image are owned by the shifted range: keep host
# users out of the tree so that none of them can become uid 100000 and
# rewrite the image every sandbox shares. Overlayfs reads the lower layer
# with the mounter's (root's) credentials, and the sandbox's "/" takes its
# mode from the upper layer, so 0700 here changes nothing inside.
chmod 0700 "$root"

echo "$recipe_sha" >"$work/recipe.sha256"
date -u +%Y-%m-%dT%H:%M:%SZ >"$work/built-at"
echo "$RUNTIME_UID_SHIFT" >"$work/uid-shift"
echo "$PACKAGES $EXTRA${PIP_PACKAGES:+ ${PIP_PACKAGES%% *}}${DENO_PACKAGE:+ $(echo "$DENO_PACKAGE" | awk '{ print $1 "@" $2 }')}${MCP_RECIPES:+ $(grep -o '^mcp-proxy==[^ ]*' "$MCP_RECIPES/requirements.txt")}" >"$work/packages"
rm -f "$work/mmdebstrap.log"
du -sh "$root" | awk '{ print "rootfs size " $1 }' | while read -r l; do log "$l"; done

# The tree on disk before its name says it is there (dpkg did not sync it).
sync -f "$root"

# rename(2) cannot replace a non-empty directory: move the old image aside,
# move the new one in, then remove the old one. Sandboxes running on the old
# rootfs keep their overlay's reference to it until they stop.
if [ -e "$target" ]; then
        aside="$image_dir/$name.old-$$"
        mv -T "$target" "$aside"
fi
mv -T "$work" "$target"
work=""
if [ -n "$aside" ]; then
        rm -rf --one-file-system "$aside"
        aside=""
fi
log "image $name ready at $target"
