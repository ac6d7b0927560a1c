#ifndef DAEMON_HTTP_EDGE_H
#define DAEMON_HTTP_EDGE_H

/* The HTTP edge: one thread that accepts every connection and holds it,
 * without a thread of its own, until its first request's head is whole;
 * only then does it go to the HTTP server, which spends a thread on each
 * connection it holds. A connection that trickles its head, or opens and
 * says nothing, costs a socket and a few bytes here, never a thread.
 *
 * The edge also watches the server's connections between two requests: a
 * kept-alive connection whose next head is not whole within the same time
 * is cut, so that a thread is held by a request in progress or, for at
 * most that long, by a connection its client keeps for the next one. */

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

typedef struct Edge Edge;
typedef struct EdgeConn EdgeConn;

typedef struct EdgeConfig {
        unsigned max_waiting;          /* connections awaiting a head, all peers; past it the oldest is closed */
        unsigned max_waiting_per_peer; /* ... from one peer: its address, or its uid on a unix socket */
        unsigned head_ms;              /* a head is whole this long after the connection came, or the answer before it */
        size_t head_max;               /* bytes of a head; a longer one is a 431 */
        unsigned max_held;             /* connections the server holds at most; a whole head waits
                                        * for room (a 503 once its time is up); 0: no bound */
        unsigned (*held)(void *userdata); /* the connections the server holds now */
} EdgeConfig;

/* Gets a connection whose head is whole (the bytes are still in the
 * socket, unread); owns fd from then on. Whether the server took it. */
typedef bool (*EdgeHandOff)(void *userdata, int fd, const struct sockaddr *sa, socklen_t len);

/* Takes listen_fd (made non-blocking, closed by edge_quiesce or edge_free). */
int edge_start(int listen_fd, const EdgeConfig *cfg, EdgeHandOff hand_off, void *userdata, Edge **ret);
/* No new connection from now on: the listening socket and the connections
 * still awaiting a head are closed. The server's connections go on. */
void edge_quiesce(Edge *e);
void edge_free(Edge *e);

/* The server's connections, each from its start to just before the server
 * closes its socket (edge_conn_remove). A new one awaits a head. */
EdgeConn *edge_conn_add(Edge *e, int fd);
void edge_conn_busy(EdgeConn *c);     /* a request's head is in */
void edge_conn_idle(EdgeConn *c);     /* answered: the next head has head_ms from now */
void edge_conn_upgraded(EdgeConn *c); /* no longer HTTP: never cut */
void edge_conn_remove(EdgeConn *c);
/* A connection the server held is closed: a whole head waiting for room
 * is looked at again. */
void edge_server_closed(Edge *e);
/* For the server's thread of a kept-alive connection, between two
 * requests: waits at most wait_ms for the next head to be whole, and looks
 * at it as the edge looks at a first one (the server would end a header's
 * value at a NUL, and the value it passes on would not show it). 0: the
 * server reads it (or the client ended, or the time is up, and the sweep
 * cuts it); -EBADMSG: it was answered (400 or 431), and the connection is
 * shut down for the server to close. */
int edge_next_head(Edge *e, int fd, unsigned wait_ms);

/* What the edge did since it started, for /metrics and the tests. */
typedef struct EdgeStats {
        unsigned waiting;                 /* connections awaiting a head now */
        unsigned ready;                   /* ... of them whole, waiting for room in the server */
        unsigned long long handed;        /* to the server */
        unsigned long long refused_peer;  /* past the peer's bound: closed at once */
        unsigned long long evicted;       /* the oldest, closed for a new one past max_waiting */
        unsigned long long timed_out;     /* heads not whole in time (kept-alive ones included) */
        unsigned long long malformed;     /* a NUL in the head, or a head too long: answered 400 or 431 */
} EdgeStats;
void edge_stats(Edge *e, EdgeStats *ret);

/* Where the head that begins buf (n bytes) ends, just past its empty line:
 * > 0, 0 while it is not whole, -EBADMSG for a NUL in it. Line breaks
 * that come before the request line are skipped, as HTTP allows.
 * Exposed for the unit test. */
long edge_head_end(const char *buf, size_t n);

#endif
