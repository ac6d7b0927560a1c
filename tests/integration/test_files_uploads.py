"""Uploads in parts (POST .../uploads, PUT .../uploads/{id}?offset=, :commit, :abort), as the
published client sends a file over 1 MiB: parts in any order, the SHA-256 checked at the
commit, nothing written to the sandbox before it; and the attacks: parts out of place or too
long, a commit with a part missing or the wrong digest, another sandbox's upload."""
from __future__ import annotations

import hashlib
import os

import pytest

from helpers import assert_error

CHUNK = 1024 * 1024


def begin(sandbox, path, data, **extra):
    return sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/uploads",
                            json={"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), **extra})


def part(sandbox, uid, offset, body):
    return sandbox.api.put(f"/v1/sandboxes/{sandbox.id}/uploads/{uid}", params={"offset": offset}, content=body)


def call(sandbox, uid, verb):
    return sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/uploads/{uid}:{verb}", json={})


@pytest.mark.microvm_subset
def test_parts_in_any_order_then_commit(sandbox):
    data = os.urandom(3 * CHUNK + 12345)
    r = begin(sandbox, "/workspace/up/big.bin", data, mode="750")
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["chunkBytes"] == CHUNK and b["mode"] == "750" and b["uploadId"].startswith("upl_")
    for off in reversed(range(0, len(data), CHUNK)):
        r = part(sandbox, b["uploadId"], off, data[off:off + CHUNK])
        assert r.status_code == 200, r.text
    # Nothing is in the sandbox before the commit.
    assert sandbox.stat("/workspace/up/big.bin").json()["exists"] is False
    r = call(sandbox, b["uploadId"], "commit")
    assert r.status_code == 200 and r.json() == {"path": "/workspace/up/big.bin", "size": len(data)}, r.text
    assert sandbox.run("sha256sum /workspace/up/big.bin").split()[0] == hashlib.sha256(data).hexdigest()
    assert sandbox.stat("/workspace/up/big.bin").json()["mode"] == "0750"
    assert_error(call(sandbox, b["uploadId"], "commit"), 404, "not_found")  # gone once done


def test_bad_parts_and_commits_are_refused(sandbox, api, any_driver):
    data = os.urandom(2 * CHUNK + 7)
    uid = begin(sandbox, "/workspace/x.bin", data).json()["uploadId"]
    assert_error(part(sandbox, uid, 1, b"x"), 400, "invalid_request")  # not at a part's start
    assert_error(part(sandbox, uid, 3 * CHUNK, b"x"), 400, "invalid_request")  # past the end
    assert_error(part(sandbox, uid, 0, data[:CHUNK] + b"x"), 400, "invalid_request")  # too long
    assert_error(part(sandbox, uid, 0, data[:10]), 400, "invalid_request")  # too short
    assert_error(sandbox.api.put(f"/v1/sandboxes/{sandbox.id}/uploads/{uid}", content=b"x"), 400, "invalid_request")
    assert part(sandbox, uid, 0, data[:CHUNK]).status_code == 200
    assert_error(call(sandbox, uid, "commit"), 409, "conflict")  # a part missing
    # Another sandbox (of the same owner) cannot touch it.
    other = api.create_sandbox(driver=any_driver)
    assert_error(part(other, uid, CHUNK, data[CHUNK:2 * CHUNK]), 404, "not_found")
    assert_error(call(other, uid, "abort"), 404, "not_found")
    # Every part, but not the bytes the digest named: refused, nothing written.
    assert part(sandbox, uid, CHUNK, b"\0" * CHUNK).status_code == 200
    assert part(sandbox, uid, 2 * CHUNK, data[2 * CHUNK:]).status_code == 200
    assert_error(call(sandbox, uid, "commit"), 400, "invalid_request")
    assert sandbox.stat("/workspace/x.bin").json()["exists"] is False
    # Abort drops it.
    uid = begin(sandbox, "/workspace/y.bin", data).json()["uploadId"]
    assert call(sandbox, uid, "abort").status_code == 200
    assert_error(part(sandbox, uid, 0, data[:CHUNK]), 404, "not_found")
    for bad in ({"path": "/w/x", "size": -1, "sha256": "0" * 64}, {"path": "/w/x", "size": 1, "sha256": "zz"},
                {"path": "/w/x", "size": 1, "sha256": "0" * 64, "mode": "999"},
                {"path": "/w/x", "size": 1, "sha256": "0" * 64, "extra": 1},
                {"path": "/w/x", "size": 1 << 50, "sha256": "0" * 64}):
        r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/uploads", json=bad)
        assert r.status_code in (400, 413), (bad, r.text)
    for bad_id in ("upl_zz", "upl_" + "0" * 16, "../x"):
        assert part(sandbox, bad_id, 0, b"x").status_code == 404


def test_uploads_in_progress_are_bounded(sandbox):
    ids = []
    for i in range(8):
        r = begin(sandbox, f"/workspace/b{i}", b"x" * (CHUNK + 1))
        assert r.status_code == 200, r.text
        ids.append(r.json()["uploadId"])
    assert_error(begin(sandbox, "/workspace/b9", b"x"), 429, "rate_limited")
    for uid in ids:
        assert call(sandbox, uid, "abort").status_code == 200
    assert begin(sandbox, "/workspace/b9", b"x").status_code == 200
