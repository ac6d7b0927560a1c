#!/usr/bin/env python3
"""Create and exec round trips of two builds side by side, interleaved (A, B, A, B, ...) so that the
load of a shared machine falls on both alike. For a change's before and after:

    git worktree add ../runtime-before <commit> && make -C ../runtime-before -j2
    sudo python3 bench/create_exec.py ../runtime-before/build build --rounds 40

Per round and build, on one driver (namespace unless --driver): a create to its first exec result
(`true`), then exec `true` in that running sandbox after a quiet spell of --quiet-ms (20 ms: an
agent's calls come between its model's turns, not back to back) and once back to back, then the
delete. The builds take turns going first (A B, B A, ...). Prints the p50 and p90 of each figure per build and the ratio B/A of the p50s. Needs root,
the default image and each build's runtimed, runtime-agent and runtime-egress.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from helpers import Api, Daemon, remove_empty_cgroup_tree  # noqa: E402

FIGURES = ("create to first exec", "exec true after quiet", "exec true back to back", "delete")


class Side:
    def __init__(self, build: Path, image_dir: Path, tag: str, driver: str):
        self.tmp = Path(tempfile.mkdtemp(prefix=f"runtime-bench-ce-{tag}-"))
        self.cg = f"runtime-bench-ce-{os.getpid()}-{tag}"
        self.d = Daemon(build, image_dir, self.tmp / "state", self.cg)
        self.d.start()
        self.api = Api(self.d, timeout=600)
        self.driver = driver
        self.samples: dict[str, list[float]] = {f: [] for f in FIGURES}

    def round(self, quiet_s: float) -> None:
        t = time.perf_counter()
        r = self.api.post("/v1/sandboxes", json={"driver": self.driver, "timeoutSeconds": 600})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert self.api.exec(sid, command="true")["exitCode"] == 0
        self.samples["create to first exec"].append(time.perf_counter() - t)
        time.sleep(quiet_s)
        t = time.perf_counter()
        assert self.api.exec(sid, argv=["true"])["exitCode"] == 0
        self.samples["exec true after quiet"].append(time.perf_counter() - t)
        t = time.perf_counter()
        assert self.api.exec(sid, argv=["true"])["exitCode"] == 0
        self.samples["exec true back to back"].append(time.perf_counter() - t)
        t = time.perf_counter()
        r = self.api.delete(f"/v1/sandboxes/{sid}")
        assert r.status_code == 200, r.text
        self.samples["delete"].append(time.perf_counter() - t)

    def close(self) -> None:
        self.api.close()
        self.d.stop()
        remove_empty_cgroup_tree(self.cg)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build_a", type=Path, help="the build before (its build/ directory)")
    ap.add_argument("build_b", type=Path, help="the build after")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--driver", default="namespace")
    ap.add_argument("--quiet-ms", type=float, default=20.0)
    ap.add_argument("--image-dir", type=Path,
                    default=Path(os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images")))
    args = ap.parse_args()
    sides = [Side(args.build_a.resolve(), args.image_dir, "a", args.driver),
             Side(args.build_b.resolve(), args.image_dir, "b", args.driver)]
    try:
        for s in sides:  # a warm-up round each, not counted
            s.round(args.quiet_ms / 1000)
            for f in FIGURES:
                s.samples[f].clear()
        for i in range(args.rounds):
            # A B, then B A: whichever goes second runs just after the other's round (its
            # delete, its layer's replenishing), so each build takes each place as often.
            for s in (sides if i % 2 == 0 else sides[::-1]):
                s.round(args.quiet_ms / 1000)
    finally:
        for s in sides:
            s.close()
    print(f"{args.rounds} rounds, driver {args.driver}, quiet {args.quiet_ms:g} ms; "
          f"A = {args.build_a}, B = {args.build_b}")
    print(f"{'figure':<26} {'A p50 ms':>9} {'A p90 ms':>9} {'B p50 ms':>9} {'B p90 ms':>9} {'B/A p50':>8}")
    for f in FIGURES:
        a, b = sides[0].samples[f], sides[1].samples[f]
        a50, b50 = statistics.median(a) * 1000, statistics.median(b) * 1000
        print(f"{f:<26} {a50:9.2f} {pct(a, 0.9) * 1000:9.2f} {b50:9.2f} {pct(b, 0.9) * 1000:9.2f} "
              f"{b50 / a50:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
