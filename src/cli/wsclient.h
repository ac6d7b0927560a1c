#pragma once
/* A WebSocket client on the daemon's connection (TCP, TLS or its unix
 * socket, through libcurl's connect-only mode): the handshake, then Debian's
 * libwslay for the framing. Terminals (sandbox shell) and tunnels
 * (sandbox port-forward) use it. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/client.h"

typedef struct WsClient WsClient;
/* A whole message from the daemon. */
typedef void (*WsClientMessageFn)(void *userdata, bool text, const uint8_t *data, size_t len);

/* Connects, sends the handshake for target (a path and query) and reads its
 * answer: 0 on 101, else the API's error in err (-EPROTO) or why the daemon
 * could not be reached. A message over max_message drops the connection. */
int ws_client_open(Client *c, const char *target, size_t max_message, WsClientMessageFn fn, void *userdata,
                   WsClient **ret, CliError *err);
void ws_client_free(WsClient *w);
int ws_client_fd(WsClient *w);
/* Bytes read with the handshake's answer are waiting: read without polling. */
bool ws_client_pending(WsClient *w);
bool ws_client_want_read(WsClient *w);
bool ws_client_want_write(WsClient *w);
/* Reads and hands out messages / writes what is queued: -EPIPE once closed. */
int ws_client_read(WsClient *w);
int ws_client_write(WsClient *w);
int ws_client_send(WsClient *w, bool text, const void *data, size_t len);
int ws_client_close(WsClient *w, uint16_t code);
bool ws_client_close_sent(WsClient *w);
size_t ws_client_queued(WsClient *w);
