"""A read key's requests are not activity: a dashboard that polls with one never keeps a sandbox
from its idle pause. Its owner may make one whose requests are (`keepsAwake: true`): the sandbox it
polls stays awake while it polls, pauses when it stops, and is not woken by it (a wake spends).
The setting is the key's, shown wherever the key is, and checked when the key is made."""
from __future__ import annotations

import os
import time

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, first_driver

# Short enough for a quick test, long enough that a poll every POLL seconds is well inside it.
IDLE = 2
POLL = 0.25


@pytest.fixture(scope="module")
def quick(build_dir, image_dir, tmp_path_factory):
    """A daemon of its own whose idle pause may be as short as a second."""
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("activity") / "state",
                      f"runtime-test-{os.getpid()}-activity", extra_args=["--idle-pause-min-seconds", "1"])
    yield d
    _finish_daemon(d)


@pytest.fixture
def admin(quick):
    c = Api(quick)
    yield c
    c.close()


def _read_key(admin: Api, name: str, **fields) -> tuple[dict, Api]:
    r = admin.post("/v1/keys", json={"name": name, "access": "read", **fields})
    assert r.status_code == 201, r.text
    return r.json(), Api(admin.daemon, key=r.json()["key"])


def test_keeps_awake_is_the_keys_and_checked(admin):
    made, watcher = _read_key(admin, "watcher", keepsAwake=True)
    plain, poller = _read_key(admin, "poller")
    try:
        assert made["access"] == "read" and made["keepsAwake"] is True, made
        assert plain["keepsAwake"] is False, plain
        # A full key's requests are activity: it says so, and true on one changes nothing.
        r = admin.post("/v1/keys", json={"name": "agent", "keepsAwake": True})
        assert r.status_code == 201 and r.json()["access"] == "full" and r.json()["keepsAwake"] is True, r.text
        full_id = r.json()["id"]
        # Listed as made, and each key sees its own in /v1/me.
        listed = {k["id"]: k for k in admin.get("/v1/keys").json()["keys"]}
        assert listed[made["id"]]["keepsAwake"] is True, listed[made["id"]]
        assert listed[plain["id"]]["keepsAwake"] is False, listed[plain["id"]]
        assert listed[full_id]["keepsAwake"] is True, listed[full_id]
        assert all(isinstance(k["keepsAwake"], bool) for k in listed.values()), listed
        me = watcher.get("/v1/me").json()
        assert me["access"] == "read" and me["keepsAwake"] is True, me
        assert poller.get("/v1/me").json()["keepsAwake"] is False
        assert admin.get("/v1/me").json()["keepsAwake"] is True
        # Still a read key in everything else.
        assert_error(watcher.post("/v1/sandboxes", json={}), 403, "forbidden")
        assert_error(watcher.post("/v1/keys", json={"name": "more", "access": "read", "keepsAwake": True}),
                     403, "forbidden")
        # A boolean, or 400 naming the field; false on a full key is a promise it cannot keep.
        for bad in ("true", 1, 0, None, [], {}):
            assert_error(admin.post("/v1/keys", json={"name": "bad", "access": "read", "keepsAwake": bad}),
                         400, "invalid_request", mentions="keepsAwake")
        assert_error(admin.post("/v1/keys", json={"name": "bad", "keepsAwake": False}), 400, "invalid_request",
                     mentions="keepsAwake")
        assert_error(admin.post("/v1/keys", json={"name": "bad", "access": "full", "keepsAwake": False}), 400,
                     "invalid_request", mentions="keepsAwake")
        assert not [k for k in admin.get("/v1/keys").json()["keys"] if k["name"] == "bad"]
    finally:
        watcher.close()
        poller.close()


def test_a_read_key_keeps_a_sandbox_awake_only_when_made_to(admin):
    driver = first_driver(admin.daemon)
    _, poller = _read_key(admin, "dashboard")
    _, watcher = _read_key(admin, "dashboard-awake", keepsAwake=True)
    try:
        # Two sandboxes polled alike, each by one of the keys: the same route at the same pace.
        idle = admin.create_sandbox(driver=driver, idlePauseSeconds=IDLE)
        kept = admin.create_sandbox(driver=driver, idlePauseSeconds=IDLE)
        assert idle["idlePauseSeconds"] == IDLE and kept["idlePauseSeconds"] == IDLE

        def poll(c: Api, sid: str) -> int:
            return c.get(f"/v1/sandboxes/{sid}/files/stat", params={"path": "/workspace"}).status_code

        def state(sid: str) -> str:
            # A read key's GET of the sandbox is no activity whatever the key.
            return poller.get(f"/v1/sandboxes/{sid}").json()["state"]

        start = time.monotonic()
        paused_after = None
        # Until the plain key's sandbox has paused and the other has been polled awake for twice
        # its idle time.
        while paused_after is None or time.monotonic() - start < 2 * IDLE + POLL:
            assert time.monotonic() - start < IDLE + 20, "the sandbox a plain read key polls never paused"
            code = poll(poller, idle.id)
            assert code in (200, 409), code
            assert poll(watcher, kept.id) == 200
            assert state(kept.id) == "running", "a keepsAwake read key's polling let the sandbox pause"
            if paused_after is None and state(idle.id) == "paused":
                paused_after = time.monotonic() - start
            time.sleep(POLL)
        # On time: its idle time after the create, give or take the daemon's once-a-second check and the
        # pause itself.
        assert paused_after < IDLE + 10, paused_after
        # The plain key's polls of a paused sandbox never woke it.
        assert_error(poller.get(f"/v1/sandboxes/{idle.id}/files/stat", params={"path": "/workspace"}), 409,
                     "conflict")
        assert state(idle.id) == "paused"

        # The polls were what kept it awake: left alone, it pauses too.
        admin.wait_state(kept.id, "paused", IDLE + 20)
        # And the key that kept it awake does not wake it: a wake spends.
        err = assert_error(watcher.get(f"/v1/sandboxes/{kept.id}/files/stat", params={"path": "/workspace"}),
                           409, "conflict")
        assert "read key" in err["message"], err
        assert state(kept.id) == "paused"
    finally:
        poller.close()
        watcher.close()
