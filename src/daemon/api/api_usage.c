/* The usage routes (docs/api.md, "Keys, limits, usage"): GET /v1/usage,
 * an owner's charges summed over a window; GET /v1/usage/export, its
 * settled charges one row each, in pages of CSV and JSON; GET
 * /v1/usage/requests, its keys' API answers counted per hour. */
#include "daemon/api/api_usage.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/manager/ledger.h"
#include "daemon/manager/request_counts.h"

/* Unix seconds, or an RFC 3339 UTC time "2026-11-30T09:00:00Z". */
static int parse_time(const char *s, int64_t *ret) {
        if (!s || !*s || strlen(s) > 32)
                return -EINVAL;
        char *end;
        if (s[0] >= '0' && s[0] <= '9' && !strchr(s, '-')) {
                errno = 0;
                long long v = strtoll(s, &end, 10);
                if (errno || *end || v < 0)
                        return -EINVAL;
                *ret = v;
                return 0;
        }
        struct tm tm = { 0 };
        int n = 0;
        if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2dZ%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                   &tm.tm_sec, &n) != 6 ||
            s[n] != '\0' || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
            tm.tm_min > 59 || tm.tm_sec > 60 || tm.tm_year < 1970)
                return -EINVAL;
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        time_t t = timegm(&tm);
        if (t < 0)
                return -EINVAL;
        *ret = t;
        return 0;
}

/* Far enough for any real window, small enough that nothing overflows. */
#define USAGE_MAX_TIME 253402300799LL /* 9999-12-31T23:59:59Z */

/* GET /v1/usage's totals and lists, before the window and owner. */
static json_t *usage_json(const LedgerUsage *u) {
        _cleanup_json_ json_t *sandboxes = json_array(), *keys = json_array();
        if (!sandboxes || !keys)
                return NULL;
        for (size_t i = 0; i < u->n_sandboxes; i++) {
                const LedgerUsageSandbox *sb = &u->sandboxes[i];
                if (json_array_append_new(sandboxes, json_pack("{s:s,s:I,s:I,s:s,s:b}", "sandboxId", sb->sandbox_id,
                                                               "seconds", (json_int_t)sb->seconds, "micros",
                                                               (json_int_t)sb->micros, "keyId", sb->key_id,
                                                               "running", sb->running)) < 0)
                        return NULL;
        }
        for (size_t i = 0; i < u->n_keys; i++) {
                const LedgerUsageKey *k = &u->keys[i];
                if (json_array_append_new(keys, json_pack("{s:s,s:I,s:I,s:s}", "keyId", k->key_id, "seconds",
                                                          (json_int_t)k->seconds, "micros", (json_int_t)k->micros,
                                                          "name", k->name)) < 0)
                        return NULL;
        }
        return json_pack("{s:I,s:I,s:O,s:O,s:b}", "totalSeconds", (json_int_t)u->total_seconds, "totalMicros",
                         (json_int_t)u->total_micros, "sandboxes", sandboxes, "keys", keys, "truncated",
                         u->truncated);
}

enum MHD_Result handle_usage(Req *r) {
        ApiError e = { 0 };
        int64_t now = time_now_unix(), since = now - LEDGER_WINDOW_SECONDS, until = now;
        const char *s = req_query(r, "since"), *u = req_query(r, "until");
        if (s && (parse_time(s, &since) < 0 || since > USAGE_MAX_TIME)) {
                api_error(&e, 400, "invalid_request", "give since as unix seconds or 2026-11-30T09:00:00Z",
                          "since is not a time");
                return reply_error(r, &e);
        }
        if (u && (parse_time(u, &until) < 0 || until > USAGE_MAX_TIME)) {
                api_error(&e, 400, "invalid_request", "give until as unix seconds or 2026-11-30T09:00:00Z",
                          "until is not a time");
                return reply_error(r, &e);
        }
        if (since >= until) {
                api_error(&e, 400, "invalid_request", NULL, "since must be before until");
                return reply_error(r, &e);
        }
        _cleanup_(ledger_usage_done) LedgerUsage usage = { 0 };
        int rc = ledger_usage(r->app->ledger, r->key.owner, since, until, now, &usage);
        if (rc < 0)
                return api_reply_store_error(r, rc, "read the usage");
        json_t *j = usage_json(&usage);
        if (!j || json_object_set_new(j, "since", json_time_or_null(since)) < 0 ||
            json_object_set_new(j, "until", json_time_or_null(until)) < 0 ||
            json_object_set_new(j, "owner", json_string(r->key.owner)) < 0) {
                json_decref(j);
                return reply_internal(r);
        }
        return reply_json(r, 200, j);
}


/* An export's cursor: the place of the last row of a page, as
 * "<end>.<start>.<series>"; a series is [a-z0-9_] with an optional
 * ":disk". */
static int parse_place(const char *s, LedgerExportPlace *ret) {
        if (!s || strlen(s) > 96)
                return -EINVAL;
        long long end, start;
        int n = 0;
        if (sscanf(s, "%lld.%lld.%n", &end, &start, &n) != 2 || n == 0 || end < 0 || start < 0)
                return -EINVAL;
        const char *series = s + n;
        size_t len = strlen(series);
        if (len == 0 || len >= sizeof ret->series || strspn(series, "abcdefghijklmnopqrstuvwxyz0123456789_:") != len)
                return -EINVAL;
        *ret = (LedgerExportPlace){ .ended_at = end, .started_at = start };
        memcpy(ret->series, series, len + 1);
        return 0;
}

/* A CSV field as RFC 4180 has it (quoted when it holds a comma, a quote or
 * a line break), and never a formula: a text a spreadsheet would run (its
 * first character =, +, -, @, a tab or a carriage return) starts with a
 * quote mark. Key names are the client's words. */
static void csv_field(FILE *f, const char *v, bool last) {
        bool formula = v[0] && strchr("=+-@\t\r", v[0]);
        bool quote = formula || strpbrk(v, ",\"\r\n");
        if (quote)
                fputc('"', f);
        if (formula)
                fputc('\'', f);
        for (const char *p = v; *p; p++) {
                if (*p == '"')
                        fputc('"', f);
                fputc(*p, f);
        }
        if (quote)
                fputc('"', f);
        fputs(last ? "\r\n" : ",", f);
}

#define EXPORT_COLUMNS "settledAt,product,resourceId,keyId,keyName,startedAt,endedAt,quantity,unit,unitPriceMicros,amountMicros,final"

/* Whether a sandbox can be charged nothing more: it is deleted (or gone
 * from the store altogether). */
static bool sandbox_final(Req *r, const char *series) {
        char id[LEDGER_SERIES_MAX];
        snprintf(id, sizeof id, "%s", series);
        char *colon = strchr(id, ':');
        if (colon)
                *colon = '\0';
        SandboxRow row;
        int rc = db_sandbox_get(r->app->db, id, &row);
        if (rc == -ENOENT)
                return true;
        if (rc < 0)
                return false;
        bool deleted = row.state == SANDBOX_DELETED;
        sandbox_row_done(&row);
        return deleted;
}

/* One row, in JSON and as a line of CSV: money and quantities are decimal
 * strings. */
static json_t *export_row(Req *r, const LedgerExportRow *x, FILE *csv) {
        /* A charge is settled as it ends: its last day's row ends then; a
         * row of an earlier day of it ends at that day's midnight. */
        char settled[RFC3339_LEN], started[RFC3339_LEN], ended[RFC3339_LEN], qty[24], price[24], amount[24];
        time_format_rfc3339(x->at.ended_at, settled);
        time_format_rfc3339(x->at.started_at, started);
        time_format_rfc3339(x->ended_at, ended);
        snprintf(qty, sizeof qty, "%lld", (long long)x->seconds);
        snprintf(price, sizeof price, "%lld", (long long)x->price_per_hour);
        snprintf(amount, sizeof amount, "%lld", (long long)x->micros);
        char resource[LEDGER_SERIES_MAX];
        snprintf(resource, sizeof resource, "%s", x->at.series);
        size_t len = strlen(resource), suffix = strlen(LEDGER_DISK_SUFFIX);
        bool disk = len > suffix && strcmp(resource + len - suffix, LEDGER_DISK_SUFFIX) == 0;
        if (disk)
                resource[len - suffix] = '\0';
        const char *product = disk ? "sandbox_disk" : "sandbox";
        bool final = sandbox_final(r, resource);
        const char *fields[] = { settled, product, resource, x->key_id, x->key_name, started, ended, qty,
                                 "second", price, amount, final ? "true" : "false" };
        for (size_t i = 0; i < ELEMENTSOF(fields); i++)
                csv_field(csv, fields[i], i + 1 == ELEMENTSOF(fields));
        return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:b}", "settledAt", settled, "product", product,
                         "resourceId", resource, "keyId", x->key_id, "keyName", x->key_name, "startedAt", started,
                         "endedAt", ended, "quantity", qty, "unit", "second", "unitPriceMicros", price,
                         "amountMicros", amount, "final", final);
}

/* The longest range one export covers: a year and a day. */
#define EXPORT_MAX_RANGE_SECONDS (367LL * 86400)

enum MHD_Result handle_usage_export(Req *r) {
        int64_t since, until;
        const char *s = req_query(r, "since"), *u = req_query(r, "until"), *cursor = req_query(r, "cursor");
        const char *lim = req_query(r, "limit");
        static const char when[] = "give it as 2026-11-30T09:00:00Z (UTC) or unix seconds";
        if (!s || parse_time(s, &since) < 0 || since > USAGE_MAX_TIME)
                return api_reply_invalid(r, when, "since is required and must be a time");
        if (!u || parse_time(u, &until) < 0 || until > USAGE_MAX_TIME)
                return api_reply_invalid(r, when, "until is required and must be a time");
        if (since >= until)
                return api_reply_invalid(r, NULL, "since must be before until");
        if (until - since > EXPORT_MAX_RANGE_SECONDS)
                return api_reply_invalid(r, "export a year at a time", "the range is longer than 367 days");
        long limit = 100;
        if (lim) {
                char *end = NULL;
                limit = strtol(lim, &end, 10);
                if (!*lim || *end || limit < 1 || limit > LEDGER_EXPORT_MAX_ROWS)
                        return api_reply_invalid(r, NULL, "limit must be 1..1000");
        }
        LedgerExportPlace after;
        if (cursor && parse_place(cursor, &after) < 0)
                return api_reply_invalid(r, "pass the nextCursor of the page before, with the same range", "cursor is not one");
        LedgerExportRow *rows = calloc((size_t)limit, sizeof(*rows));
        if (!rows)
                return reply_internal(r);
        size_t n = 0;
        bool more = false;
        int64_t final_through = 0;
        int rc = ledger_export(r->app->ledger, r->key.owner, since, until, cursor ? &after : NULL, (size_t)limit,
                               time_now_unix(), rows, &n, &more, &final_through);
        if (rc < 0) {
                free(rows);
                return api_reply_store_error(r, rc, "read the usage export");
        }
        char *text = NULL;
        size_t text_len = 0;
        FILE *csv = open_memstream(&text, &text_len);
        _cleanup_json_ json_t *list = json_array();
        bool ok = csv && list;
        if (ok && !cursor)
                fputs(EXPORT_COLUMNS "\r\n", csv);
        for (size_t i = 0; ok && i < n; i++)
                ok = json_array_append_new(list, export_row(r, &rows[i], csv)) == 0;
        if (csv && fclose(csv) != 0)
                ok = false;
        char next[128] = "";
        if (more && n)
                snprintf(next, sizeof next, "%lld.%lld.%s", (long long)rows[n - 1].at.ended_at,
                         (long long)rows[n - 1].at.started_at, rows[n - 1].at.series);
        free(rows);
        json_t *j = ok ? json_pack("{s:o,s:o,s:s,s:O,s:s?,s:b,s:o}", "since", json_time_or_null(since), "until",
                                   json_time_or_null(until), "csv", text ? text : "", "rows", list, "nextCursor",
                                   next[0] ? next : NULL, "hasMore", more, "finalThrough",
                                   json_time_or_null(final_through))
                       : NULL;
        free(text);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

/* The answers of one bucket or one key, as they are summed. */
typedef struct Tally {
        char key_id[40];
        int64_t at;
        int64_t requests, client_errors, server_errors;
} Tally;

#define REQUESTS_MAX_KEYS 1000

typedef struct RequestsWalk {
        int64_t bucket;
        Tally total;
        Tally *buckets; /* in order: the store's rows come by hour */
        size_t n_buckets, cap_buckets;
        Tally keys[REQUESTS_MAX_KEYS];
        size_t n_keys;
        bool keys_truncated;
} RequestsWalk;

static void tally_add(Tally *t, const RequestCount *c) {
        t->requests += c->requests;
        t->client_errors += c->client_errors;
        t->server_errors += c->server_errors;
}

static int requests_add(void *userdata, const RequestCount *c) {
        RequestsWalk *w = userdata;
        tally_add(&w->total, c);
        int64_t at = c->hour / w->bucket * w->bucket;
        if (!w->n_buckets || w->buckets[w->n_buckets - 1].at != at) {
                if (w->n_buckets == w->cap_buckets) {
                        size_t cap = w->cap_buckets ? w->cap_buckets * 2 : 32;
                        Tally *b = reallocarray(w->buckets, cap, sizeof(*b));
                        if (!b)
                                return -ENOMEM;
                        w->buckets = b;
                        w->cap_buckets = cap;
                }
                w->buckets[w->n_buckets++] = (Tally){ .at = at };
        }
        tally_add(&w->buckets[w->n_buckets - 1], c);
        size_t k = 0;
        while (k < w->n_keys && strcmp(w->keys[k].key_id, c->key_id) != 0)
                k++;
        if (k == w->n_keys) {
                if (k == REQUESTS_MAX_KEYS) {
                        w->keys_truncated = true;
                        return 0;
                }
                snprintf(w->keys[k].key_id, sizeof w->keys[k].key_id, "%s", c->key_id);
                w->n_keys++;
        }
        tally_add(&w->keys[k], c);
        return 0;
}

/* A tally's counts as decimal strings, and its error percent (4xx and 5xx
 * of all; null without answers). */
static json_t *tally_json(const Tally *t) {
        char req[24], ce[24], se[24];
        snprintf(req, sizeof req, "%lld", (long long)t->requests);
        snprintf(ce, sizeof ce, "%lld", (long long)t->client_errors);
        snprintf(se, sizeof se, "%lld", (long long)t->server_errors);
        json_t *pct = t->requests ? json_real((double)(t->client_errors + t->server_errors) * 100.0 /
                                              (double)t->requests)
                                  : json_null();
        return json_pack("{s:s,s:s,s:s,s:o}", "requests", req, "clientErrors", ce, "serverErrors", se,
                         "errorPercent", pct);
}

enum MHD_Result handle_usage_requests(Req *r) {
        static const struct {
                const char *name;
                int64_t buckets, bucket;
        } ranges[] = { { "24h", 24, 3600 }, { "7d", 7 * 24, 3600 }, { "30d", 30, 86400 }, { "90d", 90, 86400 } };
        const char *name = req_query(r, "range");
        if (!name)
                name = "24h";
        size_t i = 0;
        while (i < ELEMENTSOF(ranges) && strcmp(ranges[i].name, name) != 0)
                i++;
        if (i == ELEMENTSOF(ranges))
                return api_reply_invalid(r, "use 24h, 7d, 30d or 90d", "range must be one of 24h, 7d, 30d, 90d");
        RequestCounts *counts = r->app->requests;
        if (!counts) {
                ApiError e = { 0 };
                api_error(&e, 501, "not_implemented", NULL, "this daemon does not count its answers");
                return reply_error(r, &e);
        }
        /* This host's latest answers first, this call's own before it among them. */
        (void)request_counts_flush(counts);
        int64_t now = time_now_unix(), bucket = ranges[i].bucket;
        /* The window ends with the partial bucket now is in. */
        int64_t since = now / bucket * bucket - (ranges[i].buckets - 1) * bucket;
        RequestsWalk *w = calloc(1, sizeof(*w));
        if (!w)
                return reply_internal(r);
        w->bucket = bucket;
        int rc = request_counts_list(counts, r->key.owner, since, requests_add, w);
        if (rc < 0) {
                free(w->buckets);
                free(w);
                return api_reply_store_error(r, rc, "read the request counts");
        }
        json_t *buckets = json_array(), *keys = json_array();
        bool ok = buckets && keys;
        for (size_t b = 0; ok && b < w->n_buckets; b++) {
                json_t *j = tally_json(&w->buckets[b]);
                ok = j && json_object_set_new(j, "at", json_time_or_null(w->buckets[b].at)) == 0 &&
                     json_array_append_new(buckets, j) == 0;
        }
        for (size_t k = 0; ok && k < w->n_keys; k++) {
                json_t *j = tally_json(&w->keys[k]);
                ok = j && json_object_set_new(j, "keyId", json_string(w->keys[k].key_id)) == 0 &&
                     json_array_append_new(keys, j) == 0;
        }
        json_t *j = ok ? tally_json(&w->total) : NULL;
        if (j && (json_object_set_new(j, "range", json_string(name)) < 0 ||
                  json_object_set_new(j, "since", json_time_or_null(since)) < 0 ||
                  json_object_set_new(j, "until", json_time_or_null(now)) < 0 ||
                  json_object_set_new(j, "bucketSeconds", json_integer(bucket)) < 0 ||
                  json_object_set(j, "buckets", buckets) < 0 || json_object_set(j, "keys", keys) < 0 ||
                  json_object_set_new(j, "keysTruncated", json_boolean(w->keys_truncated)) < 0)) {
                json_decref(j);
                j = NULL;
        }
        json_decref(buckets);
        json_decref(keys);
        free(w->buckets);
        free(w);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}
