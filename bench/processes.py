#!/usr/bin/env python3
"""Processes: the round trip of `true` through the buffered exec and through the streamed exec
(a process read from its cursor) side by side, and the throughput of a process writing 100 MiB
to stdout read through the cursor API (GET .../processes/{id}/output?follow=true), per driver.

    sudo python3 bench/processes.py                       # writes its section of docs/benchmarks.md
    sudo python3 bench/processes.py --quick --out -       # fewer runs, print the section
    sudo python3 bench/processes.py --drivers namespace   # only these drivers

Needs root, a built tree (it runs `make`), the default image and httpx.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "bench"))

from helpers import Api, Daemon, remove_empty_cgroup_tree  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- processes benchmark: begin (bench/processes.py) -->"
END = "<!-- processes benchmark: end -->"
SIZE = 100 * 1024 * 1024


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def round_trips(api: Api, sid: str, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"buffered": [], "streamed": []}
    for _ in range(5):  # warm up both paths
        api.post(f"/v1/sandboxes/{sid}:exec", json={"argv": ["true"]})
        list(api.exec_stream(sid, argv=["true"]))
    for _ in range(n):  # interleaved, so that load on the machine falls on both alike
        t = time.perf_counter()
        r = api.post(f"/v1/sandboxes/{sid}:exec", json={"argv": ["true"]})
        out["buffered"].append((time.perf_counter() - t) * 1000)
        assert r.json()["exitCode"] == 0
        t = time.perf_counter()
        evs = [e for _, e in api.exec_stream(sid, argv=["true"])]
        out["streamed"].append((time.perf_counter() - t) * 1000)
        assert evs[-1]["type"] == "exit" and evs[-1]["exitCode"] == 0
    return out


def throughput(api: Api, sid: str) -> dict:
    t0 = time.perf_counter()
    r = api.post(f"/v1/sandboxes/{sid}/processes",
                 json={"command": f"head -c {SIZE} /dev/zero | tr '\\0' a"})
    pid = r.json()["id"]
    got = dropped = 0
    cursor = 0
    while True:
        resumed = False
        with api.stream("GET", f"/v1/sandboxes/{sid}/processes/{pid}/output",
                        params={"cursor": cursor, "follow": "true"}, timeout=600) as resp:
            for line in resp.iter_lines():
                ev = json.loads(line)
                if ev["type"] == "stdout":
                    got += len(ev["data"])
                    cursor = ev["offset"] + len(ev["data"])
                elif ev["type"] == "truncated":
                    dropped += ev["droppedBytes"]
                    cursor = ev["resumeAt"]
                elif ev["type"] == "continue":
                    cursor, resumed = ev["cursor"], True
                elif ev["type"] == "exit":
                    assert ev["exitCode"] == 0, ev
        if not resumed:
            break
    secs = time.perf_counter() - t0
    return {"bytes": got, "dropped": dropped, "seconds": secs, "mbps": got / secs / 1e6}


def render(results: dict, n: int, args) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, "", "## Processes: streamed vs buffered exec, output through the cursor API", "",
             f"`sudo python3 bench/processes.py` ({when}, {platform.node()}, {os.cpu_count()} cores, shared with "
             "other builds and tests while it ran; figures move with that load).", "",
             f"Round trip of `true` in a running sandbox, {n} of each, interleaved (ms):", "",
             "| driver | buffered p50 | buffered p95 | streamed p50 | streamed p95 |",
             "| --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "rt" in r:
            b, s = r["rt"]["buffered"], r["rt"]["streamed"]
            lines.append(f"| {drv} | {pct(b, 50):.2f} | {pct(b, 95):.2f} | {pct(s, 50):.2f} | {pct(s, 95):.2f} |")
    lines += ["", "A process writing 100 MiB to stdout (`head -c 104857600 /dev/zero | tr '\\0' a`), read "
              "from cursor 0 with `follow=true` by one client as it runs, spawn to exit event "
              "(target: at least 100 MB/s on namespace):", "",
              "| driver | MB/s | seconds | bytes read | bytes dropped |", "| --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "tp" in r:
            t = r["tp"]
            lines.append(f"| {drv} | {t['mbps']:.0f} | {t['seconds']:.2f} | {t['bytes']} | {t['dropped']} |")
        elif "error" in r:
            lines.append(f"| {drv} | not run: {r['error']} | | | |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="50 round trips of each instead of 300")
    ap.add_argument("--drivers", default="namespace,gvisor,microvm")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"),
                    help="the file whose processes section is replaced (appended when absent); - prints it")
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/processes.py: run as root (the daemon needs it)", file=sys.stderr)
        return 2
    n = 50 if args.quick else 300
    mk = subprocess.run(["make", "-j2"], cwd=REPO, capture_output=True, text=True)
    if mk.returncode != 0:
        print(mk.stdout[-2000:], mk.stderr[-4000:], file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-processes-"))
    cg = f"runtime-bench-processes-{os.getpid()}"
    d = Daemon(REPO / "build", Path(args.image_dir), tmp / "state", cg)
    d.start()
    results: dict[str, dict] = {}
    try:
        api = Api(d, timeout=600)
        for drv in [x for x in args.drivers.split(",") if x]:
            try:
                sbx = api.create_sandbox(driver=drv, timeoutSeconds=3600)
            except AssertionError as e:
                results[drv] = {"error": str(e)[:120]}
                continue
            # The microVM is emulated here (TCG): fewer round trips.
            results[drv] = {"rt": round_trips(api, sbx.id, n if drv != "microvm" else max(20, n // 10)),
                            "tp": throughput(api, sbx.id)}
            api.delete(f"/v1/sandboxes/{sbx.id}")
        api.close()
    finally:
        d.stop()
        remove_empty_cgroup_tree(cg)
    emit(args.out, BEGIN, END, render(results, n, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
