"""Images users build, in a fleet (docs/images.md, docs/fleet.md): two runtimed on one real
PostgreSQL, sharing a fleet secret; an owner's key made through host a serves on both. An image
built through host a is read through host b (list, get, resolve, its log as a page and followed),
a sandbox created through b from it runs on a (the host that keeps its disk) and sees its files, a
tag moved through b is seen on a, and a delete through b removes the disk on a. A host whose epoch
moved on during a build writes nothing of it (not its disk, not its end), and the sweeper fails it
once the host is dead. An image whose host is dead answers a create and a log read 503 at once,
saying to build it again; a rebuild through the surviving host builds again there (the cache is
per host), and the dead host's disk goes at its next start once its record is deleted. A build sent
to b whose FROM or COPY --from names an image a keeps fails at that line naming a; sent to a, it
runs (a build secret too)."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import time
import uuid

import pytest

from conftest import _two_hosts
from helpers import Api, assert_error, wait_until


DOCKERFILE = """\
FROM default
WORKDIR /opt/app
COPY hello.txt ./
RUN echo "built on $(hostname)" > built.txt && cat hello.txt
"""
CONTEXT = {"hello.txt": b"hello from the context\n"}


def _hosts(build_dir, image_dir, tmp_path, postgres, dead_after: int):
    # Builds run on the daemon's default driver: namespace here, and the creates ask for it too.
    for a, b, db in _two_hosts(build_dir, image_dir, tmp_path, postgres, dead_after=dead_after, ids=("img-a", "img-b"),
                               extra_args=("--driver", "namespace")):
        yield a, b, (lambda sql: postgres.psql(sql, db).strip())


@pytest.fixture
def pair(build_dir, image_dir, tmp_path, postgres):
    yield from _hosts(build_dir, image_dir, tmp_path, postgres, 3)


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0)


def _owner_key(a) -> str:
    """A key of an owner's own, made through host a: keys are the store's, so it works on every
    host."""
    with Api(a) as admin:
        r = admin.post("/v1/keys", json={"name": "builder", "owner": f"owner-{uuid.uuid4().hex[:8]}"})
        assert r.status_code == 201, r.text
        return r.json()["key"]


def _host_state(daemon, admin_key: str, host: str) -> str:
    with Api(daemon, key=admin_key) as admin:
        return {h["id"]: h for h in admin.get("/v1/hosts").json()["hosts"]}[host]["state"]


def _build(api: Api, name: str, dockerfile: str = DOCKERFILE, files: dict[str, bytes] | None = None,
           tags=("v1",)) -> str:
    """A build through api's host, its context's chunk uploaded there: the image's id."""
    data = _tar(CONTEXT if files is None else files)
    digest = hashlib.sha256(data).hexdigest()
    if api.post("/v1/images/context/missing", json={"digests": [digest]}).json()["missing"]:
        r = api.put(f"/v1/images/context/{digest}", content=data)
        assert r.status_code == 200, r.text
    r = api.post("/v1/images", json={"name": name, "dockerfile": dockerfile, "tags": list(tags),
                                     "context": {"archive": {"sha256": digest, "size": len(data),
                                                             "chunks": [digest]}, "files": []}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _ended(api: Api, image_id: str, timeout: float = 300) -> dict:
    def done():
        j = api.get(f"/v1/images/{image_id}").json()
        return j if j["state"] not in ("queued", "building") else None
    return wait_until(done, timeout, 0.5, what=f"image {image_id}'s build to end")


def _log_lines(api: Api, image_id: str) -> list[str]:
    r = api.get(f"/v1/images/{image_id}/logs")
    assert r.status_code == 200, r.text
    return [line["line"] for line in r.json()["lines"]]


class _Via:
    """A host as the published client's harness sees one: its URL, with a key of our choosing."""

    def __init__(self, host, key):
        self.base_url, self.api_key = host.base_url, key


def test_an_image_built_on_one_host_serves_the_fleet(pair, published_client):
    a, b, sql = pair
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    key = _owner_key(a)
    with Api(a, key=key) as on_a, Api(b, key=key) as via_b:
        image_id = _build(on_a, name)
        image = _ended(on_a, image_id)
        assert image["state"] == "ready", image
        assert sql(f"SELECT host_id FROM images WHERE id = '{image_id}'") == "img-a"
        snap = image["snapshotId"]
        assert (a.state_dir / "snapshots" / snap).is_dir()
        # The records are the store's: b lists, gets and resolves it as a does.
        listed = via_b.get("/v1/images", params={"name": name}).json()["data"]
        assert [i["id"] for i in listed] == [image_id] and listed[0]["state"] == "ready", listed
        assert via_b.get(f"/v1/images/{image_id}").json() == on_a.get(f"/v1/images/{image_id}").json()
        r = via_b.get("/v1/images/resolve", params={"ref": f"{name}:v1"})
        assert r.status_code == 200 and r.json()["id"] == image_id, r.text
        # The log is a's file: b's answer is a's, as a page and followed to its end.
        lines = _log_lines(via_b, image_id)
        assert lines == _log_lines(on_a, image_id) and any("hello from the context" in x for x in lines), lines
        page = via_b.get(f"/v1/images/{image_id}/logs").json()
        assert page["done"] is True and page["nextAfter"] > 0, page
        with via_b.stream("GET", f"/v1/images/{image_id}/logs", params={"follow": "true"}) as resp:
            assert resp.status_code == 200
            events = [json.loads(x) for x in resp.iter_lines() if x]
        assert events[-1]["type"] == "done" and events[-1]["image"]["id"] == image_id, events[-3:]
        # A sandbox created through b from the image runs on a, where its disk is, and sees its files.
        for ref in (f"{name}:v1", image_id):
            r = via_b.post("/v1/sandboxes", json={"image": ref, "driver": "namespace", "timeoutSeconds": 120})
            assert r.status_code == 201, r.text
            sbx = r.json()["id"]
            assert sql(f"SELECT host_id FROM sandboxes WHERE id = '{sbx}'") == "img-a"
            res = via_b.exec(sbx, command="cat /opt/app/hello.txt /opt/app/built.txt")
            assert res["exitCode"] == 0 and res["stdout"].startswith("hello from the context\nbuilt on "), res
            assert via_b.delete(f"/v1/sandboxes/{sbx}").status_code in (200, 204)
        # The published client, pointed at b, starts one by name as well.
        got = published_client.run_json(_Via(b, key), """
import json, sys
from withruntime import Runtime, Sandbox
image = Runtime().images.resolve(sys.argv[1])
s = Sandbox.create(image=sys.argv[1], timeout_seconds=120)
out = s.exec("cat /opt/app/hello.txt").stdout
s.delete()
print(json.dumps([image["id"], out]))
""", args=[f"{name}:v1"], timeout=240)
        assert got == [image_id, "hello from the context\n"], got
        # A tag moved through b is seen through a; untagged through b, gone on a.
        r = via_b.post(f"/v1/images/{image_id}:tag", json={"tag": "stable"})
        assert r.status_code == 200 and sorted(r.json()["tags"]) == ["stable", "v1"], r.text
        assert on_a.get("/v1/images/resolve", params={"ref": f"{name}:stable"}).json()["id"] == image_id
        assert via_b.post(f"/v1/images/{image_id}:untag", json={"tag": "v1"}).status_code == 200
        assert on_a.get("/v1/images/resolve", params={"ref": f"{name}:v1"}).status_code == 404
        # A delete through b goes on to a, which removes the disk and the log with the records.
        log_file = a.state_dir / "user-images" / f"{image_id}.log"
        assert log_file.exists()
        r = via_b.post(f"/v1/images/{image_id}:delete", json={})
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
        assert not (a.state_dir / "snapshots" / snap).exists()
        assert not log_file.exists()
        assert sql(f"SELECT count(*) FROM snapshots WHERE id = '{snap}'") == "0"
        assert_error(on_a.get(f"/v1/images/{image_id}"), 404, "image_not_found")
        assert_error(via_b.get(f"/v1/images/{image_id}/logs"), 404, "image_not_found")


def test_a_host_whose_epoch_moved_on_writes_nothing_of_its_build(pair):
    # The build runs on a; while its step runs, a's epoch moves on in the store (another runtimed
    # registered its id, as test_hosts does by a second start). a fences itself at its next beat,
    # its build ends, and none of it lands: not its disk, not its end (the record stays building),
    # until b, the sweeper, declares a dead and fails the build saying why.
    a, b, sql = pair
    name = f"fenced-{uuid.uuid4().hex[:8]}"
    dockerfile = "FROM default\nRUN echo step-started && sleep 3 && echo step-ended\n"
    with Api(a) as on_a, Api(b, key=a.api_key) as via_b:
        image_id = _build(on_a, name, dockerfile=dockerfile, files={})
        wait_until(lambda: any("step-started" in x for x in _log_lines(on_a, image_id)), 120, 0.2,
                   what="the build's step to start")
        epoch = int(sql("SELECT epoch FROM hosts WHERE id = 'img-a'"))
        sql(f"UPDATE hosts SET epoch = {epoch + 1} WHERE id = 'img-a'")
        # a's own log (a file of its own, not the store's) says when its build gave up.
        log_file = a.state_dir / "user-images" / f"{image_id}.log"
        wait_until(lambda: "the build failed" in log_file.read_text() or "ready in" in log_file.read_text(), 60,
                   0.2, what="a's build to end")
        assert "ready in" not in log_file.read_text()
        state, error = sql(f"SELECT state, COALESCE(error, '') FROM images WHERE id = '{image_id}'").split("|")
        # Not a's end: the record is still building, or failed by b's sweep (never by a).
        swept = "its host img-a stopped answering during the build"
        assert state == "building" or (state == "failed" and swept in error), (state, error)
        assert sql(f"SELECT count(*) FROM snapshots WHERE labels LIKE '%{image_id}%'") == "0"
        assert_error(on_a.get(f"/v1/images/{image_id}"), 503, "host_fenced")
        img = wait_until(lambda: (lambda j: j if j["state"] == "failed" else None)(
            via_b.get(f"/v1/images/{image_id}").json()), 30, 0.3, what="the sweeper to fail a's build")
        assert swept in img["error"], img
        hosts = {h["id"]: h for h in via_b.get("/v1/hosts").json()["hosts"]}
        assert hosts["img-a"]["state"] == "dead", hosts


def test_an_image_whose_host_is_gone(pair):
    a, b, sql = pair
    name = f"gone-{uuid.uuid4().hex[:8]}"
    key = _owner_key(a)
    with Api(a, key=key) as on_a, Api(b, key=key) as via_b:
        old = _build(on_a, name)
        snap = _ended(on_a, old)["snapshotId"]
        a.kill()
        # At once (a silent, not yet declared dead) and once declared dead: 503, never a hang.
        for _ in range(2):
            t0 = time.monotonic()
            r = via_b.post("/v1/sandboxes", json={"image": f"{name}:v1", "driver": "namespace", "timeoutSeconds": 60})
            assert time.monotonic() - t0 < 5, "a create from an image of a dead host hung"
            assert_error(r, 503, "host_unavailable")
            assert "img-a" in r.json()["error"]["message"] and "build the image again" in r.json()["error"]["hint"]
            wait_until(lambda: _host_state(b, a.api_key, "img-a") == "dead", 30, 0.3, what="a declared dead")
        r = via_b.get(f"/v1/images/{old}/logs")
        assert_error(r, 503, "host_unavailable")
        assert via_b.get(f"/v1/images/{old}").json()["state"] == "ready"
        # A rebuild of the same Dockerfile and context through b builds again there: the cache is
        # per host, and a's is out of reach.
        new = _build(via_b, name)
        assert _ended(via_b, new)["state"] == "ready"
        lines = _log_lines(via_b, new)
        assert not any("using the cache" in x or x.startswith("CACHED") for x in lines), lines
        assert any("hello from the context" in x for x in lines), lines
        assert sql(f"SELECT host_id FROM images WHERE id = '{new}'") == "img-b"
        # b kept its own layers under the keys a holds too (a layer's key is one host's).
        layers = "SELECT count(*) FROM image_layers WHERE host_id = '{}'"
        assert int(sql(layers.format("img-a"))) > 0 and int(sql(layers.format("img-b"))) > 0
        assert sql("SELECT count(*) FROM image_layers a JOIN image_layers b ON a.key = b.key "
                   "WHERE a.host_id = 'img-a' AND b.host_id = 'img-b'") != "0"
        r = via_b.post("/v1/sandboxes", json={"image": f"{name}:v1", "driver": "namespace", "timeoutSeconds": 60})
        assert r.status_code == 201, r.text
        assert sql(f"SELECT host_id FROM sandboxes WHERE id = '{r.json()['id']}'") == "img-b"
        assert via_b.exec(r.json()["id"], command="cat /opt/app/hello.txt")["stdout"] == "hello from the context\n"
        # The next rebuild through b finds b's own.
        again = _build(via_b, name)
        assert _ended(via_b, again)["state"] == "ready"
        assert any("using the cache" in x for x in _log_lines(via_b, again))
        # The dead host's image can be deleted through b: its records go now, and the disk on a
        # at a's next start (its files have no record then).
        r = via_b.post(f"/v1/images/{old}:delete", json={})
        assert r.status_code == 200, r.text
        assert_error(via_b.get(f"/v1/images/{old}"), 404, "image_not_found")
        assert (a.state_dir / "snapshots" / snap).is_dir()
        a.start()
        wait_until(lambda: not (a.state_dir / "snapshots" / snap).exists(), 30, 0.3,
                   what="a's start to remove the disk of the deleted image")
        assert not (a.state_dir / "user-images" / f"{old}.log").exists()
        wait_until(lambda: _host_state(b, a.api_key, "img-a") == "live", 20, what="a live again")
        assert on_a.get(f"/v1/images/{new}").json()["state"] == "ready"


def test_a_build_naming_an_image_another_host_keeps(pair):
    """A build sent to host b whose FROM or COPY --from names the owner's image kept by host a
    (its disk is a's file) fails at that line, naming the host to send it to; a build of the same
    kind sent to a runs, secrets included."""
    a, b, _ = pair
    name = f"kept-{uuid.uuid4().hex[:8]}"
    key = _owner_key(a)
    with Api(a, key=key) as on_a, Api(b, key=key) as via_b:
        assert _ended(on_a, _build(on_a, name))["state"] == "ready"
        for dockerfile in (f"FROM {name}:v1\nRUN cat /opt/app/hello.txt\n",
                           f"FROM default\nCOPY --from={name}:v1 /opt/app/hello.txt /hello.txt\n"):
            image = _ended(via_b, _build(via_b, f"{name}-b", dockerfile=dockerfile, files={"x": b"x"}))
            assert image["state"] == "failed", image
            assert "img-a" in image["error"] and "send the build to that host" in image["error"], image
        dockerfile = (f"FROM {name}:v1\nCOPY --from={name}:v1 /opt/app/hello.txt /copied.txt\n"
                      "RUN --mount=type=secret,id=tok cat /run/secrets/tok > /dev/null && cat /copied.txt\n")
        data = _tar({"x": b"x"})
        digest = hashlib.sha256(data).hexdigest()
        assert on_a.put(f"/v1/images/context/{digest}", content=data).status_code == 200
        r = on_a.post("/v1/images", json={"name": f"{name}-a", "dockerfile": dockerfile, "tags": ["v1"],
                                          "secrets": {"tok": "s3cret-value"},
                                          "context": {"archive": {"sha256": digest, "size": len(data),
                                                                  "chunks": [digest]}, "files": []}})
        assert r.status_code == 201, r.text
        image = _ended(on_a, r.json()["id"])
        assert image["state"] == "ready", (image, _log_lines(on_a, image["id"]))
        assert any("hello from the context" in x for x in _log_lines(via_b, image["id"]))
