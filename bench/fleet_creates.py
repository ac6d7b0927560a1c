#!/usr/bin/env python3
"""Creates per second: one host on its SQLite file, one host on PostgreSQL, three hosts on one
PostgreSQL, side by side in one run.

    sudo python3 bench/fleet_creates.py --creates 60 --concurrency 6

Each setup gets fresh daemons of this tree's build (namespace driver) and a database of its own
on a PostgreSQL server the bench starts (helpers/postgres.py: Debian's postgresql-15, a unix
socket, no TCP). A round sends `--creates` creates (timeoutSeconds 60) from `--concurrency`
client threads, spread round-robin over the setup's hosts, and times each from request to 201;
then deletes them. The hosts of a fleet share this machine's cores, so three hosts here measure
what the shared database costs, not what three machines add. Writes its section of
docs/benchmarks.md (--out - prints it).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "bench"))

from _harness import pct, prepare, start_hosts, stop_hosts  # noqa: E402
from helpers import Api, Daemon  # noqa: E402
from helpers.postgres import PostgresServer, available  # noqa: E402
from sections import replace_section  # noqa: E402

BEGIN = "<!-- fleet creates benchmark: begin"
END = "<!-- fleet creates benchmark: end -->"


def round_of_creates(hosts: list[Daemon], creates: int, concurrency: int) -> dict:
    key = hosts[0].api_key

    def one(i: int) -> tuple[float, str]:
        with Api(hosts[i % len(hosts)], key=key) as c:
            t0 = time.perf_counter()
            r = c.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 60})
            dt = time.perf_counter() - t0
            assert r.status_code == 201, r.text
            return dt, r.json()["id"]

    # One untimed create first: images and caches warm on every host.
    for h in hosts:
        with Api(h) as c:
            c.delete(f"/v1/sandboxes/{c.create_sandbox(driver='namespace', timeoutSeconds=60).id}")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(one, range(creates)))
    wall = time.perf_counter() - t0
    with ThreadPoolExecutor(concurrency) as pool:
        def drop(i_id: tuple[int, str]) -> None:
            i, sid = i_id
            with Api(hosts[i % len(hosts)], key=key) as c:
                c.delete(f"/v1/sandboxes/{sid}")
        list(pool.map(drop, enumerate(sid for _, sid in done)))
    lat = [dt * 1000 for dt, _ in done]
    return {"per_s": creates / wall, "p50": statistics.median(lat), "p95": pct(lat, 95)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--creates", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    a = ap.parse_args()
    rc = prepare("fleet_creates.py")
    if rc:
        return rc
    why = available()
    if why:
        print(f"bench/fleet_creates.py: no PostgreSQL: {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-fleet-"))
    pg = PostgresServer().start()
    rows = []
    try:
        for label, n, use_pg in (("one host, SQLite", 1, False), ("one host, PostgreSQL", 1, True),
                                 ("three hosts, one PostgreSQL", 3, True)):
            database = None
            if use_pg:
                db = f"bench_{n}_{os.getpid()}"
                pg.psql(f"CREATE DATABASE {db}")
                database = pg.url(db)
            args = ["--max-sandboxes", "1000", "--max-sandboxes-per-key", "1000"]
            hosts = start_hosts(tmp, a.image_dir, n, f"fleet{n}{'pg' if use_pg else 'sq'}",
                                [*args, "--database", database] if database else args)
            try:
                rows.append((label, round_of_creates(hosts, a.creates, a.concurrency)))
            finally:
                stop_hosts(hosts)
            print(f"{label}: {rows[-1][1]}", file=sys.stderr)
    finally:
        pg.stop()
    base = rows[0][1]["per_s"]
    lines = [
        f"{BEGIN} (bench/fleet_creates.py) -->",
        "## Fleet: creates per second",
        "",
        f"`sudo python3 bench/fleet_creates.py --creates {a.creates} --concurrency {a.concurrency}`: "
        f"{a.creates} creates (namespace driver, each timed from request to `201`) from "
        f"{a.concurrency} client threads, spread round-robin over the setup's hosts; fresh daemons "
        "and a database of their own per setup, on one PostgreSQL 15 over its unix socket. The hosts "
        "share this machine's 2 cores: three hosts here measure what the shared database costs, not "
        "what three machines add.",
        "",
        "| setup | creates/s | vs one host on SQLite | p50 | p95 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, r in rows:
        lines.append(f"| {label} | {r['per_s']:.1f} | {r['per_s'] / base:.2f}x | {r['p50']:.1f} ms | "
                     f"{r['p95']:.1f} ms |")
    lines += ["", END]
    section = "\n".join(lines)
    if a.out == "-":
        print(section)
    else:
        replace_section(Path(a.out), BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
