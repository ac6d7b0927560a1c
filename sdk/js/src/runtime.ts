/**
 * `Runtime`: the calls about the key's owner rather than one sandbox: its lifecycle events,
 * webhooks, OpenTelemetry exports, audit log, usage export and volumes. The Python SDK's `Runtime` with
 * JavaScript names (`rotate_secret` is `rotateSecret`, `usage_export` is `usageExport`); each
 * answers the API's page or object as the daemon sends it (docs/api.md, "Events", "Webhooks",
 * "OpenTelemetry", "Audit", "Keys, limits, usage").
 */
import { InvalidRequestError } from "./errors.js";
import type { HttpClient, Query } from "./http.js";
import { Images } from "./images.js";
import { Mcp } from "./mcp.js";
import { idempotencyHeaders } from "./models.js";
import { connect, type ClientOptions } from "./sandbox.js";

/**
 * A webhook's test and a delivery's retry send to the receiver and wait for its answer (10 s
 * after a connect of up to 5 s); a flush pushes logs and metrics to the collector in turn. The
 * call waits that long whatever a short `httpTimeoutSeconds` says.
 */
const OUTBOUND_TIMEOUT_SECONDS = 60;

type Answer = Record<string, unknown>;

/** The options given, checked against the call's names: an unknown one is a TypeError. */
function options(call: string, opts: object, names: readonly string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(opts)) {
    if (!names.includes(name)) {
      throw new TypeError(`${call}() got an unknown option ${JSON.stringify(name)} (valid: ${names.join(", ") || "none"})`);
    }
    if (value !== undefined && value !== null) out[name] = value;
  }
  return out;
}

function itemPath(collection: string, id: unknown, what: string, suffix = ""): string {
  if (typeof id !== "string" || id === "") throw new InvalidRequestError(`${what} must be a non-empty string`);
  return `${collection}/${encodeURIComponent(id)}${suffix}`;
}

const webhookPath = (id: string, suffix = "") => itemPath("/v1/webhooks", id, "a webhook id", suffix);
const exportPath = (id: string, suffix = "") => itemPath("/v1/otel-exports", id, "an export id", suffix);

/** A time as the API takes it: RFC 3339 UTC text or unix seconds; a Date becomes the text. */
function moment(value: unknown, what: string): string | number {
  if (typeof value === "string" || (typeof value === "number" && Number.isInteger(value))) return value;
  if (value instanceof Date && !Number.isNaN(value.getTime())) return value.toISOString().replace(/\.\d{3}Z$/, "Z");
  throw new InvalidRequestError(`${what} must be RFC 3339 UTC text, unix seconds or a valid Date`);
}

export interface EventsListOptions {
  resourceId?: string;
  /** A type, or a group ending in "." (`"sandbox."`). */
  type?: string;
  cursor?: string;
  /** 1 to 100 (default 50). */
  limit?: number;
}

/** The key owner's lifecycle events (`runtime.events`). */
export class Events {
  readonly #http: HttpClient;
  /** @internal */
  constructor(http: HttpClient) {
    this.#http = http;
  }

  /** One page, newest first: `{data, nextCursor, hasMore}`; pass `nextCursor` back as `cursor`. */
  async list(opts: EventsListOptions = {}): Promise<Answer> {
    const query = options("events.list", opts, ["resourceId", "type", "cursor", "limit"]) as Query;
    return this.#http.request("GET", "/v1/events", { query });
  }
}

export interface WebhookFields {
  url?: string;
  /** Event types or groups (`"snapshot."`); left out, every type. */
  events?: string[];
  description?: string;
}

/** The key owner's webhooks (`runtime.webhooks`); check each delivery with `verifyWebhook`. */
export class Webhooks {
  readonly #http: HttpClient;
  /** @internal */
  constructor(http: HttpClient) {
    this.#http = http;
  }

  /** The webhook with its `secret`, shown this once: keep it. */
  async create(opts: WebhookFields & { url: string; idempotencyKey?: string }): Promise<Answer> {
    const { idempotencyKey, ...fields } = opts;
    const json = options("webhooks.create", fields, ["url", "events", "description"]);
    return this.#http.request("POST", "/v1/webhooks", { json, headers: idempotencyHeaders(idempotencyKey) });
  }
  /** `{data: [webhook, ...]}`, oldest first, never with a secret. */
  async list(): Promise<Answer> {
    return this.#http.request("GET", "/v1/webhooks");
  }
  async get(webhookId: string): Promise<Answer> {
    return this.#http.request("GET", webhookPath(webhookId));
  }
  /** Changes what is given; `enabled: false` stops new deliveries and gives up queued ones. */
  async update(webhookId: string, opts: WebhookFields & { enabled?: boolean }): Promise<Answer> {
    const json = options("webhooks.update", opts, ["url", "events", "description", "enabled"]);
    return this.#http.request("POST", webhookPath(webhookId, ":update"), { json });
  }
  /**
   * A new `secret`, shown once. The old one keeps signing beside it for `keepPreviousSeconds` (a
   * day by default, a week at most; 0 ends it now).
   */
  async rotateSecret(webhookId: string, opts: { keepPreviousSeconds?: number } = {}): Promise<Answer> {
    const json = options("webhooks.rotateSecret", opts, ["keepPreviousSeconds"]);
    return this.#http.request("POST", webhookPath(webhookId, ":rotate-secret"), { json });
  }
  /** `{id, deleted: true}`; its queued deliveries go with it. */
  async delete(webhookId: string): Promise<Answer> {
    return this.#http.request("POST", webhookPath(webhookId, ":delete"), { json: {} });
  }
  /** Sends a signed `webhook.test` event now: `{delivered, responseStatus, error, durationMs}`. */
  async test(webhookId: string): Promise<Answer> {
    return this.#http.request("POST", webhookPath(webhookId, ":test"), { json: {}, timeoutSeconds: OUTBOUND_TIMEOUT_SECONDS });
  }
  /** One page of its deliveries, newest first: `{data, nextCursor, hasMore}`. */
  async deliveries(webhookId: string, opts: { state?: string; cursor?: string; limit?: number } = {}): Promise<Answer> {
    const query = options("webhooks.deliveries", opts, ["state", "cursor", "limit"]) as Query;
    return this.#http.request("GET", webhookPath(webhookId, "/deliveries"), { query });
  }
  /** Sends one delivery again, once, now; resolves the delivery after the attempt. */
  async retry(deliveryId: string): Promise<Answer> {
    const path = itemPath("/v1/webhook-deliveries", deliveryId, "a delivery id", ":retry");
    return this.#http.request("POST", path, { json: {}, timeoutSeconds: OUTBOUND_TIMEOUT_SECONDS });
  }
}

const volumePath = (id: string, suffix = "") => itemPath("/v1/volumes", id, "a volume id", suffix);

/**
 * The key owner's volumes (`runtime.volumes`, docs/volumes.md): disks of a fixed size that
 * outlive sandboxes. A sandbox attaches them at its create: `volumes: [{volumeId, path, readOnly}]`.
 */
export class Volumes {
  readonly #http: HttpClient;
  /** @internal */
  constructor(http: HttpClient) {
    this.#http = http;
  }

  /** A new volume of `sizeMiB` MiB (1024 when left out), ready; `shared` lets many sandboxes write it. */
  async create(sizeMiB?: number, opts: { name?: string; labels?: Record<string, string>; shared?: boolean;
                                         idempotencyKey?: string } = {}): Promise<Answer> {
    const { idempotencyKey, ...fields } = opts;
    const json = { ...options("volumes.create", fields, ["name", "labels", "shared"]),
                   ...(sizeMiB === undefined ? {} : { sizeMiB }) };
    return this.#http.request("POST", "/v1/volumes", { json, headers: idempotencyHeaders(idempotencyKey) });
  }
  async get(volumeId: string): Promise<Answer> {
    return this.#http.request("GET", volumePath(volumeId));
  }
  /** One page, oldest first: `{data, nextCursor}`; pass `nextCursor` back as `cursor`. */
  async list(opts: { name?: string; state?: string; cursor?: string; limit?: number } = {}): Promise<Answer> {
    const query = options("volumes.list", opts, ["name", "state", "cursor", "limit"]) as Query;
    return this.#http.request("GET", "/v1/volumes", { query });
  }
  /** Grows a volume no sandbox holds; a smaller size is refused. */
  async resize(volumeId: string, sizeMiB: number): Promise<Answer> {
    return this.#http.request("POST", volumePath(volumeId, ":resize"), { json: { sizeMiB } });
  }
  /** `{id, deleted: true}`; refused while attached unless `force`. */
  async delete(volumeId: string, opts: { force?: boolean } = {}): Promise<Answer> {
    const json = options("volumes.delete", opts, ["force"]);
    return this.#http.request("POST", volumePath(volumeId, ":delete"), { json });
  }
  /** Attaches the volume to a running sandbox at `path` (every driver; on the microVM a disk put in an empty slot of its guest): the attachment. */
  async attach(volumeId: string, sandboxId: string, path: string, opts: { readOnly?: boolean } = {}): Promise<Answer> {
    const json = { ...options("volumes.attach", opts, ["readOnly"]), sandboxId, path };
    return this.#http.request("POST", volumePath(volumeId, ":attach"), { json });
  }
  /** Unmounts it from the sandbox; refused (409) while a process there uses it. */
  async detach(volumeId: string, attachmentId: string): Promise<Answer> {
    const path = volumePath(volumeId) + itemPath("/attachments", attachmentId, "an attachment id", ":detach");
    return this.#http.request("POST", path, { json: {} });
  }
  async getAttachment(volumeId: string, attachmentId: string): Promise<Answer> {
    return this.#http.request("GET", volumePath(volumeId) + itemPath("/attachments", attachmentId, "an attachment id"));
  }
  /** A copy of the volume as it is now, kept until deleted, or `retentionDays` (1 to 365) days. */
  async backup(volumeId: string, opts: { name?: string; retentionDays?: number } = {}): Promise<Answer> {
    const json = options("volumes.backup", opts, ["name", "retentionDays"]);
    return this.#http.request("POST", volumePath(volumeId, ":backup"), { json });
  }
  /** The daemon's automatic backups of the volume: `daily` on or off, every `everyMinutes` (15 or
   * more) or at the times of a five-field UTC `cron` instead, or back to daily (`noSchedule`); each
   * kept `retentionDays`. `keep` counts (last, hourly, daily, weekly, monthly, yearly) prune the
   * scheduled backups; `noKeep` clears them. What is left out keeps its value. The volume, with
   * its `backupPolicy`. */
  async setBackupPolicy(volumeId: string, opts: { daily?: boolean; retentionDays?: number; everyMinutes?: number;
                                                  cron?: string; keep?: Record<string, number>;
                                                  noSchedule?: boolean; noKeep?: boolean } = {}): Promise<Answer> {
    const { everyMinutes, cron, noSchedule, noKeep, ...fields } = opts;
    if ([everyMinutes !== undefined, cron !== undefined, !!noSchedule].filter(Boolean).length > 1)
      throw new TypeError("volumes.setBackupPolicy: give one of everyMinutes, cron and noSchedule");
    if (fields.keep !== undefined && noKeep)
      throw new TypeError("volumes.setBackupPolicy: give one of keep and noKeep");
    const json: Record<string, unknown> = options("volumes.setBackupPolicy", fields, ["daily", "retentionDays", "keep"]);
    if (everyMinutes !== undefined) json.schedule = { everyMinutes };
    else if (cron !== undefined) json.schedule = { cron };
    else if (noSchedule) json.schedule = null;
    if (noKeep) json.keep = null;
    return this.#http.request("POST", volumePath(volumeId, ":backup-policy"), { json });
  }
  /** One page of backups, newest first: `{data, nextCursor}`. */
  async backups(volumeId?: string, opts: { cursor?: string; limit?: number } = {}): Promise<Answer> {
    const query = { ...options("volumes.backups", opts, ["cursor", "limit"]),
                    ...(volumeId === undefined ? {} : { volumeId }) } as Query;
    return this.#http.request("GET", "/v1/volume-backups", { query });
  }
  async getBackup(backupId: string): Promise<Answer> {
    return this.#http.request("GET", itemPath("/v1/volume-backups", backupId, "a backup id"));
  }
  async deleteBackup(backupId: string): Promise<Answer> {
    return this.#http.request("POST", itemPath("/v1/volume-backups", backupId, "a backup id", ":delete"), { json: {} });
  }
  /** A new volume of the backup's size with its files. */
  async restore(backupId: string, opts: { name?: string } = {}): Promise<Answer> {
    const json = { ...options("volumes.restore", opts, ["name"]), fromBackup: backupId };
    return this.#http.request("POST", "/v1/volumes", { json });
  }
}

export interface OtelFields {
  /** The OTLP/HTTP base URL, as OTEL_EXPORTER_OTLP_ENDPOINT. */
  endpoint?: string;
  /** They authenticate to the collector and are never answered back (`headerNames` lists them). */
  headers?: Record<string, string>;
  /** `"logs"`, `"metrics"` or both (the default). */
  signals?: string[];
}

/** The key owner's OpenTelemetry exports (`runtime.otel`). */
export class Otel {
  readonly #http: HttpClient;
  /** @internal */
  constructor(http: HttpClient) {
    this.#http = http;
  }

  async create(opts: OtelFields & { endpoint: string; idempotencyKey?: string }): Promise<Answer> {
    const { idempotencyKey, ...fields } = opts;
    const json = options("otel.create", fields, ["endpoint", "headers", "signals"]);
    return this.#http.request("POST", "/v1/otel-exports", { json, headers: idempotencyHeaders(idempotencyKey) });
  }
  /** `{data: [export, ...]}`. */
  async list(): Promise<Answer> {
    return this.#http.request("GET", "/v1/otel-exports");
  }
  async get(exportId: string): Promise<Answer> {
    return this.#http.request("GET", exportPath(exportId));
  }
  /** Changes what is given; `headers` replaces them all. */
  async update(exportId: string, opts: OtelFields & { enabled?: boolean }): Promise<Answer> {
    const json = options("otel.update", opts, ["endpoint", "headers", "signals", "enabled"]);
    return this.#http.request("POST", exportPath(exportId, ":update"), { json });
  }
  /** Pushes now instead of at the next interval; resolves the export after the push. */
  async flush(exportId: string): Promise<Answer> {
    return this.#http.request("POST", exportPath(exportId, ":flush"), { json: {}, timeoutSeconds: OUTBOUND_TIMEOUT_SECONDS });
  }
  async delete(exportId: string): Promise<Answer> {
    return this.#http.request("POST", exportPath(exportId, ":delete"), { json: {} });
  }
}

export interface AuditListOptions {
  /** An action (`"sandbox.exec"`) or a group ending in "." (`"sandbox."`). */
  action?: string;
  /** The records of one sandbox. */
  sandboxId?: string;
  /** 1 to 100 (default 50). */
  limit?: number;
  /** The previous page's `next`, for older records. */
  before?: string;
}

/** The key owner's audit log (`runtime.audit`). */
export class Audit {
  readonly #http: HttpClient;
  /** @internal */
  constructor(http: HttpClient) {
    this.#http = http;
  }

  /** One page, newest first: `{events, next, hasMore}`; pass `next` back as `before`. */
  async list(opts: AuditListOptions = {}): Promise<Answer> {
    const query = options("audit.list", opts, ["action", "sandboxId", "limit", "before"]) as Query;
    return this.#http.request("GET", "/v1/audit", { query });
  }
}

/**
 * The calls about the key's owner: `events`, `webhooks`, `otel`, `audit`, `volumes`, `images`, `mcp` and `usageExport`,
 * sharing one connection pool. `close()` (or `using`) releases it.
 */
export class Runtime implements Disposable {
  readonly #http: HttpClient;
  readonly events: Events;
  readonly webhooks: Webhooks;
  readonly otel: Otel;
  readonly audit: Audit;
  readonly volumes: Volumes;
  /** Images built from recipes and Dockerfiles (docs/images.md). */
  readonly images: Images;
  /** The catalog of MCP servers a sandbox can run (docs/mcp.md). */
  readonly mcp: Mcp;

  constructor(opts: ClientOptions = {}) {
    this.#http = connect(opts);
    this.events = new Events(this.#http);
    this.webhooks = new Webhooks(this.#http);
    this.otel = new Otel(this.#http);
    this.audit = new Audit(this.#http);
    this.volumes = new Volumes(this.#http);
    this.images = new Images(this.#http);
    this.mcp = new Mcp(this.#http);
  }

  /**
   * One page of the owner's settled charges that ended at `since` or later and before `until`
   * (RFC 3339 UTC text, unix seconds or a Date): `{csv, rows, nextCursor, hasMore, finalThrough,
   * ...}`. Follow `nextCursor` with the same range until it is null and join each page's `csv`
   * (the header is on the first only); `limit` is 1 to 1000 (100).
   */
  async usageExport(since: string | number | Date, until: string | number | Date,
                    opts: { cursor?: string; limit?: number } = {}): Promise<Answer> {
    const query = { since: moment(since, "since"), until: moment(until, "until"),
                    ...options("usageExport", opts, ["cursor", "limit"]) } as Query;
    return this.#http.request("GET", "/v1/usage/export", { query });
  }

  close(): void {
    this.#http.close();
  }
  [Symbol.dispose](): void {
    this.close();
  }
}
