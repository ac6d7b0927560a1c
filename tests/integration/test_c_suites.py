"""The C unit tests and the libFuzzer targets, run from pytest so that one
command runs every suite."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from helpers import REPO


@pytest.mark.timeout(1800)
def test_unit_tests_pass(build_dir):
    r = subprocess.run(["make", "-j2", "test-unit"], cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900)
    sections = re.split(r"^== ", r.stdout, flags=re.M)[1:]
    bad = [sec.splitlines()[0] + "\n" + "\n".join(sec.splitlines()[-15:])
           for sec in sections if "[  PASSED  ]" not in sec or "[  FAILED  ]" in sec]
    assert r.returncode == 0, ("make test-unit failed; binaries that did not pass:\n"
                               + ("\n---\n".join(bad) or r.stdout[-4000:]))
    assert sections, f"make test-unit ran no test binary:\n{r.stdout[-2000:]}"


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_fuzzers_over_their_corpora(build_dir):
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed: no libFuzzer")
    if not list((REPO / "tests" / "fuzz").glob("fuzz_*.c")):
        pytest.skip("no fuzz targets in tests/fuzz")
    r = subprocess.run(["make", "-j2", "fuzz-run", "FUZZ_SECONDS=10"], cwd=REPO,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"make fuzz-run failed:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
