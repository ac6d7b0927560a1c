"""File watches (docs/api.md, "File watches"): inotify in the agent, the changes read by cursor
and followed as NDJSON, through the published client's calls (files.watch, get_new_events,
events(), stop) and our own requests; the bounds (watches per sandbox, descriptors of a
recursive watch, the queue), a flood of changes reported as an overflow, a missing path
refused, hostile bodies refused, and a watch ending with its path and its sandbox."""
from __future__ import annotations

import json
import time

import httpx
import pytest

PRELUDE = """
import json, sys, time
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
"""


def _events(api, sid, wid, cursor=0, wait_ms=2000):
    r = api.get(f"/v1/sandboxes/{sid}/files/watches/{wid}/events",
                params={"cursor": cursor, "waitMs": wait_ms})
    assert r.status_code == 200, r.text
    return r.json()


def _until(api, sid, wid, pred, timeout=15.0):
    """Reads by cursor until pred(all events so far) holds; the events and the reads' notices."""
    got, notices, cursor = [], [], 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = _events(api, sid, wid, cursor, 1000)
        got += body["events"]
        notices += body["notices"]
        cursor = body["nextCursor"]
        if pred(got) or body["ended"]:
            break
    return got, notices, cursor


@pytest.mark.microvm_subset
def test_published_client_watch_poll_and_stream(pub, sandbox):
    sandbox.run("mkdir -p /workspace/w/sub")
    got = pub(PRELUDE + """
w = sbx.files.watch("/workspace/w", recursive=True)
sbx.files.write("/workspace/w/a.txt", "hi")
sbx.exec("mkdir /workspace/w/sub/deeper && echo x > /workspace/w/sub/deeper/b.txt && chmod 600 /workspace/w/a.txt"
         " && mv /workspace/w/a.txt /workspace/w/c.txt && rm /workspace/w/c.txt")
seen = []
deadline = time.time() + 15
while time.time() < deadline and not any(e["type"] == "remove" and e["path"].endswith("/c.txt") for e in seen):
    seen += w.get_new_events(wait_ms=1000)
listed = [x["id"] for x in sbx.files.watches.list()]
# The stream, from the cursor on: a change made now arrives on it.
w2 = sbx.files.watch("/workspace/w")
sbx.files.write("/workspace/w/streamed.txt", "s")
streamed = []
for e in w2.events():
    streamed.append(e)
    if e["path"].endswith("streamed.txt"):
        break
stopped = [w.stop(), w2.stop()]
print(json.dumps({"seen": seen, "listed": listed, "id": w.id, "streamed": streamed, "stopped": stopped,
                  "after": [x["id"] for x in sbx.files.watches.list()]}))
""", sandbox.id)
    kinds = {(e["type"], e["path"]) for e in got["seen"]}
    assert ("create", "/workspace/w/a.txt") in kinds, got["seen"]
    assert ("create", "/workspace/w/sub/deeper") in kinds, got["seen"]
    # The directory made after the watch began is watched too (recursive).
    assert ("create", "/workspace/w/sub/deeper/b.txt") in kinds, got["seen"]
    assert ("chmod", "/workspace/w/a.txt") in kinds
    assert ("rename", "/workspace/w/a.txt") in kinds
    assert ("create", "/workspace/w/c.txt") in kinds
    assert ("remove", "/workspace/w/c.txt") in kinds
    assert [e["isDir"] for e in got["seen"] if e["path"] == "/workspace/w/sub/deeper"][0] is True
    assert got["id"] in got["listed"]
    assert got["streamed"][-1]["path"] == "/workspace/w/streamed.txt"
    assert got["stopped"] == [True, True]
    assert got["after"] == []


def test_missing_path_and_hostile_bodies(api, sandbox):
    base = f"/v1/sandboxes/{sandbox.id}/files/watches"
    r = api.post(base, json={"path": "/workspace/nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    bad = [
        {},
        {"path": "/workspace", "bogus": 1},
        {"path": "/workspace", "recursive": "yes"},
        {"path": "/workspace", "events": ["create", "explode"]},
        {"path": "/workspace", "events": []},
        {"path": "/workspace", "include": ["x" * 300]},
        {"path": "/workspace", "exclude": ["a"] * 65},
        {"path": "/workspace", "maxWatches": 0},
        {"path": "/workspace", "maxWatches": 10 ** 9},
        {"path": "/workspace", "timeoutMs": -1},
        {"path": "/workspace", "batchMs": 10 ** 9},
        {"path": "/workspace", "id": "../x"},
        {"path": "/workspace", "id": "a" * 64},
        {"path": "/work\u0000space"},
        {"path": "/" + "a" * 5000},
    ]
    for body in bad:
        r = api.post(base, json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["code"] == "invalid_request"
    r = api.post(base, json={"path": "/workspace", "webhook": True})
    assert r.status_code == 501 and r.json()["error"]["code"] == "not_implemented"
    # A link is not followed: it could lead anywhere.
    sandbox.run("ln -s /etc /workspace/etc-link")
    r = api.post(base, json={"path": "/workspace/etc-link"})
    assert r.status_code in (400, 404), r.text
    for path in ("/w_x/events", "/w_nothing", "/w_nothing/events"):
        r = api.get(base + path)
        assert r.status_code == 404, (path, r.text)
    r = api.get(base + "/..%2f..")
    assert r.status_code == 404
    w = api.post(base, json={"path": "/workspace", "id": "mine"}).json()
    assert w["id"] == "mine" and w["running"] is True
    r = api.post(base, json={"path": "/workspace", "id": "mine"})
    assert r.status_code == 409
    for q in ({"cursor": "-1"}, {"cursor": "x"}, {"follow": "maybe"}, {"waitMs": "soon"}):
        r = api.get(base + "/mine/events", params=q)
        assert r.status_code == 400, (q, r.text)
    assert api.delete(base + "/mine").json()["stopped"] is True
    assert api.delete(base + "/mine").status_code == 404


def test_watches_per_sandbox_bound(api, sandbox):
    base = f"/v1/sandboxes/{sandbox.id}/files/watches"
    ids = []
    for _ in range(16):
        r = api.post(base, json={"path": "/workspace"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    r = api.post(base, json={"path": "/workspace"})
    assert r.status_code == 429 and "16" in r.json()["error"]["message"], r.text
    assert len(api.get(base).json()["data"]) == 16
    api.delete(f"{base}/{ids[0]}")
    assert api.post(base, json={"path": "/workspace"}).status_code == 201


def test_descriptor_bound_is_reported(api, sandbox):
    sandbox.run("mkdir -p /workspace/t && cd /workspace/t && mkdir d1 d2 d3 d4 d5 d6")
    base = f"/v1/sandboxes/{sandbox.id}/files/watches"
    w = api.post(base, json={"path": "/workspace/t", "recursive": True, "maxWatches": 3}).json()
    sandbox.run("touch /workspace/t/top")
    got, notices, _ = _until(api, sandbox.id, w["id"], lambda ev: any(e["path"].endswith("/top") for e in ev))
    assert any(n["k"] == "limit" and n["watches"] == 3 for n in notices), notices


def test_flood_is_bounded_and_reported(api, sandbox):
    """Far more changes than the queue keeps: a reader that waits sees the newest ones and an
    overflow notice that says how many it lost (the kernel's own overflow, when it comes first,
    is a notice too); the daemon stays well."""
    sandbox.run("mkdir -p /workspace/flood")
    base = f"/v1/sandboxes/{sandbox.id}/files/watches"
    w = api.post(base, json={"path": "/workspace/flood"}).json()
    sandbox.run("cd /workspace/flood && for i in $(seq 1 30000); do : > f$i; done; touch last", timeoutMs=120000)
    got, notices, _ = _until(api, sandbox.id, w["id"],
                             lambda ev: any(e["path"].endswith("/last") for e in ev), timeout=60)
    assert any(e["path"].endswith("/last") for e in got)
    assert any(n["k"] == "overflow" for n in notices), notices[:5]
    lost = [n for n in notices if n["k"] == "overflow" and n.get("source") == "queue"]
    if lost:
        assert lost[0]["lost"] > 0


def test_filters_and_follow_stream(api, sandbox):
    sandbox.run("mkdir -p /workspace/f/node_modules/x /workspace/f/src")
    base = f"/v1/sandboxes/{sandbox.id}/files/watches"
    w = api.post(base, json={"path": "/workspace/f", "recursive": True, "events": ["create"],
                             "exclude": ["node_modules"], "include": ["*.py", "src"]}).json()
    sandbox.run("touch /workspace/f/node_modules/x/a.py /workspace/f/src/b.py /workspace/f/c.txt "
                "/workspace/f/d.py && chmod 600 /workspace/f/d.py")
    got = []
    with api.stream("GET", f"{base}/{w['id']}/events", params={"cursor": 0, "follow": "true"},
                    timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        for line in r.iter_lines():
            msg = json.loads(line)
            if msg["k"] == "events":
                got += msg["events"]
                assert msg["cursor"] > 0
            if any(e["path"].endswith("/d.py") for e in got):
                break
    paths = sorted(e["path"] for e in got)
    assert paths == ["/workspace/f/d.py", "/workspace/f/src/b.py"], got
    assert {e["type"] for e in got} == {"create"}


def test_watch_ends_with_its_path_and_its_sandbox(api, sandbox):
    sandbox.run("mkdir -p /workspace/gone")
    base = f"/v1/sandboxes/{sandbox.id}/files/watches"
    w = api.post(base, json={"path": "/workspace/gone"}).json()
    sandbox.run("rmdir /workspace/gone")
    got, notices, _ = _until(api, sandbox.id, w["id"], lambda ev: False)
    assert {"k": "end", "reason": "root-removed"} in notices, notices
    sandbox.run("mkdir -p /workspace/kept")
    w2 = api.post(base, json={"path": "/workspace/kept"}).json()
    # A follower waits; the sandbox's stop ends the watch and the stream.
    assert api.post(f"/v1/sandboxes/{sandbox.id}:stop", json={}).status_code == 200
    got, notices, _ = _until(api, sandbox.id, w2["id"], lambda ev: False)
    assert any(n["k"] == "end" for n in notices), notices


def test_other_owner_sees_no_watch(api, daemon, sandbox):
    base = f"/v1/sandboxes/{sandbox.id}/files/watches"
    w = api.post(base, json={"path": "/workspace"}).json()
    r = api.post("/v1/keys", json={"name": "other", "owner": "other-owner", "access": "full"})
    assert r.status_code in (200, 201), r.text
    other = httpx.Client(base_url=str(api.base_url),
                         headers={"Authorization": f"Bearer {r.json()['key']}"}, timeout=30)
    with other:
        assert other.get(f"{base}/{w['id']}/events").status_code == 404
        assert other.delete(f"{base}/{w['id']}").status_code == 404
        assert other.post(base, json={"path": "/workspace"}).status_code == 404
    assert api.get(f"{base}/{w['id']}").json()["running"] is True
