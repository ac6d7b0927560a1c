"""The scripted server speaks the OpenAI wire format that the official client and
llama-index-llms-openai expect, in both the plain and the streaming form."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scripted_openai import ScriptedOpenAI  # noqa: E402

openai = pytest.importorskip("openai")

SCRIPT = {"turns": [
    {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "echo 'quoted' \"twice\""}}]},
    {"content": "out={tool_stdout} all={tool_output}"},
]}
TOOL_RESULT = "exit code: 0\nstdout:\nquoted twice\nstderr: (empty)"


@pytest.fixture(scope="module")
def server():
    with ScriptedOpenAI(SCRIPT) as s:
        yield s


def conversation(tool_call_id: str = "call_1") -> list:
    return [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": tool_call_id, "type": "function",
             "function": {"name": "runtime_exec", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": tool_call_id, "content": TOOL_RESULT},
    ]


def test_plain_tool_call_then_answer(server):
    server.set_script(SCRIPT)
    server.reset()
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    r = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "go"}])
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "runtime_exec"
    assert json.loads(call.function.arguments) == {"command": "echo 'quoted' \"twice\""}
    r = client.chat.completions.create(model="gpt-4o-mini", messages=conversation())
    assert r.choices[0].message.content == f"out=quoted twice all={TOOL_RESULT}"
    assert r.choices[0].finish_reason == "stop"
    assert len(server.requests()) == 2


def test_streamed_tool_call_then_answer(server):
    server.set_script(SCRIPT)
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    chunks = list(client.chat.completions.create(model="gpt-4o-mini", stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "go"}]))
    args = "".join(tc.function.arguments or "" for c in chunks if c.choices
                   for tc in (c.choices[0].delta.tool_calls or []))
    names = [tc.function.name for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])
             if tc.function and tc.function.name]
    assert names == ["runtime_exec"]
    assert json.loads(args) == {"command": "echo 'quoted' \"twice\""}
    assert chunks[-1].usage is not None and not chunks[-1].choices
    stream = client.chat.completions.create(model="gpt-4o-mini", stream=True, messages=conversation())
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == f"out=quoted twice all={TOOL_RESULT}"


def test_a_new_user_message_starts_the_script_over(server):
    server.set_script(SCRIPT)
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    msgs = conversation() + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "again"}]
    r = client.chat.completions.create(model="gpt-4o-mini", messages=msgs)
    assert r.choices[0].message.tool_calls[0].function.name == "runtime_exec"


def test_out_of_script_never_loops_on_tool_calls(server):
    server.set_script({"turns": [{"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "x"}}]}]})
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    r = client.chat.completions.create(model="gpt-4o-mini", messages=conversation())
    assert not r.choices[0].message.tool_calls and "no more turns" in r.choices[0].message.content


def test_bad_script_is_refused(server):
    import urllib.error

    with pytest.raises(urllib.error.HTTPError):
        server.set_script({"turns": []})


def test_llama_index_openai_talks_to_it(server):
    li = pytest.importorskip("llama_index.llms.openai")
    from llama_index.core.llms import ChatMessage

    server.set_script({"turns": [{"content": "plain answer"}]})
    llm = li.OpenAI(api_base=server.base_url, api_key="test", model="gpt-4o-mini")
    assert llm.metadata.is_function_calling_model
    assert str(llm.chat([ChatMessage(role="user", content="hi")]).message.content) == "plain answer"
    text = "".join(r.delta or "" for r in llm.stream_chat([ChatMessage(role="user", content="hi")]))
    assert text == "plain answer"
