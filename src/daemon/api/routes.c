#include "daemon/api/routes.h"

#include "common/macro.h"
#include "daemon/api/api_egress.h"
#include "daemon/api/api_events.h"
#include "daemon/api/api_exec.h"
#include "daemon/api/api_archive.h"
#include "daemon/api/api_audit.h"
#include "daemon/api/api_computer.h"
#include "daemon/api/api_dashboard.h"
#include "daemon/api/api_files.h"
#include "daemon/api/api_hosts.h"
#include "daemon/api/api_uploads.h"
#include "daemon/api/api_usage.h"
#include "daemon/api/api_images.h"
#include "daemon/api/api_user_images.h"
#include "daemon/api/api_interpreter.h"
#include "daemon/api/api_keys.h"
#include "daemon/api/api_links.h"
#include "daemon/api/api_mcp.h"
#include "daemon/api/api_mcp_inside.h"
#include "daemon/api/api_otel.h"
#include "daemon/api/api_previews.h"
#include "daemon/api/api_volumes.h"
#include "daemon/api/api_processes.h"
#include "daemon/api/api_sandbox_metrics.h"
#include "daemon/api/api_sandboxes.h"
#include "daemon/api/api_sessions.h"
#include "daemon/api/api_snapshots.h"
#include "daemon/api/api_terminal.h"
#include "daemon/api/api_tunnel.h"
#include "daemon/api/api_system.h"
#include "daemon/api/api_watches.h"
#include "daemon/api/api_webhooks.h"

#define R(k, n, m, p, a, b, h) { .kind = (k), .name = (n), .method = (m), .path = (p), .access = (a), .body = (b), .handler = (h) }
/* The same, for a route whose answer an Idempotency-Key replays. */
#define RI(k, n, m, p, a, b, h) { .kind = (k), .name = (n), .method = (m), .path = (p), .access = (a), .body = (b), .handler = (h), .idempotent = true }
/* The same, for a route a sandbox session's token may use too (its own
 * sandbox only): the sessions' allow-list is these routes' `.session`. */
#define RS(k, n, m, p, a, b, h) { .kind = (k), .name = (n), .method = (m), .path = (p), .access = (a), .body = (b), .handler = (h), .session = true }
#define SBX "/v1/sandboxes/{sandbox}"

/* Every route of the API. For one path, the order of its methods here is the
 * order of a 405's Allow header. */
const HttpRoute api_routes[] = {
        R(ROUTE_HEALTHZ, "healthz", "GET", "/healthz", HTTP_ACCESS_PUBLIC, HTTP_BODY_NONE, handle_healthz),
        R(ROUTE_DASHBOARD_ROOT, "dashboard_root", "GET", "/dashboard", HTTP_ACCESS_PUBLIC, HTTP_BODY_NONE,
          handle_dashboard_root),
        R(ROUTE_DASHBOARD, "dashboard", "GET", "/dashboard/", HTTP_ACCESS_PUBLIC, HTTP_BODY_NONE, handle_dashboard),
        R(ROUTE_DASHBOARD_JS, "dashboard_js", "GET", "/dashboard/app.js", HTTP_ACCESS_PUBLIC, HTTP_BODY_NONE,
          handle_dashboard_js),
        R(ROUTE_DASHBOARD_CSS, "dashboard_css", "GET", "/dashboard/app.css", HTTP_ACCESS_PUBLIC, HTTP_BODY_NONE,
          handle_dashboard_css),
        R(ROUTE_METRICS, "metrics", "GET", "/metrics", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_metrics),
        R(ROUTE_INFO, "info", "GET", "/v1/info", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_info),
        R(ROUTE_LIMITS, "limits", "GET", "/v1/limits", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_limits),
        R(ROUTE_HOSTS, "hosts", "GET", "/v1/hosts", HTTP_ACCESS_ADMIN, HTTP_BODY_NONE, handle_hosts),
        R(ROUTE_EVENTS, "events", "GET", "/v1/events", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_events),
        R(ROUTE_AUDIT, "audit", "GET", "/v1/audit", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_audit),
        /* A create's and a rotation's answers carry a secret, which an
         * Idempotency-Key's record would keep: those two are not replayed. */
        R(ROUTE_WEBHOOKS_LIST, "webhooks_list", "GET", "/v1/webhooks", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_webhooks_list),
        R(ROUTE_WEBHOOKS_CREATE, "webhooks_create", "POST", "/v1/webhooks", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_webhooks_create),
        R(ROUTE_WEBHOOK_GET, "webhook_get", "GET", "/v1/webhooks/{webhook}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_webhook_get),
        RI(ROUTE_WEBHOOK_DELETE, "webhook_delete", "DELETE", "/v1/webhooks/{webhook}", HTTP_ACCESS_FULL,
           HTTP_BODY_NONE, handle_webhook_delete),
        RI(ROUTE_WEBHOOK_UPDATE, "webhook_update", "POST", "/v1/webhooks/{webhook}:update", HTTP_ACCESS_FULL,
           HTTP_BODY_JSON, handle_webhook_update),
        R(ROUTE_WEBHOOK_ROTATE, "webhook_rotate", "POST", "/v1/webhooks/{webhook}:rotate-secret", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_webhook_rotate),
        RI(ROUTE_WEBHOOK_DELETE_POST, "webhook_delete_post", "POST", "/v1/webhooks/{webhook}:delete",
           HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_webhook_delete),
        R(ROUTE_WEBHOOK_TEST, "webhook_test", "POST", "/v1/webhooks/{webhook}:test", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_webhook_test),
        R(ROUTE_WEBHOOK_DELIVERIES, "webhook_deliveries", "GET", "/v1/webhooks/{webhook}/deliveries",
          HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_webhook_deliveries),
        R(ROUTE_DELIVERY_RETRY, "delivery_retry", "POST", "/v1/webhook-deliveries/{delivery}:retry",
          HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_delivery_retry),
        R(ROUTE_OTEL_LIST, "otel_list", "GET", "/v1/otel-exports", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_otel_list),
        RI(ROUTE_OTEL_CREATE, "otel_create", "POST", "/v1/otel-exports", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
           handle_otel_create),
        R(ROUTE_OTEL_GET, "otel_get", "GET", "/v1/otel-exports/{export}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_otel_get),
        RI(ROUTE_OTEL_UPDATE, "otel_update", "POST", "/v1/otel-exports/{export}:update", HTTP_ACCESS_FULL,
           HTTP_BODY_JSON, handle_otel_update),
        R(ROUTE_OTEL_FLUSH, "otel_flush", "POST", "/v1/otel-exports/{export}:flush", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_otel_flush),
        RI(ROUTE_OTEL_DELETE_POST, "otel_delete_post", "POST", "/v1/otel-exports/{export}:delete", HTTP_ACCESS_FULL,
           HTTP_BODY_JSON_OR_EMPTY, handle_otel_delete),
        RI(ROUTE_OTEL_DELETE, "otel_delete", "DELETE", "/v1/otel-exports/{export}", HTTP_ACCESS_FULL, HTTP_BODY_NONE,
           handle_otel_delete),
        RI(ROUTE_HOST_DRAIN, "host_drain", "POST", "/v1/hosts/{host}:drain", HTTP_ACCESS_ADMIN,
           HTTP_BODY_JSON_OR_EMPTY, handle_host_drain),
        RI(ROUTE_HOST_UNDRAIN, "host_undrain", "POST", "/v1/hosts/{host}:undrain", HTTP_ACCESS_ADMIN,
           HTTP_BODY_JSON_OR_EMPTY, handle_host_drain),
        R(ROUTE_KEYS_LIST, "keys_list", "GET", "/v1/keys", HTTP_ACCESS_FULL, HTTP_BODY_NONE, handle_keys_list),
        R(ROUTE_KEYS_CREATE, "keys_create", "POST", "/v1/keys", HTTP_ACCESS_FULL, HTTP_BODY_JSON, handle_keys_create),
        RI(ROUTE_KEY_REVOKE, "key_revoke", "DELETE", "/v1/keys/{key}", HTTP_ACCESS_FULL, HTTP_BODY_NONE,
          handle_key_revoke),
        R(ROUTE_USAGE, "usage", "GET", "/v1/usage", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_usage),
        /* POST /v1/trial mints a key: its handler refuses it but on loopback. */
        R(ROUTE_TRIAL, "trial", "POST", "/v1/trial", HTTP_ACCESS_PUBLIC, HTTP_BODY_NONE, handle_trial),
        R(ROUTE_SECRETS_LIST, "secrets_list", "GET", "/v1/egress-secrets", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_secrets_list),
        R(ROUTE_SECRET_GET, "secret_get", "GET", "/v1/egress-secrets/{secret}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_secret_get),
        RI(ROUTE_SECRET_PUT, "secret_put", "PUT", "/v1/egress-secrets/{secret}", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_secret_put),
        RI(ROUTE_SECRET_DELETE, "secret_delete", "DELETE", "/v1/egress-secrets/{secret}", HTTP_ACCESS_FULL,
          HTTP_BODY_NONE, handle_secret_delete),
        RI(ROUTE_SECRET_ROTATE, "secret_rotate", "POST", "/v1/egress-secrets/{secret}:rotate", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON, handle_secret_rotate),
        R(ROUTE_SECRET_SCOPE, "secret_scope", "PUT", "/v1/egress-secrets/{secret}/sandboxes", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_not_offered),
        R(ROUTE_SECRET_NARROW, "secret_narrow", "PUT", "/v1/egress-secrets/{secret}/rules", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_not_offered),
        R(ROUTE_JOB_SECRETS, "job_secrets", "GET", "/v1/secrets", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_not_offered),
        R(ROUTE_JOB_SECRET_CREATE, "job_secret_create", "POST", "/v1/secrets", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_not_offered),
        R(ROUTE_ME, "me", "GET", "/v1/me", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_me),
        R(ROUTE_ACCOUNT_CLOSE, "account_close", "POST", "/v1/account:close", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_not_offered),
        R(ROUTE_ACCOUNT_EMAILS, "account_emails", "GET", "/v1/account/emails", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_not_offered),
        R(ROUTE_ACCOUNT_EMAILS_UPDATE, "account_emails_update", "POST", "/v1/account/emails:update",
          HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_not_offered),
        R(ROUTE_USAGE_REQUESTS, "usage_requests", "GET", "/v1/usage/requests", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_usage_requests),
        R(ROUTE_USAGE_EXPORT, "usage_export", "GET", "/v1/usage/export", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_usage_export),
        R(ROUTE_IMAGES, "images", "GET", "/v1/images", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_images),
        R(ROUTE_IMAGE_BUILD, "image_build", "POST", "/v1/images/{image}:build", HTTP_ACCESS_ADMIN, HTTP_BODY_NONE,
          handle_image_build),
        /* The Model Context Protocol (docs/mcp.md): any key; each tool
         * checks the key's access as its REST route does. Its body may be
         * a JSON-RPC batch, an array: the handler parses it. No GET: the
         * transport's server-sent stream is not offered, which a 405 says. */
        { .kind = ROUTE_MCP, .name = "mcp_call", .method = "POST", .path = "/mcp", .access = HTTP_ACCESS_READ,
          .body = HTTP_BODY_RAW, .handler = handle_mcp_post, .max_body = MCP_MAX_BODY,
          .too_large_hint = "send at most 4 MiB: write larger files with the REST API" },
        R(ROUTE_MCP_END, "mcp_end", "DELETE", "/mcp", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_mcp_delete),
        R(ROUTE_IMAGE_CONTEXT_MISSING, "image_context_missing", "POST", "/v1/images/context/missing", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON, handle_image_context_missing),
        { .kind = ROUTE_IMAGE_CONTEXT_PUT, .name = "image_context_put", .method = "PUT",
          .path = "/v1/images/context/{digest}", .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_STREAM,
          .handler = handle_image_context_put, .upload = &image_context_upload },
        { .kind = ROUTE_IMAGE_IMPORT, .name = "image_import", .method = "PUT", .path = "/v1/images/import",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_STREAM, .handler = handle_image_import,
          .upload = &image_import_upload },
        { .kind = ROUTE_IMAGE_CREATE, .name = "image_create", .method = "POST", .path = "/v1/images",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_JSON, .handler = handle_image_create, .idempotent = true,
          /* Inline files: 8 MiB, 4/3 of that in base64, and the JSON around. */
          .max_body = IMAGE_CREATE_MAX_BODY,
          .too_large_hint = "send larger files as a context folder (context_dir)" },
        R(ROUTE_IMAGE_RESOLVE, "image_resolve", "GET", "/v1/images/resolve", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_image_resolve),
        R(ROUTE_IMAGE_REGISTRIES, "image_registries", "GET", "/v1/images/registries", HTTP_ACCESS_READ,
          HTTP_BODY_NONE, handle_image_registries),
        R(ROUTE_IMAGE_REGISTRY_SET, "image_registry_set", "POST", "/v1/images/registries", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_image_registry_set),
        R(ROUTE_IMAGE_REGISTRY_DELETE, "image_registry_delete", "POST", "/v1/images/registries:delete",
          HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_image_registry_delete),
        R(ROUTE_IMAGE_GET, "image_get", "GET", "/v1/images/{image}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_image_get),
        R(ROUTE_IMAGE_LOGS, "image_logs", "GET", "/v1/images/{image}/logs", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_image_logs),
        R(ROUTE_IMAGE_TAG, "image_tag", "POST", "/v1/images/{image}:tag", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_image_tag),
        R(ROUTE_IMAGE_UNTAG, "image_untag", "POST", "/v1/images/{image}:untag", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_image_untag),
        R(ROUTE_IMAGE_DELETE, "image_delete", "POST", "/v1/images/{image}:delete", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_image_delete),
        R(ROUTE_SANDBOX_LIST, "sandbox_list", "GET", "/v1/sandboxes", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_sandbox_list),
        RI(ROUTE_SANDBOX_CREATE, "sandbox_create", "POST", "/v1/sandboxes", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
          handle_sandbox_create),
        RS(ROUTE_SANDBOX_GET, "sandbox_get", "GET", SBX, HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_sandbox_get),
        RI(ROUTE_SANDBOX_DELETE, "sandbox_delete", "DELETE", SBX, HTTP_ACCESS_FULL, HTTP_BODY_NONE,
          handle_sandbox_delete),
        { .kind = ROUTE_SANDBOX_EXEC, .session = true, .name = "exec", .method = "POST", .path = SBX ":exec",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_JSON, .handler = handle_exec,
          .idempotent = true, .idem_to_handler = true,
          /* JSON bodies are small, but for an exec's stdin (16 MiB, 4/3 of
           * that in base64). */
          .max_body = REQ_MAX_EXEC_BODY,
          .too_large_hint = "send large inputs as a file (PUT .../files/content) and redirect" },
        RI(ROUTE_SANDBOX_STOP, "stop", "POST", SBX ":stop", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
          handle_sandbox_stop),
        RI(ROUTE_SANDBOX_EXTEND, "extend", "POST", SBX ":extend", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_sandbox_extend),
        RI(ROUTE_SANDBOX_PAUSE, "pause", "POST", SBX ":pause", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
          handle_sandbox_pause),
        RI(ROUTE_SANDBOX_WAKE, "wake", "POST", SBX ":wake", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
          handle_sandbox_wake),
        RI(ROUTE_SANDBOX_RESTART, "restart", "POST", SBX ":restart", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
          handle_sandbox_restart),
        RI(ROUTE_SANDBOX_UPDATE, "update", "POST", SBX ":update", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_sandbox_update),
        RI(ROUTE_SANDBOX_SNAPSHOT, "snapshot", "POST", SBX ":snapshot", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
           handle_sandbox_snapshot),
        RI(ROUTE_SANDBOX_FORK, "fork", "POST", SBX ":fork", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
           handle_sandbox_fork),
        R(ROUTE_SNAPSHOT_LIST, "snapshot_list", "GET", "/v1/snapshots", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_snapshot_list),
        R(ROUTE_SNAPSHOT_GET, "snapshot_get", "GET", "/v1/snapshots/{snapshot}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_snapshot_get),
        RI(ROUTE_SNAPSHOT_DELETE, "snapshot_delete", "DELETE", "/v1/snapshots/{snapshot}", HTTP_ACCESS_FULL,
           HTTP_BODY_NONE, handle_snapshot_delete),
        RI(ROUTE_SNAPSHOT_UPDATE, "snapshot_update", "POST", "/v1/snapshots/{snapshot}:update", HTTP_ACCESS_FULL,
           HTTP_BODY_JSON, handle_snapshot_update),
        RI(ROUTE_SNAPSHOT_EXTEND, "snapshot_extend", "POST", "/v1/snapshots/{snapshot}:extend", HTTP_ACCESS_FULL,
           HTTP_BODY_JSON, handle_snapshot_extend),
        RI(ROUTE_SNAPSHOT_DELETE_POST, "snapshot_delete_post", "POST", "/v1/snapshots/{snapshot}:delete",
           HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_snapshot_delete),
        R(ROUTE_SANDBOX_NETWORK_GET, "network_get", "GET", SBX "/network", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_sandbox_network_get),
        RI(ROUTE_SANDBOX_NETWORK, "network", "PUT", SBX "/network", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_sandbox_network),
        R(ROUTE_SANDBOX_EGRESS, "sandbox_egress", "GET", SBX "/egress", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_sandbox_egress),
        { .kind = ROUTE_SANDBOX_METRICS, .name = "sandbox_metrics", .method = "GET", .path = SBX "/metrics",
          .access = HTTP_ACCESS_READ, .body = HTTP_BODY_NONE, .handler = handle_sandbox_metrics,
          .store_only = true },
        /* A signed file link (files:link) is one of these three with its
         * signed query instead of a key. */
        { .kind = ROUTE_FILES_READ, .session = true, .name = "files_read", .method = "GET", .path = SBX "/files/content",
          .access = HTTP_ACCESS_READ, .body = HTTP_BODY_NONE, .handler = handle_files_read, .link_op = "download" },
        { .kind = ROUTE_FILES_WRITE, .session = true, .name = "files_write", .method = "PUT", .path = SBX "/files/content",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_STREAM, .handler = handle_files_write,
          .upload = &files_upload, .link_op = "upload" },
        RS(ROUTE_FILES_LIST, "files_list", "GET", SBX "/files/list", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_files_list),
        RS(ROUTE_FILES_STAT, "files_stat", "GET", SBX "/files/stat", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_files_stat),
        RS(ROUTE_WATCH_START, "watch_start", "POST", SBX "/files/watches", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_watch_start),
        RS(ROUTE_WATCH_LIST, "watch_list", "GET", SBX "/files/watches", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_watch_list),
        RS(ROUTE_WATCH_GET, "watch_get", "GET", SBX "/files/watches/{watch}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_watch_get),
        RS(ROUTE_WATCH_STOP, "watch_stop", "DELETE", SBX "/files/watches/{watch}", HTTP_ACCESS_FULL, HTTP_BODY_NONE,
          handle_watch_stop),
        RS(ROUTE_WATCH_EVENTS, "watch_events", "GET", SBX "/files/watches/{watch}/events", HTTP_ACCESS_READ,
          HTTP_BODY_NONE, handle_watch_events),
        RS(ROUTE_FILES_MKDIR, "files_mkdir", "POST", SBX "/files:mkdir", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_files_mkdir),
        RS(ROUTE_FILES_REMOVE, "files_remove", "POST", SBX "/files:remove", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_files_remove),
        RS(ROUTE_FILES_RENAME, "files_rename", "POST", SBX "/files:rename", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_files_rename),
        { .kind = ROUTE_FILES_ARCHIVE_GET, .session = true, .name = "files_archive_get", .method = "GET", .path = SBX "/files/archive",
          .access = HTTP_ACCESS_READ, .body = HTTP_BODY_NONE, .handler = handle_files_archive_get,
          .link_op = "archive" },
        /* The links read and write only the store: the host the client
         * asked makes the URL with its own address. */
        { .kind = ROUTE_FILES_LINK, .name = "files_link", .method = "POST", .path = SBX "/files:link",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_JSON, .handler = handle_files_link, .store_only = true },
        { .kind = ROUTE_FILES_REVOKE_LINKS, .name = "files_revoke_links", .method = "POST",
          .path = SBX "/files:revoke-links", .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_JSON_OR_EMPTY,
          .handler = handle_files_revoke_links, .store_only = true },
        { .kind = ROUTE_FILES_ARCHIVE_PUT, .session = true, .name = "files_archive_put", .method = "PUT", .path = SBX "/files/archive",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_STREAM, .handler = handle_files_archive_put,
          .upload = &archive_upload },
        RS(ROUTE_ARCHIVE_UPLOAD_BEGIN, "archive_upload_begin", "POST", SBX "/files/archive/uploads", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON, handle_archive_upload_begin),
        { .kind = ROUTE_ARCHIVE_UPLOAD_PART, .session = true, .name = "archive_upload_part", .method = "PUT",
          .path = SBX "/files/archive/uploads/{upload}", .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_STREAM,
          .handler = handle_upload_part, .upload = &upload_part_stream },
        RS(ROUTE_ARCHIVE_UPLOAD_COMMIT, "archive_upload_commit", "POST", SBX "/files/archive/uploads/{upload}:commit",
          HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_upload_commit),
        RS(ROUTE_ARCHIVE_UPLOAD_ABORT, "archive_upload_abort", "POST", SBX "/files/archive/uploads/{upload}:abort",
          HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_upload_abort),
        RS(ROUTE_UPLOAD_BEGIN, "upload_begin", "POST", SBX "/uploads", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_upload_begin),
        { .kind = ROUTE_UPLOAD_PART, .session = true, .name = "upload_part", .method = "PUT", .path = SBX "/uploads/{upload}",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_STREAM, .handler = handle_upload_part,
          .upload = &upload_part_stream },
        RS(ROUTE_UPLOAD_COMMIT, "upload_commit", "POST", SBX "/uploads/{upload}:commit", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_upload_commit),
        RS(ROUTE_UPLOAD_ABORT, "upload_abort", "POST", SBX "/uploads/{upload}:abort", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_upload_abort),
        RS(ROUTE_PROC_LIST, "proc_list", "GET", SBX "/processes", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_proc_list),
        { .kind = ROUTE_PROC_SPAWN, .session = true, .name = "proc_spawn", .method = "POST", .path = SBX "/processes",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_JSON, .handler = handle_proc_spawn,
          .idempotent = true, .idem_to_handler = true,
          .max_body = REQ_MAX_EXEC_BODY,
          .too_large_hint = "send large inputs as a file (PUT .../files/content) and redirect" },
        RS(ROUTE_PROC_GET, "proc_get", "GET", SBX "/processes/{process}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_proc_get),
        RS(ROUTE_PROC_OUTPUT, "proc_output", "GET", SBX "/processes/{process}/output", HTTP_ACCESS_READ,
          HTTP_BODY_NONE, handle_proc_output),
        { .kind = ROUTE_PROC_WRITE, .session = true, .name = "proc_write", .method = "POST", .path = SBX "/processes/{process}:write",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_JSON, .handler = handle_proc_write,
          /* 1 MiB of input, in base64. */
          .max_body = 2 * REQ_MAX_BODY },
        RS(ROUTE_PROC_SIGNAL, "proc_signal", "POST", SBX "/processes/{process}:signal", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_proc_signal),
        RS(ROUTE_PROC_WAIT, "proc_wait", "POST", SBX "/processes/{process}:wait", HTTP_ACCESS_READ,
          HTTP_BODY_JSON_OR_EMPTY, handle_proc_wait),
        RS(ROUTE_PROC_RESIZE, "proc_resize", "POST", SBX "/processes/{process}:resize", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON, handle_proc_resize),
        /* A WebSocket: the handshake is a GET, the terminal runs past it. */
        RS(ROUTE_TERMINAL, "terminal", "GET", SBX "/terminal", HTTP_ACCESS_FULL, HTTP_BODY_NONE, handle_terminal),
        /* Port forwarding: a WebSocket too, each connection a stream of it. */
        R(ROUTE_TUNNEL, "tunnel", "GET", SBX "/tunnel", HTTP_ACCESS_FULL, HTTP_BODY_NONE, handle_tunnel),
        /* Previews: a port shared at a host name of its own, served on the
         * preview listener. A create's answer carries a token: not replayed. */
        /* Sandbox sessions (docs/sessions.md): a create's answer carries
         * the token, which a replay never does (the handler records what a
         * retry gets). */
        { .kind = ROUTE_SESSION_CREATE, .name = "session_create", .method = "POST", .path = SBX "/sessions",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_JSON_OR_EMPTY, .handler = handle_session_create,
          .idempotent = true, .idem_to_handler = true },
        R(ROUTE_SESSION_LIST, "session_list", "GET", SBX "/sessions", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_session_list),
        R(ROUTE_SESSION_REVOKE, "session_revoke", "POST", SBX "/sessions/{session}:revoke", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_session_revoke),
        RS(ROUTE_PREVIEWS_LIST, "previews_list", "GET", SBX "/previews", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_previews_list),
        R(ROUTE_PREVIEWS_CREATE, "previews_create", "POST", SBX "/previews", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_previews_create),
        RS(ROUTE_PREVIEW_GET, "preview_get", "GET", SBX "/previews/{port}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_preview_get),
        R(ROUTE_PREVIEW_DELETE, "preview_delete", "DELETE", SBX "/previews/{port}", HTTP_ACCESS_FULL,
          HTTP_BODY_NONE, handle_preview_delete),
        R(ROUTE_PREVIEW_ROTATE, "preview_rotate", "POST", SBX "/previews/{port}:rotate", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_preview_rotate),
        /* Another host relays a preview's connection here: no key (the
         * fleet's secret, which the handler requires; the preview's token
         * is checked on the connection), never forwarded on. */
        { .kind = ROUTE_PREVIEW_RELAY, .name = "preview_relay", .method = "GET", .path = SBX "/previews/{port}:relay",
          .access = HTTP_ACCESS_PUBLIC, .body = HTTP_BODY_NONE, .handler = handle_preview_relay, .store_only = true },
        /* Volumes: disks that outlive sandboxes (docs/volumes.md). */
        R(ROUTE_VOLUMES_LIST, "volumes_list", "GET", "/v1/volumes", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_volumes_list),
        RI(ROUTE_VOLUMES_CREATE, "volumes_create", "POST", "/v1/volumes", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
           handle_volumes_create),
        R(ROUTE_VOLUME_GET, "volume_get", "GET", "/v1/volumes/{volume}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_volume_get),
        RI(ROUTE_VOLUME_DELETE, "volume_delete", "DELETE", "/v1/volumes/{volume}", HTTP_ACCESS_FULL, HTTP_BODY_NONE,
           handle_volume_delete),
        RI(ROUTE_VOLUME_DELETE_POST, "volume_delete_post", "POST", "/v1/volumes/{volume}:delete", HTTP_ACCESS_FULL,
           HTTP_BODY_JSON_OR_EMPTY, handle_volume_delete),
        RI(ROUTE_VOLUME_RESIZE, "volume_resize", "POST", "/v1/volumes/{volume}:resize", HTTP_ACCESS_FULL,
           HTTP_BODY_JSON, handle_volume_resize),
        R(ROUTE_VOLUME_ATTACH, "volume_attach", "POST", "/v1/volumes/{volume}:attach", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON, handle_volume_attach),
        R(ROUTE_VOLUME_ATTACHMENT_GET, "volume_attachment_get", "GET", "/v1/volumes/{volume}/attachments/{sandbox}",
          HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_volume_attachment_get),
        R(ROUTE_VOLUME_DETACH, "volume_detach", "POST", "/v1/volumes/{volume}/attachments/{sandbox}:detach",
          HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_volume_detach),
        RI(ROUTE_VOLUME_BACKUP, "volume_backup", "POST", "/v1/volumes/{volume}:backup", HTTP_ACCESS_FULL,
           HTTP_BODY_JSON_OR_EMPTY, handle_volume_backup),
        R(ROUTE_VOLUME_BACKUP_POLICY, "volume_backup_policy", "POST", "/v1/volumes/{volume}:backup-policy",
          HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_volume_backup_policy),
        R(ROUTE_VOLUME_BACKUPS, "volume_backups", "GET", "/v1/volume-backups", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_volume_backups_list),
        R(ROUTE_VOLUME_BACKUP_GET, "volume_backup_get", "GET", "/v1/volume-backups/{backup}", HTTP_ACCESS_READ,
          HTTP_BODY_NONE, handle_volume_backup_get),
        RI(ROUTE_VOLUME_BACKUP_DELETE, "volume_backup_delete", "DELETE", "/v1/volume-backups/{backup}",
           HTTP_ACCESS_FULL, HTTP_BODY_NONE, handle_volume_backup_delete),
        RI(ROUTE_VOLUME_BACKUP_DELETE_POST, "volume_backup_delete_post", "POST", "/v1/volume-backups/{backup}:delete",
           HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_volume_backup_delete),
        R(ROUTE_INTERP_RUN, "interpreter_run", "POST", SBX "/interpreter:run", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_interpreter_run),
        R(ROUTE_INTERP_CONTEXT_LIST, "interpreter_context_list", "GET", SBX "/interpreter/contexts",
          HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_interpreter_contexts),
        R(ROUTE_INTERP_CONTEXT_CREATE, "interpreter_context_create", "POST", SBX "/interpreter/contexts",
          HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_interpreter_contexts),
        R(ROUTE_INTERP_CONTEXT_RESTART, "interpreter_context_restart", "POST",
          SBX "/interpreter/contexts/{context}:restart", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
          handle_interpreter_contexts),
        R(ROUTE_INTERP_CONTEXT_INTERRUPT, "interpreter_context_interrupt", "POST",
          SBX "/interpreter/contexts/{context}:interrupt", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
          handle_interpreter_contexts),
        R(ROUTE_INTERP_CONTEXT_DELETE, "interpreter_context_delete", "DELETE", SBX "/interpreter/contexts/{context}",
          HTTP_ACCESS_FULL, HTTP_BODY_NONE, handle_interpreter_contexts),
        R(ROUTE_INTERP_RESULT, "interpreter_result", "GET", SBX "/interpreter/contexts/{context}/results/{result}",
          HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_interpreter_result),
        /* MCP servers inside a sandbox (docs/mcp.md). The state answers
         * the URLs' guard token: full keys only, as the browser's. */
        R(ROUTE_MCP_CATALOG, "mcp_catalog", "GET", "/v1/mcp/catalog", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_mcp_catalog),
        R(ROUTE_SANDBOX_MCP_START, "sandbox_mcp_start", "POST", SBX "/mcp", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_sandbox_mcp_start),
        R(ROUTE_SANDBOX_MCP_GET, "sandbox_mcp_get", "GET", SBX "/mcp", HTTP_ACCESS_FULL, HTTP_BODY_NONE,
          handle_sandbox_mcp_get),
        R(ROUTE_SANDBOX_MCP_STOP, "sandbox_mcp_stop", "DELETE", SBX "/mcp", HTTP_ACCESS_FULL, HTTP_BODY_NONE,
          handle_sandbox_mcp_stop),
        /* The browser and the desktop (docs/computer-use.md). Reading the
         * browser's state answers a cdpUrl, which drives it: full keys only. */
        R(ROUTE_BROWSER_START, "browser_start", "POST", SBX "/browser:start", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_browser_start),
        R(ROUTE_BROWSER_GET, "browser_get", "GET", SBX "/browser", HTTP_ACCESS_FULL, HTTP_BODY_NONE,
          handle_browser_get),
        R(ROUTE_BROWSER_STOP, "browser_stop", "POST", SBX "/browser:stop", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_browser_stop),
        R(ROUTE_DESKTOP_START, "desktop_start", "POST", SBX "/desktop:start", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_desktop_start),
        R(ROUTE_DESKTOP_STOP, "desktop_stop", "POST", SBX "/desktop:stop", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_desktop_stop),
        R(ROUTE_DESKTOP_SCREENSHOT, "desktop_screenshot", "GET", SBX "/desktop/screenshot", HTTP_ACCESS_FULL,
          HTTP_BODY_NONE, handle_desktop_screenshot),
        R(ROUTE_DESKTOP_ACT, "desktop_act", "POST", SBX "/desktop:act", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_desktop_act),
        /* The screen to MP4, one recording at a time. Reading one or its
         * video shows the screen: full keys only, as a screenshot. */
        R(ROUTE_RECORDINGS_LIST, "recordings_list", "GET", SBX "/desktop/recordings", HTTP_ACCESS_FULL,
          HTTP_BODY_NONE, handle_recordings_list),
        R(ROUTE_RECORDING_START, "recording_start", "POST", SBX "/desktop/recordings", HTTP_ACCESS_FULL,
          HTTP_BODY_JSON_OR_EMPTY, handle_recording_start),
        R(ROUTE_RECORDING_GET, "recording_get", "GET", SBX "/desktop/recordings/{recording}", HTTP_ACCESS_FULL,
          HTTP_BODY_NONE, handle_recording_get),
        R(ROUTE_RECORDING_DELETE, "recording_delete", "DELETE", SBX "/desktop/recordings/{recording}",
          HTTP_ACCESS_FULL, HTTP_BODY_NONE, handle_recording_delete),
        R(ROUTE_RECORDING_STOP, "recording_stop", "POST", SBX "/desktop/recordings/{recording}:stop",
          HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY, handle_recording_stop),
        R(ROUTE_RECORDING_VIDEO, "recording_video", "GET", SBX "/desktop/recordings/{recording}/video",
          HTTP_ACCESS_FULL, HTTP_BODY_NONE, handle_recording_video),
};
const size_t api_n_routes = ELEMENTSOF(api_routes);

int route_parse(const char *method, const char *url, Route *ret) {
        return http_route_match(api_routes, api_n_routes, method, url, ret);
}

static const HttpRoute *route_def(RouteKind k) {
        for (size_t i = 0; i < api_n_routes; i++)
                if (api_routes[i].kind == (int)k)
                        return &api_routes[i];
        return NULL;
}

const char *route_name(RouteKind k) {
        const HttpRoute *d = route_def(k);
        return d ? d->name : "unknown";
}

bool route_needs_auth(RouteKind k) {
        const HttpRoute *d = route_def(k);
        return !d || d->access != HTTP_ACCESS_PUBLIC;
}

bool route_needs_full_access(RouteKind k) {
        const HttpRoute *d = route_def(k);
        return !d || d->access == HTTP_ACCESS_FULL || d->access == HTTP_ACCESS_ADMIN;
}
