// sbx.browser and sbx.desktop against the real daemon, on a sandbox of the `desktop` image: the
// desktop's start and its live view, screenshots (PNGs of the screen's size, decoded here), an
// xterm typed into with xdotool and seen in the next screenshot, a recording listed and
// downloaded, the browser's cdpUrl driven by a CDP client (node:http's WebSocket upgrade, then
// DevTools commands), and hostile input refused with the SDK's error classes.
// tests/integration/test_computer_use.py runs this file on each driver it tests, against a daemon
// with a preview listener.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import http from "node:http";
import { after, before } from "node:test";
import { inflateSync } from "node:zlib";

import { ConflictError, InvalidRequestError, NotFoundError, Sandbox } from "withruntime";

import { DRIVER, daemonTest, waitFor } from "./env.mjs";

const IMAGE = process.env.RUNTIME_TEST_DESKTOP_IMAGE || "desktop";
const WHITE = [255, 255, 255];

/** A PNG's width, height and a pixel reader (8-bit RGB or RGBA, as ffmpeg writes a screen). */
function decodePng(buf) {
  assert.deepEqual([...buf.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], "a PNG");
  let off = 8;
  let width = 0, height = 0, colorType = 0;
  const idat = [];
  while (off < buf.length) {
    const len = buf.readUInt32BE(off);
    const type = buf.toString("latin1", off + 4, off + 8);
    const data = buf.subarray(off + 8, off + 8 + len);
    if (type === "IHDR") {
      width = data.readUInt32BE(0);
      height = data.readUInt32BE(4);
      assert.equal(data[8], 8, "8 bits a sample");
      colorType = data[9];
    } else if (type === "IDAT") idat.push(data);
    off += 12 + len;
  }
  const bpp = { 2: 3, 6: 4 }[colorType];
  assert.ok(bpp, `colour type ${colorType}`);
  const raw = inflateSync(Buffer.concat(idat));
  const stride = width * bpp;
  const px = Buffer.alloc(stride * height);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let i = 0; i < stride; i++) {
      const a = i >= bpp ? px[y * stride + i - bpp] : 0;
      const b = y > 0 ? px[(y - 1) * stride + i] : 0;
      const c = i >= bpp && y > 0 ? px[(y - 1) * stride + i - bpp] : 0;
      let p;
      if (filter === 0) p = 0;
      else if (filter === 1) p = a;
      else if (filter === 2) p = b;
      else if (filter === 3) p = (a + b) >> 1;
      else {
        const pa = Math.abs(b - c), pb = Math.abs(a - c), pc = Math.abs(a + b - 2 * c);
        p = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      px[y * stride + i] = (line[i] + p) & 0xff;
    }
  }
  const pixel = (x, y) => [...px.subarray(y * stride + x * bpp, y * stride + x * bpp + 3)];
  return { width, height, pixel };
}

/** Pixels of a rectangle that are not white: text drawn on the xterm's white background. */
function inked(png, x0, y0, x1, y1) {
  let n = 0;
  for (let y = y0; y < y1; y++) for (let x = x0; x < x1; x++) if (png.pixel(x, y).join() !== WHITE.join()) n++;
  return n;
}

/*
 * The cdpUrl names 9222-sbx-HEX.localhost, which Node's resolver does not resolve: connect to
 * the listener's address and name the preview in the Host header, as docs/computer-use.md says.
 */
function throughListener(cdpUrl) {
  const u = new URL(cdpUrl);
  return { host: u.host, port: Number(u.port), path: u.pathname + u.search, token: u.searchParams.get("runtime_preview_token") };
}

/* The listener checks a token once per connection: each probe on a connection of its own. */
function get(port, host, path, headers) {
  return new Promise((resolve, reject) => {
    http
      .get({ host: "127.0.0.1", port, path, agent: false, headers: { Host: host, ...headers } }, (res) => {
        const parts = [];
        res.on("data", (c) => parts.push(c));
        res.on("end", () => resolve({ status: res.statusCode, body: Buffer.concat(parts).toString() }));
      })
      .on("error", reject);
  });
}

/** A client frame of one text message (masked, as RFC 6455 has clients send them). */
function textFrame(text) {
  const payload = Buffer.from(text);
  assert.ok(payload.length < 126);
  const mask = randomBytes(4);
  const masked = Buffer.from(payload.map((b, i) => b ^ mask[i % 4]));
  return Buffer.concat([Buffer.from([0x81, 0x80 | payload.length]), mask, masked]);
}

/** The first whole text message of a server's frames (unmasked; 7- or 16-bit length). */
function firstMessage(buf) {
  if (buf.length < 2) return null;
  let len = buf[1] & 0x7f;
  let off = 2;
  if (len === 126) {
    if (buf.length < 4) return null;
    len = buf.readUInt16BE(2);
    off = 4;
  }
  return buf.length < off + len ? null : buf.subarray(off, off + len).toString();
}

/** One DevTools command over the WebSocket of `cdpUrl`: its answer. */
function cdpCommand(cdpUrl, command) {
  const { host, port, path } = throughListener(cdpUrl);
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: "127.0.0.1",
      port,
      path,
      agent: false,
      headers: {
        Host: host,
        Connection: "Upgrade",
        Upgrade: "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": randomBytes(16).toString("base64"),
      },
    });
    const timer = setTimeout(() => req.destroy(new Error("no DevTools answer in 30 s")), 30_000);
    req.on("response", (res) => reject(new Error(`the WebSocket upgrade was answered ${res.statusCode}`)));
    req.on("error", reject);
    req.on("upgrade", (res, socket, head) => {
      let got = head;
      socket.on("data", (c) => {
        got = Buffer.concat([got, c]);
        const msg = firstMessage(got);
        if (msg !== null) {
          clearTimeout(timer);
          socket.destroy();
          resolve(JSON.parse(msg));
        }
      });
      socket.on("error", reject);
      socket.write(textFrame(JSON.stringify({ id: 1, ...command })));
    });
    req.end();
  });
}

let sbx;
before(async () => {
  if (!process.env.RUNTIME_BASE_URL) return;
  sbx = await Sandbox.create({ driver: DRIVER, image: IMAGE, memoryMiB: 2048, timeoutSeconds: 1800 });
});
after(async () => {
  if (!sbx) return;
  await sbx.delete();
  sbx.close();
});

daemonTest("desktop: start, screenshots of its size, an xterm typed into and seen", async () => {
  // Before its start an action is a conflict, and the error says what to do.
  await assert.rejects(sbx.desktop.move(10, 10), (e) => e instanceof ConflictError && e.status === 409);
  await assert.rejects(sbx.desktop.start({ width: 10, height: 10 }), InvalidRequestError);

  const started = await sbx.desktop.start({ width: 640, height: 480 });
  assert.equal(started.running, true);
  assert.equal(started.width, 640);
  assert.match(started.streamUrl, /^http:\/\/6080-sbx-[^/]+\/vnc\.html\?.*runtime_preview_token=/);
  // The live view: noVNC's page through the listener with the URL's token, and not without it.
  const view = throughListener(started.streamUrl);
  const page = await waitFor("noVNC's page", async () => {
    const r = await get(view.port, view.host, "/vnc.html", { "x-runtime-preview-token": view.token });
    return r.status === 200 ? r : null;
  }, 30);
  assert.ok(page.body.includes("noVNC"), page.body.slice(0, 200));
  assert.equal((await get(view.port, view.host, "/vnc.html", {})).status, 401);

  const empty = decodePng(await sbx.desktop.screenshot());
  assert.deepEqual([empty.width, empty.height], [640, 480]);
  assert.notDeepEqual(empty.pixel(100, 100), WHITE);
  const jpeg = await sbx.desktop.screenshot({ format: "jpeg", quality: 50 });
  assert.deepEqual([...jpeg.subarray(0, 3)], [0xff, 0xd8, 0xff]);

  const launched = await sbx.desktop.launch(["xterm", "-geometry", "60x15+40+40", "-bg", "white", "-fg", "black", "-title", "typed-here"]);
  assert.ok(launched.pid > 0, JSON.stringify(launched));
  const [win] = await waitFor("the xterm's window", async () => {
    const w = (await sbx.desktop.windows()).filter((x) => x.title === "typed-here");
    return w.length ? w : null;
  }, 60);
  assert.ok(win.width > 100 && typeof win.id === "string", JSON.stringify(win));
  await sbx.desktop.focus(win.id);
  await sbx.desktop.click(200, 120);
  // The window drawn, nothing typed yet: white where the window is, a prompt at most.
  const before = await waitFor("the xterm drawn", async () => {
    const png = decodePng(await sbx.desktop.screenshot());
    return png.pixel(100, 100).join() === WHITE.join() ? png : null;
  }, 30);
  const box = [win.x, win.y, Math.min(640, win.x + win.width), Math.min(480, win.y + win.height)];
  const inkBefore = inked(before, ...box);

  await sbx.desktop.type("echo typed-by-node > /tmp/typed.txt");
  await sbx.desktop.press("Return");
  await waitFor("the typed command's file", async () => (await sbx.exec("cat /tmp/typed.txt 2>/dev/null")).stdout === "typed-by-node\n", 30);
  // The typed line and its new prompt are on the screen: more ink in the window than before.
  // (xterm draws what it read a moment later: the next screenshots, until one shows it.)
  await waitFor(`the typed line on the screen (ink before it: ${inkBefore})`, async () => {
    return inked(decodePng(await sbx.desktop.screenshot()), ...box) > inkBefore + 200;
  }, 20);

  await sbx.desktop.move(300, 200);
  assert.deepEqual(await sbx.desktop.cursor(), { x: 300, y: 200 });
  assert.equal((await sbx.desktop.scroll(3, { dx: -2, x: 5, y: 5 })).ok, true);
  assert.equal((await sbx.desktop.drag([1, 1], [100, 100])).ok, true);
  assert.equal((await sbx.desktop.rightClick()).ok, true);
  assert.equal((await sbx.desktop.mouseDown()).ok, true);
  assert.equal((await sbx.desktop.mouseUp()).ok, true);
});

daemonTest("desktop: hostile input is refused as the daemon answers it", async () => {
  await sbx.desktop.start({ width: 640, height: 480 });
  const refused = (status, needle) => (e) => {
    assert.equal(e.status, status, String(e));
    if (needle) assert.ok(e.message.includes(needle), e.message);
    return true;
  };
  // An action of an unknown kind (past the type, as an agent's tool call may send it).
  await assert.rejects(sbx.desktop.act({ action: "teleport" }), (e) => e instanceof InvalidRequestError && refused(400, "unknown action")(e));
  await assert.rejects(sbx.desktop.act({ action: "move", x: 1, y: 1, extra: true }), (e) => e instanceof InvalidRequestError && refused(400, "unknown field")(e));
  await assert.rejects(sbx.desktop.click(640, 0), (e) => e instanceof InvalidRequestError && refused(400, "off the screen")(e));
  await assert.rejects(sbx.desktop.move(-1, 0), InvalidRequestError);
  await assert.rejects(sbx.desktop.drag([0, 0], [9999, 0]), InvalidRequestError);
  await assert.rejects(sbx.desktop.press("ctrl+nosuchkey"), (e) => e instanceof InvalidRequestError && refused(400, "nosuchkey")(e));
  await assert.rejects(sbx.desktop.press("Return; reboot"), InvalidRequestError);
  await assert.rejects(sbx.desktop.type("x".repeat(5000)), InvalidRequestError);
  await assert.rejects(sbx.desktop.type("x".repeat(4000), { delayMs: 1000 }), InvalidRequestError);
  await assert.rejects(sbx.desktop.scroll(100000), InvalidRequestError);
  await assert.rejects(sbx.desktop.click(1, 1, { button: "fourth" }), InvalidRequestError);
  await assert.rejects(sbx.desktop.focus("0x1; id"), InvalidRequestError);
  await assert.rejects(sbx.desktop.focus("0x7fffffff"), NotFoundError);
  await assert.rejects(sbx.desktop.open("javascript:alert(1)"), InvalidRequestError);
  await assert.rejects(sbx.desktop.launch([]), InvalidRequestError);
  await assert.rejects(sbx.desktop.launch(["no-such-program-here"]), ConflictError);
  await assert.rejects(sbx.desktop.screenshot({ format: "bmp" }), InvalidRequestError);
  await assert.rejects(sbx.desktop.screenshot({ format: "jpeg", quality: 101 }), InvalidRequestError);
  await assert.rejects(sbx.desktop.recordings.start({ fps: 0 }), InvalidRequestError);
  // A recording id that would walk the URL's path is refused before any request.
  await assert.rejects(sbx.desktop.recordings.get("rec_../../../files/content"), (e) => e instanceof InvalidRequestError && e.status === null);
  await assert.rejects(sbx.desktop.recordings.download("rec_0123456789abcdef0123"), NotFoundError);
  assert.equal((await sbx.exec("echo fine")).stdout, "fine\n");
});

daemonTest("desktop: a recording, listed and downloaded", async () => {
  await sbx.desktop.start({ width: 640, height: 480 });
  const rec = await sbx.desktop.recordings.start({ fps: 5, maxSeconds: 60, maxMiB: 5 });
  assert.match(rec.id, /^rec_[0-9a-f]+$/);
  assert.equal(rec.state, "recording");
  assert.deepEqual([rec.fps, rec.maxMiB], [5, 5]);
  await assert.rejects(sbx.desktop.recordings.start(), (e) => e instanceof ConflictError && e.code === "conflict");
  await assert.rejects(sbx.desktop.recordings.download(rec.id), ConflictError);
  await sbx.desktop.launch(["xterm"]);
  await new Promise((r) => setTimeout(r, 2000));
  await sbx.desktop.type("moving pixels");
  const stopped = await sbx.desktop.recordings.stop(rec.id);
  assert.equal(stopped.state, "done");
  assert.deepEqual((await sbx.desktop.recordings.list()).map((r) => r.id), [rec.id]);
  assert.equal((await sbx.desktop.recordings.get(rec.id)).state, "done");
  const video = await sbx.desktop.recordings.download(rec.id);
  assert.equal(video.subarray(4, 8).toString("latin1"), "ftyp", "an MP4");
  assert.equal(video.length, stopped.sizeBytes);
  assert.ok(video.length > 1000 && video.length <= 5 << 20, String(video.length));
  assert.equal(await sbx.desktop.recordings.delete(rec.id), true);
  await assert.rejects(sbx.desktop.recordings.get(rec.id), NotFoundError);
  assert.deepEqual(await sbx.desktop.recordings.list(), []);
});

daemonTest("browser: start, its cdpUrl driven by a CDP client, stop", async () => {
  const started = await sbx.browser.start();
  assert.equal(started.running, true);
  const cdp = new URL(started.cdpUrl);
  assert.equal(cdp.protocol, "ws:");
  assert.ok(cdp.hostname.startsWith("9222-sbx-") && cdp.pathname.startsWith("/devtools/browser/"), started.cdpUrl);
  const again = await sbx.browser.get();
  assert.equal(again.running, true);
  assert.equal(new URL(again.cdpUrl).pathname, cdp.pathname, "the same browser");

  // DevTools' own /json/version, with the token in a header, names the browser; without it, 401.
  const { host, port, token } = throughListener(started.cdpUrl);
  const version = await get(port, host, "/json/version", { "x-runtime-preview-token": token });
  assert.equal(version.status, 200, version.body);
  assert.ok(JSON.parse(version.body).webSocketDebuggerUrl.includes(cdp.pathname), version.body);
  assert.equal((await get(port, host, "/json/version", {})).status, 401);
  assert.equal((await get(port, host, "/json/version", { "x-runtime-preview-token": "1.00" })).status, 403);

  // A DevTools command over the cdpUrl's WebSocket, as a CDP client sends it.
  const answer = await cdpCommand(started.cdpUrl, { method: "Browser.getVersion" });
  assert.equal(answer.id, 1);
  assert.match(answer.result.product, /Chrome/, JSON.stringify(answer));
  const target = await cdpCommand(started.cdpUrl, { method: "Target.createTarget", params: { url: "about:blank" } });
  assert.match(target.result.targetId, /^[0-9A-F]+$/i, JSON.stringify(target));

  assert.equal(await sbx.browser.stop(), true);
  const after = await sbx.browser.get();
  assert.deepEqual([after.running, after.cdpUrl], [false, null]);
  assert.equal(await sbx.browser.stop(), false);
});

daemonTest("browser and desktop: an image without them is a conflict naming the image to use", async () => {
  const plain = await Sandbox.create({ driver: DRIVER, timeoutSeconds: 600 });
  try {
    const needsDesktop = (e) => e instanceof ConflictError && e.hint !== null && e.hint.includes('"desktop"');
    await assert.rejects(plain.browser.start({ headless: true }), needsDesktop);
    await assert.rejects(plain.desktop.start(), needsDesktop);
    assert.deepEqual(await plain.browser.get(), { running: false, cdpUrl: null, streamUrl: null });
  } finally {
    await plain.delete();
    plain.close();
  }
});
