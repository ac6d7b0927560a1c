/**
 * Checking a webhook delivery (docs/api.md, "A delivery").
 *
 *     import { verifyWebhook } from "withruntime";
 *     const event = verifyWebhook(rawBody, req.headers["runtime-signature"], secret);
 *
 * runtimed signs each delivery with `Runtime-Signature: t=<unix seconds>,v1=<hex>`: the hex
 * HMAC-SHA256, keyed with the webhook's secret (the whole `whsec_...` text), of the stamp, a dot
 * and the body; while a rotation overlaps, a second `v1` made with the previous secret. Pass the
 * body exactly as received, before any JSON parsing: a body parsed and written again is other
 * bytes, and its signature does not match.
 */
import { createHmac, timingSafeEqual } from "node:crypto";

import { InvalidRequestError, WebhookVerificationError } from "./errors.js";

/**
 * How far a signature's stamp may be from now: long enough for a retry's queueing and a clock
 * that is a little off, short enough that a captured delivery cannot be sent again later.
 */
export const DEFAULT_TOLERANCE_SECONDS = 300;
/* A stamp is unix seconds; more digits than this is not one. */
const STAMP = /^[0-9]{1,12}$/;

export interface VerifyWebhookOptions {
  /** Seconds the stamp may be from `now` (default 300). */
  toleranceSeconds?: number;
  /** Unix seconds to judge the stamp against (default: the clock). */
  now?: number;
}

function signatures(header: string | string[] | null | undefined): { stamp: string; given: Buffer[] } {
  if (Array.isArray(header)) header = header.join(",");
  if (!header) throw new WebhookVerificationError("no Runtime-Signature header");
  const stamps: string[] = [];
  const given: Buffer[] = [];
  for (const part of header.split(",")) {
    const at = part.indexOf("=");
    if (at < 0) continue;
    const key = part.slice(0, at).trim();
    const value = part.slice(at + 1).trim();
    if (key === "t") stamps.push(value);
    else if (key === "v1" && value) given.push(Buffer.from(value, "utf8"));
  }
  if (stamps.length !== 1 || !STAMP.test(stamps[0]!) || given.length === 0) {
    throw new WebhookVerificationError("the Runtime-Signature header is not t=<unix seconds>,v1=<hex>");
  }
  return { stamp: stamps[0]!, given };
}

function keys(secret: string | Uint8Array | readonly (string | Uint8Array)[]): Buffer[] {
  const list = typeof secret === "string" || secret instanceof Uint8Array ? [secret] : [...secret];
  if (list.length === 0 || !list.every((s) => (typeof s === "string" || s instanceof Uint8Array) && s.length > 0)) {
    throw new InvalidRequestError("secret must be the webhook's secret (whsec_...), or an array of them");
  }
  return list.map((s) => (typeof s === "string" ? Buffer.from(s, "utf8") : Buffer.from(s)));
}

/**
 * The event a delivery carries, once `header` (its `Runtime-Signature`; Node's
 * `req.headers["runtime-signature"]`) holds a signature of `body` by `secret` (or by any of an
 * array of secrets, as during a rotation) made within `toleranceSeconds` of `now`, which keeps a
 * captured delivery from being accepted again later. Throws `WebhookVerificationError`
 * otherwise. Signatures are compared in constant time.
 */
export function verifyWebhook(
  body: string | Uint8Array,
  header: string | string[] | null | undefined,
  secret: string | Uint8Array | readonly (string | Uint8Array)[],
  opts: VerifyWebhookOptions = {},
): Record<string, unknown> {
  const tolerance = opts.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  if (typeof tolerance !== "number" || !Number.isFinite(tolerance) || tolerance < 0) {
    throw new InvalidRequestError("toleranceSeconds must be a number of seconds, 0 or more");
  }
  let payload: Buffer;
  if (typeof body === "string") payload = Buffer.from(body, "utf8");
  else if (body instanceof Uint8Array) payload = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  else throw new InvalidRequestError("body must be the delivery's bytes or text, as received");
  const secrets = keys(secret);
  const { stamp, given } = signatures(header);
  const signed = Buffer.concat([Buffer.from(stamp + ".", "ascii"), payload]);
  let matched = false;
  // Every pair is compared, a match or not: how long this takes says nothing about the secret.
  for (const key of secrets) {
    const expected = Buffer.from(createHmac("sha256", key).update(signed).digest("hex"), "ascii");
    for (const value of given) {
      // A length is not secret: timingSafeEqual takes equal lengths only.
      const same = value.length === expected.length && timingSafeEqual(value, expected);
      matched = matched || same;
    }
  }
  if (!matched) throw new WebhookVerificationError("no signature in the Runtime-Signature header matches the body and the secret");
  const age = (opts.now ?? Date.now() / 1000) - Number(stamp);
  if (Math.abs(age) > tolerance) {
    const when = age > 0 ? `${Math.floor(age)} s ago` : `${Math.floor(-age)} s in the future`;
    throw new WebhookVerificationError(`the signature was made ${when}, beyond the tolerance of ${tolerance} s: the delivery may be a replay`);
  }
  let event: unknown;
  try {
    event = JSON.parse(payload.toString("utf8"));
  } catch {
    throw new WebhookVerificationError("the delivery's body is not JSON");
  }
  if (typeof event !== "object" || event === null || Array.isArray(event)) {
    throw new WebhookVerificationError("the delivery's body is not an event object");
  }
  return event as Record<string, unknown>;
}
