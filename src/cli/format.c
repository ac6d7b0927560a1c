#include "cli/format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"

#define TABLE_COLS_MAX 8

int rfc3339_parse(const char *s, time_t *ret) {
        struct tm tm = {0};
        const char *p;
        long offset = 0;
        time_t t;

        if (!s)
                return -EINVAL;
        p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
        if (!p)
                return -EINVAL;
        if (*p == '.') {
                p++;
                if (*p < '0' || *p > '9')
                        return -EINVAL;
                while (*p >= '0' && *p <= '9')
                        p++;
        }
        if (*p == 'Z' || *p == 'z')
                p++;
        else if ((*p == '+' || *p == '-') && strlen(p) == 6 && p[3] == ':') {
                int h = (p[1] - '0') * 10 + (p[2] - '0'), m = (p[4] - '0') * 10 + (p[5] - '0');
                if (h < 0 || h > 23 || m < 0 || m > 59)
                        return -EINVAL;
                offset = (h * 3600L + m * 60L) * (*p == '+' ? 1 : -1);
                p += 6;
        } else
                return -EINVAL;
        if (*p)
                return -EINVAL;
        t = timegm(&tm);
        if (t == (time_t)-1)
                return -EINVAL;
        *ret = t - offset;
        return 0;
}

void format_span(char *buf, size_t len, long long s) {
        if (s < 0)
                s = 0;
        if (s < 60)
                snprintf(buf, len, "%llds", s);
        else if (s < 3600)
                snprintf(buf, len, "%lldm", s / 60);
        else if (s < 86400)
                snprintf(buf, len, "%lldh%lldm", s / 3600, s % 3600 / 60);
        else
                snprintf(buf, len, "%lldd%lldh", s / 86400, s % 86400 / 3600);
}

void format_relative(char *buf, size_t len, const char *rfc3339, time_t now) {
        char span[32];
        time_t t;

        if (rfc3339_parse(rfc3339, &t) < 0) {
                snprintf(buf, len, "-");
                return;
        }
        if (t <= now) {
                format_span(span, sizeof(span), (long long)(now - t));
                snprintf(buf, len, "%s ago", span);
        } else {
                format_span(span, sizeof(span), (long long)(t - now));
                snprintf(buf, len, "in %s", span);
        }
}

void format_money(char *buf, size_t len, long long micros) {
        const char *sign = micros < 0 ? "-" : "";
        unsigned long long m = micros < 0 ? 0ULL - (unsigned long long)micros : (unsigned long long)micros;

        snprintf(buf, len, "%s$%llu.%06llu", sign, m / 1000000, m % 1000000);
}

void format_bytes(char *buf, size_t len, long long bytes) {
        static const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
        double v = (double)bytes;
        size_t u = 0;

        if (bytes < 1024) {
                snprintf(buf, len, "%lld B", bytes);
                return;
        }
        v /= 1024;
        while (v >= 1024 && u + 1 < ELEMENTSOF(units)) {
                v /= 1024;
                u++;
        }
        snprintf(buf, len, "%.1f %s", v, units[u]);
}

/* A daemon string made safe for a terminal; "-" for a missing value. */
static char *clean(const char *s) {
        char *r;

        if (!s || !*s)
                return strdup("-");
        r = strdup(s);
        if (!r)
                return NULL;
        for (char *p = r; *p; p++)
                if ((unsigned char)*p < 0x20 || *p == 0x7f)
                        *p = '?';
        return r;
}

static const char *str_of(json_t *obj, const char *name) {
        return json_string_value(json_object_get(obj, name));
}

/* Display width in code points, which is right for most names. */
static size_t width_of(const char *s) {
        size_t w = 0;

        for (; *s; s++)
                if (((unsigned char)*s & 0xc0) != 0x80)
                        w++;
        return w;
}

typedef struct Table {
        size_t ncols, nrows;
        const char *headers[TABLE_COLS_MAX];
        char **cells; /* nrows * ncols, owned */
} Table;

static void table_print(FILE *f, Table *t) {
        size_t w[TABLE_COLS_MAX] = {0};

        for (size_t c = 0; c < t->ncols; c++)
                w[c] = width_of(t->headers[c]);
        for (size_t r = 0; r < t->nrows; r++)
                for (size_t c = 0; c < t->ncols; c++) {
                        const char *cell = t->cells[r * t->ncols + c];
                        size_t cw = width_of(cell ? cell : "");
                        if (cw > w[c])
                                w[c] = cw;
                }
        for (size_t r = 0; r <= t->nrows; r++) {
                for (size_t c = 0; c < t->ncols; c++) {
                        const char *cell = r == 0 ? t->headers[c] : t->cells[(r - 1) * t->ncols + c];
                        if (!cell)
                                cell = "";
                        if (c + 1 == t->ncols)
                                fprintf(f, "%s\n", cell);
                        else
                                fprintf(f, "%s%*s", cell, (int)(w[c] - width_of(cell) + 2), "");
                }
        }
}

static void table_free(Table *t) {
        if (t->cells)
                for (size_t i = 0; i < t->nrows * t->ncols; i++)
                        free(t->cells[i]);
        free(t->cells);
        t->cells = NULL;
}

static bool table_alloc(Table *t, size_t nrows) {
        t->nrows = nrows;
        t->cells = calloc(nrows ? nrows * t->ncols : 1, sizeof(char *));
        return t->cells != NULL;
}

void format_sandbox_table(FILE *f, json_t *sandboxes, time_t now) {
        Table t = {.ncols = 6, .headers = {"ID", "NAME", "STATE", "DRIVER", "CREATED", "LEASE ENDS"}};
        char buf[64];
        size_t i;
        json_t *s;

        if (!table_alloc(&t, json_array_size(sandboxes)))
                return;
        json_array_foreach(sandboxes, i, s) {
                char **row = t.cells + i * t.ncols;
                const char *state = str_of(s, "state");

                row[0] = clean(str_of(s, "id"));
                row[1] = clean(str_of(s, "name"));
                row[2] = clean(state);
                row[3] = clean(str_of(s, "driver"));
                format_relative(buf, sizeof(buf), str_of(s, "createdAt"), now);
                row[4] = strdup(buf);
                /* A lease matters only while the sandbox runs. */
                if (state && strcmp(state, "running") == 0)
                        format_relative(buf, sizeof(buf), str_of(s, "leaseEndsAt"), now);
                else
                        snprintf(buf, sizeof(buf), "-");
                row[5] = strdup(buf);
        }
        table_print(f, &t);
        table_free(&t);
}

static void kv_line(FILE *f, const char *key, const char *value) {
        _cleanup_free_ char *v = clean(value);

        fprintf(f, "%s: %s\n", key, v ? v : "-");
}

static void kv_time(FILE *f, const char *key, json_t *obj, const char *name, time_t now) {
        const char *s = str_of(obj, name);
        _cleanup_free_ char *v = clean(s);
        char rel[64];
        time_t t;

        if (!s || rfc3339_parse(s, &t) < 0) {
                fprintf(f, "%s: %s\n", key, v ? v : "-");
                return;
        }
        format_relative(rel, sizeof(rel), s, now);
        fprintf(f, "%s: %s (%s)\n", key, v, rel);
}

static void kv_int(FILE *f, const char *key, json_t *obj, const char *name, const char *unit) {
        json_t *v = json_object_get(obj, name);

        if (json_is_integer(v))
                fprintf(f, "%s: %" JSON_INTEGER_FORMAT "%s%s\n", key, json_integer_value(v), unit ? " " : "",
                        unit ? unit : "");
        else
                fprintf(f, "%s: -\n", key);
}

static void kv_money(FILE *f, const char *key, json_t *obj, const char *name, const char *suffix) {
        json_t *v = json_object_get(obj, name);
        char buf[48];

        if (!json_is_integer(v)) {
                fprintf(f, "%s: -\n", key);
                return;
        }
        format_money(buf, sizeof(buf), (long long)json_integer_value(v));
        fprintf(f, "%s: %s%s\n", key, buf, suffix ? suffix : "");
}

static void print_joined(FILE *f, json_t *arr) {
        size_t i;
        json_t *v;

        json_array_foreach(arr, i, v) {
                _cleanup_free_ char *s = clean(json_string_value(v));
                fprintf(f, "%s%s", i ? ", " : "", s ? s : "?");
        }
}

void format_sandbox_detail(FILE *f, json_t *s, time_t now) {
        json_t *net = json_object_get(s, "network"), *labels = json_object_get(s, "labels");
        const char *key;
        json_t *v;

        kv_line(f, "id", str_of(s, "id"));
        kv_line(f, "name", str_of(s, "name"));
        kv_line(f, "state", str_of(s, "state"));
        if (str_of(s, "failureReason"))
                kv_line(f, "failure reason", str_of(s, "failureReason"));
        kv_line(f, "driver", str_of(s, "driver"));
        kv_line(f, "image", str_of(s, "image"));
        kv_int(f, "vcpu", s, "vcpu", NULL);
        kv_int(f, "memory", s, "memoryMiB", "MiB");
        kv_int(f, "disk", s, "diskMiB", "MiB");
        if (json_is_object(net)) {
                fprintf(f, "internet: %s\n", json_is_true(json_object_get(net, "internet")) ? "yes" : "no");
                if (json_array_size(json_object_get(net, "allow")) > 0) {
                        fprintf(f, "allow: ");
                        print_joined(f, json_object_get(net, "allow"));
                        fputc('\n', f);
                }
                if (json_array_size(json_object_get(net, "deny")) > 0) {
                        fprintf(f, "deny: ");
                        print_joined(f, json_object_get(net, "deny"));
                        fputc('\n', f);
                }
        }
        kv_int(f, "lease", s, "timeoutSeconds", "s");
        kv_line(f, "on lease end", str_of(s, "onLeaseEnd"));
        kv_time(f, "created", s, "createdAt", now);
        kv_time(f, "started", s, "startedAt", now);
        kv_time(f, "stopped", s, "stoppedAt", now);
        kv_time(f, "lease ends", s, "leaseEndsAt", now);
        kv_money(f, "cost per hour", s, "costMicrosPerHour", "/h");
        kv_money(f, "cost so far", s, "costMicros", NULL);
        kv_money(f, "max cost", s, "maxCostMicros", NULL);
        if (json_object_size(labels) > 0) {
                bool first = true;
                fprintf(f, "labels: ");
                json_object_foreach(labels, key, v) {
                        _cleanup_free_ char *k = clean(key), *val = clean(json_string_value(v));
                        fprintf(f, "%s%s=%s", first ? "" : ", ", k ? k : "?", val ? val : "?");
                        first = false;
                }
                fputc('\n', f);
        }
}

void format_image_table(FILE *f, json_t *images) {
        Table t = {.ncols = 4, .headers = {"NAME", "BUILT", "BUILT AT", "SIZE"}};
        char buf[64];
        size_t i;
        json_t *img;

        if (!table_alloc(&t, json_array_size(images)))
                return;
        json_array_foreach(images, i, img) {
                char **row = t.cells + i * t.ncols;
                json_t *size = json_object_get(img, "sizeBytes");

                row[0] = clean(str_of(img, "name"));
                row[1] = strdup(json_is_true(json_object_get(img, "built")) ? "yes" : "no");
                row[2] = clean(str_of(img, "builtAt"));
                if (json_is_integer(size))
                        format_bytes(buf, sizeof(buf), (long long)json_integer_value(size));
                else
                        snprintf(buf, sizeof(buf), "-");
                row[3] = strdup(buf);
        }
        table_print(f, &t);
        table_free(&t);
}

void format_file_entries(FILE *f, json_t *entries) {
        Table t = {.ncols = 5, .headers = {"TYPE", "MODE", "SIZE", "MODIFIED", "PATH"}};
        char buf[64];
        size_t i;
        json_t *e;

        if (!table_alloc(&t, json_array_size(entries)))
                return;
        json_array_foreach(entries, i, e) {
                char **row = t.cells + i * t.ncols;
                json_t *mode = json_object_get(e, "mode"), *size = json_object_get(e, "size");
                const char *path = str_of(e, "path"), *target = str_of(e, "target");

                row[0] = clean(str_of(e, "type"));
                if (json_is_integer(mode))
                        snprintf(buf, sizeof(buf), "%04llo",
                                 (unsigned long long)json_integer_value(mode) & 07777);
                else
                        snprintf(buf, sizeof(buf), "-");
                row[1] = json_is_string(mode) ? clean(json_string_value(mode)) : strdup(buf);
                if (json_is_integer(size))
                        snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(size));
                else
                        snprintf(buf, sizeof(buf), "-");
                row[2] = strdup(buf);
                row[3] = clean(str_of(e, "mtime"));
                if (target) {
                        _cleanup_free_ char *p = clean(path ? path : str_of(e, "name"));
                        _cleanup_free_ char *tg = clean(target);
                        if (asprintf(&row[4], "%s -> %s", p ? p : "?", tg ? tg : "?") < 0)
                                row[4] = NULL;
                } else
                        row[4] = clean(path ? path : str_of(e, "name"));
        }
        table_print(f, &t);
        table_free(&t);
}

void format_put_safe(FILE *f, const char *s, int width) {
        int n = 0;
        for (; s && *s; s++, n++)
                fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, f);
        for (; n < width; n++)
                fputc(' ', f);
}
