#pragma once
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* "2026-11-30T09:00:00Z" plus NUL. */
#define RFC3339_LEN 21

int64_t time_now_unix(void);
/* The same clock in milliseconds: time_now_unix_ms() / 1000 is the second
 * time_now_unix() would have read. */
int64_t time_now_unix_ms(void);
/* Milliseconds of CLOCK_MONOTONIC, for durations. */
uint64_t time_now_mono_ms(void);
/* The CLOCK_MONOTONIC time ms milliseconds from now, as the absolute
 * deadline of pthread_cond_timedwait on a condition made by
 * time_cond_init_mono (a wall clock set back must not stretch a wait). */
void time_mono_deadline(struct timespec *ret, int64_t ms);
/* Initialises a condition variable whose timed waits run on
 * CLOCK_MONOTONIC. 0 or a negative errno. */
int time_cond_init_mono(pthread_cond_t *cond);
/* Formats unix seconds as an RFC 3339 UTC string. -EINVAL when the time does
 * not fit a four-digit year. */
int time_format_rfc3339(int64_t t, char out[RFC3339_LEN]);
/* "2026-11-30T09:00:00.123Z" plus NUL. */
#define RFC3339_MS_LEN 25
/* Unix seconds t and the millisecond msec (0..999) within them, as an RFC
 * 3339 UTC string with milliseconds. -EINVAL as above, or for msec out of
 * range. */
int time_format_rfc3339_ms(int64_t t, int msec, char out[RFC3339_MS_LEN]);
