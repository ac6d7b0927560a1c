"""Lifecycle: :pause keeps memory and processes (the cgroup freezer on namespace and gVisor, QMP's
stop on the microVM), :wake carries the same processes on, :stop then :wake (or :restart) boots
the sandbox again from its disk; leases, idle time and auto-wake drive the same transitions; the
heartbeat spares a paused sandbox; a daemon killed while one is paused leaves it stopped, ready to
wake. What is driver-independent runs on one driver; what a driver does runs on each (a subset on
the emulated microVM)."""
from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from datetime import datetime

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, cgroup_dirs, host_pids, wait_until

# A loop whose count lives only in its shell's memory: a restarted process would count from 1.
COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; sleep 0.05; done"


def start_counter(api, sbx) -> str:
    r = api.post(f"/v1/sandboxes/{sbx.id}/processes", json={"command": COUNTER})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def count(sbx) -> int:
    out = sbx.exec("cat /workspace/n 2>/dev/null || echo 0")["stdout"].strip()
    return int(out or 0)


def pause(api, sid: str, status: int = 200) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}:pause", json={})
    assert r.status_code == status, r.text
    return r.json()


def wake(api, sid: str, **body) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}:wake", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def freezer_frozen(sid: str) -> bool | None:
    """The host's word on the sandbox's cgroup: None where it has no freezer file."""
    seen = None
    for d in cgroup_dirs(sid):
        for name, frozen in (("freezer.state", "FROZEN"), ("cgroup.freeze", "1")):
            p = d / name
            if p.exists():
                value = p.read_text().strip()
                if value == frozen:
                    return True
                seen = False
    return seen


def cpu_usage_ns(sid: str) -> int | None:
    for d in cgroup_dirs(sid):
        p = d / "cpuacct.usage"
        if p.exists():
            return int(p.read_text())
        p = d / "cpu.stat"
        if p.exists():
            for line in p.read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "usage_usec":
                    return int(v) * 1000
    return None


def runsc_state(api, sid: str) -> str:
    """runsc's word on a gVisor sandbox: running, paused, ..."""
    state = api.daemon.state_dir / "sandboxes" / sid / "runsc-state"
    runsc = os.environ.get("RUNTIME_RUNSC") or shutil.which("runsc", path="/usr/local/bin:/usr/bin:/usr/sbin")
    out = subprocess.run([runsc, "--root", str(state), "state", sid], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["status"]


def steady_for(seconds: float, read, what: str):
    """Observes read() for `seconds` and asserts it never changes: the subject here is that
    nothing happens over a stretch of time, so the test watches it rather than sleeping."""
    first = read()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = read()
        assert now == first, f"{what} changed from {first!r} to {now!r}"
        time.sleep(0.1)
    return first


@pytest.mark.microvm_subset
def test_pause_keeps_processes_and_wake_carries_on(api, driver):
    sbx = api.create_sandbox(driver=driver, autoWake=False, timeoutSeconds=900)
    pid = start_counter(api, sbx)
    bound = 240 if driver == "microvm" else 60
    wait_until(lambda: count(sbx) >= 20, bound, 0.2, what="the counter reached 20")
    before = count(sbx)
    got = pause(api, sbx.id)
    assert got["state"] == "paused" and got["pausedAt"] and got["leaseEndsAt"] is None, got
    assert api.sandbox(sbx.id)["state"] == "paused"
    if driver == "namespace":
        assert freezer_frozen(sbx.id) is True, "the sandbox's cgroup is not frozen"
        usage = cpu_usage_ns(sbx.id)
        if usage is not None:
            steady_for(1.0, lambda: cpu_usage_ns(sbx.id), "CPU time of a paused sandbox")
    if driver == "gvisor":
        # Stopped inside its Sentry (runsc pause), not frozen: the Sentry and
        # its gofer idle, their housekeeping all the CPU they take.
        assert runsc_state(api, sbx.id) == "paused"
        assert freezer_frozen(sbx.id) is not True
        usage = cpu_usage_ns(sbx.id)
        if usage is not None:
            t0 = time.monotonic()
            time.sleep(2.0)
            used = (cpu_usage_ns(sbx.id) - usage) / 1e9 / (time.monotonic() - t0)
            assert used < 0.05, f"a paused gVisor sandbox took {used:.1%} of a CPU"
    # Paused, without auto-wake: a command is refused with the state, nothing runs.
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "true"}), 409, "conflict",
                 mentions="paused")
    run_before = api.sandbox(sbx.id)["runSeconds"]
    woke = wake(api, sbx.id)
    assert woke["state"] == "running" and woke["pausedAt"] is None and woke["leaseEndsAt"], woke
    assert woke["runSeconds"] == run_before
    if driver == "namespace":
        assert freezer_frozen(sbx.id) is False
    if driver == "gvisor":
        assert runsc_state(api, sbx.id) == "running"
    after = count(sbx)
    # The same loop: its count carries on from where it stood (a new one would start at 1).
    assert after >= before, (before, after)
    wait_until(lambda: count(sbx) > after, bound, 0.2, what="the counter to carry on")
    proc = api.get(f"/v1/sandboxes/{sbx.id}/processes/{pid}").json()
    assert proc["state"] == "running", proc


def test_transitions_refused_say_the_state(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver)
    err = assert_error(api.post(f"/v1/sandboxes/{sbx.id}:wake", json={}), 409, "not_paused",
                       mentions="running")
    assert "not paused" in err["message"]
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:pause", json={"now": True}), 400, "invalid_request",
                 mentions="now")
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:wake", json={"timeoutSeconds": 0}), 400,
                 "invalid_request", mentions="timeoutSeconds")
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:wake", json={"timeoutSeconds": "9"}), 400,
                 "invalid_request", mentions="timeoutSeconds")
    assert pause(api, sbx.id)["state"] == "paused"
    # Pausing a paused sandbox is where it was asked to be.
    assert pause(api, sbx.id)["state"] == "paused"
    r = api.post(f"/v1/sandboxes/{sbx.id}:stop", json={})
    assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:pause", json={}), 409, "conflict", mentions="stopped")
    # Another owner's sandbox is not there at all.
    key = api.post("/v1/keys", json={"name": "other-owner", "owner": "someone-else"})
    assert key.status_code == 201, key.text
    other = Api(api.daemon, key=key.json()["key"])
    try:
        for verb in ("pause", "wake", "restart"):
            assert_error(other.post(f"/v1/sandboxes/{sbx.id}:{verb}", json={}), 404, "not_found")
    finally:
        other.close()
    assert_error(api.post("/v1/sandboxes/sbx_00000000000000000000:pause", json={}), 404, "not_found",
                 mentions="no sandbox")


def test_pausable_false_refuses(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, pausable=False)
    assert sbx["pausable"] is False
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:pause", json={}), 409, "conflict", mentions="pausable")
    assert_error(api.post("/v1/sandboxes", json={"pausable": False, "onLeaseEnd": "pause"}), 400,
                 "invalid_request", mentions="pausable")
    assert_error(api.post("/v1/sandboxes", json={"onLeaseEnd": "hibernate"}), 400, "invalid_request",
                 mentions="onLeaseEnd")
    assert_error(api.post("/v1/sandboxes", json={"idlePauseSeconds": -1}), 400, "invalid_request",
                 mentions="idlePauseSeconds")
    assert_error(api.post("/v1/sandboxes", json={"autoWake": "yes"}), 400, "invalid_request",
                 mentions="autoWake")


def test_auto_wake_serves_a_paused_sandbox(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver)
    assert sbx["autoWake"] is True
    sbx.write("/workspace/a.txt", b"kept")
    pause(api, sbx.id)
    # A read key looks but never wakes (a wake spends), nor calls the transitions.
    rk = api.post("/v1/keys", json={"name": "lifecycle-read", "access": "read"})
    assert rk.status_code == 201, rk.text
    reader = Api(api.daemon, key=rk.json()["key"])
    try:
        r = reader.get(f"/v1/sandboxes/{sbx.id}/files/content", params={"path": "/workspace/a.txt"})
        assert_error(r, 409, "conflict", mentions="read key")
        assert_error(reader.post(f"/v1/sandboxes/{sbx.id}:wake", json={}), 403, "forbidden")
        assert reader.get(f"/v1/sandboxes/{sbx.id}").json()["state"] == "paused"
    finally:
        reader.close()
    # A command and a file call each wake it first.
    assert sbx.run("echo hi") == "hi\n"
    assert api.sandbox(sbx.id)["state"] == "running"
    pause(api, sbx.id)
    assert sbx.read("/workspace/a.txt") == b"kept"
    assert api.sandbox(sbx.id)["state"] == "running"
    # Many requests at once to a paused sandbox: one wakes it, every one is served.
    pause(api, sbx.id)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: api.post(f"/v1/sandboxes/{sbx.id}:exec",
                                                   json={"command": f"echo {i}"}), range(8)))
    for i, r in enumerate(results):
        assert r.status_code == 200 and r.json()["stdout"] == f"{i}\n", r.text


@pytest.mark.microvm_subset
@pytest.mark.parametrize("verb", ["wake", "restart"])
def test_stop_then_boot_from_disk(api, driver, verb):
    if driver == "microvm" and verb == "restart":
        pytest.skip("the emulated microVM boots from its disk here by :wake; its :restart runs in "
                    "test_published_client_lifecycle.py (each boot takes tens of seconds under TCG)")
    sbx = api.create_sandbox(driver=driver)
    sbx.write("/workspace/kept.txt", b"files stay")
    pid = start_counter(api, sbx)
    wait_until(lambda: count(sbx) >= 1, 240 if driver == "microvm" else 60, 0.2, what="the counter")
    r = api.post(f"/v1/sandboxes/{sbx.id}:stop", json={})
    assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
    assert not host_pids(sbx.id)
    r = api.post(f"/v1/sandboxes/{sbx.id}:{verb}", json={})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["state"] == "running" and got["failureReason"] is None and got["leaseEndsAt"], got
    assert sbx.read("/workspace/kept.txt") == b"files stay"
    # Memory is not kept: the loop is gone and its process with it.
    assert "while :" not in sbx.exec("ps -eo args")["stdout"]
    proc = api.get(f"/v1/sandboxes/{sbx.id}/processes/{pid}")
    assert proc.status_code == 404 or proc.json()["state"] != "running", proc.text


def test_restart_of_running_and_paused(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver)
    sbx.write("/workspace/f", b"1")
    boot = sbx.run("cat /proc/sys/kernel/random/boot_id; echo $$")
    r = api.post(f"/v1/sandboxes/{sbx.id}:restart", json={})
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    assert sbx.read("/workspace/f") == b"1"
    pause(api, sbx.id)
    r = api.post(f"/v1/sandboxes/{sbx.id}:restart", json={})
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    assert sbx.read("/workspace/f") == b"1"
    assert sbx.run("echo ok") == "ok\n"
    assert boot  # the first boot answered too


def test_paused_sandbox_is_billed_for_its_disk_only(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, diskMiB=1024)
    got = pause(api, sbx.id)
    run = got["runSeconds"]
    steady_for(2.2, lambda: api.sandbox(sbx.id)["runSeconds"], "runSeconds of a paused sandbox")
    assert api.sandbox(sbx.id)["runSeconds"] == run
    usage = api.get("/v1/usage").json()
    text = repr(usage)
    assert f"{sbx.id}:disk" in text, usage
    woke = wake(api, sbx.id)
    assert woke["state"] == "running"
    wait_until(lambda: api.sandbox(sbx.id)["runSeconds"] > run, 15, 0.2,
               what="running time to count again after the wake")


def test_concurrent_transitions_serialise(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver)
    verbs = ["pause", "wake"] * 6

    def call(verb):
        r = api.post(f"/v1/sandboxes/{sbx.id}:{verb}", json={})
        return verb, r.status_code, r.json()

    with concurrent.futures.ThreadPoolExecutor(len(verbs)) as pool:
        results = list(pool.map(call, verbs))
    for verb, status, body in results:
        if status == 200:
            assert body["state"] in ("paused", "running"), body
            assert body["state"] == ("paused" if verb == "pause" else "running"), (verb, body)
        else:
            assert status == 409, (verb, status, body)
            assert body["error"]["code"] == "not_paused" and verb == "wake", body
    state = api.sandbox(sbx.id)["state"]
    assert state in ("paused", "running")
    if state == "paused":
        wake(api, sbx.id)
    assert sbx.run("echo alive") == "alive\n"


def test_lease_end_pauses_and_wake_gives_a_new_lease(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=2, onLeaseEnd="pause")
    assert sbx["onLeaseEnd"] == "pause"
    st = api.wait_state(sbx.id, "paused", 20)
    assert st["leaseEndsAt"] is None and st["pausedAt"], st
    woke = wake(api, sbx.id, timeoutSeconds=600)
    assert woke["state"] == "running"
    # The old lease's timer does not fire again on the new one.
    steady_for(3.0, lambda: api.sandbox(sbx.id)["state"], "state after a wake with a new lease")
    assert sbx.run("echo ok") == "ok\n"


@pytest.fixture
def quick_daemon(build_dir, image_dir, tmp_path):
    """A daemon whose idle pause may be short and whose heartbeat is fast."""
    d = _start_daemon(build_dir, image_dir, tmp_path / "state",
                               f"runtime-test-{os.getpid()}-lifecycle",
                               extra_args=["--idle-pause-min-seconds", "1", "--heartbeat-interval-ms", "1000",
                                           "--heartbeat-timeout-ms", "2000"])
    yield d
    if d.alive():
        with d.client() as c:
            for s in c.get("/v1/sandboxes").json().get("sandboxes", []):
                c.delete(f"/v1/sandboxes/{s['id']}")
    _finish_daemon(d)


def test_idle_pause_and_the_heartbeat(quick_daemon, any_driver):
    with quick_daemon.client() as api:
        r = api.post("/v1/sandboxes", json={"driver": any_driver, "idlePauseSeconds": 2})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert r.json()["idlePauseSeconds"] == 2
        api.wait_state(sid, "paused", 30)
        # Paused for well past the heartbeat's 2 s timeout: not failed.
        steady_for(4.0, lambda: api.get(f"/v1/sandboxes/{sid}").json()["state"], "a paused sandbox's state")
        r = api.post(f"/v1/sandboxes/{sid}:exec", json={"command": "echo back"})
        assert r.status_code == 200 and r.json()["stdout"] == "back\n", r.text
        # Awake again and answering its heartbeat: a command keeps it busy, then it idles again.
        api.wait_state(sid, "paused", 30)
        api.delete(f"/v1/sandboxes/{sid}")


def test_a_read_keys_requests_do_not_keep_it_awake(quick_daemon, any_driver):
    """A dashboard that polls with a read key (files, the sandbox) never keeps a sandbox from its
    idle pause; a full key's commands do."""
    with quick_daemon.client() as api:
        r = api.post("/v1/keys", json={"name": "dashboard", "access": "read"})
        assert r.status_code == 201, r.text
        read_key = r.json()["key"]
        r = api.post("/v1/sandboxes", json={"driver": any_driver, "idlePauseSeconds": 3})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        # A full key's commands every half second: still running after twice the idle time.
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            r = api.post(f"/v1/sandboxes/{sid}:exec", json={"command": "true"})
            assert r.status_code == 200, r.text
            time.sleep(0.5)
        assert api.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        # The read key polls as often: the sandbox pauses all the same.
        headers = {"Authorization": f"Bearer {read_key}"}
        deadline = time.monotonic() + 30.0
        state = "running"
        while time.monotonic() < deadline and state != "paused":
            r = api.get(f"/v1/sandboxes/{sid}/files/list", params={"path": "/"}, headers=headers)
            assert r.status_code in (200, 409), r.text
            state = api.get(f"/v1/sandboxes/{sid}", headers=headers).json()["state"]
            time.sleep(0.5)
        assert state == "paused", "a read key's polling kept the sandbox awake"
        api.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.parametrize("live", [True, False], ids=["live-restore", "no-live-restore"])
def test_daemon_killed_while_paused(fresh_daemon, fresh_api, any_driver, live):
    """With live restore a paused sandbox is still paused after the daemon's kill and start, and
    its wake carries on the same processes; without, it is recorded stopped and its wake boots it
    from its files."""
    if not live:
        fresh_daemon.without_live_restore()
    sbx = fresh_api.create_sandbox(driver=any_driver)
    sbx.write("/workspace/kept.txt", b"still here")
    proc = fresh_api.post(f"/v1/sandboxes/{sbx.id}/processes", json={"command": "sleep 100000"}).json()
    pause(fresh_api, sbx.id)
    os.kill(fresh_daemon.pid, signal.SIGKILL)
    fresh_daemon.proc.wait(30)
    fresh_daemon.start()
    st = fresh_api.sandbox(sbx.id)
    if live and any_driver != "microvm":
        assert st["state"] == "paused", st
        woke = wake(fresh_api, sbx.id)
        assert woke["state"] == "running", woke
        p = fresh_api.get(f"/v1/sandboxes/{sbx.id}/processes/{proc['id']}").json()
        assert p["state"] == "running", p
    else:
        assert st["state"] == "stopped" and st["failureReason"] == "daemon restarted", st
        assert not host_pids(sbx.id)
        woke = wake(fresh_api, sbx.id)
        assert woke["state"] == "running", woke
    assert sbx.read("/workspace/kept.txt") == b"still here"


def test_sdk_pause_wake_restart(daemon, any_driver, monkeypatch):
    """Our SDK's pause(), wake() and restart(), sync and async, against the daemon."""
    import asyncio
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
    from withruntime import AsyncSandbox, Sandbox
    from withruntime.errors import ConflictError, NotPausedError
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    with Sandbox.create(driver=any_driver, auto_wake=False, idle_pause_seconds=0) as sbx:
        sbx.files.write("/workspace/f.txt", "kept")
        assert sbx.pause().state == "paused"
        with pytest.raises(ConflictError) as e:
            sbx.exec("true")
        assert "paused" in str(e.value)
        assert sbx.wake().state == "running"
        # Awake already: done, not an error; with a new lease asked for, the refusal.
        assert sbx.wake().state == "running"
        with pytest.raises(NotPausedError):
            sbx.wake(timeout_seconds=60)
        # An Idempotency-Key replays the first answer instead of pausing again.
        pause_key = f"lifecycle-p-{uuid.uuid4().hex}"  # keys are the owner's, across its sandboxes
        assert sbx.pause(idempotency_key=pause_key).state == "paused"
        sbx.wake()
        assert sbx.pause(idempotency_key=pause_key).state == "paused"
        assert sbx.refresh().state == "running"
        sbx.stop()
        assert sbx.restart(idempotency_key=f"lifecycle-r-{uuid.uuid4().hex}").state == "running"
        assert sbx.files.read("/workspace/f.txt") == b"kept" or sbx.files.read("/workspace/f.txt") == "kept"

    async def run_async():
        async with await AsyncSandbox.create(driver=any_driver) as a:
            assert (await a.pause()).state == "paused"
            assert (await a.wake(timeout_seconds=120)).state == "running"
            assert (await a.restart()).state == "running"
            r = await a.exec("echo async")
            assert r.stdout == "async\n"
    asyncio.run(run_async())


def test_cli_pause_wake_restart(api, any_driver, build_dir):
    import subprocess
    sbx = api.create_sandbox(driver=any_driver)
    env = {**os.environ, **api.daemon.env()}
    cli = str(build_dir / "runtime")

    def run(*args):
        return subprocess.run([cli, *args], capture_output=True, text=True, env=env, timeout=120)

    r = run("sandbox", "pause", sbx.id)
    assert r.returncode == 0 and r.stdout == f"{sbx.id}: paused\n", (r.stdout, r.stderr)
    r = run("sandbox", "wake", "--lease", "10m", sbx.id)
    assert r.returncode == 0 and r.stdout == f"{sbx.id}: running\n", (r.stdout, r.stderr)
    r = run("sandbox", "wake", sbx.id)
    assert r.returncode == 1 and "not paused" in r.stderr, (r.stdout, r.stderr)
    r = run("sandbox", "wake", "--lease", "forever", sbx.id)
    assert r.returncode == 2, (r.stdout, r.stderr)
    r = run("--json", "sandbox", "restart", sbx.id)
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout)["state"] == "running"
    r = run("sandbox", "pause", "sbx_00000000000000000000")
    assert r.returncode == 1 and "no sandbox" in r.stderr, (r.stdout, r.stderr)
    r = run("sandbox", "pause")
    assert r.returncode == 2, (r.stdout, r.stderr)


def test_exec_in_flight_across_a_long_pause(api, any_driver):
    """A buffered exec waiting when its sandbox is paused for longer than the exec's own bound
    plus the daemon's grace for a silent agent (15 s) is not taken for a wedged agent: after the
    wake it answers, and the sandbox is not failed."""
    sbx = api.create_sandbox(driver=any_driver, autoWake=False)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(api.post, f"/v1/sandboxes/{sbx.id}:exec",
                          json={"command": "touch /workspace/started; sleep 1; echo done", "timeoutMs": 1000})
        wait_until(lambda: sbx.stat("/workspace/started").json().get("exists") is True, 30, 0.02,
                   what="the command to start")
        pause(api, sbx.id)
        steady_for(17.0, lambda: (api.sandbox(sbx.id)["state"], fut.done()), "a paused sandbox and its exec")
        wake(api, sbx.id)
        r = fut.result(timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["timedOut"] or r.json()["stdout"] == "done\n", r.json()
    assert api.sandbox(sbx.id)["state"] == "running"
    assert sbx.run("echo ok") == "ok\n"


def test_wait_for_a_state(api, any_driver):
    """GET ?waitFor=STATE&timeoutSeconds=N, the published client's server-side wait: answers once
    the sandbox is in the state, or as it is at the bound."""
    sbx = api.create_sandbox(driver=any_driver)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(api.get, f"/v1/sandboxes/{sbx.id}", params={"waitFor": "paused", "timeoutSeconds": 60})
        wait_until(lambda: fut.running() or fut.done(), 10, 0.01, what="the wait to be sent")
        pause(api, sbx.id)
        r = fut.result(timeout=90)
    assert r.status_code == 200 and r.json()["state"] == "paused", r.text
    t = time.monotonic()
    r = api.get(f"/v1/sandboxes/{sbx.id}", params={"waitFor": "stopped", "timeoutSeconds": 0})
    assert r.status_code == 200 and r.json()["state"] == "paused" and time.monotonic() - t < 5, r.text
    for bad in ({"waitFor": "asleep"}, {"waitFor": "paused", "timeoutSeconds": "121"},
                {"waitFor": "paused", "timeoutSeconds": "-1"}, {"waitFor": "paused", "timeoutSeconds": "1e3"}):
        assert_error(api.get(f"/v1/sandboxes/{sbx.id}", params=bad), 400, "invalid_request")


def test_wake_reserves_its_lease_against_the_daily_limit(api, any_driver):
    """A wake spends again: its lease is reserved like an :extend, and a refusal leaves the
    sandbox as it was (paused stays paused)."""
    key = api.post("/v1/keys", json={"name": "lifecycle-limited", "dailyLimitMicros": 300})
    assert key.status_code == 201, key.text
    limited = Api(api.daemon, key=key.json()["key"])
    try:
        sbx = limited.create_sandbox(driver=any_driver, timeoutSeconds=60)  # 209 micro-dollars held
        pause(limited, sbx.id)
        err = assert_error(limited.post(f"/v1/sandboxes/{sbx.id}:wake", json={"timeoutSeconds": 3600}), 402,
                           "spending_limit_reached")
        assert "daily limit" in err["message"], err
        assert limited.sandbox(sbx.id)["state"] == "paused"
        assert wake(limited, sbx.id)["state"] == "running"  # what the pause left fits
    finally:
        limited.close()


def test_update_lease_of_a_paused_sandbox_applies_at_the_wake(api, driver):
    """:update with timeoutSeconds on a paused sandbox keeps it paused with no lease running, and
    its wake gives it that lease counted from the wake; a lease past maxTotalCostMicros is refused
    and changes nothing; a stopped sandbox has no lease to update."""
    sbx = api.create_sandbox(driver=driver, timeoutSeconds=60, maxTotalCostMicros=2000, vcpu=1, memoryMiB=64)
    pause(api, sbx.id)
    r = api.post(f"/v1/sandboxes/{sbx.id}:update", json={"timeoutSeconds": 600, "labels": {"l": "1"}})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["state"] == "paused" and got["leaseEndsAt"] is None and got["labels"] == {"l": "1"}, got
    # 2000 micro-dollars buy about 12 minutes of this sandbox: a day's lease does not fit.
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json={"timeoutSeconds": 86400, "labels": {"l": "2"}}),
                 409, "budget_exceeded", mentions="maxTotalCostMicros")
    assert api.sandbox(sbx.id)["labels"] == {"l": "1"}
    before = time.time()
    woke = wake(api, sbx.id)
    after = time.time()
    assert woke["state"] == "running", woke
    ends = datetime.fromisoformat(woke["leaseEndsAt"].replace("Z", "+00:00")).timestamp()
    assert before + 600 - 2 <= ends <= after + 600 + 2, (before, ends, after)
    assert sbx.run("echo ok") == "ok\n"
    assert api.post(f"/v1/sandboxes/{sbx.id}:stop", json={}).status_code == 200
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json={"timeoutSeconds": 600}), 409, "conflict",
                 mentions="stopped")
