#pragma once
/*
 * What the files of the agent's loop share: the streams, the agent's state
 * and the functions one file calls in another. agent.c holds the channel
 * (frames in and out, requests), agent_io.c the streams' descriptors (a
 * child's pipes, its end, and the egress relay's connections), agent_hold.c
 * what happens to them while the host's daemon is away (DETACH, ATTACH and
 * the output held in between).
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent/agent.h"
#include "agent/exec.h"
#include "agent/fsops.h"
#include "agent/limits.h"
#include "agent/request.h"
#include "agent/watch.h"
#include "proto/proto.h"

/* A child's stdout and stderr pipes hold this much (F_SETPIPE_SZ; the
 * default is 64 KiB): a program that writes a lot runs on while the agent
 * waits for its turn on a loaded machine, and the agent then takes it in a
 * few large reads instead of many wakeups of 64 KiB or less. Best effort:
 * past /proc/sys/fs/pipe-max-size the default stays. */
#define EXEC_PIPE_BYTES (1024u * 1024u)
/* The channel's send buffer (SO_SNDBUF, or the pipe's size under gVisor):
 * room for a whole window of output, so that a frame goes out in one write
 * while the host's reader is not yet scheduled. Best effort as well. */
#define CHANNEL_SEND_BYTES (2u * 1024u * 1024u)
/* Bytes read per DATA frame from a file, a child's pipe or a forwarded
 * connection, and from the channel at once: a whole largest frame, so that
 * bulk data moves in few frames and syscalls. */
#define BIG_CHUNK PROTO_MAX_PAYLOAD
/* Queued frames handed to one writev(). */
#define FLUSH_IOV 64
/* Looks at what else is ready before queued frames are written (agent_run). */
#define AGENT_BATCH_PASSES 4
/* Credit is returned to the host in batches of at least this much, or when the
 * stdin queue runs empty. */
#define WINDOW_BATCH (64u * 1024u)
/* After the group was killed, an escaped process (its own session) can still
 * hold the pipes: stop draining them this long after. */
#define FINAL_DRAIN_MS 2000
/* After the host resizes a terminal, how long and how often the agent checks
 * that its size was not put back (pty_guard in agent_io.c). */
#define PTY_GUARD_MS 1000
#define PTY_GUARD_EVERY_MS 5
/* The id a stream of a saved machine's earlier channel takes in a copy of
 * that machine: never found by a frame's id, and whatever it would send is
 * dropped (the copy's host never opened it). */
#define ORPHAN_STREAM UINT32_MAX
/* Held output (AGENT_HOLD_*) is kept in chunks of at most this many bytes of
 * one fd: a partly dropped chunk is compacted, so what a stream holds in
 * memory is what it is charged for. */
#define HELD_CHUNK_BYTES (64u * 1024u)
/* What a held chunk costs beyond its bytes (its header and the allocator's):
 * charged to the bounds as well, so that a program alternating one-byte
 * writes to stdout and stderr cannot grow the agent past them. */
#define HELD_CHUNK_OVERHEAD 64u
/* The most one exec's entry in an ATTACH's HELLO takes without its tag
 * ("tag":null included): every number at its widest. */
#define HELLO_ENTRY_BYTES 200u
/* What the HELLO's entries may take in all: the rest of the frame is the
 * usual members (the kernel's release at most 64 bytes). An exec whose entry
 * would not fit is refused, so that the list always fits one frame. */
#define HELLO_LIST_BUDGET (PROTO_MAX_JSON - 1024u)

typedef struct Chunk {
        struct Chunk *next;
        size_t len, off;
        uint8_t data[];
} Chunk;

typedef enum StreamKind {
        STREAM_EXEC,
        STREAM_READ,
        STREAM_WRITE,
        STREAM_RELAY, /* a connection to the egress relay, opened by us */
        STREAM_FORWARD, /* a connection to a port inside, opened by the host (port forwarding) */
        STREAM_WATCH,   /* a file watch: its changes as NDJSON lines on fd 1 (agent/watch.h) */
} StreamKind;

enum { PIPE_IN, PIPE_OUT, PIPE_ERR, RELAY_SOCK };

/* An exec across a daemon's restart (docs/protocol.md, "Detach and attach"). */
typedef enum HoldState {
        HOLD_NONE,     /* output goes to the channel as credit allows */
        HOLD_DETACHED, /* no host: the pipes are read whatever the credit, into the held queue */
        HOLD_LISTED,   /* in an ATTACH's HELLO: silent, pipes unread, until the host's first WINDOW */
        HOLD_REPLAY,   /* the held bytes go out first; then HOLD_NONE */
} HoldState;

typedef struct HeldChunk {
        struct HeldChunk *next;
        uint8_t fd;
        size_t len, off; /* off: the bytes of it already sent */
        uint8_t data[];
} HeldChunk;

typedef struct Stream {
        uint32_t id;
        StreamKind kind;
        bool finished;     /* RESULT queued; freed at the end of the loop iteration */
        uint64_t credit;   /* DATA bytes the host still accepts from us */
        uint64_t in_held;  /* DATA bytes from the host not yet credited back */
        uint64_t in_ack;   /* consumed, waiting to go out as WINDOW */
        size_t queued_out; /* bytes of our DATA frames still in the channel queue */

        /* exec */
        pid_t pid;
        int fds[3]; /* stdin (write end), stdout, stderr (read ends); -1 closed */
        Chunk *in_head, *in_tail;
        bool in_eof;
        bool exited;
        int status;
        bool timed_out;
        bool group_killed;
        bool pty; /* fds[PIPE_IN] and fds[PIPE_OUT] are its master; no stderr */
        /* The host's last size of the terminal and the one before it, kept
         * until pty_guard_until_ms (0: no guard). */
        unsigned short pty_cols, pty_rows, pty_was_cols, pty_was_rows;
        uint64_t pty_guard_until_ms;
        bool sync_after; /* sync() before its RESULT (the request's syncAfter) */
        uint64_t oom_kills_before; /* limits_oom_kills() when it started */
        unsigned oom_killed;       /* processes of its group the agent's memory watch killed */
        uint64_t start_ms, end_ms;
        uint64_t deadline_ms;    /* timeout, 0 for none */
        uint64_t drain_until_ms; /* leader exited, pipes still open */
        uint64_t final_until_ms; /* group killed, last drain */
        json_t *tag;             /* the request's "tag", listed unread after an ATTACH; NULL for none */
        size_t list_cost;        /* of its entry in that list, counted in Agent.list_bytes */
        uint64_t out_sent;       /* DATA payload (fd 1 and 2) queued to the channel since the OPEN */
        uint64_t in_total;       /* DATA fd 0 bytes received from the host since the OPEN */
        uint64_t in_stale;       /* stdin queued for a host before an ATTACH: written, never credited */
        HoldState hold;
        /* Held output, oldest first: the newest bytes the process wrote,
         * from offset out_sent + held_dropped on. held_prev is the chunk
         * before held_tail (NULL when the tail is the head). */
        HeldChunk *held_head, *held_tail, *held_prev;
        uint64_t held_bytes;
        uint64_t held_cost;    /* held_bytes and the chunks' overhead: what the bounds count */
        uint64_t held_dropped; /* dropped for the bounds since the OPEN, over every detach */
        uint8_t held_eof;      /* bit per fd: its EOF waits for the held bytes to be out */

        /* read */
        int file_fd;
        /* watch */
        AgentWatch *watch;
        uint64_t sent;

        /* write: committed as the user it was begun as (-1: root) */
        FsWrite *write;
        int64_t write_uid, write_gid;

        /* relay: the client's socket; its bytes go out as DATA fd 0, the
         * host's DATA fd 1 is queued in in_head and written to it. */
        int sock;
        bool sock_eof;  /* the client sent everything (EOF fd 0 sent) */
        bool wr_shut;   /* the host sent everything and it was written */
        bool host_done; /* the proxy answered RESULT: finished once in_head is written */
        /* forward: the same socket fields, the directions of an exec (the
         * host's bytes are DATA fd 0, the program's DATA fd 1). */
        bool connecting; /* the non-blocking connect has not finished */
        bool orphan;     /* of the channel before a checkpoint; this is a copy */
} Stream;

typedef struct OutFrame {
        struct OutFrame *next;
        uint32_t data_stream; /* a DATA frame's stream, for its queued_out; else 0 */
        size_t len, off;
        uint8_t *buf;
} OutFrame;

struct Agent {
        int in_fd, out_fd, sig_fd;
        ProtoReader *reader;
        OutFrame *out_head, *out_tail;
        size_t out_bytes;
        Stream *streams[AGENT_MAX_STREAMS];
        size_t n_streams;
        bool quit;
        int exit_status;
        int relay_fd; /* listening on 127.0.0.1:AGENT_RELAY_PORT, or -1 */
        uint32_t next_even;
        int (*resume)(const AgentRequest *r); /* until the first request */
        int (*vm_resume)(const AgentRequest *r); /* what resume is armed with again by a checkpoint */
        /* `mount` and `unmount` of a live volume (agent_set_mounts). */
        int (*mount)(const char *name, const char *dest, bool read_only);
        int (*unmount)(const char *dest);
        /* After a checkpoint's answer: nothing is read or sent but the
         * channel until the host's next frame, so that a machine saved now
         * holds no frame half-sent or half-read, and its copy's channel
         * starts empty both ways. */
        bool quiet;
        bool checkpointed; /* a resume now comes from a copy of the saved machine */
        uint64_t memory_limit;   /* bytes, 0: the kernel enforces it alone */
        uint64_t next_memory_ms; /* when the watch looks again */
        bool memory_escalate;    /* killed at the last look: the next kills a group */
        uint64_t memory_at_kill; /* in use when the watch last killed */
        uint64_t memory_hold_ms; /* until then, no second kill while the count is not up since */
        pid_t doomed[AGENT_MAX_STREAMS]; /* killed process groups not yet seen gone */
        size_t n_doomed;
        uint64_t next_rekill_ms;
        /* Between a DETACH and an ATTACH: the host's daemon is away. */
        bool detached;
        uint64_t held_total; /* the held_cost of every stream */
        size_t list_bytes;   /* the list_cost of every exec */
};

json_t *agent_attach(Agent *a);
void agent_detach(Agent *a);
void agent_fatal(Agent *a, const char *why);
void agent_close_fd(int *fd);
void agent_consumed(Agent *a, Stream *s, size_t n, bool force);
void agent_drop_stdin(Agent *a, Stream *s);
void agent_exec_check(Agent *a, Stream *s, uint64_t now);
void agent_exec_kill(Agent *a, Stream *s);
void agent_finish_error(Agent *a, Stream *s, const char *code, const char *message);
ssize_t agent_hold_read(Agent *a, Stream *s, int which);
void agent_hold_pump(Agent *a, Stream *s);
void agent_hold_release(Agent *a, Stream *s);
void agent_hold_window(Agent *a, Stream *s);
void agent_log_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void agent_pipe_ended(Agent *a, Stream *s, int which);
void agent_pipe_readable(Agent *a, Stream *s, int which);
void agent_queue_frame(Agent *a, OutFrame *f, uint8_t type, uint32_t stream);
void agent_read_pump(Agent *a, Stream *s);
void agent_read_signals(Agent *a);
void agent_relay_accept(Agent *a);
void agent_relay_readable(Agent *a, Stream *s);
void agent_relay_shut_write(Stream *s);
void agent_relay_writable(Agent *a, Stream *s);
void agent_send_frame(Agent *a, uint8_t type, uint8_t flags, uint32_t stream, const void *payload, size_t len);
void agent_send_json_new(Agent *a, uint8_t type, uint32_t stream, json_t *j);
void agent_send_window(Agent *a, Stream *s, bool force);
void agent_stdin_writable(Agent *a, Stream *s);
/* The host's new size of a terminal's window, and the check that keeps it
 * (agent_io.c). */
void agent_pty_resize(Stream *s, unsigned cols, unsigned rows);
void agent_pty_guard(Stream *s, uint64_t now);
Stream *agent_stream_find(Agent *a, uint32_t id);
void agent_stream_free(Stream *s);
void agent_sweep(Agent *a);
