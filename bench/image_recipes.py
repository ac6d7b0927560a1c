#!/usr/bin/env python3
"""The built-in images' sizes and create -> first exec result on each, against another build of
them (an image directory built from an earlier recipe), side by side in one run.

    sudo python3 bench/image_recipes.py --before OLD_IMAGE_DIR                 # writes its section
    sudo python3 bench/image_recipes.py --before OLD_IMAGE_DIR --quick --out -  # prints it

One daemon per image directory, both running; rounds alternate between them per driver and
image: create a sandbox, exec `true`, delete it. The size is `du` of the image's root
filesystem. Needs root and a built tree.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone

from _harness import bench_daemon, options, pct, prepare
from helpers import Api, daemon_info
from sections import emit

BEGIN = "<!-- image recipes benchmark: begin (bench/image_recipes.py) -->"
END = "<!-- image recipes benchmark: end -->"
IMAGES = ("minimal", "default", "analysis")


def size(image_dir: str, name: str) -> str:
    root = os.path.join(image_dir, name, "rootfs")
    if not os.path.isdir(root):
        return "-"
    kib = int(subprocess.run(["du", "-sk", "--one-file-system", root], capture_output=True,
                             text=True).stdout.split()[0])
    return f"{kib / 1024:.0f} MiB"


def create_exec(api: Api, driver: str, image: str) -> float:
    t = time.perf_counter()
    sbx = api.create_sandbox(driver=driver, image=image)
    r = api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"argv": ["true"]})
    ms = (time.perf_counter() - t) * 1000
    assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text
    api.delete(f"/v1/sandboxes/{sbx.id}")
    return ms


def main() -> int:
    ap = options(__doc__, "image recipes", quick="3 rounds instead of 10")
    ap.add_argument("--before", required=True, help="the image directory of the earlier recipes")
    args = ap.parse_args()
    if (rc := prepare("image_recipes.py")) != 0:
        return rc
    rounds = 3 if args.quick else 10
    dirs = {"before": args.before, "now": args.image_dir}
    rows = []
    with bench_daemon("recipes-before", dirs["before"], extra_args=["--no-interpreter-prestart"]) as b, \
            bench_daemon("recipes-now", dirs["now"], extra_args=["--no-interpreter-prestart"]) as n:
        apis = {"before": Api(b, timeout=600), "now": Api(n, timeout=600)}
        available = {x["name"] for x in daemon_info(n).get("drivers", []) if x.get("available")}
        for driver in [d for d in args.drivers.split(",") if d in available and d != "microvm"]:
            for image in IMAGES:
                have = [k for k in dirs if os.path.isdir(os.path.join(dirs[k], image, "rootfs"))]
                got = {k: [] for k in have}
                for _ in range(rounds):
                    for k in have:
                        got[k].append(create_exec(apis[k], driver, image))
                cells = []
                for k in dirs:
                    xs = sorted(got.get(k, []))
                    cells.append(f"{size(dirs[k], image)} | " +
                                 (f"{xs[len(xs) // 2]:.0f} ms (p90 {pct(xs, 90):.0f})" if xs else "-"))
                rows.append(f"| {driver} | `{image}` | {' | '.join(cells)} |")
                print(rows[-1], file=sys.stderr)
        for api in apis.values():
            api.close()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join([
        BEGIN,
        "## Built-in images: size and create -> first exec, before and after a recipe change",
        "",
        f"{rounds} alternating rounds per driver and image, {when}, {platform.node()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the end; p50 (p90) of a create and an exec of `true` "
        "after it, as a client sees them, on two daemons (`--no-interpreter-prestart`, so that the "
        "kernel's start is no part of either), one per image directory. Size: `du` of the root "
        "filesystem. `-`: no such image in that directory (`minimal` is new).",
        "",
        "| driver | image | size before | create -> first exec before | size now | create -> first exec now |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "`sudo python3 bench/image_recipes.py --before OLD_IMAGE_DIR` rewrites this section.",
        END,
    ])
    emit(args.out, BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
