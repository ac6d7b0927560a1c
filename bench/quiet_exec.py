#!/usr/bin/env python3
"""Exec after a quiet spell: what a command costs in a namespace and a gVisor sandbox when it comes as
an agent's calls come (a pause of 20-50 ms before each, between its model's turns), beside the same
command run on the bare host after the same pause, and beside both back to back.

    sudo python3 bench/quiet_exec.py --image-dir /var/lib/runtime/images        # writes its section
    sudo python3 bench/quiet_exec.py --runs 20 --out - --image-dir ...           # print the section
    sudo python3 bench/quiet_exec.py --runs 40 --breakdown --drivers gvisor      # and where it goes

Per command (`true`, `python3 -c 'print(6*7)'`, the same with Debian's /usr/bin/python3) and round: a random pause of 20-50 ms, the exec
through the API (plain HTTP, the buffered exec), another pause, the same argv as a subprocess on
the host; the two take turns going first. Then the same pairs back to back. Medians, p95s and the
ratio sandbox/host of the medians. With --breakdown, bench/exec_probe.c (built static here) runs as
root in each sandbox and times children started the agent's ways, from the clone to the reap: a
dynamic `true`, a static binary, a task that execs nothing, and one that joins the commands' cgroup
(gVisor's) first. Needs root, a built tree (it runs `make`) and the default image.
"""
from __future__ import annotations

import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _harness import REPO, bench_daemon, options, pct, per_driver, prepare
from helpers import Api  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- quiet exec benchmark: begin (bench/quiet_exec.py) -->"
END = "<!-- quiet exec benchmark: end -->"
# The host's `python3` may be another build with its own site-packages; /usr/bin/python3 is
# Debian's on both sides (the image's release and the host's), like for like.
COMMANDS = {"true": ["true"], "python3 -c 'print(6*7)'": ["python3", "-c", "print(6*7)"],
            "/usr/bin/python3 -c 'print(6*7)'": ["/usr/bin/python3", "-c", "print(6*7)"]}


def sandbox_once(api: Api, sid: str, argv: list[str]) -> float:
    t = time.perf_counter()
    r = api.post(f"/v1/sandboxes/{sid}:exec", json={"argv": argv})
    ms = (time.perf_counter() - t) * 1000
    assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text[:300]
    return ms


def host_once(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t) * 1000


def measure(api: Api, sid: str, argv: list[str], runs: int, quiet: bool) -> dict[str, list[float]]:
    """runs pairs (sandbox, host), interleaved, each after a 20-50 ms pause when quiet."""
    out: dict[str, list[float]] = {"sandbox": [], "host": []}
    for i in range(runs):
        order = ("sandbox", "host") if i % 2 == 0 else ("host", "sandbox")
        for side in order:
            if quiet:
                time.sleep(random.uniform(0.020, 0.050))
            out[side].append(sandbox_once(api, sid, argv) if side == "sandbox" else host_once(argv))
    return out


def build_probe(tmp: Path) -> Path | str:
    """bench/exec_probe.c built static into tmp (no library of the sandbox's needed), or why not."""
    out = tmp / "exec_probe"
    r = subprocess.run(["cc", "-O2", "-static", "-o", str(out), str(REPO / "bench" / "exec_probe.c")],
                       capture_output=True, text=True)
    return out if r.returncode == 0 else f"cc -static failed: {r.stderr.strip()[:200]}"


def probe(api: Api, sid: str, binary: Path, runs: int) -> dict[str, list[tuple[str, float, float]]]:
    """The probe's lines (way, p50, p90) in the sandbox, quiet and back to back."""
    r = api.put_file(sid, "/tmp/exec_probe", binary.read_bytes(), mode="755")
    assert r.status_code == 200, r.text[:300]
    out = {}
    for mode, quiet in (("quiet", "1"), ("back to back", "0")):
        r = api.post(f"/v1/sandboxes/{sid}:exec", json={"argv": ["/tmp/exec_probe", str(runs), quiet],
                                                         "user": "root", "timeoutMs": 600_000})
        assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text[:300]
        out[mode] = [(w, float(a), float(b)) for w, a, b in
                     (line.split("\t") for line in r.json()["stdout"].strip().splitlines())]
    return out


def render(results: dict, args) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = f"sudo python3 bench/quiet_exec.py --runs {args.runs} --drivers {args.drivers}" + \
        (" --breakdown" if args.breakdown else "")
    loads = ", ".join(f"{d} {r['load']:.1f}" for d, r in results.items() if "load" in r)
    lines = [BEGIN, "", "## Exec after a quiet spell", "",
             f"`{cmd}` ({when}, {platform.node()}, {os.cpu_count()} cores, 1-minute load at the end of "
             f"each driver's run: {loads or 'n/a'}). Round trip through the API (plain HTTP, buffered exec) "
             "of each command in a running sandbox, and the same argv as a subprocess on the host, "
             f"{args.runs} of each, interleaved; quiet: a pause of 20-50 ms before every call, as an agent's "
             "calls come; back to back: no pause. ms; ratio: sandbox p50 / host p50. `python3` is the "
             "image's in the sandbox and the host's own on the host, which need not be the same build (a "
             "host's python3 with many site packages starts slower); `/usr/bin/python3` is Debian's build "
             "on both sides, like for like. `true` is the sandbox's own cost.", "",
             "| driver | command | calls | sandbox p50 | sandbox p95 | host p50 | host p95 | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for drv, res in results.items():
        if "error" in res:
            lines.append(f"| {drv} | not run: {res['error']} | | | | | | |")
        for name, by in res.get("rows", {}).items():
            for mode in ("quiet", "back to back"):
                s, h = by[mode]["sandbox"], by[mode]["host"]
                lines.append(f"| {drv} | `{name}` | {mode} | {statistics.median(s):.2f} | {pct(s, 95):.2f} | "
                             f"{statistics.median(h):.2f} | {pct(h, 95):.2f} | "
                             f"{statistics.median(s) / statistics.median(h):.2f} |")
    probes = {d: r["probe"] for d, r in results.items() if "probe" in r}
    if probes:
        lines += ["", "Inside the sandbox (bench/exec_probe.c, as root, "
                  f"{args.runs} of each way, taking turns): a child started as the agent starts one "
                  "(clone with CLONE_VM and CLONE_VFORK), timed from the clone to its reap; ms, p50 (p90).", "",
                  "| driver | child | quiet | back to back |", "| --- | --- | --- | --- |"]
        for drv, pr in probes.items():
            if isinstance(pr, str):
                lines.append(f"| {drv} | not run: {pr} | | |")
                continue
            for (way, q50, q90), (_, b50, b90) in zip(pr["quiet"], pr["back to back"]):
                lines.append(f"| {drv} | {way} | {q50:.2f} ({q90:.2f}) | {b50:.2f} ({b90:.2f}) |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    ap = options(__doc__, "quiet exec", drivers=False)
    ap.add_argument("--runs", type=int, default=30, help="calls of each command, each side (default 30)")
    ap.add_argument("--drivers", default="namespace,gvisor")
    ap.add_argument("--breakdown", action="store_true", help="also run bench/exec_probe.c in each sandbox")
    args = ap.parse_args()
    if (rc := prepare("quiet_exec.py")) != 0:
        return rc
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-quiet-exec-"))
    binary = build_probe(tmp) if args.breakdown else None
    results: dict = {}
    with bench_daemon("quiet-exec", args.image_dir, tmp) as d:
        api = Api(d, timeout=120)
        for drv, sbx in per_driver(api, args.drivers, results):
            rows: dict = {}
            for name, argv in COMMANDS.items():
                for _ in range(5):  # warm up: the page cache, the agent's first fork
                    sandbox_once(api, sbx.id, argv)
                    host_once(argv)
                rows[name] = {"quiet": measure(api, sbx.id, argv, args.runs, True),
                              "back to back": measure(api, sbx.id, argv, args.runs, False)}
            results[drv] = {"rows": rows, "load": os.getloadavg()[0]}
            if binary is not None:
                results[drv]["probe"] = probe(api, sbx.id, binary, args.runs) if isinstance(binary, Path) \
                    else binary
        api.close()
    emit(args.out, BEGIN, END, render(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
