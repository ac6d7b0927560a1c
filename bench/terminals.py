#!/usr/bin/env python3
"""Terminals and port forwarding: the round trip of one key through a terminal (typed into `cat`
on a PTY, its echo read back over the WebSocket), and the throughput of a port forward both ways
(100 MiB from a server inside to a client here, 100 MiB the other way), per driver.

    sudo python3 bench/terminals.py                       # writes its section of docs/benchmarks.md
    sudo python3 bench/terminals.py --quick --out -       # fewer runs, print the section
    sudo python3 bench/terminals.py --drivers namespace   # only these drivers

Needs root, a built tree (it runs `make`) and the default image.
"""
from __future__ import annotations

import os
import platform
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk" / "python" / "src"))

from _harness import bench_daemon, options, pct, per_driver, prepare  # noqa: E402
from helpers import Api  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- terminals benchmark: begin (bench/terminals.py) -->"
END = "<!-- terminals benchmark: end -->"
SIZE = 100 * 1024 * 1024
# Inside: port 9100 sends SIZE bytes to each connection; port 9101 reads all and answers the count.
SERVER = r"""
import socket, sys, threading
def listen(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(8); return s
def send(c):
    block = b"a" * 262144
    for _ in range(%d // len(block)):
        c.sendall(block)
    c.close()
def count(c):
    n = 0
    while True:
        b = c.recv(262144)
        if not b:
            break
        n += len(b)
    c.sendall(str(n).encode()); c.close()
def serve(s, fn):
    while True:
        c, _ = s.accept(); threading.Thread(target=fn, args=(c,), daemon=True).start()
a, b = listen(9100), listen(9101)
threading.Thread(target=serve, args=(b, count), daemon=True).start()
serve(a, send)
""" % SIZE


def key_round_trips(sbx, n: int) -> list[float]:
    out = []
    with sbx.terminal(command="exec cat", cols=80, rows=24) as term:
        for i in range(n + 5):
            key = bytes([ord("a") + i % 26])
            t = time.perf_counter()
            term.write(key)
            seen = b""
            while key not in seen:
                seen += term.recv(timeout=120) or b""
            if i >= 5:  # after a warm-up
                out.append((time.perf_counter() - t) * 1000)
    return out


def forward(sbx) -> dict:
    p = sbx.spawn(["python3", "-c", SERVER])
    deadline = time.monotonic() + 300
    probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9101), 2).close()'"
    while sbx.exec(probe, timeout_ms=300_000).exit_code != 0:
        assert time.monotonic() < deadline, "the server inside did not start"
        time.sleep(0.2)
    res = {}
    with sbx.forward_port(9100, local_port=0) as down, sbx.forward_port(9101, local_port=0) as up:
        t = time.perf_counter()
        got = 0
        with socket.create_connection(("127.0.0.1", down.local_port)) as c:
            while chunk := c.recv(1 << 20):
                got += len(chunk)
        res["down"] = (got, time.perf_counter() - t)
        t = time.perf_counter()
        block = b"b" * (1 << 20)
        with socket.create_connection(("127.0.0.1", up.local_port)) as c:
            for _ in range(SIZE // len(block)):
                c.sendall(block)
            c.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := c.recv(100):
                answer += chunk
        res["up"] = (int(answer or b"0"), time.perf_counter() - t)
    p.kill()
    return res


def render(results: dict, n: int) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, "", "## Terminals and port forwarding", "",
             f"`sudo python3 bench/terminals.py` ({when}, {platform.node()}, {os.cpu_count()} cores, shared with "
             "other builds and tests while it ran; figures move with that load).", "",
             f"One key typed into `cat` on a terminal and its echo read back over the WebSocket, {n} keys (ms); "
             "a port forward carrying 100 MiB from a server inside to a client here (down) and 100 MiB the "
             "other way (up), one connection each (MB/s):", "",
             "| driver | key p50 | key p95 | down MB/s | up MB/s |", "| --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "error" in r:
            lines.append(f"| {drv} | not run: {r['error']} | | | |")
            continue
        k, f = r["keys"], r["fwd"]
        mb = {d: f[d][0] / f[d][1] / 1e6 for d in ("down", "up")}
        lost = "".join(f" ({d}: {f[d][0]} of {SIZE} bytes!)" for d in ("down", "up") if f[d][0] != SIZE)
        lines.append(f"| {drv} | {pct(k, 50):.2f} | {pct(k, 95):.2f} | {mb['down']:.0f} | {mb['up']:.0f}{lost} |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    args = options(__doc__, "terminals", quick="50 keys instead of 300").parse_args()
    if (rc := prepare("terminals.py")) != 0:
        return rc
    n = 50 if args.quick else 300
    results: dict[str, dict] = {}
    with bench_daemon("terminals", args.image_dir) as d:
        for k, v in d.env().items():
            os.environ[k] = v
        from withruntime import Sandbox
        api = Api(d, timeout=600)
        for drv, info in per_driver(api, args.drivers, results):
            with Sandbox.connect(info.id) as sbx:
                results[drv] = {"keys": key_round_trips(sbx, n if drv != "microvm" else max(20, n // 10)),
                                "fwd": forward(sbx)}
        api.close()
    emit(args.out, BEGIN, END, render(results, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
