#pragma once
/*
 * The rules of a volume's backup policy (docs/volumes.md, "Backups") that
 * are more than a number: a five-field cron schedule, read strictly, and
 * the times it falls on; and the grandfather-father-son counts that choose
 * which of a volume's backups stay. Times are Unix seconds, calendars UTC.
 * Pure: logs nothing, keeps nothing.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest cron text taken: five fields with lists fit many times over. */
#define CRON_TEXT_MAX 127

typedef enum CronField {
        CRON_MINUTE,
        CRON_HOUR,
        CRON_DAY_OF_MONTH,
        CRON_MONTH,
        CRON_DAY_OF_WEEK,
        CRON_FIELDS,
        CRON_WHOLE = CRON_FIELDS, /* the text itself: its length or its count of fields */
} CronField;

/* Each field as the set of values it matches, bit v for value v. */
typedef struct CronSchedule {
        uint64_t minutes;      /* 0-59 */
        uint32_t hours;        /* 0-23 */
        uint32_t days;         /* 1-31 */
        uint16_t months;       /* 1-12 */
        uint8_t weekdays;      /* 0-6, Sunday 0 */
        bool days_restricted;  /* day-of-month does not start with '*' */
        bool weekdays_restricted;
} CronSchedule;

/* "minute", "hour", "day-of-month", "month", "day-of-week", or "cron" for
 * CRON_WHOLE. */
const char *cron_field_name(CronField f);

/* Reads "minute hour day-of-month month day-of-week": each field '*', a
 * value, a range a-b, a step (*\/n, a-b/n, a/n: from a to the field's end)
 * or a comma list of them; months jan-dec and weekdays sun-sat by name (7
 * is Sunday too). -EINVAL for anything else, with *ret_field the field at
 * fault; a day-of-month that no month of the schedule has (31 in February
 * only) is the day-of-month's fault, as such a schedule never runs. */
int cron_parse(const char *text, CronSchedule *ret, CronField *ret_field);

/* The first minute after `after` the schedule falls on: its minute, hour
 * and month match, and its day does (when both day-of-month and
 * day-of-week are restricted, either matching is enough, as in every cron).
 * -ERANGE when none within CRON_SEARCH_YEARS (never for a schedule
 * cron_parse took). */
#define CRON_SEARCH_YEARS 9
int cron_next(const CronSchedule *c, int64_t after, int64_t *ret);

/* How many of a volume's backups stay (0 each: the rule is unused). */
typedef struct BackupKeep {
        uint32_t last;
        uint32_t hourly;
        uint32_t daily;
        uint32_t weekly; /* ISO weeks */
        uint32_t monthly;
        uint32_t yearly;
} BackupKeep;

#define BACKUP_KEEP_MAX 1000u

/* Whether any count is set. */
bool backup_keep_any(const BackupKeep *k);

/* Chooses which of n backups, created at created[0..n) newest first, the
 * counts keep: the newest `last`, and the newest of each of the newest
 * `hourly` hours (days, ISO weeks, months, years) that have one. A backup
 * any rule keeps stays. ret_keep[i] says whether backup i stays. */
void backup_keep_select(const BackupKeep *k, const int64_t *created, size_t n, bool *ret_keep);
