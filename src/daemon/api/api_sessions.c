/* The sandbox session routes and the check of a session's token at the
 * HTTP edge (manager/sessions.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/api/api_sessions.h"
#include "daemon/manager/sessions.h"
#include "daemon/model/auth.h"

static enum MHD_Result sessions_off(Req *r) {
        return api_reply_not_offered(r, "sandbox sessions");
}

/* The session as the API shows it; the token only in a create's answer. */
static json_t *session_json(const StoreSession *s, const char *token, int64_t now) {
        char created[RFC3339_LEN], expires[RFC3339_LEN], revoked[RFC3339_LEN];
        if (time_format_rfc3339(s->created_at, created) < 0 || time_format_rfc3339(s->expires_at, expires) < 0)
                return NULL;
        if (!s->revoked_at || time_format_rfc3339(s->revoked_at, revoked) < 0)
                revoked[0] = '\0';
        json_t *origins = json_array();
        for (const char *p = s->origins; origins && *p;) {
                const char *nl = strchr(p, '\n');
                size_t n = nl ? (size_t)(nl - p) : strlen(p);
                json_array_append_new(origins, json_stringn(p, n));
                p = nl ? nl + 1 : p + n;
        }
        const char *state = s->revoked_at ? "revoked" : now >= s->expires_at ? "expired" : "active";
        return json_pack("{s:s,s:s,s:s?,s:o,s:s,s:s,s:s?,s:s,s:b,s:s*}", "id", s->id, "sandboxId", s->sandbox_id,
                         "name", s->name[0] ? s->name : NULL, "origins", origins ? origins : json_array(), "createdAt",
                         created, "expiresAt", expires, "revokedAt", revoked[0] ? revoked : NULL, "state", state,
                         "active", session_active(s, now), "token", token);
}

/* {ttlSeconds, origins, name}: *ret_origins one a line. */
static int parse_create(json_t *body, int64_t *ret_ttl, char *origins, size_t cap, const char **ret_name,
                        ApiError *e) {
        const char *key;
        json_t *v;
        json_object_foreach(body, key, v) {
                if (strcmp(key, "ttlSeconds") && strcmp(key, "origins") && strcmp(key, "name"))
                        return api_error(e, 400, "invalid_request", NULL, "unknown field %.64s", key);
        }
        json_t *ttl = json_object_get(body, "ttlSeconds");
        *ret_ttl = SESSION_TTL_DEFAULT;
        if (ttl && !json_is_null(ttl)) {
                if (!json_is_integer(ttl) || json_integer_value(ttl) < SESSION_TTL_MIN ||
                    json_integer_value(ttl) > SESSION_TTL_MAX)
                        return api_error(e, 400, "invalid_request", "a session lasts a minute to a day",
                                         "ttlSeconds is an integer from %d to %d", SESSION_TTL_MIN, SESSION_TTL_MAX);
                *ret_ttl = json_integer_value(ttl);
        }
        json_t *name = json_object_get(body, "name");
        *ret_name = NULL;
        if (name && !json_is_null(name)) {
                const char *s = json_string_value(name);
                size_t n = s ? json_string_length(name) : 0;
                bool ok = s && n >= 1 && n <= 64 && strlen(s) == n;
                for (size_t i = 0; ok && i < n; i++)
                        ok = (unsigned char)s[i] >= 0x20 && s[i] != 0x7f;
                if (!ok)
                        return api_error(e, 400, "invalid_request", NULL,
                                         "name is 1 to 64 bytes of printable characters");
                *ret_name = s;
        }
        json_t *list = json_object_get(body, "origins");
        size_t at = 0, i;
        origins[0] = '\0';
        if (!list || json_is_null(list))
                return 0;
        if (!json_is_array(list) || json_array_size(list) > SESSION_MAX_ORIGINS)
                return api_error(e, 400, "invalid_request", NULL, "origins is a list of at most %d origins",
                                 SESSION_MAX_ORIGINS);
        json_array_foreach(list, i, v) {
                const char *o = json_string_value(v);
                if (!o || !session_origin_ok(o, json_string_length(v)))
                        return api_error(e, 400, "invalid_request",
                                         "an origin is a page's scheme, host and port: https://app.example.com",
                                         "origins[%zu] is not an origin (lowercase, no path, no trailing slash)", i);
                size_t n = json_string_length(v);
                if (at + n + 2 > cap)
                        return api_error(e, 400, "invalid_request", NULL, "origins are too long");
                if (at)
                        origins[at++] = '\n';
                memcpy(origins + at, o, n);
                at += n;
                origins[at] = '\0';
        }
        return 0;
}

enum MHD_Result handle_session_create(Req *r) {
        if (!r->app->sessions)
                return sessions_off(r);
        ApiError e = { 0 };
        int64_t now = time_now_unix();
        if (r->idem_replay) {
                /* A retry of a create whose answer was lost: the session
                 * again, never its token, which was shown once. */
                _cleanup_json_ json_t *rec = json_loads(r->idem_replay, 0, NULL);
                return rec ? reply_json(r, 200, json_incref(rec)) : reply_internal(r);
        }
        int64_t ttl = SESSION_TTL_DEFAULT;
        char origins[STORE_SESSION_ORIGINS_MAX];
        const char *name = NULL;
        if (parse_create(r->json, &ttl, origins, sizeof origins, &name, &e) < 0 || api_sandbox_owned(r, &e) < 0)
                return reply_error(r, &e);
        /* The session ends with the key that made it: its hash is kept. */
        const char *key = auth_parse_bearer(MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                                         MHD_HTTP_HEADER_AUTHORIZATION));
        char key_hash[AUTH_HASH_HEX_LEN + 1];
        if (!key || !auth_key_format_ok(key) || auth_hash_key(key, key_hash) < 0) {
                api_error(&e, 403, "forbidden", "make sessions on your backend with an API key",
                          "only an API key makes sessions");
                return reply_error(r, &e);
        }
        char token[SESSION_TOKEN_LEN + 1];
        StoreSession row;
        int rc = sessions_create(r->app->sessions, r->route.sandbox_id, r->key.owner, key_hash, name, ttl, origins, now,
                                 token, &row);
        if (rc == -EUSERS) {
                api_error(&e, 429, "rate_limited", "revoke sessions that are no longer used",
                          "sandbox %s has %d active sessions, its bound", r->route.sandbox_id, SESSIONS_MAX_ACTIVE);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return api_reply_store_error(r, rc, "make the session");
        req_audit_note(r, "session", row.id);
        _cleanup_json_ json_t *shown = session_json(&row, NULL, now);
        _cleanup_free_ char *text = shown ? json_dumps(shown, JSON_COMPACT) : NULL;
        if (text)
                req_idem_record(r, text);
        json_t *j = session_json(&row, token, now);
        explicit_bzero(token, sizeof token);
        return j ? reply_json(r, 201, j) : reply_internal(r);
}

enum MHD_Result handle_session_list(Req *r) {
        if (!r->app->sessions)
                return sessions_off(r);
        r->audit_skip = true;
        ApiError e = { 0 };
        if (api_sandbox_owned(r, &e) < 0)
                return reply_error(r, &e);
        int64_t now = time_now_unix();
        StoreSession *all = NULL;
        size_t n = 0;
        int rc = sessions_list(r->app->sessions, r->route.sandbox_id, r->key.owner, now, &all, &n);
        if (rc < 0)
                return api_reply_store_error(r, rc, "list the sessions");
        json_t *data = json_array();
        for (size_t i = 0; data && i < n; i++)
                json_array_append_new(data, session_json(&all[i], NULL, now));
        free(all);
        return data ? reply_json(r, 200, json_pack("{s:o}", "data", data)) : reply_internal(r);
}

enum MHD_Result handle_session_revoke(Req *r) {
        if (!r->app->sessions)
                return sessions_off(r);
        ApiError e = { 0 };
        int64_t now = time_now_unix();
        StoreSession row;
        int rc = sessions_revoke(r->app->sessions, r->route.session_id, r->route.sandbox_id, r->key.owner, now, &row);
        if (rc == -ENOENT) {
                api_error(&e, 404, "not_found", "list them: GET /v1/sandboxes/{id}/sessions",
                          "no session %s of sandbox %s", r->route.session_id, r->route.sandbox_id);
                return reply_error(r, &e);
        }
        if (rc < 0)
                return api_reply_store_error(r, rc, "revoke the session");
        /* Refused at once: its open streams and WebSockets close now. */
        req_end_session(r, row.id);
        req_audit_note(r, "session", row.id);
        json_t *j = session_json(&row, NULL, now);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

/* ---- the edge's check ---- */

static int edge_check(void *userdata, Req *r, const char *token, const char *origin, ApiError *e) {
        App *app = userdata;
        StoreSession row;
        int rc = sessions_by_token(app->sessions, token, time_now_unix(), &row);
        if (rc == -ENOENT || rc == -EKEYREVOKED || rc == -EKEYEXPIRED)
                return api_error(e, 401, "unauthorized", "ask your backend for a new session",
                                 rc == -EKEYREVOKED   ? "the session was revoked"
                                 : rc == -EKEYEXPIRED ? "the session has expired"
                                                      : "the session token is not valid");
        if (rc < 0) {
                log_error(r->rid, "looking up a session: %s", strerror(-rc));
                return api_error(e, 503, "unavailable", "try again", "the store did not answer");
        }
        /* A page of another origin may not use it, even with the token. */
        if (origin && !session_origin_listed(row.origins, origin))
                return api_error(e, 403, "forbidden", "list the page's origin when the session is made",
                                 "this session does not answer pages of that origin");
        rc = keystore_by_hash(app->keys, row.key_hash, &r->key);
        if (rc == -ENOENT)
                return api_error(e, 401, "unauthorized", "ask your backend for a new session",
                                 "the key that made the session was revoked");
        if (rc < 0)
                return api_error(e, 503, "unavailable", "try again", "the store did not answer");
        r->session.used = true;
        snprintf(r->session.id, sizeof r->session.id, "%s", row.id);
        snprintf(r->session.sandbox_id, sizeof r->session.sandbox_id, "%.24s", row.sandbox_id);
        snprintf(r->session.origin, sizeof r->session.origin, "%s", origin ? origin : "");
        r->session.expires_at = row.expires_at;
        return 0;
}

static bool edge_preflight(void *userdata, const char *sandbox_id, const char *origin) {
        App *app = userdata;
        StoreSession *all = NULL;
        size_t n = 0;
        int64_t now = time_now_unix();
        bool ok = false;
        /* The sandbox's owner is not known before the token: every owner's
         * sessions of it (there is one owner per sandbox). */
        if (sessions_list(app->sessions, sandbox_id, NULL, now, &all, &n) < 0)
                return false;
        for (size_t i = 0; i < n && !ok; i++)
                ok = session_active(&all[i], now) && session_origin_listed(all[i].origins, origin);
        free(all);
        return ok;
}

HttpSessions api_sessions_edge(App *app) {
        return (HttpSessions){ .check = edge_check, .preflight = edge_preflight, .userdata = app };
}
