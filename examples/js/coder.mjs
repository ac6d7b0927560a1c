#!/usr/bin/env node
// Coder: a LlamaIndex.TS agent writes a program into a sandbox, runs it there and reports its
// output, with each tool call printed as it happens.
//
//     (cd sdk/js && npm ci) && (cd examples/js && npm install) && node examples/js/coder.mjs
//
// Needs a running runtimed (RUNTIME_BASE_URL / RUNTIME_API_KEY, or its admin key on this machine).
// Uses OpenAI when OPENAI_API_KEY is set (OPENAI_MODEL, default gpt-4o-mini); otherwise the
// repository's scripted OpenAI-compatible server plays the model on 127.0.0.1, and the agent, the
// tools and the sandbox are all real.
import { spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { openai } from "@llamaindex/openai";
import { agent, agentToolCallEvent, agentToolCallResultEvent, stopAgentEvent } from "@llamaindex/workflow";
import { Sandbox } from "withruntime";
import { sandboxTools } from "withruntime/tools";

const QUESTION =
  "Write a Python program primes.py that prints how many primes there are below 100000 and " +
  "the largest of them, run it, and tell me both numbers.";

const PROGRAM = `import math

def is_prime(n):
    if n < 2:
        return False
    for d in range(2, math.isqrt(n) + 1):
        if n % d == 0:
            return False
    return True

primes = [n for n in range(100000) if is_prime(n)]
print(len(primes), primes[-1])
`;

/** The scripted model: the tool calls a model would make, then an answer quoting the tool's output. */
async function scriptedModel() {
  const script = JSON.stringify({
    turns: [
      { tool_calls: [{ name: "runtime_write_file", arguments: { path: "primes.py", content: PROGRAM } }] },
      { tool_calls: [{ name: "runtime_exec", arguments: { command: "python3 primes.py" } }] },
      { content: "primes.py printed: {tool_stdout}" },
    ],
  });
  const here = dirname(fileURLToPath(import.meta.url));
  const server = spawn("python3", [join(here, "..", "..", "tests", "llm", "scripted_openai.py"), "--port", "0", "--script-json", script], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const first = await new Promise((resolve, reject) => {
    createInterface({ input: server.stdout }).once("line", resolve);
    server.once("exit", (code) => reject(new Error(`the scripted model exited (${code})`)));
  });
  const url = /listening (\S+)/.exec(first)?.[1];
  if (!url) throw new Error(`the scripted model said: ${first}`);
  return { llm: openai({ model: "gpt-4o-mini", apiKey: "scripted", baseURL: url }), stop: () => server.kill() };
}

const model = process.env.OPENAI_API_KEY
  ? { llm: openai({ model: process.env.OPENAI_MODEL || "gpt-4o-mini" }), stop: () => {} }
  : await scriptedModel();

const sbx = await Sandbox.create({ timeoutSeconds: 900 });
try {
  const coder = agent({ tools: sandboxTools(sbx), llm: model.llm });
  for await (const ev of coder.runStream(QUESTION)) {
    if (agentToolCallEvent.include(ev)) console.log(`-> ${ev.data.toolName}(${JSON.stringify(ev.data.toolKwargs).slice(0, 80)})`);
    else if (agentToolCallResultEvent.include(ev)) console.log(`<- ${String(ev.data.raw).split("\n").join(" | ").slice(0, 100)}`);
    else if (stopAgentEvent.include(ev)) console.log(`\n${ev.data.result}`);
  }
} finally {
  await sbx.delete();
  sbx.close();
  model.stop();
}
