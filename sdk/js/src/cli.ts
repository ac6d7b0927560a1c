#!/usr/bin/env node
/**
 * `withruntime`: the command line of the npm package. The verbs a Node user needs, with the
 * exit codes, streaming, Ctrl-C handling and trial-key flow of the C CLI `runtime` (docs/cli.md).
 */
import { closeSync, createReadStream, createWriteStream, fsyncSync, mkdirSync, openSync, renameSync, statSync, unlinkSync, writeSync, constants as fsc } from "node:fs";
import { basename, dirname, join } from "node:path";
import { pipeline } from "node:stream/promises";

import { defaultStateDir, isValidKey, readKeyFile, resolveApiKey, resolveEndpoint, type Endpoint } from "./config.js";
import { APIError, ConfigurationError } from "./errors.js";
import { HttpClient } from "./http.js";
import { checkPath, checkSandboxId, parseExecEvent, sandboxPath } from "./models.js";
import { VERSION } from "./version.js";

const EXIT_OK = 0;
const EXIT_FAILURE = 1;
const EXIT_USAGE = 2;
const EXIT_TIMEOUT = 124;
const EXIT_BROKEN_PIPE = 141;
const SIGNAL_NUMBERS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGTERM: 15 };

const LEASE_MAX_S = 86400;
const EXEC_TIMEOUT_MAX_MS = 86_400_000;
const RUN_LEASE_MIN_S = 300;
const RUN_LEASE_SLACK_S = 60;
const STDIN_MAX = 16 * 1024 * 1024;
const DOLLARS_MAX_MICROS = 1_000_000_000n * 1_000_000n;

class UsageError extends Error {}
/** A failure already explained; carries the exit code. */
class Exit extends Error {
  constructor(readonly code: number) {
    super(`exit ${code}`);
  }
}

/* ---------------------------------------------------------------- output */

/** Text from the daemon goes to the terminal with control characters replaced. */
function clean(s: unknown): string {
  if (s === null || s === undefined || s === "") return "-";
  return String(s).replace(/[\x00-\x1f\x7f]/g, "?");
}

function fail(message: string, hint?: string | null): Exit {
  process.stderr.write(`withruntime: ${clean(message)}\n`);
  if (hint) process.stderr.write(`hint: ${clean(hint)}\n`);
  return new Exit(EXIT_FAILURE);
}

function apiFail(e: unknown): Exit {
  if (e instanceof Exit) return e;
  if (e instanceof APIError) return fail(e.message, e.hint);
  return fail(e instanceof Error ? e.message : String(e));
}

function printJson(v: unknown): void {
  process.stdout.write(JSON.stringify(v, null, 2) + "\n");
}

function relative(iso: unknown, now: number): string {
  if (typeof iso !== "string") return "-";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "-";
  let d = Math.round((t - now) / 1000);
  const future = d > 0;
  d = Math.abs(d);
  let s: string;
  if (d < 60) s = `${d}s`;
  else if (d < 3600) s = `${Math.floor(d / 60)}m`;
  else if (d < 86400) s = `${Math.floor(d / 3600)}h${Math.floor((d % 3600) / 60)}m`;
  else s = `${Math.floor(d / 86400)}d${Math.floor((d % 86400) / 3600)}h`;
  return future ? `in ${s}` : `${s} ago`;
}

function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!))).join("  ");
  return [line(headers), ...rows.map(line)].join("\n") + "\n";
}

/* ---------------------------------------------------------------- values */

function parseDuration(what: string, s: string, unitMs = false): number {
  const m = /^(\d{1,12})(ms|s|m|h|d)?$/.exec(s);
  if (!m) throw new UsageError(`${what}: '${s.slice(0, 40)}' is not a duration (e.g. 90, 1500ms, 30s, 5m, 2h, 1d)`);
  const mult: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
  const ms = Number(m[1]) * mult[m[2] ?? "s"]!;
  return unitMs ? ms : Math.ceil(ms / 1000);
}

function parseSize(what: string, s: string): number {
  const m = /^(\d{1,9})(M|MiB|G|GiB|T|TiB)?$/.exec(s);
  if (!m) throw new UsageError(`${what}: '${s.slice(0, 40)}' is not a size (e.g. 512, 512M, 2G)`);
  const mult: Record<string, number> = { M: 1, MiB: 1, G: 1024, GiB: 1024, T: 1024 * 1024, TiB: 1024 * 1024 };
  return Number(m[1]) * mult[m[2] ?? "M"]!;
}

function parseInt10(what: string, s: string, min: number, max: number): number {
  if (!/^\d{1,9}$/.test(s) || Number(s) < min || Number(s) > max) throw new UsageError(`${what}: '${s.slice(0, 40)}' is not a whole number from ${min} to ${max}`);
  return Number(s);
}

function parseDollars(what: string, s: string): number {
  const m = /^\$?(\d*)(?:\.(\d{0,6}))?$/.exec(s);
  if (!m || (!m[1] && !m[2])) throw new UsageError(`${what}: '${s.slice(0, 40)}' is not an amount of dollars (25, 0.5, $1.25)`);
  const micros = BigInt(m[1] || "0") * 1_000_000n + BigInt((m[2] ?? "").padEnd(6, "0") || "0");
  if (micros > DOLLARS_MAX_MICROS) throw new UsageError(`${what}: at most $1000000000`);
  return Number(micros);
}

function parseKV(what: string, s: string, env: boolean): [string, string] {
  const i = s.indexOf("=");
  if (i <= 0) throw new UsageError(`${what}: '${s.slice(0, 40)}' is not K=V`);
  const k = s.slice(0, i);
  if (env && !/^[A-Za-z_][A-Za-z0-9_]{0,254}$/.test(k)) throw new UsageError(`${what}: '${k.slice(0, 40)}' is not an environment variable name`);
  if (!env && (k.length > 63 || /[\x00-\x1f\x7f]/.test(k))) throw new UsageError(`${what}: a label key is 1 to 63 printable bytes`);
  return [k, s.slice(i + 1)];
}

function checkHost(what: string, s: string): string {
  if (!s || s.length > 253 || !/^(\*\.)?[A-Za-z0-9.-]+(:\d{1,5})?$/.test(s)) throw new UsageError(`${what}: '${s.slice(0, 80)}' is not a host name or *.suffix pattern`);
  return s;
}

function checkId(verb: string, id: string | undefined): string {
  if (!id) throw new UsageError(`a sandbox id is required`);
  try {
    return checkSandboxId(id);
  } catch {
    throw new UsageError(`'${clean(id.slice(0, 80))}' is not a sandbox id`);
  }
}

/* ---------------------------------------------------------------- arguments */

interface Globals {
  url?: string;
  key?: string;
  json: boolean;
}

type Verb = "run" | "create" | "exec";

interface SandboxArgs {
  help: boolean;
  json: boolean;
  timeoutMs: number;
  leaseS: number;
  cwd?: string;
  interactive: boolean;
  keep: boolean;
  trial: boolean;
  vcpu?: number;
  memoryMiB?: number;
  diskMiB?: number;
  driver?: string;
  image?: string;
  name?: string;
  onLeaseEnd?: string;
  maxCostMicros?: number;
  env?: Record<string, string>;
  labels?: Record<string, string>;
  internet: number; // -1 unsaid, 0 no, 1 yes
  allow?: string[];
  deny?: string[];
  id?: string;
  command: string[];
}

const USAGE: Record<string, string> = {
  "sandbox run": "withruntime sandbox run [OPTIONS] [--] CMD [ARG...]",
  "sandbox create": "withruntime sandbox create [OPTIONS]",
  "sandbox exec": "withruntime sandbox exec [OPTIONS] ID [--] CMD [ARG...]",
  "sandbox ls": "withruntime sandbox ls",
  "sandbox get": "withruntime sandbox get ID",
  "sandbox stop": "withruntime sandbox stop ID",
  "sandbox rm": "withruntime sandbox rm ID...",
  "sandbox extend": "withruntime sandbox extend ID DURATION",
  "files get": "withruntime files get ID PATH [LOCAL]",
  "files put": "withruntime files put [--mode MODE] ID LOCAL PATH",
  "files ls": "withruntime files ls [--depth N] ID [PATH]",
};

const SANDBOX_OPTIONS_HELP = `Options:
  --timeout DURATION   kill the command after this long; exit code 124
  --lease DURATION     the sandbox's lease
  --cwd DIR            the command's working directory (default /workspace)
  -i, --interactive    send stdin to the command (at most 16 MiB)
  --keep               do not delete the sandbox (run); print its id on stderr
  --vcpu N, --memory SIZE, --disk SIZE, --driver NAME, --image NAME
  -e, --env K=V        an environment variable (repeatable)
  --name NAME, --label K=V
  --internet, --no-internet, --allow HOST, --deny HOST
  --on-lease-end stop|delete (create), --max-cost DOLLARS
  --trial              use a trial key from the local daemon (kept in <state dir>/trial.key)
  --json               print the API's NDJSON events / JSON objects
`;

const HELP = `usage: withruntime [--url URL] [--key KEY] [--json] COMMAND ...

Commands:
${Object.values(USAGE).map((u) => "  " + u.slice("withruntime ".length)).join("\n")}

The daemon: --url, else RUNTIME_BASE_URL (or RUNTIME_API_URL), else http://127.0.0.1:7878.
The key: --key, else RUNTIME_API_KEY, else <state dir>/admin.key.
Exit codes: 0 ok, 1 error, 2 usage, 124 timeout, 130 Ctrl-C, 141 broken pipe, else the command's own.
`;

function parseSandboxArgs(verb: Verb, argv: string[]): SandboxArgs {
  const a: SandboxArgs = { help: false, json: false, timeoutMs: -1, leaseS: -1, interactive: false, keep: false, trial: false, internet: -1, command: [] };
  const allowed: Record<Verb, Set<string>> = {
    run: new Set(["timeout", "lease", "cwd", "interactive", "keep", "vcpu", "memory", "disk", "driver", "image", "env", "name", "label", "internet", "no-internet", "allow", "deny", "max-cost", "trial"]),
    create: new Set(["timeout", "lease", "vcpu", "memory", "disk", "driver", "image", "env", "name", "label", "internet", "no-internet", "allow", "deny", "max-cost", "trial", "on-lease-end"]),
    exec: new Set(["timeout", "cwd", "interactive", "env"]),
  };
  const withValue = new Set(["timeout", "lease", "cwd", "vcpu", "memory", "disk", "driver", "image", "env", "name", "label", "allow", "deny", "max-cost", "on-lease-end"]);
  let i = 0;
  for (; i < argv.length; i++) {
    let arg = argv[i]!;
    if (arg === "--") {
      i++;
      break;
    }
    if (!arg.startsWith("-") || arg === "-") break;
    let value: string | undefined;
    let name: string;
    if (arg.startsWith("--")) {
      const eq = arg.indexOf("=");
      if (eq > 0) {
        value = arg.slice(eq + 1);
        arg = arg.slice(0, eq);
      }
      name = arg.slice(2);
    } else {
      const short: Record<string, string> = { "-i": "interactive", "-e": "env", "-h": "help" };
      if (!short[arg]) throw new UsageError(`unknown option '${arg.slice(0, 40)}'`);
      name = short[arg]!;
    }
    if (name === "help") {
      a.help = true;
      continue;
    }
    if (name === "json") {
      a.json = true;
      continue;
    }
    if (!withValue.has(name) && !allowed.run.has(name) && !allowed.create.has(name)) throw new UsageError(`unknown option '${arg.slice(0, 40)}'`);
    if (!allowed[verb].has(name)) throw new UsageError(`--${name} is not an option of sandbox ${verb}`);
    if (withValue.has(name) && value === undefined) {
      if (i + 1 >= argv.length) throw new UsageError(`${arg} needs a value`);
      value = argv[++i]!;
    }
    const what = `--${name}`;
    const v = value ?? "";
    switch (name) {
      case "timeout":
        if (verb === "create") a.leaseS = parseDuration(what, v);
        else a.timeoutMs = parseDuration(what, v, true);
        if (a.timeoutMs === 0 || a.timeoutMs > EXEC_TIMEOUT_MAX_MS || a.leaseS === 0 || a.leaseS > LEASE_MAX_S) throw new UsageError(`${what}: from 1 ms to 24 h`);
        break;
      case "lease":
        a.leaseS = parseDuration(what, v);
        if (a.leaseS < 1 || a.leaseS > LEASE_MAX_S) throw new UsageError(`${what}: from 1 s to 24 h`);
        break;
      case "cwd":
        a.cwd = v;
        break;
      case "interactive":
        a.interactive = true;
        break;
      case "keep":
        a.keep = true;
        break;
      case "trial":
        a.trial = true;
        break;
      case "vcpu":
        a.vcpu = parseInt10(what, v, 1, 64);
        break;
      case "memory":
        a.memoryMiB = parseSize(what, v);
        break;
      case "disk":
        a.diskMiB = parseSize(what, v);
        break;
      case "driver":
        if (!/^[a-z][a-z0-9_-]{0,31}$/.test(v)) throw new UsageError(`${what}: '${v.slice(0, 40)}' is not a driver name`);
        a.driver = v;
        break;
      case "image":
        if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(v)) throw new UsageError(`${what}: '${v.slice(0, 80)}' is not an image name`);
        a.image = v;
        break;
      case "name":
        if (!v || Buffer.byteLength(v) > 64 || /[\x00-\x1f\x7f]/.test(v)) throw new UsageError(`${what}: 1 to 64 printable bytes`);
        a.name = v;
        break;
      case "env": {
        const [k, val] = parseKV(what, v, true);
        (a.env ??= {})[k] = val;
        break;
      }
      case "label": {
        const [k, val] = parseKV(what, v, false);
        (a.labels ??= {})[k] = val;
        break;
      }
      case "internet":
        if (a.internet === 0) throw new UsageError("--internet and --no-internet contradict each other");
        a.internet = 1;
        break;
      case "no-internet":
        if (a.internet === 1) throw new UsageError("--internet and --no-internet contradict each other");
        a.internet = 0;
        break;
      case "allow":
        (a.allow ??= []).push(checkHost(what, v));
        break;
      case "deny":
        (a.deny ??= []).push(checkHost(what, v));
        break;
      case "max-cost":
        a.maxCostMicros = parseDollars(what, v);
        break;
      case "on-lease-end":
        if (v !== "stop" && v !== "delete") throw new UsageError(`${what}: '${v.slice(0, 32)}' is neither stop nor delete`);
        a.onLeaseEnd = v;
        break;
    }
  }
  if (a.internet === 0 && a.allow) throw new UsageError("--no-internet and --allow contradict each other");
  const pos = argv.slice(i);
  if (a.help) return a;
  if (verb === "create") {
    if (pos.length) throw new UsageError(`unexpected argument '${clean(pos[0]!.slice(0, 80))}'`);
  } else {
    if (verb === "exec") {
      if (pos.length < 1) throw new UsageError("a sandbox id and a command are required");
      a.id = checkId("sandbox exec", pos.shift());
      if (pos[0] === "--") pos.shift();
    }
    if (pos.length === 0) throw new UsageError("a command is required");
    if (pos[0] === "") throw new UsageError("the command is an empty string");
    a.command = pos;
  }
  return a;
}

function runLease(a: SandboxArgs): number {
  if (a.leaseS > 0) return a.leaseS;
  if (a.timeoutMs < 0) return RUN_LEASE_MIN_S;
  return Math.min(LEASE_MAX_S, Math.max(RUN_LEASE_MIN_S, Math.ceil(a.timeoutMs / 1000) + RUN_LEASE_SLACK_S));
}

function createBody(a: SandboxArgs, verb: Verb): Record<string, unknown> {
  const b: Record<string, unknown> = {};
  if (verb === "run") {
    b.timeoutSeconds = runLease(a);
    // If this program dies, the sandbox goes at lease end instead of lingering stopped.
    b.onLeaseEnd = a.keep ? "stop" : "delete";
  } else {
    if (a.leaseS > 0) b.timeoutSeconds = a.leaseS;
    if (a.onLeaseEnd) b.onLeaseEnd = a.onLeaseEnd;
  }
  if (a.vcpu !== undefined) b.vcpu = a.vcpu;
  if (a.memoryMiB !== undefined) b.memoryMiB = a.memoryMiB;
  if (a.diskMiB !== undefined) b.diskMiB = a.diskMiB;
  if (a.driver) b.driver = a.driver;
  if (a.image) b.image = a.image;
  if (a.name) b.name = a.name;
  if (a.maxCostMicros !== undefined) b.maxCostMicros = a.maxCostMicros;
  if (a.env) b.env = a.env;
  if (a.labels) b.labels = a.labels;
  if (a.allow || a.deny || a.internet >= 0) {
    const net: Record<string, unknown> = { internet: a.internet !== 0 && (!!a.allow || a.internet > 0) };
    if (a.allow) net.allow = a.allow;
    if (a.deny) net.deny = a.deny;
    b.network = net;
  }
  return b;
}

function execBody(a: SandboxArgs, verb: Verb): Record<string, unknown> {
  const b: Record<string, unknown> = {
    argv: a.command,
    stream: true,
    timeoutMs: a.timeoutMs > 0 ? a.timeoutMs : EXEC_TIMEOUT_MAX_MS,
  };
  if (a.cwd !== undefined) b.cwd = a.cwd;
  // run puts --env on the sandbox; exec on the command.
  if (verb === "exec" && a.env) b.env = a.env;
  return b;
}

/* ---------------------------------------------------------------- signals */

/** Ctrl-C, SIGTERM and SIGHUP: the first one asks the running step to end, a second one gives up. */
class Signals {
  signal: string | null = null;
  again = false;
  #controller = new AbortController();
  #urgent = new AbortController();
  /** Aborted at the first signal: a command's stream. */
  get first(): AbortSignal {
    return this.#controller.signal;
  }
  /** Aborted at the second signal: steps that must not be cut short by one Ctrl-C (create, delete). */
  get second(): AbortSignal {
    return this.#urgent.signal;
  }
  #handler = (sig: NodeJS.Signals) => {
    if (this.signal === null) {
      this.signal = sig;
      this.#controller.abort();
    } else {
      this.again = true;
      this.#urgent.abort();
    }
  };
  install(): void {
    for (const s of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(s, this.#handler);
  }
  uninstall(): void {
    for (const s of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.off(s, this.#handler);
  }
  exitCode(): number {
    return 128 + (SIGNAL_NUMBERS[this.signal ?? "SIGINT"] ?? 2);
  }
}

/* ---------------------------------------------------------------- connection */

interface Ctx extends Globals {
  endpoint?: Endpoint;
}

function endpointOf(ctx: Ctx): Endpoint {
  try {
    return (ctx.endpoint ??= resolveEndpoint(ctx.url));
  } catch (e) {
    throw apiFail(e);
  }
}

function connect(ctx: Ctx): HttpClient {
  const endpoint = endpointOf(ctx);
  let key: string;
  try {
    key = resolveApiKey(ctx.key);
  } catch (e) {
    throw apiFail(e);
  }
  return new HttpClient(endpoint, key);
}

/** --trial: reuse <state dir>/trial.key, or ask the local daemon for one (POST /v1/trial, no key) and keep it. */
async function useTrialKey(ctx: Ctx): Promise<void> {
  if (ctx.key) {
    process.stderr.write("withruntime: --trial and --key do not go together\n");
    throw new Exit(EXIT_USAGE);
  }
  const dir = defaultStateDir();
  const path = join(dir, "trial.key");
  let kept: string | null;
  try {
    kept = readKeyFile(path);
  } catch {
    throw fail(`${path} does not hold a valid key; remove it to get a new trial key`);
  }
  if (kept) {
    ctx.key = kept;
    return;
  }
  const http = new HttpClient(endpointOf(ctx), "");
  let ans: Record<string, unknown>;
  try {
    ans = (await http.request<Record<string, unknown>>("POST", "/v1/trial", { anonymous: true })) ?? {};
  } catch (e) {
    throw apiFail(e);
  } finally {
    http.close();
  }
  const key = ans.key;
  if (typeof key !== "string" || !isValidKey(key)) throw fail("the daemon answered no trial key");
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const fd = openSync(path, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
    try {
      writeSync(fd, key + "\n");
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    const allowance = ans.trialAllowance as { sandboxSeconds?: number } | undefined;
    const hours = Math.floor((allowance?.sandboxSeconds ?? 0) / 3600);
    process.stderr.write(`withruntime: got a trial key (${hours} free sandbox-hours), kept in ${path}\n`);
  } catch (e) {
    process.stderr.write(`withruntime: warning: could not keep the trial key in ${path}: ${(e as NodeJS.ErrnoException).code ?? e}\n`);
  }
  ctx.key = key;
}

/* ---------------------------------------------------------------- run and exec */

/** Reads stdin whole for -i; a signal ends the wait (a typist may never send EOF). */
async function readStdinOrSignal(sig: Signals): Promise<Buffer | null> {
  if (sig.first.aborted) return null;
  let onAbort = () => {};
  const aborted = new Promise<null>((resolve) => {
    onAbort = () => resolve(null);
    sig.first.addEventListener("abort", onAbort, { once: true });
  });
  try {
    return await Promise.race([readStdin(), aborted]);
  } finally {
    sig.first.removeEventListener("abort", onAbort);
  }
}

async function readStdin(): Promise<Buffer> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const chunk of process.stdin as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > STDIN_MAX) throw fail("stdin is larger than 16 MiB; copy big inputs in with 'withruntime files put'");
    parts.push(chunk);
  }
  return Buffer.concat(parts);
}

class BrokenPipe extends Error {}

/** Writes to stdout or stderr; waits while the pipe is full, and gives up when its reader went away. */
function writeOut(stream: NodeJS.WriteStream, data: string): Promise<void> | null {
  if (brokenPipe) throw new BrokenPipe();
  if (stream.write(data)) return null;
  return new Promise((resolve, reject) => {
    const gone = () => {
      stream.off("drain", drained);
      reject(new BrokenPipe());
    };
    const drained = () => {
      pipeAbort.signal.removeEventListener("abort", gone);
      resolve();
    };
    stream.once("drain", drained);
    pipeAbort.signal.addEventListener("abort", gone, { once: true });
  });
}

let brokenPipe = false;
const pipeAbort = new AbortController();
for (const s of [process.stdout, process.stderr]) {
  s.on("error", (e: NodeJS.ErrnoException) => {
    if (e.code === "EPIPE") {
      brokenPipe = true;
      pipeAbort.abort();
    }
  });
}

/** Streams an exec; returns the exit code to leave with. */
async function streamExec(http: HttpClient, id: string, body: Record<string, unknown>, json: boolean, sig: Signals): Promise<number> {
  const signal = AbortSignal.any([sig.first, pipeAbort.signal]);
  let exit: { exitCode: number; timedOut: boolean } | null = null;
  try {
    for await (const line of http.lines("POST", sandboxPath(id, ":exec"), { json: body, timeoutSeconds: Number(body.timeoutMs) / 1000 + 30, signal })) {
      if (json) await writeOut(process.stdout, line + "\n");
      const ev = parseExecEvent(line);
      if (ev === null) continue;
      if (ev.type === "stdout" || ev.type === "stderr") {
        if (!json) await writeOut(ev.type === "stdout" ? process.stdout : process.stderr, ev.data);
      } else if (ev.type === "exit") {
        exit = ev;
        break;
      }
    }
  } catch (e) {
    if (sig.signal) return sig.exitCode();
    if (brokenPipe || e instanceof BrokenPipe) return EXIT_BROKEN_PIPE;
    throw apiFail(e);
  }
  if (sig.signal) return sig.exitCode();
  if (brokenPipe) return EXIT_BROKEN_PIPE;
  if (!exit) throw fail("the output of the command ended before it exited");
  if (exit.timedOut) return EXIT_TIMEOUT;
  if (exit.exitCode < 0 || exit.exitCode > 255) return 255;
  return exit.exitCode;
}

/** Renews a `run` sandbox's lease while its command runs (no --timeout, no --lease). */
function keepLease(ctx: Ctx, id: string, leaseS: number): () => void {
  const http = connect(ctx);
  let ends = Date.now() + leaseS * 1000;
  let warned = false;
  let busy = false;
  const timer = setInterval(async () => {
    const remaining = Math.max(0, Math.floor((ends - Date.now()) / 1000));
    if (busy || remaining > leaseS / 2) return;
    busy = true;
    const add = leaseS - remaining;
    try {
      await http.request("POST", sandboxPath(id, ":extend"), { json: { seconds: add } });
      ends = Math.max(ends, Date.now()) + add * 1000;
    } catch (e) {
      if (!warned) {
        warned = true;
        process.stderr.write(`withruntime: cannot renew the lease of ${id}: ${clean(e instanceof Error ? e.message : e)}\n`);
      }
    } finally {
      busy = false;
    }
  }, Math.max(1, Math.floor(leaseS / 4)) * 1000);
  return () => {
    clearInterval(timer);
    http.close();
  };
}

async function cmdRun(ctx: Ctx, argv: string[]): Promise<number> {
  const a = parseSandboxArgs("run", argv);
  if (a.help) return help("sandbox run", "Creates a sandbox, runs CMD in it (argv, no shell) with its output streamed, deletes it,\nand exits with the command's exit code.\n\n" + SANDBOX_OPTIONS_HELP);
  const json = ctx.json || a.json;
  const create = createBody(a, "run");
  const exec = execBody(a, "run");
  if (a.trial) await useTrialKey(ctx);
  const http = connect(ctx);
  const sig = new Signals();
  sig.install();
  try {
    // Stdin first: a sandbox should not wait on a typist.
    if (a.interactive) {
      const data = await readStdinOrSignal(sig);
      if (data) exec.stdinBase64 = data.toString("base64");
    }
    if (sig.signal) return sig.exitCode();
    // A create cut short may still make a sandbox whose id we would never learn; only a second
    // Ctrl-C abandons it.
    let sbx: Record<string, unknown>;
    try {
      sbx = (await http.request<Record<string, unknown>>("POST", "/v1/sandboxes", { json: create, timeoutSeconds: 180, signal: sig.second })) ?? {};
    } catch (e) {
      if (sig.again) return sig.exitCode();
      throw apiFail(e);
    }
    const id = typeof sbx.id === "string" ? sbx.id : "";
    try {
      checkSandboxId(id);
    } catch {
      throw fail("runtimed answered a sandbox without a valid id");
    }
    let code: number;
    let stopKeeper = () => {};
    try {
      if (sig.signal) code = sig.exitCode();
      else {
        if (a.timeoutMs < 0 && a.leaseS < 0) stopKeeper = keepLease(ctx, id, runLease(a));
        code = await streamExec(http, id, exec, json, sig);
      }
    } catch (e) {
      code = e instanceof Exit ? e.code : apiFail(e).code;
    } finally {
      stopKeeper();
    }
    if (a.keep) process.stderr.write(`${id}\n`);
    else {
      try {
        await http.request("DELETE", sandboxPath(id), { signal: sig.second });
      } catch (e) {
        if (!(e instanceof APIError && e.status === 404) && !sig.again) {
          process.stderr.write(`withruntime: could not delete sandbox ${id}: ${clean(e instanceof Error ? e.message : e)}\n`);
          if (e instanceof APIError && e.hint) process.stderr.write(`hint: ${clean(e.hint)}\n`);
        }
      }
    }
    return code;
  } finally {
    sig.uninstall();
    http.close();
  }
}

async function cmdExec(ctx: Ctx, argv: string[]): Promise<number> {
  const a = parseSandboxArgs("exec", argv);
  if (a.help) return help("sandbox exec", "Runs a command in a running sandbox, streamed, with its exit code passed on.\n\n" + SANDBOX_OPTIONS_HELP);
  const exec = execBody(a, "exec");
  const http = connect(ctx);
  const sig = new Signals();
  sig.install();
  try {
    if (a.interactive) {
      const data = await readStdinOrSignal(sig);
      if (data) exec.stdinBase64 = data.toString("base64");
    }
    if (sig.signal) return sig.exitCode();
    // Leaving the stream makes the daemon kill the command's process group.
    return await streamExec(http, a.id!, exec, ctx.json || a.json, sig);
  } finally {
    sig.uninstall();
    http.close();
  }
}

async function cmdCreate(ctx: Ctx, argv: string[]): Promise<number> {
  const a = parseSandboxArgs("create", argv);
  if (a.help) return help("sandbox create", "Creates and starts a sandbox and prints its id.\n\n" + SANDBOX_OPTIONS_HELP);
  const body = createBody(a, "create");
  if (a.trial) await useTrialKey(ctx);
  const http = connect(ctx);
  try {
    const sbx = await http.request<Record<string, unknown>>("POST", "/v1/sandboxes", { json: body, timeoutSeconds: 180 });
    if (ctx.json || a.json) printJson(sbx);
    else process.stdout.write(`${clean(sbx?.id)}\n`);
    return EXIT_OK;
  } catch (e) {
    throw apiFail(e);
  } finally {
    http.close();
  }
}

/* ---------------------------------------------------------------- simple verbs */

function simpleArgs(verb: string, argv: string[], min: number, max: number, valued: string[] = []): { pos: string[]; opts: Record<string, string>; json: boolean; help: boolean } {
  const pos: string[] = [];
  const opts: Record<string, string> = {};
  let json = false;
  let helpWanted = false;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--") {
      pos.push(...argv.slice(i + 1));
      break;
    }
    if (arg === "--json") json = true;
    else if (arg === "--help" || arg === "-h") helpWanted = true;
    else if (arg.startsWith("--") && valued.includes(arg.split("=")[0]!.slice(2))) {
      const eq = arg.indexOf("=");
      if (eq > 0) opts[arg.slice(2, eq)] = arg.slice(eq + 1);
      else {
        if (i + 1 >= argv.length) throw new UsageError(`${arg} needs a value`);
        opts[arg.slice(2)] = argv[++i]!;
      }
    } else if (arg.startsWith("-") && arg !== "-") throw new UsageError(`unknown option '${arg.slice(0, 40)}'`);
    else pos.push(arg);
  }
  if (!helpWanted && (pos.length < min || pos.length > max)) {
    throw new UsageError(pos.length < min ? "missing argument" : `unexpected argument '${clean(pos[max]!.slice(0, 80))}'`);
  }
  return { pos, opts, json, help: helpWanted };
}

function help(verb: string, text: string): number {
  process.stdout.write(`usage: ${USAGE[verb]}\n\n${text}`);
  return EXIT_OK;
}

async function withClient<T>(ctx: Ctx, f: (http: HttpClient) => Promise<T>): Promise<T> {
  const http = connect(ctx);
  try {
    return await f(http);
  } catch (e) {
    throw apiFail(e);
  } finally {
    http.close();
  }
}

async function cmdLs(ctx: Ctx, argv: string[]): Promise<number> {
  const s = simpleArgs("sandbox ls", argv, 0, 0);
  if (s.help) return help("sandbox ls", "Lists your sandboxes, oldest first.\n");
  const ans = await withClient(ctx, (h) => h.request<{ sandboxes?: Record<string, unknown>[] }>("GET", "/v1/sandboxes"));
  if (ctx.json || s.json) {
    printJson(ans);
    return EXIT_OK;
  }
  const now = Date.now();
  const rows = (ans?.sandboxes ?? []).map((x) => [
    clean(x.id),
    clean(x.name),
    clean(x.state),
    clean(x.driver),
    relative(x.createdAt, now),
    x.state === "running" ? relative(x.leaseEndsAt, now) : "-",
  ]);
  process.stdout.write(table(["ID", "NAME", "STATE", "DRIVER", "CREATED", "LEASE ENDS"], rows));
  return EXIT_OK;
}

async function cmdGet(ctx: Ctx, argv: string[]): Promise<number> {
  const s = simpleArgs("sandbox get", argv, 1, 1);
  if (s.help) return help("sandbox get", "Shows one sandbox.\n");
  const id = checkId("sandbox get", s.pos[0]);
  const x = await withClient(ctx, (h) => h.request<Record<string, unknown>>("GET", sandboxPath(id)));
  if (ctx.json || s.json) printJson(x);
  else {
    const now = Date.now();
    const net = (x.network ?? {}) as Record<string, unknown>;
    const lines: [string, string][] = [
      ["id", clean(x.id)], ["name", clean(x.name)], ["state", clean(x.state)], ["driver", clean(x.driver)],
      ["image", clean(x.image)], ["vcpu", clean(x.vcpu)], ["memory", `${clean(x.memoryMiB)} MiB`],
      ["disk", `${clean(x.diskMiB)} MiB`], ["internet", net.internet ? "yes" : "no"],
      ["lease", `${clean(x.timeoutSeconds)} s`], ["on lease end", clean(x.onLeaseEnd)],
      ["created", `${clean(x.createdAt)} (${relative(x.createdAt, now)})`],
      ["lease ends", `${clean(x.leaseEndsAt)} (${relative(x.leaseEndsAt, now)})`],
    ];
    if (x.failureReason) lines.push(["failure reason", clean(x.failureReason)]);
    process.stdout.write(lines.map(([k, v]) => `${k}: ${v}\n`).join(""));
  }
  return EXIT_OK;
}

async function cmdStop(ctx: Ctx, argv: string[]): Promise<number> {
  const s = simpleArgs("sandbox stop", argv, 1, 1);
  if (s.help) return help("sandbox stop", "Stops a sandbox: every process ends, the files stay until 'sandbox rm'.\n");
  const id = checkId("sandbox stop", s.pos[0]);
  const x = await withClient(ctx, (h) => h.request("POST", sandboxPath(id, ":stop")));
  if (ctx.json || s.json) printJson(x);
  else process.stdout.write(`${id}\n`);
  return EXIT_OK;
}

async function cmdRm(ctx: Ctx, argv: string[]): Promise<number> {
  const s = simpleArgs("sandbox rm", argv, 1, 1000);
  if (s.help) return help("sandbox rm", "Deletes sandboxes.\n");
  const ids = s.pos.map((p) => checkId("sandbox rm", p));
  const http = connect(ctx);
  let rc = EXIT_OK;
  try {
    for (const id of ids) {
      try {
        await http.request("DELETE", sandboxPath(id));
        process.stdout.write(`${id}\n`);
      } catch (e) {
        apiFail(e);
        rc = EXIT_FAILURE;
      }
    }
  } finally {
    http.close();
  }
  return rc;
}

async function cmdExtend(ctx: Ctx, argv: string[]): Promise<number> {
  const s = simpleArgs("sandbox extend", argv, 2, 2);
  if (s.help) return help("sandbox extend", "Renews a sandbox's lease: it ends DURATION after the later of now and its old end.\n");
  const id = checkId("sandbox extend", s.pos[0]);
  const seconds = parseDuration("DURATION", s.pos[1]!);
  if (seconds < 1 || seconds > LEASE_MAX_S) throw new UsageError("DURATION: from 1 s to 24 h");
  const x = await withClient(ctx, (h) => h.request<Record<string, unknown>>("POST", sandboxPath(id, ":extend"), { json: { seconds } }));
  if (ctx.json || s.json) printJson(x);
  else process.stdout.write(`${id}: lease ends ${clean(x.leaseEndsAt)} (${relative(x.leaseEndsAt, Date.now())})\n`);
  return EXIT_OK;
}

function sandboxFilePath(p: string): string {
  try {
    return checkPath(p);
  } catch (e) {
    throw new UsageError(`PATH: ${(e as Error).message}`);
  }
}

async function cmdFilesGet(ctx: Ctx, argv: string[]): Promise<number> {
  const s = simpleArgs("files get", argv, 2, 3);
  if (s.help) return help("files get", "Copies a file out of a sandbox to LOCAL, or to stdout when LOCAL is missing or '-'.\n");
  const id = checkId("files get", s.pos[0]);
  const path = sandboxFilePath(s.pos[1]!);
  let local = s.pos[2] ?? "-";
  if (local !== "-") {
    try {
      if (statSync(local).isDirectory()) local = join(local, basename(path));
    } catch {
      /* a new file */
    }
  }
  const http = connect(ctx);
  const sig = new Signals();
  sig.install();
  let tmp: string | null = null;
  try {
    const { res, done } = await http.open("GET", sandboxPath(id, "/files/content"), { query: { path }, timeoutSeconds: 3600, signal: sig.first }).catch((e) => {
      throw sig.signal ? new Exit(sig.exitCode()) : apiFail(e);
    });
    try {
      if ((res.statusCode ?? 0) >= 300) {
        const chunks: Buffer[] = [];
        for await (const c of res as AsyncIterable<Buffer>) chunks.push(c);
        const { errorFromResponse } = await import("./errors.js");
        const text = Buffer.concat(chunks).subarray(0, 65536).toString("utf8");
        let body: unknown = null;
        try {
          body = JSON.parse(text);
        } catch {
          body = null;
        }
        throw apiFail(errorFromResponse(res.statusCode ?? 0, body, null, text));
      }
      if (local === "-") {
        await pipeline(res, process.stdout, { end: false });
      } else {
        // Written under a temporary name and renamed when complete: a failed copy leaves nothing half-written.
        tmp = join(dirname(local), `.${basename(local)}.withruntime-${process.pid}`);
        await pipeline(res, createWriteStream(tmp, { flags: "wx", mode: 0o644 }));
        if (!res.complete) throw fail("the copy was cut short");
        renameSync(tmp, local);
        tmp = null;
      }
    } finally {
      done();
    }
    return EXIT_OK;
  } catch (e) {
    if (sig.signal) return sig.exitCode();
    if (brokenPipe) return EXIT_BROKEN_PIPE;
    throw e instanceof Exit ? e : fail(`cannot write ${local}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  } finally {
    if (tmp) {
      try {
        unlinkSync(tmp);
      } catch {
        /* never made */
      }
    }
    sig.uninstall();
    http.close();
  }
}

async function cmdFilesPut(ctx: Ctx, argv: string[]): Promise<number> {
  const s = simpleArgs("files put", argv, 3, 3, ["mode"]);
  if (s.help) return help("files put", "Copies LOCAL ('-' for stdin) into a sandbox at PATH, atomically, making parent directories.\n");
  const id = checkId("files put", s.pos[0]);
  const local = s.pos[1]!;
  const path = sandboxFilePath(s.pos[2]!);
  const query: Record<string, string> = { path };
  if (s.opts.mode !== undefined) {
    if (!/^[0-7]{1,4}$/.test(s.opts.mode)) throw new UsageError(`--mode: '${s.opts.mode.slice(0, 20)}' is not octal permission bits (e.g. 755)`);
    query.mode = s.opts.mode;
  }
  let body: NodeJS.ReadableStream;
  if (local === "-") body = process.stdin;
  else {
    try {
      const st = statSync(local);
      if (!st.isFile()) throw fail(`${local} is not a regular file`);
    } catch (e) {
      if (e instanceof Exit) throw e;
      throw fail(`cannot read ${local}: ${(e as NodeJS.ErrnoException).code}`);
    }
    body = createReadStream(local);
  }
  const ans = await withClient(ctx, (h) =>
    h.request<Record<string, unknown>>("PUT", sandboxPath(id, "/files/content"), { query, body: body as AsyncIterable<Uint8Array>, timeoutSeconds: 3600 }),
  );
  if (ctx.json || s.json) printJson(ans);
  else process.stdout.write(`${clean(ans?.path ?? path)}: ${clean(ans?.size)} bytes\n`);
  return EXIT_OK;
}

async function cmdFilesLs(ctx: Ctx, argv: string[]): Promise<number> {
  const s = simpleArgs("files ls", argv, 1, 2, ["depth"]);
  if (s.help) return help("files ls", "Lists a directory in a sandbox (default /workspace).\n");
  const id = checkId("files ls", s.pos[0]);
  const path = sandboxFilePath(s.pos[1] ?? "/workspace");
  const depth = s.opts.depth === undefined ? 1 : parseInt10("--depth", s.opts.depth, 1, 10);
  const ans = await withClient(ctx, (h) => h.request<{ data?: Record<string, unknown>[]; entries?: Record<string, unknown>[] }>("GET", sandboxPath(id, "/files/list"), { query: { path, depth } }));
  if (ctx.json || s.json) printJson(ans);
  else {
    const rows = (ans?.data ?? ans?.entries ?? []).map((e) => [
      clean(e.type),
      typeof e.mode === "number" ? e.mode.toString(8).padStart(4, "0") : typeof e.mode === "string" ? clean(e.mode) : "-",
      clean(e.size),
      clean(e.mtime),
      clean(e.path),
    ]);
    process.stdout.write(table(["TYPE", "MODE", "SIZE", "MODIFIED", "PATH"], rows));
  }
  return EXIT_OK;
}

/* ---------------------------------------------------------------- main */

const COMMANDS: Record<string, (ctx: Ctx, argv: string[]) => Promise<number>> = {
  "sandbox run": cmdRun,
  "sandbox create": cmdCreate,
  "sandbox exec": cmdExec,
  "sandbox ls": cmdLs,
  "sandbox get": cmdGet,
  "sandbox stop": cmdStop,
  "sandbox rm": cmdRm,
  "sandbox extend": cmdExtend,
  "files get": cmdFilesGet,
  "files put": cmdFilesPut,
  "files ls": cmdFilesLs,
};

async function main(argv: string[]): Promise<number> {
  const ctx: Ctx = { json: false };
  let i = 0;
  for (; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--json") ctx.json = true;
    else if (arg === "--version") {
      process.stdout.write(`withruntime ${VERSION}\n`);
      return EXIT_OK;
    } else if (arg === "--help" || arg === "-h") {
      process.stdout.write(HELP);
      return EXIT_OK;
    } else if (arg === "--url" || arg === "--key") {
      if (i + 1 >= argv.length) {
        process.stderr.write(`withruntime: ${arg} needs a value\n`);
        return EXIT_USAGE;
      }
      ctx[arg === "--url" ? "url" : "key"] = argv[++i]!;
    } else if (arg.startsWith("--url=")) ctx.url = arg.slice(6);
    else if (arg.startsWith("--key=")) ctx.key = arg.slice(6);
    else if (arg.startsWith("-")) {
      process.stderr.write(`withruntime: unknown option '${clean(arg.slice(0, 40))}'\n${HELP}`);
      return EXIT_USAGE;
    } else break;
  }
  const group = argv[i];
  const verb = argv[i + 1];
  const name = `${group ?? ""} ${verb ?? ""}`;
  const cmd = COMMANDS[name];
  if (!cmd) {
    process.stderr.write(group ? `withruntime: unknown command '${clean(name.trim().slice(0, 60))}'\n` : "withruntime: a command is required\n");
    process.stderr.write(HELP);
    return EXIT_USAGE;
  }
  try {
    return await cmd(ctx, argv.slice(i + 2));
  } catch (e) {
    if (e instanceof Exit) return e.code;
    if (e instanceof UsageError) {
      process.stderr.write(`withruntime: ${name}: ${e.message}\nusage: ${USAGE[name]}\nTry 'withruntime ${name} --help'.\n`);
      return EXIT_USAGE;
    }
    if (e instanceof ConfigurationError || e instanceof APIError) return apiFail(e).code;
    process.stderr.write(`withruntime: ${e instanceof Error ? e.message : String(e)}\n`);
    return EXIT_FAILURE;
  }
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
  // Output still queued for a pipe is written before the exit.
  process.stdout.write("", () => process.stderr.write("", () => process.exit(code)));
  // A pipe whose reader went away never calls back; leave with the code set.
  setTimeout(() => process.exit(code), 2000).unref();
});
