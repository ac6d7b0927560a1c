/* MCP servers inside a sandbox (docs/mcp.md, "Inside a sandbox"): a catalog
 * of stdio servers the default image holds, and a gateway (mcp-proxy, in the
 * image) that runs the ones asked for as the sandbox's user and serves each
 * over MCP's streamable HTTP at /servers/ID/mcp on a port of the sandbox's
 * loopback. That port is shared as a private preview, so the URLs go
 * through the preview listener and its token guards them, as the browser's
 * cdpUrl is (docs/computer-use.md). The gateway's program
 * (src/mcp/runtime_mcp_gateway.py) runs as an exec does; its state lives
 * in the sandbox and ends with it. */
#include "daemon/api/api_mcp_inside.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "daemon/api/api.h"
#include "daemon/http/request.h"
#include "daemon/manager/previews.h"

static const char gateway_program[] =
#include "mcp_gateway_program.inc"
        ;
static const char http_program[] =
#include "mcp_http_program.inc"
        ;

/* The program's exit statuses (runtime_mcp_gateway.py). */
#define GW_EXIT_MISSING 10
#define GW_EXIT_NOT_RUNNING 11
#define GW_EXIT_BUSY 16
#define GW_EXIT_NO_SECRET 17
#define GW_EXIT_PORT_BUSY 18

#define MCP_PORT_DEFAULT 8811
#define MCP_PORT_MIN 1024
#define MCP_PORT_MAX 65535
#define MCP_SERVERS_MAX 8
#define MCP_SECRETS_MAX 16
#define MCP_NAME_MAX 64
/* The start waits for every server to come up (40 s in the program). */
#define MCP_START_TIMEOUT_MS 60000
#define MCP_VERB_TIMEOUT_MS 20000
#define MCP_OUTPUT_MAX (64u * 1024u)
/* The program's restarts of one server's gateway (RESTARTS_MAX). */
#define MCP_RESTARTS_MAX 5

#define MCP_SERVERS_DIR "/opt/runtime-mcp/servers/node_modules/@modelcontextprotocol"

typedef struct CatalogEntry {
        const char *id, *description, *package;
        const char *const *argv;
        const char *const *env; /* NAME=VALUE pairs it always gets */
        const char *const *secrets; /* the env names it takes secrets in */
} CatalogEntry;

static const char *const none[] = { NULL };
static const char *const filesystem_argv[] = { "node", MCP_SERVERS_DIR "/server-filesystem/dist/index.js", "/workspace",
                                               NULL };
static const char *const memory_argv[] = { "node", MCP_SERVERS_DIR "/server-memory/dist/index.js", NULL };
static const char *const memory_env[] = { "MEMORY_FILE_PATH=/workspace/.mcp-memory.jsonl", NULL };
/* Our own server (src/mcp/runtime_mcp_http.py) on the gateway's Python,
 * whose venv holds the MCP SDK; -I: no PYTHON* variable or user site steers
 * it. */
static const char *const http_argv[] = { "/opt/runtime-mcp/venv/bin/python3", "-I", "-c", http_program, NULL };
static const char *const http_secrets[] = { "HTTP_BEARER_TOKEN", NULL };

static const CatalogEntry catalog[] = {
        { "filesystem",
          "Reads, writes, moves and searches files under /workspace (and nowhere else)",
          "@modelcontextprotocol/server-filesystem", filesystem_argv, none, none },
        { "memory",
          "A knowledge graph of entities, relations and observations, kept in /workspace/.mcp-memory.jsonl",
          "@modelcontextprotocol/server-memory", memory_argv, memory_env, none },
        { "http",
          "Sends HTTP requests through the sandbox's egress policy, with a secret as the bearer token if one is "
          "given",
          "runtime-mcp-http (on the MCP Python SDK)", http_argv, none, http_secrets },
};

static const CatalogEntry *catalog_find(const char *id) {
        for (size_t i = 0; i < ELEMENTSOF(catalog); i++)
                if (strcmp(catalog[i].id, id) == 0)
                        return &catalog[i];
        return NULL;
}

static json_t *strings_json(const char *const *v) {
        json_t *a = json_array();
        for (size_t i = 0; a && v[i]; i++)
                json_array_append_new(a, json_string(v[i]));
        return a;
}

enum MHD_Result handle_mcp_catalog(Req *r) {
        json_t *data = json_array();
        for (size_t i = 0; data && i < ELEMENTSOF(catalog); i++)
                json_array_append_new(data, json_pack("{s:s,s:s,s:s,s:s,s:o,s:b,s:s}", "id", catalog[i].id,
                                                      "description", catalog[i].description, "transport",
                                                      "streamable-http", "package", catalog[i].package, "secrets",
                                                      strings_json(catalog[i].secrets), "inImage", 1, "image",
                                                      "default"));
        if (!data)
                return reply_internal(r);
        return reply_json(r, 200, json_pack("{s:o}", "data", data));
}

/* An environment variable's name: [A-Za-z_][A-Za-z0-9_]*, and an egress
 * secret's, which has the same shape. */
static bool env_name_ok(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > MCP_NAME_MAX || (s[0] >= '0' && s[0] <= '9'))
                return false;
        return strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") == n;
}

static bool listed(const char *const *v, const char *s) {
        for (size_t i = 0; v[i]; i++)
                if (strcmp(v[i], s) == 0)
                        return true;
        return false;
}

/* One server of a start: {"id", "secrets": {ENV: SECRET}} into the
 * program's {"id", "argv", "env", "secrets"}. */
static int server_spec(json_t *s, size_t i, json_t *seen, json_t **ret, ApiError *e) {
        if (!json_is_object(s))
                return api_error(e, 400, "invalid_request", "{\"id\": \"filesystem\"}", "servers[%zu] must be an object",
                                 i);
        const char *k;
        json_t *v;
        json_object_foreach(s, k, v) {
                if (strcmp(k, "id") != 0 && strcmp(k, "secrets") != 0)
                        return api_error(e, 400, "invalid_request", "a server has an id and secrets",
                                         "servers[%zu]: unknown field %.64s", i, k);
        }
        const char *id = json_string_value(json_object_get(s, "id"));
        if (!id)
                return api_error(e, 400, "invalid_request", "GET /v1/mcp/catalog lists them",
                                 "servers[%zu].id must be a catalog id", i);
        const CatalogEntry *c = catalog_find(id);
        if (!c)
                return api_error(e, 404, "not_found", "GET /v1/mcp/catalog lists them", "no server \"%.64s\" in the catalog",
                                 id);
        if (json_object_get(seen, id))
                return api_error(e, 400, "invalid_request", NULL, "server \"%s\" is asked for twice", id);
        json_object_set_new(seen, id, json_true());
        json_t *sec = json_object_get(s, "secrets");
        _cleanup_json_ json_t *secrets = json_object();
        if (sec && !json_is_null(sec)) {
                if (!json_is_object(sec) || json_object_size(sec) > MCP_SECRETS_MAX)
                        return api_error(e, 400, "invalid_request", "{\"ENV_NAME\": \"SECRET_NAME\"}",
                                         "servers[%zu].secrets must map at most %d environment names to secret names", i,
                                         MCP_SECRETS_MAX);
                json_object_foreach(sec, k, v) {
                        const char *name = json_string_value(v);
                        if (!env_name_ok(k) || !name || !env_name_ok(name))
                                return api_error(e, 400, "invalid_request", "{\"ENV_NAME\": \"SECRET_NAME\"}",
                                                 "servers[%zu].secrets: \"%.64s\" must map an environment name to an "
                                                 "egress secret's name",
                                                 i, k);
                        if (!listed(c->secrets, k))
                                return api_error(e, 400, "invalid_request", "GET /v1/mcp/catalog lists what each takes",
                                                 "server \"%s\" takes no secret %.64s", id, k);
                        json_object_set(secrets, k, v);
                }
        }
        json_t *env = json_object();
        for (size_t j = 0; env && c->env[j]; j++) {
                const char *eq = strchr(c->env[j], '=');
                _cleanup_free_ char *name = strndup(c->env[j], (size_t)(eq - c->env[j]));
                if (!name || json_object_set_new(env, name, json_string(eq + 1)) < 0)
                        json_decref(TAKE_PTR(env));
        }
        *ret = env ? json_pack("{s:s,s:o,s:o,s:O}", "id", id, "argv", strings_json(c->argv), "env", env, "secrets",
                               secrets)
                   : NULL;
        return *ret ? 0 : -ENOMEM;
}

/* The program's argument from a start's body, and whether to replace. */
static int start_spec(json_t *body, char **ret_spec, bool *ret_replace, ApiError *e) {
        static const char *const known[] = { "servers", "port", "replace", "public", NULL };
        const char *k;
        json_t *v;
        json_object_foreach(body, k, v) {
                if (!listed(known, k))
                        return api_error(e, 400, "invalid_request", NULL, "unknown field %.64s", k);
        }
        json_t *pub = json_object_get(body, "public");
        if (pub && !json_is_null(pub) && !json_is_false(pub))
                return api_error(e, 501, "not_implemented",
                                 "leave public out: the URLs carry a preview token in their headers, fresh on each GET",
                                 "public MCP URLs are not offered by this server");
        json_t *rep = json_object_get(body, "replace");
        if (rep && !json_is_null(rep) && !json_is_boolean(rep))
                return api_error(e, 400, "invalid_request", NULL, "replace must be true or false");
        *ret_replace = json_is_true(rep);
        json_t *jp = json_object_get(body, "port");
        int64_t port = MCP_PORT_DEFAULT;
        if (jp && !json_is_null(jp)) {
                if (!json_is_integer(jp) || json_integer_value(jp) < MCP_PORT_MIN || json_integer_value(jp) > MCP_PORT_MAX)
                        return api_error(e, 400, "invalid_request", NULL, "port must be a whole number from %d to %d",
                                         MCP_PORT_MIN, MCP_PORT_MAX);
                port = json_integer_value(jp);
        }
        json_t *servers = json_object_get(body, "servers");
        if (!json_is_array(servers) || json_array_size(servers) == 0 || json_array_size(servers) > MCP_SERVERS_MAX)
                return api_error(e, 400, "invalid_request", "[{\"id\": \"filesystem\"}]",
                                 "servers must be a list of 1 to %d servers of the catalog", MCP_SERVERS_MAX);
        _cleanup_json_ json_t *seen = json_object();
        _cleanup_json_ json_t *list = json_array();
        if (!seen || !list)
                return -ENOMEM;
        size_t i;
        json_array_foreach(servers, i, v) {
                json_t *s = NULL;
                int rc = server_spec(v, i, seen, &s, e);
                if (rc < 0)
                        return rc;
                json_array_append_new(list, s);
        }
        _cleanup_json_ json_t *spec = json_pack("{s:I,s:O}", "port", (json_int_t)port, "servers", list);
        *ret_spec = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
        return *ret_spec ? 0 : -ENOMEM;
}

/* The microVM is left out as the browser is: the preview route to its
 * guest is not tested under the software emulation these hosts run it
 * with, where Node.js servers take minutes to start. */
static int driver_supported(Req *r, ApiError *e) {
        SandboxRow row;
        SandboxError se;
        if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se) < 0)
                return api_sandbox_error(&se, e);
        bool microvm = row.spec.driver == SANDBOX_DRIVER_MICROVM;
        sandbox_row_done(&row);
        if (microvm)
                return api_error(e, 501, "not_implemented", "create the sandbox with driver \"namespace\" or \"gvisor\"",
                                 "MCP servers run on the namespace and gvisor drivers, not on the microVM (untested "
                                 "there, and under emulation Node.js servers take minutes to start)");
        if (!r->app->previews)
                return api_error(e, 501, "previews_unavailable", "start runtimed with --preview-listen ADDR:PORT",
                                 "a sandbox's MCP servers are served on the preview listener, and this server has none");
        return 0;
}

static int gateway_error(Req *r, int code, const char *out, ApiError *e) {
        switch (code) {
        case GW_EXIT_MISSING:
                return api_error(e, 409, "conflict", "create the sandbox with image \"default\"",
                                 "sandbox %s's image has no MCP gateway (%.64s)", r->route.sandbox_id, out);
        case GW_EXIT_NOT_RUNNING:
                return -ESRCH;
        case GW_EXIT_BUSY:
                return api_error(e, 409, "conflict", "pass replace: true to stop them and start these",
                                 "MCP servers run in sandbox %s already (%.200s)", r->route.sandbox_id, out);
        case GW_EXIT_NO_SECRET:
                return api_error(e, 400, "invalid_request",
                                 "PUT /v1/egress-secrets/{name}, and name it in the sandbox's secrets at its create",
                                 "sandbox %s has no secret %.64s", r->route.sandbox_id, out);
        case GW_EXIT_PORT_BUSY:
                return api_error(e, 409, "conflict", "choose another port",
                                 "port %.8s of sandbox %s is in use by another program", out, r->route.sandbox_id);
        default:
                return api_error(e, 500, "internal", NULL, "the MCP gateway's command failed in the sandbox");
        }
}

static int run_gateway(Req *r, const char *verb, const char *a1, const char *a2, int64_t timeout_ms, char **ret_out,
                       ApiError *e) {
        _cleanup_json_ json_t *argv = json_pack("[s,s,s,s]", "python3", "-c", gateway_program, verb);
        if (argv && a1)
                json_array_append_new(argv, json_string(a1));
        if (argv && a2)
                json_array_append_new(argv, json_string(a2));
        if (!argv)
                return -ENOMEM;
        int code = 0;
        _cleanup_free_ char *out = NULL;
        int rc = api_sandbox_script(r, argv, timeout_ms, MCP_OUTPUT_MAX, &out, &code, e);
        if (rc < 0)
                return rc;
        if (code != 0)
                return gateway_error(r, code, out, e);
        *ret_out = TAKE_PTR(out);
        return 0;
}

/* The answer from the program's state: each server's URL on the preview
 * listener, and the header that carries the preview's token. */
static json_t *state_json(Req *r, const char *out, ApiError *e) {
        _cleanup_json_ json_t *st = json_loads(out, 0, NULL);
        json_t *servers = json_object_get(st, "servers");
        json_t *port = json_object_get(st, "port");
        if (!json_is_array(servers) || !json_is_integer(port) || json_integer_value(port) < MCP_PORT_MIN ||
            json_integer_value(port) > MCP_PORT_MAX) {
                log_error(r->rid, "the MCP gateway of %s answered %.200s", r->route.sandbox_id, out);
                api_error(e, 500, "internal", NULL, "the MCP gateway gave no state");
                return NULL;
        }
        char base[400], token[PREVIEW_TOKEN_MAX];
        if (api_preview_share(r, (unsigned)json_integer_value(port), base, sizeof base, token, e) < 0)
                return NULL;
        size_t blen = strlen(base);
        while (blen > 0 && base[blen - 1] == '/')
                base[--blen] = '\0';
        _cleanup_json_ json_t *list = json_array();
        size_t i;
        json_t *s;
        json_array_foreach(servers, i, s) {
                const char *id = json_string_value(json_object_get(s, "id"));
                const char *status = json_string_value(json_object_get(s, "status"));
                /* The state is a file of the sandbox, which its user may
                 * write: only catalog ids, known statuses and a bounded
                 * error pass. */
                if (!id || !status || !catalog_find(id))
                        continue;
                if (strcmp(status, "installing") != 0 && strcmp(status, "running") != 0)
                        status = "failed";
                char url[600], err[601] = "";
                snprintf(url, sizeof url, "%s/servers/%s/mcp", base, id);
                const char *why = json_string_value(json_object_get(s, "error"));
                if (why)
                        snprintf(err, sizeof err, "%s", why);
                json_t *je = why ? json_string(err) : NULL; /* NULL too where the cut split a character */
                json_int_t restarts = json_integer_value(json_object_get(s, "restarts"));
                if (restarts < 0 || restarts > MCP_RESTARTS_MAX)
                        restarts = 0;
                json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:s,s:o,s:I}", "id", id, "status", status, "url",
                                                      url, "transport", "streamable-http", "error",
                                                      je ? je : json_null(), "restarts", restarts));
        }
        json_t *j = json_pack("{s:b,s:I,s:O,s:{s:s},s:b}", "running", json_is_true(json_object_get(st, "running")),
                              "port", json_integer_value(port), "servers", list, "headers", PREVIEW_TOKEN_HEADER, token,
                              "public", 0);
        explicit_bzero(token, sizeof token);
        return j;
}

static enum MHD_Result reply_failed(Req *r, int rc, const ApiError *e) {
        if (rc == -EPIPE)
                return MHD_NO;
        return e->code ? reply_error(r, e) : reply_internal(r);
}

static enum MHD_Result reply_stopped_state(Req *r) {
        return reply_json(r, 200, json_pack("{s:b,s:[],s:{},s:b}", "running", 0, "servers", "headers", "public", 0));
}

enum MHD_Result handle_sandbox_mcp_start(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *spec = NULL, *out = NULL;
        bool replace = false;
        int rc = start_spec(r->json, &spec, &replace, &e);
        if (rc == 0)
                rc = driver_supported(r, &e);
        if (rc == 0)
                rc = run_gateway(r, "start", spec, replace ? "1" : "0", MCP_START_TIMEOUT_MS, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        json_t *j = state_json(r, out, &e);
        return j ? reply_json(r, 200, j) : reply_failed(r, -EIO, &e);
}

enum MHD_Result handle_sandbox_mcp_get(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *out = NULL;
        int rc = driver_supported(r, &e);
        if (rc == 0)
                rc = run_gateway(r, "get", NULL, NULL, MCP_VERB_TIMEOUT_MS, &out, &e);
        if (rc == -ESRCH)
                return reply_stopped_state(r);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        json_t *j = state_json(r, out, &e);
        return j ? reply_json(r, 200, j) : reply_failed(r, -EIO, &e);
}

enum MHD_Result handle_sandbox_mcp_stop(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *out = NULL;
        int rc = api_sandbox_owned(r, &e);
        if (rc == 0)
                rc = run_gateway(r, "stop", NULL, NULL, MCP_VERB_TIMEOUT_MS, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        return reply_json(r, 200, json_pack("{s:b,s:b}", "stopped", strcmp(out, "1") == 0, "running", 0));
}
