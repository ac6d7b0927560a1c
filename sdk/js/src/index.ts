/**
 * withruntime: the TypeScript SDK of Runtime, secure sandboxes for AI agents.
 *
 *     import { Sandbox } from "withruntime";
 *     await using sbx = await Sandbox.create({ timeoutSeconds: 600 });
 *     await sbx.files.write("/workspace/hello.py", "print(6 * 7)");
 *     console.log((await sbx.exec("python3 hello.py")).stdout);
 *
 * The daemon's address and key come from RUNTIME_BASE_URL (or RUNTIME_API_URL) and
 * RUNTIME_API_KEY, or from the daemon's own admin key file on the same machine.
 * `withruntime/tools` turns a sandbox into four LlamaIndex.TS tools.
 */
export { Sandbox, Files, Network, Previews, Secrets } from "./sandbox.js";
export type { ClientOptions, CreateOptions, SandboxData, FileData, FileLink, Preview, ExecStreamOptions, SpawnOptions, MetricsRange } from "./sandbox.js";
export { Runtime, Events, Webhooks, Otel, Audit, Volumes } from "./runtime.js";
export { Images, inlineFiles } from "./images.js";
export type { ImageCreateOptions, InlineFile, Files as InlineFiles, Recipe } from "./images.js";
export type { AuditListOptions, EventsListOptions, OtelFields, WebhookFields } from "./runtime.js";
export { verifyWebhook, DEFAULT_TOLERANCE_SECONDS } from "./webhooks.js";
export type { VerifyWebhookOptions } from "./webhooks.js";
export { Process } from "./process.js";
export type { ProcessInfo } from "./process.js";
export { Interpreter, InterpreterContexts, TABLE_MIME } from "./interpreter.js";
export { Browser, Desktop, DesktopRecordings } from "./computer.js";
export { Mcp, SandboxMcp } from "./mcp.js";
export type { McpCatalogEntry, McpGateway, McpServer, McpServerSpec } from "./mcp.js";
export type { ActResult, BrowserInfo, DesktopAction, DesktopInfo, DesktopWindow, MouseButton, Recording } from "./computer.js";
export type { Execution, ExecutionError, InterpreterContext, ResultBundle, RunOptions } from "./interpreter.js";
export type {
  CommandResult,
  CreateFields,
  ExecEvent,
  ExecOptions,
  FileEntry,
  FileList,
  NetworkPolicy,
  SignalName,
  WriteResult,
} from "./models.js";
export {
  APIError,
  APIConnectionError,
  APITimeoutError,
  ConfigurationError,
  InvalidRequestError,
  AuthenticationError,
  SpendingLimitError,
  PermissionDeniedError,
  NotFoundError,
  ConflictError,
  BudgetExceededError,
  PayloadTooLargeError,
  RateLimitError,
  InternalServerError,
  UnavailableError,
  CommandError,
  WebhookVerificationError,
} from "./errors.js";
export { resolveEndpoint, resolveApiKey, defaultStateDir } from "./config.js";
export { VERSION } from "./version.js";
