"""Per-step layers (docs/images.md, "Per-step layers"): a build keeps each step's tree as a layer
keyed by its parent's key and the step with its inputs, and a later build restarts from the last
layer it finds. Each RUN below writes a stamp of the time it ran, and the last RUN prints them: a
step the log says CACHED left the stamp of the build before. A changed last RUN runs only that
step; a changed COPY source runs from that COPY; another build arg runs from the first step after
its ARG; `cache: false` runs every step; another owner finds none of these layers; past the
owner's bound the least recently used layer goes. Layers are the daemon's own: never among the
owner's snapshots, outside their bounds. The last step's layer is a link of the image's disk, not a
snapshot of its own, and a WORKDIR keeps no layer: a rebuild from either gives the files a fresh
build gives."""
from __future__ import annotations

import hashlib
import json
import math
import re
import sqlite3
import uuid

import pytest

from helpers import Api, wait_until

DOCKERFILE = """\
FROM default
RUN date +%s%N > /stamp1
COPY hello.txt /opt/hello.txt
ARG WHO=world
RUN echo "$WHO" > /opt/who && date +%s%N > /stamp2
RUN echo "stamps $(cat /stamp1) $(cat /stamp2) $(cat /opt/hello.txt) $(cat /opt/who) LAST"
"""

BUILD = """
import json, sys
from withruntime import Runtime
runtime = Runtime()
lines = []
kw = json.loads(sys.argv[3])
image = runtime.images.build(dockerfile=open(sys.argv[1] + "/Dockerfile").read(), context_dir=sys.argv[1],
                             name=sys.argv[2], on_log=lambda l: lines.append(l["line"]), **kw)
print(json.dumps({"image": image, "lines": lines}))
"""


def _build(published_client, daemon, ctx, key, last="LAST", dockerfile=DOCKERFILE, **kw):
    (ctx / "Dockerfile").write_text(dockerfile.replace("LAST", last))
    got = published_client.run_json(daemon, BUILD, args=[str(ctx), f"layers-{uuid.uuid4().hex[:8]}", json.dumps(kw)],
                                    timeout=600, env={"RUNTIME_API_KEY": key})
    assert got["image"]["state"] == "ready", got
    lines = got["lines"]
    stamps = [l.split() for l in lines if l.startswith("stamps ")]
    assert len(stamps) == 1, lines
    cached = [re.sub(r"^CACHED step \d+/\d+: (\w+) .*", r"\1", l) for l in lines if l.startswith("CACHED step")]
    return {"cached": cached, "stamp1": stamps[0][1], "stamp2": stamps[0][2], "hello": stamps[0][3],
            "who": stamps[0][4], "lines": lines}


def _starts(build):
    """How many sandboxes the build started (its log says each)."""
    return sum(1 for l in build["lines"] if re.match(r"stage \d+: building in sandbox ", l))


def _owner_key(api):
    r = api.post("/v1/keys", json={"name": "layers", "owner": f"layers-{uuid.uuid4().hex[:8]}"})
    assert r.status_code == 201, r.text
    return r.json()["key"]


@pytest.mark.parametrize("driver", ["namespace", "gvisor"], indirect=True)
@pytest.mark.driver_independent
def test_a_rebuild_restarts_from_the_last_layer_found(published_client, daemon, api, driver, tmp_path):
    key = _owner_key(api)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("hello\n")
    # The Dockerfile, changed below, is not part of the context: an unchanged folder is the same archive.
    (ctx / ".dockerignore").write_text("Dockerfile\n")
    cold = _build(published_client, daemon, ctx, key)
    assert cold["cached"] == [], cold["lines"]

    # The last RUN changed: the three steps before it are layers found, their stamps the cold build's.
    last = _build(published_client, daemon, ctx, key, last="CHANGED")
    assert last["cached"] == ["RUN", "COPY", "RUN"], last["lines"]
    assert (last["stamp1"], last["stamp2"]) == (cold["stamp1"], cold["stamp2"]), last["lines"]
    # The same context and steps before the COPY: its sources' digest is the one the cold build read,
    # so one sandbox starts, at the last layer found (not one to read them and another after).
    assert _starts(last) == 1, last["lines"]

    # A COPY source changed: the first RUN is found, the COPY and what follows run.
    (ctx / "hello.txt").write_text("changed\n")
    copied = _build(published_client, daemon, ctx, key)
    assert copied["cached"] == ["RUN"], copied["lines"]
    assert copied["stamp1"] == cold["stamp1"] and copied["stamp2"] != cold["stamp2"], copied["lines"]
    assert copied["hello"] == "changed", copied["lines"]
    assert _starts(copied) == 1, copied["lines"]

    # Another build arg: found up to its ARG, run from the RUN after it.
    arg = _build(published_client, daemon, ctx, key, build_args={"WHO": "there"})
    assert arg["cached"] == ["RUN", "COPY"], arg["lines"]
    assert arg["stamp1"] == cold["stamp1"] and arg["stamp2"] != copied["stamp2"], arg["lines"]
    assert arg["who"] == "there", arg["lines"]
    assert _starts(arg) == 1, arg["lines"]

    # cache: false runs every step.
    forced = _build(published_client, daemon, ctx, key, last="FORCED", cache=False)
    assert forced["cached"] == [] and forced["stamp1"] != cold["stamp1"], forced["lines"]

    # Another owner's same build finds none of these layers.
    other = _build(published_client, daemon, ctx, _owner_key(api), last="CHANGED")
    assert other["cached"] == [] and other["stamp1"] != cold["stamp1"], other["lines"]


# A base without GNU tar and sha256sum (hidden in the build's own tree, the shared image untouched):
# the COPY's digest is the daemon's, read from the context's archive, so its layers are kept.
NO_TAR = """\
FROM default
RUN rm -f /usr/bin/tar /bin/tar /usr/bin/sha256sum /bin/sha256sum && date +%s%N > /stamp1
COPY hello.txt /opt/hello.txt
RUN echo "stamps $(cat /stamp1) - $(cat /opt/hello.txt) - $(command -v tar || echo notar) LAST"
"""


@pytest.mark.driver_independent
def test_a_copy_is_keyed_by_what_it_takes_from_the_context(published_client, daemon, api, tmp_path):
    key = _owner_key(api)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("hello\n")
    (ctx / "other.txt").write_text("one\n")
    (ctx / ".dockerignore").write_text("Dockerfile\n")
    cold = _build(published_client, daemon, ctx, key, dockerfile=NO_TAR)
    assert cold["cached"] == [] and "notar LAST" in " ".join(cold["lines"]), cold["lines"]

    # A file the COPY does not take changed (another archive, so no digest remembered): the COPY's
    # layer is found all the same, and one sandbox starts, at it.
    (ctx / "other.txt").write_text("two\n")
    other = _build(published_client, daemon, ctx, key, last="CHANGED", dockerfile=NO_TAR)
    assert other["cached"] == ["RUN", "COPY"], other["lines"]
    assert other["stamp1"] == cold["stamp1"] and other["hello"] == "hello", other["lines"]
    assert _starts(other) == 1, other["lines"]

    # The copied file changed: the COPY and what follows run.
    (ctx / "hello.txt").write_text("changed\n")
    copied = _build(published_client, daemon, ctx, key, last="CHANGED", dockerfile=NO_TAR)
    assert copied["cached"] == ["RUN"], copied["lines"]
    assert copied["stamp1"] == cold["stamp1"] and copied["hello"] == "changed", copied["lines"]
    assert _starts(copied) == 1, copied["lines"]


def _raw_build(api, dockerfile):
    """A build without a context through the API: the log's CACHED steps (their RUN text)."""
    r = api.post("/v1/images", json={"name": f"lru-{uuid.uuid4().hex[:8]}", "dockerfile": dockerfile})
    assert r.status_code == 201, r.text
    image_id = r.json()["id"]
    wait_until(lambda: api.get(f"/v1/images/{image_id}").json()["state"] not in ("queued", "building"), 300, 0.1,
               what="the build's end")
    assert api.get(f"/v1/images/{image_id}").json()["state"] == "ready"
    lines = [l["line"] for l in api.get(f"/v1/images/{image_id}/logs?after=0").json()["lines"]]
    return [re.sub(r"^CACHED step \d+/\d+: RUN ", "", l) for l in lines if l.startswith("CACHED step")]


def _layers(daemon, owner=None):
    """The layers the images store records, {snapshot id: size} (of owner's only, when given): no
    route shows them."""
    db = sqlite3.connect(f"file:{daemon.state_dir / 'runtime.db'}?mode=ro", uri=True, timeout=30)
    try:
        if owner:
            return dict(db.execute("SELECT snapshot_id, size_bytes FROM image_layers WHERE owner = ?",
                                   (owner,)).fetchall())
        return dict(db.execute("SELECT snapshot_id, size_bytes FROM image_layers").fetchall())
    finally:
        db.close()


def _named_build(api, name, dockerfile):
    """A build without a context under name: its id and the RUN steps its log says CACHED."""
    r = api.post("/v1/images", json={"name": name, "dockerfile": dockerfile})
    assert r.status_code == 201, r.text
    image_id = r.json()["id"]
    wait_until(lambda: api.get(f"/v1/images/{image_id}").json()["state"] not in ("queued", "building"), 300, 0.1,
               what="the build's end")
    lines = [l["line"] for l in api.get(f"/v1/images/{image_id}/logs?after=0").json()["lines"]]
    assert api.get(f"/v1/images/{image_id}").json()["state"] == "ready", lines
    return image_id, [re.sub(r"^CACHED step \d+/\d+: RUN ", "", l) for l in lines if l.startswith("CACHED step")]


@pytest.mark.driver_independent
def test_last_layer_shares_the_image_disk_and_workdirs_keep_none(daemon, api):
    """A cold build keeps one snapshot per RUN but the last, whose layer is a link of the image's disk
    (its layer.img the same file), and none for a WORKDIR. Rebuilds from those layers, after the image
    is deleted, give what a fresh build gives: the WORKDIR's directory made where the walk stopped
    (as the user in force then), the files of the found steps, the context of none."""
    owner = f"layers-{uuid.uuid4().hex[:8]}"
    r = api.post("/v1/keys", json={"name": "layers", "owner": owner})
    assert r.status_code == 201, r.text
    own = Api(daemon, key=r.json()["key"])
    try:
        base = "FROM default\nRUN echo a > /a\nUSER sandbox\nWORKDIR /workspace/w\nUSER root\nRUN pwd > /here\n"
        first, cached = _named_build(own, "lw", base)
        assert cached == []
        layers = _layers(daemon, owner)
        assert len(layers) == 2, layers  # the two RUNs; the WORKDIR none
        shared = [sid for sid in layers
                  if (daemon.state_dir / "snapshots" / sid / "layer.img").stat().st_nlink >= 2]
        assert len(shared) == 1, layers  # the last RUN's is a link of the image's disk
        assert own.post(f"/v1/images/{first}:delete", json={}).status_code == 200

        # The last RUN changed: the first found, the WORKDIR made from there, as sandbox.
        _, cached = _named_build(own, "lw", base.replace("/here", "/there"))
        assert cached == ["echo a > /a"], cached
        # Every step found, and a WORKDIR after the last: made on the last layer (the image's disk's link).
        _, cached = _named_build(own, "lw2", base + "WORKDIR /v\n")
        assert cached == ["echo a > /a", "pwd > /here"], cached
        for image, want in (("lw", "/there"), ("lw2", "/here")):
            sbx = own.create_sandbox(image=image)
            try:
                out = sbx.exec(f"cat {want} /a; stat -c %U /workspace/w; test -d /v && echo v; "
                               "test -e /.runtime-build-context && echo context; true")
                assert out["stdout"].split() == ["/workspace/w", "a", "sandbox"] + (["v"] if image == "lw2" else []), out
            finally:
                own.delete(f"/v1/sandboxes/{sbx.id}")
    finally:
        own.close()


def test_the_bound_evicts_the_least_recently_used_layer(fresh_daemon):
    """With room for two layers and not three, the layer used last stays and the other goes."""
    api = Api(fresh_daemon)
    try:
        a = "FROM default\nRUN echo a > /x\n"
        assert _raw_build(api, a) == []
        (size,) = _layers(fresh_daemon).values()
        cap = int(2.5 * size) >> 20
        if not (2 * size < cap << 20 < 3 * size):
            pytest.skip(f"a layer here is {size} bytes: no bound in MiB holds two and not three")
        api.close()
        fresh_daemon.extra_args = list(fresh_daemon.extra_args or []) + ["--image-layer-max-mib-per-owner", str(cap)]
        fresh_daemon.restart()
        api = Api(fresh_daemon)
        assert _raw_build(api, "FROM default\nRUN echo b > /x\n") == []  # layers a, b: within the bound
        # a found (used after b), a2 kept: three layers, and b, the least recently used, goes.
        assert _raw_build(api, a + "RUN echo a2 > /y\n") == ["echo a > /x"]
        assert len(_layers(fresh_daemon)) == 2
        assert _raw_build(api, "FROM default\nRUN echo b > /x\nRUN echo b2 > /y\n") == []
    finally:
        api.close()


@pytest.mark.driver_independent
def test_layers_are_not_the_owners_snapshots(fresh_daemon):
    """A build's layers are not listed, got, changed, deleted or started from through the snapshots API
    (404, as an unknown id), and do not count against the owner's snapshot bounds: a daemon whose bound
    on the owner's snapshot bytes is below what the layers hold still takes the owner's snapshot."""
    api = Api(fresh_daemon)
    try:
        assert _raw_build(api, "FROM default\nRUN head -c 8M /dev/urandom > /a\n"
                               "RUN head -c 8M /dev/urandom > /b\n") == []
        layers = _layers(fresh_daemon)
        assert len(layers) == 2, layers
        listed = api.get("/v1/snapshots").json()["data"]
        assert not set(layers) & {s["id"] for s in listed}, listed
        image_disk = sum(s["sizeBytes"] for s in listed)
        for lid in layers:
            for method, path, body in (("GET", f"/v1/snapshots/{lid}", None),
                                       ("POST", f"/v1/snapshots/{lid}:update", {"labels": {"a": "b"}}),
                                       ("POST", f"/v1/snapshots/{lid}:delete", {}),
                                       ("POST", f"/v1/snapshots/{lid}:extend", {"retentionDays": 2}),
                                       ("DELETE", f"/v1/snapshots/{lid}", None),
                                       ("POST", "/v1/sandboxes", {"snapshot": lid}),
                                       ("POST", "/v1/sandboxes", {"image": lid})):
                r = api.request(method, path, json=body)
                assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", (method, path, r.text)
            assert (fresh_daemon.state_dir / "snapshots" / lid).is_dir()  # the DELETE took nothing
        events = api.get("/v1/events?type=snapshot.created").json()["data"]
        assert not set(layers) & {e.get("resourceId") for e in events}, events
        # Snapshot storage is billed per snapshot (a "<id>:disk" series): the image's disk has one, a layer none.
        billed = {u["sandboxId"].split(":")[0] for u in api.get("/v1/usage").json()["sandboxes"]}
        assert {s["id"] for s in listed} <= billed and not set(layers) & billed, billed

        sbx = api.create_sandbox(image="default")
        first = api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={})
        assert first.status_code == 201, first.text
        own = first.json()["sizeBytes"]
        assert api.delete(f"/v1/snapshots/{first.json()['id']}").status_code == 200
        # Room for the image's disk and two of these snapshots, less than the layers hold.
        bound = math.ceil((image_disk + 2 * own) / (1 << 20)) + 1
        if bound << 20 >= image_disk + sum(layers.values()):
            pytest.skip(f"the layers here hold {sum(layers.values())} bytes: no bound in MiB between them "
                        f"and the owner's {image_disk + 2 * own}")
        api.close()
        fresh_daemon.extra_args = list(fresh_daemon.extra_args or []) + ["--max-snapshot-mib-per-owner", str(bound)]
        fresh_daemon.restart()
        api = Api(fresh_daemon)
        sbx = api.create_sandbox(image="default")
        r = api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={})
        assert r.status_code == 201, r.text
        assert set(_layers(fresh_daemon)) == set(layers)
    finally:
        api.close()


def _linked_tar(text: bytes) -> bytes:
    """A context of real/a.txt, real/sub/b and link -> real, as a gzipped tar (the published client
    packs no symbolic links: the archive is uploaded as any client may send it)."""
    import gzip
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        info = tarfile.TarInfo("link")
        info.type = tarfile.SYMTYPE
        info.linkname = "real"
        t.addfile(info)
        for path, data in (("real/a.txt", text), ("real/sub/b", b"b\n")):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0)


def _linked_build(api, text: bytes):
    """A build through the API whose COPYs go through the link: its log."""
    data = _linked_tar(text)
    digest = hashlib.sha256(data).hexdigest()
    if api.post("/v1/images/context/missing", json={"digests": [digest]}).json()["missing"]:
        assert api.put(f"/v1/images/context/{digest}", content=data).status_code == 200
    body = {"name": f"linked-{uuid.uuid4().hex[:8]}",
            "dockerfile": "FROM default\nCOPY link/ /dst/\nCOPY link/a.txt /x\nCOPY l*/s?b /sub/\n"
                          "RUN echo \"got $(cat /dst/a.txt) $(cat /x) $(cat /sub/b)\"\n",
            "context": {"archive": {"sha256": digest, "size": len(data), "chunks": [digest]}, "files": []}}
    r = api.post("/v1/images", json=body)
    assert r.status_code == 201, r.text
    image_id = r.json()["id"]
    wait_until(lambda: api.get(f"/v1/images/{image_id}").json()["state"] not in ("queued", "building"), 300, 0.2,
               what="the build's end")
    lines = [l["line"] for l in api.get(f"/v1/images/{image_id}/logs?after=0").json()["lines"]]
    assert api.get(f"/v1/images/{image_id}").json()["state"] == "ready", lines
    return lines


@pytest.mark.driver_independent
def test_a_copy_through_a_link_is_keyed_by_the_files_it_reaches(daemon, api):
    """COPY link/ and COPY link/a.txt, link -> real: a change to real/a.txt is a miss of those
    COPYs (their digest follows the link as the copy does), so the rebuild sees the new bytes where
    it found the COPYs' layers, and so the old bytes, before; the same context again is a hit."""
    key = Api(api.daemon, key=_owner_key(api))
    try:
        old, new = f"old-{uuid.uuid4().hex[:6]}", f"new-{uuid.uuid4().hex[:6]}"
        cold = _linked_build(key, old.encode())
        assert f"got {old} {old} b" in cold, cold
        warm = _linked_build(key, old.encode())
        assert any(l.startswith("using the cache") for l in warm), warm
        changed = _linked_build(key, new.encode())
        assert f"got {new} {new} b" in changed, changed
        assert not any(l.startswith("CACHED") and "COPY" in l for l in changed), changed
    finally:
        key.close()
