#!/usr/bin/env python3
"""What the HTTP edge costs a request: two builds side by side, interleaved (A, B, A, B, ...).

    git worktree add ../runtime-before main && make -C ../runtime-before -j2
    sudo python3 bench/http_edge.py ../runtime-before/build build --rounds 6

Per round and build: the median of 200 `GET /v1/sandboxes/{id}` each on a new connection (connect, request,
answer, close: the path the edge adds a step to), of 200 on one kept-alive connection, and of 100
execs of `true` on a kept-alive connection after 20 ms of quiet, as an agent's calls come. Then the
medians of the rounds and B/A. Needs root and the default image.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from helpers import Api, Daemon, remove_empty_cgroup_tree  # noqa: E402

FIGURES = ("new connection", "kept-alive", "exec true")


def answer(s: socket.socket) -> None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed before an answer")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(rest) < n:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed inside an answer")
        rest += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head[:200])


def new_connections(d: Daemon, sid: str, n: int) -> float:
    req = f"GET /v1/sandboxes/{sid} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.api_key}\r\nConnection: close\r\n\r\n".encode()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        s = socket.create_connection(("127.0.0.1", d.port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(req)
        answer(s)
        s.close()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def kept_alive(d: Daemon, sid: str, n: int) -> float:
    req = f"GET /v1/sandboxes/{sid} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.api_key}\r\n\r\n".encode()
    s = socket.create_connection(("127.0.0.1", d.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            s.sendall(req)
            answer(s)
            times.append(time.perf_counter() - t)
    finally:
        s.close()
    return statistics.median(times) * 1000


def execs(api: Api, sid: str, n: int) -> float:
    times = []
    for _ in range(n):
        time.sleep(0.02)
        t = time.perf_counter()
        assert api.exec(sid, argv=["true"])["exitCode"] == 0
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="build A (before)")
    ap.add_argument("b", type=Path, help="build B (after)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--image-dir", type=Path,
                    default=Path(os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images")))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-edge-"))
    daemons, apis, boxes, cgs = [], [], [], []
    try:
        for i, build in enumerate((args.a, args.b)):
            cg = f"runtime-bench-edge-{os.getpid()}-{i}"
            d = Daemon(build.resolve(), args.image_dir, tmp / f"state{i}", cg)
            d.start()
            cgs.append(cg)
            daemons.append(d)
            api = Api(d, timeout=600)
            apis.append(api)
            boxes.append(api.create_sandbox(driver="namespace", timeoutSeconds=3600))
        for i in range(2):  # warm-up
            new_connections(daemons[i], boxes[i].id, 20)
            kept_alive(daemons[i], boxes[i].id, 20)
            execs(apis[i], boxes[i].id, 5)
        res = {f: ([], []) for f in FIGURES}
        for rnd in range(args.rounds):
            order = (0, 1) if rnd % 2 == 0 else (1, 0)
            for i in order:
                res["new connection"][i].append(new_connections(daemons[i], boxes[i].id, 200))
                res["kept-alive"][i].append(kept_alive(daemons[i], boxes[i].id, 200))
                res["exec true"][i].append(execs(apis[i], boxes[i].id, 100))
            print(f"round {rnd + 1}: " + ", ".join(
                f"{f} {res[f][0][-1]:.3f}/{res[f][1][-1]:.3f} ms" for f in FIGURES), flush=True)
    finally:
        for api in apis:
            api.close()
        for d in daemons:
            d.stop()
        for cg in cgs:
            remove_empty_cgroup_tree(cg)
    print(f"\n{args.rounds} rounds, A = {args.a}, B = {args.b} (medians of the rounds' medians, ms)")
    print(f"{'figure':<16} {'A':>8} {'B':>8} {'B/A':>6}")
    for f in FIGURES:
        a, b = statistics.median(res[f][0]), statistics.median(res[f][1])
        print(f"{f:<16} {a:8.3f} {b:8.3f} {b / a:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
