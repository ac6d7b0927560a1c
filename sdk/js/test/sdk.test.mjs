// The SDK against the real daemon: create, exec (buffered and streamed), files, stop, extend,
// delete, disposal, typed errors, and bad input refused before any request.
import assert from "node:assert/strict";
import http from "node:http";
import { randomBytes } from "node:crypto";

import {
  APIConnectionError,
  AuthenticationError,
  BudgetExceededError,
  ConfigurationError,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  Sandbox,
  resolveEndpoint,
  SpendingLimitError,
} from "withruntime";

import { API_KEY, BASE_URL, DRIVER, SLOW, daemonTest, fullTest, waitFor } from "./env.mjs";

const create = (opts = {}) => Sandbox.create({ driver: DRIVER, timeoutSeconds: 600, ...opts });

/** A local HTTP server that records what reaches it. */
async function recorder(handler = (req, res) => res.end("{}")) {
  const seen = [];
  const server = http.createServer((req, res) => {
    seen.push({ method: req.method, url: req.url, headers: req.headers });
    handler(req, res);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${server.address().port}`;
  return { seen, url, close: () => new Promise((r) => server.close(r)) };
}

daemonTest("create, exec, files and delete on one sandbox", async () => {
  const sbx = await create();
  try {
    assert.match(sbx.id, /^sbx_/);
    assert.equal(sbx.state, "running");
    if (DRIVER) assert.equal(sbx.driver, DRIVER);

    const r = await sbx.exec("python3 -c 'print(6 * 7)'");
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "42\n");
    assert.equal(r.ok, true);

    const data = randomBytes(70_000);
    const w = await sbx.files.write("bin/data.bin", data);
    assert.deepEqual(w, { path: "/workspace/bin/data.bin", size: data.length });
    assert.deepEqual(await sbx.files.read("/workspace/bin/data.bin"), data);
    const sum = await sbx.exec(["sha256sum", "bin/data.bin"]);
    const { createHash } = await import("node:crypto");
    assert.equal(sum.stdout.split(" ")[0], createHash("sha256").update(data).digest("hex"));
  } finally {
    await sbx.delete();
    sbx.close();
  }
  await assert.rejects(Sandbox.connect(sbx.id), NotFoundError);
});

fullTest("exec: argv, stdin, env, cwd, exit codes and a timeout as a result", async () => {
  const sbx = await create();
  try {
    const a = await sbx.exec(["printf", "%s|", "a b", "$HOME", "'q'"]);
    assert.equal(a.stdout, "a b|$HOME|'q'|");
    const s = await sbx.exec("cat", { stdin: "from stdin\n" });
    assert.equal(s.stdout, "from stdin\n");
    const b = await sbx.exec(["od", "-An", "-tx1"], { stdin: new Uint8Array([0, 255, 10]) });
    assert.equal(b.stdout.trim(), "00 ff 0a");
    const e = await sbx.exec("echo $GREETING; pwd", { env: { GREETING: "hello" }, cwd: "/tmp" });
    assert.equal(e.stdout, "hello\n/tmp\n");
    const f = await sbx.exec("echo out; echo err >&2; exit 3");
    assert.deepEqual([f.exitCode, f.stdout, f.stderr, f.ok], [3, "out\n", "err\n", false]);
    const t = await sbx.exec("sleep 30", { timeoutSeconds: 1 });
    assert.equal(t.timedOut, true);
    assert.equal(t.exitCode, 137);
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

daemonTest("streamed exec: events as they happen, with the process id", async () => {
  const sbx = await create();
  try {
    const events = [];
    let firstAt = 0;
    const started = Date.now();
    for await (const ev of sbx.execStream("echo one; sleep 1; echo two >&2; exit 4")) {
      events.push(ev);
      if (ev.type === "stdout" && !firstAt) firstAt = Date.now();
    }
    assert.equal(events[0].type, "start");
    assert.ok(Number.isInteger(events[0].pid) && events[0].pid > 0, JSON.stringify(events[0]));
    const out = events.filter((e) => e.type === "stdout").map((e) => e.data).join("");
    const err = events.filter((e) => e.type === "stderr").map((e) => e.data).join("");
    assert.equal(out, "one\n");
    assert.equal(err, "two\n");
    const exit = events.at(-1);
    assert.equal(exit.type, "exit");
    assert.equal(exit.exitCode, 4);
    // "one" arrived before the command slept its second: it was streamed, not buffered.
    assert.ok(firstAt - started < Date.now() - started - 500, `first output at ${firstAt - started} ms`);

    const seen = [];
    const r = await sbx.exec("for i in 1 2 3; do echo $i; done; echo e >&2", {
      onStdout: (d) => seen.push(["out", d]),
      onStderr: (d) => seen.push(["err", d]),
    });
    assert.equal(r.stdout, "1\n2\n3\n");
    assert.equal(r.stderr, "e\n");
    assert.ok(Number.isInteger(r.pid));
    assert.equal(seen.filter(([k]) => k === "out").map(([, d]) => d).join(""), "1\n2\n3\n");
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

fullTest("leaving a stream early ends the command in the sandbox", async () => {
  const sbx = await create();
  try {
    for await (const ev of sbx.execStream("echo $$ > /workspace/pid; echo ready; sleep 600")) {
      if (ev.type === "stdout") break;
    }
    const pid = (await sbx.files.readText("/workspace/pid")).trim();
    await waitFor("the abandoned command to be killed", async () => (await sbx.exec(`kill -0 ${pid} 2>/dev/null || echo gone`)).stdout === "gone\n");

    const ac = new AbortController();
    const p = sbx.exec("sleep 600", { signal: ac.signal, onStdout: () => {} });
    setTimeout(() => ac.abort(), 200);
    await assert.rejects(p, (e) => e.code === "aborted");
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

daemonTest("files: signed links download and upload with no key, once when one-time, never after a revoke", async () => {
  const sbx = await create();
  try {
    await sbx.files.write("linked.txt", "through a link");
    const down = await sbx.files.downloadUrl("linked.txt", { expiresInSeconds: 120, filename: "linked.txt" });
    assert.equal(down.method, "GET");
    assert.equal(down.path, "/workspace/linked.txt");
    assert.equal(down.expiresInSeconds, 120);
    let r = await fetch(down.url); // no key
    assert.equal(r.status, 200);
    assert.equal(await r.text(), "through a link");
    assert.equal(r.headers.get("content-disposition"), 'attachment; filename="linked.txt"');
    const once = await sbx.files.downloadUrl("linked.txt", { oneTime: true });
    assert.equal((await fetch(once.url)).status, 200);
    r = await fetch(once.url);
    assert.equal(r.status, 410);
    assert.equal((await r.json()).error.code, "link_used");
    const up = await sbx.files.uploadUrl("up/by-link.txt", { maxBytes: 64 });
    assert.equal(up.maxBytes, 64);
    r = await fetch(up.url, { method: "PUT", body: "uploaded" });
    assert.equal(r.status, 200);
    assert.equal(await sbx.files.readText("up/by-link.txt"), "uploaded");
    assert.equal((await sbx.files.revokeLinks()).revoked, true);
    r = await fetch(down.url);
    assert.equal(r.status, 403);
    assert.equal((await r.json()).error.code, "forbidden");
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

fullTest("files: list, stat, exists, mkdir, rename, remove, mode", async () => {
  const sbx = await create();
  try {
    await sbx.files.mkdir("/workspace/d/e");
    await sbx.files.write("d/e/f.txt", "hello");
    await sbx.files.write("run.sh", "#!/bin/sh\necho ran\n", { mode: 0o755 });
    assert.equal((await sbx.exec("./run.sh")).stdout, "ran\n");
    const st = await sbx.files.stat("d/e/f.txt");
    assert.equal(st.type, "file");
    assert.equal(st.size, 5);
    assert.equal(st.isFile, true);
    const list = await sbx.files.list("/workspace", { depth: 3 });
    const paths = list.map((e) => e.path).sort();
    assert.ok(paths.includes("/workspace/d/e/f.txt"), paths.join(","));
    assert.equal(list.truncated, false);
    assert.equal(await sbx.files.exists("d/e/f.txt"), true);
    await sbx.files.rename("d/e/f.txt", "d/g.txt");
    assert.equal(await sbx.files.exists("d/e/f.txt"), false);
    assert.equal(await sbx.files.readText("d/g.txt"), "hello");
    await assert.rejects(sbx.files.remove("d"), ConflictError);
    await sbx.files.remove("d", { recursive: true });
    assert.equal(await sbx.files.exists("d"), false);
    await assert.rejects(sbx.files.read("nope.txt"), (e) => e instanceof NotFoundError && e.code === "not_found" && e.status === 404);
    // A stream of bytes goes up without being gathered first.
    async function* chunks() {
      for (let i = 0; i < 8; i++) yield Buffer.alloc(256 * 1024, i);
    }
    const w = await sbx.files.write("big.bin", chunks());
    assert.equal(w.size, 8 * 256 * 1024);
    assert.equal((await sbx.files.read("big.bin")).length, 8 * 256 * 1024);
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
});

fullTest("stop, extend, refresh, connect, list and await-using disposal", async () => {
  const sbx = await create({ timeoutSeconds: 300, labels: { suite: "js" }, name: "js-sdk" });
  let id = sbx.id;
  try {
    const ends = Date.parse(sbx.leaseEndsAt);
    await sbx.extend(600);
    assert.ok(Date.parse(sbx.leaseEndsAt) > ends);
    const other = await Sandbox.connect(id);
    assert.equal(other.name, "js-sdk");
    assert.deepEqual(other.labels, { suite: "js" });
    await other[Symbol.asyncDispose](); // attached: not deleted
    assert.equal((await sbx.refresh()).state, "running");
    const all = await Sandbox.list();
    assert.ok(all.some((s) => s.id === id));
    await sbx.stop();
    assert.equal(sbx.state, "stopped");
    await assert.rejects(sbx.exec("true"), ConflictError);
  } finally {
    await sbx[Symbol.asyncDispose]();
  }
  await assert.rejects(Sandbox.connect(id), NotFoundError);

  const kept = await create({ keep: true });
  id = kept.id;
  await kept[Symbol.asyncDispose]();
  const again = await Sandbox.connect(id);
  assert.equal(again.state, "running");
  await again.delete();
  again.close();
});

fullTest("typed errors with the API's codes: budget_exceeded, spending_limit_reached, unauthorized", async () => {
  await assert.rejects(create({ maxCostMicros: 1 }), (e) => e instanceof BudgetExceededError && e.code === "budget_exceeded" && e.status === 409);

  // A key whose daily limit is below one lease.
  const res = await fetch(`${BASE_URL}/v1/keys`, {
    method: "POST",
    headers: { Authorization: `Bearer ${API_KEY}`, "Content-Type": "application/json" },
    body: JSON.stringify({ name: `js-limit-${Date.now()}`, dailyLimitMicros: 1 }),
  });
  assert.equal(res.status, 201, await res.clone().text());
  const limited = (await res.json()).key;
  await assert.rejects(create({ apiKey: limited }), (e) => e instanceof SpendingLimitError && e.code === "spending_limit_reached" && e.status === 402);

  const wrong = "rt_" + "0".repeat(40);
  await assert.rejects(Sandbox.list({ apiKey: wrong }), (e) => {
    assert.ok(e instanceof AuthenticationError);
    assert.ok(!String(e).includes(wrong) && !e.message.includes(wrong));
    return true;
  });
});

daemonTest("bad input is refused before a request is made", async () => {
  const rec = await recorder();
  try {
    const opts = { baseUrl: rec.url, apiKey: "rt_test" };
    for (const id of ["", "../keys", "sbx_1/../../v1/keys", "a b", "x".repeat(200), "sbx?x=1", "%2e%2e"]) {
      await assert.rejects(Sandbox.connect(id, opts), InvalidRequestError, id);
    }
    await assert.rejects(Sandbox.create({ ...opts, memoryMB: 512 }), (e) => e instanceof TypeError && /memoryMiB/.test(e.message));
    // A sandbox object for the file checks; its id is one the daemon never made.
    const { HttpClient } = await import("../dist/http.js");
    const fake = new Sandbox(new HttpClient(resolveEndpoint(rec.url), "rt_test"), { id: "sbx_0" });
    await assert.rejects(fake.files.read("a\0b"), InvalidRequestError);
    await assert.rejects(fake.files.read(""), InvalidRequestError);
    await assert.rejects(fake.files.write("x".repeat(5000), "a"), InvalidRequestError);
    await assert.rejects(fake.files.list("/", { depth: 11 }), InvalidRequestError);
    await assert.rejects(fake.exec(""), InvalidRequestError);
    await assert.rejects(fake.exec([]), InvalidRequestError);
    await assert.rejects(fake.exec("true", { timeoutSeconds: 0 }), InvalidRequestError);
    await assert.rejects(fake.exec("true", { timeoutSeconds: 86401 }), InvalidRequestError);
    await assert.rejects(fake.network.set({ internet: false, allow: ["a.com"] }), InvalidRequestError);
    assert.deepEqual(rec.seen, []);
    // Credentials in the base URL are refused, without echoing them.
    await assert.rejects(Sandbox.list({ baseUrl: "http://rt_secret@127.0.0.1:1" }), (e) => e instanceof ConfigurationError && !e.message.includes("rt_secret"));
  } finally {
    await rec.close();
  }
});

daemonTest("redirects are not followed and proxies from the environment are not used", async () => {
  const target = await recorder();
  const redirector = await recorder((req, res) => {
    res.writeHead(307, { Location: `${target.url}${req.url}` });
    res.end();
  });
  const proxy = await recorder();
  const saved = { HTTP_PROXY: process.env.HTTP_PROXY, http_proxy: process.env.http_proxy, HTTPS_PROXY: process.env.HTTPS_PROXY };
  process.env.HTTP_PROXY = process.env.http_proxy = process.env.HTTPS_PROXY = proxy.url;
  try {
    await assert.rejects(Sandbox.list({ baseUrl: redirector.url, apiKey: "rt_secret_key" }), (e) => {
      assert.ok(e instanceof APIConnectionError, String(e));
      assert.match(e.message, /redirect/);
      assert.ok(!e.message.includes("rt_secret_key"));
      return true;
    });
    assert.equal(redirector.seen.length, 1);
    assert.equal(redirector.seen[0].headers.authorization, "Bearer rt_secret_key");
    assert.deepEqual(target.seen, []);
    // The real daemon, with a proxy in the environment: the proxy sees nothing.
    const sbxs = await Sandbox.list();
    assert.ok(Array.isArray(sbxs));
    assert.deepEqual(proxy.seen, []);
    // The key never goes in a URL.
    assert.ok(redirector.seen.every((r) => !r.url.includes("rt_secret_key")));
  } finally {
    for (const [k, v] of Object.entries(saved)) if (v === undefined) delete process.env[k]; else process.env[k] = v;
    await Promise.all([target.close(), redirector.close(), proxy.close()]);
  }
});

daemonTest("a daemon that is not there is a connection error naming the address", async () => {
  const rec = await recorder();
  const url = rec.url;
  await rec.close();
  await assert.rejects(Sandbox.list({ baseUrl: url, apiKey: "rt_x" }), (e) => e instanceof APIConnectionError && e.message.includes(url) && e.code === "connection_error");
});

void SLOW;

daemonTest("metrics: the sandbox's readings, and a range not offered refused before any request", async () => {
  const sbx = await create();
  try {
    const m = await sbx.metrics("15m");
    assert.equal(m.sandboxId, sbx.id);
    assert.equal(m.range, "15m");
    assert.ok(Array.isArray(m.points));
    assert.ok(Number.isInteger(m.stepSeconds) && m.stepSeconds >= 1);
    assert.equal((await sbx.metrics()).range, "1h");
    await assert.rejects(sbx.metrics("2h"), InvalidRequestError);
  } finally {
    await sbx.delete();
  }
});
