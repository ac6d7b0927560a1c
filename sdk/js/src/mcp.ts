/**
 * `runtime.mcp` and `sbx.mcp`: the catalog of MCP servers and the servers running inside a
 * sandbox (docs/mcp.md, "Inside a sandbox"), with the names of the Python SDK and the published
 * client in this SDK's casing.
 *
 *     const catalog = await runtime.mcp.catalog();
 *     await sbx.mcp.start([{ id: "filesystem" }]);
 *     const gw = await sbx.mcp.ready();                 // no server still "installing"
 *     const { url } = gw.servers[0];                     // connect with gw.headers
 *
 * The daemon checks every field (catalog ids, secrets, the port); what it refuses is thrown as
 * the SDK's APIError classes: `InvalidRequestError`, `NotFoundError` for an id not in the
 * catalog, `ConflictError` for servers running already without `replace`.
 */
import { APIConnectionError } from "./errors.js";
import type { HttpClient } from "./http.js";
import { sandboxPath } from "./models.js";

/* A start answers once each server runs or failed: the daemon waits up to 40 s for them. */
const START_HTTP_SECONDS = 120;

/** A server of the catalog (`GET /v1/mcp/catalog`). */
export interface McpCatalogEntry {
  id: string;
  description: string;
  transport: string;
  package: string;
  /** The environment names it takes secrets in. */
  secrets: string[];
  inImage: boolean;
  image: string;
  [k: string]: unknown;
}

/** One server a start asks for: a catalog `id`, and its secrets as `{ENV: SECRET_NAME}`. */
export interface McpServerSpec {
  id: string;
  secrets?: Record<string, string>;
}

/** A running (or failed) server and the URL it is served at. */
export interface McpServer {
  id: string;
  status: "installing" | "running" | "failed" | string;
  url: string;
  transport: string;
  error: string | null;
  /** How often its gateway was started again after it exited (at most 5). */
  restarts?: number;
  [k: string]: unknown;
}

/** What `start`, `get` and `ready` answer; send `headers` with every request to a `url`. */
export interface McpGateway {
  running: boolean;
  port?: number;
  public: boolean;
  servers: McpServer[];
  headers: Record<string, string>;
  [k: string]: unknown;
}

/** The catalog of the MCP servers a sandbox can run (`runtime.mcp`). */
export class Mcp {
  readonly #http: HttpClient;
  /** @internal */
  constructor(http: HttpClient) {
    this.#http = http;
  }

  async catalog(): Promise<McpCatalogEntry[]> {
    const out = await this.#http.request<{ data?: unknown }>("GET", "/v1/mcp/catalog");
    if (!out || !Array.isArray(out.data)) throw new APIConnectionError("the daemon's answer is not a list of MCP servers");
    return out.data as McpCatalogEntry[];
  }
}

/** Catalog MCP servers inside the sandbox, behind one gateway, at URLs an MCP client connects to. */
export class SandboxMcp {
  readonly #http: HttpClient;
  readonly #path: string;

  /** @internal */
  constructor(http: HttpClient, sandboxId: string) {
    this.#http = http;
    this.#path = sandboxPath(sandboxId, "/mcp");
  }

  /**
   * Starts the gateway with `servers` (1 to 8) on `port` of the sandbox's loopback (8811);
   * resolves once each runs or failed (one still starting reads `installing`). Servers running
   * already are a ConflictError unless `replace: true`. `public: true` (URLs guarded by the header
   * alone) is not offered by this daemon: it answers 501 `not_implemented`.
   */
  async start(servers: readonly McpServerSpec[], opts: { port?: number; replace?: boolean; public?: boolean } = {}): Promise<McpGateway> {
    const json: Record<string, unknown> = { servers: servers.map((s) => ({ ...s })) };
    if (opts.port !== undefined) json.port = opts.port;
    if (opts.replace) json.replace = true;
    if (opts.public) json.public = true;
    return this.#http.request<McpGateway>("POST", this.#path, { json, timeoutSeconds: START_HTTP_SECONDS });
  }

  /** The servers' state, with fresh URLs and `headers` (a new preview token each time). */
  async get(): Promise<McpGateway> {
    return this.#http.request<McpGateway>("GET", this.#path);
  }

  /**
   * Reads the state every `intervalSeconds` (2) until no server is `installing`, or for
   * `timeoutSeconds` (600); resolves to the last state read (check each server's `status`).
   */
  async ready(opts: { timeoutSeconds?: number; intervalSeconds?: number } = {}): Promise<McpGateway> {
    const deadline = Date.now() + (opts.timeoutSeconds ?? 600) * 1000;
    for (;;) {
      const state = await this.get();
      const servers = Array.isArray(state?.servers) ? state.servers : [];
      if (!state?.running || servers.every((s) => s.status !== "installing") || Date.now() >= deadline) return state;
      await new Promise((r) => setTimeout(r, (opts.intervalSeconds ?? 2) * 1000));
    }
  }

  /** Ends the gateway and every server; false when none ran. */
  async stop(): Promise<boolean> {
    const out = await this.#http.request<{ stopped?: unknown }>("DELETE", this.#path, { timeoutSeconds: START_HTTP_SECONDS });
    return out?.stopped === true;
  }
}
