"""The API answers counted per key and hour (docs/api.md, "GET /v1/usage/requests"): what the
published client's usage_requests reads, for each range; each answer to a known key counted
once, 4xx and 5xx apart, an owner's own keys only; a range not offered refused; counts that
outlive a restart of the daemon."""
from __future__ import annotations

import uuid

from helpers import Api, assert_error


def _key(daemon, owner: str, access: str = "full") -> str:
    with Api(daemon) as admin:
        r = admin.post("/v1/keys", json={"name": owner, "owner": owner, "access": access})
        assert r.status_code == 201, r.text
        return r.json()["key"]


def _key_id(daemon, key: str) -> str:
    with Api(daemon, key=key) as c:
        return c.get("/v1/me").json()["keyId"]


def test_answers_counted_per_key(daemon, published_client):
    owner = f"req-{uuid.uuid4().hex[:8]}"
    full, reader = _key(daemon, owner), _key(daemon, owner, access="read")
    other = _key(daemon, f"req-{uuid.uuid4().hex[:8]}")
    full_id, reader_id = _key_id(daemon, full), _key_id(daemon, reader)  # one answer each
    with Api(daemon, key=full) as c, Api(daemon, key=reader) as ro, Api(daemon, key=other) as o:
        for _ in range(5):
            assert c.get("/v1/sandboxes").status_code == 200
        assert c.get("/v1/sandboxes/sbx_00000000000000000000").status_code == 404
        assert ro.post("/v1/sandboxes", json={}).status_code == 403
        for _ in range(3):
            assert o.get("/v1/sandboxes").status_code == 200
    # Answers without a known key are nobody's.
    with Api(daemon, key="rt_not-a-key") as anon:
        assert anon.get("/v1/sandboxes").status_code == 401

    got = published_client.run_json(daemon, """
import json
from withruntime import Runtime
rt = Runtime()
print(json.dumps({r: rt.usage_requests(r) for r in ("24h", "7d", "30d", "90d")}))
""", env={"RUNTIME_API_KEY": reader})
    day = got["24h"]
    keys = {k["keyId"]: k for k in day["keys"]}
    assert set(keys) == {full_id, reader_id}, keys  # the other owner's key is not here
    # full: /v1/me, five lists and a 404; reader: /v1/me and the 403 (a call is counted once
    # answered: the next one sees it).
    assert keys[full_id]["requests"] == "7" and keys[full_id]["clientErrors"] == "1"
    assert keys[reader_id]["requests"] == "2" and keys[reader_id]["clientErrors"] == "1"
    assert day["requests"] == "9" and day["clientErrors"] == "2" and day["serverErrors"] == "0"
    assert abs(day["errorPercent"] - 200 / 9) < 1e-9
    # One bucket, or two when the calls straddled an hour.
    assert day["bucketSeconds"] == 3600 and 1 <= len(day["buckets"]) <= 2
    assert sum(int(b["requests"]) for b in day["buckets"]) == 9
    assert all(b["at"].endswith(":00:00Z") and day["since"] < b["at"] <= day["until"] for b in day["buckets"])
    # Every range holds the same answers, and the calls for the ranges before it.
    assert [got[r]["requests"] for r in ("7d", "30d", "90d")] == ["10", "11", "12"]
    assert got["30d"]["bucketSeconds"] == 86400 and got["30d"]["buckets"][0]["at"].endswith("T00:00:00Z")


def test_refusals_and_a_restart(fresh_daemon):
    owner = f"req-{uuid.uuid4().hex[:8]}"
    key = _key(fresh_daemon, owner)
    with Api(fresh_daemon, key=key) as c:
        for bad in ("1h", "", "24H", "x" * 100):
            assert_error(c.get("/v1/usage/requests", params={"range": bad}), 400, "invalid_request",
                         mentions="range")
        for _ in range(4):
            c.get("/v1/sandboxes")
    # Stopped before the next write of the counts: the stop writes them.
    fresh_daemon.restart()
    with Api(fresh_daemon, key=key) as c:
        got = c.get("/v1/usage/requests").json()
    # Four refusals and four lists.
    assert got["requests"] == "8" and got["clientErrors"] == "4", got
