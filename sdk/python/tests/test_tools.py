from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any, Dict

import httpx
import pytest

from fakedaemon import FakeDaemon, api_error
from withruntime import AsyncSandbox, Sandbox
from withruntime.tools import sandbox_tools

NAMES = ["runtime_exec", "runtime_read_file", "runtime_write_file", "runtime_list_files"]


def exec_answer(stdout: str = "", stderr: str = "", code: int = 0, timed_out: bool = False,
                chunk: int = 4096) -> httpx.Response:
    """A streamed exec as the daemon sends it: output events, then the exit."""
    events: list = [{"type": "start", "pid": 7}]
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        for i in range(0, len(text), chunk):
            events.append({"type": name, "data": text[i : i + chunk]})
    events.append({"type": "exit", "exitCode": code, "timedOut": timed_out, "durationMs": 1})
    body = "".join(json.dumps(e) + "\n" for e in events).encode()
    return httpx.Response(200, content=body, headers={"Content-Type": "application/x-ndjson"})


@pytest.fixture
def tools(fake: FakeDaemon, sbx: Sandbox) -> Dict[str, Any]:
    return {f.__name__: f for f in sandbox_tools(sbx, max_output_chars=500, timeout_seconds=120)}


def test_four_plain_functions(sbx) -> None:
    fns = sandbox_tools(sbx)
    assert [f.__name__ for f in fns] == NAMES
    assert not any(inspect.iscoroutinefunction(f) for f in fns)
    params = {f.__name__: list(inspect.signature(f).parameters) for f in fns}
    assert params == {"runtime_exec": ["command", "cwd", "timeout_seconds"], "runtime_read_file": ["path"],
                      "runtime_write_file": ["path", "content"], "runtime_list_files": ["path", "depth"]}


def test_async_sandbox_gives_coroutines(fake) -> None:
    async def go() -> None:
        sbx = await AsyncSandbox.connect("sbx_1", _transport=httpx.MockTransport(fake))
        fns = sandbox_tools(sbx)
        assert [f.__name__ for f in fns] == NAMES
        assert all(inspect.iscoroutinefunction(f) for f in fns)
        fake.on("POST", "/v1/sandboxes/sbx_1:exec", exec_answer("async out\n"))
        assert "async out" in await fns[0]("echo")
        await sbx.close()

    asyncio.run(go())


def test_bad_arguments_to_sandbox_tools(sbx) -> None:
    with pytest.raises(ValueError):
        sandbox_tools(sbx, root="relative")
    with pytest.raises(ValueError):
        sandbox_tools(sbx, timeout_seconds=0)
    with pytest.raises(ValueError):
        sandbox_tools(sbx, max_output_chars=10)
    with pytest.raises(TypeError):
        sandbox_tools(object())  # type: ignore[arg-type]


def test_exec_text_and_request(fake, tools) -> None:
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", exec_answer("42\n", "warn\n", 3))
    out = tools["runtime_exec"]("python3 x.py", cwd="sub", timeout_seconds=30)
    assert out == "exit code: 3\nstdout:\n42\nstderr:\nwarn"
    body = fake.last_json()
    assert body["command"] == "python3 x.py" and body["cwd"] == "/workspace/sub" and body["timeoutMs"] == 30000
    assert body["stream"] is True
    tools["runtime_exec"]("true")
    assert fake.last_json()["cwd"] == "/workspace" and fake.last_json()["timeoutMs"] == 120000


def test_exec_timeout_is_capped_and_reported(fake, tools) -> None:
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", exec_answer("", "", 137, True))
    out = tools["runtime_exec"]("sleep 1000", timeout_seconds=99999)
    assert fake.last_json()["timeoutMs"] == 120000
    assert "capped at 120" in out and "timed out: yes" in out and "120 s" in out
    assert "not a number" not in tools["runtime_exec"]("x", timeout_seconds="5")  # type: ignore[arg-type]
    assert fake.last_json()["timeoutMs"] == 5000
    assert tools["runtime_exec"]("x", timeout_seconds="soon").startswith("error:")  # type: ignore[arg-type]


def test_long_output_keeps_its_end(fake, tools) -> None:
    text = "".join(f"line {i}\n" for i in range(5000))
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", exec_answer(text, "E" * 10))
    out = tools["runtime_exec"]("seq")
    assert len(out) < 700
    assert "line 4999" in out and "line 0\n" not in out
    dropped = int(out.split("[... ")[1].split(" ")[0])
    kept = out.split("characters cut from the start ...]\n")[1].split("\nstderr:")[0] + "\n"
    assert dropped + len(kept) == len(text)
    assert kept.startswith("line ")  # cut on a line boundary
    assert "EEEEEEEEEE" in out


def test_cut_count_is_exact_beyond_what_is_kept(fake, tools) -> None:
    # 2 MB of output: far more than the 2000 bytes kept, and every character is counted.
    text = "".join(f"{i:07d}\n" for i in range(250000))
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", exec_answer(text, chunk=1000))
    out = tools["runtime_exec"]("x")
    dropped = int(out.split("[... ")[1].split(" ")[0])
    kept = out.split("characters cut from the start ...]\n")[1].split("\nstderr:")[0] + "\n"
    assert dropped + len(kept) == len(text)
    assert kept.endswith("0249999\n") and kept.startswith("0")


def test_failures_are_text(fake, tools) -> None:
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", api_error(409, "conflict", "sandbox sbx_1 is not running"))
    out = tools["runtime_exec"]("echo")
    assert out.startswith("error:") and "not running" in out
    fake.on("GET", "/v1/sandboxes/sbx_1/files/stat", api_error(404, "not_found", "no such file /workspace/x"))
    assert "not found" in tools["runtime_read_file"]("x")
    fake.on("GET", "/v1/sandboxes/sbx_1/files/stat", httpx.Response(200, json={"path": "/workspace/x", "exists": False}))
    assert "not found" in tools["runtime_read_file"]("x")
    assert tools["runtime_exec"]("").startswith("error:")
    assert tools["runtime_read_file"]("").startswith("error:")

    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    fake.on("GET", "/v1/sandboxes/sbx_1/files/list", boom)
    out = tools["runtime_list_files"]()
    assert out.startswith("error:") and "could not be reached" in out


def test_read_write_list(fake, tools) -> None:
    fake.on("GET", "/v1/sandboxes/sbx_1/files/stat",
            lambda r: httpx.Response(200, json={"path": r.url.params["path"], "name": "a", "type": "file", "size": 5}))
    fake.on("GET", "/v1/sandboxes/sbx_1/files/content", httpx.Response(200, content=b"hello"))
    assert tools["runtime_read_file"]("a.txt") == "hello"
    assert fake.requests[-1].url.params["path"] == "/workspace/a.txt"
    fake.on("PUT", "/v1/sandboxes/sbx_1/files/content",
            lambda r: httpx.Response(200, json={"path": r.url.params["path"], "size": len(r.content)}))
    assert tools["runtime_write_file"]("d/../b.py", "print(1)\n") == "wrote 9 bytes to /workspace/b.py"
    assert tools["runtime_write_file"]("/tmp/abs", "x") == "wrote 1 bytes to /tmp/abs"
    fake.on("GET", "/v1/sandboxes/sbx_1/files/list", httpx.Response(200, json={"path": "/workspace", "entries": [
        {"path": "/workspace/b.py", "name": "b.py", "type": "file", "size": 9},
        {"path": "/workspace/d", "name": "d", "type": "dir"},
        {"path": "/workspace/l", "name": "l", "type": "symlink", "target": "/etc"}]}))
    out = tools["runtime_list_files"](".", depth=99)
    assert fake.requests[-1].url.params["depth"] == "10"
    assert out.splitlines() == ["/workspace (depth 10, 3 entries):", "file  b.py  (9 bytes)", "dir   d/",
                                "link  l -> /etc"]


def test_binary_and_large_files(fake, tools) -> None:
    fake.on("GET", "/v1/sandboxes/sbx_1/files/stat",
            lambda r: httpx.Response(200, json={"path": r.url.params["path"], "name": "x", "type": "file",
                                                "size": 4 if "bin" in r.url.params["path"] else 100000}))
    fake.on("GET", "/v1/sandboxes/sbx_1/files/content", httpx.Response(200, content=b"\x00\x01\x02\x03"))
    assert "binary file of 4 bytes" in tools["runtime_read_file"]("x.bin")
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", httpx.Response(200, json={
        "exitCode": 0, "stdout": "y" * 2000, "stderr": "", "timedOut": False,
        "stdoutTruncated": False, "stderrTruncated": False, "durationMs": 1}))
    out = tools["runtime_read_file"]("big.txt")
    assert fake.last_json()["argv"] == ["head", "-c", "2000", "--", "/workspace/big.txt"]
    assert out.startswith("y" * 500) and "has 100000 bytes" in out and len(out) < 800


def test_schema_has_a_description_for_every_parameter(sbx) -> None:
    FunctionTool = pytest.importorskip("llama_index.core.tools").FunctionTool
    for fn in sandbox_tools(sbx):
        tool = FunctionTool.from_defaults(fn=fn)
        assert tool.metadata.name == fn.__name__
        schema = tool.metadata.get_parameters_dict()
        props = schema["properties"]
        assert set(props) == set(inspect.signature(fn).parameters)
        for name, prop in props.items():
            assert prop.get("description"), f"{fn.__name__}.{name} has no description: {json.dumps(schema)}"
        assert schema.get("required", []) == [p for p, v in inspect.signature(fn).parameters.items()
                                             if v.default is inspect.Parameter.empty]
