#!/usr/bin/env python3
"""Webhooks: what they cost a create, and deliveries per second to a local receiver.

    sudo python3 bench/webhooks.py --creates 40 --hooks 20

Two fresh daemons of this tree's build (namespace driver, SQLite), side by side in one run: one
with no webhook, one whose owner has `--hooks` webhooks taking every sandbox event, all to one
receiver on loopback (the daemon allows loopback with --webhook-allow-cidr). On each, `--creates`
creates are timed one after another, from request to 201 (each create records two events, and
each event queues a delivery per webhook on the way); the sandboxes are deleted after. On the
second, the deliveries of every event of the round (three per sandbox: created, started, deleted,
times the webhooks) are timed from the first create until the receiver has them all:
deliveries per second, with the daemon's default two workers. Writes its section of
docs/benchmarks.md (--out - prints it).
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "bench"))

from _harness import bench_daemon, pct, prepare  # noqa: E402
from helpers import Api  # noqa: E402
from sections import replace_section  # noqa: E402

BEGIN = "<!-- webhooks benchmark: begin"
END = "<!-- webhooks benchmark: end -->"


class Counter:
    def __init__(self):
        self.n = 0
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.n += 1
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def count(self) -> int:
        with self.lock:
            return self.n


def creates(d, n: int, warmed=None) -> tuple[list[float], float]:
    lat = []
    with Api(d) as c:
        c.delete(f"/v1/sandboxes/{c.create_sandbox(driver='namespace', timeoutSeconds=60).id}")  # warm
        if warmed:
            warmed()
        ids = []
        t_start = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            r = c.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 60})
            lat.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        for i in ids:
            c.delete(f"/v1/sandboxes/{i}")
    return lat, t_start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--creates", type=int, default=40)
    ap.add_argument("--hooks", type=int, default=20)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    a = ap.parse_args()
    rc = prepare("webhooks.py")
    if rc:
        return rc
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-webhooks-"))
    args = ["--webhook-allow-cidr", "127.0.0.0/8", "--max-sandboxes", "1000", "--max-sandboxes-per-key", "1000"]
    with bench_daemon("webhooks-off", a.image_dir, tmp / "off", extra_args=args) as d:
        off, _ = creates(d, a.creates)
    # The same webhooks at a port where nothing listens: each delivery fails at once and waits
    # ten seconds for its next attempt, so the round pays the queueing and one store round trip
    # per attempt, not the receiver's work on these same two cores.
    with bench_daemon("webhooks-down", a.image_dir, tmp / "down", extra_args=args) as d:
        with Api(d) as c:
            dead = socket.socket()
            dead.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{dead.getsockname()[1]}/hook"
            dead.close()
            for _ in range(a.hooks):
                assert c.post("/v1/webhooks", json={"url": url, "events": ["sandbox."]}).status_code == 201
        down, _ = creates(d, a.creates)
    recv = Counter()
    with bench_daemon("webhooks-on", a.image_dir, tmp / "on", extra_args=args) as d:
        with Api(d) as c:
            for _ in range(a.hooks):
                r = c.post("/v1/webhooks", json={"url": recv.url, "events": ["sandbox."]})
                assert r.status_code == 201, r.text
        # The warm-up sandbox's events (created, started, deleted), counted as they come: a
        # sandbox's share of the round.
        warm = {}

        def settle():
            last, stable = -1, 0
            while stable < 20:
                n = recv.count()
                stable = stable + 1 if n == last else 0
                last = n
                time.sleep(0.05)
            warm["n"] = last

        on, t_start = creates(d, a.creates, settle)
        per_sandbox = warm["n"]
        want = per_sandbox * (1 + a.creates)
        warm = per_sandbox
        deadline = time.monotonic() + 600
        while recv.count() < want and time.monotonic() < deadline:
            time.sleep(0.05)
        t_end = time.perf_counter()
        got = recv.count()
    recv.httpd.shutdown()
    per_s = (got - warm) / (t_end - t_start)
    p50_off, p50_on = statistics.median(off), statistics.median(on)
    lines = [
        f"{BEGIN} (bench/webhooks.py) -->",
        "## Webhooks",
        "",
        f"`sudo python3 bench/webhooks.py --creates {a.creates} --hooks {a.hooks}`: {a.creates} creates "
        "(namespace driver) one after another on a fresh daemon without webhooks and on one whose owner "
        f"has {a.hooks} webhooks taking every sandbox event, to one receiver on loopback; then the "
        "deliveries of the round counted at the receiver, from the first create until all of them "
        "came (two workers, the default). A third daemon has the same webhooks at a port where nothing "
        "listens: its creates pay the queueing alone (one store write per event, whatever the number of "
        "webhooks), not the deliveries' and the receiver's CPU on these two cores.",
        "",
        "| | create p50 | create p95 | vs none |",
        "| --- | --- | --- | --- |",
        f"| no webhook | {p50_off:.1f} ms | {pct(off, 95):.1f} ms | 1.00x |",
        f"| {a.hooks} webhooks, receiver down (queueing only) | {statistics.median(down):.1f} ms | "
        f"{pct(down, 95):.1f} ms | {statistics.median(down) / p50_off:.2f}x |",
        f"| {a.hooks} webhooks, delivered meanwhile | {p50_on:.1f} ms | {pct(on, 95):.1f} ms | {p50_on / p50_off:.2f}x |",
        "",
        f"Deliveries: {got - warm} of {want - warm} in {t_end - t_start:.1f} s, {per_s:.0f} a second "
        "(each a signed POST and two writes of the store).",
        "",
        END,
    ]
    section = "\n".join(lines)
    if a.out == "-":
        print(section)
    else:
        replace_section(Path(a.out), BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
