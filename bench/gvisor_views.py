#!/usr/bin/env python3
"""gVisor's view of a sandbox's size, before and after, side by side: two builds, one daemon each,
interleaved (A, B, A, B, ...) so that the load of a shared machine falls on both alike. For a
change's before and after:

    git worktree add ../runtime-before main && make -C ../runtime-before -j2
    sudo python3 bench/gvisor_views.py ../runtime-before/build build --rounds 10

Per build and vcpu (1 and 2): create to the first exec result, exec `true` and
`python3 -c 'print(6*7)'` round trips in a running sandbox, and what the sandbox says of itself
(MemTotal, nproc). Prints the medians. Needs root, runsc and the default image.
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


class Side:
    def __init__(self, build: Path, image_dir: Path, tag: str):
        self.tmp = Path(tempfile.mkdtemp(prefix=f"runtime-bench-gvviews-{tag}-"))
        self.cg = f"runtime-bench-gvviews-{os.getpid()}-{tag}"
        self.d = Daemon(build, image_dir, self.tmp / "state", self.cg)
        self.d.start()
        self.api = Api(self.d, timeout=600)
        self.sandboxes = {v: self.api.create_sandbox(driver="gvisor", vcpu=v, memoryMiB=1024,
                                                      timeoutSeconds=3600) for v in (1, 2)}

    def create(self, vcpu: int) -> float:
        t = time.perf_counter()
        sbx = self.api.create_sandbox(driver="gvisor", vcpu=vcpu, memoryMiB=1024)
        sbx.run("true")
        secs = time.perf_counter() - t
        self.api.delete(f"/v1/sandboxes/{sbx.id}")
        return secs * 1000

    def exec_ms(self, vcpu: int, command: str) -> float:
        sbx = self.sandboxes[vcpu]
        t = time.perf_counter()
        sbx.run(command)
        return (time.perf_counter() - t) * 1000

    def sees(self, vcpu: int) -> str:
        out = self.sandboxes[vcpu].run("grep MemTotal /proc/meminfo; nproc")
        return " ".join(out.split())

    def close(self) -> None:
        self.api.close()
        self.d.stop()
        remove_empty_cgroup_tree(self.cg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path, help="the first build directory (before)")
    ap.add_argument("b", type=Path, help="the second build directory (after)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    args = ap.parse_args()
    sides = {"A": Side(args.a, Path(args.image_dir), "a"), "B": Side(args.b, Path(args.image_dir), "b")}
    cases = [("create", None), ("true", "true"), ("python3", "python3 -c 'print(6*7)'")]
    got: dict[tuple[str, int, str], list[float]] = {}
    try:
        for tag, s in sides.items():
            for v in (1, 2):
                print(f"{tag} vcpu {v} sees: {s.sees(v)}", flush=True)
        with open("/proc/loadavg") as f:
            print("load before:", f.read().split()[:3], flush=True)
        for _ in range(args.rounds):
            for v in (1, 2):
                for name, command in cases:
                    for tag, s in sides.items():
                        ms = s.create(v) if command is None else s.exec_ms(v, command)
                        got.setdefault((tag, v, name), []).append(ms)
        with open("/proc/loadavg") as f:
            print("load after:", f.read().split()[:3], flush=True)
        for v in (1, 2):
            for name, _ in cases:
                a = statistics.median(got[("A", v, name)])
                b = statistics.median(got[("B", v, name)])
                print(f"vcpu {v} {name:8s} p50 ms: A {a:8.1f}  B {b:8.1f}  (B/A {b / a:.2f})")
    finally:
        for s in sides.values():
            s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
