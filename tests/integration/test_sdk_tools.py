"""withruntime.tools against the real daemon: the four functions, sync and async, called
directly and through LlamaIndex's FunctionTool (which runs sync tools in worker threads),
truncation, and failures that come back as text."""
from __future__ import annotations

import asyncio
import inspect
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))

from withruntime import AsyncSandbox, Sandbox  # noqa: E402
from withruntime.tools import sandbox_tools  # noqa: E402

FunctionTool = pytest.importorskip("llama_index.core.tools").FunctionTool


# llama-index-core touches deprecated pydantic attributes while it runs; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DRIVER: str | None = None


def pick_fast_driver(daemon) -> str | None:
    """namespace or gvisor when the daemon offers one: the daemon's default may be microvm under
    TCG here, seconds per start; the samples that run as written keep the default."""
    r = httpx.get(daemon.base_url + "/v1/info", headers={"Authorization": f"Bearer {daemon.api_key}"})
    available = {d.get("name") for d in r.json().get("drivers", []) if d.get("available")}
    return next((d for d in ("namespace", "gvisor") if d in available), None)


@pytest.fixture
def sdk_env(daemon, monkeypatch):
    global DRIVER
    DRIVER = pick_fast_driver(daemon)
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    return daemon


@pytest.fixture
def sbx(sdk_env):
    with Sandbox.create(driver=DRIVER, timeout_seconds=600) as s:
        yield s


def by_name(fns):
    return {f.__name__: f for f in fns}


def test_schemas_describe_every_parameter(sbx):
    for fn in sandbox_tools(sbx):
        tool = FunctionTool.from_defaults(fn=fn)
        schema = tool.metadata.get_parameters_dict()
        assert set(schema["properties"]) == set(inspect.signature(fn).parameters)
        for name, prop in schema["properties"].items():
            assert prop.get("description"), (fn.__name__, name, schema)
        # What the model is told about the tool as a whole.
        assert tool.metadata.description.startswith(fn.__name__ + "(")
        assert tool.metadata.to_openai_tool()["function"]["parameters"] == schema


def test_sync_tools_drive_the_sandbox(sbx):
    t = by_name(sandbox_tools(sbx, timeout_seconds=30))
    assert t["runtime_write_file"]("calc/square.py", "import sys\nprint(int(sys.argv[1]) ** 2)\n") == \
        "wrote 40 bytes to /workspace/calc/square.py"
    out = t["runtime_exec"]("python3 square.py 12", cwd="calc")
    assert out == "exit code: 0\nstdout:\n144\nstderr: (empty)"
    assert t["runtime_read_file"]("calc/square.py").startswith("import sys")
    listing = t["runtime_list_files"](".", depth=2)
    assert "dir   calc/" in listing and "file  calc/square.py  (40 bytes)" in listing
    assert sbx.files.read_text("/workspace/calc/square.py").endswith("** 2)\n")


def test_exec_failure_and_timeout_as_text(sbx):
    t = by_name(sandbox_tools(sbx, timeout_seconds=2))
    out = t["runtime_exec"]("echo oops >&2; exit 4")
    assert out == "exit code: 4\nstdout: (empty)\nstderr:\noops"
    t0 = time.monotonic()
    out = t["runtime_exec"]("echo before; sleep 60", timeout_seconds=600)
    assert time.monotonic() - t0 < 20
    assert "capped at 2" in out and "timed out: yes" in out and "before" in out


def test_long_output_is_cut_keeping_the_end(sbx):
    t = by_name(sandbox_tools(sbx, max_output_chars=1000))
    out = t["runtime_exec"]("seq 1 200000")
    assert len(out) < 1200
    assert out.endswith("\n199999\n200000\nstderr: (empty)")
    dropped = int(out.split("[... ")[1].split(" characters cut")[0])
    full = len("".join(f"{i}\n" for i in range(1, 200001)))
    kept = out.split("cut from the start ...]\n")[1].split("\nstderr:")[0] + "\n"
    assert dropped + len(kept) == full
    sbx.files.write("/workspace/big.txt", "x" * 50000)
    out = t["runtime_read_file"]("big.txt")
    assert out.startswith("x" * 1000) and "has 50000 bytes" in out and len(out) < 1400


def test_missing_files_and_binary_as_text(sbx):
    t = by_name(sandbox_tools(sbx))
    assert t["runtime_read_file"]("nope.txt").startswith("error: reading 'nope.txt': not found")
    assert t["runtime_list_files"]("nope").startswith("error:")
    sbx.files.write("/workspace/b.bin", b"\x00\x01\x02" * 10)
    assert "binary file of 30 bytes" in t["runtime_read_file"]("b.bin")
    assert "is a directory" in t["runtime_read_file"](".")


def test_stopped_sandbox_answers_in_text(sbx):
    t = by_name(sandbox_tools(sbx))
    sbx.stop()
    for name, args in [("runtime_exec", ("echo hi",)), ("runtime_read_file", ("a",)),
                       ("runtime_write_file", ("a", "b")), ("runtime_list_files", ())]:
        out = t[name](*args)
        assert out.startswith("error:"), (name, out)
    assert "not running" in t["runtime_exec"]("echo hi")


def test_function_tools_in_parallel_threads(sbx):
    tools = [FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)]
    exec_tool = tools[0]

    async def many():
        # FunctionTool.acall runs a sync function in a worker thread: these run at once.
        return await asyncio.gather(*[exec_tool.acall(command=f"sleep 1; echo job {i}") for i in range(8)])

    t0 = time.monotonic()
    outs = asyncio.run(many())
    elapsed = time.monotonic() - t0
    for i, o in enumerate(outs):
        assert f"job {i}" in o.content and not o.is_error, o
    assert elapsed < 7, f"8 one-second commands took {elapsed:.1f}s: not run concurrently"


def test_async_tools(sdk_env):
    async def go():
        async with AsyncSandbox.create(driver=DRIVER, timeout_seconds=300) as asbx:
            fns = sandbox_tools(asbx, timeout_seconds=30)
            assert all(inspect.iscoroutinefunction(f) for f in fns)
            t = by_name(fns)
            assert (await t["runtime_write_file"]("a.py", "print(sum(range(10)))")).startswith("wrote 21 bytes")
            outs = await asyncio.gather(*[t["runtime_exec"](f"python3 a.py; echo {i}") for i in range(5)])
            for i, o in enumerate(outs):
                assert o == f"exit code: 0\nstdout:\n45\n{i}\nstderr: (empty)"
            assert "file  a.py  (21 bytes)" in await t["runtime_list_files"]()
            assert await t["runtime_read_file"]("a.py") == "print(sum(range(10)))"
            tool = FunctionTool.from_defaults(async_fn=fns[0])
            res = await tool.acall(command="echo via tool")
            assert "via tool" in res.content
            await asbx.stop()
            assert (await t["runtime_exec"]("true")).startswith("error:")

    asyncio.run(go())
