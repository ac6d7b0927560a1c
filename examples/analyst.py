#!/usr/bin/env python3
"""Analyst: a CSV goes into the sandbox; the agent looks up how to read it in a small
knowledge base (a QueryEngineTool beside the sandbox tools), computes the figure with Python
in the sandbox, and leaves it in /workspace/result.txt.

    python3 examples/analyst.py

Needs a running runtimed; uses OpenAI when OPENAI_API_KEY is set, a scripted local model
otherwise. The knowledge base is a tiny in-memory summary index: it needs no embeddings, and with
the scripted model it answers with llama-index's mock LLM, so nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import random
from typing import Any, Optional

import common  # noqa: F401
from llama_index.core import Document, SummaryIndex
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.llms import MockLLM
from llama_index.core.tools import FunctionTool, QueryEngineTool

from withruntime import Sandbox
from withruntime.tools import sandbox_tools

NOTES = [
    "sales.csv has one row per order with the columns date, region, product, units, unit_price, status.",
    "Revenue of an order is units * unit_price, in euros.",
    "Orders whose status is 'returned' were refunded and do not count towards revenue.",
]

QUESTION = (
    "What was the total revenue in /workspace/sales.csv? Check the sales notes for how revenue "
    "is defined, compute it with Python in the sandbox, and write the figure to /workspace/result.txt."
)

ANALYSIS = """\
import csv
total = 0.0
with open('/workspace/sales.csv', newline='') as f:
    for row in csv.DictReader(f):
        if row['status'] != 'returned':
            total += int(row['units']) * float(row['unit_price'])
figure = f'{total:.2f}'
open('/workspace/result.txt', 'w').write(figure + '\\n')
print(figure)
"""

SCRIPT = {
    "turns": [
        {"tool_calls": [{"name": "sales_notes",
                         "arguments": {"input": "How is revenue defined and how are returns recorded?"}}]},
        {"tool_calls": [{"name": "runtime_exec",
                         "arguments": {"command": "python3 - <<'EOF'\n" + ANALYSIS + "EOF"}}]},
        {"content": "Total revenue, returns excluded: {tool_stdout} EUR (computed in the sandbox, "
                    "also in /workspace/result.txt)."},
    ]
}


def make_csv(rows: int = 200, seed: Optional[int] = None) -> str:
    rnd = random.Random(seed)
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["date", "region", "product", "units", "unit_price", "status"])
    for i in range(rows):
        w.writerow([f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}", rnd.choice(["north", "south", "east", "west"]),
                    rnd.choice(["widget", "gadget", "gizmo"]), rnd.randint(1, 40),
                    f"{rnd.randint(100, 9999) / 100:.2f}", rnd.choice(["shipped"] * 5 + ["returned"])])
    return out.getvalue()


def notes_tool(llm: Any) -> QueryEngineTool:
    # A summary index reads every note for each question: no embeddings, so nothing to download
    # and no embedding account needed. With the scripted model the notes are answered by
    # llama-index's MockLLM, which echoes what it was given.
    index = SummaryIndex.from_documents([Document(text=t) for t in NOTES])
    engine = index.as_query_engine(llm=llm if llm is not None else MockLLM())
    return QueryEngineTool.from_defaults(
        engine, name="sales_notes",
        description="Answers questions about the sales data: what the columns of sales.csv mean "
                    "and how revenue is defined.")


async def main(csv_text: Optional[str] = None) -> Any:
    csv_text = csv_text or make_csv(seed=int(os.environ.get("ANALYST_SEED", "7")))
    llm, stop, server = common.make_llm(SCRIPT)
    try:
        with Sandbox.create(network={"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]},
                            timeout_seconds=900, on_lease_end="stop") as sbx:
            sbx.files.write("/workspace/sales.csv", csv_text)
            tools = [notes_tool(llm if server is None else None)] + [
                FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)]
            agent = FunctionAgent(tools=tools, llm=llm,
                                  system_prompt="You are a data analyst. Compute numbers with Python in the "
                                                "sandbox; never guess them.")
            handler = agent.run(user_msg=QUESTION)
            async for event in handler.stream_events():
                if isinstance(event, ToolCallResult):
                    print(event.tool_name, event.tool_kwargs)
            answer = str(await handler)
            data = sbx.files.read("/workspace/result.txt")
            print(f"answer: {answer}")
            print(f"/workspace/result.txt: {data.decode().strip()}")
            return answer, data
    finally:
        stop()


if __name__ == "__main__":
    asyncio.run(main())
