"""A build of runtimed from an earlier commit of this repository, for tests of
an upgrade: a state directory written by the daemon users run today must open
in the daemon of this tree, and (later) its running sandboxes must carry on.

The build is made from `git archive` of the commit into a cache directory
(`$RUNTIME_TEST_BASELINE_DIR`, default /var/cache/runtime/baseline), keyed by the
commit, and reused by later runs; a lock keeps two test runs from building it
at once. A clone without that commit in its history (a shallow one) cannot
have it: the caller skips, saying so.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from helpers import REPO

DEFAULT_DIR = "/var/cache/runtime/baseline"
PROGRAMS = ("runtimed", "runtime-agent", "runtime-egress", "runtime")


class BaselineUnavailable(Exception):
    """The commit is not in this clone's history."""


def _has_commit(commit: str) -> bool:
    r = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                       capture_output=True)
    return r.returncode == 0


def baseline_build(commit: str, timeout: float = 900) -> Path:
    """The build directory of `commit` (its runtimed, agent, egress and CLI),
    built on first use."""
    if not _has_commit(commit):
        raise BaselineUnavailable(f"commit {commit} is not in this clone's history (a shallow clone?)")
    root = Path(os.environ.get("RUNTIME_TEST_BASELINE_DIR", DEFAULT_DIR)) / commit
    root.parent.mkdir(parents=True, exist_ok=True)
    build = root / "src-tree" / "build"
    with open(root.parent / f".{commit}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((build / p).exists() for p in PROGRAMS) and (root / "complete").exists():
            return build
        if root.exists():
            shutil.rmtree(root)
        tree = root / "src-tree"
        tree.mkdir(parents=True)
        archive = subprocess.Popen(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                                   stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
        assert archive.wait() == 0, f"git archive {commit} failed"
        r = subprocess.run(["make", "-j2", *(f"build/{p}" for p in PROGRAMS)], cwd=tree,
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise AssertionError(f"building {commit} failed ({r.returncode}):\n{r.stdout[-3000:]}\n"
                                 f"{r.stderr[-3000:]}")
        (root / "complete").write_text(commit + "\n")
        return build
