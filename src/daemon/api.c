#include "daemon/api.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/agent_client.h"
#include "daemon/api_egress.h"
#include "daemon/api_exec.h"
#include "daemon/api_files.h"
#include "daemon/api_images.h"
#include "daemon/api_interpreter.h"
#include "daemon/api_keys.h"
#include "daemon/api_sandboxes.h"
#include "daemon/api_system.h"
#include "daemon/request.h"

#define R(k, n, m, p, a, b, h) { .kind = (k), .name = (n), .method = (m), .path = (p), .access = (a), .body = (b), .handler = (h) }
#define SBX "/v1/sandboxes/{sandbox}"

/* Every route of the API. For one path, the order of its methods here is the
 * order of a 405's Allow header. */
const HttpRoute api_routes[] = {
        R(ROUTE_HEALTHZ, "healthz", "GET", "/healthz", HTTP_ACCESS_PUBLIC, HTTP_BODY_NONE, handle_healthz),
        R(ROUTE_METRICS, "metrics", "GET", "/metrics", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_metrics),
        R(ROUTE_INFO, "info", "GET", "/v1/info", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_info),
        R(ROUTE_LIMITS, "limits", "GET", "/v1/limits", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_limits),
        R(ROUTE_KEYS_LIST, "keys_list", "GET", "/v1/keys", HTTP_ACCESS_FULL, HTTP_BODY_NONE, handle_keys_list),
        R(ROUTE_KEYS_CREATE, "keys_create", "POST", "/v1/keys", HTTP_ACCESS_FULL, HTTP_BODY_JSON, handle_keys_create),
        R(ROUTE_KEY_REVOKE, "key_revoke", "DELETE", "/v1/keys/{key}", HTTP_ACCESS_FULL, HTTP_BODY_NONE,
          handle_key_revoke),
        R(ROUTE_USAGE, "usage", "GET", "/v1/usage", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_usage),
        /* POST /v1/trial mints a key: its handler refuses it but on loopback. */
        R(ROUTE_TRIAL, "trial", "POST", "/v1/trial", HTTP_ACCESS_PUBLIC, HTTP_BODY_NONE, handle_trial),
        R(ROUTE_SECRETS_LIST, "secrets_list", "GET", "/v1/egress-secrets", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_secrets_list),
        R(ROUTE_SECRET_GET, "secret_get", "GET", "/v1/egress-secrets/{secret}", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_secret_get),
        R(ROUTE_SECRET_PUT, "secret_put", "PUT", "/v1/egress-secrets/{secret}", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_secret_put),
        R(ROUTE_SECRET_DELETE, "secret_delete", "DELETE", "/v1/egress-secrets/{secret}", HTTP_ACCESS_FULL,
          HTTP_BODY_NONE, handle_secret_delete),
        R(ROUTE_IMAGES, "images", "GET", "/v1/images", HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_images),
        R(ROUTE_IMAGE_BUILD, "image_build", "POST", "/v1/images/{image}:build", HTTP_ACCESS_FULL, HTTP_BODY_NONE,
          handle_image_build),
        R(ROUTE_SANDBOX_LIST, "sandbox_list", "GET", "/v1/sandboxes", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_sandbox_list),
        R(ROUTE_SANDBOX_CREATE, "sandbox_create", "POST", "/v1/sandboxes", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
          handle_sandbox_create),
        R(ROUTE_SANDBOX_GET, "sandbox_get", "GET", SBX, HTTP_ACCESS_READ, HTTP_BODY_NONE, handle_sandbox_get),
        R(ROUTE_SANDBOX_DELETE, "sandbox_delete", "DELETE", SBX, HTTP_ACCESS_FULL, HTTP_BODY_NONE,
          handle_sandbox_delete),
        { .kind = ROUTE_SANDBOX_EXEC, .name = "exec", .method = "POST", .path = SBX ":exec",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_JSON, .handler = handle_exec,
          /* JSON bodies are small, but for an exec's stdin (16 MiB, 4/3 of
           * that in base64). */
          .max_body = REQ_MAX_EXEC_BODY,
          .too_large_hint = "send large inputs as a file (PUT .../files/content) and redirect" },
        R(ROUTE_SANDBOX_STOP, "stop", "POST", SBX ":stop", HTTP_ACCESS_FULL, HTTP_BODY_JSON_OR_EMPTY,
          handle_sandbox_stop),
        R(ROUTE_SANDBOX_EXTEND, "extend", "POST", SBX ":extend", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_sandbox_extend),
        R(ROUTE_SANDBOX_NETWORK, "network", "PUT", SBX "/network", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_sandbox_network),
        R(ROUTE_SANDBOX_EGRESS, "sandbox_egress", "GET", SBX "/egress", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_sandbox_egress),
        R(ROUTE_FILES_READ, "files_read", "GET", SBX "/files/content", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_files_read),
        { .kind = ROUTE_FILES_WRITE, .name = "files_write", .method = "PUT", .path = SBX "/files/content",
          .access = HTTP_ACCESS_FULL, .body = HTTP_BODY_STREAM, .handler = handle_files_write,
          .upload = &files_upload },
        R(ROUTE_FILES_LIST, "files_list", "GET", SBX "/files/list", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_files_list),
        R(ROUTE_FILES_STAT, "files_stat", "GET", SBX "/files/stat", HTTP_ACCESS_READ, HTTP_BODY_NONE,
          handle_files_stat),
        R(ROUTE_FILES_MKDIR, "files_mkdir", "POST", SBX "/files:mkdir", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_files_mkdir),
        R(ROUTE_FILES_REMOVE, "files_remove", "POST", SBX "/files:remove", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_files_remove),
        R(ROUTE_FILES_RENAME, "files_rename", "POST", SBX "/files:rename", HTTP_ACCESS_FULL, HTTP_BODY_JSON,
          handle_files_rename),
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
        return !d || d->access == HTTP_ACCESS_FULL;
}

void api_agent_error(json_t *result, const char *path, ApiError *e) {
        const char *msg = NULL;
        const char *code = agent_result_error(result, &msg);
        if (!code)
                code = "internal";
        /* The agent's message is about the sandbox's own files: safe to pass on,
         * but bounded. */
        char text[300];
        if (path)
                snprintf(text, sizeof(text), "%.180s: %.100s", path, msg ? msg : code);
        else
                snprintf(text, sizeof(text), "%.200s", msg ? msg : code);
        static const struct {
                const char *agent;
                int status;
                const char *code;
        } map[] = {
                { "invalid", 400, "invalid_request" },          { "not_found", 404, "not_found" },
                { "exists", 409, "conflict" },                  { "not_a_directory", 400, "invalid_request" },
                { "is_a_directory", 400, "invalid_request" },   { "not_empty", 409, "conflict" },
                { "permission_denied", 403, "forbidden" },      { "no_space", 413, "payload_too_large" },
                { "too_large", 413, "payload_too_large" },      { "busy", 409, "conflict" },
                { "io", 500, "internal" },                      { "internal", 500, "internal" },
        };
        for (size_t i = 0; i < ELEMENTSOF(map); i++)
                if (strcmp(code, map[i].agent) == 0) {
                        api_error(e, map[i].status, map[i].code, NULL, "%s", text);
                        return;
                }
        api_error(e, 500, "internal", NULL, "%s", text);
}

int api_sandbox_error(const SandboxError *se, ApiError *e) {
        static const struct {
                int status;
                const char *code;
        } map[] = {
                [SANDBOX_ERR_INTERNAL] = { 500, "internal" },
                [SANDBOX_ERR_INVALID] = { 400, "invalid_request" },
                [SANDBOX_ERR_NOT_FOUND] = { 404, "not_found" },
                [SANDBOX_ERR_CONFLICT] = { 409, "conflict" },
                [SANDBOX_ERR_OVER_BUDGET] = { 409, "budget_exceeded" },
                [SANDBOX_ERR_SPENDING] = { 402, "spending_limit_reached" },
                [SANDBOX_ERR_TOO_LARGE] = { 413, "payload_too_large" },
                [SANDBOX_ERR_TOO_MANY] = { 429, "rate_limited" },
                [SANDBOX_ERR_UNAVAILABLE] = { 503, "unavailable" },
        };
        unsigned k = (unsigned)se->kind < ELEMENTSOF(map) ? (unsigned)se->kind : SANDBOX_ERR_INTERNAL;
        return api_error(e, map[k].status, map[k].code, se->hint[0] ? se->hint : NULL, "%s", se->message);
}

int api_sandbox_acquire(Req *r, Sandbox **ret, ApiError *e) {
        SandboxError se;
        if (sandbox_acquire(r->app->manager, &r->key, r->route.sandbox_id, ret, &se) < 0)
                return api_sandbox_error(&se, e);
        return 0;
}

int api_open_stream(Sandbox *sb, json_t *request, ChanStream **ret, ApiError *e) {
        SandboxError se;
        if (sandbox_open_stream(sb, request, ret, &se) < 0)
                return api_sandbox_error(&se, e);
        return 0;
}

json_t *api_image_json(const ImageInfo *info) {
        return json_pack("{s:s,s:b,s:o,s:I}", "name", info->name, "built", info->built, "builtAt",
                         info->built_at[0] ? json_string(info->built_at) : json_null(), "sizeBytes",
                         (json_int_t)info->size_bytes);
}

static int image_append(void *userdata, const ImageInfo *info) {
        json_t *j = api_image_json(info);
        return j && json_array_append_new(userdata, j) == 0 ? 0 : -ENOMEM;
}

json_t *api_images_json(const DaemonConfig *cfg) {
        json_t *arr = json_array();
        if (arr && images_list(cfg, image_append, arr) < 0) {
                json_decref(arr);
                return NULL;
        }
        return arr;
}
