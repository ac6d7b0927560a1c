"""The egress proxy's privilege separation and bounds.

The proxy runs as a process of its own (runtime-egress), started by the
daemon, as a user other than root with no capability in any set, no way back
to them (no_new_privs) and none of the daemon's files; killed, it is started
again, its open connections end cleanly and new ones work.

Connections come from a pool of worker threads with a per-sandbox share
(--egress-workers, --egress-workers-per-sandbox): past the share they wait,
past the waiting room they are refused with a 503 and an audit entry. A
hostile sandbox opens as many relay connections as it likes; the thread
counts must stay under the documented bound throughout: for the daemon, its
threads before the connections plus two per worker (the worker and the pump
towards the sandbox) plus the refuser; for the proxy, two per connection it
serves (at most --egress-workers) plus its main thread.

No traffic leaves the machine: the upstream is a server of this module on
127.0.0.1, reached as echo.test through --egress-test-upstream.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import threading
import time

import pytest

from conftest import DRIVERS, MICROVM_SKIP, RUN_ALL, _finish_daemon, _need_root
from egress_servers import EchoServer
from helpers import (REPO, Api, Daemon, DaemonError, host_pids, proc_comm, skip_unless_driver, tail,
                     wait_until)

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


def proxy_pid(d: Daemon) -> int:
    """The daemon's runtime-egress child."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue
        if st.get("Name") == "runtime-egress" and int(st.get("PPid", "0")) == d.pid:
            return int(entry)
    raise AssertionError(f"runtimed {d.pid} has no runtime-egress child; log:\n{tail(d.log_path)}")


def status_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


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


def _daemon_with_echo(build_dir, image_dir, tmp_path_factory, name: str, pool_args: list[str]):
    """A daemon of its own whose echo.test reaches a local echo server, with
    the egress pool flags given; yields (daemon, echo), then ends both."""
    _need_root()
    tmp = tmp_path_factory.mktemp(name)
    echo = EchoServer().start()
    d = Daemon(build_dir, image_dir, tmp / "state", f"runtime-test-{os.getpid()}-{name}",
               extra_args=["--egress-test-upstream", f"echo.test=127.0.0.1:{echo.port}", *pool_args])
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


@pytest.fixture(scope="module")
def env(build_dir, image_dir, tmp_path_factory):
    yield from _daemon_with_echo(build_dir, image_dir, tmp_path_factory, "egress-privsep",
                                 ["--egress-workers", str(WORKERS), "--egress-workers-per-sandbox", str(SHARE)])


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


# The pool, its waiting room and their bounds are the daemon's and the proxy's, on the host:
# the sandbox only opens connections, through the same agent relay on every driver. These two
# run on namespace by default (gVisor's cases took 64 s); RUNTIME_TEST_ALL=1 runs them there too.
@pytest.mark.driver_independent
@pytest.mark.slow
def test_five_thousand_connections_stay_in_the_pool(eapi, edriver, env):
    d, echo = env
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    assert sbx.run("echo ready").strip() == "ready"
    base = threads_of(d.pid)
    bound = base + 2 * WORKERS + 1 + EXEC_SLACK
    pp = proxy_pid(d)
    proxy_bound = 2 * WORKERS + 1
    n, conc = 5000, 100  # 100 at once: within the share and its waiting room
    with Sampler(d.pid) as s, Sampler(pp) as ps:
        counts = run_client(sbx, n, conc, "get", timeout_s=1500)
    assert counts == {"200": n}, counts
    assert len(echo.seen()) == n
    assert s.samples > 10 and ps.samples > 10, "the samplers never ran"
    assert s.peak <= bound, (f"runtimed reached {s.peak} threads serving {conc} concurrent egress "
                             f"connections; the bound is {bound} ({base} before)")
    assert ps.peak <= proxy_bound, f"runtime-egress reached {ps.peak} threads; the bound is {proxy_bound}"
    assert proxy_pid(d) == pp, "the proxy was restarted during the run"
    print(f"runtimed threads: {base} before, peak {s.peak}, bound {bound} ({s.samples} samples); "
          f"runtime-egress peak {ps.peak}, bound {proxy_bound}")


@pytest.mark.driver_independent
def test_past_the_waiting_room_refused_with_an_audit_entry(eapi, edriver, env):
    d, _ = env
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    # Connections that never send a request hold the share's workers until
    # the proxy gives up on them; the next 128 wait; the rest are refused at
    # once with a 503 that says why, and each refusal is in the audit log.
    extra = 40
    n = SHARE + WAIT_PER_SANDBOX + extra
    base = threads_of(d.pid)
    pp = proxy_pid(d)
    with Sampler(d.pid) as s, Sampler(pp) as ps:
        counts = run_client(sbx, n, n, "idle", timeout_s=600)
    assert counts.get("503", 0) >= extra, counts
    assert "503-other" not in counts, counts
    assert s.peak <= base + 2 * WORKERS + 1 + EXEC_SLACK, (s.peak, base)
    assert ps.peak <= 2 * WORKERS + 1, ps.peak
    # Each refusal's entry is written before its 503: all there as the
    # client returns.
    entries = [e for e in egress_log(eapi, sbx.id) if "too many connections" in e["reason"]]
    assert entries, egress_log(eapi, sbx.id)
    e = entries[0]
    assert e["allowed"] is False and e["kind"] == "none", e
    assert "--egress-workers-per-sandbox" in e["reason"], e
    # The sandbox and the pool are fine afterwards, once the closed
    # connections have left the waiting room.
    wait_until(lambda: sbx.exec("curl -sS --max-time 60 -o /dev/null -w '%{http_code}' "
                                "http://echo.test/after", timeoutMs=90000)["stdout"].strip() == "200",
               timeout=120, interval=1, what="egress to work again")


def test_pool_flags_are_validated(build_dir):
    for bad in (["--egress-workers", "0"], ["--egress-workers", "5000"],
                ["--egress-workers-per-sandbox", "0"], ["--egress-workers", "x"],
                ["--egress-wait-timeout-ms", "0"], ["--egress-wait-timeout-ms", "99"],
                ["--egress-wait-timeout-ms", "600001"], ["--egress-wait-timeout-ms", "-5"],
                ["--egress-wait-timeout-ms", "x"]):
        p = subprocess.run([str(build_dir / "runtimed"), *bad, "--help"], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 2, (bad, p.returncode, p.stdout[-300:], p.stderr[-300:])
        assert bad[0] in p.stderr, (bad, p.stderr)


WAIT_MS = 2000
WAITER = r'''
import json, socket, time
# The first connection sends nothing: it holds the sandbox's one worker
# until the proxy gives up on its head (30 s). The second is queued behind
# it (the daemon takes a sandbox's connections in order) and waits.
idle = socket.create_connection(("127.0.0.1", 3128))
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"GET http://echo.test/waited HTTP/1.1\r\nHost: echo.test\r\nConnection: close\r\n\r\n")
s.settimeout(120)
t0, data = time.monotonic(), b""
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
print(json.dumps({"elapsed": time.monotonic() - t0, "answer": data.decode("latin-1")}))
'''


@pytest.fixture(scope="module")
def small_pool(build_dir, image_dir, tmp_path_factory):
    """A daemon whose sandboxes get one egress worker each, and whose
    connections wait for one at most WAIT_MS."""
    yield from _daemon_with_echo(build_dir, image_dir, tmp_path_factory, "egress-wait",
                                 ["--egress-workers", "2", "--egress-workers-per-sandbox", "1",
                                  "--egress-wait-timeout-ms", str(WAIT_MS)])


@pytest.mark.parametrize("wdriver", [d for d in DRIVERS if d != "microvm"] or ["namespace"])
def test_waiting_connection_times_out_with_a_refusal(small_pool, wdriver):
    d, echo = small_pool
    skip_unless_driver(d, wdriver)
    api = Api(d)
    try:
        sbx = api.create_sandbox(driver=wdriver, network={"internet": True, "allow": ["echo.test"]})
        sbx.write("/tmp/waiter.py", WAITER.encode())
        res = sbx.exec("python3 /tmp/waiter.py", timeoutMs=180000)
        assert res["exitCode"] == 0, res
        out = json.loads(res["stdout"].strip().splitlines()[-1])
        head, _, body = out["answer"].partition("\r\n\r\n")
        # The proxy's usual refusal, saying why, once the wait is over and
        # well before the worker would have been free (30 s).
        assert head.startswith("HTTP/1.1 503 "), out
        assert "X-Runtime-Egress: refused" in head, out
        assert body.startswith("runtime egress: waited") and "--egress-wait-timeout-ms" in body, out
        assert WAIT_MS / 1000 * 0.9 <= out["elapsed"] < 25, out
        assert echo.seen() == [], "the timed-out request reached the upstream"
        # Its entry was written before the answer: read at once.
        entries = [e for e in egress_log(api, sbx.id) if "--egress-wait-timeout-ms" in e["reason"]]
        assert len(entries) == 1, egress_log(api, sbx.id)
        e = entries[0]
        assert e["allowed"] is False and e["kind"] == "none" and e["end"] == "refused", e
        assert "this sandbox's share is busy" in e["reason"], e
        assert e["durationMs"] >= WAIT_MS * 0.9, e
    finally:
        problems = api.delete_all()
        api.close()
    assert not problems, problems


def test_proxy_runs_without_root_capabilities_or_the_database(env):
    d, _ = env
    pid = proxy_pid(d)
    st = status_of(pid)
    uids, gids = st["Uid"].split(), st["Gid"].split()
    assert all(u != "0" for u in uids), st["Uid"]
    assert all(g != "0" for g in gids), st["Gid"]
    assert st["Groups"].strip() == "", st["Groups"]
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(st[cap], 16) == 0, f"{cap} {st[cap]}"
    assert st["NoNewPrivs"].strip() == "1", st["NoNewPrivs"]
    assert st["Seccomp"].strip() == "2", st["Seccomp"]  # a filter: no exec, ptrace, namespaces, ...
    # Nothing of the daemon's state is open in it: no database, no CA key
    # file (the key is in its memory alone), only its sockets and stdio.
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        assert target.startswith(("socket:", "pipe:", "/dev/null", "anon_inode:")) or int(fd) <= 2, \
            (fd, target)
    # And as its user it could not open them.
    uid, gid = int(uids[0]), int(gids[0])
    r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "cat",
                        str(d.state_dir / "runtime.db")], capture_output=True, timeout=30)
    assert r.returncode != 0 and b"SQLite" not in r.stdout, r


def test_killed_proxy_is_restarted_open_connections_end(eapi, edriver, env):
    d, echo = env
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    # A connection held open through the proxy: it waits for an answer to a
    # request it has not finished.
    sbx.write("/tmp/hold.py", b"""
import socket, sys, time
# A tunnel the proxy has decided on and opened, held open.
t = socket.create_connection(("127.0.0.1", 3128))
t.sendall(b"CONNECT echo.test:80 HTTP/1.1\\r\\nHost: echo.test:80\\r\\n\\r\\n")
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += t.recv(1)
assert head.startswith(b"HTTP/1.1 200"), head
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"GET http://echo.test/held HTTP/1.1\\r\\nHost: echo.test\\r\\n")
open("/tmp/held", "w").write("open")
s.settimeout(120)
try:
    data = s.recv(4096)
    out = "eof" if data == b"" else "data:" + data[:40].decode("latin-1")
except Exception as e:
    out = "error:" + type(e).__name__
open("/tmp/held.out", "w").write(out)
""")
    sbx.exec("nohup python3 /tmp/hold.py >/dev/null 2>&1 &")
    wait_until(lambda: sbx.exec("cat /tmp/held 2>/dev/null")["stdout"] == "open", timeout=60,
               what="the held connection")
    old = proxy_pid(d)
    # The held connection has reached the proxy: it is waiting on its head.
    # The tunnel holds its data, meta and upstream sockets, the held
    # connection its data and meta.
    wait_until(lambda: sum(os.readlink(f"/proc/{old}/fd/{fd}").startswith("socket:")
                           for fd in os.listdir(f"/proc/{old}/fd") if int(fd) > 3) >= 5,
               timeout=30, what="both connections in the proxy")
    os.kill(old, 9)
    out = wait_until(lambda: sbx.exec("cat /tmp/held.out 2>/dev/null")["stdout"] or None, timeout=60,
                     what="the held connection to end")
    assert out in ("eof",) or out.startswith("error:"), out
    # The next connection starts a new proxy, as unprivileged as the first.
    res = sbx.exec("curl -sS --max-time 60 -o /dev/null -w '%{http_code}' http://echo.test/after",
                   timeoutMs=90000)
    assert res["stdout"].strip() == "200", res
    new = proxy_pid(d)
    assert new != old
    st = status_of(new)
    assert st["Uid"].split()[0] != "0" and int(st["CapEff"], 16) == 0 and int(st["CapBnd"], 16) == 0, st
    assert [r["path"] for r in echo.seen()] == ["/after"], echo.seen()
    entries = egress_log(eapi, sbx.id)
    assert any("egress proxy ended" in e["reason"] for e in entries), entries
    # The decided tunnel keeps its one entry, allowed, and is marked as
    # ended by the proxy's end (the mark follows the connection's close).
    tunnels = wait_until(lambda: (lambda t: t if t and all(e["end"] for e in t) else None)(
        [e for e in egress_log(eapi, sbx.id) if e["kind"] == "connect"]), timeout=30, what="the tunnel's end")
    assert len(tunnels) == 1, tunnels
    assert tunnels[0]["allowed"] and tunnels[0]["reason"] == "allowed (test upstream)", tunnels
    assert tunnels[0]["end"] == "the egress proxy ended during the connection", tunnels

# Capabilities runtimed drops at start because no driver uses them
# (docs/drivers.md#capabilities), by number (linux/capability.h).
UNUSED_CAPS = {"CAP_LINUX_IMMUTABLE": 9, "CAP_NET_BROADCAST": 11, "CAP_SYS_MODULE": 16,
               "CAP_SYS_RAWIO": 17, "CAP_SYS_PACCT": 20, "CAP_SYS_BOOT": 22, "CAP_SYS_TIME": 25,
               "CAP_SYS_TTY_CONFIG": 26, "CAP_LEASE": 28, "CAP_AUDIT_CONTROL": 30,
               "CAP_MAC_OVERRIDE": 32, "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35,
               "CAP_BLOCK_SUSPEND": 36, "CAP_AUDIT_READ": 37, "CAP_PERFMON": 38, "CAP_BPF": 39}


def test_daemon_keeps_only_what_drivers_need(eapi, edriver, env):
    d, _ = env
    st = status_of(d.pid)
    for field in ("CapBnd", "CapPrm", "CapEff"):
        have = int(st[field], 16)
        kept = [name for name, bit in UNUSED_CAPS.items() if have & (1 << bit)]
        assert not kept, f"runtimed {field} still has {kept}"
    # What the drivers do need is still there (mounts, namespaces, uid maps).
    assert int(st["CapEff"], 16) & (1 << 21), "CAP_SYS_ADMIN gone: no driver could start"
    # The bounding set reaches what runtimed starts: a sandbox's host processes.
    sbx = eapi.create_sandbox(driver=edriver)
    assert sbx.run("echo ok").strip() == "ok"
    pids = host_pids(sbx.id)
    assert pids, "no host process of the sandbox found"
    for pid in pids:
        try:
            bnd = int(status_of(pid)["CapBnd"], 16)
        except FileNotFoundError:
            continue
        kept = [name for name, bit in UNUSED_CAPS.items() if bnd & (1 << bit)]
        assert not kept, f"pid {pid} ({proc_comm(pid)}) of the sandbox has {kept} in its bounding set"


TUNNEL_HOLD = b"""
import socket
t = socket.create_connection(("127.0.0.1", 3128))
t.sendall(b"CONNECT echo.test:80 HTTP/1.1\\r\\nHost: echo.test:80\\r\\n\\r\\n")
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += t.recv(1)
open("/tmp/tunnel", "w").write(head.split(b" ")[1].decode())
t.settimeout(600)
try:
    t.recv(1)
except Exception:
    pass
"""


def test_open_entry_ended_at_the_next_start_after_a_crash(small_pool):
    """An entry is open (end and durationMs null) while its connection is;
    a daemon killed under it marks it at its next start."""
    d, _ = small_pool
    skip_unless_driver(d, "namespace")
    api = Api(d)
    sid = None
    try:
        sbx = api.create_sandbox(driver="namespace", network={"internet": True, "allow": ["echo.test"]})
        sid = sbx.id
        sbx.write("/tmp/tunnel.py", TUNNEL_HOLD)
        sbx.exec("nohup python3 /tmp/tunnel.py >/dev/null 2>&1 &")
        assert wait_until(lambda: sbx.exec("cat /tmp/tunnel 2>/dev/null")["stdout"], timeout=60,
                          what="the tunnel") == "200"
        open_ = [e for e in egress_log(api, sid) if e["kind"] == "connect"]
        assert len(open_) == 1 and open_[0]["allowed"], open_
        assert open_[0]["end"] is None and open_[0]["durationMs"] is None, open_
        d.kill()  # as a crash would: its sandboxes and their connections left as they are
        d.start()
        # The restart may have removed the sandbox its crash left behind:
        # its log is read from the store.
        with sqlite3.connect(f"file:{d.state_dir / 'runtime.db'}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT kind, allowed, end_reason FROM egress_log WHERE sandbox = ?",
                              (sid,)).fetchall()
        assert rows == [("connect", 1, "the daemon stopped during the connection")], rows
    finally:
        problems = api.delete_all()
        api.close()
    assert not problems, problems


CAP_NUMBERS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5,
               "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "LINUX_IMMUTABLE": 9, "NET_BIND_SERVICE": 10,
               "NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13, "IPC_LOCK": 14, "IPC_OWNER": 15,
               "SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_PACCT": 20,
               "SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23, "SYS_RESOURCE": 24, "SYS_TIME": 25,
               "SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28, "AUDIT_WRITE": 29, "AUDIT_CONTROL": 30,
               "SETFCAP": 31, "MAC_OVERRIDE": 32, "MAC_ADMIN": 33, "SYSLOG": 34, "WAKE_ALARM": 35,
               "BLOCK_SUSPEND": 36, "AUDIT_READ": 37, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40}


def caps_table() -> dict[str, set[str]]:
    """docs/drivers.md's capability table: for each column (runtimed and each
    driver), the capabilities marked as needed there."""
    text = (REPO / "docs" / "drivers.md").read_text()
    section = text.split("## Capabilities", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    header = next(ln for ln in section.splitlines() if ln.startswith("| capability"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    need: dict[str, set[str]] = {c: set() for c in cols[1:-1]}
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        names = [n.strip("` ") for n in cells[0].split(",")]
        for col, cell in zip(cols[1:-1], cells[1:-1]):
            if cell == "yes":
                need[col].update(names)
    assert need.get("runtimed") and need.get("namespace"), f"no capability table in docs/drivers.md: {cols}"
    return need


def cap_names(mask: int) -> set[str]:
    return {name for name, bit in CAP_NUMBERS.items() if mask & (1 << bit)}


def test_namespace_only_daemon_keeps_its_drivers_capabilities(build_dir, image_dir, tmp_path):
    """A daemon offering the namespace driver alone keeps what runtimed and
    that driver need (docs/drivers.md's table), and no more: none of what
    only gVisor or the microVM use, in its own sets or in what it starts."""
    _need_root()
    if shutil.which("bwrap") is None:
        pytest.skip("the namespace driver needs bubblewrap")
    table = caps_table()
    # What the daemon can hold at all: what this process's bounding set
    # passes on (a container may lack some, SYS_RESOURCE here).
    available = cap_names(int(status_of(os.getpid())["CapBnd"], 16))
    expected = (table["runtimed"] | table["namespace"]) & available
    others = (table.get("gvisor", set()) | table.get("microvm", set())) - table["runtimed"] - table["namespace"]
    assert others, "the table names nothing that only the other drivers use"
    d = Daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-caps-ns",
               extra_args=["--drivers", "namespace"])
    try:
        d.start()
    except DaemonError as err:
        pytest.fail(str(err), pytrace=False)
    api = Api(d)
    try:
        st = status_of(d.pid)
        for field in ("CapBnd", "CapPrm", "CapEff"):
            have = cap_names(int(st[field], 16))
            assert have == expected, (f"runtimed {field}: kept beyond the table {sorted(have - expected)}, "
                                      f"missing {sorted(expected - have)}")
        assert int(st["CapInh"], 16) == 0 and int(st["CapAmb"], 16) == 0, st
        assert "capabilities kept for runtimed and the offered drivers" in d.log_path.read_text()
        # The driver works with that set, and what runtimed started for the
        # sandbox holds none of the rest either.
        sbx = api.create_sandbox(driver="namespace")
        assert sbx.run("echo ok").strip() == "ok"
        # NET_BIND_SERVICE is kept for the sandbox's root: a server on port 80.
        bind = sbx.exec(argv=["python3", "-c", "import socket; s = socket.socket(); "
                              "s.bind(('127.0.0.1', 80)); print('bound')"], user="root")
        assert bind["stdout"].strip() == "bound", bind
        pids = host_pids(sbx.id)
        assert pids, "no host process of the sandbox found"
        for pid in pids:
            try:
                bnd = cap_names(int(status_of(pid)["CapBnd"], 16))
            except FileNotFoundError:
                continue
            assert not bnd & others, f"pid {pid} ({proc_comm(pid)}) has {sorted(bnd & others)}"
    finally:
        problems = api.delete_all()
        api.close()
        _finish_daemon(d)
    assert not problems, problems
