#pragma once
/*
 * A request head on the preview listener, parsed strictly (RFC 9112): a
 * preview relays requests to a server in a sandbox, and a head that two
 * parsers could read two ways (a request smuggled past the check of the
 * first) is refused, never repaired. Refused: anything but CRLF line ends,
 * obs-fold, a space before a header's colon, control characters, a target
 * not in origin form, HTTP versions but 1.0 and 1.1, no Host or more than
 * one, more than one Content-Length or one that is not a plain number,
 * Transfer-Encoding with Content-Length, or other than a lone "chunked".
 * Pure: no I/O, no allocation.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PREVIEW_HEAD_MAX (16u * 1024u)
#define PREVIEW_HEAD_MAX_FIELDS 100u

typedef struct PreviewSpan {
        const char *p;
        size_t n;
} PreviewSpan;

typedef struct PreviewHead {
        size_t head_len; /* the bytes of the head, the blank line included */
        PreviewSpan method, target;
        bool http10;
        PreviewSpan host;        /* its value, port included */
        int64_t content_length;  /* -1: none */
        bool chunked;
        bool upgrade;            /* Upgrade with Connection: upgrade */
        bool close;              /* Connection: close, or HTTP/1.0 without keep-alive */
        PreviewSpan token;       /* x-runtime-preview-token; n 0: none */
        /* Where each header line starts and its length (CRLF excluded), for
         * a relay that drops some. */
        PreviewSpan fields[PREVIEW_HEAD_MAX_FIELDS];
        size_t n_fields;
} PreviewHead;

/* 0 and *ret for a whole head at the start of buf; -EAGAIN when more bytes
 * may complete it; -EMSGSIZE past PREVIEW_HEAD_MAX; -EINVAL (400) or
 * -ENOTSUP (501: a transfer coding other than chunked; 505 for a version)
 * with a reason in *ret_why. */
int preview_head_parse(const char *buf, size_t len, PreviewHead *ret, const char **ret_why);

/* Whether the field (a header line) is named name, case-insensitively. */
bool preview_field_is(PreviewSpan field, const char *name);
/* The field's value, without the optional white space around it. */
PreviewSpan preview_field_value(PreviewSpan field);

/* A chunked body's framing, fed byte runs: how far the body goes. */
typedef enum PreviewChunkState {
        CHUNK_SIZE,
        CHUNK_EXT,
        CHUNK_SIZE_LF,
        CHUNK_DATA,
        CHUNK_DATA_CR,
        CHUNK_DATA_LF,
        CHUNK_TRAILER,    /* at the start of a trailer line */
        CHUNK_TRAILER_LINE,
        CHUNK_TRAILER_LF,
        CHUNK_END_LF,
        CHUNK_DONE,
} PreviewChunkState;

typedef struct PreviewChunked {
        PreviewChunkState state;
        uint64_t size;  /* of the chunk being read */
        unsigned digits;
        size_t line;    /* bytes of the extension or trailer line so far */
} PreviewChunked;

/* The bytes of buf that belong to the body (<= len; the body ended when
 * state is CHUNK_DONE), or -EINVAL for a malformed one. */
ssize_t preview_chunked_feed(PreviewChunked *c, const char *buf, size_t len);
