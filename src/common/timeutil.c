#include "common/timeutil.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

int64_t time_now_unix(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec;
}

int64_t time_now_unix_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t time_now_mono_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void time_mono_deadline(struct timespec *ret, int64_t ms) {
        clock_gettime(CLOCK_MONOTONIC, ret);
        if (ms < 0)
                ms = 0;
        ret->tv_sec += (time_t)(ms / 1000);
        ret->tv_nsec += (long)(ms % 1000) * 1000000L;
        if (ret->tv_nsec >= 1000000000L) {
                ret->tv_sec++;
                ret->tv_nsec -= 1000000000L;
        }
}

int time_cond_init_mono(pthread_cond_t *cond) {
        pthread_condattr_t attr;
        int r = pthread_condattr_init(&attr);
        if (r != 0)
                return -r;
        r = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        if (r == 0)
                r = pthread_cond_init(cond, &attr);
        pthread_condattr_destroy(&attr);
        return -r;
}

int time_format_rfc3339(int64_t t, char out[RFC3339_LEN]) {
        /* Years 0000..9999 only: anything else cannot be written in the format. */
        if (t < -62167219200LL || t > 253402300799LL)
                return -EINVAL;
        time_t tt = (time_t)t;
        struct tm tm;
        if (!gmtime_r(&tt, &tm))
                return -EINVAL;
        int n = snprintf(out, RFC3339_LEN, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900,
                         tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        if (n != RFC3339_LEN - 1)
                return -EINVAL;
        return 0;
}

int time_format_rfc3339_ms(int64_t t, int msec, char out[RFC3339_MS_LEN]) {
        char whole[RFC3339_LEN];
        if (msec < 0 || msec > 999)
                return -EINVAL;
        int r = time_format_rfc3339(t, whole);
        if (r < 0)
                return r;
        /* The whole second's text less its "Z", then ".mmmZ". */
        int n = snprintf(out, RFC3339_MS_LEN, "%.19s.%03dZ", whole, msec);
        return n == RFC3339_MS_LEN - 1 ? 0 : -EINVAL;
}
