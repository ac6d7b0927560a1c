#include "egress/secret.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_SUBSTITUTED (64u * 1024u)

/* Environment names the daemon sets itself: a secret may not take them. */
static const char *const reserved_names[] = {
        "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
        "all_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS", "PATH", "HOME", "LANG", "TERM", "LD_PRELOAD", "LD_LIBRARY_PATH", NULL,
};

bool egress_secret_name_ok(const char *name) {
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > 64)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = name[i];
                bool ok = c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (i > 0 && c >= '0' && c <= '9');
                if (!ok)
                        return false;
        }
        for (const char *const *r = reserved_names; *r; r++)
                if (strcmp(*r, name) == 0)
                        return false;
        return true;
}

bool egress_secret_value_valid(const char *value, size_t len) {
        if (!value || len == 0 || len > EGRESS_SECRET_MAX_VALUE)
                return false;
        for (size_t i = 0; i < len; i++)
                if ((unsigned char)value[i] < 0x20 || (unsigned char)value[i] > 0x7e)
                        return false;
        return true;
}

static bool tchar(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("!#$%&'*+-.^_`|~", c);
}

/* Headers that frame the message or steer the connection: a secret that set
 * one could smuggle a second request or reroute this one. */
static const char *const forbidden_headers[] = {
        "host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer",
        "keep-alive", "expect", "proxy-authorization", "proxy-connection", "proxy-authenticate", "http2-settings",
        NULL,
};

bool egress_secret_header_valid(const char *name) {
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > EGRESS_SECRET_MAX_HEADER)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!tchar(name[i]))
                        return false;
        if (strncasecmp(name, "proxy-", 6) == 0)
                return false;
        for (const char *const *f = forbidden_headers; *f; f++)
                if (strcasecmp(*f, name) == 0)
                        return false;
        return true;
}

bool egress_secret_format_valid(const char *format) {
        size_t n = format ? strlen(format) : 0;
        if (n == 0 || n > EGRESS_SECRET_MAX_FORMAT || !egress_secret_value_valid(format, n))
                return false;
        const char *at = strstr(format, "{value}");
        return at && !strstr(at + 1, "{value}");
}

void egress_secret_rules_free(EgressSecretRule *rules, unsigned n) {
        if (!rules)
                return;
        for (unsigned i = 0; i < n; i++)
                for (unsigned k = 0; k < rules[i].n_paths; k++)
                        free(rules[i].paths[k]);
        free(rules);
}

static bool method_valid(const char *m) {
        size_t n = strlen(m);
        if (n == 0 || n > 15)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!(m[i] >= 'A' && m[i] <= 'Z'))
                        return false;
        return true;
}

/* A path as a rule or a request must write it to be judged: "/", then
 * segments of visible ASCII without ".", "..", empty ones, ';', '\\', '?',
 * '#', or a percent-encoded '/', '\\' or '.'. Anything else could mean one
 * path to the rule and another to the server. */
static bool path_canonical(const char *p, size_t n) {
        if (n == 0 || p[0] != '/')
                return false;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)p[i];
                if (c <= 0x20 || c > 0x7e || c == ';' || c == '\\' || c == '?' || c == '#')
                        return false;
                if (c == '%') {
                        if (i + 2 >= n)
                                return false;
                        char a = p[i + 1], b = p[i + 2];
                        if (a == '2' && (b == 'f' || b == 'F' || b == 'e' || b == 'E'))
                                return false;
                        if (a == '5' && (b == 'c' || b == 'C'))
                                return false;
                }
                if (c == '/') {
                        size_t end = i + 1;
                        while (end < n && p[end] != '/')
                                end++;
                        size_t seg = end - i - 1;
                        if (end < n && seg == 0)
                                return false; /* "//" */
                        if ((seg == 1 && p[i + 1] == '.') || (seg == 2 && p[i + 1] == '.' && p[i + 2] == '.'))
                                return false;
                }
        }
        return true;
}

int egress_secret_rules_parse(const json_t *rules, json_t **ret, EgressSecretRule **ret_rules, unsigned *ret_n,
                              char *err, size_t err_len) {
#define FAIL(...)                                                   \
        do {                                                        \
                snprintf(err, err_len, __VA_ARGS__);                \
                egress_secret_rules_free(out, n_out);               \
                json_decref(norm);                                  \
                return -EINVAL;                                     \
        } while (0)
        EgressSecretRule *out = NULL;
        unsigned n_out = 0;
        json_t *norm = NULL;
        if (!json_is_array(rules) || json_array_size(rules) == 0 || json_array_size(rules) > EGRESS_SECRET_MAX_RULES)
                FAIL("rules must be an array of 1 to %d rules", EGRESS_SECRET_MAX_RULES);
        size_t count = json_array_size(rules);
        out = calloc(count, sizeof(*out));
        norm = json_array();
        if (!out || !norm)
                FAIL("out of memory");
        size_t i;
        json_t *rule;
        json_array_foreach(rules, i, rule) {
                if (!json_is_object(rule))
                        FAIL("rules[%zu] must be an object {methods, paths}", i);
                const char *key;
                json_t *v;
                json_object_foreach((json_t *)rule, key, v) {
                        if (strcmp(key, "methods") != 0 && strcmp(key, "paths") != 0)
                                FAIL("rules[%zu]: unknown field %.64s (the fields are methods and paths)", i, key);
                }
                EgressSecretRule *r = &out[n_out++];
                json_t *methods = json_object_get(rule, "methods"), *paths = json_object_get(rule, "paths");
                json_t *nm = json_array(), *np = json_array();
                json_t *nr = json_object();
                if (!nm || !np || !nr || json_array_append_new(norm, nr) < 0) {
                        json_decref(nm);
                        json_decref(np);
                        FAIL("out of memory");
                }
                json_object_set_new(nr, "methods", nm);
                json_object_set_new(nr, "paths", np);
                if (methods) {
                        if (!json_is_array(methods) || json_array_size(methods) == 0 ||
                            json_array_size(methods) > EGRESS_SECRET_MAX_RULE_METHODS)
                                FAIL("rules[%zu].methods must be an array of 1 to %d methods", i,
                                     EGRESS_SECRET_MAX_RULE_METHODS);
                        size_t k;
                        json_t *m;
                        json_array_foreach(methods, k, m) {
                                char up[16];
                                const char *s = json_string_value(m);
                                size_t len = s ? strlen(s) : 0;
                                if (!s || len == 0 || len >= sizeof(up) || len != json_string_length(m))
                                        FAIL("rules[%zu].methods[%zu] must be a method such as GET", i, k);
                                for (size_t c = 0; c <= len; c++)
                                        up[c] = (s[c] >= 'a' && s[c] <= 'z') ? (char)(s[c] - 32) : s[c];
                                if (!method_valid(up))
                                        FAIL("rules[%zu].methods[%zu] must be a method such as GET", i, k);
                                snprintf(r->methods[r->n_methods++], sizeof(r->methods[0]), "%s", up);
                                json_array_append_new(nm, json_string(up));
                        }
                } else
                        json_object_del(nr, "methods");
                if (!json_is_array(paths) || json_array_size(paths) == 0 ||
                    json_array_size(paths) > EGRESS_SECRET_MAX_RULE_PATHS)
                        FAIL("rules[%zu].paths must be an array of 1 to %d paths", i, EGRESS_SECRET_MAX_RULE_PATHS);
                size_t k;
                json_t *pv;
                json_array_foreach(paths, k, pv) {
                        const char *s = json_string_value(pv);
                        size_t len = s ? json_string_length(pv) : 0;
                        bool wild = len >= 2 && s[len - 2] == '/' && s[len - 1] == '*';
                        size_t stem = wild ? len - 1 : len; /* a trailing star: the stem "/a/" is judged */
                        bool ok = s && len > 0 && len <= EGRESS_SECRET_MAX_RULE_PATH && strlen(s) == len &&
                                  !memchr(s, '*', stem) && path_canonical(s, stem);
                        if (!ok)
                                FAIL("rules[%zu].paths[%zu] must be a canonical path (from \"/\", no \".\" or "
                                     "\"..\" segments, no ';', backslash, '?' or encoded slash, at most %d bytes), "
                                     "exact or ending in \"/*\"",
                                     i, k, EGRESS_SECRET_MAX_RULE_PATH);
                        if (!(r->paths[r->n_paths] = strdup(s)))
                                FAIL("out of memory");
                        r->n_paths++;
                        json_array_append_new(np, json_string(s));
                }
        }
        *ret = norm;
        if (ret_rules) {
                *ret_rules = out;
                *ret_n = n_out;
        } else
                egress_secret_rules_free(out, n_out);
        return 0;
#undef FAIL
}

bool egress_secret_rules_allow(const EgressSecret *s, const char *method, const char *target) {
        if (!s->rules || s->n_rules == 0)
                return true;
        size_t n = strcspn(target, "?");
        if (!path_canonical(target, n))
                return false;
        for (unsigned i = 0; i < s->n_rules; i++) {
                const EgressSecretRule *r = &s->rules[i];
                bool method_ok = r->n_methods == 0;
                for (unsigned k = 0; k < r->n_methods && !method_ok; k++)
                        method_ok = strcmp(r->methods[k], method) == 0;
                if (!method_ok)
                        continue;
                for (unsigned k = 0; k < r->n_paths; k++) {
                        const char *p = r->paths[k];
                        size_t pl = strlen(p);
                        if (pl >= 2 && p[pl - 1] == '*') {
                                /* a trailing star: anything under the stem */
                                if (n >= pl - 1 && memcmp(target, p, pl - 1) == 0)
                                        return true;
                        } else if (n == pl && memcmp(target, p, pl) == 0)
                                return true;
                }
        }
        return false;
}

bool egress_secret_applies(const EgressSecret *s, const char *host, uint16_t port) {
        return s && s->hosts && egress_policy_check(s->hosts, host, port) == EGRESS_ALLOW;
}

bool egress_any_secret_applies(const EgressSecret *secrets, size_t n, const char *host, uint16_t port) {
        for (size_t i = 0; i < n; i++)
                if (egress_secret_applies(&secrets[i], host, port))
                        return true;
        return false;
}

int egress_substitute(const char *in, size_t len, const EgressSecret *secrets, size_t n, const char *host,
                      uint16_t port, char **ret, size_t *ret_len) {
        size_t cap = len + 1, out_len = 0;
        char *out = malloc(cap);
        if (!out)
                return -ENOMEM;
        int count = 0;
        size_t i = 0;
        while (i < len) {
                const EgressSecret *hit = NULL;
                /* Placeholders all start with the same prefix: cheap to skip. */
                if (in[i] == EGRESS_PLACEHOLDER_PREFIX[0])
                        for (size_t k = 0; k < n; k++) {
                                size_t pl = strlen(secrets[k].placeholder);
                                if (pl && pl <= len - i && memcmp(in + i, secrets[k].placeholder, pl) == 0 &&
                                    egress_secret_applies(&secrets[k], host, port)) {
                                        hit = &secrets[k];
                                        break;
                                }
                        }
                const char *piece = hit ? hit->value : in + i;
                size_t piece_len = hit ? strlen(hit->value) : 1;
                if (out_len + piece_len + 1 > cap) {
                        size_t ncap = cap * 2 + piece_len;
                        if (ncap > MAX_SUBSTITUTED + 1) {
                                free(out);
                                return -E2BIG;
                        }
                        char *np = realloc(out, ncap);
                        if (!np) {
                                free(out);
                                return -ENOMEM;
                        }
                        out = np;
                        cap = ncap;
                }
                memcpy(out + out_len, piece, piece_len);
                out_len += piece_len;
                i += hit ? strlen(hit->placeholder) : 1;
                count += hit ? 1 : 0;
        }
        out[out_len] = '\0';
        *ret = out;
        *ret_len = out_len;
        return count;
}

/* The value as its header carries it: format with {value} replaced. */
static int header_line(const EgressSecret *s, char **ret, size_t *ret_len) {
        const char *fmt = s->format ? s->format : "{value}";
        const char *at = strstr(fmt, "{value}");
        if (!at)
                return -EINVAL;
        char *line = NULL;
        int n = asprintf(&line, "%s: %.*s%s%s\r\n", s->header, (int)(at - fmt), fmt, s->value, at + 7);
        if (n < 0)
                return -ENOMEM;
        *ret = line;
        *ret_len = (size_t)n;
        return 0;
}

/* Whether a header line (without its CRLF) has the given name. */
static bool line_is_header(const char *line, size_t len, const char *name) {
        size_t nl = strlen(name);
        return len > nl && line[nl] == ':' && strncasecmp(line, name, nl) == 0;
}

int egress_secret_prepare_head(const char *head, size_t len, const EgressSecret *secrets, size_t n,
                               const char *host, uint16_t port, char **ret, size_t *ret_len, char *why,
                               size_t why_len) {
        /* The request line: METHOD SP target SP version CRLF. */
        const char *eol = memmem(head, len, "\r\n", 2);
        const char *sp1 = eol ? memchr(head, ' ', (size_t)(eol - head)) : NULL;
        const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
        if (!sp2 || sp1 - head >= 24 || len < 4 || memcmp(head + len - 4, "\r\n\r\n", 4) != 0)
                return -EINVAL;
        char method[24];
        memcpy(method, head, (size_t)(sp1 - head));
        method[sp1 - head] = '\0';
        size_t tlen = (size_t)(sp2 - sp1 - 1);
        char *target = strndup(sp1 + 1, tlen);
        if (!target)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const EgressSecret *s = &secrets[i];
                if (!egress_secret_applies(s, host, port))
                        continue;
                bool used = s->header[0] || memmem(head, len, s->placeholder, strlen(s->placeholder));
                if (used && !egress_secret_rules_allow(s, method, target)) {
                        snprintf(why, why_len, "secret %s: no rule allows %s %.100s%s", s->name, method, target,
                                 tlen > 100 ? "..." : "");
                        free(target);
                        return -EACCES;
                }
        }
        free(target);
        char *sub = NULL;
        size_t sub_len = 0;
        int count = egress_substitute(head, len, secrets, n, host, port, &sub, &sub_len);
        if (count < 0)
                return count;
        /* Header secrets: drop the sandbox's header of that name, add ours
         * before the blank line that ends the head. */
        bool any = false;
        for (size_t i = 0; i < n && !any; i++)
                any = secrets[i].header[0] && egress_secret_applies(&secrets[i], host, port);
        if (!any) {
                *ret = sub;
                *ret_len = sub_len;
                return count;
        }
        size_t cap = sub_len + 1, out_len = 0;
        for (size_t i = 0; i < n; i++)
                if (secrets[i].header[0] && egress_secret_applies(&secrets[i], host, port))
                        cap += EGRESS_SECRET_MAX_HEADER + EGRESS_SECRET_MAX_FORMAT + EGRESS_SECRET_MAX_VALUE + 8;
        char *out = malloc(cap);
        if (!out) {
                free(sub);
                return -ENOMEM;
        }
        size_t pos = 0;
        while (pos < sub_len) {
                const char *nl = memmem(sub + pos, sub_len - pos, "\r\n", 2);
                size_t line_len = nl ? (size_t)(nl - (sub + pos)) : sub_len - pos;
                if (line_len == 0)
                        break; /* the blank line */
                bool drop = false;
                if (pos > 0)
                        for (size_t i = 0; i < n && !drop; i++)
                                drop = secrets[i].header[0] && egress_secret_applies(&secrets[i], host, port) &&
                                       line_is_header(sub + pos, line_len, secrets[i].header);
                if (!drop) {
                        memcpy(out + out_len, sub + pos, line_len + 2);
                        out_len += line_len + 2;
                }
                pos += line_len + 2;
        }
        for (size_t i = 0; i < n; i++) {
                if (!secrets[i].header[0] || !egress_secret_applies(&secrets[i], host, port))
                        continue;
                char *line = NULL;
                size_t ll = 0;
                int r = header_line(&secrets[i], &line, &ll);
                if (r < 0) {
                        free(out);
                        free(sub);
                        return r;
                }
                memcpy(out + out_len, line, ll);
                out_len += ll;
                explicit_bzero(line, ll);
                free(line);
                count++;
        }
        memcpy(out + out_len, "\r\n", 2);
        out_len += 2;
        out[out_len] = '\0';
        explicit_bzero(sub, sub_len);
        free(sub);
        *ret = out;
        *ret_len = out_len;
        return count;
}
