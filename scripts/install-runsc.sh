#!/usr/bin/env bash
# Installs gVisor's runsc for the gvisor driver as /usr/local/bin/runsc, the
# place the driver looks first. scripts/install-deps.sh runs it; the Debian
# package ships it as /usr/libexec/runtime/runtime-install-runsc, a step the
# administrator runs after installing the package (docs/install.md): a
# package's own scripts never fetch from the network. It fetches either the
# Go modules gVisor's pinned commit is built from (from the Go module proxy,
# when Go 1.26.3 or newer is installed) or Debian trixie's runsc package
# (from the machine's Debian mirror), each pinned by hash, and says which.
# Safe to rerun: a cached build or download is reused.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "install-runsc: run as root (it installs /usr/local/bin/runsc)" >&2
  exit 1
fi

# gVisor. Debian 12's runsc (0.0~20221219) answers statx with EINVAL, so
# `ls -l` and `stat` fail in every sandbox, and the gvisor driver refuses it.
# The runsc installed here is built from gVisor's source at the commit pinned
# in scripts/runsc/go.mod, fetched from the Go module proxy: go.sum pins the
# hash of every module it is built from (and the go command checks each one
# against Go's checksum database on its first download), so a module that
# differs fails the build. It starts python3 in a sandbox ~30% faster than
# Debian trixie's 0.0~20240729 here and forks twice as fast
# (docs/benchmarks.md). The build (~4 min on 2 cores) is cached with its
# SHA-256, so a rerun needs neither network nor compiler. A machine without
# Go 1.26.3 or newer gets trixie's package instead, fetched by apt through a
# source list of its own (the machine's sources stay as they are): apt checks
# the archive's signature and the package's hash, and the package and the
# binary are pinned here by SHA-256. Either binary is installed under a
# temporary name and renamed, so sandboxes starting meanwhile see the old
# runsc or the new one, never half of one. The driver prefers
# /usr/local/bin/runsc.
# go.mod and go.sum: beside this script in the source tree (scripts/runsc),
# in PREFIX/share/runtime/runsc where `make install` and the package put them
# (this script being PREFIX/libexec/runtime/runtime-install-runsc).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RUNSC_GO_DIR=${RUNSC_GO_DIR:-$here/runsc}
[ -f "$RUNSC_GO_DIR/go.mod" ] || RUNSC_GO_DIR="$here/../../share/runtime/runsc"
RUNSC_GO_VERSION=$(awk '$1 == "gvisor.dev/gvisor" { print $2 }' "$RUNSC_GO_DIR/go.mod")
RUNSC_GO_MIN=1.26.3
RUNSC_DEB_VERSION='0.0~20240729.0-4+b7'
RUNSC_DEB_SHA256=3c25a5130dfac2f71237d5baad56ac86a255de87a0400f11b36a555156dc325a
RUNSC_BIN_SHA256=ce52e04038baa76d6069afae5fc1bee60c153bbf0276f2c3c25506553526f38f
RUNSC_CACHE=${RUNSC_CACHE:-/var/cache/runtime/runsc}
RUNSC_DEST=/usr/local/bin/runsc

sha256_is() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# The machine's configured Debian mirror: the URI that serves its own release
# (deb822 .sources first, then sources.list), as images/build.sh finds it. No
# host is named here; trixie is fetched from the same mirror.
debian_mirror() {
  local suite f
  suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$suite" ] || return 0
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$suite" '
      function flush() {
        if (uri != "" && (" " suites " ") ~ (" " suite " ") && (" " types " ") ~ / deb /) { print uri; found = 1; exit }
        uri = ""; suites = ""; types = ""
      }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]*#/ { next }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "suites:" { $1 = ""; suites = $0 }
      tolower($1) == "types:" { $1 = ""; types = $0 }
      END { if (!found) flush() }
    ' "$f"
  done
  if [ -f /etc/apt/sources.list ]; then
    awk -v suite="$suite" '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($(i+1) == suite) { print $i; exit } break } }' \
      /etc/apt/sources.list
  fi
}

install_runsc_deb() {
  sha256_is "$RUNSC_DEST" "$RUNSC_BIN_SHA256" && return 0
  local deb="$RUNSC_CACHE/runsc_${RUNSC_DEB_VERSION}_amd64.deb"
  if ! sha256_is "$deb" "$RUNSC_DEB_SHA256"; then
    echo "install-runsc: fetching runsc $RUNSC_DEB_VERSION from Debian trixie"
    local a="$RUNSC_CACHE/apt"
    mkdir -p "$a/lists/partial" "$a/etc/sources.list.d" "$a/etc/preferences.d"
    local mirror
    mirror=$(debian_mirror | head -n1)
    if [ -z "$mirror" ]; then
      echo "install-runsc: no Debian mirror for this release in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources" >&2
      exit 1
    fi
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-trixie-stable.gpg] $mirror trixie main" \
      >"$a/etc/sources.list"
    local opts=(
      -o "Dir::Etc::SourceList=$a/etc/sources.list" -o "Dir::Etc::SourceParts=$a/etc/sources.list.d"
      -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$a/etc/preferences.d"
      -o "Dir::State::Lists=$a/lists" -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
      -o "APT::Architecture=amd64" -o "APT::Architectures=amd64"
      -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false" -o "APT::Sandbox::User=root"
    )
    apt-get -qq "${opts[@]}" update
    (cd "$RUNSC_CACHE" && apt-get -qq "${opts[@]}" download "runsc=$RUNSC_DEB_VERSION")
    if ! sha256_is "$deb" "$RUNSC_DEB_SHA256"; then
      echo "install-runsc: $deb does not match its pinned SHA-256" >&2
      rm -f "$deb"
      exit 1
    fi
  fi
  local x
  x=$(mktemp -d "$RUNSC_CACHE/extract.XXXXXX")
  dpkg-deb -x "$deb" "$x"
  if ! sha256_is "$x/usr/bin/runsc" "$RUNSC_BIN_SHA256"; then
    echo "install-runsc: runsc in $deb does not match its pinned SHA-256" >&2
    rm -rf "$x"
    exit 1
  fi
  install -m 0755 "$x/usr/bin/runsc" "$RUNSC_DEST.new.$$"
  mv -f "$RUNSC_DEST.new.$$" "$RUNSC_DEST"
  rm -rf "$x"
  echo "install-runsc: installed runsc $RUNSC_DEB_VERSION as $RUNSC_DEST"
}

# Whether this machine's go is at least $RUNSC_GO_MIN.
go_is_new_enough() {
  command -v go >/dev/null 2>&1 || return 1
  local v
  v=$(go env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  [ "$(printf '%s\n%s\n' "$RUNSC_GO_MIN" "$v" | sort -V | head -n1)" = "$RUNSC_GO_MIN" ]
}

# The pinned gVisor built from source; returns 1 when this machine cannot
# build it (no Go, or too old), for trixie's package instead.
install_runsc_go() {
  local dir="$RUNSC_CACHE/go-$RUNSC_GO_VERSION"
  local bin="$dir/runsc" sum="$dir/runsc.sha256"
  if [ -f "$sum" ] && sha256_is "$RUNSC_DEST" "$(cat "$sum")"; then
    return 0
  fi
  if ! { [ -f "$sum" ] && sha256_is "$bin" "$(cat "$sum")"; }; then
    go_is_new_enough || return 1
    echo "install-runsc: building runsc $RUNSC_GO_VERSION from the Go module proxy (a few minutes)"
    mkdir -p "$dir"
    rm -f "$bin" "$sum"
    # -mod=readonly: go.mod and go.sum as committed, never updated.
    if ! (cd "$RUNSC_GO_DIR" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
        go build -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$RUNSC_GO_VERSION" \
        -o "$bin.new" gvisor.dev/gvisor/runsc); then
      echo "install-runsc: building runsc $RUNSC_GO_VERSION failed" >&2
      rm -f "$bin.new"
      exit 1
    fi
    mv -f "$bin.new" "$bin"
    sha256sum "$bin" | cut -d' ' -f1 >"$sum.new"
    mv -f "$sum.new" "$sum"
  fi
  install -m 0755 "$bin" "$RUNSC_DEST.new.$$"
  mv -f "$RUNSC_DEST.new.$$" "$RUNSC_DEST"
  echo "install-runsc: installed runsc $RUNSC_GO_VERSION as $RUNSC_DEST"
}

if [ "$(dpkg --print-architecture)" = amd64 ]; then
  mkdir -p "$RUNSC_CACHE"
  if ! install_runsc_go; then
    echo "install-runsc: no Go $RUNSC_GO_MIN or newer here: runsc from Debian trixie instead"
    install_runsc_deb
  fi
else
  echo "install-runsc: no pinned runsc for $(dpkg --print-architecture); the gvisor driver needs one" >&2
fi

