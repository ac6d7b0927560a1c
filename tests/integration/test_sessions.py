"""Sandbox sessions (docs/sessions.md): a token a backend makes for its own frontend, which then
uses one sandbox's commands, processes, files, terminals, watches and previews and nothing else.

The published client's calls (sbx.sessions.create/list/revoke, Sandbox.from_session) drive the
real daemon; the attacks go over httpx and raw sockets: every route of the table not on the
sessions' allow-list refuses a session's token (the walk reads routes.c, so a new route is
walked too), another sandbox is a 404, a revoked, expired or malformed token and one whose key
was revoked are refused, CORS is answered for the session's origins only (preflight included),
and a revocation closes the session's open streams and WebSockets at once."""
from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from helpers import websocket_open

REPO = Path(__file__).resolve().parents[2]

PRELUDE = """
import json, sys
from withruntime import Sandbox, RuntimeAPIError
sbx = Sandbox.connect(sys.argv[1])
"""

# The routes a session may use: the sessions' allow-list as the published client reaches it.
ALLOWED = {
    ("GET", "/v1/sandboxes/{sandbox}"),
    ("POST", "/v1/sandboxes/{sandbox}:exec"),
    ("GET", "/v1/sandboxes/{sandbox}/files/content"), ("PUT", "/v1/sandboxes/{sandbox}/files/content"),
    ("GET", "/v1/sandboxes/{sandbox}/files/list"), ("GET", "/v1/sandboxes/{sandbox}/files/stat"),
    ("POST", "/v1/sandboxes/{sandbox}/files:mkdir"), ("POST", "/v1/sandboxes/{sandbox}/files:remove"),
    ("POST", "/v1/sandboxes/{sandbox}/files:rename"),
    ("GET", "/v1/sandboxes/{sandbox}/files/archive"), ("PUT", "/v1/sandboxes/{sandbox}/files/archive"),
    ("POST", "/v1/sandboxes/{sandbox}/files/archive/uploads"),
    ("PUT", "/v1/sandboxes/{sandbox}/files/archive/uploads/{upload}"),
    ("POST", "/v1/sandboxes/{sandbox}/files/archive/uploads/{upload}:commit"),
    ("POST", "/v1/sandboxes/{sandbox}/files/archive/uploads/{upload}:abort"),
    ("POST", "/v1/sandboxes/{sandbox}/uploads"), ("PUT", "/v1/sandboxes/{sandbox}/uploads/{upload}"),
    ("POST", "/v1/sandboxes/{sandbox}/uploads/{upload}:commit"),
    ("POST", "/v1/sandboxes/{sandbox}/uploads/{upload}:abort"),
    ("POST", "/v1/sandboxes/{sandbox}/files/watches"), ("GET", "/v1/sandboxes/{sandbox}/files/watches"),
    ("GET", "/v1/sandboxes/{sandbox}/files/watches/{watch}"),
    ("DELETE", "/v1/sandboxes/{sandbox}/files/watches/{watch}"),
    ("GET", "/v1/sandboxes/{sandbox}/files/watches/{watch}/events"),
    ("GET", "/v1/sandboxes/{sandbox}/processes"), ("POST", "/v1/sandboxes/{sandbox}/processes"),
    ("GET", "/v1/sandboxes/{sandbox}/processes/{process}"),
    ("GET", "/v1/sandboxes/{sandbox}/processes/{process}/output"),
    ("POST", "/v1/sandboxes/{sandbox}/processes/{process}:write"),
    ("POST", "/v1/sandboxes/{sandbox}/processes/{process}:signal"),
    ("POST", "/v1/sandboxes/{sandbox}/processes/{process}:wait"),
    ("POST", "/v1/sandboxes/{sandbox}/processes/{process}:resize"),
    ("GET", "/v1/sandboxes/{sandbox}/terminal"),
    ("GET", "/v1/sandboxes/{sandbox}/previews"), ("GET", "/v1/sandboxes/{sandbox}/previews/{port}"),
}

PARAMS = {
    "key": "key_0000000000000000", "image": "default", "secret": "s", "process": "proc_0000000000000000",
    "context": "c1", "result": "r", "upload": "upl_0000000000000000", "snapshot": "snp_" + "0" * 20,
    "host": "h1", "webhook": "wh_" + "0" * 20, "delivery": "whd_" + "0" * 20, "export": "otx_" + "0" * 20,
    "port": "8000", "digest": "0" * 64, "watch": "w1", "session": "ses_" + "0" * 20,
    "recording": "rec_" + "0" * 20, "volume": "vol_" + "0" * 20, "backup": "vb_" + "0" * 20,
}


def _routes() -> list[tuple[str, str]]:
    """Every (method, path) of the route table, read from its source."""
    text = (REPO / "src" / "daemon" / "api" / "routes.c").read_text()
    text = text.replace('SBX "', '"/v1/sandboxes/{sandbox}').replace("SBX,", '"/v1/sandboxes/{sandbox}",')
    found = set()
    for m in re.finditer(r'R[IS]?\(\s*ROUTE_\w+,\s*"[^"]+",\s*"(\w+)",\s*"([^"]+)"', text):
        found.add((m.group(1), m.group(2)))
    for m in re.finditer(r'\.method = "(\w+)",\s*\.path = "([^"]+)"', text):
        found.add((m.group(1), m.group(2)))
    assert len(found) > 100, len(found)
    return sorted(found)


def _fill(path: str, sid: str) -> str:
    def one(m):
        name = m.group(1)
        return sid if name == "sandbox" else PARAMS[name]
    return re.sub(r"\{(\w+)\}", one, path)


def _session(api, sid: str, **body) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}/sessions", json=body)
    assert r.status_code == 201, r.text
    s = r.json()
    assert s["token"].startswith("rtsess_") and s["id"].startswith("ses_")
    return s


def _as(api, token: str, **headers) -> httpx.Client:
    return httpx.Client(base_url=str(api.base_url), timeout=60,
                        headers={"Authorization": f"Bearer {token}", **headers})


@pytest.mark.microvm_subset
def test_published_client_sessions(pub, api, sandbox):
    other = api.create_sandbox(driver=sandbox.driver)
    got = pub(PRELUDE + """
made = sbx.sessions.create(ttl_seconds=600, origins=["https://app.example.com"], name="front")
s = Sandbox.from_session(made["token"], sbx.id)
out = {"made": {k: made[k] for k in ("id", "origins", "name", "active")}}
out["exec"] = s.exec("echo hi from the session").stdout
s.files.write("/workspace/s.txt", "written")
out["read"] = s.files.read("/workspace/s.txt").decode()
out["listed"] = [e["name"] for e in s.files.list("/workspace")]
w = s.files.watch("/workspace")
s.files.write("/workspace/t.txt", "t")
ev = []
for _ in range(10):
    ev += w.get_new_events(wait_ms=1000)
    if any(e["path"].endswith("t.txt") for e in ev):
        break
out["watched"] = [e["path"] for e in ev]
w.stop()
def refused(fn):
    try:
        fn()
        return "no error"
    except RuntimeAPIError as e:
        return [e.status, e.code]
out["stop"] = refused(lambda: s.stop())
out["other"] = refused(lambda: Sandbox.from_session(made["token"], sys.argv[2]).exec("true"))
out["sessions_by_session"] = refused(lambda: s.sessions.create())
out["listed_sessions"] = [x["id"] for x in sbx.sessions.list()]
out["revoked"] = sbx.sessions.revoke(made["id"])["state"]
out["after"] = refused(lambda: s.exec("true"))
try:
    Sandbox.from_session("rt_not_a_session", sbx.id)
    out["shape"] = "no error"
except Exception as e:
    out["shape"] = type(e).__name__
print(json.dumps(out))
""", sandbox.id, other.id)
    assert got["made"] == {"id": got["made"]["id"], "origins": ["https://app.example.com"], "name": "front",
                           "active": True}
    assert got["exec"].strip() == "hi from the session"
    assert got["read"] == "written"
    assert "s.txt" in got["listed"]
    assert "/workspace/t.txt" in got["watched"]
    assert got["stop"] == [403, "forbidden"]
    assert got["other"] == [404, "not_found"]
    assert got["sessions_by_session"] == [403, "forbidden"]
    assert got["made"]["id"] in got["listed_sessions"]
    assert got["revoked"] == "revoked"
    assert got["after"] == [401, "unauthorized"]
    assert got["shape"] == "RuntimeError"


def test_every_route_off_the_allow_list_refuses_a_session(api, sandbox):
    other = api.create_sandbox(driver=sandbox.driver)
    token = _session(api, sandbox.id)["token"]
    routes = _routes()
    assert ALLOWED <= set(routes), ALLOWED - set(routes)
    refused, let_in = [], []
    with _as(api, token) as c:
        for method, path in routes:
            url = _fill(path, sandbox.id)
            r = c.request(method, url, content=b"{}" if method in ("POST", "PUT") else None,
                          headers={"Content-Type": "application/json"})
            if (method, path) in ALLOWED:
                if r.status_code in (401, 403):
                    let_in.append((method, path, r.status_code, r.text[:200]))
                # The same route on another sandbox: a sandbox the session does not know.
                if "{sandbox}" in path:
                    r2 = c.request(method, _fill(path, other.id),
                                   content=b"{}" if method in ("POST", "PUT") else None)
                    assert r2.status_code == 404, (method, path, r2.text)
            elif r.status_code != 403 or r.json()["error"]["code"] != "forbidden":
                refused.append((method, path, r.status_code, r.text[:200]))
    assert not refused, "routes that did not refuse a session's token:\n" + "\n".join(map(str, refused))
    assert not let_in, "allowed routes that refused it:\n" + "\n".join(map(str, let_in))
    # The sandbox is untouched: the walk ran nothing that stops or deletes it.
    assert api.sandbox(sandbox.id)["state"] == "running"


def test_bad_tokens_and_bodies(api, daemon, sandbox):
    base = f"/v1/sandboxes/{sandbox.id}"
    s = _session(api, sandbox.id)
    for bad in ("rtsess_", "rtsess_" + "0" * 48, "rtsess_" + "g" * 48, s["token"] + "0", s["token"].upper(),
                s["token"][:-1]):
        with _as(api, bad) as c:
            r = c.post(f"{base}:exec", json={"command": "true"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", (bad, r.text)
    # Never in the query: the token goes in the Authorization header only.
    r = httpx.post(f"{api.base_url}{base}:exec", params={"token": s["token"]}, json={"command": "true"})
    assert r.status_code == 401
    for body in ({"ttlSeconds": 0}, {"ttlSeconds": 59}, {"ttlSeconds": 86401}, {"ttlSeconds": "60"},
                 {"origins": "https://a.com"}, {"origins": ["*"]}, {"origins": ["https://a.com/"]},
                 {"origins": ["HTTPS://A.COM"]}, {"origins": ["null"]}, {"origins": ["javascript:alert(1)"]},
                 {"origins": ["https://a.com/path"]}, {"origins": ["https://a.com:99999"]},
                 {"origins": [f"https://a{i}.com" for i in range(11)]}, {"origins": ["https://" + "a" * 300]},
                 {"name": "x" * 65}, {"name": "a\nb"}, {"bogus": 1}):
        r = api.post(f"{base}/sessions", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", (body, r.text)
    assert api.post("/v1/sandboxes/sbx_" + "0" * 20 + "/sessions", json={}).status_code == 404
    r = api.post(f"{base}/sessions/ses_{'0' * 20}:revoke", json={})
    assert r.status_code == 404
    # The list never shows a token, nor its hash.
    listed = api.get(f"{base}/sessions").json()["data"]
    assert listed and all("token" not in x for x in listed)
    assert s["token"] not in str(listed)


def test_cors_for_the_sessions_origins_only(api, sandbox):
    base = f"/v1/sandboxes/{sandbox.id}"
    s = _session(api, sandbox.id, origins=["https://app.example.com", "http://localhost:5173"])
    pre = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(f"{api.base_url}{base}:exec", headers=pre)
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == "https://app.example.com"
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    for origin, method, path in (("https://evil.example.com", "POST", ":exec"),
                                 ("https://app.example.com.evil.com", "POST", ":exec"),
                                 ("https://app.example.com", "DELETE", ""),          # not a session route
                                 ("https://app.example.com", "POST", ":stop")):
        r = httpx.options(f"{api.base_url}{base}{path}",
                          headers={"Origin": origin, "Access-Control-Request-Method": method})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers, (origin, path, r.text)
    with _as(api, s["token"], Origin="http://localhost:5173") as c:
        r = c.post(f"{base}:exec", json={"command": "echo cors"})
        assert r.status_code == 200 and r.json()["stdout"] == "cors\n"
        assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert r.headers["vary"] == "Origin"
    with _as(api, s["token"], Origin="https://evil.example.com") as c:
        r = c.post(f"{base}:exec", json={"command": "true"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    # A key's answers carry no CORS headers at all.
    r = api.get(base, headers={"Origin": "https://app.example.com"})
    assert "access-control-allow-origin" not in r.headers
    api.post(f"{base}/sessions/{s['id']}:revoke", json={})
    r = httpx.options(f"{api.base_url}{base}:exec", headers=pre)
    assert r.status_code == 403


def _ws(api, path: str, token: str) -> socket.socket:
    sock, head = websocket_open(str(api.base_url), path, token)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(0.5)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def test_revoke_closes_streams_and_websockets(api, sandbox):
    base = f"/v1/sandboxes/{sandbox.id}"
    s = _session(api, sandbox.id)
    term = _ws(api, f"{base}/terminal?cols=80&rows=24", s["token"])
    ended = threading.Event()

    def follow():
        with _as(api, s["token"]) as c:
            try:
                with c.stream("POST", f"{base}:exec", json={"command": "sleep 60", "stream": True}) as r:
                    assert r.status_code == 200
                    for _ in r.iter_lines():
                        pass
            except httpx.HTTPError:
                pass
        ended.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    time.sleep(1.5)
    assert not ended.is_set()
    t0 = time.monotonic()
    r = api.post(f"{base}/sessions/{s['id']}:revoke", json={})
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    assert ended.wait(5), "the session's exec stream stayed open after the revocation"
    assert _closed_within(term, 5), "the session's terminal stayed open after the revocation"
    assert time.monotonic() - t0 < 6
    with _as(api, s["token"]) as c:
        assert c.get(base).status_code == 401
    term.close()


def test_key_revocation_ends_its_sessions(api, sandbox):
    r = api.post("/v1/keys", json={"name": "backend", "access": "full"})
    assert r.status_code in (200, 201), r.text
    key = r.json()
    with httpx.Client(base_url=str(api.base_url), timeout=60,
                      headers={"Authorization": f"Bearer {key['key']}"}) as k:
        made = k.post(f"/v1/sandboxes/{sandbox.id}/sessions", json={})
        assert made.status_code == 201, made.text
    token = made.json()["token"]
    with _as(api, token) as c:
        assert c.get(f"/v1/sandboxes/{sandbox.id}").status_code == 200
        assert api.delete(f"/v1/keys/{key['id']}").status_code in (200, 204)
        r = c.get(f"/v1/sandboxes/{sandbox.id}")
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


@pytest.mark.driver_independent  # expiry is the daemon's; a minute per driver bought nothing
def test_expiry_refuses_and_closes(api, sandbox):
    """A session of a minute: its stream is closed when it expires, and its next request refused."""
    base = f"/v1/sandboxes/{sandbox.id}"
    s = _session(api, sandbox.id, ttlSeconds=60)
    term = _ws(api, f"{base}/terminal?cols=80&rows=24", s["token"])
    assert _closed_within(term, 75), "the terminal outlived its session"
    with _as(api, s["token"]) as c:
        r = c.get(base)
        assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    listed = {x["id"]: x for x in api.get(f"{base}/sessions").json()["data"]}
    assert listed[s["id"]]["state"] == "expired"
