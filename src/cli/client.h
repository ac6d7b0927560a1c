#pragma once
/* The HTTP client of the CLI: one libcurl easy handle per Client, requests
 * built on an Endpoint, the key in the Authorization header and nowhere else.
 * Functions return 0, or a negative errno with err filled in:
 *   -EPROTO     the daemon answered an API error (err->status, code, message, hint)
 *   -EINTR      the interrupt flag was raised during the transfer
 *   other       the daemon could not be reached or the connection broke (err->message)
 * A negative value returned by a caller's callback is passed back unchanged. */
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "cli/endpoint.h"
#include "cli/ndjson.h"
#include "common/jsonutil.h"

typedef struct Client Client;

typedef struct CliError {
        long status; /* HTTP status of an API error, 0 when there was no answer */
        char code[64];
        char message[1024];
        char hint[1024];
        char request_id[128];
} CliError;

/* Copies what it needs from ep and key. */
int client_new(const Endpoint *ep, const char *key, Client **ret);
Client *client_free(Client *c);
static inline void client_freep(Client **c) {
        client_free(*c);
}
#define _cleanup_client_ __attribute__((cleanup(client_freep)))

/* While *flag is non-zero, transfers are aborted (with -EINTR) within about
 * a second. NULL turns it off. */
void client_set_interrupt(Client *c, volatile sig_atomic_t *flag);

/* A request with an optional JSON body (body NULL and method POST sends an
 * empty body). ret may be NULL; otherwise it gets the answer's JSON. */
int client_json(Client *c, const char *method, const char *path, json_t *body, json_t **ret, CliError *err);

/* An NDJSON answer: fn gets every line (without its '\n') as it arrives. */
typedef LineFn ClientLineFn;
int client_stream_lines(Client *c, const char *method, const char *path, json_t *body, ClientLineFn fn,
                        void *userdata, CliError *err);

/* A raw GET: fn gets the bytes as they arrive. */
typedef int (*ClientSinkFn)(const void *data, size_t len, void *userdata);
int client_download(Client *c, const char *path, ClientSinkFn fn, void *userdata, CliError *err);

/* A raw PUT read from fd as it is sent; size -1 when unknown (chunked). */
int client_upload(Client *c, const char *path, int fd, long long size, json_t **ret, CliError *err);

/* A raw connection for a WebSocket (the terminal): connects to the daemon
 * (TCP, TLS or its unix socket) and sends nothing; the caller writes the
 * handshake. The Authorization header line to send, without CRLF. */
int client_raw_connect(Client *c, CliError *err);
const char *client_auth_header(Client *c);
/* The host of the base URL (for the Host header) and its path prefix. */
const char *client_base(Client *c);
/* The connected socket, to poll. */
int client_raw_socket(Client *c);
/* Bytes to and from the raw connection: the count, -EAGAIN when it would
 * block, -EPIPE when it closed. */
ssize_t client_raw_send(Client *c, const void *buf, size_t len);
ssize_t client_raw_recv(Client *c, void *buf, size_t len);

/* Percent-encodes s for a query value or a path segment ('/' kept). */
char *url_escape(const char *s);

/* Copies an API error object ({"error": {...}}) into err; control
 * characters are replaced so a message cannot drive the terminal. */
void cli_error_from_json(CliError *err, long status, const char *body, size_t len);
void cli_error_set(CliError *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
