#pragma once
/*
 * The daemon's end of one agent channel (docs/protocol.md): a reader thread
 * that demultiplexes frames into streams, and a write lock so that many
 * request threads share the one fd. Flow control is done here: a writer
 * blocks while its stream has no credit, and a reader's consumption hands
 * credit back to the agent.
 *
 * Requests and results are the JSON objects of docs/protocol.md; this layer
 * does not interpret them.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct Channel Channel;
typedef struct ChanStream ChanStream;

/* Called once, from the reader thread, when the channel ends: EOF, read error
 * or a malformed frame (`reason` says which). Every open stream then gets
 * CHAN_EV_CLOSED. */
typedef void (*ChannelClosedFn)(void *userdata, const char *reason);

/* The random token of a taken-over channel's DETACH, which the agent echoes. */
#define CHANNEL_TOKEN_LEN 16u

/* Takes ownership of fd. Starts the reader thread. NULL on failure (fd closed). */
Channel *channel_new(int fd, ChannelClosedFn on_closed, void *userdata);
/* The same for a channel a supervisor hands over to a daemon that did not
 * start the sandbox: what the agent sent before is unknown (the last daemon
 * may have read part of a frame), so the reader skips everything up to the
 * agent's echo of the DETACH that channel_attach sends first. */
Channel *channel_take_over(int fd, ChannelClosedFn on_closed, void *userdata);
/* Waits for the agent's HELLO. 0 and *ret_hello (a new reference), -ETIMEDOUT,
 * -EPIPE when the channel closed first. */
int channel_wait_hello(Channel *c, int timeout_ms, json_t **ret_hello);
/* A daemon taking over the channel of a sandbox it did not start (after a
 * restart, through the sandbox's supervisor): sends DETACH with the token
 * (channel_take_over's only), then ATTACH, and waits for the agent's HELLO,
 * whose "attached" member lists the processes the agent kept
 * (docs/protocol.md). As channel_wait_hello otherwise. */
int channel_attach(Channel *c, int timeout_ms, json_t **ret_hello);
/* One of those processes' streams, linked under its old id (odd; the ids
 * opened from now on start past it). Sends the WINDOW after which the agent
 * sends what it held. -EINVAL for an id the daemon could not have opened,
 * -EEXIST, -EMFILE, -EPIPE. */
int channel_adopt_stream(Channel *c, uint32_t id, ChanStream **ret);
/* Round trip of a PING; 0 or -ETIMEDOUT / -EPIPE. */
int channel_ping(Channel *c, int timeout_ms);
/* One step of the heartbeat, for a caller that runs it periodically (every
 * second or so); never blocks on the agent. Sends a PING when none is awaited
 * and the last went out interval_ms or more ago; when the write lock is held
 * or the socket is full it tries again on the next call. Any byte from the
 * agent counts as life, so a sandbox busy streaming output is never dead.
 * 0 alive, -ETIMEDOUT when a ping has been awaited and nothing at all arrived
 * for deadline_ms, -EPIPE when the channel is closed. Times are monotonic
 * milliseconds. */
int channel_heartbeat(Channel *c, int64_t now_ms, int64_t interval_ms, int64_t deadline_ms);
/* After the agent was paused on purpose: the silence so far is not its
 * fault, so the heartbeat starts afresh from now. */
void channel_heartbeat_reset(Channel *c, int64_t now_ms);
/* Streams open on the channel (execs, processes, files, tunnels). */
size_t channel_stream_count(Channel *c);
bool channel_is_open(Channel *c);
/* Ends the channel without freeing it: the fd is shut down both ways, every
 * waiter gets CHAN_EV_CLOSED, on_closed is called. */
void channel_shutdown(Channel *c);
/* Ends the channel at the daemon's stop without touching the socket, which
 * the sandbox's supervisor keeps for the agent: every waiter gets
 * CHAN_EV_CLOSED, on_closed is called, and neither the reader's end nor
 * channel_free shuts the socket down. */
void channel_let_go(Channel *c);
/* Shuts the fd down, wakes every waiter with CHAN_EV_CLOSED, joins the reader
 * thread, frees. Streams still held must be freed by their owners afterwards
 * (they stay valid until chan_stream_free). NULL is fine. */
void channel_free(Channel *c);

/* Opens a host stream (odd id) with `request` as the OPEN payload (borrowed).
 * -EPIPE when the channel is closed, -E2BIG when the JSON is over
 * PROTO_MAX_JSON, -EMFILE past CHANNEL_MAX_STREAMS open streams. */
#define CHANNEL_MAX_STREAMS 1024
int channel_open_stream(Channel *c, json_t *request, ChanStream **ret);

/* A checkpoint of the agent (a microVM about to be saved): sends `request`
 * (borrowed) and waits up to timeout_ms for its answer, after which the
 * agent sends nothing until the daemon's next frame. On success (0) the
 * channel's write lock stays held, so that nothing goes to the agent either:
 * the channel is empty both ways until channel_checkpoint_end, and a machine
 * saved meanwhile holds no frame half-sent. -ETIMEDOUT, -EPIPE, and
 * -EPROTO when the agent refused; the lock is then released. */
int channel_checkpoint_begin(Channel *c, json_t *request, int timeout_ms);
void channel_checkpoint_end(Channel *c);

/* Sends DATA on fd PROTO_FD_IN, split into frames, blocking while the stream
 * has no credit. timeout_ms < 0 waits for ever. 0, -ETIMEDOUT, -EPIPE (channel
 * closed or stream finished). */
int chan_stream_write(ChanStream *s, const void *buf, size_t n, int timeout_ms);
/* Like chan_stream_write, but sends what the credit allows within timeout_ms
 * and says how much: the bytes sent (> 0), 0 when none could go in time,
 * -EPIPE. For a writer that must account for every byte it accepted. */
ssize_t chan_stream_write_some(ChanStream *s, const void *buf, size_t n, int timeout_ms);
/* fn(userdata) whenever a WINDOW from the agent gives the stream credit
 * again after it had none: a writer that must not block (one thread serving
 * many streams) sleeps in its own poll and is woken by this instead of
 * looking again on a timer. Called from the channel's reader thread with the
 * channel's lock held: it must not block nor call into the channel (writing
 * a byte to a non-blocking pipe is what it is for). NULL turns it off. */
typedef void (*ChanCreditFn)(void *userdata);
void chan_stream_on_credit(ChanStream *s, ChanCreditFn fn, void *userdata);
/* The stream's id on the channel (what a signal request names). */
uint32_t chan_stream_id(ChanStream *s);
/* EOF for PROTO_FD_IN. */
int chan_stream_close_write(ChanStream *s);
/* A JSON EVENT to the peer on the stream (a terminal's resize); -EPIPE once
 * the stream or the channel ended. */
int chan_stream_send_event(ChanStream *s, json_t *event);
/* Sends CANCEL once; the agent still answers RESULT. */
void chan_stream_cancel(ChanStream *s);

typedef enum ChanEventType {
        CHAN_EV_DATA,   /* fd and data/len */
        CHAN_EV_EOF,    /* fd */
        CHAN_EV_EVENT,  /* json */
        CHAN_EV_RESULT, /* json; the stream is finished, next() returns CLOSED after it */
        CHAN_EV_CLOSED, /* the channel closed before a RESULT */
} ChanEventType;

typedef struct ChanEvent {
        ChanEventType type;
        int fd;
        uint8_t *data; /* owned by the event */
        size_t len;
        json_t *json;  /* owned by the event */
} ChanEvent;

/*
 * Streams the agent opens (even ids): the egress relay's connections. The
 * acceptor is called from the reader thread with the new stream and its OPEN
 * request (a new reference); it must not block, and owns both (typically it
 * hands them to a thread of its own). On such a stream the roles turn
 * around: chan_stream_next yields the agent's DATA on fd PROTO_FD_IN and its
 * EOF; chan_stream_write/close_write send on PROTO_FD_OUT; the agent giving up
 * (CANCEL) arrives as a RESULT event; chan_stream_finish answers the RESULT
 * that ends the stream (chan_stream_free sends an empty one if none was).
 * Without an acceptor, agent streams are refused.
 */
typedef void (*ChannelAcceptFn)(void *userdata, ChanStream *s, json_t *request);
void channel_set_acceptor(Channel *c, ChannelAcceptFn fn, void *userdata);
int chan_stream_finish(ChanStream *s, json_t *result);

/* Next event of the stream, in arrival order. 0 and *ret filled, -ETIMEDOUT
 * (timeout_ms >= 0). Taking a DATA event returns its bytes of credit to the
 * agent. Queued, unconsumed data per stream is bounded by the window. */
int chan_stream_next(ChanStream *s, int timeout_ms, ChanEvent *ret);
void chan_event_clear(ChanEvent *e);

/* Frees the stream; sends CANCEL first if no RESULT arrived yet. NULL is fine. */
void chan_stream_free(ChanStream *s);
