"""Conformance: the published withruntime client (0.35.0, in a venv of its own) drives runtimed's
collection surface: Sandbox.get_or_create by name (made once, then reused; a paused one woken,
a stopped one booted again from its disk), runtime.sandboxes.list with pages (data, nextCursor) and filters by
state and labels, and stop_all / delete_all by labels.

The published create has no driver field, so its sandboxes use the daemon's default driver; the
collection logic is the same for every driver, and the suite's own sandboxes (made on each
driver) are listed beside them."""
from __future__ import annotations

import secrets

import pytest

from helpers import assert_error

# A client's calls, whose answers do not depend on the driver: by default on namespace only
# (conftest.py, driver_independent); each driver's own behaviour is checked by the tests of it.
pytestmark = pytest.mark.driver_independent

PRELUDE = """
import json, sys
from withruntime import Runtime, Sandbox, RuntimeAPIError
rt = Runtime()
"""


def test_get_or_create_by_name(pub, api):
    name = "goc-" + secrets.token_hex(4)
    got = pub(PRELUDE + """
a = Sandbox.get_or_create(sys.argv[1], labels={"suite": "goc"}, timeout_seconds=600)
b = Sandbox.get_or_create(sys.argv[1], timeout_seconds=600)
print(json.dumps({"a": [a.id, a.state, a.info.get("reused")], "b": [b.id, b.state, b.info.get("reused")],
                  "labels": b.info.get("labels")}))
""", name)
    api.created.append(got["a"][0])
    assert got["a"][1:] == ["running", False] and got["b"][1:] == ["running", True]
    assert got["a"][0] == got["b"][0] and got["labels"] == {"suite": "goc"}
    # One name, one sandbox, whatever the order of the calls.
    named = api.get("/v1/sandboxes", params={"name": name}).json()["data"]
    assert [s["id"] for s in named] == [got["a"][0]]
    # Paused: woken; stopped: booted again from its disk, its files kept. Either way the same id.
    sid = got["a"][0]
    assert api.post(f"/v1/sandboxes/{sid}:pause", json={}).status_code == 200
    again = pub(PRELUDE + """
s = Sandbox.get_or_create(sys.argv[1], timeout_seconds=600)
print(json.dumps([s.id, s.state, s.info.get("reused")]))
""", name)
    assert again == [sid, "running", True], again
    api.exec(sid, command="echo kept > /workspace/k.txt")
    assert api.post(f"/v1/sandboxes/{sid}:stop", json={}).status_code == 200
    again = pub(PRELUDE + """
s = Sandbox.get_or_create(sys.argv[1], timeout_seconds=600)
print(json.dumps([s.id, s.state, s.info.get("reused")]))
""", name)
    assert again == [sid, "running", True], again
    assert api.exec(sid, command="cat /workspace/k.txt")["stdout"] == "kept\n"
    assert_error(api.post("/v1/sandboxes", json={"getOrCreate": True}), 400, "invalid_request")
    assert_error(api.post("/v1/sandboxes", json={"getOrCreate": "yes", "name": "x"}), 400, "invalid_request")


def test_list_pages_filters_stop_all_delete_all(pub, api, driver):
    tag = secrets.token_hex(4)
    ours = [api.create_sandbox(driver=driver, labels={"suite": tag, "n": str(i)}) for i in range(3)]
    other = api.create_sandbox(driver=driver, labels={"suite": "other-" + tag})
    assert api.post(f"/v1/sandboxes/{ours[2].id}:stop", json={}).status_code == 200
    got = pub(PRELUDE + """
tag = sys.argv[1]
first = rt.sandboxes.list(labels={"suite": tag}, limit=2)
every = [s.id for s in rt.sandboxes.list(labels={"suite": tag}, limit=2)]
running = [s.id for s in rt.sandboxes.list(labels={"suite": tag}, state=["running"])]
one = [s.id for s in rt.sandboxes.list(labels={"suite": tag, "n": "1"})]
stopped = rt.sandboxes.stop_all(labels={"suite": tag})
after = sorted((s.id, s.state) for s in rt.sandboxes.list(labels={"suite": tag}))
deleted = rt.sandboxes.delete_all(labels={"suite": tag})
left = [s.id for s in rt.sandboxes.list(labels={"suite": tag})]
print(json.dumps({"first": [len(first.data), first.has_more, first.next_cursor is not None],
                  "every": every, "running": running, "one": one,
                  "stopped": [stopped["stopped"], len(stopped["failed"])], "after": after,
                  "deleted": [deleted["deleted"], len(deleted["failed"])], "left": left}))
""", tag)
    ids = [s.id for s in ours]
    assert got["first"] == [2, True, True]
    assert got["every"] == ids  # oldest first, across pages
    assert got["running"] == ids[:2]
    assert got["one"] == [ids[1]]
    assert sorted(got["stopped"][0]) == sorted(ids) and got["stopped"][1] == 0
    assert got["after"] == sorted([i, "stopped"] for i in ids)
    assert sorted(got["deleted"][0]) == sorted(ids) and got["deleted"][1] == 0
    assert got["left"] == []
    assert api.sandbox(other.id)["state"] == "running"  # another label's sandbox is untouched


def test_list_query_is_checked(api):
    for params in ({"limit": "0"}, {"limit": "101"}, {"limit": "x"}, {"cursor": "nope"},
                   {"cursor": "1.sbx_../../x"}, {"label": "nocolon"}, {"label": ":v"}, {"state": "RUNNING"},
                   {"includeStopped": "maybe"}, {"name": "x" * 65},
                   {"label": [f"k{i}:v" for i in range(33)]}):
        assert_error(api.get("/v1/sandboxes", params=params), 400, "invalid_request")
    body = api.get("/v1/sandboxes").json()
    assert body["data"] == body["sandboxes"] and "nextCursor" in body


def test_update_labels_network_lease(pub, api, driver):
    sbx = api.create_sandbox(driver=driver, name="before", labels={"a": "1"}, timeoutSeconds=300)
    ends = sbx["leaseEndsAt"]
    got = pub(PRELUDE + """
from withruntime import Sandbox
s = Sandbox.connect(sys.argv[1])
s.update(name="after", labels={"b": "2"}, network={"internet": True, "allow": ["pypi.org"]},
         timeout_seconds=3600, on_timeout="delete")
longer = dict(s.info)
s.update(timeout_seconds=120)
shorter = s.info["leaseEndsAt"]
try:
    s.update(env={"1X": "1"})  # not a variable's name: refused, nothing changed
    refused = "no error"
except RuntimeAPIError as e:
    refused = [e.status, e.code, str(e)]
print(json.dumps({"longer": longer, "shorter": shorter, "refused": refused}))
""", sbx.id)
    longer = got["longer"]
    assert longer["name"] == "after" and longer["labels"] == {"b": "2"}, longer
    assert longer["network"]["internet"] is True and longer["network"]["allow"] == ["pypi.org"]
    assert longer["onLeaseEnd"] == "delete"
    assert longer["leaseEndsAt"] > ends and got["shorter"] < longer["leaseEndsAt"]
    assert got["refused"][:2] == [400, "invalid_request"] and "env" in got["refused"][2]
    # Read back by the suite: recorded, and listed under the new name and labels.
    now = api.sandbox(sbx.id)
    assert now["name"] == "after" and now["labels"] == {"b": "2"} and now["leaseEndsAt"] == got["shorter"]
    assert [s["id"] for s in api.get("/v1/sandboxes", params={"label": "b:2", "name": "after"}).json()["data"]] \
        == [sbx.id]
    for bad in ({"labels": "x"}, {"name": ""}, {"timeoutSeconds": 0}, {"onTimeout": "later"}, {"bogus": 1},
                {"network": {"internet": "yes"}}):
        assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json=bad), 400, "invalid_request")
    assert api.post(f"/v1/sandboxes/{sbx.id}:stop", json={}).status_code == 200
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json={"timeoutSeconds": 600}), 409, "conflict")
    r = api.post(f"/v1/sandboxes/{sbx.id}:update", json={"labels": None, "name": None})
    assert r.status_code == 200 and r.json()["labels"] == {} and r.json()["name"] is None, r.text
    assert_error(api.post("/v1/sandboxes/sbx_00000000000000000000:update", json={"name": "x"}), 404, "not_found")
