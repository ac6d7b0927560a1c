/**
 * `sbx.browser` and `sbx.desktop`: Chromium and an X desktop in a sandbox of the `desktop` image
 * (docs/computer-use.md), with the names of the Python SDK and the published client in this
 * SDK's casing.
 *
 *     const { cdpUrl } = await sbx.browser.start();          // for a CDP client (Playwright, ...)
 *     const { streamUrl } = await sbx.desktop.start({ width: 1280, height: 800 });
 *     await sbx.desktop.launch(["xterm"]);
 *     await sbx.desktop.type("ls -l\n");
 *     const png = await sbx.desktop.screenshot();
 *
 * The daemon checks every field (points on the screen, key names, text length); what it refuses
 * is thrown as `InvalidRequestError`, a desktop not started as `ConflictError`.
 */
import { APIConnectionError, InvalidRequestError } from "./errors.js";
import type { HttpClient } from "./http.js";
import { dropUndefined, sandboxPath } from "./models.js";

/* A start runs the X server or Chromium in the sandbox (the daemon waits up to 60 s for it); an
 * action, a screenshot and a recording's stop up to 30 s. These cover the daemon's wait with room
 * for a loaded host; typing is bounded by the daemon at 120 s. */
const START_HTTP_SECONDS = 120;
const ACT_HTTP_SECONDS = 180;
/* A screenshot of the largest screen (3840x2160) as PNG stays well under this. */
const SCREENSHOT_MAX_BYTES = 64 * 1024 * 1024;
/* A recording's file never passes maxMiB, at most 1024 MiB. */
const VIDEO_MAX_BYTES = 1025 * 1024 * 1024;
const VIDEO_HTTP_SECONDS = 600;

/* Recording ids are `rec_` and hex; anything else could walk the URL's path. */
const RECORDING_ID = /^rec_[0-9a-f]{1,64}$/;

/** What `browser.start` and `browser.get` answer. */
export interface BrowserInfo {
  running: boolean;
  headless?: boolean;
  /** `ws://9222-sbx-HEX.DOMAIN[:PORT]/devtools/browser/UUID?runtime_preview_token=...`, or null when it is not running. */
  cdpUrl: string | null;
  /** The live view (noVNC) when the browser is shown on the desktop, else null. */
  streamUrl: string | null;
  width?: number;
  height?: number;
  [k: string]: unknown;
}

/** What `desktop.start` answers. */
export interface DesktopInfo {
  running: boolean;
  width: number;
  height: number;
  display: string;
  /** The live view: noVNC's page on the preview listener, with its token; null without a listener. */
  streamUrl: string | null;
  [k: string]: unknown;
}

/** A window as `desktop.windows()` lists it. */
export interface DesktopWindow {
  id: string;
  title: string;
  pid: number;
  x: number;
  y: number;
  width: number;
  height: number;
  focused: boolean;
}

/** A screen recording (`rec_...`); `state` is `recording` or `done`. */
export interface Recording {
  id: string;
  state: "recording" | "done" | string;
  fps: number;
  maxSeconds: number;
  maxMiB: number;
  startedAt: string;
  sizeBytes: number;
  [k: string]: unknown;
}

export type MouseButton = "left" | "middle" | "right";

/** One action of `POST .../desktop:act` (docs/computer-use.md, "The desktop's actions"). */
export type DesktopAction =
  | { action: "move"; x: number; y: number }
  | { action: "click"; x?: number; y?: number; button?: MouseButton; double?: boolean }
  | { action: "mouseDown" | "mouseUp"; button?: MouseButton }
  | { action: "drag"; from: [number, number]; to: [number, number] }
  | { action: "scroll"; dy: number; dx?: number; x?: number; y?: number }
  | { action: "type"; text: string; delayMs?: number }
  | { action: "key"; keys: string }
  | { action: "cursor" }
  | { action: "windows" }
  | { action: "focus"; windowId: string }
  | { action: "open"; url: string }
  | { action: "launch"; argv: string[] };

/** What most actions answer. */
export type ActResult = { ok: boolean; [k: string]: unknown };

function checkRecordingId(id: unknown): string {
  if (typeof id !== "string" || !RECORDING_ID.test(id)) {
    throw new InvalidRequestError(`${JSON.stringify(String(id)).slice(0, 80)} is not a recording id`, {
      hint: "recording ids look like rec_0123456789abcdef0123",
    });
  }
  return id;
}

/** Chromium in the sandbox. `start` answers a `cdpUrl` for a CDP client, private to its token. */
export class Browser {
  readonly #http: HttpClient;
  readonly #base: string;

  /** @internal */
  constructor(http: HttpClient, sandboxId: string) {
    this.#http = http;
    this.#base = sandboxPath(sandboxId, "/browser");
  }

  /**
   * Starts Chromium, or answers the one running. `headless: false` shows it on the desktop (and
   * answers its live view as `streamUrl`); `width` and `height` are its window's, 64x64 to 3840x2160.
   */
  async start(opts: { headless?: boolean; width?: number; height?: number } = {}): Promise<BrowserInfo> {
    const body = dropUndefined({ headless: opts.headless, width: opts.width, height: opts.height });
    return this.#http.request<BrowserInfo>("POST", `${this.#base}:start`, { json: body, timeoutSeconds: START_HTTP_SECONDS });
  }

  /** Whether it runs, and a fresh `cdpUrl` when it does. */
  async get(): Promise<BrowserInfo> {
    return this.#http.request<BrowserInfo>("GET", this.#base);
  }

  /** Stops it; false when it was not running. */
  async stop(): Promise<boolean> {
    const out = await this.#http.request<{ stopped?: unknown }>("POST", `${this.#base}:stop`, { json: {}, timeoutSeconds: START_HTTP_SECONDS });
    return out?.stopped === true;
  }
}

/** The desktop's screen to MP4, one recording at a time per sandbox (`sbx.desktop.recordings`). */
export class DesktopRecordings {
  readonly #http: HttpClient;
  readonly #base: string;

  /** @internal */
  constructor(http: HttpClient, sandboxId: string) {
    this.#http = http;
    this.#base = sandboxPath(sandboxId, "/desktop/recordings");
  }

  #url(id: string, suffix = ""): string {
    return `${this.#base}/${encodeURIComponent(checkRecordingId(id))}${suffix}`;
  }

  /**
   * Starts recording: `fps` 1..30 (10), `maxSeconds` 1..3600 (300), `maxMiB` 1..1024 (100, lowered
   * to the sandbox's free disk), `crf` 0..51 (28). A second start while one records is a ConflictError.
   */
  async start(opts: { fps?: number; maxSeconds?: number; maxMiB?: number; crf?: number } = {}): Promise<Recording> {
    const body = dropUndefined({ fps: opts.fps, maxSeconds: opts.maxSeconds, maxMiB: opts.maxMiB, crf: opts.crf });
    return this.#http.request<Recording>("POST", this.#base, { json: body, timeoutSeconds: ACT_HTTP_SECONDS });
  }

  /** Stops it; resolves once the file is whole. */
  async stop(recordingId: string): Promise<Recording> {
    return this.#http.request<Recording>("POST", this.#url(recordingId, ":stop"), { json: {}, timeoutSeconds: ACT_HTTP_SECONDS });
  }

  async get(recordingId: string): Promise<Recording> {
    return this.#http.request<Recording>("GET", this.#url(recordingId));
  }

  async list(): Promise<Recording[]> {
    const out = await this.#http.request<{ data?: unknown }>("GET", this.#base);
    if (!out || !Array.isArray(out.data)) throw new APIConnectionError("the daemon's answer is not a list of recordings");
    return out.data as Recording[];
  }

  /** The MP4's bytes; a ConflictError while it still records. */
  async download(recordingId: string): Promise<Buffer> {
    return this.#http.request<Buffer>("GET", this.#url(recordingId, "/video"), {
      raw: true,
      maxBytes: VIDEO_MAX_BYTES,
      timeoutSeconds: VIDEO_HTTP_SECONDS,
    });
  }

  async delete(recordingId: string): Promise<boolean> {
    const out = await this.#http.request<{ deleted?: unknown }>("DELETE", this.#url(recordingId));
    return out?.deleted === true;
  }
}

/** The sandbox's X desktop, driven as a person would: start, actions, screenshots, recordings. */
export class Desktop {
  readonly #http: HttpClient;
  readonly #base: string;
  /** The screen to MP4. */
  readonly recordings: DesktopRecordings;

  /** @internal */
  constructor(http: HttpClient, sandboxId: string) {
    this.#http = http;
    this.#base = sandboxPath(sandboxId, "/desktop");
    this.recordings = new DesktopRecordings(http, sandboxId);
  }

  /** Starts Xvfb and the window manager (1280x800 by default); a running desktop keeps its size. */
  async start(opts: { width?: number; height?: number } = {}): Promise<DesktopInfo> {
    const body = dropUndefined({ width: opts.width, height: opts.height });
    return this.#http.request<DesktopInfo>("POST", `${this.#base}:start`, { json: body, timeoutSeconds: START_HTTP_SECONDS });
  }

  /** Stops the desktop, and a browser shown on it: `{stopped, running: false}`. */
  async stop(): Promise<{ stopped: boolean; running: boolean }> {
    return this.#http.request("POST", `${this.#base}:stop`, { json: {}, timeoutSeconds: START_HTTP_SECONDS });
  }

  /** The whole screen as PNG, or as JPEG with `format: "jpeg"` (`quality` 1..100). */
  async screenshot(opts: { format?: "png" | "jpeg"; quality?: number } = {}): Promise<Buffer> {
    return this.#http.request<Buffer>("GET", `${this.#base}/screenshot`, {
      query: { format: opts.format ?? "png", quality: opts.quality },
      raw: true,
      maxBytes: SCREENSHOT_MAX_BYTES,
      timeoutSeconds: ACT_HTTP_SECONDS,
    });
  }

  /** One action as the API takes it; the methods below build each kind. */
  async act<T = ActResult>(action: DesktopAction): Promise<T> {
    return this.#http.request<T>("POST", `${this.#base}:act`, { json: action, timeoutSeconds: ACT_HTTP_SECONDS });
  }

  async move(x: number, y: number): Promise<ActResult> {
    return this.act({ action: "move", x, y });
  }

  /** Clicks where given, or where the pointer is. */
  async click(x?: number, y?: number, opts: { button?: MouseButton; double?: boolean } = {}): Promise<ActResult> {
    const at = x !== undefined && y !== undefined ? { x, y } : {};
    return this.act({ action: "click", ...at, button: opts.button ?? "left", ...(opts.double ? { double: true } : {}) });
  }

  async doubleClick(x?: number, y?: number): Promise<ActResult> {
    return this.click(x, y, { double: true });
  }

  async rightClick(x?: number, y?: number): Promise<ActResult> {
    return this.click(x, y, { button: "right" });
  }

  async mouseDown(button: MouseButton = "left"): Promise<ActResult> {
    return this.act({ action: "mouseDown", button });
  }

  async mouseUp(button: MouseButton = "left"): Promise<ActResult> {
    return this.act({ action: "mouseUp", button });
  }

  /** Drags with the left button from `start` to `end`, each `[x, y]`. */
  async drag(start: [number, number], end: [number, number]): Promise<ActResult> {
    return this.act({ action: "drag", from: [start[0], start[1]], to: [end[0], end[1]] });
  }

  /** Wheel clicks, -100..100: positive `dy` scrolls down, positive `dx` right; at `x`, `y` when given. */
  async scroll(dy: number, opts: { dx?: number; x?: number; y?: number } = {}): Promise<ActResult> {
    const at = opts.x !== undefined && opts.y !== undefined ? { x: opts.x, y: opts.y } : {};
    return this.act({ action: "scroll", dy, ...(opts.dx ? { dx: opts.dx } : {}), ...at });
  }

  /** Types `text` (up to 4096 bytes), `delayMs` (0..1000, 12 by default) between keys. */
  async type(text: string, opts: { delayMs?: number } = {}): Promise<ActResult> {
    return this.act({ action: "type", text, ...(opts.delayMs !== undefined ? { delayMs: opts.delayMs } : {}) });
  }

  /** X key names as xdotool takes them, space separated: "ctrl+l", "Return", "alt+Tab". */
  async press(keys: string): Promise<ActResult> {
    return this.act({ action: "key", keys });
  }

  /** Where the pointer is. */
  async cursor(): Promise<{ x: number; y: number }> {
    return this.act({ action: "cursor" });
  }

  async windows(): Promise<DesktopWindow[]> {
    const out = await this.act<{ windows?: unknown }>({ action: "windows" });
    if (!out || !Array.isArray(out.windows)) throw new APIConnectionError("the daemon's answer is not a list of windows");
    return out.windows as DesktopWindow[];
  }

  /** Raises and focuses a window by the id `windows()` gives; NotFoundError when there is none. */
  async focus(windowId: string): Promise<ActResult> {
    return this.act({ action: "focus", windowId });
  }

  /** Opens an http(s) or file URL in Chromium on the desktop, or an absolute path with xdg-open. */
  async open(url: string): Promise<ActResult> {
    return this.act({ action: "open", url });
  }

  /** Starts a program on the desktop, detached: `{ok, pid}`. */
  async launch(argv: readonly string[]): Promise<ActResult & { pid: number }> {
    return this.act({ action: "launch", argv: [...argv] });
  }
}
