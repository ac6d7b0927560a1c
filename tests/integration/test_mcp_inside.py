"""MCP servers inside a sandbox (docs/mcp.md, "Inside a sandbox"), on the default image.

The published client (withruntime 0.35.0) reads the catalog, starts the filesystem and memory
servers with sbx.mcp.start(), waits with ready() and reads get(); the official MCP Python SDK then
connects to the filesystem server's URL through the daemon's preview listener with the answer's
headers, lists its tools and reads a file the test wrote in /workspace, and LlamaIndex's
McpToolSpec lists the same tools and calls one. The same URL without the
guard header is refused (401), with a wrong one too (403). A second start without replace is a
409, one with replace starts anew; a server that floods its output and exits at its start reads
failed while the others serve, and the output kept is bounded (a server that never answers initialize is
ended after 30 s, a drill run with RUNTIME_TEST_ALL=1); stop() ends the gateway and its servers. Hostile starts (an
unknown server, a secret mapping the server does not take, too many servers, a port out of range,
public URLs, unknown fields) get their errors, and another owner's key a 404. Our own SDKs drive
the same routes under the published client's names: the Python SDK, blocking and awaitable, with
the MCP Python SDK connected to its URL, and the TypeScript SDK from Node
(sdk/js/test/mcp.test.mjs). Against the real daemon."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from helpers import Api, assert_error, free_port, skip_unless_driver, wait_until

sys.path.insert(0, str(Path(__file__).parent))
from conftest import _finish_daemon, _start_daemon, need_microvm_parts  # noqa: E402
from test_js_sdk import NODE, _env, js_build, run_node  # noqa: E402,F401 - js_build: the fixture that builds sdk/js

mcp = pytest.importorskip("mcp", reason="the MCP Python SDK (tests/requirements.txt: mcp) is not installed")
from mcp import ClientSession  # noqa: E402

DRIVERS = ["namespace", "gvisor"]


@pytest.fixture(scope="module")
def mdaemon(build_dir, image_dir, tmp_path_factory):
    """A daemon with a preview listener: the servers' URLs are served there."""
    state = tmp_path_factory.mktemp("mcpin") / "state"
    port = free_port()
    d = _start_daemon(build_dir, image_dir, state, f"runtime-test-{os.getpid()}-mcpin",
                      extra_args=["--preview-listen", f"127.0.0.1:{port}"])
    d.preview_port = port
    yield d
    _finish_daemon(d)


@pytest.fixture
def mapi(mdaemon):
    c = Api(mdaemon)
    yield c
    problems = c.delete_all()
    c.close()
    assert mdaemon.alive(), "runtimed died during the test"
    assert not problems, problems


def _local(url: str, preview_port: int) -> tuple[str, str]:
    """The URL at the listener's address, and the Host that names the preview (*.localhost
    need not resolve on the host)."""
    parts = urlsplit(url)
    return f"http://127.0.0.1:{preview_port}{parts.path}", parts.netloc


async def _read_through_sdk(url: str, host: str, headers: dict) -> tuple[set, str]:
    from mcp.client import streamable_http as sh
    client = httpx.AsyncClient(headers={"Host": host, **headers}, timeout=httpx.Timeout(60, read=120))
    try:
        async with sh.streamable_http_client(url, http_client=client) as (read, write, _):
            async with ClientSession(read, write) as s:
                await s.initialize()
                tools = {t.name for t in (await s.list_tools()).tools}
                name = "read_text_file" if "read_text_file" in tools else "read_file"
                res = await s.call_tool(name, {"path": "/workspace/hello.txt"})
                return tools, "".join(c.text for c in res.content if getattr(c, "text", None))
    finally:
        await client.aclose()


@pytest.mark.parametrize("driver", DRIVERS)
def test_servers_through_published_client_and_mcp_sdk(published_client, mdaemon, mapi, driver):
    skip_unless_driver(mdaemon, driver)
    sbx = mapi.create_sandbox(driver=driver, memoryMiB=1024)
    sbx.write("/workspace/hello.txt", b"written by the test\n")
    got = published_client.run_json(mdaemon, """
import json, sys
from withruntime import Runtime, Sandbox
sbx = Sandbox.connect(sys.argv[1])
catalog = Runtime().mcp.catalog()
started = sbx.mcp.start([{"id": "filesystem"}, {"id": "memory"}])
ready = sbx.mcp.ready(timeout=60, interval=0.5)
print(json.dumps({"catalog": catalog, "started": started, "ready": ready, "get": sbx.mcp.get()}))
""", args=[sbx.id])
    ids = {c["id"]: c for c in got["catalog"]}
    assert {"filesystem", "memory"} <= set(ids), got["catalog"]
    assert ids["filesystem"]["inImage"] is True and ids["filesystem"]["secrets"] == [], ids
    ready = got["ready"]
    assert ready["running"] is True, got
    status = {s["id"]: s for s in ready["servers"]}
    assert status["filesystem"]["status"] == "running" and status["memory"]["status"] == "running", ready
    headers = ready["headers"]
    assert list(headers) == ["x-runtime-preview-token"], headers
    fs = status["filesystem"]["url"]
    assert urlsplit(fs).hostname.startswith(f"{ready['port']}-sbx-") and fs.endswith("/servers/filesystem/mcp"), fs

    url, host = _local(fs, mdaemon.preview_port)
    tools, text = asyncio.run(_read_through_sdk(url, host, headers))
    assert "list_directory" in tools, tools
    assert "written by the test" in text, text
    # LlamaIndex's McpToolSpec: the server's tools become an agent's tools.
    try:
        from llama_index.tools.mcp import BasicMCPClient, McpToolSpec
    except ImportError:  # pragma: no cover - the suite installs it (tests/requirements.txt)
        pass
    else:
        async def llama():
            spec = McpToolSpec(client=BasicMCPClient(url, headers={"Host": host, **headers}))
            found = {t.metadata.name: t for t in await spec.to_tool_list_async()}
            out = await found["list_directory"].acall(path="/workspace")
            return set(found), "".join(c.text for c in out.raw_output.content if getattr(c, "text", None))
        names, listing = asyncio.run(llama())
        assert "read_text_file" in names and "hello.txt" in listing, (names, listing)

    # The guard: no header, a wrong token.
    probe = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Host": host, "Accept": "application/json, text/event-stream"}
    with httpx.Client(timeout=15) as c:
        assert c.post(url, json=probe, headers=accept).status_code == 401
        assert c.post(url, json=probe, headers={**accept, "x-runtime-preview-token": "1.00"}).status_code == 403

    # A second start: refused without replace, a new gateway with it.
    again = mapi.post(f"/v1/sandboxes/{sbx.id}/mcp", json={"servers": [{"id": "memory"}]})
    assert_error(again, 409, "conflict")
    assert "replace" in again.json()["error"]["hint"]
    again = mapi.post(f"/v1/sandboxes/{sbx.id}/mcp", json={"servers": [{"id": "memory"}], "replace": True})
    assert again.status_code == 200 and [s["id"] for s in again.json()["servers"]] == ["memory"], again.text

    # A server that floods its stderr (8 MiB) and exits at its start reads failed, with what it
    # said; the others run on, and what the gateway keeps of the output is bounded.
    broken = "/opt/runtime-mcp/servers/node_modules/@modelcontextprotocol/server-memory/dist/index.js"
    flood = "for (let i = 0; i < 128; i++) process.stderr.write('x'.repeat(65535) + '\\n'); process.exit(3);"
    assert sbx.exec(f"echo \"{flood}\" | sudo tee {broken} >/dev/null")["exitCode"] == 0
    # (A replace would keep the memory server that runs: its command is the same. Stop, then start.)
    assert mapi.delete(f"/v1/sandboxes/{sbx.id}/mcp").json()["stopped"] is True
    again = mapi.post(f"/v1/sandboxes/{sbx.id}/mcp", json={"servers": [{"id": "memory"}, {"id": "filesystem"}]})
    assert again.status_code == 200, again.text
    status = {s["id"]: s for s in again.json()["servers"]}
    assert status["memory"]["status"] == "failed" and status["memory"]["error"], status
    assert status["filesystem"]["status"] == "running", status
    tools, text = asyncio.run(_read_through_sdk(url, host, again.json()["headers"]))
    assert "written by the test" in text, text
    kept = sbx.exec("stat -c %s /tmp/.runtime-mcp/gateway.log")
    assert kept["exitCode"] == 0 and int(kept["stdout"]) <= 64 * 1024, kept

    stopped = mapi.delete(f"/v1/sandboxes/{sbx.id}/mcp")
    assert stopped.status_code == 200 and stopped.json()["stopped"] is True, stopped.text
    assert mapi.get(f"/v1/sandboxes/{sbx.id}/mcp").json()["running"] is False
    left = sbx.exec("ps -eo pid=,stat=,pgid=,args= | grep -E 'mcp-prox[y]|server-(filesystem|memor[y])' || true")
    assert left["stdout"].strip() == "", left
    assert sbx.exec("echo fine")["stdout"] == "fine\n"


def test_the_microvm_refuses_and_says_why(build_dir, image_dir, mdaemon, mapi):
    """A microVM sandbox runs no MCP servers: its start is a 501 that names the drivers that do."""
    skip_unless_driver(mdaemon, "microvm")
    need_microvm_parts(build_dir, image_dir)
    sbx = mapi.create_sandbox(driver="microvm")
    err = assert_error(mapi.post(f"/v1/sandboxes/{sbx.id}/mcp", json={"servers": [{"id": "filesystem"}]}),
                       501, "not_implemented")
    assert "microVM" in err["message"] and "namespace" in err["hint"], err


@pytest.mark.driver_independent
def test_hostile_starts(mdaemon, mapi):
    sbx = mapi.create_sandbox()
    path = f"/v1/sandboxes/{sbx.id}/mcp"

    def start(body, status, code, needle):
        r = mapi.post(path, json=body)
        assert_error(r, status, code)
        assert needle in r.json()["error"]["message"], r.text

    start({"servers": [{"id": "nope"}]}, 404, "not_found", '"nope"')
    start({"servers": [{"id": "filesystem", "secrets": {"GITHUB_TOKEN": "GH"}}]}, 400, "invalid_request",
          "takes no secret GITHUB_TOKEN")
    start({"servers": [{"id": "filesystem", "secrets": {"BAD-NAME": "GH"}}]}, 400, "invalid_request",
          "environment name")
    start({"servers": [{"id": "filesystem", "secrets": ["GH"]}]}, 400, "invalid_request", "secrets")
    start({"servers": [{"id": "filesystem"}] * 9}, 400, "invalid_request", "1 to 8")
    start({"servers": [{"id": "filesystem"}, {"id": "filesystem"}]}, 400, "invalid_request", "twice")
    start({"servers": []}, 400, "invalid_request", "1 to 8")
    start({"servers": [{"id": "filesystem"}], "port": 80}, 400, "invalid_request", "port")
    start({"servers": [{"id": "filesystem"}], "port": 70000}, 400, "invalid_request", "port")
    start({"servers": [{"id": "filesystem"}], "port": "8811"}, 400, "invalid_request", "port")
    start({"servers": [{"id": "filesystem"}], "public": True}, 501, "not_implemented", "public")
    start({"servers": [{"id": "filesystem", "cmd": "sh"}]}, 400, "invalid_request", "unknown field")
    start({"servers": [{"id": "filesystem"}], "command": "sh"}, 400, "invalid_request", "unknown field")
    start({"servers": [{"id": "x" * 5000}]}, 404, "not_found", "no server")
    assert mapi.get(path).json()["running"] is False
    # Another owner's key: the sandbox is not theirs.
    k = mapi.post("/v1/keys", json={"name": "mcpin-other", "owner": "mcpin-other"})
    assert k.status_code == 201, k.text
    with Api(mdaemon, key=k.json()["key"]) as other:
        for r in (other.get(path), other.delete(path), other.post(path, json={"servers": [{"id": "memory"}]})):
            assert r.status_code == 404, r.text
    assert sbx.exec("echo fine")["stdout"] == "fine\n"


def _parameters(fn) -> list:
    import inspect
    return [[p.name, p.kind.name, None if p.default is p.empty else repr(p.default)]
            for p in inspect.signature(fn).parameters.values()]


MCP_CALLS = {"runtime": ["catalog"], "sandbox": ["start", "get", "ready", "stop"]}


@pytest.mark.driver_independent
@pytest.mark.parametrize("driver", DRIVERS)
def test_our_python_sdk_has_the_same_calls(published_client, mdaemon, mapi, driver, monkeypatch):
    """Our SDK's runtime.mcp and sbx.mcp, blocking and awaitable, with the published client's
    names and parameters: the catalog, the filesystem server started and ready, the official MCP
    SDK connected with the answer's headers, a public start refused, stop."""
    skip_unless_driver(mdaemon, driver)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
    from withruntime import AsyncSandbox, Runtime, Sandbox
    from withruntime.errors import APIError
    for k, v in mdaemon.env().items():
        monkeypatch.setenv(k, v)
    sid = mapi.create_sandbox(driver=driver, memoryMiB=1024).id
    published = published_client.run_json(mdaemon, """
import inspect, json, sys
from withruntime import Runtime, Sandbox

def parameters(fn):
    return [[p.name, p.kind.name, None if p.default is p.empty else repr(p.default)]
            for p in inspect.signature(fn).parameters.values()]

owners = {"runtime": Runtime().mcp, "sandbox": Sandbox.connect(sys.argv[2]).mcp}
print(json.dumps({f"{k}.{n}": parameters(getattr(owners[k], n)) for k, ns in json.loads(sys.argv[1]).items() for n in ns}))
""", args=[json.dumps(MCP_CALLS), sid])
    from withruntime.async_sandbox import AsyncMcp, AsyncSandboxMcp
    from withruntime.sandbox import Mcp, SandboxMcp
    sbx = Sandbox.connect(sid)
    with Runtime() as rt:
        for kind, names in MCP_CALLS.items():
            sync_cls, async_cls = (Mcp, AsyncMcp) if kind == "runtime" else (SandboxMcp, AsyncSandboxMcp)
            for name in names:
                ours = getattr(rt.mcp if kind == "runtime" else sbx.mcp, name)
                assert _parameters(ours) == published[f"{kind}.{name}"], name
                assert _parameters(getattr(async_cls, name)) == _parameters(getattr(sync_cls, name)), name
        assert "filesystem" in {c["id"] for c in rt.mcp.catalog()}
    sbx.files.write("/workspace/hello.txt", "written by the test\n")
    assert sbx.mcp.get()["running"] is False
    with pytest.raises(APIError) as public:
        sbx.mcp.start([{"id": "filesystem"}], public=True)
    assert public.value.status == 501
    started = sbx.mcp.start([{"id": "filesystem"}], port=8812)
    assert started["port"] == 8812 and [s["id"] for s in started["servers"]] == ["filesystem"], started
    ready = sbx.mcp.ready(timeout=60, interval=0.5)
    fs = ready["servers"][0]
    assert ready["running"] is True and fs["status"] == "running", ready
    url, host = _local(fs["url"], mdaemon.preview_port)
    tools, text = asyncio.run(_read_through_sdk(url, host, ready["headers"]))
    assert "list_directory" in tools and "written by the test" in text, (tools, text)

    async def awaited():
        a = await AsyncSandbox.connect(sid)
        state = await a.mcp.ready(timeout=10, interval=0.2)
        stopped = await a.mcp.stop()
        after = await a.mcp.get()
        await a.close()
        return state, stopped, after

    state, stopped, after = asyncio.run(awaited())
    assert state["running"] is True and stopped is True and after["running"] is False, (state, after)
    assert sbx.mcp.stop() is False
    sbx.close()


@pytest.mark.driver_independent
@pytest.mark.parametrize("driver", DRIVERS)
def test_ts_sdk_mcp(js_build, mdaemon, mapi, driver):
    """The TypeScript SDK's runtime.mcp and sbx.mcp (sdk/js/test/mcp.test.mjs) from Node against
    this daemon: the catalog, hostile starts refused, the filesystem server ready, its URL 401
    without the header and answering initialize with it, stop."""
    skip_unless_driver(mdaemon, driver)
    if NODE is None:
        pytest.skip("node is not installed (scripts/install-deps.sh)")
    run_node("mcp.test.mjs", _env(mdaemon, driver, RUNTIME_TEST_PREVIEW_PORT=str(mdaemon.preview_port)), 600)


def test_a_server_that_never_answers_initialize_is_failed(mdaemon, mapi):
    """A server that starts and never speaks MCP: the gateway ends it after its 30 s and marks it
    failed saying so, and the other server of the start serves. A drill of 30 s and more, so only
    with RUNTIME_TEST_ALL=1 (the namespace driver: the limit is the gateway's, in the sandbox)."""
    if os.environ.get("RUNTIME_TEST_ALL") != "1":
        pytest.skip("waits out the gateway's 30 s limit on a server's initialize; RUNTIME_TEST_ALL=1 runs it")
    skip_unless_driver(mdaemon, "namespace")
    sbx = mapi.create_sandbox(driver="namespace", memoryMiB=1024)
    mute = "/opt/runtime-mcp/servers/node_modules/@modelcontextprotocol/server-memory/dist/index.js"
    assert sbx.exec(f"echo 'setInterval(() => {{}}, 1000);' | sudo tee {mute} >/dev/null")["exitCode"] == 0
    started = mapi.post(f"/v1/sandboxes/{sbx.id}/mcp", json={"servers": [{"id": "memory"}, {"id": "filesystem"}]})
    assert started.status_code == 200, started.text

    def settled():
        got = mapi.get(f"/v1/sandboxes/{sbx.id}/mcp").json()
        status = {s["id"]: s for s in got["servers"]}
        return status if status["memory"]["status"] == "failed" and status["filesystem"]["status"] == "running" \
            else None

    status = wait_until(settled, 90, 1, what="the mute server failed and the other running")
    assert "did not answer MCP's initialize within 30 s" in status["memory"]["error"], status
    # The mute server was ended, not left beside the gateway (whose own command line names it).
    node = "ps -eo comm=,args= | awk '$1 == \"node\" && /server-%s/'"
    assert sbx.exec(node % "filesystem")["stdout"].strip(), "the check finds no node server at all"
    left = sbx.exec(node % "memory")
    assert left["exitCode"] == 0 and left["stdout"].strip() == "", left
