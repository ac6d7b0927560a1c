#!/usr/bin/env bash
# Installs what Runtime needs to build, run and test, from Debian's packages
# and PyPI. Safe to rerun: it installs only what is missing.
set -euo pipefail

DEBS=(
  build-essential pkg-config clang libclang-rt-14-dev
  libmicrohttpd-dev libjansson-dev libsqlite3-dev libpq-dev libseccomp-dev libssl-dev
  # The PostgreSQL store's tests start a server of their own (tests/integration/helpers/postgres.py).
  postgresql-15
  libcurl4-openssl-dev libcmocka-dev libhttp-parser-dev libwslay-dev zlib1g-dev
  # Images are made by mmdebstrap; the package's test installs into a root made by debootstrap.
  bubblewrap lxcfs mmdebstrap debootstrap e2fsprogs xfsprogs qemu-system-x86 iproute2 procps
  python3 python3-pip python3-venv ca-certificates curl
  libsystemd-dev
  # The daemon reads a build context's archive to key a COPY's layer (src/daemon/manager/context_digest.c).
  libarchive-dev
  # The Debian package and its tests (docs/install.md): the build, lintian, the
  # unit's check (the systemd package's tools; systemd-sysv, which would make
  # it init, is not installed), the manual pages' rendering.
  git debhelper lintian systemd groff-base man-db
  # The dashboard's tests drive a real headless Chromium over WebDriver (tests/integration/test_dashboard.py).
  chromium chromium-driver
  # Images from OCI registries: skopeo downloads, umoci unpacks (src/daemon/manager/oci_pull.c);
  # the tests push to a docker-registry of their own on loopback (tests/integration/test_images_oci.py).
  skopeo umoci docker-registry
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

# The fleet's database failover drill (tests/integration/test_fleet_failover.py) runs PostgreSQL
# under Patroni with etcd; it is among the slow tests that RUNTIME_TEST_ALL=1 runs, and only then
# are its packages installed. Their services are not started here (the drill starts its own).
if [ "${RUNTIME_TEST_ALL:-}" = 1 ]; then
  drill=()
  for p in patroni etcd-server etcd-client; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || drill+=("$p")
  done
  if [ "${#drill[@]}" -gt 0 ]; then
    echo "install-deps: installing ${drill[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${drill[@]}" >/dev/null
  fi
fi

# gVisor's runsc, from its pinned source or a pinned package: install-runsc.sh says how.
"$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/install-runsc.sh"

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
