#!/usr/bin/env python3
"""Streamed events: watch each tool call reach the sandbox as the agent runs, then the answer.

    python3 examples/stream_events.py

Needs a running runtimed; uses OpenAI when OPENAI_API_KEY is set, a scripted local model
otherwise.
"""

from __future__ import annotations

import asyncio

import common  # noqa: F401
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.tools import FunctionTool

from withruntime import Sandbox
from withruntime.tools import sandbox_tools

QUESTION = "Which Linux kernel and which Python version does the sandbox run? Check, don't guess."

SCRIPT = {
    "turns": [
        {"tool_calls": [{"name": "runtime_exec",
                         "arguments": {"command": "uname -sr; python3 --version"}}]},
        {"content": "The sandbox reports:\n{tool_stdout}"},
    ]
}


async def main() -> str:
    llm, stop, _ = common.make_llm(SCRIPT)
    try:
        with Sandbox.create(timeout_seconds=300) as sbx:
            agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)], llm=llm)
            handler = agent.run(user_msg=QUESTION)
            async for event in handler.stream_events():
                if isinstance(event, ToolCallResult):
                    print(event.tool_name, event.tool_kwargs)
                    print("  ->", str(event.tool_output.content).replace("\n", "\n     "))
            answer = str(await handler)
            print(f"answer: {answer}")
            return answer
    finally:
        stop()


if __name__ == "__main__":
    asyncio.run(main())
