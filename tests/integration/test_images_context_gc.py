"""Build-context chunks are collected (docs/images.md, "Context chunks"), on a daemon whose owners
keep 8 MiB of chunks and whose chunks unused for 24 hours go: an owner at the bound whose chunks no
build names uploads a new context (the least recently used go, what a `missing` query just reported
stays) and builds it, another owner's chunks untouched; the chunks a running build names are never
removed (429 naming the bound until the build ends); a chunk unused past the age bound goes at the
owner's next upload and at the daemon's start; uploads at once past the bound leave only whole
chunks within it."""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import time
import uuid

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, wait_until

BOUND_MIB = 8
MAX_AGE_HOURS = 24
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def gc_daemon(build_dir, image_dir, tmp_path_factory):
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("ctxgc") / "state",
                      f"runtime-test-{os.getpid()}-ctxgc",
                      extra_args=["--image-context-max-mib-per-owner", str(BOUND_MIB),
                                  "--image-context-max-age-hours", str(MAX_AGE_HOURS)])
    yield d
    _finish_daemon(d)


@pytest.fixture
def owner_api(gc_daemon):
    """A key of a new owner's, and the directory its chunks are kept in."""
    admin = Api(gc_daemon)
    made = []

    def make():
        owner = f"ctx-{uuid.uuid4().hex[:8]}"
        r = admin.post("/v1/keys", json={"name": owner, "owner": owner})
        assert r.status_code == 201, r.text
        api = Api(gc_daemon, key=r.json()["key"])
        made.append(api)
        return api, gc_daemon.state_dir / "image-context" / hashlib.sha256(owner.encode()).hexdigest()[:32]

    yield make
    for api in made:
        api.delete_all()
        api.close()
    admin.close()


def _context(size: int) -> tuple[bytes, list[bytes]]:
    """A gzipped tar of one incompressible file of size bytes, and its 1 MiB chunks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        info = tarfile.TarInfo("blob")
        info.size = size
        t.addfile(info, io.BytesIO(os.urandom(size)))
    data = gzip.compress(buf.getvalue(), mtime=0)
    return data, [data[i:i + MIB] for i in range(0, len(data), MIB)]


def _put(api, chunk: bytes):
    return api.put(f"/v1/images/context/{hashlib.sha256(chunk).hexdigest()}", content=chunk)


def _digests(chunks):
    return [hashlib.sha256(c).hexdigest() for c in chunks]


def _build(api, data: bytes, chunks: list[bytes], dockerfile: str) -> str:
    missing = api.post("/v1/images/context/missing", json={"digests": _digests(chunks)}).json()["missing"]
    for c in chunks:
        if hashlib.sha256(c).hexdigest() in missing:
            r = _put(api, c)
            assert r.status_code == 200, r.text
    ctx = {"archive": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "chunks": _digests(chunks)}}
    r = api.post("/v1/images", json={"name": f"gc-{uuid.uuid4().hex[:8]}", "dockerfile": dockerfile, "context": ctx})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _wait(api, image_id, timeout=300):
    def done():
        j = api.get(f"/v1/images/{image_id}").json()
        return j if j["state"] not in ("queued", "building") else None
    return wait_until(done, timeout, 0.5, what=f"image {image_id} built")


def _on_disk(d):
    return {p.name for p in d.iterdir() if not p.name.startswith(".")} if d.exists() else set()


COPY = "FROM default\nCOPY blob /opt/blob\n"


def test_an_owner_at_the_bound_uploads_and_builds_a_new_context(owner_api):
    alice, alice_dir = owner_api()
    bob, bob_dir = owner_api()
    # Bob's chunks, older than any of Alice's and named by no build.
    b_data, b_chunks = _context(MIB)
    assert _wait(bob, _build(bob, b_data, b_chunks, COPY))["state"] == "ready"
    bob_kept = _on_disk(bob_dir)
    assert bob_kept == set(_digests(b_chunks))
    for d in bob_kept:
        os.utime(bob_dir / d, (time.time() - 5000, time.time() - 5000))
    # Alice's first context nearly fills her 8 MiB; built, no build names it any more.
    a_data, a_chunks = _context(7 * MIB + MIB // 2)
    assert len(a_chunks) == 8
    assert _wait(alice, _build(alice, a_data, a_chunks, COPY))["state"] == "ready"
    a = _digests(a_chunks)
    # Its chunks used in order, the first the least recently, all longer ago than a hold lasts.
    for i, d in enumerate(a):
        os.utime(alice_dir / d, (time.time() - 4000 + i, time.time() - 4000 + i))
    # A missing query reports the least recently used present: it stays for the build that follows.
    assert alice.post("/v1/images/context/missing", json={"digests": [a[0]]}).json()["missing"] == []
    n_data, n_chunks = _context(2 * MIB + MIB // 4)
    image = _wait(alice, _build(alice, n_data, n_chunks, COPY + "RUN test $(stat -c %s /opt/blob) -gt 2000000\n"))
    assert image["state"] == "ready", image
    left = _on_disk(alice_dir)
    # Room for the 2.25 MiB: the next two least recently used went, the one just reported stayed.
    assert left == {a[0], *a[3:], *_digests(n_chunks)}, (sorted(left), a)
    assert sum((alice_dir / d).stat().st_size for d in left) <= BOUND_MIB * MIB
    assert _on_disk(bob_dir) == bob_kept
    # What is gone is reported missing.
    assert alice.post("/v1/images/context/missing", json={"digests": a[:3]}).json()["missing"] == a[1:3]


def test_a_running_builds_chunks_are_never_removed(owner_api):
    api, chunks_dir = owner_api()
    data, chunks = _context(5 * MIB)
    named = set(_digests(chunks))
    image_id = _build(api, data, chunks, COPY + "RUN echo WAITING; while [ ! -e /tmp/go ]; do sleep 0.2; done\n")

    def build_sandbox():
        return next((s["id"] for s in api.get("/v1/sandboxes").json()["data"]
                     if (s.get("labels") or {}).get("runtime.imageBuild") == image_id), None)

    def in_run_step():
        return (api.get(f"/v1/images/{image_id}").json()["state"] == "building" and
                any(l["line"] == "WAITING" for l in api.get(f"/v1/images/{image_id}/logs?after=0").json()["lines"]))

    wait_until(in_run_step, 300, 0.2, what="the build's RUN step")
    sid = build_sandbox()
    assert sid
    # The running build's chunks are the least recently used: still, none goes.
    for d in named:
        os.utime(chunks_dir / d, (time.time() - 3000, time.time() - 3000))
    fillers = [os.urandom(MIB) for _ in range(BOUND_MIB)]
    codes = [_put(api, f).status_code for f in fillers]
    assert codes[:2] == [200, 200] and 429 in codes, codes
    refused = fillers[codes.index(429)]
    r = _put(api, refused)
    assert_error(r, 429, "rate_limited")
    assert f"{BOUND_MIB} MiB" in r.json()["error"]["message"], r.text
    assert named <= _on_disk(chunks_dir)
    # The build ends; its chunks are then the least recently used that nothing keeps.
    api.exec(sid, command="touch /tmp/go")
    assert _wait(api, image_id)["state"] == "ready"
    assert _put(api, refused).status_code == 200
    left = _on_disk(chunks_dir)
    assert hashlib.sha256(refused).hexdigest() in left and not named <= left, sorted(left)


def test_a_chunk_unused_past_the_age_bound_goes(owner_api, gc_daemon):
    api, chunks_dir = owner_api()
    other, other_dir = owner_api()
    data, chunks = _context(MIB // 2)
    (old,) = _digests(chunks)
    assert _wait(api, _build(api, data, chunks, COPY))["state"] == "ready"
    o_data, o_chunks = _context(MIB // 2)
    assert _wait(other, _build(other, o_data, o_chunks, COPY))["state"] == "ready"
    (o_old,) = _digests(o_chunks)
    past = time.time() - (MAX_AGE_HOURS + 1) * 3600
    os.utime(chunks_dir / old, (past, past))
    os.utime(other_dir / o_old, (past, past))
    # A chunk just used is kept however old its file: one a day and a half old and just reported present.
    recent = os.urandom(1000)
    assert _put(api, recent).status_code == 200
    os.utime(chunks_dir / hashlib.sha256(recent).hexdigest(), (past, past))
    assert api.post("/v1/images/context/missing",
                    json={"digests": [hashlib.sha256(recent).hexdigest()]}).json()["missing"] == []
    assert _put(api, os.urandom(1000)).status_code == 200
    left = _on_disk(chunks_dir)
    assert old not in left and hashlib.sha256(recent).hexdigest() in left, sorted(left)
    # The other owner's old chunk waits for its own owner's upload, or the daemon's sweep at its start.
    assert o_old in _on_disk(other_dir)
    gc_daemon.stop()
    gc_daemon.start()
    assert o_old not in _on_disk(other_dir)
    assert hashlib.sha256(recent).hexdigest() in _on_disk(chunks_dir)


def test_uploads_at_once_at_the_bound_leave_only_whole_chunks(owner_api):
    """Sixteen uploads at once (two of them one chunk) past the bound: each is kept whole under its
    own name or refused with 429, nothing half written stays, and the bound holds."""
    from concurrent.futures import ThreadPoolExecutor

    api, chunks_dir = owner_api()
    chunks = [os.urandom(MIB) for _ in range(15)]
    chunks.append(chunks[0])
    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        codes = list(pool.map(lambda c: _put(api, c).status_code, chunks))
    assert set(codes) <= {200, 429} and codes.count(200) >= BOUND_MIB, codes
    on_disk = [p for p in chunks_dir.iterdir()]
    assert not [p.name for p in on_disk if p.name.startswith(".")]
    for p in on_disk:
        assert hashlib.sha256(p.read_bytes()).hexdigest() == p.name
    assert sum(p.stat().st_size for p in on_disk) <= BOUND_MIB * MIB
    assert len(on_disk) == BOUND_MIB


def test_holds_outlive_a_restart(owner_api, gc_daemon):
    """Chunks uploaded just before a restart are still held after it, for their build to name: an
    upload past the bound is then a 429 that removes nothing. Past the hold (their files' time set
    back 31 minutes) they are the least recently used again, and the upload removes one."""
    api, chunks_dir = owner_api()
    first = [os.urandom(MIB) for _ in range(BOUND_MIB)]
    assert [_put(api, c).status_code for c in first] == [200] * BOUND_MIB
    gc_daemon.stop()
    gc_daemon.start()
    extra = os.urandom(MIB)
    r = _put(api, extra)
    assert_error(r, 429, "rate_limited")
    assert _on_disk(chunks_dir) == set(_digests(first))
    past = time.time() - 31 * 60
    os.utime(chunks_dir / _digests(first)[0], (past, past))
    assert _put(api, extra).status_code == 200
    assert _on_disk(chunks_dir) == set(_digests(first[1:] + [extra]))
