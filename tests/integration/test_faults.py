"""Faults from outside: the agent or its launcher killed on the host, the
daemon killed and restarted. Afterwards every sandbox is in a true state,
the daemon serves, and nothing of a dead sandbox is left on the host."""
from __future__ import annotations

import os
import signal
import time
import uuid
import warnings

import httpx
import pytest

from helpers import (assert_error, assert_no_cgroups, assert_no_host_trace, cgroup_dirs, host_pids,
                     layer_read,
                     proc_alive, proc_cmdline, proc_comm, proc_identity, proc_ppid,
                     skip_unless_driver, wait_until)


# Faults differ per driver (what dies, what is left): every test here runs on the microVM too.
pytestmark = pytest.mark.microvm_subset


def _is_agent(pid: int) -> bool:
    argv = proc_cmdline(pid)
    return bool(argv) and ("runtime-agent" in argv[0] or os.path.basename(argv[0]) == "agent"
                           or proc_comm(pid).startswith("runtime-agent"))


def find_victim(sid: str, what: str) -> int:
    pids = host_pids(sid)
    if what == "agent":
        found = [p for p in pids if _is_agent(p)]
    elif what == "bwrap":
        found = [p for p in pids if proc_comm(p) == "bwrap"]
        # the outermost launcher: one whose parent is not itself a bwrap
        found = [p for p in found if proc_comm(proc_ppid(p) or 0) != "bwrap"] or found
    elif what == "runsc-sandbox":
        found = [p for p in pids if "boot" in proc_cmdline(p)]
    elif what == "runsc-gofer":
        found = [p for p in pids if "gofer" in proc_cmdline(p)]
    else:
        raise ValueError(what)
    if not found:
        pytest.fail(f"no {what} process of {sid} found on the host; its processes: "
                    f"{[(p, proc_cmdline(p)[:4]) for p in pids]}")
    return found[0]


VICTIMS = [("namespace", "agent"), ("namespace", "bwrap"),
           ("gvisor", "runsc-sandbox"), ("gvisor", "runsc-gofer")]


@pytest.mark.parametrize("drv,what", VICTIMS, ids=[f"{d}-{w}" for d, w in VICTIMS])
def test_killed_from_outside_becomes_failed(api, daemon, drv, what):
    skip_unless_driver(daemon, drv)
    sbx = api.create_sandbox(driver=drv)
    other = api.create_sandbox(driver=drv)
    sbx.write("/workspace/kept.txt", b"kept")
    victim = find_victim(sbx.id, what)
    os.kill(victim, signal.SIGKILL)
    st = api.wait_state(sbx.id, "failed", 20)
    assert st["failureReason"], f"failed without a reason: {st}"
    # a failed sandbox refuses exec and files with 409, and the daemon serves
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "true"}), 409, "conflict")
    assert_error(sbx.get_file("/workspace/kept.txt"), 409, "conflict")
    assert other.run("echo ok") == "ok\n"
    assert api.create_sandbox(driver=drv).run("echo new") == "new\n"
    # nothing of it keeps running on the host (the failed state released it)
    assert_no_host_trace(sbx.id, 20)
    # delete removes the rest
    r = api.delete(f"/v1/sandboxes/{sbx.id}")
    assert r.status_code == 200 and r.json() == {"id": sbx.id, "state": "deleted"}, r.text
    assert_no_cgroups(sbx.id)


def test_exec_in_flight_when_agent_dies(api, daemon):
    skip_unless_driver(daemon, "namespace")
    sbx = api.create_sandbox(driver="namespace")
    victim = find_victim(sbx.id, "agent")
    events = []
    ev = sbx.exec_stream(command="echo up; sleep 60")
    for _, e in ev:
        events.append(e)
        if e["type"] == "stdout":
            os.kill(victim, signal.SIGKILL)
    assert events[-1]["type"] == "error", f"a stream cut by a dead sandbox must end with an error: {events}"
    assert {"code", "message"} <= set(events[-1]["error"]), events[-1]
    api.wait_state(sbx.id, "failed", 20)


def test_stop_and_delete(api, driver, daemon):
    sbx = api.create_sandbox(driver=driver)
    sbx.write("/workspace/f.txt", b"data")
    r = api.post(f"/v1/sandboxes/{sbx.id}:stop")
    assert r.status_code == 200, r.text
    st = r.json()
    assert st["state"] == "stopped" and st["stoppedAt"], st
    assert_no_host_trace(sbx.id)
    # stopping again is a no-op
    r = api.post(f"/v1/sandboxes/{sbx.id}:stop")
    assert r.status_code == 200 and r.json()["state"] == "stopped"
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "true"}), 409, "conflict")
    assert_error(sbx.get_file("/workspace/f.txt"), 409, "conflict")
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:extend", json={"seconds": 60}), 409, "conflict")
    kept = layer_read(daemon.state_dir, sbx.id, "/workspace/f.txt")
    if kept is None:
        warnings.warn(f"cannot read the writable layer of {sbx.id} from the host to check its files")
    else:
        assert kept == b"data", "a stopped sandbox lost its files"
    assert any(s["id"] == sbx.id and s["state"] == "stopped"
               for s in api.get("/v1/sandboxes").json()["sandboxes"])
    r = api.delete(f"/v1/sandboxes/{sbx.id}")
    assert r.status_code == 200 and r.json() == {"id": sbx.id, "state": "deleted"}
    assert_error(api.delete(f"/v1/sandboxes/{sbx.id}"), 404, "not_found")
    assert_error(api.get(f"/v1/sandboxes/{sbx.id}"), 404, "not_found")
    assert_no_cgroups(sbx.id)


def test_delete_running_leaves_nothing(api, driver, daemon):
    sbx = api.create_sandbox(driver=driver)
    sbx.run("sleep 1000 >/dev/null 2>&1 & echo started")
    assert host_pids(sbx.id), "no host process found for a running sandbox"
    assert cgroup_dirs(sbx.id), "no cgroup found for a running sandbox"
    r = api.delete(f"/v1/sandboxes/{sbx.id}")
    assert r.status_code == 200
    assert_no_host_trace(sbx.id)
    assert_no_cgroups(sbx.id)
    left = [str(p) for p in daemon.state_dir.rglob(f"*{sbx.id}*")]
    assert not left, f"files of a deleted sandbox left in the state dir: {left}"


def _snapshot(sid: str) -> list[tuple[int, int]]:
    return [i for i in (proc_identity(p) for p in host_pids(sid)) if i]


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_daemon_restart_keeps_true_states(fresh_daemon, fresh_api, driver, how):
    skip_unless_driver(fresh_daemon, driver)
    api = fresh_api
    running = api.create_sandbox(driver=driver, name="running-one")
    stopped = api.create_sandbox(driver=driver, name="stopped-one")
    marker = uuid.uuid4().hex.encode()
    running.write("/workspace/keep.txt", marker)
    stopped.write("/workspace/keep.txt", marker)
    running.run("sleep 1000 >/dev/null 2>&1 & echo bg")
    assert api.post(f"/v1/sandboxes/{stopped.id}:stop").status_code == 200
    before = _snapshot(running.id)
    assert before, "no host processes for the running sandbox"

    if how == "sigkill":
        fresh_daemon.kill()
    else:
        assert fresh_daemon.stop() == 0, "runtimed did not exit 0 on SIGTERM"
    fresh_daemon.start()
    api = fresh_daemon.client()
    try:
        listed = {s["id"]: s for s in api.get("/v1/sandboxes").json()["sandboxes"]}
        assert running.id in listed and stopped.id in listed, listed.keys()
        assert listed[stopped.id]["state"] == "stopped", listed[stopped.id]
        for sid in (stopped.id,) + ((running.id,) if listed[running.id]["state"] != "running" else ()):
            kept = layer_read(fresh_daemon.state_dir, sid, "/workspace/keep.txt")
            if kept is None:
                warnings.warn(f"cannot read the writable layer of {sid} from the host")
            else:
                assert kept == marker, f"{sid} lost its files across the restart"
        assert_error(api.get(f"/v1/sandboxes/{stopped.id}/files/content",
                             params={"path": "/workspace/keep.txt"}), 409, "conflict")
        st = listed[running.id]
        assert st["state"] in ("running", "stopped", "failed"), st
        if st["state"] == "running":
            # re-attached: it must really work, files and all
            r = api.post(f"/v1/sandboxes/{running.id}:exec", json={"command": "cat keep.txt"})
            assert r.status_code == 200 and r.json()["stdout"] == marker.decode(), r.text
        else:
            if st["state"] == "failed":
                assert st["failureReason"], st
            # no process of the old sandbox remains on the host, no cgroup
            wait_until(lambda: not any(proc_alive(i) for i in before), 20,
                       what=f"old processes of {running.id} to be gone: "
                            f"{[i for i in before if proc_alive(i)]}")
            assert_no_host_trace(running.id)
            assert_no_cgroups(running.id)
            assert_error(api.post(f"/v1/sandboxes/{running.id}:exec", json={"command": "true"}),
                         409, "conflict")
        # the restarted daemon still makes working sandboxes
        r = api.post("/v1/sandboxes", json={"driver": driver})
        assert r.status_code == 201, r.text
        new = r.json()["id"]
        r = api.post(f"/v1/sandboxes/{new}:exec", json={"command": "echo fine"})
        assert r.json()["stdout"] == "fine\n"
        # deleting everything leaves nothing on the host
        for sid in (running.id, stopped.id, new):
            assert api.delete(f"/v1/sandboxes/{sid}").status_code == 200
        for sid in (running.id, stopped.id, new):
            assert_no_host_trace(sid)
            assert_no_cgroups(sid)
    finally:
        api.close()


def test_daemon_survives_many_sandboxes_dying(api, daemon):
    """Several sandboxes failing at once do not take the daemon down."""
    skip_unless_driver(daemon, "namespace")
    sbxs = [api.create_sandbox(driver="namespace") for _ in range(5)]
    for s in sbxs:
        os.kill(find_victim(s.id, "agent"), signal.SIGKILL)
    for s in sbxs:
        api.wait_state(s.id, "failed", 20)
    assert httpx.get(daemon.base_url + "/healthz").status_code == 200
    assert api.create_sandbox(driver="namespace").run("echo ok") == "ok\n"


def test_delete_while_exec_runs(api, driver):
    sbx = api.create_sandbox(driver=driver)
    import threading
    out = {}

    def long_exec():
        try:
            out["r"] = api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "sleep 60"},
                                timeout=90)
        except httpx.HTTPError as e:
            out["e"] = e
    t = threading.Thread(target=long_exec)
    t.start()
    time.sleep(1)
    t0 = time.monotonic()
    assert api.delete(f"/v1/sandboxes/{sbx.id}").status_code == 200
    t.join(30)
    assert not t.is_alive(), "an exec outlived the deletion of its sandbox"
    assert time.monotonic() - t0 < 30
    if "r" in out:
        assert out["r"].status_code in (200, 404, 409, 503), out["r"].text
    assert_no_host_trace(sbx.id)
