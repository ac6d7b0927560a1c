// The account's calls against the real daemon: events, webhooks (each delivery checked by
// verifyWebhook), the audit log, the usage export and an OpenTelemetry export, under the Python
// SDK's names in camelCase. tests/integration/test_sdk_observability.py runs this file against a
// daemon that allows loopback receivers, tries a failed delivery again only after an hour and
// pushes exports only every hour (so a retry and a flush by hand are the only ones), with the key
// of an owner of its own.
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import http from "node:http";

import {
  InvalidRequestError,
  NotFoundError,
  Runtime,
  Sandbox,
  WebhookVerificationError,
  verifyWebhook,
} from "withruntime";

import { DRIVER, daemonTest, waitFor } from "./env.mjs";

const create = () => Sandbox.create({ driver: DRIVER, timeoutSeconds: 120 });

async function gone(sbx) {
  await sbx.delete();
  sbx.close();
}

/** A receiver on loopback: webhook deliveries at /hook, OTLP pushes under /otlp; answers `status`. */
async function receiver() {
  const seen = [];
  const state = { status: 204 };
  const server = http.createServer((req, res) => {
    const parts = [];
    req.on("data", (c) => parts.push(c));
    req.on("end", () => {
      seen.push({ url: req.url, headers: req.headers, body: Buffer.concat(parts) });
      res.writeHead(state.status, { "Content-Length": "0" });
      res.end();
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const base = `http://127.0.0.1:${server.address().port}`;
  return {
    state,
    url: `${base}/hook`,
    otlp: `${base}/otlp`,
    seen,
    ofType: (type) => seen.filter((s) => s.url === "/hook" && JSON.parse(s.body.toString("utf8")).type === type),
    logs: () =>
      seen
        .filter((s) => s.url === "/otlp/v1/logs")
        .flatMap((s) => JSON.parse(s.body.toString("utf8")).resourceLogs)
        .flatMap((rl) => rl.scopeLogs.flatMap((sl) => sl.logRecords))
        .map((rec) => Object.fromEntries(rec.attributes.map((a) => [a.key, a.value.stringValue]))),
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(r);
      }),
  };
}

/** A Runtime-Signature made here by the scheme docs/api.md states, not by the SDK. */
function sign(secret, stamp, body) {
  return `t=${stamp},v1=${createHmac("sha256", secret).update(`${stamp}.`).update(body).digest("hex")}`;
}

daemonTest("events: listed, filtered and paged", async () => {
  const rt = new Runtime();
  try {
    const sbx = await create();
    await sbx.stop();
    await gone(sbx);
    const page = await rt.events.list({ resourceId: sbx.id });
    assert.deepEqual(page.data.map((e) => e.type), ["sandbox.deleted", "sandbox.stopped", "sandbox.started", "sandbox.created"]);
    assert.equal(page.hasMore, false);
    const created = page.data[3];
    assert.match(created.id, /^evt_/);
    assert.equal(created.resourceId, sbx.id);
    assert.equal(created.resourceType, "sandbox");
    const stopped = await rt.events.list({ resourceId: sbx.id, type: "sandbox.stopped" });
    assert.deepEqual(stopped.data.map((e) => e.id), [page.data[1].id]);
    const first = await rt.events.list({ resourceId: sbx.id, limit: 3 });
    assert.equal(first.data.length, 3);
    assert.equal(first.hasMore, true);
    const second = await rt.events.list({ resourceId: sbx.id, limit: 3, cursor: first.nextCursor });
    assert.deepEqual([...first.data, ...second.data], page.data);
    await assert.rejects(rt.events.list({ limit: 0 }), (e) => e instanceof InvalidRequestError && e.status === 400);
    await assert.rejects(rt.events.list({ resource_id: sbx.id }), /unknown option "resource_id"/);
  } finally {
    rt.close();
  }
});

daemonTest("webhooks: deliveries verified, retried, rotated; the webhook disabled and deleted", async () => {
  const rt = new Runtime();
  const rx = await receiver();
  try {
    const hook = await rt.webhooks.create({ url: rx.url, events: ["sandbox.created", "sandbox.deleted"], description: "js" });
    const secret = hook.secret;
    assert.match(secret, /^whsec_[0-9a-f]{64}$/);
    assert.deepEqual([hook.url, hook.events, hook.description, hook.enabled], [rx.url, ["sandbox.created", "sandbox.deleted"], "js", true]);
    assert.ok((await rt.webhooks.list()).data.some((w) => w.id === hook.id && !("secret" in w)));
    assert.equal((await rt.webhooks.get(hook.id)).url, rx.url);

    const tested = await rt.webhooks.test(hook.id);
    assert.deepEqual([tested.delivered, tested.responseStatus, tested.error], [true, 204, null]);
    const [sent] = rx.ofType("webhook.test");
    const header = sent.headers["runtime-signature"];
    const event = verifyWebhook(sent.body, header, secret);
    assert.equal(event.type, "webhook.test");
    assert.deepEqual(verifyWebhook(sent.body.toString("utf8"), header, secret), event);

    // What verifyWebhook refuses, and the edges of its tolerance.
    const stamp = Number(/t=(\d+)/.exec(header)[1]);
    const changed = Buffer.from(sent.body);
    changed[changed.length - 2] ^= 1;
    for (const body of [changed, Buffer.concat([sent.body, Buffer.from(" ")])]) {
      assert.throws(() => verifyWebhook(body, header, secret), (e) => e instanceof WebhookVerificationError && /matches/.test(e.message));
    }
    assert.throws(() => verifyWebhook(sent.body, header, "whsec_" + "0".repeat(64)), /matches/);
    assert.throws(() => verifyWebhook(sent.body, header, secret, { now: stamp + 301 }), /301 s ago/);
    assert.throws(() => verifyWebhook(sent.body, header, secret, { now: stamp - 301 }), /in the future/);
    assert.equal(verifyWebhook(sent.body, header, secret, { now: stamp + 300 }).type, "webhook.test");
    const now = Math.floor(Date.now() / 1000);
    assert.throws(() => verifyWebhook(sent.body, sign(secret, now - 600, sent.body), secret), /ago/);
    assert.equal(verifyWebhook(sent.body, sign(secret, now, sent.body), secret).type, "webhook.test");
    assert.throws(() => verifyWebhook(sent.body, header.replace(`t=${stamp}`, `t=${stamp + 1}`), secret, { now: stamp }), /matches/);
    for (const bad of [undefined, "", header.split(",")[1], header.split(",")[0], `${header},t=${stamp}`]) {
      assert.throws(() => verifyWebhook(sent.body, bad, secret), (e) => e instanceof WebhookVerificationError && /header/.test(e.message));
    }
    assert.throws(() => verifyWebhook(sent.body, header, []), InvalidRequestError);

    // A refused first attempt waits an hour here; a retry by hand delivers it now.
    rx.state.status = 503;
    const sbx = await create();
    const [pending] = await waitFor("the refused first attempt", async () => {
      const d = (await rt.webhooks.deliveries(hook.id, { state: "pending" })).data.filter((x) => x.attempts === 1);
      return d.length ? d : null;
    });
    assert.deepEqual([pending.eventType, pending.responseStatus, pending.webhookId], ["sandbox.created", 503, hook.id]);
    rx.state.status = 204;
    const retried = await rt.webhooks.retry(pending.id);
    assert.deepEqual([retried.id, retried.state, retried.attempts, retried.responseStatus], [pending.id, "delivered", 2, 204]);
    const tries = rx.ofType("sandbox.created");
    assert.deepEqual(tries.map((t) => t.headers["runtime-delivery-id"]), [pending.id, pending.id]);
    const delivered = verifyWebhook(tries[1].body, tries[1].headers["runtime-signature"], secret);
    assert.deepEqual([delivered.id, delivered.resourceId], [pending.eventId, sbx.id]);
    await gone(sbx);
    await waitFor("the sandbox.deleted delivery", async () => (await rt.webhooks.deliveries(hook.id, { state: "delivered" })).data.length === 2);
    const one = await rt.webhooks.deliveries(hook.id, { limit: 1 });
    const two = await rt.webhooks.deliveries(hook.id, { limit: 1, cursor: one.nextCursor });
    assert.deepEqual([...one.data, ...two.data].map((d) => d.eventType), ["sandbox.deleted", "sandbox.created"]);
    assert.deepEqual([one.hasMore, two.hasMore], [true, false]);

    // A rotation with an overlap signs with both secrets; one without, with the new one only.
    const rotated = await rt.webhooks.rotateSecret(hook.id, { keepPreviousSeconds: 120 });
    assert.notEqual(rotated.secret, secret);
    assert.ok(rotated.previousSecretExpiresAt);
    assert.equal((await rt.webhooks.test(hook.id)).delivered, true);
    let last = rx.ofType("webhook.test").at(-1);
    assert.equal(last.headers["runtime-signature"].split("v1=").length - 1, 2);
    for (const key of [rotated.secret, secret, ["whsec_" + "1".repeat(64), rotated.secret]]) {
      assert.equal(verifyWebhook(last.body, last.headers["runtime-signature"], key).type, "webhook.test");
    }
    const newest = (await rt.webhooks.rotateSecret(hook.id, { keepPreviousSeconds: 0 })).secret;
    assert.equal((await rt.webhooks.test(hook.id)).delivered, true);
    last = rx.ofType("webhook.test").at(-1);
    assert.equal(verifyWebhook(last.body, last.headers["runtime-signature"], newest).type, "webhook.test");
    assert.throws(() => verifyWebhook(last.body, last.headers["runtime-signature"], rotated.secret), WebhookVerificationError);

    const off = await rt.webhooks.update(hook.id, { enabled: false, description: "off" });
    assert.deepEqual([off.enabled, off.description], [false, "off"]);
    assert.deepEqual(await rt.webhooks.delete(hook.id), { id: hook.id, deleted: true });
    await assert.rejects(rt.webhooks.get(hook.id), NotFoundError);
    await assert.rejects(rt.webhooks.get(""), InvalidRequestError);
  } finally {
    rt.close();
    await rx.close();
  }
});

daemonTest("audit: by action, by sandbox and by page", async () => {
  const rt = new Runtime();
  const a = await create();
  const b = await create();
  try {
    assert.equal((await a.exec("exit 3")).exitCode, 3);
    assert.equal((await b.exec("true")).exitCode, 0);
    assert.equal((await a.exec("echo ok")).stdout, "ok\n");
    // A record is written once its call is answered: the last may come just after.
    await waitFor("a's three records", async () => (await rt.audit.list({ sandboxId: a.id })).events.length === 3);
    const ofA = (await rt.audit.list({ sandboxId: a.id })).events;
    assert.deepEqual(
      ofA.map((e) => [e.action, e.detail.command ?? null, e.detail.exitCode ?? null]),
      [["sandbox.exec", "echo ok", 0], ["sandbox.exec", "exit 3", 3], ["sandbox.create", null, null]],
    );
    const ofB = (await rt.audit.list({ action: "sandbox.exec", sandboxId: b.id })).events;
    assert.deepEqual(ofB.map((e) => e.detail.command), ["true"]);
    const first = await rt.audit.list({ sandboxId: a.id, limit: 2 });
    const second = await rt.audit.list({ sandboxId: a.id, limit: 2, before: first.next });
    assert.deepEqual([first.hasMore, second.hasMore], [true, false]);
    assert.deepEqual([...first.events, ...second.events].map((e) => e.id), ofA.map((e) => e.id));
    await assert.rejects(rt.audit.list({ sandboxId: "x y" }), InvalidRequestError);
  } finally {
    await gone(a);
    await gone(b);
    rt.close();
  }
});

daemonTest("usageExport: every page, CSV and JSON alike", async () => {
  const rt = new Runtime();
  try {
    const since = new Date(Date.now() - 1000);
    const made = [];
    for (let i = 0; i < 3; i++) {
      const sbx = await create();
      made.push(sbx.id);
      await gone(sbx);
    }
    const until = new Date(Date.now() + 60_000);
    const pages = [];
    let cursor;
    do {
      const page = await rt.usageExport(since, until, { cursor, limit: 2 });
      pages.push(page);
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
    assert.ok(pages.length >= 2 && pages.at(-1).hasMore === false);
    const rows = pages.flatMap((p) => p.rows);
    assert.deepEqual(rows.filter((r) => made.includes(r.resourceId)).map((r) => r.resourceId).sort(), [...made].sort());
    const csv = pages.map((p) => p.csv).join("");
    assert.equal(csv.split("settledAt,").length - 1, 1);
    assert.equal(csv.trim().split("\r\n").length, rows.length + 1);
    // The same range as text and as unix seconds: the same rows.
    const text = (d) => d.toISOString().replace(/\.\d{3}Z$/, "Z");
    assert.deepEqual((await rt.usageExport(text(since), text(until), { limit: 1000 })).rows, rows);
    assert.deepEqual((await rt.usageExport(Math.floor(since / 1000), Math.floor(until / 1000), { limit: 1000 })).rows, rows);
    await assert.rejects(rt.usageExport(new Date("not a time"), until), InvalidRequestError);
    await assert.rejects(rt.usageExport(until, since), (e) => e instanceof InvalidRequestError && e.status === 400);
  } finally {
    rt.close();
  }
});

daemonTest("otel: an export made, listed, flushed, changed and deleted", async () => {
  const rt = new Runtime();
  const rx = await receiver();
  try {
    const x = await rt.otel.create({ endpoint: rx.otlp, headers: { Authorization: "Bearer js-T0KEN-9" }, signals: ["logs"] });
    assert.match(x.id, /^otx_/);
    assert.deepEqual([x.endpoint, x.headerNames, x.signals, x.enabled], [rx.otlp, ["Authorization"], ["logs"], true]);
    const listed = await rt.otel.list();
    assert.deepEqual(listed.data.map((e) => e.id), [x.id]);
    assert.equal((await rt.otel.get(x.id)).endpoint, rx.otlp);
    assert.ok(!JSON.stringify([x, listed]).includes("js-T0KEN-9"));
    const sbx = await create();
    await gone(sbx);
    const types = (await rt.events.list({ resourceId: sbx.id })).data.map((e) => e.type).sort();
    // Records younger than two seconds wait for the next push: flush until all came.
    const after = await waitFor("the sandbox's events pushed by flush", async () => {
      await new Promise((r) => setTimeout(r, 250));
      const got = await rt.otel.flush(x.id);
      const kinds = rx.logs().filter((l) => l["runtime.resource.id"] === sbx.id).map((l) => l["event.name"]).sort();
      return JSON.stringify(kinds) === JSON.stringify(types) ? got : null;
    });
    assert.deepEqual([after.lastStatus, after.lastError], [204, null]);  // what the receiver answers
    assert.ok(rx.seen.every((s) => s.url === "/otlp/v1/logs" && s.headers.authorization === "Bearer js-T0KEN-9"));
    const up = await rt.otel.update(x.id, { enabled: false, signals: ["logs", "metrics"] });
    assert.deepEqual([up.enabled, up.signals], [false, ["logs", "metrics"]]);
    assert.deepEqual(await rt.otel.delete(x.id), { id: x.id, deleted: true });
    await assert.rejects(rt.otel.get(x.id), NotFoundError);
  } finally {
    rt.close();
    await rx.close();
  }
});
