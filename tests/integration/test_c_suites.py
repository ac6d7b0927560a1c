"""The C unit tests and the libFuzzer targets, run from pytest so that one
command runs every suite.

Each cmocka test is a pytest item of its own (`test_unit[<binary>::<test>]`),
so a C test that skips reaches pytest's summary as a skip with the reason it
printed. A binary that ran zero tests, stopped early, leaked or tripped a
sanitizer fails its `test_unit_binary` item. The sanitizer lane runs the same
binaries built with ASan+UBSan (`make asan-build`, in build/asan) and replays
every fuzz corpus under the sanitizers (`make fuzz-replay`). Its items are
marked sanitizer_lane: they run after all others, their build having started
in the background once the release build was done (conftest.py).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import REPO
from helpers.prebuild import fuzz_run_command

UNIT_DIR = REPO / "tests" / "unit"
LANES = {"release": ("unit-build", REPO / "build" / "tests"),
         "asan": ("asan-build", REPO / "build" / "asan" / "tests")}
BINARY_TIMEOUT = 900
RUN_ALL = os.environ.get("RUNTIME_TEST_ALL") == "1"


def _cases() -> dict[str, list[str]]:
    """The cmocka tests each tests/unit/test_*.c registers, in order."""
    out = {}
    for src in sorted(UNIT_DIR.glob("test_*.c")):
        out[src.stem] = re.findall(r"cmocka_unit_test\w*\(\s*(\w+)", src.read_text())
    return out


CASES = _cases()
# The sanitizer lane's items run last, after their build has run beside the
# rest of the suite (conftest.py, helpers/prebuild.py).
LANE_MARKS = {"release": (), "asan": (pytest.mark.sanitizer_lane,)}
CASE_PARAMS = [pytest.param(lane, binary, case, id=f"{lane}-{binary}::{case}", marks=LANE_MARKS[lane])
               for lane in LANES for binary, cases in CASES.items() for case in cases]
BINARY_PARAMS = [pytest.param(lane, binary, id=f"{lane}-{binary}", marks=LANE_MARKS[lane])
                 for lane in LANES for binary in CASES]

# ---------------------------------------------------------------------------
# Running a binary once and reading cmocka's output

RESULT_RE = re.compile(r"^\[ +(RUN|OK|SKIPPED|FAILED) +\] (\w+)[ \t]*$", re.M)
SUMMARY_RE = re.compile(r"^\[ +(PASSED|SKIPPED|FAILED) +\] (\d+) test\(s\)", re.M)
SANITIZER_RE = re.compile(r"^(==\d+==ERROR: \w+Sanitizer.*|.*: runtime error: .*)$", re.M)


@dataclass
class Run:
    returncode: int
    output: str
    status: dict[str, str] = field(default_factory=dict)   # case -> OK, SKIPPED, FAILED, RUN
    text: dict[str, str] = field(default_factory=dict)     # case -> what it printed
    summary: dict[str, int] = field(default_factory=dict)  # PASSED/SKIPPED/FAILED -> count

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-n:])


def parse(returncode: int, output: str) -> Run:
    run = Run(returncode, output)
    marks = list(RESULT_RE.finditer(output))
    for i, m in enumerate(marks):
        kind, case = m.groups()
        if kind == "RUN":
            end = marks[i + 1].start() if i + 1 < len(marks) else len(output)
            run.status[case] = "RUN"
            run.text[case] = output[m.end():end].strip()
        elif run.status.get(case) in (None, "RUN"):
            # The list under the summary repeats SKIPPED/FAILED lines; the
            # first result after RUN is the one that counts.
            run.status[case] = kind
    for m in SUMMARY_RE.finditer(output):
        run.summary.setdefault(m.group(1), int(m.group(2)))
    return run


_runs: dict[tuple[str, str], Run] = {}


def _lane_env(lane: str, binary: str) -> dict[str, str]:
    env = dict(os.environ)
    if lane == "asan":
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
        if binary == "test_driver_microvm" and not RUN_ALL:
            # The release lane boots guests under TCG; booting them again
            # under the sanitizers adds minutes and covers the same host code.
            env["RUNTIME_TEST_MICROVM_LIVE"] = "0"
    return env


def run_binary(request, lane: str, binary: str) -> Run:
    key = (lane, binary)
    if key not in _runs:
        request.getfixturevalue(f"{lane}_unit_build")
        env = _lane_env(lane, binary)
        if binary.startswith("test_driver_"):
            # The driver tests start real sandboxes from the suite's image.
            env["RUNTIME_TEST_IMAGE_DIR"] = str(request.getfixturevalue("image_dir"))
        if binary.startswith("test_store_postgres"):
            # The PostgreSQL backend's tests run against a real server.
            env["RUNTIME_TEST_PG_URL"] = request.getfixturevalue("postgres").url()
        path = LANES[lane][1] / binary
        try:
            r = subprocess.run([str(path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               timeout=BINARY_TIMEOUT)
            _runs[key] = parse(r.returncode, r.stdout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            _runs[key] = parse(-1, out + f"\n(killed after {BINARY_TIMEOUT} s)")
    return _runs[key]


def _build(target: str) -> None:
    r = subprocess.run(["make", "-j2", target], cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=1800)
    if r.returncode != 0:
        pytest.fail(f"`make {target}` failed ({r.returncode}):\n{r.stdout[-8000:]}", pytrace=False)


@pytest.fixture(scope="module")
def release_unit_build(build_dir):
    _build(LANES["release"][0])


@pytest.fixture(scope="module")
def asan_unit_build(build_dir, sanitizer_build):
    sanitizer_build.wait()
    _build(LANES["asan"][0])


# ---------------------------------------------------------------------------
# The items


@pytest.mark.timeout(BINARY_TIMEOUT + 1800)
@pytest.mark.parametrize("lane,binary,case", CASE_PARAMS)
def test_unit(request, lane, binary, case):
    run = run_binary(request, lane, binary)
    status = run.status.get(case)
    if status == "SKIPPED":
        reason = " ".join(line.strip() for line in run.text.get(case, "").splitlines() if line.strip())
        if lane == "asan" and "RUNTIME_TEST_MICROVM_LIVE=0" in reason and not RUN_ALL:
            reason += " (the sanitizer lane boots no guest unless RUNTIME_TEST_ALL=1; the release lane does)"
        pytest.skip(f"{binary}::{case}: {reason or 'skipped without a reason printed'}")
    assert status is not None, (f"{binary}::{case} never ran (exit {run.returncode}); "
                                f"the end of its output:\n{run.tail()}")
    assert status != "RUN", (f"{binary}::{case} started but never finished (exit {run.returncode}):\n"
                             f"{run.text.get(case, '')[-6000:]}")
    assert status == "OK", f"{binary}::{case} {status}:\n{run.text.get(case, '')[-6000:]}"


@pytest.mark.timeout(BINARY_TIMEOUT + 1800)
@pytest.mark.parametrize("lane,binary", BINARY_PARAMS)
def test_unit_binary(request, lane, binary):
    """The binary as a whole: it registered tests, ran them all, said so in
    cmocka's summary, exited 0, and no sanitizer spoke."""
    expected = CASES[binary]
    assert expected, f"tests/unit/{binary}.c registers no cmocka test"
    run = run_binary(request, lane, binary)
    reports = SANITIZER_RE.findall(run.output)
    assert not reports, f"{binary} ({lane}): sanitizer reports:\n" + "\n".join(reports[:10]) + \
        f"\n---\n{run.tail(120)}"
    assert run.returncode == 0, f"{binary} ({lane}) exited {run.returncode}:\n{run.tail()}"
    passed, skipped = run.summary.get("PASSED"), run.summary.get("SKIPPED", 0)
    assert passed is not None, f"{binary} ({lane}) printed no cmocka summary:\n{run.tail()}"
    assert passed + skipped > 0, f"{binary} ({lane}) ran zero tests:\n{run.tail()}"
    assert passed + skipped == len(expected), (
        f"{binary} ({lane}): {passed} passed and {skipped} skipped of the {len(expected)} "
        f"it registers:\n{run.tail()}")
    unknown = sorted(set(run.status) - set(expected))
    assert not unknown, f"{binary} ({lane}) ran tests its source does not register: {unknown}"


@pytest.mark.sanitizer_lane
@pytest.mark.timeout(1800)
def test_fuzz_corpora_under_sanitizers(build_dir, sanitizer_build):
    """The sanitizer lane's other half: every fuzz target (ASan+UBSan) over
    each input of its corpus, nothing new."""
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed: no libFuzzer")
    sanitizer_build.wait()
    targets = sorted((REPO / "tests" / "fuzz").glob("fuzz_*.c"))
    assert targets, "no fuzz targets in tests/fuzz"
    r = subprocess.run(["make", "-j2", "fuzz-replay"], cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, errors="replace", timeout=1700)
    assert r.returncode == 0, f"make fuzz-replay failed:\n{r.stdout[-8000:]}"
    for t in targets:
        corpus = REPO / "tests" / "fuzz" / "corpus" / t.stem.removeprefix("fuzz_")
        n = sum(1 for p in corpus.iterdir() if p.is_file()) if corpus.is_dir() else 0
        assert n > 0, f"{t.name} has no corpus in {corpus.relative_to(REPO)}"
    # libFuzzer says how many inputs it read; a replay that read none proves nothing.
    read = [int(m) for m in re.findall(r"INFO: seed corpus: files: (\d+)", r.stdout)]
    assert len(read) == len(targets) and all(read), \
        f"a target replayed no input ({read} of {len(targets)} targets):\n{r.stdout[-4000:]}"


@pytest.mark.sanitizer_lane
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_fuzzers_over_their_corpora(build_dir, sanitizer_build):
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed: no libFuzzer")
    if not list((REPO / "tests" / "fuzz").glob("fuzz_*.c")):
        pytest.skip("no fuzz targets in tests/fuzz")
    sanitizer_build.wait()
    # A few seconds of new inputs per target by default; RUNTIME_TEST_ALL=1
    # fuzzes each for longer (helpers/prebuild.py). The run the background
    # job made, when it finished one; else one here.
    got = sanitizer_build.fuzz_result()
    if got is None:
        r = subprocess.run(fuzz_run_command(), cwd=REPO, capture_output=True, text=True, timeout=1800)
        got = (r.returncode, r.stdout + r.stderr)
    returncode, out = got
    assert returncode == 0, f"make fuzz-run failed:\n{out[-12000:]}"
    # Every target ran to its end: make names each, and libFuzzer's last line says how long it ran.
    targets = sorted(p.stem for p in (REPO / "tests" / "fuzz").glob("fuzz_*.c"))
    ran = [t for t in targets if f"== build/fuzz/{t}\n" in out]
    done = len(re.findall(r"^Done \d+ runs in \d+ second", out, re.M))
    assert len(ran) == len(targets) and done == len(targets), \
        f"fuzz-run did not run every target to its end ({len(ran)} named, {done} done, of {len(targets)}):\n{out[-6000:]}"


# ---------------------------------------------------------------------------
# The reader itself, on cmocka's real output shapes


def test_parse_counts_a_zero_test_binary_as_zero():
    run = parse(0, "[==========] tests: Running 0 test(s).\n[==========] tests: 0 test(s) run.\n"
                   "[  PASSED  ] 0 test(s).\n")
    assert run.summary == {"PASSED": 0} and not run.status


def test_parse_reads_skips_with_their_reason():
    out = ("[ RUN      ] test_a\n[       OK ] test_a\n"
           "[ RUN      ] test_b\nskip: no image at /x/default (build it)\n[  SKIPPED ] test_b\n"
           "[ RUN      ] test_c\n[  ERROR   ] --- 1 != 2\n[   LINE   ] --- t.c:3: error: Failure!\n"
           "[  FAILED  ] test_c\n[ RUN      ] test_d\n"
           "[==========] tests: 4 test(s) run.\n[  PASSED  ] 1 test(s).\n"
           "[  FAILED  ] 1 test(s), listed below:\n[  FAILED  ] test_c\n"
           "[  SKIPPED ] 1 test(s), listed below:\n[  SKIPPED ] test_b\n")
    run = parse(1, out)
    assert run.status == {"test_a": "OK", "test_b": "SKIPPED", "test_c": "FAILED", "test_d": "RUN"}
    assert run.text["test_b"] == "skip: no image at /x/default (build it)"
    assert "1 != 2" in run.text["test_c"]
    assert run.summary == {"PASSED": 1, "FAILED": 1, "SKIPPED": 1}


def test_sanitizer_reports_are_recognised():
    out = ("==123==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x1\n"
           "src/x.c:3:5: runtime error: signed integer overflow\n"
           "==9==ERROR: LeakSanitizer: detected memory leaks\nall fine\n")
    assert len(SANITIZER_RE.findall(out)) == 3
