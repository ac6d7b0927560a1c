"""Copy-on-write snapshots and forks (docs/lifecycle.md, "Snapshots and fork"): on a layer store whose
files share blocks (the XFS pool the fixtures mount at each daemon's state dir, as
scripts/setup.sh does), a fork of a sandbox with a large file writes little new data on the host,
each copy reads the same bytes and diverges on its own writes, and a snapshot taken under write
load is consistent. The pool's allocated blocks are measured (statvfs), not apparent sizes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers import Sandbox, assert_error, layer_pool_skip_reason

MiB = 1 << 20


def need_pool(daemon) -> None:
    if not daemon.layer_pool:
        pytest.skip(f"the daemon's state dir is no layer pool: {layer_pool_skip_reason() or 'see its log'}")


def pool_used(daemon) -> int:
    """Bytes allocated in the pool: a block shared by several files counts once."""
    st = os.statvfs(daemon.state_dir)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def settle_used(daemon, quiet_s: float = 1.0, timeout: float = 60.0) -> int:
    """The pool's usage once it has stopped moving for quiet_s (the daemon's database and the
    sandboxes' logs write on their own), so a before and after compare like with like."""
    deadline = time.monotonic() + timeout
    last, since = pool_used(daemon), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = pool_used(daemon)
        if abs(now - last) > 256 * 1024:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
    return pool_used(daemon)


def sha(sbx, path: str) -> str:
    r = sbx.exec(f"sha256sum {path}", user="root", timeoutMs=600_000)
    assert r["exitCode"] == 0, r
    return r["stdout"].split()[0]


@pytest.mark.microvm_subset
def test_fork_shares_the_sources_blocks(api, driver, daemon):
    need_pool(daemon)
    # Under emulation the microVM writes a few MiB a second: a smaller file there.
    mib = 64 if driver == "microvm" else 256
    src = api.create_sandbox(driver=driver, diskMiB=2048, timeoutSeconds=3600)
    r = src.exec(f"head -c {mib}M /dev/urandom > /workspace/big && sync", timeoutMs=900_000)
    assert r["exitCode"] == 0, r
    digest = sha(src, "/workspace/big")
    before = settle_used(daemon)
    # Two copies; one on the emulated microVM, whose copies' boots write a few MiB each of their own.
    count = 1 if driver == "microvm" else 2
    t0 = time.monotonic()
    r = api.post(f"/v1/sandboxes/{src.id}:fork", json={"count": count}, timeout=900)
    fork_s = time.monotonic() - t0
    assert r.status_code == 201, r.text
    copies = [Sandbox(api, c) for c in r.json()["sandboxes"]]
    api.created.extend(c.id for c in copies)
    after = settle_used(daemon)
    new = after - before
    print(f"\nfork of {count} cop{'y' if count == 1 else 'ies'} of a {driver} sandbox with {mib} MiB written: "
          f"{fork_s:.2f} s, {new / MiB:.1f} MiB new in the pool")
    # The source's blocks are shared, not written again: a copy of them would be `mib` MiB.
    assert new < 10 * MiB, f"{new / MiB:.1f} MiB written for a fork of {mib} MiB"
    for c in copies:
        assert api.sandbox(c.id)["state"] == "running"
        assert sha(c, "/workspace/big") == digest
    # Each diverges on its own writes; the others keep the bytes they had.
    head = src.exec("head -c 6 /workspace/big | od -An -tx1")["stdout"]
    a, rest = copies[0], copies[1:]
    assert a.exec("printf copy-a | dd of=/workspace/big conv=notrunc status=none && sync")["exitCode"] == 0
    assert src.exec("printf source | dd of=/workspace/big conv=notrunc status=none && sync")["exitCode"] == 0
    assert a.exec("head -c 6 /workspace/big")["stdout"] == "copy-a"
    assert src.exec("head -c 6 /workspace/big")["stdout"] == "source"
    for b in rest:
        assert b.exec("head -c 6 /workspace/big | od -An -tx1")["stdout"] == head
        assert sha(b, "/workspace/big") == digest


WRITER = r"""
import sqlite3, sys
db = sqlite3.connect("/workspace/load.db", isolation_level=None)
db.execute("PRAGMA journal_mode=%s" % sys.argv[1])
db.execute("CREATE TABLE IF NOT EXISTS t (i INTEGER PRIMARY KEY, v BLOB)")
i = 0
while True:
    db.execute("BEGIN")
    for _ in range(50):
        db.execute("INSERT INTO t (v) VALUES (randomblob(4096))")
    db.execute("DELETE FROM t WHERE i % 7 = 0 AND i > ?", (i,))
    db.execute("COMMIT")
    i += 50
    if i % 500 == 0:
        print(i, flush=True)
"""


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_snapshot_under_write_load_is_consistent(api, driver, journal):
    src = api.create_sandbox(driver=driver, timeoutSeconds=3600)
    src.write("/workspace/writer.py", WRITER.encode())
    r = api.post(f"/v1/sandboxes/{src.id}/processes", json={"argv": ["python3", "/workspace/writer.py", journal]})
    assert r.status_code == 201, r.text
    proc = r.json()["id"]

    def rows() -> int:
        out = src.exec("python3 -c 'import sqlite3; print(sqlite3.connect(\"file:/workspace/load.db?mode=ro\", "
                       "uri=True).execute(\"SELECT count(*) FROM t\").fetchone()[0])'")
        return int(out["stdout"]) if out["exitCode"] == 0 and out["stdout"].strip().isdigit() else 0

    deadline = time.monotonic() + (600 if driver == "microvm" else 120)
    while rows() < 200:
        assert time.monotonic() < deadline, "the writer made no rows"
        time.sleep(0.5)
    snap = api.post(f"/v1/sandboxes/{src.id}:snapshot", json={}, timeout=900)
    assert snap.status_code == 201, snap.text
    # The writer ran on through the snapshot.
    assert api.get(f"/v1/sandboxes/{src.id}/processes/{proc}").json()["state"] == "running"
    copy = api.create_sandbox(snapshot=snap.json()["id"])
    out = copy.exec("python3 -c 'import sqlite3; db = sqlite3.connect(\"/workspace/load.db\"); "
                    "print(db.execute(\"PRAGMA integrity_check\").fetchone()[0], "
                    "db.execute(\"SELECT count(*) FROM t\").fetchone()[0])'", timeoutMs=600_000)
    assert out["exitCode"] == 0, out
    verdict, count = out["stdout"].split()
    assert verdict == "ok" and int(count) >= 200, out


def test_full_pool_fails_only_that_snapshot(fresh_daemon, any_driver):
    """A pool with no room left answers the snapshot 503 in the API's error shape, keeps no part
    of it, and the source carries on: once there is room, it snapshots again."""
    need_pool(fresh_daemon)
    api = fresh_daemon.client()
    try:
        src = api.create_sandbox(driver=any_driver)
        assert src.exec("head -c 8M /dev/urandom > /workspace/f && sync")["exitCode"] == 0
        digest = sha(src, "/workspace/f")
        fillers = fresh_daemon.state_dir / "fillers"
        fillers.mkdir()
        # posix_fallocate reserves blocks without writing them: the pool's image does not grow.
        # Files of 1 GiB, then smaller ones, until the pool refuses even a block: a clone needs next
        # to no room, so the pool must be quite full for the snapshot to fail.
        n = 0
        for chunk in (1024 * MiB, 64 * MiB, 4 * MiB, MiB, 64 << 10, 4096):
            while True:
                n += 1
                try:
                    fd = os.open(fillers / str(n), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except OSError:
                    break
                try:
                    os.posix_fallocate(fd, 0, chunk)
                except OSError:
                    break
                finally:
                    os.close(fd)
        left = os.statvfs(fresh_daemon.state_dir)
        assert left.f_bavail * left.f_frsize < MiB, left
        r = api.post(f"/v1/sandboxes/{src.id}:snapshot", json={}, timeout=600)
        assert_error(r, 503, "unavailable", mentions="disk space")
        assert api.get("/v1/snapshots").json()["data"] == []
        assert [p.name for p in (fresh_daemon.state_dir / "snapshots").iterdir()] == []
        shutil.rmtree(fillers)
        assert api.sandbox(src.id)["state"] == "running"
        assert sha(src, "/workspace/f") == digest
        r = api.post(f"/v1/sandboxes/{src.id}:snapshot", json={}, timeout=600)
        assert r.status_code == 201, r.text
        copy = api.create_sandbox(snapshot=r.json()["id"])
        assert sha(copy, "/workspace/f") == digest
    finally:
        api.delete_all()
        api.close()


def test_daemon_says_which_copy_it_uses(daemon, build_dir, tmp_path):
    """The log at start-up and `runtimed --doctor` name the path: shared blocks on a pool, sparse
    copies on a filesystem that refuses FICLONE (the daemon works on either)."""
    def doctor(state: Path) -> dict:
        r = subprocess.run([str(build_dir / "runtimed"), "--doctor", "--json", "--state-dir", str(state)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["layerCopies"]
    log = daemon.log_path.read_text(errors="replace")
    if daemon.layer_pool:
        got = doctor(daemon.state_dir)
        assert got["reflink"] is True and "shared blocks" in got["detail"], got
        assert "layer copies (snapshots, forks, new layers): shared blocks" in log
    plain = tmp_path / "plain"
    plain.mkdir()
    got = doctor(plain)
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(plain)], capture_output=True, text=True).stdout.strip()
    if fs in ("ext2/ext3", "ext4", "tmpfs"):
        assert got["reflink"] is False and "sparse copies" in got["detail"], got


def test_daemon_refuses_a_pool_that_is_not_mounted(build_dir, tmp_path):
    """After a reboot the pool's loop mount is gone but its image is still beside the state dir: a
    daemon started then would make a fresh state under it and lose every sandbox and snapshot, so
    it stops and says how to mount the pool again. Nothing is written to the bare directory."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (tmp_path / "state.layer-pool.img").write_bytes(b"")
    r = subprocess.run([str(build_dir / "runtimed"), "--state-dir", str(state), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "is not mounted at" in r.stderr and "layer-pool.sh" in r.stderr, r.stderr
    assert list(state.iterdir()) == [], "the daemon wrote to the bare state dir"
