#pragma once
/*
 * Forwarding a request to the host that runs its sandbox (docs/fleet.md,
 * "Any host answers"): the request goes on, as the client sent it, over a
 * kept-alive connection (a pool per host, or a new one) to the owner's
 * advertised URL (http://, or https:// with the fleet's CA: hop_tls.h),
 * with the fleet's secret and this host's id; the answer comes back as it
 * comes, a stream as a stream, a download without being held, a WebSocket
 * spliced byte for byte. The owner authenticates the client's key itself
 * (the keys are the store's): the secret alone grants nothing but the hop,
 * and a request that came forwarded is never forwarded again.
 *
 * Parsing the owner's answer head is http_parser's (the library the egress
 * proxy uses), bounded: 64 headers, 8 KiB each.
 */
#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "daemon/http/apierror.h"

/* The headers of the hop. A client's own are dropped before a request goes
 * on; FORWARD_SECRET_HEADER names the fleet's secret. */
#define FORWARD_SECRET_HEADER "Runtime-Fleet-Secret"
#define FORWARD_BY_HEADER "Runtime-Forwarded-By"
/* The forwarding host holds the request's Idempotency-Key claim: the owner
 * answers it (recording its answer) rather than claiming it again. */
#define FORWARD_CLAIM_HEADER "Runtime-Idempotency-Claimed"
#define FORWARD_CONNECT_TIMEOUT_MS 2000
#define FORWARD_MAX_SECRET 256

typedef struct Forward Forward;

/* The request that goes on, as the HTTP edge has it. */
typedef struct ForwardRequest {
        struct MHD_Connection *conn; /* its headers and query */
        const char *method;
        const char *url;        /* the path, whole */
        const char *rid;        /* for the log */
        const char *sandbox_id; /* for the messages; may be "" */
        bool claimed;           /* this host holds its Idempotency-Key's claim */
        int client_fd;          /* the client's socket: its hang-up ends the hop */
        long long body_len;     /* the body's length when known whole, -1 to follow the client's framing */
} ForwardRequest;

/* Connects to base_url (http://HOST:PORT) and sends the request line and
 * headers (the secret and `by` added). On failure e says why (503
 * host_unavailable) and nothing is left open. */
int forward_open(const ForwardRequest *q, const char *base_url, const char *secret, const char *by, Forward **ret,
                 ApiError *e);
/* The next bytes of the request's body. */
int forward_body(Forward *f, const char *data, size_t n);
/* Ends the request and reads the owner's answer head: *ret a response
 * with its body to come (a 101 becomes a spliced WebSocket) and *ret_status
 * its status, the response owning f; or e (f freed), or -ECONNRESET when the
 * client left (f freed, nothing to answer). */
int forward_answer(Forward *f, unsigned *ret_status, struct MHD_Response **ret, ApiError *e);
/* A connection of its own to another host for a protocol other than HTTP
 * (a preview's bytes: docs/previews.md, "A fleet"): GET path with
 * `Upgrade: protocol`, the fleet's secret and this host's id. */
typedef struct ForwardTunnel {
        const char *base_url; /* the host's advertised URL */
        const char *path;
        const char *protocol;
        const char *secret, *by;
        const char *rid;        /* for the log; may be NULL */
        const char *sandbox_id; /* for the messages */
        int client_fd;          /* the client's socket: its hang-up ends the wait */
} ForwardTunnel;
/* The answer head is waited for this long at most. */
#define FORWARD_TUNNEL_ANSWER_MS 5000
/* Opens the tunnel: 0 once the host answered 101 (*ret the connection,
 * the bytes after the head kept for forward_read); -ECONNRESET when the
 * client left; else e (503 host_unavailable when the host cannot be
 * reached, 502 when it answers otherwise or not in time). */
int forward_tunnel_open(const ForwardTunnel *t, Forward **ret, ApiError *e);
/* The tunnel's socket, to poll; and whether bytes are read already that
 * no poll of it shows (TLS's, or what came with the answer head). */
int forward_fd(const Forward *f);
bool forward_pending(const Forward *f);
/* Its bytes: read (0 at the end, < 0 on error), written (0 or < 0), and
 * the end of what this side sends. */
ssize_t forward_read(Forward *f, char *buf, size_t n);
int forward_write(Forward *f, const char *p, size_t n);
void forward_shutdown_write(Forward *f);

/* Closes what is open; NULL is fine. */
void forward_free(Forward *f);

/* The TLS client context (hop_tls_client) that https:// hosts are reached
 * with; never set: an https:// host is refused (503). Set once, before
 * any request. */
void forward_set_tls(void *client_ctx);

/* Closes the kept-alive connections to other hosts (a hop's answer read
 * whole leaves its connection for the next hop to the same host, for up to
 * 2 s). At the daemon's stop. */
void forward_pool_drain(void);

/* Whether value is the secret (compared in constant time). */
bool forward_secret_ok(const char *secret, const char *value);
