#include "egress/policy.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "egress/addr.h"

typedef struct Pattern {
        char host[EGRESS_MAX_HOST + 1]; /* normalised; for wildcards the suffix without "*." */
        bool wildcard;
        bool is_ip;
        char ip_text[64]; /* canonical address text when is_ip */
        unsigned port;    /* 0: the default ports (allow) or every port (deny) */
        char *source;     /* as given, normalised, for to_json */
} Pattern;

struct EgressPolicy {
        bool internet;
        Pattern *allow;
        size_t n_allow;
        bool has_allow; /* an allow list was given, even an empty one */
        Pattern *deny;
        size_t n_deny;
};

static const unsigned default_ports[] = { 80, 443 };

int egress_host_normalize(const char *host, char *out, size_t out_len) {
        if (!host || !out || out_len == 0)
                return -EINVAL;
        size_t len = strnlen(host, EGRESS_MAX_HOST + 2);
        if (len == 0 || len > EGRESS_MAX_HOST + 1)
                return -EINVAL;

        struct sockaddr_storage ss;
        int r = egress_parse_ip_literal(host, &ss);
        if (r < 0)
                return -EINVAL;
        if (r == 1)
                return egress_addr_format((struct sockaddr *)&ss, out, out_len);

        if (host[len - 1] == '.')
                len--;
        if (len == 0 || len > EGRESS_MAX_HOST || len + 1 > out_len)
                return -EINVAL;
        size_t label = 0;
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)host[i];
                if (c == '.') {
                        if (label == 0 || out[i - 1] == '-')
                                return -EINVAL;
                        label = 0;
                        out[i] = '.';
                        continue;
                }
                if (!(isalnum(c) || c == '-' || c == '_'))
                        return -EINVAL;
                if (c == '-' && label == 0)
                        return -EINVAL;
                if (++label > 63)
                        return -EINVAL;
                out[i] = (char)tolower(c);
        }
        if (label == 0 || out[len - 1] == '-')
                return -EINVAL;
        out[len] = '\0';
        return 0;
}

static int parse_port(const char *s, unsigned *ret) {
        if (!*s || strlen(s) > 5)
                return -EINVAL;
        unsigned v = 0;
        for (const char *p = s; *p; p++) {
                if (!isdigit((unsigned char)*p))
                        return -EINVAL;
                v = v * 10 + (unsigned)(*p - '0');
        }
        if (v == 0 || v > 65535)
                return -EINVAL;
        *ret = v;
        return 0;
}

static int parse_pattern(const char *text, Pattern *p) {
        char buf[EGRESS_MAX_HOST + 16];
        size_t len = strnlen(text, sizeof(buf));
        if (len == 0 || len >= sizeof(buf))
                return -EINVAL;
        memcpy(buf, text, len + 1);
        memset(p, 0, sizeof(*p));

        char *host = buf, *port = NULL;
        if (buf[0] == '[') {
                char *close = strchr(buf, ']');
                if (!close)
                        return -EINVAL;
                if (close[1] == ':')
                        port = close + 2;
                else if (close[1] != '\0')
                        return -EINVAL;
                close[1] = '\0';
        } else {
                char *colon = strchr(buf, ':');
                if (colon && !strchr(colon + 1, ':')) {
                        *colon = '\0';
                        port = colon + 1;
                }
        }
        if (port && parse_port(port, &p->port) < 0)
                return -EINVAL;

        if (strncmp(host, "*.", 2) == 0) {
                p->wildcard = true;
                host += 2;
        }
        struct sockaddr_storage ss;
        int r = egress_parse_ip_literal(host, &ss);
        if (r < 0)
                return -EINVAL;
        if (r == 1) {
                if (p->wildcard)
                        return -EINVAL;
                p->is_ip = true;
                if (egress_addr_format((struct sockaddr *)&ss, p->ip_text, sizeof(p->ip_text)) < 0)
                        return -EINVAL;
                snprintf(p->host, sizeof(p->host), "%s", p->ip_text);
        } else if (egress_host_normalize(host, p->host, sizeof(p->host)) < 0)
                return -EINVAL;
        /* "*.com" style patterns are allowed; a bare "*" is not a host. */
        char src[EGRESS_MAX_HOST + 16];
        bool v6 = p->is_ip && strchr(p->ip_text, ':');
        if (p->port)
                snprintf(src, sizeof(src), "%s%s%s%s:%u", p->wildcard ? "*." : "", v6 ? "[" : "", p->host,
                         v6 ? "]" : "", p->port);
        else
                snprintf(src, sizeof(src), "%s%s", p->wildcard ? "*." : "", p->host);
        p->source = strdup(src);
        return p->source ? 0 : -ENOMEM;
}

static void patterns_free(Pattern *ps, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(ps[i].source);
        free(ps);
}

void egress_policy_free(EgressPolicy *p) {
        if (!p)
                return;
        patterns_free(p->allow, p->n_allow);
        patterns_free(p->deny, p->n_deny);
        free(p);
}

static int parse_list(const json_t *arr, const char *field, Pattern **ret, size_t *ret_n, char *err,
                      size_t err_len) {
        if (!json_is_array(arr)) {
                snprintf(err, err_len, "network.%s must be an array of host patterns", field);
                return -EINVAL;
        }
        size_t n = json_array_size(arr);
        if (n > EGRESS_MAX_PATTERNS) {
                snprintf(err, err_len, "network.%s has %zu patterns; at most %d are allowed", field, n,
                         EGRESS_MAX_PATTERNS);
                return -EINVAL;
        }
        Pattern *ps = calloc(n ? n : 1, sizeof(Pattern));
        if (!ps)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const json_t *v = json_array_get(arr, i);
                if (!json_is_string(v)) {
                        snprintf(err, err_len, "network.%s[%zu] must be a string", field, i);
                        patterns_free(ps, i);
                        return -EINVAL;
                }
                int r = parse_pattern(json_string_value(v), &ps[i]);
                if (r < 0) {
                        snprintf(err, err_len,
                                 "network.%s[%zu] is not a host pattern (use \"example.org\", "
                                 "\"*.example.org\" or \"example.org:8443\")",
                                 field, i);
                        patterns_free(ps, i + 1);
                        return r;
                }
        }
        *ret = ps;
        *ret_n = n;
        return 0;
}

int egress_policy_parse(const json_t *network, EgressPolicy **ret, char *err, size_t err_len) {
        EgressPolicy *p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        if (!network || json_is_null(network)) {
                *ret = p;
                return 0;
        }
        if (!json_is_object(network)) {
                snprintf(err, err_len, "network must be an object");
                egress_policy_free(p);
                return -EINVAL;
        }
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)network, key, val) {
                int r = 0;
                if (strcmp(key, "internet") == 0) {
                        if (!json_is_boolean(val)) {
                                snprintf(err, err_len, "network.internet must be a boolean");
                                r = -EINVAL;
                        } else
                                p->internet = json_is_true(val);
                } else if (strcmp(key, "allow") == 0) {
                        r = parse_list(val, "allow", &p->allow, &p->n_allow, err, err_len);
                        p->has_allow = r == 0;
                } else if (strcmp(key, "deny") == 0)
                        r = parse_list(val, "deny", &p->deny, &p->n_deny, err, err_len);
                else {
                        snprintf(err, err_len, "unknown field network.%.64s", key);
                        r = -EINVAL;
                }
                if (r < 0) {
                        egress_policy_free(p);
                        return r;
                }
        }
        /* An allow list with no entries would allow nothing: that is what
         * internet:false says, and saying it two ways invites mistakes. */
        if (p->has_allow && p->n_allow == 0)
                p->has_allow = false;
        *ret = p;
        return 0;
}

static json_t *patterns_json(const Pattern *ps, size_t n) {
        json_t *a = json_array();
        for (size_t i = 0; a && i < n; i++)
                json_array_append_new(a, json_string(ps[i].source));
        return a;
}

json_t *egress_policy_to_json(const EgressPolicy *p) {
        return json_pack("{s:b, s:o, s:o}", "internet", p->internet, "allow", patterns_json(p->allow, p->n_allow),
                         "deny", patterns_json(p->deny, p->n_deny));
}

static bool host_matches(const Pattern *pat, const char *host, bool host_is_ip) {
        if (pat->is_ip != host_is_ip)
                return false;
        if (!pat->wildcard)
                return strcmp(pat->host, host) == 0;
        size_t hl = strlen(host), sl = strlen(pat->host);
        return hl > sl + 1 && host[hl - sl - 1] == '.' && strcmp(host + hl - sl, pat->host) == 0;
}

static bool port_allowed(unsigned pattern_port, unsigned port) {
        if (pattern_port)
                return pattern_port == port;
        for (size_t i = 0; i < sizeof(default_ports) / sizeof(default_ports[0]); i++)
                if (default_ports[i] == port)
                        return true;
        return false;
}

static void rule_set(char *rule, size_t rule_len, const char *what, const Pattern *pat) {
        if (rule && rule_len)
                snprintf(rule, rule_len, "%s%s%s", what, pat ? " " : "", pat && pat->source ? pat->source : "");
}

EgressVerdict egress_policy_check_rule(const EgressPolicy *p, const char *host, uint16_t port, char *rule,
                                       size_t rule_len) {
        rule_set(rule, rule_len, "", NULL);
        if (!p->internet) {
                rule_set(rule, rule_len, "internet: false", NULL);
                return EGRESS_DENY_NO_INTERNET;
        }
        char norm[EGRESS_MAX_HOST + 1];
        if (port == 0 || egress_host_normalize(host, norm, sizeof(norm)) < 0)
                return EGRESS_DENY_BAD_HOST;
        struct sockaddr_storage ss;
        bool is_ip = egress_parse_ip_literal(host, &ss) == 1;

        for (size_t i = 0; i < p->n_deny; i++)
                if (host_matches(&p->deny[i], norm, is_ip) && (!p->deny[i].port || p->deny[i].port == port)) {
                        rule_set(rule, rule_len, "deny", &p->deny[i]);
                        return EGRESS_DENY_DENIED;
                }

        /* IP literals pass only when the policy names that very address. */
        if (!p->has_allow && !is_ip) {
                if (!port_allowed(0, port))
                        return EGRESS_DENY_PORT;
                rule_set(rule, rule_len, "internet: any public host on 80 and 443", NULL);
                return EGRESS_ALLOW;
        }
        bool host_seen = false;
        for (size_t i = 0; i < p->n_allow; i++) {
                if (!host_matches(&p->allow[i], norm, is_ip))
                        continue;
                host_seen = true;
                if (port_allowed(p->allow[i].port, port)) {
                        rule_set(rule, rule_len, "allow", &p->allow[i]);
                        return EGRESS_ALLOW;
                }
        }
        return host_seen ? EGRESS_DENY_PORT : EGRESS_DENY_NOT_ALLOWED;
}

EgressVerdict egress_policy_check(const EgressPolicy *p, const char *host, uint16_t port) {
        return egress_policy_check_rule(p, host, port, NULL, 0);
}

const char *egress_verdict_reason(EgressVerdict v) {
        switch (v) {
        case EGRESS_ALLOW:
                return "allowed";
        case EGRESS_DENY_NO_INTERNET:
                return "this sandbox has no internet access (network.internet is false)";
        case EGRESS_DENY_NOT_ALLOWED:
                return "the host is not in the sandbox's allow list (IP addresses must be listed as they are)";
        case EGRESS_DENY_DENIED:
                return "the host matches the sandbox's deny list";
        case EGRESS_DENY_PORT:
                return "the port is not allowed for this host (80 and 443 unless a pattern names the port)";
        case EGRESS_DENY_BAD_HOST:
                return "not a valid host name";
        }
        return "refused";
}
