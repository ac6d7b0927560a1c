"""Conformance: the published withruntime client (0.35.0, in a venv of its own) drives runtimed's
command surface: buffered and streamed exec, exec(check=True, timeout_ms=...), background
processes with their output, input, kill and wait, and its own four LlamaIndex tools driven by
the real llama-index-core agent against the scripted OpenAI-compatible server.

The sandbox is made by the suite (so each driver is chosen: the published client's create has
no driver field) and the published client attaches to it with Sandbox.connect. On the microVM,
emulated here, only a representative subset runs."""
from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "llm"))


PRELUDE = """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
"""


def test_exec_buffered_and_streamed(pub, sandbox):
    got = pub(PRELUDE + """
r = sbx.exec("echo out; echo err >&2; exit 3")
seen = []
s = sbx.exec("echo a; sleep 0.5; echo b", on_stdout=seen.append, timeout_ms=90_000)
events = list(sbx.exec_stream(["sh", "-c", "printf 'x\\\\377y'; echo e >&2"]))
root = sbx.exec("id -u", user="root")
mine = sbx.exec("id -un; echo $HOME", user="sandbox")
default = sbx.exec("id -u")
bg = sbx.spawn("id -u", user="root")
bg_default = sbx.spawn("id -u")
print(json.dumps({"buffered": [r.exit_code, r.stdout, r.stderr, r.timed_out],
                  "streamed": [s.exit_code, s.stdout, s.process_id, seen],
                  "events": events, "root": root.stdout, "mine": mine.stdout, "default": default.stdout,
                  "spawned": [bg.user, bg.wait().stdout, bg_default.user, bg_default.wait().stdout]}))
""", sandbox.id)
    assert got["buffered"] == [3, "out\n", "err\n", False]
    code, out, pid, seen = got["streamed"]
    assert code == 0 and out == "a\nb\n" and pid.startswith("proc_") and "".join(seen) == "a\nb\n"
    types = [e["type"] for e in got["events"]]
    assert types[0] == "start" and types[-1] == "exit", types
    assert got["events"][0]["process_id"] == got["events"][0]["processId"]
    outs = [e for e in got["events"] if e["type"] == "stdout"]
    assert any("base64" in e for e in outs), outs  # bytes that are not UTF-8 travel exactly
    assert got["events"][-1]["exit_code"] == 0 and got["events"][-1]["timedOut"] is False
    assert got["root"] == "0\n"
    # The unprivileged sandbox user by default, as the published product runs commands.
    assert got["mine"] == "sandbox\n/workspace\n" and got["default"] == "1000\n", got
    assert got["spawned"] == ["root", "0\n", "sandbox", "1000\n"], got["spawned"]


def test_exec_check_and_timeout(pub, sandbox, driver):
    # The emulated microVM needs seconds to start bash: a bound it can meet.
    short = 15_000 if driver == "microvm" else 1_000
    got = pub(PRELUDE + """
from withruntime import CommandError
out = {}
try:
    sbx.exec("echo no; exit 5", check=True, timeout_ms=30_000)
except CommandError as e:
    out["check"] = [type(e).__name__, str(e)[:300]]
ok = sbx.exec("echo yes", check=True, timeout_ms=30_000)
out["ok"] = [ok.exit_code, ok.stdout]
t = sbx.exec("echo started; sleep 100", timeout_ms=int(sys.argv[2]))
out["timeout"] = [t.timed_out, t.stdout]
long = sbx.exec("sleep 1; echo long", timeout_ms=120_000)  # over 60 s: the client streams it
out["long"] = [long.exit_code, long.stdout, long.process_id]
print(json.dumps(out))
""", sandbox.id, str(short))
    assert got["check"][0] == "CommandError", got
    assert got["ok"] == [0, "yes\n"]
    assert got["timeout"] == [True, "started\n"]
    assert got["long"][:2] == [0, "long\n"] and got["long"][2].startswith("proc_")


def test_spawn_processes_output_write_kill_wait(pub, sandbox, driver):
    if driver == "microvm":
        pytest.skip("microvm is emulated here: the streamed exec test stands for it")
    got = pub(PRELUDE + """
out = {}
p = sbx.spawn("echo one; sleep 1; echo two")
out["spawned"] = [p.id, p.state]
out["listed"] = [x["id"] for x in sbx.processes()]
out["got"] = sbx.process(p.id).id
r = p.wait()
out["wait"] = [r.exit_code, r.stdout, p.state]
out["output"] = [e for e in sbx.process(p.id).output()]
cat = sbx.spawn("cat", stdin="pipe")
cat.write("hello ")
cat.write(b"world", eof=True)
out["cat"] = cat.wait().stdout
sleeper = sbx.spawn("sleep 1000")
sleeper.kill("SIGKILL")
w = sleeper.wait()
out["killed"] = [w.exit_code, sleeper.state]
print(json.dumps(out))
""", sandbox.id)
    pid, state = got["spawned"]
    assert pid.startswith("proc_") and state == "running"
    assert pid in got["listed"] and got["got"] == pid
    assert got["wait"] == [0, "one\ntwo\n", "exited"]
    assert [e["type"] for e in got["output"]][-1] == "exit"
    assert got["cat"] == "hello world"
    assert got["killed"][1] == "killed", got["killed"]


def test_async_client(pub, sandbox, driver):
    if driver == "microvm":
        pytest.skip("microvm is emulated here: the sync tests stand for it")
    got = pub("""
import asyncio, json, sys
from withruntime import AsyncRuntime

async def main():
    sbx = await AsyncRuntime().sandboxes.get(sys.argv[1])
    r = await sbx.exec("echo async", timeout_ms=90_000, on_stdout=lambda s: None)
    p = await sbx.spawn("echo bg")
    w = await p.wait()
    return [r.stdout, r.process_id is not None, w.stdout]

print(json.dumps(asyncio.run(main())))
""", sandbox.id)
    assert got == ["async\n", True, "bg\n"]


@pytest.fixture
def llm_server():
    from scripted_openai import ScriptedOpenAI
    with ScriptedOpenAI() as server:
        yield server


TOOLS_SCRIPT = """
import asyncio, json, sys
from withruntime import Sandbox
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai import OpenAI
from withruntime.tools import sandbox_tools

sbx = Sandbox.connect(sys.argv[1])

async def main():
    llm = OpenAI(api_base=sys.argv[2], api_key="scripted", model="gpt-4o-mini")
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)], llm=llm)
    handler = agent.run(user_msg="write, run, list and read a program")
    calls = []
    async for ev in handler.stream_events():
        if isinstance(ev, ToolCallResult):
            calls.append([ev.tool_name, ev.tool_output.raw_output])
    return {"calls": calls, "answer": str(await handler)}

print(json.dumps(asyncio.run(main()), default=str))
"""


def test_sandbox_tools_with_llamaindex(pub, sandbox, llm_server, driver):
    nonce = secrets.token_hex(8)
    program = f"print('{nonce}'[::-1])\n"
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "runtime_write_file", "arguments": {"path": "prog.py", "content": program}}]},
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "python3 prog.py"}}]},
        {"tool_calls": [{"name": "runtime_list_files", "arguments": {"path": "."}}]},
        {"tool_calls": [{"name": "runtime_read_file", "arguments": {"path": "prog.py"}}]},
        {"content": "done: {tool_outputs}"},
    ]})
    got = pub(TOOLS_SCRIPT, sandbox.id, llm_server.base_url, timeout=600)
    names = [c[0] for c in got["calls"]]
    assert names == ["runtime_write_file", "runtime_exec", "runtime_list_files", "runtime_read_file"], got
    assert got["calls"][1][1]["exit_code"] == 0 and got["calls"][1][1]["stdout"] == nonce[::-1] + "\n"
    assert any(e["path"] == "/workspace/prog.py" for e in got["calls"][2][1]), got["calls"][2]
    assert got["calls"][3][1] == program
    assert sandbox.api.get_file(sandbox.id, "/workspace/prog.py").content == program.encode()
    assert nonce[::-1] in got["answer"]


