#pragma once
/*
 * GET /v1/sandboxes/{id}/tunnel: port forwarding over one WebSocket
 * (docs/api.md). Every connection of a client's forward is a stream of the
 * tunnel, carried to 127.0.0.1:PORT inside the sandbox on a stream of the
 * agent channel (the agent's "forward" op), with the client's flow control
 * (credit frames) and the channel's. One thread per tunnel, one per
 * connection reading the sandbox's side.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/http/http.h"

/* Open tunnels in this daemon, and connections in one tunnel. */
#define TUNNEL_MAX_OPEN 64
#define TUNNEL_MAX_OPEN_PER_OWNER 16 /* one owner's share: never all of the host's */
#define TUNNEL_MAX_CONNS 64
/* What a client may send past the last credit it got (the published
 * client's window), and what it may have waiting here at most: beyond that
 * it ignored the window, and the tunnel closes. */
#define TUNNEL_WINDOW (1024u * 1024u)
#define TUNNEL_MAX_BUFFERED (2u * TUNNEL_WINDOW)
/* A client message: a kind, a stream number and at most 64 KiB of data. */
#define TUNNEL_MAX_MESSAGE (5u + 64u * 1024u)

typedef enum TunnelFrameKind {
        TUNNEL_OPEN = 'o',
        TUNNEL_DATA = 'd',
        TUNNEL_END = 'e',
        TUNNEL_CLOSE = 'c',
        TUNNEL_ACK = 'a',
} TunnelFrameKind;

typedef struct TunnelFrame {
        TunnelFrameKind kind;
        uint32_t stream;
        const uint8_t *payload;
        size_t len;
        unsigned port; /* an open's "tcp PORT" */
} TunnelFrame;

/* A binary message from the client: 0 and the frame, -EINVAL when it is not
 * one a client sends (an ack, an unknown kind, stream 0, an open that is not
 * "tcp 1..65535"). Pure: fuzzed. */
int tunnel_parse_frame(const uint8_t *msg, size_t len, TunnelFrame *ret);

enum MHD_Result handle_tunnel(Req *r);
/* Ends every open tunnel (the daemon is stopping) and waits for them. */
void tunnel_close_all(void);
