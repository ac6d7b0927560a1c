#!/usr/bin/env python3
"""A trivial interpreter cell in a warm context against `python3 -c` through exec, per driver:
the round trip a client sees for `6*7`, measured side by side in one sandbox.

    sudo python3 bench/interpreter.py                  # writes the interpreter section of docs/benchmarks.md
    sudo python3 bench/interpreter.py --quick --out -  # fewer rounds, print the section

Each driver gets one sandbox; the context is warmed with one cell first. Then rounds alternate
an interpreter:run of `6*7` and an exec of `python3 -c 'print(6*7)'`, so load on the machine
touches both alike; then one streamed cell measures how soon its events arrive. The same
rounds run in a context on the loop (the fallback of images without ipykernel), and a few new
contexts of each kind measure the time from the create to the first cell's answer. The microVM
(emulated here) gets --microvm-rounds. Needs root, a built tree (it runs `make`) and the default
image (with its microVM parts for the microvm row).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

from _harness import bench_daemon, options, pct, prepare
from helpers import Api, daemon_info
from sections import emit

BEGIN = "<!-- interpreter benchmark: begin (bench/interpreter.py) -->"
END = "<!-- interpreter benchmark: end -->"


KERNEL_ENV = "RUNTIME_INTERPRETER_KERNEL"  # "loop" asks a context for the fallback loop


def measure(api: Api, driver: str, rounds: int, first_rounds: int) -> dict:
    sbx = api.create_sandbox(driver=driver)
    base = f"/v1/sandboxes/{sbx.id}"
    warm = api.post(f"{base}/interpreter:run", json={"code": "0"}, timeout=300)
    assert warm.status_code == 200 and warm.json()["status"] == "ok", warm.text
    loop = api.post(f"{base}/interpreter/contexts", json={"id": "loop", "env": {KERNEL_ENV: "loop"}}, timeout=300)
    assert loop.status_code == 201 and loop.json()["kernel"] == "loop", loop.text
    cell, loop_cell, exe, floor = [], [], [], []
    for _ in range(rounds):
        t = time.perf_counter()
        r = api.post(f"{base}/interpreter:run", json={"code": "6*7"})
        cell.append((time.perf_counter() - t) * 1000)
        assert r.json()["results"][0]["data"]["text/plain"] == "42", r.text
        t = time.perf_counter()
        r = api.post(f"{base}/interpreter:run", json={"code": "6*7", "context": "loop"})
        loop_cell.append((time.perf_counter() - t) * 1000)
        assert r.json()["results"][0]["data"]["text/plain"] == "42", r.text
        t = time.perf_counter()
        r = api.post(f"{base}:exec", json={"argv": ["python3", "-c", "print(6*7)"]})
        exe.append((time.perf_counter() - t) * 1000)
        assert r.json()["stdout"] == "42\n", r.text
        t = time.perf_counter()
        r = api.post(f"{base}:exec", json={"argv": ["true"]})
        floor.append((time.perf_counter() - t) * 1000)
        assert r.json()["exitCode"] == 0, r.text
    delays = stream_delays(api, base)
    first = {"ipykernel": [], "loop": []}
    for i in range(first_rounds):
        for kernel in first:
            env = {KERNEL_ENV: "loop"} if kernel == "loop" else {}
            t = time.perf_counter()
            made = api.post(f"{base}/interpreter/contexts", json={"id": f"first-{i}", "env": env}, timeout=300)
            assert made.status_code == 201 and made.json()["kernel"] == kernel, made.text
            r = api.post(f"{base}/interpreter:run", json={"code": "6*7", "context": f"first-{i}"}, timeout=300)
            first[kernel].append((time.perf_counter() - t) * 1000)
            assert r.json()["results"][0]["data"]["text/plain"] == "42", r.text
            api.delete(f"{base}/interpreter/contexts/first-{i}")
    api.delete(base)
    return {"cell": cell, "loop": loop_cell, "exec": exe, "true": floor, "stream": delays, "first": first}


STREAM_CELL = "import time\nfor _ in range(20):\n    print(repr(time.time()))\n    time.sleep(0.05)"


def stream_delays(api: Api, base: str) -> list[float]:
    """A streamed cell that prints the time 20 times, 50 ms apart: how long after each print its
    stdout event reaches the client (ms). The sandbox's clock is the host's, but for the microVM's,
    which drifts from it under emulation: there each delay is counted from the first event's,
    which shows whether events come as they happen rather than at the end of the cell."""
    out = []
    with api.stream("POST", f"{base}/interpreter:run", json={"code": STREAM_CELL, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            now = time.time()
            ev = json.loads(line)
            if ev["k"] == "stdout":
                out += [(now - float(t)) * 1000 for t in ev["text"].split()]
    assert len(out) == 20, out
    return out


def relative(delays: list[float]) -> list[float]:
    return [d - delays[0] for d in delays[1:]]


def image_sizes(image_dir) -> str:
    """The root filesystems' sizes on disk (du), the default and analysis images."""
    import subprocess
    out = []
    for name in ("default", "analysis"):
        root = os.path.join(str(image_dir), name, "rootfs")
        if os.path.isdir(root):
            kib = int(subprocess.run(["du", "-sk", "--one-file-system", root], capture_output=True,
                                     text=True).stdout.split()[0])
            out.append(f"`{name}` rootfs {kib / 1024:.0f} MiB")
    return ", ".join(out) or "not measured"


def main() -> int:
    ap = options(__doc__, "interpreter", quick="20 rounds instead of 100")
    ap.add_argument("--microvm-rounds", type=int, default=20,
                    help="rounds on the microVM, emulated here and several times slower (default 20)")
    args = ap.parse_args()
    if (rc := prepare("interpreter.py")) != 0:
        return rc
    rounds = 20 if args.quick else 100
    rows = []
    with bench_daemon("interpreter", args.image_dir) as d:
        available = {x["name"] for x in daemon_info(d).get("drivers", []) if x.get("available")}
        api = Api(d, timeout=600)
        for driver in args.drivers.split(","):
            if driver not in available:
                rows.append(f"| {driver} | not available here | | | | | | | | |")
                continue
            n = min(rounds, args.microvm_rounds) if driver == "microvm" else rounds
            m = measure(api, driver, n, 2 if driver == "microvm" else 5)
            c50, e50 = statistics.median(m["cell"]), statistics.median(m["exec"])
            st = relative(m["stream"]) if driver == "microvm" else m["stream"]
            rows.append(f"| {driver} | {n} | {c50:.1f} ms (p90 {pct(m['cell'], 90):.1f}) | "
                        f"{e50:.1f} ms (p90 {pct(m['exec'], 90):.1f}) | {e50 / c50:.1f}x | "
                        f"{statistics.median(m['loop']):.1f} ms (p90 {pct(m['loop'], 90):.1f}) | "
                        f"{statistics.median(m['first']['ipykernel']):.0f} ms | "
                        f"{statistics.median(m['first']['loop']):.0f} ms | "
                        f"{statistics.median(m['true']):.1f} ms | "
                        f"{statistics.median(st):.1f} ms (p90 {pct(st, 90):.1f}){' *' if driver == 'microvm' else ''} |")
            print(rows[-1], file=sys.stderr)
        api.close()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join([
        BEGIN,
        "## Interpreter: a trivial cell in a warm context vs python3 -c through exec",
        "",
        f"Alternating rounds per driver in one sandbox, {when}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end. "
        "`interpreter:run` of `6*7` in the warmed `python` context against "
        "`:exec` of `python3 -c 'print(6*7)'`; p50 (p90) of the client's round trip. "
        "`exec true`: the same round trip for an exec that runs nothing, the floor of any exec. "
        "Streamed event: a streamed cell prints the time 20 times, 50 ms apart; how long after "
        "each print its `stdout` event reached the client. A context is an IPython kernel "
        "(ipykernel) where the image has it; `loop`: the same cell in a context on the fallback "
        "loop. First cell: create a new context, then its first cell, p50 of 5 (2 on the microVM).",
        f"Images: {image_sizes(args.image_dir)}.",
        "",
        "| driver | rounds | cell in a warm kernel | python3 -c through exec | speed-up | cell in a warm loop | "
        "first cell, kernel | first cell, loop | exec true | streamed event |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "\\* the microVM's clock drifts from the host's under emulation: its events' delay counted "
        "from the first event's.",
        "",
        "`sudo python3 bench/interpreter.py` rewrites this section.",
        END,
    ])
    emit(args.out, BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
