#!/usr/bin/env python3
"""What an Idempotency-Key costs and what a replay saves, on loopback against a daemon of its own:
the latency of a small idempotent call (DELETE of a sandbox that does not exist: a 404 that is
kept) without a key, with a new key each time (a claim and a kept answer in the daemon's table),
and with one key sent again (a replay); then creates on the namespace driver with a new key and
their replays.

    sudo python3 bench/guardrails.py            # prints a markdown table
    sudo python3 bench/guardrails.py --quick    # fewer calls

Needs root, a built tree and the default image, as the integration tests do.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

import httpx  # noqa: E402

from helpers import Daemon, remove_empty_cgroup_tree  # noqa: E402


def timed(call, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def row(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    return f"| {name} | {len(ms)} | {statistics.median(ms):.2f} | {p90:.2f} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 small calls and 5 creates per case")
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    args = ap.parse_args()
    n, creates = (100, 5) if args.quick else (500, 20)
    tmp = Path(tempfile.mkdtemp(prefix="bench-guardrails-"))
    cgroup = f"runtime-bench-{os.getpid()}-guardrails"
    d = Daemon(REPO / "build", Path(args.image_dir), tmp / "state", cgroup)
    d.start()
    lines = ["| call | n | p50 ms | p90 ms |", "| --- | --- | --- | --- |"]
    try:
        with httpx.Client(base_url=d.base_url, headers={"Authorization": f"Bearer {d.api_key}"},
                          timeout=120) as c:
            gone = "/v1/sandboxes/sbx_" + "0" * 20
            run = uuid.uuid4().hex
            lines.append(row("DELETE (404), no key", timed(lambda i: c.delete(gone), n)))
            lines.append(row("DELETE (404), a new key", timed(
                lambda i: c.delete(gone, headers={"Idempotency-Key": f"b-{run}-{i}"}), n)))
            c.delete(gone, headers={"Idempotency-Key": f"again-{run}"})
            lines.append(row("DELETE (404), the same key again (replay)", timed(
                lambda i: c.delete(gone, headers={"Idempotency-Key": f"again-{run}"}), n)))
            body = {"driver": "namespace", "timeoutSeconds": 600}
            made: list[str] = []

            def create(i: int) -> None:
                r = c.post("/v1/sandboxes", json=body, headers={"Idempotency-Key": f"c-{run}-{i}"})
                assert r.status_code == 201, r.text
                made.append(r.json()["id"])

            lines.append(row("create (namespace), a new key", timed(create, creates)))
            lines.append(row("create, its key again (replay: no second sandbox)", timed(
                lambda i: c.post("/v1/sandboxes", json=body, headers={"Idempotency-Key": f"c-{run}-{i}"}),
                creates)))
            listed = c.get("/v1/sandboxes").json()["sandboxes"]
            lines.append(f"\nsandboxes made: {len(made)}, listed: {len(listed)}")
            for sid in made:
                c.delete(f"/v1/sandboxes/{sid}")
    finally:
        d.stop()
        remove_empty_cgroup_tree(cgroup)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
