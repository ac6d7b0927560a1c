#!/usr/bin/env python3
"""A new process that creates a sandbox, runs `true` in it and deletes it, through each client,
side by side in one run against one daemon, rounds interleaved so that load falls on all alike.

    sudo python3 bench/sdk_start.py                         # writes its section of docs/benchmarks.md
    sudo python3 bench/sdk_start.py --rounds 10 --out -     # fewer rounds, print the section
    sudo python3 bench/sdk_start.py --before ../runtime-before   # and another tree's Python SDK beside

Each sample is one fresh process (or three, for curl), timed by this script from its start to its
exit: the interpreter's start, the imports, the three calls and the exit are all in it.

  curl        three curl processes (create, exec `true`, delete): the daemon's own time, and
              about what a client that starts at once pays;
  python      `python3 -c` importing this tree's SDK (sdk/python) and making the three calls;
  published   the published client `withruntime` 0.35.0, in the venv of its own that the
              integration tests build (tests/integration/helpers/published.py), when there is one;
  node        `node -e` importing this tree's TypeScript SDK (sdk/js, built) and the same calls;
  before      with --before TREE: that tree's Python SDK, as `python`.

and, for reference, each interpreter starting and importing nothing. The Python SDKs run in a venv
of this interpreter made for the run, with this interpreter's site-packages on PYTHONPATH for
httpx (so that no .pth hook of the host runs in every process: the published client's venv has
none either), and their bytecode written once beforehand, as an installed package has it. The daemon's default driver is
--driver (namespace), so no client names one. Needs root, a built tree (it runs `make`), the
default image, curl, and for node sdk/js built (`cd sdk/js && npm ci`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from _harness import bench_daemon, options, pct, prepare  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- sdk start benchmark: begin (bench/sdk_start.py) -->"
END = "<!-- sdk start benchmark: end -->"

PY_CALLS = """
from withruntime import Sandbox
sbx = Sandbox.create()
assert sbx.exec(["true"]).exit_code == 0
sbx.delete()
"""

NODE_CALLS = """
import { Sandbox } from "withruntime";
const sbx = await Sandbox.create();
const r = await sbx.exec(["true"]);
if (r.exitCode !== 0) throw new Error("exit " + r.exitCode);
await sbx.delete();
sbx.close();
"""

LABELS = {
    "curl": "curl: create, exec, delete (3 processes)",
    "python": "Python SDK (sdk/python), `python3 -c`",
    "before": "Python SDK of --before, `python3 -c`",
    "published": "published client 0.35.0, `python3 -c`",
    "node": "TypeScript SDK (sdk/js), `node -e`",
    "python bare": "`python3 -c pass` (interpreter start only)",
    "node bare": "`node -e ''` (interpreter start only)",
}


class Clients:
    """How to run each client once against the daemon, and its samples in seconds."""

    def __init__(self, daemon, python: str, before: Path | None, node: str | None) -> None:
        self.daemon = daemon
        self.python = python
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("RUNTIME_") and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
        # The SDK's dependencies (httpx) from this interpreter's site-packages, on the path
        # without running that directory's .pth hooks.
        deps = sysconfig.get_paths()["purelib"]
        self.env = {**base, **daemon.env(), "PYTHONPATH": f"{REPO / 'sdk' / 'python' / 'src'}{os.pathsep}{deps}"}
        self.runs: dict[str, tuple[list[str], dict[str, str], Path | None]] = {
            "python": ([python, "-c", PY_CALLS], self.env, None),
            "python bare": ([python, "-c", "pass"], self.env, None),
        }
        if before is not None:
            env = {**self.env, "PYTHONPATH": f"{before / 'sdk' / 'python' / 'src'}{os.pathsep}{deps}"}
            self.runs["before"] = ([python, "-c", PY_CALLS], env, None)
        venv = published_venv()
        if venv is not None:
            env = {**base, "RUNTIME_API_URL": daemon.base_url, "RUNTIME_API_KEY": daemon.api_key or ""}
            self.runs["published"] = ([str(venv / "bin" / "python"), "-I", "-c", PY_CALLS], env, Path("/"))
        if node is not None:
            self.runs["node"] = ([node, "--input-type=module", "-e", NODE_CALLS], self.env, REPO / "sdk" / "js")
            self.runs["node bare"] = ([node, "-e", ""], self.env, None)
        self.names = ["curl", *self.runs]
        self.samples: dict[str, list[float]] = {n: [] for n in self.names}

    def once(self, name: str) -> float:
        if name == "curl":
            return self._curl()
        argv, env, cwd = self.runs[name]
        t = time.perf_counter()
        r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
        took = time.perf_counter() - t
        if r.returncode != 0:
            raise RuntimeError(f"{name} failed ({r.returncode}): {r.stderr[-3000:]}")
        return took

    def _curl(self) -> float:
        url, key = self.daemon.base_url, self.daemon.api_key
        head = ["curl", "-sS", "--fail-with-body", "-H", f"Authorization: Bearer {key}",
                "-H", "Content-Type: application/json"]

        def call(*args: str) -> str:
            r = subprocess.run([*head, *args], capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise RuntimeError(f"curl {' '.join(args)} failed: {r.stdout[-500:]} {r.stderr[-500:]}")
            return r.stdout

        t = time.perf_counter()
        sid = json.loads(call("-d", "{}", f"{url}/v1/sandboxes"))["id"]
        exit_code = json.loads(call("-d", '{"argv":["true"]}', f"{url}/v1/sandboxes/{sid}:exec"))["exitCode"]
        call("-X", "DELETE", f"{url}/v1/sandboxes/{sid}")
        took = time.perf_counter() - t
        assert exit_code == 0
        return took


def published_venv() -> Path | None:
    """The published client's venv when the integration tests have built it, else None."""
    from helpers.published import DEFAULT_DIR, MARKER

    venv = Path(os.environ.get("RUNTIME_TEST_PUBLISHED_CLIENT_DIR", DEFAULT_DIR))
    return venv if (venv / MARKER).exists() and (venv / "bin" / "python").exists() else None


def import_ms(python: str, env: dict[str, str], runs: int) -> float:
    """The p50 of `python3 -X importtime -c 'import withruntime'`'s cumulative microseconds for
    the package, in milliseconds."""
    out = []
    for _ in range(runs):
        r = subprocess.run([python, "-X", "importtime", "-c", "import withruntime"], env=env,
                           capture_output=True, text=True, timeout=120)
        line = [x for x in r.stderr.splitlines() if x.rstrip().endswith("| withruntime")][-1]
        out.append(int(line.split("|")[1]) / 1000)
    return pct(out, 50)


def compile_sdk(tree: Path) -> None:
    """Bytecode written once, as pip writes it at install."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "sdk" / "python" / "src")],
                   check=True, capture_output=True)


def main() -> int:
    ap = options(__doc__, "SDK start", drivers=False)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--driver", default="namespace", help="the daemon's default driver")
    ap.add_argument("--before", type=Path, help="another tree whose Python SDK runs beside this one's")
    args = ap.parse_args()
    rc = prepare("sdk_start.py")
    if rc:
        return rc
    if not shutil.which("curl"):
        print("bench/sdk_start.py: needs curl", file=sys.stderr)
        return 2
    node = shutil.which("node")
    if node and not (REPO / "sdk" / "js" / "dist" / "index.js").exists():
        print("bench/sdk_start.py: sdk/js is not built (cd sdk/js && npm ci); node left out", file=sys.stderr)
        node = None
    before = args.before.resolve() if args.before else None
    compile_sdk(REPO)
    if before is not None:
        compile_sdk(before)

    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-sdk-start-"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    python = str(tmp / "venv" / "bin" / "python")
    load0 = os.getloadavg()
    with bench_daemon("sdk-start", args.image_dir, tmp=tmp, extra_args=["--driver", args.driver]) as d:
        clients = Clients(d, python, before, node)
        for name in clients.names:  # a warm-up of each, not counted
            clients.once(name)
        for i in range(args.rounds):
            k = i % len(clients.names)
            for name in clients.names[k:] + clients.names[:k]:
                clients.samples[name].append(clients.once(name))
        imports = {"python": import_ms(python, clients.env, 15)}
        if before is not None:
            imports["before"] = import_ms(python, clients.runs["before"][1], 15)
    load1 = os.getloadavg()
    shutil.rmtree(tmp, ignore_errors=True)

    ms = {n: [x * 1000 for x in xs] for n, xs in clients.samples.items()}
    curl50, curl90 = pct(ms["curl"], 50), pct(ms["curl"], 90)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    node_v = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip() if node else "-"
    lines = [
        BEGIN,
        "## A new process: create, exec `true`, delete",
        "",
        f"Each client in a fresh process making the three calls against one daemon ({args.driver}), "
        f"{args.rounds} interleaved rounds on {when}; Python {sys.version.split()[0]}, Node {node_v}, "
        f"{os.cpu_count()} CPUs shared with other work: load average (1, 5 min) "
        f"{load0[0]:.2f}, {load0[1]:.2f} at the start and {load1[0]:.2f}, {load1[1]:.2f} at the end. "
        "Times from the process's start to its exit, as the bench sees them. Regenerate with:",
        "",
        "```",
        "python3 bench/sdk_start.py   # as root, from the repo root, after `cd sdk/js && npm ci`"
        + ("; --before TREE for another tree's Python SDK beside it" if before is not None else ""),
        "```",
        "",
        "| client | p50 | p90 | p50 over curl | p90 over curl |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in clients.names:
        xs = ms[name]
        bare = name == "curl" or name.endswith(" bare")
        over = "" if bare else f"{pct(xs, 50) - curl50:+.1f} ms"
        over90 = "" if bare else f"{pct(xs, 90) - curl90:+.1f} ms"
        lines.append(f"| {LABELS[name]} | {pct(xs, 50):.1f} ms | {pct(xs, 90):.1f} ms | {over} | {over90} |")
    if before is not None:
        rev = subprocess.run(["git", "-C", str(before), "log", "-1", "--format=%h (%cs)"], capture_output=True,
                             text=True).stdout.strip()
        lines += ["", f"--before: the Python SDK of commit {rev or 'unknown'}."]
    py_over = pct(ms["python"], 50) - curl50
    lines += [
        "",
        f"The Python SDK's process is {py_over:.1f} ms over curl's three at p50 (the target is at most "
        f"150 ms). `python3 -X importtime -c 'import withruntime'`: {imports['python']:.1f} ms cumulative "
        "at p50 of 15" + (f" ({imports['before']:.1f} ms for --before)." if "before" in imports else ".")
        + " Of a client's time, the `bare` row is its interpreter's start and curl's is about the "
        "daemon's work; the rest is the import and the client's own requests.",
        END,
    ]
    emit(args.out, BEGIN, END, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
