"""RuntimeCodeInterpreterToolSpec with the real llama-index-core FunctionAgent and the scripted
OpenAI-compatible server: the tool keeps state between calls (a DataFrame defined in one cell
is used by a later one), and a chart comes back to the host as a PNG that decodes."""
from __future__ import annotations

import asyncio
import struct
import sys
import zlib
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
sys.path.insert(0, str(REPO / "tests" / "llm"))

pytest.importorskip("llama_index.core")
pytest.importorskip("llama_index.llms.openai")

from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402
from llama_index.llms.openai import OpenAI  # noqa: E402
from scripted_openai import ScriptedOpenAI  # noqa: E402

from withruntime import Sandbox  # noqa: E402
from withruntime.tools import RuntimeCodeInterpreterToolSpec  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def fast_driver(daemon) -> str | None:
    r = httpx.get(daemon.base_url + "/v1/info", headers={"Authorization": f"Bearer {daemon.api_key}"})
    available = {d.get("name") for d in r.json().get("drivers", []) if d.get("available")}
    return next((d for d in ("namespace", "gvisor") if d in available), None)


@pytest.fixture
def sdk_env(daemon, monkeypatch):
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return daemon


@pytest.fixture
def llm_server():
    with ScriptedOpenAI() as server:
        yield server


def tool_texts(server) -> list[str]:
    out = []
    for m in server.requests()[-1]["messages"]:
        if m.get("role") == "tool":
            c = m.get("content")
            out.append("".join(p.get("text", "") for p in c) if isinstance(c, list) else c or "")
    return out


def png_dimensions(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, dims = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            dims = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    assert dims and zlib.decompress(idat)
    return dims


def test_tool_spec_shape():
    spec_cls = RuntimeCodeInterpreterToolSpec
    assert spec_cls.spec_functions == ["code_interpreter"]
    from llama_index.core.tools.tool_spec.base import BaseToolSpec
    assert issubclass(spec_cls, BaseToolSpec)


def test_state_persists_across_tool_calls(sdk_env, llm_server):
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "code_interpreter", "arguments": {"code": "totals = {'north': 3, 'south': 4}"}}]},
        {"tool_calls": [{"name": "code_interpreter", "arguments": {"code": "sum(totals.values()) * 6"}}]},
        {"content": "The answer: {tool_output}"},
    ]})
    driver = fast_driver(sdk_env)

    async def run() -> str:
        with Sandbox.create(timeout_seconds=600, **({"driver": driver} if driver else {})) as sbx:
            spec = RuntimeCodeInterpreterToolSpec(sbx)
            tools = spec.to_tool_list()
            assert [t.metadata.name for t in tools] == ["code_interpreter"]
            agent = FunctionAgent(tools=tools, llm=OpenAI(api_base=llm_server.base_url, api_key="test",
                                                          model="gpt-4o-mini"))
            return str(await agent.run(user_msg="add them up"))

    answer = asyncio.run(run())
    assert answer == "The answer: result:\n42"
    assert tool_texts(llm_server) == ["(no output)", "result:\n42"]


def test_dataframe_then_chart(sdk_env, llm_server, analysis_image, tmp_path):
    driver = fast_driver(sdk_env)
    if driver is None:
        pytest.skip("neither namespace nor gvisor is available")
    csv = "region,units\nnorth,12\nsouth,30\nnorth,5\n"
    llm_server.set_script({"turns": [
        {"tool_calls": [{"name": "code_interpreter", "arguments": {
            "code": "import pandas as pd\ndf = pd.read_csv('/workspace/sales.csv')\nlen(df)"}}]},
        {"tool_calls": [{"name": "code_interpreter", "arguments": {
            "code": "by = df.groupby('region')['units'].sum()\nprint(by.to_dict())\n"
                    "by.plot.bar()\nimport matplotlib.pyplot as plt\nplt.title('units')\nNone"}}]},
        {"content": "Done: {tool_output}"},
    ]})

    async def run():
        with Sandbox.create(timeout_seconds=600, image="analysis", driver=driver) as sbx:
            sbx.files.write("/workspace/sales.csv", csv)
            spec = RuntimeCodeInterpreterToolSpec(sbx, image_dir=str(tmp_path))
            agent = FunctionAgent(tools=spec.to_tool_list(),
                                  llm=OpenAI(api_base=llm_server.base_url, api_key="test", model="gpt-4o-mini"))
            return str(await agent.run(user_msg="units by region, as a chart")), spec.images

    answer, images = asyncio.run(run())
    texts = tool_texts(llm_server)
    assert texts[0] == "result:\n3"
    assert "{'north': 17, 'south': 30}" in texts[1]
    assert images == [str(tmp_path / "chart-1.png")]
    assert f"[chart saved to {images[0]}]" in texts[1] and answer.startswith("Done: ")
    w, h = png_dimensions(Path(images[0]).read_bytes())
    assert w > 100 and h > 100
