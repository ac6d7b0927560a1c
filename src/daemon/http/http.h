#pragma once
/*
 * The HTTP edge of the daemon: libmicrohttpd with a thread per connection
 * (exec and file transfers block their thread), strict routing over one
 * table of routes, authentication and access, request bodies and their
 * limits, and the one error shape of the API. It knows nothing of sandboxes:
 * the handlers a route table names (api_*.c) translate between JSON and the
 * manager.
 */
#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/http/apierror.h"
#include "daemon/manager/db.h"
#include "daemon/manager/keys.h"

#define ROUTE_ID_LEN 24 /* "sbx_" + 20 hex */
#define ROUTE_KEY_ID_LEN 20 /* "key_" + 16 hex */
#define ROUTE_MAX_URL 1024
/* The longest header value a request may carry: no header we read needs
 * more (a key is 43 bytes, an Idempotency-Key 128). */
#define HTTP_MAX_HEADER_VALUE 8192u
#define HTTP_PROCESS_ID_LEN 21 /* "proc_" + 16 hex */
#define HTTP_UPLOAD_ID_LEN 20  /* "upl_" + 16 hex */

/* What the handlers share (the daemon's parts); opaque to this layer. */
typedef struct App App;
typedef struct Req Req;
typedef enum MHD_Result (*HttpHandler)(Req *r);

typedef enum HttpAccess {
        HTTP_ACCESS_PUBLIC, /* no key: the handler decides (healthz, trial) */
        HTTP_ACCESS_READ,   /* any valid key */
        HTTP_ACCESS_FULL,   /* creates, runs, writes, deletes, extends or spends */
        HTTP_ACCESS_ADMIN,  /* changes what every owner uses: the admin key only */
} HttpAccess;

typedef enum HttpBody {
        HTTP_BODY_NONE,          /* a body is a 400 */
        HTTP_BODY_JSON,          /* a JSON object, parsed into r->json */
        HTTP_BODY_JSON_OR_EMPTY, /* the same, an empty body being {} */
        HTTP_BODY_STREAM,        /* raw bytes handed to the route's upload as they come */
        HTTP_BODY_RAW,           /* the bytes whole in r->body, bounded, for a handler that parses them itself */
} HttpBody;

/* A route whose body streams: begin on the request's first call (after
 * access), data for each piece, the route's handler at the end. free
 * releases r->upload however the request ended. */
typedef struct HttpUpload {
        HttpHandler begin;
        enum MHD_Result (*data)(Req *r, const char *data, size_t len);
        void (*free)(void *upload);
} HttpUpload;

/* Path patterns are literal but for their parameters: {sandbox} (sbx_ + 20
 * hex), {key} (key_ + 16 hex), {image} (an image name), {secret} (1..64
 * bytes, no '/', checked by its handler), {process} (proc_ + 16 hex),
 * {context} (an interpreter context id), {result} (a kept result's file
 * name), {upload} (upl_ + 16 hex), {host} (a host id), {webhook} (wh_ + 20
 * hex), {delivery} (whd_ + 20 hex), {export} (otx_ + 20 hex), {port} (1 to 5 digits) and
 * {digest} (a SHA-256, 64 lowercase hex), {watch} (a file watch's id), {session} (ses_ + 20 hex), {recording} (rec_ + 20 hex),
 * {volume} (vol_ + 20 hex), {backup} (vb_ + 20 hex). A parameter ends at the pattern's next literal character, or at
 * the end of the path. */
typedef struct HttpRoute {
        int kind;
        const char *name; /* for logs and metrics */
        const char *method;
        const char *path;
        HttpAccess access;
        HttpBody body;
        size_t max_body;            /* 0: REQ_MAX_BODY */
        const char *too_large_hint; /* NULL: "send at most 1 MiB of JSON" */
        HttpHandler handler;
        const HttpUpload *upload; /* HTTP_BODY_STREAM only */
        /* A JSON route whose answer an Idempotency-Key replays: the same key
         * and request within the key's life get the first answer again, and
         * the change happens once (http.c; the records are the db's). */
        bool idempotent;
        /* With idempotent: the answer streams, so the handler keeps what a
         * replay needs (req_idem_record, status 202) and gets it back in
         * r->idem_replay; a reuse with another request is 409 conflict. */
        bool idem_to_handler;
        /* The operation a signed file link may do here without a key
         * ("download", "archive", "upload"; NULL: none): a request with no
         * Authorization and a `sig` argument is checked as a link
         * (http_server_set_links). */
        const char *link_op;
        /* About a sandbox, but reads and writes only the store: any host of
         * the fleet serves it, its sandbox's host down or not. */
        bool store_only;
        /* A sandbox session's token may use it, on the session's own
         * sandbox only (docs/sessions.md); every route without it refuses
         * one, public routes too. */
        bool session;
} HttpRoute;

typedef struct Route {
        const HttpRoute *def;
        int kind;
        char sandbox_id[ROUTE_ID_LEN + 1];
        char image[65];
        char key_id[ROUTE_KEY_ID_LEN + 1];
        char secret[65];
        char proc_id[HTTP_PROCESS_ID_LEN + 1];
        char upload_id[HTTP_UPLOAD_ID_LEN + 1];
        char snapshot_id[32]; /* snp_ and 20 hex digits */
        char context[64]; /* an interpreter context: [a-z0-9][a-z0-9-]{0,62} */
        char result[129]; /* a kept interpreter result: [A-Za-z0-9][A-Za-z0-9_.-]{0,127} */
        char host_id[64]; /* a host of the fleet: [A-Za-z0-9_.-]{1,63} */
        char webhook_id[24];  /* wh_ and 20 hex digits */
        char delivery_id[25]; /* whd_ and 20 hex digits */
        char export_id[25];   /* otx_ and 20 hex digits */
        char port[6];         /* a preview's port: 1 to 5 digits (its range is the handler's) */
        char digest[65];      /* a SHA-256 in 64 lowercase hex digits */
        char watch_id[64];    /* a file watch: [A-Za-z0-9][A-Za-z0-9_.-]{0,62} */
        char session_id[25];  /* ses_ and 20 hex digits */
        char recording[25];   /* a desktop's recording: rec_ and 20 hex digits */
        char volume_id[25];   /* vol_ and 20 hex digits */
        char backup_id[24];   /* vb_ and 20 hex digits */
        char allow[48]; /* for a 405: the methods the path has */
} Route;

/* 0 and *ret; -ENOENT for an unknown path; -EMSGSIZE for an over-long one;
 * -EOPNOTSUPP for a known path and a method it does not have (ret->allow is
 * set). Pure. */
int http_route_match(const HttpRoute *routes, size_t n, const char *method, const char *url, Route *ret);
bool route_sandbox_id_ok(const char *s);
bool route_key_id_ok(const char *s);
bool route_context_id_ok(const char *s);

/* What a request a signed link authenticated may do beyond its route's own
 * arguments (the link checker fills it; r->key then names the sandbox's
 * owner, its id the link's). */
typedef struct ReqLink {
        bool used; /* the request came with a link, not a key */
        bool once; /* a one-time link: its use is claimed where it is served */
        int64_t expires_at;
        uint64_t max_bytes;     /* an upload's bound; 0: the daemon's */
        char filename[256];     /* a download's Content-Disposition name; "": none */
} ReqLink;

/* A request a sandbox session's token authenticated (HttpSessions.check
 * fills it; r->key is then the key that made the session). */
typedef struct ReqSession {
        bool used;
        char id[32];
        char sandbox_id[ROUTE_ID_LEN + 1];
        int64_t expires_at;
        char origin[256]; /* the request's Origin, one of the session's: answered with CORS; "": none */
} ReqSession;

struct Req {
        App *app;
        struct MHD_Connection *conn;
        char rid[24];
        const char *method;
        char path[128]; /* for the log, cut */
        uint64_t t0;
        Route route;
        KeyInfo key;
        char *body;
        size_t body_len;
        size_t discarded;
        json_t *json; /* the parsed body, for routes that take one */
        bool refused; /* the body broke a limit: drop the rest, answer `refusal` at the end */
        ApiError refusal;
        bool answered; /* a response is queued */
        unsigned status;
        void *upload; /* a streamed body's state (HttpUpload) */
        Db *idem_db;    /* with idem_key: this request claimed that key */
        char *idem_key;
        char *idem_replay; /* idem_to_handler routes: what the first request recorded */
        char *url;          /* the path as sent (no query), whole */
        bool forwarded;     /* came from another host of the fleet, with the fleet's secret */
        struct Forward *fwd; /* going on to the host that runs its sandbox */
        json_t *audit_detail; /* what the handler named for the audit trail (req_audit_note) */
        /* The sandbox a route without one in its path acted on (a create's
         * new one), for the audit trail; "" when none. */
        char audit_sandbox_id[ROUTE_ID_LEN + 1];
        struct HttpServer *server;
        bool owner_counted; /* one of its owner's requests in progress */
        bool http11;        /* an HTTP/1.1 request: its connection may be kept alive */
        ReqLink link;
        ReqSession session;
        /* The handler found nothing worth an audit record (an MCP ping, a
         * listing, a read). */
        bool audit_skip;
};

/* Names one detail of the request for its audit record ("command": the
 * command line), cut to AUDIT_DETAIL_MAX bytes (on a character's boundary,
 * the cut said). Never a secret: a handler names what a reader of the trail
 * may see. */
void req_audit_note(Req *r, const char *field, const char *value);
/* The same for a JSON value (a number); takes v. */
void req_audit_note_json(Req *r, const char *field, json_t *v);

/* Queue a response; the reply functions add X-Request-Id. */
enum MHD_Result reply_json(Req *r, unsigned status, json_t *body); /* steals body */
enum MHD_Result reply_error(Req *r, const ApiError *e);
enum MHD_Result reply_response(Req *r, unsigned status, struct MHD_Response *resp, const char *content_type);
enum MHD_Result reply_internal(Req *r);
/* rc < 0: e (or a 500 when e has no code); else j with status. */
enum MHD_Result reply_result(Req *r, int rc, json_t *j, const ApiError *e, unsigned status);

/* For an idem_to_handler route that claimed its key: records what a retry
 * with the key gets back in r->idem_replay (JSON text). No-op without a claim. */
void req_idem_record(Req *r, const char *body);

/* The socket of the request's connection, to notice a client that left. */
int req_socket(Req *r);
/* Whether the client hung up (POLLRDHUP / POLLHUP / POLLERR on the socket). */
bool socket_hung_up(int fd);
const char *req_query(Req *r, const char *name);
/* A query argument with its real length (a %00 does not cut it short). */
bool req_query_n(Req *r, const char *name, const char **ret, size_t *ret_len);
/* Whether the request came over loopback or a unix socket. */
bool req_from_this_host(Req *r, bool unix_socket);

typedef struct HttpServer HttpServer;

/* Serves `routes` (kept, not copied) with `app` handed to each request;
 * keys are checked against db. */
/* How long a connection has to send a request's whole head, from its
 * start or from the answer before (http/edge.h), and how long a request
 * may then be silent. */
#define HTTP_HEADER_TIMEOUT_S 15u
#define HTTP_REQUEST_TIMEOUT_S 600
/* The bytes of a request's head (its line and headers). */
#define HTTP_MAX_HEAD (64u * 1024u)
/* Connections awaiting their first head at once, all peers. */
#define HTTP_MAX_WAITING_DEFAULT 4096u
/* Requests one owner has in progress at once. */
#define HTTP_REQUESTS_PER_OWNER_DEFAULT 128u
#define OWNER_BUCKETS 256u
/* max_connections in all, max_per_peer from one peer address. */
typedef struct Fleet Fleet;
int http_server_new(const HttpRoute *routes, size_t n_routes, App *app, Db *db, KeyStore *keys,
                    unsigned max_connections,
                    unsigned max_per_peer, HttpServer **ret);
/* This host's standing among the hosts (NULL: none): a fenced host answers
 * 503 host_fenced to everything but /metrics. */
void http_server_set_fleet(HttpServer *s, Fleet *fleet);
/* Before http_server_start: requests one owner may have in progress (its
 * streams and WebSockets included; a 429 past it), connections that may
 * await their first head at once (past it the oldest is closed), and the
 * time a connection has for a request's whole head (HTTP_HEADER_TIMEOUT_S
 * unless set). */
void http_server_set_bounds(HttpServer *s, unsigned owner_max, unsigned max_waiting, unsigned head_timeout_s);
struct EdgeStats;
void http_server_edge_stats(HttpServer *s, struct EdgeStats *ret);
/* Each request that changes something (and each WebSocket opened) gets an
 * audit record once answered (manager/audit.h). */
struct Audit;
struct RequestCounts;
void http_server_set_audit(HttpServer *s, struct Audit *audit);
/* Every answer to a known key is counted there (docs/api.md, "GET /v1/usage/requests"). */
void http_server_set_requests(HttpServer *s, struct RequestCounts *requests);
/* The fleet's secret (NULL: forwarding off): a request about another host's
 * sandbox is forwarded to it with the secret; a request that carries it
 * came forwarded and is served here. Kept, not copied. */
void http_server_set_fleet_secret(HttpServer *s, const char *secret);
/* Forwards r, whose body (if any) is whole in r->body, to the host at
 * base_url (the placement of a create): 0 and *ret the client's answer (the
 * host's); -EHOSTUNREACH when it could not be reached and nothing was sent
 * (or this host does not forward): the caller may run it elsewhere. */
int http_forward_whole(Req *r, const char *base_url, enum MHD_Result *ret);
/* How a signed file link is checked (the handlers' side knows the links):
 * check, at admission, reads r's query as a link for the route's link_op
 * and fills r->key and r->link, or refuses in e; claim, once the request is
 * served here and not forwarded, records a one-time link's use or refuses
 * in e. Kept, not copied. */
typedef struct HttpLinks {
        int (*check)(void *userdata, Req *r, const char *op, ApiError *e);
        int (*claim)(void *userdata, Req *r, ApiError *e);
        void *userdata;
} HttpLinks;
void http_server_set_links(HttpServer *s, const HttpLinks *links);
/* How a sandbox session's token is checked (the handlers' side knows the
 * sessions): check reads the token (a session token's shape) and the
 * request's Origin (NULL: none; one the session does not list is refused)
 * and fills r->key and r->session, or refuses in e; preflight says whether
 * an active session of the sandbox lists origin (a CORS preflight carries
 * no token). Kept, not copied; before http_server_start. */
typedef struct HttpSessions {
        int (*check)(void *userdata, Req *r, const char *token, const char *origin, ApiError *e);
        bool (*preflight)(void *userdata, const char *sandbox_id, const char *origin);
        void *userdata;
} HttpSessions;
void http_server_set_sessions(HttpServer *s, const HttpSessions *sessions);
/* Ends the connections that carry the session's requests: its streams and
 * WebSockets close at once (http/session_conns.h). */
void req_end_session(Req *r, const char *session_id);
/* Whether this host forwards (it has the fleet's secret). */
bool http_forwards(const Req *r);
/* A request about sandbox_id named in its body (its path names none, so
 * it was not forwarded before its handler ran), body whole in r->body: 1
 * and *ret the answer when it went on to the host that runs the sandbox;
 * 0 to serve it here (this host runs it, does not forward, or cannot reach
 * that one: the handler then says where it runs). */
int http_forward_to_sandbox(Req *r, const char *sandbox_id, enum MHD_Result *ret);
/* Serves on listen_fd (bound and listening; the server takes it). */
int http_server_start(HttpServer *s, int listen_fd);
/* After http_server_start: serves the other hosts' forwarded requests on
 * hop_fd over TLS with cert_pem and key_pem (docs/fleet.md, "TLS between
 * hosts"). A request there needs the fleet's secret; from then on a request
 * that carries the secret on the clients' listener is refused, so that the
 * secret is never taken from a connection in the clear. */
int http_server_start_hop(HttpServer *s, int hop_fd, const char *cert_pem, const char *key_pem);
/* Stops accepting new connections; running requests go on. */
void http_server_quiesce(HttpServer *s);
/* Closes every connection and joins their threads. */
void http_server_stop(HttpServer *s);
void http_server_free(HttpServer *s);
