/** Result types, request building and answer parsing. */
import { APIConnectionError, InvalidRequestError, errorFromResponse } from "./errors.js";

export const MAX_PATH_BYTES = 4096;
export const MAX_EXEC_TIMEOUT_SECONDS = 86400;
export const DEFAULT_EXEC_TIMEOUT_SECONDS = 60;
/* Output kept per stream when the SDK gathers a streamed exec: the daemon never cuts a stream,
 * so without a bound a sandbox could fill the client's memory. */
export const DEFAULT_STREAM_KEEP_BYTES = 1024 * 1024;
/* The HTTP wait for an exec is the command's own timeout plus this slack. */
export const EXEC_HTTP_SLACK_SECONDS = 30;
export const CREATE_HTTP_TIMEOUT_SECONDS = 180;

const SANDBOX_ID = /^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$/;

/** Network policy of a sandbox. */
export interface NetworkPolicy {
  internet: boolean;
  allow?: string[];
  deny?: string[];
}

/** Fields of POST /v1/sandboxes, with the API's own names. */
export interface CreateFields {
  timeoutSeconds?: number;
  onLeaseEnd?: "stop" | "delete";
  vcpu?: number;
  memoryMiB?: number;
  diskMiB?: number;
  network?: NetworkPolicy;
  env?: Record<string, string>;
  image?: string;
  driver?: string;
  name?: string;
  labels?: Record<string, string>;
  maxCostMicros?: number;
  maxTotalCostMicros?: number;
  /** Volumes attached for the sandbox's life (docs/volumes.md). */
  volumes?: VolumeAttachment[];
}

/** A volume a create attaches: its id, where, and whether read-only. */
export interface VolumeAttachment {
  volumeId: string;
  path: string;
  readOnly?: boolean;
}

export const CREATE_FIELDS: readonly (keyof CreateFields)[] = [
  "timeoutSeconds", "onLeaseEnd", "vcpu", "memoryMiB", "diskMiB", "network", "env", "image",
  "driver", "name", "labels", "maxCostMicros", "maxTotalCostMicros", "volumes",
];
export const CLIENT_OPTIONS = ["keep", "apiKey", "baseUrl", "httpTimeoutSeconds"] as const;

/** A body of the fields that were given. */
export function dropUndefined(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}

export function sandboxPath(id: string, suffix = ""): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}${suffix}`;
}

export function checkSandboxId(id: unknown): string {
  if (typeof id !== "string" || !SANDBOX_ID.test(id)) {
    throw new InvalidRequestError(`${JSON.stringify(String(id)).slice(0, 80)} is not a sandbox id`, {
      hint: "sandbox ids look like sbx_9f2c4e1a7b3d5c6e8f01",
    });
  }
  return id;
}

export function checkPath(path: unknown, what = "path"): string {
  if (typeof path !== "string") throw new InvalidRequestError(`${what} must be a string, not ${typeof path}`);
  if (!path) throw new InvalidRequestError(`${what} is empty`);
  if (path.includes("\0")) throw new InvalidRequestError(`${what} contains a NUL byte`);
  if (Buffer.byteLength(path, "utf8") > MAX_PATH_BYTES) {
    throw new InvalidRequestError(`${what} is longer than ${MAX_PATH_BYTES} bytes`);
  }
  return path;
}

export function checkDepth(depth: unknown): number {
  if (typeof depth !== "number" || !Number.isInteger(depth) || depth < 1 || depth > 10) {
    throw new InvalidRequestError(`depth must be an integer from 1 to 10, not ${String(depth)}`);
  }
  return depth;
}

function nearest(name: string, valid: readonly string[]): string {
  const low = name.toLowerCase().replace(/_/g, "");
  const exact = valid.find((v) => v.toLowerCase() === low);
  if (exact) return exact;
  const starts = valid.find((v) => v.toLowerCase().startsWith(low.slice(0, 4)));
  return starts ?? "";
}

/** The create body; an unknown field is a TypeError naming the nearest valid one. */
export function buildCreateBody(fields: Record<string, unknown>): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  const valid = [...CREATE_FIELDS, ...CLIENT_OPTIONS] as string[];
  for (const [name, value] of Object.entries(fields)) {
    if ((CLIENT_OPTIONS as readonly string[]).includes(name)) continue;
    if (!(CREATE_FIELDS as readonly string[]).includes(name)) {
      const near = nearest(name, valid);
      throw new TypeError(
        `Sandbox.create() got an unknown option ${JSON.stringify(name)}${near ? `; did you mean ${JSON.stringify(near)}?` : ""} (valid: ${valid.join(", ")})`,
      );
    }
    if (value !== undefined && value !== null) body[name] = value;
  }
  return body;
}

/** Options of `exec`. */
export interface ExecOptions {
  /** Working directory (default /workspace). */
  cwd?: string;
  env?: Record<string, string>;
  /** Text, or bytes (sent base64). */
  stdin?: string | Uint8Array;
  /** Seconds before the command's whole process group is killed (default 60, at most 86400). */
  timeoutSeconds?: number;
  /** The same bound in milliseconds, the published client's name; wins over `timeoutSeconds`. */
  timeoutMs?: number;
  /** The user the command runs as: `"sandbox"` (the default: unprivileged, HOME=/workspace) or `"root"`. */
  user?: string;
  /** Throw `CommandError` when the command exits non-zero or times out (default false). */
  check?: boolean;
  /**
   * 1-128 of `A-Z a-z 0-9 _ . : -`: the same key with the same command within ten minutes gives
   * back the first run (its output from the start) instead of running it again.
   */
  idempotencyKey?: string;
  /** Called with each piece of stdout as it arrives (the command is then streamed). */
  onStdout?: (data: string) => void;
  /** Called with each piece of stderr as it arrives. */
  onStderr?: (data: string) => void;
  /** Output kept per stream, its end kept (default: the daemon's bound; 1 MiB when streamed). */
  maxOutputBytes?: number;
  /** Aborting ends the request; a streamed command (one with a callback, or execStream) is then killed. */
  signal?: AbortSignal;
}

export function buildExecBody(
  command: string | readonly string[],
  opts: ExecOptions,
  stream: boolean,
): { body: Record<string, unknown>; waitSeconds: number } {
  const body: Record<string, unknown> = {};
  if (typeof command === "string") {
    if (!command) throw new InvalidRequestError("command is empty");
    body.command = command;
  } else if (Array.isArray(command)) {
    if (command.length === 0) throw new InvalidRequestError("argv is empty", { hint: "pass at least the program to run" });
    if (!command.every((a) => typeof a === "string")) throw new InvalidRequestError("every argv element must be a string");
    body.argv = [...command];
  } else {
    throw new InvalidRequestError("command must be a string (run by bash -c) or an array of strings (argv)");
  }
  if (opts.cwd !== undefined) body.cwd = checkPath(opts.cwd, "cwd");
  if (opts.env && Object.keys(opts.env).length) {
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(opts.env)) env[String(k)] = String(v);
    body.env = env;
  }
  if (opts.stdin !== undefined) {
    if (typeof opts.stdin === "string") body.stdin = opts.stdin;
    else if (opts.stdin instanceof Uint8Array) body.stdinBase64 = Buffer.from(opts.stdin).toString("base64");
    else throw new InvalidRequestError("stdin must be a string or a Uint8Array");
  }
  if (opts.user !== undefined) {
    if (typeof opts.user !== "string" || !opts.user || opts.user.length > 64) throw new InvalidRequestError("user must be a name of 1 to 64 characters");
    body.user = opts.user;
  }
  let seconds = opts.timeoutSeconds ?? DEFAULT_EXEC_TIMEOUT_SECONDS;
  if (opts.timeoutMs !== undefined) {
    if (typeof opts.timeoutMs !== "number" || !Number.isInteger(opts.timeoutMs)) throw new InvalidRequestError("timeoutMs must be an integer");
    seconds = opts.timeoutMs / 1000;
  }
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds <= 0 || seconds > MAX_EXEC_TIMEOUT_SECONDS) {
    throw new InvalidRequestError(`timeoutSeconds must be in (0, ${MAX_EXEC_TIMEOUT_SECONDS}], not ${String(seconds)}`);
  }
  body.timeoutMs = Math.max(1, Math.round(seconds * 1000));
  if (stream) body.stream = true;
  else if (opts.maxOutputBytes !== undefined) {
    if (!Number.isInteger(opts.maxOutputBytes) || opts.maxOutputBytes < 0) {
      throw new InvalidRequestError("maxOutputBytes must be a non-negative integer");
    }
    body.maxOutputBytes = opts.maxOutputBytes;
  }
  return { body, waitSeconds: seconds + EXEC_HTTP_SLACK_SECONDS };
}

/** What a command did. A timeout is a result: `timedOut` is true and `exitCode` 137. */
export interface CommandResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  durationMs: number;
  /** The command's process id in the sandbox, when the answer said it (streamed exec). */
  pid: number | null;
  /** The daemon's id of the process (`proc_...`), when it ran as one (streamed exec, spawn). */
  processId: string | null;
  /** Set when the command used up the sandbox's memory and was killed: `{code, memoryMiB, message, hint, ...}`. */
  outOfMemory: Record<string, unknown> | null;
  /** Who ran it, `"sandbox"` or `"root"` (root on an image without the sandbox user); null when not said. */
  user: string | null;
  /** True when the command exited 0 within its timeout. */
  ok: boolean;
}

function result(fields: Omit<CommandResult, "ok">): CommandResult {
  return { ...fields, ok: fields.exitCode === 0 && !fields.timedOut };
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export function parseExecResult(data: unknown): CommandResult {
  if (!isObject(data) || !Number.isInteger(data.exitCode)) {
    throw new APIConnectionError("the daemon's exec answer has no exitCode");
  }
  return result({
    exitCode: data.exitCode as number,
    stdout: typeof data.stdout === "string" ? data.stdout : "",
    stderr: typeof data.stderr === "string" ? data.stderr : "",
    timedOut: data.timedOut === true,
    stdoutTruncated: data.stdoutTruncated === true,
    stderrTruncated: data.stderrTruncated === true,
    durationMs: Number.isInteger(data.durationMs) ? (data.durationMs as number) : 0,
    pid: Number.isInteger(data.pid) ? (data.pid as number) : null,
    processId: typeof data.processId === "string" ? data.processId : null,
    outOfMemory: isObject(data.outOfMemory) ? data.outOfMemory : null,
    user: typeof data.user === "string" ? data.user : null,
  });
}

/** The files routes' `user` query argument: `"sandbox"` (the daemon's default) or `"root"`. */
export function withUser(query: Record<string, string | number>, user: string | undefined): Record<string, string | number> {
  if (user !== undefined) {
    if (typeof user !== "string" || !user || user.length > 64) throw new InvalidRequestError("user must be a name of 1 to 64 characters");
    query.user = user;
  }
  return query;
}

/**
 * The events of a streamed exec and of a process's output, as the API sends them. `offset`
 * counts bytes of stdout and stderr together; `base64` carries the exact bytes when they are
 * not UTF-8 (or the process was spawned with `outputEncoding: "base64"`).
 */
export type ExecEvent =
  | { type: "start"; pid: number | null; processId: string | null; replayed: boolean; user: string | null; [k: string]: unknown }
  | { type: "stdout" | "stderr"; data: string; offset: number | null; base64?: string }
  | { type: "truncated"; droppedBytes: number; resumeAt: number | null }
  | {
      type: "exit";
      exitCode: number;
      timedOut: boolean;
      durationMs: number;
      state: string | null;
      outOfMemory: Record<string, unknown> | null;
      [k: string]: unknown;
    };

/** Where a reader of the output is after `ev` (the byte after its data, or a truncation's resume point). */
export function eventEnd(ev: ExecEvent, cursor: number): number {
  if (ev.type === "truncated") return ev.resumeAt !== null ? Math.max(cursor, ev.resumeAt) : cursor;
  if ((ev.type !== "stdout" && ev.type !== "stderr") || ev.offset === null) return cursor;
  const n = ev.base64 !== undefined ? Buffer.from(ev.base64, "base64").length : Buffer.byteLength(ev.data, "utf8");
  return Math.max(cursor, ev.offset + n);
}

const nonNegative = (v: unknown): number | null => (Number.isSafeInteger(v) && (v as number) >= 0 ? (v as number) : null);

/** A `continue` line: the daemon ended a long answer; read on from `cursor`. */
export interface ContinueMark {
  type: "continue";
  processId: string | null;
  cursor: number;
}

/** Turns one NDJSON line into an event; an `error` event is thrown as its APIError. Unknown types give null. */
export function parseExecEvent(line: string): ExecEvent | null {
  const ev = parseOutputLine(line);
  return ev === null || ev.type === "continue" ? null : ev;
}

/** As `parseExecEvent`, with the `continue` mark a reader follows on from. */
export function parseOutputLine(line: string): ExecEvent | ContinueMark | null {
  let ev: unknown;
  try {
    ev = JSON.parse(line);
  } catch {
    throw new APIConnectionError("the daemon sent an exec event that is not JSON");
  }
  if (!isObject(ev)) throw new APIConnectionError("the daemon sent an exec event that is not an object");
  switch (ev.type) {
    case "stdout":
    case "stderr": {
      const out: ExecEvent = { type: ev.type, data: typeof ev.data === "string" ? ev.data : "", offset: nonNegative(ev.offset) };
      if (typeof ev.base64 === "string") out.base64 = ev.base64;
      return out;
    }
    case "truncated":
      return { type: "truncated", droppedBytes: nonNegative(ev.droppedBytes) ?? 0, resumeAt: nonNegative(ev.resumeAt) };
    case "continue":
      return { type: "continue", processId: typeof ev.processId === "string" ? ev.processId : null, cursor: nonNegative(ev.cursor) ?? 0 };
    case "start":
      return {
        ...ev,
        type: "start",
        pid: Number.isInteger(ev.pid) ? (ev.pid as number) : null,
        processId: typeof ev.processId === "string" ? ev.processId : null,
        replayed: ev.replayed === true,
        user: typeof ev.user === "string" ? ev.user : null,
      };
    case "exit":
      return {
        ...ev,
        type: "exit",
        exitCode: Number.isInteger(ev.exitCode) ? (ev.exitCode as number) : -1,
        timedOut: ev.timedOut === true,
        durationMs: Number.isInteger(ev.durationMs) ? (ev.durationMs as number) : 0,
        state: typeof ev.state === "string" ? ev.state : null,
        outOfMemory: isObject(ev.outOfMemory) ? ev.outOfMemory : null,
      };
    case "error": {
      const err = isObject(ev.error) ? ev.error : {};
      const status = Number.isInteger(err.status) ? (err.status as number) : 500;
      throw errorFromResponse(status, { error: err });
    }
    default:
      return null;
  }
}

/** Keeps the last `limit` bytes of a stream (errors and results come at its end). */
export class Tail {
  #parts: Buffer[] = [];
  #size = 0;
  truncated = false;
  constructor(readonly limit: number) {}

  add(text: string): void {
    const b = Buffer.from(text, "utf8");
    this.#parts.push(b);
    this.#size += b.length;
    if (this.#size > this.limit * 2 || this.#parts.length > 4096) this.#compact();
  }

  #compact(): void {
    let all = Buffer.concat(this.#parts);
    if (all.length > this.limit) {
      all = all.subarray(all.length - this.limit);
      this.truncated = true;
    }
    this.#parts = [all];
    this.#size = all.length;
  }

  text(): string {
    this.#compact();
    let data = this.#parts[0] ?? Buffer.alloc(0);
    if (this.truncated) {
      // Do not start in the middle of a UTF-8 character.
      let i = 0;
      while (i < data.length && i < 4 && (data[i]! & 0xc0) === 0x80) i++;
      data = data.subarray(i);
    }
    return data.toString("utf8");
  }
}

/** Folds the events of a streamed exec into a CommandResult. */
export class ExecFold {
  readonly stdout: Tail;
  readonly stderr: Tail;
  pid: number | null = null;
  processId: string | null = null;
  user: string | null = null;
  /** Output the daemon no longer kept when it was read (a `truncated` event). */
  lost = false;
  result: CommandResult | null = null;

  constructor(keepBytes = DEFAULT_STREAM_KEEP_BYTES) {
    this.stdout = new Tail(keepBytes);
    this.stderr = new Tail(keepBytes);
  }

  feed(ev: ExecEvent): void {
    if (ev.type === "stdout") this.stdout.add(ev.data);
    else if (ev.type === "stderr") this.stderr.add(ev.data);
    else if (ev.type === "start") {
      this.pid = ev.pid;
      this.processId = ev.processId;
      this.user = ev.user;
    } else if (ev.type === "truncated") this.lost = true;
    else if (ev.type === "exit") {
      this.result = result({
        exitCode: ev.exitCode,
        stdout: this.stdout.text(),
        stderr: this.stderr.text(),
        timedOut: ev.timedOut,
        stdoutTruncated: this.stdout.truncated || this.lost,
        stderrTruncated: this.stderr.truncated || this.lost,
        durationMs: ev.durationMs,
        pid: this.pid,
        processId: this.processId,
        outOfMemory: ev.outOfMemory,
        user: this.user,
      });
    }
  }

  finish(): CommandResult {
    if (!this.result) {
      throw new APIConnectionError("the exec stream ended before the command's exit was reported", {
        hint: "the daemon or the sandbox may have stopped; check the sandbox's state",
      });
    }
    return this.result;
  }
}

/** One file, directory or link inside the sandbox. */
export interface FileEntry {
  path: string;
  name: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  mode: number;
  mtime: string | null;
  target: string | null;
  isDir: boolean;
  isFile: boolean;
}

export function parseEntry(data: unknown): FileEntry {
  if (!isObject(data) || typeof data.path !== "string") {
    throw new APIConnectionError("the daemon sent a file entry without a path");
  }
  const path = data.path;
  // The daemon answers in the published client's shape ("directory", mode as octal text,
  // modifiedAt, symlinkTarget); this SDK's names stay as they were.
  const wireType = data.type === "directory" ? "dir" : data.type;
  const type = (["file", "dir", "symlink"].includes(wireType as string) ? wireType : "other") as FileEntry["type"];
  const mode = Number.isInteger(data.mode)
    ? (data.mode as number)
    : typeof data.mode === "string" && /^[0-7]{1,7}$/.test(data.mode)
      ? parseInt(data.mode, 8)
      : 0;
  const mtime = typeof data.modifiedAt === "string" ? data.modifiedAt : typeof data.mtime === "string" ? data.mtime : null;
  const target =
    typeof data.symlinkTarget === "string" ? data.symlinkTarget : typeof data.target === "string" ? data.target : null;
  return {
    path,
    name: typeof data.name === "string" && data.name ? data.name : (path.replace(/\/+$/, "").split("/").pop() ?? ""),
    type,
    size: Number.isInteger(data.size) ? (data.size as number) : 0,
    mode,
    mtime,
    target,
    isDir: type === "dir",
    isFile: type === "file",
  };
}

/** Entries of a listing; `truncated` is true when the daemon stopped at its entry limit. */
export interface FileList extends Array<FileEntry> {
  truncated: boolean;
}

export function parseList(data: unknown): FileList {
  const out = [] as unknown as FileList;
  const entries = !isObject(data) ? [] : Array.isArray(data.data) ? data.data : Array.isArray(data.entries) ? data.entries : [];
  for (const e of entries) out.push(parseEntry(e));
  out.truncated = isObject(data) && data.truncated === true;
  return out;
}

/** Where a write landed (the absolute path in the sandbox) and how many bytes it holds. */
export interface WriteResult {
  path: string;
  size: number;
}

export function parseWrite(data: unknown, path: string, size: number): WriteResult {
  if (isObject(data)) {
    return {
      path: typeof data.path === "string" && data.path ? data.path : path,
      size: Number.isInteger(data.size) ? (data.size as number) : size,
    };
  }
  return { path, size };
}

const NETWORK_PATTERNS_MAX = 256;

function patterns(what: string, value: unknown, limit: number): string[] {
  if (!Array.isArray(value)) throw new InvalidRequestError(`${what} must be an array of host patterns, such as ["pypi.org"]`);
  if (value.length > limit) throw new InvalidRequestError(`${what}: at most ${limit} patterns`);
  for (const v of value) {
    if (typeof v !== "string" || !v || v.length > 260) {
      throw new InvalidRequestError(`${what}: each pattern is a host name of 1 to 260 characters`);
    }
  }
  return [...value];
}

/** The `network` object of the API from `network.set`'s arguments. */
export function buildNetworkBody(p: { internet?: boolean; allow?: string[]; deny?: string[] }): NetworkPolicy {
  let internet = p.internet;
  if (internet === undefined) {
    if (p.allow === undefined) throw new InvalidRequestError("say internet: true or internet: false, or give allow: [...]");
    internet = true;
  }
  if (typeof internet !== "boolean") throw new InvalidRequestError("internet must be true or false");
  if (!internet && p.allow && p.allow.length) throw new InvalidRequestError("allow needs internet: true (with internet: false nothing leaves)");
  const body: NetworkPolicy = { internet };
  if (p.allow !== undefined) body.allow = patterns("allow", p.allow, NETWORK_PATTERNS_MAX);
  if (p.deny !== undefined) body.deny = patterns("deny", p.deny, NETWORK_PATTERNS_MAX);
  return body;
}

export function checkLimit(limit: unknown): number {
  if (typeof limit !== "number" || !Number.isInteger(limit) || limit < 1 || limit > 10000) {
    throw new InvalidRequestError("limit must be an integer from 1 to 10000");
  }
  return limit;
}

const PROCESS_ID = /^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$/;
const IDEMPOTENCY_KEY = /^[A-Za-z0-9_.:-]{1,128}$/;
export const SIGNALS = ["SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGCONT", "SIGSTOP", "SIGTSTP"] as const;
export type SignalName = (typeof SIGNALS)[number];

export function checkProcessId(id: unknown): string {
  if (typeof id !== "string" || !PROCESS_ID.test(id)) {
    throw new InvalidRequestError(`${JSON.stringify(String(id)).slice(0, 80)} is not a process id`, {
      hint: "process ids look like proc_3b1f0c9a2d4e5f60",
    });
  }
  return id;
}

/** The Idempotency-Key header, or none. */
export function idempotencyHeaders(key: unknown): Record<string, string> | undefined {
  if (key === undefined) return undefined;
  if (typeof key !== "string" || !IDEMPOTENCY_KEY.test(key)) {
    throw new InvalidRequestError("idempotencyKey must be 1 to 128 of A-Z a-z 0-9 _ . : -");
  }
  return { "Idempotency-Key": key };
}

/** A signal's API name: "TERM", "SIGTERM" and 15 are the same; others than SIGNALS are refused. */
export function signalName(signal: unknown): string | number {
  if (typeof signal === "number") {
    if (!Number.isInteger(signal) || signal < 1 || signal > 64) throw new InvalidRequestError("a signal number is from 1 to 64");
    return signal;
  }
  if (typeof signal !== "string") throw new InvalidRequestError("signal must be a name such as \"SIGTERM\" or a number");
  const name = signal.startsWith("SIG") ? signal : "SIG" + signal;
  if (!(SIGNALS as readonly string[]).includes(name)) throw new InvalidRequestError(`signal must be one of ${SIGNALS.join(", ")}`);
  return name;
}
