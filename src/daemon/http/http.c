#include "daemon/http/http.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/evp.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/model/auth.h"
#include "daemon/manager/request_counts.h"
#include "daemon/manager/audit.h"
#include "daemon/manager/fleet.h"
#include "daemon/manager/images.h"
#include "daemon/manager/keys.h"
#include "common/log.h"
#include "daemon/manager/metrics.h"
#include "daemon/http/edge.h"
#include "daemon/http/forward.h"
#include "daemon/http/request.h"
#include "daemon/http/session_conns.h"
#include "daemon/manager/snapshot.h"

/* Bytes of a refused body read and thrown away before the connection is cut. */
#define MAX_DISCARD (2u * 1024u * 1024u)

/* ---- routing ---- */

bool route_sandbox_id_ok(const char *s) {
        if (strncmp(s, "sbx_", 4) != 0 || strlen(s) != ROUTE_ID_LEN)
                return false;
        for (const char *p = s + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

bool route_key_id_ok(const char *s) {
        if (strncmp(s, "key_", 4) != 0 || strlen(s) != ROUTE_KEY_ID_LEN)
                return false;
        for (const char *p = s + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static bool proc_id_ok(const char *s) {
        if (strncmp(s, "proc_", 5) != 0 || strlen(s) != HTTP_PROCESS_ID_LEN)
                return false;
        for (const char *p = s + 5; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static bool upload_id_ok(const char *s) {
        if (strncmp(s, "upl_", 4) != 0 || strlen(s) != HTTP_UPLOAD_ID_LEN)
                return false;
        for (const char *p = s + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

bool route_context_id_ok(const char *s) {
        size_t len = strlen(s);
        if (len == 0 || len > 63)
                return false;
        for (size_t i = 0; i < len; i++) {
                char c = s[i];
                if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && c == '-')))
                        return false;
        }
        return true;
}

/* A kept result's name: no '/', no leading dot, so never "." or "..". */
static bool result_name_ok(const char *s) {
        size_t len = strlen(s);
        if (len == 0 || len > 128)
                return false;
        for (size_t i = 0; i < len; i++) {
                char c = s[i];
                bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                          (i > 0 && (c == '_' || c == '.' || c == '-'));
                if (!ok)
                        return false;
        }
        return true;
}

/* A host id: what --host-id and host.id may hold. */
static bool host_id_ok(const char *s) {
        for (const char *p = s; *p; p++) {
                char c = *p;
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '-' || c == '.'))
                        return false;
        }
        return *s != '\0' && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* A record's id: prefix and then exactly `hex` lowercase hex digits. */
static bool hex_id_ok(const char *s, const char *prefix, size_t hex) {
        size_t pl = strlen(prefix);
        if (strncmp(s, prefix, pl) != 0 || strlen(s) != pl + hex)
                return false;
        for (const char *p = s + pl; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

/* Stores one path parameter into r after checking its shape. */
static bool param_set(const char *name, size_t name_len, const char *v, size_t len, Route *r) {
#define IS(lit) (name_len == sizeof(lit) - 1 && memcmp(name, lit, name_len) == 0)
        char *dst;
        size_t cap;
        if (IS("sandbox")) {
                dst = r->sandbox_id;
                cap = sizeof(r->sandbox_id);
        } else if (IS("key")) {
                dst = r->key_id;
                cap = sizeof(r->key_id);
        } else if (IS("image")) {
                dst = r->image;
                cap = sizeof(r->image);
        } else if (IS("secret")) {
                dst = r->secret;
                cap = sizeof(r->secret);
        } else if (IS("process")) {
                dst = r->proc_id;
                cap = sizeof(r->proc_id);
        } else if (IS("upload")) {
                dst = r->upload_id;
                cap = sizeof(r->upload_id);
        } else if (IS("snapshot")) {
                dst = r->snapshot_id;
                cap = sizeof(r->snapshot_id);
        } else if (IS("context")) {
                dst = r->context;
                cap = sizeof(r->context);
        } else if (IS("result")) {
                dst = r->result;
                cap = sizeof(r->result);
        } else if (IS("host")) {
                dst = r->host_id;
                cap = sizeof(r->host_id);
        } else if (IS("webhook")) {
                dst = r->webhook_id;
                cap = sizeof(r->webhook_id);
        } else if (IS("delivery")) {
                dst = r->delivery_id;
                cap = sizeof(r->delivery_id);
        } else if (IS("export")) {
                dst = r->export_id;
                cap = sizeof(r->export_id);
        } else if (IS("port")) {
                dst = r->port;
                cap = sizeof(r->port);
        } else if (IS("digest")) {
                dst = r->digest;
                cap = sizeof(r->digest);
        } else if (IS("session")) {
                dst = r->session_id;
                cap = sizeof(r->session_id);
        } else if (IS("watch")) {
                dst = r->watch_id;
                cap = sizeof(r->watch_id);
        } else if (IS("recording")) {
                dst = r->recording;
                cap = sizeof(r->recording);
        } else if (IS("volume")) {
                dst = r->volume_id;
                cap = sizeof(r->volume_id);
        } else if (IS("backup")) {
                dst = r->backup_id;
                cap = sizeof(r->backup_id);
        } else
                return false;
        if (len == 0 || len >= cap || memchr(v, '/', len))
                return false;
        memcpy(dst, v, len);
        dst[len] = '\0';
        if (IS("sandbox"))
                return route_sandbox_id_ok(dst);
        if (IS("key"))
                return route_key_id_ok(dst);
        if (IS("image"))
                return image_name_ok(dst);
        if (IS("process"))
                return proc_id_ok(dst);
        if (IS("upload"))
                return upload_id_ok(dst);
        if (IS("snapshot"))
                return snapshot_id_ok(dst);
        if (IS("context"))
                return route_context_id_ok(dst);
        if (IS("result"))
                return result_name_ok(dst);
        if (IS("host"))
                return host_id_ok(dst);
        if (IS("webhook"))
                return hex_id_ok(dst, "wh_", 20);
        if (IS("delivery"))
                return hex_id_ok(dst, "whd_", 20);
        if (IS("export"))
                return hex_id_ok(dst, "otx_", 20);
        if (IS("recording"))
                return hex_id_ok(dst, "rec_", 20);
        if (IS("port"))
                return strspn(dst, "0123456789") == len;
        if (IS("session"))
                return hex_id_ok(dst, "ses_", 20);
        if (IS("watch"))
                return host_id_ok(dst) && dst[0] != '.' && dst[0] != '_' && dst[0] != '-';
        if (IS("volume"))
                return hex_id_ok(dst, "vol_", 20);
        if (IS("backup"))
                return hex_id_ok(dst, "vb_", 20);
        if (IS("digest")) {
                size_t n = strspn(dst, "0123456789abcdef");
                return n == 64 && !dst[n];
        }
        return true;
#undef IS
}

/* Whether url has the shape of pattern; fills its parameters into r. */
static bool path_match(const char *pattern, const char *url, Route *r) {
        for (;;) {
                const char *open = strchr(pattern, '{');
                if (!open)
                        return strcmp(pattern, url) == 0;
                size_t lit = (size_t)(open - pattern);
                if (strncmp(pattern, url, lit) != 0)
                        return false;
                const char *close = strchr(open, '}');
                if (!close)
                        return false;
                const char *v = url + lit, *rest = close + 1;
                const char *end = *rest ? strchr(v, *rest) : v + strlen(v);
                if (!end)
                        return false;
                if (!param_set(open + 1, (size_t)(close - open - 1), v, (size_t)(end - v), r))
                        return false;
                pattern = rest;
                url = end;
        }
}

int http_route_match(const HttpRoute *routes, size_t n, const char *method, const char *url, Route *ret) {
        if (!method || !url)
                return -ENOENT;
        if (strlen(url) > ROUTE_MAX_URL)
                return -EMSGSIZE;
        Route r = { 0 };
        bool path_known = false;
        for (size_t i = 0; i < n; i++) {
                Route cand = { 0 };
                if (!path_match(routes[i].path, url, &cand))
                        continue;
                if (strcmp(method, routes[i].method) == 0) {
                        cand.def = &routes[i];
                        cand.kind = routes[i].kind;
                        *ret = cand;
                        return 0;
                }
                if (!path_known)
                        r = cand;
                path_known = true;
                size_t used = strlen(r.allow);
                snprintf(r.allow + used, sizeof(r.allow) - used, "%s%s", used ? ", " : "", routes[i].method);
        }
        if (!path_known)
                return -ENOENT;
        *ret = r;
        return -EOPNOTSUPP;
}

/* ---- answering ---- */

enum MHD_Result reply_response(Req *r, unsigned status, struct MHD_Response *resp, const char *content_type) {
        if (!resp)
                return MHD_NO;
        MHD_add_response_header(resp, "X-Request-Id", r->rid);
        MHD_add_response_header(resp, "Cache-Control", "no-store");
        if (r->link.filename[0] && status < 300) {
                char disposition[sizeof r->link.filename + 32];
                snprintf(disposition, sizeof disposition, "attachment; filename=\"%s\"", r->link.filename);
                MHD_add_response_header(resp, "Content-Disposition", disposition);
        }
        if (content_type)
                MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        /* A session's page reads the answer: its origin only, never "*". */
        if (r->session.used && r->session.origin[0]) {
                MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->session.origin);
                MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id, Idempotent-Replayed");
                MHD_add_response_header(resp, "Vary", "Origin");
        }
        enum MHD_Result ret = MHD_queue_response(r->conn, status, resp);
        MHD_destroy_response(resp);
        if (ret == MHD_YES) {
                r->answered = true;
                r->status = status;
        }
        return ret;
}

enum MHD_Result reply_json(Req *r, unsigned status, json_t *body) {
        char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        json_decref(body);
        if (!text)
                return MHD_NO;
        size_t len = strlen(text);
        text[len] = '\0';
        /* Append a newline: friendlier for curl users. */
        char *t2 = realloc(text, len + 2);
        if (!t2) {
                free(text);
                return MHD_NO;
        }
        t2[len] = '\n';
        t2[len + 1] = '\0';
        if (r->idem_key) {
                int rc = db_idem_finish(r->idem_db, r->key.owner, r->idem_key, status, t2);
                if (rc < 0)
                        log_warn(r->rid, "keeping the answer for Idempotency-Key: %s", strerror(-rc));
                free(TAKE_PTR(r->idem_key));
        }
        struct MHD_Response *resp = MHD_create_response_from_buffer(len + 1, t2, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(t2);
                return MHD_NO;
        }
        return reply_response(r, status, resp, "application/json");
}

enum MHD_Result reply_error(Req *r, const ApiError *e) {
        if (e->status >= 500)
                log_warn(r->rid, "%s %s: %d %s: %s", r->method, r->path, e->status, e->code, e->message);
        else
                log_debug(r->rid, "%s %s: %d %s: %s", r->method, r->path, e->status, e->code, e->message);
        struct MHD_Response *resp;
        json_t *j = api_error_json(e, r->rid);
        if (e->status == 401) {
                char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
                json_decref(j);
                if (!text)
                        return MHD_NO;
                resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
                if (!resp) {
                        free(text);
                        return MHD_NO;
                }
                MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
                return reply_response(r, 401, resp, "application/json");
        }
        if (e->status == 405 && r->route.allow[0]) {
                char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
                json_decref(j);
                if (!text)
                        return MHD_NO;
                resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
                if (!resp) {
                        free(text);
                        return MHD_NO;
                }
                MHD_add_response_header(resp, "Allow", r->route.allow);
                return reply_response(r, 405, resp, "application/json");
        }
        return reply_json(r, (unsigned)e->status, j);
}

enum MHD_Result reply_internal(Req *r) {
        ApiError e;
        api_error(&e, 500, "internal", "the daemon's log has details", "internal error");
        return reply_error(r, &e);
}

int req_socket(Req *r) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        return ci ? ci->connect_fd : -1;
}

bool socket_hung_up(int fd) {
        if (fd < 0)
                return false;
        struct pollfd p = { .fd = fd, .events = POLLRDHUP };
        if (poll(&p, 1, 0) <= 0)
                return false;
        return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

enum MHD_Result reply_result(Req *r, int rc, json_t *j, const ApiError *e, unsigned status) {
        if (rc < 0) {
                json_decref(j);
                if (!e->code)
                        return reply_internal(r);
                return reply_error(r, e);
        }
        return reply_json(r, status, j);
}

bool req_query_n(Req *r, const char *name, const char **ret, size_t *ret_len) {
        const char *p = NULL;
        size_t len = 0;
        if (MHD_lookup_connection_value_n(r->conn, MHD_GET_ARGUMENT_KIND, name, strlen(name), &p, &len) != MHD_YES ||
            !p)
                return false;
        *ret = p;
        *ret_len = len;
        return true;
}

bool req_from_this_host(Req *r, bool unix_socket) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (!ci || !ci->client_addr)
                return unix_socket;
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_UNIX)
                return true;
        if (sa->sa_family == AF_INET) {
                const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
                return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
        }
        if (sa->sa_family == AF_INET6) {
                const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
                if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
                        return true;
                return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
        }
        return unix_socket;
}

const char *req_query(Req *r, const char *name) {
        return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* ---- the MHD callbacks ---- */

struct HttpServer {
        const HttpRoute *routes;
        size_t n_routes;
        App *app;
        Db *db;         /* the idempotency records */
        KeyStore *keys; /* authentication */
        unsigned max_connections;
        unsigned max_per_peer;
        Fleet *fleet;   /* this host's standing: fenced, it serves nothing but metrics */
        Audit *audit;   /* NULL: no audit trail */
        RequestCounts *requests; /* NULL: answers not counted */
        const char *fleet_secret; /* NULL: no forwarding */
        const HttpLinks *links;   /* NULL: no signed file links */
        const HttpSessions *sessions; /* NULL: no sandbox sessions */
        SessionConns *session_conns;  /* the connections of sessions' requests */
        struct MHD_Daemon *mhd;
        /* The hop's TLS listener (http_server_start_hop); NULL: the hop
         * comes to the clients' listener. */
        struct MHD_Daemon *mhd_hop;
        Edge *edge;
        unsigned max_waiting;
        unsigned head_timeout_s;
        /* Requests each owner has in progress (streams and WebSockets
         * included), at most owner_max. */
        unsigned owner_max;
        pthread_mutex_t owners_lock;
        struct OwnerLoad *owners[OWNER_BUCKETS];
};

/* Whether a comma-separated header value (Connection) names token. */
static bool header_has_token(const char *value, const char *token) {
        size_t n = strlen(token);
        for (const char *p = value; p && *p;) {
                while (*p == ' ' || *p == '\t' || *p == ',')
                        p++;
                const char *end = p;
                while (*end && *end != ',')
                        end++;
                const char *last = end;
                while (last > p && (last[-1] == ' ' || last[-1] == '\t'))
                        last--;
                if ((size_t)(last - p) == n && strncasecmp(p, token, n) == 0)
                        return true;
                p = end;
        }
        return false;
}

/* ---- each owner's requests in progress ---- */

/* A connection's own: the edge's watch on it, and the owner whose request
 * it carries after an upgrade, counted until it closes. */
typedef struct Conn {
        EdgeConn *edge;
        int fd;
        bool hop; /* on the hop's TLS listener: the edge never sees it */
        char *owner;
} Conn;

typedef struct OwnerLoad {
        unsigned n;
        struct OwnerLoad *next;
        char owner[];
} OwnerLoad;

static unsigned owner_bucket(const char *owner) {
        return (unsigned)(fnv1a64_str(FNV1A64_INIT, owner) % OWNER_BUCKETS);
}

/* One more request of r's owner, unless it has owner_max in progress. */
static int owner_take(HttpServer *s, Req *r) {
        unsigned b = owner_bucket(r->key.owner);
        int rc = 0;
        pthread_mutex_lock(&s->owners_lock);
        OwnerLoad *o = s->owners[b];
        while (o && strcmp(o->owner, r->key.owner) != 0)
                o = o->next;
        if (!o) {
                size_t len = strlen(r->key.owner);
                if ((o = calloc(1, sizeof *o + len + 1))) {
                        memcpy(o->owner, r->key.owner, len + 1);
                        o->next = s->owners[b];
                        s->owners[b] = o;
                }
        }
        if (!o)
                rc = -ENOMEM;
        else if (o->n >= s->owner_max)
                rc = -EUSERS;
        else {
                o->n++;
                r->owner_counted = true;
        }
        pthread_mutex_unlock(&s->owners_lock);
        return rc;
}

static void owner_release(HttpServer *s, const char *owner) {
        unsigned b = owner_bucket(owner);
        pthread_mutex_lock(&s->owners_lock);
        for (OwnerLoad **pp = &s->owners[b]; *pp; pp = &(*pp)->next) {
                OwnerLoad *o = *pp;
                if (strcmp(o->owner, owner) != 0)
                        continue;
                if (--o->n == 0) {
                        *pp = o->next;
                        free(o);
                }
                break;
        }
        pthread_mutex_unlock(&s->owners_lock);
}

void http_server_set_bounds(HttpServer *s, unsigned owner_max, unsigned max_waiting, unsigned head_timeout_s) {
        s->owner_max = owner_max;
        s->max_waiting = max_waiting;
        s->head_timeout_s = head_timeout_s;
}

void http_server_edge_stats(HttpServer *s, EdgeStats *ret) {
        edge_stats(s ? s->edge : NULL, ret);
}

void http_server_set_fleet(HttpServer *s, Fleet *fleet) {
        s->fleet = fleet;
}

void http_server_set_requests(HttpServer *s, RequestCounts *requests) {
        s->requests = requests;
}

void http_server_set_audit(HttpServer *s, Audit *audit) {
        s->audit = audit;
}

/* The text of at most AUDIT_DETAIL_MAX bytes of value, cut on a UTF-8
 * character's boundary; the cut is said. */
static json_t *bounded_text(const char *value) {
        size_t n = strlen(value);
        if (n <= AUDIT_DETAIL_MAX)
                return json_stringn(value, n);
        n = AUDIT_DETAIL_MAX;
        while (n > 0 && ((unsigned char)value[n] & 0xC0) == 0x80)
                n--;
        char *cut = NULL;
        if (asprintf(&cut, "%.*s... (%zu bytes)", (int)n, value, strlen(value)) < 0)
                return NULL;
        json_t *j = json_string(cut);
        free(cut);
        return j;
}

void req_audit_note(Req *r, const char *field, const char *value) {
        if (!value)
                return;
        if (!r->audit_detail && !(r->audit_detail = json_object()))
                return;
        json_t *v = bounded_text(value);
        if (v)
                json_object_set_new(r->audit_detail, field, v);
}

void req_audit_note_json(Req *r, const char *field, json_t *v) {
        if (!v)
                return;
        if (!r->audit_detail && !(r->audit_detail = json_object())) {
                json_decref(v);
                return;
        }
        json_object_set_new(r->audit_detail, field, v);
}

/* The action of a route: its name with its first '_' a '.' and the
 * resource singular ("keys_create": key.create, "proc_spawn":
 * process.spawn); a one-word name is a sandbox's ("stop": sandbox.stop).
 * The POST twin of a DELETE ("webhook_delete_post") is the same act:
 * webhook.delete. */
static void audit_action(const char *route_name, char *buf, size_t n) {
        char name[64];
        size_t len = strlen(route_name);
        if (len > 5 && strcmp(route_name + len - 5, "_post") == 0)
                len -= 5;
        snprintf(name, sizeof name, "%.*s", (int)len, route_name);
        const char *us = strchr(name, '_');
        if (!us) {
                snprintf(buf, n, "sandbox.%s", name);
                return;
        }
        size_t head = (size_t)(us - name);
        if (head == 4 && strncmp(name, "proc", 4) == 0)
                snprintf(buf, n, "process.%s", us + 1);
        else if (head > 1 && name[head - 1] == 's' && strncmp(name, "sandboxes", head) != 0)
                snprintf(buf, n, "%.*s.%s", (int)head - 1, name, us + 1);
        else
                snprintf(buf, n, "%.*s.%s", (int)head, name, us + 1);
}

static void client_text(Req *r, char *buf, size_t n) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        snprintf(buf, n, "unix");
        if (!ci || !ci->client_addr)
                return;
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
                inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)n);
        else if (sa->sa_family == AF_INET6)
                inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, (socklen_t)n);
}

/* The audit record of an answered request: one that changes something or
 * opens a WebSocket, of a known key, served here (one forwarded on is the
 * owner host's to record). */
static void audit_request(HttpServer *s, Req *r, unsigned status) {
        if (!s->audit || !r->route.def || !r->key.id[0] || r->fwd || !status || r->audit_skip)
                return;
        if (strcmp(r->method, "GET") == 0 && status != 101)
                return;
        char action[96], client[INET6_ADDRSTRLEN + 1], path[257];
        audit_action(r->route.def->name, action, sizeof action);
        client_text(r, client, sizeof client);
        snprintf(path, sizeof path, "%s", r->url ? r->url : r->path);
        const char *named = req_query(r, "path");
        if (named)
                req_audit_note(r, "path", named);
        _cleanup_free_ char *detail = r->audit_detail ? json_dumps(r->audit_detail, JSON_COMPACT) : NULL;
        AuditRecord rec = { .owner = r->key.owner, .action = action, .key_id = r->key.id, .method = r->method,
                            .path = path,
                            .sandbox_id = r->route.sandbox_id[0] ? r->route.sandbox_id : r->audit_sandbox_id,
                            .detail = detail, .status = (int)status,
                            .client = client, .request_id = r->rid };
        audit_record(s->audit, &rec);
}

void http_server_set_fleet_secret(HttpServer *s, const char *secret) {
        s->fleet_secret = secret;
}

/* Whether conn came to the hop's TLS listener. */
static bool on_hop_listener(const HttpServer *s, struct MHD_Connection *conn) {
        if (!s->mhd_hop)
                return false;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_DAEMON);
        return ci && ci->daemon == s->mhd_hop;
}

void http_server_set_links(HttpServer *s, const HttpLinks *links) {
        s->links = links;
}

void http_server_set_sessions(HttpServer *s, const HttpSessions *sessions) {
        s->sessions = sessions;
        if (sessions && !s->session_conns)
                s->session_conns = session_conns_new();
}

void req_end_session(Req *r, const char *session_id) {
        if (r->server && r->server->session_conns)
                session_conns_end(r->server->session_conns, session_id);
}

/* Where sandbox_id runs when another host does: 1 and its url (host, the
 * host's id), 0 when here (or the sandbox is not found: the handler says
 * so), -ENOENT when that host is not in the fleet's list (it does not
 * answer). A host on SQLite, or running the sandbox, reads nothing. */
static int sandbox_elsewhere(HttpServer *s, const char *sandbox_id, char *host, size_t host_len, char *url,
                             size_t url_len) {
        /* A host alone as of its last look, or running the sandbox, serves
         * it without reading its record; a host that joined since (and may
         * run it) is looked for below. */
        if (fleet_runs_here(s->fleet, sandbox_id) || (fleet_alone(s->fleet) && fleet_single(s->fleet)))
                return 0;
        SandboxRow row;
        if (db_sandbox_get(s->db, sandbox_id, &row) < 0)
                return 0;
        const char *self = fleet_host_id(s->fleet);
        bool here = !row.host_id[0] || strcmp(row.host_id, self) == 0 || row.state == SANDBOX_LOST;
        snprintf(host, host_len, "%s", row.host_id);
        sandbox_row_done(&row);
        if (here)
                return 0;
        int rc = fleet_host_url(s->fleet, host, url, url_len);
        if (rc == -ENOENT && fleet_refresh(s->fleet) == 0) /* a host that joined since the last look */
                rc = fleet_host_url(s->fleet, host, url, url_len);
        return rc < 0 ? -ENOENT : 1;
}

/* Whether r is about a sandbox another live host runs, and so goes on to
 * it: 1 (r->fwd open), 0 (served here), or a refusal in e (-1). */
static int forward_decide(HttpServer *s, Req *r, ApiError *e) {
        if (r->forwarded || !r->route.sandbox_id[0] || !s->fleet || r->route.def->store_only)
                return 0;
        char host[64], url[512];
        int rc = sandbox_elsewhere(s, r->route.sandbox_id, host, sizeof host, url, sizeof url);
        if (rc == 0)
                return 0;
        if (rc < 0)
                return api_error(e, 503, "host_unavailable", "try again; once the host is declared dead the sandbox "
                                 "shows as lost", "host %s, which runs sandbox %s, does not answer", host,
                                 r->route.sandbox_id);
        if (!s->fleet_secret) {
                /* Its record is the store's: read here. Anything that
                 * reaches its processes or files is its host's. */
                if (strcmp(r->route.def->name, "sandbox_get") == 0)
                        return 0;
                return api_error(e, 503, "unavailable", "send it to that host, or give the hosts a fleet secret "
                                 "(docs/fleet.md)", "sandbox %s runs on host %s, and this host does not forward",
                                 r->route.sandbox_id, host);
        }
        ForwardRequest q = { .conn = r->conn, .method = r->method, .url = r->url, .rid = r->rid,
                             .sandbox_id = r->route.sandbox_id, .client_fd = req_socket(r), .body_len = -1 };
        if (forward_open(&q, url, s->fleet_secret, fleet_host_id(s->fleet), &r->fwd, e) < 0)
                return -1;
        log_info(r->rid, "%s %s goes on to host %s", r->method, r->path, host);
        return 1;
}

int http_forward_to_sandbox(Req *r, const char *sandbox_id, enum MHD_Result *ret) {
        HttpServer *s = r->server;
        char host[64], url[512];
        if (r->forwarded || !http_forwards(r) ||
            sandbox_elsewhere(s, sandbox_id, host, sizeof host, url, sizeof url) <= 0 ||
            http_forward_whole(r, url, ret) < 0)
                return 0;
        log_info(r->rid, "%s %s goes on to host %s, which runs sandbox %s", r->method, r->path, host, sandbox_id);
        return 1;
}

/* The owner's answer to a request that went on, for the client. */
static enum MHD_Result forward_reply(Forward *f, Req *r) {
        ApiError e = { 0 };
        unsigned status = 0;
        struct MHD_Response *resp = NULL;
        int rc = forward_answer(f, &status, &resp, &e);
        if (rc == -ECONNRESET)
                return MHD_NO;
        if (rc < 0)
                return reply_error(r, &e);
        /* The owner answered, and with its answer finished the claim this
         * host held (kept, or dropped for a retry): nothing left to do. */
        free(TAKE_PTR(r->idem_key));
        return reply_response(r, status, resp, NULL);
}

bool http_forwards(const Req *r) {
        return r->server && r->server->fleet_secret && r->server->fleet;
}

int http_forward_whole(Req *r, const char *base_url, enum MHD_Result *ret) {
        HttpServer *s = r->server;
        ApiError e = { 0 };
        Forward *f = NULL;
        if (!s->fleet_secret || !s->fleet)
                return -EHOSTUNREACH;
        ForwardRequest q = { .conn = r->conn, .method = r->method, .url = r->url, .rid = r->rid,
                             .sandbox_id = r->route.sandbox_id, .claimed = r->idem_key != NULL,
                             .client_fd = req_socket(r), .body_len = (long long)r->body_len };
        if (forward_open(&q, base_url, s->fleet_secret, fleet_host_id(s->fleet), &f, &e) < 0)
                return -EHOSTUNREACH; /* nothing sent: the caller may run it elsewhere */
        if (r->body_len && forward_body(f, r->body, r->body_len) < 0) {
                forward_free(f);
                api_error(&e, 503, "host_unavailable", "try again", "the chosen host hung up");
                *ret = reply_error(r, &e);
                return 0;
        }
        *ret = forward_reply(f, r);
        return 0;
}

static bool has_body(const HttpRoute *d) {
        return d->body != HTTP_BODY_NONE;
}

static size_t body_limit(const HttpRoute *d) {
        return d->max_body ? d->max_body : REQ_MAX_BODY;
}

static int body_too_large(ApiError *e, const HttpRoute *d) {
        unsigned mib = (unsigned)(body_limit(d) >> 20);
        return api_error(e, 413, "payload_too_large", d->too_large_hint ? d->too_large_hint : "send at most 1 MiB of JSON",
                         "the request body is over %u MiB", mib);
}

/* The first header whose value no handler may see: one with a control
 * byte (RFC 9110 allows none but a tab) or over HTTP_MAX_HEADER_VALUE bytes.
 * libmicrohttpd bounds the whole head by its connection memory. */
typedef struct BadHeader {
        char name[64];
        const char *why;
} BadHeader;

static enum MHD_Result header_check(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                    const char *value, size_t value_size) {
        BadHeader *bad = cls;
        const char *why = NULL;
        /* Authorization is judged whole by the key check: any value that is
         * not a key, however long, is a 401. */
        if (value_size > HTTP_MAX_HEADER_VALUE &&
            !(key && strcasecmp(key, MHD_HTTP_HEADER_AUTHORIZATION) == 0))
                why = "is too long";
        for (size_t i = 0; !why && value && i < value_size; i++) {
                unsigned char c = (unsigned char)value[i];
                if ((c < 0x20 && c != '\t') || c == 0x7f)
                        why = "has a control character";
        }
        if (!why)
                return MHD_YES;
        /* The name goes into the error: keep it short and printable. */
        size_t n = 0;
        for (size_t i = 0; key && i < key_size && n + 1 < sizeof bad->name; i++)
                if (key[i] > 0x20 && key[i] < 0x7f)
                        bad->name[n++] = key[i];
        bad->name[n] = '\0';
        bad->why = why;
        return MHD_NO;
}

static int owner_admit(HttpServer *s, Req *r, ApiError *e);

/* A request with a sandbox session's token: the token, the page's origin,
 * the route (the table's allow-list) and the sandbox, in that order. */
static int admit_session(HttpServer *s, Req *r, const char *token, ApiError *e) {
        const HttpRoute *d = r->route.def;
        if (!s->sessions)
                return api_error(e, 401, "unauthorized", "use an API key", "this server makes no sandbox sessions");
        const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
        int rc = s->sessions->check(s->sessions->userdata, r, token, origin, e);
        if (rc < 0)
                return rc;
        if (!d->session)
                return api_error(e, 403, "forbidden", "a session uses its sandbox's commands, processes, files, "
                                 "terminals, watches and previews; do the rest with an API key on your backend",
                                 "a sandbox session may not use %s %.200s", r->method, r->url);
        /* Another sandbox is one the session does not know of. */
        if (strcmp(r->route.sandbox_id, r->session.sandbox_id) != 0)
                return api_error(e, 404, "not_found", NULL, "no sandbox %s", r->route.sandbox_id);
        /* The trail names the key that made the session, and the session. */
        req_audit_note(r, "session", r->session.id);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        Conn *c = ci ? ci->socket_context : NULL;
        if (c && c->fd >= 0 && s->session_conns &&
            session_conns_add(s->session_conns, c->fd, r->session.id, r->session.expires_at) < 0)
                return api_error(e, 500, "internal", NULL, "out of memory");
        return owner_admit(s, r, e);
}

/* A browser's CORS preflight (OPTIONS with Origin and
 * Access-Control-Request-Method) for a session's route: it carries no
 * token, so it is answered for an origin that an active session of the
 * sandbox lists, and refused for any other. 0 when it was one (answered in
 * *ret), 1 when it is no preflight. */
static int preflight(HttpServer *s, Req *r, const char *url, enum MHD_Result *ret) {
        const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
        const char *want = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Access-Control-Request-Method");
        if (strcmp(r->method, "OPTIONS") != 0 || !origin || !want)
                return 1;
        Route route;
        ApiError e = { 0 };
        if (!s->sessions || http_route_match(s->routes, s->n_routes, want, url, &route) < 0 ||
            !route.def->session || !route.sandbox_id[0] ||
            !s->sessions->preflight(s->sessions->userdata, route.sandbox_id, origin)) {
                api_error(&e, 403, "forbidden", "make a session that lists this page's origin",
                          "no session of this sandbox answers this origin");
                *ret = reply_error(r, &e);
                return 0;
        }
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (!resp) {
                *ret = MHD_NO;
                return 0;
        }
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", want);
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, Idempotency-Key, X-Runtime-Client");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
        MHD_add_response_header(resp, "Vary", "Origin");
        *ret = reply_response(r, 204, resp, NULL);
        return 0;
}

/* The first call for a request: headers, route, auth, access. Fills e on
 * refusal. */
static int admit(HttpServer *s, Req *r, const char *url, ApiError *e) {
        BadHeader bad = { .why = NULL };
        MHD_get_connection_values_n(r->conn, MHD_HEADER_KIND, header_check, &bad);
        if (bad.why)
                return api_error(e, 400, "invalid_request", "send header values of visible characters, spaces and tabs",
                                 "the header %s %s (at most %u bytes of visible characters)", bad.name, bad.why,
                                 (unsigned)HTTP_MAX_HEADER_VALUE);
        int rc = http_route_match(s->routes, s->n_routes, r->method, url, &r->route);
        if (rc == -ENOENT || rc == -EMSGSIZE)
                return api_error(e, 404, "not_found", "see docs/api.md for the routes", "no route %s %.200s",
                                 r->method, url);
        if (rc == -EOPNOTSUPP)
                return api_error(e, 405, "invalid_request", NULL, "%s is not allowed here; allowed: %s", r->method,
                                 r->route.allow);
        const HttpRoute *d = r->route.def;
        /* A hop from another host carries the fleet's secret: a wrong one
         * (or one this host has none to compare with) is refused. */
        const char *hop = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, FORWARD_SECRET_HEADER);
        bool on_hop = on_hop_listener(s, r->conn);
        if (s->mhd_hop && !on_hop && hop) {
                log_warn(r->rid, "a request with the fleet secret on the clients' listener (from host %.64s)",
                         MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, FORWARD_BY_HEADER) ?: "?");
                return api_error(e, 403, "forbidden", "see docs/fleet.md, \"TLS between hosts\"",
                                 "the fleet's requests come to this host over TLS, on its --fleet-listen");
        }
        if (on_hop && !hop)
                return api_error(e, 403, "forbidden", "send it to the host's API address",
                                 "this listener serves the fleet's hosts only");
        if (hop) {
                if (!forward_secret_ok(s->fleet_secret, hop)) {
                        log_warn(r->rid, "a request with a wrong fleet secret (from host %.64s)",
                                 MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, FORWARD_BY_HEADER) ?: "?");
                        return api_error(e, 403, "forbidden", NULL, "the fleet secret is not this host's");
                }
                r->forwarded = true;
        }
        /* A fenced host cannot prove its sandboxes are still its own: it
         * answers nothing that reads or writes them (its health says so
         * too, for a balancer in front) until it registers again; not even
         * a key check, which needs the store it lost. */
        if (fleet_fenced(s->fleet) && strcmp(d->name, "metrics") != 0)
                return api_error(e, 503, "host_fenced", "try again, or another host of the service",
                                 "this host is cut off from the service's store and serves nothing until it rejoins");
        const char *hdr = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        const char *bearer = auth_parse_bearer(hdr);
        if (bearer && strncmp(bearer, "rtsess_", 7) == 0)
                return admit_session(s, r, bearer, e);
        if (d->access == HTTP_ACCESS_PUBLIC)
                return 0;
        /* A signed link in place of a key: it names what it may do, and
         * counts against its sandbox owner's bounds like the owner's own. */
        if (!hdr && d->link_op && s->links && req_query(r, "sig")) {
                if ((rc = s->links->check(s->links->userdata, r, d->link_op, e)) < 0)
                        return rc;
                r->link.used = true;
                return owner_admit(s, r, e);
        }
        const char *key = auth_parse_bearer(hdr);
        if (!key)
                return api_error(e, 401, "unauthorized", "send Authorization: Bearer <key>", "an API key is required");
        char hash[AUTH_HASH_HEX_LEN + 1];
        if (!auth_key_format_ok(key) || auth_hash_key(key, hash) < 0 ||
            (rc = keystore_by_hash(s->keys, hash, &r->key)) == -ENOENT)
                return api_error(e, 401, "unauthorized", "check RUNTIME_API_KEY", "the API key is not valid");
        if (rc < 0) {
                log_error(r->rid, "looking up a key: %s", strerror(-rc));
                if (rc == -ENOTCONN || rc == -ETIMEDOUT || rc == -EAGAIN)
                        return api_error(e, 503, "unavailable", "try again", "the store did not answer");
                return api_error(e, 500, "internal", NULL, "could not check the key");
        }
        if (d->access == HTTP_ACCESS_ADMIN && !keys_is_admin(&r->key))
                return api_error(e, 403, "forbidden", "ask the daemon's administrator",
                                 "this changes what every owner uses: only the admin key may");
        if (d->access == HTTP_ACCESS_FULL && r->key.access != KEY_ACCESS_FULL)
                return api_error(e, 403, "forbidden", "use a key with full access",
                                 "this key has read access only");
        return owner_admit(s, r, e);
}

/* After the key or link: the owner's bound of requests in progress, and a
 * JSON body's announced length. */
static int owner_admit(HttpServer *s, Req *r, ApiError *e) {
        const HttpRoute *d = r->route.def;
        int rc;
        /* Each request holds a thread while it lasts: one owner's streams
         * and WebSockets take a share of the connections, never all. */
        if ((rc = owner_take(s, r)) == -EUSERS)
                return api_error(e, 429, "rate_limited", "finish or close some of them (streams, WebSockets) first",
                                 "this owner has %u requests in progress, its bound (--max-requests-per-owner)",
                                 s->owner_max);
        if (rc < 0)
                return api_error(e, 500, "internal", NULL, "out of memory");
        if (d->body == HTTP_BODY_JSON || d->body == HTTP_BODY_JSON_OR_EMPTY || d->body == HTTP_BODY_RAW) {
                const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
                if (cl && strtoull(cl, NULL, 10) > body_limit(d))
                        return body_too_large(e, d);
        }
        return 0;
}

/* The request's digest for its Idempotency-Key: the route, its parameters
 * and the body, so that the key reused for anything else is told apart. */
static int idem_digest(const Req *r, char out[65]) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned len = 0;
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        const char *parts[] = { r->route.def->name, r->route.sandbox_id, r->route.secret, r->route.key_id };
        int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL);
        for (size_t i = 0; ok && i < ELEMENTSOF(parts); i++)
                ok = EVP_DigestUpdate(c, parts[i], strlen(parts[i]) + 1);
        ok = ok && EVP_DigestUpdate(c, r->body ? r->body : "", r->body_len) && EVP_DigestFinal_ex(c, md, &len);
        EVP_MD_CTX_free(c);
        if (!ok)
                return -EIO;
        for (unsigned i = 0; i < len && i < 32; i++)
                snprintf(out + 2 * i, 3, "%02x", md[i]);
        return 0;
}

void req_idem_record(Req *r, const char *body) {
        if (!r->idem_key)
                return;
        int rc = db_idem_finish(r->idem_db, r->key.owner, r->idem_key, 202, body);
        if (rc < 0)
                log_warn(r->rid, "keeping the record of Idempotency-Key: %s", strerror(-rc));
        free(TAKE_PTR(r->idem_key));
}

/* How long a retry waits for the first request with its key to finish. */
#define IDEM_WAIT_MS 120000u

/* An Idempotency-Key on an idempotent route: claims it (0, the handler
 * runs), or answers: the first answer again, 409 while the first is still
 * served past IDEM_WAIT_MS, 422 idempotency_conflict for another request. */
static int idem_begin(HttpServer *s, Req *r, bool *ret_answered, enum MHD_Result *ret) {
        const char *key = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Idempotency-Key");
        *ret_answered = false;
        if (!key)
                return 0;
        ApiError e = { 0 };
        if (!request_idempotency_key_ok(key)) {
                api_error(&e, 400, "invalid_request", NULL,
                          "Idempotency-Key must be 1-128 characters of A-Z a-z 0-9 _ . : -");
                goto answer;
        }
        /* A create another host placed here: that host holds the claim
         * for it, and this one finishes it with its answer. */
        if (r->forwarded && MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, FORWARD_CLAIM_HEADER)) {
                if (!(r->idem_key = strdup(key)))
                        return -ENOMEM;
                r->idem_db = s->db;
                return 0;
        }
        char hash[65];
        if (idem_digest(r, hash) < 0)
                return -EIO;
        uint64_t until = time_now_mono_ms() + IDEM_WAIT_MS;
        for (;;) {
                unsigned status = 0;
                _cleanup_free_ char *body = NULL;
                int rc = db_idem_claim(s->db, r->key.owner, key, hash, time_now_unix(), &status, &body);
                if (rc < 0)
                        return rc;
                if (rc == STORE_IDEM_CLAIMED) {
                        if (!(r->idem_key = strdup(key)))
                                return -ENOMEM;
                        r->idem_db = s->db;
                        return 0;
                }
                if (rc == STORE_IDEM_MISMATCH) {
                        if (r->route.def->idem_to_handler)
                                api_error(&e, 409, "conflict", "use a new Idempotency-Key for another request",
                                          "Idempotency-Key was used with a different request");
                        else
                                api_error(&e, 422, "idempotency_conflict",
                                          "use a new Idempotency-Key for another request",
                                          "this Idempotency-Key was used with a different request");
                        goto answer;
                }
                if (rc == STORE_IDEM_REPLAY && status == 202 && r->route.def->idem_to_handler) {
                        r->idem_replay = TAKE_PTR(body);
                        return 0;
                }
                if (rc == STORE_IDEM_REPLAY) {
                        _cleanup_json_ json_t *j = json_loads(body, 0, NULL);
                        if (json_is_object(j) && status < 300)
                                json_object_set_new(j, "replayed", json_true());
                        char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
                        struct MHD_Response *resp =
                                text ? MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE) : NULL;
                        if (!resp) {
                                free(text);
                                return -ENOMEM;
                        }
                        MHD_add_response_header(resp, "Idempotent-Replayed", "true");
                        *ret_answered = true;
                        *ret = reply_response(r, status, resp, "application/json");
                        return 0;
                }
                /* STORE_IDEM_PENDING: the first send is still being served. */
                if (time_now_mono_ms() >= until || socket_hung_up(req_socket(r))) {
                        api_error(&e, 409, "conflict", "send it again with the same key once it is done",
                                  "a request with this Idempotency-Key is still being served");
                        goto answer;
                }
                struct timespec ts = { .tv_sec = 0, .tv_nsec = 100 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
answer:
        *ret_answered = true;
        *ret = reply_error(r, &e);
        return 0;
}

/* The whole request is in: parse a JSON body, then the route's handler. */
static enum MHD_Result dispatch(HttpServer *s, Req *r) {
        const HttpRoute *d = r->route.def;
        if (d->body == HTTP_BODY_JSON || d->body == HTTP_BODY_JSON_OR_EMPTY) {
                ApiError e = { 0 };
                if (request_body_parse(r->body ? r->body : "", r->body_len, d->body == HTTP_BODY_JSON_OR_EMPTY,
                                       &r->json, &e) < 0)
                        return e.code ? reply_error(r, &e) : reply_internal(r);
        }
        if (d->idempotent && r->key.id[0]) {
                bool answered = false;
                enum MHD_Result ret = MHD_YES;
                int rc = idem_begin(s, r, &answered, &ret);
                if (rc < 0) {
                        log_error(r->rid, "Idempotency-Key: %s", strerror(-rc));
                        return reply_internal(r);
                }
                if (answered)
                        return ret;
        }
        return d->handler(r);
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                      const char *version, const char *upload_data, size_t *upload_data_size,
                                      void **con_cls) {
        HttpServer *s = cls;
        Req *r = *con_cls;
        if (!r) {
                r = calloc(1, sizeof(*r));
                if (!r)
                        return MHD_NO;
                *con_cls = r;
                /* Its headers are in: the request has the long timeout. */
                MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)HTTP_REQUEST_TIMEOUT_S);
                const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
                if (ci && ci->socket_context)
                        edge_conn_busy(((Conn *)ci->socket_context)->edge);
                r->app = s->app;
                r->conn = conn;
                r->method = method;
                r->http11 = version && strcmp(version, MHD_HTTP_VERSION_1_1) == 0;
                r->t0 = time_now_mono_ms();
                char hex[17];
                if (random_hex(hex, 8) < 0)
                        snprintf(hex, sizeof(hex), "0000000000000000");
                snprintf(r->rid, sizeof(r->rid), "req_%s", hex);
                snprintf(r->path, sizeof(r->path), "%s", url);
                r->server = s;
                if (!(r->url = strdup(url)))
                        return MHD_NO;
                enum MHD_Result pre;
                if (preflight(s, r, url, &pre) == 0)
                        return pre;
                ApiError e = { 0 };
                if (admit(s, r, url, &e) < 0)
                        return reply_error(r, &e);
                int fr = forward_decide(s, r, &e);
                if (fr < 0)
                        return reply_error(r, &e);
                if (fr > 0)
                        return MHD_YES;
                /* Served here: a one-time link is spent now, by this
                 * request alone (a host that forwarded it spent nothing). */
                if (r->link.used && r->link.once && s->links->claim(s->links->userdata, r, &e) < 0)
                        return reply_error(r, &e);
                if (r->route.def->body == HTTP_BODY_STREAM)
                        return r->route.def->upload->begin(r);
                return MHD_YES;
        }
        const HttpRoute *d = r->route.def;
        if (r->fwd) {
                if (*upload_data_size > 0) {
                        size_t n = *upload_data_size;
                        *upload_data_size = 0;
                        return forward_body(r->fwd, upload_data, n) == 0 ? MHD_YES : MHD_NO;
                }
                Forward *f = r->fwd;
                r->fwd = NULL;
                return forward_reply(f, r);
        }
        if (*upload_data_size > 0) {
                size_t n = *upload_data_size;
                *upload_data_size = 0;
                if (r->answered || r->refused) {
                        /* Refused already: drop the body, up to a point. */
                        r->discarded += n;
                        return r->discarded > MAX_DISCARD ? MHD_NO : MHD_YES;
                }
                if (d->body == HTTP_BODY_STREAM)
                        return d->upload->data(r, upload_data, n);
                /* MHD cannot answer before the body is read: note the
                 * refusal, drop the rest, answer at the end. */
                if (!has_body(d)) {
                        r->refused = true;
                        r->discarded = n;
                        api_error(&r->refusal, 400, "invalid_request", NULL, "this route takes no body");
                        return MHD_YES;
                }
                if (r->body_len + n > body_limit(d)) {
                        r->refused = true;
                        r->discarded = n;
                        body_too_large(&r->refusal, d);
                        return MHD_YES;
                }
                char *b = realloc(r->body, r->body_len + n + 1);
                if (!b)
                        return MHD_NO;
                memcpy(b + r->body_len, upload_data, n);
                r->body = b;
                r->body_len += n;
                r->body[r->body_len] = '\0';
                return MHD_YES;
        }
        if (r->answered)
                return MHD_YES;
        if (r->refused)
                return reply_error(r, &r->refusal);
        return dispatch(s, r);
}

static void request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
        Req *r = *con_cls;
        if (!r)
                return;
        *con_cls = NULL;
        unsigned status = r->answered ? r->status : 0;
        HttpServer *s = cls;
        /* Between two requests a connection has the head's time, not the
         * request's: the edge cuts one whose next head is late. An
         * upgraded one (a WebSocket) is its owner's request in progress
         * until it closes. */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        Conn *c = ci ? ci->socket_context : NULL;
        bool next = c && status != 101 && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && r->http11 &&
                    !header_has_token(MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONNECTION),
                                      "close");
        /* A keep-alive connection may carry a key's requests after a
         * session's: it is the session's only while it serves one (an
         * upgraded one, a WebSocket, until it closes). */
        if (r->session.used && c && c->fd >= 0 && status != 101)
                session_conns_remove(s->session_conns, c->fd);
        if (c && status == 101) {
                edge_conn_upgraded(c->edge);
                if (r->owner_counted && !c->owner) {
                        c->owner = strdup(r->key.owner);
                        r->owner_counted = !c->owner;
                }
        } else if (c) {
                edge_conn_idle(c->edge);
                MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, s->head_timeout_s);
        }
        if (r->owner_counted)
                owner_release(s, r->key.owner);
        r->owner_counted = false;
        metrics_http_response(status);
        audit_request(cls, r, status);
        /* Counted where the client asked: a call forwarded here was counted there. */
        if (status && r->key.id[0] && !r->forwarded)
                request_counts_note(((HttpServer *)cls)->requests, r->key.owner, r->key.id, status);
        uint64_t ms = time_now_mono_ms() - r->t0;
        if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
                log_info(r->rid, "%s %s %u %llums", r->method, r->path, status, (unsigned long long)ms);
        else
                log_info(r->rid, "%s %s %u %llums (connection ended early, code %d)", r->method, r->path, status,
                         (unsigned long long)ms, (int)toe);
        if (r->upload && r->route.def && r->route.def->upload)
                r->route.def->upload->free(r->upload);
        if (r->idem_key) /* no JSON answer was made: a retry runs again */
                (void)db_idem_finish(r->idem_db, r->key.owner, r->idem_key, 0, NULL);
        forward_free(r->fwd);
        json_decref(r->audit_detail);
        free(r->url);
        free(r->idem_key);
        free(r->idem_replay);
        json_decref(r->json);
        free(r->body);
        free(r);
        /* A kept-alive connection's next head is looked at before the
         * server reads it, as its first was by the edge: this thread would
         * wait for it all the same. */
        if (next && edge_next_head(s->edge, c->fd, s->head_timeout_s * 1000u) < 0)
                log_debug(NULL, "http: a kept-alive connection's next head refused");
}

/* A connection comes from the edge with its first head whole; the edge
 * watches it from then on until it closes. */
static void connection_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                              enum MHD_ConnectionNotificationCode code) {
        HttpServer *s = cls;
        if (code == MHD_CONNECTION_NOTIFY_STARTED) {
                MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, s->head_timeout_s);
                const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
                Conn *c = calloc(1, sizeof *c);
                if (c && on_hop_listener(s, conn)) {
                        /* TLS: its bytes are not a head the edge could read. */
                        c->hop = true;
                        c->fd = -1;
                } else if (c && ci) {
                        c->edge = edge_conn_add(s->edge, ci->connect_fd);
                        c->fd = ci->connect_fd;
                } else if (c)
                        c->fd = -1;
                *socket_context = c;
        } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
                Conn *c = *socket_context;
                *socket_context = NULL;
                if (!c || !c->hop)
                        edge_server_closed(s->edge);
                if (!c)
                        return;
                edge_conn_remove(c->edge);
                if (c->fd >= 0)
                        session_conns_remove(s->session_conns, c->fd);
                if (c->owner)
                        owner_release(s, c->owner);
                free(c->owner);
                free(c);
        }
}

static unsigned server_held(void *userdata) {
        HttpServer *s = userdata;
        const union MHD_DaemonInfo *i = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        return i ? i->num_connections : 0;
}

static bool hand_off(void *userdata, int fd, const struct sockaddr *sa, socklen_t len) {
        HttpServer *s = userdata;
        /* Closed by the server whatever it answers (past its bound per
         * peer address, or out of memory). */
        if (MHD_add_connection(s->mhd, fd, sa, len) == MHD_YES)
                return true;
        log_debug(NULL, "http: a connection not taken: %s", strerror(errno));
        return false;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
        char buf[512];
        vsnprintf(buf, sizeof(buf), fmt, ap);
        log_debug(NULL, "http: %s", buf);
}

int http_server_new(const HttpRoute *routes, size_t n_routes, App *app, Db *db, KeyStore *keys,
                    unsigned max_connections,
                    unsigned max_per_peer, HttpServer **ret) {
        HttpServer *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->routes = routes;
        s->n_routes = n_routes;
        s->app = app;
        s->db = db;
        s->keys = keys;
        s->max_connections = max_connections;
        s->max_per_peer = max_per_peer;
        s->max_waiting = HTTP_MAX_WAITING_DEFAULT;
        s->owner_max = HTTP_REQUESTS_PER_OWNER_DEFAULT;
        s->head_timeout_s = HTTP_HEADER_TIMEOUT_S;
        pthread_mutex_init(&s->owners_lock, NULL);
        *ret = s;
        return 0;
}

int http_server_start(HttpServer *s, int listen_fd) {
        /* The server listens on nothing: the edge accepts, and hands it
         * each connection once its head is whole. */
        /* MHD_USE_POLL: each connection's thread waits in poll(), not select(), which
         * refuses a socket numbered past FD_SETSIZE (1024): a daemon with a few hundred
         * sandboxes holds more descriptors than that, and reset every new connection. */
        s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                                          MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE |
                                          MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC,
                                  0, NULL, NULL, access_handler, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                  MHD_OPTION_CONNECTION_LIMIT, s->max_connections,
                                  MHD_OPTION_PER_IP_CONNECTION_LIMIT, s->max_per_peer,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                                  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_REQUEST_TIMEOUT_S,
                                  MHD_OPTION_NOTIFY_CONNECTION, connection_notify, s, MHD_OPTION_NOTIFY_COMPLETED,
                                  request_completed, s, MHD_OPTION_END);
        if (!s->mhd)
                return -EIO;
        /* A head of up to the connection's memory less what the server
         * keeps for the rest; a NUL in it is refused here, before the
         * server would cut a header's value at it. */
        EdgeConfig cfg = { .max_waiting = s->max_waiting, .max_waiting_per_peer = s->max_per_peer,
                           .head_ms = s->head_timeout_s * 1000u, .head_max = HTTP_MAX_HEAD,
                           .max_held = s->max_connections, .held = server_held };
        int r = edge_start(listen_fd, &cfg, hand_off, s, &s->edge);
        if (r < 0) {
                MHD_stop_daemon(s->mhd);
                s->mhd = NULL;
        }
        return r;
}

int http_server_start_hop(HttpServer *s, int hop_fd, const char *cert_pem, const char *key_pem) {
        s->mhd_hop = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                                              MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE |
                                              MHD_USE_TLS | MHD_USE_ITC,
                                      0, NULL, NULL, access_handler, s, MHD_OPTION_LISTEN_SOCKET, hop_fd,
                                      MHD_OPTION_HTTPS_MEM_CERT, cert_pem, MHD_OPTION_HTTPS_MEM_KEY, key_pem,
                                      MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_CONNECTION_LIMIT,
                                      s->max_connections, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                                      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_REQUEST_TIMEOUT_S,
                                      MHD_OPTION_NOTIFY_CONNECTION, connection_notify, s,
                                      MHD_OPTION_NOTIFY_COMPLETED, request_completed, s, MHD_OPTION_END);
        if (!s->mhd_hop) {
                close(hop_fd);
                return -EIO;
        }
        return 0;
}

void http_server_quiesce(HttpServer *s) {
        edge_quiesce(s->edge);
        if (s->mhd_hop) {
                /* The listening socket is handed back: closed here. */
                MHD_socket fd = MHD_quiesce_daemon(s->mhd_hop);
                if (fd != MHD_INVALID_SOCKET)
                        close(fd);
        }
}

/* The edge first (nothing more handed on), then the server, whose
 * connections the edge watches until each is closed, then the edge. */
void http_server_stop(HttpServer *s) {
        edge_quiesce(s->edge);
        if (s->mhd_hop)
                MHD_stop_daemon(s->mhd_hop);
        s->mhd_hop = NULL;
        if (s->mhd)
                MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        edge_free(s->edge);
        s->edge = NULL;
}

void http_server_free(HttpServer *s) {
        if (!s)
                return;
        http_server_stop(s);
        session_conns_free(s->session_conns);
        for (unsigned b = 0; b < OWNER_BUCKETS; b++)
                while (s->owners[b]) {
                        OwnerLoad *o = s->owners[b];
                        s->owners[b] = o->next;
                        free(o);
                }
        pthread_mutex_destroy(&s->owners_lock);
        free(s);
}
