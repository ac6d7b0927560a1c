#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* jansson (>= 2.9) provides json_decrefp for exactly this use. */
#define _cleanup_json_ __attribute__((cleanup(json_decrefp)))

/* Counts the nesting of a JSON text without parsing it (strings and escapes
 * honoured), so that a deep document is refused before any parser recurses.
 * true when the depth never passes max. Used on every JSON text a client or
 * a sandbox sends: request bodies, channel frames, the agent's requests. */
bool json_depth_ok(const void *buf, size_t len, unsigned max);
/* A Unix time as an RFC 3339 UTC string; 0 (never) or an unformattable time
 * as null. */
json_t *json_time_or_null(int64_t t);
/* The same with the millisecond msec (0..999) within t's second:
 * "2026-11-30T09:00:00.123Z". */
json_t *json_time_ms_or_null(int64_t t, int msec);
