"""The daemon killed (SIGKILL) in the middle of a pause or a fork leaves nothing half-made: no
snapshot listed that no one asked to keep, no snapshot files on the host that no row names, and
the sandbox it worked on `stopped` with its files, ready to wake. They run without live restore
(test_live_restore.py is the kill of a daemon whose sandboxes have supervisors). (A kill in the middle of a
snapshot is test_snapshots.py's test_restart_mid_snapshot_leaves_no_half_snapshot; one while
paused, test_lifecycle.py's test_daemon_killed_while_paused.)"""
from __future__ import annotations

import threading

import pytest

from helpers import host_pids, proc_comm, skip_unless_driver, wait_until


def _in_flight(api, path: str, body: dict) -> threading.Thread:
    """Sends a request whose answer never comes (the daemon is killed under it)."""
    def send():
        try:
            api.post(path, json=body, timeout=300)
        except Exception:  # no answer is the point
            pass
    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


def _kill_and_start(daemon, thread) -> None:
    daemon.kill()
    thread.join(30)
    daemon.start()


def _nothing_half_made(daemon, api) -> None:
    snaps = daemon.state_dir / "snapshots"
    listed = api.get("/v1/snapshots").json()["data"]
    assert listed == [], f"a snapshot no one kept is listed after the restart: {listed}"
    left = sorted(p.name for p in snaps.iterdir()) if snaps.exists() else []
    assert left == [], f"snapshot files left on the host: {left}"


def test_daemon_killed_in_the_middle_of_a_pause(fresh_daemon, fresh_api):
    """Killed while :pause has the sandbox sync its files (the step before the freeze)."""
    skip_unless_driver(fresh_daemon, "namespace")
    fresh_daemon.without_live_restore()
    sbx = fresh_api.create_sandbox(driver="namespace", diskMiB=2048)
    sbx.exec("head -c 64 /dev/urandom > /workspace/kept && sync && "
             "head -c 400M /dev/zero > /workspace/dirty", timeoutMs=300000)
    t = _in_flight(fresh_api, f"/v1/sandboxes/{sbx.id}:pause", {})
    syncing = wait_until(lambda: [p for p in host_pids(sbx.id) if proc_comm(p) == "sync"] or
                         (not t.is_alive() and "done"), 60, 0.005, what="the pause's sync in the sandbox")
    if syncing == "done":
        pytest.skip("the pause's sync ended before it could be seen on this host (nothing dirty left)")
    _kill_and_start(fresh_daemon, t)
    with fresh_daemon.client() as api:
        st = api.sandbox(sbx.id)
        assert st["state"] == "stopped" and st["failureReason"] == "daemon restarted", st
        wait_until(lambda: not host_pids(sbx.id), 20, what=f"the processes of {sbx.id} to be gone")
        _nothing_half_made(fresh_daemon, api)
        r = api.post(f"/v1/sandboxes/{sbx.id}:wake", json={})
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        assert api.exec(sbx.id, command="test -s /workspace/kept && echo ok")["stdout"] == "ok\n"
        # It pauses and wakes as before.
        assert api.post(f"/v1/sandboxes/{sbx.id}:pause", json={}).json()["state"] == "paused"
        assert api.post(f"/v1/sandboxes/{sbx.id}:wake", json={}).json()["state"] == "running"


@pytest.mark.parametrize("keep", [False, True])
def test_daemon_killed_in_the_middle_of_a_fork(fresh_daemon, fresh_api, keep):
    """Killed after the fork's snapshot is made and while its copies are being made: the
    snapshot, which only keepSnapshot asks to keep, is not listed after the restart, and no
    file of it is left; with keepSnapshot it is whole and usable."""
    skip_unless_driver(fresh_daemon, "namespace")
    fresh_daemon.without_live_restore()
    src = fresh_api.create_sandbox(driver="namespace")
    src.write("/workspace/f.txt", b"forked")
    t = _in_flight(fresh_api, f"/v1/sandboxes/{src.id}:fork", {"count": 16, "keepSnapshot": keep})
    # A copy listed: the snapshot is recorded and the copies are being made from it.
    with fresh_daemon.client() as look:
        wait_until(lambda: len(look.get("/v1/sandboxes").json()["data"]) > 1 or not t.is_alive(), 120, 0.01,
                   what="the fork's first copy")
    if not t.is_alive():
        pytest.skip("the fork of 16 copies ended before its snapshot could be seen on this host")
    _kill_and_start(fresh_daemon, t)
    with fresh_daemon.client() as api:
        if keep:
            listed = api.get("/v1/snapshots").json()["data"]
            assert len(listed) == 1 and listed[0]["sandboxId"] == src.id, listed
            r = api.post("/v1/sandboxes", json={"snapshot": listed[0]["id"]})
            assert r.status_code == 201, r.text
            copy = r.json()["id"]
            assert api.get(f"/v1/sandboxes/{copy}/files/content",
                           params={"path": "/workspace/f.txt"}).content == b"forked"
        else:
            _nothing_half_made(fresh_daemon, api)
        # The copies made before the kill are sandboxes in a true state, stopped by the restart.
        for s in api.get("/v1/sandboxes").json()["data"]:
            assert s["state"] in ("running", "stopped"), s
        r = api.post(f"/v1/sandboxes/{src.id}:wake", json={})
        assert r.status_code == 200, r.text
        assert api.get(f"/v1/sandboxes/{src.id}/files/content",
                       params={"path": "/workspace/f.txt"}).content == b"forked"
