#!/usr/bin/env python3
"""What relaying a preview costs: a request to a preview through the host that runs its sandbox
and through another host of the fleet, side by side in one run.

    sudo python3 bench/fleet_previews.py --rounds 300

Two runtimed of this tree's build on one PostgreSQL the bench starts (a unix socket), both on
loopback with a preview listener each and a fleet secret; one namespace sandbox on host A with a
Python http.server (HTTP/1.1, keep-alive) answering 1 KiB, shared as a private preview. Each round
times, through A's listener and through B's in turn (20 ms of quiet before each): a GET on a
kept-alive connection, and a GET on a new connection (B then opens a hop to A for it). Then a
32 MiB answer, five times each way. Writes its section of docs/benchmarks.md (--out - prints it).
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

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "bench"))

from _harness import pct, prepare, start_hosts, stop_hosts, timed_get  # noqa: E402
from helpers import Api, Daemon, free_port, wait_until  # noqa: E402
from helpers.postgres import PostgresServer, available  # noqa: E402
from previews import BIG, SERVER  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- fleet previews benchmark: begin (bench/fleet_previews.py) -->"
END = "<!-- fleet previews benchmark: end -->"
MIB = 1024 * 1024


def one_get(port: int, host: str, token: str) -> float:
    """Milliseconds for a GET of 1 KiB on a new connection, from connect to the last byte."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nx-runtime-preview-token: {token}\r\n"
                  "Connection: close\r\n\r\n".encode())
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"x" * 1024), got[:200]
    return (time.perf_counter() - t0) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--downloads", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    a = ap.parse_args()
    rc = prepare("fleet_previews.py")
    if rc:
        return rc
    why = available()
    if why:
        print(f"bench/fleet_previews.py: no PostgreSQL: {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-fleetprev-"))
    secret = tmp / "fleet.secret"
    secret.write_text(os.urandom(24).hex() + "\n")
    os.chmod(secret, 0o600)
    ports = [free_port(), free_port()]
    pg = PostgresServer().start()
    hosts: list[Daemon] = []
    ways = ("owner", "other")
    try:
        pg.psql("CREATE DATABASE bench_fleetprev")
        hosts = start_hosts(tmp, a.image_dir, 2, "fprev",
                            ["--database", pg.url("bench_fleetprev"), "--fleet-secret-file", str(secret)],
                            lambda i: ["--preview-listen", f"127.0.0.1:{ports[i]}"])
        api = Api(hosts[0])
        wait_until(lambda: sum(h["state"] == "live" for h in api.get("/v1/hosts").json()["hosts"]) == 2, 20)
        for _ in range(30):
            sid = api.create_sandbox(driver="namespace", timeoutSeconds=3600).id
            if pg.psql(f"SELECT host_id FROM sandboxes WHERE id = '{sid}'", "bench_fleetprev").strip() == "fprev-0":
                break
            api.delete(f"/v1/sandboxes/{sid}")
        else:
            raise RuntimeError("no sandbox landed on host A in 30 creates")
        api.put_file(sid, "/workspace/server.py", SERVER.encode()).raise_for_status()
        api.post(f"/v1/sandboxes/{sid}/processes",
                 json={"command": f"exec python3 /workspace/server.py 8000 {BIG}"}).raise_for_status()
        probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 2).close()'"
        wait_until(lambda: api.exec(sid, command=probe)["exitCode"] == 0, 60, 0.2, what="the server")
        pv = api.post(f"/v1/sandboxes/{sid}/previews", json={"port": 8000}).json()
        host, token = pv["url"].split("://", 1)[1].split("/")[0], pv["token"]
        headers = {"Host": host, "x-runtime-preview-token": token}
        clients = {w: httpx.Client(timeout=600, headers=headers) for w in ways}
        urls = {w: f"http://127.0.0.1:{ports[i]}" for i, w in enumerate(ways)}
        for w in ways:  # warm both paths and their kept-alive connections
            for _ in range(10):
                clients[w].get(urls[w] + "/").raise_for_status()
                one_get(ports[ways.index(w)], host, token)
        kept: dict[str, list[float]] = {w: [] for w in ways}
        fresh: dict[str, list[float]] = {w: [] for w in ways}
        for i in range(a.rounds):
            for w in (ways if i % 2 == 0 else ways[::-1]):
                time.sleep(0.02)
                t0 = time.perf_counter()
                r = clients[w].get(urls[w] + "/")
                kept[w].append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200 and len(r.content) == 1024
                time.sleep(0.02)
                fresh[w].append(one_get(ports[ways.index(w)], host, token))
        rates: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(a.downloads):
            for w in ways:
                rates[w].append(BIG / MIB / timed_get(clients[w], urls[w] + "/big", BIG))
        for c in clients.values():
            c.close()
        api.close()
    finally:
        stop_hosts(hosts)
        pg.stop()
    p50k = {w: statistics.median(v) for w, v in kept.items()}
    p99k = {w: pct(v, 99) for w, v in kept.items()}
    p50f = {w: statistics.median(v) for w, v in fresh.items()}
    p99f = {w: pct(v, 99) for w, v in fresh.items()}
    mbs = {w: statistics.median(v) for w, v in rates.items()}
    lines = [
        BEGIN,
        "## Fleet: a preview through another host",
        "",
        f"`sudo python3 bench/fleet_previews.py --rounds {a.rounds}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): two hosts on one PostgreSQL on this "
        "machine (loopback), each with a preview listener; one namespace sandbox on host A with a Python "
        "`http.server` answering 1 KiB, shared as a private preview (token in the header). Through A's "
        f"listener and B's in turn, {a.rounds} rounds, 20 ms of quiet before each request: a GET on a "
        "kept-alive connection, and a GET on a new connection (connect to last byte); then a 32 MiB answer "
        f"{a.downloads} times each way (median). Load average at the end: {os.getloadavg()[0]:.1f} (2 cores).",
        "",
        "| path | kept-alive p50 | p99 | new connection p50 | p99 | 32 MiB answer |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| through the owner's listener | {p50k['owner']:.2f} ms | {p99k['owner']:.2f} ms | "
        f"{p50f['owner']:.2f} ms | {p99f['owner']:.2f} ms | {mbs['owner']:.0f} MiB/s |",
        f"| through another host's listener | {p50k['other']:.2f} ms | {p99k['other']:.2f} ms | "
        f"{p50f['other']:.2f} ms | {p99f['other']:.2f} ms | {mbs['other']:.0f} MiB/s |",
        f"| the relay adds | {p50k['other'] - p50k['owner']:+.2f} ms | | {p50f['other'] - p50f['owner']:+.2f} ms | "
        f"| {mbs['other'] / mbs['owner'] * 100:.0f}% of the throughput |",
        "",
        "A kept-alive connection pays the relay's copy only (its hop to A stays open as long as the "
        "client's connection); a new connection through B also pays B's look at the sandbox's record, "
        "a connection to A's API and its upgrade (the hop is a connection of its own per client "
        "connection, never pooled). Both hosts and the sandbox share this machine's 2 cores.",
        "",
        END,
    ]
    emit(a.out, BEGIN, END, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
