/** The client: `Sandbox`, its `Files` and `Network`, and `Secrets`. */
import { resolveApiKey, resolveEndpoint } from "./config.js";
import { APIConnectionError, APIError, InvalidRequestError, NotFoundError } from "./errors.js";
import { HttpClient, type Body } from "./http.js";
import {
  CREATE_HTTP_TIMEOUT_SECONDS,
  DEFAULT_STREAM_KEEP_BYTES,
  ExecFold,
  buildCreateBody,
  buildExecBody,
  buildNetworkBody,
  checkDepth,
  checkLimit,
  checkPath,
  checkSandboxId,
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

function connect(opts: ClientOptions): HttpClient {
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

  /** @internal Use `Sandbox.create`, `Sandbox.connect` or `Sandbox.list`. */
  constructor(http: HttpClient, data: unknown, keep = true, ownsHttp = true) {
    this.http = http;
    this.#data = sandboxData(data);
    this.#keep = keep;
    this.#ownsHttp = ownsHttp;
    this.files = new Files(this);
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

  /** The caller's sandboxes, newest first. */
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
   * a result (`timedOut: true`, exit code 137), not an error.
   */
  async exec(command: string | readonly string[], opts: ExecOptions = {}): Promise<CommandResult> {
    const stream = opts.onStdout !== undefined || opts.onStderr !== undefined;
    if (!stream) {
      const { body, waitSeconds } = buildExecBody(command, opts, false);
      return parseExecResult(
        await this.http.request("POST", sandboxPath(this.id, ":exec"), { json: body, timeoutSeconds: waitSeconds, signal: opts.signal }),
      );
    }
    const fold = new ExecFold(opts.maxOutputBytes ?? DEFAULT_STREAM_KEEP_BYTES);
    for await (const ev of this.execStream(command, opts)) {
      fold.feed(ev);
      if (ev.type === "stdout") opts.onStdout?.(ev.data);
      else if (ev.type === "stderr") opts.onStderr?.(ev.data);
    }
    return fold.finish();
  }

  /**
   * Run a command and yield the API's events as they happen: `start` (with the process id),
   * `stdout`, `stderr`, `exit`. An `error` event is thrown as its APIError. Leaving the loop
   * early (or aborting `signal`) ends the request, and the daemon kills the command.
   */
  async *execStream(command: string | readonly string[], opts: ExecOptions = {}): AsyncGenerator<ExecEvent> {
    const { body, waitSeconds } = buildExecBody(command, opts, true);
    for await (const line of this.http.lines("POST", sandboxPath(this.id, ":exec"), {
      json: body,
      timeoutSeconds: waitSeconds,
      signal: opts.signal,
    })) {
      const ev = parseExecEvent(line);
      if (ev === null) continue;
      yield ev;
      if (ev.type === "exit") return;
    }
  }

  toString(): string {
    return `Sandbox(id=${this.id}, state=${this.state})`;
  }
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
  async read(path: string, opts: { signal?: AbortSignal } = {}): Promise<Buffer> {
    const p = checkPath(path);
    return this.#sbx.http.request<Buffer>("GET", this.#url("/files/content"), { query: { path: p }, raw: true, signal: opts.signal, timeoutSeconds: 600 });
  }

  /** The file decoded as UTF-8. */
  async readText(path: string): Promise<string> {
    return (await this.read(path)).toString("utf8");
  }

  /** Write a whole file atomically, making parent directories. `mode` is the permission bits (e.g. 0o755). */
  async write(path: string, data: FileData, opts: { mode?: number } = {}): Promise<WriteResult> {
    const p = checkPath(path);
    const query: Record<string, string> = { path: p };
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
    return parseEntry(await this.#sbx.http.request("GET", this.#url("/files/stat"), { query: { path: p } }));
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

  async mkdir(path: string, opts: { parents?: boolean } = {}): Promise<void> {
    const p = checkPath(path);
    await this.#sbx.http.request("POST", this.#url("/files:mkdir"), { json: { path: p, parents: opts.parents ?? true } });
  }

  /** Remove a file, an empty directory, or with `recursive: true` a whole tree. */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    const p = checkPath(path);
    await this.#sbx.http.request("POST", this.#url("/files:remove"), { json: { path: p, recursive: opts.recursive ?? false } });
  }

  async rename(src: string, dst: string): Promise<void> {
    const s = checkPath(src, "src");
    const d = checkPath(dst, "dst");
    await this.#sbx.http.request("POST", this.#url("/files:rename"), { json: { from: s, to: d } });
  }
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
