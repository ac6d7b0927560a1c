/**
 * Errors the SDK throws. Every failure the daemon reports has one shape (`code`, `status`,
 * `message`, `hint`, `requestId`); it is thrown as the `APIError` subclass its `code` names.
 * A daemon that cannot be reached throws `APIConnectionError`, naming the address tried.
 */
import type { CommandResult } from "./models.js";

export interface ErrorFields {
  code?: string;
  status?: number | null;
  hint?: string | null;
  requestId?: string | null;
}

export class APIError extends Error {
  static defaultCode = "error";
  /** The API's stable error code (`not_found`, `conflict`, ...). */
  readonly code: string;
  /** The HTTP status, or null when no answer came. */
  readonly status: number | null;
  /** What to do about it, or null. */
  readonly hint: string | null;
  /** The daemon's request id for its log, or null. */
  readonly requestId: string | null;

  constructor(message: string, fields: ErrorFields = {}) {
    super(message);
    this.name = new.target.name;
    this.code = fields.code ?? (new.target as typeof APIError).defaultCode;
    this.status = fields.status ?? null;
    this.hint = fields.hint ?? null;
    this.requestId = fields.requestId ?? null;
  }

  override toString(): string {
    const head = this.status === null ? this.code : `${this.status} ${this.code}`;
    let text = `${this.name}: [${head}] ${this.message}`;
    if (this.hint) text += `\n  hint: ${this.hint}`;
    if (this.requestId) text += `\n  request id: ${this.requestId}`;
    return text;
  }
}

/** The daemon could not be reached (not running, wrong address, connection dropped). */
export class APIConnectionError extends APIError {
  static override defaultCode = "connection_error";
}
/** The daemon did not answer in time. */
export class APITimeoutError extends APIConnectionError {
  static override defaultCode = "timeout";
}
/** The SDK could not find what it needs to talk to the daemon (address or key), or a call was aborted. */
export class ConfigurationError extends APIError {
  static override defaultCode = "configuration_error";
}
/** 400: malformed request, unknown field, value out of range, bad path. */
export class InvalidRequestError extends APIError {
  static override defaultCode = "invalid_request";
}
/** 401: no key, an unknown key or a revoked key. */
export class AuthenticationError extends APIError {
  static override defaultCode = "unauthorized";
}
/** 402: the key's daily spending limit would be passed. */
export class SpendingLimitError extends APIError {
  static override defaultCode = "spending_limit_reached";
}
/** 403: a read-only key on a route that changes or spends. */
export class PermissionDeniedError extends APIError {
  static override defaultCode = "forbidden";
}
/** 404: no such sandbox, file or route. */
export class NotFoundError extends APIError {
  static override defaultCode = "not_found";
}
/** 409: the sandbox is not running, the file exists, the directory is not empty. */
export class ConflictError extends APIError {
  static override defaultCode = "conflict";
}
/** 409: the first lease would cost more than `maxCostMicros`. */
export class BudgetExceededError extends ConflictError {
  static override defaultCode = "budget_exceeded";
}
/** 413: a body over its limit, or the sandbox's disk is full. */
export class PayloadTooLargeError extends APIError {
  static override defaultCode = "payload_too_large";
}
/** 429: too many sandboxes or requests for this key or daemon. */
export class RateLimitError extends APIError {
  static override defaultCode = "rate_limited";
}
/** 500: a bug in the daemon; its log has the details under the request id. */
export class InternalServerError extends APIError {
  static override defaultCode = "internal";
}
/** 503: no driver can run the request, the image is not built, the sandbox failed to start. */
export class UnavailableError extends APIError {
  static override defaultCode = "unavailable";
}

/**
 * A command run with `check: true` exited non-zero or timed out; `result` is its CommandResult.
 * Thrown by the SDK, not answered by the daemon.
 */
export class CommandError extends APIError {
  static override defaultCode = "command_failed";
  readonly result: CommandResult;

  constructor(result: CommandResult) {
    const why = result.timedOut ? "timed out" : `exited with ${result.exitCode}`;
    const tail = result.stderr.slice(-500).trimEnd();
    super(tail ? `the command ${why}: ${tail}` : `the command ${why}`);
    this.result = result;
  }
}

/**
 * A webhook delivery that `verifyWebhook` refused: no signature of the secret matches its body,
 * its signature is older (or newer) than the tolerance, or its header or body is malformed.
 * Thrown by the SDK, never a daemon's answer: `status` is null.
 */
export class WebhookVerificationError extends APIError {
  static override defaultCode = "webhook_verification_failed";
}

type ErrorClass = typeof APIError;

const BY_CODE: Record<string, ErrorClass> = {
  invalid_request: InvalidRequestError,
  unauthorized: AuthenticationError,
  spending_limit_reached: SpendingLimitError,
  forbidden: PermissionDeniedError,
  not_found: NotFoundError,
  budget_exceeded: BudgetExceededError,
  conflict: ConflictError,
  payload_too_large: PayloadTooLargeError,
  rate_limited: RateLimitError,
  internal: InternalServerError,
  unavailable: UnavailableError,
};

const BY_STATUS: Record<number, ErrorClass> = {
  400: InvalidRequestError,
  401: AuthenticationError,
  402: SpendingLimitError,
  403: PermissionDeniedError,
  404: NotFoundError,
  405: InvalidRequestError,
  409: ConflictError,
  413: PayloadTooLargeError,
  429: RateLimitError,
  500: InternalServerError,
  503: UnavailableError,
};

/* A hostile or broken peer could send megabytes of "message"; keep what reaches a log readable. */
const MAX_TEXT = 2000;

function text(value: unknown): string | null {
  if (value === null || value === undefined) return null;
  let s = typeof value === "string" ? value : String(value);
  if (s.length > MAX_TEXT) s = s.slice(0, MAX_TEXT) + "...";
  return s;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * The right `APIError` subclass for an error answer. `body` is the decoded JSON (or null when it
 * was not JSON); `rawText` becomes the message when the body is not in the API's error shape.
 */
export function errorFromResponse(
  status: number,
  body: unknown,
  requestId: string | null = null,
  rawText = "",
): APIError {
  const err = isObject(body) && isObject(body.error) ? body.error : {};
  let code = typeof err.code === "string" ? err.code : null;
  let cls: ErrorClass | undefined = (code && BY_CODE[code]) || BY_STATUS[status];
  if (!cls) cls = status >= 500 ? InternalServerError : APIError;
  const message = text(err.message) || text(rawText.trim()) || `HTTP ${status}`;
  if (code === null) code = cls !== APIError ? cls.defaultCode : `http_${status}`;
  const rid = typeof err.requestId === "string" ? err.requestId : requestId;
  return new cls(message, { code, status, hint: text(err.hint), requestId: rid });
}
