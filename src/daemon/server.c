#include "daemon/server.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/auth.h"
#include "daemon/handlers.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/request.h"

/* Bytes of a refused body read and thrown away before the connection is cut. */
#define MAX_DISCARD (2u * 1024u * 1024u)

/* ---- answering ---- */

enum MHD_Result reply_response(Req *r, unsigned status, struct MHD_Response *resp, const char *content_type) {
        if (!resp)
                return MHD_NO;
        MHD_add_response_header(resp, "X-Request-Id", r->rid);
        MHD_add_response_header(resp, "Cache-Control", "no-store");
        if (content_type)
                MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
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
        if (e->status == 405 && r->route.allow) {
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

const char *req_query(Req *r, const char *name) {
        return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* ---- simple handlers ---- */

static enum MHD_Result handle_healthz(Req *r) {
        const Driver *d = r->srv->cfg->default_driver;
        return reply_json(r, 200, json_pack("{s:s,s:s,s:s?}", "status", "ok", "version", RUNTIME_VERSION,
                                            "defaultDriver", d ? d->name : NULL));
}

static json_t *drivers_json(const DaemonConfig *cfg) {
        json_t *arr = json_array();
        for (unsigned i = 0; arr && i < cfg->n_drivers; i++) {
                const DriverOffer *o = &cfg->drivers[i];
                json_array_append_new(arr, json_pack("{s:s,s:b,s:b,s:s}", "name", o->driver->name, "available",
                                                     o->available && o->offered, "probe", o->available,
                                                     "reason", o->reason));
        }
        return arr;
}

static enum MHD_Result handle_info(Req *r) {
        const DaemonConfig *cfg = r->srv->cfg;
        const Driver *d = cfg->default_driver;
        json_t *images = images_json(cfg);
        json_t *drivers = drivers_json(cfg);
        if (!images || !drivers) {
                json_decref(images);
                json_decref(drivers);
                return reply_internal(r);
        }
        return reply_json(r, 200,
                          json_pack("{s:s,s:s?,s:o,s:o,s:{s:i,s:i,s:i,s:i,s:i,s:I,s:I}}", "version", RUNTIME_VERSION,
                                    "defaultDriver", d ? d->name : NULL, "drivers", drivers, "images", images,
                                    "limits", "maxVcpu", (int)cfg->max_vcpu, "maxMemoryMiB", (int)cfg->max_memory_mib,
                                    "maxDiskMiB", (int)cfg->max_disk_mib, "maxFileMiB", (int)cfg->max_file_mib,
                                    "maxSandboxesPerKey", (int)cfg->max_sandboxes_per_key, "priceVcpuHourMicros",
                                    (json_int_t)cfg->price_vcpu_hour_micros, "priceGibHourMicros",
                                    (json_int_t)cfg->price_gib_hour_micros));
}

static enum MHD_Result handle_metrics(Req *r) {
        char *text = metrics_render(r->srv->db);
        if (!text)
                return reply_internal(r);
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(text);
                return MHD_NO;
        }
        return reply_response(r, 200, resp, "text/plain; version=0.0.4");
}

static enum MHD_Result answer(Req *r, int rc, json_t *j, ApiError *e, unsigned status) {
        if (rc < 0) {
                if (!e->code)
                        return reply_internal(r);
                return reply_error(r, e);
        }
        return reply_json(r, status, j);
}

/* Egress secrets and the egress audit log. */
static enum MHD_Result handle_egress(Req *r, json_t *body) {
        Server *s = r->srv;
        ApiError e = { 0 };
        json_t *j = NULL;
        int rc;
        if (!s->egress) {
                api_error(&e, 503, "unavailable", NULL, "egress is not set up on this daemon");
                return reply_error(r, &e);
        }
        const char *owner = r->key.owner, *name = r->route.secret;
        switch (r->route.kind) {
        case ROUTE_SECRETS_LIST:
                rc = egress_secret_list(s->egress, owner, &j, &e);
                break;
        case ROUTE_SECRET_GET:
                rc = egress_secret_get(s->egress, owner, name, &j, &e);
                break;
        case ROUTE_SECRET_PUT:
                rc = egress_secret_put(s->egress, owner, name, body, &j, &e);
                break;
        case ROUTE_SECRET_DELETE:
                rc = egress_secret_delete(s->egress, owner, name, &j, &e);
                break;
        default: {
                /* Only the owner may read a sandbox's log: 404 otherwise. */
                _cleanup_json_ json_t *sbx = NULL;
                rc = sandbox_get(s->manager, &r->key, r->route.sandbox_id, &sbx, &e);
                const char *lim = req_query(r, "limit");
                char *end = NULL;
                long limit = lim ? strtol(lim, &end, 10) : 1000;
                if (rc == 0 && (limit < 1 || limit > 10000 || (lim && *end)))
                        rc = api_error(&e, 400, "invalid_request", NULL, "limit must be 1..10000");
                if (rc == 0)
                        rc = egress_audit_list(s->egress, r->route.sandbox_id, (unsigned)limit, &j, &e);
                break;
        }
        }
        return answer(r, rc, j, &e, 200);
}

static enum MHD_Result dispatch(Req *r) {
        Server *s = r->srv;
        ApiError e = { 0 };
        json_t *j = NULL;
        _cleanup_json_ json_t *body = NULL;
        int rc;
        const char *id = r->route.sandbox_id;

        /* Routes that take a JSON body parse it first. */
        switch (r->route.kind) {
        case ROUTE_SANDBOX_CREATE:
        case ROUTE_SANDBOX_EXEC:
        case ROUTE_SANDBOX_EXTEND:
        case ROUTE_SANDBOX_NETWORK:
        case ROUTE_FILES_MKDIR:
        case ROUTE_FILES_REMOVE:
        case ROUTE_FILES_RENAME:
        case ROUTE_SANDBOX_STOP:
        case ROUTE_KEYS_CREATE:
        case ROUTE_SECRET_PUT:
                rc = request_body_parse(r->body ? r->body : "", r->body_len,
                                        r->route.kind == ROUTE_SANDBOX_CREATE || r->route.kind == ROUTE_SANDBOX_STOP,
                                        &body, &e);
                if (rc < 0)
                        return e.code ? reply_error(r, &e) : reply_internal(r);
                break;
        default:
                break;
        }

        switch (r->route.kind) {
        case ROUTE_HEALTHZ:
                return handle_healthz(r);
        case ROUTE_INFO:
                return handle_info(r);
        case ROUTE_LIMITS:
                return handle_limits(r);
        case ROUTE_USAGE:
                return handle_usage(r);
        case ROUTE_KEYS_LIST:
                return handle_keys_list(r);
        case ROUTE_KEYS_CREATE:
                return handle_keys_create(r, body);
        case ROUTE_KEY_REVOKE:
                return handle_key_revoke(r);
        case ROUTE_TRIAL:
                return handle_trial(r);
        case ROUTE_SECRETS_LIST:
        case ROUTE_SECRET_GET:
        case ROUTE_SECRET_PUT:
        case ROUTE_SECRET_DELETE:
        case ROUTE_SANDBOX_EGRESS:
                return handle_egress(r, body);
        case ROUTE_METRICS:
                return handle_metrics(r);
        case ROUTE_IMAGES:
                return handle_images(r);
        case ROUTE_IMAGE_BUILD:
                return handle_image_build(r);
        case ROUTE_SANDBOX_LIST:
                rc = sandbox_list(s->manager, &r->key, &j, &e);
                return answer(r, rc, j, &e, 200);
        case ROUTE_SANDBOX_CREATE: {
                ReqLimits lim = { s->cfg->max_vcpu, s->cfg->max_memory_mib, s->cfg->max_disk_mib };
                CreateRequest cr;
                rc = request_parse_create(body, &lim, &cr, &e);
                if (rc < 0)
                        return answer(r, rc, NULL, &e, 0);
                if ((rc = keys_apply_trial_shape(&r->key, body, &cr, &e)) < 0) {
                        create_request_done(&cr);
                        return answer(r, rc, NULL, &e, 0);
                }
                rc = sandbox_create(s->manager, &r->key, &cr, r->rid, &j, &e);
                create_request_done(&cr);
                return answer(r, rc, j, &e, 201);
        }
        case ROUTE_SANDBOX_GET:
                rc = sandbox_get(s->manager, &r->key, id, &j, &e);
                return answer(r, rc, j, &e, 200);
        case ROUTE_SANDBOX_DELETE:
                rc = sandbox_delete(s->manager, &r->key, id, r->rid, &j, &e);
                return answer(r, rc, j, &e, 200);
        case ROUTE_SANDBOX_STOP:
                if (json_object_size(body) > 0) {
                        api_error(&e, 400, "invalid_request", NULL, "unknown field %.64s",
                                  json_object_iter_key(json_object_iter(body)));
                        return reply_error(r, &e);
                }
                rc = sandbox_stop(s->manager, &r->key, id, r->rid, &j, &e);
                return answer(r, rc, j, &e, 200);
        case ROUTE_SANDBOX_EXTEND: {
                int64_t seconds;
                rc = request_parse_extend(body, &seconds, &e);
                if (rc == 0)
                        rc = sandbox_extend(s->manager, &r->key, id, seconds, &j, &e);
                return answer(r, rc, j, &e, 200);
        }
        case ROUTE_SANDBOX_NETWORK: {
                _cleanup_json_ json_t *net = NULL;
                rc = request_parse_network(body, "network", &net, &e);
                if (rc == 0)
                        rc = sandbox_set_network(s->manager, &r->key, id, net, &j, &e);
                return answer(r, rc, j, &e, 200);
        }
        case ROUTE_SANDBOX_EXEC:
                r->json = TAKE_PTR(body);
                return handle_exec(r);
        case ROUTE_FILES_READ:
                return handle_files_read(r);
        case ROUTE_FILES_LIST:
                return handle_files_list(r);
        case ROUTE_FILES_STAT:
                return handle_files_stat(r);
        case ROUTE_FILES_MKDIR:
        case ROUTE_FILES_REMOVE:
        case ROUTE_FILES_RENAME:
                r->json = TAKE_PTR(body);
                return handle_files_op(r);
        case ROUTE_FILES_WRITE:
                return files_upload_end(r);
        default:
                return reply_internal(r);
        }
}

/* ---- the MHD callbacks ---- */

static bool route_has_json_body(RouteKind k) {
        switch (k) {
        case ROUTE_KEYS_CREATE:
        case ROUTE_SECRET_PUT:
        case ROUTE_SANDBOX_CREATE:
        case ROUTE_SANDBOX_EXEC:
        case ROUTE_SANDBOX_EXTEND:
        case ROUTE_SANDBOX_NETWORK:
        case ROUTE_SANDBOX_STOP:
        case ROUTE_FILES_MKDIR:
        case ROUTE_FILES_REMOVE:
        case ROUTE_FILES_RENAME:
                return true;
        default:
                return false;
        }
}

/* JSON bodies are small, but for an exec's stdin (16 MiB, 4/3 of that in
 * base64). */
static size_t body_limit(RouteKind k) {
        return k == ROUTE_SANDBOX_EXEC ? REQ_MAX_EXEC_BODY : REQ_MAX_BODY;
}

static int body_too_large(ApiError *e, RouteKind k) {
        unsigned mib = (unsigned)(body_limit(k) >> 20);
        return api_error(e, 413, "payload_too_large",
                         k == ROUTE_SANDBOX_EXEC ? "send large inputs as a file (PUT .../files/content) and redirect"
                                                 : "send at most 1 MiB of JSON",
                         "the request body is over %u MiB", mib);
}

/* The first call for a request: route, auth, access. Fills e on refusal. */
static int admit(Req *r, const char *url, ApiError *e) {
        int rc = route_parse(r->method, url, &r->route);
        if (rc == -ENOENT || rc == -EMSGSIZE)
                return api_error(e, 404, "not_found", "see docs/api.md for the routes", "no route %s %.200s",
                                 r->method, url);
        if (rc == -EOPNOTSUPP)
                return api_error(e, 405, "invalid_request", NULL, "%s is not allowed here; allowed: %s", r->method,
                                 r->route.allow);
        if (!route_needs_auth(r->route.kind))
                return 0;
        const char *hdr = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        const char *key = auth_parse_bearer(hdr);
        if (!key)
                return api_error(e, 401, "unauthorized", "send Authorization: Bearer <key>", "an API key is required");
        char hash[AUTH_HASH_HEX_LEN + 1];
        if (!auth_key_format_ok(key) || auth_hash_key(key, hash) < 0 ||
            (rc = db_key_by_hash(r->srv->db, hash, &r->key)) == -ENOENT)
                return api_error(e, 401, "unauthorized", "check RUNTIME_API_KEY", "the API key is not valid");
        if (rc < 0) {
                log_error(r->rid, "looking up a key: %s", strerror(-rc));
                return api_error(e, 500, "internal", NULL, "could not check the key");
        }
        if (route_needs_full_access(r->route.kind) && !r->key.full)
                return api_error(e, 403, "forbidden", "use a key with full access",
                                 "this key has read access only");
        if (route_has_json_body(r->route.kind)) {
                const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
                if (cl && strtoull(cl, NULL, 10) > body_limit(r->route.kind))
                        return body_too_large(e, r->route.kind);
        }
        return 0;
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                      const char *version, const char *upload_data, size_t *upload_data_size,
                                      void **con_cls) {
        Server *s = cls;
        Req *r = *con_cls;
        if (!r) {
                r = calloc(1, sizeof(*r));
                if (!r)
                        return MHD_NO;
                *con_cls = r;
                r->srv = s;
                r->conn = conn;
                r->method = method;
                r->t0 = time_now_mono_ms();
                char hex[17];
                if (random_hex(hex, 8) < 0)
                        snprintf(hex, sizeof(hex), "0000000000000000");
                snprintf(r->rid, sizeof(r->rid), "req_%s", hex);
                snprintf(r->path, sizeof(r->path), "%s", url);
                ApiError e = { 0 };
                if (admit(r, url, &e) < 0)
                        return reply_error(r, &e);
                if (r->route.kind == ROUTE_FILES_WRITE)
                        return files_upload_begin(r);
                return MHD_YES;
        }
        if (*upload_data_size > 0) {
                size_t n = *upload_data_size;
                *upload_data_size = 0;
                if (r->answered || r->refused) {
                        /* Refused already: drop the body, up to a point. */
                        r->discarded += n;
                        return r->discarded > MAX_DISCARD ? MHD_NO : MHD_YES;
                }
                if (r->route.kind == ROUTE_FILES_WRITE)
                        return files_upload_data(r, upload_data, n);
                /* MHD cannot answer before the body is read: note the
                 * refusal, drop the rest, answer at the end. */
                if (!route_has_json_body(r->route.kind)) {
                        r->refused = true;
                        r->discarded = n;
                        api_error(&r->refusal, 400, "invalid_request", NULL, "this route takes no body");
                        return MHD_YES;
                }
                if (r->body_len + n > body_limit(r->route.kind)) {
                        r->refused = true;
                        r->discarded = n;
                        body_too_large(&r->refusal, r->route.kind);
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
        return dispatch(r);
}

static void request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
        Req *r = *con_cls;
        if (!r)
                return;
        *con_cls = NULL;
        unsigned status = r->answered ? r->status : 0;
        metrics_http_response(status);
        uint64_t ms = time_now_mono_ms() - r->t0;
        if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
                log_info(r->rid, "%s %s %u %llums", r->method, r->path, status, (unsigned long long)ms);
        else
                log_info(r->rid, "%s %s %u %llums (connection ended early, code %d)", r->method, r->path, status,
                         (unsigned long long)ms, (int)toe);
        files_upload_free(r->upload);
        json_decref(r->json);
        free(r->body);
        free(r);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
        char buf[512];
        vsnprintf(buf, sizeof(buf), fmt, ap);
        log_debug(NULL, "http: %s", buf);
}

int server_new(const DaemonConfig *cfg, Db *db, Manager *m, Server **ret) {
        Server *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->cfg = cfg;
        s->db = db;
        s->manager = m;
        atomic_init(&s->building, false);
        *ret = s;
        return 0;
}

void server_set_egress(Server *s, EgressService *egress) {
        s->egress = egress;
}

void server_set_guardrails(Server *s, Ledger *ledger, KeyStore *keys) {
        s->ledger = ledger;
        s->keys = keys;
}

int server_start(Server *s, int listen_fd) {
        s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                          MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME,
                                  0, NULL, NULL, access_handler, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                  MHD_OPTION_LISTEN_SOCKET, listen_fd,
                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg->max_connections,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                                  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_NOTIFY_COMPLETED,
                                  request_completed, s, MHD_OPTION_END);
        return s->mhd ? 0 : -EIO;
}

void server_quiesce(Server *s) {
        if (s->mhd) {
                MHD_socket fd = MHD_quiesce_daemon(s->mhd);
                if (fd != MHD_INVALID_SOCKET)
                        close(fd);
        }
}

void server_stop(Server *s) {
        if (s->mhd)
                MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
}

void server_free(Server *s) {
        if (!s)
                return;
        server_stop(s);
        free(s);
}
