// The `withruntime` bin and the C CLI `runtime` against the same expectations (docs/cli.md):
// exit codes, streaming, Ctrl-C, a broken pipe, the trial-key flow, files and the other verbs.
// RUNTIME_TEST_CLIS lists the CLIs as JSON ([["name", "argv0", ...], ...]); the default is this bin alone.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, statSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { describe } from "node:test";

import { Sandbox } from "withruntime";

import { API_KEY, BASE_URL, DRIVER, SLOW, daemonTest, fullTest, waitFor } from "./env.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const CLIS = process.env.RUNTIME_TEST_CLIS
  ? JSON.parse(process.env.RUNTIME_TEST_CLIS)
  : [["withruntime", process.execPath, join(HERE, "..", "dist", "cli.js")]];
const D = DRIVER ? ["--driver", DRIVER] : [];

function childEnv(extra = {}) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("RUNTIME_")) env[k] = v;
  return { ...env, RUNTIME_BASE_URL: BASE_URL, RUNTIME_API_KEY: API_KEY, ...extra };
}

/** Starts the CLI; `done` resolves with {code, signal, stdout, stderr}. */
function start(cli, args, { env, input } = {}) {
  const [, argv0, ...pre] = cli;
  const child = spawn(argv0, [...pre, ...args], { env: env ?? childEnv(), stdio: ["pipe", "pipe", "pipe"] });
  const out = [];
  const err = [];
  child.stdout.on("data", (d) => out.push(d));
  child.stderr.on("data", (d) => err.push(d));
  child.stdout.on("error", () => {});
  child.stdin.on("error", () => {});
  if (input !== undefined) child.stdin.end(input);
  else child.stdin.end();
  const done = new Promise((resolve) =>
    child.on("close", (code, signal) =>
      resolve({ code, signal, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString("utf8"), text: Buffer.concat(out).toString("utf8") }),
    ),
  );
  return { child, done, stdoutSoFar: () => Buffer.concat(out).toString("utf8") };
}

const run = (cli, args, opts) => start(cli, args, opts).done;

async function sandboxIds() {
  return new Set((await Sandbox.list()).map((s) => s.id));
}

/** Waits until every sandbox made since `before` is gone. */
async function noNewSandboxes(before) {
  await waitFor("the CLI's sandbox to be deleted", async () => [...(await sandboxIds())].every((id) => before.has(id)));
}

for (const cli of CLIS) {
  const name = cli[0];
  describe(name, () => {
    daemonTest(`${name}: sandbox run prints 42 and deletes its sandbox`, async () => {
      const before = await sandboxIds();
      const r = await run(cli, ["sandbox", "run", ...D, "--", "python3", "-c", "print(6 * 7)"]);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.text, "42\n");
      await noNewSandboxes(before);
    });

    fullTest(`${name}: exit codes pass through; stdout and stderr apart; a timeout is 124`, async () => {
      for (const code of [0, 1, 7, 255]) {
        const r = await run(cli, ["sandbox", "run", ...D, "--", "sh", "-c", `exit ${code}`]);
        assert.equal(r.code, code, r.stderr);
      }
      const r = await run(cli, ["sandbox", "run", ...D, "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
      assert.deepEqual([r.code, r.text, r.stderr], [3, "out\n", "err\n"]);
      const t = await run(cli, ["sandbox", "run", ...D, "--timeout", "1s", "--", "sleep", "30"]);
      assert.equal(t.code, 124, t.stderr);
      const k = await run(cli, ["sandbox", "run", ...D, "--", "sh", "-c", "kill -TERM $$"]);
      assert.equal(k.code, 143, k.stderr);
    });

    fullTest(`${name}: usage errors are 2, API errors and an absent daemon 1, the key never printed`, async () => {
      for (const args of [
        ["sandbox", "run", "--memory", "lots", "--", "true"],
        ["sandbox", "run"],
        ["sandbox", "exec", "not/an/id", "--", "true"],
        ["sandbox", "run", "--no-such-option", "--", "true"],
        ["sandbox", "frobnicate"],
      ]) {
        const r = await run(cli, args);
        assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
        assert.ok(r.stderr.length > 0);
      }
      const missing = await run(cli, ["sandbox", "get", "sbx_00000000000000000000"]);
      assert.equal(missing.code, 1);
      assert.match(missing.stderr, /sbx_00000000000000000000/);
      const key = "rt_" + "ab".repeat(20);
      const gone = await run(cli, ["sandbox", "ls"], { env: childEnv({ RUNTIME_BASE_URL: "http://127.0.0.1:9", RUNTIME_API_KEY: key }) });
      assert.equal(gone.code, 1);
      assert.match(gone.stderr, /127\.0\.0\.1:9/);
      assert.ok(!gone.stderr.includes(key));
      const bad = await run(cli, ["sandbox", "ls"], { env: childEnv({ RUNTIME_API_KEY: key }) });
      assert.equal(bad.code, 1);
      assert.ok(!bad.stderr.includes(key), bad.stderr);
    });

    daemonTest(`${name}: output is streamed; Ctrl-C ends the command, deletes the sandbox, exits 130`, async () => {
      const before = await sandboxIds();
      const p = start(cli, ["sandbox", "run", ...D, "--", "sh", "-c", "echo ready; sleep 600"]);
      await waitFor("the first line of output", () => p.stdoutSoFar().includes("ready\n"));
      p.child.kill("SIGINT");
      const r = await p.done;
      assert.equal(r.code, 130, r.stderr);
      await noNewSandboxes(before);
    });

    fullTest(`${name}: SIGTERM exits 143 and --keep keeps the sandbox`, async () => {
      const before = await sandboxIds();
      const p = start(cli, ["sandbox", "run", ...D, "--keep", "--", "sh", "-c", "echo ready; sleep 600"]);
      await waitFor("the first line of output", () => p.stdoutSoFar().includes("ready\n"));
      p.child.kill("SIGTERM");
      const r = await p.done;
      assert.equal(r.code, 143, r.stderr);
      const id = r.stderr.trim().split("\n").at(-1);
      assert.match(id, /^sbx_/);
      assert.ok(!before.has(id) && (await sandboxIds()).has(id));
      await (await Sandbox.connect(id)).delete();
    });

    fullTest(`${name}: a reader that goes away is exit 141, and the sandbox is deleted`, async () => {
      const before = await sandboxIds();
      const p = start(cli, ["sandbox", "run", ...D, "--", "sh", "-c", "while :; do echo y; done"]);
      await waitFor("output", () => p.stdoutSoFar().length > 1000);
      p.child.stdout.destroy();
      const r = await p.done;
      assert.equal(r.code, 141, r.stderr);
      await noNewSandboxes(before);
    });

    fullTest(`${name}: -i sends stdin; --json prints the events`, async () => {
      const r = await run(cli, ["sandbox", "run", ...D, "-i", "--", "wc", "-l"], { input: "a\nb\n" });
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.text.trim(), "2");
      const j = await run(cli, ["--json", "sandbox", "run", ...D, "--", "sh", "-c", "echo hi; exit 5"]);
      assert.equal(j.code, 5, j.stderr);
      const events = j.text.trim().split("\n").map((l) => JSON.parse(l));
      assert.deepEqual(events.map((e) => e.type), ["start", "stdout", "exit"]);
      assert.equal(events[1].data, "hi\n");
      assert.equal(events[2].exitCode, 5);
    });

    daemonTest(`${name}: --trial gets a key from the local daemon, keeps it, and reuses it`, async () => {
      const state = mkdtempSync(join(tmpdir(), "trial-"));
      try {
        const env = childEnv({ RUNTIME_STATE_DIR: state });
        delete env.RUNTIME_API_KEY;
        const r = await run(cli, ["sandbox", "run", "--trial", ...D, "--", "python3", "-c", "print(6 * 7)"], { env });
        assert.equal(r.code, 0, r.stderr);
        assert.equal(r.text, "42\n");
        assert.match(r.stderr, /trial key/);
        const kept = join(state, "trial.key");
        assert.ok(existsSync(kept));
        assert.equal(statSync(kept).mode & 0o777, 0o600);
        const again = await run(cli, ["sandbox", "run", "--trial", ...D, "--", "true"], { env });
        assert.equal(again.code, 0, again.stderr);
        assert.doesNotMatch(again.stderr, /got a trial key/);
        const both = await run(cli, ["--key", "rt_x", "sandbox", "run", "--trial", "--", "true"], { env });
        assert.equal(both.code, 2, both.stderr);
      } finally {
        rmSync(state, { recursive: true, force: true });
      }
    });

    fullTest(`${name}: create, exec, files put/get/ls, stop and rm`, async () => {
      const c = await run(cli, ["sandbox", "create", ...D, "--lease", "10m"]);
      assert.equal(c.code, 0, c.stderr);
      const id = c.text.trim();
      assert.match(id, /^sbx_/);
      const dir = mkdtempSync(join(tmpdir(), "files-"));
      try {
        const e = await run(cli, ["sandbox", "exec", "--env", "X=1", id, "--", "sh", "-c", "echo $X; exit 6"]);
        assert.deepEqual([e.code, e.text], [6, "1\n"]);
        const data = randomBytes(300_000);
        const put = await run(cli, ["files", "put", id, "-", "in/data.bin"], { input: data });
        assert.equal(put.code, 0, put.stderr);
        assert.match(put.text, /\/workspace\/in\/data\.bin: 300000 bytes/);
        const get = await run(cli, ["files", "get", id, "in/data.bin"]);
        assert.equal(get.code, 0, get.stderr);
        assert.ok(get.stdout.equals(data));
        const toDir = await run(cli, ["files", "get", id, "in/data.bin", dir]);
        assert.equal(toDir.code, 0, toDir.stderr);
        assert.equal(statSync(join(dir, "data.bin")).size, data.length);
        const ls = await run(cli, ["files", "ls", "--depth", "2", id]);
        assert.equal(ls.code, 0, ls.stderr);
        assert.match(ls.text, /\/workspace\/in\/data\.bin/);
        const nf = await run(cli, ["files", "get", id, "nope.txt", join(dir, "nope.txt")]);
        assert.equal(nf.code, 1);
        assert.ok(!existsSync(join(dir, "nope.txt")));
        const lsAll = await run(cli, ["sandbox", "ls"]);
        assert.match(lsAll.text, new RegExp(id));
        const stop = await run(cli, ["sandbox", "stop", id]);
        assert.deepEqual([stop.code, stop.text], [0, `${id}\n`]);
        const dead = await run(cli, ["sandbox", "exec", id, "--", "true"]);
        assert.equal(dead.code, 1);
      } finally {
        const rm = await run(cli, ["sandbox", "rm", id]);
        assert.deepEqual([rm.code, rm.text], [0, `${id}\n`]);
        rmSync(dir, { recursive: true, force: true });
      }
      const again = await run(cli, ["sandbox", "rm", id]);
      assert.equal(again.code, 1);
    });
  });
}

void SLOW;
