/** The client: `Sandbox`, its `Files` and `Network`, and `Secrets`. */
import { resolveApiKey, resolveEndpoint } from "./config.js";
import { APIConnectionError, APIError, CommandError, InvalidRequestError, NotFoundError } from "./errors.js";
import { HttpClient, type Body } from "./http.js";
import { Browser, Desktop } from "./computer.js";
import { Interpreter } from "./interpreter.js";
import { SandboxMcp } from "./mcp.js";
import { Process, readOutput } from "./process.js";
import {
  CREATE_HTTP_TIMEOUT_SECONDS,
  MAX_EXEC_TIMEOUT_SECONDS,
  checkProcessId,
  eventEnd,
  idempotencyHeaders,
  parseOutputLine,
  DEFAULT_STREAM_KEEP_BYTES,
  ExecFold,
  buildCreateBody,
  buildExecBody,
  buildNetworkBody,
  checkDepth,
  checkLimit,
  checkPath,
  checkSandboxId,
  dropUndefined,
  parseEntry,
  parseExecEvent,
  parseExecResult,
  parseList,
  parseWrite,
  sandboxPath,
  type CommandResult,
  type CreateFields,
  type ExecEvent,
  type ExecOptions,
  type FileEntry,
  type FileList,
  type NetworkPolicy,
  type WriteResult,
  withUser,
} from "./models.js";

/** Where the daemon is and which key to use; left out, `RUNTIME_BASE_URL` and `RUNTIME_API_KEY`. */
export interface ClientOptions {
  apiKey?: string;
  baseUrl?: string;
  /** Seconds for ordinary calls (default 60). */
  httpTimeoutSeconds?: number;
}

export interface CreateOptions extends CreateFields, ClientOptions {
  /** Leave the sandbox running when a `using` block ends (default false: it is deleted). */
  keep?: boolean;
}

/** The sandbox object as the API answers it (camelCase names). */
export type SandboxData = Record<string, unknown> & { id: string; state?: string };

/** The ranges a sandbox's metrics are read over. */
export const METRICS_RANGES = ["15m", "1h", "6h", "24h", "7d", "30d"] as const;
export type MetricsRange = (typeof METRICS_RANGES)[number];

/** @internal A client of the daemon the options name (Runtime shares this). */
export function connect(opts: ClientOptions): HttpClient {
  const endpoint = resolveEndpoint(opts.baseUrl);
  return new HttpClient(endpoint, resolveApiKey(opts.apiKey), opts.httpTimeoutSeconds);
}

function sandboxData(data: unknown): SandboxData {
  if (typeof data !== "object" || data === null || typeof (data as SandboxData).id !== "string") {
    throw new APIConnectionError("the daemon's answer is not a sandbox object");
  }
  return data as SandboxData;
}

/**
 * A sandbox on a Runtime daemon. Make one with `Sandbox.create()` or attach to one with
 * `Sandbox.connect()`. With `await using`, a created sandbox is deleted when the block ends
 * (unless `keep: true`); an attached one is left as it is.
 */
export class Sandbox implements AsyncDisposable {
  /** @internal */
  readonly http: HttpClient;
  #data: SandboxData;
  #keep: boolean;
  #ownsHttp: boolean;
  /** File operations in this sandbox. */
  readonly files: Files;
  /** Ports of this sandbox shared at a host name of their own (docs/previews.md). */
  readonly previews: Previews;
  /** The stateful Python interpreter (docs/interpreter.md). */
  readonly interpreter: Interpreter;
  /** Chromium in the sandbox, for CDP clients (docs/computer-use.md; the `desktop` image). */
  readonly browser: Browser;
  /** The sandbox's X desktop: actions, screenshots, recordings (docs/computer-use.md). */
  readonly desktop: Desktop;
  /** Catalog MCP servers inside the sandbox, at URLs an MCP client connects to (docs/mcp.md). */
  readonly mcp: SandboxMcp;

  /** @internal Use `Sandbox.create`, `Sandbox.connect` or `Sandbox.list`. */
  constructor(http: HttpClient, data: unknown, keep = true, ownsHttp = true) {
    this.http = http;
    this.#data = sandboxData(data);
    this.#keep = keep;
    this.#ownsHttp = ownsHttp;
    this.files = new Files(this);
    this.previews = new Previews(this);
    this.interpreter = new Interpreter(http, this.#data.id);
    this.browser = new Browser(http, this.#data.id);
    this.desktop = new Desktop(http, this.#data.id);
    this.mcp = new SandboxMcp(http, this.#data.id);
  }

  /** Create and start a sandbox; resolves once it is running. */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const body = buildCreateBody(opts as Record<string, unknown>);
    const http = connect(opts);
    try {
      const data = await http.request("POST", "/v1/sandboxes", { json: body, timeoutSeconds: CREATE_HTTP_TIMEOUT_SECONDS });
      return new Sandbox(http, data, opts.keep ?? false);
    } catch (e) {
      http.close();
      throw e;
    }
  }

  /** Attach to an existing sandbox. Disposing it does not delete it. */
  static async connect(id: string, opts: ClientOptions = {}): Promise<Sandbox> {
    checkSandboxId(id);
    const http = connect(opts);
    try {
      return new Sandbox(http, await http.request("GET", sandboxPath(id)), true);
    } catch (e) {
      http.close();
      throw e;
    }
  }

  /** The caller's sandboxes, oldest first. */
  static async list(opts: ClientOptions = {}): Promise<Sandbox[]> {
    const http = connect(opts);
    try {
      const data = await http.request<{ sandboxes?: unknown[] }>("GET", "/v1/sandboxes");
      const items = Array.isArray(data?.sandboxes) ? data.sandboxes : [];
      // The listed sandboxes share this client; its idle sockets do not keep Node running.
      if (items.length === 0) http.close();
      return items.map((d) => new Sandbox(http, d, true, false));
    } catch (e) {
      http.close();
      throw e;
    }
  }

  /** The sandbox object as the API last answered it. */
  get data(): SandboxData {
    return { ...this.#data };
  }
  get id(): string {
    return this.#data.id;
  }
  get state(): string {
    return typeof this.#data.state === "string" ? this.#data.state : "unknown";
  }
  get name(): string | null {
    return (this.#data.name as string) ?? null;
  }
  get labels(): Record<string, string> {
    return { ...((this.#data.labels as Record<string, string>) ?? {}) };
  }
  get driver(): string | null {
    return (this.#data.driver as string) ?? null;
  }
  get image(): string | null {
    return (this.#data.image as string) ?? null;
  }
  get vcpu(): number | null {
    return (this.#data.vcpu as number) ?? null;
  }
  get memoryMiB(): number | null {
    return (this.#data.memoryMiB as number) ?? null;
  }
  get diskMiB(): number | null {
    return (this.#data.diskMiB as number) ?? null;
  }
  get timeoutSeconds(): number | null {
    return (this.#data.timeoutSeconds as number) ?? null;
  }
  get onLeaseEnd(): string | null {
    return (this.#data.onLeaseEnd as string) ?? null;
  }
  get createdAt(): string | null {
    return (this.#data.createdAt as string) ?? null;
  }
  get leaseEndsAt(): string | null {
    return (this.#data.leaseEndsAt as string) ?? null;
  }
  get costMicros(): number | null {
    return (this.#data.costMicros as number) ?? null;
  }
  get costMicrosPerHour(): number | null {
    return (this.#data.costMicrosPerHour as number) ?? null;
  }
  get maxCostMicros(): number | null {
    return (this.#data.maxCostMicros as number) ?? null;
  }
  get failureReason(): string | null {
    return (this.#data.failureReason as string) ?? null;
  }
  /** The egress policy as last answered, with `.set()` to replace it. */
  get network(): Network {
    return new Network(this, (this.#data.network as NetworkPolicy) ?? { internet: false });
  }

  /** Reload the sandbox's state from the daemon. */
  async refresh(): Promise<this> {
    this.#data = sandboxData(await this.http.request("GET", sandboxPath(this.id)));
    return this;
  }

  /** Kill every process and keep the files. Stopping a stopped sandbox does nothing. */
  async stop(): Promise<this> {
    this.#data = sandboxData(await this.http.request("POST", sandboxPath(this.id, ":stop")));
    return this;
  }

  /** Renew the lease: it then ends `seconds` after the later of now and its old end. */
  async extend(seconds: number): Promise<this> {
    if (!Number.isInteger(seconds)) throw new InvalidRequestError("seconds must be an integer");
    this.#data = sandboxData(await this.http.request("POST", sandboxPath(this.id, ":extend"), { json: { seconds } }));
    return this;
  }

  /** Replace the egress policy; it applies to new connections. */
  async setNetwork(network: NetworkPolicy): Promise<this> {
    this.#data = sandboxData(await this.http.request("PUT", sandboxPath(this.id, "/network"), { json: network }));
    return this;
  }

  /** The egress audit log, newest first. */
  async egressLog(limit = 100): Promise<Record<string, unknown>[]> {
    const data = await this.http.request<{ entries?: unknown }>("GET", sandboxPath(this.id, "/egress"), {
      query: { limit: checkLimit(limit) },
    });
    if (!data || !Array.isArray(data.entries)) throw new APIConnectionError("the daemon's answer is not an egress log");
    return data.entries.filter((e): e is Record<string, unknown> => typeof e === "object" && e !== null);
  }

  /**
   * Its CPU, memory, disk and network use over `range` (15m, 1h (the default), 6h, 24h, 7d or
   * 30d): `points` in steps of `stepSeconds`, and `latest`, its newest reading.
   */
  async metrics(range?: MetricsRange): Promise<Record<string, unknown>> {
    if (range !== undefined && !(METRICS_RANGES as readonly string[]).includes(range)) {
      throw new InvalidRequestError(`range must be one of ${METRICS_RANGES.join(", ")}`);
    }
    const data = await this.http.request<{ points?: unknown }>("GET", sandboxPath(this.id, "/metrics"), {
      query: range === undefined ? {} : { range },
    });
    if (!data || !Array.isArray(data.points)) throw new APIConnectionError("the daemon's answer is not a sandbox's metrics");
    return data as Record<string, unknown>;
  }

  /** Stop the sandbox and remove its files and everything it had on the host. */
  async delete(): Promise<void> {
    await this.http.request("DELETE", sandboxPath(this.id));
    this.#data = { ...this.#data, state: "deleted" };
  }

  /** Release the HTTP connections (the sandbox itself is left as it is). */
  close(): void {
    if (this.#ownsHttp) this.http.close();
  }

  /** `await using sbx = await Sandbox.create()`: deletes the sandbox at the block's end unless kept. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      if (!this.#keep) {
        try {
          await this.delete();
        } catch (e) {
          if (!(e instanceof NotFoundError)) throw e;
        }
      }
    } finally {
      this.close();
    }
  }

  /**
   * Run a command and wait for it. A string runs under `bash -c`; an array runs as argv with no
   * shell. With `onStdout`/`onStderr` the output is streamed to them as it happens. A timeout is
   * a result (`timedOut: true`, exit code 137), not an error, unless `check: true`, which throws
   * `CommandError` for it and for a non-zero exit.
   */
  async exec(command: string | readonly string[], opts: ExecOptions = {}): Promise<CommandResult> {
    const stream = opts.onStdout !== undefined || opts.onStderr !== undefined;
    const headers = idempotencyHeaders(opts.idempotencyKey);
    let result: CommandResult;
    if (!stream) {
      const { body, waitSeconds } = buildExecBody(command, opts, false);
      result = parseExecResult(
        await this.http.request("POST", sandboxPath(this.id, ":exec"), { json: body, timeoutSeconds: waitSeconds, signal: opts.signal, headers }),
      );
    } else {
      const { body, waitSeconds } = buildExecBody(command, opts, true);
      const fold = new ExecFold(opts.maxOutputBytes ?? DEFAULT_STREAM_KEEP_BYTES);
      for await (const ev of this.#execEvents(body, waitSeconds, headers, opts.signal, true)) {
        fold.feed(ev);
        if (ev.type === "stdout") opts.onStdout?.(ev.data);
        else if (ev.type === "stderr") opts.onStderr?.(ev.data);
      }
      result = fold.finish();
    }
    if (opts.check && !result.ok) throw new CommandError(result);
    return result;
  }

  /**
   * Run a command as a process and yield the API's events as they happen: `start` (with
   * `processId` and `pid`), `stdout`, `stderr` (with `offset`), `truncated` when output was lost,
   * `exit`. When the daemon ends a long answer (`continue`) the output is read on from its cursor.
   * An `error` event is thrown as its APIError. Leaving the loop early (or aborting `signal`)
   * kills the command, unless `detach: true` leaves it running for `sbx.process(id)`. Without
   * `timeoutMs`/`timeoutSeconds` the command may run for a day.
   */
  execStream(command: string | readonly string[], opts: ExecStreamOptions = {}): AsyncGenerator<ExecEvent> {
    const o = opts.timeoutMs === undefined && opts.timeoutSeconds === undefined ? { ...opts, timeoutSeconds: MAX_EXEC_TIMEOUT_SECONDS } : opts;
    const { body, waitSeconds } = buildExecBody(command, o, true);
    const headers = idempotencyHeaders(opts.idempotencyKey);
    return this.#execEvents(body, waitSeconds, headers, opts.signal, opts.detach !== true);
  }

  async *#execEvents(
    body: Record<string, unknown>,
    waitSeconds: number,
    headers: Record<string, string> | undefined,
    signal: AbortSignal | undefined,
    killOnLeave: boolean,
  ): AsyncGenerator<ExecEvent> {
    let processId: string | null = null;
    let cursor = 0;
    let resumed = false;
    let ended = false;
    try {
      for await (const line of this.http.lines("POST", sandboxPath(this.id, ":exec"), { json: body, timeoutSeconds: waitSeconds, signal, headers })) {
        const ev = parseOutputLine(line);
        if (ev === null) continue;
        if (ev.type === "continue") {
          processId = ev.processId ?? processId;
          cursor = Math.max(cursor, ev.cursor);
          resumed = true;
          break;
        }
        if (ev.type === "start") processId = ev.processId;
        cursor = eventEnd(ev, cursor);
        if (ev.type === "exit") ended = true;
        yield ev;
        if (ended) return;
      }
      if (resumed && processId) {
        for await (const ev of readOutput(this.http, this.id, checkProcessId(processId), cursor, true, signal)) {
          if (ev.type === "exit") ended = true;
          yield ev;
        }
      }
    } catch (e) {
      // An error event: the sandbox stopped and the process with it.
      if (e instanceof APIError && e.code !== "aborted" && !(e instanceof APIConnectionError)) ended = true;
      throw e;
    } finally {
      // A disconnect leaves a process running in the daemon; a reader that left ends it.
      if (!ended && killOnLeave && processId) await this.#killQuietly(processId);
    }
  }

  async #killQuietly(processId: string): Promise<void> {
    try {
      await this.http.request("POST", sandboxPath(this.id, `/processes/${encodeURIComponent(checkProcessId(processId))}:signal`), {
        json: { signal: "SIGKILL" },
        timeoutSeconds: 30,
      });
    } catch {
      /* it ended meanwhile, or the sandbox did */
    }
  }

  /**
   * Start a background process and resolve at once with it. `stdin: "pipe"` keeps its input
   * open for `Process.write`; other text or bytes are its whole input. Without
   * `timeoutMs`/`timeoutSeconds` it may run for a day.
   */
  async spawn(command: string | readonly string[], opts: SpawnOptions = {}): Promise<Process> {
    const pipe = opts.stdin === "pipe";
    const o: ExecOptions = { ...opts, stdin: pipe ? undefined : opts.stdin, maxOutputBytes: undefined };
    if (o.timeoutMs === undefined && o.timeoutSeconds === undefined) o.timeoutSeconds = MAX_EXEC_TIMEOUT_SECONDS;
    const { body } = buildExecBody(command, o, false);
    if (pipe) body.stdinMode = "pipe";
    if (opts.outputEncoding !== undefined) {
      if (opts.outputEncoding !== "utf8" && opts.outputEncoding !== "base64") throw new InvalidRequestError('outputEncoding must be "utf8" or "base64"');
      body.outputEncoding = opts.outputEncoding;
    }
    const headers = idempotencyHeaders(opts.idempotencyKey);
    return new Process(this.http, this.id, await this.http.request("POST", sandboxPath(this.id, "/processes"), { json: body, headers }));
  }

  /** The sandbox's processes, running and recently ended, oldest first. */
  async processes(): Promise<Process[]> {
    const data = await this.http.request<{ data?: unknown }>("GET", sandboxPath(this.id, "/processes"));
    if (!data || !Array.isArray(data.data)) throw new APIConnectionError("the daemon's answer is not a list of processes");
    return data.data.map((p) => new Process(this.http, this.id, p));
  }

  /** One process by its id (`proc_...`); throws NotFoundError when there is none. */
  async process(processId: string): Promise<Process> {
    const id = checkProcessId(processId);
    return new Process(this.http, this.id, await this.http.request("GET", sandboxPath(this.id, `/processes/${encodeURIComponent(id)}`)));
  }

  toString(): string {
    return `Sandbox(id=${this.id}, state=${this.state})`;
  }
}

/** Options of `execStream`. */
export interface ExecStreamOptions extends Omit<ExecOptions, "onStdout" | "onStderr" | "maxOutputBytes" | "check"> {
  /** Leaving the loop early leaves the process running instead of killing it. */
  detach?: boolean;
}

/** Options of `spawn`. */
export interface SpawnOptions extends Omit<ExecOptions, "onStdout" | "onStderr" | "maxOutputBytes" | "check" | "stdin" | "signal"> {
  /** `"pipe"` keeps stdin open for `Process.write`; text or bytes are its whole input. */
  stdin?: "pipe" | string | Uint8Array;
  /** `"base64"`: every output event carries the exact bytes in `base64`. */
  outputEncoding?: "utf8" | "base64";
}

/** Bytes for a file: text (written as UTF-8), bytes, or a stream of bytes. */
export type FileData = string | Uint8Array | AsyncIterable<Uint8Array>;

/** File operations inside one sandbox. Relative paths are relative to /workspace. */
export class Files {
  readonly #sbx: Sandbox;
  constructor(sbx: Sandbox) {
    this.#sbx = sbx;
  }

  #url(suffix: string): string {
    return sandboxPath(this.#sbx.id, suffix);
  }

  /** The file's bytes. */
  async read(path: string, opts: { signal?: AbortSignal; user?: string } = {}): Promise<Buffer> {
    const p = checkPath(path);
    return this.#sbx.http.request<Buffer>("GET", this.#url("/files/content"), { query: withUser({ path: p }, opts.user), raw: true, signal: opts.signal, timeoutSeconds: 600 });
  }

  /** The file decoded as UTF-8. */
  async readText(path: string): Promise<string> {
    return (await this.read(path)).toString("utf8");
  }

  /**
   * Write a whole file atomically, making parent directories. `mode` is the permission bits (e.g. 0o755).
   * The file is `user`'s (`"sandbox"`, the default, or `"root"`), written with that user's rights.
   */
  async write(path: string, data: FileData, opts: { mode?: number; user?: string } = {}): Promise<WriteResult> {
    const p = checkPath(path);
    const query = withUser({ path: p }, opts.user);
    if (opts.mode !== undefined) {
      if (!Number.isInteger(opts.mode) || opts.mode < 0 || opts.mode > 0o7777) throw new InvalidRequestError("mode must be permission bits from 0 to 0o7777");
      query.mode = opts.mode.toString(8);
    }
    let body: Body;
    let size = -1;
    if (typeof data === "string") {
      body = Buffer.from(data, "utf8");
      size = body.byteLength;
    } else if (data instanceof Uint8Array) {
      body = data;
      size = data.byteLength;
    } else if (data && typeof (data as AsyncIterable<Uint8Array>)[Symbol.asyncIterator] === "function") {
      body = data;
    } else {
      throw new InvalidRequestError("data must be a string, a Uint8Array or an async iterable of bytes");
    }
    const out = await this.#sbx.http.request("PUT", this.#url("/files/content"), { query, body, timeoutSeconds: 600 });
    return parseWrite(out, p, size);
  }

  /** Entries under `path` down to `depth` levels (1..10); `.truncated` says whether the daemon stopped at its limit. */
  async list(path = "/workspace", opts: { depth?: number } = {}): Promise<FileList> {
    const p = checkPath(path);
    const d = checkDepth(opts.depth ?? 1);
    return parseList(await this.#sbx.http.request("GET", this.#url("/files/list"), { query: { path: p, depth: d } }));
  }

  /** One entry; throws NotFoundError when there is none. */
  async stat(path: string): Promise<FileEntry> {
    const p = checkPath(path);
    const data = await this.#sbx.http.request("GET", this.#url("/files/stat"), { query: { path: p } });
    // Nothing there is an answer, `exists: false`, not a 404.
    if (data && typeof data === "object" && (data as { exists?: unknown }).exists === false) {
      throw new NotFoundError(`nothing at ${p}`, { code: "not_found", status: 404 });
    }
    return parseEntry(data);
  }

  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  async mkdir(path: string, opts: { parents?: boolean; user?: string } = {}): Promise<void> {
    const p = checkPath(path);
    await this.#sbx.http.request("POST", this.#url("/files:mkdir"), { query: withUser({}, opts.user), json: { path: p, parents: opts.parents ?? true } });
  }

  /** Remove a file, an empty directory, or with `recursive: true` a whole tree. */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    const p = checkPath(path);
    await this.#sbx.http.request("POST", this.#url("/files:remove"), { json: { path: p, recursive: opts.recursive ?? false } });
  }

  async rename(src: string, dst: string, opts: { user?: string } = {}): Promise<void> {
    const s = checkPath(src, "src");
    const d = checkPath(dst, "dst");
    await this.#sbx.http.request("POST", this.#url("/files:rename"), { query: withUser({}, opts.user), json: { from: s, to: d } });
  }

  /**
   * A signed link anyone can open without a key to download `path` (with `archive: true` a directory, as .tar.gz).
   * It lives `expiresInSeconds` (1 s to 7 days; an hour when left out); `oneTime` makes its first use its only one.
   */
  async downloadUrl(path: string, opts: { expiresInSeconds?: number; filename?: string; wake?: boolean; archive?: boolean; oneTime?: boolean } = {}): Promise<FileLink> {
    const p = checkPath(path);
    return this.#sbx.http.request<FileLink>("POST", this.#url("/files:link"), { json: dropUndefined({ path: p, method: "GET", ...opts }) });
  }

  /** A signed link anyone can PUT a raw body to without a key, writing `path` atomically; `maxBytes` bounds the body. */
  async uploadUrl(path: string, opts: { expiresInSeconds?: number; maxBytes?: number; wake?: boolean; oneTime?: boolean } = {}): Promise<FileLink> {
    const p = checkPath(path);
    return this.#sbx.http.request<FileLink>("POST", this.#url("/files:link"), { json: dropUndefined({ path: p, method: "PUT", ...opts }) });
  }

  /** Ends every download and upload link made for this sandbox so far. */
  async revokeLinks(): Promise<{ sandboxId: string; revoked: boolean; revokedAt: string }> {
    return this.#sbx.http.request("POST", this.#url("/files:revoke-links"), { json: {} });
  }
}

/** A shared port (docs/api.md, "Previews"): open `urlWithToken` in a browser, or send `token` as the `x-runtime-preview-token` header. */
export interface Preview {
  sandboxId: string;
  port: number;
  visibility: "private" | "public";
  url: string;
  token: string | null;
  tokenExpiresAt: string | null;
  urlWithToken: string;
  expiresAt: string | null;
  createdAt: string;
  embedOrigins: string[];
}

/** Ports of one sandbox shared at `http://PORT-SANDBOX.DOMAIN`, with the published client's names. */
export class Previews {
  readonly #sbx: Sandbox;
  constructor(sbx: Sandbox) {
    this.#sbx = sbx;
  }

  #url(suffix = ""): string {
    return sandboxPath(this.#sbx.id, `/previews${suffix}`);
  }

  static #port(port: number): number {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new InvalidRequestError("port must be 1 to 65535");
    return port;
  }

  /**
   * Shares `port`, or changes the visibility and end of the preview already there. `visibility` is
   * "private" (the default: a token is needed) or "public"; `ttlSeconds` and `expiresAt` end the preview.
   * `embedOrigins` names the only sites that may show it in a frame (`["https://app.example.com",
   * "https://*.example.com"]`, up to 16); `[]` is any site, the default; left out, a shared port keeps its list.
   */
  async create(port: number, opts: { visibility?: "private" | "public"; ttlSeconds?: number; expiresAt?: string; embedOrigins?: string[] } = {}): Promise<Preview> {
    return this.#sbx.http.request<Preview>("POST", this.#url(), { json: dropUndefined({ port: Previews.#port(port), ...opts }) });
  }

  /** Every shared port, each private one with a fresh token. */
  async list(): Promise<Preview[]> {
    return (await this.#sbx.http.request<{ data: Preview[] }>("GET", this.#url())).data;
  }

  /** The preview of `port`, its token ending no later than asked. */
  async get(port: number, opts: { ttlSeconds?: number; expiresAt?: string } = {}): Promise<Preview> {
    const query: Record<string, string> = {};
    if (opts.ttlSeconds !== undefined) query.ttlSeconds = String(opts.ttlSeconds);
    if (opts.expiresAt !== undefined) query.expiresAt = opts.expiresAt;
    return this.#sbx.http.request<Preview>("GET", this.#url(`/${Previews.#port(port)}`), { query });
  }

  /** Refuses every token made for `port` so far, closes its connections, and returns a new one. */
  async rotate(port: number): Promise<Preview> {
    return this.#sbx.http.request<Preview>("POST", this.#url(`/${Previews.#port(port)}:rotate`), { json: {} });
  }

  /** Stops sharing `port`; its open connections are closed before this resolves. */
  async delete(port: number): Promise<{ sandboxId: string; port: number; deleted: boolean }> {
    return this.#sbx.http.request("DELETE", this.#url(`/${Previews.#port(port)}`));
  }
}

/** A signed file link (docs/api.md, "File links"): `url` opens without a key until `expiresAt`. */
export interface FileLink {
  url: string;
  id: string;
  sandboxId: string;
  method: "GET" | "PUT";
  path: string;
  expiresAt: string;
  expiresInSeconds: number;
  oneTime: boolean;
  wake: boolean;
  archive: boolean;
  maxBytes?: number;
  filename?: string;
}

/** A sandbox's egress policy as last answered; `set()` replaces it. */
export class Network {
  readonly internet: boolean;
  readonly allow: string[];
  readonly deny: string[];
  readonly #sbx: Sandbox;

  constructor(sbx: Sandbox, data: NetworkPolicy) {
    this.#sbx = sbx;
    this.internet = data.internet === true;
    this.allow = Array.isArray(data.allow) ? [...data.allow] : [];
    this.deny = Array.isArray(data.deny) ? [...data.deny] : [];
  }

  /**
   * Replace the policy. `internet: false`: nothing leaves. `internet: true`: any public host on
   * ports 80 and 443, or with `allow` only those hosts. `deny` wins. `allow` alone implies internet.
   */
  async set(p: { internet?: boolean; allow?: string[]; deny?: string[] }): Promise<Network> {
    await this.#sbx.setNetwork(buildNetworkBody(p));
    return this.#sbx.network;
  }

  toJSON(): NetworkPolicy {
    return { internet: this.internet, allow: this.allow, deny: this.deny };
  }
}

const SECRET_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,63}$/;

function secretPath(name: string): string {
  if (typeof name !== "string" || !SECRET_NAME.test(name)) {
    throw new InvalidRequestError("a secret's name is an environment variable name, [A-Za-z_][A-Za-z0-9_]{0,63}");
  }
  return `/v1/egress-secrets/${encodeURIComponent(name)}`;
}

/**
 * The key owner's egress secrets: values the proxy puts in place of a placeholder in requests
 * to the secret's hosts. Sandboxes only ever see the placeholder; values are never returned.
 */
export class Secrets {
  readonly #http: HttpClient;
  constructor(opts: ClientOptions = {}) {
    this.#http = connect(opts);
  }

  async set(name: string, value: string, hosts: string[]): Promise<Record<string, unknown>> {
    const path = secretPath(name);
    if (typeof value !== "string" || !value || Buffer.byteLength(value) > 8192) throw new InvalidRequestError("value must be a string of 1 to 8192 bytes");
    if (/[\r\n\0]/.test(value)) throw new InvalidRequestError("value goes into HTTP headers, so it cannot hold CR, LF or NUL");
    if (!Array.isArray(hosts) || hosts.length === 0 || hosts.length > 64) throw new InvalidRequestError("hosts: name 1 to 64 hosts the value may go to");
    return this.#http.request("PUT", path, { json: { value, hosts } });
  }
  async get(name: string): Promise<Record<string, unknown>> {
    return this.#http.request("GET", secretPath(name));
  }
  async list(): Promise<Record<string, unknown>[]> {
    const data = await this.#http.request<{ secrets?: unknown[] }>("GET", "/v1/egress-secrets");
    return (data?.secrets ?? []).filter((s): s is Record<string, unknown> => typeof s === "object" && s !== null);
  }
  async delete(name: string): Promise<void> {
    await this.#http.request("DELETE", secretPath(name));
  }
  close(): void {
    this.#http.close();
  }
  [Symbol.dispose](): void {
    this.close();
  }
}

export { APIError };
