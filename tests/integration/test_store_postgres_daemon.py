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
from helpers import Api, assert_error, wait_until


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


def test_two_hosts_share_a_database(build_dir, image_dir, tmp_path, postgres, any_driver):
    # Two runtimed on one database (each its own state directory): each works on its own
    # sandboxes only. A second host's start, its recovery and its stop leave the first's running
    # sandbox alone; a host killed is declared dead after --host-dead-after-seconds, and its
    # sandbox becomes lost, with the reason, for every host; restarted, it comes back with a new
    # epoch and brings none of it back.
    db = f"rt_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {db}")
    args = ["--database", postgres.url(db), "--host-dead-after-seconds", "3",
            "--sandbox-metrics-interval-seconds", "1"]
    a = _start_daemon(build_dir, image_dir, tmp_path / "a", f"runtime-test-{os.getpid()}-pga",
                      extra_args=[*args, "--host-id", "host-a"])
    # The admin key is made once, by the first host on an empty database; the operator hands the
    # same file to the others (keys are the database's: one works on every host).
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "admin.key").write_text((a.state_dir / "admin.key").read_text())
    try:
        b = _start_daemon(build_dir, image_dir, tmp_path / "b", f"runtime-test-{os.getpid()}-pgb",
                          extra_args=[*args, "--host-id", "host-b"])
    except BaseException:
        _finish_daemon(a)
        raise
    api_a, api_b = Api(a), Api(b)
    try:
        on_a = api_a.create_sandbox(driver=any_driver, timeoutSeconds=300)
        on_b = api_b.create_sandbox(driver=any_driver, timeoutSeconds=300)
        hosts = {h["id"]: h for h in api_b.get("/v1/hosts").json()["hosts"]}
        assert hosts["host-a"]["state"] == "live" and hosts["host-b"]["state"] == "live", hosts
        assert postgres.psql(f"SELECT host_id FROM sandboxes WHERE id = '{on_a.id}'", db).strip() == "host-a"
        assert postgres.psql(f"SELECT host_id FROM sandboxes WHERE id = '{on_b.id}'", db).strip() == "host-b"
        # A snapshot's home is the host that made it; an Idempotency-Key is the fleet's: the
        # same create sent to the other host answers the first's sandbox.
        r = api_a.post(f"/v1/sandboxes/{on_a.id}:snapshot", json={"name": "home-a"})
        assert r.status_code in (200, 201), r.text
        snap = r.json()["id"]
        assert postgres.psql(f"SELECT host_id FROM snapshots WHERE id = '{snap}'", db).strip() == "host-a"
        key = f"fleet-{uuid.uuid4().hex}"
        first = api_a.post("/v1/sandboxes", json={"driver": any_driver}, headers={"Idempotency-Key": key})
        assert first.status_code == 201, first.text
        again = api_b.post("/v1/sandboxes", json={"driver": any_driver}, headers={"Idempotency-Key": key})
        assert again.status_code == 201 and again.json()["id"] == first.json()["id"], again.text
        api_a.delete(f"/v1/sandboxes/{first.json()['id']}")
        # getOrCreate of one name sent to both hosts at once makes one sandbox.
        from concurrent.futures import ThreadPoolExecutor

        def goc(d):
            with Api(d, key=a.api_key) as c:
                r = c.post("/v1/sandboxes", json={"driver": any_driver, "name": "one-of-a-kind",
                                                  "getOrCreate": True})
                assert r.status_code in (200, 201), r.text
                return r.json()["id"]
        with ThreadPoolExecutor(6) as pool:
            ids = set(pool.map(goc, [a, b] * 3))
        assert len(ids) == 1, ids
        api_a.delete(f"/v1/sandboxes/{ids.pop()}")
        # Each host counts the answers it gave, and the database sums them: b writes its counts
        # as it stops.
        r = api_a.post("/v1/keys", json={"name": "counted", "owner": "counted"})
        assert r.status_code == 201, r.text
        counted = r.json()["key"]
        for d, n in ((a, 2), (b, 3)):
            with Api(d, key=counted) as c:
                for _ in range(n):
                    assert c.get("/v1/sandboxes").status_code == 200
        # A sandbox's readings are the store's: the other host answers them itself (each
        # reads its own sandboxes).
        def readings(api, sid):
            r = api.get(f"/v1/sandboxes/{sid}/metrics", params={"range": "15m"})
            assert r.status_code == 200, r.text
            return r.json()["points"]
        wait_until(lambda: readings(api_b, on_a.id) and readings(api_a, on_b.id), 30,
                   what="each host's readings seen from the other")
        # b's restart recovers b's sandboxes only: a's keeps running and answering, and a's
        # snapshot (its files on a) is neither removed nor charged twice.
        b.restart()
        assert api_b.get(f"/v1/snapshots/{snap}").status_code == 200
        with Api(a, key=counted) as c:
            assert c.get("/v1/usage/requests").json()["requests"] == "5"
        assert on_a.run("echo still") == "still\n"
        assert api_a.get(f"/v1/sandboxes/{on_a.id}").json()["state"] == "running"
        assert api_a.get(f"/v1/sandboxes/{on_b.id}").json()["state"] == "stopped"
        r = api_b.post(f"/v1/sandboxes/{on_b.id}:wake", json={})
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        epoch_before = {h["id"]: h["epoch"] for h in api_a.get("/v1/hosts").json()["hosts"]}["host-b"]
        # b dies: a, the only other host, declares it dead and its sandbox lost.
        b.kill()
        st = api_a.wait_state(on_b.id, "lost", timeout=30)
        assert "host-b" in (st.get("failureReason") or ""), st
        assert st["stoppedAt"], st
        hosts = {h["id"]: h for h in api_a.get("/v1/hosts").json()["hosts"]}
        assert hosts["host-b"]["state"] == "dead", hosts
        assert readings(api_a, on_b.id), "a lost sandbox's readings, from the host that is left"
        assert api_a.get(f"/v1/sandboxes/{on_b.id}/metrics").json()["latest"], "its newest reading"

        assert on_a.run("echo alive") == "alive\n"
        # a swept: its metrics say so, and what it sees of the fleet.
        metrics = api_a.get("/metrics").text
        assert "\nruntime_host_sweeper 1\n" in metrics
        assert 'runtime_fleet_hosts{state="dead"} 1' in metrics
        assert "runtime_fleet_sandboxes_lost_total 1" in metrics
        assert 'runtime_host_epoch{host="host-a"} 1' in metrics
        # The loss is an event of the sandbox's owner, and the host's death one of the admin's.
        lost = api_a.get("/v1/events", params={"resourceId": on_b.id, "type": "sandbox.lost"}).json()["data"]
        assert len(lost) == 1 and "host-b" in lost[0]["data"]["reason"], lost
        assert lost[0]["keyId"] is None and lost[0]["hostId"] == "host-a"
        dead = api_a.get("/v1/events", params={"resourceId": "host-b", "type": "host.dead"}).json()["data"]
        assert len(dead) == 1 and dead[0]["resourceType"] == "host", dead
        # Its charge was settled (closed) by a, not left open.
        assert postgres.psql(f"SELECT count(*) FROM ledger WHERE sandbox_id = '{on_b.id}' AND open = 1",
                             db).strip() == "0"
        # A lost sandbox does not boot again; it can be deleted.
        r = api_a.post(f"/v1/sandboxes/{on_b.id}:wake", json={})
        assert_error(r, 409, r.json()["error"]["code"])
        # b comes back: a new epoch, live again, and its lost sandbox stays lost.
        b.start()
        hosts = {h["id"]: h for h in api_a.get("/v1/hosts").json()["hosts"]}
        assert hosts["host-b"]["state"] == "live" and hosts["host-b"]["epoch"] > epoch_before, hosts
        assert api_a.get(f"/v1/sandboxes/{on_b.id}").json()["state"] == "lost"
        assert api_a.delete(f"/v1/sandboxes/{on_b.id}").status_code in (200, 204)
    finally:
        api_a.close()
        api_b.close()
        _finish_daemon(b)
        _finish_daemon(a)


def test_one_runtimed_a_state_directory(fresh_daemon, build_dir, image_dir):
    from helpers import Daemon, DaemonError
    other = Daemon(build_dir, image_dir, fresh_daemon.state_dir, f"runtime-test-{os.getpid()}-state2")
    try:
        with pytest.raises(DaemonError):
            other.start()
    finally:
        other.release_layer_pool()
    assert "another runtimed uses the state directory" in other.log_path.read_text()


def _postgres_down(server) -> None:
    """Stops the server as a lost link would look from runtimed: every connection gone, no new
    one taken. Its data directory stays for _postgres_up."""
    server.proc.terminate()
    server.proc.wait(30)


def _postgres_up(server) -> None:
    import subprocess
    import time
    from helpers.postgres import PG_BIN
    server.proc = subprocess.Popen(
        ["runuser", "-u", "postgres", "--", str(PG_BIN / "postgres"), "-D", str(server.data),
         "-k", str(server.sock), "-c", "listen_addresses=", "-c", "fsync=off", "-p", str(server.port)],
        stdout=open(server.dir / "log", "ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while subprocess.run([str(PG_BIN / "pg_isready"), "-h", str(server.sock), "-p", str(server.port)],
                         capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "postgres did not come back"
        time.sleep(0.1)


def test_a_host_cut_off_from_the_database_fences_itself(build_dir, image_dir, tmp_path, any_driver):
    # The database goes away under a host: within the dead-after time it stops its sandboxes and
    # answers 503 host_fenced; when the database is back it registers at a new epoch and its
    # sandbox is lost, not running again. A server of the test's own: the suite's is shared.
    import subprocess
    from helpers import wait_until
    from helpers.postgres import PostgresServer
    server = PostgresServer().start()
    d = None
    try:
        server.psql("CREATE DATABASE fence")
        d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-fence",
                          extra_args=["--database", server.url("fence"), "--host-dead-after-seconds", "3",
                                      "--host-id", "host-cut"])
        api = Api(d)
        sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=300)
        marker = f"sleep {31000 + os.getpid() % 1000}.5"
        r = api.post(f"/v1/sandboxes/{sbx.id}/processes", json={"command": marker})
        assert r.status_code in (200, 201), r.text

        def running() -> bool:
            return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0
        wait_until(running, 10, what="the sandbox's process")
        epoch = next(h["epoch"] for h in api.get("/v1/hosts").json()["hosts"] if h["id"] == "host-cut")

        _postgres_down(server)
        wait_until(lambda: api.get("/healthz").status_code == 503, 15, interval=0.2, what="the fence")
        assert_error(api.get(f"/v1/sandboxes/{sbx.id}"), 503, "host_fenced")
        # /metrics is not fenced, but its key is checked in the store, which is gone.
        assert_error(api.get("/metrics"), 503, "unavailable")
        wait_until(lambda: not running(), 15, interval=0.2, what="the sandbox's process to be stopped")
        assert "is fenced" in d.log_path.read_text()

        _postgres_up(server)
        wait_until(lambda: api.get("/healthz").status_code == 200, 30, interval=0.2, what="the host to rejoin")
        st = api.get(f"/v1/sandboxes/{sbx.id}").json()
        assert st["state"] == "lost" and "cut off" in st["failureReason"], st
        again = next(h for h in api.get("/v1/hosts").json()["hosts"] if h["id"] == "host-cut")
        assert again["epoch"] > epoch and again["state"] == "live", again
        assert api.create_sandbox(driver=any_driver, timeoutSeconds=60).run("echo back") == "back\n"
        api.close()
    finally:
        if d is not None:
            _finish_daemon(d)
        server.stop()


def test_volumes_in_postgresql(pg_daemon, postgres):
    """Volumes on the PostgreSQL store: made, attached (one writer: a second create is refused by
    the database's index), kept across a restart, backed up (with a retention, and a policy kept
    across the restart, then a cron and keep counts) and deleted."""
    d, db = pg_daemon
    from helpers import skip_unless_driver
    skip_unless_driver(d, "namespace")
    c = Api(d)
    try:
        vol = c.post("/v1/volumes", json={"sizeMiB": 16, "name": "pg"})
        assert vol.status_code == 201, vol.text
        vid = vol.json()["id"]
        s = c.create_sandbox(driver="namespace", volumes=[{"volumeId": vid, "path": "/data"}])
        assert c.exec(s.id, command="echo pg > /data/f && sync")["exitCode"] == 0
        assert_error(c.post("/v1/sandboxes", json={"driver": "namespace",
                                                   "volumes": [{"volumeId": vid, "path": "/d"}]}), 409, "conflict")
        assert c.post(f"/v1/volumes/{vid}:backup", json={}).status_code == 201
        kept = c.post(f"/v1/volumes/{vid}:backup", json={"retentionDays": 5})
        assert kept.status_code == 201 and kept.json()["expiresAt"], kept.text
        assert c.post(f"/v1/volume-backups/{kept.json()['id']}:delete", json={}).status_code == 200
        pol = c.post(f"/v1/volumes/{vid}:backup-policy", json={"schedule": {"everyMinutes": 600}, "retentionDays": 2})
        assert pol.status_code == 200, pol.text
        d.restart()
        got = c.get(f"/v1/volumes/{vid}").json()
        assert got["name"] == "pg" and [a["sandboxId"] for a in got["attachments"]] == [s.id]
        assert got["backupPolicy"]["schedule"] == {"everyMinutes": 600} and got["backupPolicy"]["retentionDays"] == 2
        # A cron schedule and keep counts, read back from the database.
        cron = c.post(f"/v1/volumes/{vid}:backup-policy",
                      json={"schedule": {"cron": "15 2 1 * sun"}, "keep": {"monthly": 6, "last": 2}})
        assert cron.status_code == 200, cron.text
        p = c.get(f"/v1/volumes/{vid}").json()["backupPolicy"]
        assert p == cron.json()["backupPolicy"] and p["schedule"] == {"cron": "15 2 1 * sun"}
        assert p["keep"]["monthly"] == 6 and p["keep"]["last"] == 2 and p["nextBackupAt"].endswith("T02:15:00Z")
        assert c.post(f"/v1/volumes/{vid}:backup-policy", json={"daily": False}).status_code == 200
        c.delete_all()
        s2 = c.create_sandbox(driver="namespace", volumes=[{"volumeId": vid, "path": "/data"}])
        assert c.exec(s2.id, command="cat /data/f")["stdout"] == "pg\n"
        c.delete_all()
        # The policy's first backup (due at once) was taken by the sweep, or is not yet.
        backups = c.get("/v1/volume-backups", params={"volumeId": vid}).json()["data"]
        assert 1 <= len(backups) <= 2 and all(b["name"] in (None, "scheduled") for b in backups), backups
        for b in backups:
            assert c.post(f"/v1/volume-backups/{b['id']}:delete", json={}).status_code == 200
        assert c.post(f"/v1/volumes/{vid}:delete", json={}).status_code == 200
    finally:
        c.close()
