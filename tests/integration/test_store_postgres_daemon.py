"""runtimed on PostgreSQL (--database postgresql://...): the same daemon, its state in a database
server instead of the state directory's file. Sandboxes, keys, idempotency, snapshots, egress
secrets, uploads and the ledger go through the PostgreSQL store; a restart finds them all there.
The server is the suite's own (helpers/postgres.py), a database of its own per test."""
from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error


@pytest.fixture
def pg_daemon(build_dir, image_dir, tmp_path, postgres):
    db = f"rt_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {db}")
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-pg",
                      extra_args=["--database", postgres.url(db)])
    yield d, db
    _finish_daemon(d)


def test_a_daemon_keeps_its_state_in_postgresql(pg_daemon, postgres, any_driver):
    d, db = pg_daemon
    api = Api(d)
    try:
        # No database file: the rows are the server's.
        assert not (d.state_dir / "runtime.db").exists()
        sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=300, name="on-pg", labels={"a": "b"})
        assert sbx.run("echo hi") == "hi\n"
        assert postgres.psql(f"SELECT state FROM sandboxes WHERE id = '{sbx.id}'", db).strip() == "running"
        # Keys: one made through the API authenticates; a read key cannot create.
        r = api.post("/v1/keys", json={"name": "reader", "access": "read"})
        assert r.status_code == 201, r.text
        reader = Api(d, key=r.json()["key"])
        assert reader.get(f"/v1/sandboxes/{sbx.id}").json()["name"] == "on-pg"
        assert_error(reader.post("/v1/sandboxes", json={}), 403, "forbidden")
        reader.close()
        # An Idempotency-Key: the retry replays the first answer.
        key = f"pg-{uuid.uuid4().hex}"
        first = api.post("/v1/sandboxes", json={"driver": any_driver}, headers={"Idempotency-Key": key})
        assert first.status_code == 201, first.text
        again = api.post("/v1/sandboxes", json={"driver": any_driver}, headers={"Idempotency-Key": key})
        assert again.json()["id"] == first.json()["id"]
        api.delete(f"/v1/sandboxes/{first.json()['id']}")
        # get-or-create by name finds the one there is.
        r = api.post("/v1/sandboxes", json={"driver": any_driver, "name": "on-pg", "getOrCreate": True})
        assert r.status_code == 200 and r.json()["id"] == sbx.id and r.json()["reused"], r.text
        # An egress secret.
        r = api.put("/v1/egress-secrets/TOKEN", json={"value": "s3cret", "hosts": ["api.example.com"]})
        assert r.status_code in (200, 201), r.text
        assert api.get("/v1/egress-secrets/TOKEN").status_code == 200
        # An upload in parts, committed.
        data = b"x" * 1000
        r = api.post(f"/v1/sandboxes/{sbx.id}/uploads",
                     json={"path": "/workspace/up.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        assert r.status_code == 200, r.text
        uid = r.json()["uploadId"]
        assert api.put(f"/v1/sandboxes/{sbx.id}/uploads/{uid}", params={"offset": 0}, content=data).status_code == 200
        assert api.post(f"/v1/sandboxes/{sbx.id}/uploads/{uid}:commit", json={}).status_code == 200
        assert sbx.read("/workspace/up.bin") == data
        # A snapshot, and a sandbox made from it.
        sbx.write("/workspace/kept.txt", b"kept")
        r = api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={"name": "snap"})
        assert r.status_code in (200, 201), r.text
        snap = r.json()["id"]
        assert postgres.psql(f"SELECT count(*) FROM snapshots WHERE id = '{snap}'", db).strip() == "1"
        copy = api.create_sandbox(driver=any_driver, snapshot=snap)
        assert copy.read("/workspace/kept.txt") == b"kept"
        api.delete(f"/v1/sandboxes/{copy.id}")
        # The ledger: the sandbox's charge is open in the database.
        assert int(postgres.psql(f"SELECT count(*) FROM ledger WHERE sandbox_id = '{sbx.id}'", db)) >= 1
        # A restart: the daemon finds its sandbox (stopped, as a stop of the daemon leaves it),
        # wakes it on its files, and the secret and the snapshot are still there.
        # A claim a daemon left pending (it died serving the request) is dropped at the next
        # start, which holds the database alone: a retry then runs again.
        postgres.psql("INSERT INTO idempotency (owner, key, hash, status, created_at) "
                      "VALUES ('admin', 'left-pending', 'h', 0, 1)", db)
        d.stop()
        d.start()
        assert postgres.psql("SELECT count(*) FROM idempotency WHERE status = 0", db).strip() == "0"
        st = api.get(f"/v1/sandboxes/{sbx.id}").json()
        assert st["state"] == "stopped", st
        r = api.post(f"/v1/sandboxes/{sbx.id}:wake", json={})
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        assert sbx.read("/workspace/kept.txt") == b"kept"
        assert api.get("/v1/egress-secrets/TOKEN").status_code == 200
        assert api.get(f"/v1/snapshots/{snap}").status_code == 200
        usage = api.get("/v1/usage").json()
        assert usage, usage
    finally:
        api.close()


def test_a_database_of_a_newer_daemon_is_refused(build_dir, image_dir, tmp_path, postgres):
    db = f"rt_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {db}")
    postgres.psql("CREATE TABLE store_versions (kind TEXT PRIMARY KEY, version BIGINT NOT NULL);"
                  "INSERT INTO store_versions VALUES ('postgres', 999)", db)
    from helpers import Daemon, DaemonError
    d = Daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-pgnew",
               ["--database", postgres.url(db)])
    try:
        with pytest.raises(DaemonError) as e:
            d.start()
    finally:
        d.release_layer_pool()
    assert "newer runtimed" in str(e.value) or "newer" in d.log_path.read_text(), e.value
    # The URL (it may hold a password) is never in runtimed's own lines (the harness's "===="
    # line names its command line).
    own = [line for line in d.log_path.read_text().splitlines() if not line.startswith("====")]
    assert not any(postgres.url(db) in line for line in own), own


def test_one_runtimed_a_database(pg_daemon, build_dir, image_dir, tmp_path, postgres):
    # A second runtimed on the same database (another state directory) refuses to start: it would
    # take the first's running sandboxes for a crashed daemon's.
    d, db = pg_daemon
    from helpers import Daemon, DaemonError
    other = Daemon(build_dir, image_dir, tmp_path / "other", f"runtime-test-{os.getpid()}-pg2",
                   ["--database", postgres.url(db)])
    try:
        with pytest.raises(DaemonError):
            other.start()
    finally:
        other.release_layer_pool()
    assert "another runtimed uses the database of --database" in other.log_path.read_text()
    assert Api(d).get("/healthz").status_code == 200


def test_one_runtimed_a_state_directory(fresh_daemon, build_dir, image_dir):
    from helpers import Daemon, DaemonError
    other = Daemon(build_dir, image_dir, fresh_daemon.state_dir, f"runtime-test-{os.getpid()}-state2")
    try:
        with pytest.raises(DaemonError):
            other.start()
    finally:
        other.release_layer_pool()
    assert "another runtimed uses the state directory" in other.log_path.read_text()
