#pragma once
/*
 * The server side of a WebSocket (RFC 6455) on a connection that HTTP has
 * handed over (libmicrohttpd's upgrade). Framing, masking, fragments,
 * control frames and the closing handshake are wslay's (Debian's libwslay, a
 * framing library that does no I/O of its own); this module gives it the
 * socket, bounds what a client may send, and turns whole messages into
 * callbacks. Not thread-safe: one owner, or the owner's lock, at a time.
 * Knows nothing of terminals or sandboxes.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Close codes this server sends. */
#define WS_CLOSE_NORMAL 1000
#define WS_CLOSE_GOING_AWAY 1001
#define WS_CLOSE_POLICY 1008
#define WS_CLOSE_TOO_BIG 1009
#define WS_CLOSE_INTERNAL 1011

/* A Sec-WebSocket-Key: the base64 of 16 bytes (24 characters). */
bool ws_client_key_ok(const char *key);
/* Sec-WebSocket-Accept for a valid key: 28 characters and a NUL. */
int ws_accept_value(const char *key, char ret[29]);

typedef struct WsConn WsConn;
/* A whole message from the client: text (UTF-8 not checked here) or binary. */
typedef void (*WsMessageFn)(void *userdata, bool text, const uint8_t *data, size_t len);

/* fd: the connected socket, made non-blocking here; -1 for none (bytes only
 * come from ws_conn_feed and what is sent is dropped: the fuzz target).
 * A message over max_message bytes closes the connection with 1009. */
WsConn *ws_conn_new(int fd, size_t max_message, WsMessageFn fn, void *userdata);
void ws_conn_free(WsConn *c);
/* Bytes the client sent before the upgrade finished, read before the socket. */
int ws_conn_feed(WsConn *c, const uint8_t *data, size_t len);
/* Reads what the socket has and hands out whole messages; answers pings
 * and a close. -EPIPE once the client is gone or broke the protocol. */
int ws_conn_read(WsConn *c);
/* Writes what is queued, as far as the socket takes it. -EPIPE when the
 * client is gone. */
int ws_conn_write(WsConn *c);
/* Queues a message (copied). -EPIPE once a close was queued. */
int ws_conn_send(WsConn *c, bool text, const void *data, size_t len);
/* Queues the close frame; no message goes out after it. */
int ws_conn_close(WsConn *c, uint16_t code, const char *reason);
bool ws_conn_want_read(WsConn *c);
bool ws_conn_want_write(WsConn *c);
/* Bytes of messages queued and not yet written. */
size_t ws_conn_queued(WsConn *c);
/* The close frame went out (ours or the echo of the client's). */
bool ws_conn_close_sent(WsConn *c);
/* Before the socket is closed: no more writes, and what the client still
 * sends is read and dropped for up to timeout_ms (or 1 MiB), so that the
 * kernel does not answer it with a reset that would destroy our close frame
 * before the client reads it. */
void ws_conn_linger(WsConn *c, int timeout_ms);
/* The client sent its close frame. */
bool ws_conn_close_received(WsConn *c);
