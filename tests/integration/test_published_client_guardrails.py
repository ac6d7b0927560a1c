"""Conformance: the published withruntime client (0.35.0, in a venv of its own) manages runtimed's
guard rails: egress secrets with a header, a format and rules, their list, replace, rotation and
delete; `me()` and the account calls a self-hosted daemon answers with 501; the sandbox's network
read and its off()/on()/set(); and Idempotency-Key on create, delete and the other calls the
client retries. The reflection test: an echo server on a host the sandbox may reach never receives
the value of a secret scoped to another host, nor a header secret on a path its rules refuse.

No traffic leaves the machine: every upstream is a server of this module on 127.0.0.1 under a
test name the daemon maps with --egress-test-upstream (see test_egress.py)."""
from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import uuid

import httpx
import pytest

from conftest import DRIVERS, _finish_daemon, _need_root
from egress_servers import EchoServer, TestCa
from helpers import Api, Daemon, DaemonError, first_driver, skip_unless_driver, tail

VALUE_A = "tok-A-" + uuid.uuid4().hex  # scoped to api.test, set as a header
VALUE_B = "tok-B-" + uuid.uuid4().hex  # scoped to api.test, a placeholder
VALUE_C = "tok-C-" + uuid.uuid4().hex  # scoped to echo.test


class Env:
    def __init__(self, tmp):
        self.ca = TestCa(tmp / "ca", "runtime guard-rail tests CA")
        self.echo = EchoServer().start()
        self.tls = EchoServer(tls=self.ca.leaf("api", ["api.test"])).start()
        self.mapping = {"echo.test": self.echo.port, "api.test": self.tls.port}
        self.daemon: Daemon | None = None

    def stop(self):
        self.echo.stop()
        self.tls.stop()

    def clear(self):
        self.echo.clear()
        self.tls.clear()


@pytest.fixture(scope="module")
def env(build_dir, image_dir, tmp_path_factory):
    _need_root()
    tmp = tmp_path_factory.mktemp("guardrails")
    e = Env(tmp)
    args = []
    for name, port in e.mapping.items():
        args += ["--egress-test-upstream", f"{name}=127.0.0.1:{port}"]
    args += ["--egress-extra-ca", str(e.ca.cert_path)]
    d = Daemon(build_dir, image_dir, tmp / "state", f"runtime-test-{os.getpid()}-guardrails", extra_args=args)
    try:
        d.start()
    except DaemonError as err:
        e.stop()
        pytest.fail(str(err), pytrace=False)
    e.daemon = d
    yield e
    _finish_daemon(d)
    e.stop()


@pytest.fixture
def gapi(env):
    c = Api(env.daemon)
    env.clear()
    yield c
    problems = c.delete_all()
    for s in c.get("/v1/egress-secrets").json().get("secrets", []):
        c.delete(f"/v1/egress-secrets/{s['name']}")
    c.close()
    assert env.daemon.alive(), f"runtimed died during the test; log:\n{tail(env.daemon.log_path)}"
    assert not problems, problems


@pytest.fixture(params=DRIVERS)
def gdriver(request, env) -> str:
    skip_unless_driver(env.daemon, request.param)
    return request.param


@pytest.fixture
def gany(env) -> str:
    return first_driver(env.daemon)


@pytest.fixture
def pub(published_client, env):
    def run(script: str, *args: str, key: str | None = None, **kw):
        extra = {"RUNTIME_API_KEY": key} if key else None
        return published_client.run_json(env.daemon, "import json, sys\nfrom withruntime import Runtime\n"
                                         "rt = Runtime()\n" + script, args=list(args), env=extra, **kw)
    return run


def read_key(api: Api) -> str:
    r = api.post("/v1/keys", json={"name": "reader-" + uuid.uuid4().hex[:6], "access": "read"})
    assert r.status_code in (200, 201), r.text
    return r.json()["key"]


def no_value_in(text: str) -> None:
    for v in (VALUE_A, VALUE_B, VALUE_C):
        assert v not in text, text[:500]


# ---------------------------------------------------------------------------
# Secrets through the published client


def test_secrets_set_list_replace_delete(pub, gapi, env):
    got = pub("""
out = {}
out["set"] = rt.secrets.set("GH_TOKEN", value=sys.argv[1], hosts=["api.test"], header="Authorization",
                            format="Bearer {value}", rules=[{"methods": ["get"], "paths": ["/repos/acme/*"]}])
out["plain"] = rt.secrets.set("PLAIN_TOKEN", value=sys.argv[2], hosts=["api.test", "*.api.test"])
out["list"] = rt.secrets.list()
out["page1"] = rt.secrets.list(limit=1)
out["page2"] = rt.secrets.list(limit=1, after=out["page1"][-1]["name"])
out["get"] = rt.secrets.get("GH_TOKEN")
# A replace keeps the placeholder; without rules it clears them.
out["replaced"] = rt.secrets.set("GH_TOKEN", value=sys.argv[2], hosts=["api.test"])
out["all"] = rt.secrets.all()
out["deleted"] = rt.secrets.delete("PLAIN_TOKEN")
try:
    rt.secrets.get("PLAIN_TOKEN")
except Exception as e:
    out["gone"] = [type(e).__name__, e.status]
print(json.dumps(out))
""", VALUE_A, VALUE_B)
    no_value_in(json.dumps(got))
    s = got["set"]
    assert s["name"] == "GH_TOKEN" and s["hosts"] == ["api.test"] and s["header"] == "Authorization"
    assert s["format"] == "Bearer {value}" and s["rules"] == [{"methods": ["GET"], "paths": ["/repos/acme/*"]}]
    assert s["placeholder"].startswith("runtime-secret-GH_TOKEN-")
    assert [x["name"] for x in got["list"]] == ["GH_TOKEN", "PLAIN_TOKEN"]
    assert all({"name", "hosts", "placeholder"} <= set(x) and "value" not in x for x in got["list"])
    assert [x["name"] for x in got["page1"]] == ["GH_TOKEN"]
    assert [x["name"] for x in got["page2"]] == ["PLAIN_TOKEN"]
    assert got["get"]["sandboxes"]["placeholder"] == s["placeholder"] and got["get"]["jobs"] is None
    assert got["replaced"]["placeholder"] == s["placeholder"]
    assert got["replaced"]["rules"] is None and got["replaced"]["header"] is None
    assert [x["name"] for x in got["all"]] == ["GH_TOKEN", "PLAIN_TOKEN"]
    assert got["deleted"]["deleted"] is True and got["deleted"]["from"] == ["sandboxes"]
    assert got["gone"] == ["NotFoundError", 404]
    no_value_in(env.daemon.log_path.read_text(errors="replace"))


def test_rotate_keeps_the_placeholder_and_needs_a_full_key(pub, gapi, env):
    first = gapi.put("/v1/egress-secrets/ROT_TOKEN", json={"value": VALUE_A, "hosts": ["api.test"],
                                                           "header": "X-Api-Key"}).json()
    r = gapi.post("/v1/egress-secrets/ROT_TOKEN:rotate", json={"value": VALUE_B},
                  headers={"Idempotency-Key": "rot-" + uuid.uuid4().hex})
    assert r.status_code == 200, r.text
    no_value_in(r.text)
    rotated = r.json()
    assert rotated["placeholder"] == first["placeholder"] and rotated["header"] == "X-Api-Key"
    assert rotated["hosts"] == ["api.test"]
    for bad in ({"value": "a\nb"}, {"value": ""}, {"value": "x", "hosts": ["a.test"]}, {}):
        r = gapi.post("/v1/egress-secrets/ROT_TOKEN:rotate", json=bad)
        assert r.status_code == 400, f"{bad}: {r.status_code} {r.text}"
    assert gapi.post("/v1/egress-secrets/NO_SUCH:rotate", json={"value": "x"}).status_code == 404
    # The published client's rotate is its jobs copy's: a clear 501 that points at this route.
    got = pub("""
try:
    rt.secrets.rotate("ROT_TOKEN", sys.argv[1])
    print(json.dumps("rotated"))
except Exception as e:
    print(json.dumps([e.status, e.code, e.hint]))
""", VALUE_C)
    assert got[0] == 501 and got[1] == "not_implemented" and ":rotate" in got[2], got
    # A read key lists but cannot set, rotate or delete.
    key = read_key(gapi)
    got = pub("""
out = {"list": [s["name"] for s in rt.secrets.list()]}
for name, call in (("set", lambda: rt.secrets.set("ROT_TOKEN", value=sys.argv[1], hosts=["echo.test"])),
                   ("delete", lambda: rt.secrets.delete("ROT_TOKEN"))):
    try:
        call()
        out[name] = "done"
    except Exception as e:
        out[name] = [e.status, e.code]
print(json.dumps(out))
""", VALUE_C, key=key)
    assert got == {"list": ["ROT_TOKEN"], "set": [403, "forbidden"], "delete": [403, "forbidden"]}, got
    with httpx.Client(base_url=env.daemon.base_url, headers={"Authorization": f"Bearer {key}"}) as rc:
        assert rc.post("/v1/egress-secrets/ROT_TOKEN:rotate", json={"value": VALUE_C}).status_code == 403
    after = gapi.get("/v1/egress-secrets/ROT_TOKEN").json()
    assert after["hosts"] == ["api.test"] and after["updatedAt"] == rotated["updatedAt"]


@pytest.mark.parametrize("body, field", [
    ({"header": "X-Evil\r\nX-Injected: 1"}, "header"),
    ({"header": "Host"}, "header"),
    ({"header": "content-length"}, "header"),
    ({"header": "Transfer-Encoding"}, "header"),
    ({"header": "Proxy-Authorization"}, "header"),
    ({"header": "Bad Header"}, "header"),
    ({"header": "X" * 65}, "header"),
    ({"header": ""}, "header"),
    ({"header": "Authorization", "format": "Bearer"}, "format"),
    ({"header": "Authorization", "format": "{value} {value}"}, "format"),
    ({"header": "Authorization", "format": "Bearer {value}\r\nX-Injected: 1"}, "format"),
    ({"header": "Authorization", "format": "B" * 300 + "{value}"}, "format"),
    ({"format": "Bearer {value}"}, "format"),
    ({"rules": []}, "rules"),
    ({"rules": [{"paths": ["/a/../b"]}]}, "rules"),
    ({"rules": [{"paths": ["/a/./b"]}]}, "rules"),
    ({"rules": [{"paths": ["/a/%2e%2e/b"]}]}, "rules"),
    ({"rules": [{"paths": ["/a%2Fb"]}]}, "rules"),
    ({"rules": [{"paths": ["/a;b"]}]}, "rules"),
    ({"rules": [{"paths": ["/a\\b"]}]}, "rules"),
    ({"rules": [{"paths": ["a/b"]}]}, "rules"),
    ({"rules": [{"paths": ["/a*"]}]}, "rules"),
    ({"rules": [{"paths": ["/*/b"]}]}, "rules"),
    ({"rules": [{"paths": ["/a?b=1"]}]}, "rules"),
    ({"rules": [{"paths": ["/" + "a" * 600]}]}, "rules"),
    ({"rules": [{"paths": []}]}, "rules"),
    ({"rules": [{"methods": ["GET"]}]}, "rules"),
    ({"rules": [{"methods": ["G ET"], "paths": ["/a"]}]}, "rules"),
    ({"rules": [{"methods": [], "paths": ["/a"]}]}, "rules"),
    ({"rules": [{"paths": ["/a"], "hosts": ["x"]}]}, "rules"),
    ({"rules": [{"paths": ["/a"]}] * 17}, "rules"),
    ({"rules": {"paths": ["/a"]}}, "rules"),
    ({"value": "a\r\nX-Evil: 1"}, "value"),
    ({"value": "a\tb"}, "value"),
    ({"value": "caf\u00e9"}, "value"),
    ({"value": "x" * 8193}, "value"),
    ({"extra": 1}, "extra"),
])
def test_secret_fields_validated(gapi, body, field):
    full = {"value": "v", "hosts": ["api.test"], **body}
    r = gapi.put("/v1/egress-secrets/BAD_ONE", json=full)
    assert r.status_code == 400, f"{body}: {r.status_code} {r.text}"
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and field in err["message"], err
    assert "\r" not in r.text and "X-Injected" not in r.headers
    assert gapi.get("/v1/egress-secrets/BAD_ONE").status_code == 404


def test_secret_fields_this_daemon_lacks_are_501(pub, gapi):
    got = pub("""
out = {}
for field, kw in (("only", {"only": {"sandboxes": ["sbx_1"]}}),
                  ("githubApp", {"github_app": {"id": 1, "installation": 2}}),
                  ("git", {"git": {"push": []}}), ("api", {"api": {"callsPerHour": 5}}), ("env", {"env": "X"})):
    try:
        rt.secrets.set("SOME_TOKEN", value="v", hosts=["api.test"], **kw)
        out[field] = "stored"
    except Exception as e:
        out[field] = [e.status, e.code, str(e)[:200], e.hint]
for name, call in (("scope", lambda: rt.secrets.scope("SOME_TOKEN", {})),
                   ("narrow", lambda: rt.secrets.narrow("SOME_TOKEN", hosts=["api.test"]))):
    try:
        call()
        out[name] = "done"
    except Exception as e:
        out[name] = [e.status, e.code, str(e)[:200], e.hint]
print(json.dumps(out))
""")
    for field in ("only", "githubApp", "git", "api", "env", "scope", "narrow"):
        status, code, message, hint = got[field]
        assert (status, code) == (501, "not_implemented") and hint, (field, got[field])
    assert gapi.get("/v1/egress-secrets/SOME_TOKEN").status_code == 404


# ---------------------------------------------------------------------------
# me() and the account calls


def test_me_and_account_calls(pub, gapi, env):
    got = pub("""
out = {"me": rt.me()}
for name, call in (("emails", lambda: rt.account.emails()),
                   ("close", lambda: rt.account.close(confirm="x"))):
    try:
        call()
        out[name] = "answered"
    except Exception as e:
        out[name] = [e.status, e.code, e.hint]
print(json.dumps(out))
""")
    me = got["me"]
    assert me["access"] == "full" and me["owner"] == me["orgName"] and me["keyId"].startswith("key_")
    assert me["limits"]["daily"]["usedMicros"] >= 0 and me["selfHosted"] is True
    for name in ("emails", "close"):
        assert got[name][0] == 501 and got[name][1] == "not_implemented" and got[name][2], (name, got[name])
    # A read key reads itself.
    key = read_key(gapi)
    me = pub("print(json.dumps(rt.me()))", key=key)
    assert me["access"] == "read"


# ---------------------------------------------------------------------------
# The sandbox's network


@pytest.mark.microvm_subset
def test_network_get_set_off_on(pub, gapi, gdriver, env):
    sbx = gapi.create_sandbox(driver=gdriver, network={"internet": True, "allow": ["echo.test"]})
    got = pub("""
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
out = {"get": sbx.network.get()}
sbx.network.set(internet=True, allow=["api.test"], deny=["bad.api.test"])
out["set"] = sbx.network.get()
sbx.network.off()
out["off"] = sbx.network.get()
sbx.network.set(internet=False, allow=["echo.test"])
out["allow_only"] = sbx.network.get()
sbx.network.on()
out["on"] = sbx.network.get()
try:
    sbx.network.set(internet=True, connect=["db.test:5432"])
except Exception as e:
    out["connect"] = [e.status, e.code, e.hint]
print(json.dumps(out))
""", sbx.id)
    assert got["get"] == {"internet": True, "allow": ["echo.test"], "deny": []}
    assert got["set"] == {"internet": True, "allow": ["api.test"], "deny": ["bad.api.test"]}
    assert got["off"]["internet"] is False
    assert got["allow_only"] == {"internet": True, "allow": ["echo.test"], "deny": []}
    assert got["on"] == {"internet": True, "allow": [], "deny": []}
    assert got["connect"][:2] == [501, "not_implemented"] and "allow" in got["connect"][2], got["connect"]
    # The settings are the ones the proxy follows: off refuses, allow-only admits its host.
    gapi.put(f"/v1/sandboxes/{sbx.id}/network", json={"internet": False})
    assert curl(sbx, "http://echo.test/off")[0] == 403
    gapi.put(f"/v1/sandboxes/{sbx.id}/network", json={"internet": False, "allow": ["echo.test"]})
    assert curl(sbx, "http://echo.test/on")[0] == 200
    assert [r["path"] for r in env.echo.seen()] == ["/on"]
    assert gapi.get("/v1/sandboxes/sbx_00000000000000000000/network").status_code == 404


# ---------------------------------------------------------------------------
# Idempotency keys


def test_retried_create_makes_one_sandbox_and_reserves_once(gapi, env, gany):
    # A key with a daily limit, so that each create reserves against it.
    r = gapi.post("/v1/keys", json={"name": "idem-" + uuid.uuid4().hex[:6], "access": "full",
                                    "dailyLimitMicros": 1_000_000})
    assert r.status_code in (200, 201), r.text
    key = r.json()["key"]
    with httpx.Client(base_url=env.daemon.base_url, headers={"Authorization": f"Bearer {key}"},
                      timeout=300) as c:
        body = {"driver": gany, "timeoutSeconds": 600}
        idem = "create-" + uuid.uuid4().hex
        # Concurrent sends with one key: one sandbox, the others wait and replay its answer.
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: c.post("/v1/sandboxes", json=body, headers={"Idempotency-Key": idem}),
                                    range(3)))
        assert all(a.status_code == 201 for a in answers), [a.text for a in answers]
        ids = {a.json()["id"] for a in answers}
        assert len(ids) == 1, ids
        assert sorted(a.json().get("replayed", False) for a in answers) == [False, True, True]
        assert sum(a.headers.get("Idempotent-Replayed") == "true" for a in answers) == 2
        listed = [s for s in c.get("/v1/sandboxes").json()["sandboxes"]]
        assert [s["id"] for s in listed] == list(ids), listed
        limits = c.get("/v1/limits").json()["daily"]
        one = limits["usedMicros"]
        assert one > 0, limits
        again = c.post("/v1/sandboxes", json=body, headers={"Idempotency-Key": idem})
        assert again.status_code == 201 and again.json()["id"] in ids and again.json()["replayed"] is True
        assert c.get("/v1/limits").json()["daily"]["usedMicros"] == one
        # The key with another request: refused, and nothing made.
        other = c.post("/v1/sandboxes", json={**body, "timeoutSeconds": 601}, headers={"Idempotency-Key": idem})
        assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_conflict", other.text
        for bad in ("", "a" * 129, "bad key", "k\u00e9y", "a/b"):
            r = c.post("/v1/sandboxes", json=body, headers={"Idempotency-Key": bad.encode()})
            assert r.status_code == 400, f"{bad!r}: {r.status_code} {r.text}"
        assert len(c.get("/v1/sandboxes").json()["sandboxes"]) == 1
        # Delete, retried: one delete, the same answer twice.
        sid = ids.pop()
        dkey = "delete-" + uuid.uuid4().hex
        d1 = c.delete(f"/v1/sandboxes/{sid}", headers={"Idempotency-Key": dkey})
        d2 = c.delete(f"/v1/sandboxes/{sid}", headers={"Idempotency-Key": dkey})
        assert d1.status_code == d2.status_code == 200, (d1.text, d2.text)
        assert d2.json()["id"] == d1.json()["id"] and d2.headers.get("Idempotent-Replayed") == "true"
        # A new key is a new request: the sandbox is gone.
        assert c.delete(f"/v1/sandboxes/{sid}", headers={"Idempotency-Key": "fresh-" + dkey}).status_code == 404


def test_published_client_create_with_key_is_one_sandbox(pub, gapi, gany):
    # The published client has no driver field: the daemon's default driver serves it.
    got = pub("""
from withruntime import Sandbox
k = "pub-" + sys.argv[1]
a = Sandbox.create(idempotency_key=k, timeout_seconds=600)
b = Sandbox.create(idempotency_key=k, timeout_seconds=600)
out = {"ids": [a.id, b.id], "replayed": [a.info.get("replayed"), b.info.get("replayed")]}
out["delete"] = [rt.sandboxes.delete(a.id, idempotency_key=k + "-d")["id"],
                 rt.sandboxes.delete(a.id, idempotency_key=k + "-d")["id"]]
print(json.dumps(out))
""", uuid.uuid4().hex, timeout=600)
    assert got["ids"][0] == got["ids"][1] and got["replayed"] == [None, True], got
    assert got["delete"] == [got["ids"][0]] * 2


# ---------------------------------------------------------------------------
# The reflection test, and per-sandbox scopes


def curl(sbx, *args: str, timeout: int = 60) -> tuple[int, str, str]:
    """curl in the sandbox through the proxy (NO_PROXY dropped); (status or 0, body, stderr)."""
    cmd = ("env -u NO_PROXY -u no_proxy curl -sS --max-time 30 -o /tmp/body -w '%{http_code}' "
           + " ".join(shlex.quote(a) for a in args) + "; rc=$?; echo; echo ===; cat /tmp/body 2>/dev/null; exit $rc")
    res = sbx.exec(cmd, timeoutMs=timeout * 1000)
    head, _, body = res["stdout"].partition("\n===\n")
    code = int(head.strip()) if head.strip().isdigit() else 0
    return code, body, res["stderr"]


def headers_of(record: dict) -> dict:
    return {k.lower(): v for k, v in record["headers"]}


# Not in the microVM's default subset: the proxy decides every assertion here alike for each
# driver, and test_sandbox_secret_scope's microvm case takes a secret through the guest's
# relay and its trust store; RUNTIME_TEST_ALL=1 runs it there too (36 s under TCG).
def test_reflection(gapi, gdriver, env):
    a = gapi.put("/v1/egress-secrets/HDR_TOKEN", json={
        "value": VALUE_A, "hosts": ["api.test"], "header": "Authorization", "format": "Bearer {value}",
        "rules": [{"methods": ["GET"], "paths": ["/allowed/*", "/exact"]}]}).json()
    b = gapi.put("/v1/egress-secrets/PH_TOKEN", json={"value": VALUE_B, "hosts": ["api.test"]}).json()
    c = gapi.put("/v1/egress-secrets/ECHO_TOKEN", json={"value": VALUE_C, "hosts": ["echo.test"],
                                                          "rules": [{"paths": ["/mine"]}]}).json()
    sbx = gapi.create_sandbox(driver=gdriver, network={"internet": True, "allow": ["api.test", "echo.test"]})
    env_out = sbx.run("printf '%s\\n%s\\n%s' \"$HDR_TOKEN\" \"$PH_TOKEN\" \"$ECHO_TOKEN\"")
    assert env_out.split("\n") == [a["placeholder"], b["placeholder"], c["placeholder"]]

    # The header secret on a path its rules allow: set by the proxy, over the sandbox's own header.
    code, body, err = curl(sbx, "-H", "Authorization: Bearer forged", "https://api.test/allowed/x")
    assert code == 200, (code, body, err)
    assert headers_of(env.tls.seen()[-1])["authorization"] == f"Bearer {VALUE_A}"
    code, _, _ = curl(sbx, "https://api.test/exact?q=1")
    assert code == 200 and headers_of(env.tls.seen()[-1])["authorization"] == f"Bearer {VALUE_A}"
    seen_before = len(env.tls.seen())
    # Paths and methods its rules refuse, and paths that only look allowed: refused before upstream.
    for extra in (["https://api.test/other"], ["https://api.test/exact/more"], ["https://api.test/allowedx"],
                  ["-X", "POST", "https://api.test/allowed/x"], ["--path-as-is", "https://api.test/allowed/../other"],
                  ["https://api.test/allowed/%2e%2e/other"], ["https://api.test/allowed/x%2Fy"],
                  ["https://api.test/allowed//x"], ["https://api.test/allowed/x;y"]):
        code, body, err = curl(sbx, *extra)
        assert code == 403, (extra, code, body, err)
        assert "HDR_TOKEN" in body and VALUE_A not in body, body
    assert len(env.tls.seen()) == seen_before, env.tls.seen()[seen_before:]

    # Placeholders of api.test's secrets sent to echo.test (allowed, and a secret's own host):
    # echo.test receives the placeholders, never the values.
    env.echo.clear()
    res = sbx.exec("curl -sS --max-time 30 -H \"Authorization: Bearer $HDR_TOKEN\" -H \"X-B: $PH_TOKEN\" "
                   "-H \"X-C: $ECHO_TOKEN\" \"http://echo.test/mine?a=$HDR_TOKEN&b=$PH_TOKEN\"", timeoutMs=60_000)
    assert res["exitCode"] == 0, res
    rec = env.echo.seen()[-1]
    text = json.dumps(rec)
    assert VALUE_A not in text and VALUE_B not in text, rec
    assert a["placeholder"] in text and b["placeholder"] in text
    assert headers_of(rec)["x-c"] == VALUE_C  # echo.test's own secret, on a path its rule allows
    # echo.test's secret on a path its rule refuses: refused, nothing reaches echo.test.
    env.echo.clear()
    code, body, _ = curl(sbx, "-H", f"X-C: {c['placeholder']}", "http://echo.test/elsewhere")
    assert code == 403 and env.echo.seen() == [], (code, body)
    # And api.test never sees echo.test's value.
    curl(sbx, "-H", f"X-C: {c['placeholder']}", "https://api.test/allowed/c")
    assert all(VALUE_C not in json.dumps(r) for r in env.tls.seen())

    # The refusals are in the audit log, naming the secret, never a value.
    log = gapi.get(f"/v1/sandboxes/{sbx.id}/egress", params={"limit": 1000}).json()["entries"]
    refusals = [e for e in log if not e["allowed"] and "HDR_TOKEN" in e["reason"]]
    assert len(refusals) >= 5, log
    assert any("ECHO_TOKEN" in e["reason"] for e in log if not e["allowed"]), log
    no_value_in(json.dumps(log))
    no_value_in(env.daemon.log_path.read_text(errors="replace"))


@pytest.mark.microvm_subset
def test_sandbox_secret_scope(gapi, gdriver, env):
    a = gapi.put("/v1/egress-secrets/SCOPED_A", json={"value": VALUE_A, "hosts": ["api.test"]}).json()
    b = gapi.put("/v1/egress-secrets/SCOPED_B", json={"value": VALUE_B, "hosts": ["api.test"]}).json()
    sbx = gapi.create_sandbox(driver=gdriver, network={"internet": True, "allow": ["api.test"]},
                              secrets=["SCOPED_A"])
    assert sbx["secrets"] == ["SCOPED_A"] and gapi.sandbox(sbx.id)["secrets"] == ["SCOPED_A"]
    out = sbx.run("printf '%s|%s' \"${SCOPED_A-}\" \"${SCOPED_B-}\"")
    assert out == f"{a['placeholder']}|", out
    # A placeholder learned elsewhere is not a way in: SCOPED_B is not this sandbox's.
    code, _, _ = curl(sbx, "-H", f"X-A: {a['placeholder']}", "-H", f"X-B: {b['placeholder']}",
                      "https://api.test/scope")
    assert code == 200
    got = headers_of(env.tls.seen()[-1])
    assert got["x-a"] == VALUE_A and got["x-b"] == b["placeholder"], got
    # Fixed for the sandbox's life: a restart from its disk keeps the scope.
    r = gapi.post(f"/v1/sandboxes/{sbx.id}:restart", json={})
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    assert r.json()["secrets"] == ["SCOPED_A"]
    out = sbx.run("printf '%s|%s' \"${SCOPED_A-}\" \"${SCOPED_B-}\"")
    assert out == f"{a['placeholder']}|", out
    code, _, _ = curl(sbx, "-H", f"X-A: {a['placeholder']}", "-H", f"X-B: {b['placeholder']}",
                      "https://api.test/scope")
    assert code == 200
    got = headers_of(env.tls.seen()[-1])
    assert got["x-a"] == VALUE_A and got["x-b"] == b["placeholder"], got
    none = gapi.create_sandbox(driver=gdriver, network={"internet": True, "allow": ["api.test"]}, secrets=[])
    assert none.run("env | grep -c runtime-secret- || true").strip() == "0"
    for bad in (["1BAD"], ["A", "A"], "SCOPED_A", [1], ["x" * 65], ["A"] * 101):
        r = gapi.post("/v1/sandboxes", json={"driver": gdriver, "secrets": bad})
        assert r.status_code == 400, f"{bad!r}: {r.status_code} {r.text}"


# ---------------------------------------------------------------------------
# The CLI


def test_cli_header_format_rules_rotate(build_dir, gapi, env):
    import subprocess

    def cli(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
        e = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        e.update(env.daemon.env())
        return subprocess.run([str(build_dir / "runtime"), *args], env=e, capture_output=True, timeout=120,
                              input=input)

    r = cli("--json", "secrets", "set", "CLI_GH", "--hosts", "api.test", "--header", "Authorization",
            "--format", "Bearer {value}", "--rule", "GET,HEAD /repos/acme/*,/user", "--rule", "/v1/*",
            input=(VALUE_A + "\n").encode())
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    assert made["header"] == "Authorization" and made["format"] == "Bearer {value}"
    assert made["rules"] == [{"methods": ["GET", "HEAD"], "paths": ["/repos/acme/*", "/user"]},
                             {"paths": ["/v1/*"]}]
    no_value_in(r.stdout.decode() + r.stderr.decode())
    r = cli("secrets", "rotate", "CLI_GH", input=(VALUE_B + "\n").encode())
    assert r.returncode == 0 and b"placeholder is unchanged" in r.stdout, r.stderr
    after = gapi.get("/v1/egress-secrets/CLI_GH").json()
    assert after["placeholder"] == made["placeholder"] and after["rules"] == made["rules"]
    # Usage errors before any request; the daemon's refusals come through as they are.
    for args in (["--rule", "GET "], ["--rule", "GET /a,"], ["--format", "Bearer"], ["--format", "x{value}"],
                 ["--header", "Bad Header"]):
        r = cli("secrets", "set", "CLI_BAD", "--hosts", "api.test", *args, input=b"v\n")
        assert r.returncode == 2, (args, r.returncode, r.stderr)
    r = cli("secrets", "set", "CLI_BAD", "--hosts", "api.test", "--rule", "GET /a/../b", input=b"v\n")
    assert r.returncode == 1 and b"canonical" in r.stderr, r.stderr
    r = cli("secrets", "set", "CLI_BAD", "--hosts", "api.test", "--header", "Host", input=b"v\n")
    assert r.returncode == 1 and b"header" in r.stderr, r.stderr
    assert cli("secrets", "rotate", "NO_SUCH", input=b"v\n").returncode == 1
    assert cli("secrets", "rotate", "CLI_GH", "extra", input=b"v\n").returncode == 2
    assert gapi.get("/v1/egress-secrets/CLI_BAD").status_code == 404


# ---------------------------------------------------------------------------
# Our SDK: the same calls, the same names


def test_our_sdk_same_calls(gapi, env, gany):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
    from withruntime import Runtime, Sandbox
    from withruntime.errors import InvalidRequestError, PermissionDeniedError

    conn = {"api_key": env.daemon.api_key, "base_url": env.daemon.base_url}
    set_key = "sdk-set-" + uuid.uuid4().hex
    with Runtime(**conn) as rt:
        made = rt.secrets.set("SDK_TOKEN", value=VALUE_A, hosts=["api.test"], header="X-Api-Key",
                              rules=[{"methods": ["GET"], "paths": ["/v1/*"]}], idempotency_key=set_key)
        again = rt.secrets.set("SDK_TOKEN", value=VALUE_A, hosts=["api.test"], header="X-Api-Key",
                               rules=[{"methods": ["GET"], "paths": ["/v1/*"]}], idempotency_key=set_key)
        assert again["placeholder"] == made["placeholder"] and again.get("replayed") is True
        rt.secrets.set("SDK_OTHER", value=VALUE_B, hosts=["echo.test"])
        assert [s["name"] for s in rt.secrets.list(limit=1)] == ["SDK_OTHER"]
        assert [s["name"] for s in rt.secrets.list()] == ["SDK_OTHER", "SDK_TOKEN"]
        rotated = rt.secrets.rotate("SDK_TOKEN", VALUE_C)
        assert rotated["placeholder"] == made["placeholder"] and rotated["header"] == "X-Api-Key"
        with pytest.raises(InvalidRequestError):
            rt.secrets.set("SDK_TOKEN", value="a\tb", hosts=["api.test"])
        assert rt.me()["access"] == "full"
        assert rt.secrets.delete("SDK_OTHER")["deleted"] is True
    with Runtime(api_key=read_key(gapi), base_url=env.daemon.base_url) as reader:
        assert reader.me()["access"] == "read"
        with pytest.raises(PermissionDeniedError):
            reader.secrets.rotate("SDK_TOKEN", VALUE_A)
    a = Sandbox.create(driver=gany, secrets=["SDK_TOKEN"], idempotency_key="sdk-create-" + uuid.uuid4().hex,
                       network={"internet": True, "allow": ["echo.test"]}, **conn)
    try:
        assert gapi.sandbox(a.id)["secrets"] == ["SDK_TOKEN"]
        assert a.network.get() == {"internet": True, "allow": ["echo.test"], "deny": []}
        assert a.network.off()["internet"] is False
        assert a.network.on() == {"internet": True, "allow": [], "deny": []}
    finally:
        a.delete(idempotency_key="sdk-delete-" + uuid.uuid4().hex)
        a.close()
    no_value_in(env.daemon.log_path.read_text(errors="replace"))


def test_idempotency_records_are_per_owner_and_bounded(gapi, env):
    # Keys are per owner: another owner's same key is a request of its own.
    r = gapi.post("/v1/keys", json={"name": "other-owner", "owner": "team-" + uuid.uuid4().hex[:8]})
    assert r.status_code in (200, 201), r.text
    other = r.json()["key"]
    key = {"Idempotency-Key": "shared-" + uuid.uuid4().hex}
    body = {"value": "v", "hosts": ["api.test"]}
    a = gapi.put("/v1/egress-secrets/OWNED", json=body, headers=key)
    with httpx.Client(base_url=env.daemon.base_url, headers={"Authorization": f"Bearer {other}"}) as c:
        b = c.put("/v1/egress-secrets/OWNED", json=body, headers=key)
        assert b.status_code == 200 and "Idempotent-Replayed" not in b.headers, b.text
        assert b.json()["placeholder"] != a.json()["placeholder"]
        c.delete("/v1/egress-secrets/OWNED")
    # An owner keeps its newest 1000 keys: the oldest is forgotten past them.
    first = "bound-" + uuid.uuid4().hex
    gone = "sbx_" + "0" * 20
    assert gapi.delete(f"/v1/sandboxes/{gone}", headers={"Idempotency-Key": first}).status_code == 404
    again = gapi.delete(f"/v1/sandboxes/{gone}", headers={"Idempotency-Key": first})
    assert again.headers.get("Idempotent-Replayed") == "true"
    for i in range(1000):
        assert gapi.delete(f"/v1/sandboxes/{gone}", headers={"Idempotency-Key": f"fill-{i}-{first}"}).status_code == 404
    late = gapi.delete(f"/v1/sandboxes/{gone}", headers={"Idempotency-Key": first})
    assert late.status_code == 404 and "Idempotent-Replayed" not in late.headers
