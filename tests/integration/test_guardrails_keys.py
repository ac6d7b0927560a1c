"""Guard rails, keys: making, listing and revoking keys; read keys refused on
every route that changes or spends; one owner's sandboxes invisible to
another's keys; the CLI's key verbs. Against the real daemon."""
from __future__ import annotations

import os
import re
import subprocess

import httpx
import pytest

from helpers import Api, assert_error, first_driver


def make_key(api: Api, expect: int = 201, **body) -> dict:
    r = api.post("/v1/keys", json=body)
    assert r.status_code == expect, f"POST /v1/keys {body!r}: {r.status_code} {r.text[:1000]}"
    return r.json()


@pytest.fixture
def drv(daemon) -> str:
    return first_driver(daemon)


@pytest.fixture
def clients(daemon):
    """Clients on other keys, closed (their sandboxes deleted) at teardown."""
    made: list[Api] = []

    def make(key: str) -> Api:
        c = Api(daemon, key=key)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_create_list_revoke(api):
    k = make_key(api, name="ci-full", dailyLimitMicros=25_000_000)
    assert re.fullmatch(r"key_[0-9a-f]{16}", k["id"]), k
    assert re.fullmatch(r"rt_[0-9a-f]{40}", k["key"]), "the secret is answered once, in full"
    assert k["access"] == "full" and k["dailyLimitMicros"] == 25_000_000 and k["revokedAt"] is None
    assert k["owner"] == "admin" and k["trial"] is False
    listed = api.get("/v1/keys").json()["keys"]
    mine = [x for x in listed if x["id"] == k["id"]]
    assert len(mine) == 1
    text = api.get("/v1/keys").text
    assert k["key"] not in text, "a listing must never show a secret"
    assert "hash" not in mine[0] and "key" not in mine[0], mine[0]

    with httpx.Client(base_url=api.daemon.base_url,
                      headers={"Authorization": f"Bearer {k['key']}"}) as c:
        lim = c.get("/v1/limits").json()
        assert lim["access"] == "full" and lim["daily"]["limitMicros"] == 25_000_000, lim
        r = api.delete(f"/v1/keys/{k['id']}")
        assert r.status_code == 200 and r.json()["revoked"] is True, r.text
        # Revocation takes effect on the very next request.
        assert_error(c.get("/v1/limits"), 401, "unauthorized")
        assert_error(c.get("/v1/sandboxes"), 401, "unauthorized")
    assert_error(api.delete(f"/v1/keys/{k['id']}"), 404, "not_found")
    listed = {x["id"]: x for x in api.get("/v1/keys").json()["keys"]}
    assert listed[k["id"]]["revokedAt"], "a revoked key stays listed with revokedAt"


def test_key_rules(api, clients):
    # The installation cannot lock itself out: the admin owner keeps a full key.
    admin_id = api.get("/v1/limits").json()["keyId"]
    assert_error(api.delete(f"/v1/keys/{admin_id}"), 409, "conflict")
    # A key with a daily limit makes read keys only (or it could multiply its limit).
    other = make_key(api, name="ci-rules", owner="ci-rules", dailyLimitMicros=1000)
    c = clients(other["key"])
    assert_error(c.post("/v1/keys", json={"name": "x"}), 403, "forbidden")
    rk = c.post("/v1/keys", json={"name": "x-read", "access": "read"})
    assert rk.status_code == 201, rk.text
    assert rk.json()["owner"] == "ci-rules"
    # Only an admin key names another owner.
    assert_error(c.post("/v1/keys", json={"name": "y", "access": "read", "owner": "admin"}), 403,
                 "forbidden")
    # A limited key of the admin owner is no admin either.
    la = make_key(api, name="ci-limited-admin", dailyLimitMicros=1000)
    assert la["owner"] == "admin"
    lc = clients(la["key"])
    assert_error(lc.post("/v1/keys", json={"name": "z"}), 403, "forbidden")
    assert_error(lc.post("/v1/keys", json={"name": "z", "access": "read", "owner": "ci-x"}), 403,
                 "forbidden")
    # It lists and revokes only its own owner's keys.
    ids = {x["id"] for x in c.get("/v1/keys").json()["keys"]}
    assert admin_id not in ids and other["id"] in ids
    assert_error(c.delete(f"/v1/keys/{admin_id}"), 404, "not_found")


@pytest.mark.parametrize("body, field", [
    ({}, "name"),
    ({"name": ""}, "name"),
    ({"name": "x" * 65}, "name"),
    ({"name": "a\nb"}, "name"),
    ({"name": 5}, "name"),
    ({"name": "x", "access": "admin"}, "access"),
    ({"name": "x", "dailyLimitMicros": -1}, "dailyLimitMicros"),
    ({"name": "x", "dailyLimitMicros": 10**16}, "dailyLimitMicros"),
    ({"name": "x", "dailyLimitMicros": "25"}, "dailyLimitMicros"),
    ({"name": "x", "dailyLimitMicros": 1.5}, "dailyLimitMicros"),
    ({"name": "x", "owner": "Bad Owner"}, "owner"),
    ({"name": "x", "secret": "mine"}, "secret"),
])
def test_key_bad_input(api, body, field):
    assert_error(api.post("/v1/keys", json=body), 400, "invalid_request", mentions=field)


def test_read_key_refused_on_every_mutating_route(api, clients, drv):
    sbx = api.create_sandbox(driver=drv, timeoutSeconds=120)
    sbx.write("/workspace/a.txt", b"hello")
    rk = make_key(api, name="ci-read", access="read")
    c = clients(rk["key"])
    sid = sbx.id
    refused = [
        ("POST", "/v1/sandboxes", {"json": {}}),
        ("DELETE", f"/v1/sandboxes/{sid}", {}),
        ("POST", f"/v1/sandboxes/{sid}:exec", {"json": {"command": "true"}}),
        ("POST", f"/v1/sandboxes/{sid}:stop", {}),
        ("POST", f"/v1/sandboxes/{sid}:extend", {"json": {"seconds": 60}}),
        ("PUT", f"/v1/sandboxes/{sid}/network", {"json": {"internet": False}}),
        ("PUT", f"/v1/sandboxes/{sid}/files/content", {"params": {"path": "/workspace/b"},
                                                       "content": b"x"}),
        ("POST", f"/v1/sandboxes/{sid}/files:mkdir", {"json": {"path": "/workspace/d"}}),
        ("POST", f"/v1/sandboxes/{sid}/files:remove", {"json": {"path": "/workspace/a.txt"}}),
        ("POST", f"/v1/sandboxes/{sid}/files:rename", {"json": {"from": "/workspace/a.txt",
                                                                "to": "/workspace/c.txt"}}),
        ("POST", "/v1/images/default:build", {}),
        ("POST", "/v1/keys", {"json": {"name": "x", "access": "read"}}),
        ("GET", "/v1/keys", {}),
        ("DELETE", f"/v1/keys/{rk['id']}", {}),
    ]
    for method, path, kw in refused:
        assert_error(c.request(method, path, **kw), 403, "forbidden")
    # ... and it looks: sandboxes, files, usage, limits.
    assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
    assert any(s["id"] == sid for s in c.get("/v1/sandboxes").json()["sandboxes"])
    r = c.get(f"/v1/sandboxes/{sid}/files/content", params={"path": "/workspace/a.txt"})
    assert r.status_code == 200 and r.content == b"hello"
    assert c.get("/v1/usage").status_code == 200
    lim = c.get("/v1/limits").json()
    assert lim["access"] == "read", lim
    # Nothing changed under the refusals.
    assert sbx.read("/workspace/a.txt") == b"hello"
    assert api.sandbox(sid)["state"] == "running"


def test_cross_owner_isolation(api, clients, drv):
    sbx = api.create_sandbox(driver=drv, timeoutSeconds=120)
    other = make_key(api, name="ci-other", owner="ci-other")
    c = clients(other["key"])
    sid = sbx.id
    for method, path, kw in [
        ("GET", f"/v1/sandboxes/{sid}", {}),
        ("DELETE", f"/v1/sandboxes/{sid}", {}),
        ("POST", f"/v1/sandboxes/{sid}:exec", {"json": {"command": "true"}}),
        ("POST", f"/v1/sandboxes/{sid}:stop", {}),
        ("POST", f"/v1/sandboxes/{sid}:extend", {"json": {"seconds": 60}}),
        ("GET", f"/v1/sandboxes/{sid}/files/list", {"params": {"path": "/workspace"}}),
        ("PUT", f"/v1/sandboxes/{sid}/files/content", {"params": {"path": "/workspace/x"},
                                                       "content": b"x"}),
    ]:
        # 404, not 403: ids cannot be probed.
        assert_error(c.request(method, path, **kw), 404, "not_found")
    assert all(s["id"] != sid for s in c.get("/v1/sandboxes").json()["sandboxes"])
    theirs = c.create_sandbox(driver=drv, timeoutSeconds=60)
    assert_error(api.get(f"/v1/sandboxes/{theirs.id}"), 404, "not_found")
    usage = c.get("/v1/usage").json()
    assert {s["sandboxId"] for s in usage["sandboxes"]} <= {theirs.id}, usage
    assert usage["owner"] == "ci-other"
    assert api.sandbox(sid)["state"] == "running"


def test_cli_keys(daemon, build_dir, api):
    env = {**os.environ, **daemon.env()}
    cli = [str(build_dir / "runtime")]
    r = subprocess.run(cli + ["keys", "create", "--read-only", "--daily-limit", "25", "ci-cli"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    m = re.search(r"^key: (rt_[0-9a-f]{40})$", r.stdout, re.M)
    kid = re.search(r"^id: (key_[0-9a-f]{16})$", r.stdout, re.M)
    assert m and kid, r.stdout
    assert "daily limit: $25.000000" in r.stdout and "access: read" in r.stdout
    assert "only time" in r.stderr
    ls = subprocess.run(cli + ["keys", "ls"], env=env, capture_output=True, text=True, timeout=30)
    assert ls.returncode == 0 and kid.group(1) in ls.stdout and m.group(1) not in ls.stdout
    lim = subprocess.run(cli + ["--key", m.group(1), "limits"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert lim.returncode == 0 and "access: read" in lim.stdout and "$25.000000" in lim.stdout, lim
    rv = subprocess.run(cli + ["keys", "revoke", kid.group(1)], env=env, capture_output=True, text=True,
                        timeout=30)
    assert rv.returncode == 0, rv.stderr
    lim = subprocess.run(cli + ["--key", m.group(1), "limits"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert lim.returncode == 1 and "not valid" in lim.stderr, lim
    bad = subprocess.run(cli + ["keys", "create", "--daily-limit", "-3", "x"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--daily-limit" in bad.stderr, bad
    bad = subprocess.run(cli + ["keys", "revoke", "../sandboxes"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 2, bad
