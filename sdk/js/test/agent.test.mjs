// A LlamaIndex.TS agent (the real @llamaindex/workflow agent and @llamaindex/openai LLM) driving the
// four tools against the suite's scripted OpenAI-compatible server (SCRIPTED_OPENAI_URL), with its
// tool-call events streamed. Checks that each command reached the sandbox and that its real output
// reached the model and the answer.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";

import { openai } from "@llamaindex/openai";
import { stringifyJSONToMessageContent } from "@llamaindex/core/utils";
import { agent, agentToolCallEvent, agentToolCallResultEvent, stopAgentEvent } from "@llamaindex/workflow";

import { Sandbox } from "withruntime";
import { sandboxTools } from "withruntime/tools";

import { DRIVER, daemonTest, fullTest } from "./env.mjs";

const LLM_URL = process.env.SCRIPTED_OPENAI_URL ?? "";
const skip = LLM_URL ? undefined : "SCRIPTED_OPENAI_URL is not set (tests/integration/test_js_sdk.py starts the scripted server)";

async function control(method, path, body) {
  const res = await fetch(new URL(path, LLM_URL), {
    method,
    headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  assert.ok(res.ok, `${method} ${path}: ${res.status}`);
  return res.json();
}

const llm = () => openai({ model: "gpt-4o-mini", apiKey: "test", baseURL: LLM_URL, maxRetries: 0 });

function toolText(m) {
  const c = m.content;
  return Array.isArray(c) ? c.map((p) => p.text ?? "").join("") : (c ?? "");
}

daemonTest("a LlamaIndex.TS agent writes and runs a program in the sandbox, tool calls streamed", { skip }, async () => {
  await control("POST", "/_reset", {});
  const nonce = randomBytes(8).toString("hex");
  const program = `import hashlib\nopen('/workspace/proof.txt', 'w').write('${nonce}')\nprint(hashlib.sha256(b'${nonce}').hexdigest())\n`;
  await control("POST", "/_script", {
    turns: [
      { tool_calls: [{ name: "runtime_write_file", arguments: { path: "prog.py", content: program } }] },
      { tool_calls: [{ name: "runtime_exec", arguments: { command: "python3 prog.py" } }] },
      { content: "The program printed {tool_stdout}" },
    ],
  });
  const digest = createHash("sha256").update(nonce).digest("hex");
  const sbx = await Sandbox.create({ driver: DRIVER, timeoutSeconds: 600 });
  try {
    const a = agent({ tools: sandboxTools(sbx), llm: llm() });
    const calls = [];
    const results = [];
    let answer = null;
    for await (const ev of a.runStream("write and run a program")) {
      if (agentToolCallEvent.include(ev)) calls.push(ev.data);
      else if (agentToolCallResultEvent.include(ev)) results.push(ev.data);
      else if (stopAgentEvent.include(ev)) answer = ev.data.result;
    }
    // The model's answer quotes what the sandbox computed.
    assert.ok(answer.startsWith("The program printed ") && answer.includes(digest), answer);
    // The streamed events name each tool with its arguments, then its result, in order.
    assert.deepEqual(calls.map((c) => c.toolName), ["runtime_write_file", "runtime_exec"]);
    assert.deepEqual(calls[1].toolKwargs, { command: "python3 prog.py" });
    assert.deepEqual(results.map((r) => r.toolName), ["runtime_write_file", "runtime_exec"]);
    // What the tools returned (`raw`) is the Python tools' text, word for word; the agent hands it
    // to the model through its own JSON rendering (toolOutput.result).
    assert.match(results[0].raw, /^wrote \d+ bytes to \/workspace\/prog\.py$/);
    const execText = `exit code: 0\nstdout:\n${digest}\nstderr: (empty)`;
    assert.equal(results[1].raw, execText);
    assert.equal(results[1].toolOutput.result, stringifyJSONToMessageContent(execText));
    // The command reached the sandbox: its side effect is there.
    assert.equal(await sbx.files.readText("/workspace/proof.txt"), nonce);
    assert.equal(await sbx.files.readText("/workspace/prog.py"), program);
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
  const reqs = (await control("GET", "/_requests")).requests;
  assert.equal(reqs.length, 3);
  const tools = Object.fromEntries(reqs[0].tools.map((t) => [t.function.name, t.function]));
  assert.deepEqual(Object.keys(tools).sort(), ["runtime_exec", "runtime_list_files", "runtime_read_file", "runtime_write_file"]);
  for (const t of Object.values(tools)) {
    for (const [pname, prop] of Object.entries(t.parameters.properties)) assert.ok(prop.description, `${t.name}.${pname}`);
  }
  const lastTool = reqs[2].messages.filter((m) => m.role === "tool").at(-1);
  assert.equal(toolText(lastTool), stringifyJSONToMessageContent(`exit code: 0\nstdout:\n${digest}\nstderr: (empty)`));
  // The model could not have known the digest before the sandbox computed it.
  assert.ok(!JSON.stringify(reqs[0]).includes(digest) && !JSON.stringify(reqs[1]).includes(digest));
});

fullTest("the agent lists and reads files, and a failing tool comes back as text", { skip }, async () => {
  await control("POST", "/_reset", {});
  await control("POST", "/_script", {
    turns: [
      { tool_calls: [{ name: "runtime_list_files", arguments: { path: ".", depth: 2 } }] },
      { tool_calls: [{ name: "runtime_read_file", arguments: { path: "data/n.txt" } }] },
      { tool_calls: [{ name: "runtime_read_file", arguments: { path: "missing.txt" } }] },
      { content: "done: {tool_outputs}" },
    ],
  });
  const sbx = await Sandbox.create({ driver: DRIVER, timeoutSeconds: 600 });
  try {
    await sbx.files.write("data/n.txt", "seventeen\n");
    const a = agent({ tools: sandboxTools(sbx), llm: llm() });
    const results = [];
    for await (const ev of a.runStream("look around")) if (agentToolCallResultEvent.include(ev)) results.push(ev.data.raw);
    assert.equal(results.length, 3);
    assert.match(results[0], /^\/workspace \(depth 2, 2 entries\):\ndir {3}data\/\nfile {2}data\/n\.txt {2}\(10 bytes\)$/);
    assert.equal(results[1], "seventeen\n");
    assert.match(results[2], /^error: reading "missing\.txt": not found/);
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});
