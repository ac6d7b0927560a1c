#include "cli/parse.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"

/* Leading decimal digits of s as an unsigned value; *ret_end points after
 * them. Refuses an empty digit run and values that do not fit. */
static int leading_number(const char *s, unsigned long long *ret, const char **ret_end) {
        unsigned long long v = 0;
        const char *p = s;

        if (!isdigit((unsigned char)*p))
                return -EINVAL;
        for (; isdigit((unsigned char)*p); p++) {
                if (__builtin_mul_overflow(v, 10ULL, &v) ||
                    __builtin_add_overflow(v, (unsigned)(*p - '0'), &v))
                        return -ERANGE;
        }
        *ret = v;
        *ret_end = p;
        return 0;
}

int parse_uint_bounded(const char *what, const char *s, long long min, long long max, long long *ret,
                       char *err, size_t errlen) {
        unsigned long long v;
        const char *end;
        int r;

        if (!s || !*s) {
                snprintf(err, errlen, "%s: a number is required", what);
                return -EINVAL;
        }
        r = leading_number(s, &v, &end);
        if (r < 0 || *end != '\0') {
                if (r == -ERANGE)
                        snprintf(err, errlen, "%s: '%.64s' is too large (at most %lld)", what, s, max);
                else if (*s == '-')
                        snprintf(err, errlen,
                                 "%s: '%.64s' is negative; expected a whole number from %lld to %lld", what,
                                 s, min, max);
                else
                        snprintf(err, errlen, "%s: '%.64s' is not a whole number", what, s);
                return -EINVAL;
        }
        if (v > (unsigned long long)max || (long long)v < min) {
                snprintf(err, errlen, "%s: %llu is out of range (%lld to %lld)", what, v, min, max);
                return -ERANGE;
        }
        *ret = (long long)v;
        return 0;
}

int parse_duration_ms(const char *what, const char *s, long long min_ms, long long max_ms, long long *ret,
                      char *err, size_t errlen) {
        static const struct {
                const char *suffix;
                unsigned long long ms;
        } units[] = {
                {"", 1000}, {"s", 1000}, {"ms", 1}, {"m", 60000}, {"h", 3600000}, {"d", 86400000},
        };
        unsigned long long v, total;
        const char *end;
        int r;

        if (!s || !*s) {
                snprintf(err, errlen, "%s: a duration is required (e.g. 30, 30s, 5m, 2h)", what);
                return -EINVAL;
        }
        if (*s == '-') {
                snprintf(err, errlen, "%s: '%.64s' is negative; a duration is at least %lldms", what, s,
                         min_ms);
                return -EINVAL;
        }
        r = leading_number(s, &v, &end);
        if (r == -ERANGE) {
                snprintf(err, errlen, "%s: '%.64s' is too large", what, s);
                return -ERANGE;
        }
        if (r < 0) {
                snprintf(err, errlen, "%s: '%.64s' is not a duration (e.g. 30, 30s, 5m, 2h)", what, s);
                return -EINVAL;
        }
        for (size_t i = 0; i < ELEMENTSOF(units); i++) {
                if (strcmp(end, units[i].suffix) != 0)
                        continue;
                if (__builtin_mul_overflow(v, units[i].ms, &total) || total > (unsigned long long)max_ms ||
                    (long long)total < min_ms) {
                        snprintf(err, errlen, "%s: '%.64s' is out of range (%lldms to %llds)", what, s,
                                 min_ms, max_ms / 1000);
                        return -ERANGE;
                }
                *ret = (long long)total;
                return 0;
        }
        snprintf(err, errlen, "%s: '%.64s' has an unknown unit (use ms, s, m, h or d)", what, s);
        return -EINVAL;
}

int parse_duration_s(const char *what, const char *s, long long min_s, long long max_s, long long *ret,
                     char *err, size_t errlen) {
        long long ms;
        int r;

        r = parse_duration_ms(what, s, min_s * 1000, max_s * 1000, &ms, err, errlen);
        if (r < 0)
                return r;
        if (ms % 1000 != 0) {
                snprintf(err, errlen, "%s: '%.64s' is not a whole number of seconds", what, s);
                return -EINVAL;
        }
        *ret = ms / 1000;
        return 0;
}

int parse_size_mib(const char *what, const char *s, long long min_mib, long long max_mib, long long *ret,
                   char *err, size_t errlen) {
        static const struct {
                const char *suffix;
                unsigned long long mib;
        } units[] = {
                {"", 1},
                {"M", 1},
                {"MiB", 1},
                {"MB", 1},
                {"m", 1},
                {"G", 1024},
                {"GiB", 1024},
                {"GB", 1024},
                {"g", 1024},
                {"T", 1024 * 1024},
                {"TiB", 1024 * 1024},
                {"TB", 1024 * 1024},
                {"t", 1024 * 1024},
        };
        unsigned long long v, total;
        const char *end;
        int r;

        if (!s || !*s) {
                snprintf(err, errlen, "%s: a size is required (e.g. 512, 512M, 2G)", what);
                return -EINVAL;
        }
        if (*s == '-') {
                snprintf(err, errlen, "%s: '%.64s' is negative", what, s);
                return -EINVAL;
        }
        r = leading_number(s, &v, &end);
        if (r == -ERANGE) {
                snprintf(err, errlen, "%s: '%.64s' is too large", what, s);
                return -ERANGE;
        }
        if (r < 0) {
                snprintf(err, errlen, "%s: '%.64s' is not a size (e.g. 512, 512M, 2G)", what, s);
                return -EINVAL;
        }
        for (size_t i = 0; i < ELEMENTSOF(units); i++) {
                if (strcmp(end, units[i].suffix) != 0)
                        continue;
                if (__builtin_mul_overflow(v, units[i].mib, &total) || total > (unsigned long long)max_mib ||
                    (long long)total < min_mib) {
                        snprintf(err, errlen, "%s: '%.64s' is out of range (%lld to %lld MiB)", what, s,
                                 min_mib, max_mib);
                        return -ERANGE;
                }
                *ret = (long long)total;
                return 0;
        }
        snprintf(err, errlen, "%s: '%.64s' has an unknown unit (use M or G; a bare number is MiB)", what, s);
        return -EINVAL;
}

bool env_name_valid(const char *name, size_t len) {
        if (len == 0 || len > CLI_ENV_NAME_MAX)
                return false;
        if (!(isalpha((unsigned char)name[0]) || name[0] == '_'))
                return false;
        for (size_t i = 1; i < len; i++) {
                unsigned char c = (unsigned char)name[i];
                if (!(isascii(c) && (isalnum(c) || c == '_')))
                        return false;
        }
        return true;
}

static bool printable_key(const char *s, size_t len) {
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)s[i];
                if (c < 0x20 || c == 0x7f)
                        return false;
        }
        return true;
}

int parse_kv_into(KvKind kind, const char *s, json_t *obj, char *err, size_t errlen) {
        const char *what = kind == KV_ENV ? "--env" : "--label";
        size_t max_entries = kind == KV_ENV ? CLI_ENV_MAX : CLI_LABELS_MAX;
        size_t max_value = kind == KV_ENV ? CLI_ENV_VALUE_MAX : CLI_LABEL_VALUE_MAX;
        _cleanup_free_ char *key = NULL;
        const char *eq, *value;
        size_t klen;
        json_t *v;

        eq = s ? strchr(s, '=') : NULL;
        if (!eq) {
                snprintf(err, errlen, "%s: '%.64s' has no '='; expected K=V", what, s ? s : "");
                return -EINVAL;
        }
        klen = (size_t)(eq - s);
        value = eq + 1;
        if (kind == KV_ENV && !env_name_valid(s, klen)) {
                snprintf(err, errlen,
                         "%s: '%.*s' is not a variable name ([A-Za-z_][A-Za-z0-9_]*, at most %d bytes)",
                         what, (int)(klen > 64 ? 64 : klen), s, CLI_ENV_NAME_MAX);
                return -EINVAL;
        }
        if (kind == KV_LABEL && (klen == 0 || klen > CLI_LABEL_KEY_MAX || !printable_key(s, klen))) {
                snprintf(err, errlen, "%s: a label key is 1 to %d printable bytes", what, CLI_LABEL_KEY_MAX);
                return -EINVAL;
        }
        if (strlen(value) > max_value) {
                snprintf(err, errlen, "%s: the value of '%.*s' is longer than %zu bytes", what,
                         (int)(klen > 64 ? 64 : klen), s, max_value);
                return -EINVAL;
        }
        key = strndup(s, klen);
        if (!key)
                return -ENOMEM;
        if (!json_object_get(obj, key) && json_object_size(obj) >= max_entries) {
                snprintf(err, errlen, "%s: at most %zu entries", what, max_entries);
                return -E2BIG;
        }
        v = json_stringn(value, strlen(value));
        if (!v) {
                snprintf(err, errlen, "%s: the value of '%.*s' is not valid UTF-8", what,
                         (int)(klen > 64 ? 64 : klen), s);
                return -EINVAL;
        }
        if (json_object_set_new(obj, key, v) < 0) {
                snprintf(err, errlen, "%s: '%.*s' is not valid UTF-8", what, (int)(klen > 64 ? 64 : klen),
                         s);
                return -EINVAL;
        }
        return 0;
}

bool sandbox_id_valid(const char *id) {
        size_t n = id ? strlen(id) : 0;

        if (n == 0 || n > CLI_SANDBOX_ID_MAX)
                return false;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)id[i];
                if (!(isascii(c) && (isalnum(c) || c == '_' || c == '-')))
                        return false;
        }
        return true;
}

bool image_name_valid(const char *name) {
        size_t n = name ? strlen(name) : 0;

        if (n == 0 || n > 64)
                return false;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)name[i];
                bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && strchr("._-", c));
                if (!ok)
                        return false;
        }
        return true;
}

bool cli_user_valid(const char *user) {
        return strcmp(user, "sandbox") == 0 || strcmp(user, "root") == 0;
}

int sandbox_path_check(const char *path, char *err, size_t errlen) {
        size_t n = path ? strlen(path) : 0;

        if (n == 0) {
                snprintf(err, errlen, "a path inside the sandbox is required");
                return -EINVAL;
        }
        if (n > CLI_PATH_MAX) {
                snprintf(err, errlen, "the path is longer than %d bytes", CLI_PATH_MAX);
                return -ENAMETOOLONG;
        }
        return 0;
}

char *base64_encode(const void *data, size_t len) {
        static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const unsigned char *in = data;
        size_t out_len, i, o = 0;
        char *out;

        if (len > (SIZE_MAX - 1) / 4 * 3 - 3)
                return NULL;
        out_len = (len + 2) / 3 * 4;
        out = malloc(out_len + 1);
        if (!out)
                return NULL;
        for (i = 0; i + 2 < len; i += 3) {
                uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
                out[o++] = tbl[v >> 18 & 63];
                out[o++] = tbl[v >> 12 & 63];
                out[o++] = tbl[v >> 6 & 63];
                out[o++] = tbl[v & 63];
        }
        if (i < len) {
                uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0);
                out[o++] = tbl[v >> 18 & 63];
                out[o++] = tbl[v >> 12 & 63];
                out[o++] = i + 1 < len ? tbl[v >> 6 & 63] : '=';
                out[o++] = '=';
        }
        out[o] = '\0';
        return out;
}
