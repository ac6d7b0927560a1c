#!/usr/bin/env python3
"""Create to first exec result from the warm pool against cold, side by side and interleaved on one
driver: two daemons of one build, A without a pool and B with --warm-pool DRIVER:default=N.

    sudo python3 bench/warm_pool.py build --driver namespace --rounds 60
    sudo python3 bench/warm_pool.py build --driver gvisor --rounds 40

Per round and daemon, each call after a quiet spell of --quiet-ms (20 ms: an agent's calls come
between its model's turns, not back to back): a create of the default image and shape and an exec of
`true` until its result (on B the pool's shape: a hit when one is ready), the delete; then the same
for a shape no pool has (memoryMiB 512, cold on both), which on B runs while the pool refills the
sandbox just handed out, so that its figure beside A's says what a refill costs a client's cold
create. The daemons take turns going first (A B, B A, ...). Prints p50 and p90 of each figure per
daemon, B/A of the p50s, and B's hits and misses. Needs root, the default image, and the build's
runtimed, runtime-agent and runtime-egress.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from helpers import Api, Daemon, remove_empty_cgroup_tree  # noqa: E402

FIGURES = ("create to first exec, pool's shape", "create to first exec, other shape")


class Side:
    def __init__(self, build: Path, image_dir: Path, tag: str, driver: str, pool: int, more: list[str] | None = None):
        self.tmp = Path(tempfile.mkdtemp(prefix=f"runtime-bench-pool-{tag}-"))
        self.cg = f"runtime-bench-pool-{os.getpid()}-{tag}"
        extra = (["--warm-pool", f"{driver}:default={pool}"] if pool else []) + (more or [])
        self.d = Daemon(build, image_dir, self.tmp / "state", self.cg, extra_args=extra)
        self.d.start()
        self.api = Api(self.d, timeout=600)
        self.driver = driver
        self.pool = pool
        self.samples: dict[str, list[float]] = {f: [] for f in FIGURES}

    def hits_misses(self) -> tuple[int, int]:
        text = self.api.get("/metrics").text
        h = re.search(rf'^runtime_warm_pool_hits_total\{{driver="{self.driver}",image="default",[^}}]*\}} (\d+)',
                      text, re.M)
        m = re.search(rf'^runtime_warm_pool_misses_total\{{driver="{self.driver}",image="default",[^}}]*\}} (\d+)',
                      text, re.M)
        return (int(h.group(1)), int(m.group(1))) if h and m else (0, 0)

    def wait_ready(self, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while self.pool and time.monotonic() < end:
            text = self.api.get("/metrics").text
            m = re.search(rf'^runtime_warm_pool_ready\{{driver="{self.driver}",image="default",[^}}]*\}} (\d+)',
                          text, re.M)
            if m and int(m.group(1)) >= self.pool:
                return
            time.sleep(0.1)

    def one(self, figure: str, quiet_s: float, **fields) -> None:
        time.sleep(quiet_s)
        t = time.perf_counter()
        r = self.api.post("/v1/sandboxes", json={"driver": self.driver, "timeoutSeconds": 600, **fields})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert self.api.exec(sid, command="true")["exitCode"] == 0
        self.samples[figure].append(time.perf_counter() - t)
        time.sleep(quiet_s)
        r = self.api.delete(f"/v1/sandboxes/{sid}")
        assert r.status_code == 200, r.text

    def round(self, quiet_s: float) -> None:
        self.one(FIGURES[0], quiet_s)
        self.one(FIGURES[1], quiet_s, memoryMiB=512)

    def close(self) -> None:
        self.api.close()
        self.d.stop()
        remove_empty_cgroup_tree(self.cg)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", type=Path, help="the build (its build/ directory)")
    ap.add_argument("--driver", default="namespace")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--pool", type=int, default=2, help="B's pool size")
    ap.add_argument("--quiet-ms", type=float, default=20.0)
    ap.add_argument("--image-dir", type=Path,
                    default=Path(os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images")))
    args = ap.parse_args()
    build = args.build.resolve()
    sides = [Side(build, args.image_dir, "a", args.driver, 0), Side(build, args.image_dir, "b", args.driver, args.pool)]
    quiet = args.quiet_ms / 1000
    try:
        sides[1].wait_ready()
        for s in sides:  # a warm-up round each, not counted
            s.round(quiet)
            for f in FIGURES:
                s.samples[f].clear()
        sides[1].wait_ready()
        h0, m0 = sides[1].hits_misses()
        for i in range(args.rounds):
            for s in (sides if i % 2 == 0 else sides[::-1]):
                s.round(quiet)
        h1, m1 = sides[1].hits_misses()
    finally:
        for s in sides:
            s.close()
    print(f"{args.rounds} rounds, driver {args.driver}, quiet {args.quiet_ms:g} ms; A = no pool, "
          f"B = --warm-pool {args.driver}:default={args.pool}: {h1 - h0} hits, {m1 - m0} misses; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'figure':<36} {'A p50 ms':>9} {'A p90 ms':>9} {'B p50 ms':>9} {'B p90 ms':>9} {'B/A p50':>8}")
    for f in FIGURES:
        a, b = sides[0].samples[f], sides[1].samples[f]
        a50, b50 = statistics.median(a) * 1000, statistics.median(b) * 1000
        print(f"{f:<36} {a50:9.2f} {pct(a, 0.9) * 1000:9.2f} {b50:9.2f} {pct(b, 0.9) * 1000:9.2f} "
              f"{b50 / a50:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
