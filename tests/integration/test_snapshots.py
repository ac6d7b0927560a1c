"""Snapshots and fork: :snapshot keeps a sandbox's writable layer (its files and /workspace) while
the sandbox carries on; POST /v1/sandboxes with snapshot starts a new one from it; /v1/snapshots
lists, reads, updates and deletes them, owner by owner; :fork makes copies all or none. Memory
snapshots are refused in the API's error shape on namespace (test_snapshots_memory.py has the
drivers that keep them)."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
from withruntime import AsyncRuntime, AsyncSandbox, Runtime, Sandbox  # noqa: E402
from withruntime.errors import APIError, InvalidRequestError, NotFoundError  # noqa: E402


def snapshot(api, sid: str, status: int = 201, **body) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}:snapshot", json=body)
    assert r.status_code == status, r.text
    return r.json()


@pytest.fixture
def other_owner(api):
    owner = f"ci-snap-{int(time.time() * 1000) % 10**9}"
    r = api.post("/v1/keys", json={"name": owner, "owner": owner})
    assert r.status_code == 201, r.text
    c = Api(api.daemon, key=r.json()["key"])
    yield c
    c.delete_all()
    c.close()


@pytest.mark.microvm_subset
def test_disk_snapshot_and_create_from_it(api, driver):
    sbx = api.create_sandbox(driver=driver)
    # As root: the snapshot keeps the whole disk, the system's files too.
    sbx.exec("echo kept > /workspace/a.txt && mkdir -p /opt/x && echo root > /opt/x/b && rm -f /etc/issue",
             user="root")
    snap = snapshot(api, sbx.id, mode="disk", name="base", labels={"k": "v"}, retentionDays=2)
    assert snap["id"].startswith("snp_") and snap["state"] == "ready" and snap["mode"] == "disk", snap
    assert snap["sandboxId"] == sbx.id and snap["name"] == "base" and snap["labels"] == {"k": "v"}
    assert snap["retentionDays"] == 2 and snap["expiresAt"], snap
    # The source carries on, and its later writes are not in the snapshot.
    assert sbx.exec("echo later > /workspace/c.txt && cat /workspace/a.txt")["stdout"] == "kept\n"
    copy = api.create_sandbox(snapshot=snap["id"])
    assert copy["driver"] == driver
    out = copy.exec("cat /workspace/a.txt /opt/x/b; test -e /etc/issue && echo has-issue; "
                    "test -e /workspace/c.txt && echo has-later; echo done")["stdout"]
    assert out == "kept\nroot\ndone\n", out
    # The copy's writes are its own.
    copy.exec("echo mine > /workspace/a.txt")
    assert sbx.exec("cat /workspace/a.txt")["stdout"] == "kept\n"
    assert api.get(f"/v1/snapshots/{snap['id']}").json()["id"] == snap["id"]


def test_snapshot_of_stopped_and_paused(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver)
    sbx.exec("echo one > /workspace/f")
    r = api.post(f"/v1/sandboxes/{sbx.id}:pause", json={})
    assert r.status_code == 200, r.text
    snap = snapshot(api, sbx.id)
    assert snap["mode"] == "disk"
    assert api.sandbox(sbx.id)["state"] == "paused"   # a paused source stays paused
    assert api.post(f"/v1/sandboxes/{sbx.id}:stop", json={}).status_code == 200
    snap2 = snapshot(api, sbx.id)
    for s in (snap, snap2):
        copy = api.create_sandbox(snapshot=s["id"])
        assert copy.exec("cat /workspace/f")["stdout"] == "one\n"
    r = api.post(f"/v1/sandboxes/{sbx.id}:wake", json={})
    assert r.status_code == 200, r.text


def test_memory_mode_refused(api, driver):
    if driver != "namespace":
        pytest.skip(f"{driver} keeps memory: test_snapshots_memory.py")
    sbx = api.create_sandbox(driver=driver)
    r = api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={"mode": "memory"})
    err = assert_error(r, 501, "not_implemented", mentions=driver)
    assert "disk" in err["hint"], err
    assert api.sandbox(sbx.id)["state"] == "running"


def test_bad_input(api, any_driver, other_owner):
    sbx = api.create_sandbox(driver=any_driver)
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={"mode": "both"}), 400, "invalid_request")
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={"retentionDays": 0}), 400)
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={"retentionDays": 366}), 400)
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={"volumes": []}), 400, mentions="volumes")
    for bad in (0, 17, -1, "2", 1.5):
        assert_error(api.post(f"/v1/sandboxes/{sbx.id}:fork", json={"count": bad}), 400, "invalid_request")
    for sid in ("snp_zz", "snp_" + "0" * 20, "../etc", "sbx_" + "0" * 20):
        r = api.get(f"/v1/snapshots/{sid}")
        assert r.status_code in (400, 404), (sid, r.text)
    assert_error(api.post("/v1/sandboxes", json={"snapshot": "snp_" + "1" * 20}), 404, "not_found")
    assert_error(api.post("/v1/sandboxes", json={"snapshot": 7}), 400, "invalid_request")
    snap = snapshot(api, sbx.id)
    assert_error(api.post("/v1/sandboxes", json={"snapshot": snap["id"], "diskMiB": 4096}), 400,
                 mentions="diskMiB")
    # Another owner sees none of it.
    assert_error(other_owner.get(f"/v1/snapshots/{snap['id']}"), 404, "not_found")
    assert other_owner.get("/v1/snapshots").json()["data"] == []
    assert_error(other_owner.post(f"/v1/snapshots/{snap['id']}:delete", json={}), 404)
    assert_error(other_owner.post(f"/v1/snapshots/{snap['id']}:update", json={"name": "x"}), 404)
    assert_error(other_owner.post("/v1/sandboxes", json={"snapshot": snap["id"]}), 404)
    assert_error(other_owner.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={}), 404)
    assert_error(other_owner.post(f"/v1/sandboxes/{sbx.id}:fork", json={}), 404)
    assert api.get(f"/v1/snapshots/{snap['id']}").status_code == 200


def test_list_update_delete(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver)
    made = [snapshot(api, sbx.id, name=f"s{i}")["id"] for i in range(3)]
    # Oldest first; within one second by id.
    page = api.get("/v1/snapshots", params={"sandboxId": sbx.id, "limit": 2}).json()
    assert len(page["data"]) == 2 and page["nextCursor"], page
    rest = api.get("/v1/snapshots", params={"sandboxId": sbx.id, "cursor": page["nextCursor"]}).json()
    assert len(rest["data"]) == 1 and rest["nextCursor"] is None, rest
    assert sorted(s["id"] for s in page["data"] + rest["data"]) == sorted(made)
    assert [s["id"] for s in api.get("/v1/snapshots", params={"name": "s1"}).json()["data"]] == [made[1]]
    assert_error(api.get("/v1/snapshots", params={"cursor": "nonsense"}), 400)
    r = api.post(f"/v1/snapshots/{made[0]}:update", json={"name": "renamed", "labels": {"a": "b"}})
    assert r.status_code == 200 and r.json()["name"] == "renamed" and r.json()["labels"] == {"a": "b"}, r.text
    r = api.post(f"/v1/snapshots/{made[0]}:update", json={"labels": {"c": "d"}, "ifLabels": {"x": "y"}})
    assert_error(r, 409, "conflict")
    r = api.post(f"/v1/snapshots/{made[0]}:update", json={"name": None})
    assert r.status_code == 200 and r.json()["name"] is None and r.json()["labels"] == {"a": "b"}, r.text
    r = api.post(f"/v1/snapshots/{made[0]}:extend", json={"retentionDays": 30})
    assert r.status_code == 200 and r.json()["retentionDays"] >= 30, r.text
    assert api.post(f"/v1/snapshots/{made[0]}:delete", json={}).status_code == 200
    assert api.delete(f"/v1/snapshots/{made[1]}").status_code == 200
    assert_error(api.get(f"/v1/snapshots/{made[0]}"), 404)
    assert_error(api.delete(f"/v1/snapshots/{made[1]}"), 404)
    left = [s["id"] for s in api.get("/v1/snapshots", params={"sandboxId": sbx.id}).json()["data"]]
    assert left == made[2:]
    # Its files are gone from the host with it.
    snaps = api.daemon.state_dir / "snapshots"
    assert not (snaps / made[0]).exists() and (snaps / made[2]).exists()


def test_fork(api, driver):
    src = api.create_sandbox(driver=driver, labels={"role": "src"})
    src.exec("echo prepared > /workspace/state")
    r = api.post(f"/v1/sandboxes/{src.id}:fork", json={"count": 3, "name": "attempt"})
    assert r.status_code == 201, r.text
    copies = r.json()["sandboxes"]
    api.created.extend(c["id"] for c in copies)
    assert len(copies) == 3 and len({c["id"] for c in copies}) == 3
    assert [c["name"] for c in copies] == ["attempt-1", "attempt-2", "attempt-3"]
    for c in copies:
        assert c["state"] == "running" and c["driver"] == driver and c["labels"] == {"role": "src"}
        out = api.exec(c["id"], command="cat /workspace/state; echo $(( $(cat /proc/uptime | cut -d. -f1) >= 0 ))")
        assert out["stdout"].startswith("prepared\n"), out
    # The source ran on; the fork's own snapshot is not kept unless asked.
    assert api.sandbox(src.id)["state"] == "running"
    assert api.get("/v1/snapshots", params={"sandboxId": src.id}).json()["data"] == []
    r = api.post(f"/v1/sandboxes/{src.id}:fork", json={"keepSnapshot": True})
    assert r.status_code == 201, r.text
    api.created.extend(c["id"] for c in r.json()["sandboxes"])
    assert r.json()["snapshotId"].startswith("snp_")


def test_fork_past_spending_limit_makes_no_copy(api, any_driver):
    owner = f"ci-fork-{int(time.time() * 1000) % 10**9}"
    # One 1 vCPU + 1 GiB sandbox for 300 s is about 1,042 micro-dollars: room for the source and
    # two copies, not for four.
    r = api.post("/v1/keys", json={"name": owner, "owner": owner, "dailyLimitMicros": 3500})
    assert r.status_code == 201, r.text
    c = Api(api.daemon, key=r.json()["key"])
    try:
        src = c.create_sandbox(driver=any_driver, vcpu=1, memoryMiB=1024, timeoutSeconds=300)
        r = c.post(f"/v1/sandboxes/{src.id}:fork", json={"count": 4})
        assert_error(r, 402, "spending_limit_reached", mentions="no copy")
        ids = [s["id"] for s in c.get("/v1/sandboxes").json()["data"]]
        assert ids == [src.id], ids
        assert c.get("/v1/snapshots").json()["data"] == []
    finally:
        c.delete_all()
        c.close()


def test_restart_mid_snapshot_leaves_no_half_snapshot(build_dir, image_dir, tmp_path, any_driver):
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-snap")
    try:
        c = Api(d)
        sbx = c.create_sandbox(driver=any_driver, diskMiB=2048)
        # Enough written that the copy takes a while.
        sbx.exec("head -c 400M /dev/urandom > /workspace/big", timeoutMs=300000)
        snaps = d.state_dir / "snapshots"
        def take():
            try:
                c.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={})
            except Exception:  # the daemon is killed under it: no answer is the point
                pass
        t = threading.Thread(target=take, daemon=True)
        t.start()
        wait_until(lambda: any(p.name.endswith(".part") for p in snaps.iterdir()), 60, 0.01,
                   what="the snapshot's temporary files")
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait()
        t.join(30)
        c.close()
        d.start()
        c = Api(d)
        assert c.get("/v1/snapshots").json()["data"] == []
        assert [p.name for p in snaps.iterdir()] == []
        # The sandbox the copy had frozen is re-attached and thawed (live restore); the microVM's
        # is recorded stopped and boots again from its disk.
        if c.sandbox(sbx.id)["state"] == "stopped":
            assert any_driver == "microvm", c.sandbox(sbx.id)
            r = c.post(f"/v1/sandboxes/{sbx.id}:wake", json={})
            assert r.status_code == 200 and r.json()["state"] == "running", r.text
        assert c.sandbox(sbx.id)["state"] == "running"
        assert c.exec(sbx.id, command="test -s /workspace/big && echo ok")["stdout"] == "ok\n"
        c.delete_all()
        c.close()
    finally:
        _finish_daemon(d)


def test_sdk_sync_and_async(daemon, any_driver, monkeypatch):
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    with Sandbox.create(driver=any_driver) as sbx, Runtime() as rt:
        sbx.files.write("/workspace/x", b"from sdk")
        snap = sbx.snapshot(name="sdk", labels={"via": "sdk"}, retention_days=3, mode="disk")
        assert snap["state"] == "ready" and snap["mode"] == "disk" and snap["retentionDays"] == 3
        assert [s["id"] for s in rt.snapshots.list(sandbox_id=sbx.id)] == [snap["id"]]
        assert rt.snapshots.get(snap["id"])["name"] == "sdk"
        assert rt.snapshots.update(snap["id"], name="renamed")["name"] == "renamed"
        with Sandbox.create(snapshot=snap["id"]) as copy:
            assert copy.files.read("/workspace/x") == b"from sdk"
        one = sbx.fork()
        two = sbx.fork(count=2)
        try:
            assert isinstance(one, Sandbox) and len(two) == 2
            assert all(c.files.read("/workspace/x") == b"from sdk" for c in [one, *two])
        finally:
            for c in [one, *two]:
                c.delete()
        with pytest.raises(InvalidRequestError):
            sbx.fork(count=17)
        with pytest.raises(InvalidRequestError):
            sbx.snapshot(mode="both")
        if any_driver == "namespace":
            with pytest.raises(APIError) as info:
                sbx.snapshot(mode="memory")
            assert info.value.status == 501
            with pytest.raises(APIError) as info:
                sbx.fork(mode="memory")
            assert info.value.status == 501
        with pytest.raises(InvalidRequestError):
            sbx.fork(mode="both")
        rt.snapshots.delete(snap["id"])
        with pytest.raises(NotFoundError):
            rt.snapshots.get(snap["id"])

    async def run():
        async with AsyncRuntime() as rt:
            sbx = await AsyncSandbox.create(driver=any_driver)
            try:
                await sbx.files.write("/workspace/y", b"async")
                snap = await sbx.snapshot()
                assert [s["id"] for s in await rt.snapshots.list(sandbox_id=sbx.id)] == [snap["id"]]
                copies = await sbx.fork(count=2)
                for c in copies:
                    assert await c.files.read("/workspace/y") == b"async"
                    await c.delete()
                await rt.snapshots.delete(snap["id"])
            finally:
                await sbx.delete()
    asyncio.run(run())


def test_cli_verbs(api, any_driver, build_dir, daemon):
    import json
    import subprocess

    def cli(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        env.update(daemon.env())
        return subprocess.run([str(build_dir / "runtime"), *args], env=env, capture_output=True, text=True,
                              timeout=180)

    sbx = api.create_sandbox(driver=any_driver)
    sbx.exec("echo cli > /workspace/f")
    r = cli("sandbox", "snapshot", "--name", "from-cli", "--retention", "2", sbx.id)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    assert sid.startswith("snp_")
    r = cli("--json", "snapshot", "get", sid)
    assert r.returncode == 0 and json.loads(r.stdout)["name"] == "from-cli", r.stderr
    r = cli("snapshot", "ls", "--sandbox", sbx.id)
    assert r.returncode == 0 and sid in r.stdout and "from-cli" in r.stdout, r.stdout + r.stderr
    r = cli("sandbox", "fork", "--count", "2", sbx.id)
    assert r.returncode == 0, r.stderr
    copies = r.stdout.split()
    api.created.extend(copies)
    assert len(copies) == 2 and all(c.startswith("sbx_") for c in copies)
    assert api.exec(copies[1], command="cat /workspace/f")["stdout"] == "cli\n"
    if any_driver == "namespace":
        r = cli("sandbox", "snapshot", "--mode", "memory", sbx.id)
        assert r.returncode == 1 and "memory" in r.stderr, r.stderr
        r = cli("sandbox", "fork", "--mode", "memory", sbx.id)
        assert r.returncode == 1 and "memory" in r.stderr, r.stderr
    for bad in (("sandbox", "fork", "--count", "17", sbx.id), ("sandbox", "snapshot", "--mode", "x", sbx.id),
                ("sandbox", "fork", "--mode", "x", sbx.id),
                ("snapshot", "get", "snp_nope")):
        r = cli(*bad)
        assert r.returncode == 2, (bad, r.stderr)
    r = cli("snapshot", "rm", sid)
    assert r.returncode == 0 and r.stdout.strip() == sid, r.stderr
    r = cli("snapshot", "get", sid)
    assert r.returncode == 1 and "no snapshot" in r.stderr, r.stderr


def test_generations_share_layers(api, driver):
    """A copy reads its snapshot's layer in place (hard links, nothing copied); a snapshot of a
    copy carries that layer on; deleting the snapshots leaves the copies whole; past the bound on
    generations a snapshot is refused with 409."""
    if driver == "microvm":
        pytest.skip("a microVM's copy boots on a copy of the snapshot's disk: it stacks no layers")
    src = api.create_sandbox(driver=driver)
    src.exec("head -c 64M /dev/urandom > /workspace/big && md5sum /workspace/big > /workspace/sum")
    cur, snaps = src, []
    for gen in range(1, 9):
        snap = snapshot(api, cur.id)
        if gen > 1:   # only what the copy wrote, not the 64 MiB below it
            assert snap["sizeBytes"] < 32 << 20, snap
        snaps.append(snap["id"])
        cur = api.create_sandbox(snapshot=snaps[-1])
        cur.exec(f"echo {gen} > /workspace/gen{gen} && rm -f /workspace/gen{gen - 1}")
    r = api.post(f"/v1/sandboxes/{cur.id}:snapshot", json={})
    assert_error(r, 409, "conflict", mentions="copy of a copy")
    for s in snaps:
        assert api.delete(f"/v1/snapshots/{s}").status_code == 200
    out = cur.exec("md5sum -c /workspace/sum && ls /workspace | sort | tr '\\n' ' '")
    assert out["exitCode"] == 0 and out["stdout"].endswith("big gen8 sum "), out
    assert api.post(f"/v1/sandboxes/{cur.id}:stop", json={}).status_code == 200
    r = api.post(f"/v1/sandboxes/{cur.id}:wake", json={})
    assert r.status_code == 200, r.text
    assert api.exec(cur.id, command="cat /workspace/gen8")["stdout"] == "8\n"
    # The copies' own layer files hold what they wrote, not the 64 MiB below them.
    layer = api.daemon.state_dir / "sandboxes" / cur.id / "layer.img"
    assert layer.stat().st_blocks * 512 < 32 << 20, layer.stat()


def test_retention_is_enforced_and_storage_billed(api, any_driver):
    """The daemon deletes a snapshot whose retention has passed, files and all, and bills its
    storage as a series of its own. The shortest retention is a day: the test moves the
    snapshot's expiry into the past in the daemon's database, as a day going by would."""
    import sqlite3

    sbx = api.create_sandbox(driver=any_driver)
    sbx.exec("head -c 8M /dev/urandom > /workspace/f")
    keep = snapshot(api, sbx.id, retentionDays=1)
    gone = snapshot(api, sbx.id, retentionDays=1)
    files = api.daemon.state_dir / "snapshots" / gone["id"]
    assert files.is_dir()
    with sqlite3.connect(api.daemon.state_dir / "runtime.db", timeout=30) as db:
        db.execute("UPDATE snapshots SET expires_at = 1 WHERE id = ?", (gone["id"],))
    # The record goes first, then the files.
    wait_until(lambda: api.get(f"/v1/snapshots/{gone['id']}").status_code == 404 and not files.exists(), 30, 0.2,
               what="the expired snapshot's deletion")
    assert api.get(f"/v1/snapshots/{keep['id']}").status_code == 200
    usage = api.get("/v1/usage", params={"since": "0"}).json()
    series = {s["sandboxId"] for s in usage["sandboxes"]}
    assert f"{keep['id']}:disk" in series and f"{gone['id']}:disk" in series, series


def test_cli_create_from_snapshot(api, driver, build_dir, daemon):
    """runtime sandbox create --snapshot ID starts a sandbox on the snapshot's files; an id that is
    not a snapshot's is a usage error before any request, one of nobody's a 404 from the daemon."""
    import json
    import subprocess

    def cli(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        env.update(daemon.env())
        return subprocess.run([str(build_dir / "runtime"), *args], env=env, capture_output=True, text=True,
                              timeout=180)

    sbx = api.create_sandbox(driver=driver)
    sbx.exec("echo from-cli > /workspace/f")
    sid = snapshot(api, sbx.id)["id"]
    r = cli("--json", "sandbox", "create", "--snapshot", sid, "--name", "cli-copy", "--label", "k=v")
    assert r.returncode == 0, r.stderr
    copy = json.loads(r.stdout)
    api.created.append(copy["id"])
    assert copy["name"] == "cli-copy" and copy["labels"] == {"k": "v"} and copy["driver"] == driver, copy
    assert api.exec(copy["id"], command="cat /workspace/f")["stdout"] == "from-cli\n"
    r = cli("sandbox", "create", "--snapshot", sid)
    assert r.returncode == 0 and r.stdout.strip().startswith("sbx_"), r.stderr
    api.created.append(r.stdout.strip())
    for bad in ("snp_nope", "sbx_9f2c4e1a7b3d5c6e8f01", "snp_4B1E9C0D2A7F3E5C8D10", ""):
        r = cli("sandbox", "create", "--snapshot", bad)
        assert r.returncode == 2 and "snapshot id" in r.stderr, (bad, r.stderr)
    r = cli("sandbox", "run", "--snapshot", sid, "--", "true")
    assert r.returncode == 2 and "--snapshot is not an option of sandbox run" in r.stderr, r.stderr
    r = cli("sandbox", "create", "--snapshot", "snp_00000000000000000000")
    assert r.returncode == 1 and "snapshot" in r.stderr, r.stderr
    r = cli("sandbox", "create", "--help")
    assert r.returncode == 0 and "--snapshot ID" in r.stdout, r.stdout
