// runtime.mcp and sbx.mcp against the real daemon: the catalog, the filesystem server started and
// ready, its URL refused without the guard header and answering MCP's initialize with it, hostile
// starts refused with the SDK's error classes, stop. tests/integration/test_mcp_inside.py runs
// this file against a daemon with a preview listener, whose port it passes in
// RUNTIME_TEST_PREVIEW_PORT.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before } from "node:test";

import { ConflictError, InvalidRequestError, NotFoundError, Runtime, Sandbox } from "withruntime";

import { DRIVER, daemonTest } from "./env.mjs";

const PREVIEW_PORT = Number(process.env.RUNTIME_TEST_PREVIEW_PORT || 0);

/*
 * A server's URL names PORT-sbx-HEX.localhost, which Node's resolver need not resolve: post to
 * the listener's address and name the preview in the Host header, as docs/mcp.md says.
 */
function post(url, body, headers) {
  const u = new URL(url);
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: "127.0.0.1",
      port: PREVIEW_PORT,
      path: u.pathname,
      method: "POST",
      agent: false,
      headers: {
        Host: u.host,
        "Content-Type": "application/json",
        Accept: "application/json, text/event-stream",
        "Content-Length": Buffer.byteLength(data),
        ...headers,
      },
    }, (res) => {
      const parts = [];
      res.on("data", (c) => parts.push(c));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(parts).toString() }));
    });
    req.setTimeout(60_000, () => req.destroy(new Error("no answer in 60 s")));
    req.on("error", reject);
    req.end(data);
  });
}

/** The JSON-RPC message of an answer sent as JSON or as one server-sent event. */
function rpcAnswer(res) {
  if (String(res.headers["content-type"]).startsWith("text/event-stream")) {
    const line = res.body.split("\n").find((l) => l.startsWith("data:"));
    assert.ok(line, res.body);
    return JSON.parse(line.slice(5));
  }
  return JSON.parse(res.body);
}

let sbx;
before(async () => {
  if (!process.env.RUNTIME_BASE_URL) return;
  sbx = await Sandbox.create({ driver: DRIVER, memoryMiB: 1024, timeoutSeconds: 900 });
});
after(async () => {
  if (!sbx) return;
  await sbx.delete();
  sbx.close();
});

daemonTest("mcp: catalog, start, ready, the URL guarded and answering initialize, stop", { skip: PREVIEW_PORT ? undefined : "RUNTIME_TEST_PREVIEW_PORT is not set (run through tests/integration/test_mcp_inside.py)" }, async () => {
  const runtime = new Runtime();
  try {
    const catalog = await runtime.mcp.catalog();
    assert.ok(catalog.some((c) => c.id === "filesystem" && c.inImage === true), JSON.stringify(catalog));
  } finally {
    runtime.close();
  }
  assert.equal((await sbx.mcp.get()).running, false);
  // Hostile starts, refused before anything runs.
  await assert.rejects(sbx.mcp.start([{ id: "nope" }]), NotFoundError);
  await assert.rejects(sbx.mcp.start([]), InvalidRequestError);
  await assert.rejects(sbx.mcp.start([{ id: "filesystem" }], { port: 80 }), InvalidRequestError);
  await assert.rejects(sbx.mcp.start([{ id: "filesystem", cmd: "sh" }]), (e) => e instanceof InvalidRequestError && e.message.includes("unknown field"));
  await assert.rejects(sbx.mcp.start([{ id: "filesystem" }], { public: true }), (e) => e.status === 501 && e.code === "not_implemented");

  const started = await sbx.mcp.start([{ id: "filesystem" }]);
  assert.equal(started.running, true);
  assert.deepEqual(started.servers.map((s) => s.id), ["filesystem"]);
  await assert.rejects(sbx.mcp.start([{ id: "memory" }]), ConflictError);
  const ready = await sbx.mcp.ready({ timeoutSeconds: 60, intervalSeconds: 0.5 });
  const [fs] = ready.servers;
  assert.equal(fs.status, "running", JSON.stringify(ready));
  assert.ok(fs.url.endsWith("/servers/filesystem/mcp"), fs.url);
  assert.deepEqual(Object.keys(ready.headers), ["x-runtime-preview-token"]);

  const initialize = {
    jsonrpc: "2.0",
    id: 1,
    method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "withruntime-test", version: "1" } },
  };
  assert.equal((await post(fs.url, initialize, {})).status, 401);
  assert.equal((await post(fs.url, initialize, { "x-runtime-preview-token": "1.00" })).status, 403);
  const res = await post(fs.url, initialize, ready.headers);
  assert.equal(res.status, 200, res.body);
  const answer = rpcAnswer(res);
  assert.equal(answer.id, 1, res.body);
  assert.ok(answer.result.serverInfo.name, res.body);
  assert.ok(answer.result.capabilities.tools, res.body);

  assert.equal(await sbx.mcp.stop(), true);
  assert.equal((await sbx.mcp.get()).running, false);
  assert.equal(await sbx.mcp.stop(), false);
});
