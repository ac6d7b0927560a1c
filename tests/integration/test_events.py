"""GET /v1/events (docs/api.md, "Events"): every lifecycle change of an owner's sandboxes is an
event with its type, the resource, the key that caused it (none for the daemon's own acts) and a
time; listed newest first, by page, filtered by resource and type; each owner sees its own, the
admin key every owner's. The published client's `events.list()` reads them."""
from __future__ import annotations

import json

from helpers import Api, assert_error


def _events(c: Api, **params) -> list[dict]:
    r = c.get("/v1/events", params=params)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_a_sandboxs_life_is_recorded(api, daemon, any_driver):
    sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=120)
    assert api.post(f"/v1/sandboxes/{sbx.id}:pause", json={}).status_code == 200
    assert api.post(f"/v1/sandboxes/{sbx.id}:wake", json={}).status_code == 200
    assert api.post(f"/v1/sandboxes/{sbx.id}:extend", json={"seconds": 60}).status_code == 200
    assert api.post(f"/v1/sandboxes/{sbx.id}:stop", json={}).status_code == 200
    assert api.post(f"/v1/sandboxes/{sbx.id}:restart", json={}).status_code == 200
    assert api.delete(f"/v1/sandboxes/{sbx.id}").status_code in (200, 204)
    got = _events(api, resourceId=sbx.id)
    types = [e["type"] for e in reversed(got)]
    assert types == ["sandbox.created", "sandbox.started", "sandbox.paused", "sandbox.woken", "sandbox.extended",
                     "sandbox.stopped", "sandbox.restarted", "sandbox.deleted"], types
    newest = got[0]
    assert newest["resourceType"] == "sandbox" and newest["resourceId"] == sbx.id
    assert newest["id"].startswith("evt_") and newest["time"].endswith("Z")
    assert newest["keyId"] and newest["hostId"]
    assert newest["data"]["from"] == "stopped" or newest["data"]["state"] == "deleted", newest
    created = got[-1]
    assert created["data"]["driver"] == any_driver
    # A type and a group of types.
    assert [e["type"] for e in _events(api, resourceId=sbx.id, type="sandbox.stopped")] == ["sandbox.stopped"]
    assert len(_events(api, resourceId=sbx.id, type="sandbox.")) == 8


def test_pages_filters_and_owners(api, daemon, any_driver):
    r = api.post("/v1/keys", json={"name": "events-other", "owner": "events-other"})
    assert r.status_code == 201, r.text
    other_key = r.json()["key"]
    with Api(daemon, key=other_key) as other:
        mine = other.create_sandbox(driver=any_driver, timeoutSeconds=60)
        other.delete(f"/v1/sandboxes/{mine.id}")
        seen = _events(other)
        assert {e["resourceId"] for e in seen} == {mine.id}, seen
        # A read key of that owner reads them too.
        r = other.post("/v1/keys", json={"name": "events-reader", "access": "read"})
        assert r.status_code == 201, r.text
        with Api(daemon, key=r.json()["key"]) as reader:
            assert [e["id"] for e in _events(reader)] == [e["id"] for e in seen]
    # The admin key sees every owner's; pages by cursor, newest first, no overlap.
    everything = _events(api, limit=100)
    assert mine.id in {e["resourceId"] for e in everything}
    first = api.get("/v1/events", params={"limit": 2}).json()
    assert len(first["data"]) == 2 and first["hasMore"] and first["nextCursor"]
    second = api.get("/v1/events", params={"limit": 2, "cursor": first["nextCursor"]}).json()
    assert [e["id"] for e in first["data"] + second["data"]] == [e["id"] for e in everything[:4]]
    # Bad input is named.
    for params in ({"limit": 0}, {"limit": 101}, {"limit": "x"}, {"cursor": "abc"}, {"cursor": "-1"},
                   {"type": "a" * 65}, {"resourceId": "sbx/../x"}, {"type": "%"}):
        assert_error(api.get("/v1/events", params=params), 400, "invalid_request")


def test_the_published_client_lists_events(published_client, daemon, api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=60)
    api.post(f"/v1/sandboxes/{sbx.id}:stop", json={})
    got = published_client.run_json(daemon, """
import json, sys
from withruntime import Runtime
rt = Runtime()
page = rt.events.list(resource_id=sys.argv[1], limit=10)
typed = rt.events.list(resource_id=sys.argv[1], type="sandbox.stopped")
print(json.dumps({"types": [e["type"] for e in page["data"]], "typed": len(typed["data"])}))
""", args=[sbx.id])
    assert got["types"] == ["sandbox.stopped", "sandbox.started", "sandbox.created"], got
    assert got["typed"] == 1
