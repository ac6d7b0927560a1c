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
deliveries per second, with the daemon's default four workers (two of them at most for one
owner). Then, on a fourth daemon, how long another owner's delivery takes (create to its
sandbox.created at his receiver) on an idle daemon and while one owner's webhooks flood a receiver
that never answers (each attempt hanging for the 10 s timeout): `--rounds` of each. Writes its
section of docs/benchmarks.md (--out - prints it).
"""
from __future__ import annotations

import argparse
import json
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
    """A receiver on loopback: how many deliveries came, and when each sandbox's first one did."""

    def __init__(self):
        self.n = 0
        self.at: dict[str, float] = {}
        self.cond = threading.Condition()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.perf_counter()
                with outer.cond:
                    outer.n += 1
                    outer.at.setdefault(json.loads(body).get("resourceId", ""), now)
                    outer.cond.notify_all()
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def count(self) -> int:
        with self.cond:
            return self.n

    def wait(self, sid: str, timeout: float) -> float | None:
        with self.cond:
            self.cond.wait_for(lambda: sid in self.at, timeout)
            return self.at.get(sid)


class Hanging:
    """A receiver that accepts every connection and never answers."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


def owner_key(d, owner: str) -> str:
    with Api(d) as admin:
        r = admin.post("/v1/keys", json={"name": owner, "owner": owner, "access": "full"})
        assert r.status_code in (200, 201), r.text
        return r.json()["key"]


def bobs_deliveries(d, key: str, recv: Counter, rounds: int) -> list[float]:
    """Create to sandbox.created at Bob's receiver, ms, one round after another."""
    lat = []
    with Api(d, key=key) as c:
        for _ in range(rounds):
            time.sleep(0.02)
            t0 = time.perf_counter()
            r = c.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 60})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            got = recv.wait(sid, 30)
            assert got is not None, f"Bob's delivery for {sid} never came"
            lat.append((got - t0) * 1000)
            c.delete(f"/v1/sandboxes/{sid}")
    return lat


def fairness(image_dir: str, tmp: Path, args: list[str], rounds: int) -> tuple[list[float], list[float], int]:
    """Bob's delivery latency on an idle daemon, then while Alice's eight webhooks to a hanging
    receiver have a flood queued; and how many of Alice's attempts hung meanwhile."""
    recv, hang = Counter(), Hanging()
    try:
        with bench_daemon("webhooks-fair", image_dir, tmp / "fair", extra_args=args) as d:
            alice, bob = owner_key(d, "alice"), owner_key(d, "bob")
            with Api(d, key=bob) as b:
                r = b.post("/v1/webhooks", json={"url": recv.url, "events": ["sandbox.created"]})
                assert r.status_code == 201, r.text
            bobs_deliveries(d, bob, recv, 2)  # warm
            idle = bobs_deliveries(d, bob, recv, rounds)
            with Api(d, key=alice) as a:
                for _ in range(8):
                    assert a.post("/v1/webhooks", json={"url": hang.url}).status_code == 201
                # Two sandboxes' created and started events: 32 deliveries, each hanging 10 s.
                sbx = [a.create_sandbox(driver="namespace", timeoutSeconds=120) for _ in range(2)]
                deadline = time.monotonic() + 10
                while len(hang.held) < 2 and time.monotonic() < deadline:
                    time.sleep(0.02)
                flooded = bobs_deliveries(d, bob, recv, rounds)
                held = len(hang.held)
                hang.close()
                for s_ in sbx:
                    a.delete(f"/v1/sandboxes/{s_.id}")
    finally:
        recv.httpd.shutdown()
        hang.close()
    return idle, flooded, held


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
    ap.add_argument("--rounds", type=int, default=20)
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
    idle, flooded, held = fairness(a.image_dir, tmp, args, a.rounds)
    per_s = (got - warm) / (t_end - t_start)
    p50_off, p50_on = statistics.median(off), statistics.median(on)
    lines = [
        f"{BEGIN} (bench/webhooks.py) -->",
        "## Webhooks",
        "",
        f"`sudo python3 bench/webhooks.py --creates {a.creates} --hooks {a.hooks} --rounds {a.rounds}`: {a.creates} creates "
        "(namespace driver) one after another on a fresh daemon without webhooks and on one whose owner "
        f"has {a.hooks} webhooks taking every sandbox event, to one receiver on loopback; then the "
        "deliveries of the round counted at the receiver, from the first create until all of them "
        "came (four workers, the default, of which at most two send one owner's deliveries). A third daemon has the same webhooks at a port where nothing "
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
        f"One owner's hanging receivers and another's deliveries: on a fourth daemon, Bob's webhook "
        f"takes his sandbox.created; {a.rounds} creates of his (20 ms apart), each timed from the "
        "request to the event at his receiver, first on the idle daemon, then while Alice's eight "
        "webhooks to a receiver that accepts and never answers have 32 deliveries queued (each "
        f"attempt hangs for the 10 s timeout): {held} attempts of hers were hanging at the end, her "
        "share of the four workers, each with her next deliveries claimed behind it.",
        "",
        "| Bob's delivery | p50 | p95 | p50 vs idle |",
        "| --- | --- | --- | --- |",
        f"| idle daemon | {statistics.median(idle):.1f} ms | {pct(idle, 95):.1f} ms | 1.00x |",
        f"| Alice's receivers hanging | {statistics.median(flooded):.1f} ms | {pct(flooded, 95):.1f} ms | "
        f"{statistics.median(flooded) / statistics.median(idle):.2f}x |",
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
