/* A volume backup policy's cron schedule and keep counts
 * (daemon/model/backup_policy.h): every form of a field is read, each bad
 * field is refused naming it, the next time crosses month ends, finds
 * February 29 and follows the day-of-month / day-of-week rule; the keep
 * counts keep the newest of each period and nothing more. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "daemon/model/backup_policy.h"

static int64_t at(int y, int mo, int d, int h, int mi) {
        struct tm tm = { .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi };
        return (int64_t)timegm(&tm);
}

static CronSchedule parsed(const char *text) {
        CronSchedule c;
        CronField f;
        assert_int_equal(cron_parse(text, &c, &f), 0);
        return c;
}

static int64_t next_of(const char *text, int64_t after) {
        CronSchedule c = parsed(text);
        int64_t t = 0;
        assert_int_equal(cron_next(&c, after, &t), 0);
        return t;
}

static void test_fields(void **state) {
        CronSchedule c = parsed("*/15 1-5 1,15 jan-mar mon-fri");
        assert_true(c.minutes == ((1ull << 0) | (1ull << 15) | (1ull << 30) | (1ull << 45)));
        assert_int_equal(c.hours, 0x3e);
        assert_int_equal(c.days, (1u << 1) | (1u << 15));
        assert_int_equal(c.months, 0xe);
        assert_int_equal(c.weekdays, 0x3e);
        assert_true(c.days_restricted && c.weekdays_restricted);
        c = parsed("  0,30\t*  * * *  ");
        assert_true(c.minutes == ((1ull << 0) | (1ull << 30)));
        assert_int_equal(c.hours, 0xffffff);
        assert_false(c.days_restricted || c.weekdays_restricted);
        /* 7 is Sunday; names in any case; a/n runs to the field's end; a-b/n. */
        c = parsed("5/20 0-12/6 * DEC 5-7");
        assert_true(c.minutes == ((1ull << 5) | (1ull << 25) | (1ull << 45)));
        assert_int_equal(c.hours, (1u << 0) | (1u << 6) | (1u << 12));
        assert_int_equal(c.months, 1u << 12);
        assert_int_equal(c.weekdays, (1u << 5) | (1u << 6) | (1u << 0));
        c = parsed("59 23 31 * sun,sat");
        assert_true(c.minutes == 1ull << 59);
        assert_int_equal(c.weekdays, (1u << 0) | (1u << 6));
}

static void refused(const char *text, CronField want) {
        CronSchedule c;
        CronField f = CRON_MINUTE;
        assert_int_equal(cron_parse(text, &c, &f), -EINVAL);
        if (f != want)
                fail_msg("\"%s\": field %s, not %s", text, cron_field_name(f), cron_field_name(want));
}

static void test_bad_input(void **state) {
        refused("", CRON_WHOLE);
        refused("* * * *", CRON_WHOLE);
        refused("* * * * * *", CRON_WHOLE);
        refused("@daily", CRON_WHOLE);
        char longer[CRON_TEXT_MAX + 8];
        memset(longer, '0', sizeof longer - 1);
        longer[sizeof longer - 1] = '\0';
        refused(longer, CRON_WHOLE);
        refused("60 * * * *", CRON_MINUTE);
        refused("-1 * * * *", CRON_MINUTE);
        refused("*/0 * * * *", CRON_MINUTE);
        refused("*/61 * * * *", CRON_MINUTE);
        refused("1,,2 * * * *", CRON_MINUTE);
        refused("1, * * * *", CRON_MINUTE);
        refused(",1 * * * *", CRON_MINUTE);
        refused("005 * * * *", CRON_MINUTE);
        refused("jan * * * *", CRON_MINUTE);
        refused("*-5 * * * *", CRON_MINUTE);
        refused("1/ * * * *", CRON_MINUTE);
        refused("0 24 * * *", CRON_HOUR);
        refused("0 5-3 * * *", CRON_HOUR);
        refused("0 x * * *", CRON_HOUR);
        refused("0 0 0 * *", CRON_DAY_OF_MONTH);
        refused("0 0 32 * *", CRON_DAY_OF_MONTH);
        refused("0 0 * 13 *", CRON_MONTH);
        refused("0 0 * janu *", CRON_MONTH);
        refused("0 0 * 0 *", CRON_MONTH);
        refused("0 0 * * 8", CRON_DAY_OF_WEEK);
        refused("0 0 * * mon-", CRON_DAY_OF_WEEK);
        refused("0 0 * * sunday", CRON_DAY_OF_WEEK);
        refused("0 0 * * 1\xff", CRON_DAY_OF_WEEK);
        /* Days no month of the schedule has: it would never run. */
        refused("0 0 30 2 *", CRON_DAY_OF_MONTH);
        refused("0 0 31 apr,jun,sep,nov *", CRON_DAY_OF_MONTH);
        /* ... unless the weekdays may match alone. */
        parsed("0 0 30 2 mon");
        assert_string_equal(cron_field_name(CRON_DAY_OF_MONTH), "day-of-month");
        assert_string_equal(cron_field_name(CRON_WHOLE), "cron");
}

static void test_next(void **state) {
        /* Strictly after, to the minute. */
        assert_int_equal(next_of("* * * * *", at(2026, 1, 1, 0, 0)), at(2026, 1, 1, 0, 1));
        assert_int_equal(next_of("* * * * *", at(2026, 1, 1, 0, 0) + 59), at(2026, 1, 1, 0, 1));
        assert_int_equal(next_of("*/15 * * * *", at(2026, 1, 1, 10, 7)), at(2026, 1, 1, 10, 15));
        assert_int_equal(next_of("0 3 * * *", at(2026, 1, 1, 3, 0)), at(2026, 1, 2, 3, 0));
        /* Month and year ends. */
        assert_int_equal(next_of("30 23 31 * *", at(2026, 4, 1, 0, 0)), at(2026, 5, 31, 23, 30));
        assert_int_equal(next_of("0 0 1 * *", at(2026, 12, 31, 23, 59)), at(2027, 1, 1, 0, 0));
        assert_int_equal(next_of("0 0 31 * *", at(2023, 1, 31, 0, 0)), at(2023, 3, 31, 0, 0));
        /* February 29: the next leap year; 2100 is not one. */
        assert_int_equal(next_of("0 12 29 2 *", at(2024, 3, 1, 0, 0)), at(2028, 2, 29, 12, 0));
        assert_int_equal(next_of("0 12 29 2 *", at(2024, 2, 28, 12, 0)), at(2024, 2, 29, 12, 0));
        assert_int_equal(next_of("0 0 29 feb *", at(2096, 3, 1, 0, 0)), at(2104, 2, 29, 0, 0));
        /* Both day fields restricted: either matches (the 13th or a Friday). */
        assert_int_equal(next_of("0 0 13 * fri", at(2026, 12, 6, 0, 0)), at(2026, 12, 11, 0, 0));
        assert_int_equal(next_of("0 0 13 * fri", at(2026, 12, 11, 0, 0)), at(2026, 12, 13, 0, 0));
        /* One restricted, the other '*': only it. */
        assert_int_equal(next_of("0 0 13 * *", at(2026, 12, 6, 0, 0)), at(2026, 12, 13, 0, 0));
        assert_int_equal(next_of("0 0 * * fri", at(2026, 12, 6, 0, 0)), at(2026, 12, 11, 0, 0));
        /* A step on '*' leaves the field unrestricted: both must match (the
         * first Sunday on an odd day is Dec 13). */
        assert_int_equal(next_of("0 0 */2 * sun", at(2026, 12, 6, 1, 0)), at(2026, 12, 13, 0, 0));
        /* Weekdays at 9:30 from a Friday evening: Monday. 7 is Sunday. */
        assert_int_equal(next_of("30 9 * * mon-fri", at(2026, 12, 4, 18, 0)), at(2026, 12, 7, 9, 30));
        assert_int_equal(next_of("0 0 * * 7", at(2026, 12, 1, 0, 0)), at(2026, 12, 6, 0, 0));
        /* Hour and minute roll over within the day and past it. */
        assert_int_equal(next_of("10 5,17 * * *", at(2026, 6, 1, 5, 11)), at(2026, 6, 1, 17, 10));
        assert_int_equal(next_of("10 5,17 * * *", at(2026, 6, 1, 17, 10)), at(2026, 6, 2, 5, 10));
}

static void keep_of(const BackupKeep *k, const int64_t *t, size_t n, const char *want) {
        bool got[16];
        backup_keep_select(k, t, n, got);
        char s[17] = { 0 };
        for (size_t i = 0; i < n; i++)
                s[i] = got[i] ? 'k' : '-';
        assert_string_equal(s, want);
}

static void test_keep(void **state) {
        BackupKeep none = { 0 };
        assert_false(backup_keep_any(&none));
        /* Newest first: three this hour, two the hour before, one yesterday,
         * one the week before, one a month before, one a year before. */
        const int64_t t[] = { at(2026, 12, 6, 10, 50), at(2026, 12, 6, 10, 20), at(2026, 12, 6, 10, 0),
                              at(2026, 12, 6, 9, 40),  at(2026, 12, 6, 9, 10),  at(2026, 12, 5, 23, 0),
                              at(2026, 11, 29, 8, 0),  at(2026, 11, 1, 8, 0),   at(2025, 12, 1, 8, 0) };
        size_t n = sizeof t / sizeof t[0];
        keep_of(&(BackupKeep){ .last = 2 }, t, n, "kk-------");
        keep_of(&(BackupKeep){ .last = 20 }, t, n, "kkkkkkkkk");
        keep_of(&(BackupKeep){ .hourly = 2 }, t, n, "k--k-----");
        keep_of(&(BackupKeep){ .hourly = 24 }, t, n, "k--k-kkkk");
        keep_of(&(BackupKeep){ .daily = 2 }, t, n, "k----k---");
        /* Sunday Nov 29 ends the ISO week before Monday Nov 30's; Dec 5-6
         * are one week. */
        keep_of(&(BackupKeep){ .weekly = 2 }, t, n, "k-----k--");
        keep_of(&(BackupKeep){ .monthly = 3 }, t, n, "k-----k-k");
        keep_of(&(BackupKeep){ .yearly = 5 }, t, n, "k-------k");
        /* Rules add up: a backup any of them keeps stays. */
        keep_of(&(BackupKeep){ .last = 1, .hourly = 2, .yearly = 2 }, t, n, "k--k----k");
        /* ISO weeks across a year's end: Thu Dec 31 2020 and Mon Jan 4 2021
         * are different weeks; Sun Jan 3 2021 is in 2020-W53. */
        const int64_t y[] = { at(2021, 1, 4, 0, 0), at(2021, 1, 3, 0, 0), at(2020, 12, 31, 0, 0),
                              at(2020, 12, 28, 0, 0) };
        keep_of(&(BackupKeep){ .weekly = 5 }, y, 4, "kk--");
        keep_of(&(BackupKeep){ .yearly = 5 }, y, 4, "k-k-");
        keep_of(&(BackupKeep){ .monthly = 1 }, y, 4, "k---");
        keep_of(&(BackupKeep){ .daily = 1 }, y, 0, "");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fields),
                cmocka_unit_test(test_bad_input),
                cmocka_unit_test(test_next),
                cmocka_unit_test(test_keep),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
