"""MCP servers inside a sandbox (docs/mcp.md, "Inside a sandbox"): secrets, and a change of the
set that cuts no session of a server that stays.

Secrets: the published client (withruntime 0.35.0) starts the catalog's http server with its
HTTP_BEARER_TOKEN mapped to an egress secret, as its own docs show
({"secrets": {ENV: SECRET}}, sent as given). A tool call through the official MCP SDK sends a
request to the secret's host, where the value arrives (the upstream's record), and to another
host, which gets the placeholder alone. The variable is in the http server's environment and in
no other process's of the sandbox; the value is in none, nor in the gateway's files, the GET
answer or the daemon's log. Mappings to a variable that is no secret (PATH), to a secret the
sandbox does not see, to a name the server does not take, and too many, are 400s.

Sessions: a client session to the filesystem server keeps its session id and calls a tool again,
without initialize, while the memory server is added and removed by starts with replace; a
gateway killed is started again and its restarts read in GET, five at most; the router of the
public port refuses what names no server. Against the real daemon, on the
namespace and gVisor drivers (the sessions' and the router's checks on the first of them
unless RUNTIME_TEST_ALL=1: they are the gateway's, the same program on every driver); no traffic leaves the machine (the upstreams are
egress_servers.py's on 127.0.0.1, under test names)."""
from __future__ import annotations

import asyncio
import json
import hashlib
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from egress_servers import EchoServer, TestCa
from helpers import Api, assert_error, free_port, skip_unless_driver, wait_until

sys.path.insert(0, str(Path(__file__).parent))
from conftest import _finish_daemon, _start_daemon  # noqa: E402

mcp = pytest.importorskip("mcp", reason="the MCP Python SDK (tests/requirements.txt: mcp) is not installed")
from mcp import ClientSession  # noqa: E402
from mcp.client import streamable_http as sh  # noqa: E402

DRIVERS = ["namespace", "gvisor"]
VALUE = "mcp-secret-" + hashlib.sha256(os.urandom(16)).hexdigest()[:24]


@pytest.fixture(scope="module")
def gdaemon(build_dir, image_dir, tmp_path_factory):
    """A daemon with a preview listener (the servers' URLs) and two upstreams: api.test (HTTPS,
    the secret's host, its certificate from a CA the daemon trusts) and echo.test (plain)."""
    tmp = tmp_path_factory.mktemp("mcpgw")
    ca = TestCa(tmp / "ca", "runtime MCP tests CA")
    tls = EchoServer(tls=ca.leaf("api", ["api.test"])).start()
    echo = EchoServer().start()
    port = free_port()
    d = _start_daemon(build_dir, image_dir, tmp / "state", f"runtime-test-{os.getpid()}-mcpgw",
                      extra_args=["--preview-listen", f"127.0.0.1:{port}",
                                  "--egress-test-upstream", f"api.test=127.0.0.1:{tls.port}",
                                  "--egress-test-upstream", f"echo.test=127.0.0.1:{echo.port}",
                                  "--egress-extra-ca", str(ca.cert_path)])
    d.preview_port, d.tls, d.echo = port, tls, echo
    yield d
    _finish_daemon(d)
    tls.stop()
    echo.stop()


@pytest.fixture
def gapi(gdaemon):
    c = Api(gdaemon)
    yield c
    problems = c.delete_all()
    c.delete("/v1/egress-secrets/MCP_TOKEN")
    c.close()
    assert gdaemon.alive(), "runtimed died during the test"
    assert not problems, problems


def _local(url: str, preview_port: int) -> tuple[str, str]:
    parts = urlsplit(url)
    return f"http://127.0.0.1:{preview_port}{parts.path}", parts.netloc


def _text(res) -> str:
    return "".join(c.text for c in res.content if getattr(c, "text", None))


async def _call(url: str, host: str, headers: dict, tool: str, args: dict) -> str:
    client = httpx.AsyncClient(headers={"Host": host, **headers}, timeout=httpx.Timeout(60, read=120))
    try:
        async with sh.streamable_http_client(url, http_client=client) as (read, write, _):
            async with ClientSession(read, write) as s:
                await s.initialize()
                return _text(await s.call_tool(tool, args))
    finally:
        await client.aclose()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_servers_secret(published_client, gdaemon, gapi, driver):
    skip_unless_driver(gdaemon, driver)
    put = gapi.put("/v1/egress-secrets/MCP_TOKEN", json={"value": VALUE, "hosts": ["api.test"]})
    assert put.status_code in (200, 201), put.text
    placeholder = put.json()["placeholder"]
    sbx = gapi.create_sandbox(driver=driver, memoryMiB=1024,
                              network={"internet": True, "allow": ["api.test", "echo.test"]})
    got = published_client.run_json(gdaemon, """
import json, sys
from withruntime import Runtime, Sandbox
sbx = Sandbox.connect(sys.argv[1])
catalog = Runtime().mcp.catalog()
sbx.mcp.start([{"id": "http", "secrets": {"HTTP_BEARER_TOKEN": "MCP_TOKEN"}}, {"id": "filesystem"}])
print(json.dumps({"catalog": catalog, "ready": sbx.mcp.ready(timeout=60, interval=0.5)}))
""", args=[sbx.id])
    assert {c["id"]: c for c in got["catalog"]}["http"]["secrets"] == ["HTTP_BEARER_TOKEN"], got["catalog"]
    ready = got["ready"]
    status = {s["id"]: s for s in ready["servers"]}
    assert status["http"]["status"] == "running" and status["filesystem"]["status"] == "running", ready
    url, host = _local(status["http"]["url"], gdaemon.preview_port)

    # To the secret's host the value arrives (its answer is bytes that do not hold it); to
    # another host the placeholder alone.
    gdaemon.tls.clear()
    gdaemon.echo.clear()
    out = asyncio.run(_call(url, host, ready["headers"], "fetch", {"url": "https://api.test/bytes/2"}))
    assert out.startswith("HTTP 200") and VALUE not in out, out
    seen = gdaemon.tls.seen()
    assert len(seen) == 1 and dict((k.lower(), v) for k, v in seen[0]["headers"])["authorization"] \
        == f"Bearer {VALUE}", "the secret's host did not get the value"
    out = asyncio.run(_call(url, host, ready["headers"], "fetch", {"url": "http://echo.test/elsewhere"}))
    assert out.startswith("HTTP 200") and VALUE not in out and f"Bearer {placeholder}" in out, out

    # The variable is the http server's alone; the value is nowhere in the sandbox.
    holders = sbx.exec("for p in /proc/[0-9]*; do { tr '\\0' '\\n' <$p/environ; } 2>/dev/null | "
                       "grep -q '^HTTP_BEARER_TOKEN=' && { tr '\\0\\n' '  ' <$p/cmdline | cut -c1-60; echo; }; "
                       "done; true")
    lines = [ln for ln in holders["stdout"].splitlines() if ln.strip()]
    assert len(lines) == 1 and "python3 -I -c" in lines[0], holders
    found = sbx.exec(f"grep -rls -- {VALUE} /proc/[0-9]*/environ /tmp/.runtime-mcp /workspace /tmp; true")
    assert found["stdout"].strip() == "", found
    answer = gapi.get(f"/v1/sandboxes/{sbx.id}/mcp")
    assert answer.status_code == 200 and VALUE not in answer.text and placeholder not in answer.text, answer.text
    assert VALUE not in Path(gdaemon.log_path).read_text(errors="replace"), "the value is in the daemon's log"

    # Refusals, each a 400 by name, and the servers that run are left as they are.
    def refused(secrets, needle):
        r = gapi.post(f"/v1/sandboxes/{sbx.id}/mcp", json={"servers": [{"id": "http", "secrets": secrets}],
                                                          "replace": True})
        assert_error(r, 400, "invalid_request")
        assert needle in r.json()["error"]["message"], r.text

    refused({"HTTP_BEARER_TOKEN": "PATH"}, "no secret PATH")
    refused({"HTTP_BEARER_TOKEN": "NOT_STORED"}, "no secret NOT_STORED")
    refused({"GITHUB_TOKEN": "MCP_TOKEN"}, "takes no secret GITHUB_TOKEN")
    refused({"HTTP_BEARER_TOKEN": "A" * 65}, "environment name")
    refused({f"V{i}": "MCP_TOKEN" for i in range(17)}, "at most 16")
    refused({"HTTP_BEARER_TOKEN": 7}, "environment name")
    after = {s["id"]: s["status"] for s in gapi.get(f"/v1/sandboxes/{sbx.id}/mcp").json()["servers"]}
    assert after == {"http": "running", "filesystem": "running"}, after

    # A sandbox made without the secret does not see it: refused by name.
    other = gapi.create_sandbox(driver=driver, memoryMiB=1024, secrets=[])
    r = gapi.post(f"/v1/sandboxes/{other.id}/mcp",
                  json={"servers": [{"id": "http", "secrets": {"HTTP_BEARER_TOKEN": "MCP_TOKEN"}}]})
    assert_error(r, 400, "invalid_request")
    assert "no secret MCP_TOKEN" in r.json()["error"]["message"], r.text


def _gateway_pid(sbx, server: str) -> str:
    out = sbx.exec(f"pgrep -f 'mcp-prox[y] --named-server-config /tmp/.runtime-mcp/config-{server}.json' || true")
    return out["stdout"].strip()


# The set's change is the gateway's and the supervisor's, programs of the image; the gateway
# per driver: test_a_servers_secret here and test_mcp_inside.py.
@pytest.mark.driver_independent
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_change_of_servers_keeps_the_sessions_of_those_that_stay(gdaemon, gapi, driver):
    skip_unless_driver(gdaemon, driver)
    sbx = gapi.create_sandbox(driver=driver, memoryMiB=1024)
    sbx.write("/workspace/hello.txt", b"written by the test\n")
    path = f"/v1/sandboxes/{sbx.id}/mcp"
    started = gapi.post(path, json={"servers": [{"id": "filesystem"}]})
    assert started.status_code == 200, started.text
    fs = started.json()["servers"][0]
    assert fs["status"] == "running" and fs["restarts"] == 0, fs
    url, host = _local(fs["url"], gdaemon.preview_port)
    memory_url = url.replace("/servers/filesystem/", "/servers/memory/")
    gateway = _gateway_pid(sbx, "filesystem")
    assert gateway.isdigit(), gateway

    def change(servers):
        r = gapi.post(path, json={"servers": [{"id": i} for i in servers], "replace": True})
        assert r.status_code == 200, r.text
        return r.json()

    async def session():
        headers = {"Host": host, **started.json()["headers"]}
        client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60, read=120))
        try:
            async with sh.streamable_http_client(url, http_client=client) as (read, write, session_id):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    first = session_id()
                    assert "written by the test" in _text(await s.call_tool("read_text_file",
                                                                            {"path": "/workspace/hello.txt"}))
                    added = await asyncio.to_thread(change, ["filesystem", "memory"])
                    status = {x["id"]: x["status"] for x in added["servers"]}
                    assert status == {"filesystem": "running", "memory": "running"}, added
                    assert session_id() == first
                    assert "hello.txt" in _text(await s.call_tool("list_directory", {"path": "/workspace"}))
                    graph = await _call(memory_url, host, started.json()["headers"], "read_graph", {})
                    assert "entities" in graph, graph
                    removed = await asyncio.to_thread(change, ["filesystem"])
                    assert [x["id"] for x in removed["servers"]] == ["filesystem"], removed
                    assert session_id() == first
                    assert "written by the test" in _text(await s.call_tool("read_text_file",
                                                                            {"path": "/workspace/hello.txt"}))
                    return first
        finally:
            await client.aclose()

    assert asyncio.run(session())
    assert _gateway_pid(sbx, "filesystem") == gateway, "the filesystem server's gateway was started again"
    assert _gateway_pid(sbx, "memory") == "", "the memory server's gateway was left running"
    gone = httpx.post(memory_url, headers={"Host": host, **started.json()["headers"],
                                           "Accept": "application/json, text/event-stream"},
                      json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=15)
    assert gone.status_code == 404, gone.text

    # A gateway that dies is started again, and GET says how often.
    assert sbx.exec(f"kill -9 {gateway}")["exitCode"] == 0

    def again():
        got = gapi.get(path).json()
        s = got["servers"][0]
        return got if s["status"] == "running" and s["restarts"] == 1 else None

    got = wait_until(again, 60, 0.5, what="the filesystem server's gateway started again")
    assert got["running"] is True and _gateway_pid(sbx, "filesystem") not in ("", gateway)
    out = asyncio.run(_call(url, host, got["headers"], "read_text_file", {"path": "/workspace/hello.txt"}))
    assert "written by the test" in out, out
    assert gapi.delete(path).json()["stopped"] is True


ROUTER_PROBE = r"""
import json, socket, sys

def ask(data, shut=True):
    s = socket.create_connection(("127.0.0.1", 8811), timeout=40)
    s.sendall(data)
    if shut:
        s.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while len(got) < 65536:
            b = s.recv(4096)
            if not b:
                break
            got += b
    except OSError as e:
        got += b"[" + str(e).encode() + b"]"
    s.close()
    return got.split(b"\r\n", 1)[0].decode(errors="replace")

print(json.dumps({
    "huge": ask(b"GET /servers/filesystem/mcp HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", shut=False),
    "unknown": ask(b"GET /servers/nope/mcp HTTP/1.1\r\nHost: x\r\n\r\n"),
    "dots": ask(b"GET /servers/../servers/filesystem/mcp HTTP/1.1\r\nHost: x\r\n\r\n"),
    "bare": ask(b"\r\n\r\n"),
    "cut": ask(b"GET /servers/filesystem/mcp HTTP/1.1\r\nHost: x\r\n"),
}))
"""


# The router and the restarts are the gateway's and the supervisor's (see above).
@pytest.mark.driver_independent
@pytest.mark.parametrize("driver", DRIVERS)
def test_the_router_refuses_and_restarts_are_bounded(gdaemon, gapi, driver):
    """The router of the public port, asked from inside the sandbox: a head over 16 KiB, a server
    not in the set, dot segments, a bare blank line and a head cut short reach no server (404, or
    closed);
    the server still serves. A gateway killed six times reads failed, with five restarts. A
    supervisor killed reads running: false, and the next start ends the gateway it left."""
    skip_unless_driver(gdaemon, driver)
    sbx = gapi.create_sandbox(driver=driver, memoryMiB=1024)
    sbx.write("/workspace/hello.txt", b"written by the test\n")
    path = f"/v1/sandboxes/{sbx.id}/mcp"
    started = gapi.post(path, json={"servers": [{"id": "filesystem"}]})
    assert started.status_code == 200 and started.json()["servers"][0]["status"] == "running", started.text
    sbx.write("/tmp/probe.py", ROUTER_PROBE.encode())
    res = sbx.exec("python3 /tmp/probe.py", timeoutMs=120000)
    assert res["exitCode"] == 0, res
    got = json.loads(res["stdout"])
    assert got["huge"] == "" and got["cut"] == "", got
    assert all(got[k].startswith("HTTP/1.1 404") for k in ("unknown", "dots", "bare")), got
    url, host = _local(started.json()["servers"][0]["url"], gdaemon.preview_port)
    out = asyncio.run(_call(url, host, started.json()["headers"], "read_text_file", {"path": "/workspace/hello.txt"}))
    assert "written by the test" in out, out

    for n in range(1, 7):
        pid = wait_until(lambda: _gateway_pid(sbx, "filesystem") or None, 60, 0.2, what="a gateway")
        assert sbx.exec(f"kill -9 {pid}")["exitCode"] == 0

        def settled(n=n):
            s = gapi.get(path).json()["servers"][0]
            return s if s["status"] == "failed" or (s["status"] == "running" and s["restarts"] == n) else None

        s = wait_until(settled, 60, 0.3, what=f"the gateway after kill {n}")
        if n < 6:
            assert s["status"] == "running" and s["restarts"] == n, s
    assert s["status"] == "failed" and s["restarts"] == 5 and "exited 6 times" in s["error"], s
    gone = httpx.post(url, headers={"Host": host, **started.json()["headers"],
                                    "Accept": "application/json, text/event-stream"},
                      json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=15)
    assert gone.status_code == 503, gone.text
    assert gapi.get(path).json()["running"] is True

    # The supervisor killed: GET says so, and the next start ends the gateway it left.
    r = gapi.post(path, json={"servers": [{"id": "memory"}], "replace": True})
    assert r.status_code == 200 and r.json()["servers"][0]["status"] == "running", r.text
    assert sbx.exec("kill -9 $(cat /tmp/.runtime-mcp/supervisor.pid)")["exitCode"] == 0
    wait_until(lambda: gapi.get(path).json()["running"] is False, 30, 0.3, what="running: false")
    r = gapi.post(path, json={"servers": [{"id": "memory"}]})
    assert r.status_code == 200 and r.json()["servers"][0]["status"] == "running", r.text
    gateways = sbx.exec("pgrep -c -f 'mcp-prox[y] --named-server-config' || true")["stdout"].strip()
    assert gateways == "1", gateways
    assert gapi.delete(path).json()["stopped"] is True
