/**
 * Processes: every streamed exec and every spawn is one, with an id, its output kept by the
 * daemon and read from a cursor (docs/api.md, Processes).
 */
import { APIConnectionError, InvalidRequestError } from "./errors.js";
import type { HttpClient } from "./http.js";
import {
  ExecFold,
  eventEnd,
  parseOutputLine,
  sandboxPath,
  signalName,
  type CommandResult,
  type ExecEvent,
  type SignalName,
} from "./models.js";

/** How long one output request may run; the daemon ends long ones with `continue`. */
export const OUTPUT_READ_TIMEOUT_SECONDS = 600;
/* Bytes per :write request; the API takes at most 1 MiB decoded. */
const WRITE_CHUNK = 512 * 1024;
/* Rounds of :write in a row that the process took nothing from before giving up. */
const WRITE_STALLS = 1200;

/** A process as the API answers it (camelCase names). */
export type ProcessInfo = Record<string, unknown> & {
  id: string;
  state?: string;
  exitCode?: number | null;
  command?: string;
};

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export function processInfo(data: unknown): ProcessInfo {
  if (!isObject(data) || typeof data.id !== "string") throw new APIConnectionError("the daemon's answer is not a process object");
  return data as ProcessInfo;
}

/**
 * Reads a process's output from `cursor`: yields its events, follows `continue` marks on, and
 * throws an `error` event (its sandbox stopped) as its APIError.
 * @internal
 */
export async function* readOutput(
  http: HttpClient,
  sandboxId: string,
  processId: string,
  cursor: number,
  follow: boolean,
  signal?: AbortSignal,
): AsyncGenerator<ExecEvent> {
  for (;;) {
    let resumed = false;
    const lines = http.lines("GET", sandboxPath(sandboxId, `/processes/${encodeURIComponent(processId)}/output`), {
      query: { cursor, follow: follow ? "true" : "false" },
      timeoutSeconds: OUTPUT_READ_TIMEOUT_SECONDS,
      signal,
    });
    for await (const line of lines) {
      const ev = parseOutputLine(line);
      if (ev === null) continue;
      if (ev.type === "continue") {
        cursor = Math.max(cursor, ev.cursor);
        resumed = true;
        break;
      }
      cursor = eventEnd(ev, cursor);
      yield ev;
      if (ev.type === "exit") return;
    }
    if (!resumed) return;
  }
}

/** A process in a sandbox: its output from a cursor, its stdin, signals, its end. */
export class Process {
  readonly sandboxId: string;
  #http: HttpClient;
  #info: ProcessInfo;
  #stdinOffset: number;

  /** @internal Use `sbx.spawn()` or `sbx.process(id)`. */
  constructor(http: HttpClient, sandboxId: string, info: unknown) {
    this.#http = http;
    this.sandboxId = sandboxId;
    this.#info = processInfo(info);
    this.#stdinOffset = Number.isSafeInteger(this.#info.stdinOffset) ? (this.#info.stdinOffset as number) : 0;
  }

  /** The process as the API last answered it. */
  get info(): ProcessInfo {
    return { ...this.#info };
  }
  get id(): string {
    return this.#info.id;
  }
  /** `running`, `exited`, `killed`, `timed_out` or `lost` (its sandbox stopped), as of the last answer. */
  get state(): string | null {
    return typeof this.#info.state === "string" ? this.#info.state : null;
  }
  /** Null while it runs, and when a signal or a timeout ended it. */
  get exitCode(): number | null {
    return Number.isInteger(this.#info.exitCode) ? (this.#info.exitCode as number) : null;
  }
  get command(): string | null {
    return typeof this.#info.command === "string" ? this.#info.command : null;
  }
  /** The process's pid inside the sandbox. */
  get pid(): number | null {
    return Number.isInteger(this.#info.pid) ? (this.#info.pid as number) : null;
  }
  /** True when the answer was a replay of an earlier spawn with the same idempotency key. */
  get replayed(): boolean {
    return this.#info.replayed === true;
  }

  #path(suffix = ""): string {
    return sandboxPath(this.sandboxId, `/processes/${encodeURIComponent(this.id)}${suffix}`);
  }

  /** Reload its state from the daemon. */
  async refresh(): Promise<this> {
    this.#info = processInfo(await this.#http.request("GET", this.#path()));
    return this;
  }

  /**
   * Its output events from `cursor` (bytes of stdout and stderr together): `stdout`, `stderr`
   * (`data`, and `base64` when the bytes are not UTF-8), `truncated` for output the daemon no
   * longer kept, and at the end `exit`. An `error` event (its sandbox stopped) is thrown as its
   * APIError. With `follow` (the default) it waits for the end; without, it stops at what exists.
   */
  output(opts: { cursor?: number; follow?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<ExecEvent> {
    const cursor = opts.cursor ?? 0;
    if (!Number.isSafeInteger(cursor) || cursor < 0) throw new InvalidRequestError("cursor must be a non-negative integer");
    return readOutput(this.#http, this.sandboxId, this.id, cursor, opts.follow ?? true, opts.signal);
  }

  /** Follows the output to its end and resolves it as a CommandResult (its end kept, 1 MiB per stream by default). */
  async wait(opts: { maxOutputBytes?: number; signal?: AbortSignal } = {}): Promise<CommandResult> {
    const fold = new ExecFold(opts.maxOutputBytes);
    fold.processId = this.id;
    fold.pid = this.pid;
    for await (const ev of this.output({ signal: opts.signal })) fold.feed(ev);
    await this.refresh();
    return fold.finish();
  }

  /**
   * Sends input to a process spawned with `stdin: "pipe"`; `eof: true` closes its stdin after.
   * Offsets are tracked, so bytes the process already took are never sent twice.
   */
  async write(data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<void> {
    let payload: Buffer;
    if (typeof data === "string") payload = Buffer.from(data, "utf8");
    else if (data instanceof Uint8Array) payload = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    else throw new InvalidRequestError("data must be a string or a Uint8Array");
    const eof = opts.eof === true;
    let sent = 0;
    let stalls = 0;
    for (;;) {
      const chunk = payload.subarray(sent, sent + WRITE_CHUNK);
      const last = sent + chunk.length === payload.length;
      const reply = await this.#http.request<{ offset?: unknown }>("POST", this.#path(":write"), {
        json: { base64: chunk.toString("base64"), offset: this.#stdinOffset, eof: eof && last },
      });
      const now = reply && Number.isSafeInteger(reply.offset) ? (reply.offset as number) : this.#stdinOffset;
      const took = Math.max(0, Math.min(now - this.#stdinOffset, chunk.length));
      this.#stdinOffset += took;
      sent += took;
      if (sent >= payload.length && (!eof || last)) return;
      if (took === 0) {
        // The process has not read what it was sent yet.
        if (++stalls > WRITE_STALLS) throw new APIConnectionError("the process took no input for a long time", { hint: "is it reading its stdin?" });
        await new Promise((r) => setTimeout(r, 50));
      } else stalls = 0;
    }
  }

  /** Sends `signal` (default SIGTERM) to its whole process group. */
  async kill(signal: SignalName | string | number = "SIGTERM"): Promise<this> {
    const name = signalName(signal);
    this.#info = processInfo(await this.#http.request("POST", this.#path(":signal"), { json: { signal: name } }));
    return this;
  }

  toString(): string {
    return `Process(id=${this.id}, state=${this.state}, exitCode=${this.exitCode})`;
  }
}
