/**
 * `runtime.images` (docs/images.md): images built from a recipe or from a Dockerfile with small
 * inline files, under the published client's names: `create` queues a build, `build` waits for
 * it (each log line to `onLog`), `get`, `logs` and `delete`. A context folder's upload is the
 * Python SDK's and the CLI's (`runtime image build`).
 */
import { APIError, InvalidRequestError } from "./errors.js";
import type { HttpClient } from "./http.js";
import { idempotencyHeaders } from "./models.js";

type Answer = Record<string, unknown>;

/** An inline file as the wire takes it. */
export interface InlineFile {
  path: string;
  content: string;
  encoding?: "base64" | "utf-8";
  mode?: number;
}
/** Inline files: `{path: text or bytes}` (bytes sent in base64) or the wire's list. */
export type Files = InlineFile[] | Record<string, string | Uint8Array>;

/** A recipe: the daemon makes a Dockerfile of it (docs/images.md, "Recipes and inline files"). */
export interface Recipe {
  base?: string;
  env?: Record<string, string>;
  workdir?: string;
  apt?: string[];
  files?: Files;
  pip?: string[];
  npm?: string[];
  commands?: string[];
  /** `root` or `sandbox`: who the image's sandboxes run as (the lines above run as root). */
  user?: "root" | "sandbox";
}

export interface ImageCreateOptions {
  /** Exactly one of dockerfile, image and recipe. */
  dockerfile?: string;
  image?: string;
  recipe?: Recipe;
  /** With a dockerfile: its context, small and inline. */
  files?: Files;
  name?: string;
  tags?: string[];
  labels?: Record<string, string>;
  buildArgs?: Record<string, string>;
  env?: Record<string, string>;
  target?: string;
  cache?: boolean;
  build?: { vcpu?: number; memoryMiB?: number; diskMiB?: number; timeoutSeconds?: number };
  start?: Record<string, unknown> | null;
  /** Build secrets, {id: value}: what a `RUN --mount=type=secret,id=...` reads while that step
   * runs; kept nowhere, and not in the cache's keys. */
  secrets?: Record<string, string>;
  idempotencyKey?: string;
}

const NAMES = ["dockerfile", "image", "recipe", "files", "name", "tags", "labels", "buildArgs", "env", "target",
               "cache", "build", "start", "secrets"];

/** Inline files as the wire's list: bytes as base64, text as it is. */
export function inlineFiles(files: Files): InlineFile[] {
  if (Array.isArray(files)) return files;
  return Object.entries(files).map(([path, content]) =>
    typeof content === "string"
      ? { path, content }
      : { path, content: Buffer.from(content).toString("base64"), encoding: "base64" as const });
}

function imagePath(id: unknown, suffix = ""): string {
  if (typeof id !== "string" || id === "") throw new InvalidRequestError("an image id must be a non-empty string");
  return `/v1/images/${encodeURIComponent(id)}${suffix}`;
}

/** The key owner's images (`runtime.images`). */
export class Images {
  readonly #http: HttpClient;
  /** @internal */
  constructor(http: HttpClient) {
    this.#http = http;
  }

  /** Queues a build; resolves the image, state `queued`. */
  async create(opts: ImageCreateOptions): Promise<Answer> {
    const { idempotencyKey, ...fields } = opts;
    const json: Record<string, unknown> = {};
    for (const [name, value] of Object.entries(fields)) {
      if (!NAMES.includes(name)) {
        throw new TypeError(`images.create() got an unknown option ${JSON.stringify(name)} (valid: ${NAMES.join(", ")})`);
      }
      if (value !== undefined) json[name] = value;
    }
    if ([json.dockerfile, json.image, json.recipe].filter((v) => v !== undefined && v !== null).length !== 1) {
      throw new InvalidRequestError("give dockerfile, image or recipe, one of them");
    }
    if (json.files !== undefined) json.files = inlineFiles(json.files as Files);
    const recipe = json.recipe as Recipe | undefined;
    if (recipe?.files !== undefined) json.recipe = { ...recipe, files: inlineFiles(recipe.files) };
    return this.#http.request("POST", "/v1/images", { json, headers: idempotencyHeaders(idempotencyKey) });
  }
  async get(imageId: string): Promise<Answer> {
    return this.#http.request("GET", imagePath(imageId));
  }
  /** `{lines, nextAfter, done}`: the log's lines after seq `after`. */
  async logs(imageId: string, after = 0): Promise<Answer> {
    return this.#http.request("GET", imagePath(imageId, "/logs"), { query: { after } });
  }
  async delete(imageId: string): Promise<Answer> {
    return this.#http.request("POST", imagePath(imageId, ":delete"), { json: {} });
  }
  /**
   * Builds and waits for its end, each log line to `onLog`; resolves the ready image. A failed
   * build rejects with code `image_build_failed` and the build's error.
   */
  async build(opts: ImageCreateOptions & { onLog?: (line: Answer) => void; pollSeconds?: number }): Promise<Answer> {
    const { onLog, pollSeconds = 0.5, ...fields } = opts;
    let image = await this.create(fields);
    let after = 0;
    for (;;) {
      const page = await this.logs(image.id as string, after);
      const lines = page.lines as Answer[];
      for (const line of lines) onLog?.(line);
      after = page.nextAfter as number;
      if (page.done) break;
      if (!lines.length) await new Promise((r) => setTimeout(r, pollSeconds * 1000));
    }
    image = await this.get(image.id as string);
    if (image.state !== "ready") {
      throw new APIError(`image ${image.id} ${image.state}: ${image.error ?? "no error given"}`,
                         { code: "image_build_failed", status: 422, hint: "read the whole log with runtime.images.logs(id)" });
    }
    return image;
  }
}
