#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a sandbox answering 42:
# installs what is missing, builds and installs Runtime, builds the default
# image when it is missing, starts runtimed, and runs
#   runtime sandbox run -- python3 -c 'print(6 * 7)'
# Safe to rerun: a rerun reuses the image and restarts the daemon it started. The state dir is put
# on a layer pool (scripts/layer-pool.sh, RUNTIME_LAYER_POOL_MIB) where its filesystem cannot share
# blocks, so snapshots and forks copy no data.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX=${PREFIX:-/usr/local}
STATE_DIR=${RUNTIME_STATE_DIR:-/var/lib/runtime}
LOG=${RUNTIME_LOG:-/var/log/runtimed.log}
PIDFILE=/run/runtimed.pid
LISTEN=${RUNTIME_LISTEN:-127.0.0.1:7878}
# More runtimed options, split on spaces, e.g. the egress operator settings
# (docs/egress.md): RUNTIME_DAEMON_ARGS="--egress-public-cidr 203.0.113.80/32 --egress-trust-ca FILE"
read -r -a DAEMON_ARGS <<<"${RUNTIME_DAEMON_ARGS:-}"

step() { printf '\n== %s\n' "$*"; }

step "dependencies"
scripts/install-deps.sh

step "build"
make -j"$(nproc)"
make install PREFIX="$PREFIX" >/dev/null
export PATH="$PREFIX/bin:$PATH"

step "daemon"
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "stopping the runtimed this script started before (pid $(cat "$PIDFILE"))"
  kill -TERM "$(cat "$PIDFILE")"
  for _ in $(seq 1 100); do kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break; sleep 0.1; done
fi
# The state dir on a filesystem whose files share blocks (docs/lifecycle.md, "Snapshots and fork"):
# a pool of RUNTIME_LAYER_POOL_MIB (default 64 GiB, sparse) where the host's has no reflink.
scripts/layer-pool.sh "$STATE_DIR" ||
  echo "no layer pool: snapshots and forks copy sparse (runtime doctor says so)"
mkdir -p "$(dirname "$LOG")"
nohup "$PREFIX/bin/runtimed" --state-dir "$STATE_DIR" --listen "$LISTEN" "${DAEMON_ARGS[@]}" >>"$LOG" 2>&1 &
echo $! >"$PIDFILE"
export RUNTIME_BASE_URL="http://$LISTEN" RUNTIME_STATE_DIR="$STATE_DIR"
for _ in $(seq 1 100); do
  curl -fsS "$RUNTIME_BASE_URL/healthz" >/dev/null 2>&1 && break
  kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { echo "runtimed exited; see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
  sleep 0.1
done
echo "runtimed is up at $RUNTIME_BASE_URL (log: $LOG)"
runtime doctor || true

step "image"
# RUNTIME_IMAGES="default desktop" builds the desktop image too (docs/computer-use.md).
for image in ${RUNTIME_IMAGES:-default}; do
  runtime image build "$image"
done

step "run"
echo "\$ runtime sandbox run -- python3 -c 'print(6 * 7)'"
runtime sandbox run -- python3 -c 'print(6 * 7)'
