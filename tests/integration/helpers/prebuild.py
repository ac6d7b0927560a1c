"""The sanitizer lane's build, started beside the other tests.

`make asan-build` and `make fuzz` compile every library source again with
ASan+UBSan (and, for the fuzzers, clang's coverage): minutes of CPU on two
cores that no other test needs. The suite starts them at low priority as
soon as the release build is done, so that they use what the other tests
leave idle, and runs the sanitizer lane's items last. Those items wait for
this build (at normal priority from then on) and then run their own `make`
as before, which finds everything made or, if the background build failed,
makes it again and reports the failure itself: this build only warms the
tree, it never decides a result.

When the run holds test_fuzzers_over_their_corpora, the same job then runs
`make fuzz-run` (every fuzz target over its corpus, then FUZZ_SECONDS of new
inputs each), still at low priority, and keeps its output and exit status
for that test, which reads them rather than fuzzing again at the end of the
run. A fuzz run the job did not finish (stopped, or its build failed) is
run again by the test in line. At low priority a target may try fewer new
inputs in its seconds than it would alone; every corpus input is replayed
either way.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

# Niceness of the background build while other tests run.
NICE = 15
# Seconds of new inputs per fuzz target: a few by default, longer with RUNTIME_TEST_ALL=1.
FUZZ_SECONDS = 30 if os.environ.get("RUNTIME_TEST_ALL") == "1" else 4


def fuzz_run_command() -> list[str]:
    """`make fuzz-run`: two targets at a time, each one's output kept whole (-Otarget)."""
    return ["make", "-j2", "-Otarget", "fuzz-run", f"FUZZ_SECONDS={FUZZ_SECONDS}"]


class Prebuild:
    def __init__(self, repo: Path):
        self.repo = repo
        self.proc: subprocess.Popen | None = None
        self.fuzz_out: Path | None = None

    def targets(self) -> list[str]:
        out = ["asan-build"]
        if shutil.which("clang") is not None:
            out.append("fuzz")
        return out

    def start(self, log_path: Path, fuzz: bool = False) -> None:
        """Starts the build; then, with fuzz (and clang), the fuzz run whose
        result fuzz_result() gives."""
        if self.proc is not None:
            return
        script = shlex.join(["make", "-j2", *self.targets()])
        if fuzz and "fuzz" in self.targets():
            self.fuzz_out = log_path.with_name(log_path.stem + "-fuzz-run.log")
            rc = self.fuzz_out.with_suffix(".rc")
            # The status is written last, to a new name: a file there means the run finished.
            script += (f" && {{ {shlex.join(fuzz_run_command())} >{shlex.quote(str(self.fuzz_out))} 2>&1;"
                       f" echo $? >{shlex.quote(str(rc))}.tmp && mv {shlex.quote(str(rc))}.tmp"
                       f" {shlex.quote(str(rc))}; }}")
        with open(log_path, "wb") as log:
            # A session of its own: its process group is renice'd and, at the
            # end of a run that never waited for it, killed as one.
            self.proc = subprocess.Popen(["nice", "-n", str(NICE), "sh", "-c", script],
                                         cwd=self.repo, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def fuzz_result(self) -> tuple[int, str] | None:
        """The background fuzz run's exit status and output, once it has finished; None when
        it did not run or did not finish (wait() first)."""
        if self.fuzz_out is None:
            return None
        rc = self.fuzz_out.with_suffix(".rc")
        if not rc.exists():
            return None
        return int(rc.read_text().strip()), self.fuzz_out.read_text(errors="replace")

    def wait(self, timeout: float = 1800) -> None:
        """Waits for the build, raising its priority first: from here on
        the suite waits for nothing else. Its result is not read here; the
        caller's own `make` decides."""
        raise_group(self.proc)
        wait_group(self.proc, timeout, 30)

    def stop(self) -> None:
        stop_group(self.proc, 30)


def wait_group(proc: subprocess.Popen | None, timeout: float, grace: float) -> None:
    """Waits for a background job; past timeout, stops its whole group (stop_group)."""
    if proc is None:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc, grace)


def raise_group(proc: subprocess.Popen | None) -> None:
    """A background job a test now waits for runs at normal priority from here on."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.setpriority(os.PRIO_PGRP, proc.pid, 0)
    except (PermissionError, ProcessLookupError):
        pass


def stop_group(proc: subprocess.Popen | None, grace: float) -> None:
    """SIGTERM to the job's process group, then a wait for the whole group (its
    children clean up after its leader has gone); SIGKILL past grace seconds."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        proc.poll()
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
