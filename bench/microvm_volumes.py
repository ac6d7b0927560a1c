#!/usr/bin/env python3
"""microVM volumes: create -> first exec of a microVM sandbox with one volume against one without,
and against one created without it that then attaches it (`:attach`, into an empty disk slot of
the running guest), side by side in one run (taking turns, round after round, on one daemon).
Without volumes a create restores its shape's template; with one it boots, the volume a disk of
the guest from the first (docs/microvm.md, "Volumes"). The first create without volumes makes
the template and is left out. Each time ends with `true` run in the volume's directory.

    sudo python3 bench/microvm_volumes.py --image-dir DIR         # writes its section of docs/benchmarks.md
    sudo python3 bench/microvm_volumes.py --image-dir DIR --out - # print the section

DIR is an image directory of your own with the default image built: the run makes a template of
its shape there. Needs root and a built tree (it runs `make`).
"""
from __future__ import annotations

import json
import platform
import sys
import time
from datetime import datetime, timezone

from _harness import bench_daemon, options, pct, prepare
from helpers import Api
from sections import emit

BEGIN = "<!-- microvm volumes benchmark: begin (bench/microvm_volumes.py) -->"
END = "<!-- microvm volumes benchmark: end -->"
ROUNDS = 6


def create_exec(api: Api, attach: str | None = None, **fields) -> float:
    """Seconds from the create's request to the end of `true` in the new sandbox (with attach, a
    volume's id: after its :attach at /data); it is deleted."""
    t = time.perf_counter()
    sbx = api.create_sandbox(driver="microvm", timeoutSeconds=600, **fields)
    if attach:
        r = api.post(f"/v1/volumes/{attach}:attach", json={"sandboxId": sbx.id, "path": "/data"})
        assert r.status_code == 201, r.text
    out = api.exec(sbx.id, argv=["true"], **({"cwd": "/data"} if attach or fields else {}))
    took = time.perf_counter() - t
    assert out["exitCode"] == 0, out
    api.delete(f"/v1/sandboxes/{sbx.id}")
    api.created.remove(sbx.id)
    return took


def render(res: dict, accel: str) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    lines = [BEGIN, "", "## microVM: create with a volume against without", "",
             f"`sudo python3 bench/microvm_volumes.py --image-dir DIR` ({when}, {platform.node()}, "
             f"{ROUNDS} creates of each, taking turns; create -> first `true` in the volume's directory, "
             f"in seconds). "
             f"Accelerator: {accel or 'unknown'}.", "",
             "| create | start | median | p90 |", "| --- | --- | --- | --- |",
             f"| no volume | template restore | {pct(res['none'], 50):.2f} | {pct(res['none'], 90):.2f} |",
             f"| one 64 MiB volume | boot | {pct(res['vol'], 50):.2f} | {pct(res['vol'], 90):.2f} |",
             f"| no volume, then `:attach` of one 64 MiB volume | template restore, disk slot | "
             f"{pct(res['live'], 50):.2f} | {pct(res['live'], 90):.2f} |",
             "", END]
    return "\n".join(lines)


def main() -> int:
    ap = options(__doc__, "microvm volumes", drivers=False)
    args = ap.parse_args()
    rc = prepare("microvm_volumes.py")
    if rc:
        return rc
    res: dict = {"none": [], "vol": [], "live": []}
    with bench_daemon("microvm-volumes", args.image_dir) as d:
        api = Api(d, timeout=600)
        info = {x["name"]: x for x in api.get("/v1/info").json().get("drivers", [])}
        mv = info.get("microvm", {})
        if not mv.get("available"):
            print(f"bench/microvm_volumes.py: the microvm driver is unavailable: {mv}", file=sys.stderr)
            return 1
        accel = mv.get("reason") or mv.get("detail") or ""
        vol = api.post("/v1/volumes", json={"sizeMiB": 64})
        assert vol.status_code == 201, vol.text
        vid = vol.json()["id"]
        create_exec(api)  # makes the shape's template
        for i in range(ROUNDS):
            order = [("none", None, {}), ("vol", None, {"volumes": [{"volumeId": vid, "path": "/data"}]}),
                     ("live", vid, {})]
            for name, attach, fields in order[i % 3:] + order[:i % 3]:
                res[name].append(create_exec(api, attach, **fields))
        api.post(f"/v1/volumes/{vid}:delete", json={"force": True})
        api.close()
    print(json.dumps(res), file=sys.stderr)
    emit(args.out, BEGIN, END, render(res, accel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
