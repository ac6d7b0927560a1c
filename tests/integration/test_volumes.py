"""Volumes: disks of a fixed size that outlive sandboxes (docs/volumes.md).

The published client's volumes calls (create, get, list in pages, resize, delete) drive the shared
daemon, and its sandboxes.create(volumes=[...]) attaches them on the namespace and gVisor drivers
(and on the microVM, where a volume is a disk of the guest: the tests marked microvm_subset).
The rules are tried as an attacker would: another owner's key finds nothing; paths that climb, are
relative, or lie over /proc, /sys, /dev, /.runtime or the root are refused; a symbolic link in a
volume that points out of it resolves inside the sandbox, never on the host; a full volume is
ENOSPC inside and its image on the host stays its size; of two creates racing for one volume that
is not shared exactly one gets it; a daemon killed with -9 while a volume is attached keeps its
data and lets the volume be attached again after its restart; a volume attached live outlives a
daemon's restart with its sandbox kept (on every driver; the published client drives the live
attach too, the microVM's into an empty disk slot of its guest); a microVM create beside a namespace sandbox that holds the
volume is 409 before anything boots; a sandbox with a volume is not snapshotted or forked."""
from __future__ import annotations

import contextlib
import os
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from helpers import Api, assert_error, skip_unless_driver, wait_until

import sys
sys.path.insert(0, str(Path(__file__).parent))
from conftest import _finish_daemon, _start_daemon  # noqa: E402

VOLUME_DRIVERS = ["namespace", "gvisor"]


@pytest.fixture(params=VOLUME_DRIVERS)
def vdriver(request, daemon) -> str:
    skip_unless_driver(daemon, request.param)
    return request.param


def make_volume(api: Api, **body) -> dict:
    r = api.post("/v1/volumes", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def drop_volume(api: Api, vid: str) -> None:
    r = api.post(f"/v1/volumes/{vid}:delete", json={"force": True})
    assert r.status_code in (200, 404), r.text


@contextlib.contextmanager
def kept_daemon(build_dir, image_dir, tmp_path, tag: str):
    """A daemon of its own that keeps its sandboxes running across its restarts (live restore),
    and its client; at the end it runs again, its sandboxes are deleted and it stops cleanly."""
    from helpers import Daemon, DaemonError
    d = Daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-{tag}", keep_sandboxes=True)
    try:
        d.start()
    except DaemonError as e:
        pytest.fail(str(e), pytrace=False)
    c = Api(d)
    try:
        yield d, c
    finally:
        if not d.alive():
            d.start()
        c.delete_all()
        c.close()
        _finish_daemon(d)


def pub_attach(pub, vid: str, sid: str, path: str) -> str:
    """The published client's attach of volume vid to running sandbox sid at path, and its
    get_attachment: the attachment's id."""
    out = pub("""
        import json, sys
        from withruntime import Runtime
        rt = Runtime()
        att = rt.volumes.attach(sys.argv[1], sys.argv[2], sys.argv[3])
        print(json.dumps({"att": att, "got": rt.volumes.get_attachment(sys.argv[1], att["id"])}))
    """, vid, sid, path)
    assert out["att"]["sandboxId"] == sid and out["att"]["path"] == path and out["got"] == out["att"], out
    return out["att"]["id"]


def pub_detach(pub, vid: str, aid: str) -> None:
    out = pub("""
        import json, sys
        from withruntime import Runtime
        print(json.dumps(Runtime().volumes.detach(sys.argv[1], sys.argv[2])))
    """, vid, aid)
    assert out["state"] == "detached", out


def sh(api: Api, sid: str, command: str, **kw) -> dict:
    return api.exec(sid, command=command, **kw)


def test_published_client_volume_calls(pub, api):
    """create, get, list in pages, resize (grow only), delete, as the published client sends them."""
    out = pub("""
        import json
        from withruntime import Runtime
        from withruntime._errors import RuntimeError as RtError
        rt = Runtime()
        made = [rt.volumes.create(64, name="pub-vol", labels={"team": "a"}) for _ in range(3)]
        got = rt.volumes.get(made[0]["id"])
        page = rt.volumes.list(name="pub-vol", limit=2)
        first = [v["id"] for v in page.data]
        every = [v["id"] for v in rt.volumes.list(name="pub-vol", limit=2)]
        grown = rt.volumes.resize(made[0]["id"], 96)
        try:
            rt.volumes.resize(made[0]["id"], 32)
            shrink = None
        except RtError as e:
            shrink = [e.code, e.status]
        gone = [rt.volumes.delete(v["id"]) for v in made]
        try:
            rt.volumes.get(made[0]["id"])
            after = None
        except RtError as e:
            after = [e.code, e.status]
        print(json.dumps({"made": made, "got": got, "first": first, "has_more": page.has_more,
                          "every": every, "grown": grown, "shrink": shrink, "gone": gone, "after": after}))
    """)
    ids = [v["id"] for v in out["made"]]
    assert all(v["state"] == "ready" and v["sizeMiB"] == 64 for v in out["made"])
    assert out["got"]["name"] == "pub-vol" and out["got"]["labels"] == {"team": "a"}
    assert out["got"]["attachments"] == [] and out["got"]["shared"] is False
    # Oldest first; those made in one second by id.
    assert out["first"] == out["every"][:2] and out["has_more"] is True
    assert sorted(out["every"]) == sorted(ids)
    assert out["grown"]["sizeMiB"] == 96
    assert out["shrink"] == ["invalid_request", 400]
    assert all(g["deleted"] for g in out["gone"])
    assert out["after"] == ["not_found", 404]


def test_published_client_attaches_at_create(pub, api):
    """sandboxes.create(volumes=[{"volume_id", "path"}]) on the daemon's default driver (the
    published client names none): the files stay across sandboxes."""
    default = api.get("/v1/info").json().get("defaultDriver")
    if default not in VOLUME_DRIVERS:
        pytest.skip(f"the daemon's default driver is {default}, which attaches no volumes")
    out = pub(f"""
        import json
        from withruntime import Runtime
        rt = Runtime()
        vol = rt.volumes.create(64)
        with rt.sandboxes.create(volumes=[{{"volume_id": vol["id"], "path": "/data"}}]) as s:
            s.exec("echo kept > /data/note && sync")
            attached = rt.volumes.get(vol["id"])["attachments"]
        with rt.sandboxes.create(volumes=[{{"volume_id": vol["id"], "path": "/mnt/v"}}]) as s:
            read = s.exec("cat /mnt/v/note").stdout
        rt.volumes.delete(vol["id"])
        print(json.dumps({{"attached": attached, "read": read}}))
    """)
    assert [a["path"] for a in out["attached"]] == ["/data"]
    assert out["read"] == "kept\n"


def test_sandbox_user_owns_it_and_read_only_is_read_only(api, vdriver):
    vol = make_volume(api, sizeMiB=32)
    try:
        a = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/data"}])
        r = sh(api, a.id, "stat -c %u:%g /data && id -u && touch /data/by-user && ls -n /data/by-user")
        assert r["exitCode"] == 0, r
        lines = r["stdout"].split("\n")
        assert lines[0] == "1000:1000" and lines[1] == "1000", r
        assert " 1000 1000 " in lines[2], r
        # Writable by root inside too, as any directory of the sandbox.
        assert sh(api, a.id, "echo x > /data/by-root", user="root")["exitCode"] == 0
        # One writer: a second sandbox may only read it.
        err = api.post("/v1/sandboxes", json={"driver": vdriver,
                                               "volumes": [{"volumeId": vol["id"], "path": "/data"}]})
        assert_error(err, 409, "conflict")
        b = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/ro", "readOnly": True}])
        r = sh(api, b.id, "cat /ro/by-root; echo y > /ro/new", user="root")
        assert r["stdout"] == "x\n" and r["exitCode"] != 0 and "Read-only" in r["stderr"], r
        # Attached: neither deleted nor resized without force.
        assert_error(api.post(f"/v1/volumes/{vol['id']}:delete", json={}), 409, "conflict")
        assert_error(api.post(f"/v1/volumes/{vol['id']}:resize", json={"sizeMiB": 64}), 409, "conflict")
        got = api.get(f"/v1/volumes/{vol['id']}").json()
        assert sorted(x["sandboxId"] for x in got["attachments"]) == sorted([a.id, b.id])
        # The writer gone, another sandbox writes it.
        assert api.delete(f"/v1/sandboxes/{a.id}").status_code == 200
        c = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/data"}])
        assert sh(api, c.id, "ls /data")["stdout"].split() == ["by-root", "by-user", "lost+found"]
    finally:
        api.delete_all()
        drop_volume(api, vol["id"])


def test_shared_volume_takes_many_writers(api, vdriver):
    vol = make_volume(api, sizeMiB=32, shared=True)
    try:
        a = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/shared"}])
        b = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/shared"}])
        assert sh(api, a.id, "echo from-a > /shared/a && sync")["exitCode"] == 0
        assert sh(api, b.id, "echo from-b > /shared/b && sync")["exitCode"] == 0
        assert sh(api, b.id, "cat /shared/a")["stdout"] == "from-a\n"
    finally:
        api.delete_all()
        drop_volume(api, vol["id"])


@pytest.mark.parametrize("path", ["data", "./data", "/data/../etc", "/", "//data", "/data/", "/proc",
                                  "/proc/x", "/sys/fs", "/dev", "/dev/shm", "/.runtime", "/.runtime/agent",
                                  "/a/./b", "/a\nb", "/a,b", "/" + "x" * 300])
def test_bad_paths_are_refused(api, path):
    vol = make_volume(api, sizeMiB=16)
    try:
        r = api.post("/v1/sandboxes", json={"volumes": [{"volumeId": vol["id"], "path": path}]})
        assert_error(r, 400, "invalid_request")
        assert api.get(f"/v1/volumes/{vol['id']}").json()["attachments"] == []
    finally:
        drop_volume(api, vol["id"])


def test_bad_volume_lists_are_refused(api):
    vol = make_volume(api, sizeMiB=16)
    vid = vol["id"]
    try:
        for bad in ([{"volumeId": vid, "path": "/a"}, {"volumeId": vid, "path": "/b"}],
                    [{"volumeId": vid, "path": "/a"}, {"volumeId": "vol_00000000000000000000", "path": "/a/b"}],
                    [{"volumeId": vid, "path": "/a", "extra": 1}],
                    [{"volumeId": vid, "path": "/a", "readOnly": "yes"}],
                    [{"volumeId": vid}], "nope", [1],
                    [{"volumeId": f"vol_{i:020d}", "path": f"/v{i}"} for i in range(5)]):
            assert_error(api.post("/v1/sandboxes", json={"volumes": bad}), 400, "invalid_request")
        assert_error(api.post("/v1/sandboxes", json={"volumes": [{"volumeId": vid, "path": "/a",
                                                                  "mode": "snapshot"}]}), 501,
                     "not_implemented")
        # A volume that does not exist (or is another's) is not found.
        assert_error(api.post("/v1/sandboxes", json={"volumes": [{"volumeId": "vol_00000000000000000000",
                                                                  "path": "/a"}]}), 404, "not_found")
        # Bad volume bodies.
        for body in ({"sizeMiB": 1}, {"sizeMiB": 10 ** 9}, {"sizeMiB": "64"}, {"name": "a b"},
                     {"labels": {"k": 1}}, {"labels": [1]}, {"color": "red"}, {"shared": "yes"}):
            assert_error(api.post("/v1/volumes", json=body), 400, "invalid_request")
        assert_error(api.post("/v1/volumes", json={"fromBackup": "vb_1"}), 404, "not_found")
        assert_error(api.post("/v1/volumes", json={"fromBackup": "../x"}), 400, "invalid_request")
        assert_error(api.post("/v1/volumes", json={"region": "eu"}), 501, "not_implemented")
        assert_error(api.post(f"/v1/volumes/{vid}:attach", json={"sandboxId": "x", "path": "/a"}), 404, "not_found")
        assert_error(api.post(f"/v1/volumes/{vid}:attach", json={"sandboxId": "../x", "path": "/a"}), 400,
                     "invalid_request")
        assert api.get("/v1/volumes/vol_bad").status_code == 404
    finally:
        drop_volume(api, vid)


def test_another_owner_gets_404(api, daemon):
    k = api.post("/v1/keys", json={"name": "vol-other", "owner": "vol-other"})
    assert k.status_code == 201, k.text
    other = Api(daemon, key=k.json()["key"])
    vol = make_volume(api, sizeMiB=16)
    try:
        vid = vol["id"]
        assert_error(other.get(f"/v1/volumes/{vid}"), 404, "not_found")
        assert_error(other.post(f"/v1/volumes/{vid}:resize", json={"sizeMiB": 32}), 404, "not_found")
        assert_error(other.post(f"/v1/volumes/{vid}:delete", json={"force": True}), 404, "not_found")
        assert_error(other.post("/v1/sandboxes", json={"volumes": [{"volumeId": vid, "path": "/a"}]}), 404,
                     "not_found")
        assert vid not in [v["id"] for v in other.get("/v1/volumes").json()["data"]]
        assert api.get(f"/v1/volumes/{vid}").status_code == 200
    finally:
        other.close()
        drop_volume(api, vol["id"])
        api.delete(f"/v1/keys/{k.json()['id']}")


def test_symlink_out_of_the_volume_stays_in_the_sandbox(api, vdriver, daemon):
    """The bind is of the volume's root: a link in it to / or ../.. resolves in the sandbox's own
    tree, never to the host directory that holds the volume's image."""
    vol = make_volume(api, sizeMiB=16)
    marker = daemon.state_dir / "volumes" / "host-marker"
    marker.write_text("host")
    try:
        a = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/data"}])
        r = sh(api, a.id, "ln -s / /data/up && ln -s ../../../.. /data/rel && ln -s /etc/hostname /data/h "
                          "&& readlink -f /data/up /data/rel && cat /data/h && ls -a /data/.. /data/rel",
               user="root")
        assert r["exitCode"] == 0, r
        assert "host-marker" not in r["stdout"]
        assert r["stdout"].split("\n")[:2] == ["/", "/"]
        assert sh(api, a.id, "test -e /data/../host-marker || test -e /data/rel/host-marker")["exitCode"] != 0
        # On the host the links are plain files of the volume: nothing was followed there.
        mnt = daemon.state_dir / "volumes" / f"{vol['id']}.mnt"
        assert os.readlink(mnt / "up") == "/" and marker.read_text() == "host"
        assert sorted(p.name for p in mnt.iterdir()) == ["h", "lost+found", "rel", "up"]
    finally:
        marker.unlink()
        api.delete_all()
        drop_volume(api, vol["id"])


def test_full_volume_is_enospc_inside(api, vdriver, daemon):
    vol = make_volume(api, sizeMiB=16)
    try:
        a = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/data"}])
        r = sh(api, a.id, "dd if=/dev/zero of=/data/big bs=1M count=64 conv=fsync")
        assert r["exitCode"] != 0 and "No space left on device" in r["stderr"], r
        # The sandbox goes on, and the image on the host is still 16 MiB.
        assert sh(api, a.id, "rm /data/big && echo ok > /data/ok && cat /data/ok")["stdout"] == "ok\n"
        img = daemon.state_dir / "volumes" / f"{vol['id']}.img"
        st = img.stat()
        assert st.st_size == 16 << 20 and st.st_blocks * 512 <= 16 << 20
    finally:
        api.delete_all()
        drop_volume(api, vol["id"])


def test_racing_creates_one_wins(api, vdriver):
    vol = make_volume(api, sizeMiB=16)
    results: list[int] = []
    lock = threading.Lock()

    def create():
        c = Api(api.daemon)
        r = c.post("/v1/sandboxes", json={"driver": vdriver, "volumes": [{"volumeId": vol["id"], "path": "/d"}]})
        with lock:
            results.append(r.status_code)
            if r.status_code == 201:
                api.created.append(r.json()["id"])
        c.close()
    try:
        threads = [threading.Thread(target=create) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [201, 409, 409, 409], results
    finally:
        api.delete_all()
        drop_volume(api, vol["id"])


def test_snapshot_and_fork_refused_with_a_volume(api, vdriver):
    vol = make_volume(api, sizeMiB=16)
    try:
        a = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/data"}])
        assert_error(api.post(f"/v1/sandboxes/{a.id}:snapshot", json={}), 409, "conflict")
        assert_error(api.post(f"/v1/sandboxes/{a.id}:fork", json={}), 409, "conflict")
    finally:
        api.delete_all()
        drop_volume(api, vol["id"])


def test_bounds_and_kill_9(build_dir, image_dir, tmp_path):
    """The daemon's bounds on volumes; then a daemon killed with -9 while a volume is attached:
    the data is kept and the volume is attached again after the restart."""
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-vol",
                      extra_args=["--volume-max-mib", "64", "--volume-max-count", "3",
                                  "--volume-max-total-mib", "100"])
    c = Api(d)
    try:
        driver = next((x for x in VOLUME_DRIVERS if x in [o["name"] for o in c.get("/v1/info").json()
                                                          .get("drivers", []) if o.get("available")]), None)
        assert_error(c.post("/v1/volumes", json={"sizeMiB": 65}), 400, "invalid_request")
        v1 = make_volume(c, sizeMiB=64)
        assert_error(c.post("/v1/volumes", json={"sizeMiB": 64}), 429, "quota_exceeded")
        v2 = make_volume(c, sizeMiB=16)
        make_volume(c, sizeMiB=16)
        assert_error(c.post("/v1/volumes", json={"sizeMiB": 16}), 429, "quota_exceeded")
        assert_error(c.post(f"/v1/volumes/{v2['id']}:resize", json={"sizeMiB": 32}), 429, "quota_exceeded")
        if driver is None:
            pytest.skip("neither the namespace nor the gVisor driver runs here")
        s = c.create_sandbox(driver=driver, volumes=[{"volumeId": v1["id"], "path": "/data"}])
        assert sh(c, s.id, "echo survived > /data/f && sync")["exitCode"] == 0
        d.kill()
        d.start()
        c.delete_all()
        s2 = c.create_sandbox(driver=driver, volumes=[{"volumeId": v1["id"], "path": "/data"}])
        assert sh(c, s2.id, "cat /data/f")["stdout"] == "survived\n"
        c.delete_all()
        assert c.post(f"/v1/volumes/{v1['id']}:delete", json={}).status_code == 200
    finally:
        c.close()
        _finish_daemon(d)


def test_our_sdk_same_names(api, daemon, vdriver):
    """Our SDK's runtime.volumes, sync and async, with the published client's names, and
    Sandbox.create(volumes=[{"volume_id", "path", "read_only"}])."""
    import asyncio
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
    from withruntime import AsyncRuntime, Runtime, Sandbox
    from withruntime.errors import ConflictError, InvalidRequestError, NotFoundError

    conn = {"api_key": daemon.api_key, "base_url": daemon.base_url}
    with Runtime(**conn) as rt:
        vol = rt.volumes.create(32, name="sdk-vol", labels={"k": "v"})
        try:
            assert rt.volumes.get(vol["id"])["labels"] == {"k": "v"}
            assert vol["id"] in [v["id"] for v in rt.volumes.list(name="sdk-vol")["data"]]
            assert rt.volumes.resize(vol["id"], 48)["sizeMiB"] == 48
            with pytest.raises(InvalidRequestError):
                rt.volumes.resize(vol["id"], 16)
            with Sandbox.create(driver=vdriver, volumes=[{"volume_id": vol["id"], "path": "/data"}], **conn) as a:
                assert a.exec("echo sdk > /data/f && cat /data/f").stdout == "sdk\n"
                with pytest.raises(ConflictError):
                    rt.volumes.delete(vol["id"])
                with Sandbox.create(driver=vdriver, volumes=[{"volume_id": vol["id"], "path": "/r",
                                                              "read_only": True}], **conn) as b:
                    assert b.exec("echo x > /r/g").exit_code != 0
            b = rt.volumes.backup(vol["id"], name="sdk")
            assert [x["id"] for x in rt.volumes.backups(vol["id"])["data"]] == [b["id"]]
            assert rt.volumes.get_backup(b["id"])["volumeId"] == vol["id"]
            new = rt.volumes.restore(b["id"])
            assert new["sizeMiB"] == 48
            rt.volumes.delete(new["id"])
            assert rt.volumes.delete_backup(b["id"])["deleted"] is True
            kept = rt.volumes.backup(vol["id"], retention_days=2)
            assert kept["expiresAt"] is not None
            rt.volumes.delete_backup(kept["id"])
            pol = rt.volumes.set_backup_policy(vol["id"], every_minutes=30, retention_days=3)["backupPolicy"]
            assert pol["schedule"] == {"everyMinutes": 30} and pol["retentionDays"] == 3
            back = rt.volumes.set_backup_policy(vol["id"], no_schedule=True)["backupPolicy"]
            assert back["daily"] is True and back["retentionDays"] == 3
            cron = rt.volumes.set_backup_policy(vol["id"], cron="0 */6 * * *", keep={"daily": 7})["backupPolicy"]
            assert cron["schedule"] == {"cron": "0 */6 * * *"} and cron["keep"]["daily"] == 7
            assert rt.volumes.set_backup_policy(vol["id"], no_keep=True)["backupPolicy"]["keep"] is None
            assert rt.volumes.set_backup_policy(vol["id"], daily=False)["backupPolicy"]["enabled"] is False
            if vdriver == "namespace":
                with Sandbox.create(driver=vdriver, **conn) as c:
                    att = rt.volumes.attach(vol["id"], c.id, "/live", read_only=True)
                    assert rt.volumes.get_attachment(vol["id"], att["id"])["readOnly"] is True
                    assert c.exec("cat /live/f").stdout == "sdk\n"
                    assert rt.volumes.detach(vol["id"], att["id"])["state"] == "detached"
        finally:
            rt.volumes.delete(vol["id"], force=True)
        with pytest.raises(NotFoundError):
            rt.volumes.get(vol["id"])

    async def run_async():
        async with AsyncRuntime(**conn) as art:
            v = await art.volumes.create(16)
            await art.volumes.set_backup_policy(v["id"], daily=False)
            got = await art.volumes.get(v["id"])
            gone = await art.volumes.delete(v["id"])
            return got, gone
    got, gone = asyncio.run(run_async())
    assert got["sizeMiB"] == 16 and gone["deleted"] is True


def test_volume_kept_across_stop_pause_and_wake(api, vdriver):
    """A stopped sandbox is started again with its volume bound; a paused one keeps it."""
    vol = make_volume(api, sizeMiB=16)
    try:
        a = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/data"}])
        assert sh(api, a.id, "echo 1 > /data/n && sync")["exitCode"] == 0
        assert api.post(f"/v1/sandboxes/{a.id}:pause", json={}).status_code == 200
        assert api.post(f"/v1/sandboxes/{a.id}:wake", json={}).status_code == 200
        api.wait_state(a.id, "running")
        assert sh(api, a.id, "cat /data/n")["stdout"] == "1\n"
        assert api.post(f"/v1/sandboxes/{a.id}:stop", json={}).status_code == 200
        api.wait_state(a.id, "stopped")
        # Stopped, it still holds the volume: another writer is refused.
        assert_error(api.post("/v1/sandboxes", json={"driver": vdriver, "volumes": [{"volumeId": vol["id"],
                                                                                      "path": "/d"}]}),
                     409, "conflict")
        assert api.post(f"/v1/sandboxes/{a.id}:wake", json={}).status_code == 200
        api.wait_state(a.id, "running")
        assert sh(api, a.id, "cat /data/n && findmnt -n -o TARGET /data")["stdout"] == "1\n/data\n"
    finally:
        api.delete_all()
        drop_volume(api, vol["id"])


def test_a_microvm_create_is_refused_up_front_beside_the_hosts_sandboxes(api, daemon):
    """A volume a running namespace sandbox holds, even readOnly, or a shared one it writes: a
    microVM create that asks for it is 409 conflict before anything starts (no guest boots, no
    record is made, the host's mount stays for the holder), naming the volume and its holder.
    A shared volume takes writers on namespace and gVisor together, as docs/volumes.md says."""
    skip_unless_driver(daemon, "namespace")
    offered = {o["name"]: o for o in api.get("/v1/info").json().get("drivers", [])}
    if not offered.get("microvm", {}).get("available"):
        pytest.skip(f"the microvm driver is not available here: {offered.get('microvm')}")
    vol = make_volume(api, sizeMiB=16)
    shared = make_volume(api, sizeMiB=16, shared=True)
    mnt = daemon.state_dir / "volumes" / f"{vol['id']}.mnt"
    try:
        rd = api.create_sandbox(driver="namespace", volumes=[{"volumeId": vol["id"], "path": "/data",
                                                               "readOnly": True}])
        w = api.create_sandbox(driver="namespace", volumes=[{"volumeId": shared["id"], "path": "/s"}])
        assert sh(api, w.id, "echo ns > /s/f && sync")["exitCode"] == 0
        before = {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]}
        for vid, holder, ro in ((vol["id"], rd.id, True), (vol["id"], rd.id, False), (shared["id"], w.id, False),
                                (shared["id"], w.id, True)):
            err = assert_error(api.post("/v1/sandboxes", json={"driver": "microvm", "volumes": [
                {"volumeId": vid, "path": "/v", "readOnly": ro}]}), 409, "conflict")
            assert vid in err["message"] and holder in err["message"], err
            assert "microVM" in err["message"], err
        assert {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]} == before
        assert os.path.ismount(mnt)
        assert [a["sandboxId"] for a in api.get(f"/v1/volumes/{vol['id']}").json()["attachments"]] == [rd.id]
        assert sh(api, rd.id, "ls /data")["exitCode"] == 0
        if offered.get("gvisor", {}).get("available"):
            g = api.create_sandbox(driver="gvisor", volumes=[{"volumeId": shared["id"], "path": "/s"}])
            assert sh(api, g.id, "cat /s/f && echo gv >> /s/f && sync")["stdout"] == "ns\n"
            assert sh(api, w.id, "cat /s/f")["stdout"] == "ns\ngv\n"
    finally:
        api.delete_all()
        drop_volume(api, vol["id"])
        drop_volume(api, shared["id"])


@pytest.mark.microvm_subset
def test_microvm_volume_is_the_guests_disk(api, daemon):
    """A microVM's volume is a virtio disk of its guest (docs/microvm.md, "Volumes"): the guest
    writes it as the sandbox's user and fills it to ENOSPC while the host has it unmounted and
    refuses a namespace sandbox or a second microVM beside it (409 at the create, naming the
    holder); after the microVM's deletion a namespace sandbox's user owns what it wrote and adds to
    it, and a readOnly microVM reads that and cannot write, while the stopped namespace writer's
    wake is 409."""
    skip_unless_driver(daemon, "microvm")
    skip_unless_driver(daemon, "namespace")
    vol = make_volume(api, sizeMiB=16)
    vid = vol["id"]
    img = daemon.state_dir / "volumes" / f"{vid}.img"
    mnt = daemon.state_dir / "volumes" / f"{vid}.mnt"
    at = [{"volumeId": vid, "path": "/data"}]
    try:
        a = api.create_sandbox(driver="microvm", volumes=at)
        r = sh(api, a.id, "stat -c %u /data && echo hello > /data/f && sync && "
                          "dd if=/dev/zero of=/data/big bs=1M count=64 conv=fsync; rm -f /data/big; sync")
        assert r["stdout"].startswith("1000\n") and "No space left on device" in r["stderr"], r
        st = img.stat()
        assert st.st_size == 16 << 20 and st.st_blocks * 512 <= 16 << 20
        # Only the guest's kernel has the filesystem: not mounted on the host, and a namespace
        # sandbox cannot read it beside the microVM's writes.
        assert not os.path.ismount(mnt)
        err = assert_error(api.post("/v1/sandboxes", json={"driver": "namespace",
                                                           "volumes": [dict(at[0], readOnly=True)]}), 409, "conflict")
        assert vid in err["message"] and a.id in err["message"], err
        # Two guests never write one filesystem: a second microVM is refused up front too.
        err = assert_error(api.post("/v1/sandboxes", json={"driver": "microvm",
                                                           "volumes": [dict(at[0], readOnly=True)]}), 409, "conflict")
        assert vid in err["message"] and a.id in err["message"], err
        assert_error(api.post(f"/v1/sandboxes/{a.id}:snapshot", json={}), 409, "conflict")
        assert_error(api.post(f"/v1/sandboxes/{a.id}:fork", json={}), 409, "conflict")
        # Nor a backup: the host cannot freeze a filesystem the guest's kernel writes.
        assert_error(api.post(f"/v1/volumes/{vid}:backup", json={}), 409, "conflict")
        api.delete_all()

        # The owners cross drivers intact: the guest's user wrote f as the host's sandboxes
        # own their files, so the namespace sandbox's user owns it and appends to it.
        b = api.create_sandbox(driver="namespace", volumes=at)
        r = sh(api, b.id, "stat -c %u /data/f && echo more >> /data/f && cat /data/f")
        assert r["stdout"] == "1000\nhello\nmore\n", r
        # While it runs, a microVM is refused even to read; the host's mount stays for the
        # namespace sandbox's readers.
        err = assert_error(api.post("/v1/sandboxes", json={"driver": "microvm",
                                                           "volumes": [dict(at[0], readOnly=True)]}), 409, "conflict")
        assert vid in err["message"] and b.id in err["message"], err
        rd = api.create_sandbox(driver="namespace", volumes=[dict(at[0], readOnly=True)])
        assert sh(api, rd.id, "cat /data/f")["stdout"] == "hello\nmore\n"
        api.delete(f"/v1/sandboxes/{rd.id}")
        # A stopped sandbox holds nothing: a microVM reader takes the volume, and the stopped
        # writer's wake is then 409 up front (it stays stopped, not failed).
        assert api.post(f"/v1/sandboxes/{b.id}:stop", json={}).status_code == 200
        api.wait_state(b.id, "stopped")

        c = api.create_sandbox(driver="microvm", volumes=[dict(at[0], readOnly=True)])
        err = assert_error(api.post(f"/v1/sandboxes/{b.id}:wake", json={}), 409, "conflict")
        assert vid in err["message"] and c.id in err["message"], err
        assert api.sandbox(b.id)["state"] == "stopped"
        r = sh(api, c.id, "stat -c %u /data/f && cat /data/f; echo x > /data/g")
        assert r["stdout"] == "1000\nhello\nmore\n" and "Read-only file system" in r["stderr"], r
        r = sh(api, c.id, "echo x > /data/g", user="root")
        assert r["exitCode"] != 0 and "Read-only file system" in r["stderr"], r
    finally:
        api.delete_all()
        drop_volume(api, vid)


def test_backups_and_restore_published_client(pub, api):
    """backup, backups (pages, by volume), get_backup, restore into a new volume, delete_backup, as
    the published client sends them; the backup is the volume as it was when taken."""
    default = api.get("/v1/info").json().get("defaultDriver")
    if default not in VOLUME_DRIVERS:
        pytest.skip(f"the daemon's default driver is {default}, which attaches no volumes")
    out = pub("""
        import json
        from withruntime import Runtime
        from withruntime._errors import RuntimeError as RtError
        rt = Runtime()
        vol = rt.volumes.create(32)
        with rt.sandboxes.create(volumes=[{"volume_id": vol["id"], "path": "/data"}]) as s:
            s.exec("echo before > /data/f")
            # Taken while the sandbox runs: the filesystem is frozen for the copy.
            b = rt.volumes.backup(vol["id"], name="first")
            s.exec("echo after > /data/f")
        listed = [x["id"] for x in rt.volumes.backups(vol["id"])]
        got = rt.volumes.get_backup(b["id"])
        new = rt.volumes.restore(b["id"], name="restored")
        with rt.sandboxes.create(volumes=[{"volume_id": new["id"], "path": "/r"}]) as s:
            read = s.exec("cat /r/f").stdout
        days = rt.volumes.backup(vol["id"], retention_days=3)
        rt.volumes.delete_backup(days["id"])
        gone = rt.volumes.delete_backup(b["id"])
        try:
            rt.volumes.get_backup(b["id"])
            after = None
        except RtError as e:
            after = [e.code, e.status]
        rt.volumes.delete(vol["id"])
        rt.volumes.delete(new["id"])
        print(json.dumps({"b": b, "listed": listed, "got": got, "new": new, "read": read, "days": days,
                          "gone": gone, "after": after}))
    """)
    assert out["b"]["state"] == "ready" and out["b"]["name"] == "first" and out["b"]["sizeMiB"] == 32
    assert out["listed"] == [out["b"]["id"]] and out["got"]["volumeId"] == out["b"]["volumeId"]
    assert out["new"]["sizeMiB"] == 32 and out["new"]["name"] == "restored"
    assert out["read"] == "before\n"
    # Three days on, to the second of its creation (this daemon's days are 86400 s).
    from datetime import datetime
    made, ends = (datetime.fromisoformat(out["days"][k].replace("Z", "+00:00")) for k in ("createdAt", "expiresAt"))
    assert (ends - made).total_seconds() == 3 * 86400 and out["b"]["expiresAt"] is None
    assert out["gone"]["deleted"] is True and out["after"] == ["not_found", 404]


def test_backups_belong_to_their_owner(api, daemon):
    k = api.post("/v1/keys", json={"name": "vb-other", "owner": "vb-other"})
    assert k.status_code == 201, k.text
    other = Api(daemon, key=k.json()["key"])
    vol = make_volume(api, sizeMiB=16)
    try:
        b = api.post(f"/v1/volumes/{vol['id']}:backup", json={})
        assert b.status_code == 201, b.text
        bid = b.json()["id"]
        assert_error(other.get(f"/v1/volume-backups/{bid}"), 404, "not_found")
        assert_error(other.post(f"/v1/volume-backups/{bid}:delete", json={}), 404, "not_found")
        assert_error(other.post("/v1/volumes", json={"fromBackup": bid}), 404, "not_found")
        assert other.get("/v1/volume-backups").json()["data"] == []
        assert_error(api.post(f"/v1/volumes/{vol['id']}:backup", json={"color": 1}), 400, "invalid_request")
        assert_error(api.post("/v1/volumes", json={"fromBackup": bid, "sizeMiB": 64}), 400, "invalid_request")
        # Backup policies: another owner's is 404; every field is bounded.
        policy = f"/v1/volumes/{vol['id']}:backup-policy"
        assert_error(other.post(policy, json={"daily": True}), 404, "not_found")
        for body in ({"retentionDays": 0}, {"retentionDays": 366}, {"retentionDays": "7"}, {"daily": "yes"},
                     {"schedule": {"everyMinutes": 14}}, {"schedule": {"everyMinutes": 7 * 1440 + 1}},
                     {"schedule": {}}, {"schedule": {"everyMinutes": 60, "x": 1}}, {"schedule": 15},
                     {"daily": False, "schedule": {"everyMinutes": 60}}, {"color": 1}):
            assert_error(api.post(policy, json=body), 400, "invalid_request")
        # A cron schedule and keep counts are taken; a bad one is 400 naming its field, and the
        # policy stays as it was.
        ok = api.post(policy, json={"schedule": {"cron": "0 3 * * *"}, "keep": {"daily": 7}})
        assert ok.status_code == 200, ok.text
        p = ok.json()["backupPolicy"]
        assert p["schedule"] == {"cron": "0 3 * * *"} and p["enabled"] is True and p["daily"] is False
        assert p["keep"] == {"last": 0, "hourly": 0, "daily": 7, "weekly": 0, "monthly": 0, "yearly": 0}
        assert p["nextBackupAt"].endswith("T03:00:00Z"), p
        for cron, field in (("61 * * * *", "minute field"), ("*/0 * * * *", "minute field"),
                            ("0 24 * * *", "hour field"), ("0 5-3 * * *", "hour field"),
                            ("0 0 32 * *", "day-of-month field"), ("0 0 30 feb *", "day-of-month field"),
                            ("0 0 * 13 *", "month field"), ("0 0 * janu *", "month field"),
                            ("0 0 * * 8", "day-of-week field"), ("0 0 * * mon,", "day-of-week field"),
                            ("0 0 * *", "five fields"), ("0 0 * * * *", "five fields"), ("@daily", "five fields"),
                            ("1," * 100 + "1 * * * *", "five fields"), ("", "five fields")):
            r = api.post(policy, json={"schedule": {"cron": cron}})
            assert_error(r, 400, "invalid_request")
            assert field in r.json()["error"]["message"], (cron, r.text)
        for body in ({"schedule": {"cron": 5}}, {"schedule": {"cron": None}},
                     {"schedule": {"cron": "0 3 * * *", "everyMinutes": 60}},
                     {"keep": {"daily": 1001}}, {"keep": {"daily": -1}}, {"keep": {"daily": "7"}},
                     {"keep": {"fortnightly": 1}}, {"keep": [7]}, {"keep": 7}):
            assert_error(api.post(policy, json=body), 400, "invalid_request")
        assert api.get(f"/v1/volumes/{vol['id']}").json()["backupPolicy"] == p
        # Keep counts all 0, or none ({}), clear them as null does: the published client sends
        # keep only when given, so {} is how it clears them.
        for cleared in ({}, {"daily": 0}):
            r = api.post(policy, json={"keep": cleared})
            assert r.status_code == 200 and r.json()["backupPolicy"]["keep"] is None, r.text
            assert api.post(policy, json={"keep": {"daily": 7}}).json()["backupPolicy"]["keep"]["daily"] == 7
        off = api.post(policy, json={"daily": False, "keep": None})
        assert off.status_code == 200 and off.json()["backupPolicy"]["keep"] is None, off.text
        for days in (0, 366, 1.5):
            assert_error(api.post(f"/v1/volumes/{vol['id']}:backup", json={"retentionDays": days}), 400,
                         "invalid_request")
        assert api.get(f"/v1/volumes/{vol['id']}").json()["backupPolicy"]["enabled"] is False
        assert api.delete(f"/v1/volume-backups/{bid}").status_code == 200
    finally:
        other.close()
        drop_volume(api, vol["id"])
        api.delete(f"/v1/keys/{k.json()['id']}")


def test_forced_delete_then_wake_says_why(api, vdriver):
    """A volume deleted by force under a stopped sandbox: its wake fails, naming the volume."""
    vol = make_volume(api, sizeMiB=16)
    a = api.create_sandbox(driver=vdriver, volumes=[{"volumeId": vol["id"], "path": "/data"}])
    try:
        assert api.post(f"/v1/sandboxes/{a.id}:stop", json={}).status_code == 200
        api.wait_state(a.id, "stopped")
        assert api.delete(f"/v1/volumes/{vol['id']}").status_code == 409
        assert api.delete(f"/v1/volumes/{vol['id']}", params={"force": "true"}).status_code == 200
        r = api.post(f"/v1/sandboxes/{a.id}:wake", json={})
        assert r.status_code >= 400, r.text
        assert vol["id"] in r.text and "not on this host" in r.text, r.text
    finally:
        api.delete_all()


# The published-client scripts of the sweep's tests begin with these: a wait for a condition,
# and whether a backup is gone (404).
SWEEP_SCRIPT_HEAD = textwrap.dedent("""
    import json, time
    from withruntime import Runtime
    from withruntime._errors import RuntimeError as RtError
    rt = Runtime()

    def until(what, cond, seconds=60):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            got = cond()
            if got:
                return got
            time.sleep(0.1)
        raise SystemExit(f"timed out waiting for {what}")

    def gone(bid):
        try:
            rt.volumes.get_backup(bid)
            return False
        except RtError as e:
            return e.status == 404
""")


@pytest.mark.skipif(os.environ.get("RUNTIME_TEST_ALL") != "1",
                    reason="waits for a minute's turn (up to 60 s); RUNTIME_TEST_ALL=1 runs it")
def test_a_cron_schedule_takes_its_backup_at_its_time(build_dir, image_dir, tmp_path):
    """schedule.cron "* * * * *" on a daemon sweeping every second: no backup before the
    policy's nextBackupAt, one named `scheduled` at it (within the sweep's second and a margin),
    and nextBackupAt then a minute on."""
    from datetime import datetime, timezone
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-volcron",
                      extra_args=["--volume-backup-sweep-seconds", "1"])
    api = Api(d)
    try:
        vol = make_volume(api, sizeMiB=16)
        r = api.post(f"/v1/volumes/{vol['id']}:backup-policy", json={"schedule": {"cron": "* * * * *"}})
        assert r.status_code == 200, r.text
        due = datetime.fromisoformat(r.json()["backupPolicy"]["nextBackupAt"].replace("Z", "+00:00"))
        assert due.second == 0 and 0 < (due - datetime.now(timezone.utc)).total_seconds() <= 60, due

        def scheduled():
            return [b for b in api.get("/v1/volume-backups", params={"volumeId": vol["id"]}).json()["data"]
                    if b["name"] == "scheduled"]
        while datetime.now(timezone.utc) < due:
            assert not scheduled(), "a backup before its time"
            time.sleep(0.2)
        got = wait_until(scheduled, 30, 0.2, what="the scheduled backup")
        taken = datetime.fromisoformat(got[0]["createdAt"].replace("Z", "+00:00"))
        assert due <= taken <= due + timedelta(seconds=20), (due, taken)
        after = api.get(f"/v1/volumes/{vol['id']}").json()["backupPolicy"]["nextBackupAt"]
        assert datetime.fromisoformat(after.replace("Z", "+00:00")) == due + timedelta(minutes=1), (due, after)
    finally:
        api.delete_all()
        api.close()
        _finish_daemon(d)


def test_backup_policy_and_retention_published_client(published_client, build_dir, image_dir, tmp_path):
    """set_backup_policy and backup(retention_days=) as the published client sends them, on a
    daemon whose day is two seconds (--volume-backup-day-seconds) and whose sweep runs every
    second: the sweep takes the due backup, deletes the expired ones and keeps the one without a
    retention; daily=False turns the policy off."""
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-volsched",
                      extra_args=["--volume-backup-sweep-seconds", "1", "--volume-backup-day-seconds", "2"])
    try:
        out = published_client.run_json(d, SWEEP_SCRIPT_HEAD + textwrap.dedent("""
            vol = rt.volumes.create(16)
            kept = rt.volumes.backup(vol["id"], name="kept")
            short = rt.volumes.backup(vol["id"], name="short", retention_days=1)
            policy = rt.volumes.set_backup_policy(vol["id"], daily=True, retention_days=1)
            got = rt.volumes.get(vol["id"])
            scheduled = until("a scheduled backup", lambda: [b for b in rt.volumes.backups(vol["id"])
                                                             if b["name"] == "scheduled"])[0]
            until("the short backup's expiry", lambda: gone(short["id"]))
            until("the scheduled backup's expiry", lambda: gone(scheduled["id"]))
            every = rt.volumes.set_backup_policy(vol["id"], every_minutes=60)
            off = rt.volumes.set_backup_policy(vol["id"], daily=False)
            still = rt.volumes.get_backup(kept["id"])
            print(json.dumps({"policy": policy, "got": got, "scheduled": scheduled, "every": every,
                              "off": off, "still": still}))
        """))
        assert out["policy"]["backupPolicy"] == out["got"]["backupPolicy"]
        p = out["got"]["backupPolicy"]
        assert p["enabled"] is True and p["daily"] is True and p["retentionDays"] == 1 and p["schedule"] is None
        assert out["scheduled"]["expiresAt"] is not None and out["scheduled"]["volumeId"] == out["got"]["id"]
        e = out["every"]["backupPolicy"]
        assert e["schedule"] == {"everyMinutes": 60} and e["daily"] is False and e["retentionDays"] == 1
        assert out["off"]["backupPolicy"]["enabled"] is False and out["off"]["backupPolicy"]["nextBackupAt"] is None
        assert out["still"]["name"] == "kept" and out["still"]["expiresAt"] is None
    finally:
        _finish_daemon(d)


@pytest.mark.driver_independent
def test_cron_and_keep_counts_published_client(published_client, build_dir, image_dir, tmp_path):
    """set_backup_policy(cron=..., keep=...) as the published client sends them, on a daemon
    whose sweep runs every second and whose day is two seconds: the cron policy reads back on the
    policy and on the volume with its next time, a bad cron is refused 400 naming its field; keep
    {last: 2} on a schedule every 15 (shrunk) minutes leaves the two newest scheduled backups and
    never touches the manual one; with retentionDays a backup still goes at its retention's end
    though a count would keep it."""
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-volkeep",
                      extra_args=["--volume-backup-sweep-seconds", "1", "--volume-backup-day-seconds", "2"])
    try:
        out = published_client.run_json(d, SWEEP_SCRIPT_HEAD + textwrap.dedent("""
            def scheduled(vid):
                return [b["id"] for b in rt.volumes.backups(vid) if b["name"] == "scheduled"]

            vol = rt.volumes.create(16)
            cron = rt.volumes.set_backup_policy(vol["id"], cron="30 4 * * mon-fri", keep={"weekly": 4, "last": 3})
            got = rt.volumes.get(vol["id"])
            try:
                rt.volumes.set_backup_policy(vol["id"], cron="0 25 * * *")
                bad = None
            except RtError as e:
                bad = [e.status, e.code, str(e)]

            manual = rt.volumes.backup(vol["id"], name="by-hand")
            rt.volumes.set_backup_policy(vol["id"], every_minutes=15, keep={"last": 2})
            seen = set()

            def pruned():
                now = scheduled(vol["id"])
                seen.update(now)
                return len(seen) >= 5 and len(now) <= 2 and now
            left = until("five scheduled backups, all but two pruned", pruned)
            pruned_ids = [b for b in seen if b not in left]
            still = rt.volumes.get_backup(manual["id"])

            # retentionDays 1 (two seconds here) with a count that would keep five: the age wins.
            rt.volumes.set_backup_policy(vol["id"], retention_days=1, keep={"last": 5})
            first = until("a backup with a retention",
                          lambda: [b for b in rt.volumes.backups(vol["id"])
                                   if b["name"] == "scheduled" and b["expiresAt"]])[-1]
            until("its retention's end", lambda: gone(first["id"]))
            newer = len([b for b in rt.volumes.backups(vol["id"]) if b["name"] == "scheduled" and b["expiresAt"]])
            # The client leaves keep=None out (the API's keep: null clears the counts): they stay.
            off = rt.volumes.set_backup_policy(vol["id"], daily=False, keep=None)
            # keep={} is how it clears them.
            cleared = rt.volumes.set_backup_policy(vol["id"], keep={})
            print(json.dumps({"cron": cron, "got": got, "bad": bad, "left": left, "gone": len(pruned_ids),
                              "still": still, "newer": newer, "off": off, "cleared": cleared}))
        """), timeout=120)
        p = out["got"]["backupPolicy"]
        assert out["cron"]["backupPolicy"] == p
        assert p["enabled"] is True and p["daily"] is False and p["schedule"] == {"cron": "30 4 * * mon-fri"}
        assert p["keep"] == {"last": 3, "hourly": 0, "daily": 0, "weekly": 4, "monthly": 0, "yearly": 0}
        from datetime import datetime
        nxt = datetime.fromisoformat(p["nextBackupAt"].replace("Z", "+00:00"))
        assert (nxt.hour, nxt.minute, nxt.second) == (4, 30, 0) and nxt.weekday() < 5, p
        assert out["bad"][0] == 400 and out["bad"][1] == "invalid_request" and "hour field" in out["bad"][2]
        assert len(out["left"]) <= 2 and out["gone"] >= 3
        assert out["still"]["name"] == "by-hand"
        assert out["newer"] < 5
        assert out["off"]["backupPolicy"]["enabled"] is False and out["off"]["backupPolicy"]["keep"]["last"] == 5
        assert out["cleared"]["backupPolicy"]["keep"] is None, out["cleared"]
    finally:
        _finish_daemon(d)


def test_attach_to_a_running_sandbox(pub, api, daemon):
    """attach, get_attachment and detach as the published client sends them, on the namespace
    driver: a running sandbox gets the volume at the path, its user owning its root, writes, the
    volume is detached (refused while a process holds it) and attached to another sandbox that
    reads the file; a read-only attach refuses writes; the paths of a create are refused, and a
    symbolic link the sandbox plants on the way; another owner finds nothing; of two attaches
    racing for one volume one wins; gVisor and the microVM refuse, naming why."""
    skip_unless_driver(daemon, "namespace")
    vol = make_volume(api, sizeMiB=16)
    a = api.create_sandbox(driver="namespace")
    b = api.create_sandbox(driver="namespace")
    try:
        out = pub("""
            import json, sys
            from withruntime import Runtime
            rt = Runtime()
            vol, a = sys.argv[1], sys.argv[2]
            att = rt.volumes.attach(vol, a, "/mnt/data")
            got = rt.volumes.get_attachment(vol, att["id"])
            listed = rt.volumes.get(vol)["attachments"]
            print(json.dumps({"att": att, "got": got, "listed": listed}))
        """, vol["id"], a.id)
        assert out["att"]["sandboxId"] == a.id and out["att"]["path"] == "/mnt/data"
        assert out["got"] == out["att"] and [x["id"] for x in out["listed"]] == [out["att"]["id"]]
        res = sh(api, a.id, "stat -c %u /mnt/data && echo live > /mnt/data/f && sync")
        assert res["stdout"] == "1000\n", res
        # A process with its cwd in the volume holds it: the detach is refused, never lazy.
        sh(api, a.id, "setsid sh -c 'cd /mnt/data && exec sleep 300' </dev/null >/dev/null 2>&1 &")
        assert sh(api, a.id, "sleep 0.2; pgrep -x sleep")["exitCode"] == 0
        aid = out["att"]["id"]
        detach = f"/v1/volumes/{vol['id']}/attachments/{aid}:detach"
        assert_error(api.post(detach, json={}), 409, "conflict")
        sh(api, a.id, "pkill -x sleep; sleep 0.2")
        out = pub("""
            import json, sys
            from withruntime import Runtime
            rt = Runtime()
            print(json.dumps(rt.volumes.detach(sys.argv[1], sys.argv[2])))
        """, vol["id"], aid)
        assert out["state"] == "detached"
        assert sh(api, a.id, "test -e /mnt/data/f")["exitCode"] != 0
        assert_error(api.get(f"/v1/volumes/{vol['id']}/attachments/{aid}"), 404, "not_found")
        r = api.post(f"/v1/volumes/{vol['id']}:attach", json={"sandboxId": b.id, "path": "/data", "readOnly": True})
        assert r.status_code == 201, r.text
        assert sh(api, b.id, "cat /data/f")["stdout"] == "live\n"
        assert sh(api, b.id, "echo x > /data/g")["exitCode"] != 0
        assert sh(api, b.id, "echo x > /data/g", user="root")["exitCode"] != 0
        assert api.post(f"/v1/volumes/{vol['id']}/attachments/{b.id}:detach", json={}).status_code == 200

        # Paths: those a create refuses, and a link the sandbox made on the way.
        attach = f"/v1/volumes/{vol['id']}:attach"
        for path in ("/", "/proc", "/proc/x", "/.runtime", "/sys/y", "/dev", "relative", "/a/../proc", "/a//b",
                     "/a/", "/a/.", "x" * 300):
            assert_error(api.post(attach, json={"sandboxId": a.id, "path": path}), 400, "invalid_request")
        sh(api, a.id, "ln -s /proc /tmp/p && ln -s /etc /tmp/e")
        for path in ("/tmp/p", "/tmp/p/sub", "/tmp/e/sub"):
            assert_error(api.post(attach, json={"sandboxId": a.id, "path": path}), 400, "invalid_request")
        assert_error(api.post(attach, json={"sandboxId": a.id, "path": "/d", "mode": "rw"}), 400, "invalid_request")
        assert_error(api.post(attach, json={"sandboxId": "sbx_none", "path": "/d"}), 404, "not_found")

        # Another owner: neither the volume nor the sandbox is found.
        k = api.post("/v1/keys", json={"name": "va-other", "owner": "va-other"})
        assert k.status_code == 201, k.text
        other = Api(daemon, key=k.json()["key"])
        try:
            assert_error(other.post(attach, json={"sandboxId": a.id, "path": "/d"}), 404, "not_found")
            theirs = make_volume(other, sizeMiB=16)
            assert_error(other.post(f"/v1/volumes/{theirs['id']}:attach", json={"sandboxId": a.id, "path": "/d"}),
                         404, "not_found")
            assert_error(other.get(f"/v1/volumes/{vol['id']}/attachments/{a.id}"), 404, "not_found")
            drop_volume(other, theirs["id"])
        finally:
            other.close()
            api.delete(f"/v1/keys/{k.json()['id']}")

        # Two attaches racing for the one writer: one wins.
        results: list[int] = []

        def race(sid: str, path: str) -> None:
            c = Api(daemon)
            results.append(c.post(attach, json={"sandboxId": sid, "path": path}).status_code)
            c.close()
        threads = [threading.Thread(target=race, args=(a.id, "/w1")), threading.Thread(target=race, args=(b.id, "/w2"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [201, 409], results
        # A sandbox's end ends its live attachment as a create's.
        api.delete(f"/v1/sandboxes/{a.id}")
        api.delete(f"/v1/sandboxes/{b.id}")
        assert api.get(f"/v1/volumes/{vol['id']}").json()["attachments"] == []

    finally:
        api.delete_all()
        drop_volume(api, vol["id"])


def test_attach_to_a_running_gvisor_sandbox(pub, api, daemon):
    """The same calls on gVisor (volumes.md, "Attaching to a running sandbox"): the host binds the
    volume under the sandbox's live directory and the agent's helper binds it at the path. A
    running sandbox gets the volume, its user owning its root, writes, another sandbox reads it;
    the detach is refused while a process holds it and leaves the path empty with the data kept; a
    read-only attach refuses writes, root's too; the paths, a second attach, a stopped sandbox and
    a link planted on the way are refused as on namespace; nothing in the sandbox mounts, reaches
    the live directory, or climbs out of a volume by `..` or a link; a volume given at the create
    is not detached while it runs."""
    skip_unless_driver(daemon, "gvisor")
    vol = make_volume(api, sizeMiB=16, shared=True)
    other_vol = make_volume(api, sizeMiB=16)
    a = api.create_sandbox(driver="gvisor")
    b = api.create_sandbox(driver="gvisor")
    attach = f"/v1/volumes/{vol['id']}:attach"
    try:
        aid = pub_attach(pub, vol["id"], a.id, "/mnt/data")
        res = sh(api, a.id, "stat -c %u /mnt/data && echo live > /mnt/data/f && sync && cat /mnt/data/f")
        assert res["stdout"] == "1000\nlive\n", res
        r = api.post(attach, json={"sandboxId": b.id, "path": "/data"})
        assert r.status_code == 201, r.text
        assert sh(api, b.id, "cat /data/f")["stdout"] == "live\n"
        assert sh(api, b.id, "echo more >> /data/f && sync")["exitCode"] == 0
        assert sh(api, a.id, "cat /mnt/data/f")["stdout"] == "live\nmore\n"

        # Nothing in the sandbox mounts, sees the live directory, or climbs out.
        for cmd in ("mount -t tmpfs x /tmp", "mount --bind /mnt/data /tmp", "umount /mnt/data",
                    "ls /.runtime/live | grep .", "cd /mnt/data/.. && ls /mnt/data/../../.runtime/live | grep ."):
            out = sh(api, a.id, cmd, user="root")
            assert out["exitCode"] != 0, (cmd, out)
        assert sh(api, a.id, "grep -c ' /mnt/data ' /proc/self/mountinfo")["stdout"] == "1\n"
        # Only the agent's helper keeps CAP_SYS_ADMIN, and root in the sandbox cannot look into it.
        st = sh(api, a.id, "grep CapBnd /proc/self/status", user="root")["stdout"].split()
        assert int(st[1], 16) & (1 << 21) == 0, st
        helper = sh(api, a.id, "pgrep -x runtime-mounts")["stdout"].strip()
        out = sh(api, a.id, f"python3 -c 'import ctypes; print(ctypes.CDLL(None).ptrace(16, {helper}, 0, 0))'",
                 user="root")
        assert out["stdout"] == "-1\n", out
        sh(api, a.id, "ln -s / /mnt/data/up && ln -s /.runtime/live /mnt/data/lv")
        out = sh(api, a.id, "ls /mnt/data/up/ | grep -c proc; ls /mnt/data/lv/ | wc -l")
        assert out["stdout"] == "1\n0\n", out
        assert sh(api, a.id, "test -e /mnt/data/up/etc/hostname")["exitCode"] == 0  # the sandbox's own root

        # A process with its cwd in the volume holds it: the detach is refused, never lazy.
        sh(api, a.id, "setsid sh -c 'cd /mnt/data && exec sleep 300' </dev/null >/dev/null 2>&1 &")
        assert sh(api, a.id, "sleep 0.2; pgrep -x sleep")["exitCode"] == 0
        detach = f"/v1/volumes/{vol['id']}/attachments/{aid}:detach"
        assert_error(api.post(detach, json={}), 409, "conflict")
        sh(api, a.id, "pkill -x sleep; while pgrep -x sleep; do sleep 0.1; done")
        # Nor does root follow the helper's descriptors (to the live directory) out of /proc.
        out = sh(api, a.id, "p=$(pgrep -x runtime-mounts); ls /proc/$p/fd | grep -q . && "
                            "for f in /proc/$p/fd/*; do readlink $f || ls $f/ && echo followed; done", user="root")
        assert "followed" not in out["stdout"] and "Permission denied" in out["stderr"], out
        pub_detach(pub, vol["id"], aid)
        assert sh(api, a.id, "ls -A /mnt/data | wc -l")["stdout"] == "0\n"
        assert sh(api, b.id, "cat /data/f")["stdout"] == "live\nmore\n"
        assert api.post(f"/v1/volumes/{vol['id']}/attachments/{b.id}:detach", json={}).status_code == 200
        assert api.get(f"/v1/volumes/{vol['id']}").json()["attachments"] == []

        # Read-only: nobody writes, root neither.
        r = api.post(attach, json={"sandboxId": b.id, "path": "/ro", "readOnly": True})
        assert r.status_code == 201, r.text
        assert sh(api, b.id, "cat /ro/f")["stdout"] == "live\nmore\n"
        assert sh(api, b.id, "echo x > /ro/g")["exitCode"] != 0
        assert sh(api, b.id, "echo x > /ro/g", user="root")["exitCode"] != 0
        assert sh(api, b.id, "mount -o remount,rw /ro", user="root")["exitCode"] != 0

        # The refusals of the namespace driver.
        assert_error(api.post(attach, json={"sandboxId": b.id, "path": "/again"}), 409, "conflict")
        for path in ("/", "/proc", "/.runtime", "/.runtime/live", "/dev", "relative", "/a/../proc"):
            assert_error(api.post(attach, json={"sandboxId": a.id, "path": path}), 400, "invalid_request")
        sh(api, a.id, "ln -s /proc /tmp/p && ln -s /etc /tmp/e && touch /tmp/file")
        for path in ("/tmp/p", "/tmp/p/sub", "/tmp/e/sub", "/tmp/file"):
            assert_error(api.post(attach, json={"sandboxId": a.id, "path": path}), 400, "invalid_request")
        r = api.post(f"/v1/volumes/{other_vol['id']}:attach", json={"sandboxId": a.id, "path": "/etc"})
        assert r.status_code == 201, r.text  # over a directory that exists: it is hidden, as on namespace
        assert sh(api, a.id, "ls -A /etc")["stdout"] == "lost+found\n"
        assert api.post(f"/v1/volumes/{other_vol['id']}/attachments/{a.id}:detach", json={}).status_code == 200
        assert sh(api, a.id, "test -s /etc/passwd")["exitCode"] == 0
        assert api.post(f"/v1/sandboxes/{a.id}:stop", json={}).status_code == 200
        assert_error(api.post(attach, json={"sandboxId": a.id, "path": "/d"}), 409, "conflict")

        # A volume given at the create stays while the sandbox runs; a live one outlives a restart.
        c = api.create_sandbox(driver="gvisor", volumes=[{"volumeId": other_vol["id"], "path": "/given"}])
        assert_error(api.post(f"/v1/volumes/{other_vol['id']}/attachments/{c.id}:detach", json={}), 409,
                     "conflict")
        r = api.post(attach, json={"sandboxId": c.id, "path": "/live", "readOnly": True})
        assert r.status_code == 201, r.text
        assert api.post(f"/v1/sandboxes/{c.id}:stop", json={}).status_code == 200
        assert api.post(f"/v1/sandboxes/{c.id}:wake", json={}).status_code in (200, 202)
        assert sh(api, c.id, "cat /live/f && test -d /given")["stdout"] == "live\nmore\n"
    finally:
        api.delete_all()
        drop_volume(api, vol["id"])
        drop_volume(api, other_vol["id"])


@pytest.mark.microvm_subset
def test_attach_to_a_running_microvm(pub, api, daemon):
    """A microVM takes a volume while it runs (volumes.md, "Attaching to a running sandbox"): the
    host puts the volume's image in one of the guest's empty disk slots and the agent probes that
    disk again and mounts it. Its user owns the root and writes; a process in it keeps the detach
    refused (409), never lazy; after the detach the path is empty and the image's lock is free
    (a namespace sandbox reads what the guest wrote); a read-only attach goes into a read-only
    slot whose disk nobody writes, root neither, nor remounts; a slot emptied takes a volume again
    and shows that volume, not what the guest saw before; a link planted on the way, a paused
    sandbox and a second attach are refused; and a live attachment is a disk of the next boot,
    which is then not detached while it runs."""
    skip_unless_driver(daemon, "microvm")
    skip_unless_driver(daemon, "namespace")
    vol = make_volume(api, sizeMiB=16)
    other = make_volume(api, sizeMiB=16)
    a = api.create_sandbox(driver="microvm", timeoutSeconds=900)
    attach = f"/v1/volumes/{vol['id']}:attach"
    try:
        aid = pub_attach(pub, vol["id"], a.id, "/mnt/data")
        res = sh(api, a.id, "stat -c %u /mnt/data && echo live > /mnt/data/f && sync && cat /mnt/data/f && "
                            "findmnt -n -o FSTYPE /mnt/data")
        assert res["stdout"] == "1000\nlive\next4\n", res
        # The guest's kernel holds the image: no namespace sandbox reads it meanwhile.
        assert_error(api.post("/v1/sandboxes", json={"driver": "namespace", "volumes": [
            {"volumeId": vol["id"], "path": "/d", "readOnly": True}]}), 409, "conflict")
        assert_error(api.post(attach, json={"sandboxId": a.id, "path": "/again"}), 409, "conflict")

        # A process with its cwd in the volume holds it: the detach is refused, never lazy.
        sh(api, a.id, "setsid sh -c 'cd /mnt/data && exec sleep 300' </dev/null >/dev/null 2>&1 &")
        wait_until(lambda: sh(api, a.id, "pgrep -x sleep")["exitCode"] == 0, timeout=30)
        detach = f"/v1/volumes/{vol['id']}/attachments/{aid}:detach"
        assert_error(api.post(detach, json={}), 409, "conflict")
        sh(api, a.id, "pkill -x sleep; while pgrep -x sleep; do sleep 0.1; done")
        pub_detach(pub, vol["id"], aid)
        assert sh(api, a.id, "ls -A /mnt/data | wc -l; findmnt /mnt/data")["stdout"] == "0\n"
        assert api.get(f"/v1/volumes/{vol['id']}").json()["attachments"] == []
        # QEMU let the image go with its lock: a namespace sandbox writes it now.
        n = api.create_sandbox(driver="namespace", volumes=[{"volumeId": vol["id"], "path": "/d"}])
        assert sh(api, n.id, "cat /d/f && echo ns >> /d/f")["stdout"] == "live\n"
        api.delete(f"/v1/sandboxes/{n.id}")

        # Read-only: a read-only slot; nobody writes, root neither, nor remounts it.
        r = api.post(attach, json={"sandboxId": a.id, "path": "/ro", "readOnly": True})
        assert r.status_code == 201, r.text
        assert sh(api, a.id, "cat /ro/f")["stdout"] == "live\nns\n"
        assert sh(api, a.id, "echo x > /ro/g")["exitCode"] != 0
        assert sh(api, a.id, "echo x > /ro/g", user="root")["exitCode"] != 0
        assert sh(api, a.id, "mount -o remount,rw /ro", user="root")["exitCode"] != 0
        assert api.post(f"/v1/volumes/{vol['id']}/attachments/{a.id}:detach", json={}).status_code == 200

        # The writable slot emptied before takes another volume: the guest sees that one's files
        # and size, nothing it cached of the first.
        r = api.post(f"/v1/volumes/{other['id']}:attach", json={"sandboxId": a.id, "path": "/mnt/data"})
        assert r.status_code == 201, r.text
        res = sh(api, a.id, "ls -A /mnt/data; echo o > /mnt/data/o && sync && cat /mnt/data/o")
        assert res["stdout"] == "lost+found\no\n", res
        assert api.post(f"/v1/volumes/{other['id']}/attachments/{a.id}:detach", json={}).status_code == 200

        # The refusals: a link on the way (the agent walks the path with no link followed), a
        # paused sandbox (its agent mounts), and a file where a directory should be.
        sh(api, a.id, "ln -s /etc /tmp/e && touch /tmp/file")
        for path in ("/tmp/e/sub", "/tmp/file"):
            assert_error(api.post(attach, json={"sandboxId": a.id, "path": path}), 400, "invalid_request")
        assert sh(api, a.id, "test -e /etc/sub")["exitCode"] == 1  # nothing made through the link
        assert api.get(f"/v1/volumes/{vol['id']}").json()["attachments"] == []
        assert api.post(f"/v1/sandboxes/{a.id}:pause", json={}).status_code == 200
        assert_error(api.post(attach, json={"sandboxId": a.id, "path": "/p"}), 409, "conflict")
        assert api.post(f"/v1/sandboxes/{a.id}:wake", json={}).status_code in (200, 202)
        api.wait_state(a.id, "running")

        # A live attachment is a disk of the next boot, and is then not detached while it runs.
        r = api.post(attach, json={"sandboxId": a.id, "path": "/live"})
        assert r.status_code == 201, r.text
        assert api.post(f"/v1/sandboxes/{a.id}:stop", json={}).status_code == 200
        api.wait_state(a.id, "stopped")
        assert api.post(f"/v1/sandboxes/{a.id}:wake", json={}).status_code in (200, 202)
        api.wait_state(a.id, "running")
        assert sh(api, a.id, "cat /live/f")["stdout"] == "live\nns\n"
        assert_error(api.post(f"/v1/volumes/{vol['id']}/attachments/{a.id}:detach", json={}), 409, "conflict")
    finally:
        api.delete_all()
        drop_volume(api, vol["id"])
        drop_volume(api, other["id"])


@pytest.mark.microvm_subset
def test_a_microvm_live_attachment_outlives_its_daemon(build_dir, image_dir, tmp_path):
    """A volume put in a running microVM's disk slot, then the daemon killed (-9) with its
    sandboxes kept running (live restore): the guest still has the volume's files and writes
    them; the attachment shows; no other sandbox takes the volume meanwhile; the adopted guest's
    slot is detached, and the volume then attached to another sandbox with the guest's writes."""
    with kept_daemon(build_dir, image_dir, tmp_path, "vmlive") as (d, c):
        skip_unless_driver(d, "microvm")
        skip_unless_driver(d, "namespace")
        vid = make_volume(c, sizeMiB=16)["id"]
        a = c.create_sandbox(driver="microvm", timeoutSeconds=900)
        r = c.post(f"/v1/volumes/{vid}:attach", json={"sandboxId": a.id, "path": "/mnt/data"})
        assert r.status_code == 201, r.text
        assert sh(c, a.id, "echo before > /mnt/data/f && sync")["exitCode"] == 0
        d.kill()
        d.start()
        assert c.sandbox(a.id)["state"] == "running"
        res = sh(c, a.id, "cat /mnt/data/f && echo after >> /mnt/data/f && sync && findmnt -n -o TARGET /mnt/data")
        assert res["stdout"] == "before\n/mnt/data\n", res
        assert [x["sandboxId"] for x in c.get(f"/v1/volumes/{vid}").json()["attachments"]] == [a.id]
        assert_error(c.post("/v1/sandboxes", json={"driver": "namespace",
                                                   "volumes": [{"volumeId": vid, "path": "/d"}]}), 409, "conflict")
        r = c.post(f"/v1/volumes/{vid}/attachments/{a.id}:detach", json={})
        assert r.status_code == 200, r.text
        assert sh(c, a.id, "test -e /mnt/data/f")["exitCode"] != 0
        b = c.create_sandbox(driver="namespace", volumes=[{"volumeId": vid, "path": "/d"}])
        assert sh(c, b.id, "cat /d/f")["stdout"] == "before\nafter\n"
        c.delete_all()
        assert c.post(f"/v1/volumes/{vid}:delete", json={}).status_code == 200


@pytest.mark.parametrize("driver", ["namespace", "gvisor"])
@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_live_attachment_outlives_its_daemon(build_dir, image_dir, tmp_path, how, driver):
    """A volume attached through :attach to a running sandbox (namespace, gVisor), then the daemon stopped
    (SIGTERM) or killed (-9) with its sandboxes kept running (live restore): after the restart the
    sandbox still has the volume's files and writes them, the volume's record shows the
    attachment, a backup is frozen for its copy, readers attach it, no other sandbox writes it
    meanwhile (one writer), and the detach works."""
    with kept_daemon(build_dir, image_dir, tmp_path, "vlive") as (d, c):
        skip_unless_driver(d, driver)
        vid = make_volume(c, sizeMiB=16)["id"]
        a = c.create_sandbox(driver=driver, timeoutSeconds=600)
        b = c.create_sandbox(driver=driver, timeoutSeconds=600)
        r = c.post(f"/v1/volumes/{vid}:attach", json={"sandboxId": a.id, "path": "/mnt/data"})
        assert r.status_code == 201, r.text
        assert sh(c, a.id, "echo before > /mnt/data/f && sync")["exitCode"] == 0
        if how == "kill":
            d.kill()
        else:
            assert d.stop() == 0
        d.start()
        assert c.sandbox(a.id)["state"] == "running"
        res = sh(c, a.id, "cat /mnt/data/f && echo after >> /mnt/data/f && sync && findmnt -n -o TARGET /mnt/data")
        assert res["stdout"] == "before\n/mnt/data\n", res
        assert [x["sandboxId"] for x in c.get(f"/v1/volumes/{vid}").json()["attachments"]] == [a.id]
        assert c.get(f"/v1/volumes/{vid}/attachments/{a.id}").json()["path"] == "/mnt/data"
        # A backup meanwhile freezes the filesystem the sandbox binds: the daemon mounts it again
        # (the same one, from the loop device that holds it) rather than copy it as it changes.
        bk = c.post(f"/v1/volumes/{vid}:backup", json={})
        assert bk.status_code == 201, bk.text
        assert os.path.ismount(d.state_dir / "volumes" / f"{vid}.mnt")
        copy = c.post("/v1/volumes", json={"fromBackup": bk.json()["id"]})
        assert copy.status_code == 201, copy.text
        # Readers may have it meanwhile, as before the restart.
        rd = c.create_sandbox(driver=driver, volumes=[{"volumeId": vid, "path": "/r", "readOnly": True},
                                                           {"volumeId": copy.json()["id"], "path": "/c"}])
        assert sh(c, rd.id, "cat /r/f /c/f")["stdout"] == "before\nafter\n" * 2
        c.delete(f"/v1/sandboxes/{rd.id}")
        # Still the one writer: neither an attach nor a create takes it elsewhere.
        assert_error(c.post(f"/v1/volumes/{vid}:attach", json={"sandboxId": b.id, "path": "/d"}), 409, "conflict")
        assert_error(c.post("/v1/sandboxes", json={"driver": driver,
                                                   "volumes": [{"volumeId": vid, "path": "/d"}]}), 409, "conflict")
        r = c.post(f"/v1/volumes/{vid}/attachments/{a.id}:detach", json={})
        assert r.status_code == 200, r.text
        assert sh(c, a.id, "test -e /mnt/data/f")["exitCode"] != 0
        assert c.get(f"/v1/volumes/{vid}").json()["attachments"] == []
        r = c.post(f"/v1/volumes/{vid}:attach", json={"sandboxId": b.id, "path": "/d"})
        assert r.status_code == 201, r.text
        assert sh(c, b.id, "cat /d/f")["stdout"] == "before\nafter\n"
        c.delete_all()
        assert c.post(f"/v1/volumes/{vid}:delete", json={}).status_code == 200
        assert c.post(f"/v1/volumes/{copy.json()['id']}:delete", json={}).status_code == 200
