#!/usr/bin/env python3
"""Images users build: a Dockerfile of five steps after its FROM (ENV, WORKDIR, COPY and two RUNs,
the first of which takes 2 s, as an install would) built cold, rebuilt unchanged (a hit of the
build cache: a new version sharing the first one's disk), rebuilt unchanged with `cache: false`
(every step run: what a rebuild cost before the caches), and rebuilt after a change to its last
step (the per-step layers: the steps before it are found and only the last runs), through
the API with the context uploaded by digest (a rebuild's chunks are there already); then the disk
that ten images built on one base take, as the sizes of their disks (each a snapshot of the build's
writable layer) against the base image's tree, and the disk ten cached rebuilds of one image add
(`du` of the snapshots' directory, which counts a hard-linked layer once). Each round's steps
differ from the others' (its ENV), so that its cold build finds no layer of theirs. Builds run on
the daemon's default driver.

Then what per-step layers cost a cold build (no layer found): a Dockerfile of eight RUN steps
after its FROM built cold on a daemon that keeps layers and on one that keeps none
(`--image-layer-max-mib-per-owner 0`: the image's disk is the build's only snapshot), the two
daemons taking turns, and on a third whose tree is given by --baseline-build (another commit's
build directory, e.g. the one before a change to the builder), so that before and after are in
one run. Last, on this tree and on --baseline-build's, a rebuild after a change to a file a later
COPY takes (the earlier COPY's layer found in a context that changed).

    sudo python3 bench/images.py              # writes its two sections of docs/benchmarks.md
    sudo python3 bench/images.py --out -      # print them
    sudo python3 bench/images.py --cold-only --baseline-build OLD/build   # the cold builds only
    sudo python3 bench/images.py --copy-only --baseline-build OLD/build   # the copied file's rebuild only

Needs root, a built tree (it runs `make`), the default image and httpx.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import platform
import re
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _harness import bench_daemon, options, prepare
from helpers import Api
from sections import emit

BEGIN = "<!-- images benchmark: begin (bench/images.py) -->"
END = "<!-- images benchmark: end -->"
COLD_BEGIN = "<!-- images cold benchmark: begin (bench/images.py) -->"
COLD_END = "<!-- images cold benchmark: end -->"
COPY_BEGIN = "<!-- images copy benchmark: begin (bench/images.py) -->"
COPY_END = "<!-- images copy benchmark: end -->"
ROUNDS = 3
COLD_ROUNDS = 5
COLD_STEPS = 8

DOCKERFILE = """\
FROM default
ENV APP=/app ROUND={round}
WORKDIR /app
COPY app.py ./
RUN sleep 2 && python3 -m py_compile app.py && python3 app.py > out.txt
RUN echo {last} > last.txt
"""


def context(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0)


def du(path: Path) -> int:
    r = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True)
    return int(r.stdout.split()[0]) if r.returncode == 0 else 0


def build(api: Api, name: str, dockerfile: str, archive: bytes, **extra) -> tuple[float, dict]:
    """Seconds from the upload's start to the image ready, and the image."""
    t0 = time.monotonic()
    digest = hashlib.sha256(archive).hexdigest()
    missing = api.post("/v1/images/context/missing", json={"digests": [digest]}).json()["missing"]
    if missing:
        assert api.put(f"/v1/images/context/{digest}", content=archive).status_code == 200
    r = api.post("/v1/images", json={"name": name, "dockerfile": dockerfile, "context": {
        "archive": {"sha256": digest, "size": len(archive), "chunks": [digest]}, "files": []}, **extra})
    assert r.status_code == 201, r.text
    image_id = r.json()["id"]
    while True:
        image = api.get(f"/v1/images/{image_id}").json()
        if image["state"] not in ("queued", "building"):
            break
        time.sleep(0.05)
    assert image["state"] == "ready", image
    return time.monotonic() - t0, image


def measure(api: Api, image_dir: str, state_dir: str) -> dict:
    archive = context({"app.py": b"print(sum(range(1000)))\n"})
    out: dict = {"cold": [], "unchanged": [], "no_cache": [], "last_changed": []}
    for i in range(ROUNDS):
        name = f"bench-{i}"
        s, _ = build(api, name, DOCKERFILE.format(round=i, last=f"one-{i}"), archive)
        out["cold"].append(s)
        s, image = build(api, name, DOCKERFILE.format(round=i, last=f"one-{i}"), archive)
        out["unchanged"].append(s)
        out.setdefault("unchanged_build_ms", []).append(image["buildMs"])
        s, _ = build(api, name, DOCKERFILE.format(round=i, last=f"one-{i}"), archive, cache=False)
        out["no_cache"].append(s)
        s, _ = build(api, name, DOCKERFILE.format(round=i, last=f"changed-{i}"), archive)
        out["last_changed"].append(s)
    snapshots = Path(state_dir) / "snapshots"
    before = du(snapshots)
    ids = [build(api, "cached-ten", DOCKERFILE.format(round="ten", last="ten"), archive)[1]["id"]]
    first = du(snapshots)
    for _ in range(9):
        ids.append(build(api, "cached-ten", DOCKERFILE.format(round="ten", last="ten"), archive)[1]["id"])
    out["cached_ten"] = {"first": first - before, "nine_more": du(snapshots) - first}
    for image_id in ids:
        api.post(f"/v1/images/{image_id}:delete", json={})
    out["cached_ten"]["after_delete"] = du(snapshots) - before
    sizes = []
    for i in range(10):
        _, image = build(api, f"ten-{i}", DOCKERFILE.format(round="images", last=f"image-{i}"), archive)
        sizes.append(image["sizeBytes"])
    base = subprocess.run(["du", "-sb", str(Path(image_dir) / "default" / "rootfs")], capture_output=True,
                          text=True)
    out["ten_sizes"] = sizes
    out["base_bytes"] = int(base.stdout.split()[0]) if base.returncode == 0 else None
    out["driver"] = api.get("/v1/info").json().get("defaultDriver")
    return out


def cold_dockerfile(tag: str) -> str:
    """COLD_STEPS quick RUN steps after FROM default; tag (in an ENV before them) makes each
    build's layer keys its own, so no build finds another's layers."""
    return f"FROM default\nENV ROUND={tag}\n" + "".join(f"RUN echo {i} > /step{i}\n" for i in range(COLD_STEPS))


def measure_cold(apis: dict[str, Api]) -> dict:
    """Each daemon's cold builds of cold_dockerfile, the daemons taking turns in each round: the
    seconds from the upload to ready, and the worker's buildMs."""
    archive = context({"app.py": b"print(1)\n"})
    out: dict = {label: {"s": [], "ms": []} for label in apis}
    for i in range(COLD_ROUNDS):
        for label, api in apis.items():
            s, image = build(api, f"cold-{i}", cold_dockerfile(f"{label}-{i}-{time.time_ns()}"), archive)
            out[label]["s"].append(s)
            out[label]["ms"].append(image["buildMs"])
    return out


# A rebuild after a change to a copied file: the first COPY's layer is found in a context that changed,
# the second COPY's sources are the change.
COPY_DOCKERFILE = """\
FROM default
ENV ROUND={round}
RUN echo one > /one
COPY a.txt /a.txt
RUN echo two > /two
COPY b.txt /b.txt
RUN cat /a.txt /b.txt > /ab
"""


def measure_copy(apis: dict[str, Api]) -> dict:
    """Each daemon's rebuild after a change to the file its second COPY takes (cold first, then
    changed), the daemons taking turns: seconds from the upload to ready, and the worker's buildMs."""
    out: dict = {label: {"s": [], "ms": []} for label in apis}
    for i in range(COLD_ROUNDS):
        for label, api in apis.items():
            dockerfile = COPY_DOCKERFILE.format(round=f"{label}-{i}-{time.time_ns()}")
            build(api, f"copy-{i}", dockerfile, context({"a.txt": b"a\n", "b.txt": b"b\n"}))
            s, image = build(api, f"copy-{i}", dockerfile, context({"a.txt": b"a\n", "b.txt": f"b{i}\n".encode()}))
            out[label]["s"].append(s)
            out[label]["ms"].append(image["buildMs"])
    return out


COLD_LABELS = {
    "off": "no layers kept (`--image-layer-max-mib-per-owner 0`): the image's disk the only snapshot",
    "baseline": "per-step layers, the --baseline-build tree",
    "on": "per-step layers, this tree",
}


def render_cold(r: dict, baseline: str | None) -> str:
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "sudo python3 bench/images.py" + (f" --baseline-build <a tree of {baseline}>/build" if baseline else "")
    lines = [COLD_BEGIN, "## What per-step layers cost a cold build (bench/images.py)", "",
             f"{when}, {platform.node()}, the daemon's default driver ({r.get('driver')}), 1-minute load "
             f"{r['load'][0]:.1f} at the start and {r['load'][1]:.1f} at the end; `{cmd}`. "
             f"FROM default, an ENV, then {COLD_STEPS} RUN steps (`echo i > /stepi`), built cold (no layer "
             f"found) {COLD_ROUNDS} times on each daemon, the daemons taking turns; medians of the worker's "
             "`buildMs` and of the seconds from the context's upload to the image ready. The cost per step is "
             "the median's difference to the daemon that keeps no layers, over the steps.", "",
             "| daemon | buildMs median | all | per step over no layers | upload to ready, median |",
             "| --- | --- | --- | --- | --- |"]
    off = med(r["cold"]["off"]["ms"]) if "off" in r["cold"] else None
    for label, row in r["cold"].items():
        m = med(row["ms"])
        per = f"{(m - off) / COLD_STEPS:+.0f} ms" if off is not None and label != "off" else "-"
        name = COLD_LABELS[label].replace("the --baseline-build tree", baseline or "") if label == "baseline" \
            else COLD_LABELS[label]
        lines.append(f"| {name} | {m} ms | {', '.join(str(x) for x in row['ms'])} | {per} | {med(row['s']):.2f} s |")
    lines.append(COLD_END)
    return "\n".join(lines) + "\n"


def render_copy(r: dict, baseline: str | None) -> str:
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "sudo python3 bench/images.py --copy-only" + (f" --baseline-build <a tree of {baseline}>/build"
                                                         if baseline else "")
    lines = [COPY_BEGIN, "## A rebuild after a change to a copied file (bench/images.py)", "",
             f"{when}, {platform.node()}, the daemon's default driver ({r.get('driver')}), 1-minute load "
             f"{r['load'][0]:.1f} at the start and {r['load'][1]:.1f} at the end; `{cmd}`. FROM default, an "
             "ENV, RUN, COPY a.txt, RUN, COPY b.txt, RUN, built cold then rebuilt with b.txt changed (the "
             f"first COPY's layer found in a context that changed), {COLD_ROUNDS} times on each daemon, the "
             "daemons taking turns; medians of the rebuild's `buildMs` and of the seconds from the context's "
             "upload to the image ready.", "",
             "| daemon | rebuild buildMs median | all | upload to ready, median |", "| --- | --- | --- | --- |"]
    for label, row in r["copy"].items():
        name = COLD_LABELS[label].replace("the --baseline-build tree", baseline or "") if label == "baseline" \
            else COLD_LABELS[label]
        lines.append(f"| {name} | {med(row['ms'])} ms | {', '.join(str(x) for x in row['ms'])} | "
                     f"{med(row['s']):.2f} s |")
    lines.append(COPY_END)
    return "\n".join(lines) + "\n"


def render(r: dict) -> str:
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mib = lambda b: f"{b / 1048576:.1f} MiB"  # noqa: E731
    lines = [BEGIN, "## Images users build (bench/images.py)", "",
             f"{when}, {platform.node()}, the daemon's default driver ({r.get('driver')}), 1-minute load "
             f"{r['load'][0]:.1f} at the start and {r['load'][1]:.1f} at the end; "
             "`sudo python3 bench/images.py`. "
             f"Five steps after FROM default (ENV, WORKDIR, COPY, two RUNs, the first taking 2 s as an "
             f"install would), {ROUNDS} rounds, median "
             "seconds from the context's upload to the image ready, side by side in one run against "
             "the target of an unchanged rebuild (under 3 s).", "",
             "| build | median | all |", "| --- | --- | --- |"]
    for key, label in (("cold", "cold"), ("unchanged", "rebuilt unchanged (cached)"),
                       ("no_cache", "rebuilt unchanged with cache: false (every step)"),
                       ("last_changed", "rebuilt after a change to its last step (the earlier steps' "
                                        "layers found, the last step run)")):
        lines.append(f"| {label} | {med(r[key]):.2f} s | {', '.join(f'{x:.2f}' for x in r[key])} |")
    lines += ["", f"A cached rebuild's own `buildMs` (the worker's time, no sandbox started): "
              f"{', '.join(str(x) for x in r['unchanged_build_ms'])} ms."]
    c = r["cached_ten"]
    lines += ["", f"Ten builds of one image, the nine last cached: the first added {mib(c['first'])} to the "
              f"snapshots' directory (its disk and the layers of its steps not found), the nine cached ones "
              f"{mib(c['nine_more'])} (their disks are links of the first's); all ten deleted, "
              f"{mib(c['after_delete'])} is left of them (the layers, kept to their bound)."]
    total = sum(r["ten_sizes"])
    lines += ["", f"Ten images on one base: their disks take {mib(total)} in all "
              f"({mib(min(r['ten_sizes']))} to {mib(max(r['ten_sizes']))} each), the base's tree "
              f"{mib(r['base_bytes']) if r['base_bytes'] else 'unknown'} once: each image keeps only "
              "what its build wrote over the base.", END]
    return "\n".join(lines) + "\n"


def baseline_rev(build_dir: Path) -> str:
    """The commit a baseline tree was made from: its git HEAD, else a commit id in the tree's name
    (a `git archive` of it unpacked in a directory so named), else the name."""
    r = subprocess.run(["git", "-C", str(build_dir.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                       text=True)
    if r.returncode == 0 and r.stdout.strip():
        return r.stdout.strip()
    m = re.search(r"[0-9a-f]{7,40}", build_dir.parent.name)
    return m.group(0) if m else build_dir.parent.name


def side_by_side(args, key: str, measure_fn, with_off: bool) -> tuple[dict, str | None]:
    """measure_fn over this tree's daemon, --baseline-build's when given and (with_off) one that
    keeps no layers, all started at once: its results under key, the driver and the load."""
    baseline = Path(args.baseline_build).resolve() if args.baseline_build else None
    with contextlib.ExitStack() as stack:
        daemons = {}
        if with_off:
            daemons["off"] = stack.enter_context(bench_daemon("images-off", args.image_dir,
                                                              extra_args=["--image-layer-max-mib-per-owner", "0"]))
        if baseline:
            daemons["baseline"] = stack.enter_context(bench_daemon("images-baseline", args.image_dir,
                                                                   build_dir=baseline))
        daemons["on"] = stack.enter_context(bench_daemon("images-on", args.image_dir))
        apis = {label: stack.enter_context(contextlib.closing(Api(d, timeout=600))) for label, d in daemons.items()}
        load = os.getloadavg()[0]
        results = {key: measure_fn(apis), "driver": apis["on"].get("/v1/info").json().get("defaultDriver")}
        results["load"] = (load, os.getloadavg()[0])
    return results, baseline_rev(baseline) if baseline else None


def cold(args) -> None:
    results, baseline = side_by_side(args, "cold", measure_cold, with_off=True)
    emit(args.out, COLD_BEGIN, COLD_END, render_cold(results, baseline))


def copy(args) -> None:
    results, baseline = side_by_side(args, "copy", measure_copy, with_off=False)
    emit(args.out, COPY_BEGIN, COPY_END, render_copy(results, baseline))


def main() -> int:
    ap = options(__doc__, "images", drivers=False)
    ap.add_argument("--baseline-build", help="the build directory of another tree, whose daemon builds the cold "
                                             "builds too (before and after a change, in one run)")
    ap.add_argument("--cold-only", action="store_true", help="only the cold builds' section")
    ap.add_argument("--copy-only", action="store_true", help="only the section of a rebuild after a change to a "
                                                             "copied file")
    args = ap.parse_args()
    if (rc := prepare("images.py")) != 0:
        return rc
    if args.copy_only:
        copy(args)
        return 0
    if not args.cold_only:
        with bench_daemon("images", args.image_dir) as d:
            api = Api(d, timeout=600)
            load = os.getloadavg()[0]
            results = measure(api, args.image_dir, d.state_dir)
            results["load"] = (load, os.getloadavg()[0])
            api.close()
        emit(args.out, BEGIN, END, render(results))
    cold(args)
    copy(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
