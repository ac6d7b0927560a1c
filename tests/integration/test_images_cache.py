"""The build cache (docs/images.md, "The build cache"): a build the owner has made before (the same
Dockerfile, context, build args, env, labels, target and bases) is a new version whose disk shares
the earlier one's, ready in well under 3 s with no sandbox started and its log's steps CACHED; a
changed COPY source, another build arg or `cache: false` (the published client's cache=False) runs
every step; another owner's same build is never a hit; deleting the images takes their shared disk
once the last of them goes."""
from __future__ import annotations

import json
import os
import uuid

import pytest

from helpers import Api, wait_until

DOCKERFILE = """\
FROM default
ARG WHO=world
COPY hello.txt /opt/hello.txt
RUN echo "hi $WHO" > /opt/who.txt
RUN cat /opt/hello.txt /opt/who.txt > /opt/all.txt
"""

BUILD = """
import json, sys, time
from withruntime import Runtime
runtime = Runtime()
lines = []
kw = json.loads(sys.argv[3])
t0 = time.monotonic()
image = runtime.images.build(dockerfile=open(sys.argv[1] + "/Dockerfile").read(), context_dir=sys.argv[1],
                             name=sys.argv[2], on_log=lambda l: lines.append(l["line"]), **kw)
print(json.dumps({"image": image, "lines": lines, "seconds": time.monotonic() - t0}))
"""


def _context(tmp_path, hello: str):
    ctx = tmp_path / f"ctx-{uuid.uuid4().hex[:6]}"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    (ctx / "hello.txt").write_text(hello)
    return ctx


def _build(published_client, daemon, ctx, name, key=None, **kw):
    env = {"RUNTIME_API_KEY": key} if key else None
    got = published_client.run_json(daemon, BUILD, args=[str(ctx), name, json.dumps(kw)], timeout=600, env=env)
    assert got["image"]["state"] == "ready", got
    return got


def _cached(lines):
    return [l for l in lines if l.startswith("CACHED")]


def _snapshot_dir(daemon, snap):
    return daemon.state_dir / "snapshots" / snap


@pytest.mark.parametrize("driver", ["namespace", "gvisor"], indirect=True)
def test_unchanged_rebuild_is_cached_and_changes_are_not(published_client, daemon, api, driver, tmp_path):
    hello = f"hello {uuid.uuid4().hex}\n"
    ctx = _context(tmp_path, hello)
    name = f"cache-{uuid.uuid4().hex[:8]}"
    cold = _build(published_client, daemon, ctx, name)
    assert not _cached(cold["lines"]) and any("step 5/5: RUN" in l for l in cold["lines"]), cold["lines"]

    warm = _build(published_client, daemon, ctx, name)
    image = warm["image"]
    assert image["version"] == 2 and image["snapshotId"] != cold["image"]["snapshotId"], image
    cached = _cached(warm["lines"])
    assert len(cached) == 5 and "RUN" in cached[-1], warm["lines"]
    assert not any(l.startswith("step ") for l in warm["lines"]), warm["lines"]
    assert image["buildMs"] < 3000 and warm["seconds"] < 3, (image["buildMs"], warm["seconds"])
    # One copy of the layer on disk: the new snapshot's is the same file.
    a = _snapshot_dir(daemon, cold["image"]["snapshotId"]) / "layer.img"
    b = _snapshot_dir(daemon, image["snapshotId"]) / "layer.img"
    assert os.stat(a).st_ino == os.stat(b).st_ino, (a, b)

    sbx = api.create_sandbox(driver=driver, image=image["id"])
    out = api.exec(sbx.id, command="cat /opt/all.txt")
    assert out["stdout"] == hello + "hi world\n", out

    # A COPY source changed: every step from the COPY on runs again (the per-step layers find no
    # step of it: the COPY is the first step with a tree), and the result has the new bytes.
    changed_text = f"changed {uuid.uuid4().hex}\n"
    (ctx / "hello.txt").write_text(changed_text)
    changed = _build(published_client, daemon, ctx, name)
    assert not _cached(changed["lines"]) and any("step 5/5: RUN" in l for l in changed["lines"]), changed["lines"]
    # Another build arg: the same.
    other_arg = _build(published_client, daemon, ctx, name, build_args={"WHO": "there"})
    assert not _cached(other_arg["lines"]), other_arg["lines"]
    sbx = api.create_sandbox(driver=driver, image=other_arg["image"]["id"])
    out = api.exec(sbx.id, command="cat /opt/all.txt")
    assert out["stdout"] == changed_text + "hi there\n", out

    # cache=False runs every step of a build that would hit.
    forced = _build(published_client, daemon, ctx, name, cache=False)
    assert not _cached(forced["lines"]) and any("cache is not used" in l for l in forced["lines"]), forced["lines"]
    for got in (cold, warm, changed, other_arg, forced):
        assert api.post(f"/v1/images/{got['image']['id']}:delete", json={}).status_code == 200


def test_another_owner_never_hits(published_client, daemon, api, tmp_path):
    ctx = _context(tmp_path, f"shared {uuid.uuid4().hex}\n")
    name = f"cache-{uuid.uuid4().hex[:8]}"
    mine = _build(published_client, daemon, ctx, name)
    r = api.post("/v1/keys", json={"name": "other", "owner": f"other-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201, r.text
    key = r.json()["key"]
    other = Api(api.daemon, key=key)
    try:
        theirs = _build(published_client, daemon, ctx, name, key=key)
        assert not _cached(theirs["lines"]), theirs["lines"]
        assert any("step 5/5: RUN" in l for l in theirs["lines"]), theirs["lines"]
        assert other.post(f"/v1/images/{theirs['image']['id']}:delete", json={}).status_code == 200
    finally:
        other.close()
    assert api.post(f"/v1/images/{mine['image']['id']}:delete", json={}).status_code == 200


def test_deleting_the_images_takes_their_shared_disk(published_client, daemon, api, tmp_path):
    """The first image deleted, the cached one still starts (its disk is its own link); the second
    deleted, its link goes with it, and the file stays only as the last step's layer (a link of the
    first image's disk, kept to the layers' bound)."""
    hello = f"kept {uuid.uuid4().hex}\n"
    ctx = _context(tmp_path, hello)
    name = f"cache-{uuid.uuid4().hex[:8]}"
    first = _build(published_client, daemon, ctx, name)["image"]
    second = _build(published_client, daemon, ctx, name)["image"]
    layer = _snapshot_dir(daemon, second["snapshotId"]) / "layer.img"
    assert os.stat(layer).st_nlink == 3  # the two images' disks and the last step's layer
    # Counted in full against the owner's bounds: it outlives the first.
    sizes = [api.get(f"/v1/snapshots/{i['snapshotId']}").json()["sizeBytes"] for i in (first, second)]
    assert sizes[0] > 0 and sizes[0] == sizes[1], sizes
    assert api.post(f"/v1/images/{first['id']}:delete", json={}).status_code == 200
    assert not _snapshot_dir(daemon, first["snapshotId"]).exists()
    assert os.stat(layer).st_nlink == 2
    sbx = api.create_sandbox(image=second["id"])
    out = api.exec(sbx.id, command="cat /opt/hello.txt")
    assert out["stdout"] == hello, out
    # A third build now hits the second.
    third = _build(published_client, daemon, ctx, name)
    assert _cached(third["lines"]) and any(second["id"] in l for l in third["lines"]), third["lines"]
    for image in (second, third["image"]):
        assert api.post(f"/v1/images/{image['id']}:delete", json={}).status_code == 200
    assert not _snapshot_dir(daemon, second["snapshotId"]).exists()
    assert not _snapshot_dir(daemon, third["image"]["snapshotId"]).exists()


def test_cache_must_be_a_boolean(api):
    r = api.post("/v1/images", json={"name": "bad", "dockerfile": "FROM default\n", "cache": "no"})
    assert r.status_code == 400 and "cache" in r.json()["error"]["message"], r.text
    r = api.post("/v1/images", json={"name": "bad", "dockerfile": "FROM default\n", "cache": 1})
    assert r.status_code == 400, r.text


OURS = """
import json, sys
from withruntime import Runtime
runtime = Runtime()
out = []
for cache in (None, None, False):
    lines = []
    runtime.images.build(name=sys.argv[2], dockerfile=open(sys.argv[1] + "/Dockerfile").read(),
                         context_dir=sys.argv[1], cache=cache, on_log=lambda l: lines.append(l["line"]))
    out.append(sum(1 for l in lines if l.startswith("CACHED")))
print(json.dumps(out))
"""


def test_our_sdk_takes_cache(api, tmp_path):
    """Our SDK sends cache as the published one does."""
    import subprocess
    import sys
    from helpers import REPO
    ctx = _context(tmp_path, f"ours {uuid.uuid4().hex}\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "sdk" / "python" / "src"),
           "RUNTIME_API_KEY": api.daemon.api_key, "RUNTIME_BASE_URL": api.daemon.base_url}
    r = subprocess.run([sys.executable, "-c", OURS, str(ctx), f"ours-{uuid.uuid4().hex[:8]}"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [0, 5, 0], r.stdout


MULTI = """\
FROM default AS builder
COPY hello.txt /src/hello.txt
RUN tr a-z A-Z < /src/hello.txt > /src/upper.txt
FROM registry.invalid/never/pulled:tag AS unused
RUN exit 9
FROM default
COPY --from=builder /src/upper.txt /srv/upper.txt
"""


@pytest.mark.parametrize("driver", ["namespace", "gvisor"], indirect=True)
def test_multi_stage_cached(published_client, daemon, api, driver, tmp_path):
    """The key and the CACHED lines take the stages the build runs: a stage nothing names (here
    FROM a registry's tag, which would make the build one not to cache) is left out."""
    ctx = _context(tmp_path, f"multi {uuid.uuid4().hex}\n")
    (ctx / "Dockerfile").write_text(MULTI)
    name = f"cache-{uuid.uuid4().hex[:8]}"
    cold = _build(published_client, daemon, ctx, name)
    assert not any(l.startswith("not cached") for l in cold["lines"]), cold["lines"]
    warm = _build(published_client, daemon, ctx, name)
    cached = _cached(warm["lines"])
    assert [c.split("]")[0] for c in cached] == ["CACHED [stage 0, line 1", "CACHED [stage 0, line 2",
                                                 "CACHED [stage 0, line 3", "CACHED [stage 2, line 6",
                                                 "CACHED [stage 2, line 7"], warm["lines"]
    sbx = api.create_sandbox(driver=driver, image=warm["image"]["id"])
    out = api.exec(sbx.id, command="cat /srv/upper.txt")
    assert out["stdout"] == (ctx / "hello.txt").read_text().upper(), out
    for got in (cold, warm):
        assert api.post(f"/v1/images/{got['image']['id']}:delete", json={}).status_code == 200


def test_a_registry_tag_is_not_cached(api):
    """FROM a registry's tag: the build says why it is not cached (here the pull then fails: there
    is no network to that name)."""
    r = api.post("/v1/images", json={"name": f"tag-{uuid.uuid4().hex[:8]}",
                                     "dockerfile": "FROM registry.invalid/some/image:tag\nRUN true\n"})
    assert r.status_code == 201, r.text
    image_id = r.json()["id"]

    def done():
        j = api.get(f"/v1/images/{image_id}").json()
        return j if j["state"] not in ("queued", "building") else None
    wait_until(done, 300, 0.5, what="the build ended")
    lines = [l["line"] for l in api.get(f"/v1/images/{image_id}/logs").json()["lines"]]
    assert any(l.startswith("not cached: a FROM names a registry's tag") for l in lines), lines


def test_an_image_without_its_disk_is_passed_over(published_client, daemon, api, tmp_path):
    """The snapshot of a cached image deleted on its own: the whole-build cache passes it over (the
    per-step layers, snapshots of their own, still find its steps)."""
    ctx = _context(tmp_path, f"lost {uuid.uuid4().hex}\n")
    name = f"cache-{uuid.uuid4().hex[:8]}"
    first = _build(published_client, daemon, ctx, name)["image"]
    assert api.delete(f"/v1/snapshots/{first['snapshotId']}").status_code in (200, 204)
    again = _build(published_client, daemon, ctx, name)
    assert not any(l.startswith("CACHED [stage") or "using the cache" in l for l in again["lines"]), again["lines"]
    assert any(l.startswith("CACHED step 5/5: RUN") for l in again["lines"]), again["lines"]
    for image in (first, again["image"]):
        assert api.post(f"/v1/images/{image['id']}:delete", json={}).status_code == 200
