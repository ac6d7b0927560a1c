#!/usr/bin/env python3
"""Two builds side by side, interleaved (A, B, A, B, ...) so that the load of a shared machine falls
on both alike: the round trip of `true` through the buffered and the streamed exec, the output of a
process writing 100 MiB read through the cursor API, and a bulk transfer through
`runtime sandbox port-forward` both ways. For a change's before and after:

    git worktree add ../runtime-before main && make -C ../runtime-before -j2
    sudo python3 bench/compare.py ../runtime-before/build build --rounds 4

Per round and build it prints: the median round trip of 40 buffered and 40 streamed execs of `true`
(interleaved), the MB/s of the output read by curl into /dev/null (spawn to the
end of the reply), the MB/s of the same process with no reader at all (spawn to its end: the agent
and the channel alone), the daemon's CPU seconds for the curl read, and the MB/s of 100 MiB through
a forwarded port from a server inside (down) and to it (up). Then the medians. Needs root, curl, the
default image, and each build's runtimed, runtime-agent and runtime.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "bench"))

from helpers import Api, Daemon, free_port, remove_empty_cgroup_tree  # noqa: E402
from processes import SIZE, WRITER, round_trips  # noqa: E402
from terminals import SERVER  # noqa: E402
from terminals import SIZE as FORWARD_SIZE  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Side:
    """One build: its daemon, a sandbox, a server inside and two forwards to it."""

    def __init__(self, build: Path, image_dir: Path, driver: str, tag: str):
        self.build = build
        self.tmp = Path(tempfile.mkdtemp(prefix=f"runtime-bench-compare-{tag}-"))
        self.cg = f"runtime-bench-compare-{os.getpid()}-{tag}"
        # A build from before live restore has no --stop-sandboxes-on-exit (and stops its
        # sandboxes at exit anyway).
        helps = subprocess.run([str(build / "runtimed"), "--help"], capture_output=True, text=True)
        self.d = Daemon(build, image_dir, self.tmp / "state", self.cg,
                        keep_sandboxes="--stop-sandboxes-on-exit" not in helps.stdout + helps.stderr)
        self.forwards: list[subprocess.Popen] = []
        self.d.start()
        self.api = Api(self.d, timeout=600)
        self.sid = self.api.create_sandbox(driver=driver, timeoutSeconds=3600).id
        self.api.post(f"/v1/sandboxes/{self.sid}/processes", json={"argv": ["python3", "-c", SERVER]})
        env = {**os.environ, **self.d.env()}
        self.ports = [free_port(), free_port()]
        for local, remote in zip(self.ports, (9100, 9101)):
            self.forwards.append(subprocess.Popen(
                [str(build / "runtime"), "sandbox", "port-forward", self.sid, f"{local}:{remote}"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9101), 2).close()'"
        deadline = time.monotonic() + 120
        while self.api.post(f"/v1/sandboxes/{self.sid}:exec", json={"command": probe}).json()["exitCode"] != 0:
            assert time.monotonic() < deadline, "the server inside did not start"
            time.sleep(0.2)
        for p in self.ports:
            wait_port(p)

    def execs(self) -> tuple[float, float]:
        rt = round_trips(self.api, self.sid, 40)
        return statistics.median(rt["buffered"]), statistics.median(rt["streamed"])

    def no_reader(self) -> float:
        t = time.perf_counter()
        pid = self.api.post(f"/v1/sandboxes/{self.sid}/processes", json={"command": WRITER}).json()["id"]
        info = self.api.post(f"/v1/sandboxes/{self.sid}/processes/{pid}:wait", json={"timeoutMs": 60000}).json()
        assert info["state"] == "exited" and info["outputBytes"] == SIZE, info
        return SIZE / (time.perf_counter() - t) / 1e6

    def curl_read(self) -> tuple[float, float]:
        c0 = cpu_seconds(self.d.pid)
        t = time.perf_counter()
        pid = self.api.post(f"/v1/sandboxes/{self.sid}/processes", json={"command": WRITER}).json()["id"]
        out = subprocess.run(["curl", "-sN", "-o", "/dev/null", "-H", f"Authorization: Bearer {self.d.api_key}",
                              f"{self.d.base_url}/v1/sandboxes/{self.sid}/processes/{pid}/output?cursor=0&follow=true"],
                             capture_output=True, timeout=600)
        secs = time.perf_counter() - t
        assert out.returncode == 0, out
        return SIZE / secs / 1e6, cpu_seconds(self.d.pid) - c0

    def forward(self) -> tuple[float, float]:
        t = time.perf_counter()
        got = 0
        with socket.create_connection(("127.0.0.1", self.ports[0])) as c:
            while chunk := c.recv(1 << 20):
                got += len(chunk)
        assert got == FORWARD_SIZE, got
        down = got / (time.perf_counter() - t) / 1e6
        block = b"b" * (1 << 20)
        t = time.perf_counter()
        with socket.create_connection(("127.0.0.1", self.ports[1])) as c:
            for _ in range(FORWARD_SIZE // len(block)):
                c.sendall(block)
            c.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := c.recv(100):
                answer += chunk
        assert int(answer or b"0") == FORWARD_SIZE, answer
        return down, FORWARD_SIZE / (time.perf_counter() - t) / 1e6

    def close(self) -> None:
        for p in self.forwards:
            p.terminate()
            p.wait(10)
        self.api.close()
        self.d.stop()
        remove_empty_cgroup_tree(self.cg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path, help="the first build directory (before)")
    ap.add_argument("b", type=Path, help="the second build directory (after)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--driver", default="namespace")
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("curl"):
        print("bench/compare.py: run as root, with curl installed", file=sys.stderr)
        return 2
    sides: dict[str, Side] = {}
    rows: dict[str, list[tuple]] = {"A": [], "B": []}
    try:
        for tag, build in (("A", args.a), ("B", args.b)):
            sides[tag] = Side(build.resolve(), Path(args.image_dir), args.driver, tag)
        for r in range(args.rounds):
            for tag, side in sides.items():
                load = os.getloadavg()[0]
                buffered, streamed = side.execs()
                cur, cpu = side.curl_read()
                alone = side.no_reader()
                down, up = side.forward()
                rows[tag].append((buffered, streamed, cur, alone, cpu, down, up, load))
                print(f"round {r} {tag} ({side.build}): exec {buffered:.2f} ms, streamed exec {streamed:.2f} ms; "
                      f"cursor via curl {cur:.0f} MB/s, no reader {alone:.0f} MB/s, "
                      f"daemon CPU {cpu:.2f} s; forward down {down:.0f} MB/s, up {up:.0f} MB/s; load {load:.1f}",
                      flush=True)
    finally:
        for side in sides.values():
            side.close()
    names = ("exec p50 ms", "streamed exec p50 ms", "cursor via curl MB/s", "no reader MB/s", "daemon CPU s",
             "forward down MB/s", "forward up MB/s", "load")
    print("| build | " + " | ".join(names) + " |")
    print("| --- " * (len(names) + 1) + "|")
    for tag in rows:
        med = [statistics.median(x[i] for x in rows[tag]) for i in range(len(names))]
        cells = [f"{m:.2f}" if "CPU" in n or " ms" in n else f"{m:.1f}" if n == "load" else f"{m:.0f}"
                 for n, m in zip(names, med)]
        print(f"| {tag} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
