#pragma once
/*
 * The last lines of a sandbox's console (a guest kernel's serial output, kept
 * by its driver), made fit for a failure reason: the guest controls every
 * byte of it, so control characters and invalid UTF-8 are replaced and the
 * size is bounded before it reaches the API's JSON or the log.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* At most this many lines and bytes (NUL excluded) are kept. */
#define CONSOLE_TAIL_LINES 8u
#define CONSOLE_TAIL_MAX 1024u
/* How much of the end of the file is read to find them. */
#define CONSOLE_TAIL_READ (8u * 1024u)

/* The last `max_lines` non-blank lines of `in` (lines end at '\n' or '\r'),
 * joined with '\n', into out (NUL-terminated, valid UTF-8, no control
 * character but those '\n'). Tabs become spaces, other control characters
 * (C0, DEL, C1) '?', bytes that are not valid UTF-8 U+FFFD. When the result
 * would exceed out_size - 1 bytes the oldest part is dropped, at a character
 * boundary and, where one exists, after a line break. A kernel's crash line
 * ("Kernel panic", "BUG: ", "Oops", ...) older than those lines takes the
 * first of them, so that the reason survives the register dump printed
 * after it (it gets at most a quarter of the room). With `partial_first`
 * the first line of `in` is taken as the cut end of a longer one and skipped
 * (unless it is the only line). Returns the length written. */
size_t console_tail_sanitize(const uint8_t *in, size_t n, unsigned max_lines, bool partial_first, char *out,
                             size_t out_size);

/* Reads the end of the regular file `name` in the directory `dir` (no
 * symlink followed) and sanitizes it into out. 0 with *out possibly empty,
 * or a negative errno (-ENOENT when there is no such file). */
int console_tail_read(const char *dir, const char *name, char *out, size_t out_size);
