"""Live restore (docs/lifecycle.md): sandboxes outlive their daemon.

Each running sandbox has a supervisor (runtime-supervisor) that holds its end
of the agent channel. A daemon killed with SIGKILL, or stopped with SIGTERM
without --stop-sandboxes-on-exit, leaves the sandbox and its processes
running. The next start re-attaches them: the process never stopped, the
output it wrote meanwhile is readable by cursor, new commands work, the lease
ends on time and the ledger bills the whole time once.

Every driver hands its sandboxes over, the microVM too (its QEMU, monitor and
console, docs/microvm.md). Under TCG the microVM runs the cases marked
microvm_subset: a kill and a stop, a paused sandbox, and a process followed to
its end across a kill; its serial console written while no daemon reads it is
checked on the microVM alone.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time

import httpx
import pytest

from helpers import Daemon, host_pids, wait_until

pytestmark = pytest.mark.usefixtures("build_dir")

# A line every half second: a gap of a few seconds is several lines.
TICKER = "i=0; while true; do i=$((i+1)); echo line-$i; sleep 0.5; done"


@pytest.fixture
def keeping_daemon(build_dir, image_dir, tmp_path):
    """A daemon of its own that leaves its sandboxes running when it stops, as runtimed does by
    default (the suite's other daemons pass --stop-sandboxes-on-exit)."""
    from conftest import _finish_daemon, _need_root
    from helpers import DaemonError
    _need_root()
    d = Daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-live", keep_sandboxes=True)
    try:
        d.start()
    except DaemonError as e:
        pytest.fail(str(e), pytrace=False)
    yield d
    if not d.alive():
        d.start()
    with d.client() as c:
        for s in c.get("/v1/sandboxes").json().get("sandboxes", []):
            c.delete(f"/v1/sandboxes/{s['id']}")
    _finish_daemon(d)


def live_driver(d: Daemon, driver: str) -> None:
    from helpers import skip_unless_driver
    skip_unless_driver(d, driver)


def ticking_sandbox(d: Daemon, driver: str) -> tuple[str, dict]:
    """A new sandbox with the ticker running in it: its id and the process."""
    with d.client() as api:
        sid = api.post("/v1/sandboxes", json={"driver": driver}).json()["id"]
        proc = start_ticker(api, sid)
        wait_lines(api, sid, proc["id"], 2)
    return sid, proc


def start_ticker(api, sid: str) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}/processes", json={"command": TICKER})
    assert r.status_code == 201, r.text
    return r.json()


def read_output(api, sid: str, pid: str, cursor: int = 0) -> list[dict]:
    r = api.get(f"/v1/sandboxes/{sid}/processes/{pid}/output", params={"cursor": cursor})
    assert r.status_code == 200, r.text
    return [json.loads(l) for l in r.text.splitlines() if l.strip()]


def lines_of(events: list[dict]) -> list[int]:
    text = "".join(e.get("data", "") for e in events if e["type"] == "stdout")
    return [int(l.split("-")[1]) for l in text.splitlines() if l.startswith("line-")]


def supervisor_pids(sid: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"runtime-supervisor") and sid.encode() in argv:
            found.append(int(name))
    return found


def wait_lines(api, sid: str, pid: str, n: int, timeout: float = 30.0) -> list[int]:
    return wait_until(lambda: (lambda l: l if len(l) >= n else None)(lines_of(read_output(api, sid, pid))),
                      timeout, what=f"{n} lines of the ticker")


def check_survived(d: Daemon, sid: str, proc: dict, last_before: int, cursor_before: int, gap_s: float) -> None:
    with d.client() as api:
        sb = api.sandbox(sid)
        assert sb["state"] == "running", sb
        p = api.get(f"/v1/sandboxes/{sid}/processes/{proc['id']}").json()
        assert p["state"] == "running" and p["pid"] == proc["pid"], p
        # From the cursor a reader had: what the old daemon's ring held past it is gone with it (a
        # truncated event says so), then the lines continue without a gap.
        events = read_output(api, sid, proc["id"], cursor_before)
        kinds = [e["type"] for e in events]
        assert "error" not in kinds, events
        after = lines_of(events)
        assert after, events
        assert after == list(range(after[0], after[0] + len(after))), f"a gap in the lines: {after}"
        assert after[0] <= last_before + 2, (last_before, after[:5])
        # The process ran through the gap: the lines written while no daemon was there are here.
        assert after[-1] >= last_before + int(gap_s / 0.5) - 2, (last_before, after[-1], gap_s)
        # It goes on, and new commands work.
        more = wait_lines(api, sid, proc["id"], 0)
        assert api.exec(sid, command="echo again")["stdout"] == "again\n"
        assert api.get_file(sid, "/workspace/kept.txt").content == b"still here"
        assert more is not None


@pytest.mark.microvm_subset
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_sandbox_outlives_its_daemon(keeping_daemon, driver, how):
    """SIGKILL (a crash) or SIGTERM (an upgrade) of runtimed; the next start finds the sandbox
    running, its process never stopped, its output from the gap readable by cursor."""
    d = keeping_daemon
    live_driver(d, driver)
    with d.client() as api:
        sb = api.post("/v1/sandboxes", json={"driver": driver, "timeoutSeconds": 600}).json()
        sid = sb["id"]
        assert api.put_file(sid, "/workspace/kept.txt", b"still here").status_code in (200, 201, 204)
        proc = start_ticker(api, sid)
        got = wait_lines(api, sid, proc["id"], 3)
        proc = api.get(f"/v1/sandboxes/{sid}/processes/{proc['id']}").json()
        assert proc["pid"], proc
        before = read_output(api, sid, proc["id"])
        cursor = sum(len(e.get("data", "").encode()) for e in before if e["type"] == "stdout")
        last = lines_of(before)[-1]
        assert got
        sups = supervisor_pids(sid)
        assert len(sups) == 1, sups
    t0 = time.monotonic()
    if how == "kill":
        d.kill()
    else:
        assert d.stop() == 0
    # Nothing of the sandbox stopped with the daemon.
    assert supervisor_pids(sid) == sups
    time.sleep(3.0)
    d.start()
    gap = time.monotonic() - t0
    check_survived(d, sid, proc, last, cursor, gap)
    assert supervisor_pids(sid) == sups
    with d.client() as api:
        assert api.delete(f"/v1/sandboxes/{sid}").status_code in (200, 204)
    wait_until(lambda: not host_pids(sid), 20, what="the sandbox's processes and supervisor gone")


def test_the_lease_ends_on_time_and_is_billed_once(keeping_daemon, driver):
    """A lease that ends while the daemon is away ends at the next start at once; one that ends
    after it ends on time; the ledger bills the whole run, the gap included, once."""
    d = keeping_daemon
    live_driver(d, driver)
    with d.client() as api:
        sb = api.post("/v1/sandboxes", json={"driver": driver, "timeoutSeconds": 12}).json()
        sid = sb["id"]
        created = time.time()
    d.kill()
    time.sleep(2.0)
    d.start()
    with d.client() as api:
        assert api.sandbox(sid)["state"] == "running"
        st = api.wait_state(sid, "stopped", timeout=40)
        ended = time.time()
        assert 10 <= ended - created <= 12 + 8, (ended - created, st)
        assert 11 <= st["runSeconds"] <= 13, st
    wait_until(lambda: not host_pids(sid), 20, what="the sandbox's processes and supervisor gone")


def test_a_terminal_and_a_forward_end_with_a_resume_hint(keeping_daemon, driver):
    """Open streams end with the daemon; after the start the same sandbox serves new ones."""
    d = keeping_daemon
    live_driver(d, driver)
    with d.client() as api:
        sid = api.post("/v1/sandboxes", json={"driver": driver}).json()["id"]
        term = api.post(f"/v1/sandboxes/{sid}/processes",
                        json={"command": "bash", "pty": {"cols": 80, "rows": 24}, "stdinMode": "pipe"}).json()
        assert term["state"] == "running", term
    d.kill()
    d.start()
    with d.client() as api:
        p = api.get(f"/v1/sandboxes/{sid}/processes/{term['id']}").json()
        assert p["state"] == "running" and p["pty"] == {"cols": 80, "rows": 24}, p
        r = api.post(f"/v1/sandboxes/{sid}/processes/{term['id']}:write",
                     json={"data": "echo typed-after\n", "offset": p["stdinOffset"]})
        assert r.status_code == 200, r.text
        wait_until(lambda: "typed-after" in "".join(e.get("data", "") for e in read_output(
            api, sid, term["id"], 0) if e["type"] == "stdout").replace("echo typed-after", ""), 20,
            what="the terminal's shell answering after the restart")


@pytest.mark.parametrize("what", ["supervisor", "sandbox"])
def test_a_dead_supervisor_means_stopped_with_the_wake_hint(keeping_daemon, driver, what):
    """A supervisor that died while the daemon was away, or a sandbox that ended then (its
    supervisor ends with it): the sandbox is recorded stopped, nothing of it is left on the host,
    and an exec's hint says to wake it (which works)."""
    d = keeping_daemon
    live_driver(d, driver)
    with d.client() as api:
        sid = api.post("/v1/sandboxes", json={"driver": driver}).json()["id"]
        assert api.put_file(sid, "/workspace/kept.txt", b"still here").status_code in (200, 201, 204)
    sups = supervisor_pids(sid)
    assert len(sups) == 1
    d.kill()
    if what == "supervisor":
        os.kill(sups[0], signal.SIGKILL)
    else:
        for pid in host_pids(sid):
            if pid not in sups:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        wait_until(lambda: not supervisor_pids(sid), 20, what="the supervisor ending with its sandbox")
    d.start()
    with d.client() as api:
        st = api.sandbox(sid)
        assert st["state"] == "stopped", st
        assert st["failureReason"].startswith("daemon restarted"), st
        wait_until(lambda: not host_pids(sid), 20, what="the sandbox's processes gone")
        r = api.post(f"/v1/sandboxes/{sid}:exec", json={"command": "true"})
        assert r.status_code == 409, r.text
        assert ":wake" in r.json()["error"]["hint"], r.json()
        r = api.post(f"/v1/sandboxes/{sid}:wake", json={})
        assert r.status_code == 200, r.text
        assert api.get_file(sid, "/workspace/kept.txt").content == b"still here"


def test_a_supervisor_refuses_a_wrong_nonce_and_garbage(keeping_daemon, any_driver):
    """The supervisor's socket is the daemon's alone (0600) and answers only the sandbox's id and
    nonce; a second daemon while one is attached is refused."""
    d = keeping_daemon
    with d.client() as api:
        sid = api.post("/v1/sandboxes", json={"driver": any_driver}).json()["id"]
    path = d.state_dir / "sandboxes" / sid / "supervisor.sock"
    assert path.exists()
    assert (path.stat().st_mode & 0o777) == 0o600, oct(path.stat().st_mode)

    def ask(line: bytes) -> bytes:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        # Through the directory's fd, as the daemon does: the state dir's path may be too long.
        dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            s.connect(f"/proc/self/fd/{dirfd}/{path.name}")
        finally:
            os.close(dirfd)
        s.sendall(line)
        got = b""
        while not got.endswith(b"\n"):
            b = s.recv(256)
            if not b:
                break
            got += b
        s.close()
        return got

    assert ask(f"ATTACH 2 {sid} {'0' * 32}\n".encode()) == b"NO nonce\n"
    # The first version relayed frames; this supervisor hands the channel over, and says so.
    assert ask(f"ATTACH 1 {sid} {'0' * 32}\n".encode()) == b"NO version 2\n"
    assert ask(b"\x00\xff garbage\n").startswith(b"NO ")
    # The attached daemon still serves the sandbox.
    with d.client() as api:
        assert api.exec(sid, command="echo fine")["stdout"] == "fine\n"


def test_a_second_daemon_on_the_same_state_dir_refuses_to_start(keeping_daemon):
    d = keeping_daemon
    other = Daemon(d.build_dir, d.image_dir, d.state_dir, d.cgroup_parent + "-2")
    proc = __import__("subprocess").run(other.argv(), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "state directory" in (proc.stdout + proc.stderr), proc.stderr[-2000:]
    with d.client() as api:
        assert api.get("/healthz").status_code == 200


FOLLOWER = """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
for ev in sbx.process(sys.argv[2]).output():
    print(json.dumps(ev), flush=True)
"""


@pytest.mark.microvm_subset
def test_the_published_client_follows_across_a_kill(keeping_daemon, published_client, driver, tmp_path):
    """The published client following a process's output while runtimed is killed and started
    again: its reconnect from the cursor carries on with the lines the process wrote meanwhile,
    and ends with the process's exit."""
    import queue
    import subprocess
    import threading
    d = keeping_daemon
    live_driver(d, driver)
    sid, proc = ticking_sandbox(d, driver)
    script = tmp_path / "follow.py"
    script.write_text(FOLLOWER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and not k.startswith("RUNTIME_")}
    env.update({"RUNTIME_API_URL": d.base_url, "RUNTIME_API_KEY": d.api_key or ""})
    follower = subprocess.Popen([str(published_client.python), "-I", str(script), sid, proc["id"]], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    events: "queue.Queue[dict]" = queue.Queue()
    threading.Thread(target=lambda: [events.put(json.loads(l)) for l in follower.stdout], daemon=True).start()
    got: list[dict] = []

    def take_until(pred, timeout: float) -> None:
        end = time.monotonic() + timeout
        while not pred():
            left = end - time.monotonic()
            assert left > 0, f"the follower saw {got[-5:]}; stderr: {follower.stderr.read() if follower.poll() is not None else ''}"
            try:
                got.append(events.get(timeout=left))
            except queue.Empty:
                pass
    try:
        take_until(lambda: len(lines_of(got)) >= 3, 60)
        last = lines_of(got)[-1]
        d.kill()
        time.sleep(2.0)
        d.start()
        take_until(lambda: lines_of(got) and lines_of(got)[-1] >= last + 6, 120)
        with d.client() as api:
            r = api.post(f"/v1/sandboxes/{sid}/processes/{proc['id']}:signal", json={"signal": "TERM"})
            assert r.status_code == 200, r.text
        take_until(lambda: got and got[-1]["type"] == "exit", 60)
        assert follower.wait(30) == 0, follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
    numbers = lines_of(got)
    # In order, and without a hole but where the client was told of one.
    gaps = [(a, b) for a, b in zip(numbers, numbers[1:]) if b != a + 1]
    truncated = [e for e in got if e["type"] == "truncated"]
    assert len(gaps) <= len(truncated) <= 1, (gaps, truncated)
    assert all(b - a <= 3 for a, b in gaps), gaps


@pytest.mark.microvm_subset
def test_a_paused_sandbox_is_taken_over_paused(keeping_daemon, driver):
    """A sandbox paused when runtimed is killed comes back paused: its process stood still
    through the gap (the take-over wakes it for a moment to attach its agent, then pauses it
    again), and a wake carries the same process on."""
    d = keeping_daemon
    live_driver(d, driver)
    sid, proc = ticking_sandbox(d, driver)
    with d.client() as api:
        proc = api.get(f"/v1/sandboxes/{sid}/processes/{proc['id']}").json()
        r = api.post(f"/v1/sandboxes/{sid}:pause", json={})
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "paused", r.json()
        before = read_output(api, sid, proc["id"])
        cursor = sum(len(e.get("data", "").encode()) for e in before if e["type"] == "stdout")
        last = lines_of(before)[-1]
    d.kill()
    d.start()
    with d.client() as api:
        sb = api.sandbox(sid)
        assert sb["state"] == "paused", sb
        held = lines_of(read_output(api, sid, proc["id"], cursor))
        assert all(n <= last + 2 for n in held), (last, held)
        r = api.post(f"/v1/sandboxes/{sid}:wake", json={})
        assert r.status_code == 200, r.text
        more = wait_until(lambda: (lambda l: l if l and l[-1] >= last + 4 else None)(
            lines_of(read_output(api, sid, proc["id"], cursor))), 60, what="the ticker going on after the wake")
        assert more == list(range(more[0], more[0] + len(more))), f"a gap in the lines: {more}"
        p = api.get(f"/v1/sandboxes/{sid}/processes/{proc['id']}").json()
        assert p["state"] == "running" and p["pid"] == proc["pid"], p
        assert api.exec(sid, command="echo awake")["stdout"] == "awake\n"
        assert api.delete(f"/v1/sandboxes/{sid}").status_code in (200, 204)
    wait_until(lambda: not host_pids(sid), 20, what="the sandbox's processes and supervisor gone")


def test_microvm_console_written_while_away_reaches_its_log(keeping_daemon, build_dir, image_dir):
    """The microVM's serial console while no daemon reads it: what the guest writes there waits in
    its socket (QEMU runs on), and the next daemon copies it into console.log after what the
    earlier one wrote, with nothing lost."""
    import re
    from conftest import need_microvm_parts
    from helpers import skip_unless_driver
    d = keeping_daemon
    skip_unless_driver(d, "microvm")
    need_microvm_parts(build_dir, image_dir)
    with d.client() as api:
        sid = api.post("/v1/sandboxes", json={"driver": "microvm"}).json()["id"]
        r = api.post(f"/v1/sandboxes/{sid}/processes", json={
            "command": "i=0; while :; do i=$((i+1)); echo con-$i; sleep 0.1; done | sudo tee /dev/ttyS0 >/dev/null"})
        assert r.status_code == 201, r.text
    log = d.state_dir / "sandboxes" / sid / "console.log"

    def numbers() -> list[int]:
        return [int(n) for n in re.findall(rb"con-(\d+)\r?\n", log.read_bytes())]
    wait_until(lambda: len(numbers()) >= 5, 30, what="the guest's console in console.log")
    d.kill()
    at_kill = max(numbers())
    d.start()
    with d.client() as api:
        assert api.sandbox(sid)["state"] == "running"
    got = wait_until(lambda: (lambda n: n if n and max(n) >= at_kill + 20 else None)(numbers()), 30,
                     what="the console written while the daemon was away, and after")
    assert got == list(range(1, len(got) + 1)), f"lost console lines: {got}"
    with d.client() as api:
        assert api.delete(f"/v1/sandboxes/{sid}").status_code in (200, 204)


def _build_of(commit: str, dest) -> "Path":
    """runtimed and its companions built from `commit` of this repository, in dest."""
    import subprocess
    from pathlib import Path
    from helpers import REPO
    src = Path(dest) / "tree"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True,
                             timeout=120, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True, timeout=120)
    targets = ["build/runtimed", "build/runtime-agent", "build/runtime-supervisor", "build/runtime-egress",
               "build/runtime-image-build"]
    mk = subprocess.run(["make", "-j2", *targets], cwd=src, capture_output=True, text=True, timeout=1800)
    assert mk.returncode == 0, mk.stderr[-4000:]
    return src / "build"


def test_an_upgrade_keeps_the_sandboxes(build_dir, image_dir, tmp_path):
    """The daemon of the first commit that had live restore (built here from its tree) runs a
    sandbox with a process; it is stopped and this tree's daemon started on its state directory:
    the sandbox is re-attached through the older supervisor, its process never stopped."""
    import subprocess
    from conftest import _finish_daemon, _need_root
    from helpers import REPO, skip_unless_driver
    _need_root()
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no earlier commit to build")
    first = subprocess.run(["git", "-C", str(REPO), "log", "--format=%H", "--diff-filter=A", "--",
                            "src/supervisor/main.c"], capture_output=True, text=True, timeout=60).stdout.split()
    if not first:
        pytest.skip("no commit of this history has a supervisor yet")
    old_build = _build_of(first[-1], tmp_path / "old")
    state = tmp_path / "state"
    old = Daemon(old_build, image_dir, state, f"runtime-test-{os.getpid()}-upgrade", keep_sandboxes=True)
    old.start()
    try:
        skip_unless_driver(old, "namespace")
        with old.client() as api:
            sid = api.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 600}).json()["id"]
            assert api.put_file(sid, "/workspace/kept.txt", b"still here").status_code in (200, 201, 204)
            proc = start_ticker(api, sid)
            wait_lines(api, sid, proc["id"], 3)
            proc = api.get(f"/v1/sandboxes/{sid}/processes/{proc['id']}").json()
            before = read_output(api, sid, proc["id"])
            cursor = sum(len(e.get("data", "").encode()) for e in before if e["type"] == "stdout")
            last = lines_of(before)[-1]
        sups = supervisor_pids(sid)
        t0 = time.monotonic()
        assert old.stop() == 0
    finally:
        if old.alive():
            old.kill()
    new = Daemon(build_dir, image_dir, state, old.cgroup_parent, keep_sandboxes=True)
    new.start()
    try:
        time.sleep(1.0)
        check_survived(new, sid, proc, last, cursor, time.monotonic() - t0)
        assert supervisor_pids(sid) == sups, "the older supervisor is the one kept"
        with new.client() as api:
            assert api.delete(f"/v1/sandboxes/{sid}").status_code in (200, 204)
        wait_until(lambda: not host_pids(sid), 20, what="the sandbox's processes and supervisor gone")
    finally:
        _finish_daemon(new)
        old.release_layer_pool()


@pytest.mark.parametrize("fault", ["wrong-nonce", "garbage"])
def test_a_supervisor_that_does_not_prove_itself_is_refused(keeping_daemon, any_driver, fault):
    """A supervisor that refuses the nonce the store has (the row's nonce changed while the daemon
    was down), or a socket answering garbage in its place: the sandbox is not taken over but
    stopped, with the reason, its processes killed and its supervisor gone; :wake boots it."""
    import sqlite3
    import threading
    d = keeping_daemon
    with d.client() as api:
        sid = api.post("/v1/sandboxes", json={"driver": any_driver}).json()["id"]
        assert api.put_file(sid, "/workspace/kept.txt", b"still here").status_code in (200, 201, 204)
    d.kill()
    sock = d.state_dir / "sandboxes" / sid / "supervisor.sock"
    fake = None
    if fault == "wrong-nonce":
        with sqlite3.connect(d.state_dir / "runtime.db") as db:
            spec = json.loads(db.execute("SELECT spec FROM sandboxes WHERE id = ?", (sid,)).fetchone()[0])
            assert len(spec["supervisorNonce"]) == 32
            spec["supervisorNonce"] = "0" * 32
            db.execute("UPDATE sandboxes SET spec = ? WHERE id = ?", (json.dumps(spec), sid))
        why = "refused"
    else:
        # The supervisor is killed (its sandbox's channel with it) and something else answers on
        # its socket.
        for pid in supervisor_pids(sid):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not supervisor_pids(sid), 10, what="the supervisor gone")
        dirfd = os.open(sock.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            sock.unlink(missing_ok=True)
            fake = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            fake.bind(f"/proc/self/fd/{dirfd}/{sock.name}")
        finally:
            os.close(dirfd)
        fake.listen(4)

        def answer():
            while True:
                try:
                    c, _ = fake.accept()
                except OSError:
                    return
                c.recv(512)
                c.sendall(b"OK 1 1 9 \x01\x02garbage\n")
                c.close()
        threading.Thread(target=answer, daemon=True).start()
        why = "garbage"
    try:
        d.start()
    finally:
        if fake:
            fake.close()
    with d.client() as api:
        st = api.sandbox(sid)
        assert st["state"] == "stopped", st
        assert st["failureReason"].startswith("daemon restarted; ") and why in st["failureReason"], st
        wait_until(lambda: not host_pids(sid), 20, what="the sandbox's processes and supervisor gone")
        r = api.post(f"/v1/sandboxes/{sid}:wake", json={})
        assert r.status_code == 200, r.text
        assert api.get_file(sid, "/workspace/kept.txt").content == b"still here"


def test_an_output_stream_ends_with_continue_at_a_stop(keeping_daemon, any_driver):
    """A reader following a process's output when runtimed stops (SIGTERM) gets a `continue`
    event with its cursor, not an error: the process runs on, and reading on from that cursor
    after the start finds the lines that followed."""
    import threading
    d = keeping_daemon
    sid, proc = ticking_sandbox(d, any_driver)
    lines: list[dict] = []
    started = threading.Event()

    def follow():
        with httpx.Client(base_url=d.base_url, headers={"Authorization": f"Bearer {d.api_key}"},
                          timeout=60) as c:
            with c.stream("GET", f"/v1/sandboxes/{sid}/processes/{proc['id']}/output",
                          params={"cursor": 0, "follow": "true"}) as r:
                started.set()
                for line in r.iter_lines():
                    if line.strip():
                        lines.append(json.loads(line))
    t = threading.Thread(target=follow, daemon=True)
    t.start()
    assert started.wait(30)
    wait_until(lambda: len(lines_of(lines)) >= 3, 30, what="the follower reading lines")
    assert d.stop() == 0
    t.join(30)
    assert not t.is_alive(), "the output stream did not end with the daemon's stop"
    assert lines[-1]["type"] == "continue" and lines[-1]["processId"] == proc["id"], lines[-3:]
    cursor = lines[-1]["cursor"]
    before = lines_of(lines)
    d.start()
    with d.client() as api:
        more = wait_until(lambda: (lambda l: l if l else None)(lines_of(read_output(api, sid, proc["id"], cursor))),
                          30, what="lines after the continue's cursor")
        assert more[0] == before[-1] + 1, (before[-3:], more[:3])


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_an_exec_in_flight_at_the_daemons_end_is_ended_and_its_stream_not_reused(keeping_daemon, driver, how):
    """A plain exec (not a process) running when runtimed goes has lost its client with it: the
    next daemon ends it (its process group killed, as a client's leaving does) and never opens a
    stream under the id the agent still holds it by. Every exec after the start answers: an OPEN
    under that id would be ignored by the agent and its exec wait for its whole timeout."""
    import threading
    d = keeping_daemon
    live_driver(d, driver)
    with d.client() as api:
        sid = api.post("/v1/sandboxes", json={"driver": driver}).json()["id"]
    gone = threading.Event()

    def in_flight():
        # Its own client: the daemon's end breaks its connection.
        try:
            with d.client(timeout=120) as c:
                c.exec(sid, command="echo $$ > /tmp/left.pid; exec sleep 300", timeoutMs=600_000)
        except Exception:
            pass
        gone.set()
    t = threading.Thread(target=in_flight, daemon=True)
    t.start()
    with d.client() as api:
        pid = wait_until(lambda: api.exec(sid, command="cat /tmp/left.pid 2>/dev/null")["stdout"].strip() or None,
                         30, what="the exec in flight running")
    if how == "kill":
        d.kill()
    else:
        assert d.stop() == 0
    assert gone.wait(30), "the exec's connection did not end with the daemon"
    d.start()
    # Each exec opens the next stream id: within these, one lands where the old exec's would.
    with d.client(timeout=30) as api:
        for i in range(16):
            assert api.exec(sid, command=f"echo {i}")["stdout"] == f"{i}\n"
        wait_until(lambda: api.exec(sid, command=f"kill -0 {pid}")["exitCode"] != 0, 30,
                   what="the exec left by the last daemon ended")
        assert api.sandbox(sid)["state"] == "running"
