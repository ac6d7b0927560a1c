/**
 * `sbx.interpreter`: a stateful Python in the sandbox, like a notebook (docs/interpreter.md).
 *
 *     await sbx.interpreter.run("x = 6 * 7");
 *     (await sbx.interpreter.run("x")).results[0].data["text/plain"];   // "42"
 */
import { APIConnectionError, APIError, InvalidRequestError, errorFromResponse } from "./errors.js";
import type { HttpClient } from "./http.js";
import { checkPath, sandboxPath } from "./models.js";

/** The MIME type of a DataFrame's rows: `{columns, index, rows, dtypes, totalRows, truncated}`. */
export const TABLE_MIME = "application/vnd.runtime.table+json";

const CONTEXT = /^[a-z0-9][a-z0-9-]{0,62}$/;
const RESULT = /^\/workspace\/\.runtime\/interpreter\/([a-z0-9][a-z0-9-]{0,62})\/out\/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})$/;
const MAX_TIMEOUT_MS = 86_400_000;
/* The daemon answers a cell past its timeout; the HTTP wait only covers a lost daemon. */
const HTTP_SLACK_SECONDS = 60;
/* With no timeout (0), how long the HTTP exchange may last at most. */
const NO_TIMEOUT_HTTP_SECONDS = 86_400 + HTTP_SLACK_SECONDS;

/** A displayed value: MIME type to data (`image/png` is base64), and entries kept as files. */
export interface ResultBundle {
  main: boolean;
  data: Record<string, unknown>;
  refs: Record<string, { path: string; size: number }>;
}

/** An exception the cell raised. */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string;
}

/** What a run did. */
export interface Execution {
  /** `ok`, `error` (the cell raised), `timeout`, or `lost` (the context's process ended). */
  status: "ok" | "error" | "timeout" | "lost" | string;
  context: string;
  executionCount: number;
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  results: ResultBundle[];
  error: ExecutionError | null;
  [k: string]: unknown;
}

/** An interpreter context: `{id, language, cwd, createdAt, running, pid, kernel}`; `kernel` is `"ipykernel"`, `"bash_kernel"` or `"loop"` (docs/interpreter.md). */
export type InterpreterContext = Record<string, unknown> & { id: string };

export interface RunOptions {
  /** `"python"`, the only one. */
  language?: string;
  /** The context to run in (default `"python"`, started on first use); others must be created first. */
  context?: string;
  /** Milliseconds before the cell is interrupted, its state kept (default 60000; 0: none). */
  timeoutMs?: number;
  /** A client that goes away mid-cell interrupts it (default true). */
  interruptOnDisconnect?: boolean;
  /** With any of these four the run is streamed and they are called as output happens. */
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  onResult?: (result: ResultBundle) => void;
  onError?: (error: ExecutionError) => void;
  /** Aborting ends the request (and with `interruptOnDisconnect`, the cell). */
  signal?: AbortSignal;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export function checkContext(id: unknown): string {
  if (typeof id !== "string" || !CONTEXT.test(id)) {
    throw new InvalidRequestError(`${JSON.stringify(String(id)).slice(0, 80)} is not a context id`, {
      hint: "a context id is 1-63 of [a-z0-9-], starting with a letter or digit",
    });
  }
  return id;
}

function execution(data: unknown): Execution {
  if (!isObject(data) || typeof data.status !== "string") throw new APIConnectionError("the daemon's answer is not an execution");
  const str = (v: unknown) => (typeof v === "string" ? v : "");
  return {
    ...data,
    status: data.status,
    context: str(data.context),
    executionCount: Number.isInteger(data.executionCount) ? (data.executionCount as number) : 0,
    stdout: str(data.stdout),
    stderr: str(data.stderr),
    stdoutTruncated: data.stdoutTruncated === true,
    stderrTruncated: data.stderrTruncated === true,
    results: Array.isArray(data.results) ? data.results.filter(isObject).map(bundle) : [],
    error: isObject(data.error) ? errorOf(data.error) : null,
  };
}

function bundle(r: Record<string, unknown>): ResultBundle {
  return {
    main: r.main === true,
    data: isObject(r.data) ? r.data : {},
    refs: (isObject(r.refs) ? r.refs : {}) as ResultBundle["refs"],
  };
}

function errorOf(e: Record<string, unknown>): ExecutionError {
  const str = (v: unknown) => (typeof v === "string" ? v : "");
  return { name: str(e.name), value: str(e.value), traceback: str(e.traceback) };
}

function runBody(code: unknown, opts: RunOptions): { body: Record<string, unknown>; waitSeconds: number } {
  if (typeof code !== "string") throw new InvalidRequestError("code must be a string");
  const body: Record<string, unknown> = { code };
  if (opts.context !== undefined) body.context = checkContext(opts.context);
  if (opts.language !== undefined) {
    if (typeof opts.language !== "string" || !opts.language) throw new InvalidRequestError("language must be a string such as \"python\"");
    body.language = opts.language;
  }
  let waitSeconds = 60 + HTTP_SLACK_SECONDS;
  if (opts.timeoutMs !== undefined) {
    const t = opts.timeoutMs;
    if (!Number.isInteger(t) || t < 0 || t > MAX_TIMEOUT_MS) throw new InvalidRequestError(`timeoutMs must be an integer from 0 (none) to ${MAX_TIMEOUT_MS}`);
    body.timeoutMs = t;
    waitSeconds = t === 0 ? NO_TIMEOUT_HTTP_SECONDS : t / 1000 + HTTP_SLACK_SECONDS;
  }
  if (opts.interruptOnDisconnect !== undefined) body.interruptOnDisconnect = opts.interruptOnDisconnect === true;
  return { body, waitSeconds };
}

/** The path of a result kept as a file, from a `refs` entry or its path. */
function resultPath(ref: { path?: unknown } | string): string {
  const path = typeof ref === "string" ? ref : isObject(ref) ? ref.path : undefined;
  const m = typeof path === "string" ? RESULT.exec(path) : null;
  if (!m) throw new InvalidRequestError("not an interpreter result path (a refs entry's path under /workspace/.runtime/interpreter/)");
  return `/contexts/${m[1]}/results/${m[2]}`;
}

function failure(ev: Record<string, unknown>): APIError {
  const status = Number.isInteger(ev.status) ? (ev.status as number) : 500;
  const err: Record<string, unknown> = {};
  for (const k of ["code", "status", "message", "hint", "requestId"]) if (ev[k] !== undefined) err[k] = ev[k];
  return errorFromResponse(status, { error: err });
}

/** `sbx.interpreter.contexts`: interpreters with their own state, directory and environment. */
export class InterpreterContexts {
  readonly #http: HttpClient;
  readonly #sandboxId: string;
  /** @internal */
  constructor(http: HttpClient, sandboxId: string) {
    this.#http = http;
    this.#sandboxId = sandboxId;
  }

  #path(suffix = ""): string {
    return sandboxPath(this.#sandboxId, `/interpreter/contexts${suffix}`);
  }

  async list(): Promise<InterpreterContext[]> {
    const data = await this.#http.request<{ data?: unknown }>("GET", this.#path());
    if (!isObject(data) || !Array.isArray(data.data)) throw new APIConnectionError("the daemon's answer is not a list of contexts");
    return data.data.filter((c): c is InterpreterContext => isObject(c) && typeof c.id === "string");
  }

  /** Create a context (`id` left out: the daemon names it); `cwd` and `env` apply to its process. */
  async create(opts: { id?: string; language?: string; cwd?: string; env?: Record<string, string> } = {}): Promise<InterpreterContext> {
    const body: Record<string, unknown> = {};
    if (opts.id !== undefined) body.id = checkContext(opts.id);
    if (opts.language !== undefined) body.language = opts.language;
    if (opts.cwd !== undefined) body.cwd = checkPath(opts.cwd, "cwd");
    if (opts.env !== undefined) {
      if (!isObject(opts.env)) throw new InvalidRequestError("env must be an object of strings");
      const env: Record<string, string> = {};
      for (const [k, v] of Object.entries(opts.env)) env[k] = String(v);
      body.env = env;
    }
    const data = await this.#http.request("POST", this.#path(), { json: body });
    if (!isObject(data) || typeof data.id !== "string") throw new APIConnectionError("the daemon's answer is not a context");
    return data as InterpreterContext;
  }

  /** Start the context again with empty state. */
  async restart(id: string): Promise<InterpreterContext> {
    const data = await this.#http.request("POST", this.#path(`/${checkContext(id)}:restart`), { json: {} });
    if (!isObject(data) || typeof data.id !== "string") throw new APIConnectionError("the daemon's answer is not a context");
    return data as InterpreterContext;
  }

  /** Stop the running cell as Ctrl-C would; the state stays. Resolves whether a cell was running. */
  async interrupt(id: string): Promise<boolean> {
    const data = await this.#http.request<{ interrupted?: unknown }>("POST", this.#path(`/${checkContext(id)}:interrupt`), { json: {} });
    return isObject(data) && data.interrupted === true;
  }

  /** Remove the context, its process and its kept results. */
  async remove(id: string): Promise<boolean> {
    const data = await this.#http.request<{ deleted?: unknown }>("DELETE", this.#path(`/${checkContext(id)}`));
    return isObject(data) && data.deleted === true;
  }
}

/** `sbx.interpreter`. */
export class Interpreter {
  readonly contexts: InterpreterContexts;
  readonly #http: HttpClient;
  readonly #sandboxId: string;
  /** @internal */
  constructor(http: HttpClient, sandboxId: string) {
    this.#http = http;
    this.#sandboxId = sandboxId;
    this.contexts = new InterpreterContexts(http, sandboxId);
  }

  /**
   * Run a cell and resolve its execution: `status` (ok, error, timeout, lost), `stdout`,
   * `stderr`, `results` (MIME bundles), `error` (name, value, traceback), `executionCount`.
   * A cell that raised is an execution with `status: "error"`, not a thrown error. With any
   * `on*` callback the run is streamed and they are called as output happens.
   */
  async run(code: string, opts: RunOptions = {}): Promise<Execution> {
    const { body, waitSeconds } = runBody(code, opts);
    const path = sandboxPath(this.#sandboxId, "/interpreter:run");
    const stream = opts.onStdout || opts.onStderr || opts.onResult || opts.onError;
    if (!stream) {
      return execution(await this.#http.request("POST", path, { json: body, timeoutSeconds: waitSeconds, signal: opts.signal }));
    }
    for await (const line of this.#http.lines("POST", path, { json: { ...body, stream: true }, timeoutSeconds: waitSeconds, signal: opts.signal })) {
      let ev: unknown;
      try {
        ev = JSON.parse(line);
      } catch {
        throw new APIConnectionError("the daemon sent an interpreter event that is not JSON");
      }
      if (!isObject(ev)) throw new APIConnectionError("the daemon sent an interpreter event that is not an object");
      switch (ev.k) {
        case "stdout":
          opts.onStdout?.(typeof ev.text === "string" ? ev.text : "");
          break;
        case "stderr":
          opts.onStderr?.(typeof ev.text === "string" ? ev.text : "");
          break;
        case "result":
          opts.onResult?.(bundle(ev));
          break;
        case "error":
          opts.onError?.(errorOf(ev));
          break;
        case "execution":
          return execution(ev.execution);
        case "failure":
          throw failure(ev);
        default:
          break;
      }
    }
    throw new APIConnectionError("the interpreter stream ended without an execution", {
      code: "stream_ended",
      hint: "the daemon or the sandbox may have stopped; check the sandbox's state",
    });
  }

  /** The bytes of a result too large to travel inline (a `refs` entry, or its path). */
  async result(ref: { path: string } | string, opts: { signal?: AbortSignal } = {}): Promise<Buffer> {
    return this.#http.request<Buffer>("GET", sandboxPath(this.#sandboxId, `/interpreter${resultPath(ref)}`), {
      raw: true,
      timeoutSeconds: 600,
      signal: opts.signal,
    });
  }
}
