#pragma once
/*
 * Exec output as the API hands it out: JSON strings must be valid UTF-8, so
 * every invalid byte becomes U+FFFD; a buffered reply keeps the last N bytes
 * of a stream (errors and results come at the end); a streamed reply never
 * splits a character across two events.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the well-formed UTF-8 sequence starting at p, 0 when p[0]
 * cannot start one here (an invalid byte), -1 when the bytes so far are a
 * valid prefix but avail ends before the sequence does. avail >= 1. */
int utf8_seq_len(const uint8_t *p, size_t avail);

/* A malloc'ed, NUL-terminated copy of buf with each byte that is not part of
 * a well-formed sequence replaced by U+FFFD. NULL on ENOMEM. */
char *utf8_sanitize(const uint8_t *buf, size_t len, size_t *ret_len);

/* Keeps the last `cap` bytes appended; grows on demand up to cap. */
typedef struct TailBuf {
        uint8_t *buf;
        size_t cap;   /* bytes kept at most */
        size_t alloc; /* bytes allocated */
        size_t start; /* ring start once full */
        size_t len;   /* bytes held */
        uint64_t total;
        bool truncated; /* some output was dropped */
} TailBuf;

void tailbuf_init(TailBuf *t, size_t cap);
/* -ENOMEM (the buffer is then unchanged). */
int tailbuf_append(TailBuf *t, const void *data, size_t n);
/* The kept bytes as sanitized text (malloc'ed, NUL-terminated). When output
 * was dropped, a character cut at the start of the kept tail is dropped
 * rather than shown as U+FFFD: the cut is ours, not the program's. */
char *tailbuf_text(const TailBuf *t, size_t *ret_len);
void tailbuf_done(TailBuf *t);

/* Holds back an incomplete character at the end of a chunk until the next
 * chunk completes it (at most 3 bytes). */
typedef struct Utf8Holder {
        uint8_t pending[4];
        size_t n;
} Utf8Holder;

/* Sanitized text of every complete character in pending+data (may be empty,
 * *ret_len 0). 0 or -ENOMEM. */
int utf8_holder_feed(Utf8Holder *h, const uint8_t *data, size_t len, char **ret, size_t *ret_len);
/* Whatever is held, as sanitized text (the held bytes never completed). */
int utf8_holder_flush(Utf8Holder *h, char **ret, size_t *ret_len);

/* A stream's pending NDJSON lines: bytes [off, len) of buf are still to be
 * sent; the buffer restarts when all of it was. */
typedef struct LineQueue {
        char *buf;
        size_t off, len, cap;
} LineQueue;

/* Appends the compact JSON of j and a newline; steals j (NULL is ENOMEM). */
int line_queue_push(LineQueue *q, json_t *j);
