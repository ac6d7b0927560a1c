#!/usr/bin/env python3
"""Create to first cell result with the warm pool's kernel, without it, and cold, side by side and
interleaved on one driver: three daemons of one build, A without a pool, B with
--warm-pool DRIVER:default=1 --no-warm-pool-kernel (its sandboxes hold no kernel) and C with
--warm-pool DRIVER:default=1 (each holds its default python kernel, started before hand-out).

    sudo python3 bench/warm_pool_kernel.py build --driver namespace --rounds 10
    sudo python3 bench/warm_pool_kernel.py build --driver gvisor --rounds 10
    sudo python3 bench/warm_pool_kernel.py build --driver gvisor --memory

With --memory, instead: the cgroup memory of each ready pool sandbox (--pool of them) on B and on C,
what a pool sandbox's kernel costs while it waits.

Per round and daemon, after both pools are full again and a quiet spell of --quiet-ms: a create of
the default image and shape (a pool hit on B and C) and at once a cell (`1 + 1`) until its result,
then the delete. The daemons take turns going first. Prints p50 and p90 per daemon, and each
one's p50 over A's. Needs root, the default image, and the build's runtimed and companions.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from warm_pool import Side, pct  # noqa: E402
from helpers import cgroup_dirs  # noqa: E402


class KernelSide(Side):
    def first_cell(self, quiet_s: float) -> None:
        time.sleep(quiet_s)
        t = time.perf_counter()
        r = self.api.post("/v1/sandboxes", json={"driver": self.driver, "timeoutSeconds": 600})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        r = self.api.post(f"/v1/sandboxes/{sid}/interpreter:run", json={"code": "1 + 1"}, timeout=300)
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        self.samples.setdefault("cell", []).append(time.perf_counter() - t)
        r = self.api.delete(f"/v1/sandboxes/{sid}")
        assert r.status_code == 200, r.text


def pool_memory_mib(side: Side) -> list[float]:
    """Each ready pool sandbox's cgroup memory (v2 memory.current or v1 usage_in_bytes), MiB."""
    out = []
    for marker in sorted((side.d.state_dir / "warm-pool").iterdir()):
        got = [int(f.read_text()) for c in cgroup_dirs(marker.name)
               for f in (c / "memory.current", c / "memory.usage_in_bytes") if f.exists()]
        if got:
            out.append(max(got) / 2**20)
    return out


def memory(build: Path, image_dir: Path, driver: str, pool: int) -> int:
    sides = [KernelSide(build, image_dir, "b", driver, pool, ["--no-warm-pool-kernel"]),
             KernelSide(build, image_dir, "c", driver, pool)]
    try:
        for s in sides:
            s.wait_ready(300)
        time.sleep(3)  # the kernel's start settled
        figures = [pool_memory_mib(s) for s in sides]
    finally:
        for s in sides:
            s.close()
    print(f"driver {driver}, {pool} ready pool sandboxes each; cgroup memory per sandbox, MiB")
    for name, xs in zip(("B pool, no kernel", "C pool, kernel"), figures):
        print(f"{name:<20} " + " ".join(f"{x:.1f}" for x in xs))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", type=Path, help="the build (its build/ directory)")
    ap.add_argument("--driver", default="namespace")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--quiet-ms", type=float, default=1000.0)
    ap.add_argument("--memory", action="store_true", help="the pool sandboxes' memory, with and without kernel")
    ap.add_argument("--pool", type=int, default=2, help="pool size for --memory")
    ap.add_argument("--image-dir", type=Path,
                    default=Path(os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images")))
    args = ap.parse_args()
    build = args.build.resolve()
    if args.memory:
        return memory(build, args.image_dir, args.driver, args.pool)
    names = ("A cold", "B pool, no kernel", "C pool, kernel")
    sides = [KernelSide(build, args.image_dir, "a", args.driver, 0),
             KernelSide(build, args.image_dir, "b", args.driver, 1, ["--no-warm-pool-kernel"]),
             KernelSide(build, args.image_dir, "c", args.driver, 1)]
    quiet = args.quiet_ms / 1000
    hits = []
    try:
        for s in sides:  # a warm-up round each, not counted
            s.wait_ready(300)
            s.first_cell(quiet)
            s.samples["cell"].clear()
        h0 = [s.hits_misses() for s in sides[1:]]
        for i in range(args.rounds):
            order = sides[i % 3:] + sides[:i % 3]
            for s in order:
                for w in sides:
                    w.wait_ready(300)
                s.first_cell(quiet)
        hits = [(h1[0] - h[0], h1[1] - h[1]) for h, h1 in zip(h0, [s.hits_misses() for s in sides[1:]])]
    finally:
        for s in sides:
            s.close()
    print(f"{args.rounds} rounds, driver {args.driver}, quiet {args.quiet_ms:g} ms; hits, misses: B {hits[0]}, "
          f"C {hits[1]}; load average {os.getloadavg()[0]:.2f}")
    a50 = statistics.median(sides[0].samples["cell"]) * 1000
    print(f"{'create to first cell result':<28} {'p50 ms':>9} {'p90 ms':>9} {'/A p50':>7}")
    for name, s in zip(names, sides):
        xs = s.samples["cell"]
        p50 = statistics.median(xs) * 1000
        print(f"{name:<28} {p50:9.1f} {pct(xs, 0.9) * 1000:9.1f} {p50 / a50:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
