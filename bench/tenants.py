#!/usr/bin/env python3
"""Owner B's request latency while owner A holds every bound it has, against the same daemon idle.

    sudo python3 bench/tenants.py build --rounds 200

One daemon (namespace unless --driver). Owner B has a running sandbox and, per round, asks for it
(GET /v1/sandboxes/{id}), lists a directory in it and runs `true` in it. The rounds run twice:
first with owner A idle, then with owner A at its bounds: 16 terminals open (its share of the
daemon's 64), 16 uploads in progress (its share, 1 GiB declared in all), as many commands waited
on as its bound of requests in progress lets it start (128 with the terminals), and 1,000 slow
sockets from another peer address (127.0.0.2) that send part of their headers and stop (the edge
holds 256 of them, its bound per peer, without a thread, until their 15 s are up; the bench opens
them again as they close). Prints the p50 and p90 of each figure, idle and loaded, and loaded/idle
of the p50s, and the daemon's threads idle and loaded. Needs root and the default image.
"""
from __future__ import annotations

import argparse
import base64
import os
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from helpers import Api, Daemon, remove_empty_cgroup_tree  # noqa: E402

FIGURES = ("get sandbox", "list a directory", "exec true")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def rounds(api: Api, sid: str, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {f: [] for f in FIGURES}
    for _ in range(n):
        t = time.perf_counter()
        assert api.get(f"/v1/sandboxes/{sid}").status_code == 200
        out["get sandbox"].append(time.perf_counter() - t)
        t = time.perf_counter()
        r = api.get(f"/v1/sandboxes/{sid}/files/list", params={"path": "/workspace"})
        assert r.status_code == 200, r.text
        out["list a directory"].append(time.perf_counter() - t)
        t = time.perf_counter()
        assert api.exec(sid, argv=["true"])["exitCode"] == 0
        out["exec true"].append(time.perf_counter() - t)
    return out


def terminal(port: int, key: str, sid: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    wskey = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /v1/sandboxes/{sid}/terminal?command=sleep%203600 HTTP/1.1\r\nHost: x\r\n"
               f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {wskey}\r\n"
               f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {key}\r\n\r\n").encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


def long_exec(port: int, key: str, sid: str) -> socket.socket:
    """A command waited on (`sleep 3600`): one request in progress until the socket closes."""
    body = b'{"argv": ["sleep", "3600"]}'
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall((f"POST /v1/sandboxes/{sid}:exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    return s


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


class Slowloris(threading.Thread):
    """Keeps n sockets from 127.0.0.2 open with half a request each, opening new ones as the
    daemon closes them."""

    def __init__(self, port: int, n: int):
        super().__init__(daemon=True)
        self.port, self.n, self.stop = port, n, threading.Event()
        self.socks: list[socket.socket] = []

    def one(self) -> socket.socket | None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.2", 0))
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", self.port))
            s.sendall(b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            s.setblocking(False)
            return s
        except OSError:
            s.close()
            return None

    def run(self) -> None:
        while not self.stop.is_set():
            alive = []
            for s in self.socks:
                try:
                    if s.recv(1) == b"":
                        s.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    continue
                alive.append(s)
            self.socks = alive
            while len(self.socks) < self.n and not self.stop.is_set():
                s = self.one()
                if s:
                    self.socks.append(s)
            self.stop.wait(0.5)
        for s in self.socks:
            s.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", type=Path, help="the build/ directory")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--driver", default="namespace")
    ap.add_argument("--image-dir", type=Path,
                    default=Path(os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images")))
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(8192, hard), hard))
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-tenants-"))
    cg = f"runtime-bench-tenants-{os.getpid()}"
    d = Daemon(args.build.resolve(), args.image_dir, tmp / "state", cg)
    d.start()
    held: list[socket.socket] = []
    loris = Slowloris(d.port, 1000)
    try:
        admin = Api(d, timeout=600)
        r = admin.post("/v1/keys", json={"name": "tenant-b", "owner": "tenant-b"})
        assert r.status_code == 201, r.text
        b = Api(d, key=r.json()["key"], timeout=600)
        sb = b.create_sandbox(driver=args.driver, timeoutSeconds=3600)
        a_boxes = [admin.create_sandbox(driver=args.driver, timeoutSeconds=3600) for _ in range(2)]
        rounds(b, sb.id, 5)  # warm-up
        idle = rounds(b, sb.id, args.rounds)
        threads_before = threads(d.proc.pid)
        # Owner A at every bound it has.
        for i in range(16):
            held.append(terminal(d.port, d.api_key, a_boxes[i % 2].id))
        for i in range(16):
            box = a_boxes[i // 8]
            r = admin.post(f"/v1/sandboxes/{box.id}/uploads",
                           json={"path": f"/workspace/u{i}", "size": 64 << 20, "sha256": "0" * 64})
            assert r.status_code == 200, r.text
        r = admin.post(f"/v1/sandboxes/{a_boxes[0].id}/uploads",
                       json={"path": "/workspace/more", "size": 1, "sha256": "0" * 64})
        assert r.status_code == 429, r.text
        # Requests in progress up to the owner's bound: the next one is refused.
        for _ in range(512):
            if admin.get("/v1/info").status_code == 429:
                break
            held.append(long_exec(d.port, d.api_key, a_boxes[len(held) % 2].id))
        else:
            raise AssertionError("owner A never reached its bound of requests in progress")
        in_progress = len(held) - 16
        loris.start()
        while len(loris.socks) < 1000:
            time.sleep(0.2)
        loaded = rounds(b, sb.id, args.rounds)
        threads_loaded = threads(d.proc.pid)
    finally:
        loris.stop.set()
        for s in held:
            s.close()
        d.stop()
        remove_empty_cgroup_tree(cg)
    print(f"{args.rounds} rounds of owner B, driver {args.driver}; owner A idle, then at its bounds "
          f"(16 terminals, 16 uploads, {in_progress} more requests in progress, 1,000 slow sockets from "
          f"another address); the daemon's threads: {threads_before} idle, {threads_loaded} loaded")
    print(f"{'figure':<20} {'idle p50':>9} {'idle p90':>9} {'loaded p50':>11} {'loaded p90':>11} {'ratio p50':>10}")
    for f in FIGURES:
        i50, l50 = statistics.median(idle[f]) * 1000, statistics.median(loaded[f]) * 1000
        print(f"{f:<20} {i50:9.2f} {pct(idle[f], 0.9) * 1000:9.2f} {l50:11.2f} {pct(loaded[f], 0.9) * 1000:11.2f} "
              f"{l50 / i50:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
