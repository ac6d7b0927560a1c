// Processes and the interpreter against the real daemon: execStream's process ids and events,
// spawn with its output from a cursor, stdin, signals and wait, exec's check/timeoutMs/
// idempotencyKey/user, interpreter runs (buffered and streamed), contexts and kept results,
// and bad ids and input refused before any request.
import assert from "node:assert/strict";
import http from "node:http";

import { CommandError, ConflictError, InvalidRequestError, NotFoundError, Process, Sandbox } from "withruntime";

import { API_KEY, DRIVER, daemonTest, fullTest, waitFor } from "./env.mjs";

const create = (opts = {}) => Sandbox.create({ driver: DRIVER, timeoutSeconds: 600, ...opts });

async function collect(gen) {
  const out = [];
  for await (const ev of gen) out.push(ev);
  return out;
}

daemonTest("execStream gives the process id, offsets and the exit; exec's check, timeoutMs, user and idempotencyKey", async () => {
  const sbx = await create();
  try {
    const evs = await collect(sbx.execStream("printf ab; printf cd >&2; exit 3"));
    const start = evs[0];
    assert.equal(start.type, "start");
    assert.match(start.processId, /^proc_/);
    assert.equal(start.replayed, false);
    const out = evs.filter((e) => e.type === "stdout" || e.type === "stderr");
    assert.equal(out.filter((e) => e.type === "stdout").map((e) => e.data).join(""), "ab");
    assert.equal(out.filter((e) => e.type === "stderr").map((e) => e.data).join(""), "cd");
    assert.equal(out[0].offset, 0);
    assert.ok(out.every((e, i) => i === 0 || e.offset === out[i - 1].offset + Buffer.byteLength(out[i - 1].data)), "offsets count stdout and stderr together");
    const exit = evs.at(-1);
    assert.equal(exit.type, "exit");
    assert.equal(exit.exitCode, 3);
    assert.equal(exit.state, "exited");

    // The streamed exec is a process the daemon still knows.
    const proc = await sbx.process(start.processId);
    assert.equal(proc.state, "exited");
    assert.equal(proc.exitCode, 3);
    assert.ok((await sbx.processes()).some((p) => p.id === start.processId));

    // exec: check throws CommandError carrying the result; a timeout in ms is a result.
    await assert.rejects(sbx.exec("echo boom >&2; exit 4", { check: true }), (e) => {
      assert.ok(e instanceof CommandError);
      assert.equal(e.code, "command_failed");
      assert.equal(e.result.exitCode, 4);
      assert.match(e.message, /exited with 4: boom/);
      return true;
    });
    const streamedFail = sbx.exec("exit 5", { check: true, onStdout: () => {} });
    await assert.rejects(streamedFail, (e) => e instanceof CommandError && e.result.exitCode === 5 && e.result.processId !== null);
    const t = await sbx.exec("sleep 30", { timeoutMs: 300 });
    assert.equal(t.timedOut, true);
    assert.equal(t.exitCode, 137);
    await assert.rejects(sbx.exec("sleep 30", { timeoutMs: 300, check: true }), (e) => e instanceof CommandError && /timed out/.test(e.message));
    assert.equal((await sbx.exec("id -u", { user: "root", check: true })).stdout, "0\n");
    // The unprivileged sandbox user by default; the result says who ran it.
    const mine = await sbx.exec("id -un; echo $HOME", { check: true });
    assert.deepEqual([mine.stdout, mine.user], ["sandbox\n/workspace\n", "sandbox"]);
    await sbx.files.write("/etc/js-root.conf", "x", { user: "root" });
    assert.equal((await sbx.exec("stat -c %U /etc/js-root.conf")).stdout, "root\n");

    // The same idempotency key and command: the first run given back, not a second one.
    const key = `js-${Date.now()}`;
    const cmd = "echo run >> /workspace/runs; cat /workspace/runs | wc -l";
    const first = await sbx.exec(cmd, { idempotencyKey: key, timeoutMs: 60_000, onStdout: () => {} });
    const again = await collect(sbx.execStream(cmd, { idempotencyKey: key, timeoutMs: 60_000 }));
    assert.equal(again[0].replayed, true);
    assert.equal(again[0].processId, first.processId);
    assert.equal(again.filter((e) => e.type === "stdout").map((e) => e.data).join(""), first.stdout);
    assert.equal((await sbx.files.readText("/workspace/runs")), "run\n");
    await assert.rejects(collect(sbx.execStream("echo other", { idempotencyKey: key, timeoutMs: 60_000 })), ConflictError);
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

daemonTest("spawn: output from a cursor, stdin through a pipe, wait, kill", async () => {
  const sbx = await create();
  try {
    const cat = await sbx.spawn("cat; echo done >&2", { stdin: "pipe" });
    assert.ok(cat instanceof Process);
    assert.match(cat.id, /^proc_/);
    assert.equal(cat.state, "running");
    await cat.write("hello ");
    await cat.write(new TextEncoder().encode("world\n"), { eof: true });
    const r = await cat.wait();
    assert.equal(r.stdout, "hello world\n");
    assert.equal(r.stderr, "done\n");
    assert.equal(r.exitCode, 0);
    assert.equal(r.processId, cat.id);
    assert.equal(cat.state, "exited");

    // Reading from a cursor gives the output from there on, and again as often as asked.
    const from6 = await collect(cat.output({ cursor: 6 }));
    assert.equal(from6.filter((e) => e.type === "stdout").map((e) => e.data).join(""), "world\n");
    assert.equal(from6.at(-1).type, "exit");
    // Writing to a process that ended is a conflict.
    await assert.rejects(cat.write("late"), ConflictError);

    const sleeper = await sbx.spawn(["bash", "-c", "echo up; exec sleep 600"]);
    // Without follow, the output is what exists now.
    await waitFor("the spawned process's first line", async () =>
      (await collect(sleeper.output({ follow: false }))).some((e) => e.type === "stdout" && e.data === "up\n"));
    await sleeper.kill("TERM");
    const end = await sleeper.wait();
    assert.equal(end.exitCode, 128 + 15);
    assert.equal(sleeper.state, "killed");
    await assert.rejects(sleeper.kill(), ConflictError);

    // Bytes that are not UTF-8 arrive exactly in base64.
    const raw = await sbx.spawn(["printf", "\\377\\000a"], { outputEncoding: "base64" });
    const evs = await collect(raw.output());
    const bytes = Buffer.concat(evs.filter((e) => e.type === "stdout").map((e) => Buffer.from(e.base64, "base64")));
    assert.deepEqual([...bytes], [0xff, 0x00, 0x61]);
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

fullTest("leaving an execStream early kills its process unless detached", async () => {
  const sbx = await create();
  try {
    let id = null;
    for await (const ev of sbx.execStream("echo ready; exec sleep 600")) {
      if (ev.type === "start") id = ev.processId;
      if (ev.type === "stdout") break;
    }
    const p = await sbx.process(id);
    await waitFor("the abandoned process to be killed", async () => (await p.refresh()).state === "killed");

    let kept = null;
    for await (const ev of sbx.execStream("echo ready; exec sleep 600", { detach: true })) {
      if (ev.type === "start") kept = ev.processId;
      if (ev.type === "stdout") break;
    }
    const k = await sbx.process(kept);
    assert.equal(k.state, "running");
    await k.kill("SIGKILL");
    assert.equal((await k.wait()).exitCode, 137);
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

daemonTest("interpreter: state between runs, errors as results, streamed events, contexts", async () => {
  const sbx = await create();
  try {
    const it = sbx.interpreter;
    assert.equal((await it.run("x = 6 * 7")).status, "ok");
    const r = await it.run("print('side'); x");
    assert.equal(r.status, "ok");
    assert.equal(r.stdout, "side\n");
    assert.deepEqual(r.results, [{ main: true, data: { "text/plain": "42" }, refs: {} }]);
    assert.equal(r.context, "python");

    const bad = await it.run("1 / 0");
    assert.equal(bad.status, "error");
    assert.equal(bad.error.name, "ZeroDivisionError");
    assert.match(bad.error.traceback, /ZeroDivisionError/);
    assert.equal((await it.run("x + 1")).results[0].data["text/plain"], "43");

    const seen = [];
    const s = await it.run("import sys\nprint('o')\nprint('e', file=sys.stderr)\ndisplay({'a': 1})\nraise ValueError('v')", {
      onStdout: (t) => seen.push(["out", t]),
      onStderr: (t) => seen.push(["err", t]),
      onResult: (b) => seen.push(["result", b.data["application/json"]]),
      onError: (e) => seen.push(["error", e.name, e.value]),
    });
    assert.equal(s.status, "error");
    assert.deepEqual(seen.filter(([k]) => k === "out"), [["out", "o\n"]]);
    assert.deepEqual(seen.filter(([k]) => k === "err"), [["err", "e\n"]]);
    assert.deepEqual(seen.filter(([k]) => k === "result"), [["result", { a: 1 }]]);
    assert.deepEqual(seen.filter(([k]) => k === "error"), [["error", "ValueError", "v"]]);

    // A timeout stops the cell and keeps the state.
    const slow = await it.run("import time\ntime.sleep(60)", { timeoutMs: 500 });
    assert.equal(slow.status, "timeout");
    assert.equal((await it.run("x")).results[0].data["text/plain"], "42");

    // Contexts: each with its own state; restart empties one, remove ends it.
    const ctx = await it.contexts.create({ id: "js-ctx", cwd: "/tmp", env: { GREETING: "hi" } });
    assert.equal(ctx.id, "js-ctx");
    const inCtx = await it.run("import os\n(os.getcwd(), os.environ['GREETING'], 'x' in globals())", { context: "js-ctx" });
    assert.equal(inCtx.results[0].data["text/plain"], "('/tmp', 'hi', False)");
    await it.run("y = 1", { context: "js-ctx" });
    assert.ok((await it.contexts.list()).some((c) => c.id === "js-ctx"));
    assert.equal((await it.contexts.restart("js-ctx")).id, "js-ctx");
    assert.equal((await it.run("'y' in globals()", { context: "js-ctx" })).results[0].data["text/plain"], "False");
    assert.equal(typeof (await it.contexts.interrupt("js-ctx")), "boolean");
    assert.equal(await it.contexts.remove("js-ctx"), true);
    await assert.rejects(it.run("1", { context: "js-ctx" }), NotFoundError);

    // A result too large to travel inline is kept as a file and read by its ref.
    const big = await it.run("class Big:\n    def _repr_html_(self):\n        return '<p>' + 'y' * 600_000 + '</p>'\n    def __repr__(self):\n        return 'Big'\nBig()");
    const ref = big.results[0].refs["text/html"];
    assert.ok(ref, JSON.stringify(big.results[0]));
    const bytes = await it.result(ref);
    assert.equal(bytes.length, ref.size);
    assert.equal(bytes.toString("utf8", 0, 4), "<p>y");
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

fullTest("an interrupt stops a running cell and the context keeps its state", async () => {
  const sbx = await create();
  try {
    await sbx.interpreter.run("z = 7");
    let started = false;
    const running = sbx.interpreter.run("import time\nprint('started', flush=True)\nfor _ in range(600):\n    time.sleep(0.1)", {
      timeoutMs: 0,
      onStdout: (t) => (started ||= t.includes("started")),
    });
    await waitFor("the cell to start", () => started);
    assert.equal(await sbx.interpreter.contexts.interrupt("python"), true);
    const r = await running;
    assert.equal(r.status, "error");
    assert.equal(r.error.name, "KeyboardInterrupt");
    assert.equal((await sbx.interpreter.run("z")).results[0].data["text/plain"], "7");
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

daemonTest("bad process and context ids, signals, keys and refs are refused before any request", async () => {
  const seen = [];
  const server = http.createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    res.setHeader("Content-Type", "application/json");
    res.end(JSON.stringify({ id: "sbx_fake", state: "running" }));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${server.address().port}`;
  const sbx = await Sandbox.connect("sbx_fake", { baseUrl: url, apiKey: API_KEY });
  seen.length = 0;
  try {
    for (const id of ["", "../x", "proc_1/../../x", "a?b", "a#b", "p".repeat(200), "proc 1", null, 7]) {
      await assert.rejects(sbx.process(id), InvalidRequestError, String(id));
    }
    for (const ctx of ["", "Python", "../x", "a/b", "a:restart", "-x", "x".repeat(64), null]) {
      await assert.rejects(sbx.interpreter.contexts.restart(ctx), InvalidRequestError);
      await assert.rejects(sbx.interpreter.contexts.remove(ctx), InvalidRequestError);
      await assert.rejects(sbx.interpreter.run("1", { context: ctx }), InvalidRequestError);
    }
    await assert.rejects(sbx.interpreter.contexts.create({ id: "Bad!" }), InvalidRequestError);
    await assert.rejects(sbx.interpreter.run(42), InvalidRequestError);
    for (const t of [-1, 1.5, "10", 86_400_001]) await assert.rejects(sbx.interpreter.run("1", { timeoutMs: t }), InvalidRequestError);
    for (const ref of ["/etc/shadow", "/workspace/.runtime/interpreter/python/out/../../x", { path: "/workspace/x" }, {}]) {
      await assert.rejects(sbx.interpreter.result(ref), InvalidRequestError);
    }
    for (const key of ["", "a b", "k\r\nX-Evil: 1", "é", "k".repeat(129)]) {
      await assert.rejects(sbx.exec("true", { idempotencyKey: key }), InvalidRequestError);
      await assert.rejects(sbx.spawn("true", { idempotencyKey: key }), InvalidRequestError);
      assert.throws(() => sbx.execStream("true", { idempotencyKey: key }), InvalidRequestError);
    }
    await assert.rejects(sbx.spawn("true", { outputEncoding: "latin1" }), InvalidRequestError);
    await assert.rejects(sbx.exec("true", { timeoutMs: "5" }), InvalidRequestError);
    const p = new Process(sbx.http, sbx.id, { id: "proc_0123456789abcdef", state: "running" });
    for (const sig of ["SIGSEGV", "KILL; rm", "", 0, 99, 1.5]) await assert.rejects(p.kill(sig), InvalidRequestError);
    assert.throws(() => p.output({ cursor: -1 }), InvalidRequestError);
    await assert.rejects(p.write(42), InvalidRequestError);
    assert.deepEqual(seen, [], "nothing reached the server");
  } finally {
    sbx.close();
    await new Promise((r) => server.close(r));
  }
});

fullTest("a process of another sandbox or one that never was is not found", async () => {
  const a = await create();
  const b = await create();
  try {
    const p = await a.spawn("sleep 600");
    await assert.rejects(b.process(p.id), NotFoundError);
    await assert.rejects(a.process("proc_0000000000000000"), NotFoundError);
    await p.kill("KILL");
  } finally {
    await a[Symbol.asyncDispose]();
    await b[Symbol.asyncDispose]();
  }
});

daemonTest("a continue line is followed on from its cursor; a hostile one is refused", async () => {
  // A scripted peer, standing in for a daemon that ended a long answer (1 GiB or 5 minutes):
  // the SDK must read on from the cursor it was given, and never follow an id that is not one.
  const seen = [];
  let nextId = "proc_0123456789abcdef";
  const server = http.createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    res.setHeader("Content-Type", "application/x-ndjson");
    if (req.method === "POST" && req.url.endsWith(":exec")) {
      res.end([
        { type: "start", processId: "proc_0123456789abcdef", pid: 5, replayed: false },
        { type: "stdout", offset: 0, data: "abc" },
        { type: "continue", processId: nextId, cursor: 3 },
      ].map((e) => JSON.stringify(e) + "\n").join(""));
    } else if (req.method === "GET" && req.url.includes("/output?cursor=3")) {
      res.end([
        { type: "stdout", offset: 3, data: "def" },
        { type: "exit", exitCode: 0, timedOut: false, durationMs: 1, state: "exited" },
      ].map((e) => JSON.stringify(e) + "\n").join(""));
    } else {
      res.setHeader("Content-Type", "application/json");
      res.end(JSON.stringify({ id: "sbx_fake", state: "running" }));
    }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const sbx = await Sandbox.connect("sbx_fake", { baseUrl: `http://127.0.0.1:${server.address().port}`, apiKey: API_KEY });
  try {
    const r = await sbx.exec("x", { onStdout: () => {} });
    assert.equal(r.stdout, "abcdef");
    assert.equal(r.processId, "proc_0123456789abcdef");
    assert.ok(seen.some((s) => s.startsWith("GET /v1/sandboxes/sbx_fake/processes/proc_0123456789abcdef/output?cursor=3&follow=true")), seen.join("\n"));

    nextId = "../../../v1/keys";
    seen.length = 0;
    await assert.rejects(sbx.exec("x", { onStdout: () => {} }), InvalidRequestError);
    assert.ok(!seen.some((s) => s.includes("keys")), seen.join("\n"));
  } finally {
    sbx.close();
    await new Promise((r) => server.close(r));
  }
});
