"""Previews across a fleet (docs/previews.md, "A fleet"): two runtimed on one PostgreSQL, each with
a preview listener of its own and the fleet's secret. A preview request that reaches the host
which does not run the sandbox is relayed to the one that does: its token checked where it lands
and again by the owner, keep-alive, a streamed answer, a request body, a WebSocket echo and
embedOrigins' policy all through the other host; the urlWithToken's cookie works at either host.
An upgraded connection carries megabytes both ways at once through the other host.
The URLs built on previews (the browser's cdpUrl, the desktop's streamUrl and its WebSocket) and
the interpreter's JavaScript context work through the other host too, and so does a create sent to
one host and placed on the other, whose warm pool kernel answers its first cell.
A client that claims to be a host (the hop's headers on the preview listener, or the relay route
called without the secret) gains nothing; an owner host that is unknown or does not answer is a
page at once, not a hang."""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, free_port, vnc_greeting, wait_until

sys.path.insert(0, str(Path(__file__).parent))
from test_previews import APP, name_of, start_app, websocket_echo  # noqa: E402

pytestmark = pytest.mark.driver_independent

SECRET = "fleet-" + uuid.uuid4().hex
RELAY_MAX = 16


@pytest.fixture(scope="module")
def fleet(build_dir, image_dir, tmp_path_factory, postgres):
    """Hosts a and b, each with a preview listener, sharing a database and a fleet secret."""
    tmp = tmp_path_factory.mktemp("fleetprev")
    db = f"rt_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {db}")
    secret = tmp / "fleet.secret"
    secret.write_text(SECRET + "\n")
    os.chmod(secret, 0o600)
    hosts = []
    try:
        for name in ("a", "b"):
            if hosts:
                (tmp / name).mkdir()
                for f in ("admin.key", "secrets.key"):
                    (tmp / name / f).write_text((hosts[0].state_dir / f).read_text())
                    os.chmod(tmp / name / f, 0o600)
            port = free_port()
            h = _start_daemon(build_dir, image_dir, tmp / name, f"runtime-test-{os.getpid()}-fprev{name}",
                              extra_args=["--database", postgres.url(db), "--fleet-secret-file", str(secret),
                                          "--host-id", f"prev-{name}", "--preview-listen", f"127.0.0.1:{port}",
                                          # Host b relays at most RELAY_MAX connections to a (256 by
                                          # default), so its bound is reached in a few.
                                          *(["--preview-relay-max-connections", str(RELAY_MAX)] if name == "b" else []),
                                          # Host a keeps a sandbox with its kernel started ahead.
                                          *(["--warm-pool", "namespace:default=1"] if name == "a" else [])])
            h.preview_port = port
            hosts.append(h)
        for h in hosts:
            with Api(h) as c:
                wait_until(lambda: len([x for x in c.get("/v1/hosts").json()["hosts"] if x["state"] == "live"]) == 2,
                           20, what="both hosts live")
        yield hosts[0], hosts[1], postgres, db
    finally:
        for h in reversed(hosts):
            _finish_daemon(h)


@contextlib.contextmanager
def b_drained(fleet):
    """Host b drains for a while, so that every create is placed on host a (each host told, so
    that its own view of the hosts has it at once)."""
    a, b, _, _ = fleet
    for h in (b, a):
        with Api(h, key=a.api_key) as c:
            c.post("/v1/hosts/prev-b:drain", json={}).raise_for_status()
    try:
        yield
    finally:
        for h in (a, b):
            with Api(h, key=a.api_key) as c:
                c.post("/v1/hosts/prev-b:undrain", json={}).raise_for_status()


def home(fleet, sid: str) -> str:
    _, _, pg, db = fleet
    return pg.psql(f"SELECT host_id FROM sandboxes WHERE id = '{sid}'", db).strip()


def create_on_a(fleet, c: Api, **create) -> str:
    """A sandbox host a runs."""
    with b_drained(fleet):
        sid = c.create_sandbox(driver="namespace", timeoutSeconds=600, **create).id
    assert home(fleet, sid) == "prev-a"
    return sid


@pytest.fixture(scope="module")
def on_a(fleet):
    """A sandbox host a runs, with the test's server on 8000."""
    with Api(fleet[0]) as c:
        sid = create_on_a(fleet, c)
        start_app(c, sid, 8000)
        yield sid
        c.delete(f"/v1/sandboxes/{sid}")


def get_at(host, name: str, path: str = "/", headers: dict | None = None) -> httpx.Response:
    with httpx.Client(timeout=30) as c:
        return c.get(f"http://127.0.0.1:{host.preview_port}{path}", headers={"Host": name, **(headers or {})})


def test_a_preview_through_the_other_host(fleet, on_a):
    a, b, _, _ = fleet
    sid = on_a
    with Api(b, key=a.api_key) as via_b:
        # The API's preview routes go on to the owner like every route of a sandbox.
        made = via_b.post(f"/v1/sandboxes/{sid}/previews", json={"port": 8000}).json()
    name = name_of(sid)
    tok = made["token"]
    # The token is checked where the request lands: none is 401, a wrong one 403, and a client
    # that sends the hop's headers (claiming to be a host) is a client all the same.
    assert get_at(b, name).status_code == 401
    assert get_at(b, name, headers={"x-runtime-preview-token": tok[:-2] + "00"}).status_code == 403
    forged = {"Runtime-Fleet-Secret": SECRET, "Runtime-Forwarded-By": "prev-a"}
    r = get_at(b, name, headers=forged)
    assert r.status_code == 401, r.text
    # urlWithToken through b: the page, and a cookie for that host name, which either host takes.
    path_q = "/" + made["urlWithToken"].split("/", 3)[3]
    r = get_at(b, name, path_q)
    assert r.status_code == 200 and "hello from the sandbox" in r.text, r.text
    cookie = r.headers["set-cookie"].split(";")[0]
    assert cookie == f"runtime_preview_token={tok}"
    for host in (a, b):
        assert get_at(host, name, headers={"Cookie": cookie}).status_code == 200
    # The server inside never sees the token, nor the hop's headers.
    seen = get_at(b, name, "/headers", headers={"x-runtime-preview-token": tok}).json()["headers"]
    assert not {k.lower() for k in seen} & {"x-runtime-preview-token", "runtime-fleet-secret"}, seen
    # Keep-alive: two requests and a body on one connection to b, each answered in turn.
    s = socket.create_connection(("127.0.0.1", b.preview_port), timeout=20)
    f = s.makefile("rb")
    for body in (b"one", b"second"):
        s.sendall(f"POST /echo HTTP/1.1\r\nHost: {name}\r\nx-runtime-preview-token: {tok}\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert f.readline().startswith(b"HTTP/1.1 200")
        length = 0
        while (line := f.readline()) != b"\r\n":
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        assert f.read(length) == b"echo:" + body
    s.close()
    # A streamed answer arrives as it is made, not at its end.
    t0 = time.monotonic()
    arrivals = []
    with httpx.Client(timeout=30) as c:
        with c.stream("GET", f"http://127.0.0.1:{b.preview_port}/stream",
                      headers={"Host": name, "x-runtime-preview-token": tok}) as resp:
            assert resp.status_code == 200
            for chunk in resp.iter_text():
                arrivals.append((time.monotonic() - t0, chunk))
    assert "".join(c for _, c in arrivals) == "part0\npart1\npart2\n"
    assert arrivals[0][0] < 0.7, arrivals
    # A WebSocket, spliced through both hosts.
    websocket_echo(b, name, f"x-runtime-preview-token: {tok}\r\n")
    # A rotation (sent to b, served by a) closes the preview's connections at a, and so the
    # relayed one at b; the old token is refused through b from then on.
    s = socket.create_connection(("127.0.0.1", b.preview_port), timeout=20)
    s.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nx-runtime-preview-token: {tok}\r\n\r\n".encode())
    f = s.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 200")
    length = 0
    while (line := f.readline()) != b"\r\n":
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    f.read(length)
    with Api(b, key=a.api_key) as via_b:
        via_b.post(f"/v1/sandboxes/{sid}/previews/8000:rotate", json={}).raise_for_status()
    s.settimeout(10)
    assert f.read(1) == b"", "the relayed connection outlived the rotation"
    s.close()
    assert get_at(b, name, headers={"x-runtime-preview-token": tok}).status_code == 403


def test_embed_origins_through_the_other_host(fleet, on_a):
    a, b, _, _ = fleet
    sid = on_a
    with Api(a) as c:
        c.post(f"/v1/sandboxes/{sid}/previews",
               json={"port": 8000, "visibility": "public", "embedOrigins": ["https://app.example.com"]}
               ).raise_for_status()
    try:
        r = get_at(b, name_of(sid), "/framed")
        assert r.status_code == 200 and r.text == "framed"
        policies = [v for k, v in r.headers.multi_items() if k.lower() == "content-security-policy"]
        assert "frame-ancestors 'self' https://app.example.com" in policies, policies
        assert "x-frame-options" not in r.headers and r.headers["connection"] == "close"
    finally:
        with Api(a) as c:
            c.post(f"/v1/sandboxes/{sid}/previews",
                   json={"port": 8000, "visibility": "private", "embedOrigins": []}).raise_for_status()


def test_the_relay_route_is_the_hosts_alone(fleet, on_a):
    """The route a host relays a preview through takes the fleet's secret and nothing else: a
    client with a key, a forged host name or a wrong secret is 403, and the owner checks the
    token again on what the route carries."""
    a, b, _, _ = fleet
    sid = on_a
    path = f"/v1/sandboxes/{sid}/previews/8000:relay"
    up = {"Upgrade": "runtime-preview", "Connection": "Upgrade"}
    with httpx.Client(base_url=a.base_url, timeout=20) as c:
        for extra in ({}, {"Authorization": f"Bearer {a.api_key}"}, {"Runtime-Forwarded-By": "prev-b"},
                      {"Runtime-Fleet-Secret": "fleet-" + "0" * 32, "Runtime-Forwarded-By": "prev-b"}):
            r = c.get(path, headers={**up, **extra})
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (extra, r.text)
    # A head past the listener's bound is refused where it lands, before any hop.
    s = socket.create_connection(("127.0.0.1", b.preview_port), timeout=20)
    s.sendall(f"GET / HTTP/1.1\r\nHost: {name_of(sid)}\r\nX-Big: {'a' * 17000}\r\n\r\n".encode())
    assert b" 431 " in s.makefile("rb").readline()
    s.close()
    # With the secret (as a host sends it), the connection is the preview listener's, which
    # still wants the token, and serves the route's preview only.
    name = name_of(sid)
    for head, want in ((f"GET / HTTP/1.1\r\nHost: {name}\r\n\r\n", b" 401 "),
                       (f"GET / HTTP/1.1\r\nHost: {name_of(sid, 8001)}\r\n\r\n", b" 400 ")):
        s = socket.create_connection(("127.0.0.1", a.port), timeout=20)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: runtime-preview\r\nConnection: Upgrade\r\n"
                  f"Runtime-Fleet-Secret: {SECRET}\r\nRuntime-Forwarded-By: prev-b\r\n\r\n".encode())
        f = s.makefile("rb")
        assert b" 101 " in f.readline()
        while f.readline() != b"\r\n":
            pass
        s.sendall(head.encode())
        assert want in f.readline()
        s.close()


def test_an_unknown_or_silent_owner_is_a_page(fleet, on_a):
    a, b, pg, db = fleet
    sid = on_a
    with Api(a) as c:
        c.post(f"/v1/sandboxes/{sid}/previews", json={"port": 8000, "visibility": "public"}).raise_for_status()
    name = name_of(sid)
    # An owner the fleet does not know: 503 at once.
    pg.psql(f"UPDATE sandboxes SET host_id = 'prev-gone' WHERE id = '{sid}'", db)
    try:
        t0 = time.monotonic()
        r = get_at(b, name)
        assert r.status_code == 503 and "prev-gone" in r.text, r.text
        assert time.monotonic() - t0 < 5
    finally:
        pg.psql(f"UPDATE sandboxes SET host_id = 'prev-a' WHERE id = '{sid}'", db)
    assert get_at(b, name).status_code == 200
    # An owner that accepts connections and answers nothing (stopped): a 502 page within the
    # relay's answer time, not a hang.
    os.kill(a.proc.pid, 19)  # SIGSTOP
    try:
        t0 = time.monotonic()
        r = get_at(b, name)
        took = time.monotonic() - t0
    finally:
        os.kill(a.proc.pid, 18)  # SIGCONT
    assert r.status_code == 502 and took < 15, (r.status_code, took, r.text)
    assert get_at(b, name).status_code == 200


def test_the_interpreters_javascript_through_the_other_host(fleet, on_a):
    """The interpreter's JavaScript context (Deno's kernel) of a sandbox host a runs, driven
    through host b: its state kept between cells, its last expression the result."""
    a, b, _, _ = fleet
    sid = on_a
    with Api(a) as c:
        if c.exec(sid, command="test -x /usr/local/bin/deno")["exitCode"] != 0:
            pytest.skip("the image has no deno (the default image of images/build.sh has it)")
    with Api(b, key=a.api_key) as via_b:
        url = f"/v1/sandboxes/{sid}/interpreter:run"
        first = via_b.post(url, json={"code": "let x = 6;\nconsole.log('set');", "language": "javascript"},
                           timeout=300).json()
        assert first["status"] == "ok" and first["stdout"] == "set\n", first
        out = via_b.post(url, json={"code": "x * 7", "language": "javascript"}, timeout=60).json()
        assert out["status"] == "ok", out
        assert [r["data"]["text/plain"] for r in out["results"] if r["main"]] == ["42"], out
        got = via_b.get(f"/v1/sandboxes/{sid}/interpreter/contexts").json()["data"]
        assert any(c["id"] == "javascript" and c["kernel"] == "deno" for c in got), got


def test_mcp_servers_inside_through_the_other_host(fleet, on_a):
    """MCP servers inside a sandbox host a runs, started through host b, and the official MCP SDK
    reading a file through b's preview listener: the start forwarded, the URL relayed."""
    pytest.importorskip("mcp", reason="the MCP Python SDK (tests/requirements.txt: mcp) is not installed")
    from test_mcp_inside import _local, _read_through_sdk
    a, b, _, _ = fleet
    sid = on_a
    with Api(a) as c:
        if c.exec(sid, command="test -d /opt/runtime-mcp")["exitCode"] != 0:
            pytest.skip("the image has no MCP servers (the default image of images/build.sh has them)")
        c.put_file(sid, "/workspace/hello.txt", b"through b\n").raise_for_status()
    with Api(b, key=a.api_key) as via_b:
        r = via_b.post(f"/v1/sandboxes/{sid}/mcp", json={"servers": [{"id": "filesystem"}]}, timeout=180)
        assert r.status_code == 200, r.text
        try:
            state = r.json()
            wait_until(lambda: via_b.get(f"/v1/sandboxes/{sid}/mcp").json()["servers"][0]["status"] != "installing",
                       120, 0.5, what="the filesystem server")
            state = via_b.get(f"/v1/sandboxes/{sid}/mcp").json()
            assert state["servers"][0]["status"] == "running", state
            url, host = _local(state["servers"][0]["url"], b.preview_port)
            tools, text = asyncio.run(_read_through_sdk(url, host, state["headers"]))
            assert "list_directory" in tools and text == "through b\n", (tools, text)
            assert httpx.post(url, headers={"Host": host}, json={}).status_code == 401
        finally:
            via_b.delete(f"/v1/sandboxes/{sid}/mcp", timeout=60)


def test_the_browser_and_the_live_view_through_the_other_host(fleet, desktop_image):
    """The URLs built on previews: the browser's cdpUrl (Chromium's DevTools) and the desktop's
    streamUrl (noVNC's page and its WebSocket to x11vnc), of a sandbox host a runs, asked for and
    opened through host b."""
    a, b, _, _ = fleet
    with Api(a) as c:
        sid = create_on_a(fleet, c, image=desktop_image, memoryMiB=2048)
    try:
        with Api(b, key=a.api_key) as via_b:
            r = via_b.post(f"/v1/sandboxes/{sid}/browser:start", json={}, timeout=120)
            assert r.status_code == 200, r.text
            cdp = urlsplit(r.json()["cdpUrl"])
            token = dict(kv.split("=", 1) for kv in cdp.query.split("&"))["runtime_preview_token"]
            ok = get_at(b, cdp.netloc, "/json/version", headers={"x-runtime-preview-token": token})
            assert ok.status_code == 200 and "webSocketDebuggerUrl" in ok.json(), ok.text
            assert get_at(b, cdp.netloc, "/json/version").status_code == 401
            r = via_b.post(f"/v1/sandboxes/{sid}/desktop:start", json={"width": 640, "height": 480}, timeout=120)
            assert r.status_code == 200, r.text
            stream = urlsplit(r.json()["streamUrl"])
            token = dict(kv.split("=", 1) for kv in stream.query.split("&"))["runtime_preview_token"]
        wait_until(lambda: get_at(b, stream.netloc, "/vnc.html",
                                  headers={"x-runtime-preview-token": token}).status_code == 200, 30, 0.3,
                   what="noVNC's page through host b")
        got = vnc_greeting(b.preview_port, stream.netloc, token)
        assert got.startswith(b"HTTP/1.1 101") and b"RFB 00" in got, got[:300]
    finally:
        with Api(a) as c:
            c.delete(f"/v1/sandboxes/{sid}")


def test_a_pool_kernel_through_the_other_host(fleet):
    """A create sent to host b and placed on host a is handed a's warm pool sandbox, whose kernel
    was started ahead: its first cell, sent through b, runs on that kernel with the create's env."""
    a, b, _, _ = fleet

    def pool(key: str) -> int:
        with Api(a) as c:
            m = re.search(rf'^runtime_warm_pool_{key}\{{driver="namespace",image="default",shape="[^"]*"\}} (\d+)$',
                          c.get("/metrics").text, re.M)
        return int(m.group(1)) if m else 0

    wait_until(lambda: pool("ready") >= 1, 180, what="host a's warm pool sandbox")
    time.sleep(1.2)  # a kernel started by the create would then show a later createdAt
    with Api(b, key=a.api_key) as via_b, b_drained(fleet):
        hits = pool("hits_total")
        r = via_b.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 600,
                                              "env": {"POOL_VIA": "host-b"}})
        assert r.status_code == 201, r.text
        sbx = r.json()
        assert home(fleet, sbx["id"]) == "prev-a"
        try:
            assert pool("hits_total") == hits + 1
            out = via_b.post(f"/v1/sandboxes/{sbx['id']}/interpreter:run",
                             json={"code": "import os\nprint(os.environ.get('POOL_VIA'))"}, timeout=180).json()
            assert out["status"] == "ok" and out["stdout"] == "host-b\n" and out["executionCount"] == 1, out
            ctx = [c for c in via_b.get(f"/v1/sandboxes/{sbx['id']}/interpreter/contexts").json()["data"]
                   if c["id"] == "python"]
            assert ctx and ctx[0]["createdAt"] < sbx["createdAt"][:19] + "Z", (ctx, sbx["createdAt"])
        finally:
            via_b.delete(f"/v1/sandboxes/{sbx['id']}")


# A server that takes an upgrade and then echoes every byte, as fast as it comes.
ECHO = r'''
import socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen(8)
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
    rest = head.split(b"\r\n\r\n", 1)[1]
    if rest:
        c.sendall(rest)
    while data := c.recv(65536):
        c.sendall(data)
    c.close()
while True:
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
'''


def test_both_ways_at_once_through_the_other_host(fleet, on_a):
    """An upgraded connection that carries megabytes both ways at once (an echo, read while it is
    written) through the other host: the relay never waits on one direction to move the other."""
    a, b, _, _ = fleet
    sid = on_a
    with Api(a) as c:
        c.put_file(sid, "/workspace/echo.py", ECHO.encode()).raise_for_status()
        c.post(f"/v1/sandboxes/{sid}/processes", json={"command": "exec python3 /workspace/echo.py 8100"}
               ).raise_for_status()
        probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8100), 2).close()'"
        wait_until(lambda: c.exec(sid, command=probe)["exitCode"] == 0, 60, 0.2, what="the echo server")
        c.post(f"/v1/sandboxes/{sid}/previews", json={"port": 8100, "visibility": "public"}).raise_for_status()
    blob = os.urandom(16 * 1024 * 1024)
    s = socket.create_connection(("127.0.0.1", b.preview_port), timeout=30)
    s.sendall(f"GET / HTTP/1.1\r\nHost: {name_of(sid, 8100)}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"
              .encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    sender = threading.Thread(target=s.sendall, args=(blob,), daemon=True)
    t0 = time.monotonic()
    sender.start()
    got = bytearray()
    while len(got) < len(blob):
        chunk = s.recv(1 << 20)
        assert chunk, f"the connection ended after {len(got)} bytes"
        got += chunk
    sender.join(10)
    s.close()
    assert bytes(got) == blob and time.monotonic() - t0 < 30


def test_relayed_connections_per_host_are_bounded(fleet, on_a):
    """Host b relays at most --preview-relay-max-connections to host a at once: one past them is
    the 503 page docs/previews.md promises, naming the bound and the host, and once one of them
    closes the next connection is relayed again."""
    a, b, _, _ = fleet
    sid = on_a
    with Api(a) as c:
        c.post(f"/v1/sandboxes/{sid}/previews", json={"port": 8000, "visibility": "public"}).raise_for_status()
    name = name_of(sid)
    held = []
    try:
        for _ in range(RELAY_MAX):
            s = socket.create_connection(("127.0.0.1", b.preview_port), timeout=20)
            s.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
            f = s.makefile("rb")
            assert f.readline().startswith(b"HTTP/1.1 200")
            length = 0
            while (line := f.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            f.read(length)
            # Kept alive: the relayed connection to a stays open.
            held.append((s, f))
        r = get_at(b, name)
        assert r.status_code == 503 and "Too many connections" in r.text, r.text
        assert f"relays {RELAY_MAX} connections to host prev-a" in r.text, r.text
        s, f = held.pop()
        f.close()
        s.close()
        wait_until(lambda: get_at(b, name).status_code == 200, 10, 0.2, what="a connection relayed again")
    finally:
        for s, f in held:
            f.close()
            s.close()

