#pragma once
/*
 * The preview listener (docs/previews.md): a socket of its own, apart from
 * the API's, where a request's Host names a preview (PORT-SANDBOX.DOMAIN)
 * and is relayed to that port in the sandbox over its agent channel, as a
 * port forward's connection is. No API key is read or accepted there. A
 * connection is bound to the one preview its first request named: every
 * later request on it must name the same host, and upgraded connections
 * (WebSockets) run on as bytes. Bounds: connections in all and per peer
 * address, the head's size and the time it may take to arrive.
 */
#include "daemon/http/http.h"

typedef struct PreviewProxy PreviewProxy;

/* Serves previews on fd (a listening socket; taken) for app, in threads of
 * its own; over TLS with tls (an SSL_CTX: preview_tls.h) unless NULL. */
int preview_proxy_start(App *app, int fd, void *tls, PreviewProxy **ret);
/* The fleet's secret (NULL: none): with it, a request for a preview of a
 * sandbox another host runs is relayed to that host (docs/previews.md, "A
 * fleet"). Set once, before any request. */
void preview_proxy_set_fleet_secret(PreviewProxy *px, const char *secret);
/* The most preview connections relayed to any one other host of the fleet,
 * and the most taken relayed from one (--preview-relay-max-connections):
 * one host's clients take a share of another's listener, never all of it.
 * Within the listener's own bound of connections. Set once, before any
 * request. */
#define PREVIEW_RELAY_MAX_DEFAULT 256u
#define PREVIEW_RELAY_MAX_LIMIT 512u
void preview_proxy_set_relay_max(unsigned n);
/* The protocol of a relay between two hosts: the relaying host's upgrade
 * request to the API of the host that runs the sandbox
 * (GET /v1/sandboxes/{id}/previews/{port}:relay). */
#define PREVIEW_RELAY_PROTOCOL "runtime-preview"
/* Serves the upgraded socket sock (closed through urh) as a connection of
 * the preview listener, relayed by host `by` for port of sandbox_id only:
 * its first bytes are extra, then what sock brings; parsed, bounded and
 * checked (the token too) as a client's own, and never relayed on. 0, or
 * < 0 when it was not taken (the caller closes it; a page may have gone). */
int preview_proxy_adopt(int sock, struct MHD_UpgradeResponseHandle *urh, const char *extra, size_t extra_len,
                        const char *by, const char *sandbox_id, unsigned port);
/* Stops accepting, closes every connection and waits for their threads. */
void preview_proxy_stop(PreviewProxy *px);
/* Closes the open connections of a preview (port 0: of every preview of
 * the sandbox), on deletion, rotation or a change of visibility. */
void preview_proxy_close(const char *sandbox_id, unsigned port);
/* A deleted sandbox's previews go with it: their records, and their open
 * connections. */
void preview_proxy_forget_sandbox(App *app, const char *sandbox_id);
