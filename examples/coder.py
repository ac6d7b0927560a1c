#!/usr/bin/env python3
"""Coder: an agent writes a program into a sandbox, runs it there and reports its output.

    python3 examples/coder.py

Needs a running runtimed (RUNTIME_BASE_URL / RUNTIME_API_KEY, or its admin key on this
machine). Uses OpenAI when OPENAI_API_KEY is set, a scripted local model otherwise.
"""

from __future__ import annotations

import asyncio

import common  # noqa: F401  (finds the SDK in a checkout)
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.tools import FunctionTool

from withruntime import Sandbox
from withruntime.tools import sandbox_tools

QUESTION = (
    "Write a Python program primes.py that prints how many primes there are below 100000 and "
    "the largest of them, run it, and tell me both numbers."
)

PROGRAM = """\
import math

def is_prime(n):
    if n < 2:
        return False
    for d in range(2, math.isqrt(n) + 1):
        if n % d == 0:
            return False
    return True

primes = [n for n in range(100000) if is_prime(n)]
print(len(primes), primes[-1])
"""

SCRIPT = {
    "turns": [
        {"tool_calls": [{"name": "runtime_write_file", "arguments": {"path": "primes.py", "content": PROGRAM}}]},
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "python3 primes.py"}}]},
        {"content": "primes.py ran in the sandbox and printed: {tool_stdout} "
                    "(the count of primes below 100000, then the largest)."},
    ]
}


async def main() -> str:
    llm, stop, _ = common.make_llm(SCRIPT)
    try:
        with Sandbox.create(timeout_seconds=600) as sbx:
            # The published client does not name the driver; ours does.
            print(f"sandbox: {sbx.id} ({getattr(sbx, 'driver', None) or 'driver not reported'})")
            agent = FunctionAgent(
                tools=[FunctionTool.from_defaults(fn=f) for f in sandbox_tools(sbx)],
                llm=llm,
                system_prompt="You are a careful programmer. Run code in the sandbox with the runtime_* tools.",
            )
            handler = agent.run(user_msg=QUESTION)
            async for event in handler.stream_events():
                if isinstance(event, ToolCallResult):
                    print(f"tool call: {event.tool_name} {event.tool_kwargs}")
            answer = str(await handler)
            print(f"answer: {answer}")
            return answer
    finally:
        stop()


if __name__ == "__main__":
    asyncio.run(main())
