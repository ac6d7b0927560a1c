#!/usr/bin/env python3
"""Lifecycle: pause and wake latency per driver, side by side in one run, for a sandbox at rest
and for one whose process holds 256 MiB of memory; and the time of a wake that boots a stopped
sandbox from its disk (:stop then :wake). Target: a wake of a paused sandbox p50 <= 50 ms on
namespace and gVisor.

    sudo python3 bench/lifecycle.py                       # writes its section of docs/benchmarks.md
    sudo python3 bench/lifecycle.py --quick --out -       # fewer runs, print the section
    sudo python3 bench/lifecycle.py --drivers namespace   # only these drivers

Needs root, a built tree (it runs `make`), the default image and httpx.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "bench"))

from helpers import Api, Daemon, remove_empty_cgroup_tree, wait_until  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- lifecycle benchmark: begin (bench/lifecycle.py) -->"
END = "<!-- lifecycle benchmark: end -->"
HOLDER = ("python3 -c \"import time; b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096]); "
          "open('/workspace/held', 'w').write('1'); time.sleep(86400)\"")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def timed(api: Api, sid: str, verb: str, want: str) -> float:
    t = time.perf_counter()
    r = api.post(f"/v1/sandboxes/{sid}:{verb}", json={})
    ms = (time.perf_counter() - t) * 1000
    assert r.status_code == 200 and r.json()["state"] == want, (verb, r.status_code, r.text[:300])
    return ms


def pause_wake(api: Api, sid: str, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"pause": [], "wake": []}
    for _ in range(3):  # warm up
        timed(api, sid, "pause", "paused")
        timed(api, sid, "wake", "running")
    for _ in range(n):
        out["pause"].append(timed(api, sid, "pause", "paused"))
        out["wake"].append(timed(api, sid, "wake", "running"))
    # Still the same sandbox, answering.
    r = api.post(f"/v1/sandboxes/{sid}:exec", json={"argv": ["true"]})
    assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text
    return out


def boot_from_disk(api: Api, sid: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        timed(api, sid, "stop", "stopped")
        t = time.perf_counter()
        timed(api, sid, "wake", "running")
        r = api.post(f"/v1/sandboxes/{sid}:exec", json={"argv": ["true"]})
        assert r.status_code == 200, r.text
        out.append((time.perf_counter() - t) * 1000)
    return out


def render(results: dict, n: int) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, "", "## Lifecycle: pause and wake", "",
             f"`sudo python3 bench/lifecycle.py` ({when}, {platform.node()}, {os.cpu_count()} cores, shared with "
             "other builds and tests while it ran; figures move with that load). Each figure is the "
             "client's wall-clock time of one `POST :pause` or `POST :wake` (HTTP over loopback included), "
             f"{n} of each, alternating, on one sandbox running a counter loop; \"256 MiB held\" adds a "
             "process holding 256 MiB of touched memory. Target: wake p50 <= 50 ms on namespace and gVisor.", "",
             "| driver | sandbox | pause p50 | pause p95 | wake p50 | wake p95 | wake target |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "error" in r:
            lines.append(f"| {drv} | not run: {r['error']} | | | | | |")
            continue
        for label, key in (("at rest", "rest"), ("256 MiB held", "held")):
            if key not in r:
                continue
            p, w = r[key]["pause"], r[key]["wake"]
            target = ("met" if pct(w, 50) <= 50 else "**not met**") if drv in ("namespace", "gvisor") else "-"
            lines.append(f"| {drv} | {label} | {pct(p, 50):.1f} ms | {pct(p, 95):.1f} ms | {pct(w, 50):.1f} ms | "
                         f"{pct(w, 95):.1f} ms | {target} |")
    lines += ["", "A wake that boots a stopped sandbox again from its disk (`:stop`, then `:wake` until a "
              "first `true` has run; memory is not kept):", "",
              "| driver | runs | p50 | max |", "| --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "boot" in r:
            b = r["boot"]
            lines.append(f"| {drv} | {len(b)} | {pct(b, 50):.0f} ms | {max(b):.0f} ms |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 pauses and wakes of each instead of 100")
    ap.add_argument("--drivers", default="namespace,gvisor,microvm")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"),
                    help="the file whose lifecycle section is replaced (appended when absent); - prints it")
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/lifecycle.py: run as root (the daemon needs it)", file=sys.stderr)
        return 2
    n = 20 if args.quick else 100
    mk = subprocess.run(["make", "-j2"], cwd=REPO, capture_output=True, text=True)
    if mk.returncode != 0:
        print(mk.stdout[-2000:], mk.stderr[-4000:], file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-lifecycle-"))
    cg = f"runtime-bench-lifecycle-{os.getpid()}"
    d = Daemon(REPO / "build", Path(args.image_dir), tmp / "state", cg)
    d.start()
    results: dict[str, dict] = {}
    try:
        api = Api(d, timeout=600)
        for drv in [x for x in args.drivers.split(",") if x]:
            try:
                sbx = api.create_sandbox(driver=drv, timeoutSeconds=3600, autoWake=False)
            except AssertionError as e:
                results[drv] = {"error": str(e)[:120]}
                continue
            # The microVM is emulated here (TCG): fewer runs.
            runs = n if drv != "microvm" else max(10, n // 5)
            api.post(f"/v1/sandboxes/{sbx.id}/processes",
                     json={"command": "while :; do sleep 0.05; done"})
            res: dict = {"rest": pause_wake(api, sbx.id, runs)}
            api.post(f"/v1/sandboxes/{sbx.id}/processes", json={"command": HOLDER})
            wait_until(lambda: api.post(f"/v1/sandboxes/{sbx.id}:exec",
                                        json={"command": "cat /workspace/held 2>/dev/null"}).json()["stdout"] == "1",
                       300, 0.2, what="the 256 MiB holder")
            res["held"] = pause_wake(api, sbx.id, runs)
            res["boot"] = boot_from_disk(api, sbx.id, 5 if drv != "microvm" else 2)
            results[drv] = res
            api.delete(f"/v1/sandboxes/{sbx.id}")
        api.close()
    finally:
        d.stop()
        remove_empty_cgroup_tree(cg)
    emit(args.out, BEGIN, END, render(results, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
