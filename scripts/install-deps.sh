#!/usr/bin/env bash
# Installs what Runtime needs to build, run and test, from Debian's packages
# and PyPI. Safe to rerun: it installs only what is missing.
set -euo pipefail

DEBS=(
  build-essential pkg-config clang libclang-rt-14-dev
  libmicrohttpd-dev libjansson-dev libsqlite3-dev libseccomp-dev libssl-dev
  libcurl4-openssl-dev libcmocka-dev libhttp-parser-dev libwslay-dev zlib1g-dev
  bubblewrap lxcfs debootstrap e2fsprogs xfsprogs qemu-system-x86 iproute2 procps
  python3 python3-pip python3-venv ca-certificates curl
)

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (it installs Debian packages)" >&2
  exit 1
fi

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Node for the TypeScript SDK (sdk/js): Debian's nodejs and npm when there is no node at all. The
# SDK needs Node 20 or newer; with an older one its tests skip and say so.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "install-deps: installing nodejs npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# gVisor. Debian 12's runsc (0.0~20221219) answers statx with EINVAL, so
# `ls -l` and `stat` fail in every sandbox, and the gvisor driver refuses it.
# The pinned runsc comes from Debian trixie's archive, fetched by apt through
# a source list of its own (the machine's sources stay as they are): apt
# checks the archive's signature and the package's hash, and the package and
# the binary are pinned here by SHA-256. The package is cached, so a rerun
# needs no network. The binary is installed under a temporary name and
# renamed, so sandboxes starting meanwhile see the old runsc or the new one,
# never half of one. The driver prefers /usr/local/bin/runsc.
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

install_runsc() {
  sha256_is "$RUNSC_DEST" "$RUNSC_BIN_SHA256" && return 0
  local deb="$RUNSC_CACHE/runsc_${RUNSC_DEB_VERSION}_amd64.deb"
  if ! sha256_is "$deb" "$RUNSC_DEB_SHA256"; then
    echo "install-deps: fetching runsc $RUNSC_DEB_VERSION from Debian trixie"
    local a="$RUNSC_CACHE/apt"
    mkdir -p "$a/lists/partial" "$a/etc/sources.list.d" "$a/etc/preferences.d"
    local mirror
    mirror=$(debian_mirror | head -n1)
    if [ -z "$mirror" ]; then
      echo "install-deps: no Debian mirror for this release in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources" >&2
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
      echo "install-deps: $deb does not match its pinned SHA-256" >&2
      rm -f "$deb"
      exit 1
    fi
  fi
  local x
  x=$(mktemp -d "$RUNSC_CACHE/extract.XXXXXX")
  dpkg-deb -x "$deb" "$x"
  if ! sha256_is "$x/usr/bin/runsc" "$RUNSC_BIN_SHA256"; then
    echo "install-deps: runsc in $deb does not match its pinned SHA-256" >&2
    rm -rf "$x"
    exit 1
  fi
  install -m 0755 "$x/usr/bin/runsc" "$RUNSC_DEST.new.$$"
  mv -f "$RUNSC_DEST.new.$$" "$RUNSC_DEST"
  rm -rf "$x"
  echo "install-deps: installed runsc $RUNSC_DEB_VERSION as $RUNSC_DEST"
}
if [ "$(dpkg --print-architecture)" = amd64 ]; then
  mkdir -p "$RUNSC_CACHE"
  install_runsc
else
  echo "install-deps: no pinned runsc for $(dpkg --print-architecture); the gvisor driver needs one" >&2
fi

# The egress proxy process (runtime-egress) becomes this user once it has
# loaded its CA: no home, no shell, no other group (docs/egress.md).
if ! getent passwd runtime-egress >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin runtime-egress
fi

# Python: the SDK itself and what the tests drive it with. Whichever python3
# is first on PATH is the one the tests use.
PY=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
pip_flags=(-q --disable-pip-version-check)
if "$PY" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages; then
  # Debian's own python3 refuses system-wide installs without this flag.
  if "$PY" -c 'import sys; sys.exit(0 if sys.prefix == sys.base_prefix and sys.prefix.startswith("/usr") else 1)'; then
    pip_flags+=(--break-system-packages)
  fi
fi
"$PY" -m pip install "${pip_flags[@]}" -r "$here/tests/requirements.txt"
"$PY" -m pip install "${pip_flags[@]}" -e "$here/sdk/python"
