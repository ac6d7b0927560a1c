#!/usr/bin/env python3
"""Processes: the round trip of `true` through the buffered exec and through the streamed exec
(a process read from its cursor) side by side, and the throughput of a process writing 100 MiB
to stdout read through the cursor API (GET .../processes/{id}/output?follow=true), per driver.

    sudo python3 bench/processes.py                       # writes its section of docs/benchmarks.md
    sudo python3 bench/processes.py --quick --out -       # fewer runs, print the section
    sudo python3 bench/processes.py --drivers namespace   # only these drivers
    sudo python3 bench/processes.py --quick --drivers namespace --sdk-before ../before/sdk/python/src

The SDK's reads run in a process of their own each (blocking and asyncio, the same 100 MiB), so
that --sdk-before can put another tree's SDK beside this one's, interleaved round by round, in one
run. Needs root, a built tree (it runs `make`), the default image and httpx.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk" / "python" / "src"))

from _harness import bench_daemon, options, pct, per_driver, prepare  # noqa: E402
from helpers import Api  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- processes benchmark: begin (bench/processes.py) -->"
END = "<!-- processes benchmark: end -->"
SIZE = 100 * 1024 * 1024
# The writer: 100 blocks of 1 MiB of ASCII, each in as few writes as the pipe takes, so that the
# figure is the cursor path's and not the writer's (`head -c ... /dev/zero | tr '\0' a` moves 8 KiB
# per write and runs at about 80 MB/s on its own here under load).
WRITER = ("python3 -c \"import os\nb = b'a' * (1 << 20)\nfor _ in range(100):\n"
          "    v = memoryview(b)\n    while v: v = v[os.write(1, v):]\"")
# The same 100 MiB as text lines of 64 bytes: every line's newline is an escape in the events'
# JSON, so their text goes through the JSON scanner.
WRITER_TEXT = WRITER.replace("b'a' * (1 << 20)", "(b'a' * 63 + b'\\\\n') * (1 << 14)")
SDK = Path(__file__).resolve().parents[1] / "sdk" / "python" / "src"
# One read through an SDK, in a process of its own: spawn the writer, follow its output to the end.
READER = r"""
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[1])
from withruntime import AsyncSandbox, Sandbox
sid, writer, mode = sys.argv[2], sys.argv[3], sys.argv[4]

def tally(ev, n):
    if ev["type"] in ("stdout", "stderr"):
        return n + len(ev["data"])
    assert ev["type"] != "exit" or ev["exitCode"] == 0, ev
    return n

def blocking():
    with Sandbox.connect(sid) as sbx:
        t0, c0, n = time.perf_counter(), time.process_time(), 0
        for ev in sbx.spawn(writer).output():
            n = tally(ev, n)
        return n, time.perf_counter() - t0, time.process_time() - c0

async def awaited():
    sbx = await AsyncSandbox.connect(sid)
    try:
        t0, c0, n = time.perf_counter(), time.process_time(), 0
        async for ev in (await sbx.spawn(writer)).output():
            n = tally(ev, n)
        return n, time.perf_counter() - t0, time.process_time() - c0
    finally:
        await sbx.close()

n, secs, cpu = blocking() if mode == "blocking" else asyncio.run(awaited())
print(json.dumps({"bytes": n, "seconds": secs, "cpu": cpu}))
"""


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


def writer_alone(api: Api, sid: str) -> float:
    """MB/s of the writer into /dev/null inside the sandbox: the ceiling of the figures below."""
    r = api.post(f"/v1/sandboxes/{sid}:exec",
                 json={"command": f"s=$(date +%s%N); {WRITER} > /dev/null; echo $(( $(date +%s%N) - s ))"})
    return SIZE / (int(r.json()["stdout"].strip()) / 1e9) / 1e6


def sdk_read(src: Path, sid: str, writer: str, mode: str) -> dict:
    """MB/s of one read through the SDK at src (blocking or asyncio), spawn to exit event, and
    the reader's CPU seconds."""
    out = subprocess.run([sys.executable, "-c", READER, str(src), sid, writer, mode],
                         capture_output=True, text=True, timeout=900, env=os.environ)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["bytes"] == SIZE, r
    return {**r, "mbps": r["bytes"] / r["seconds"] / 1e6}


def sdk_rounds(sid: str, before: Path | None, rounds: int) -> dict:
    """Medians over rounds of each reader; with before, its reads interleaved with ours."""
    sides = [("after", SDK)] + ([("before", before)] if before else [])
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for side, src in sides:
            for mode, writer in (("blocking", WRITER), ("asyncio", WRITER), ("text", WRITER_TEXT)):
                runs.setdefault(f"{side} {mode}", []).append(
                    sdk_read(src, sid, writer, "blocking" if mode == "text" else mode))
    return {k: {"mbps": statistics.median(r["mbps"] for r in v), "cpu": statistics.median(r["cpu"] for r in v),
                "all": [round(r["mbps"]) for r in v]} for k, v in runs.items()}


def throughput_curl(api: Api, sid: str) -> float | None:
    """The same read by curl into /dev/null: the server's side without a Python client's parsing."""
    if not shutil.which("curl"):
        return None
    t0 = time.perf_counter()
    pid = api.post(f"/v1/sandboxes/{sid}/processes", json={"command": WRITER}).json()["id"]
    d = api.daemon
    out = subprocess.run(["curl", "-sN", "-o", "/dev/null", "-w", "%{size_download}", "-H",
                          f"Authorization: Bearer {d.api_key}",
                          f"{d.base_url}/v1/sandboxes/{sid}/processes/{pid}/output?cursor=0&follow=true"],
                         capture_output=True, text=True, timeout=600)
    secs = time.perf_counter() - t0
    state = api.get(f"/v1/sandboxes/{sid}/processes/{pid}").json()
    assert out.returncode == 0 and state["outputBytes"] == SIZE, (out, state)
    return SIZE / secs / 1e6


def command(args) -> str:
    """The command line that gives this section (the other tree named as BEFORE)."""
    words = ["sudo python3 bench/processes.py"] + (["--quick"] if args.quick else [])
    words += [f"--drivers {args.drivers}", f"--rounds {args.rounds}"]
    return " ".join(words + (["--sdk-before BEFORE/sdk/python/src"] if args.sdk_before else []))


def render(results: dict, n: int, args) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, "", "## Processes: streamed vs buffered exec, output through the cursor API", "",
             f"`{command(args)}` ({when}, {platform.node()}, {os.cpu_count()} cores, shared with "
             "other builds and tests while it ran; figures move with that load).", "",
             f"Round trip of `true` in a running sandbox, {n} of each, interleaved (ms):", "",
             "| driver | buffered p50 | buffered p95 | streamed p50 | streamed p95 |",
             "| --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "rt" in r:
            b, s = r["rt"]["buffered"], r["rt"]["streamed"]
            lines.append(f"| {drv} | {pct(b, 50):.2f} | {pct(b, 95):.2f} | {pct(s, 50):.2f} | {pct(s, 95):.2f} |")
    lines += ["", "A process writing 100 MiB to stdout (100 writes of 1 MiB of `a` from Python), read from cursor 0 "
              "with `follow=true` as it runs, spawn to exit event (target: at least 100 MB/s on namespace). "
              "SDK: `Process.output()` of the blocking and the asyncio client, each read in a process of its own, "
              f"the median of {args.rounds} rounds (every round's figure in brackets), with the reader's CPU "
              "seconds; text lines: the same 100 MiB as lines of 64 bytes, whose newlines are escapes in the "
              "events (blocking client). curl: the same reply into /dev/null, the server's side alone; the "
              "writer alone: the program into /dev/null inside the sandbox, the ceiling of all. Machine load "
              "(1-minute average) when each ran:", "",
              "| driver | SDK | blocking MB/s (CPU s) | asyncio MB/s (CPU s) | text lines MB/s (CPU s) | curl MB/s | "
              "writer alone MB/s | load |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "sdk" in r:
            c = f"{r['curl']:.0f}" if r.get("curl") else "-"
            for side in ("before", "after"):
                if f"{side} blocking" not in r["sdk"]:
                    continue
                cells = []
                for mode in ("blocking", "asyncio", "text"):
                    m = r["sdk"][f"{side} {mode}"]
                    cells.append(f"{m['mbps']:.0f} ({m['cpu']:.2f}) {m['all']}")
                name = "this tree" if side == "after" else "--sdk-before"
                lines.append(f"| {drv} | {name} | {' | '.join(cells)} | {c} | {r['alone']:.0f} | {r['load']:.1f} |")
        elif "error" in r:
            lines.append(f"| {drv} | not run: {r['error']} | | | | | | |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    ap = options(__doc__, "processes", quick="50 round trips of each instead of 300")
    ap.add_argument("--sdk-before", help="another tree's sdk/python/src, read beside this one's")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of SDK reads (default 3)")
    args = ap.parse_args()
    if (rc := prepare("processes.py")) != 0:
        return rc
    n = 50 if args.quick else 300
    results: dict[str, dict] = {}
    with bench_daemon("processes", args.image_dir) as d:
        for k, v in d.env().items():
            os.environ[k] = v
        api = Api(d, timeout=600)
        for drv, sbx in per_driver(api, args.drivers, results):
            # The microVM is emulated here (TCG): fewer round trips.
            results[drv] = {"rt": round_trips(api, sbx.id, n if drv != "microvm" else max(20, n // 10)),
                            "load": os.getloadavg()[0], "alone": writer_alone(api, sbx.id),
                            "curl": throughput_curl(api, sbx.id)}
            results[drv]["sdk"] = sdk_rounds(sbx.id, Path(args.sdk_before) if args.sdk_before else None,
                                             args.rounds if drv != "microvm" else 1)
        api.close()
    emit(args.out, BEGIN, END, render(results, n, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
