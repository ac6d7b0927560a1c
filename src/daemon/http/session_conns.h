#pragma once
/*
 * The connections that carry a sandbox session's requests (its streams and
 * WebSockets among them), so that a session's revocation or expiry ends
 * them at once rather than at their next request: each is shut down both
 * ways, and whatever was reading or writing it sees its client gone. A
 * connection is listed while it serves a request with a session token (a
 * WebSocket until it closes); a thread of its own shuts down those whose
 * session expired.
 */
#include <stdint.h>

#define SESSION_CONNS_ID_MAX 32

typedef struct SessionConns SessionConns;

/* Starts the expiry thread. NULL on failure. */
SessionConns *session_conns_new(void);
/* Stops the thread and frees the list. NULL is fine. */
void session_conns_free(SessionConns *l);
/* Lists fd (a client's connection) under the session until expires_at
 * (Unix seconds), replacing what it was listed under. 0 or -ENOMEM. */
int session_conns_add(SessionConns *l, int fd, const char *session_id, int64_t expires_at);
/* The connection on fd closes: it leaves the list before its fd does. */
void session_conns_remove(SessionConns *l, int fd);
/* Shuts down every connection of the session; how many. */
unsigned session_conns_end(SessionConns *l, const char *session_id);
