#pragma once
/*
 * A WebSocket session after the HTTP upgrade, the part every WebSocket route
 * (terminals, tunnels) shares: the upgraded socket handed to a thread of its
 * own, the lock and wake pipe the route's other threads use to queue
 * messages, one round of socket I/O, the end (linger, stop), and the list of
 * open sessions per route with its bound, which the daemon's shutdown closes
 * and waits for. A route embeds a WsSession as its first member and gives
 * its ops.
 */
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/http/apierror.h"
#include "daemon/http/http.h"
#include "daemon/http/websocket.h"

/* Output queued for a client beyond this stops the route's producers until
 * it drains below half (they wait on drained): a client that does not read
 * holds up its own session only. */
#define WS_SESSION_OUT_HIGH (1024u * 1024u)
/* How long a close handshake is waited for. */
#define WS_SESSION_CLOSE_WAIT_MS 2000

typedef struct WsSession WsSession;

typedef struct WsSessionOps {
        const char *what;   /* "terminal", "tunnel": for the log */
        size_t max_message; /* a client's message past this closes with 1009 */
        WsMessageFn on_message; /* userdata: the WsSession; called under its lock */
        /* The session's life, on its own thread; returns once it ended (after
         * ws_session_end_locked). */
        void (*run)(WsSession *s);
        /* Undoes what the route started for a session that never ran (its
         * thread could not start, or the upgrade failed). May be NULL. */
        void (*abandon)(WsSession *s);
        /* Frees the route's part, then ws_session_destroy and the memory. */
        void (*free)(WsSession *s);
} WsSessionOps;

/* The open sessions of one route. */
typedef struct WsSessionList {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        WsSession *head;
        unsigned count;     /* listed: what close_all waits for */
        unsigned admitted;  /* of them, within the bound */
        unsigned max;       /* the host's bound */
        unsigned max_owner; /* one owner's share of it */
        atomic_bool closing;
} WsSessionList;
#define WS_SESSION_LIST_INIT(bound, owner_bound)                                                            \
        { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .max = (bound),             \
          .max_owner = (owner_bound) }

struct WsSession {
        WsSession *next;
        const WsSessionOps *ops;
        WsSessionList *list;
        bool admitted;
        char owner[64]; /* the owner of the key that opened it */
        char rid[24];
        int sock;
        struct MHD_UpgradeResponseHandle *urh;
        uint8_t *extra; /* what the client sent before the upgrade finished */
        size_t extra_len;

        pthread_mutex_t lock; /* ws, stop and the route's own state */
        pthread_cond_t drained;
        WsConn *ws;
        int wake[2];
        bool stop; /* the session is ending: the route's threads stop */
        bool gone; /* the client went away or broke the protocol */
        uint64_t close_deadline;
};

/* A new session of size bytes (the route's struct, its WsSession first,
 * zeroed) set up for a request: its lock, condition and wake pipe. NULL when
 * out of memory or descriptors. */
WsSession *ws_session_new(size_t size, const WsSessionOps *ops, WsSessionList *list, const char *owner,
                          const char *rid);
/* Releases what ws_session_new and the upgrade made; not the memory. */
void ws_session_destroy(WsSession *s);
typedef enum WsAdmit {
        WS_ADMITTED = 0,
        WS_REFUSED_OWNER,   /* its owner has max_owner of the route's sessions open */
        WS_REFUSED_HOST,    /* the route has max open, or the daemon is closing */
} WsAdmit;
/* Lists s among the route's open sessions, admitted unless its owner or
 * the route is at its bound (the owner's is checked first, so that an owner
 * at its own is told so) or the daemon is closing; s is listed all the same,
 * to answer its client with the refusal after the upgrade. */
WsAdmit ws_session_admit(WsSession *s);
/* Answers 101 with the accept value and hands the socket to a thread of its
 * own running ops->run. On failure the session is abandoned, unlisted and
 * freed, and the request answered 500. */
enum MHD_Result ws_session_upgrade(Req *r, WsSession *s, const char *accept);

/* Wakes the session's thread (from the route's other threads). */
void ws_session_wake(WsSession *s);
/* With s->lock held: feeds what came before the upgrade. */
void ws_session_start_locked(WsSession *s);
/* With s->lock held: one round of the socket. Waits up to timeout_ms (the
 * lock released meanwhile) for the socket or a wake, then reads and writes
 * what is due. false when the session is over: the client went away or
 * both sides closed, the close handshake ran out of time, or the daemon is
 * closing. */
bool ws_session_pump_locked(WsSession *s, int timeout_ms);
/* With s->lock held: the end. Lingers for the client's close when it is
 * still there, then sets stop and wakes the route's waiting threads. */
void ws_session_end_locked(WsSession *s);

/* With s->lock held: a text message of j (taken). */
void ws_session_send_json_locked(WsSession *s, json_t *j);
/* With s->lock held: {"type": "error", "error": {...}} in the API's shape. */
void ws_session_send_error_locked(WsSession *s, const ApiError *e);

/* Closes every open session of the route and waits until they are gone;
 * from then on the route admits none. */
void ws_session_close_all(WsSessionList *l);
