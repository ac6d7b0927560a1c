"""The egress proxy's bounds: a pool of worker threads with a per-sandbox
share (--egress-workers, --egress-workers-per-sandbox), connections past the
share waiting, past the waiting room refused with a 503 and an audit entry.

A hostile sandbox opens as many relay connections as it likes; the daemon's
thread count must stay under the documented bound throughout: its threads
before the connections, plus two per worker (the worker and the proxy's
helper for one direction of a tunnel), plus the refuser.

No traffic leaves the machine: the upstream is a server of this module on
127.0.0.1, reached as echo.test through --egress-test-upstream.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from conftest import DRIVERS, MICROVM_SKIP, RUN_ALL, _finish_daemon, _need_root
from egress_servers import EchoServer
from helpers import Api, Daemon, DaemonError, skip_unless_driver, tail, wait_until

WORKERS = 16
SHARE = 8
WAIT_PER_SANDBOX = 128  # egress_service.c: WAIT_PER_SANDBOX (the agent holds 256 streams)
# Threads the daemon may add while a test drives it, besides egress: the
# HTTP connection serving the exec and its helpers.
EXEC_SLACK = 8

CLIENT = r'''
import asyncio, json, sys

N, CONC, MODE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

async def one(i, sem, counts):
    async with sem:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", 3128), 120)
        except Exception as e:
            counts["connect:" + type(e).__name__] = counts.get("connect:" + type(e).__name__, 0) + 1
            return
        try:
            if MODE == "get":
                w.write(("GET http://echo.test/c%d HTTP/1.1\r\nHost: echo.test\r\n"
                         "Connection: close\r\n\r\n" % i).encode())
                await w.drain()
            # An idle connection waits for what the proxy says, then gives up.
            data = await asyncio.wait_for(r.read(), 300 if MODE == "get" else 15)
            key = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.") else "none"
            if key == "503" and b"too many connections" not in data:
                key = "503-other"
        except Exception as e:
            key = "io:" + type(e).__name__
        finally:
            w.close()
        counts[key] = counts.get(key, 0) + 1

async def main():
    sem = asyncio.Semaphore(CONC)
    counts = {}
    await asyncio.gather(*(one(i, sem, counts) for i in range(N)))
    print(json.dumps(counts))

asyncio.run(main())
'''


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError(f"no Threads in /proc/{pid}/status")


class Sampler:
    """The highest Threads of a process, sampled every 10 ms until stopped."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = threads_of(pid)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, threads_of(self.pid))
                self.samples += 1
            except (FileNotFoundError, ProcessLookupError):
                return
            self._stop.wait(0.01)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def env(build_dir, image_dir, tmp_path_factory):
    _need_root()
    tmp = tmp_path_factory.mktemp("egress-privsep")
    echo = EchoServer().start()
    d = Daemon(build_dir, image_dir, tmp / "state", f"runtime-test-{os.getpid()}-egress-privsep",
               extra_args=["--egress-test-upstream", f"echo.test=127.0.0.1:{echo.port}",
                           "--egress-workers", str(WORKERS),
                           "--egress-workers-per-sandbox", str(SHARE)])
    try:
        d.start()
    except DaemonError as err:
        echo.stop()
        pytest.fail(str(err), pytrace=False)
    yield d, echo
    if d.alive():
        with d.client() as c:
            for s in c.get("/v1/sandboxes").json().get("sandboxes", []):
                c.delete(f"/v1/sandboxes/{s['id']}")
    _finish_daemon(d)
    echo.stop()


@pytest.fixture
def eapi(env):
    d, echo = env
    c = Api(d)
    echo.clear()
    yield c
    problems = c.delete_all()
    c.close()
    assert d.alive(), f"runtimed died during the test; log:\n{tail(d.log_path)}"
    assert not problems, problems


@pytest.fixture(params=DRIVERS)
def edriver(request, env) -> str:
    skip_unless_driver(env[0], request.param)
    if request.param == "microvm" and not RUN_ALL:
        pytest.skip(MICROVM_SKIP)
    return request.param


def egress_log(api: Api, sid: str) -> list[dict]:
    r = api.get(f"/v1/sandboxes/{sid}/egress", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def run_client(sbx, n: int, conc: int, mode: str, timeout_s: int) -> dict:
    sbx.write("/tmp/flood.py", CLIENT.encode())
    res = sbx.exec(f"python3 /tmp/flood.py {n} {conc} {mode}", timeoutMs=timeout_s * 1000)
    assert res["exitCode"] == 0, res
    return json.loads(res["stdout"].strip().splitlines()[-1])


@pytest.mark.slow
def test_five_thousand_connections_stay_in_the_pool(eapi, edriver, env):
    d, echo = env
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    assert sbx.run("echo ready").strip() == "ready"
    base = threads_of(d.pid)
    bound = base + 2 * WORKERS + 1 + EXEC_SLACK
    n, conc = 5000, 100  # 100 at once: within the share and its waiting room
    with Sampler(d.pid) as s:
        counts = run_client(sbx, n, conc, "get", timeout_s=1500)
    assert counts == {"200": n}, counts
    assert len(echo.seen()) == n
    assert s.samples > 10, "the sampler never ran"
    assert s.peak <= bound, (f"runtimed reached {s.peak} threads serving {conc} concurrent egress "
                             f"connections; the bound is {bound} ({base} before)")
    print(f"runtimed threads: {base} before, peak {s.peak}, bound {bound} ({s.samples} samples)")


def test_past_the_waiting_room_refused_with_an_audit_entry(eapi, edriver, env):
    d, _ = env
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    # Connections that never send a request hold the share's workers until
    # the proxy gives up on them; the next 128 wait; the rest are refused at
    # once with a 503 that says why, and each refusal is in the audit log.
    extra = 40
    n = SHARE + WAIT_PER_SANDBOX + extra
    base = threads_of(d.pid)
    with Sampler(d.pid) as s:
        counts = run_client(sbx, n, n, "idle", timeout_s=600)
    assert counts.get("503", 0) >= extra, counts
    assert "503-other" not in counts, counts
    assert s.peak <= base + 2 * WORKERS + 1 + EXEC_SLACK, (s.peak, base)
    entries = wait_until(
        lambda: [e for e in egress_log(eapi, sbx.id) if "too many connections" in e["reason"]] or None,
        timeout=30, what="refusals in the audit log")
    e = entries[0]
    assert e["allowed"] is False and e["kind"] == "none", e
    assert "--egress-workers-per-sandbox" in e["reason"], e
    # The sandbox and the pool are fine afterwards.
    out = sbx.exec("curl -sS --max-time 60 -o /dev/null -w '%{http_code}' http://echo.test/after",
                   timeoutMs=90000)
    assert out["stdout"].strip() == "200", out


def test_pool_flags_are_validated(build_dir):
    for bad in (["--egress-workers", "0"], ["--egress-workers", "5000"],
                ["--egress-workers-per-sandbox", "0"], ["--egress-workers", "x"]):
        p = subprocess.run([str(build_dir / "runtimed"), *bad, "--help"], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 2, (bad, p.returncode, p.stdout[-300:], p.stderr[-300:])
        assert "--egress-workers" in p.stderr, (bad, p.stderr)
