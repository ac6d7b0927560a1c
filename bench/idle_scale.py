#!/usr/bin/env python3
"""Many idle sandboxes on one host: what each costs beyond its own processes, what the daemon holds
for them, and an exec's round trip while they idle.

    sudo python3 bench/idle_scale.py                                # 500 namespace, 100 gVisor; writes its section
    sudo python3 bench/idle_scale.py --namespace 50 --gvisor 10 --out -   # a quick look, printed

Per driver, one daemon of this tree's build: first one sandbox and the exec round trip of `true` in
it (quiet: a pause of 20-50 ms before each call, as an agent's calls come); then N sandboxes created
one after another (the create's p50 and p95, and the last tenth's, to show whether creates slow down
as the host fills); a settle of a few seconds; then what the host holds:
  - the sandboxes' memory as their cgroups count it (cgroup v1 `memory.usage_in_bytes` of the
    daemon's cgroup parent, hierarchical: the sandboxes' pages and the kernel memory charged to them),
  - the proportional set size (PSS) of every process the daemon started (bubblewrap, the agents,
    gVisor's sentries and gofers, the egress proxy) and of the daemon itself,
  - the host's MemAvailable drop (noisy on a shared machine; shown for scale),
  - the daemon's threads and open descriptors;
and the exec round trip again, each call in a sandbox picked at random among the N. Then all are
deleted and the daemon's threads and descriptors counted again. Needs root, a built tree (it runs
`make`) and the default image.
"""
from __future__ import annotations

import os
import platform
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from _harness import bench_daemon, options, pct, prepare
from helpers import Api  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- idle scale benchmark: begin (bench/idle_scale.py) -->"
END = "<!-- idle scale benchmark: end -->"
MIB = 1024 * 1024


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def children(root: int) -> list[int]:
    """root and every process below it (by parent links in /proc)."""
    parent: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            for line in (p / "status").read_text().splitlines():
                if line.startswith("PPid:"):
                    parent[int(p.name)] = int(line.split()[1])
                    break
        except OSError:
            pass
    kids: dict[int, list[int]] = {}
    for pid, pp in parent.items():
        kids.setdefault(pp, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def daemon_counts(pid: int) -> tuple[int, int, int]:
    """(threads, open descriptors, PSS) of the daemon itself."""
    threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
    return threads, len(os.listdir(f"/proc/{pid}/fd")), pss(pid)


def cgroup_usage(cg: str) -> int:
    p = Path("/sys/fs/cgroup/memory") / cg / "memory.usage_in_bytes"
    if not p.exists():
        p = Path("/sys/fs/cgroup") / cg / "memory.current"
    try:
        return int(p.read_text())
    except OSError:
        return 0


def cpu_ns(cg: str) -> int:
    """CPU time (ns) the cgroup's tasks have used, cgroup v1 cpuacct or v2 cpu.stat."""
    p = Path("/sys/fs/cgroup/cpuacct") / cg / "cpuacct.usage"
    try:
        if p.exists():
            return int(p.read_text())
        for line in (Path("/sys/fs/cgroup") / cg / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec"):
                return int(line.split()[1]) * 1000
    except OSError:
        pass
    return 0


def exec_rt(api: Api, ids: list[str], calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        sid = random.choice(ids)
        time.sleep(random.uniform(0.020, 0.050))
        t = time.perf_counter()
        r = api.post(f"/v1/sandboxes/{sid}:exec", json={"argv": ["true"]})
        out.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text[:300]
    return out


def run_driver(image_dir: str, driver: str, n: int, calls: int) -> dict:
    limit = str(n + 16)
    with bench_daemon(f"idle-{driver}", image_dir,
                      extra_args=["--max-sandboxes", limit, "--max-sandboxes-per-key", limit]) as d:
        api = Api(d, timeout=300)
        try:
            def create() -> str:
                r = api.post("/v1/sandboxes", json={"driver": driver, "timeoutSeconds": 7200})
                assert r.status_code == 201, f"create #{len(ids) + 1}: {r.status_code} {r.text[:300]}"
                return r.json()["id"]

            ids: list[str] = []
            first = create()
            for _ in range(5):
                exec_rt(api, [first], 1)
            before = {"rt": exec_rt(api, [first], calls)}
            time.sleep(2)
            base_avail = mem_available()
            base_cg = cgroup_usage(d.cgroup_parent)
            base_procs = sum(pss(p) for p in children(d.pid) if p != d.pid)
            base_daemon = daemon_counts(d.pid)
            ids.append(first)
            creates = []
            for _ in range(n - 1):
                t = time.perf_counter()
                ids.append(create())
                creates.append((time.perf_counter() - t) * 1000)
            time.sleep(5)
            # What the idle sandboxes use of the CPU, all of them, over 5 s with no call.
            c0, t0 = cpu_ns(d.cgroup_parent), time.monotonic()
            time.sleep(5)
            idle_cpu = (cpu_ns(d.cgroup_parent) - c0) / ((time.monotonic() - t0) * 1e9)
            procs = children(d.pid)
            held = {
                "avail": base_avail - mem_available(),
                "cg": cgroup_usage(d.cgroup_parent) - base_cg,
                "procs": sum(pss(p) for p in procs if p != d.pid) - base_procs,
                "nprocs": len(procs) - 1,
                "daemon": daemon_counts(d.pid),
                "idle_cpu": idle_cpu,
            }
            for _ in range(5):
                exec_rt(api, ids, 1)
            during = exec_rt(api, ids, calls)
            t = time.perf_counter()
            for sid in ids:
                r = api.delete(f"/v1/sandboxes/{sid}")
                assert r.status_code in (200, 204), r.text[:200]
            deleted_s = time.perf_counter() - t
            time.sleep(2)
            after = daemon_counts(d.pid)
            return {"n": n, "before": before, "base_daemon": base_daemon, "creates": creates,
                    "held": held, "during": during, "deleted_s": deleted_s, "after": after}
        finally:
            api.close()


def render(results: dict, args) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = f"sudo python3 bench/idle_scale.py --namespace {args.namespace} --gvisor {args.gvisor}"
    lines = [BEGIN, "", "## Many idle sandboxes on one host", "",
             f"`{cmd}` ({when}, {platform.node()}, {os.cpu_count()} cores, "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // (1 << 30)} GiB, 1-minute load "
             f"{results.get('load', 0):.1f} at the end). Per driver, one daemon; N sandboxes of the default "
             "image created one after another and left idle. Per sandbox: the memory their cgroups count "
             "(pages and the kernel memory charged to them), the PSS of the processes the daemon started "
             "for them, and the host's MemAvailable drop over N (noisy on a shared machine). Exec `true` "
             f"round trips ({args.calls} calls, each after 20-50 ms of quiet) in one sandbox alone, then in "
             "a random one of the N. Idle CPU: what all N used of one core over 5 s with no call.", ""]
    lines += ["| driver | N | create p50 (last tenth) | cgroup memory / sandbox | processes' PSS / sandbox | "
              "MemAvailable drop / sandbox | idle CPU, all N | exec p50 alone | exec p50 among N (p95) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    daemon_rows = []
    for drv, r in results.get("drivers", {}).items():
        if "error" in r:
            lines.append(f"| {drv} | not run: {r['error']} | | | | | | | |")
            continue
        n = r["n"]
        c = r["creates"] or [0.0]
        tail = c[-max(1, len(c) // 10):]
        h = r["held"]
        lines.append(
            f"| {drv} | {n} | {statistics.median(c):.1f} ms ({statistics.median(tail):.1f} ms) | "
            f"{h['cg'] / (n - 1) / MIB:.2f} MiB | {h['procs'] / (n - 1) / MIB:.2f} MiB | "
            f"{h['avail'] / (n - 1) / MIB:.2f} MiB | {h['idle_cpu'] * 100:.1f}% | "
            f"{statistics.median(r['before']['rt']):.2f} ms | "
            f"{statistics.median(r['during']):.2f} ms ({pct(r['during'], 95):.2f} ms) |")
        bt, bf, bp = r["base_daemon"]
        ht, hf, hp = h["daemon"]
        at, af, _ = r["after"]
        daemon_rows.append(
            f"| {drv} | {n} | {h['nprocs']} | {bt} / {ht} / {at} | {bf} / {hf} / {af} | "
            f"{bp / MIB:.1f} / {hp / MIB:.1f} MiB | {r['deleted_s']:.1f} s |")
    lines += ["", "What the daemon holds: with one sandbox / with N / after deleting them all.", "",
              "| driver | N | processes under the daemon | daemon threads | daemon descriptors | daemon PSS | "
              "deleting all N |", "| --- | --- | --- | --- | --- | --- | --- |", *daemon_rows, "", END]
    return "\n".join(lines)


def main() -> int:
    ap = options(__doc__, "idle scale", drivers=False)
    ap.add_argument("--namespace", type=int, default=500, help="idle namespace sandboxes (default 500; 0 skips)")
    ap.add_argument("--gvisor", type=int, default=100, help="idle gVisor sandboxes (default 100; 0 skips)")
    ap.add_argument("--calls", type=int, default=40, help="exec round trips measured each way (default 40)")
    args = ap.parse_args()
    if (rc := prepare("idle_scale.py")) != 0:
        return rc
    results: dict = {"drivers": {}}
    for drv, n in (("namespace", args.namespace), ("gvisor", args.gvisor)):
        if n < 2:
            continue
        try:
            results["drivers"][drv] = run_driver(args.image_dir, drv, n, args.calls)
        except AssertionError as e:
            results["drivers"][drv] = {"error": str(e)[:160]}
    results["load"] = os.getloadavg()[0]
    emit(args.out, BEGIN, END, render(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
