/* Previews: a sandbox's port shared at a host name of its own. The owner
 * makes, reads, rotates and deletes them here; another owner's key gets
 * 404, as for the sandbox itself. */
#include "daemon/api/api_previews.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/api/preview_proxy.h"
#include "daemon/http/forward.h"
#include "daemon/manager/previews.h"

static int previews_off(ApiError *e) {
        return api_error(e, 501, "previews_unavailable", "start runtimed with --preview-listen ADDR:PORT",
                         "this server serves no previews");
}

/* The route's port: 1 to 65535. */
static int route_port(Req *r, unsigned *ret, ApiError *e) {
        unsigned long v = strtoul(r->route.port, NULL, 10);
        if (v < 1 || v > 65535)
                return api_error(e, 400, "invalid_request", "a port is 1 to 65535", "port %s is out of range",
                                 r->route.port);
        *ret = (unsigned)v;
        return 0;
}

/* "2026-12-06T03:00:00Z", "...00.123Z" or "...00+00:00": Unix seconds,
 * the fraction dropped (a token then ends no later than asked). */
static int parse_time(const char *s, int64_t *ret) {
        struct tm tm = { 0 };
        int n = 0;
        if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                   &tm.tm_sec, &n) != 6 ||
            tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
            tm.tm_min > 59 || tm.tm_sec > 60 || tm.tm_year < 1970 || tm.tm_year > 9999)
                return -EINVAL;
        const char *p = s + n;
        if (*p == '.') {
                p++;
                if (*p < '0' || *p > '9')
                        return -EINVAL;
                while (*p >= '0' && *p <= '9')
                        p++;
        }
        if (strcmp(p, "Z") != 0 && strcmp(p, "+00:00") != 0)
                return -EINVAL;
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        time_t t = timegm(&tm);
        if (t < 0)
                return -EINVAL;
        *ret = t;
        return 0;
}

/* A lifetime from ttlSeconds and expiresAt, the earlier of the two; 0 when
 * neither is given. */
static int lifetime(const char *ttl, const char *at, int64_t now, int64_t *ret, ApiError *e) {
        int64_t end = 0;
        if (ttl) {
                char *rest = NULL;
                errno = 0;
                long long v = strtoll(ttl, &rest, 10);
                if (errno || !*ttl || *rest || v < 1 || v > PREVIEW_MAX_TTL_SECONDS)
                        return api_error(e, 400, "invalid_request", "ttlSeconds is 1 to 604800 (seven days)",
                                         "ttlSeconds is not a whole number of seconds in range");
                end = now + v;
        }
        if (at) {
                int64_t t = 0;
                if (parse_time(at, &t) < 0)
                        return api_error(e, 400, "invalid_request", "say it as 2026-12-06T03:00:00Z",
                                         "expiresAt is not a UTC timestamp");
                if (t <= now || t > now + PREVIEW_MAX_TTL_SECONDS)
                        return api_error(e, 400, "invalid_request", "a time up to seven days ahead",
                                         "expiresAt is in the past or more than seven days ahead");
                if (!end || t < end)
                        end = t;
        }
        *ret = end;
        return 0;
}

static void url_of(const PreviewSite *site, const StorePreview *p, char *buf, size_t n) {
        bool default_port = site->public_port == (site->https ? 443u : 80u);
        char port[8] = "";
        if (!default_port)
                snprintf(port, sizeof port, ":%u", site->public_port);
        /* sbx-HEX: a host name has no underscore (preview_proxy.c reads
         * both spellings). */
        const char *hex = strncmp(p->sandbox_id, "sbx_", 4) == 0 ? p->sandbox_id + 4 : p->sandbox_id;
        snprintf(buf, n, "%s://%u-sbx-%s.%s%s", site->https ? "https" : "http", p->port, hex, site->domain, port);
}

/* The preview as the API shows it, a private one with a token valid until
 * token_end (0: the default life), capped by the preview's own end. */
static json_t *preview_json(Req *r, const StorePreview *p, int64_t token_end) {
        char url[400], at[RFC3339_LEN], created[RFC3339_LEN];
        url_of(r->app->preview_site, p, url, sizeof url);
        if (time_format_rfc3339(p->created_at, created) < 0)
                return NULL;
        _cleanup_json_ json_t *j = json_pack("{s:s,s:i,s:s,s:s,s:s,s:[]}", "sandboxId", p->sandbox_id, "port",
                                             (int)p->port, "visibility", p->public ? "public" : "private", "url", url,
                                             "createdAt", created, "embedOrigins");
        if (!j)
                return NULL;
        json_t *embed = json_object_get(j, "embedOrigins");
        for (const char *o = p->embed_origins; *o;) {
                const char *nl = strchr(o, '\n');
                size_t n = nl ? (size_t)(nl - o) : strlen(o);
                if (json_array_append_new(embed, json_stringn(o, n)) < 0)
                        return NULL;
                o += nl ? n + 1 : n;
        }
        if (p->expires_at > 0 && time_format_rfc3339(p->expires_at, at) == 0)
                json_object_set_new(j, "expiresAt", json_string(at));
        else
                json_object_set_new(j, "expiresAt", json_null());
        if (p->public) {
                json_object_set_new(j, "token", json_null());
                json_object_set_new(j, "tokenExpiresAt", json_null());
                json_object_set_new(j, "urlWithToken", json_string(url));
                return TAKE_PTR(j);
        }
        char token[PREVIEW_TOKEN_MAX], with[600];
        int64_t end = token_end > 0 ? token_end : time_now_unix() + PREVIEW_TOKEN_DEFAULT_SECONDS, got = 0;
        int rc = previews_token(r->app->previews, p, end, token, &got);
        if (rc < 0) {
                log_error(r->rid, "signing a token of preview %s:%u: %s", p->sandbox_id, p->port, strerror(-rc));
                return NULL;
        }
        snprintf(with, sizeof with, "%s/?%s=%s", url, PREVIEW_TOKEN_ARG, token);
        if (time_format_rfc3339(got, at) < 0)
                return NULL;
        json_object_set_new(j, "token", json_string(token));
        json_object_set_new(j, "tokenExpiresAt", json_string(at));
        json_object_set_new(j, "urlWithToken", json_string(with));
        explicit_bzero(token, sizeof token);
        return TAKE_PTR(j);
}

/* embedOrigins: *ret the origins one a line ("": any site may frame the
 * preview), or NULL when left out (a shared port keeps its own). */
static int parse_embed(json_t *list, char *buf, size_t cap, const char **ret, ApiError *e) {
        size_t at = 0, i;
        json_t *v;
        *ret = NULL;
        if (!list || json_is_null(list))
                return 0;
        if (!json_is_array(list) || json_array_size(list) > PREVIEW_EMBED_MAX_ORIGINS)
                return api_error(e, 400, "invalid_request", "[] lets any site frame the preview",
                                 "embedOrigins is a list of at most %d origins", PREVIEW_EMBED_MAX_ORIGINS);
        buf[0] = '\0';
        json_array_foreach(list, i, v) {
                const char *o = json_string_value(v);
                size_t n = o ? json_string_length(v) : 0;
                if (!o || !preview_embed_origin_ok(o, n))
                        return api_error(e, 400, "invalid_request",
                                         "an origin is a site's scheme, host and port: https://app.example.com or "
                                         "https://*.example.com",
                                         "embedOrigins[%zu] is not an origin (lowercase http or https, no path, no "
                                         "trailing slash)",
                                         i);
                if (at + n + 2 > cap)
                        return api_error(e, 400, "invalid_request", NULL, "embedOrigins are too long");
                if (at)
                        buf[at++] = '\n';
                memcpy(buf + at, o, n);
                at += n;
                buf[at] = '\0';
        }
        *ret = buf;
        return 0;
}

static enum MHD_Result store_failed(Req *r, const char *what, int rc) {
        log_error(r->rid, "%s the previews of %s: %s", what, r->route.sandbox_id, strerror(-rc));
        return reply_internal(r);
}

static enum MHD_Result not_shared(Req *r, unsigned port) {
        ApiError e = { 0 };
        api_error(&e, 404, "not_found", "share it first: POST /v1/sandboxes/{id}/previews",
                  "port %u of sandbox %s is not shared", port, r->route.sandbox_id);
        return reply_error(r, &e);
}

enum MHD_Result handle_previews_create(Req *r) {
        ApiError e = { 0 };
        if (!r->app->previews) {
                previews_off(&e);
                return reply_error(r, &e);
        }
        const char *key;
        json_t *v;
        json_object_foreach(r->json, key, v) {
                if (strcmp(key, "port") && strcmp(key, "visibility") && strcmp(key, "ttlSeconds") &&
                    strcmp(key, "expiresAt") && strcmp(key, "embedOrigins")) {
                        api_error(&e, 400, "invalid_request", NULL, "unknown field %.64s", key);
                        return reply_error(r, &e);
                }
        }
        json_t *jport = json_object_get(r->json, "port"), *jvis = json_object_get(r->json, "visibility");
        json_t *jttl = json_object_get(r->json, "ttlSeconds"), *jat = json_object_get(r->json, "expiresAt");
        json_t *jembed = json_object_get(r->json, "embedOrigins");
        if (!json_is_integer(jport) || json_integer_value(jport) < 1 || json_integer_value(jport) > 65535) {
                api_error(&e, 400, "invalid_request", "a port is 1 to 65535",
                          jport ? "port is out of range" : "port is missing");
                return reply_error(r, &e);
        }
        if (jvis && !json_is_null(jvis) &&
            (!json_is_string(jvis) ||
             (strcmp(json_string_value(jvis), "private") && strcmp(json_string_value(jvis), "public")))) {
                api_error(&e, 400, "invalid_request", NULL, "visibility is \"private\" or \"public\"");
                return reply_error(r, &e);
        }
        if ((jttl && !json_is_null(jttl) && !json_is_integer(jttl)) || (jat && !json_is_null(jat) && !json_is_string(jat))) {
                api_error(&e, 400, "invalid_request", NULL, "ttlSeconds is a number, expiresAt a timestamp");
                return reply_error(r, &e);
        }
        char embed_buf[STORE_PREVIEW_EMBED_MAX];
        const char *embed = NULL;
        if (parse_embed(jembed, embed_buf, sizeof embed_buf, &embed, &e) < 0)
                return reply_error(r, &e);
        char ttl[24];
        if (jttl && json_is_integer(jttl))
                snprintf(ttl, sizeof ttl, "%" JSON_INTEGER_FORMAT, json_integer_value(jttl));
        int64_t now = time_now_unix(), end = 0;
        if (lifetime(jttl && json_is_integer(jttl) ? ttl : NULL, jat && json_is_string(jat) ? json_string_value(jat) : NULL,
                     now, &end, &e) < 0 ||
            api_sandbox_owned(r, &e) < 0)
                return reply_error(r, &e);
        bool public = jvis && json_is_string(jvis) && strcmp(json_string_value(jvis), "public") == 0;
        StorePreview p;
        int rc = previews_put(r->app->previews, r->route.sandbox_id, r->key.owner, (unsigned)json_integer_value(jport),
                              public, end, embed, &p);
        if (rc < 0)
                return store_failed(r, "writing", rc);
        /* A preview made private again: its open connections were let in
         * without a token, and go; so do those answered under the sites
         * that could frame it before. */
        if (!public || embed)
                preview_proxy_close(r->route.sandbox_id, p.port);
        char port_text[8];
        snprintf(port_text, sizeof port_text, "%u", p.port);
        req_audit_note(r, "port", port_text);
        json_t *j = preview_json(r, &p, end);
        explicit_bzero(p.secret, sizeof p.secret);
        return j ? reply_json(r, 201, j) : reply_internal(r);
}

enum MHD_Result handle_previews_list(Req *r) {
        ApiError e = { 0 };
        if (!r->app->previews) {
                previews_off(&e);
                return reply_error(r, &e);
        }
        if (api_sandbox_owned(r, &e) < 0)
                return reply_error(r, &e);
        StorePreview *all = NULL;
        size_t n = 0;
        int rc = previews_list(r->app->previews, r->route.sandbox_id, &all, &n);
        if (rc < 0)
                return store_failed(r, "reading", rc);
        _cleanup_json_ json_t *data = json_array();
        int64_t now = time_now_unix();
        bool ok = data != NULL;
        for (size_t i = 0; ok && i < n; i++)
                if (!preview_expired(&all[i], now))
                        ok = json_array_append_new(data, preview_json(r, &all[i], 0)) == 0;
        explicit_bzero(all, n * sizeof(*all));
        free(all);
        if (!ok)
                return reply_internal(r);
        return reply_json(r, 200, json_pack("{s:O}", "data", data));
}

/* The route's preview, unexpired; replies and returns false otherwise. */
static bool find(Req *r, StorePreview *ret, enum MHD_Result *reply) {
        ApiError e = { 0 };
        unsigned port = 0;
        if (!r->app->previews)
                previews_off(&e);
        else
                (void)(route_port(r, &port, &e) < 0 || api_sandbox_owned(r, &e) < 0);
        if (e.code) {
                *reply = reply_error(r, &e);
                return false;
        }
        int rc = previews_get(r->app->previews, r->route.sandbox_id, port, ret);
        if (rc == -ENOENT || (rc == 0 && preview_expired(ret, time_now_unix()))) {
                *reply = not_shared(r, port);
                return false;
        }
        if (rc < 0) {
                *reply = store_failed(r, "reading", rc);
                return false;
        }
        return true;
}

typedef struct TokenArgs {
        const char *ttl, *at;
        bool other;
} TokenArgs;

static enum MHD_Result token_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        TokenArgs *a = cls;
        if (strcmp(key, "ttlSeconds") == 0)
                a->ttl = value ? value : "";
        else if (strcmp(key, "expiresAt") == 0)
                a->at = value ? value : "";
        else
                a->other = true;
        return MHD_YES;
}

enum MHD_Result handle_preview_get(Req *r) {
        StorePreview p;
        enum MHD_Result reply;
        if (!find(r, &p, &reply))
                return reply;
        ApiError e = { 0 };
        TokenArgs a = { 0 };
        MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, token_arg, &a);
        int64_t end = 0;
        if (a.other)
                api_error(&e, 400, "invalid_request", NULL, "the arguments are ttlSeconds and expiresAt");
        else
                (void)lifetime(a.ttl, a.at, time_now_unix(), &end, &e);
        if (e.code)
                return reply_error(r, &e);
        json_t *j = preview_json(r, &p, end);
        explicit_bzero(p.secret, sizeof p.secret);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_preview_rotate(Req *r) {
        StorePreview p;
        enum MHD_Result reply;
        if (!find(r, &p, &reply))
                return reply;
        int rc = previews_rotate(r->app->previews, p.sandbox_id, p.port);
        if (rc == -ENOENT)
                return not_shared(r, p.port);
        if (rc < 0 || (rc = previews_get(r->app->previews, p.sandbox_id, p.port, &p)) < 0)
                return store_failed(r, "rotating", rc);
        /* The connections a token let in end with it. */
        if (!p.public)
                preview_proxy_close(p.sandbox_id, p.port);
        json_t *j = preview_json(r, &p, 0);
        explicit_bzero(p.secret, sizeof p.secret);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_preview_delete(Req *r) {
        StorePreview p;
        enum MHD_Result reply;
        if (!find(r, &p, &reply))
                return reply;
        explicit_bzero(p.secret, sizeof p.secret);
        int rc = previews_remove(r->app->previews, p.sandbox_id, p.port);
        if (rc == -ENOENT)
                return not_shared(r, p.port);
        if (rc < 0)
                return store_failed(r, "deleting", rc);
        /* Its open connections are closed before the answer. */
        preview_proxy_close(p.sandbox_id, p.port);
        return reply_json(r, 200, json_pack("{s:s,s:i,s:b}", "sandboxId", p.sandbox_id, "port", (int)p.port,
                                            "deleted", true));
}

int api_preview_share(Req *r, unsigned port, char *ret_url, size_t url_len, char ret_token[PREVIEW_TOKEN_MAX],
                      ApiError *e) {
        if (!r->app->previews)
                return previews_off(e);
        StorePreview p;
        int rc = previews_get(r->app->previews, r->route.sandbox_id, port, &p);
        if (rc == 0 && preview_expired(&p, time_now_unix())) {
                explicit_bzero(p.secret, sizeof p.secret);
                rc = -ENOENT;
        }
        /* None yet (or one that ended): a private one that lives as long as
         * the sandbox. One the owner shared already is used as it is. */
        if (rc == -ENOENT)
                rc = previews_put(r->app->previews, r->route.sandbox_id, r->key.owner, port, false, 0, NULL, &p);
        if (rc < 0) {
                log_error(r->rid, "sharing port %u of %s: %s", port, r->route.sandbox_id, strerror(-rc));
                return api_error(e, 503, "unavailable", "try again", "the previews' store did not answer");
        }
        url_of(r->app->preview_site, &p, ret_url, url_len);
        int64_t got = 0;
        rc = previews_token(r->app->previews, &p, time_now_unix() + PREVIEW_TOKEN_DEFAULT_SECONDS, ret_token, &got);
        explicit_bzero(p.secret, sizeof p.secret);
        if (rc < 0) {
                log_error(r->rid, "signing a token of preview %s:%u: %s", r->route.sandbox_id, port, strerror(-rc));
                return api_error(e, 500, "internal", NULL, "the preview's token could not be made");
        }
        return 0;
}

/* The preview a relayed connection may name, and the host relaying it. */
typedef struct Relay {
        char by[64];
        char sandbox_id[ROUTE_ID_LEN + 1];
        unsigned port;
} Relay;

static void relay_upgraded(void *cls, struct MHD_Connection *connection, void *req_cls, const char *extra_in,
                           size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh) {
        Relay *u = cls;
        int rc = preview_proxy_adopt(sock, urh, extra_in, extra_in_size, u->by, u->sandbox_id, u->port);
        if (rc < 0) {
                log_warn(NULL, "a preview relayed by host %s: %s", u->by, strerror(-rc));
                MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
        }
        free(u);
}

enum MHD_Result handle_preview_relay(Req *r) {
        ApiError e = { 0 };
        unsigned port = 0;
        /* The secret was checked at the edge; a client's own request, with
         * or without a header that names a host, has none. */
        if (!r->forwarded) {
                api_error(&e, 403, "forbidden", "open the preview at its URL, on the preview listener",
                          "this route serves the fleet's hosts only");
                return reply_error(r, &e);
        }
        if (!r->app->previews) {
                previews_off(&e);
                return reply_error(r, &e);
        }
        if (route_port(r, &port, &e) < 0)
                return reply_error(r, &e);
        const char *up = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Upgrade");
        if (!up || strcasecmp(up, PREVIEW_RELAY_PROTOCOL) != 0) {
                api_error(&e, 400, "invalid_request", "send Upgrade: " PREVIEW_RELAY_PROTOCOL,
                          "a relay is an upgrade to " PREVIEW_RELAY_PROTOCOL);
                return reply_error(r, &e);
        }
        Relay *u = calloc(1, sizeof(*u));
        if (!u)
                return reply_internal(r);
        const char *by = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, FORWARD_BY_HEADER);
        /* For the log and the per-host bound: printable, cut. */
        size_t k = 0;
        for (const char *p = by ? by : "?"; *p && k + 1 < sizeof u->by; p++)
                if (*p > 0x20 && *p < 0x7f)
                        u->by[k++] = *p;
        snprintf(u->sandbox_id, sizeof u->sandbox_id, "%s", r->route.sandbox_id);
        u->port = port;
        struct MHD_Response *resp = MHD_create_response_for_upgrade(relay_upgraded, u);
        if (!resp || MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, PREVIEW_RELAY_PROTOCOL) != MHD_YES) {
                if (resp)
                        MHD_destroy_response(resp);
                free(u);
                return reply_internal(r);
        }
        req_audit_note(r, "relayedBy", u->by);
        return reply_response(r, MHD_HTTP_SWITCHING_PROTOCOLS, resp, NULL);
}
