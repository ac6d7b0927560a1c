#!/usr/bin/env python3
"""Create and exec round trips of two builds side by side, interleaved (A, B, A, B, ...) so that the
load of a shared machine falls on both alike. For a change's before and after:

    git worktree add ../runtime-before <commit> && make -C ../runtime-before -j2
    sudo python3 bench/create_exec.py ../runtime-before/build build --rounds 40

Per round and build, on one driver (namespace unless --driver): a create to its first exec result
(`true`), then exec `true` in that running sandbox after a quiet spell of --quiet-ms (20 ms: an
agent's calls come between its model's turns, not back to back), again after a quiet spell through
a lean client (quiet_exec.py's: one socket, the request made ahead, none of httpx's time) and once
back to back, then the delete. The builds take turns going first (A B, B A, ...). With --otel-b, B pushes an OpenTelemetry
export to a collector on loopback every second (and with --readings-every-second reads its
sandboxes every second, not every minute). Prints the p50 and p90 of each figure per build and the ratio B/A of the p50s. Needs root,
the default image and each build's runtimed, runtime-agent and runtime-egress.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from helpers import Api, Daemon, remove_empty_cgroup_tree  # noqa: E402
from quiet_exec import LeanClient  # noqa: E402

FIGURES = ("create to first exec", "exec true after quiet", "exec true after quiet, lean client",
           "exec true back to back", "delete")


COLLECTOR = r"""
import signal, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
pushes = 0
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_POST(self):
        global pushes
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        pushes += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(httpd.server_address[1], flush=True)
def done(*_):
    print(pushes, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
httpd.serve_forever()
"""


class Collector:
    """An OTLP/HTTP receiver on loopback that takes every push and counts it: a process of its own,
    so that serving a push never holds this one's interpreter while it times a call."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", COLLECTOR], stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"
        self.pushes = 0

    def close(self) -> None:
        self.proc.terminate()
        out = self.proc.stdout.readline().strip()
        self.proc.wait(timeout=10)
        self.pushes = int(out) if out.isdigit() else -1


class Side:
    def __init__(self, build: Path, image_dir: Path, tag: str, driver: str, otel: Collector | None = None,
                 every_second: bool = False, otel_interval: int = 1):
        self.tmp = Path(tempfile.mkdtemp(prefix=f"runtime-bench-ce-{tag}-"))
        self.cg = f"runtime-bench-ce-{os.getpid()}-{tag}"
        # With a collector: the export pushes each second (its default is 10), and with
        # every_second the daemon reads every sandbox each second too (its default is 60).
        extra = ["--webhook-allow-cidr", "127.0.0.0/8", "--otel-interval-seconds", str(otel_interval)] if otel else []
        if otel and every_second:
            extra += ["--sandbox-metrics-interval-seconds", "1"]
        self.d = Daemon(build, image_dir, self.tmp / "state", self.cg, extra_args=extra)
        self.d.start()
        self.api = Api(self.d, timeout=600)
        if otel:
            r = self.api.post("/v1/otel-exports", json={"endpoint": otel.url, "headers": {"Authorization": "x"}})
            assert r.status_code == 201, r.text
        self.driver = driver
        self.lean: LeanClient | None = None
        self.samples: dict[str, list[float]] = {f: [] for f in FIGURES}

    def round(self, quiet_s: float) -> None:
        t = time.perf_counter()
        r = self.api.post("/v1/sandboxes", json={"driver": self.driver, "timeoutSeconds": 600})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert self.api.exec(sid, command="true")["exitCode"] == 0
        self.samples["create to first exec"].append(time.perf_counter() - t)
        time.sleep(quiet_s)
        t = time.perf_counter()
        assert self.api.exec(sid, argv=["true"])["exitCode"] == 0
        self.samples["exec true after quiet"].append(time.perf_counter() - t)
        if self.lean is None:  # one connection for the run, as a client keeps one
            self.lean = LeanClient(self.d, sid, ["true"])
        self.lean.target(sid, ["true"])
        time.sleep(quiet_s)
        self.samples["exec true after quiet, lean client"].append(self.lean.once() / 1000)
        t = time.perf_counter()
        assert self.api.exec(sid, argv=["true"])["exitCode"] == 0
        self.samples["exec true back to back"].append(time.perf_counter() - t)
        t = time.perf_counter()
        r = self.api.delete(f"/v1/sandboxes/{sid}")
        assert r.status_code == 200, r.text
        self.samples["delete"].append(time.perf_counter() - t)

    def close(self) -> None:
        if self.lean:
            self.lean.close()
        self.api.close()
        self.d.stop()
        remove_empty_cgroup_tree(self.cg)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build_a", type=Path, help="the build before (its build/ directory)")
    ap.add_argument("build_b", type=Path, help="the build after")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--driver", default="namespace")
    ap.add_argument("--quiet-ms", type=float, default=20.0)
    ap.add_argument("--otel-b", action="store_true",
                    help="B with an OpenTelemetry export to a collector on loopback, pushed every second (events "
                         "and the audit trail are always on where the build has them)")
    ap.add_argument("--otel-interval", type=int, default=1, help="with --otel-b: seconds between pushes")
    ap.add_argument("--readings-every-second", action="store_true",
                    help="with --otel-b: B reads every sandbox every second, not every minute")
    ap.add_argument("--image-dir", type=Path,
                    default=Path(os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images")))
    args = ap.parse_args()
    collector = Collector() if args.otel_b else None
    sides = [Side(args.build_a.resolve(), args.image_dir, "a", args.driver),
             Side(args.build_b.resolve(), args.image_dir, "b", args.driver, collector, args.readings_every_second,
                  args.otel_interval)]
    try:
        for s in sides:  # a warm-up round each, not counted
            s.round(args.quiet_ms / 1000)
            for f in FIGURES:
                s.samples[f].clear()
        for i in range(args.rounds):
            # A B, then B A: whichever goes second runs just after the other's round (its
            # delete, its layer's replenishing), so each build takes each place as often.
            for s in (sides if i % 2 == 0 else sides[::-1]):
                s.round(args.quiet_ms / 1000)
    finally:
        for s in sides:
            s.close()
        if collector:
            collector.close()
    print(f"{args.rounds} rounds, driver {args.driver}, quiet {args.quiet_ms:g} ms; "
          f"A = {args.build_a}, B = {args.build_b}"
          + (f" with an OpenTelemetry export ({collector.pushes} pushes taken)" if collector else ""))
    print(f"{'figure':<26} {'A p50 ms':>9} {'A p90 ms':>9} {'B p50 ms':>9} {'B p90 ms':>9} {'B/A p50':>8}")
    for f in FIGURES:
        a, b = sides[0].samples[f], sides[1].samples[f]
        a50, b50 = statistics.median(a) * 1000, statistics.median(b) * 1000
        print(f"{f:<26} {a50:9.2f} {pct(a, 0.9) * 1000:9.2f} {b50:9.2f} {pct(b, 0.9) * 1000:9.2f} "
              f"{b50 / a50:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
