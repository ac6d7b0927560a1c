/*
 * libFuzzer target for a volume backup policy's cron text, which any key
 * holder sends: the input is the text (cut at its first NUL, as a JSON
 * string cannot carry one). Whatever cron_parse takes must then give a next
 * time after each of a few starting points that is on a minute, later than
 * the start, on a minute, hour and month the schedule has, and the same
 * again when asked from one second before it.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/model/backup_policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char text[CRON_TEXT_MAX + 64];
        size_t n = size < sizeof text - 1 ? size : sizeof text - 1;
        memcpy(text, data, n);
        text[n] = '\0';
        CronSchedule c;
        CronField f;
        if (cron_parse(text, &c, &f) < 0) {
                if (f > CRON_WHOLE)
                        abort();
                return 0;
        }
        static const int64_t starts[] = { 0, 951782400 /* 2000-02-29 */, 1798761599 /* 2026-12-31 23:59:59 */,
                                          4107542340 /* 2100-02-28 23:59 */ };
        for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) {
                int64_t t = 0, again = 0;
                if (cron_next(&c, starts[i], &t) < 0)
                        continue; /* a day-of-month and weekday that both must match may fall rarely */
                time_t tt = (time_t)t;
                struct tm tm;
                if (t <= starts[i] || t % 60 != 0 || !gmtime_r(&tt, &tm))
                        abort();
                if (!(c.minutes >> tm.tm_min & 1) || !(c.hours >> tm.tm_hour & 1) || !(c.months >> (tm.tm_mon + 1) & 1))
                        abort();
                if (cron_next(&c, t - 1, &again) < 0 || again != t)
                        abort();
        }
        return 0;
}
