/* The MCP endpoint: the streamable HTTP transport's POST and DELETE on
 * /mcp, its sessions, and the tools, each a sandbox operation the REST
 * routes offer, run here under the request's key. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/base64.h"
#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/api/api_mcp.h"
#include "daemon/http/request.h"
#include "daemon/manager/agent_client.h"
#include "daemon/model/mcp_rpc.h"
#include "proto/proto.h"

#define SESSION_ID_BYTES 16
#define POLL_MS 250
#define OP_TIMEOUT_MS 120000
#define WRITE_CHUNK (64u * 1024u)
/* What a tool answers into a model's context: a file read whole, and an
 * exec's output kept per stream (its tail, as the REST exec keeps it). */
#define MCP_MAX_FILE (1024u * 1024u)
#define MCP_MAX_OUTPUT (1024u * 1024u)
#define MCP_DEFAULT_OUTPUT (64u * 1024u)
/* An exec waits in its request: below the HTTP request's own timeout. */
#define MCP_MAX_EXEC_MS 300000
#define MCP_LIST_MAX 1000u

/* ---- sessions ---- */

typedef struct McpSession {
        bool used;
        char id[2 * SESSION_ID_BYTES + 1];
        char key_id[40]; /* the key that opened it: no other key uses it */
        char owner[128];
        McpVersion version;
        uint64_t last_used_ms; /* monotonic */
} McpSession;

struct McpSessions {
        pthread_mutex_t lock;
        McpSession s[MCP_SESSIONS_MAX];
};

McpSessions *mcp_sessions_new(void) {
        McpSessions *t = calloc(1, sizeof(*t));
        if (t)
                pthread_mutex_init(&t->lock, NULL);
        return t;
}

void mcp_sessions_free(McpSessions *t) {
        if (!t)
                return;
        pthread_mutex_destroy(&t->lock);
        free(t);
}

static bool session_expired(const McpSession *x, uint64_t now) {
        return x->used && now - x->last_used_ms > (uint64_t)MCP_SESSION_IDLE_S * 1000u;
}

/* A new session for the key; past the owner's bound its least recently
 * used one ends (its client gets a 404 and initializes again, as the
 * transport has it). -EUSERS when every slot holds a live session. */
static int session_open(McpSessions *t, const KeyInfo *key, McpVersion v, char ret_id[2 * SESSION_ID_BYTES + 1]) {
        char id[2 * SESSION_ID_BYTES + 1];
        int rc = random_hex(id, SESSION_ID_BYTES);
        if (rc < 0)
                return rc;
        uint64_t now = time_now_mono_ms();
        pthread_mutex_lock(&t->lock);
        McpSession *free_slot = NULL, *oldest = NULL;
        unsigned owned = 0;
        for (size_t i = 0; i < MCP_SESSIONS_MAX; i++) {
                McpSession *x = &t->s[i];
                if (session_expired(x, now))
                        x->used = false;
                if (!x->used) {
                        if (!free_slot)
                                free_slot = x;
                        continue;
                }
                if (strcmp(x->owner, key->owner) != 0)
                        continue;
                owned++;
                if (!oldest || x->last_used_ms < oldest->last_used_ms)
                        oldest = x;
        }
        McpSession *slot = owned >= MCP_SESSIONS_PER_OWNER ? oldest : free_slot;
        if (slot) {
                *slot = (McpSession){ .used = true, .version = v, .last_used_ms = now };
                snprintf(slot->id, sizeof slot->id, "%s", id);
                snprintf(slot->key_id, sizeof slot->key_id, "%s", key->id);
                snprintf(slot->owner, sizeof slot->owner, "%s", key->owner);
        }
        pthread_mutex_unlock(&t->lock);
        if (!slot)
                return -EUSERS;
        memcpy(ret_id, id, sizeof id);
        return 0;
}

/* The session id names, for the key: 0 and its version (its use noted);
 * -ENOENT when there is none, it expired, or another key opened it. */
static int session_use(McpSessions *t, const KeyInfo *key, const char *id, bool end, McpVersion *ret) {
        if (!id || strlen(id) != 2 * SESSION_ID_BYTES)
                return -ENOENT;
        uint64_t now = time_now_mono_ms();
        int rc = -ENOENT;
        pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < MCP_SESSIONS_MAX; i++) {
                McpSession *x = &t->s[i];
                if (!x->used || strcmp(x->id, id) != 0)
                        continue;
                if (session_expired(x, now)) {
                        x->used = false;
                        break;
                }
                if (strcmp(x->key_id, key->id) != 0)
                        break;
                x->last_used_ms = now;
                if (ret)
                        *ret = x->version;
                if (end)
                        x->used = false;
                rc = 0;
                break;
        }
        pthread_mutex_unlock(&t->lock);
        return rc;
}

/* ---- tool results ---- */

/* A tool's answer: its JSON as text (every client reads that) and as
 * structuredContent (the clients of 2025-06-18 on read that). Steals j. */
static json_t *tool_ok(McpVersion v, json_t *j) {
        if (!j)
                return NULL;
        char *text = json_dumps(j, JSON_COMPACT);
        json_t *res = text ? json_pack("{s:[{s:s,s:s}],s:b}", "content", "type", "text", "text", text, "isError", 0)
                           : NULL;
        free(text);
        if (res && v >= MCP_V_2025_06_18 && json_is_object(j))
                json_object_set(res, "structuredContent", j);
        json_decref(j);
        return res;
}

/* A tool that ran and failed: isError, with the reason as the model reads
 * it (the API's code, message and hint). */
static json_t *tool_failed(const char *code, const char *hint, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static json_t *tool_failed(const char *code, const char *hint, const char *fmt, ...) {
        char msg[768];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        char text[1100];
        if (hint && *hint)
                snprintf(text, sizeof text, "%s: %s (%s)", code, msg, hint);
        else
                snprintf(text, sizeof text, "%s: %s", code, msg);
        return json_pack("{s:[{s:s,s:s}],s:b}", "content", "type", "text", "text", text, "isError", 1);
}

static json_t *tool_api_error(const ApiError *e) {
        return tool_failed(e->code ? e->code : "internal", e->hint, "%s",
                           e->code ? e->message : "the daemon could not do it; its log says why");
}

static json_t *tool_sandbox_error(const SandboxError *se) {
        ApiError e = { 0 };
        api_sandbox_error(se, &e);
        return tool_api_error(&e);
}

/* ---- arguments ---- */

typedef struct ToolCtx {
        Req *r;
        McpVersion version;
        json_t *args; /* an object */
} ToolCtx;

/* 0 when args names only fields of `known` (NULL-terminated); else a tool
 * error in *ret naming the first other. */
static int args_known(json_t *args, const char *const *known, json_t **ret) {
        const char *k;
        json_t *v;
        json_object_foreach(args, k, v) {
                bool hit = false;
                for (size_t i = 0; known[i] && !hit; i++)
                        hit = strcmp(k, known[i]) == 0;
                if (!hit) {
                        *ret = tool_failed("invalid_request", "the tool's inputSchema lists its arguments",
                                           "unknown argument %.64s", k);
                        return -EINVAL;
                }
        }
        return 0;
}

static int arg_string(json_t *args, const char *name, bool required, const char **out, json_t **ret) {
        json_t *v = json_object_get(args, name);
        *out = NULL;
        if (!v || json_is_null(v)) {
                if (!required)
                        return 0;
                *ret = tool_failed("invalid_request", NULL, "%s is required", name);
                return -EINVAL;
        }
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
                *ret = tool_failed("invalid_request", NULL, "%s must be a string", name);
                return -EINVAL;
        }
        *out = json_string_value(v);
        return 0;
}

static int arg_sandbox(ToolCtx *c, const char **id, json_t **ret) {
        if (arg_string(c->args, "sandboxId", true, id, ret) < 0)
                return -EINVAL;
        if (!route_sandbox_id_ok(*id)) {
                *ret = tool_failed("invalid_request", "list_sandboxes names yours",
                                   "sandboxId must be sbx_ and 20 hex digits");
                return -EINVAL;
        }
        /* The audit record names the sandbox asked for, as a REST route's
         * path does, found or not. */
        snprintf(c->r->audit_sandbox_id, sizeof c->r->audit_sandbox_id, "%s", *id);
        return 0;
}

static int arg_encoding(json_t *args, bool *ret_base64, json_t **ret) {
        const char *enc;
        if (arg_string(args, "encoding", false, &enc, ret) < 0)
                return -EINVAL;
        if (enc && strcmp(enc, "text") != 0 && strcmp(enc, "base64") != 0) {
                *ret = tool_failed("invalid_request", NULL, "encoding must be text or base64");
                return -EINVAL;
        }
        *ret_base64 = enc && strcmp(enc, "base64") == 0;
        return 0;
}

static int arg_path(json_t *args, const char *def, char **out, json_t **ret) {
        const char *p;
        if (arg_string(args, "path", !def, &p, ret) < 0)
                return -EINVAL;
        if (!p)
                p = def;
        ApiError e = { 0 };
        if (request_resolve_path(p, strlen(p), "path", out, &e) < 0) {
                *ret = tool_api_error(&e);
                return -EINVAL;
        }
        return 0;
}

/* A mutating tool with a read key is refused as the REST route is. */
static json_t *full_access_refused(ToolCtx *c) {
        if (c->r->key.access == KEY_ACCESS_FULL)
                return NULL;
        return tool_failed("forbidden", "use a key with full access", "this key has read access only");
}

/* In a fleet, a sandbox another host runs is that host's to serve: the
 * REST routes forward to it, this endpoint says where it is. Its owner's
 * only: another owner's sandbox is not found, here as anywhere. */
static int on_this_host(ToolCtx *c, const char *id, json_t **ret) {
        Fleet *fleet = c->r->app->fleet;
        if (!fleet || fleet_runs_here(fleet, id) || (fleet_alone(fleet) && fleet_single(fleet)))
                return 0;
        SandboxRow row;
        if (db_sandbox_get(c->r->app->db, id, &row) < 0)
                return 0; /* not found, or unreadable: the manager says so */
        const char *self = fleet_host_id(fleet);
        bool elsewhere = row.owner && strcmp(row.owner, c->r->key.owner) == 0 && row.host_id[0] &&
                         strcmp(row.host_id, self) != 0 && row.state != SANDBOX_LOST;
        if (elsewhere)
                *ret = tool_failed("unavailable", "connect the MCP client to that host's /mcp, or use the REST API, "
                                   "which forwards",
                                   "sandbox %s runs on host %s", id, row.host_id);
        sandbox_row_done(&row);
        return elsewhere ? -EREMOTE : 0;
}

static int acquire(ToolCtx *c, const char *id, Sandbox **sb, json_t **ret) {
        SandboxError se;
        if (on_this_host(c, id, ret) < 0)
                return -EREMOTE;
        if (sandbox_acquire(c->r->app->manager, &c->r->key, id, sb, &se) < 0) {
                *ret = tool_sandbox_error(&se);
                return -EINVAL;
        }
        return 0;
}

/* ---- the tools ---- */

static json_t *tool_create(ToolCtx *c) {
        static const char *const known[] = { "image", "driver", "timeoutSeconds", "name", NULL };
        json_t *err = full_access_refused(c);
        if (err || args_known(c->args, known, &err) < 0)
                return err;
        const DaemonConfig *cfg = c->r->app->cfg;
        ReqLimits lim = { cfg->max_vcpu, cfg->max_memory_mib, cfg->max_disk_mib };
        ApiError e = { 0 };
        CreateRequest cr;
        /* The REST create's parser and bounds, over the tool's fields. */
        _cleanup_json_ json_t *body = json_deep_copy(c->args);
        if (!body)
                return NULL;
        if (request_parse_create(body, &lim, &cr, &e) < 0)
                return tool_api_error(&e);
        if (request_apply_trial_shape(c->r->key.trial, body, &cr, &e) < 0) {
                create_request_done(&cr);
                return tool_api_error(&e);
        }
        SandboxError se;
        SandboxRow row;
        cr.pool_kernel_ok = true;
        int rc = sandbox_create(c->r->app->manager, &c->r->key, &cr, c->r->rid, &row, &se);
        create_request_done(&cr);
        if (rc < 0)
                return tool_sandbox_error(&se);
        snprintf(c->r->audit_sandbox_id, sizeof c->r->audit_sandbox_id, "%.*s", ROUTE_ID_LEN, row.id);
        if (row.state == SANDBOX_RUNNING)
                interpreter_prestart(c->r->app, &c->r->key, row.id);
        json_t *j = api_sandbox_json(c->r->app->manager, &row);
        sandbox_row_done(&row);
        return tool_ok(c->version, j);
}

typedef struct ListAcc {
        Manager *m;
        json_t *data;
} ListAcc;

static int list_one(void *userdata, SandboxRow *row) {
        ListAcc *a = userdata;
        json_t *j = api_sandbox_json(a->m, row);
        return j && json_array_append_new(a->data, j) == 0 ? 0 : -ENOMEM;
}

static json_t *tool_list_sandboxes(ToolCtx *c) {
        static const char *const known[] = { NULL };
        json_t *err = NULL;
        if (args_known(c->args, known, &err) < 0)
                return err;
        ListAcc a = { .m = c->r->app->manager, .data = json_array() };
        if (!a.data)
                return NULL;
        SandboxError se;
        if (sandbox_list(c->r->app->manager, &c->r->key, list_one, &a, &se) < 0) {
                json_decref(a.data);
                return tool_sandbox_error(&se);
        }
        return tool_ok(c->version, json_pack("{s:o}", "sandboxes", a.data));
}

static json_t *tool_delete(ToolCtx *c) {
        static const char *const known[] = { "sandboxId", NULL };
        const char *id;
        json_t *err = full_access_refused(c);
        if (err || args_known(c->args, known, &err) < 0 || arg_sandbox(c, &id, &err) < 0)
                return err;
        if (on_this_host(c, id, &err) < 0)
                return err;
        SandboxError se;
        if (sandbox_delete(c->r->app->manager, &c->r->key, id, c->r->rid, &se) < 0)
                return tool_sandbox_error(&se);
        return tool_ok(c->version, json_pack("{s:s,s:s}", "id", id, "state", "deleted"));
}

static json_t *tool_exec(ToolCtx *c) {
        static const char *const known[] = { "sandboxId", "command", "cwd", "env", "timeoutMs", "maxOutputBytes",
                                             NULL };
        const char *id, *command;
        json_t *err = full_access_refused(c);
        if (err || args_known(c->args, known, &err) < 0 || arg_sandbox(c, &id, &err) < 0 ||
            arg_string(c->args, "command", true, &command, &err) < 0)
                return err;
        json_t *t = json_object_get(c->args, "timeoutMs"), *mo = json_object_get(c->args, "maxOutputBytes");
        if (json_is_integer(t) && json_integer_value(t) > MCP_MAX_EXEC_MS)
                return tool_failed("invalid_request", "run longer work in the background (nohup ... &)",
                                   "timeoutMs must be at most %d here", MCP_MAX_EXEC_MS);
        if (json_is_integer(mo) && json_integer_value(mo) > (json_int_t)MCP_MAX_OUTPUT)
                return tool_failed("invalid_request", "redirect large output to a file and read_file a part",
                                   "maxOutputBytes must be at most %u", MCP_MAX_OUTPUT);
        /* The REST exec's parser over the tool's fields. */
        _cleanup_json_ json_t *fields = json_deep_copy(c->args);
        if (!fields)
                return NULL;
        json_object_del(fields, "sandboxId");
        if (!mo && json_object_set_new(fields, "maxOutputBytes", json_integer(MCP_DEFAULT_OUTPUT)) < 0)
                return NULL;
        ApiError e = { 0 };
        ExecRequest q;
        if (request_parse_exec(fields, &q, &e) < 0)
                return e.code ? tool_api_error(&e) : NULL;
        api_audit_command(c->r, &q);
        Sandbox *sb;
        if (acquire(c, id, &sb, &err) < 0) {
                exec_request_done(&q);
                return err;
        }
        /* The REST exec's run: the same bounds, timeout, cancellation when
         * the client leaves, and failing of a sandbox whose agent went
         * silent. */
        json_t *body = NULL;
        int rc = api_exec_run(sb, &q, req_socket(c->r), c->r->rid, &body, &e);
        exec_request_done(&q);
        if (rc == -EPIPE)
                return tool_failed("cancelled", NULL, "the client left");
        if (rc < 0)
                return e.code ? tool_api_error(&e) : NULL;
        json_t *ec = json_object_get(body, "exitCode");
        if (json_is_integer(ec))
                req_audit_note_json(c->r, "exitCode", json_copy(ec));
        return tool_ok(c->version, body);
}

/* One request-response op on a sandbox (a listing). 0 and *ret_result, or
 * a tool error in *ret. */
static int run_op(ToolCtx *c, Sandbox *sb, json_t *request, const char *path, json_t **ret_result, json_t **ret) {
        ApiError e = { 0 };
        ChanStream *s = NULL;
        if (api_req_user(request, sb) < 0)
                return -ENOMEM;
        if (api_open_stream(sb, request, &s, &e) < 0) {
                *ret = tool_api_error(&e);
                return -EINVAL;
        }
        int rc = agent_wait_result(s, OP_TIMEOUT_MS, NULL, NULL, ret_result);
        chan_stream_free(s);
        if (rc == -ETIMEDOUT)
                *ret = tool_failed("unavailable", "try again", "the sandbox did not answer in time");
        else if (rc < 0)
                *ret = tool_failed("conflict", "create a new sandbox", "sandbox %s stopped during the operation",
                                   sandbox_id(sb));
        else if (agent_result_error(*ret_result, NULL)) {
                api_agent_error(*ret_result, path, &e);
                json_decref(TAKE_PTR(*ret_result));
                *ret = tool_api_error(&e);
                rc = -EINVAL;
        }
        return rc;
}

static json_t *tool_list_files(ToolCtx *c) {
        static const char *const known[] = { "sandboxId", "path", "depth", NULL };
        const char *id;
        _cleanup_free_ char *path = NULL;
        json_t *err = NULL;
        if (args_known(c->args, known, &err) < 0 || arg_sandbox(c, &id, &err) < 0 ||
            arg_path(c->args, "/workspace", &path, &err) < 0)
                return err;
        json_t *d = json_object_get(c->args, "depth");
        if (d && !(json_is_integer(d) && json_integer_value(d) >= 1 && json_integer_value(d) <= 10))
                return tool_failed("invalid_request", NULL, "depth must be an integer from 1 to 10");
        _cleanup_json_ json_t *req = agent_req_list(path, d ? (unsigned)json_integer_value(d) : 1, NULL, true,
                                                    MCP_LIST_MAX);
        if (!req)
                return NULL;
        Sandbox *sb;
        if (acquire(c, id, &sb, &err) < 0)
                return err;
        json_t *result = NULL;
        int rc = run_op(c, sb, req, path, &result, &err);
        sandbox_release(sb);
        if (rc < 0)
                return err;
        _cleanup_json_ json_t *res = result;
        json_t *entries = json_array();
        size_t i;
        json_t *ent;
        json_array_foreach(json_object_get(res, "entries"), i, ent) {
                const char *type = json_string_value(json_object_get(ent, "type"));
                json_t *o = json_pack("{s:O?,s:O?,s:s,s:O?}", "path", json_object_get(ent, "path"), "name",
                                      json_object_get(ent, "name"), "type",
                                      type && strcmp(type, "dir") == 0 ? "directory" : type ? type : "other",
                                      "size", json_object_get(ent, "size"));
                if (o)
                        json_array_append_new(entries, o);
        }
        return tool_ok(c->version, json_pack("{s:s,s:o,s:b}", "path", path, "entries", entries, "truncated",
                                             json_is_true(json_object_get(res, "truncated"))));
}

static bool utf8_valid(const uint8_t *b, size_t n) {
        size_t i = 0;
        while (i < n) {
                uint8_t c = b[i];
                size_t k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 9;
                if (k == 9 || (k == 1 && c < 0xc2) || i + k >= n + (k ? 0 : 1))
                        return false;
                for (size_t j = 1; j <= k; j++)
                        if ((b[i + j] & 0xc0) != 0x80)
                                return false;
                if (k == 2 && ((c == 0xe0 && b[i + 1] < 0xa0) || (c == 0xed && b[i + 1] >= 0xa0)))
                        return false;
                if (k == 3 && ((c == 0xf0 && b[i + 1] < 0x90) || c > 0xf4 || (c == 0xf4 && b[i + 1] >= 0x90)))
                        return false;
                i += k + 1;
        }
        return true;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *base64_encode(const uint8_t *b, size_t n) {
        char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
        if (!out)
                return NULL;
        for (size_t i = 0; i < n; i += 3) {
                uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) |
                             (i + 2 < n ? b[i + 2] : 0);
                *o++ = B64[v >> 18 & 63];
                *o++ = B64[v >> 12 & 63];
                *o++ = i + 1 < n ? B64[v >> 6 & 63] : '=';
                *o++ = i + 2 < n ? B64[v & 63] : '=';
        }
        *o = '\0';
        return out;
}

/* Reads the whole file, refusing one over MCP_MAX_FILE by its size. */
static json_t *read_whole(ChanStream *s, const char *path, uint8_t **ret_buf, size_t *ret_len) {
        uint64_t deadline = time_now_mono_ms() + OP_TIMEOUT_MS;
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len = 0;
        bool sized = false;
        for (;;) {
                ChanEvent ev;
                int rc = chan_stream_next(s, POLL_MS, &ev);
                if (rc == -ETIMEDOUT) {
                        if (time_now_mono_ms() > deadline)
                                return tool_failed("unavailable", "try again", "the sandbox did not answer in time");
                        continue;
                }
                if (rc < 0 || ev.type == CHAN_EV_CLOSED) {
                        if (rc == 0)
                                chan_event_clear(&ev);
                        return tool_failed("conflict", "create a new sandbox", "the sandbox stopped during the read");
                }
                json_t *err = NULL;
                if (ev.type == CHAN_EV_EVENT && !sized) {
                        json_t *sz = json_object_get(ev.json, "size");
                        sized = true;
                        if (json_is_integer(sz) && json_integer_value(sz) > (json_int_t)MCP_MAX_FILE)
                                err = tool_failed("payload_too_large",
                                                  "read a part with exec (head -c, tail -c), or the file with the "
                                                  "REST API",
                                                  "%s is %" JSON_INTEGER_FORMAT " bytes, over this tool's %u",
                                                  path, json_integer_value(sz), MCP_MAX_FILE);
                } else if (ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_OUT) {
                        if (len + ev.len > MCP_MAX_FILE) /* it grew past what it said */
                                err = tool_failed("payload_too_large", NULL, "%s grew past %u bytes while read", path,
                                                  MCP_MAX_FILE);
                        else {
                                uint8_t *nb = realloc(buf, len + ev.len + 1);
                                if (!nb) {
                                        chan_event_clear(&ev);
                                        return NULL;
                                }
                                buf = nb;
                                memcpy(buf + len, ev.data, ev.len);
                                len += ev.len;
                        }
                } else if (ev.type == CHAN_EV_RESULT) {
                        if (agent_result_error(ev.json, NULL)) {
                                ApiError e = { 0 };
                                api_agent_error(ev.json, path, &e);
                                err = tool_api_error(&e);
                        } else {
                                chan_event_clear(&ev);
                                *ret_buf = buf ? TAKE_PTR(buf) : calloc(1, 1);
                                *ret_len = len;
                                return *ret_buf ? NULL : tool_failed("internal", NULL, "out of memory");
                        }
                }
                chan_event_clear(&ev);
                if (err)
                        return err;
        }
}

static json_t *tool_read_file(ToolCtx *c) {
        static const char *const known[] = { "sandboxId", "path", "encoding", NULL };
        const char *id;
        _cleanup_free_ char *path = NULL;
        bool b64 = false;
        json_t *err = NULL;
        if (args_known(c->args, known, &err) < 0 || arg_sandbox(c, &id, &err) < 0 ||
            arg_path(c->args, NULL, &path, &err) < 0 || arg_encoding(c->args, &b64, &err) < 0)
                return err;
        _cleanup_json_ json_t *req = agent_req_read(path);
        if (!req)
                return NULL;
        Sandbox *sb;
        if (acquire(c, id, &sb, &err) < 0)
                return err;
        ApiError e = { 0 };
        ChanStream *s = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len = 0;
        if (api_req_user(req, sb) < 0)
                err = tool_failed("internal", NULL, "out of memory");
        else if (api_open_stream(sb, req, &s, &e) < 0)
                err = tool_api_error(&e);
        else
                err = read_whole(s, path, &buf, &len);
        chan_stream_free(s); /* cancels a read left unfinished */
        sandbox_release(sb);
        if (err || !buf)
                return err;
        if (b64) {
                _cleanup_free_ char *text = base64_encode(buf, len);
                return text ? tool_ok(c->version, json_pack("{s:s,s:s,s:s,s:I}", "path", path, "encoding", "base64",
                                                            "content", text, "size", (json_int_t)len))
                            : NULL;
        }
        if (!utf8_valid(buf, len) || memchr(buf, '\0', len))
                return tool_failed("invalid_request", "read it with encoding base64",
                                   "%s is not UTF-8 text (%zu bytes)", path, len);
        return tool_ok(c->version, json_pack("{s:s,s:s,s:s%,s:I}", "path", path, "encoding", "text", "content",
                                             (const char *)buf, len, "size", (json_int_t)len));
}

static json_t *tool_write_file(ToolCtx *c) {
        static const char *const known[] = { "sandboxId", "path", "content", "encoding", NULL };
        const char *id;
        _cleanup_free_ char *path = NULL;
        bool b64 = false;
        json_t *err = full_access_refused(c);
        if (err || args_known(c->args, known, &err) < 0 || arg_sandbox(c, &id, &err) < 0 ||
            arg_path(c->args, NULL, &path, &err) < 0 || arg_encoding(c->args, &b64, &err) < 0)
                return err;
        json_t *content = json_object_get(c->args, "content");
        if (!json_is_string(content))
                return tool_failed("invalid_request", NULL, "content must be a string");
        _cleanup_free_ uint8_t *decoded = NULL;
        const uint8_t *data = (const uint8_t *)json_string_value(content);
        size_t len = json_string_length(content);
        if (b64) {
                int rc = base64_decode((const char *)data, len, MCP_MAX_FILE, &decoded, &len);
                if (rc == -E2BIG)
                        return tool_failed("payload_too_large", "write larger files with the REST API",
                                           "content is over %u bytes", MCP_MAX_FILE);
                if (rc < 0)
                        return tool_failed("invalid_request", NULL, "content is not base64 (RFC 4648, padded)");
                data = decoded;
        } else if (len > MCP_MAX_FILE)
                return tool_failed("payload_too_large", "write larger files with the REST API",
                                   "content is over %u bytes", MCP_MAX_FILE);
        _cleanup_json_ json_t *req = agent_req_write(path, 0644, true);
        if (!req)
                return NULL;
        Sandbox *sb;
        if (acquire(c, id, &sb, &err) < 0)
                return err;
        ApiError e = { 0 };
        ChanStream *s = NULL;
        _cleanup_json_ json_t *res = NULL;
        if (api_req_user(req, sb) < 0)
                err = tool_failed("internal", NULL, "out of memory");
        else if (api_open_stream(sb, req, &s, &e) < 0)
                err = tool_api_error(&e);
        else {
                int rc = 0;
                for (size_t off = 0; off < len && rc == 0; off += WRITE_CHUNK)
                        rc = chan_stream_write(s, data + off, len - off < WRITE_CHUNK ? len - off : WRITE_CHUNK,
                                               OP_TIMEOUT_MS);
                /* A write the agent stopped taking is answered by its
                 * RESULT, which says why. */
                if (rc == 0)
                        chan_stream_close_write(s);
                rc = agent_wait_result(s, OP_TIMEOUT_MS, NULL, NULL, &res);
                if (rc == -ETIMEDOUT)
                        err = tool_failed("unavailable", "try again", "the sandbox did not answer in time");
                else if (rc < 0)
                        err = tool_failed("conflict", "create a new sandbox", "the sandbox stopped during the write");
                else if (agent_result_error(res, NULL)) {
                        api_agent_error(res, path, &e);
                        err = tool_api_error(&e);
                }
        }
        chan_stream_free(s);
        sandbox_release(sb);
        if (err)
                return err;
        return tool_ok(c->version, json_pack("{s:s,s:I}", "path", path, "size", (json_int_t)len));
}

typedef struct McpTool {
        const char *name;
        const char *title;
        const char *description;
        const char *input_schema; /* JSON Schema text */
        bool read_only;
        bool destructive;
        json_t *(*run)(ToolCtx *c);
} McpTool;

#define SBX_ID_PROP "\"sandboxId\":{\"type\":\"string\",\"pattern\":\"^sbx_[0-9a-f]{20}$\",\"description\":\"The sandbox's id, as create_sandbox or list_sandboxes gives it.\"}"

static const McpTool tools[] = {
        { "create_sandbox", "Create a sandbox",
          "Creates a sandbox: a throwaway Linux machine with a shell, Python and /workspace, reachable only "
          "through the daemon. Returns it, with its id for the other tools.",
          "{\"type\":\"object\",\"properties\":{"
          "\"image\":{\"type\":\"string\",\"description\":\"An image the daemon has; left out, its default.\"},"
          "\"driver\":{\"type\":\"string\",\"enum\":[\"microvm\",\"gvisor\",\"namespace\"],"
          "\"description\":\"The isolation; left out, the daemon's default.\"},"
          "\"timeoutSeconds\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"The lease: the sandbox ends "
          "after this many seconds unless extended; left out, the daemon's default.\"},"
          "\"name\":{\"type\":\"string\",\"maxLength\":64,\"description\":\"A name of the owner's choosing.\"}},"
          "\"additionalProperties\":false}",
          false, false, tool_create },
        { "list_sandboxes", "List sandboxes", "Lists the key owner's sandboxes, newest first, with their states.",
          "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}", true, false, tool_list_sandboxes },
        { "exec", "Run a command",
          "Runs a shell command (bash -c) in a sandbox and waits for it. Returns exitCode, stdout, stderr "
          "(the tail of each, bounded by maxOutputBytes), timedOut and durationMs. A non-zero exit or a timeout "
          "is a result, not an error.",
          "{\"type\":\"object\",\"properties\":{" SBX_ID_PROP ","
          "\"command\":{\"type\":\"string\",\"description\":\"The command line, run by bash.\"},"
          "\"cwd\":{\"type\":\"string\",\"description\":\"The directory it runs in; left out, /workspace.\"},"
          "\"env\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}},"
          "\"timeoutMs\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":300000,\"description\":\"Left out, "
          "60000; the command's process group is killed past it.\"},"
          "\"maxOutputBytes\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":1048576,\"description\":\"Bytes "
          "kept of each of stdout and stderr (their tail); left out, 65536.\"}},"
          "\"required\":[\"sandboxId\",\"command\"],\"additionalProperties\":false}",
          false, false, tool_exec },
        { "read_file", "Read a file",
          "Reads a file of a sandbox, at most 1 MiB: as text (UTF-8; other bytes are refused) or as base64.",
          "{\"type\":\"object\",\"properties\":{" SBX_ID_PROP ","
          "\"path\":{\"type\":\"string\",\"description\":\"Absolute, or relative to /workspace.\"},"
          "\"encoding\":{\"type\":\"string\",\"enum\":[\"text\",\"base64\"],\"default\":\"text\"}},"
          "\"required\":[\"sandboxId\",\"path\"],\"additionalProperties\":false}",
          true, false, tool_read_file },
        { "write_file", "Write a file",
          "Writes a file of a sandbox whole (at most 1 MiB), making its parent directories; an existing file is "
          "replaced atomically.",
          "{\"type\":\"object\",\"properties\":{" SBX_ID_PROP ","
          "\"path\":{\"type\":\"string\",\"description\":\"Absolute, or relative to /workspace.\"},"
          "\"content\":{\"type\":\"string\",\"description\":\"The file's bytes: text, or base64 with encoding "
          "base64.\"},"
          "\"encoding\":{\"type\":\"string\",\"enum\":[\"text\",\"base64\"],\"default\":\"text\"}},"
          "\"required\":[\"sandboxId\",\"path\",\"content\"],\"additionalProperties\":false}",
          false, false, tool_write_file },
        { "list_files", "List a directory",
          "Lists a directory of a sandbox (at most 1000 entries): each entry's path, name, type and size.",
          "{\"type\":\"object\",\"properties\":{" SBX_ID_PROP ","
          "\"path\":{\"type\":\"string\",\"description\":\"Left out, /workspace.\"},"
          "\"depth\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":10,\"default\":1}},"
          "\"required\":[\"sandboxId\"],\"additionalProperties\":false}",
          true, false, tool_list_files },
        { "delete_sandbox", "Delete a sandbox", "Deletes a sandbox and its files for good.",
          "{\"type\":\"object\",\"properties\":{" SBX_ID_PROP "},\"required\":[\"sandboxId\"],"
          "\"additionalProperties\":false}",
          false, true, tool_delete },
};

static json_t *tools_list_json(McpVersion v) {
        json_t *list = json_array();
        for (size_t i = 0; list && i < ELEMENTSOF(tools); i++) {
                const McpTool *t = &tools[i];
                json_t *schema = json_loads(t->input_schema, 0, NULL);
                json_t *o = schema ? json_pack("{s:s,s:s,s:o,s:{s:b,s:b,s:b,s:b}}", "name", t->name, "description",
                                               t->description, "inputSchema", schema, "annotations", "readOnlyHint",
                                               t->read_only, "destructiveHint", t->destructive, "idempotentHint",
                                               t->read_only, "openWorldHint", 0)
                                   : NULL;
                if (o && v >= MCP_V_2025_06_18)
                        json_object_set_new(o, "title", json_string(t->title));
                if (!o || json_array_append_new(list, o) < 0) {
                        json_decref(list);
                        return NULL;
                }
        }
        return list ? json_pack("{s:o}", "tools", list) : NULL;
}

/* ---- the protocol ---- */

static json_t *handle_initialize(Req *r, McpMessage *m, char session[2 * SESSION_ID_BYTES + 1]) {
        const char *asked = json_string_value(json_object_get(m->params, "protocolVersion"));
        if (!asked)
                return mcp_error(m->id, MCP_INVALID_PARAMS, "initialize needs params.protocolVersion");
        McpVersion v = mcp_version_negotiate(asked);
        int rc = session_open(r->app->mcp, &r->key, v, session);
        if (rc == -EUSERS)
                return mcp_error(m->id, MCP_SERVER_BUSY, "this daemon holds %u MCP sessions, its bound: try again later",
                                 MCP_SESSIONS_MAX);
        if (rc < 0)
                return mcp_error(m->id, MCP_INTERNAL_ERROR, "could not open a session");
        return mcp_result(m->id, json_pack("{s:s,s:{s:{s:b}},s:{s:s,s:s},s:s}", "protocolVersion", mcp_version_name(v),
                                           "capabilities", "tools", "listChanged", 0, "serverInfo", "name",
                                           "runtimed", "version", RUNTIME_VERSION, "instructions",
                                           "Runtime's sandboxes: create_sandbox gives an id; exec, read_file, "
                                           "write_file and list_files act in it; delete_sandbox ends it."));
}

static json_t *handle_tools_call(Req *r, McpVersion v, McpMessage *m) {
        const char *name = json_string_value(json_object_get(m->params, "name"));
        if (!name)
                return mcp_error(m->id, MCP_INVALID_PARAMS, "tools/call needs params.name");
        json_t *args = json_object_get(m->params, "arguments");
        if (args && !json_is_object(args) && !json_is_null(args))
                return mcp_error(m->id, MCP_INVALID_PARAMS, "params.arguments must be an object");
        const McpTool *t = NULL;
        for (size_t i = 0; i < ELEMENTSOF(tools) && !t; i++)
                if (strcmp(tools[i].name, name) == 0)
                        t = &tools[i];
        if (!t)
                return mcp_error(m->id, MCP_INVALID_PARAMS, "unknown tool %.64s: tools/list names them", name);
        _cleanup_json_ json_t *empty = json_object();
        ToolCtx c = { .r = r, .version = v, .args = json_is_object(args) ? args : empty };
        /* A tool that changes something is in the audit trail (as mcp.call,
         * with the tool and the sandbox); a read is not, as a GET is not. */
        if (!t->read_only) {
                r->audit_skip = false;
                req_audit_note(r, "tool", t->name);
        }
        json_t *res = t->run(&c);
        if (res && json_is_true(json_object_get(res, "isError")))
                req_audit_note_json(r, "isError", json_true());
        if (!res)
                return mcp_error(m->id, MCP_INTERNAL_ERROR, "the tool failed inside the daemon; its log says why");
        return mcp_result(m->id, res);
}

/* One message's answer (NULL for those that get none). */
static json_t *handle_message(Req *r, McpVersion v, json_t *msg) {
        McpMessage m;
        mcp_message_classify(msg, &m);
        if (m.kind == MCP_MSG_INVALID)
                return mcp_error(m.id, MCP_INVALID_REQUEST, "%s", m.error);
        if (m.kind != MCP_MSG_REQUEST)
                return NULL; /* notifications (initialized, cancelled) and answers need nothing from us */
        if (strcmp(m.method, "ping") == 0)
                return mcp_result(m.id, json_object());
        if (strcmp(m.method, "tools/list") == 0)
                return mcp_result(m.id, tools_list_json(v));
        if (strcmp(m.method, "tools/call") == 0)
                return handle_tools_call(r, v, &m);
        return mcp_error(m.id, MCP_METHOD_NOT_FOUND, "method %.64s is not offered: this server has tools only",
                         m.method);
}

/* A JSON answer, with the session's header when one was opened. */
static enum MHD_Result reply_rpc(Req *r, unsigned status, json_t *body, const char *session) {
        if (!body)
                return reply_internal(r);
        char *text = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        if (!text)
                return reply_internal(r);
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(text);
                return reply_internal(r);
        }
        if (session)
                MHD_add_response_header(resp, "Mcp-Session-Id", session);
        return reply_response(r, status, resp, "application/json");
}

static enum MHD_Result reply_accepted(Req *r) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        return reply_response(r, 202, resp, NULL);
}

static const char *header(Req *r, const char *name) {
        return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* The transport's header checks: the answer is JSON, so a client must
 * take it; a protocol version header names one this server speaks. */
static json_t *check_headers(Req *r, unsigned *ret_status) {
        const char *accept = header(r, MHD_HTTP_HEADER_ACCEPT);
        if (accept && !strstr(accept, "application/json") && !strstr(accept, "*/*")) {
                *ret_status = 406;
                return mcp_error(NULL, MCP_INVALID_REQUEST, "send Accept: application/json, text/event-stream");
        }
        const char *ct = header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
        if (ct && strncasecmp(ct, "application/json", 16) != 0) {
                *ret_status = 415;
                return mcp_error(NULL, MCP_INVALID_REQUEST, "send Content-Type: application/json");
        }
        McpVersion v;
        const char *pv = header(r, "MCP-Protocol-Version");
        if (pv && mcp_version_parse(pv, &v) < 0) {
                *ret_status = 400;
                return mcp_error(NULL, MCP_INVALID_REQUEST, "MCP-Protocol-Version %.32s is not one this server "
                                 "speaks (2024-11-05 to %s)", pv, mcp_version_name(MCP_V_LATEST));
        }
        return NULL;
}

enum MHD_Result handle_mcp_post(Req *r) {
        unsigned status = 400;
        r->audit_skip = true; /* until a tool that changes something runs */
        json_t *bad = check_headers(r, &status);
        if (bad)
                return reply_rpc(r, status, bad, NULL);
        _cleanup_json_ json_t *doc = NULL;
        int rc = mcp_body_parse(r->body, r->body_len, &doc);
        if (rc == -EBADMSG)
                return reply_rpc(r, 400, mcp_error(NULL, MCP_PARSE_ERROR, "the body is not JSON (or nests deeper "
                                                   "than %u, or repeats a name)", MCP_MAX_DEPTH), NULL);
        if (rc < 0)
                return reply_rpc(r, 400, mcp_error(NULL, MCP_INVALID_REQUEST, "the body is a JSON-RPC message or a "
                                                   "batch of 1 to %u", MCP_MAX_BATCH), NULL);
        /* initialize opens a session: alone, never in a batch. */
        if (json_is_object(doc) && json_is_string(json_object_get(doc, "method")) &&
            strcmp(json_string_value(json_object_get(doc, "method")), "initialize") == 0) {
                McpMessage m;
                mcp_message_classify(doc, &m);
                if (m.kind != MCP_MSG_REQUEST)
                        return reply_rpc(r, 400, mcp_error(m.id, MCP_INVALID_REQUEST, "%s",
                                                           m.error ? m.error : "initialize is a request: it has an id"),
                                         NULL);
                char session[2 * SESSION_ID_BYTES + 1] = "";
                json_t *ans = handle_initialize(r, &m, session);
                bool ok = ans && json_object_get(ans, "result");
                int code = (int)json_integer_value(json_object_get(json_object_get(ans, "error"), "code"));
                return reply_rpc(r, ok ? 200 : code == MCP_SERVER_BUSY ? 503 : code == MCP_INVALID_PARAMS ? 400 : 500,
                                 ans, ok ? session : NULL);
        }
        const char *sid = header(r, "Mcp-Session-Id");
        McpVersion v;
        if (!sid)
                return reply_rpc(r, 400, mcp_error(NULL, MCP_INVALID_REQUEST, "send the Mcp-Session-Id header that "
                                                   "initialize answered"), NULL);
        if (session_use(r->app->mcp, &r->key, sid, false, &v) < 0)
                return reply_rpc(r, 404, mcp_error(NULL, MCP_INVALID_REQUEST, "no such session (it ended or expired): "
                                                   "initialize a new one"), NULL);
        if (json_is_array(doc) && !mcp_version_batches(v))
                return reply_rpc(r, 400, mcp_error(NULL, MCP_INVALID_REQUEST, "protocol version %s takes no batches: "
                                                   "send one message per request", mcp_version_name(v)), NULL);
        if (json_is_object(doc)) {
                json_t *ans = handle_message(r, v, doc);
                if (!ans) {
                        McpMessage m;
                        mcp_message_classify(doc, &m);
                        return m.kind == MCP_MSG_REQUEST ? reply_internal(r) : reply_accepted(r);
                }
                json_t *err = json_object_get(ans, "error");
                int code = (int)json_integer_value(json_object_get(err, "code"));
                return reply_rpc(r, err && (code == MCP_INVALID_REQUEST || code == MCP_PARSE_ERROR) ? 400 : 200, ans,
                                 NULL);
        }
        json_t *answers = json_array();
        if (!answers)
                return reply_internal(r);
        size_t i;
        json_t *msg;
        json_array_foreach(doc, i, msg) {
                if (json_is_object(msg) && json_is_string(json_object_get(msg, "method")) &&
                    strcmp(json_string_value(json_object_get(msg, "method")), "initialize") == 0) {
                        json_array_append_new(answers, mcp_error(json_object_get(msg, "id"), MCP_INVALID_REQUEST,
                                                                 "initialize is never part of a batch"));
                        continue;
                }
                json_t *ans = handle_message(r, v, msg);
                if (ans)
                        json_array_append_new(answers, ans);
        }
        if (json_array_size(answers) == 0) {
                json_decref(answers);
                return reply_accepted(r);
        }
        return reply_rpc(r, 200, answers, NULL);
}

enum MHD_Result handle_mcp_delete(Req *r) {
        const char *sid = header(r, "Mcp-Session-Id");
        if (!sid)
                return api_reply_invalid(r, "send the Mcp-Session-Id header of the session to end",
                                         "no Mcp-Session-Id header");
        if (session_use(r->app->mcp, &r->key, sid, true, NULL) < 0) {
                ApiError e = { 0 };
                api_error(&e, 404, "not_found", "it ended or expired already", "no such MCP session");
                return reply_error(r, &e);
        }
        return reply_json(r, 200, json_pack("{s:b}", "ended", 1));
}
