/* A backup policy's cron schedule and keep counts (backup_policy.h).
 *
 * The cron reader is the project's own: Debian packages cron daemons, whose
 * parsers are not libraries, and no packaged C library reads a cron line
 * into something a program can ask for its next time. */
#include "daemon/model/backup_policy.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>
#include <strings.h>

#define DAY_SECONDS 86400

static const char *const field_names[] = { "minute", "hour", "day-of-month", "month", "day-of-week", "cron" };

const char *cron_field_name(CronField f) {
        return f <= CRON_WHOLE ? field_names[f] : "cron";
}

static const char *const month_names[] = { "jan", "feb", "mar", "apr", "may", "jun",
                                           "jul", "aug", "sep", "oct", "nov", "dec" };
static const char *const weekday_names[] = { "sun", "mon", "tue", "wed", "thu", "fri", "sat" };

typedef struct FieldShape {
        unsigned min, max;
        const char *const *names; /* names[i] is min + i; NULL: numbers only */
        size_t n_names;
} FieldShape;

static const FieldShape shapes[CRON_FIELDS] = {
        [CRON_MINUTE] = { 0, 59, NULL, 0 },
        [CRON_HOUR] = { 0, 23, NULL, 0 },
        [CRON_DAY_OF_MONTH] = { 1, 31, NULL, 0 },
        [CRON_MONTH] = { 1, 12, month_names, 12 },
        /* 7 is Sunday as well as 0, as in every cron. */
        [CRON_DAY_OF_WEEK] = { 0, 7, weekday_names, 7 },
};

/* A number (at most two digits: every field's values have two) or a name
 * of the field, from *s up to end; *s moves past it. */
static int read_value(const FieldShape *sh, const char **s, const char *end, unsigned *ret) {
        const char *p = *s;
        if (p < end && isdigit((unsigned char)*p)) {
                unsigned v = 0;
                size_t digits = 0;
                while (p < end && isdigit((unsigned char)*p) && digits < 3) {
                        v = v * 10 + (unsigned)(*p++ - '0');
                        digits++;
                }
                if (digits > 2 || v < sh->min || v > sh->max)
                        return -EINVAL;
                *s = p;
                *ret = v;
                return 0;
        }
        if (!sh->names || end - p < 3)
                return -EINVAL;
        for (size_t i = 0; i < sh->n_names; i++)
                if (strncasecmp(p, sh->names[i], 3) == 0 && (end - p == 3 || !isalpha((unsigned char)p[3]))) {
                        *s = p + 3;
                        *ret = sh->min + (unsigned)i;
                        return 0;
                }
        return -EINVAL;
}

/* One item of a list: '*', a, a-b, each with an optional /step. */
static int read_item(const FieldShape *sh, const char *s, const char *end, uint64_t *bits) {
        unsigned lo = sh->min, hi = sh->max, step = 1;
        bool single = false;
        if (s < end && *s == '*')
                s++;
        else {
                if (read_value(sh, &s, end, &lo) < 0)
                        return -EINVAL;
                hi = lo;
                single = true;
                if (s < end && *s == '-') {
                        s++;
                        if (read_value(sh, &s, end, &hi) < 0 || hi < lo)
                                return -EINVAL;
                        single = false;
                }
        }
        if (s < end && *s == '/') {
                s++;
                unsigned v = 0;
                size_t digits = 0;
                while (s < end && isdigit((unsigned char)*s) && digits < 3) {
                        v = v * 10 + (unsigned)(*s++ - '0');
                        digits++;
                }
                if (digits == 0 || digits > 2 || v == 0 || v > sh->max - sh->min + 1)
                        return -EINVAL;
                step = v;
                if (single) /* a/n: from a to the field's end */
                        hi = sh->max;
        }
        if (s != end)
                return -EINVAL;
        for (unsigned v = lo; v <= hi; v += step)
                *bits |= 1ull << (sh == &shapes[CRON_DAY_OF_WEEK] && v == 7 ? 0 : v);
        return 0;
}

static int read_field(CronField f, const char *s, const char *end, uint64_t *ret) {
        uint64_t bits = 0;
        while (s < end) {
                const char *comma = memchr(s, ',', (size_t)(end - s));
                const char *item_end = comma ? comma : end;
                if (item_end == s || read_item(&shapes[f], s, item_end, &bits) < 0)
                        return -EINVAL;
                if (comma && comma + 1 == end) /* a list that ends in a comma */
                        return -EINVAL;
                s = comma ? comma + 1 : end;
        }
        *ret = bits;
        return 0;
}

static bool is_leap(int64_t y) {
        return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static unsigned month_days(int64_t y, unsigned m) {
        static const unsigned days[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        return m == 2 && is_leap(y) ? 29 : days[m - 1];
}

int cron_parse(const char *text, CronSchedule *ret, CronField *ret_field) {
        *ret_field = CRON_WHOLE;
        if (!text || strnlen(text, CRON_TEXT_MAX + 1) > CRON_TEXT_MAX)
                return -EINVAL;
        const char *start[CRON_FIELDS + 1], *end[CRON_FIELDS + 1];
        size_t n = 0;
        for (const char *p = text; *p;) {
                if (*p == ' ' || *p == '\t') {
                        p++;
                        continue;
                }
                if (n == CRON_FIELDS)
                        return -EINVAL; /* a sixth field */
                start[n] = p;
                while (*p && *p != ' ' && *p != '\t')
                        p++;
                end[n++] = p;
        }
        if (n != CRON_FIELDS)
                return -EINVAL;
        uint64_t bits[CRON_FIELDS];
        for (size_t f = 0; f < CRON_FIELDS; f++)
                if (read_field((CronField)f, start[f], end[f], &bits[f]) < 0) {
                        *ret_field = (CronField)f;
                        return -EINVAL;
                }
        CronSchedule c = { .minutes = bits[CRON_MINUTE], .hours = (uint32_t)bits[CRON_HOUR],
                           .days = (uint32_t)bits[CRON_DAY_OF_MONTH], .months = (uint16_t)bits[CRON_MONTH],
                           .weekdays = (uint8_t)bits[CRON_DAY_OF_WEEK],
                           .days_restricted = *start[CRON_DAY_OF_MONTH] != '*',
                           .weekdays_restricted = *start[CRON_DAY_OF_WEEK] != '*' };
        /* Unless the weekdays may match alone, some month of the schedule
         * must have one of its days (a leap year's February 29 counts). */
        if (!(c.days_restricted && c.weekdays_restricted)) {
                bool some = false;
                for (unsigned m = 1; m <= 12 && !some; m++)
                        for (unsigned d = 1; d <= month_days(2000, m) && !some; d++)
                                some = (c.months >> m & 1) && (c.days >> d & 1);
                if (!some) {
                        *ret_field = CRON_DAY_OF_MONTH;
                        return -EINVAL;
                }
        }
        *ret = c;
        return 0;
}

static int64_t floor_div(int64_t a, int64_t b) {
        return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

/* The civil date of a day since 1970-01-01 (H. Hinnant's algorithm). */
static void civil_of(int64_t day, int64_t *ret_y, unsigned *ret_m, unsigned *ret_d) {
        int64_t z = day + 719468;
        int64_t era = floor_div(z, 146097);
        int64_t doe = z - era * 146097;
        int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        int64_t mp = (5 * doy + 2) / 153;
        unsigned d = (unsigned)(doy - (153 * mp + 2) / 5 + 1);
        unsigned m = (unsigned)(mp < 10 ? mp + 3 : mp - 9);
        *ret_y = yoe + era * 400 + (m <= 2);
        *ret_m = m;
        *ret_d = d;
}

static bool day_matches(const CronSchedule *c, int64_t day) {
        int64_t y;
        unsigned m, d;
        civil_of(day, &y, &m, &d);
        if (!(c->months >> m & 1))
                return false;
        bool dom = c->days >> d & 1;
        bool dow = c->weekdays >> (unsigned)((day % 7 + 7 + 4) % 7) & 1; /* 1970-01-01 was a Thursday */
        /* Vixie cron's rule: with both fields restricted either one may match. */
        return c->days_restricted && c->weekdays_restricted ? dom || dow : dom && dow;
}

int cron_next(const CronSchedule *c, int64_t after, int64_t *ret) {
        int64_t t = floor_div(after, 60) * 60 + 60;
        int64_t day = floor_div(t, DAY_SECONDS);
        unsigned from = (unsigned)((t - day * DAY_SECONDS) / 60); /* the first minute of the day to try */
        for (int64_t i = 0; i < CRON_SEARCH_YEARS * 366; i++, day++, from = 0) {
                if (!day_matches(c, day))
                        continue;
                for (unsigned h = from / 60; h < 24; h++) {
                        if (!(c->hours >> h & 1))
                                continue;
                        for (unsigned mi = h == from / 60 ? from % 60 : 0; mi < 60; mi++)
                                if (c->minutes >> mi & 1) {
                                        *ret = day * DAY_SECONDS + (int64_t)h * 3600 + (int64_t)mi * 60;
                                        return 0;
                                }
                }
        }
        return -ERANGE;
}

bool backup_keep_any(const BackupKeep *k) {
        return k->last || k->hourly || k->daily || k->weekly || k->monthly || k->yearly;
}

typedef enum KeepPeriod { KEEP_HOUR, KEEP_DAY, KEEP_WEEK, KEEP_MONTH, KEEP_YEAR } KeepPeriod;

/* Which hour (day, ISO week, month, year) t falls in, as one number. */
static int64_t period_of(KeepPeriod p, int64_t t) {
        int64_t day = floor_div(t, DAY_SECONDS), y;
        unsigned m, d;
        switch (p) {
        case KEEP_HOUR:
                return floor_div(t, 3600);
        case KEEP_DAY:
                return day;
        case KEEP_WEEK:
                /* ISO weeks begin on Monday; 1970-01-05 was one. */
                return floor_div(day + 3, 7);
        case KEEP_MONTH:
                civil_of(day, &y, &m, &d);
                return y * 12 + m;
        case KEEP_YEAR:
        default:
                civil_of(day, &y, &m, &d);
                return y;
        }
}

void backup_keep_select(const BackupKeep *k, const int64_t *created, size_t n, bool *ret_keep) {
        const struct {
                KeepPeriod period;
                uint32_t count;
        } rules[] = { { KEEP_HOUR, k->hourly }, { KEEP_DAY, k->daily }, { KEEP_WEEK, k->weekly },
                      { KEEP_MONTH, k->monthly }, { KEEP_YEAR, k->yearly } };
        for (size_t i = 0; i < n; i++)
                ret_keep[i] = i < k->last;
        for (size_t r = 0; r < sizeof rules / sizeof rules[0]; r++) {
                uint32_t left = rules[r].count;
                int64_t prev = 0;
                for (size_t i = 0; i < n && left > 0; i++) {
                        int64_t p = period_of(rules[r].period, created[i]);
                        /* Newest first: the first of each period is its newest. */
                        if (i > 0 && p == prev && left < rules[r].count)
                                continue;
                        ret_keep[i] = true;
                        left--;
                        prev = p;
                }
        }
}
