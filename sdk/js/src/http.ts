/**
 * HTTP plumbing: node:http and node:https directly, so that a unix socket works, redirects are
 * never followed and no proxy from the environment ever sees the key.
 */
import http from "node:http";
import type * as HttpsModule from "node:https";
import { createRequire } from "node:module";
import { Readable } from "node:stream";

import type { Endpoint } from "./config.js";
import {
  APIConnectionError,
  APIError,
  APITimeoutError,
  ConfigurationError,
  errorFromResponse,
} from "./errors.js";
import { VERSION } from "./version.js";

/*
 * node:https, and TLS under it, is loaded on the first client of an https:// daemon: a process
 * that talks to an http:// or unix-socket daemon never pays for it (about 2.5 ms of a start).
 * A builtin loads synchronously through require, so the client's constructor stays synchronous.
 */
const requireBuiltin = createRequire(import.meta.url);
let httpsLoaded: typeof HttpsModule | undefined;
function https(): typeof HttpsModule {
  return (httpsLoaded ??= requireBuiltin("node:https") as typeof HttpsModule);
}

export const DEFAULT_TIMEOUT_SECONDS = 60;
const CONNECT_TIMEOUT_MS = 10_000;
/* An error body is read whole to build the error; a peer that sends more is not our daemon. */
const MAX_ERROR_BODY = 64 * 1024;
/* A JSON answer bigger than this is not one the API gives (listings are bounded well below). */
const MAX_JSON_BODY = 64 * 1024 * 1024;

export type Query = Record<string, string | number | undefined>;
export type Body = Uint8Array | string | AsyncIterable<Uint8Array> | Readable;

export interface RequestOptions {
  query?: Query;
  json?: unknown;
  body?: Body;
  /** Seconds for the whole exchange. */
  timeoutSeconds?: number;
  signal?: AbortSignal;
  /** Resolve with the body's bytes instead of decoded JSON. */
  raw?: boolean;
  /** Largest body accepted with `raw`. */
  maxBytes?: number;
  /** Send no Authorization header (the trial route). */
  anonymous?: boolean;
  /** Extra headers (Idempotency-Key); they cannot replace the ones the client sets. */
  headers?: Record<string, string>;
}

export class HttpClient {
  readonly endpoint: Endpoint;
  readonly #key: string;
  readonly #timeoutSeconds: number;
  readonly #agent: http.Agent;

  constructor(endpoint: Endpoint, apiKey: string, timeoutSeconds?: number) {
    this.endpoint = endpoint;
    this.#key = apiKey;
    this.#timeoutSeconds = timeoutSeconds ?? DEFAULT_TIMEOUT_SECONDS;
    const opts = { keepAlive: true, maxSockets: 16 };
    this.#agent = endpoint.protocol === "https:" ? new (https().Agent)(opts) : new http.Agent(opts);
  }

  /** Release pooled connections. */
  close(): void {
    this.#agent.destroy();
  }

  #path(path: string, query?: Query): string {
    let p = this.endpoint.prefix + path;
    if (query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) if (v !== undefined) q.append(k, String(v));
      const s = q.toString();
      if (s) p += "?" + s;
    }
    return p;
  }

  /** Sends one request; resolves with the response once its head has arrived. */
  open(method: string, path: string, opts: RequestOptions = {}): Promise<{ res: http.IncomingMessage; done: () => void; reason: () => APIError | null }> {
    const ep = this.endpoint;
    const headers: Record<string, string> = {
      ...(opts.headers ?? {}),
      "User-Agent": `withruntime-js/${VERSION}`,
      Accept: "application/json",
    };
    if (!opts.anonymous) headers.Authorization = `Bearer ${this.#key}`;
    let payload: Uint8Array | null = null;
    let stream: AsyncIterable<Uint8Array> | null = null;
    if (opts.json !== undefined) {
      payload = Buffer.from(JSON.stringify(opts.json), "utf8");
      headers["Content-Type"] = "application/json";
    } else if (opts.body !== undefined) {
      headers["Content-Type"] = "application/octet-stream";
      if (typeof opts.body === "string") payload = Buffer.from(opts.body, "utf8");
      else if (opts.body instanceof Uint8Array) payload = opts.body;
      else stream = opts.body;
    }
    if (payload) headers["Content-Length"] = String(payload.byteLength);
    else if (!stream && method !== "GET" && method !== "HEAD") headers["Content-Length"] = "0";
    const timeoutMs = Math.max(1, (opts.timeoutSeconds ?? this.#timeoutSeconds) * 1000);
    const mod = ep.protocol === "https:" ? https() : http;

    return new Promise((resolve, reject) => {
      let settled = false;
      const fail = (err: APIError) => {
        clearTimeout(timer);
        opts.signal?.removeEventListener("abort", onAbort);
        if (!settled) {
          settled = true;
          reject(err);
        }
      };
      const req = mod.request({
        method,
        path: this.#path(path, opts.query),
        headers,
        agent: this.#agent,
        ...(ep.socketPath ? { socketPath: ep.socketPath } : { host: ep.host, port: ep.port }),
      });
      let errorToReport: APIError | null = null;
      const timer = setTimeout(() => {
        errorToReport = new APITimeoutError(
          `the Runtime daemon at ${ep.display} did not answer in time (${Math.round(timeoutMs / 1000)} s)`,
          { hint: "the daemon may be overloaded; retry, or pass a longer timeout" },
        );
        req.destroy(errorToReport);
      }, timeoutMs);
      const connectTimer = setTimeout(() => {
        errorToReport = new APIConnectionError(`cannot connect to the Runtime daemon at ${ep.display}: timed out`, {
          hint: "is runtimed running? Start it, or point RUNTIME_BASE_URL at it",
        });
        req.destroy(errorToReport);
      }, CONNECT_TIMEOUT_MS);
      req.on("socket", (sock) => {
        if (!sock.connecting) clearTimeout(connectTimer);
        else sock.once("connect", () => clearTimeout(connectTimer));
      });
      const onAbort = () => {
        errorToReport = new ConfigurationError("the request was aborted", { code: "aborted" });
        req.destroy(errorToReport);
      };
      if (opts.signal) {
        if (opts.signal.aborted) {
          queueMicrotask(onAbort);
        } else opts.signal.addEventListener("abort", onAbort, { once: true });
      }
      req.on("error", (e: NodeJS.ErrnoException) => {
        clearTimeout(connectTimer);
        fail(errorToReport ?? transportError(ep.display, e));
      });
      req.on("response", (res) => {
        clearTimeout(connectTimer);
        settled = true;
        res.on("error", () => {
          /* reported to the reader of the body */
        });
        resolve({
          res,
          reason: () => errorToReport,
          done: () => {
            clearTimeout(timer);
            opts.signal?.removeEventListener("abort", onAbort);
          },
        });
      });
      if (payload) req.end(payload);
      else if (stream) {
        Readable.from(stream, { objectMode: false })
          .on("error", (e) => req.destroy(e))
          .pipe(req);
      } else req.end();
    });
  }

  /** One request; throws the API's error for a status >= 400. */
  async request<T = unknown>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    const { res, done, reason } = await this.open(method, path, opts);
    try {
      const status = res.statusCode ?? 0;
      if (status >= 400) throw await readError(res);
      if (status >= 300) {
        res.resume();
        throw new APIConnectionError(
          `the daemon at ${this.endpoint.display} answered ${method} ${path} with a redirect (${status}); redirects are not followed`,
          { status },
        );
      }
      const limit = opts.raw ? (opts.maxBytes ?? Number.MAX_SAFE_INTEGER) : MAX_JSON_BODY;
      const data = await readAll(res, limit, this.endpoint.display, reason);
      if (opts.raw) return data as T;
      if (data.length === 0) return null as T;
      try {
        return JSON.parse(data.toString("utf8")) as T;
      } catch {
        throw new APIConnectionError(`the daemon answered ${method} ${path} with a body that is not JSON`, {
          status,
          requestId: header(res, "x-request-id"),
        });
      }
    } finally {
      done();
    }
  }

  /** A request whose answer is NDJSON: yields its lines as they arrive. */
  async *lines(method: string, path: string, opts: RequestOptions = {}): AsyncGenerator<string> {
    const { res, done, reason } = await this.open(method, path, opts);
    try {
      const status = res.statusCode ?? 0;
      if (status >= 400) throw await readError(res);
      if (status >= 300) throw new APIConnectionError(`the daemon answered with a redirect (${status}); redirects are not followed`, { status });
      let pending = "";
      res.setEncoding("utf8");
      try {
        for await (const chunk of res as AsyncIterable<string>) {
          pending += chunk;
          let nl: number;
          while ((nl = pending.indexOf("\n")) >= 0) {
            const line = pending.slice(0, nl);
            pending = pending.slice(nl + 1);
            if (line.trim()) yield line;
          }
        }
      } catch (e) {
        if (e instanceof APIError) throw e;
        throw reason() ?? transportError(this.endpoint.display, e as NodeJS.ErrnoException);
      }
      if (!res.complete) throw reason() ?? new APIConnectionError(`the connection to the Runtime daemon at ${this.endpoint.display} ended mid-answer`);
      if (pending.trim()) yield pending;
    } finally {
      done();
      // Leaving the stream early closes the connection: the daemon then ends the command.
      if (!res.complete) res.destroy();
    }
  }
}

function header(res: http.IncomingMessage, name: string): string | null {
  const v = res.headers[name];
  return typeof v === "string" ? v : null;
}

async function readAll(res: http.IncomingMessage, limit: number, display: string, reason: () => APIError | null): Promise<Buffer> {
  const parts: Buffer[] = [];
  let n = 0;
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      n += chunk.length;
      if (n > limit) {
        res.destroy();
        throw new APIConnectionError(`the daemon's answer is larger than ${limit} bytes`);
      }
      parts.push(chunk);
    }
  } catch (e) {
    if (e instanceof APIError) throw e;
    throw reason() ?? transportError(display, e as NodeJS.ErrnoException);
  }
  if (!res.complete) throw reason() ?? new APIConnectionError(`the connection to the Runtime daemon at ${display} ended mid-answer`);
  return Buffer.concat(parts);
}

async function readError(res: http.IncomingMessage): Promise<APIError> {
  const parts: Buffer[] = [];
  let n = 0;
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      parts.push(chunk);
      n += chunk.length;
      if (n > MAX_ERROR_BODY) break;
    }
  } catch {
    /* what arrived is enough to say what went wrong */
  }
  res.destroy();
  const text = Buffer.concat(parts).subarray(0, MAX_ERROR_BODY).toString("utf8");
  let body: unknown = null;
  try {
    body = JSON.parse(text);
  } catch {
    body = null;
  }
  return errorFromResponse(res.statusCode ?? 0, body, header(res, "x-request-id"), text);
}

function transportError(display: string, e: NodeJS.ErrnoException): APIError {
  if (e instanceof APIError) return e;
  const reason = e.code ?? e.message ?? "error";
  if (e.code === "ECONNREFUSED" || e.code === "ENOENT" || e.code === "EHOSTUNREACH" || e.code === "ENOTFOUND" || e.code === "EACCES") {
    return new APIConnectionError(`cannot connect to the Runtime daemon at ${display}: ${reason}`, {
      hint: "is runtimed running? Start it, or point RUNTIME_BASE_URL at it",
    });
  }
  return new APIConnectionError(`the connection to the Runtime daemon at ${display} failed: ${reason}`, {
    hint: "the daemon may have restarted; retry",
  });
}
