/**
 * Where the daemon is and which key to use: arguments, then the environment, then the daemon's
 * own admin key file on this machine.
 */
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

import { ConfigurationError } from "./errors.js";

export const DEFAULT_BASE_URL = "http://127.0.0.1:7878";
/* Keys are short printable tokens; a key file much longer than one holds no key. */
const MAX_KEY_BYTES = 4096;

/** A resolved daemon address. `socketPath` is set for `unix:` addresses. */
export interface Endpoint {
  protocol: "http:" | "https:";
  host: string;
  port: number;
  /** Path prefix the daemon is mounted under ("" for none). */
  prefix: string;
  socketPath: string | null;
  /** What error messages show: never a key. */
  display: string;
}

/**
 * The daemon's address: `baseUrl`, else `RUNTIME_BASE_URL`, else `RUNTIME_API_URL`, else
 * http://127.0.0.1:7878. `unix:/path` names a unix socket. A URL with credentials, a query or a
 * fragment is refused: a key never travels in a URL.
 */
export function resolveEndpoint(baseUrl?: string | null): Endpoint {
  let raw = baseUrl ?? process.env.RUNTIME_BASE_URL ?? "";
  if (!raw.trim() && baseUrl == null) raw = process.env.RUNTIME_API_URL ?? "";
  raw = raw.trim() || DEFAULT_BASE_URL;
  if (raw.startsWith("unix:")) {
    let path = raw.slice("unix:".length);
    if (path.startsWith("//")) path = path.slice(2);
    if (!path || path.includes("\0")) {
      throw new ConfigurationError(`base URL ${JSON.stringify(raw)} names no socket path`, {
        hint: "use unix:/path/to/runtimed.sock",
      });
    }
    return { protocol: "http:", host: "localhost", port: 80, prefix: "", socketPath: path, display: `unix:${path}` };
  }
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    url = new URL("invalid:");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new ConfigurationError(`base URL ${JSON.stringify(raw.slice(0, 200))} is neither http(s):// nor unix:`, {
      hint: `for example ${DEFAULT_BASE_URL} or unix:/run/runtime/runtimed.sock`,
    });
  }
  if (url.username || url.password || url.search || url.hash || raw.includes("#")) {
    // Do not echo the URL: it may hold a key.
    throw new ConfigurationError("the base URL has credentials, a query or a fragment", {
      hint: "give the key in RUNTIME_API_KEY, never in the URL",
    });
  }
  const port = url.port ? Number(url.port) : url.protocol === "https:" ? 443 : 80;
  const prefix = url.pathname.replace(/\/+$/, "");
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1");
  return {
    protocol: url.protocol,
    host,
    port,
    prefix,
    socketPath: null,
    display: `${url.protocol}//${url.host}${prefix}`,
  };
}

/** The state directory: $RUNTIME_STATE_DIR, /var/lib/runtime for root, else the XDG state dir. */
export function defaultStateDir(): string {
  const env = process.env.RUNTIME_STATE_DIR;
  if (env) return env;
  if (typeof process.geteuid === "function" && process.geteuid() === 0) return "/var/lib/runtime";
  const xdg = process.env.XDG_STATE_HOME;
  if (xdg) return join(xdg, "runtime");
  return join(homedir(), ".local", "state", "runtime");
}

/** A key is 1 to 4096 printable ASCII characters without spaces (it goes into a header). */
export function isValidKey(key: string): boolean {
  return key.length > 0 && key.length <= MAX_KEY_BYTES && /^[\x21-\x7e]+$/.test(key);
}

/** Reads a key file; null when it does not exist. Throws when it exists but holds no key. */
export function readKeyFile(path: string): string | null {
  let data: Buffer;
  try {
    data = readFileSync(path);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return null;
    if (code === "EACCES" || code === "EPERM") {
      throw new ConfigurationError(`no API key: ${path} is not readable by this user`, {
        hint: "export RUNTIME_API_KEY=rt_..., or run as the daemon's user",
      });
    }
    throw new ConfigurationError(`no API key: ${path} could not be read (${code ?? "error"})`, {
      hint: "export RUNTIME_API_KEY=rt_...",
    });
  }
  const key = data.subarray(0, MAX_KEY_BYTES + 1).toString("utf8").trim();
  if (data.length > MAX_KEY_BYTES || !isValidKey(key)) {
    throw new ConfigurationError(`${path} does not hold an API key`, { hint: "export RUNTIME_API_KEY=rt_..." });
  }
  return key;
}

/** The API key: `apiKey`, else `RUNTIME_API_KEY`, else `<state dir>/admin.key`. */
export function resolveApiKey(apiKey?: string | null): string {
  let key = apiKey ?? "";
  if (!key) key = (process.env.RUNTIME_API_KEY ?? "").trim();
  if (key) {
    if (!isValidKey(key)) {
      throw new ConfigurationError("the API key holds characters a key cannot have (spaces, control characters)", {
        hint: "check RUNTIME_API_KEY",
      });
    }
    return key;
  }
  const path = join(defaultStateDir(), "admin.key");
  const fromFile = readKeyFile(path);
  if (fromFile === null) {
    throw new ConfigurationError(`no API key: RUNTIME_API_KEY is not set and ${path} does not exist`, {
      hint: "export RUNTIME_API_KEY=rt_... (the daemon writes its admin key to <state-dir>/admin.key on first start), or set RUNTIME_STATE_DIR",
    });
  }
  return fromFile;
}
