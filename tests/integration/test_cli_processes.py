"""CLI verbs for background processes, against the real daemon: spawn, ps, logs [-f], kill."""
from __future__ import annotations

import os
import subprocess

import pytest

from helpers import wait_until


# A client's calls, whose answers do not depend on the driver: by default on namespace only
# (conftest.py, driver_independent); each driver's own behaviour is checked by the tests of it.
pytestmark = pytest.mark.driver_independent


@pytest.fixture
def cli(build_dir, daemon):
    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        e = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        e.update(daemon.env())
        return subprocess.run([str(build_dir / "runtime"), *args], env=e, capture_output=True, timeout=timeout)
    return run


def test_spawn_ps_logs_kill(cli, sandbox):
    r = cli("sandbox", "spawn", sandbox.id, "--", "echo hello; echo oops >&2; sleep 1; exit 3")
    assert r.returncode == 0, r.stderr
    pid = r.stdout.decode().strip()
    assert pid.startswith("proc_") and len(pid) == 21
    r = cli("sandbox", "logs", "-f", sandbox.id, pid)
    assert (r.returncode, r.stdout, r.stderr) == (3, b"hello\n", b"oops\n")
    r = cli("sandbox", "logs", sandbox.id, pid)
    assert r.returncode == 0 and r.stdout == b"hello\n"
    r = cli("sandbox", "spawn", sandbox.id, "--", "sleep", "1000")
    sleeper = r.stdout.decode().strip()
    r = cli("sandbox", "ps", sandbox.id)
    assert r.returncode == 0
    lines = r.stdout.decode().splitlines()
    assert lines[0].split() == ["ID", "STATE", "EXIT", "COMMAND"]
    assert any(line.startswith(pid) and "exited" in line for line in lines), lines
    assert any(line.startswith(sleeper) and "running" in line and "sleep 1000" in line for line in lines)
    r = cli("sandbox", "kill", "-s", "KILL", sandbox.id, sleeper)
    assert r.returncode == 0, r.stderr
    wait_until(lambda: b"killed" in cli("sandbox", "ps", sandbox.id).stdout, 20, 0.2, what="the kill")
    r = cli("--json", "sandbox", "ps", sandbox.id)
    assert b'"data"' in r.stdout


def test_bad_process_arguments(cli, sandbox):
    r = cli("sandbox", "logs", sandbox.id, "proc_nothex")
    assert r.returncode == 2 and b"not a process id" in r.stderr
    r = cli("sandbox", "logs", sandbox.id, "proc_0000000000000000")
    assert r.returncode == 1 and b"no process" in r.stderr
    r = cli("sandbox", "kill", "-s", "SEGV", sandbox.id, "proc_0000000000000000")
    assert r.returncode == 1
    r = cli("sandbox", "spawn", sandbox.id)
    assert r.returncode == 2


def test_ctrl_c_on_exec_ends_the_command(build_dir, daemon, sandbox):
    import signal
    e = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    e.update(daemon.env())
    p = subprocess.Popen([str(build_dir / "runtime"), "sandbox", "exec", sandbox.id, "--",
                          "sh", "-c", "echo $$ > /workspace/cc.pid; echo ready; sleep 1000"],
                         env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        pid = sandbox.run("cat /workspace/cc.pid").strip()
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 130
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    wait_until(lambda: sandbox.exec(f"test -e /proc/{pid}")["exitCode"] != 0, 15, 0.2,
               what="the interrupted command to end")
    states = [x["state"] for x in sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/processes").json()["data"]]
    assert "running" not in states, states
