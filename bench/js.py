#!/usr/bin/env python3
"""create -> first exec result from Node (the TypeScript SDK, sdk/js) next to the same from Python
(the Python SDK), in one run against one daemon, rounds interleaved so that load falls on both.

    sudo python3 bench/js.py                  # writes the JS section of docs/benchmarks.md
    sudo python3 bench/js.py --quick --out -  # fewer runs, print the section

Each client runs in its own long-lived process (node, python3) that makes a sandbox, runs
`true` in it, and deletes it, N times; the time is from the call to create to the exec's
result, measured in that process. The process start and the module imports are not in it.
Needs root, a built tree (it runs `make`), the default image and sdk/js built (`npm ci` there).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "bench"))

from helpers import Daemon, remove_empty_cgroup_tree  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- js benchmark: begin (bench/js.py) -->"
END = "<!-- js benchmark: end -->"

NODE_LOOP = r"""
import { Sandbox } from "withruntime";
const [n, driver] = [Number(process.argv[1]), process.argv[2]];
const out = [];
for (let i = 0; i < n; i++) {
  const t = process.hrtime.bigint();
  const sbx = await Sandbox.create({ driver });
  const r = await sbx.exec(["true"]);
  out.push(Number(process.hrtime.bigint() - t) / 1e6);
  if (r.exitCode !== 0) throw new Error("exit " + r.exitCode);
  await sbx.delete();
  sbx.close();
}
console.log(JSON.stringify(out));
"""

PY_LOOP = r"""
import json, sys, time
from withruntime import Sandbox
n, driver = int(sys.argv[1]), sys.argv[2]
out = []
for _ in range(n):
    t = time.perf_counter()
    sbx = Sandbox.create(driver=driver)
    r = sbx.exec(["true"])
    out.append((time.perf_counter() - t) * 1000)
    assert r.exit_code == 0, r
    sbx.delete()
    sbx.close()
print(json.dumps(out))
"""


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def loop(cmd: list[str], env: dict[str, str], cwd: Path) -> list[list[float]]:
    """The lists of milliseconds the loop printed, one a line."""
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {r.stderr[-3000:]}")
    return [json.loads(line) for line in r.stdout.strip().splitlines()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"),
                    help="the file whose JS section is replaced (appended when absent); - prints it")
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    ap.add_argument("--driver", default="namespace")
    ap.add_argument("--quick", action="store_true", help="fewer runs")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/js.py: run as root (the daemon needs it)", file=sys.stderr)
        return 2
    node = shutil.which("node")
    if not node or not (REPO / "sdk" / "js" / "dist" / "index.js").exists():
        print("bench/js.py: needs node and sdk/js built (cd sdk/js && npm ci)", file=sys.stderr)
        return 2
    rounds, per_round = (3, 5) if args.quick else (6, 10)
    mk = subprocess.run(["make", "-j2"], cwd=REPO, capture_output=True, text=True)
    if mk.returncode != 0:
        print(mk.stdout[-2000:], mk.stderr[-4000:], file=sys.stderr)
        return 1

    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-js-"))
    cg = f"runtime-bench-js-{os.getpid()}"
    d = Daemon(REPO / "build", Path(args.image_dir), tmp / "state", cg)
    results: dict[str, list[float]] = {"node": [], "python": []}
    load0 = os.getloadavg()[0]
    try:
        d.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        env.update(d.env())
        env["PYTHONPATH"] = str(REPO / "sdk" / "python" / "src")
        node_cmd = [node, "--input-type=module", "-e", NODE_LOOP, str(per_round), args.driver]
        py_cmd = [sys.executable, "-c", PY_LOOP, str(per_round), args.driver]
        # A warm-up of each: the first create after a start fills the driver's caches.
        loop(node_cmd[:4] + ["1", args.driver], env, REPO / "sdk" / "js")
        loop(py_cmd[:3] + ["1", args.driver], env, REPO)
        for _ in range(rounds):
            results["node"] += loop(node_cmd, env, REPO / "sdk" / "js")[-1]
            results["python"] += loop(py_cmd, env, REPO)[-1]
    finally:
        if d.alive():
            d.stop()
        remove_empty_cgroup_tree(cg)
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()[0]

    node_v = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    n = len(results["node"])
    lines = [
        BEGIN,
        "## TypeScript SDK next to the Python SDK",
        "",
        f"create -> first exec result (`true`) on {args.driver}, through each SDK, {n} runs each in "
        f"{rounds} interleaved rounds, on {when}; Node {node_v}, Python {sys.version.split()[0]}; "
        f"load average (1 min) {load0:.2f} at the start, {load1:.2f} at the end. Regenerate with:",
        "",
        "```",
        "python3 bench/js.py   # as root, from the repo root, after `cd sdk/js && npm ci`",
        "```",
        "",
        "| client | p50 | p90 | mean |",
        "| --- | --- | --- | --- |",
    ]
    for name in ("node", "python"):
        xs = results[name]
        label = "Node (`withruntime`, sdk/js)" if name == "node" else "Python (`withruntime`, sdk/python)"
        lines.append(f"| {label} | {pct(xs, 50):.1f} ms | {pct(xs, 90):.1f} ms | {statistics.mean(xs):.1f} ms |")
    lines += ["", f"Node / Python at p50: {pct(results['node'], 50) / pct(results['python'], 50):.2f}x. "
              "Both keep their connections to the daemon alive between calls; the Python SDK's pool is "
              "the process's, made on the first request without an SSL context for an http:// daemon "
              "(bench/sdk_start.py measures a whole new process of each).", END]
    emit(args.out, BEGIN, END, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
