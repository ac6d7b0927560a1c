/* Signed file links: made and revoked by the sandbox's owner; checked, in
 * place of a key, on the download, archive and upload routes. A link that
 * does not verify gets one answer whatever is wrong with it, whether its
 * sandbox exists or not: the answer tells a forger nothing. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/api/api_links.h"
#include "daemon/http/request.h"
#include "daemon/manager/file_links.h"

static int links_off(ApiError *e) {
        return api_error(e, 501, "not_implemented", NULL, "this daemon makes no file links");
}

/* The address the client reached this host at, to make a URL it can open:
 * its Host header when it is a plain host[:port], else what the daemon
 * listens on. A balancer in front that ends TLS says so with
 * X-Forwarded-Proto: https. */
static void base_url(Req *r, char *buf, size_t n) {
        const char *host = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
        const char *proto = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Forwarded-Proto");
        bool ok = host && *host && strlen(host) <= 255;
        for (const char *p = host; ok && *p; p++)
                ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
                     *p == '-' || *p == ':' || *p == '[' || *p == ']';
        if (!ok)
                host = r->app->cfg->listen_addr ? r->app->cfg->listen_addr : "127.0.0.1";
        snprintf(buf, n, "%s://%s", proto && strcmp(proto, "https") == 0 ? "https" : "http", host);
}

static const char *route_of(FileLinkOp op) {
        return op == FILE_LINK_ARCHIVE ? "files/archive" : "files/content";
}

static json_t *link_json(Req *r, const FileLinkRequest *q, const FileLink *l, const char *query,
                         uint64_t max_bytes) {
        char base[300], at[RFC3339_LEN];
        _cleanup_free_ char *url = NULL;
        base_url(r, base, sizeof base);
        if (asprintf(&url, "%s/v1/sandboxes/%s/%s?%s", base, l->sandbox_id, route_of(l->op), query) < 0 ||
            time_format_rfc3339(l->expires_at, at) < 0)
                return NULL;
        json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:b,s:b,s:b}", "url", url, "id", l->id, "sandboxId",
                              l->sandbox_id, "method", l->op == FILE_LINK_UPLOAD ? "PUT" : "GET", "path", q->path,
                              "expiresAt", at, "expiresInSeconds", (json_int_t)q->ttl_seconds, "oneTime", l->once,
                              "wake", l->wake, "archive", l->op == FILE_LINK_ARCHIVE);
        if (j && l->op == FILE_LINK_UPLOAD)
                json_object_set_new(j, "maxBytes", json_integer((json_int_t)max_bytes));
        if (j && l->filename)
                json_object_set_new(j, "filename", json_string(l->filename));
        return j;
}

enum MHD_Result handle_files_link(Req *r) {
        ApiError e = { 0 };
        FileLinks *links = r->app->links;
        if (!links) {
                links_off(&e);
                return reply_error(r, &e);
        }
        uint64_t bound = (uint64_t)r->app->cfg->max_file_mib << 20;
        FileLinkRequest q = { 0 };
        int rc = request_parse_file_link(r->json, bound, &q, &e);
        if (rc < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        /* Only the owner links its sandbox's files: 404 otherwise, and for
         * one deleted. */
        SandboxError se;
        SandboxRow row;
        if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se) < 0) {
                file_link_request_done(&q);
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        sandbox_row_done(&row);
        FileLink l = { .op = q.op, .path = q.path, .path_len = strlen(q.path),
                       .expires_at = time_now_unix() + q.ttl_seconds, .once = q.once, .wake = q.wake,
                       .max_bytes = q.max_bytes, .filename = q.filename };
        snprintf(l.sandbox_id, sizeof l.sandbox_id, "%s", r->route.sandbox_id);
        uint8_t secret[FILE_LINK_SECRET_LEN];
        char sig[FILE_LINK_SIG_HEX_LEN + 1];
        _cleanup_free_ char *query = NULL;
        if ((rc = file_link_new_id(l.id)) < 0 ||
            (rc = file_links_secret(links, l.sandbox_id, r->key.owner, secret)) < 0 ||
            (rc = file_link_sign(secret, &l, sig)) < 0 || (rc = file_link_query(&l, sig, &query)) < 0) {
                explicit_bzero(secret, sizeof secret);
                file_link_request_done(&q);
                log_error(r->rid, "making a file link for %s: %s", r->route.sandbox_id, strerror(-rc));
                return reply_internal(r);
        }
        explicit_bzero(secret, sizeof secret);
        req_audit_note(r, "link", l.id);
        json_t *j = link_json(r, &q, &l, query, q.max_bytes ? q.max_bytes : bound);
        file_link_request_done(&q);
        return j ? reply_json(r, 201, j) : reply_internal(r);
}

enum MHD_Result handle_files_revoke_links(Req *r) {
        ApiError e = { 0 };
        FileLinks *links = r->app->links;
        if (!links) {
                links_off(&e);
                return reply_error(r, &e);
        }
        if (json_object_size(r->json) > 0) {
                api_error(&e, 400, "invalid_request", NULL, "files:revoke-links takes no fields");
                return reply_error(r, &e);
        }
        SandboxError se;
        SandboxRow row;
        if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        sandbox_row_done(&row);
        int rc = file_links_revoke(links, r->route.sandbox_id, r->key.owner);
        if (rc < 0) {
                log_error(r->rid, "revoking the file links of %s: %s", r->route.sandbox_id, strerror(-rc));
                return reply_internal(r);
        }
        char at[RFC3339_LEN];
        if (time_format_rfc3339(time_now_unix(), at) < 0)
                return reply_internal(r);
        return reply_json(r, 200, json_pack("{s:s,s:b,s:s}", "sandboxId", r->route.sandbox_id, "revoked", true,
                                            "revokedAt", at));
}

/* ---- a link in place of a key ---- */

typedef struct ArgWalk {
        FileLinkParse p;
        bool bad;
} ArgWalk;

static enum MHD_Result link_arg(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                const char *value, size_t value_size) {
        ArgWalk *w = cls;
        if (!key || strlen(key) != key_size || file_link_parse_arg(&w->p, key, value, value_size) < 0) {
                w->bad = true;
                return MHD_NO;
        }
        return MHD_YES;
}

static FileLinkOp op_of(const char *op) {
        if (strcmp(op, "upload") == 0)
                return FILE_LINK_UPLOAD;
        return strcmp(op, "archive") == 0 ? FILE_LINK_ARCHIVE : FILE_LINK_DOWNLOAD;
}

static int not_valid(ApiError *e) {
        return api_error(e, 403, "forbidden", "ask the sandbox's owner for a new link",
                         "this link is not valid: it was changed, revoked, or made for another sandbox or method");
}

int api_links_check(void *userdata, Req *r, const char *op, ApiError *e) {
        App *app = userdata;
        if (!app->links)
                return links_off(e);
        ArgWalk w;
        file_link_parse_init(&w.p);
        w.bad = false;
        /* Every argument is the link's, each once: one the link was not
         * made with (a user, a mode) would change what it does. */
        MHD_get_connection_values_n(r->conn, MHD_GET_ARGUMENT_KIND, link_arg, &w);
        if (w.bad || file_link_parse_done(&w.p) < 0)
                return not_valid(e);
        FileLink *l = &w.p.link;
        l->op = op_of(op);
        snprintf(l->sandbox_id, sizeof l->sandbox_id, "%s", r->route.sandbox_id);
        /* A sandbox with no secret (none, or never linked) is checked
         * against a key no link has, and refused the same way. */
        static const uint8_t none[FILE_LINK_SECRET_LEN];
        uint8_t secret[FILE_LINK_SECRET_LEN];
        char owner[sizeof r->key.owner];
        int rc = file_links_lookup(app->links, l->sandbox_id, secret, owner, sizeof owner);
        if (rc == -EBADMSG)
                log_error(r->rid, "the link secret of %s does not open with this daemon's secrets key",
                          l->sandbox_id);
        else if (rc < 0 && rc != -ENOENT) {
                log_error(r->rid, "reading the link secret of %s: %s", l->sandbox_id, strerror(-rc));
                return api_error(e, 503, "unavailable", "try again", "the store did not answer");
        }
        bool ok = file_link_verify(rc == 0 ? secret : none, l, w.p.sig) && rc == 0;
        explicit_bzero(secret, sizeof secret);
        if (!ok)
                return not_valid(e);
        if (l->expires_at <= time_now_unix()) {
                char at[RFC3339_LEN];
                if (time_format_rfc3339(l->expires_at, at) < 0)
                        snprintf(at, sizeof at, "%" PRId64, l->expires_at);
                return api_error(e, 410, "link_expired", "ask the sandbox's owner for a new link",
                                 "this link expired at %s", at);
        }
        r->key = (KeyInfo){ .access = l->wake ? KEY_ACCESS_FULL : KEY_ACCESS_READ, .daily_limit_micros = -1 };
        snprintf(r->key.id, sizeof r->key.id, "%s", l->id);
        snprintf(r->key.name, sizeof r->key.name, "file link");
        snprintf(r->key.owner, sizeof r->key.owner, "%s", owner);
        r->link.once = l->once;
        r->link.expires_at = l->expires_at;
        r->link.max_bytes = l->max_bytes;
        snprintf(r->link.filename, sizeof r->link.filename, "%s", l->filename ? l->filename : "");
        return 0;
}

int api_links_claim(void *userdata, Req *r, ApiError *e) {
        App *app = userdata;
        FileLink l = { .expires_at = r->link.expires_at };
        snprintf(l.sandbox_id, sizeof l.sandbox_id, "%s", r->route.sandbox_id);
        if (!file_link_id_ok(r->key.id))
                return api_error(e, 500, "internal", NULL, "the request's link has no id");
        memcpy(l.id, r->key.id, sizeof l.id);
        int rc = file_links_use_once(app->links, &l);
        if (rc == -EALREADY)
                return api_error(e, 410, "link_used", "ask the sandbox's owner for a new link",
                                 "this one-time link was used already");
        if (rc < 0) {
                log_error(r->rid, "recording the use of link %s: %s", l.id, strerror(-rc));
                return api_error(e, 503, "unavailable", "try again", "the store did not answer");
        }
        return 0;
}
