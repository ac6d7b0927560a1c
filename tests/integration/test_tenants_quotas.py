"""One owner's snapshots and processes never refuse another's (docs/api.md, Snapshots and
Processes): the bytes an owner's snapshots hold (--max-snapshot-mib-per-owner) and the processes
an owner runs at once across its sandboxes (--max-processes-per-owner) are bounded per owner; past
its own bound an owner gets a 429 naming that bound while another owner's requests go on, and it
can go on once it has made room. A daemon of its own runs with small bounds."""
from __future__ import annotations

import os
import time

import pytest

from conftest import DRIVERS, _finish_daemon, _start_daemon, need_microvm_parts
from helpers import Api, assert_error, skip_unless_driver, wait_until

SNAPSHOT_MIB = 32
# Written into a sandbox before its snapshots: one snapshot holds a little more than this (the
# layer's own metadata comes with it), so one fits under SNAPSHOT_MIB and two never do.
WRITTEN_MIB = 20
PROCESSES = 2


@pytest.fixture(scope="module")
def quota_daemon(build_dir, image_dir, tmp_path_factory):
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("quotas") / "state",
                      f"runtime-test-{os.getpid()}-quotas",
                      extra_args=["--max-snapshot-mib-per-owner", str(SNAPSHOT_MIB),
                                  "--max-processes-per-owner", str(PROCESSES)])
    yield d
    _finish_daemon(d)


@pytest.fixture(params=DRIVERS)
def quota_driver(request, quota_daemon, build_dir, image_dir) -> str:
    skip_unless_driver(quota_daemon, request.param)
    if request.param == "microvm":
        need_microvm_parts(build_dir, image_dir)
    return request.param


@pytest.fixture
def owners(quota_daemon):
    """Full keys of two owners of their own, A and B; at teardown their snapshots and sandboxes
    are deleted."""
    admin = Api(quota_daemon)
    made: list[Api] = []
    stamp = time.monotonic_ns()
    for name in ("a", "b"):
        owner = f"quota-{name}-{stamp}"
        r = admin.post("/v1/keys", json={"name": owner, "owner": owner})
        assert r.status_code == 201, r.text
        made.append(Api(quota_daemon, key=r.json()["key"]))
    yield made
    for c in made:
        for snap in c.get("/v1/snapshots").json()["data"]:
            c.delete(f"/v1/snapshots/{snap['id']}")
        c.close()
    admin.close()


def _snapshot(c: Api, sid: str):
    return c.post(f"/v1/sandboxes/{sid}:snapshot", json={})


def _snapshot_dirs(d) -> set[str]:
    return {p.name for p in (d.state_dir / "snapshots").iterdir()}


def test_snapshot_bytes_bound_is_the_owners_own(quota_daemon, owners, quota_driver):
    a, b = owners
    sa = a.create_sandbox(driver=quota_driver, timeoutSeconds=600)
    sb = b.create_sandbox(driver=quota_driver, timeoutSeconds=600)
    for s in (sa, sb):
        s.run(f"head -c {WRITTEN_MIB}M /dev/urandom > /workspace/blob")
    r = _snapshot(a, sa.id)
    assert r.status_code == 201, r.text
    first = r.json()
    assert WRITTEN_MIB << 20 <= first["sizeBytes"] <= SNAPSHOT_MIB << 20, first
    # A's second snapshot would take what A keeps past its bound: refused, naming A's own bound
    # and what A keeps, and nothing of it is left (no files, no record).
    err = assert_error(_snapshot(a, sa.id), 429, "rate_limited")
    assert "one owner" in err["message"] and "--max-snapshot-mib-per-owner" in err["message"], err
    assert f"{SNAPSHOT_MIB:.1f} MiB" in err["message"] and "you keep 1 snapshot holding" in err["message"], err
    assert "delete snapshots" in err["hint"], err
    assert [s["id"] for s in a.get("/v1/snapshots").json()["data"]] == [first["id"]]
    assert _snapshot_dirs(quota_daemon) == {first["id"]}
    # A fork takes a snapshot too: refused the same way, and no copy is made.
    err = assert_error(a.post(f"/v1/sandboxes/{sa.id}:fork", json={"count": 1}), 429, "rate_limited")
    assert "--max-snapshot-mib-per-owner" in err["message"], err
    assert [s["id"] for s in a.get("/v1/sandboxes").json()["data"]] == [sa.id]
    assert _snapshot_dirs(quota_daemon) == {first["id"]}
    # B's snapshot, while A is at its bound, is B's own business.
    r = _snapshot(b, sb.id)
    assert r.status_code == 201, r.text
    theirs = r.json()["id"]
    assert _snapshot_dirs(quota_daemon) == {first["id"], theirs}
    # Once A deletes its snapshot, A has room again.
    assert a.delete(f"/v1/snapshots/{first['id']}").status_code in (200, 204)
    r = _snapshot(a, sa.id)
    assert r.status_code == 201, r.text
    assert _snapshot_dirs(quota_daemon) == {r.json()["id"], theirs}


def _procs(sid: str) -> str:
    return f"/v1/sandboxes/{sid}/processes"


def _spawn(c: Api, sid: str, **body) -> dict:
    r = c.post(_procs(sid), json=body)
    assert r.status_code == 201, r.text
    return r.json()


def test_process_bound_is_the_owners_own(owners, quota_driver):
    a, b = owners
    a1 = a.create_sandbox(driver=quota_driver, timeoutSeconds=600)
    a2 = a.create_sandbox(driver=quota_driver, timeoutSeconds=600)
    sb = b.create_sandbox(driver=quota_driver, timeoutSeconds=600)
    # A's two processes run in two sandboxes, each far below the sandbox's own bound (32).
    sleeper = _spawn(a, a1.id, command="sleep 600")
    reader = _spawn(a, a2.id, command="cat", stdinMode="pipe")
    err = assert_error(a.post(_procs(a1.id), json={"command": "true"}), 429, "rate_limited")
    assert "one owner" in err["message"] and "--max-processes-per-owner" in err["message"], err
    assert f"run {PROCESSES} processes" in err["message"], err
    # A streamed exec is a process as well.
    assert_error(a.post(f"/v1/sandboxes/{a2.id}:exec", json={"command": "true", "stream": True}), 429,
                 "rate_limited")
    # B's process starts while A is at its bound.
    assert _spawn(b, sb.id, command="echo b")["state"] in ("running", "exited")
    assert sb.run("echo ok") == "ok\n"
    # A's reader ends once its stdin closes; then A can start one again.
    r = a.post(f"{_procs(a2.id)}/{reader['id']}:write", json={"eof": True})
    assert r.status_code == 200, r.text
    wait_until(lambda: a.get(f"{_procs(a2.id)}/{reader['id']}").json()["state"] != "running", 30, 0.05,
               what="A's reader to end")
    done = _spawn(a, a1.id, command="echo again")
    wait_until(lambda: a.get(f"{_procs(a1.id)}/{done['id']}").json()["state"] == "exited", 30, 0.05,
               what="A's new process to end")
    assert a.post(f"{_procs(a1.id)}/{sleeper['id']}:signal", json={"signal": "SIGKILL"}).status_code == 200
    wait_until(lambda: a.get(f"{_procs(a1.id)}/{sleeper['id']}").json()["state"] != "running", 30, 0.05,
               what="A's sleeper to end")
    assert a1.run("echo ok") == "ok\n"
