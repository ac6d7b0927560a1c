#!/usr/bin/env python3
"""Previews: a request through a preview (the preview listener, then the agent channel) against
the same request through a port forward (the SDK's forward_port: a local port, a WebSocket
tunnel, then the agent channel) and against the same server run on the host, per driver, side by
side in one run (the three interleaved, round after round, in rotating order): the round trip of
a 1 KiB answer on a kept-alive connection, and the throughput of a 32 MiB one.

    sudo python3 bench/previews.py                       # writes its section of docs/benchmarks.md
    sudo python3 bench/previews.py --out -               # print the section
    sudo python3 bench/previews.py --drivers namespace   # only these drivers

Needs root, a built tree (it runs `make`), the default image and httpx.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import httpx

from _harness import DRIVERS, REPO, bench_daemon, options, pct, per_driver, prepare, timed_get
from helpers import Api, free_port, wait_until
from sections import emit

sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
from withruntime import Sandbox  # noqa: E402

BEGIN = "<!-- previews benchmark: begin (bench/previews.py) -->"
END = "<!-- previews benchmark: end -->"
BIG = 32 * 1024 * 1024
ROUNDS = 6
SMALL_ROUNDS = 300

# The same server inside the sandbox and on the host: HTTP/1.1 with keep-alive, a 1 KiB answer
# and a 32 MiB one, written in 1 MiB pieces.
SERVER = r'''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
SMALL = b"x" * 1024
PIECE = b"y" * (1 << 20)
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body go in two writes: without this, Nagle's algorithm holds the body for the
    # client's delayed ACK (40 ms) on whichever path happens not to coalesce them.
    disable_nagle_algorithm = True
    def log_message(self, *a):
        pass
    def do_GET(self):
        n = int(sys.argv[2]) if self.path == "/big" else len(SMALL)
        self.send_response(200)
        self.send_header("Content-Length", str(n))
        self.end_headers()
        if self.path != "/big":
            self.wfile.write(SMALL)
            return
        left = n
        while left:
            self.wfile.write(PIECE[:min(left, len(PIECE))])
            left -= min(left, len(PIECE))
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def measure(d, api: Api, sid: str, host_url: str) -> dict:
    api.put_file(sid, "/workspace/server.py", SERVER.encode()).raise_for_status()
    r = api.post(f"/v1/sandboxes/{sid}/processes", json={"command": f"exec python3 /workspace/server.py 8000 {BIG}"})
    assert r.status_code in (200, 201, 202), r.text
    probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 2).close()'"
    wait_until(lambda: api.exec(sid, command=probe)["exitCode"] == 0, 60, 0.2, what="the server in the sandbox")
    pv = api.post(f"/v1/sandboxes/{sid}/previews", json={"port": 8000}).json()
    host = pv["url"].split("://", 1)[1]
    sbx = Sandbox.connect(sid, api_key=d.api_key, base_url=d.base_url)
    fwd = sbx.forward_port(8000, local_port=0)
    ways = {
        "host": (httpx.Client(timeout=600), host_url, {}),
        "forward": (httpx.Client(timeout=600), f"http://127.0.0.1:{fwd.local_port}", {}),
        "preview": (httpx.Client(timeout=600), f"http://127.0.0.1:{d.preview_port}",
                    {"headers": {"Host": host, "x-runtime-preview-token": pv["token"]}}),
    }
    names = list(ways)
    small = {w: [] for w in names}
    big = {w: [] for w in names}
    for i in range(SMALL_ROUNDS):
        for w in names[i % 3:] + names[:i % 3]:
            c, base, kw = ways[w]
            small[w].append(timed_get(c, base + "/", 1024, **kw) * 1000)
    for i in range(ROUNDS):
        for w in names[i % 3:] + names[:i % 3]:
            c, base, kw = ways[w]
            big[w].append(BIG / timed_get(c, base + "/big", BIG, **kw) / 1e6)
    for c, _, _ in ways.values():
        c.close()
    fwd.close()
    sbx.close()
    out = {}
    for w in names:
        out[f"{w}_p50"] = pct(small[w], 50)
        out[f"{w}_p99"] = pct(small[w], 99)
        out[f"{w}_mbs"] = pct(big[w], 50)
    return out


def render(results: dict, drivers: str) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "sudo python3 bench/previews.py" + ("" if drivers == DRIVERS else f" --drivers {drivers}")
    lines = [BEGIN, "", "## Previews: a request through a preview, a port forward and the bare server", "",
             f"`{command}` ({when}, {platform.node()}, {os.cpu_count()} cores, shared with "
             "other builds and tests while it ran; figures move with that load). The same Python "
             "`http.server` (HTTP/1.1, keep-alive) inside the sandbox and on the host; each way keeps "
             f"one connection. {SMALL_ROUNDS} GETs of a 1 KiB answer and {ROUNDS} of a 32 MiB one each "
             "way, the three ways interleaved in rotating order; medians, and the 99th percentile of the "
             "round trip. `forward` is the SDK's forward_port (a local port and a WebSocket tunnel to "
             "the daemon); `preview` a private preview with its token in the header.", "",
             "| driver | bare on the host, p50 / p99 (ms) | port forward, p50 / p99 (ms) | preview, p50 / p99 (ms) "
             "| bare (MB/s) | port forward (MB/s) | preview (MB/s) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "error" in r:
            lines.append(f"| {drv} | not run: {r['error']} | | | | | |")
        else:
            lines.append(f"| {drv} | {r['host_p50']:.2f} / {r['host_p99']:.2f} "
                         f"| {r['forward_p50']:.2f} / {r['forward_p99']:.2f} "
                         f"| {r['preview_p50']:.2f} / {r['preview_p99']:.2f} "
                         f"| {r['host_mbs']:.0f} | {r['forward_mbs']:.0f} | {r['preview_mbs']:.0f} |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    args = options(__doc__, "previews").parse_args()
    if (rc := prepare("previews.py")) != 0:
        return rc
    results: dict[str, dict] = {}
    port = free_port()
    host_port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "server.py"
        script.write_text(SERVER)
        bare = subprocess.Popen([sys.executable, str(script), str(host_port), str(BIG)])
        try:
            with bench_daemon("previews", args.image_dir, extra_args=["--preview-listen", f"127.0.0.1:{port}"]) as d:
                d.preview_port = port
                api = Api(d, timeout=600)
                for drv, sbx in per_driver(api, args.drivers, results):
                    results[drv] = measure(d, api, sbx.id, f"http://127.0.0.1:{host_port}")
                api.close()
        finally:
            bare.kill()
            bare.wait()
    emit(args.out, BEGIN, END, render(results, args.drivers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
