"""Previews: a sandbox's port at a host name of its own (PORT-SANDBOX.localhost here), served by
runtimed's preview listener and relayed over the agent channel as a port forward is.

The published client's previews calls (create, list, get, rotate, delete) drive a daemon started
with --preview-listen; the requests to the previews themselves go over raw sockets and httpx, so
that every byte of the framing is the test's: a private preview needs its token (the
x-runtime-preview-token header, or the runtime_preview_token query argument, which sets a cookie
for that host only), a wrong or rotated one is refused, another sandbox's host name never reaches
this one, heads that two parsers could read two ways are refused, a slow head is cut off while
other connections go on, keep-alive, a streamed answer and a WebSocket pass through, a stopped
sandbox answers a page saying so, a TTL ends a preview. A real headless Chromium opens the
urlWithToken and is refused the plain URL; the OpenAI Agents SDK integration's
resolve_exposed_port gives an endpoint a fetch with its token reaches. embedOrigins: the
frame-ancestors policy beside the server's own, its X-Frame-Options dropped, one answer a
connection, bad origins refused, and the same call through both clients and the TypeScript SDK."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from helpers import Api, free_port, skip_unless_driver, wait_until

sys.path.insert(0, str(Path(__file__).parent))
from conftest import _finish_daemon, _start_daemon  # noqa: E402
from test_js_sdk import js_build  # noqa: E402,F401  (the TypeScript SDK, built once)

PREVIEW_DRIVERS = ["namespace", "gvisor"]

# The server inside the sandbox: a page, a streamed answer, an echo of a body (Content-Length or
# chunked), the request's headers, and a WebSocket echo, on HTTP/1.1 with keep-alive.
APP = r'''
import base64, hashlib, json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def send_body(self, body, ctype="text/plain"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/framed":
            # A server with framing rules of its own: a preview's owner may loosen them, never the
            # server widen the owner's.
            body = b"framed"
            self.send_response(200)
            self.send_header("X-Frame-Options", "DENY")
            self.send_header("Content-Security-Policy", "frame-ancestors *; default-src 'self'")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith("/headers"):
            self.send_body(json.dumps({"path": self.path, "headers": dict(self.headers.items())}).encode(),
                           "application/json")
        elif self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                part = f"part{i}\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
                time.sleep(0.4)
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/ws":
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept.decode())
            self.end_headers()
            self.wfile.flush()
            head = self.rfile.read(2)
            n = head[1] & 0x7f
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            out = b"echo:" + data
            self.wfile.write(bytes([0x81, len(out)]) + out)
            self.wfile.flush()
            self.close_connection = True
        else:
            self.send_body(b"<!doctype html><title>in the sandbox</title><p id=hello>hello from the sandbox</p>",
                           "text/html")
    def do_POST(self):
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_body(b"echo:" + body)

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


@pytest.fixture(scope="module")
def pdaemon(build_dir, image_dir, tmp_path_factory):
    """A daemon with previews on a listener of its own, at PORT-SANDBOX.localhost."""
    state = tmp_path_factory.mktemp("previews") / "state"
    port = free_port()
    d = _start_daemon(build_dir, image_dir, state, f"runtime-test-{os.getpid()}-previews",
                      extra_args=["--preview-listen", f"127.0.0.1:{port}"])
    d.preview_port = port
    yield d
    _finish_daemon(d)


@pytest.fixture
def papi(pdaemon):
    c = Api(pdaemon)
    yield c
    c.delete_all()
    c.close()


@pytest.fixture(params=PREVIEW_DRIVERS)
def pdriver(request, pdaemon) -> str:
    skip_unless_driver(pdaemon, request.param)
    return request.param


def start_app(papi: Api, sid: str, port: int = 8000) -> None:
    papi.put_file(sid, "/workspace/app.py", APP.encode()).raise_for_status()
    r = papi.post(f"/v1/sandboxes/{sid}/processes",
                  json={"command": f"exec python3 /workspace/app.py {port}"})
    assert r.status_code in (200, 201, 202), r.text
    probe = f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2).close()'"
    wait_until(lambda: papi.exec(sid, command=probe)["exitCode"] == 0, 60, 0.2, what="the app listening")


def raw(pdaemon, data: bytes, timeout: float = 15.0, read_all: bool = True) -> bytes:
    """Sends bytes to the preview listener and reads until it closes (or the timeout)."""
    s = socket.create_connection(("127.0.0.1", pdaemon.preview_port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while read_all:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def host_of(url: str) -> str:
    return urlsplit(url).netloc


def get(pdaemon, url_or_host: str, path: str = "/", headers: dict | None = None) -> httpx.Response:
    """A GET to the preview listener with the preview's Host (*.localhost resolves to loopback in
    browsers; here the connection goes to 127.0.0.1 and the Host says which preview)."""
    host = host_of(url_or_host) if "://" in url_or_host else url_or_host
    with httpx.Client(timeout=30) as c:
        return c.get(f"http://127.0.0.1:{pdaemon.preview_port}{path}", headers={"Host": host, **(headers or {})})


def name_of(sid: str, port: int = 8000, domain: str = "localhost") -> str:
    """A preview's host name: the sandbox id spelled sbx-HEX (a host name has no underscore)."""
    return f"{port}-sbx-{sid.removeprefix('sbx_')}.{domain}"


def status_of(resp: bytes) -> int:
    assert resp.startswith(b"HTTP/1.1 "), resp[:200]
    return int(resp[9:12])


def websocket_echo(pdaemon, host: str, extra: str = "") -> dict:
    """A WebSocket to /ws of the preview at host: its 101 head's headers, once a frame went
    through and its echo came back."""
    s = socket.create_connection(("127.0.0.1", pdaemon.preview_port), timeout=20)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n".encode())
    f = s.makefile("rb")
    assert b" 101 " in f.readline()
    headers = {}
    while (line := f.readline()) != b"\r\n":
        k, v = line.decode().split(":", 1)
        headers.setdefault(k.strip().lower(), []).append(v.strip())
    want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    assert headers["sec-websocket-accept"] == [want.decode()]
    mask = os.urandom(4)
    payload = b"ping"
    s.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    frame = f.read(2)
    assert frame[0] == 0x81 and f.read(frame[1]) == b"echo:ping"
    s.close()
    return headers


# ---------------------------------------------------------------------------
# The published client's calls, public and private, on every driver


def test_published_client_previews(published_client, pdaemon, papi, pdriver):
    sbx = papi.create_sandbox(driver=pdriver)
    start_app(papi, sbx.id)
    got = published_client.run_json(pdaemon, """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
private = sbx.previews.create(8000, visibility="private", ttl_seconds=3600)
listed = sbx.previews.list()
capped = sbx.previews.get(8000, ttl_seconds=120)
public = sbx.previews.create(8001, visibility="public")
rotated = sbx.previews.rotate(8000)
print(json.dumps({"private": private, "listed": listed, "capped": capped, "public": public,
                  "rotated": rotated}))
""", args=[sbx.id], timeout=300)
    p = got["private"]
    port = pdaemon.preview_port
    assert p["url"] == f"http://{name_of(sbx.id)}:{port}", p
    assert p["visibility"] == "private" and p["port"] == 8000 and p["sandboxId"] == sbx.id
    assert p["token"] and p["urlWithToken"] == f"{p['url']}/?runtime_preview_token={p['token']}"
    assert [x["port"] for x in got["listed"]] == [8000]
    assert got["listed"][0]["token"]
    assert got["capped"]["tokenExpiresAt"] < p["tokenExpiresAt"]
    assert got["public"]["visibility"] == "public" and not got["public"]["token"]
    r = got["rotated"]

    # Private: the header, the query (then its cookie), nothing, a wrong one, a rotated one.
    assert get(pdaemon, p["url"], headers={"x-runtime-preview-token": r["token"]}).status_code == 200
    assert get(pdaemon, p["url"]).status_code == 401
    bad = get(pdaemon, p["url"], headers={"x-runtime-preview-token": "1." + "0" * 64})
    assert bad.status_code == 403 and "token" in bad.text
    assert get(pdaemon, p["url"], headers={"x-runtime-preview-token": p["token"]}).status_code == 403
    assert get(pdaemon, p["url"], headers={"x-runtime-preview-token": got["capped"]["token"]}).status_code == 403
    q = get(pdaemon, p["url"], path=f"/headers?a=1&runtime_preview_token={r['token']}")
    assert q.status_code == 200, q.text
    cookie = q.headers["set-cookie"]
    assert cookie.startswith(f"runtime_preview_token={r['token']};") and "HttpOnly" in cookie
    assert "domain" not in cookie.lower(), cookie  # this host's only
    seen = q.json()
    assert seen["path"] == "/headers?a=1", seen  # the token is not passed on
    c = get(pdaemon, p["url"], path="/headers", headers={"Cookie": f"theirs=1; runtime_preview_token={r['token']}",
                                                           "x-other": "kept"})
    assert c.status_code == 200
    hdrs = {k.lower(): v for k, v in c.json()["headers"].items()}
    assert hdrs["cookie"] == "theirs=1" and hdrs["x-other"] == "kept", hdrs
    assert "authorization" not in hdrs
    with_header = get(pdaemon, p["url"], path="/headers", headers={"x-runtime-preview-token": r["token"]})
    assert "x-runtime-preview-token" not in {k.lower() for k in with_header.json()["headers"]}
    # The API key is no key here.
    assert get(pdaemon, p["url"], headers={"Authorization": f"Bearer {pdaemon.api_key}"}).status_code == 401

    # Public: no token needed. Nothing listens on 8001: a page says so.
    nothing = get(pdaemon, got["public"]["url"])
    assert nothing.status_code == 502 and "8001" in nothing.text
    papi.post(f"/v1/sandboxes/{sbx.id}/previews", json={"port": 8000, "visibility": "public"}).raise_for_status()
    assert get(pdaemon, p["url"]).status_code == 200

    # Delete: gone for the API and the listener.
    d = published_client.run_json(pdaemon, """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
print(json.dumps([sbx.previews.delete(8000), sbx.previews.delete(8001), sbx.previews.list()]))
""", args=[sbx.id], timeout=120)
    assert d[0]["deleted"] and d[2] == []
    gone = get(pdaemon, p["url"])
    assert gone.status_code == 404 and "not shared" in gone.text
    assert papi.get(f"/v1/sandboxes/{sbx.id}/previews/8000").status_code == 404


def test_our_sdk_has_the_same_calls(pdaemon, papi):
    """Our SDK's sbx.previews, blocking and asyncio, with the published client's names."""
    skip_unless_driver(pdaemon, "namespace")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
    import asyncio

    from withruntime import AsyncSandbox, Sandbox
    from withruntime.errors import InvalidRequestError, NotFoundError

    sbx_info = papi.create_sandbox(driver="namespace")
    start_app(papi, sbx_info.id)
    sbx = Sandbox.connect(sbx_info.id, api_key=pdaemon.api_key, base_url=pdaemon.base_url)
    p = sbx.previews.create(8000, visibility="private", ttl_seconds=600)
    assert p["token"] and p["expiresAt"] and p["urlWithToken"].endswith(p["token"])
    assert get(pdaemon, p["url"], headers={"x-runtime-preview-token": p["token"]}).status_code == 200
    assert [x["port"] for x in sbx.previews.list()] == [8000]
    assert sbx.previews.get(8000, ttl_seconds=60)["tokenExpiresAt"] <= p["tokenExpiresAt"]
    r = sbx.previews.rotate(8000)
    assert get(pdaemon, p["url"], headers={"x-runtime-preview-token": p["token"]}).status_code == 403
    assert get(pdaemon, p["url"], headers={"x-runtime-preview-token": r["token"]}).status_code == 200
    with pytest.raises(InvalidRequestError):
        sbx.previews.create(70000)

    async def run_async():
        a = await AsyncSandbox.connect(sbx_info.id, api_key=pdaemon.api_key, base_url=pdaemon.base_url)
        pub = await a.previews.create(8000, visibility="public")
        listed = await a.previews.list()
        gone = await a.previews.delete(8000)
        await a.close()
        return pub, listed, gone

    pub, listed, gone = asyncio.run(run_async())
    assert pub["visibility"] == "public" and pub["token"] is None and listed[0]["visibility"] == "public"
    assert gone["deleted"]
    with pytest.raises(NotFoundError):
        sbx.previews.get(8000)
    sbx.close()


# ---------------------------------------------------------------------------
# What passes through: keep-alive, a body each way, a streamed answer, a WebSocket


def test_keep_alive_streaming_and_websocket(pdaemon, papi, pdriver):
    sbx = papi.create_sandbox(driver=pdriver)
    start_app(papi, sbx.id)
    pv = papi.post(f"/v1/sandboxes/{sbx.id}/previews", json={"port": 8000}).json()
    host, tok = host_of(pv["url"]), pv["token"]
    s = socket.create_connection(("127.0.0.1", pdaemon.preview_port), timeout=20)
    f = s.makefile("rb")

    def answer() -> tuple[int, dict, bytes]:
        status = int(f.readline().split()[1])
        headers = {}
        while (line := f.readline()) not in (b"\r\n", b""):
            k, v = line.decode().split(":", 1)
            headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while (size := int(f.readline().split(b";")[0], 16)):
                body += f.read(size)
                f.readline()
            f.readline()
        else:
            body = f.read(int(headers.get("content-length", "0")))
        return status, headers, body

    # Three requests on one connection: the token on the first only, a body of each framing.
    s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nx-runtime-preview-token: {tok}\r\n\r\n".encode())
    assert answer()[0] == 200
    s.sendall(f"POST /echo HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\n\r\nhello".encode())
    assert answer()[2] == b"echo:hello"
    s.sendall(f"POST /echo HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
              "3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n".encode())
    assert answer()[2] == b"echo:abcde"
    # A streamed answer arrives as it is made, not at its end.
    t0 = time.monotonic()
    s.sendall(f"GET /stream HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    status = int(f.readline().split()[1])
    while f.readline() != b"\r\n":
        pass
    first = f.readline(), f.readline()
    t_first = time.monotonic() - t0
    assert f.readline() == b"\r\n"
    assert status == 200 and first[1] == b"part0\n"
    rest = b""
    while (size := int(f.readline(), 16)):
        rest += f.read(size)
        f.readline()
    f.readline()
    assert rest == b"part1\npart2\n" and t_first < time.monotonic() - t0 - 0.5
    # A later request naming another host ends the connection: it serves one preview.
    s.sendall(f"GET / HTTP/1.1\r\nHost: 8000-sbx_00000000000000000000.localhost\r\n\r\n".encode())
    assert f.read() == b""
    s.close()

    # HTTP/1.0, and a client that half-closes after its request: each gets its whole answer.
    for head, half in ((f"GET / HTTP/1.0\r\nHost: {host}\r\n", False),
                       (f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n", True)):
        s = socket.create_connection(("127.0.0.1", pdaemon.preview_port), timeout=20)
        s.sendall(f"{head}x-runtime-preview-token: {tok}\r\n\r\n".encode())
        if half:
            s.shutdown(socket.SHUT_WR)
        resp = b""
        while chunk := s.recv(65536):
            resp += chunk
        s.close()
        assert status_of(resp) == 200 and resp.endswith(b"hello from the sandbox</p>"), resp[-200:]

    # A WebSocket through the preview.
    websocket_echo(pdaemon, host, f"Cookie: runtime_preview_token={tok}\r\n")


# ---------------------------------------------------------------------------
# Bad input: each gets a clear answer, and none affects another sandbox


def test_bad_input(pdaemon, papi):
    skip_unless_driver(pdaemon, "namespace")
    a = papi.create_sandbox(driver="namespace")
    b = papi.create_sandbox(driver="namespace")
    start_app(papi, a.id)
    start_app(papi, b.id)
    pa = papi.post(f"/v1/sandboxes/{a.id}/previews", json={"port": 8000}).json()
    papi.post(f"/v1/sandboxes/{b.id}/previews", json={"port": 8000}).raise_for_status()
    ha = host_of(pa["url"])
    # B's name as the URLs spell it, and with the id's own underscore (taken too).
    hb = f"{name_of(b.id)}:{pdaemon.preview_port}"
    assert get(pdaemon, f"8000-{b.id}.localhost", headers={"x-runtime-preview-token": papi.get(
        f"/v1/sandboxes/{b.id}/previews/8000").json()["token"]}).status_code == 200
    ok_head = lambda host: f"GET / HTTP/1.1\r\nHost: {host}\r\nx-runtime-preview-token: {pa['token']}\r\n"

    # A's token on B's host name: refused; a host that names no preview; a port out of range.
    assert get(pdaemon, hb, headers={"x-runtime-preview-token": pa["token"]}).status_code == 403
    assert get(pdaemon, f"8000-sbx_00000000000000000000.localhost").status_code == 404
    assert get(pdaemon, f"9000-{a.id}.localhost").status_code == 404
    assert get(pdaemon, "localhost").status_code == 404
    assert get(pdaemon, f"8000-{a.id}.example.com").status_code == 404
    far = get(pdaemon, f"70000-{a.id}.localhost")
    assert far.status_code == 400 and "1 to 65535" in far.text
    assert get(pdaemon, f"0-{a.id}.localhost").status_code == 400
    # The API's side: a port out of range, another owner's key.
    r = papi.post(f"/v1/sandboxes/{a.id}/previews", json={"port": 70000})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert papi.get(f"/v1/sandboxes/{a.id}/previews/0").status_code == 400
    assert papi.post(f"/v1/sandboxes/{a.id}/previews", json={"port": 8000, "nope": 1}).status_code == 400
    k = papi.post("/v1/keys", json={"name": "previews-other", "owner": "previews-other"})
    assert k.status_code == 201, k.text
    with Api(pdaemon, key=k.json()["key"]) as other:
        for resp in (other.get(f"/v1/sandboxes/{a.id}/previews"), other.get(f"/v1/sandboxes/{a.id}/previews/8000"),
                     other.post(f"/v1/sandboxes/{a.id}/previews", json={"port": 8000}),
                     other.post(f"/v1/sandboxes/{a.id}/previews/8000:rotate"),
                     other.delete(f"/v1/sandboxes/{a.id}/previews/8000")):
            assert resp.status_code == 404, resp.text

    # Smuggling: heads that two parsers could read two ways are refused before anything is relayed.
    smuggles = {
        "CL and TE": ok_head(ha) + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "two CL": ok_head(ha) + "Content-Length: 0\r\nContent-Length: 5\r\n\r\nhello",
        "CL list": ok_head(ha) + "Content-Length: 5, 5\r\n\r\nhello",
        "obs-fold": ok_head(ha) + "X-A: 1\r\n x-folded: 2\r\n\r\n",
        "space before colon": ok_head(ha) + "Content-Length : 5\r\n\r\nhello",
        "bare LF": ok_head(ha) + "X-A: 1\n\r\n",
        "two Hosts": ok_head(ha) + f"Host: {hb}\r\n\r\n",
        "no Host": f"GET / HTTP/1.1\r\nx-runtime-preview-token: {pa['token']}\r\n\r\n",
        "absolute form": f"GET http://{hb}/ HTTP/1.1\r\nHost: {ha}\r\n\r\n",
        "TE twice": ok_head(ha) + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    }
    for what, head in smuggles.items():
        resp = raw(pdaemon, head.encode())
        assert status_of(resp) == 400, (what, resp[:300])
        assert b"connection: close" in resp.lower(), what
    for what, head in {"TE gzip": ok_head(ha) + "Transfer-Encoding: gzip, chunked\r\n\r\n",
                       "HTTP/2 line": f"GET / HTTP/2.0\r\nHost: {ha}\r\n\r\n"}.items():
        assert status_of(raw(pdaemon, head.encode())) in (501, 505), what
    # A chunked body whose framing breaks, after a good head: the connection just ends.
    resp = raw(pdaemon, (ok_head(ha) + "Transfer-Encoding: chunked\r\n\r\nzz\r\n").encode())
    assert b"echo" not in resp
    # An over-long head.
    big = ok_head(ha) + "".join(f"X-{i}: {'a' * 200}\r\n" for i in range(90)) + "\r\n"
    assert status_of(raw(pdaemon, big.encode())) == 431

    # A slowloris: a head that never ends is cut off after 10 s, while others are served.
    slow = socket.create_connection(("127.0.0.1", pdaemon.preview_port), timeout=30)
    slow.sendall(ok_head(ha).encode())
    t0 = time.monotonic()
    for _ in range(3):
        assert get(pdaemon, hb, headers={"x-runtime-preview-token":
                                         papi.get(f"/v1/sandboxes/{b.id}/previews/8000").json()["token"]}
                   ).status_code == 200
        slow.sendall(b"X-Slow: 1\r\n")
        time.sleep(1)
    got = slow.recv(4096)
    assert status_of(got) == 408 and 8 < time.monotonic() - t0 < 20
    slow.close()
    # One address holds at most 64 connections: the next gets a page saying so, and once they
    # close, a request goes through again.
    held = [socket.create_connection(("127.0.0.1", pdaemon.preview_port), timeout=15) for _ in range(64)]
    time.sleep(0.5)
    over = raw(pdaemon, ok_head(ha).encode() + b"\r\n")
    assert status_of(over) == 503 and b"64" in over, over[:300]
    for h in held:
        h.close()
    time.sleep(0.5)
    assert get(pdaemon, ha, headers={"x-runtime-preview-token": pa["token"]}).status_code == 200

    # B was never touched by any of it.
    assert papi.exec(b.id, command="true")["exitCode"] == 0


# ---------------------------------------------------------------------------
# Lifecycles: a stopped sandbox, a paused one, a TTL, a deleted sandbox


def test_stopped_paused_ttl_and_deleted(pdaemon, papi):
    skip_unless_driver(pdaemon, "namespace")
    sbx = papi.create_sandbox(driver="namespace")
    start_app(papi, sbx.id)
    pv = papi.post(f"/v1/sandboxes/{sbx.id}/previews", json={"port": 8000, "visibility": "public"}).json()
    short = papi.post(f"/v1/sandboxes/{sbx.id}/previews", json={"port": 8000 + 1, "ttlSeconds": 2}).json()
    assert short["expiresAt"] and short["tokenExpiresAt"] == short["expiresAt"]
    assert get(pdaemon, pv["url"]).status_code == 200
    time.sleep(3)
    assert get(pdaemon, short["url"], headers={"x-runtime-preview-token": short["token"]}).status_code == 404
    assert [p["port"] for p in papi.get(f"/v1/sandboxes/{sbx.id}/previews").json()["data"]] == [8000]
    # Paused with autoWake: the request wakes it (the app was paused with it and goes on).
    assert papi.post(f"/v1/sandboxes/{sbx.id}:pause").status_code == 200
    woke = get(pdaemon, pv["url"])
    assert woke.status_code == 200 and "hello from the sandbox" in woke.text
    # Stopped: a page that says so.
    assert papi.post(f"/v1/sandboxes/{sbx.id}:stop").status_code == 200
    page = get(pdaemon, pv["url"])
    assert page.status_code == 503 and "not running" in page.text and sbx.id in page.text
    assert page.headers["content-type"].startswith("text/html")
    # Deleted: its previews go with it.
    assert papi.delete(f"/v1/sandboxes/{sbx.id}").status_code == 200
    assert get(pdaemon, pv["url"]).status_code == 404


# ---------------------------------------------------------------------------
# A real browser: the urlWithToken opens, the plain URL is refused


def test_headless_chromium_opens_url_with_token(pdaemon, papi, tmp_path):
    from helpers import browser
    why = browser.skip_reason()
    if why:
        pytest.skip(why)
    skip_unless_driver(pdaemon, "namespace")
    sbx = papi.create_sandbox(driver="namespace")
    papi.put_file(sbx.id, "/workspace/www/index.html",
                  b"<!doctype html><title>served</title><p id=hello>hello from http.server</p>").raise_for_status()
    r = papi.post(f"/v1/sandboxes/{sbx.id}/processes",
                  json={"command": "cd /workspace/www && exec python3 -m http.server 8000 --bind 127.0.0.1"})
    assert r.status_code in (200, 201, 202), r.text
    probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 2).close()'"
    wait_until(lambda: papi.exec(sbx.id, command=probe)["exitCode"] == 0, 60, 0.2, what="http.server")
    pv = papi.post(f"/v1/sandboxes/{sbx.id}/previews", json={"port": 8000, "visibility": "private"}).json()
    drv = browser.start(tmp_path / "profile")
    try:
        drv.get(pv["url"] + "/")
        assert "Token needed" in drv.page_source
        drv.get(pv["urlWithToken"])
        assert "hello from http.server" in drv.page_source
        # The cookie now lets this host in without the token in the URL...
        drv.get(pv["url"] + "/index.html")
        assert "hello from http.server" in drv.page_source
        # ...and no other preview's host.
        drv.delete_all_cookies()
        drv.get(pv["url"] + "/")
        assert "Token needed" in drv.page_source
    finally:
        drv.quit()


# ---------------------------------------------------------------------------
# The OpenAI Agents SDK integration: resolve_exposed_port


AGENTS_VENV = Path(os.environ.get("RUNTIME_TEST_AGENTS_CLIENT_DIR", "/var/cache/runtime/published-client-agents"))


def agents_venv() -> Path:
    """The published client with its openai-agents extra, in a venv of its own (made once)."""
    from helpers.published import PUBLISHED_VERSION
    want = f"withruntime[openai-agents]=={PUBLISHED_VERSION}"
    marker = AGENTS_VENV / "runtime-conformance.json"
    if marker.exists() and json.loads(marker.read_text()).get("requirements") == [want]:
        return AGENTS_VENV
    work = AGENTS_VENV.with_name(AGENTS_VENV.name + f".building-{os.getpid()}")
    subprocess.run([sys.executable, "-m", "venv", str(work)], check=True, capture_output=True, timeout=300)
    pip = subprocess.run([str(work / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          want], capture_output=True, text=True, timeout=900)
    if pip.returncode != 0:
        subprocess.run(["rm", "-rf", str(work)])
        pytest.skip(f"the openai-agents extra of the published client cannot be installed here: {pip.stderr[-800:]}")
    (work / "runtime-conformance.json").write_text(json.dumps({"requirements": [want]}))
    subprocess.run(["rm", "-rf", str(AGENTS_VENV)])
    os.rename(work, AGENTS_VENV)
    return AGENTS_VENV


def test_openai_agents_resolve_exposed_port(pdaemon, papi):
    skip_unless_driver(pdaemon, "namespace")
    venv = agents_venv()
    sbx = papi.create_sandbox(driver="namespace")
    start_app(papi, sbx.id)
    script = """
import asyncio, json, sys, uuid
from agents.sandbox.manifest import Manifest
from agents.sandbox.snapshot import resolve_snapshot
from withruntime.openai_agents import RuntimeCloudSandboxClient, RuntimeCloudSandboxSessionState

async def main():
    client = RuntimeCloudSandboxClient()
    sid = uuid.uuid4()
    state = RuntimeCloudSandboxSessionState(session_id=sid, manifest=Manifest(),
                                            snapshot=resolve_snapshot(None, str(sid)),
                                            sandbox_id=sys.argv[1], exposed_ports=(8000,))
    session = await client.resume(state)
    ep = await session.resolve_exposed_port(8000)
    print(json.dumps({"host": ep.host, "port": ep.port, "tls": ep.tls, "query": ep.query}))

asyncio.run(main())
"""
    env = {"PATH": os.environ["PATH"], "RUNTIME_API_URL": pdaemon.base_url, "RUNTIME_API_KEY": pdaemon.api_key}
    r = subprocess.run([str(venv / "bin" / "python"), "-I", "-c", script, sbx.id], capture_output=True, text=True,
                       timeout=300, cwd="/", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ep = json.loads(r.stdout.strip().splitlines()[-1])
    assert ep["host"] == name_of(sbx.id) and ep["port"] == pdaemon.preview_port and not ep["tls"]
    assert ep["query"].startswith("runtime_preview_token=")
    ok = get(pdaemon, f"{ep['host']}:{ep['port']}", path="/?" + ep["query"])
    assert ok.status_code == 200 and "hello from the sandbox" in ok.text
    assert get(pdaemon, f"{ep['host']}:{ep['port']}").status_code == 401


# ---------------------------------------------------------------------------
# TLS on the listener, with the operator's certificate


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (args, r.stderr[-2000:])


def test_tls_with_the_operators_certificate(build_dir, image_dir, tmp_path):
    """--preview-tls-dir: a wildcard certificate of a CA of the test's own for *.preview.localhost;
    the URL says https and the client verifies the name; plain HTTP on the port gets nothing; a key
    readable by others stops the daemon at its start."""
    d = tmp_path / "tls"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-subj", "/CN=runtime-test-preview-ca", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=preview",
             "-keyout", "key.pem", "-out", "host.csr", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:*.preview.localhost\n")
    _openssl("x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
             "-extfile", "san.ext", "-out", "cert.pem", cwd=d)
    os.chmod(d / "key.pem", 0o644)
    port = free_port()
    args = ["--preview-listen", f"127.0.0.1:{port}", "--preview-domain", "preview.localhost", "--preview-tls-dir",
            str(d)]
    from helpers import Daemon, DaemonError
    refused = Daemon(build_dir, image_dir, tmp_path / "refused", f"runtime-test-{os.getpid()}-ptls-bad",
                     extra_args=args)
    with pytest.raises(DaemonError, match="key.pem"):
        refused.start(timeout=30)
    os.chmod(d / "key.pem", 0o600)
    t = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-ptls", extra_args=args)
    try:
        skip_unless_driver(t, "namespace")
        with Api(t) as api:
            sbx = api.create_sandbox(driver="namespace")
            start_app(api, sbx.id)
            pv = api.post(f"/v1/sandboxes/{sbx.id}/previews", json={"port": 8000}).json()
            name = name_of(sbx.id, domain="preview.localhost")
            assert pv["url"] == f"https://{name}:{port}", pv
            ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
            raw_sock = socket.create_connection(("127.0.0.1", port), timeout=20)
            s = ctx.wrap_socket(raw_sock, server_hostname=name)  # the name is checked here
            s.sendall(f"GET / HTTP/1.1\r\nHost: {name}:{port}\r\nx-runtime-preview-token: {pv['token']}\r\n"
                      "Connection: close\r\n\r\n".encode())
            resp = b""
            while chunk := s.recv(65536):
                resp += chunk
            s.close()
            assert status_of(resp) == 200 and b"hello from the sandbox" in resp
            # The query form sets a Secure cookie over TLS.
            q = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=20), server_hostname=name)
            q.sendall(f"GET /?runtime_preview_token={pv['token']} HTTP/1.1\r\nHost: {name}\r\n"
                      "Connection: close\r\n\r\n".encode())
            resp = b""
            while chunk := q.recv(65536):
                resp += chunk
            q.close()
            assert b"; Secure" in resp.split(b"\r\n\r\n")[0], resp[:600]
            # Plain HTTP on the TLS port: closed without an answer.
            p = socket.create_connection(("127.0.0.1", port), timeout=15)
            p.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
            try:
                got = p.recv(4096)
            except ConnectionResetError:
                got = b""
            p.close()
            assert not got.startswith(b"HTTP/"), got[:200]
    finally:
        _finish_daemon(t)


# ---------------------------------------------------------------------------
# embedOrigins: the sites that may show a preview in a frame


def frame_policies(resp: httpx.Response) -> list[str]:
    return resp.headers.get_list("content-security-policy")


def test_embed_origins(published_client, pdaemon, papi, pdriver):
    """A preview with embedOrigins is answered with frame-ancestors naming them beside the
    server's own policy, without the server's X-Frame-Options, one answer a connection; an empty
    list is today's behaviour (the server's headers unchanged)."""
    sbx = papi.create_sandbox(driver=pdriver)
    start_app(papi, sbx.id)
    got = published_client.run_json(pdaemon, """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
made = sbx.previews.create(8000, visibility="public",
                           embed_origins=["https://app.example.com", "https://*.example.org:8443"])
kept = sbx.previews.create(8000, visibility="public")
print(json.dumps({"made": made, "kept": kept, "got": sbx.previews.get(8000), "listed": sbx.previews.list()}))
""", args=[sbx.id], timeout=300)
    want = ["https://app.example.com", "https://*.example.org:8443"]
    assert got["made"]["embedOrigins"] == want, got
    assert got["kept"]["embedOrigins"] == want  # left out: the shared port keeps its list
    assert got["got"]["embedOrigins"] == want and got["listed"][0]["embedOrigins"] == want
    url = got["made"]["url"]
    policy = "frame-ancestors 'self' https://app.example.com https://*.example.org:8443"

    plain = get(pdaemon, url)
    assert plain.status_code == 200 and "hello from the sandbox" in plain.text
    assert frame_policies(plain) == [policy], plain.headers
    assert "x-frame-options" not in plain.headers
    assert plain.headers["connection"] == "close"
    # The server's own policy stays beside the owner's: a browser enforces both, so its
    # frame-ancestors * widens nothing; its X-Frame-Options goes.
    framed = get(pdaemon, url, path="/framed")
    assert framed.status_code == 200 and framed.text == "framed"
    assert sorted(frame_policies(framed)) == sorted([policy, "frame-ancestors *; default-src 'self'"])
    assert "x-frame-options" not in framed.headers
    # One answer a connection: a kept-alive request's answer is followed by the close.
    host = host_of(url)
    two = raw(pdaemon, f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\nGET /framed HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert status_of(two) == 200 and two.count(b"HTTP/1.1 ") == 1, two[:400]
    assert f"Content-Security-Policy: {policy}\r\n".encode() in two
    # The server saw Connection: close, whatever the client asked.
    seen = get(pdaemon, url, path="/headers", headers={"Connection": "keep-alive"}).json()["headers"]
    assert {k.lower(): v for k, v in seen.items()}["connection"] == "close"

    # A WebSocket: its 101 head carries the policy, and it runs on as bytes.
    ws = websocket_echo(pdaemon, host)
    assert ws["content-security-policy"] == [policy] and ws["connection"] == ["Upgrade"], ws
    # A server that answers no HTTP head: a page says so (the head is what gets rewritten).
    junk = "import socket\nl = socket.create_server(('127.0.0.1', 8002))\nwhile True:\n" \
           "    c, _ = l.accept(); c.recv(65536); c.sendall(b'not http at all\\n' * 2000); c.close()\n"
    papi.put_file(sbx.id, "/workspace/junk.py", junk.encode()).raise_for_status()
    papi.post(f"/v1/sandboxes/{sbx.id}/processes", json={"command": "exec python3 /workspace/junk.py"})
    probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8002), 2).close()'"
    wait_until(lambda: papi.exec(sbx.id, command=probe)["exitCode"] == 0, 60, 0.2, what="the junk server")
    jp = papi.post(f"/v1/sandboxes/{sbx.id}/previews",
                   json={"port": 8002, "visibility": "public", "embedOrigins": ["https://app.example.com"]}).json()
    bad = get(pdaemon, jp["url"])
    assert bad.status_code == 502 and "no HTTP/1.1 head" in bad.text, bad.text[:300]

    # A private one: the token's cookie and the policy on the same answer.
    priv = papi.post(f"/v1/sandboxes/{sbx.id}/previews",
                     json={"port": 8000, "visibility": "private", "embedOrigins": ["http://localhost:3000"]}).json()
    assert priv["embedOrigins"] == ["http://localhost:3000"]
    q = get(pdaemon, priv["url"], path=f"/headers?runtime_preview_token={priv['token']}")
    assert q.status_code == 200 and q.json()["path"] == "/headers"
    assert q.headers["set-cookie"].startswith("runtime_preview_token=")
    assert frame_policies(q) == ["frame-ancestors 'self' http://localhost:3000"]
    assert get(pdaemon, priv["url"]).status_code == 401

    # [] is any site: the server's answers pass unchanged, kept-alive as before.
    anyone = papi.post(f"/v1/sandboxes/{sbx.id}/previews",
                       json={"port": 8000, "visibility": "public", "embedOrigins": []}).json()
    assert anyone["embedOrigins"] == []
    page = get(pdaemon, url)
    assert frame_policies(page) == [] and "x-frame-options" not in page.headers
    framed = get(pdaemon, url, path="/framed")
    assert framed.headers["x-frame-options"] == "DENY"
    assert frame_policies(framed) == ["frame-ancestors *; default-src 'self'"]
    two = raw(pdaemon, f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\nGET /framed HTTP/1.1\r\nHost: {host}\r\n"
                       f"Connection: close\r\n\r\n".encode())
    assert two.count(b"HTTP/1.1 200") == 2, two[:600]


def test_embed_origins_refused_and_sdks(pdaemon, papi, js_build):
    """Bad origins are refused 400 naming the field, and leave the list as it was; our Python
    SDK (blocking and asyncio) and the TypeScript SDK send embedOrigins by the published
    client's names."""
    skip_unless_driver(pdaemon, "namespace")
    sbx_info = papi.create_sandbox(driver="namespace")
    sid = sbx_info.id
    base = f"/v1/sandboxes/{sid}/previews"
    papi.post(base, json={"port": 8000, "embedOrigins": ["https://app.example.com"]}).raise_for_status()
    bad = ["*", "null", "javascript:alert(1)", "https://app.example.com/", "https://app.example.com/path",
           "https://a.example.com https://evil.com", "https://a.example.com,https://evil.com",
           "https://a.example.com;script-src *", "https://a.example.com\r\nX-Evil: 1", "https://*.com",
           "ftp://example.com", "HTTPS://APP.EXAMPLE.COM", "https://app.example.com:99999", "'self'",
           "https://" + "a" * 260 + ".com", "", "https://*.*.example.com"]
    for origin in bad:
        r = papi.post(base, json={"port": 8000, "embedOrigins": ["https://ok.example.com", origin]})
        assert r.status_code == 400, (origin, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_request" and "embedOrigins[1]" in err["message"], (origin, err)
    for body in ({"embedOrigins": "https://app.example.com"}, {"embedOrigins": [1]},
                 {"embedOrigins": [f"https://s{i}.example.com" for i in range(17)]}, {"embedOrigins": {}}):
        r = papi.post(base, json={"port": 8000, **body})
        assert r.status_code == 400 and "embedOrigins" in r.json()["error"]["message"], (body, r.text)
    assert papi.get(f"{base}/8000").json()["embedOrigins"] == ["https://app.example.com"]
    sixteen = [f"https://s{i}.example.com" for i in range(16)]
    assert papi.post(base, json={"port": 8000, "embedOrigins": sixteen}).json()["embedOrigins"] == sixteen

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
    import asyncio

    from withruntime import AsyncSandbox, Sandbox
    from withruntime.errors import InvalidRequestError

    sbx = Sandbox.connect(sid, api_key=pdaemon.api_key, base_url=pdaemon.base_url)
    assert sbx.previews.create(8000, embed_origins=["https://ours.example.com"])["embedOrigins"] == [
        "https://ours.example.com"]
    with pytest.raises(InvalidRequestError):
        sbx.previews.create(8000, embed_origins=["*"])
    sbx.close()

    async def run_async():
        a = await AsyncSandbox.connect(sid, api_key=pdaemon.api_key, base_url=pdaemon.base_url)
        p = await a.previews.create(8000, embed_origins=["https://*.ours.example.com"])
        await a.close()
        return p

    assert asyncio.run(run_async())["embedOrigins"] == ["https://*.ours.example.com"]

    script = js_build / "embed-check.mjs"
    script.write_text("""
import { Sandbox } from "./dist/index.js";
const sbx = await Sandbox.connect(process.argv[2], { apiKey: process.env.KEY, baseUrl: process.env.URL });
const made = await sbx.previews.create(8000, { embedOrigins: ["https://ts.example.com"] });
let refused = "";
try { await sbx.previews.create(8000, { embedOrigins: ["null"] }); } catch (e) { refused = e.code ?? String(e); }
console.log(JSON.stringify({ made: made.embedOrigins, got: (await sbx.previews.get(8000)).embedOrigins, refused }));
""")
    try:
        out = subprocess.run(["node", str(script), sid], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "KEY": pdaemon.api_key, "URL": pdaemon.base_url})
    finally:
        script.unlink()
    assert out.returncode == 0, out.stderr
    ts = json.loads(out.stdout.strip().splitlines()[-1])
    assert ts == {"made": ["https://ts.example.com"], "got": ["https://ts.example.com"],
                  "refused": "invalid_request"}, ts


def test_embed_origins_cookie_behind_https(build_dir, image_dir, tmp_path):
    """Behind HTTPS (--preview-https), a private preview that other sites may frame sets its
    token's cookie SameSite=None and Partitioned, which a third-party frame sends; one no other
    site frames keeps SameSite=Lax."""
    port = free_port()
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-embed-https",
                      extra_args=["--preview-listen", f"127.0.0.1:{port}", "--preview-https"])
    d.preview_port = port
    api = Api(d)
    try:
        skip_unless_driver(d, "namespace")
        sbx = api.create_sandbox(driver="namespace")
        start_app(api, sbx.id)
        base = f"/v1/sandboxes/{sbx.id}/previews"
        p = api.post(base, json={"port": 8000, "embedOrigins": ["https://app.example.com"]}).json()
        assert p["url"].startswith("https://")
        q = get(d, p["url"], path=f"/?runtime_preview_token={p['token']}")
        assert q.status_code == 200
        cookie = q.headers["set-cookie"]
        assert "SameSite=None; Secure; Partitioned" in cookie and "HttpOnly" in cookie, cookie
        assert frame_policies(q) == ["frame-ancestors 'self' https://app.example.com"]
        p = api.post(base, json={"port": 8000, "embedOrigins": []}).json()
        cookie = get(d, p["url"], path=f"/?runtime_preview_token={p['token']}").headers["set-cookie"]
        assert "SameSite=Lax; Secure" in cookie and "Partitioned" not in cookie, cookie
    finally:
        api.delete_all()
        api.close()
        _finish_daemon(d)
