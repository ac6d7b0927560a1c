#pragma once
/* A growing byte buffer with a bound, and the NDJSON line splitter that the
 * streamed answers (exec output, image build logs) go through. */
#include <stdbool.h>
#include <stddef.h>

typedef struct ByteBuf {
        char *data; /* NUL-terminated when not NULL */
        size_t len, cap;
        size_t scanned; /* bytes known to hold no '\n', so a long line is not searched again */
} ByteBuf;

/* Appends; -EFBIG when len would pass limit, -ENOMEM. */
int bytebuf_append(ByteBuf *b, const void *data, size_t len, size_t limit);
void bytebuf_done(ByteBuf *b);

typedef int (*LineFn)(const char *line, size_t len, void *userdata);

/* Hands every complete line in b to fn (without its '\n'; empty lines are
 * skipped) and drops them from b. With final, an unterminated last line is
 * handed on too. Stops at, and returns, fn's first negative value. */
int ndjson_take_lines(ByteBuf *b, bool final, LineFn fn, void *userdata);
