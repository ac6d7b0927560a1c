#pragma once
/*
 * The HTTP API v1: one table of routes (method, path, access, body kind,
 * handler) served by the http module, and what the handlers (api_*.c) share:
 * the daemon's parts and the mapping of the agent's errors onto the API's
 * error shape. Handlers depend on http and on the manager; nothing below
 * them (the manager, the drivers, the channel) includes this header.
 */
#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "daemon/http/apierror.h"
#include "daemon/manager/config.h"
#include "daemon/manager/db.h"
#include "daemon/manager/events.h"
#include "daemon/manager/fleet.h"
#include "daemon/egress/egress_service.h"
#include "daemon/http/http.h"
#include "daemon/manager/images.h"
#include "daemon/manager/keys.h"
#include "daemon/manager/ledger.h"
#include "daemon/manager/previews.h"
#include "daemon/manager/process.h"
#include "daemon/http/request.h"
#include "daemon/manager/sandbox.h"
#include "daemon/store/store_hosts.h"

typedef enum RouteKind {
        ROUTE_HEALTHZ,
        ROUTE_DASHBOARD_ROOT,
        ROUTE_DASHBOARD,
        ROUTE_DASHBOARD_JS,
        ROUTE_DASHBOARD_CSS,
        ROUTE_METRICS,
        ROUTE_INFO,
        ROUTE_LIMITS,
        ROUTE_IMAGES,
        ROUTE_IMAGE_BUILD,
        ROUTE_IMAGE_CONTEXT_MISSING,
        ROUTE_IMAGE_CONTEXT_PUT,
        ROUTE_IMAGE_IMPORT,
        ROUTE_IMAGE_CREATE,
        ROUTE_IMAGE_RESOLVE,
        ROUTE_IMAGE_REGISTRIES,
        ROUTE_IMAGE_REGISTRY_SET,
        ROUTE_IMAGE_REGISTRY_DELETE,
        ROUTE_IMAGE_GET,
        ROUTE_IMAGE_LOGS,
        ROUTE_IMAGE_TAG,
        ROUTE_IMAGE_UNTAG,
        ROUTE_IMAGE_DELETE,
        ROUTE_SANDBOX_LIST,
        ROUTE_SANDBOX_CREATE,
        ROUTE_SANDBOX_GET,
        ROUTE_SANDBOX_DELETE,
        ROUTE_SANDBOX_EXEC,
        ROUTE_SANDBOX_STOP,
        ROUTE_SANDBOX_EXTEND,
        ROUTE_SANDBOX_NETWORK,
        ROUTE_SANDBOX_PAUSE,
        ROUTE_SANDBOX_WAKE,
        ROUTE_SANDBOX_RESTART,
        ROUTE_SANDBOX_UPDATE,
        ROUTE_FILES_READ,
        ROUTE_FILES_WRITE,
        ROUTE_FILES_LIST,
        ROUTE_FILES_STAT,
        ROUTE_FILES_MKDIR,
        ROUTE_FILES_REMOVE,
        ROUTE_FILES_RENAME,
        ROUTE_FILES_ARCHIVE_GET,
        ROUTE_FILES_LINK,
        ROUTE_FILES_REVOKE_LINKS,
        ROUTE_FILES_ARCHIVE_PUT,
        ROUTE_ARCHIVE_UPLOAD_BEGIN,
        ROUTE_ARCHIVE_UPLOAD_PART,
        ROUTE_ARCHIVE_UPLOAD_COMMIT,
        ROUTE_ARCHIVE_UPLOAD_ABORT,
        ROUTE_UPLOAD_BEGIN,
        ROUTE_UPLOAD_PART,
        ROUTE_UPLOAD_COMMIT,
        ROUTE_UPLOAD_ABORT,
        ROUTE_HOSTS,
        ROUTE_EVENTS,
        ROUTE_AUDIT,
        ROUTE_WEBHOOKS_LIST,
        ROUTE_WEBHOOKS_CREATE,
        ROUTE_WEBHOOK_GET,
        ROUTE_WEBHOOK_DELETE,
        ROUTE_WEBHOOK_UPDATE,
        ROUTE_WEBHOOK_ROTATE,
        ROUTE_WEBHOOK_DELETE_POST,
        ROUTE_WEBHOOK_TEST,
        ROUTE_WEBHOOK_DELIVERIES,
        ROUTE_DELIVERY_RETRY,
        ROUTE_OTEL_LIST,
        ROUTE_OTEL_CREATE,
        ROUTE_OTEL_GET,
        ROUTE_OTEL_UPDATE,
        ROUTE_OTEL_FLUSH,
        ROUTE_OTEL_DELETE_POST,
        ROUTE_OTEL_DELETE,
        ROUTE_HOST_DRAIN,
        ROUTE_HOST_UNDRAIN,
        ROUTE_KEYS_LIST,
        ROUTE_KEYS_CREATE,
        ROUTE_KEY_REVOKE,
        ROUTE_USAGE,
        ROUTE_TRIAL,
        ROUTE_SECRETS_LIST,
        ROUTE_SECRET_GET,
        ROUTE_SECRET_PUT,
        ROUTE_SECRET_DELETE,
        ROUTE_SANDBOX_EGRESS,
        ROUTE_SANDBOX_METRICS,
        ROUTE_PROC_LIST,
        ROUTE_PROC_SPAWN,
        ROUTE_PROC_GET,
        ROUTE_PROC_OUTPUT,
        ROUTE_PROC_WRITE,
        ROUTE_PROC_SIGNAL,
        ROUTE_PROC_WAIT,
        ROUTE_TERMINAL,
        ROUTE_TUNNEL,
        ROUTE_PREVIEWS_LIST,
        ROUTE_PREVIEWS_CREATE,
        ROUTE_PREVIEW_GET,
        ROUTE_PREVIEW_DELETE,
        ROUTE_PREVIEW_ROTATE,
        ROUTE_PREVIEW_RELAY,
        ROUTE_VOLUMES_LIST,
        ROUTE_VOLUMES_CREATE,
        ROUTE_VOLUME_GET,
        ROUTE_VOLUME_DELETE,
        ROUTE_VOLUME_DELETE_POST,
        ROUTE_VOLUME_RESIZE,
        ROUTE_VOLUME_ATTACH,
        ROUTE_VOLUME_ATTACHMENT_GET,
        ROUTE_VOLUME_DETACH,
        ROUTE_VOLUME_BACKUP,
        ROUTE_VOLUME_BACKUP_POLICY,
        ROUTE_VOLUME_BACKUPS,
        ROUTE_VOLUME_BACKUP_GET,
        ROUTE_VOLUME_BACKUP_DELETE,
        ROUTE_VOLUME_BACKUP_DELETE_POST,
        ROUTE_INTERP_RUN,
        ROUTE_INTERP_CONTEXT_LIST,
        ROUTE_INTERP_CONTEXT_CREATE,
        ROUTE_INTERP_CONTEXT_RESTART,
        ROUTE_INTERP_CONTEXT_INTERRUPT,
        ROUTE_INTERP_CONTEXT_DELETE,
        ROUTE_INTERP_RESULT,
        ROUTE_SECRET_ROTATE,
        ROUTE_ME,
        ROUTE_SANDBOX_NETWORK_GET,
        ROUTE_JOB_SECRETS,
        ROUTE_JOB_SECRET_CREATE,
        ROUTE_SECRET_SCOPE,
        ROUTE_SECRET_NARROW,
        ROUTE_ACCOUNT_CLOSE,
        ROUTE_ACCOUNT_EMAILS,
        ROUTE_ACCOUNT_EMAILS_UPDATE,
        ROUTE_USAGE_REQUESTS,
        ROUTE_USAGE_EXPORT,
        ROUTE_SANDBOX_SNAPSHOT,
        ROUTE_SANDBOX_FORK,
        ROUTE_SNAPSHOT_LIST,
        ROUTE_SNAPSHOT_GET,
        ROUTE_SNAPSHOT_UPDATE,
        ROUTE_SNAPSHOT_EXTEND,
        ROUTE_SNAPSHOT_DELETE,
        ROUTE_SNAPSHOT_DELETE_POST,
        ROUTE_PROC_RESIZE,
        ROUTE_MCP,
        ROUTE_MCP_END,
        ROUTE_WATCH_START,
        ROUTE_WATCH_LIST,
        ROUTE_WATCH_GET,
        ROUTE_WATCH_STOP,
        ROUTE_WATCH_EVENTS,
        ROUTE_SESSION_CREATE,
        ROUTE_SESSION_LIST,
        ROUTE_SESSION_REVOKE,
        ROUTE_MCP_CATALOG,
        ROUTE_SANDBOX_MCP_START,
        ROUTE_SANDBOX_MCP_GET,
        ROUTE_SANDBOX_MCP_STOP,
        ROUTE_BROWSER_START,
        ROUTE_BROWSER_GET,
        ROUTE_BROWSER_STOP,
        ROUTE_DESKTOP_START,
        ROUTE_DESKTOP_STOP,
        ROUTE_DESKTOP_SCREENSHOT,
        ROUTE_DESKTOP_ACT,
        ROUTE_RECORDINGS_LIST,
        ROUTE_RECORDING_START,
        ROUTE_RECORDING_GET,
        ROUTE_RECORDING_STOP,
        ROUTE_RECORDING_DELETE,
        ROUTE_RECORDING_VIDEO,
        _ROUTE_MAX,
} RouteKind;

/* The daemon's parts, as every handler sees them (r->app). */
struct App {
        const DaemonConfig *cfg;
        Db *db;
        Manager *manager;
        Ledger *ledger;
        KeyStore *keys;
        EgressService *egress; /* NULL: no egress routes */
        ProcTable *procs;      /* every sandbox's processes */
        atomic_bool building;  /* one image build at a time */
        SnapshotStore *snapshots;
        Uploads *uploads; /* uploads in parts */
        const StoreHostOps *host_ops; /* the hosts sharing the store, this one among them */
        StoreHosts *hosts;
        Fleet *fleet;                 /* this host's standing among them */
        Events *events;               /* the lifecycle events */
        struct Webhooks *webhooks;    /* the owners' webhooks; NULL: not offered */
        struct Audit *audit;          /* the audit trail; NULL: none */
        struct Samples *samples;      /* the sandboxes' readings; NULL: none kept */
        int64_t sample_interval_s;    /* how often a live sandbox is read */
        struct RequestCounts *requests; /* the API answers counted; NULL: not counted */
        struct Otel *otel;              /* the OpenTelemetry exports; NULL: not offered */
        struct FileLinks *links;        /* the signed file links; NULL: not offered */
        struct McpSessions *mcp;        /* the MCP endpoint's sessions */
        struct Previews *previews;      /* the previews; NULL: not offered (no --preview-listen) */
        struct Volumes *volumes;        /* the volumes */
        const struct PreviewSite *preview_site; /* where previews are reached */
        struct UserImages *user_images; /* the images users build; NULL: not offered */
        struct WatchTable *watches;     /* the file watches of the sandboxes run here */
        struct Sessions *sessions;      /* the sandboxes' sessions; NULL: not offered */
};

/* Maps an agent {"error":{code,message}} to the API's error; path, when
 * given, prefixes the message. */
void api_agent_error(json_t *result, const char *path, ApiError *e);

/* The API's error for a manager's: its kind becomes a status and a code. */
/* An unarchive's or archive's exit code (src/agent/archive.h) and its
 * reason as the API's error. */
int api_archive_error(int code, const char *path, const char *why, ApiError *e);
int api_sandbox_error(const SandboxError *se, ApiError *e);
/* A running sandbox of the route's id and the request's key, with a
 * reference (sandbox_release): 404 when there is none, 409 when it is not
 * running. */
int api_sandbox_acquire(Req *r, Sandbox **ret, ApiError *e);
/* The route's sandbox is the request's owner's, in any state (the store's
 * record; nothing is woken): 0; 404 for anyone else and for one deleted. */
int api_sandbox_owned(Req *r, ApiError *e);
/* Opens a stream to the sandbox's agent; e filled on failure. */
int api_open_stream(Sandbox *sb, json_t *request, ChanStream **ret, ApiError *e);
/* Who a client's request to the agent runs as: u when the client named a
 * user, else the sandbox's own (its "user", set at create or :update). */
int api_req_set_user(json_t *req, Sandbox *sb, ReqUser u);
/* The sandbox's own user on req unless req names one already. */
int api_req_user(json_t *req, Sandbox *sb);

/* Processes, shared by the exec and process handlers. The agent's exec
 * request for an exec or spawn body on sb. */
json_t *api_exec_request(const ExecRequest *q, Sandbox *sb);
/* Runs the exec q on sb (the reference taken; q's stdin taken) to its end,
 * as POST .../{id}:exec without stream answers it: 0 and *ret its body
 * {exitCode, stdout, stderr, timedOut, ...}; -EPIPE when the client on sock
 * left (the command was cancelled); else a negative value with e filled
 * (e->code NULL: out of memory). */
int api_exec_run(Sandbox *sb, ExecRequest *q, int sock, const char *rid, json_t **ret, ApiError *e);
/* Starts a process for the body q on the route's sandbox, with the
 * request's Idempotency-Key. */
int api_process_start(Req *r, const ExecRequest *q, Proc **ret, bool *ret_replayed, ApiError *e);
/* The NDJSON response of a process's output from cursor (takes the
 * reference p and first, an event sent before the output, may be NULL). */
enum MHD_Result api_process_output(Req *r, Proc *p, uint64_t cursor, bool follow, json_t *first);
/* The last event of a process's output: its exit, or an error event saying
 * why it has none. */
json_t *api_process_exit_event(const ProcExit *x);
/* At a stop: waits up to timeout_ms until every output response has sent
 * its last event (a `continue` for the processes of sandboxes left running)
 * and ended; false when some had not. */
bool api_output_streams_wait(int timeout_ms);
/* The API's process object. */
json_t *api_process_json(const ProcInfo *info);
/* A sandbox's row as the API answers it (a new reference; NULL on ENOMEM). */
json_t *api_sandbox_json(Manager *m, const SandboxRow *r);
/* `outOfMemory` as the published client reads it: {code, processesKilled,
 * memoryMiB, message, hint}; NULL on allocation failure. */
json_t *api_out_of_memory(int64_t processes_killed, unsigned memory_mib);

/* {"name","built","builtAt","sizeBytes"}: one image, and every image. */
/* The request side of a WebSocket handshake; a 400 (hint: client) when it
 * is not one. */
int api_websocket_handshake(Req *r, const char *client, char accept[29], ApiError *e);
json_t *api_image_json(const ImageInfo *info);

/* Shared with the browser and desktop handlers (api_computer.c). The
 * route's sandbox's port shared for a part of the daemon that serves
 * through the preview listener (the browser's DevTools, the desktop's live
 * view): the preview there, a private one made when there is none (defined
 * in api_previews.c). Its URL (http(s)://PORT-sbx-HEX.DOMAIN[:PORT]) in
 * ret_url and a token of the default life in ret_token; 501
 * previews_unavailable without a listener. */
/* Runs argv (a JSON array) in the route's sandbox as its user, as an exec
 * does: 0 with its exit status in *ret_exit and its standard output in
 * *ret_out (trailing white space cut; its first line alone when it failed),
 * or e filled (the sandbox, a timeout, output past max_out). */
int api_sandbox_script(Req *r, json_t *argv, int64_t timeout_ms, size_t max_out, char **ret_out, int *ret_exit,
                       ApiError *e);
int api_preview_share(Req *r, unsigned port, char *ret_url, size_t url_len, char ret_token[PREVIEW_TOKEN_MAX],
                      ApiError *e);
/* The file at path in the route's sandbox, read as the sandbox's own user,
 * answered as its bytes with content_type (defined in api_files.c; the
 * desktop's recordings). */
enum MHD_Result api_files_send(Req *r, const char *path, const char *content_type);
/* Starts the default python context's kernel of a new sandbox in the
 * background (unless --no-interpreter-prestart, and within the host's bound
 * --interpreter-prestart-max), so that its first cell need not wait for a
 * kernel's start. Returns at once. The interpreter's; the create calls it. */
void interpreter_prestart(App *app, const KeyInfo *key, const char *id);
/* The warm pool's kernel start (ManagerWarmFn, userdata the App): the
 * default python context of a pool sandbox, started as the image's default
 * user with no one's env; interpreter_prestart gives it its owner's at the
 * hand-out, before any run of the sandbox's reaches it. */
int interpreter_pool_warm(void *userdata, Sandbox *sb, SandboxDriver driver, unsigned memory_mib);

/* Names the command line of an exec or a spawn for its audit record: the
 * command, or argv joined by spaces (bounded by req_audit_note); never its
 * environment or its stdin. */
void api_audit_command(Req *r, const ExecRequest *q);

/* Whether a listing's filter (an id, a type, an action) is 1 to 64 letters,
 * digits, '.', '_' or '-': what they are made of, and nothing a store could
 * read as a pattern. */
bool api_filter_ok(const char *s);

/* The answer to a store call that failed for `what` ("read the usage"):
 * 503 when the store did not answer (try again), else 500, logged. */
enum MHD_Result api_reply_store_error(Req *r, int rc, const char *what);
/* 400 invalid_request with msg (and hint, NULL for none). */
enum MHD_Result api_reply_invalid(Req *r, const char *hint, const char *msg);
/* 503 unavailable: `what` is not offered by this daemon (its store). */
enum MHD_Result api_reply_not_offered(Req *r, const char *what);
/* A listing in pages by cursor (events, webhook deliveries): its `limit`
 * (1..max, def when absent) and `cursor` (a record's place, 0 when absent)
 * from the query; -EINVAL with e filled for bad ones. */
int api_page_query(Req *r, unsigned def, unsigned max, unsigned *ret_limit, int64_t *ret_before, ApiError *e);
/* The same with the cursor under another name (the audit trail's `before`,
 * as the published client sends it). */
int api_page_query_as(Req *r, const char *cursor_name, unsigned def, unsigned max, unsigned *ret_limit,
                      int64_t *ret_before, ApiError *e);
/* The page's answer {data, nextCursor, hasMore}: data holds up to limit + 1
 * records (one past the page says there is a next one, whose cursor is
 * last_seq, the place of the page's last record); steals data. */
json_t *api_page_json(json_t *data, unsigned limit, int64_t last_seq);
json_t *api_images_json(const DaemonConfig *cfg);

/* Shared with the images handlers (api_user_images.c, which defines them):
 * the owner's images as a page of GET /v1/images ({data, nextCursor} set
 * into body); and a create's `image` that names one of the owner's images
 * (an id, name, name:tag or name@version) made the `snapshot` of its disk,
 * with the image's env under the create's own and its user, left as it is
 * when it names none (a built-in image, or a name the create refuses);
 * the image's start command, if it has one, in *ret_start as
 * {start, workdir} (docs/images.md, "The start command"). */
int api_user_images_page(Req *r, json_t *body, ApiError *e);
int api_user_image_to_create(Req *r, bool *ret_from_image, json_t **ret_start, ApiError *e);

