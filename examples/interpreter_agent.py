#!/usr/bin/env python3
"""Data analyst: an agent answers questions about a CSV with pandas in a stateful interpreter,
over several turns, and the chart it draws is written to a PNG on this machine.

    runtime image build analysis        # once: numpy, pandas, matplotlib
    python3 examples/interpreter_agent.py [--out chart.png]

The first question loads the CSV into a DataFrame; later ones use it without loading it again,
because RuntimeCodeInterpreterToolSpec keeps one Python context alive in the sandbox. Uses
OpenAI when OPENAI_API_KEY is set, a scripted local model otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile

import common  # noqa: F401  (finds the SDK in a checkout)
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.workflow import Context

from withruntime import Sandbox
from withruntime.tools import RuntimeCodeInterpreterToolSpec


def sales_csv() -> str:
    rnd = random.Random(13)
    rows = ["month,region,units"]
    for month in range(1, 7):
        for region in ("north", "south", "east"):
            rows.append(f"2026-{month:02d},{region},{rnd.randint(10, 90)}")
    return "\n".join(rows) + "\n"


# What a model would send, turn by turn; a real model writes its own code.
TURNS = [
    ("Load /workspace/sales.csv and tell me how many rows it has.",
     "import pandas as pd\ndf = pd.read_csv('/workspace/sales.csv')\nlen(df)"),
    ("Which region sold the most units?",
     "by_region = df.groupby('region')['units'].sum().sort_values(ascending=False)\nby_region"),
    ("Draw units per month as a line chart, one line per region.",
     "import matplotlib.pyplot as plt\n"
     "df.pivot(index='month', columns='region', values='units').plot(marker='o')\n"
     "plt.title('Units per month')\nplt.ylabel('units')\nNone"),
]


def script_for(code: str) -> dict:
    return {"turns": [{"tool_calls": [{"name": "code_interpreter", "arguments": {"code": code}}]},
                      {"content": "From the sandbox:\n{tool_output}"}]}


async def main(out: str) -> None:
    llm, stop, scripted = common.make_llm(script_for(TURNS[0][1]))
    try:
        with Sandbox.create(image="analysis", timeout_seconds=900) as sbx:
            print(f"sandbox: {sbx.id} ({sbx.driver}, image analysis)")
            sbx.files.write("/workspace/sales.csv", sales_csv())
            charts = tempfile.mkdtemp(prefix="charts-")
            spec = RuntimeCodeInterpreterToolSpec(sbx, image_dir=charts)
            agent = FunctionAgent(tools=spec.to_tool_list(), llm=llm,
                                  system_prompt="You analyse data with pandas in the code_interpreter tool. "
                                                "Its variables persist between calls.")
            ctx = Context(agent)  # one conversation across the questions
            for question, code in TURNS:
                if scripted is not None:
                    scripted.set_script(script_for(code))
                print(f"\nuser: {question}")
                answer = await agent.run(user_msg=question, ctx=ctx)
                print(f"agent: {answer}")
            if not spec.images:
                raise SystemExit("the agent drew no chart")
            shutil.copyfile(spec.images[-1], out)
            print(f"\nchart written to {out}")
    finally:
        stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="units_per_month.png", help="where the chart goes")
    asyncio.run(main(parser.parse_args().out))
