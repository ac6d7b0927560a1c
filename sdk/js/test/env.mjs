// What the tests are pointed at: the daemon of the integration suite (tests/integration/test_js_sdk.py
// starts it and sets these), the driver to create sandboxes on, and whether only the smoke subset runs.
import { test } from "node:test";

export const BASE_URL = process.env.RUNTIME_BASE_URL ?? "";
export const API_KEY = process.env.RUNTIME_API_KEY ?? "";
export const DRIVER = process.env.RUNTIME_TEST_DRIVER || undefined;
export const SMOKE = process.env.RUNTIME_JS_SMOKE === "1";
/** Seconds a slow driver (gVisor, the microVM under emulation) may need for one step under load. */
export const SLOW = Number(process.env.RUNTIME_TEST_STEP_SECONDS || 240);

const missing = !BASE_URL || !API_KEY;
/** A test that needs the daemon; skipped with the reason when none is given. */
export function daemonTest(name, opts, fn) {
  if (typeof opts === "function") [fn, opts] = [opts, {}];
  return test(name, { timeout: SLOW * 1000, ...opts, skip: missing ? "RUNTIME_BASE_URL and RUNTIME_API_KEY are not set (run through tests/integration/test_js_sdk.py)" : opts.skip }, fn);
}

/** Every test that is not in the smoke subset. */
export function fullTest(name, opts, fn) {
  if (typeof opts === "function") [fn, opts] = [opts, {}];
  return daemonTest(name, { ...opts, skip: SMOKE ? "smoke subset only (RUNTIME_JS_SMOKE=1)" : opts.skip }, fn);
}

/** Waits for a condition, not for a fixed time. */
export async function waitFor(what, cond, seconds = SLOW) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${seconds} s waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
