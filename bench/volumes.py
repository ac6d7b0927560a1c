#!/usr/bin/env python3
"""Volumes: write and read throughput in a volume (an ext4 image on a loop device, bound into the
sandbox) against the sandbox's own disk (/workspace, on its writable layer), per driver, side by
side in one run (the two interleaved, round after round, in alternating order). A write is
128 MiB in 1 MiB pieces ending with fsync; a read is the same file after the file's pages were
dropped from the cache (posix_fadvise DONTNEED, which gVisor takes as a hint only).

    sudo python3 bench/volumes.py                       # writes its section of docs/benchmarks.md
    sudo python3 bench/volumes.py --out -               # print the section
    sudo python3 bench/volumes.py --drivers namespace   # only these drivers

Needs root, a built tree (it runs `make`) and the default image.
"""
from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone

from _harness import REPO, bench_daemon, options, per_driver, prepare
from helpers import Api
from sections import emit

BEGIN = "<!-- volumes benchmark: begin (bench/volumes.py) -->"
END = "<!-- volumes benchmark: end -->"
MIB = 128
ROUNDS = 4

# Inside the sandbox: one write (fsync'd) and one read of MIB MiB at a path, in MiB/s.
PROBE = r'''
import os, sys, time
path, mib = sys.argv[1], int(sys.argv[2])
piece = os.urandom(1 << 20)
t = time.perf_counter()
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for _ in range(mib):
    os.write(fd, piece)
os.fsync(fd)
w = time.perf_counter() - t
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
t = time.perf_counter()
fd = os.open(path, os.O_RDONLY)
while os.read(fd, 1 << 20):
    pass
os.close(fd)
r = time.perf_counter() - t
os.unlink(path)
print(mib / w, mib / r)
'''


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def render(results: dict, drivers: str) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    lines = [BEGIN, "", "## Volumes: a volume against the sandbox's own disk", "",
             f"`sudo python3 bench/volumes.py` ({when}, {platform.node()}, {ROUNDS} rounds of {MIB} MiB "
             "each way, the two paths interleaved; medians in MiB/s). A write ends with fsync; a read "
             "follows a drop of the file's cached pages.", "",
             "| driver | volume write | own disk write | volume read | own disk read |",
             "| --- | --- | --- | --- | --- |"]
    for drv in [x for x in drivers.split(",") if x]:
        r = results.get(drv)
        if not r or "error" in r:
            lines.append(f"| {drv} | not run: {(r or {}).get('error', 'not offered')} | | | |")
            continue
        lines.append(f"| {drv} | {median(r['vol_w']):.0f} | {median(r['own_w']):.0f} | "
                     f"{median(r['vol_r']):.0f} | {median(r['own_r']):.0f} |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    ap = options(__doc__, "volumes")
    ap.set_defaults(drivers="namespace,gvisor")
    args = ap.parse_args()
    rc = prepare("volumes.py")
    if rc:
        return rc
    results: dict = {}
    with bench_daemon("volumes", args.image_dir) as d:
        api = Api(d)
        for drv in [x for x in args.drivers.split(",") if x]:
            vol = api.post("/v1/volumes", json={"sizeMiB": 1024})
            assert vol.status_code == 201, vol.text
            vid = vol.json()["id"]
            for _, sbx in per_driver(api, drv, results, diskMiB=2048,
                                     volumes=[{"volumeId": vid, "path": "/data"}]):
                api.put_file(sbx.id, "/tmp/probe.py", PROBE.encode())
                r = results.setdefault(drv, {"vol_w": [], "own_w": [], "vol_r": [], "own_r": []})
                for i in range(ROUNDS):
                    order = [("vol", "/data/f"), ("own", "/workspace/f")]
                    for name, path in order if i % 2 == 0 else reversed(order):
                        out = api.exec(sbx.id, argv=["python3", "/tmp/probe.py", path, str(MIB)], timeoutMs=300000)
                        assert out["exitCode"] == 0, out
                        w, rd = (float(x) for x in out["stdout"].split())
                        r[f"{name}_w"].append(w)
                        r[f"{name}_r"].append(rd)
            api.post(f"/v1/volumes/{vid}:delete", json={"force": True})
        api.close()
    print(json.dumps(results), file=sys.stderr)
    emit(args.out, BEGIN, END, render(results, args.drivers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
