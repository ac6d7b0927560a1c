#!/usr/bin/env python3
"""What forwarding costs: exec round trip and a 100 MiB download through the host that runs the
sandbox and through another host of the fleet, side by side in one run.

    sudo python3 bench/fleet_forward.py --rounds 200

Two runtimed of this tree's build on one PostgreSQL the bench starts (helpers/postgres.py: a unix
socket, no TCP), both on loopback, sharing a fleet secret; one namespace sandbox on host A. Each
round runs `true` through A and through B in turn (20 ms of quiet before each call, as an agent's
calls come), timed from request to answer over a kept-alive connection; then the download of a
100 MiB file, five times each way. The same again, interleaved, on a second pair whose hop goes over
TLS (--fleet-tls-dir). Writes its section of docs/benchmarks.md (--out - prints it).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "bench"))

from _harness import pct, prepare, start_hosts, stop_hosts  # noqa: E402
from helpers import Api, Daemon, free_port, wait_until  # noqa: E402
from helpers.postgres import PostgresServer, available  # noqa: E402
from helpers.tls import fleet_ca, fleet_host_dir  # noqa: E402
from sections import replace_section  # noqa: E402

BEGIN = "<!-- fleet forward benchmark: begin"
END = "<!-- fleet forward benchmark: end -->"
MIB = 1024 * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--downloads", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    a = ap.parse_args()
    rc = prepare("fleet_forward.py")
    if rc:
        return rc
    why = available()
    if why:
        print(f"bench/fleet_forward.py: no PostgreSQL: {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-forward-"))
    secret = tmp / "fleet.secret"
    secret.write_text(os.urandom(24).hex() + "\n")
    os.chmod(secret, 0o600)
    ca = fleet_ca(tmp / "ca")
    tls_ports = [free_port(), free_port()]

    def tls_args(i: int) -> list[str]:
        d = fleet_host_dir(ca, tmp / f"tls-{i}", "IP:127.0.0.1")
        return ["--fleet-tls-dir", str(d), "--fleet-listen", f"127.0.0.1:{tls_ports[i]}",
                "--advertise", f"https://127.0.0.1:{tls_ports[i]}"]

    pg = PostgresServer().start()
    hosts: list[Daemon] = []
    paths = ("owner", "other", "owner-tls", "other-tls")
    try:
        clients: dict[str, Api] = {}
        sbx = {}
        for setup, per_host in (("", None), ("-tls", tls_args)):
            db = f"bench_forward{setup.replace('-', '_')}"
            pg.psql(f"CREATE DATABASE {db}")
            pair = start_hosts(tmp, a.image_dir, 2, f"fwd{setup}", ["--database", pg.url(db),
                                                                   "--fleet-secret-file", str(secret)], per_host)
            hosts += pair
            owner, other = Api(pair[0]), Api(pair[1], key=pair[0].api_key)
            wait_until(lambda: sum(h["state"] == "live" for h in other.get("/v1/hosts").json()["hosts"]) == 2, 20)
            clients["owner" + setup], clients["other" + setup] = owner, other
            sbx["owner" + setup] = sbx["other" + setup] = owner.create_sandbox(driver="namespace",
                                                                              timeoutSeconds=3600).id
        for label in paths:  # warm every path
            for _ in range(5):
                clients[label].exec(sbx[label], command="true")
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(a.rounds):
            for label in paths:
                time.sleep(0.02)
                t0 = time.perf_counter()
                clients[label].exec(sbx[label], command="true")
                times[label].append((time.perf_counter() - t0) * 1000)
        for label in ("owner", "owner-tls"):
            clients[label].exec(sbx[label], command="head -c 104857600 /dev/urandom > /workspace/big")
        rates: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(a.downloads):
            for label in paths:
                c = clients[label]
                t0 = time.perf_counter()
                n = 0
                with c.stream("GET", f"/v1/sandboxes/{sbx[label]}/files/content",
                              params={"path": "/workspace/big"}) as r:
                    assert r.status_code == 200
                    for chunk in r.iter_bytes(1 << 20):
                        n += len(chunk)
                assert n == 100 * MIB, n
                rates[label].append(n / MIB / (time.perf_counter() - t0))
        for c in clients.values():
            c.close()
    finally:
        stop_hosts(hosts)
        pg.stop()
    p50 = {k: statistics.median(v) for k, v in times.items()}
    p95 = {k: pct(v, 95) for k, v in times.items()}
    mbs = {k: statistics.median(v) for k, v in rates.items()}
    lines = [
        f"{BEGIN} (bench/fleet_forward.py) -->",
        "## Fleet: a request through another host",
        "",
        f"`sudo python3 bench/fleet_forward.py --rounds {a.rounds}`: two hosts on one PostgreSQL on this "
        "machine (loopback), one namespace sandbox on host A; `exec true` through A and through B in "
        f"turn, {a.rounds} rounds, 20 ms of quiet before each call, and a 100 MiB download "
        f"{a.downloads} times each way (median). Load average at the end: "
        f"{os.getloadavg()[0]:.1f} (2 cores).",
        "",
        "| path | exec `true` p50 | p95 | 100 MiB download |",
        "| --- | --- | --- | --- |",
        f"| through the owner | {p50['owner']:.2f} ms | {p95['owner']:.2f} ms | {mbs['owner']:.0f} MiB/s |",
        f"| through another host | {p50['other']:.2f} ms | {p95['other']:.2f} ms | {mbs['other']:.0f} MiB/s |",
        f"| forwarding adds | {p50['other'] - p50['owner']:+.2f} ms | | "
        f"{mbs['other'] / mbs['owner'] * 100:.0f}% of the throughput |",
        f"| TLS pair: through the owner | {p50['owner-tls']:.2f} ms | {p95['owner-tls']:.2f} ms | "
        f"{mbs['owner-tls']:.0f} MiB/s |",
        f"| TLS pair: through another host, the hop over TLS | {p50['other-tls']:.2f} ms | "
        f"{p95['other-tls']:.2f} ms | {mbs['other-tls']:.0f} MiB/s |",
        f"| forwarding over TLS adds | {p50['other-tls'] - p50['owner-tls']:+.2f} ms | | "
        f"{mbs['other-tls'] / mbs['owner-tls'] * 100:.0f}% of the throughput |",
        "",
        "Targets: at most 1 ms added at p50, at least 80% of the throughput. A second pair of hosts has "
        "`--fleet-tls-dir` (P-256 certificates of a CA the bench makes) and their own TLS listeners; its "
        "four calls are interleaved with the plain pair's. The hop keeps its connections alive between calls "
        "(so one TLS handshake serves many) and parses the owner's answer with http_parser; the hosts share "
        "this machine's 2 cores, so the download's copy through B competes with A's for them.",
        "",
        END,
    ]
    section = "\n".join(lines)
    if a.out == "-":
        print(section)
    else:
        replace_section(Path(a.out), BEGIN, END, section)
    print(section, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
