#!/usr/bin/env python3
"""Lifecycle: pause and wake latency per driver, side by side in one run, for a sandbox at rest
and for one whose process holds 256 MiB of memory; and the time of a wake that boots a stopped
sandbox from its disk (:stop then :wake). Target: a wake of a paused sandbox p50 <= 50 ms on
namespace and gVisor. Then snapshots and fork: the time of a :snapshot, of a :fork of one and of
four copies and of a create from a snapshot, and the new data each puts on the host's disk, for a
sandbox with 10 MiB and with 1 GiB written. Target: a fork of a sandbox with 1 GiB written writes
< 10 MiB of new data.

    sudo python3 bench/lifecycle.py                       # writes its sections of docs/benchmarks.md
    sudo python3 bench/lifecycle.py --quick --out -       # fewer runs, print the sections
    sudo python3 bench/lifecycle.py --drivers namespace   # only these drivers
    sudo python3 bench/lifecycle.py --only snapshots      # only the snapshot and fork section

Needs root, a built tree (it runs `make`), the default image and httpx.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from _harness import bench_daemon, options, pct, per_driver, prepare
from helpers import Api, wait_until
from sections import emit

BEGIN = "<!-- lifecycle benchmark: begin (bench/lifecycle.py) -->"
END = "<!-- lifecycle benchmark: end -->"
SNAP_BEGIN = "<!-- snapshot benchmark: begin (bench/lifecycle.py) -->"
SNAP_END = "<!-- snapshot benchmark: end -->"
HOLDER = ("python3 -c \"import time; b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096]); "
          "open('/workspace/held', 'w').write('1'); time.sleep(86400)\"")


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


def disk_bytes(d) -> int:
    """Bytes allocated for the daemon's sandboxes and snapshots: on a layer pool (the state dir is
    its own XFS, as the bench's daemon gets one) the pool's used blocks, a block shared by several
    files counted once; elsewhere what du finds under sandboxes/ and snapshots/ (a file linked
    from both counted once). The new data a step put on the host's disk is the difference. On the
    host's filesystem the pre-made empty layers (.layer-templates) are left out: they are made
    ahead, in the background, for creates to come."""
    if d.layer_pool:
        st = os.statvfs(d.state_dir)
        return (st.f_blocks - st.f_bfree) * st.f_frsize
    out = subprocess.run(["du", "-s", "-B1", str(d.state_dir / "sandboxes"), str(d.state_dir / "snapshots")],
                         capture_output=True, text=True)
    return sum(int(line.split()[0]) for line in out.stdout.splitlines() if line.strip())


def measured(d, fn) -> tuple[float, int, object]:
    subprocess.run(["sync", "-f", str(d.state_dir)])
    before = disk_bytes(d)
    t = time.perf_counter()
    got = fn()
    ms = (time.perf_counter() - t) * 1000
    subprocess.run(["sync", "-f", str(d.state_dir)])
    return ms, disk_bytes(d) - before, got


FROZEN = re.compile(r"snapshot (snp_\w+) of (\S+): \d+ bytes in \d+ ms, (\d+) ms of them frozen")


def frozen_ms(d, sid: str) -> int | None:
    """How long the source was frozen for its last snapshot, from the daemon's log."""
    last = None
    for m in FROZEN.finditer(d.log_path.read_text(errors="replace")):
        if m.group(2) == sid:
            last = int(m.group(3))
    return last


def snapshots_for(api: Api, d, drv: str, written_mib: int) -> dict:
    sbx = api.create_sandbox(driver=drv, timeoutSeconds=3600, diskMiB=max(2048, written_mib * 2 + 512))
    r = api.post(f"/v1/sandboxes/{sbx.id}:exec",
                 json={"command": f"head -c {written_mib}M /dev/urandom > /workspace/data && sync",
                       "timeoutMs": 900000})
    assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text[:300]
    res: dict = {}

    def post(path: str, body: dict) -> dict:
        r = api.post(path, json=body)
        if r.status_code != 201:
            raise RuntimeError(f"{r.status_code} {r.json().get('error', {}).get('message', r.text[:200])}")
        return r.json()
    try:
        ms, b, snap = measured(d, lambda: post(f"/v1/sandboxes/{sbx.id}:snapshot", {"mode": "disk"}))
    except RuntimeError as e:
        api.delete(f"/v1/sandboxes/{sbx.id}")
        return {"error": str(e)[:160]}
    res["snapshot"] = (ms, b, frozen_ms(d, sbx.id))
    ms, b, made = measured(d, lambda: post("/v1/sandboxes", {"snapshot": snap["id"]}))
    res["create"] = (ms, b, None)
    api.delete(f"/v1/sandboxes/{made['id']}")
    for count in (1, 4):
        ms, b, made = measured(d, lambda: post(f"/v1/sandboxes/{sbx.id}:fork", {"count": count}))
        res[f"fork{count}"] = (ms, b, frozen_ms(d, sbx.id))
        for c in made["sandboxes"]:
            api.delete(f"/v1/sandboxes/{c['id']}")
    api.delete(f"/v1/snapshots/{snap['id']}")
    # The running machine too, where the driver keeps memory (a 501 elsewhere, told as such).
    try:
        ms, b, mem = measured(d, lambda: post(f"/v1/sandboxes/{sbx.id}:snapshot", {"mode": "memory"}))
        res["memory"] = (ms, b, frozen_ms(d, sbx.id))
        ms, b, made = measured(d, lambda: post("/v1/sandboxes", {"snapshot": mem["id"]}))
        res["memory_create"] = (ms, b, None)
        api.delete(f"/v1/sandboxes/{made['id']}")
        api.delete(f"/v1/snapshots/{mem['id']}")
        ms, b, made = measured(d, lambda: post(f"/v1/sandboxes/{sbx.id}:fork", {"count": 1, "mode": "memory"}))
        res["memory_fork1"] = (ms, b, frozen_ms(d, sbx.id))
        for c in made["sandboxes"]:
            api.delete(f"/v1/sandboxes/{c['id']}")
    except RuntimeError as e:
        res["memory"] = "501" if str(e).startswith("501") else f"failed: {str(e)[:100]}"
    api.delete(f"/v1/sandboxes/{sbx.id}")
    return res


def render_snapshots(results: dict, pooled: bool) -> str:
    store = ("what the step added to the daemon's layer pool (an XFS image with reflink mounted at its "
             "state dir, as scripts/setup.sh makes; its used blocks by statvfs, a shared block counted once)"
             if pooled else
             "what the step added to the daemon's sandboxes/ and snapshots/ on the host's disk (`du`, a "
             "file linked from both counted once; no layer pool)")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mib = 1024 * 1024
    lines = [SNAP_BEGIN, "", "## Snapshots and fork", "",
             f"`sudo python3 bench/lifecycle.py --only snapshots` ({when}, {platform.node()}, {os.cpu_count()} "
             "cores, shared with other builds and tests while it ran). A sandbox writes 10 MiB or 1 GiB of "
             "random data to /workspace; then, one after the other: `:snapshot` (disk), a create from that "
             "snapshot, `:fork` of one copy and `:fork` of four, then `:snapshot` with mode memory, a "
             "create from that and `:fork` of one copy with mode memory (the saved machine resumed; `501` "
             "where the driver keeps no memory). Time: "
             "the client's wall clock until the "
             f"answer (the copies running), and in brackets how long the source was frozen (the daemon's "
             f"log). New data: {store}. Target: a fork of a sandbox with 1 GiB written writes < 10 MiB of "
             "new data.", "",
             "| driver | written | snapshot | create from it | fork (1 copy) | fork (4 copies) | fork target "
             "| memory snapshot | create from it (resumed) | memory fork (1 copy) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for drv, per in results.items():
        for written, r in per.items():
            if "error" in r:
                lines.append(f"| {drv} | {written} | not taken: {r['error']} | | | | | | | |")
                continue

            def cell(k: str) -> str:
                ms, b, fz = r[k]
                return f"{ms:.0f} ms" + (f" ({fz} ms frozen)" if fz is not None else "") + f", {b / mib:.1f} MiB"
            cells = [cell(k) for k in ("snapshot", "create", "fork1", "fork4")]
            target = "-"
            if written == "1 GiB":
                target = "met" if r["fork1"][1] < 10 * mib else "**not met**"
            memory = r.get("memory", "-")
            if isinstance(memory, tuple):
                mem_cells = [cell(k) for k in ("memory", "memory_create", "memory_fork1")]
            else:
                mem_cells = [str(memory), "-", "-"]
            lines.append(f"| {drv} | {written} | " + " | ".join(cells) + f" | {target} | " + " | ".join(mem_cells) + " |")
    lines += ["", SNAP_END]
    return "\n".join(lines)


def main() -> int:
    ap = options(__doc__, "lifecycle", quick="20 pauses and wakes of each instead of 100")
    ap.add_argument("--only", choices=("pause", "snapshots"), help="one section only")
    ap.add_argument("--microvm-written", default="10",
                    help="MiB written before the microVM's snapshots (comma-separated; default 10: writing "
                         "1 GiB in an emulated guest takes many minutes here)")
    args = ap.parse_args()
    if (rc := prepare("lifecycle.py")) != 0:
        return rc
    n = 20 if args.quick else 100
    results: dict[str, dict] = {}
    snaps: dict[str, dict] = {}
    pooled = False
    with bench_daemon("lifecycle", args.image_dir) as d:
        api = Api(d, timeout=600)
        pooled = d.layer_pool
        for drv in [x for x in args.drivers.split(",") if x] if args.only != "pause" else []:
            snaps[drv] = {}
            sizes = [10, 1024] if drv != "microvm" else [int(x) for x in args.microvm_written.split(",") if x]
            for label, written in [(f"{w} MiB" if w < 1024 else f"{w // 1024} GiB", w) for w in sizes]:
                try:
                    snaps[drv][label] = snapshots_for(api, d, drv, written)
                except AssertionError as e:
                    snaps[drv][label] = {"error": str(e)[:120]}
        pause_drivers = args.drivers if args.only != "snapshots" else ""
        for drv, sbx in per_driver(api, pause_drivers, results, autoWake=False):
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
        api.close()
    if args.only != "snapshots":
        emit(args.out, BEGIN, END, render(results, n))
    if args.only != "pause":
        emit(args.out, SNAP_BEGIN, SNAP_END, render_snapshots(snaps, pooled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
