"""The real llama-index-core agent (FunctionAgent) with llama-index-llms-openai, talking to the
scripted OpenAI-compatible server on 127.0.0.1 and driving a real sandbox through the SDK's
tools. Checks that each command reached the sandbox, that its real output reached the model
and the answer, and that the analyst's number was computed by Python in the sandbox."""
from __future__ import annotations

import asyncio
import csv
import io
import json
import random
import secrets
import sys
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
sys.path.insert(0, str(REPO / "tests" / "llm"))

pytest.importorskip("llama_index.core")
pytest.importorskip("llama_index.llms.openai")

from llama_index.core import Document, VectorStoreIndex  # noqa: E402
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult  # noqa: E402
from llama_index.core.embeddings import MockEmbedding  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.tools import FunctionTool, QueryEngineTool  # noqa: E402
from llama_index.llms.openai import OpenAI  # noqa: E402
from scripted_openai import ScriptedOpenAI  # noqa: E402

from withruntime import AsyncSandbox, Sandbox  # noqa: E402
from withruntime.tools import sandbox_tools  # noqa: E402


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
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return daemon


@pytest.fixture
def llm_server():
    with ScriptedOpenAI() as server:
        yield server


def make_llm(server: ScriptedOpenAI) -> OpenAI:
    return OpenAI(api_base=server.base_url, api_key="test", model="gpt-4o-mini")


def tool_messages(req: dict) -> list:
    return [m for m in req["messages"] if m.get("role") == "tool"]


def content_text(m: dict) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict))
    return c or ""


def test_coder_agent_runs_code_in_the_sandbox(sdk_env, llm_server):
    nonce = secrets.token_hex(8)
    program = (f"import hashlib\nopen('/workspace/proof.txt', 'w').write('{nonce}')\n"
               f"print(hashlib.sha256(b'{nonce}').hexdigest())\n")
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "runtime_write_file", "arguments": {"path": "prog.py", "content": program}}]},
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "python3 prog.py"}}]},
        {"content": "The program printed {tool_stdout}"},
    ]})
    import hashlib

    digest = hashlib.sha256(nonce.encode()).hexdigest()

    async def run() -> str:
        with Sandbox.create(timeout_seconds=600) as sbx:
            agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)],
                                  llm=make_llm(llm_server))
            answer = str(await agent.run(user_msg="write and run a program"))
            # The command reached the sandbox: its side effect is there.
            assert sbx.files.read_text("/workspace/proof.txt") == nonce
            assert sbx.files.read_text("/workspace/prog.py") == program
            return answer

    answer = asyncio.run(run())
    assert answer == f"The program printed {digest}"
    reqs = llm_server.requests()
    assert len(reqs) == 3
    # The model saw the tools with a description for every parameter.
    tools = {t["function"]["name"]: t["function"] for t in reqs[0]["tools"]}
    assert set(tools) >= {"runtime_exec", "runtime_read_file", "runtime_write_file", "runtime_list_files"}
    for t in tools.values():
        for name, prop in t["parameters"]["properties"].items():
            assert prop.get("description"), (t["name"], name)
    # The real output of the sandbox reached the model in a tool message.
    last_tool = content_text(tool_messages(reqs[2])[-1])
    assert last_tool == f"exit code: 0\nstdout:\n{digest}\nstderr: (empty)"
    assert content_text(tool_messages(reqs[1])[-1]).startswith("wrote ")
    assert digest not in json.dumps(reqs[0]) and digest not in json.dumps(reqs[1])


def test_streamed_tool_call_events(sdk_env, llm_server):
    nonce = secrets.token_hex(6)
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "runtime_exec",
                         "arguments": {"command": f"echo {nonce} | rev; cat /proc/sys/kernel/hostname >/dev/null"}}]},
        {"content": "reversed: {tool_stdout}"},
    ]})

    async def run():
        events = []
        with Sandbox.create(network={"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]},
                            timeout_seconds=900, on_lease_end="stop") as sbx:
            agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)],
                                  llm=make_llm(llm_server))
            handler = agent.run(user_msg="reverse it")
            async for event in handler.stream_events():
                if isinstance(event, ToolCallResult):
                    events.append(event)
            return events, str(await handler)

    events, answer = asyncio.run(run())
    assert [e.tool_name for e in events] == ["runtime_exec"]
    assert events[0].tool_kwargs["command"].startswith(f"echo {nonce} | rev")
    assert events[0].tool_output.content == f"exit code: 0\nstdout:\n{nonce[::-1]}\nstderr: (empty)"
    assert answer == f"reversed: {nonce[::-1]}"
    assert all(r.get("stream") is True for r in llm_server.requests())


def sales_csv(seed: int) -> tuple[str, str]:
    rnd = random.Random(seed)
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["date", "region", "product", "units", "unit_price", "status"])
    total = 0
    for i in range(300):
        units, cents = rnd.randint(1, 40), rnd.randint(100, 9999)
        status = rnd.choice(["shipped"] * 5 + ["returned"])
        w.writerow([f"2026-01-{1 + i % 28:02d}", rnd.choice(["north", "south"]), "widget", units,
                    f"{cents / 100:.2f}", status])
        if status != "returned":
            total += units * cents
    return out.getvalue(), f"{total / 100:.2f}"


ANALYSIS = """\
import csv
total = 0
with open('/workspace/sales.csv', newline='') as f:
    for row in csv.DictReader(f):
        if row['status'] != 'returned':
            total += int(row['units']) * round(float(row['unit_price']) * 100)
figure = f'{total / 100:.2f}'
open('/workspace/result.txt', 'w').write(figure + '\\n')
print(figure)
"""


def test_analyst_with_query_engine_and_csv(sdk_env, llm_server):
    csv_text, expected = sales_csv(secrets.randbelow(10**6))
    notes = ["Revenue of an order is units * unit_price.",
             "Orders with status 'returned' were refunded and do not count towards revenue."]
    index = VectorStoreIndex.from_documents([Document(text=t) for t in notes], embed_model=MockEmbedding(embed_dim=8))
    notes_tool = QueryEngineTool.from_defaults(index.as_query_engine(llm=MockLLM(), similarity_top_k=2),
                                               name="sales_notes", description="How revenue is defined.")
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "sales_notes", "arguments": {"input": "how is revenue defined?"}}]},
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "python3 - <<'EOF'\n" + ANALYSIS + "EOF"}}]},
        {"content": "Total revenue: {tool_stdout}"},
    ]})
    question = "What is the total revenue in /workspace/sales.csv?"

    async def run():
        names = []
        with Sandbox.create(network={"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]},
                            timeout_seconds=900, on_lease_end="stop") as sbx:
            sbx.files.write("/workspace/sales.csv", csv_text)
            agent = FunctionAgent(tools=[notes_tool] + [FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)],
                                  llm=make_llm(llm_server))
            handler = agent.run(user_msg=question)
            async for event in handler.stream_events():
                if isinstance(event, ToolCallResult):
                    names.append((event.tool_name, event.tool_kwargs))
            answer = str(await handler)
            data = sbx.files.read("/workspace/result.txt")
            return names, answer, data

    names, answer, data = asyncio.run(run())
    assert [n for n, _ in names] == ["sales_notes", "runtime_exec"]
    assert answer == f"Total revenue: {expected}"
    assert data == f"{expected}\n".encode()
    reqs = llm_server.requests()
    # The notes reached the model through the query engine tool ...
    assert "returned" in content_text(tool_messages(reqs[1])[0])
    # ... and the figure appears nowhere before the sandbox computed it: the CSV never went to
    # the model, so only Python in the sandbox can have produced it.
    assert expected not in json.dumps(reqs[0]) and expected not in json.dumps(reqs[1])
    assert expected in content_text(tool_messages(reqs[2])[-1])


def test_non_streaming_agent(sdk_env, llm_server):
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "expr 6 \\* 7"}}]},
        {"content": "6*7 = {tool_stdout}"},
    ]})

    async def run() -> str:
        with Sandbox.create(driver=DRIVER, timeout_seconds=300) as sbx:
            agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)],
                                  llm=make_llm(llm_server), streaming=False)
            return str(await agent.run(user_msg="compute"))

    assert asyncio.run(run()) == "6*7 = 42"
    assert all(not r.get("stream") for r in llm_server.requests())


def test_async_sandbox_tools_in_an_agent(sdk_env, llm_server):
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "runtime_write_file", "arguments": {"path": "n.txt", "content": "41"}},
                        {"name": "runtime_list_files", "arguments": {}}]},
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "echo $(( $(cat n.txt) + 1 ))"}}]},
        {"content": "{tool_stdout}"},
    ]})

    async def run() -> str:
        async with AsyncSandbox.create(driver=DRIVER, timeout_seconds=300) as sbx:
            tools = [FunctionTool.from_defaults(async_fn=f) for f in sandbox_tools(sbx)]
            agent = FunctionAgent(tools=tools, llm=make_llm(llm_server))
            return str(await agent.run(user_msg="add one"))

    assert asyncio.run(run()) == "42"
    reqs = llm_server.requests()
    # The two calls of the first turn run concurrently: their messages come back in the order
    # they finish, and the listing may or may not see the file yet.
    outs = sorted(content_text(m) for m in tool_messages(reqs[1]))
    assert len(outs) == 2
    assert outs[0].startswith("/workspace (depth 1,"), outs
    assert outs[1] == "wrote 2 bytes to /workspace/n.txt", outs


def test_failures_reach_the_model_as_text_and_the_run_goes_on(sdk_env, llm_server):
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "runtime_read_file", "arguments": {"path": "missing.txt"}}]},
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "sleep 30", "timeout_seconds": 1}}]},
        {"content": "it said: {tool_outputs}"},
    ]})

    async def run() -> str:
        with Sandbox.create(driver=DRIVER, timeout_seconds=300) as sbx:
            agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)],
                                  llm=make_llm(llm_server))
            return str(await agent.run(user_msg="try"))

    answer = asyncio.run(run())
    assert "error: reading 'missing.txt': not found" in answer
    assert "timed out: yes" in answer


def test_stopped_sandbox_reaches_the_model_as_text(sdk_env, llm_server):
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "echo hi"}}]},
        {"content": "{tool_output}"},
    ]})

    async def run() -> str:
        with Sandbox.create(driver=DRIVER, timeout_seconds=300) as sbx:
            sbx.stop()
            agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)],
                                  llm=make_llm(llm_server))
            return str(await agent.run(user_msg="say hi"))

    answer = asyncio.run(run())
    assert answer.startswith("error: running the command") and "not running" in answer
