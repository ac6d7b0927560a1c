"""runtimed speaks MCP (docs/mcp.md): POST /mcp over the streamable HTTP transport, under the REST
API's keys. The official MCP Python SDK connects with a key, lists the tools, creates a sandbox on
each driver, runs a command, writes, reads and lists files and deletes it; LlamaIndex's McpToolSpec
(llama-index-tools-mcp) lists and calls the same tools; and raw requests try what a hostile or
broken client sends: no key, a wrong key, a read key calling a mutating tool, another owner's
sandbox, a huge body, malformed JSON, a wrong JSON-RPC version, an unknown method, bad arguments,
an unknown session. The daemon and the sandbox go on unaffected. Against the real daemon."""
from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest

from helpers import Api, assert_error
from test_fleet_forward import pair  # noqa: F401 (a fixture: two hosts on one PostgreSQL)

mcp = pytest.importorskip("mcp", reason="the MCP Python SDK (tests/requirements.txt: mcp) is not installed")
from mcp import ClientSession  # noqa: E402

TOOLS = {"create_sandbox", "list_sandboxes", "exec", "read_file", "write_file", "list_files", "delete_sandbox"}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _url(daemon) -> str:
    return f"{daemon.base_url}/mcp"


def make_key(api: Api, **body) -> str:
    r = api.post("/v1/keys", json=body)
    assert r.status_code == 201, r.text
    return r.json()["key"]


def _transport(url: str, key: str):
    """The SDK's streamable HTTP client with the key, in its current spelling or its older one."""
    from mcp.client import streamable_http as sh
    if hasattr(sh, "streamable_http_client"):
        client = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"},
                                   timeout=httpx.Timeout(60, read=300))
        return client, sh.streamable_http_client(url, http_client=client)
    return None, sh.streamablehttp_client(url, headers={"Authorization": f"Bearer {key}"})


async def _with_session(url: str, key: str, body):
    client, transport = _transport(url, key)
    try:
        async with transport as (read, write, _):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                return await body(s, init)
    finally:
        if client is not None:
            await client.aclose()


def structured(res) -> dict:
    """A tool's JSON answer: its structuredContent, which must equal its text content."""
    assert not res.isError, res.content
    text = json.loads(res.content[0].text)
    if res.structuredContent is not None:
        assert res.structuredContent == text
    return text


def tool_error(res) -> str:
    assert res.isError, res
    return res.content[0].text


# ---------------------------------------------------------------------------
# The official SDK, end to end


@pytest.mark.parametrize("drv", ["namespace", "gvisor"])
def test_sdk_lists_and_calls_every_tool(daemon, api, drv):
    from helpers import skip_unless_driver
    skip_unless_driver(daemon, drv)

    async def body(s: ClientSession, init):
        assert init.serverInfo.name == "runtimed"
        assert init.protocolVersion == mcp.types.LATEST_PROTOCOL_VERSION
        assert init.capabilities.tools is not None
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert set(tools) == TOOLS
        for t in tools.values():
            assert t.inputSchema["type"] == "object" and t.description
        assert tools["exec"].inputSchema["required"] == ["sandboxId", "command"]
        assert tools["read_file"].annotations.readOnlyHint is True
        assert tools["delete_sandbox"].annotations.destructiveHint is True
        await s.send_ping()

        sbx = structured(await s.call_tool("create_sandbox", {"driver": drv, "timeoutSeconds": 600}))
        sid = sbx["id"]
        api.created.append(sid)
        assert sbx["state"] == "running" and sbx["driver"] == drv
        assert any(x["id"] == sid for x in structured(await s.call_tool("list_sandboxes", {}))["sandboxes"])

        out = structured(await s.call_tool("exec", {"sandboxId": sid,
                                                    "command": "echo hi; echo oops >&2; exit 3"}))
        assert (out["exitCode"], out["stdout"], out["stderr"]) == (3, "hi\n", "oops\n")
        assert out["timedOut"] is False
        # Output is bounded: the tail is kept and the cut said.
        big = structured(await s.call_tool("exec", {"sandboxId": sid, "maxOutputBytes": 1000,
                                                    "command": "head -c 100000 /dev/zero | tr '\\0' a"}))
        assert len(big["stdout"]) == 1000 and big["stdoutTruncated"] is True
        # A timeout is a result.
        slow = structured(await s.call_tool("exec", {"sandboxId": sid, "command": "sleep 30",
                                                     "timeoutMs": 500}))
        assert slow["timedOut"] is True

        w = structured(await s.call_tool("write_file", {"sandboxId": sid, "path": "notes/a.txt",
                                                        "content": "héllo\n"}))
        assert w == {"path": "/workspace/notes/a.txt", "size": len("héllo\n".encode())}
        r = structured(await s.call_tool("read_file", {"sandboxId": sid, "path": "/workspace/notes/a.txt"}))
        assert r["content"] == "héllo\n" and r["encoding"] == "text"
        blob = bytes(range(256))
        structured(await s.call_tool("write_file", {"sandboxId": sid, "path": "b.bin", "encoding": "base64",
                                                    "content": base64.b64encode(blob).decode()}))
        assert "base64" in tool_error(await s.call_tool("read_file", {"sandboxId": sid, "path": "b.bin"}))
        rb = structured(await s.call_tool("read_file", {"sandboxId": sid, "path": "b.bin",
                                                        "encoding": "base64"}))
        assert base64.b64decode(rb["content"]) == blob
        ls = structured(await s.call_tool("list_files", {"sandboxId": sid}))
        kinds = {e["name"]: e["type"] for e in ls["entries"]}
        assert kinds["notes"] == "directory" and kinds["b.bin"] == "file"
        deep = structured(await s.call_tool("list_files", {"sandboxId": sid, "path": "/workspace", "depth": 2}))
        assert any(e["path"] == "/workspace/notes/a.txt" for e in deep["entries"])
        # What the tool wrote, the REST API reads: one sandbox, two doors.
        assert api.get(f"/v1/sandboxes/{sid}/files/content",
                       params={"path": "/workspace/notes/a.txt"}).content == "héllo\n".encode()
        # A file over the tool's bound is refused with what to do instead.
        structured(await s.call_tool("exec", {"sandboxId": sid,
                                              "command": "head -c 2000000 /dev/zero > /workspace/big"}))
        assert "payload_too_large" in tool_error(await s.call_tool("read_file", {"sandboxId": sid,
                                                                                 "path": "big"}))
        assert "not_found" in tool_error(await s.call_tool("read_file", {"sandboxId": sid, "path": "nope"}))

        gone = structured(await s.call_tool("delete_sandbox", {"sandboxId": sid}))
        assert gone == {"id": sid, "state": "deleted"}
        assert "not_found" in tool_error(await s.call_tool("exec", {"sandboxId": sid, "command": "true"}))
        return sid

    sid = asyncio.run(_with_session(_url(daemon), daemon.api_key, body))
    assert api.get(f"/v1/sandboxes/{sid}").status_code == 404
    # The audit trail has each tool that changed something, with its sandbox; reads and pings
    # are not in it, as a GET is not.
    trail = api.get("/v1/audit", params={"sandboxId": sid, "limit": 100}).json()["events"]
    tools = [e["detail"]["tool"] for e in reversed(trail) if e["action"] == "mcp.call"]
    assert tools[0] == "create_sandbox" and tools[-2:] == ["delete_sandbox", "exec"], tools
    assert set(tools) == {"create_sandbox", "exec", "write_file", "delete_sandbox"}, tools
    # The exec after the delete failed (not_found), and says so.
    failed = [e for e in trail if e["action"] == "mcp.call" and e["detail"].get("isError")]
    assert [e["detail"]["tool"] for e in failed] == ["exec"], failed


# ---------------------------------------------------------------------------
# LlamaIndex's MCP tool spec


def test_llamaindex_tool_spec_lists_and_calls(daemon, api, any_driver):
    try:
        from llama_index.tools.mcp import BasicMCPClient, McpToolSpec
    except ImportError as e:  # pragma: no cover - the suite installs it (tests/requirements.txt)
        pytest.skip(f"llama-index-tools-mcp is not installed: {e}")

    async def run():
        client = BasicMCPClient(_url(daemon), headers={"Authorization": f"Bearer {daemon.api_key}"})
        spec = McpToolSpec(client=client)
        tools = {t.metadata.name: t for t in await spec.to_tool_list_async()}
        assert set(tools) == TOOLS
        # The schema reaches the agent's function-calling description.
        params = tools["exec"].metadata.get_parameters_dict()
        assert {"sandboxId", "command"} <= set(params["properties"])

        def answer(out):
            raw = out.raw_output
            assert not raw.isError, raw.content
            return json.loads(raw.content[0].text)

        sbx = answer(await tools["create_sandbox"].acall(driver=any_driver))
        api.created.append(sbx["id"])
        res = answer(await tools["exec"].acall(sandboxId=sbx["id"], command="python3 -c 'print(6 * 7)'"))
        assert res["exitCode"] == 0 and res["stdout"] == "42\n"
        answer(await tools["write_file"].acall(sandboxId=sbx["id"], path="x.py", content="print(1)\n"))
        assert answer(await tools["read_file"].acall(sandboxId=sbx["id"], path="x.py"))["content"] == "print(1)\n"
        answer(await tools["delete_sandbox"].acall(sandboxId=sbx["id"]))
        return sbx["id"]

    sid = asyncio.run(run())
    assert api.get(f"/v1/sandboxes/{sid}").status_code == 404


# ---------------------------------------------------------------------------
# Raw requests: the transport's rules and what a hostile client sends


class Raw:
    """JSON-RPC over POST /mcp by hand, with one session."""

    def __init__(self, daemon, key: str, version: str = "2025-06-18"):
        self.c = httpx.Client(base_url=daemon.base_url, timeout=120,
                              headers={**HEADERS, "Authorization": f"Bearer {key}"})
        self.n = 0
        r = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                       "params": {"protocolVersion": version, "capabilities": {},
                                  "clientInfo": {"name": "test", "version": "1"}}})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/json")
        self.version = r.json()["result"]["protocolVersion"]
        self.session = r.headers["mcp-session-id"]
        assert len(self.session) == 32
        r = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert r.status_code == 202 and r.content == b"", r.text

    def post(self, body, session: str | None = None, **kw) -> httpx.Response:
        headers = kw.pop("headers", {})
        sid = session if session is not None else getattr(self, "session", None)
        if sid:
            headers["Mcp-Session-Id"] = sid
        if hasattr(self, "version"):
            headers.setdefault("MCP-Protocol-Version", self.version)
        if "content" in kw:
            return self.c.post("/mcp", headers=headers, **kw)
        return self.c.post("/mcp", headers=headers, content=json.dumps(body))

    def call(self, method: str, params: dict | None = None) -> dict:
        self.n += 1
        msg = {"jsonrpc": "2.0", "id": self.n, "method": method}
        if params is not None:
            msg["params"] = params
        r = self.post(msg)
        assert r.status_code in (200, 400), r.text
        return r.json()

    def tool(self, name: str, args) -> dict:
        res = self.call("tools/call", {"name": name, "arguments": args})
        assert "result" in res, res
        return res["result"]

    def close(self):
        self.c.close()


def rpc_error(r: httpx.Response, status: int, code: int) -> str:
    assert r.status_code == status, f"{r.status_code}: {r.text}"
    body = r.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == code, body
    return body["error"]["message"]


@pytest.fixture
def raw(daemon):
    made: list[Raw] = []

    def make(key: str | None = None, **kw) -> Raw:
        c = Raw(daemon, key or daemon.api_key, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def test_keys_and_access(daemon, api, raw, any_driver):
    sbx = api.create_sandbox(driver=any_driver)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    with httpx.Client(base_url=daemon.base_url, headers=HEADERS, timeout=30) as c:
        assert_error(c.post("/mcp", json=init), 401, "unauthorized")
        assert_error(c.post("/mcp", json=init, headers={"Authorization": "Bearer rt_" + "x" * 40}), 401,
                     "unauthorized")

    # A read key lists and reads; it creates, runs, writes and deletes nothing.
    reader = raw(make_key(api, name="mcp-read", access="read"))
    assert {t["name"] for t in reader.call("tools/list")["result"]["tools"]} == TOOLS
    assert any(x["id"] == sbx.id for x in reader.tool("list_sandboxes", {})["structuredContent"]["sandboxes"])
    for name, args in [("create_sandbox", {}), ("exec", {"sandboxId": sbx.id, "command": "touch /workspace/r"}),
                       ("write_file", {"sandboxId": sbx.id, "path": "r", "content": "x"}),
                       ("delete_sandbox", {"sandboxId": sbx.id})]:
        res = reader.tool(name, args)
        assert res["isError"] is True and res["content"][0]["text"].startswith("forbidden:"), (name, res)
    assert api.sandbox(sbx.id)["state"] == "running"
    assert api.get(f"/v1/sandboxes/{sbx.id}/files/stat", params={"path": "/workspace/r"}).json()["exists"] is False

    # Another owner's key finds no sandbox of the first, whatever it asks.
    other = raw(make_key(api, name="mcp-other", owner="mcp-other"))
    for name, args in [("exec", {"sandboxId": sbx.id, "command": "true"}),
                       ("read_file", {"sandboxId": sbx.id, "path": "/etc/hostname"}),
                       ("list_files", {"sandboxId": sbx.id}),
                       ("delete_sandbox", {"sandboxId": sbx.id})]:
        res = other.tool(name, args)
        assert res["isError"] is True and res["content"][0]["text"].startswith("not_found:"), (name, res)
    assert all(x["id"] != sbx.id for x in other.tool("list_sandboxes", {})["structuredContent"]["sandboxes"])
    # A session belongs to the key that opened it.
    r = other.post({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, session=reader.session)
    rpc_error(r, 404, -32600)
    assert api.sandbox(sbx.id)["state"] == "running"


def test_transport_rules_and_bad_input(daemon, api, raw, any_driver):
    sbx = api.create_sandbox(driver=any_driver)
    s = raw()
    assert s.version == "2025-06-18"
    # An unknown version is answered with the latest; the client decides.
    assert raw(version="1999-01-01").version == "2025-11-25"

    # No session, an unknown one, one ended: the transport's 400 and 404s.
    rpc_error(s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, session=""), 400, -32600)
    rpc_error(s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, session="0" * 32), 404, -32600)
    rpc_error(s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, session="../../etc"), 404, -32600)
    ended = raw()
    with httpx.Client(base_url=daemon.base_url, timeout=30,
                      headers={"Authorization": f"Bearer {daemon.api_key}"}) as c:
        assert c.delete("/mcp", headers={"Mcp-Session-Id": ended.session}).status_code == 200
        assert_error(c.delete("/mcp", headers={"Mcp-Session-Id": ended.session}), 404, "not_found")
        # No server-sent stream is offered: GET is a 405, as the transport allows.
        r = c.get("/mcp", headers={"Accept": "text/event-stream"})
        assert r.status_code == 405 and "POST" in r.headers["allow"]
    rpc_error(ended.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}), 404, -32600)

    # Malformed and hostile bodies: JSON-RPC errors, nothing else.
    assert "not JSON" in rpc_error(s.post(None, content=b'{"jsonrpc": "2.0", "id": 1, "meth'), 400, -32700)
    rpc_error(s.post(None, content=b"[" * 100000 + b"]" * 100000), 400, -32700)
    rpc_error(s.post(None, content=b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}'), 400, -32700)
    rpc_error(s.post(None, content=b'"ping"'), 400, -32600)
    rpc_error(s.post(None, content=b"[]"), 400, -32600)
    assert "2.0" in rpc_error(s.post({"jsonrpc": "1.0", "id": 1, "method": "ping"}), 400, -32600)
    rpc_error(s.post({"id": 1, "method": "ping"}), 400, -32600)
    rpc_error(s.post({"jsonrpc": "2.0", "id": None, "method": "ping"}), 400, -32600)
    rpc_error(s.post({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}), 400, -32600)
    rpc_error(s.post({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}), 400, -32600)
    assert s.call("ping") == {"jsonrpc": "2.0", "id": s.n, "result": {}}
    assert s.call("resources/list")["error"]["code"] == -32601
    assert s.call("no/such/method")["error"]["code"] == -32601
    # initialize always opens a session of its own, the one it came in untouched.
    r = s.post({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}})
    assert r.status_code == 200 and r.headers["mcp-session-id"] != s.session
    assert s.call("ping")["result"] == {}
    rpc_error(s.post({"jsonrpc": "2.0", "id": 7, "method": "initialize"}), 400, -32602)
    rpc_error(s.post({"jsonrpc": "2.0", "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}),
              400, -32600)
    # A huge body is refused whole before any parse, with the API's error shape.
    r = s.post(None, content=b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * (5 << 20)
               + b'"}}')
    assert_error(r, 413, "payload_too_large")
    # Wrong headers.
    rpc_error(s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"Accept": "text/html"}), 406, -32600)
    rpc_error(s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"MCP-Protocol-Version": "0"}), 400,
              -32600)
    rpc_error(s.post(None, content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
                     headers={"Content-Type": "text/plain"}), 415, -32600)

    # Tool calls with bad arguments: protocol errors for the call's shape, tool errors for its
    # arguments (the model reads those and corrects itself).
    assert s.call("tools/call", {"name": "no_such_tool", "arguments": {}})["error"]["code"] == -32602
    assert s.call("tools/call", {"arguments": {}})["error"]["code"] == -32602
    assert s.call("tools/call", {"name": "exec", "arguments": [1]})["error"]["code"] == -32602
    for args, says in [({"sandboxId": sbx.id}, "command is required"),
                       ({"sandboxId": sbx.id, "command": 5}, "command must be a string"),
                       ({"sandboxId": "sbx_../../x", "command": "true"}, "sandboxId"),
                       ({"sandboxId": sbx.id, "command": "true", "stream": True}, "unknown argument stream"),
                       ({"sandboxId": sbx.id, "command": "true", "timeoutMs": 10 ** 9}, "timeoutMs"),
                       ({"sandboxId": sbx.id, "command": "true", "cwd": "x" * 5000}, "cwd")]:
        res = s.tool("exec", args)
        assert res["isError"] is True and says in res["content"][0]["text"], (args, res)
    res = s.tool("read_file", {"sandboxId": sbx.id, "path": "/etc/hostname", "encoding": "hex"})
    assert res["isError"] is True and "encoding" in res["content"][0]["text"]
    res = s.tool("write_file", {"sandboxId": sbx.id, "path": "x", "content": "!!", "encoding": "base64"})
    assert res["isError"] is True and "base64" in res["content"][0]["text"]
    res = s.tool("list_files", {"sandboxId": sbx.id, "depth": 99})
    assert res["isError"] is True and "depth" in res["content"][0]["text"]
    res = s.tool("create_sandbox", {"driver": "no-such-driver"})
    assert res["isError"] is True and res["content"][0]["text"].startswith("invalid_request:")

    # Batches: refused under 2025-06-18, which removed them; answered in order under 2025-03-26.
    batch = [{"jsonrpc": "2.0", "id": "a", "method": "ping"},
             {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "z"}},
             {"jsonrpc": "2.0", "id": "b", "method": "tools/list"},
             {"jsonrpc": "1.0", "id": "c", "method": "ping"}]
    assert "batches" in rpc_error(s.post(batch), 400, -32600)
    old = raw(version="2025-03-26")
    assert old.version == "2025-03-26"
    answers = old.post(batch).json()
    assert [a["id"] for a in answers] == ["a", "b", "c"]
    assert answers[0]["result"] == {} and len(answers[1]["result"]["tools"]) == len(TOOLS)
    assert answers[2]["error"]["code"] == -32600
    assert "structuredContent" not in old.tool("list_sandboxes", {})
    r = old.post([{"jsonrpc": "2.0", "method": "notifications/initialized"}])
    assert r.status_code == 202 and r.content == b""
    rpc_error(old.post([{"jsonrpc": "2.0", "id": 1, "method": "ping"}] * 33), 400, -32600)

    # Through all of it the daemon and the sandbox went on.
    out = s.tool("exec", {"sandboxId": sbx.id, "command": "echo still here"})
    assert out["structuredContent"]["stdout"] == "still here\n"
    assert api.get("/healthz").status_code == 200
    assert sbx.exec("true")["exitCode"] == 0


def test_sessions_bounded_per_owner(daemon, api, raw):
    """Past its owner's bound a new session ends the owner's least recently used one, which the
    client learns by a 404 and initializes again; other owners' sessions are not touched."""
    bystander = raw(make_key(api, name="mcp-bystander", owner="mcp-bystander"))
    key = make_key(api, name="mcp-many", owner="mcp-many")
    first = raw(key)
    rest = [raw(key) for _ in range(32)]
    rpc_error(first.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}), 404, -32600)
    for s in rest:
        assert "result" in s.call("ping")
    assert "result" in bystander.call("ping")


# ---------------------------------------------------------------------------
# A fleet: the endpoint serves the sandboxes of the host it is asked on


def test_fleet_another_hosts_sandbox_is_named_not_touched(pair, raw):
    """A sandbox that host a runs, asked of host b's /mcp: exec, reads and delete say which host
    runs it and touch nothing (the REST API forwards; this endpoint does not); host a's /mcp
    serves it."""
    from test_fleet_forward import _on_a
    a, b = pair
    with Api(a) as ca:
        sbx = _on_a(pair, ca, driver="namespace")
        on_b = Raw(b, b.api_key)
        try:
            for name, args in [("exec", {"sandboxId": sbx.id, "command": "touch /workspace/x"}),
                               ("read_file", {"sandboxId": sbx.id, "path": "/etc/hostname"}),
                               ("delete_sandbox", {"sandboxId": sbx.id})]:
                res = on_b.tool(name, args)
                assert res["isError"] is True, (name, res)
                assert "runs on host fwd-a" in res["content"][0]["text"], (name, res)
        finally:
            on_b.close()
        assert ca.sandbox(sbx.id)["state"] == "running"
        on_a = Raw(a, a.api_key)
        try:
            out = on_a.tool("exec", {"sandboxId": sbx.id, "command": "ls /workspace"})
            assert out["structuredContent"] == {**out["structuredContent"], "exitCode": 0, "stdout": ""}
        finally:
            on_a.close()
