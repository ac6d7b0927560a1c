"""Uploads in parts across a daemon restart: the registry is in the daemon's database and the parts
in its staging files, so an upload begun before a restart (SIGTERM or SIGKILL, in the middle of its
parts) carries on after it; a part that was answered is kept. A sandbox the SIGKILL left running is
re-attached (live restore) and the commit writes the file; one the stop stopped (these daemons stop
their sandboxes on SIGTERM) answers the commit 409 and keeps the upload, and after a :wake the same
commit writes the file. An upload of a deleted sandbox is gone, another owner's id stays 404, the bounds hold, and
what a crash leaves half-made (a staging file without its row, a row without its file, an upload
idle past its hour) is cleaned up at the next start. The wire calls are the published client's
(POST .../uploads, PUT .../uploads/{id}?offset=, :commit, :abort)."""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import sqlite3
import threading

import httpx
import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import assert_error, skip_unless_driver

CHUNK = 1024 * 1024


def begin(api, sid, path, data, **extra):
    return api.post(f"/v1/sandboxes/{sid}/uploads",
                    json={"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), **extra})


def part(api, sid, uid, data, offset):
    return api.put(f"/v1/sandboxes/{sid}/uploads/{uid}", params={"offset": offset},
                   content=data[offset:offset + CHUNK])


def call(api, sid, uid, verb):
    return api.post(f"/v1/sandboxes/{sid}/uploads/{uid}:{verb}", json={})


def staged(daemon, uid):
    return daemon.state_dir / "uploads" / uid


def commit_after_wake(api, sid, uid, path, data):
    """The commit after the restart: on a sandbox the restart stopped, 409 naming its state with
    the upload kept, then a :wake; then the same commit writes the file."""
    if api.sandbox(sid)["state"] == "stopped":
        r = call(api, sid, uid, "commit")
        assert_error(r, 409, "conflict", mentions="stopped")
        assert "wake" in r.json()["error"]["hint"], r.text
        assert staged(api.daemon, uid).exists(), "a refused commit dropped the upload"
        r = api.post(f"/v1/sandboxes/{sid}:wake", json={})
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
    r = call(api, sid, uid, "commit")
    assert r.status_code == 200 and r.json() == {"path": path, "size": len(data)}, r.text
    out = api.exec(sid, command=f"sha256sum {path}", timeoutMs=120000)
    assert out["stdout"].split()[0] == hashlib.sha256(data).hexdigest(), out
    assert not staged(api.daemon, uid).exists(), "the staging file outlived its commit"
    assert_error(call(api, sid, uid, "commit"), 404, "not_found")


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_upload_carries_on_across_a_restart(fresh_daemon, fresh_api, driver, how):
    skip_unless_driver(fresh_daemon, driver)
    sbx = fresh_api.create_sandbox(driver=driver)
    data = os.urandom(5 * CHUNK + 4321)
    path = "/workspace/across/restart.bin"
    r = begin(fresh_api, sbx.id, path, data, mode="640")
    assert r.status_code == 200, r.text
    uid = r.json()["uploadId"]
    for off in (0, 2 * CHUNK, 5 * CHUNK):  # the short last one among them
        assert part(fresh_api, sbx.id, uid, data, off).status_code == 200
    if how == "sigkill":
        fresh_daemon.kill()
        fresh_daemon.start()
    else:
        fresh_daemon.restart()
    with fresh_daemon.client() as api:
        # A kill leaves it running for the start to re-attach (the microVM's ends with the
        # daemon); the stop of these test daemons stops it.
        want = "running" if how == "sigkill" and driver != "microvm" else "stopped"
        assert api.get(f"/v1/sandboxes/{sbx.id}").json()["state"] == want
        # Still missing parts: the kept ones are not asked for again, the others are.
        assert_error(call(api, sbx.id, uid, "commit"), 409, "conflict", mentions=str(CHUNK))
        for off in (CHUNK, 3 * CHUNK, 4 * CHUNK):
            r = part(api, sbx.id, uid, data, off)
            assert r.status_code == 200 and r.json() == {"offset": off, "size": CHUNK}, r.text
        commit_after_wake(api, sbx.id, uid, path, data)
        assert api.get(f"/v1/sandboxes/{sbx.id}/files/stat", params={"path": path}).json()["mode"] == "0640"


def test_parts_answered_before_a_kill_are_kept(fresh_daemon, fresh_api):
    """SIGKILL while eight parts are in flight: every part that was answered is kept (the client
    sends only the others again, and the SHA-256 at the commit proves the bytes); the ones cut
    without an answer are sent again."""
    skip_unless_driver(fresh_daemon, "namespace")
    sbx = fresh_api.create_sandbox(driver="namespace")
    data = os.urandom(48 * CHUNK)
    uid = begin(fresh_api, sbx.id, "/workspace/killed.bin", data).json()["uploadId"]
    answered: set[int] = set()
    lock = threading.Lock()
    enough = threading.Event()

    def send(off):
        try:
            with httpx.Client(base_url=fresh_daemon.base_url, timeout=60,
                              headers={"Authorization": f"Bearer {fresh_daemon.api_key}"}) as c:
                r = part(c, sbx.id, uid, data, off)
        except httpx.HTTPError:
            return
        if r.status_code == 200:
            with lock:
                answered.add(off)
                if len(answered) >= 6:
                    enough.set()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(send, off) for off in range(0, len(data), CHUNK)]
        assert enough.wait(120), f"only {len(answered)} parts answered"
        fresh_daemon.kill()
        for f in futures:
            f.result()
    kept = set(answered)
    assert 6 <= len(kept) < 48, len(kept)
    fresh_daemon.start()
    with fresh_daemon.client() as api:
        for off in range(0, len(data), CHUNK):
            if off not in kept:
                assert part(api, sbx.id, uid, data, off).status_code == 200
        commit_after_wake(api, sbx.id, uid, "/workspace/killed.bin", data)


def test_deleted_sandbox_other_owner_bounds_and_leftovers(fresh_daemon, fresh_api):
    skip_unless_driver(fresh_daemon, "namespace")
    api = fresh_api
    doomed = api.create_sandbox(driver="namespace")
    kept = api.create_sandbox(driver="namespace")
    data = os.urandom(2 * CHUNK + 1)
    gone = begin(api, doomed.id, "/workspace/d.bin", data).json()["uploadId"]
    assert part(api, doomed.id, gone, data, 0).status_code == 200
    # Eight in progress on one sandbox: the bound.
    ids = []
    for i in range(8):
        r = begin(api, kept.id, f"/workspace/k{i}.bin", data)
        assert r.status_code == 200, r.text
        ids.append(r.json()["uploadId"])
    assert part(api, kept.id, ids[0], data, 0).status_code == 200
    # Deleting the sandbox drops its upload at once, file and all.
    assert api.delete(f"/v1/sandboxes/{doomed.id}").status_code == 200
    assert not staged(fresh_daemon, gone).exists()
    assert_error(part(api, doomed.id, gone, data, CHUNK), 404, "not_found")
    # Another owner.
    r = api.post("/v1/keys", json={"name": "uploads-other", "owner": "uploads-other"})
    assert r.status_code == 201, r.text
    other_key = r.json()["key"]

    fresh_daemon.stop()
    # What a crash can leave: a staging file without its row, a row without its file, and an
    # upload idle past its hour.
    stray = fresh_daemon.state_dir / "uploads" / "upl_00000000000000ff"
    stray.write_bytes(b"left by a crash")
    staged(fresh_daemon, ids[1]).unlink()
    db = sqlite3.connect(fresh_daemon.state_dir / "runtime.db")
    with db:
        db.execute("UPDATE uploads SET touched_at = touched_at - 3700 WHERE id = ?", (ids[2],))
    db.close()
    fresh_daemon.start()

    with fresh_daemon.client() as api2, fresh_daemon.client(key=other_key) as other:
        assert not stray.exists(), "a staging file without its row survived the start"
        assert not staged(fresh_daemon, ids[2]).exists(), "an upload idle past its hour survived the start"
        for uid in (ids[1], ids[2]):
            assert_error(part(api2, kept.id, uid, data, 0), 404, "not_found")
        assert_error(part(api2, doomed.id, gone, data, 0), 404, "not_found")
        # Another owner's id stays 404 on every route, and does not touch it.
        assert_error(part(other, kept.id, ids[0], data, CHUNK), 404, "not_found")
        assert_error(call(other, kept.id, ids[0], "abort"), 404, "not_found")
        assert_error(call(other, kept.id, ids[0], "commit"), 404, "not_found")
        # Six left of eight: two more fit, a ninth does not.
        assert api2.post(f"/v1/sandboxes/{kept.id}:wake", json={}).status_code == 200
        for i in (8, 9):
            assert begin(api2, kept.id, f"/workspace/k{i}.bin", data).status_code == 200
        assert_error(begin(api2, kept.id, "/workspace/k10.bin", data), 429, "rate_limited")
        # The one with a part kept finishes.
        for off in (CHUNK, 2 * CHUNK):
            assert part(api2, kept.id, ids[0], data, off).status_code == 200
        r = call(api2, kept.id, ids[0], "commit")
        assert r.status_code == 200, r.text
        assert api2.exec(kept.id, command="sha256sum /workspace/k0.bin")["stdout"].split()[0] == \
            hashlib.sha256(data).hexdigest()
        rows = sqlite3.connect(fresh_daemon.state_dir / "runtime.db").execute(
            "SELECT count(*) FROM uploads WHERE sandbox_id = ?", (doomed.id,)).fetchone()[0]
        assert rows == 0


def test_a_lower_file_bound_holds_after_a_restart(build_dir, image_dir, tmp_path):
    """An upload begun under --max-file-mib 8 and restored under 2 is dropped: the bound holds
    across the restart."""
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-upb",
                      ["--max-file-mib", "8"])
    try:
        with d.client() as api:
            skip_unless_driver(d, "namespace")
            sbx = api.create_sandbox(driver="namespace")
            data = os.urandom(4 * CHUNK)
            uid = begin(api, sbx.id, "/workspace/b.bin", data).json()["uploadId"]
            small = os.urandom(CHUNK + 1)
            fits = begin(api, sbx.id, "/workspace/s.bin", small).json()["uploadId"]
        d.stop()
        d.extra_args = ["--max-file-mib", "2"]
        d.start()
        with d.client() as api:
            assert_error(part(api, sbx.id, uid, data, 0), 404, "not_found")
            assert not staged(d, uid).exists()
            assert part(api, sbx.id, fits, small, 0).status_code == 200
            assert api.delete(f"/v1/sandboxes/{sbx.id}").status_code == 200
            assert not staged(d, fits).exists()
    finally:
        _finish_daemon(d)
