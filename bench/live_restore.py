#!/usr/bin/env python3
"""Live restore: what a sandbox's supervisor costs on the exec path, and how long a restarted
daemon takes to take its sandboxes back.

    sudo python3 bench/live_restore.py                  # writes its section of docs/benchmarks.md
    sudo python3 bench/live_restore.py --quick --out -  # fewer runs and sandboxes, print the section

1. Round trip of `true` through the buffered and the streamed exec (a kept-alive connection) on a
   daemon whose sandboxes have a supervisor (the default: it keeps a copy of the channel and
   watches the daemon's connection, and hands the channel to the daemon) and on one started with
   --no-live-restore (no supervisor at all), per driver, in rounds that alternate between the two,
   in one run.
2. N namespace sandboxes, each with a background process; runtimed killed with SIGKILL; the time
   from the new runtimed's start to its API answering, which is after every sandbox was re-attached
   (the recovery runs before the API listens), and the same with --no-live-restore, where the
   recovery stops them instead. Every sandbox is checked running (or stopped) afterwards.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _harness import REPO, options, pct, prepare  # noqa: E402
from helpers import Api, Daemon, remove_empty_cgroup_tree, wait_until  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- live restore benchmark: begin (bench/live_restore.py) -->"
END = "<!-- live restore benchmark: end -->"


def daemon(image_dir: str, tag: str, extra: list[str], keep: bool) -> Daemon:
    tmp = Path(tempfile.mkdtemp(prefix=f"runtime-bench-live-{tag}-"))
    d = Daemon(REPO / "build", Path(image_dir), tmp / "state", f"runtime-bench-live-{tag}-{os.getpid()}",
               extra_args=extra, keep_sandboxes=keep)
    d.start()
    return d


def finish(d: Daemon) -> None:
    if not d.alive():
        d.start()
    with d.client(timeout=600) as api:
        for s in api.get("/v1/sandboxes").json().get("sandboxes", []):
            api.delete(f"/v1/sandboxes/{s['id']}")
    d.keep_sandboxes = False
    d.stop()
    d.release_layer_pool()
    remove_empty_cgroup_tree(d.cgroup_parent)


def exec_times(api: Api, sid: str, n: int) -> tuple[list[float], list[float]]:
    """n buffered and n streamed execs of `true`, interleaved: their times in ms."""
    buffered, streamed = [], []
    for _ in range(n):
        t = time.perf_counter()
        r = api.post(f"/v1/sandboxes/{sid}:exec", json={"command": "true"})
        buffered.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text
        t = time.perf_counter()
        evs = [e for _, e in api.exec_stream(sid, command="true")]
        streamed.append((time.perf_counter() - t) * 1000)
        assert evs[-1]["type"] == "exit" and evs[-1]["exitCode"] == 0, evs
    return buffered, streamed


def round_trips(image_dir: str, drivers: list[str], rounds: int, per_round: int) -> dict:
    sup = daemon(image_dir, "sup", [], False)
    direct = daemon(image_dir, "direct", ["--no-live-restore"], False)
    res: dict[str, dict] = {}
    try:
        apis = {"supervised": Api(sup), "direct": Api(direct)}
        for drv in drivers:
            sids = {}
            for name, api in apis.items():
                r = api.post("/v1/sandboxes", json={"driver": drv, "timeoutSeconds": 3600})
                if r.status_code != 201:
                    res[drv] = {"error": r.text[:120]}
                    break
                sids[name] = r.json()["id"]
            if drv in res:
                continue
            times: dict[str, dict[str, list[float]]] = {k: {"buffered": [], "streamed": []} for k in apis}
            for name in apis:  # warm-up
                exec_times(apis[name], sids[name], 5)
            for i in range(rounds):
                order = list(apis) if i % 2 == 0 else list(reversed(list(apis)))
                for name in order:
                    b, st = exec_times(apis[name], sids[name], per_round)
                    times[name]["buffered"] += b
                    times[name]["streamed"] += st
            res[drv] = times
            for name, api in apis.items():
                api.delete(f"/v1/sandboxes/{sids[name]}")
        for api in apis.values():
            api.close()
    finally:
        finish(sup)
        finish(direct)
    return res


def restart_time(image_dir: str, n: int, live: bool) -> dict:
    d = daemon(image_dir, "restart" if live else "restart-off", [] if live else ["--no-live-restore"], True)
    try:
        with d.client(timeout=600) as api:
            sids = []
            for _ in range(n):
                r = api.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 3600,
                                                    "memoryMiB": 128})
                assert r.status_code == 201, r.text
                sid = r.json()["id"]
                r = api.post(f"/v1/sandboxes/{sid}/processes", json={"command": "sleep 100000"})
                assert r.status_code == 201, r.text
                sids.append(sid)
        d.kill()
        t = time.perf_counter()
        d.start(timeout=600)
        took = time.perf_counter() - t
        with d.client(timeout=600) as api:
            states = [api.sandbox(s)["state"] for s in sids]
            kept = 0
            if live:
                for s in sids:
                    procs = api.get(f"/v1/sandboxes/{s}/processes").json()["data"]
                    kept += sum(1 for p in procs if p["state"] == "running")
        want = "running" if live else "stopped"
        assert all(s == want for s in states), states
        return {"n": n, "seconds": took, "states": want, "processes_kept": kept}
    finally:
        finish(d)


def render(rt: dict, restarts: list[dict], rounds: int, per_round: int) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    lines = [BEGIN, "## Live restore: the supervisor on the exec path, and a restart's re-attach", "",
             f"Measured {when} on {platform.node() or 'this host'} ({os.cpu_count()} CPUs) with "
             f"`sudo python3 bench/live_restore.py`.", "",
             f"Round trip of `true` through the buffered and the streamed exec (a kept-alive connection), "
             f"{rounds} alternating rounds of {per_round} of each on each daemon: sandboxes with a supervisor "
             "(the default; it hands the channel to the daemon and is not in a call's path) against "
             "`--no-live-restore` (no supervisor). The two sandboxes of a driver run at once, so gVisor's "
             "absolute figures are above those of its own sections (two Sentries on 2 CPUs); the ratio is "
             "the point.", "",
             "| driver | exec | supervised p50 | p95 | no supervisor p50 | p95 | p50 ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for drv, t in rt.items():
        if "error" in t:
            lines.append(f"| {drv} | {t['error']} | | | | | |")
            continue
        for kind in ("buffered", "streamed"):
            s, dr = t["supervised"][kind], t["direct"][kind]
            lines.append(f"| {drv} | {kind} | {statistics.median(s):.2f} ms | {pct(s, 95):.2f} ms | "
                         f"{statistics.median(dr):.2f} ms | {pct(dr, 95):.2f} ms | "
                         f"{statistics.median(s) / statistics.median(dr):.2f} |")
    lines += ["", "From a SIGKILL of runtimed to the new runtimed's API answering, with N namespace sandboxes "
              "each running a background process (the recovery runs before the API listens):", "",
              "| sandboxes | live restore | start to API | afterwards |", "| --- | --- | --- | --- |"]
    for r in restarts:
        after = (f"all running, {r['processes_kept']} processes kept" if r["states"] == "running"
                 else "all recorded stopped")
        lines.append(f"| {r['n']} | {'on' if r['states'] == 'running' else 'off'} | {r['seconds']:.2f} s | {after} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = options(__doc__, "live restore", quick="20 sandboxes and fewer rounds")
    args = ap.parse_args()
    rc = prepare("live_restore.py")
    if rc:
        return rc
    rounds, per_round = (4, 25) if args.quick else (10, 50)
    n = 20 if args.quick else 100
    drivers = [x for x in args.drivers.split(",") if x and x != "microvm"]
    rt = round_trips(args.image_dir, drivers, rounds, per_round)
    restarts = [restart_time(args.image_dir, n, True), restart_time(args.image_dir, n, False)]
    emit(args.out, BEGIN, END, render(rt, restarts, rounds, per_round))
    return 0


if __name__ == "__main__":
    sys.exit(main())
