"""The agent heartbeat and the console tail, through the real daemon.

A sandbox whose processes are alive but whose agent no longer says anything
(a stopped agent, a stopped gVisor sandbox, a stopped QEMU, a hung guest) is
found by the daemon's heartbeat and becomes failed, with the reason, and
nothing of it is left on the host. A sandbox that is busy (streaming output,
or running a long command in silence) is never taken for dead. A guest
kernel that panics leaves the last lines of its console in failureReason.

The tests run on daemons of this module with a short heartbeat
(--heartbeat-interval-ms, --heartbeat-timeout-ms) so that a verdict comes in
seconds: one for namespace and gVisor, one for the microVM with a longer
deadline. A test deletes its sandboxes at its end; none restarts the daemon.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import (Daemon, assert_no_cgroups, assert_no_host_trace, host_pids, proc_cmdline,
                     proc_comm, skip_unless_driver, tail, wait_until)

DRIVERS = [d for d in os.environ.get("RUNTIME_TEST_DRIVERS", "namespace,gvisor").split(",") if d]
INTERVAL_MS = 1000
TIMEOUT_MS = 3000
# A guest under TCG on a loaded 2-core host answers slower: a deadline that
# still ends the test quickly but leaves it room.
MVM_TIMEOUT_MS = 15000
REASON = "the agent stopped answering"

_count = 0


def _start(build_dir, image_dir, tmp_path_factory, timeout_ms: int) -> Daemon:
    global _count
    _count += 1
    return _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("hb") / f"hb-state-{_count}",
                         f"runtime-test-{os.getpid()}-hb{_count}",
                         extra_args=["--heartbeat-interval-ms", str(INTERVAL_MS),
                                     "--heartbeat-timeout-ms", str(timeout_ms)])


def _finish(d: Daemon) -> None:
    if d.alive():
        with d.client() as c:
            for s in c.get("/v1/sandboxes").json().get("sandboxes", []):
                c.delete(f"/v1/sandboxes/{s['id']}")
    _finish_daemon(d)


@pytest.fixture(scope="module")
def hb_daemon(build_dir, image_dir, tmp_path_factory):
    d = _start(build_dir, image_dir, tmp_path_factory, TIMEOUT_MS)
    yield d
    _finish(d)


@pytest.fixture
def hb_api(hb_daemon):
    c = hb_daemon.client()
    yield c
    c.close()  # deletes what the test made
    assert hb_daemon.alive(), f"runtimed died during the test; log:\n{tail(hb_daemon.log_path)}"


@pytest.fixture(params=DRIVERS)
def drv(request, hb_daemon) -> str:
    skip_unless_driver(hb_daemon, request.param)
    return request.param


def _is_agent(pid: int) -> bool:
    argv = proc_cmdline(pid)
    return bool(argv) and ("runtime-agent" in argv[0] or os.path.basename(argv[0]) == "agent"
                           or proc_comm(pid).startswith("runtime-agent"))


def _silence_targets(sid: str, driver: str) -> list[int]:
    """The host processes whose stopping leaves the sandbox alive but mute."""
    pids = host_pids(sid)
    if driver == "namespace":
        found = [p for p in pids if _is_agent(p)]
    elif driver == "gvisor":
        # The sentry (runsc boot) runs the agent; the gofer serves files.
        found = [p for p in pids if "boot" in proc_cmdline(p) or "gofer" in proc_cmdline(p)]
    elif driver == "microvm":
        found = [p for p in pids if any("qemu-system" in a for a in proc_cmdline(p)[:1])]
    else:
        raise ValueError(driver)
    assert found, f"no process to stop for {sid} ({driver}); its processes: " \
                  f"{[(p, proc_cmdline(p)[:4]) for p in pids]}"
    return found


def _stop_processes(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGSTOP)
        except ProcessLookupError:
            pass


def _continue_processes(pids: list[int]) -> None:
    """Left stopped, a process the daemon failed to kill would hang the
    teardown: let it go on at the end whatever happened."""
    for p in pids:
        try:
            os.kill(p, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _assert_fails_silent(api, sbx, driver: str, timeout_ms: int) -> dict:
    other = api.create_sandbox(driver=driver)
    victims = _silence_targets(sbx.id, driver)
    t0 = time.monotonic()
    _stop_processes(victims)
    try:
        # One interval for the ping to go out, the deadline, one second of
        # the maintenance loop's period, and slack for a loaded host.
        limit = (INTERVAL_MS + timeout_ms) / 1000 + 1 + 8
        st = api.wait_state(sbx.id, "failed", limit)
        took = time.monotonic() - t0
        reason = st["failureReason"]
        assert reason and REASON in reason, st
        assert f"no reply for {timeout_ms // 1000} s" in reason, st
        # Not before the deadline: the heartbeat waited for the agent.
        assert took >= timeout_ms / 1000 - 0.5, f"failed after {took:.1f}s, deadline {timeout_ms} ms"
        assert_no_host_trace(sbx.id, 30)
        assert_no_cgroups(sbx.id, 30)
    finally:
        _continue_processes(victims)
    # The others are untouched and the daemon serves.
    assert other.run("echo ok") == "ok\n"
    r = api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "true"})
    assert r.status_code == 409, r.text
    r = api.delete(f"/v1/sandboxes/{sbx.id}")
    assert r.status_code == 200, r.text
    return st


def test_stopped_agent_fails(hb_api, drv):
    sbx = hb_api.create_sandbox(driver=drv)
    assert sbx.run("echo up") == "up\n"
    # Idle for several intervals first: answered pings keep it running.
    time.sleep((INTERVAL_MS + TIMEOUT_MS) / 1000 + 2)
    assert hb_api.sandbox(sbx.id)["state"] == "running"
    _assert_fails_silent(hb_api, sbx, drv, TIMEOUT_MS)


def test_streaming_longer_than_deadline_is_alive(hb_api, drv):
    sbx = hb_api.create_sandbox(driver=drv)
    seconds = 2 * TIMEOUT_MS / 1000 + 2
    cmd = f"end=$((SECONDS+{int(seconds)})); while [ $SECONDS -lt $end ]; do seq 1 5000; done; echo done"
    t0 = time.monotonic()
    got = 0
    last = None
    for _, ev in sbx.exec_stream(command=cmd, timeoutMs=60000):
        if ev["type"] == "stdout":
            got += len(ev["data"]) if "data" in ev else 0
        last = ev
    assert time.monotonic() - t0 >= seconds - 1
    assert last is not None and last["type"] == "exit" and last.get("exitCode") == 0, last
    assert got > 100000, got
    assert hb_api.sandbox(sbx.id)["state"] == "running"
    assert sbx.run("echo still") == "still\n"


def test_silent_command_longer_than_deadline_is_alive(hb_api, drv):
    sbx = hb_api.create_sandbox(driver=drv)
    seconds = 2 * TIMEOUT_MS / 1000 + 2
    res = sbx.exec(f"sleep {seconds}", timeoutMs=60000)
    assert res["exitCode"] == 0 and res["timedOut"] is False, res
    assert res["durationMs"] >= (seconds - 0.5) * 1000, res
    assert hb_api.sandbox(sbx.id)["state"] == "running"
    assert sbx.run("echo still") == "still\n"


def test_flag_bounds(build_dir):
    import subprocess
    for bad in ("999", "600001", "-5", "x"):
        r = subprocess.run([str(build_dir / "runtimed"), "--heartbeat-timeout-ms", bad, "--version"],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "heartbeat-timeout-ms" in r.stderr, (bad, r.returncode, r.stderr)
        r = subprocess.run([str(build_dir / "runtimed"), "--heartbeat-interval-ms", bad, "--version"],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "heartbeat-interval-ms" in r.stderr, (bad, r.returncode, r.stderr)


# ---------------------------------------------------------------------------
# microvm: a stopped QEMU and a guest kernel panic


@pytest.fixture(scope="module")
def mvm_daemon(build_dir, image_dir, tmp_path_factory):
    if not (build_dir / "runtime-microvm-build").exists():
        pytest.skip("build/runtime-microvm-build is missing (the Makefile installs images/microvm/build.sh)")
    d = _start(build_dir, image_dir, tmp_path_factory, MVM_TIMEOUT_MS)
    try:
        skip_unless_driver(d, "microvm")
        yield d
    finally:
        _finish(d)


@pytest.fixture
def mvm_api(mvm_daemon):
    c = mvm_daemon.client()
    yield c
    c.close()  # deletes what the test made
    assert mvm_daemon.alive(), f"runtimed died during the test; log:\n{tail(mvm_daemon.log_path)}"


def test_microvm_stopped_qemu_fails(mvm_api):
    sbx = mvm_api.create_sandbox(driver="microvm", memoryMiB=256, diskMiB=64)
    assert sbx.run("echo up") == "up\n"
    victims = _silence_targets(sbx.id, "microvm")
    t0 = time.monotonic()
    _stop_processes(victims)
    try:
        st = mvm_api.wait_state(sbx.id, "failed", (INTERVAL_MS + MVM_TIMEOUT_MS) / 1000 + 15)
        took = time.monotonic() - t0
        assert REASON in st["failureReason"], st
        assert took >= MVM_TIMEOUT_MS / 1000 - 0.5, took
        assert_no_host_trace(sbx.id, 30)
        assert_no_cgroups(sbx.id, 30)
    finally:
        _continue_processes(victims)


def test_microvm_kernel_panic_leaves_console_tail(mvm_api):
    sbx = mvm_api.create_sandbox(driver="microvm", memoryMiB=256, diskMiB=64)
    assert sbx.run("id -u", user="root").strip() == "0"
    # The exec may or may not come back before the guest is gone.
    r = mvm_api.post(f"/v1/sandboxes/{sbx.id}:exec",
                     json={"command": "echo 1 > /proc/sys/kernel/sysrq; sync; echo c > /proc/sysrq-trigger",
                           "user": "root"},
                     timeout=60)
    assert r.status_code in (200, 409, 500, 503), r.text
    st = mvm_api.wait_state(sbx.id, "failed", 60)
    reason = st["failureReason"]
    print(f"\nfailureReason of a panicked guest: {reason}")
    assert reason, st
    assert "console:" in reason, st
    tail_text = reason.split("console:", 1)[1]
    assert "sysrq" in tail_text.lower() or "Kernel panic" in tail_text, reason
    assert len(tail_text.encode()) <= 1100, len(tail_text)
    assert len(tail_text.strip().splitlines()) <= 8, tail_text
    assert all(ord(ch) >= 0x20 or ch == "\n" for ch in tail_text), repr(tail_text)
    assert_no_host_trace(sbx.id, 30)
    assert_no_cgroups(sbx.id, 30)
    # The daemon's log line carries it too, on one line.
    wait_until(lambda: any(sbx.id in ln and "failed" in ln and "console:" in ln
                           for ln in tail(mvm_api.daemon.log_path, 400).splitlines()),
               5, what="the failure's log line")
