"""A daemon killed (SIGKILL) in the middle of an image build, started again on the same state: the
build's record ends failed with the reason, its sandbox is deleted, and nothing it wrote stays on disk or
in the owner's snapshot usage (docs/images.md, "How a build runs")."""
from __future__ import annotations

import hashlib
import sqlite3

from helpers import Api, skip_unless_driver, wait_until


def _db(daemon, sql, *args, write=False):
    mode = "rw" if write else "ro"
    db = sqlite3.connect(f"file:{daemon.state_dir / 'runtime.db'}?mode={mode}", uri=True, timeout=30)
    try:
        rows = db.execute(sql, args).fetchall()
        db.commit()
        return rows
    finally:
        db.close()


def test_a_build_killed_in_its_run_step_leaves_nothing_after_a_restart(fresh_daemon):
    skip_unless_driver(fresh_daemon, "namespace")
    api = Api(fresh_daemon)
    try:
        r = api.post("/v1/images", json={"name": "killed", "dockerfile": "FROM default\nRUN echo one > /one\n"
                                                                          "RUN echo KILL-HERE; sleep 600\n"})
        assert r.status_code == 201, r.text
        image_id = r.json()["id"]

        def in_run_step():
            lines = api.get(f"/v1/images/{image_id}/logs?after=0").json()["lines"]
            return any(l["line"] == "KILL-HERE" for l in lines)

        wait_until(in_run_step, 300, 0.1, what="the RUN step's log line")
        builds = [s for s in api.get("/v1/sandboxes").json()["data"]
                  if (s.get("labels") or {}).get("runtime.imageBuild") == image_id]
        assert len(builds) == 1, builds
        build_sbx = builds[0]["id"]
        before = {s["id"] for s in api.get("/v1/snapshots").json()["data"]}
        # What a kill at the build's end leaves: the image's disk taken from its sandbox (with the label
        # the daemon gives it), its record not yet ready.
        disk = api.post(f"/v1/sandboxes/{build_sbx}:snapshot", json={"labels": {"runtime.image": image_id}})
        assert disk.status_code == 201, disk.text
        disk_id = disk.json()["id"]
        (layer,) = _db(fresh_daemon, "SELECT snapshot_id FROM image_layers")  # step 1's
        layer = layer[0]
        owner = _db(fresh_daemon, "SELECT owner FROM images WHERE id = ?", image_id)[0][0]
    finally:
        api.close()

    fresh_daemon.kill()
    # A kill between a layer's snapshot and its record: the record was never written.
    _db(fresh_daemon, "DELETE FROM image_layers", write=True)
    # A kill while a snapshot's files or a context chunk were written: their temporary names.
    snaps = fresh_daemon.state_dir / "snapshots"
    (snaps / ".0123456789abcdef.part").mkdir()
    (snaps / ".0123456789abcdef.part" / "layer.img").write_bytes(b"\0" * 4096)
    chunks = fresh_daemon.state_dir / "image-context" / hashlib.sha256(owner.encode()).hexdigest()[:32]
    chunks.mkdir(parents=True, exist_ok=True)
    (chunks / f".{'ab' * 32}.part").write_bytes(b"half")
    fresh_daemon.start()

    with fresh_daemon.client() as api:
        image = api.get(f"/v1/images/{image_id}").json()
        assert image["state"] == "failed" and image["error"] == "the daemon stopped during the build", image
        r = api.get(f"/v1/sandboxes/{build_sbx}")
        assert r.status_code == 404 or r.json()["state"] == "deleted", r.text
        assert not [s for s in api.get("/v1/sandboxes").json()["data"]
                    if (s.get("labels") or {}).get("runtime.imageBuild")]
        listed = api.get("/v1/snapshots").json()["data"]
        assert {s["id"] for s in listed} == before, listed  # the image's disk went, and the usage with it
        assert api.get(f"/v1/snapshots/{disk_id}").status_code == 404
        # Its storage charge is closed: the series is no longer running.
        charges = [u for u in api.get("/v1/usage").json()["sandboxes"] if u["sandboxId"] == f"{disk_id}:disk"]
        assert not [u for u in charges if u["running"]], charges
    # On disk: the snapshots the store records, and nothing else.
    recorded = {row[0] for row in _db(fresh_daemon, "SELECT id FROM snapshots")}
    assert layer not in recorded
    assert {p.name for p in snaps.iterdir()} == recorded
    assert not [p for p in chunks.iterdir() if p.name.startswith(".")]
