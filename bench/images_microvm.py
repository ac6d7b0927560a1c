#!/usr/bin/env python3
"""A sandbox on the microVM from an image built here: the first microVM create from an image (its
layers made into the microVM's disk, then a boot on a copy of it) against a later one (a copy of
that disk, then a boot), for a small image (a few files) and a larger one (the FROM image's Python
library copied and 200 MiB of random data: about 250 MiB of layers), with how long the making took
by the daemon's log and what the disk holds. Builds run on the daemon's default driver; the
creates boot under TCG here, so each create's time is mostly its boot.

    sudo python3 bench/images_microvm.py            # writes its section of docs/benchmarks.md
    sudo python3 bench/images_microvm.py --out -    # print it

Needs root, a built tree (it runs `make`), the default image with its microVM parts and httpx.
"""
from __future__ import annotations

import os
import platform
import re
import sys
import time
from datetime import datetime, timezone

from _harness import bench_daemon, options, prepare
from helpers import Api
from sections import emit

BEGIN = "<!-- images microvm benchmark: begin (bench/images_microvm.py) -->"
END = "<!-- images microvm benchmark: end -->"
IMAGES = {
    "small": "FROM default\nRUN echo built > /opt/built.txt && rm /etc/debian_version\n",
    "larger": "FROM default\nRUN cp -a /usr/lib/python3 /opt/py && head -c 200M /dev/urandom > /opt/blob\n",
}


def build(api: Api, name: str, dockerfile: str) -> dict:
    r = api.post("/v1/images", json={"name": name, "dockerfile": dockerfile})
    assert r.status_code == 201, r.text
    image_id = r.json()["id"]
    while True:
        j = api.get(f"/v1/images/{image_id}").json()
        if j["state"] not in ("queued", "building"):
            assert j["state"] == "ready", j
            return j
        time.sleep(0.5)


def create(api: Api, image_id: str) -> tuple[float, str]:
    t0 = time.monotonic()
    r = api.post("/v1/sandboxes", json={"image": image_id, "driver": "microvm"})
    took = time.monotonic() - t0
    assert r.status_code == 201 and r.json()["state"] == "running", r.text
    sid = r.json()["id"]
    out = api.post(f"/v1/sandboxes/{sid}:exec", json={"command": "test -e /opt/built.txt || test -s /opt/blob"}).json()
    assert out["exitCode"] == 0, out
    assert api.delete(f"/v1/sandboxes/{sid}").status_code == 200
    return took, sid


def measure(api: Api, d) -> dict:
    results = {}
    for kind, dockerfile in IMAGES.items():
        img = build(api, f"mvm-{kind}", dockerfile)
        first, sid = create(api, img["id"])
        later, _ = create(api, img["id"])
        m = re.search(rf"sandbox {sid}: the image's microvm disk made from its layers \((\d+) ms\)",
                      d.log_path.read_text())
        disk = d.state_dir / "snapshots" / img["snapshotId"] / "upper.ext4"
        st = os.stat(disk)
        results[kind] = {"first": first, "later": later, "made_ms": int(m.group(1)) if m else None,
                         "layers_mib": img["sizeBytes"] / 2**20, "disk_mib": st.st_blocks * 512 / 2**20}
        assert api.post(f"/v1/images/{img['id']}:delete", json={}).status_code == 200
    return results


def render(r: dict) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, "## Images users build, on the microVM (bench/images_microvm.py)", "",
             f"`sudo python3 bench/images_microvm.py` ({now}, {platform.node()}, {os.cpu_count()} cores, TCG; "
             f"load {r['load'][0]:.1f} at the start, {r['load'][1]:.1f} at the end). One build of each image "
             "on the daemon's default driver, then a microVM create from it (its disk made from the layers, "
             "then a boot), an exec and a delete, then a second create (a copy of that disk): the client's "
             "wall clock until the create's answer. Making the disk: the daemon's log line.", "",
             "| image | layers | first microVM create | of which making the disk | a later create | the disk holds |",
             "| --- | --- | --- | --- | --- | --- |"]
    for kind in IMAGES:
        x = r[kind]
        made = f"{x['made_ms']} ms" if x["made_ms"] is not None else "?"
        lines.append(f"| {kind} | {x['layers_mib']:.1f} MiB | {x['first']:.2f} s | {made} | {x['later']:.2f} s "
                     f"| {x['disk_mib']:.1f} MiB |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    ap = options(__doc__, "images microvm", drivers=False)
    args = ap.parse_args()
    if (rc := prepare("images_microvm.py")) != 0:
        return rc
    with bench_daemon("images-microvm", args.image_dir) as d:
        api = Api(d, timeout=600)
        load = os.getloadavg()[0]
        results = measure(api, d)
        results["load"] = (load, os.getloadavg()[0])
        api.close()
    emit(args.out, BEGIN, END, render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
