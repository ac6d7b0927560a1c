/**
 * Four LlamaIndex.TS tools that give an agent a sandbox: run a command, read, write and list
 * files. Same names, descriptions and parameters as the Python SDK's `sandbox_tools`.
 *
 * What they return is text written for a model: exit code, stdout, stderr, whether it timed
 * out; long output is cut keeping its end, with a marker saying how much was dropped. Failures
 * (no such file, a timeout, a stopped sandbox, an unreachable daemon) come back as text the
 * model can act on, never as an exception that would end the agent's run.
 */
import { posix } from "node:path";

import { tool, type FunctionTool } from "@llamaindex/core/tools";

import { APIConnectionError, APIError, NotFoundError } from "./errors.js";
import type { CommandResult, FileEntry } from "./models.js";
import type { Sandbox } from "./sandbox.js";

const MAX_KEEP_BYTES = 16 * 1024 * 1024;
const MIN_OUTPUT_CHARS = 200;

export interface SandboxToolsOptions {
  /** Where relative paths resolve (default /workspace). */
  root?: string;
  /** The default and the most a model may ask for one command, in seconds (default 300). */
  timeoutSeconds?: number;
  /** Bound on the text one call returns (default 20000). */
  maxOutputChars?: number;
}

// The tools' JSON values; typed loosely so that the four share one array type.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type SandboxTool = FunctionTool<any, any, object>;

class Settings {
  readonly keepBytes: number;
  constructor(
    readonly root: string,
    readonly timeoutSeconds: number,
    readonly maxOutputChars: number,
  ) {
    // Commands are streamed so every character is counted; only the end is kept, a UTF-8
    // character being at most 4 bytes.
    this.keepBytes = Math.min(MAX_KEEP_BYTES, maxOutputChars * 4);
  }

  resolve(path: unknown): string {
    if (typeof path !== "string" || !path.trim()) throw new Error("path must be a non-empty string");
    if (path.includes("\0")) throw new Error("path contains a NUL byte");
    const p = path.trim();
    return normpath(p.startsWith("/") ? p : posix.join(this.root, p));
  }

  execTimeout(requested: unknown): [number, string] {
    if (requested === undefined || requested === null || requested === "") return [this.timeoutSeconds, ""];
    let seconds = Math.trunc(Number(requested));
    if (!Number.isFinite(seconds)) throw new Error(`timeout_seconds must be a whole number of seconds, not ${JSON.stringify(requested)}`);
    if (seconds < 1) seconds = 1;
    if (seconds > this.timeoutSeconds) return [this.timeoutSeconds, `(timeout_seconds capped at ${this.timeoutSeconds})\n`];
    return [seconds, ""];
  }
}

/** posixpath.normpath: no trailing slash, no "." or ".." left, "/" stays "/". */
function normpath(p: string): string {
  let n = posix.normalize(p);
  if (n.length > 1 && n.endsWith("/")) n = n.slice(0, -1);
  return n;
}

/** The end of `text` within `limit` characters, marked with how much of `total` is not shown. */
function cutKeepEnd(text: string, limit: number, total: number): string {
  let tail = text.length > limit ? text.slice(-limit) : text;
  if (tail.length < total) {
    // Start on a whole line when one begins soon enough.
    const nl = tail.slice(0, 200).indexOf("\n");
    if (nl >= 0 && nl < tail.length - 1) tail = tail.slice(nl + 1);
  }
  const dropped = total - tail.length;
  if (dropped <= 0) return tail;
  return `[... ${dropped} characters cut from the start ...]\n` + tail;
}

/** Share `limit` characters between stdout and stderr; a short one leaves the rest to the other. */
function splitBudget(a: string, b: string, limit: number): [number, number] {
  if (a.length + b.length <= limit) return [a.length, b.length];
  const half = Math.floor(limit / 2);
  if (a.length <= half) return [a.length, limit - a.length];
  if (b.length <= half) return [limit - b.length, b.length];
  return [half, limit - half];
}

function formatExec(r: CommandResult, seen: { stdout: number; stderr: number }, timeout: number, limit: number, note: string): string {
  const [outBudget, errBudget] = splitBudget(r.stdout, r.stderr, limit);
  const section = (name: string, text: string, budget: number, total: number): string => {
    if (!text) return `${name}: (empty)\n`;
    let body = cutKeepEnd(text, budget, Math.max(total, text.length));
    if (!body.endsWith("\n")) body += "\n";
    return `${name}:\n${body}`;
  };
  let head = note;
  if (r.timedOut) {
    head +=
      `timed out: yes, the command was killed after ${timeout} s (exit code ${r.exitCode}). ` +
      "Split the work into shorter steps or run it in the background.\n";
  } else head += `exit code: ${r.exitCode}\n`;
  return (head + section("stdout", r.stdout, outBudget, seen.stdout) + section("stderr", r.stderr, errBudget, seen.stderr)).replace(/\n+$/, "");
}

function formatError(e: unknown, what: string): string {
  if (e instanceof NotFoundError) return `error: ${what}: not found (${e.message})`;
  if (e instanceof APIConnectionError) {
    return `error: ${what}: the sandbox service could not be reached (${e.message}). Retrying later may help.`;
  }
  if (e instanceof APIError) {
    let text = `error: ${what}: ${e.message} (${e.code})`;
    if (e.code === "conflict" && e.message.toLowerCase().includes("running")) {
      text += ". The sandbox is not running, so no command or file operation can work in it; tell the user.";
    } else if (e.hint) text += `. Hint: ${e.hint}`;
    return text;
  }
  return `error: ${what}: ${e instanceof Error ? e.message : String(e)}`;
}

/** A shell word, quoted as Python's shlex.quote does. */
function shquote(s: string): string {
  if (!s) return "''";
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(s)) return s;
  return "'" + s.replace(/'/g, `'"'"'`) + "'";
}

function formatFile(path: string, data: Buffer, size: number, limit: number): string {
  if (data.length === 0) return `(${path} is empty)`;
  if (data.subarray(0, 8192).includes(0)) {
    return (
      `(${path} is a binary file of ${size} bytes, not shown. Inspect it with runtime_exec, ` +
      `e.g. \`file ${shquote(path)}\` or \`xxd ${shquote(path)} | head\`.)`
    );
  }
  let text = data.toString("utf8");
  const shownAll = data.length >= size;
  if ([...text].length <= limit && shownAll) return text;
  text = [...text].slice(0, limit).join("");
  const nextByte = Buffer.byteLength(text, "utf8") + 1;
  return (
    text +
    `\n[... ${path} has ${size} bytes; only the first ${[...text].length} characters are shown. ` +
    `Read further with runtime_exec, e.g. \`tail -c +${nextByte} ${shquote(path)} | head -c ${limit}\`. ...]`
  );
}

function formatList(path: string, entries: FileEntry[], truncated: boolean, depth: number, limit: number): string {
  if (entries.length === 0) return `${path} is empty`;
  const lines = [`${path} (depth ${depth}, ${entries.length} entries${truncated ? ", more not listed" : ""}):`];
  let used = lines[0]!.length;
  const prefix = path.replace(/\/+$/, "") + "/";
  const sorted = [...entries].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  for (let i = 0; i < sorted.length; i++) {
    const e = sorted[i]!;
    const rel = e.path.startsWith(prefix) ? e.path.slice(prefix.length) : e.path;
    let line: string;
    if (e.type === "dir") line = `dir   ${rel}/`;
    else if (e.type === "symlink") line = `link  ${rel} -> ${e.target ?? "?"}`;
    else if (e.type === "file") line = `file  ${rel}  (${e.size} bytes)`;
    else line = `other ${rel}`;
    if (used + line.length + 1 > limit) {
      lines.push(`[... ${sorted.length - i} more entries not shown; list a subdirectory ...]`);
      break;
    }
    lines.push(line);
    used += line.length + 1;
  }
  return lines.join("\n");
}

function clampDepth(depth: unknown): number {
  if (depth === undefined || depth === null) return 1;
  const d = Math.trunc(Number(depth));
  if (!Number.isFinite(d)) throw new Error(`depth must be a whole number from 1 to 10, not ${JSON.stringify(depth)}`);
  return Math.min(10, Math.max(1, d));
}

/** The tools' descriptions and parameter schemas: the Python SDK's, word for word. */
export function toolSpecs(s: { root: string; timeoutSeconds: number }) {
  const optional = (type: string, description: string) => ({ anyOf: [{ type }, { type: "null" }], default: null, description });
  const pathDoc = `Path of the file; a relative path is taken under ${s.root}.`;
  return {
    runtime_exec: {
      description:
        "Run a shell command in the sandbox (a throwaway Linux machine with bash, python3 and\n" +
        "pip) and return its exit code, stdout and stderr.\n\n" +
        `The command runs under bash -c inside the sandbox, in ${s.root} unless cwd says otherwise.\n` +
        "Files written there stay for the life of the sandbox. Long output is cut, keeping its end.",
      parameters: {
        type: "object",
        properties: {
          command: { type: "string", description: 'The shell command to run, for example "python3 analysis.py" or "ls -la".' },
          cwd: optional("string", `Directory to run in; a relative path is taken under ${s.root}. Defaults to ${s.root}.`),
          timeout_seconds: optional(
            "integer",
            `Seconds before the command is killed, at most ${s.timeoutSeconds}. Defaults to ${s.timeoutSeconds}.`,
          ),
        },
        required: ["command"],
      },
    },
    runtime_read_file: {
      description:
        "Read a text file from the sandbox and return its content.\n\n" +
        "Long files are cut, keeping their start; binary files are described, not shown.",
      parameters: { type: "object", properties: { path: { type: "string", description: pathDoc } }, required: ["path"] },
    },
    runtime_write_file: {
      description: "Write a text file in the sandbox, replacing it if it exists and making missing parent directories.",
      parameters: {
        type: "object",
        properties: {
          path: { type: "string", description: pathDoc },
          content: { type: "string", description: "The full text to write into the file." },
        },
        required: ["path", "content"],
      },
    },
    runtime_list_files: {
      description: "List the files and directories under a directory of the sandbox, with their sizes.",
      parameters: {
        type: "object",
        properties: {
          path: {
            type: "string",
            default: ".",
            description: `Directory to list; a relative path is taken under ${s.root}. Defaults to ${s.root} itself.`,
          },
          depth: {
            type: "integer",
            default: 1,
            description: "How many levels to descend, from 1 (only the directory's own entries) to 10.",
          },
        },
      },
    },
  } as const;
}

interface ExecInput {
  command: string;
  cwd?: string | null;
  timeout_seconds?: number | null;
}

/**
 * The four tools for one sandbox, in this order: `runtime_exec`, `runtime_read_file`,
 * `runtime_write_file`, `runtime_list_files`, as LlamaIndex.TS `tool()`s an agent takes as they are.
 */
export function sandboxTools(sbx: Sandbox, opts: SandboxToolsOptions = {}): SandboxTool[] {
  const root = opts.root ?? "/workspace";
  const timeoutSeconds = opts.timeoutSeconds ?? 300;
  const maxOutputChars = opts.maxOutputChars ?? 20000;
  if (typeof root !== "string" || !root.startsWith("/")) throw new Error(`root must be an absolute path, not ${JSON.stringify(root)}`);
  if (!Number.isInteger(timeoutSeconds) || timeoutSeconds < 1 || timeoutSeconds > 86400) {
    throw new Error("timeoutSeconds must be an integer from 1 to 86400");
  }
  if (!Number.isInteger(maxOutputChars) || maxOutputChars < MIN_OUTPUT_CHARS) {
    throw new Error(`maxOutputChars must be an integer of at least ${MIN_OUTPUT_CHARS}`);
  }
  if (!sbx || typeof sbx.exec !== "function" || !sbx.files) throw new TypeError("sandboxTools() needs a Sandbox");
  const s = new Settings(normpath(root), timeoutSeconds, maxOutputChars);
  const spec = toolSpecs(s);

  const runtimeExec = async (input: ExecInput): Promise<string> => {
    try {
      const command = input?.command;
      if (typeof command !== "string" || !command.trim()) return "error: command must be a non-empty string";
      const [timeout, note] = s.execTimeout(input.timeout_seconds);
      const where = input.cwd ? s.resolve(input.cwd) : s.root;
      const seen = { stdout: 0, stderr: 0 };
      const r = await sbx.exec(command, {
        cwd: where,
        timeoutSeconds: timeout,
        onStdout: (d) => (seen.stdout += d.length),
        onStderr: (d) => (seen.stderr += d.length),
        maxOutputBytes: s.keepBytes,
      });
      return formatExec(r, seen, timeout, s.maxOutputChars, note);
    } catch (e) {
      return formatError(e, "running the command");
    }
  };

  const runtimeReadFile = async (input: { path: string }): Promise<string> => {
    try {
      const full = s.resolve(input?.path);
      const st = await sbx.files.stat(full);
      if (st.isDir) return `error: ${full} is a directory; list it with runtime_list_files`;
      const limitBytes = s.maxOutputChars * 4;
      let data: Buffer;
      if (st.size > limitBytes) {
        const r = await sbx.exec(["head", "-c", String(limitBytes), "--", full], { timeoutSeconds: 60, maxOutputBytes: limitBytes });
        if (r.exitCode !== 0) return `error: reading ${full}: ${r.stderr.trim() || "exit code " + r.exitCode}`;
        data = Buffer.from(r.stdout, "utf8");
      } else data = await sbx.files.read(full);
      return formatFile(full, data, Math.max(st.size, data.length), s.maxOutputChars);
    } catch (e) {
      return formatError(e, `reading ${JSON.stringify(input?.path)}`);
    }
  };

  const runtimeWriteFile = async (input: { path: string; content: string }): Promise<string> => {
    try {
      const full = s.resolve(input?.path);
      if (typeof input.content !== "string") return "error: content must be a string";
      const w = await sbx.files.write(full, input.content);
      return `wrote ${w.size} bytes to ${w.path}`;
    } catch (e) {
      return formatError(e, `writing ${JSON.stringify(input?.path)}`);
    }
  };

  const runtimeListFiles = async (input: { path?: string; depth?: number }): Promise<string> => {
    try {
      const full = s.resolve(input?.path || ".");
      const d = clampDepth(input?.depth);
      const entries = await sbx.files.list(full, { depth: d });
      return formatList(full, entries, entries.truncated, d, s.maxOutputChars);
    } catch (e) {
      return formatError(e, `listing ${JSON.stringify(input?.path ?? ".")}`);
    }
  };

  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const make = (name: keyof typeof spec, execute: (input: any) => Promise<string>): SandboxTool =>
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    tool(execute, { name, description: spec[name].description, parameters: spec[name].parameters as any }) as SandboxTool;

  return [
    make("runtime_exec", runtimeExec),
    make("runtime_read_file", runtimeReadFile),
    make("runtime_write_file", runtimeWriteFile),
    make("runtime_list_files", runtimeListFiles),
  ];
}
