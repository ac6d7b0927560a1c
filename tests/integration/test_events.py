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


def test_processes_forks_memory_egress_and_spending_are_recorded(daemon):
    """The events beyond a sandbox's states: a process's end with its code, a fork, a kill for
    memory, a refused connection (at most one per sandbox every 10 s, the egress log has each) and
    a key at its daily limit (at most one a minute)."""
    import uuid
    from helpers import wait_until
    owner = f"ev-{uuid.uuid4().hex[:8]}"
    with Api(daemon) as admin:
        key = admin.post("/v1/keys", json={"name": "ev", "owner": owner}).json()["key"]
        poor = admin.post("/v1/keys", json={"name": "poor", "owner": owner, "dailyLimitMicros": 1}).json()
    with Api(daemon, key=key) as c:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=120, memoryMiB=256)
        p = c.post(f"/v1/sandboxes/{sbx.id}/processes", json={"argv": ["sh", "-c", "exit 7"]}).json()

        def of(type_):
            return [e for e in _events(c, resourceId=sbx.id, type=type_)]
        ended = wait_until(lambda: of("process.exited"), 30, what="the process's end")
        assert ended[0]["data"]["processId"] == p["id"] and ended[0]["data"]["exitCode"] == 7, ended
        assert ended[0]["data"]["state"] == "exited" and ended[0]["keyId"] is None

        hog = "python3 -c \"b=[bytearray(1<<20) for _ in range(1<<16)]\""
        r = c.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": hog, "timeoutMs": 120000})
        assert r.status_code == 200 and r.json().get("outOfMemory"), r.text[:500]
        oom = of("sandbox.oom_killed")
        assert len(oom) == 1 and oom[0]["data"]["processesKilled"] >= 1 and oom[0]["data"]["memoryMiB"] == 256

        for _ in range(3):
            out = sbx.exec("env -u NO_PROXY -u no_proxy curl -sS -o /dev/null -w '%{http_code}' "
                           "http://blocked.test/ || true")["stdout"]
            assert out.startswith("403"), out
        refused = of("egress.refused")
        assert len(refused) == 1, refused
        assert refused[0]["data"]["host"] == "blocked.test" and refused[0]["data"]["reason"], refused
        assert refused[0]["data"]["refusals"] == 1, refused
        # The audit trail has it too, bounded the same way.
        audited = wait_until(lambda: c.get("/v1/audit", params={"sandboxId": sbx.id, "action": "egress."})
                             .json()["events"], 10, what="the refusal's audit record")
        assert len(audited) == 1 and audited[0]["action"] == "egress.refused", audited
        assert audited[0]["detail"]["host"] == "blocked.test" and audited[0]["keyId"] is None, audited

        r = c.post(f"/v1/sandboxes/{sbx.id}:fork", json={"count": 1})
        assert r.status_code in (200, 201), r.text[:500]
        forked = of("sandbox.forked")
        assert len(forked) == 1 and forked[0]["keyId"] and forked[0]["data"]["count"] == 1, forked
        copy = forked[0]["data"]["copies"][0]
        assert c.get(f"/v1/sandboxes/{copy}").status_code == 200
        c.created.append(copy)

    with Api(daemon, key=poor["key"]) as pc:
        for _ in range(2):
            r = pc.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 60})
            assert r.status_code == 402, r.text[:300]
        got = _events(pc, resourceId=poor["id"], type="key.")
        assert [e["type"] for e in got] == ["key.spending_limit_reached"], got
        assert got[0]["data"]["limitMicros"] == 1 and got[0]["data"]["wantedMicros"] > 1, got
        assert got[0]["keyId"] == poor["id"]
