#!/usr/bin/env bash
# The whole test suite: installs what it needs, builds, then runs the C unit
# tests (release and ASan+UBSan), the fuzz corpora, and the integration tests
# against the real daemon, agent, drivers, CLI and SDK (pytest drives all of
# it; pytest.ini adds --durations). The microVM runs its representative subset
# unless RUNTIME_TEST_ALL=1. The last line is pytest's summary; every test's
# time is kept in build/test-results.xml (JUnit XML), to see where the
# suite's hour goes.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
make -j"$(nproc)"
exec python3 -m pytest -ra --junitxml=build/test-results.xml "$@"
