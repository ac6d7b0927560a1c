#pragma once
#include <stddef.h>
#include <stdint.h>

/* "2026-11-30T09:00:00Z" plus NUL. */
#define RFC3339_LEN 21

int64_t time_now_unix(void);
/* Milliseconds of CLOCK_MONOTONIC, for durations. */
uint64_t time_now_mono_ms(void);
/* Formats unix seconds as an RFC 3339 UTC string. -EINVAL when the time does
 * not fit a four-digit year. */
int time_format_rfc3339(int64_t t, char out[RFC3339_LEN]);
