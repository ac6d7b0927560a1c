#!/usr/bin/env python3
"""Exec after a quiet spell: what a command costs in a namespace and a gVisor sandbox when it comes as
an agent's calls come (a pause of 20-50 ms before each, between its model's turns), beside the same
command run on the bare host after the same pause, and beside both back to back.

    sudo python3 bench/quiet_exec.py --image-dir /var/lib/runtime/images        # writes its section
    sudo python3 bench/quiet_exec.py --runs 20 --out - --image-dir ...           # print the section
    sudo python3 bench/quiet_exec.py --runs 40 --breakdown --drivers gvisor      # and where it goes

Per command (`true`, `python3 -c 'print(6*7)'`, the same with Debian's /usr/bin/python3) and round: a random pause of 20-50 ms, the exec
through the API (plain HTTP, the buffered exec) with the tests' client (httpx) and again with a lean
one (a kept-alive socket, the request made ahead), another pause, the same argv as a subprocess on
the host; they take turns going first. Then the same pairs back to back. Medians, p95s and the
ratio sandbox/host of the medians. With --breakdown, bench/exec_probe.c (built static here) runs as
root in each sandbox and times children started the agent's ways, from the clone to the reap: a
dynamic `true` by its path and through a search of PATH (as the agent's `execvpe` finds it), a static
binary, a task that execs nothing, one that joins the commands' cgroup
(gVisor's) first, and Debian's python3; then the same probe on the bare host and, for gVisor, in a
plain `runsc do` of the same runsc and platform: the limits, with none of our code in them. Needs root, a built tree (it runs `make`) and the default image.
"""
from __future__ import annotations

import os
import json
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _harness import REPO, bench_daemon, options, pct, per_driver, prepare
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
from withruntime import Sandbox  # noqa: E402
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


class LeanClient:
    """The same buffered exec over one kept-alive socket with the request made ahead: plain HTTP
    with none of a Python HTTP library's own time (about 1.4 ms a call with httpx here), so that
    what is left is the daemon's, the agent's and the command's."""

    def __init__(self, d, sid: str, argv: list[str]):
        host, port = d.base_url.split("//")[1].split(":")
        self.host, self.key = host, d.api_key
        self.target(sid, argv)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def target(self, sid: str, argv: list[str]) -> None:
        """The request made ahead for argv in sandbox sid (the connection stays)."""
        body = json.dumps({"argv": argv}).encode()
        self.req = (f"POST /v1/sandboxes/{sid}:exec HTTP/1.1\r\nHost: {self.host}\r\n"
                    f"Authorization: Bearer {self.key}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    def once(self) -> float:
        t = time.perf_counter()
        self.sock.sendall(self.req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            assert chunk, "the daemon closed the connection"
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += self.sock.recv(65536)
        ms = (time.perf_counter() - t) * 1000
        assert head.startswith(b"HTTP/1.1 200") and json.loads(rest)["exitCode"] == 0, (head, rest[:300])
        return ms

    def close(self) -> None:
        self.sock.close()


class SdkClient:
    """The same exec through our Python SDK's blocking client (``Sandbox.exec``), as an agent's
    tool calls it: its own keep-alive connection, no httpx."""

    def __init__(self, d, sid: str, argv: list[str]):
        self.sbx = Sandbox.connect(sid, api_key=d.api_key, base_url=d.base_url)
        self.argv = argv

    def once(self) -> float:
        t = time.perf_counter()
        r = self.sbx.exec(self.argv)
        ms = (time.perf_counter() - t) * 1000
        assert r.exit_code == 0, r
        return ms

    def close(self) -> None:
        self.sbx.close()


def host_once(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t) * 1000


def measure(api: Api, lean: LeanClient, sdk: SdkClient, sid: str, argv: list[str], runs: int,
            quiet: bool) -> dict[str, list[float]]:
    """runs rounds of (sandbox, lean client, SDK, host), interleaved, each after a 20-50 ms pause
    when quiet."""
    calls = {"sandbox": lambda: sandbox_once(api, sid, argv), "lean": lean.once, "sdk": sdk.once,
             "host": lambda: host_once(argv)}
    out: dict[str, list[float]] = {side: [] for side in calls}
    for i in range(runs):
        order = ("sandbox", "lean", "sdk", "host") if i % 2 == 0 else ("host", "sdk", "lean", "sandbox")
        for side in order:
            if quiet:
                time.sleep(random.uniform(0.020, 0.050))
            out[side].append(calls[side]())
    return out


def build_probe(tmp: Path) -> Path | str:
    """bench/exec_probe.c built static into tmp (no library of the sandbox's needed), or why not."""
    out = tmp / "exec_probe"
    r = subprocess.run(["cc", "-O2", "-static", "-o", str(out), str(REPO / "bench" / "exec_probe.c")],
                       capture_output=True, text=True)
    return out if r.returncode == 0 else f"cc -static failed: {r.stderr.strip()[:200]}"


def probe_lines(text: str) -> list[tuple[str, float, float]]:
    return [(w, float(a), float(b)) for w, a, b in (line.split("\t") for line in text.strip().splitlines())]


def probe(api: Api, sid: str, binary: Path, runs: int) -> dict[str, list[tuple[str, float, float]]]:
    """The probe's lines (way, p50, p90) in the sandbox, quiet and back to back."""
    r = api.put_file(sid, "/tmp/exec_probe", binary.read_bytes(), mode="755")
    assert r.status_code == 200, r.text[:300]
    out = {}
    for mode, quiet in (("quiet", "1"), ("back to back", "0")):
        r = api.post(f"/v1/sandboxes/{sid}:exec", json={"argv": ["/tmp/exec_probe", str(runs), quiet],
                                                         "user": "root", "timeoutMs": 600_000})
        assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text[:300]
        out[mode] = probe_lines(r.json()["stdout"])
    return out


def probe_host(binary: Path, runs: int, wrapper: list[str] | None = None) -> dict[str, list[tuple[str, float, float]]]:
    """The same probe on the bare host, or under wrapper (`runsc do`): the limit of each way."""
    return {mode: probe_lines(subprocess.run([*(wrapper or []), str(binary), str(runs), quiet], check=True,
                                             capture_output=True, text=True, timeout=900).stdout)
            for mode, quiet in (("quiet", "1"), ("back to back", "0"))}


def runsc_do() -> list[str] | None:
    """`runsc do` as the gVisor driver runs runsc (its binary and platform, no network), or None."""
    runsc = os.environ.get("RUNTIME_RUNSC") or shutil.which("runsc")
    if not runsc:
        return None
    platform_ = os.environ.get("RUNTIME_GVISOR_PLATFORM", "systrap")
    return [runsc, f"--platform={platform_}", "--network=none", "do"]


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
             "on both sides, like for like. `true` is the sandbox's own cost. Lean: the same exec "
             "through one kept-alive socket with the request made ahead, without the Python HTTP "
             "library (httpx) of the sandbox column, whose own time is about 1.4 ms a call. SDK: the "
             "same exec through our Python SDK's blocking client (`Sandbox.exec`, its own kept-alive "
             "connection), what an agent's tool calls. The host's side is Python's `subprocess.run` "
             "either way.", "",
             "| driver | command | calls | sandbox p50 | sandbox p95 | lean p50 | lean p95 | SDK p50 | "
             "SDK p95 | host p50 | host p95 | ratio | lean ratio | SDK ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for drv, res in results.items():
        if "error" in res:
            lines.append(f"| {drv} | not run: {res['error']} | | | | | | | | | | | | |")
        for name, by in res.get("rows", {}).items():
            for mode in ("quiet", "back to back"):
                sides = [by[mode][k] for k in ("sandbox", "lean", "sdk", "host")]
                h = statistics.median(sides[3])
                lines.append(f"| {drv} | `{name}` | {mode} | "
                             + " | ".join(f"{statistics.median(v):.2f} | {pct(v, 95):.2f}" for v in sides) + " | "
                             + " | ".join(f"{statistics.median(v) / h:.2f}" for v in sides[:3]) + " |")
    probes = {d: (r["probe"], r.get("probe_host")) for d, r in results.items() if "probe" in r}
    probes.update({f"{d}: `runsc do`": (r["probe_runsc"], r.get("probe_host"))
                   for d, r in results.items() if "probe_runsc" in r})
    if probes:
        lines += ["", "Inside the sandbox (bench/exec_probe.c, as root, "
                  f"{args.runs} of each way, taking turns): a child started as the agent starts one "
                  "(clone with CLONE_VM and CLONE_VFORK), timed from the clone to its reap; ms, p50 (p90). "
                  "The same probe on the bare host is each way's limit; ratio: the sandbox's quiet p50 over "
                  "the host's, with no daemon, channel or agent in either. `runsc do`: the probe in a plain "
                  "gVisor sandbox of the same runsc and platform, run right after, with no Runtime code at "
                  "all: gVisor's own cost.", "",
                  "| driver | child | quiet | back to back | host quiet | host back to back | ratio (quiet) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for drv, (pr, host) in probes.items():
            if isinstance(pr, str):
                lines.append(f"| {drv} | not run: {pr} | | | | | |")
                continue
            for i, ((way, q50, q90), (_, b50, b90)) in enumerate(zip(pr["quiet"], pr["back to back"])):
                hq = host["quiet"][i] if host else (way, float("nan"), float("nan"))
                hb = host["back to back"][i] if host else hq
                lines.append(f"| {drv} | {way} | {q50:.2f} ({q90:.2f}) | {b50:.2f} ({b90:.2f}) | "
                             f"{hq[1]:.2f} ({hq[2]:.2f}) | {hb[1]:.2f} ({hb[2]:.2f}) | {q50 / hq[1]:.2f} |")
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
                lean, sdk = LeanClient(d, sbx.id, argv), SdkClient(d, sbx.id, argv)
                for _ in range(5):  # warm up: the page cache, the agent's first fork
                    sandbox_once(api, sbx.id, argv)
                    lean.once()
                    sdk.once()
                    host_once(argv)
                rows[name] = {"quiet": measure(api, lean, sdk, sbx.id, argv, args.runs, True),
                              "back to back": measure(api, lean, sdk, sbx.id, argv, args.runs, False)}
                lean.close()
                sdk.close()
            results[drv] = {"rows": rows, "load": os.getloadavg()[0]}
            if binary is not None:
                results[drv]["probe"] = probe(api, sbx.id, binary, args.runs) if isinstance(binary, Path) \
                    else binary
                if isinstance(binary, Path):  # the limits, taken right after the sandbox's
                    results[drv]["probe_host"] = probe_host(binary, args.runs)
                    if drv == "gvisor" and (wrapper := runsc_do()):
                        results[drv]["probe_runsc"] = probe_host(binary, args.runs, wrapper)
        api.close()
    emit(args.out, BEGIN, END, render(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
