"""The audit trail (docs/api.md, "Audit"): one record per call that changes something, per terminal
or tunnel opened and per refusal of one, with who, what, where and the outcome; listed by the
published client's runtime.audit.list; bounded command lines; no secret in it; an owner's own."""
from __future__ import annotations

import json
import uuid

from helpers import Api, assert_error


def _owner(daemon, access: str = "full", owner: str | None = None) -> tuple[str, str]:
    owner = owner or f"aud-{uuid.uuid4().hex[:8]}"
    with Api(daemon) as admin:
        r = admin.post("/v1/keys", json={"name": owner, "owner": owner, "access": access})
        assert r.status_code in (200, 201), r.text
        return owner, r.json()["key"]


def test_what_a_key_did_is_recorded(daemon, published_client):
    owner, key = _owner(daemon)
    with Api(daemon, key=key) as c:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        c.get(f"/v1/sandboxes/{sbx.id}")  # reads are not recorded
        r = c.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "echo audited", "env": {"TOKEN": "t0p-s3cret"}})
        assert r.status_code == 200, r.text
        long_cmd = "echo " + "x" * 3000
        c.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": long_cmd})
        c.post(f"/v1/sandboxes/{sbx.id}/processes", json={"argv": ["sleep", "0.1"]})
        c.put(f"/v1/sandboxes/{sbx.id}/files/content", params={"path": "/workspace/a.txt"}, content=b"hi")
        c.put("/v1/egress-secrets/api-token", json={"value": "s3cr3t-VALUE-4711", "hosts": ["api.example.com"]})
        c.delete(f"/v1/sandboxes/{sbx.id}")
    got = published_client.run(daemon, """
import json
from withruntime import Runtime
rt = Runtime()
everything = rt.audit.list(limit=100)
sandbox = rt.audit.list(action="sandbox.")
first = rt.audit.list(limit=2)
second = rt.audit.list(limit=2, before=first["next"])
print(json.dumps({"all": everything, "sandbox": sandbox, "first": first, "second": second}))
""", env={"RUNTIME_API_KEY": key}).stdout.strip().splitlines()[-1]
    text = got
    got = json.loads(got)
    entries = got["all"]["events"]
    actions = [e["action"] for e in reversed(entries)]
    assert actions == ["sandbox.create", "sandbox.exec", "sandbox.exec", "process.spawn", "file.write",
                       "secret.put", "sandbox.delete"], actions
    by = {e["action"]: e for e in entries}
    ex = [e for e in entries if e["action"] == "sandbox.exec"]
    assert ex[-1]["detail"]["command"] == "echo audited" and ex[-1]["status"] == 200
    assert ex[-1]["sandboxId"] == sbx.id and ex[-1]["keyId"].startswith("key_") and ex[-1]["owner"] == owner
    assert ex[-1]["clientAddress"] == "127.0.0.1" and ex[-1]["requestId"].startswith("req_")
    assert ex[-1]["method"] == "POST" and ex[-1]["path"] == f"/v1/sandboxes/{sbx.id}:exec"
    cut = ex[0]["detail"]["command"]
    assert len(cut) < 1100 and cut.startswith("echo xxx") and cut.endswith("(3005 bytes)"), cut[-40:]
    assert by["process.spawn"]["detail"]["command"] == "sleep 0.1"
    assert by["file.write"]["detail"]["path"] == "/workspace/a.txt"
    assert by["sandbox.create"]["status"] == 201
    # Secrets never: neither an exec's environment nor a secret's value.
    assert "t0p-s3cret" not in text and "s3cr3t-VALUE-4711" not in text
    assert {e["action"] for e in got["sandbox"]["events"]} == {"sandbox.create", "sandbox.exec", "sandbox.delete"}
    assert len(got["first"]["events"]) == 2 and got["first"]["next"]
    assert [e["id"] for e in got["first"]["events"] + got["second"]["events"]] == [e["id"] for e in entries[:4]]


def test_an_owners_own_and_refusals_recorded(daemon):
    owner, key = _owner(daemon)
    _, reader = _owner(daemon, access="read", owner=owner)
    other, other_key = _owner(daemon)
    with Api(daemon, key=key) as c, Api(daemon, key=reader) as ro, Api(daemon, key=other_key) as o:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        # A read key's refused change is recorded, with its status.
        assert ro.post(f"/v1/sandboxes/{sbx.id}:stop", json={}).status_code == 403
        refused = ro.get("/v1/audit", params={"action": "sandbox.stop"}).json()["events"]
        assert len(refused) == 1 and refused[0]["status"] == 403, refused
        # Another owner sees none of it; the admin key sees every owner's.
        o.create_sandbox(driver="namespace", timeoutSeconds=60)
        mine = {e["owner"] for e in c.get("/v1/audit").json()["events"]}
        theirs = {e["owner"] for e in o.get("/v1/audit").json()["events"]}
        assert mine == {owner} and theirs == {other}
        with Api(daemon) as admin:
            everyone = {e["owner"] for e in admin.get("/v1/audit", params={"limit": 100}).json()["events"]}
            assert {owner, other} <= everyone
        for params in ({"limit": 0}, {"limit": 101}, {"before": "x"}, {"before": "-1"}, {"action": "%"},
                       {"action": "a" * 65}):
            assert_error(c.get("/v1/audit", params=params), 400, "invalid_request")


def test_one_sandboxes_commands_with_their_exit_codes(daemon):
    """sandboxId= lists one sandbox's records (the dashboard's commands); an exec's record says the
    command's exit code once it ran to its end."""
    owner, key = _owner(daemon)
    with Api(daemon, key=key) as c:
        a = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        b = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        assert c.post(f"/v1/sandboxes/{a.id}:exec", json={"command": "exit 3"}).json()["exitCode"] == 3
        assert c.post(f"/v1/sandboxes/{b.id}:exec", json={"command": "true"}).json()["exitCode"] == 0
        assert c.post(f"/v1/sandboxes/{a.id}:exec", json={"command": "echo ok"}).json()["exitCode"] == 0

        def of(sid):
            r = c.get("/v1/audit", params={"sandboxId": sid})
            assert r.status_code == 200, r.text
            return [(e["action"], e["detail"].get("command"), e["detail"].get("exitCode"))
                    for e in r.json()["events"]]
        assert of(a.id) == [("sandbox.exec", "echo ok", 0), ("sandbox.exec", "exit 3", 3),
                            ("sandbox.create", None, None)]
        assert of(b.id) == [("sandbox.exec", "true", 0), ("sandbox.create", None, None)]
        # Another owner's sandbox: nothing, not an error that says it exists.
        _, other = _owner(daemon)
        with Api(daemon, key=other) as o:
            r = o.get("/v1/audit", params={"sandboxId": a.id})
            assert r.status_code == 200 and r.json()["events"] == []
        for bad in ("", "a" * 65, "sbx_%", "x y"):
            assert_error(c.get("/v1/audit", params={"sandboxId": bad}), 400, "invalid_request")
