#pragma once
/*
 * The agent channel: one framed, multiplexed protocol over any byte stream
 * (a socketpair for the namespace driver, stdio for gVisor, a virtio-serial
 * port for the microVM). docs/protocol.md is the prose version of this file.
 *
 * Every frame is a 12-byte header followed by `length` payload bytes:
 *
 *   u32 length  (big-endian, payload bytes, <= PROTO_MAX_PAYLOAD)
 *   u32 stream  (big-endian; 0 is the channel itself)
 *   u8  type    (ProtoType)
 *   u8  flags   (for DATA/EOF: the ProtoFd the bytes belong to; else 0)
 *   u16 reserved, must be 0
 *
 * Streams opened by the host have odd ids, streams opened by the agent (egress
 * relay connections) have even ids, so the two sides never collide.
 *
 * Flow control: each side may have at most PROTO_INITIAL_WINDOW bytes of DATA
 * payload in flight per stream and direction; the receiver hands credit back
 * with WINDOW frames as it consumes. A slow reader stalls only its own stream.
 */
#include <stddef.h>
#include <stdint.h>

#define PROTO_VERSION 1
#define PROTO_HEADER_SIZE 12u
/* A frame is at most this big; anything larger is malformed and closes the
 * channel. Large enough for 256 KiB of file data per frame, small enough that
 * a hostile peer cannot make us allocate much. */
#define PROTO_MAX_PAYLOAD (256u * 1024u)
#define PROTO_INITIAL_WINDOW (1024u * 1024u)
/* Control payloads (JSON) are much smaller than data frames. */
#define PROTO_MAX_JSON (64u * 1024u)
#define PROTO_MAX_DETACH_TOKEN 32u

typedef enum ProtoType {
        PROTO_HELLO = 1,  /* agent -> host, stream 0, JSON {"version","pid",...} */
        PROTO_OPEN = 2,   /* opener -> peer, JSON request, starts a stream */
        PROTO_DATA = 3,   /* bytes; flags = ProtoFd */
        PROTO_EOF = 4,    /* sender will send no more DATA for fd `flags` */
        PROTO_WINDOW = 5, /* payload: u32 BE credit for DATA in the other direction */
        PROTO_EVENT = 6,  /* agent -> host JSON, mid-stream (e.g. exec "start") */
        PROTO_RESULT = 7, /* JSON, the last frame of a stream from the responder */
        PROTO_CANCEL = 8, /* abort the stream (kills an exec's process group) */
        PROTO_PING = 9,   /* stream 0; payload echoed back in PONG */
        PROTO_PONG = 10,
        /* stream 0: the host's side of the channel says the daemon went
         * away (the sandbox's supervisor, no payload), or a daemon taking
         * the channel over marks where its frames begin (a token of up to
         * PROTO_MAX_DETACH_TOKEN bytes, which the agent echoes back in a
         * DETACH of its own after everything it sent before). The agent
         * keeps its processes running and holds their output (bounded)
         * until an ATTACH; every other stream ends without a frame. */
        PROTO_DETACH = 11,
        /* host -> agent, stream 0, JSON {}: a daemon takes the channel over.
         * The agent answers a HELLO whose "attached" lists the processes it
         * kept; each sends nothing until the host's first WINDOW on it. */
        PROTO_ATTACH = 12,
        _PROTO_TYPE_MAX,
} ProtoType;

typedef enum ProtoFd {
        PROTO_FD_IN = 0,  /* stdin of an exec, body of a file write, bytes to an egress peer */
        PROTO_FD_OUT = 1, /* stdout of an exec, content of a file read, bytes from an egress peer */
        PROTO_FD_ERR = 2, /* stderr of an exec */
} ProtoFd;

typedef struct ProtoHeader {
        uint32_t length;
        uint32_t stream;
        uint8_t type;
        uint8_t flags;
} ProtoHeader;

/* Writes the 12 header bytes. -EINVAL for an invalid type or a too large length. */
int proto_header_encode(const ProtoHeader *h, uint8_t out[PROTO_HEADER_SIZE]);

/* Parses and validates 12 header bytes: known type, length within bounds
 * (PROTO_MAX_JSON for JSON-carrying types, 4 for WINDOW, PROTO_MAX_PAYLOAD for
 * DATA), flags <= PROTO_FD_ERR for DATA/EOF and 0 elsewhere, reserved 0,
 * stream 0 exactly for HELLO/PING/PONG. -EPROTO when malformed. */
int proto_header_decode(const uint8_t in[PROTO_HEADER_SIZE], ProtoHeader *ret);

/*
 * Incremental reader for a byte stream: feed it whatever read() returned, then
 * take whole frames out. It never holds more than one frame plus one read's
 * worth of bytes.
 */
typedef struct ProtoReader ProtoReader;

ProtoReader *proto_reader_new(void);
void proto_reader_free(ProtoReader *r);
/* -EPROTO once the stream is malformed (sticky), -ENOMEM. */
int proto_reader_feed(ProtoReader *r, const void *buf, size_t n);
/* 1 and a frame (payload valid until the next call), 0 when more bytes are
 * needed, -EPROTO when malformed. */
int proto_reader_next(ProtoReader *r, ProtoHeader *ret_header, const uint8_t **ret_payload);

/* Header + payload into one buffer of PROTO_HEADER_SIZE + len bytes, malloc'ed.
 * -EINVAL on bad arguments, -ENOMEM. */
int proto_frame_build(uint8_t type, uint8_t flags, uint32_t stream, const void *payload, size_t len,
                      uint8_t **ret_buf, size_t *ret_len);

/* Writes a whole frame to a blocking fd, retrying on EINTR and short writes. */
int proto_write_frame(int fd, uint8_t type, uint8_t flags, uint32_t stream, const void *payload,
                      size_t len);

/* u32 big-endian helpers for WINDOW payloads. */
void proto_put_u32(uint8_t out[4], uint32_t v);
uint32_t proto_get_u32(const uint8_t in[4]);

const char *proto_type_name(uint8_t type);

/* The exit codes of the agent's archive child (REQ_ARCHIVE, REQ_UNARCHIVE),
 * which the daemon maps onto the API's errors. */
enum {
        ARCHIVE_EXIT_OK = 0,
        ARCHIVE_EXIT_FAILED = 1,
        ARCHIVE_EXIT_NOT_FOUND = 2,
        ARCHIVE_EXIT_NOT_A_DIRECTORY = 3,
        ARCHIVE_EXIT_MALFORMED = 4,
        ARCHIVE_EXIT_REFUSED = 5,
        ARCHIVE_EXIT_TOO_LARGE = 6,
        ARCHIVE_EXIT_PERMISSION = 7, /* EACCES: the user it runs as may not */
        ARCHIVE_EXIT_NO_SPACE = 8,   /* ENOSPC, EDQUOT: the sandbox's disk is full */
};
