#!/usr/bin/env python3
"""Files: what the published client's file calls cost, per driver, side by side in one run:
a 64 MiB write in 1 MiB parts sent eight at once (POST .../uploads, PUT parts, :commit), a
directory of 100 MiB in 1000 files out as a tar and back in (GET/PUT .../files/archive, no gzip),
and a glob over 10000 files (GET .../files/list?glob=**/*.py).

    sudo python3 bench/files.py                       # writes its section of docs/benchmarks.md
    sudo python3 bench/files.py --out -               # print the section
    sudo python3 bench/files.py --drivers namespace   # only these drivers

Needs root, a built tree (it runs `make`), the default image and httpx.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import platform
import sys
import time
from datetime import datetime, timezone

from _harness import bench_daemon, options, per_driver, prepare
from helpers import Api
from sections import emit

BEGIN = "<!-- files benchmark: begin (bench/files.py) -->"
END = "<!-- files benchmark: end -->"
PART = 1024 * 1024
WRITE = 64 * PART


def parts_write(api: Api, sid: str) -> float:
    data = os.urandom(WRITE)
    t = time.perf_counter()
    b = api.post(f"/v1/sandboxes/{sid}/uploads", json={"path": "/workspace/parts.bin", "size": len(data),
                                                         "sha256": hashlib.sha256(data).hexdigest()}).json()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for r in pool.map(lambda off: api.put(f"/v1/sandboxes/{sid}/uploads/{b['uploadId']}",
                                              params={"offset": off}, content=data[off:off + PART]),
                          range(0, len(data), PART)):
            assert r.status_code == 200, r.text
    r = api.post(f"/v1/sandboxes/{sid}/uploads/{b['uploadId']}:commit", json={})
    assert r.status_code == 200, r.text
    return len(data) / (time.perf_counter() - t) / 1e6


def archive_round_trip(api: Api, sid: str) -> tuple[float, float, int]:
    r = api.post(f"/v1/sandboxes/{sid}:exec", json={"command": (
        "mkdir -p /workspace/tree && cd /workspace/tree && for i in $(seq 0 999); do "
        "mkdir -p d$((i % 20)) && head -c 104857 /dev/urandom > d$((i % 20))/f$i; done"), "timeoutMs": 600000})
    assert r.json()["exitCode"] == 0, r.text
    t = time.perf_counter()
    out = api.get(f"/v1/sandboxes/{sid}/files/archive", params={"path": "/workspace/tree", "gzip": "false"},
                  timeout=600)
    t_out = time.perf_counter() - t
    assert out.status_code == 200
    t = time.perf_counter()
    r = api.put(f"/v1/sandboxes/{sid}/files/archive", params={"path": "/workspace/copy"}, content=out.content,
                timeout=600)
    t_in = time.perf_counter() - t
    assert r.status_code == 200, r.text
    n = len(out.content)
    return n / t_out / 1e6, n / t_in / 1e6, n


def glob_ms(api: Api, sid: str) -> float:
    r = api.post(f"/v1/sandboxes/{sid}:exec", json={"command": (
        "mkdir -p /workspace/g && cd /workspace/g && python3 -c \"import os\n"
        "for i in range(10000):\n d='p%d/q%d' % (i % 50, i % 7)\n os.makedirs(d, exist_ok=True)\n"
        " open('%s/m%d.%s' % (d, i, 'py' if i % 2 else 'txt'), 'w').close()\""), "timeoutMs": 600000})
    assert r.json()["exitCode"] == 0, r.text
    times = []
    for _ in range(5):
        t = time.perf_counter()
        r = api.get(f"/v1/sandboxes/{sid}/files/list", params={"path": "/workspace/g", "glob": "**/*.py"})
        times.append((time.perf_counter() - t) * 1000)
        assert len(r.json()["data"]) == 5000, len(r.json()["data"])
    return sorted(times)[len(times) // 2]


def render(results: dict) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, "", "## Files: writes in parts, archives, glob", "",
             f"`sudo python3 bench/files.py` ({when}, {platform.node()}, {os.cpu_count()} cores, shared with other "
             "builds and tests while it ran; figures move with that load).", "",
             "| driver | 64 MiB write in parts (MB/s) | 100 MiB directory out as tar (MB/s) | the same tar in (MB/s) "
             "| glob of 5000 in 10000 files, p50 (ms) |", "| --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "error" in r:
            lines.append(f"| {drv} | not run: {r['error']} | | | |")
        else:
            lines.append(f"| {drv} | {r['parts']:.0f} | {r['out']:.0f} | {r['in']:.0f} | {r['glob']:.0f} |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    args = options(__doc__, "files").parse_args()
    if (rc := prepare("files.py")) != 0:
        return rc
    results: dict[str, dict] = {}
    with bench_daemon("files", args.image_dir) as d:
        api = Api(d, timeout=600)
        for drv, sbx in per_driver(api, args.drivers, results, diskMiB=4096):
            out_mbps, in_mbps, _ = archive_round_trip(api, sbx.id)
            results[drv] = {"parts": parts_write(api, sbx.id), "out": out_mbps, "in": in_mbps,
                            "glob": glob_ms(api, sbx.id)}
        api.close()
    emit(args.out, BEGIN, END, render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
