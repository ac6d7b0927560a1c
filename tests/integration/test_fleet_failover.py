"""The fleet's database failover drill (docs/fleet.md, "A database that survives its primary"): two
runtimed hosts on a PostgreSQL of two nodes under Patroni with a three-member etcd and
synchronous_mode, reached by libpq's multi-host URL with target_session_attrs=read-write. The
primary is killed (SIGKILL of Patroni and its PostgreSQL) while clients create sandboxes and exec
through both hosts: service resumes within Patroni's TTL plus a margin, and no acknowledged write
is lost. Slow (tens of seconds): RUNTIME_TEST_ALL=1 runs it."""
from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from conftest import RUN_ALL, _finish_daemon, _start_daemon
from helpers import Api, wait_until
from helpers.patroni import PatroniCluster, available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not RUN_ALL, reason="the database failover drill is slow: RUNTIME_TEST_ALL=1 runs it"),
    pytest.mark.skipif(available() is not None, reason=f"no Patroni cluster here: {available()}"),
]

# How long a client may find the service down: Patroni's TTL (the old leader's key expires), its
# loop, the hosts' reconnects; and a margin for this machine's two cores.
RESUME_WITHIN = PatroniCluster.TTL + 30


def test_the_primary_killed_while_hosts_create_and_exec(build_dir, image_dir, tmp_path):
    with PatroniCluster() as pg:
        pg.psql("CREATE DATABASE fleet")
        secret = tmp_path / "fleet.secret"
        secret.write_text(uuid.uuid4().hex + "\n")
        os.chmod(secret, 0o600)
        # The hosts ride out a failover shorter than their dead-after time without fencing.
        args = ["--database", pg.url("fleet"), "--fleet-secret-file", str(secret),
                "--host-dead-after-seconds", "60"]
        hosts = []
        try:
            a = _start_daemon(build_dir, image_dir, tmp_path / "a", f"runtime-test-{os.getpid()}-foa",
                              extra_args=[*args, "--host-id", "fo-a"])
            hosts.append(a)
            (tmp_path / "b").mkdir()
            for name in ("admin.key", "secrets.key"):
                (tmp_path / "b" / name).write_text((a.state_dir / name).read_text())
                os.chmod(tmp_path / "b" / name, 0o600)
            b = _start_daemon(build_dir, image_dir, tmp_path / "b", f"runtime-test-{os.getpid()}-fob",
                              extra_args=[*args, "--host-id", "fo-b"])
            hosts.append(b)
            _drill(pg, a, b)
        finally:
            for h in reversed(hosts):
                if h.alive():
                    with Api(h) as c:
                        for s in c.get("/v1/sandboxes").json().get("sandboxes", []):
                            c.delete(f"/v1/sandboxes/{s['id']}")
                _finish_daemon(h)


def _drill(pg: PatroniCluster, a, b) -> None:
    acked: list[str] = []        # creates answered 201: each must still be there after
    failures: list[tuple[float, str]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(h, n: int) -> None:
        with Api(h, key=a.api_key, timeout=30) as c:
            while not stop.is_set():
                try:
                    r = c.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 600})
                    if r.status_code == 201:
                        sid = r.json()["id"]
                        with lock:
                            acked.append(sid)
                        e = c.post(f"/v1/sandboxes/{sid}:exec", json={"command": "echo ok"})
                        if e.status_code != 200:
                            with lock:
                                failures.append((time.monotonic(), f"exec {e.status_code}"))
                    else:
                        with lock:
                            failures.append((time.monotonic(), f"create {r.status_code}"))
                        time.sleep(0.2)
                except Exception as ex:  # a connection cut by the failover is what is measured
                    with lock:
                        failures.append((time.monotonic(), type(ex).__name__))
                    time.sleep(0.2)

    threads = [threading.Thread(target=client, args=(h, i), daemon=True) for i, h in enumerate((a, b, a))]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 4, 60, interval=0.2, what="creates before the failover")
        old = pg.leader()
        assert old is not None
        before = len(acked)
        killed_at = time.monotonic()
        pg.kill_node(old)
        wait_until(lambda: pg.leader() not in (None, old), RESUME_WITHIN, interval=0.3,
                   what="Patroni to promote the standby")
        promoted_at = time.monotonic()
        # Service resumes: creates are answered 201 again through both hosts.
        wait_until(lambda: len(acked) >= before + 4, RESUME_WITHIN, interval=0.2,
                   what="creates to succeed after the failover")
        resumed_at = time.monotonic()
        assert resumed_at - killed_at < RESUME_WITHIN, (resumed_at - killed_at)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    # No acknowledged write lost: every create answered 201 is a record the new primary has,
    # read through either host.
    with Api(a) as ca, Api(b, key=a.api_key) as cb:
        for i, sid in enumerate(acked):
            r = (ca, cb)[i % 2].get(f"/v1/sandboxes/{sid}")
            assert r.status_code == 200, (sid, r.status_code, r.text)
        # Both hosts serve, and neither fenced itself.
        for c in (ca, cb):
            assert c.get("/healthz").status_code == 200
            assert "\nruntime_host_fenced 0\n" in c.get("/metrics").text
    down = [t for t, _ in failures if t >= killed_at]
    print(f"failover: promoted after {promoted_at - killed_at:.1f} s, creates again after "
          f"{resumed_at - killed_at:.1f} s; {len(acked)} creates acknowledged, {len(down)} calls failed meanwhile")
