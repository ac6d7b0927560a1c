#include "cli/secrets.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "cli/client.h"
#include "cli/format.h"
#include "cli/parse.h"
#include "common/macro.h"

#define SECRET_NAME_MAX 64
#define SECRET_HOSTS_MAX 64
#define HOST_PATTERN_MAX 260 /* a 253-byte name and ":65535" */
#define EGRESS_LIMIT_MAX 10000
#define SECRET_RULES_MAX 16
#define SECRET_RULE_MAX 2048 
/* [A-Za-z_][A-Za-z0-9_]{0,63}: the name is an environment variable in every
 * sandbox, and a path segment of the API. */
static bool secret_name_valid(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > SECRET_NAME_MAX || (s[0] >= '0' && s[0] <= '9'))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') ||
                      (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
                        return false;
        return true;
}

int secret_value_trim(char *buf, size_t len, char *err, size_t errlen) {
        if (len > 0 && buf[len - 1] == '\n')
                len--;
        if (len > 0 && buf[len - 1] == '\r')
                len--;
        if (len == 0) {
                snprintf(err, errlen, "the value is empty (it is read from stdin)");
                return -EINVAL;
        }
        if (len > CLI_SECRET_VALUE_MAX) {
                snprintf(err, errlen, "the value is longer than %d bytes", CLI_SECRET_VALUE_MAX);
                return -EINVAL;
        }
        if (memchr(buf, '\r', len) || memchr(buf, '\n', len) || memchr(buf, '\0', len)) {
                snprintf(err, errlen, "the value holds a line break or NUL (it goes into HTTP headers)");
                return -EINVAL;
        }
        buf[len] = '\0';
        return (int)len;
}

/* Adds the comma-separated patterns of one --hosts to arr. */
static int add_hosts(json_t *arr, const char *list, char *err, size_t errlen) {
        const char *p = list;
        for (;;) {
                const char *end = strchr(p, ',');
                size_t n = end ? (size_t)(end - p) : strlen(p);
                if (n == 0 || n > HOST_PATTERN_MAX) {
                        snprintf(err, errlen, "--hosts: each host is 1 to %d bytes (h1,h2,...)",
                                 HOST_PATTERN_MAX);
                        return -EINVAL;
                }
                for (size_t i = 0; i < n; i++)
                        if ((unsigned char)p[i] <= 0x20 || p[i] == 0x7f) {
                                snprintf(err, errlen, "--hosts: '%.*s' has a space or control character",
                                         (int)(n > 80 ? 80 : n), p);
                                return -EINVAL;
                        }
                if (json_array_size(arr) >= SECRET_HOSTS_MAX) {
                        snprintf(err, errlen, "--hosts: at most %d hosts", SECRET_HOSTS_MAX);
                        return -EINVAL;
                }
                if (json_array_append_new(arr, json_stringn(p, n)) < 0) {
                        snprintf(err, errlen, "--hosts: '%.*s' is not UTF-8", (int)(n > 80 ? 80 : n), p);
                        return -EINVAL;
                }
                if (!end)
                        return 0;
                p = end + 1;
        }
}

/* One --rule: "PATH[,PATH...]" for every method, or "METHOD[,METHOD...] PATH[,PATH...]".
 * Only its shape is checked here; the daemon judges paths and methods. */
static int add_rule(json_t *rules, const char *text, char *err, size_t errlen) {
        size_t n = strlen(text);
        if (n == 0 || n > SECRET_RULE_MAX) {
                snprintf(err, errlen, "--rule: 1 to %d bytes, such as 'GET /repos/acme/*'", SECRET_RULE_MAX);
                return -EINVAL;
        }
        if (json_array_size(rules) >= SECRET_RULES_MAX) {
                snprintf(err, errlen, "--rule: at most %d rules", SECRET_RULES_MAX);
                return -EINVAL;
        }
        const char *sp = strchr(text, ' ');
        const char *paths = sp ? sp + 1 : text;
        _cleanup_json_ json_t *rule = json_object(), *m = json_array(), *p = json_array();
        if (!rule || !m || !p) {
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        for (int pass = 0; pass < 2; pass++) {
                const char *at = pass == 0 ? text : paths;
                size_t len = pass == 0 ? (sp ? (size_t)(sp - text) : 0) : strlen(paths);
                json_t *into = pass == 0 ? m : p;
                while (len > 0) {
                        const char *comma = memchr(at, ',', len);
                        size_t k = comma ? (size_t)(comma - at) : len;
                        if (k == 0 || memchr(at, ' ', k)) {
                                snprintf(err, errlen, "--rule '%.80s': want 'GET,POST /a/*,/b' or '/a/*'", text);
                                return -EINVAL;
                        }
                        json_array_append_new(into, json_stringn(at, k));
                        at += k + (comma ? 1 : 0);
                        len -= k + (comma ? 1 : 0);
                        if (comma && len == 0) {
                                snprintf(err, errlen, "--rule '%.80s': a trailing comma", text);
                                return -EINVAL;
                        }
                }
        }
        if (json_array_size(p) == 0) {
                snprintf(err, errlen, "--rule '%.80s': name at least one path", text);
                return -EINVAL;
        }
        if (json_array_size(m) > 0)
                json_object_set(rule, "methods", m);
        json_object_set(rule, "paths", p);
        return json_array_append(rules, rule);
}

/* Reads at most max bytes of stdin into buf (max + 1 bytes); *ret_len gets
 * how many, and max + 1 means there was more. On a terminal the echo is
 * turned off and one line is read, so the value never shows on screen. */
static int read_value(char *buf, size_t max, size_t *ret_len) {
        struct termios old, quiet;
        bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &old) == 0;
        size_t len = 0;
        int r = 0;

        if (tty) {
                quiet = old;
                quiet.c_lflag &= ~(tcflag_t)ECHO;
                quiet.c_lflag |= ECHONL;
                tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
                fprintf(stderr, "value (not shown): ");
                fflush(stderr);
        }
        while (len <= max) {
                ssize_t n = read(STDIN_FILENO, buf + len, max + 1 - len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        r = -errno;
                        break;
                }
                if (n == 0)
                        break;
                len += (size_t)n;
                if (tty && buf[len - 1] == '\n')
                        break;
        }
        if (tty)
                tcsetattr(STDIN_FILENO, TCSAFLUSH, &old);
        *ret_len = len;
        return r;
}

/* ---- secrets set ---- */

static const char set_usage[] = "--hosts HOST[,HOST...] [--header NAME [--format FMT]] [--rule RULE]... NAME";
static const char set_help[] =
        "Stores a secret for the egress proxy. Its value is read from stdin (never from\n"
        "the command line, where other users and shell history would see it); one trailing\n"
        "newline is dropped. Every sandbox of your owner then sees $NAME holding a\n"
        "placeholder, and the proxy puts the value in its place in requests to HOSTs only.\n"
        "Setting an existing name replaces everything but the placeholder, which stays:\n"
        "a header or rules left out are cleared.\n\n"
        "Options:\n"
        "  --hosts LIST     the hosts the value may go to: api.example.com, *.example.com,\n"
        "                   host:port (comma-separated; repeatable; at most 64)\n"
        "  --header NAME    the proxy sets this header on every request to the hosts\n"
        "  --format FMT     the header's value, {value} where the secret goes\n"
        "                   (default {value}), such as 'Bearer {value}'\n"
        "  --rule RULE      only requests a rule allows carry the value; others are refused\n"
        "                   and logged. 'GET,HEAD /repos/acme/*,/user' or '/v1/*' (every\n"
        "                   method); a path is exact or ends in /*. Repeatable, at most 16\n\n"
        "Examples:\n"
        "  printf %s \"$OPENAI_API_KEY\" | runtime secrets set OPENAI_API_KEY --hosts api.openai.com\n"
        "  runtime secrets set GITHUB_TOKEN --hosts api.github.com --header Authorization \\\n"
        "      --format 'Bearer {value}' --rule 'GET /repos/acme/*' < token.txt\n";

/* The value from stdin, trimmed and checked, into body["value"]. */
static int body_add_value(json_t *body) {
        char value[CLI_SECRET_VALUE_MAX + 3], err[256];
        size_t len = 0;
        int r = read_value(value, sizeof(value) - 2, &len);
        if (r < 0) {
                explicit_bzero(value, sizeof(value));
                return cli_fail("reading the value from stdin: %s", strerror(-r));
        }
        r = secret_value_trim(value, len, err, sizeof(err));
        json_t *v = r >= 0 ? json_stringn(value, (size_t)r) : NULL;
        explicit_bzero(value, sizeof(value));
        if (r < 0)
                return cli_fail("%s", err);
        if (!v || json_object_set_new(body, "value", v) < 0)
                return cli_fail("the value is not UTF-8 text");
        return 0;
}

int cmd_secrets_set(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, 'j'},
                {"hosts", required_argument, NULL, 'H'},
                {"header", required_argument, NULL, 'e'},
                {"format", required_argument, NULL, 'f'},
                {"rule", required_argument, NULL, 'r'},
                {NULL, 0, NULL, 0},
        };
        static const char verb[] = "secrets set";
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *hosts = json_array(), *rules = json_array(), *body = NULL, *ans = NULL;
        const char *header = NULL, *format = NULL;
        char err[256], path[128];
        int opt, r;
        CliError e;

        if (!hosts || !rules)
                return cli_fail("out of memory");
        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
                switch (opt) {
                case 'h':
                        return cli_help(verb, set_usage, set_help);
                case 'j':
                        ctx->json = true;
                        break;
                case 'H':
                        if (add_hosts(hosts, optarg, err, sizeof(err)) < 0)
                                return cli_usage_error(verb, set_usage, "%s", err);
                        break;
                case 'e':
                        if (!*optarg || strlen(optarg) > 64 || strpbrk(optarg, " :\t\r\n"))
                                return cli_usage_error(verb, set_usage, "--header: a header name, such as Authorization");
                        header = optarg;
                        break;
                case 'f':
                        if (!strstr(optarg, "{value}") || strlen(optarg) > 256)
                                return cli_usage_error(verb, set_usage,
                                                       "--format: at most 256 bytes holding {value}, such as 'Bearer {value}'");
                        format = optarg;
                        break;
                case 'r':
                        if (add_rule(rules, optarg, err, sizeof(err)) < 0)
                                return cli_usage_error(verb, set_usage, "%s", err);
                        break;
                case ':':
                        return cli_usage_error(verb, set_usage, "%s needs a value", argv[optind - 1]);
                default:
                        return cli_usage_error(verb, set_usage, "unknown option '%s'", argv[optind - 1]);
                }
        }
        if (argc - optind != 1)
                return cli_usage_error(verb, set_usage,
                                       argc - optind < 1
                                               ? "a NAME is required"
                                               : "too many arguments (the value is read from stdin)");
        const char *name = argv[optind];
        if (!secret_name_valid(name))
                return cli_usage_error(
                        verb, set_usage,
                        "NAME must be an environment variable name: [A-Za-z_][A-Za-z0-9_]{0,63}");
        if (json_array_size(hosts) == 0)
                return cli_usage_error(verb, set_usage, "--hosts is required: where may the value go?");
        if (format && !header)
                return cli_usage_error(verb, set_usage, "--format needs --header");

        body = json_pack("{s:O}", "hosts", hosts);
        if (!body)
                return cli_fail("out of memory");
        if ((header && json_object_set_new(body, "header", json_string(header)) < 0) ||
            (format && json_object_set_new(body, "format", json_string(format)) < 0) ||
            (json_array_size(rules) > 0 && json_object_set(body, "rules", rules) < 0))
                return cli_fail("--header, --format and --rule must be UTF-8 text");
        if ((r = body_add_value(body)) > 0)
                return r;

        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        snprintf(path, sizeof(path), "/v1/egress-secrets/%s", name);
        r = client_json(c, "PUT", path, body, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json) {
                cli_print_json(ans);
                return CLI_EXIT_OK;
        }
        printf("%s set; sandboxes see $%s = ", name, name);
        format_put_safe(stdout, json_string_value(json_object_get(ans, "placeholder")), 0);
        fputc('\n', stdout);
        return CLI_EXIT_OK;
}

/* ---- secrets rotate ---- */

static const char rotate_usage[] = "NAME";
static const char rotate_help[] =
        "Gives a secret a new value, read from stdin as for 'secrets set'. Its placeholder,\n"
        "hosts, header and rules stay, so running sandboxes carry on unchanged.\n\n"
        "Example:\n  runtime secrets rotate GITHUB_TOKEN < new-token.txt\n";

int cmd_secrets_rotate(CliContext *ctx, int argc, char **argv) {
        _cleanup_json_ json_t *body = json_object(), *ans = NULL;
        char **pos, path[160];
        int npos, r;

        r = cli_simple_args(ctx, "secrets rotate", rotate_usage, rotate_help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        if (!secret_name_valid(pos[0]))
                return cli_usage_error("secrets rotate", rotate_usage, "'%.80s' is not a secret name", pos[0]);
        if (!body)
                return cli_fail("out of memory");
        if ((r = body_add_value(body)) > 0)
                return r;
        snprintf(path, sizeof(path), "/v1/egress-secrets/%s:rotate", pos[0]);
        r = cli_post(ctx, path, body, &ans);
        if (r != CLI_EXIT_OK)
                return r;
        if (ctx->json)
                cli_print_json(ans);
        else
                printf("%s rotated; the placeholder is unchanged\n", pos[0]);
        return CLI_EXIT_OK;
}

/* ---- secrets ls ---- */

static const char ls_help[] = "Lists your secrets: names, hosts and placeholders; never a value.\n";

int cmd_secrets_ls(CliContext *ctx, int argc, char **argv) {
        _cleanup_json_ json_t *ans = NULL;
        int r = cli_get_resource(ctx, "secrets ls", ls_help, argc, argv, "/v1/egress-secrets", &ans);
        if (r != CLI_PROCEED)
                return r;
        printf("%-24s %-30s %s\n", "NAME", "HOSTS", "PLACEHOLDER");
        size_t i, j;
        json_t *s, *h;
        json_array_foreach(json_object_get(ans, "secrets"), i, s) {
                format_put_safe(stdout, json_string_value(json_object_get(s, "name")), 24);
                fputc(' ', stdout);
                int w = 0;
                json_array_foreach(json_object_get(s, "hosts"), j, h) {
                        const char *hs = json_string_value(h);
                        if (j) {
                                fputc(',', stdout);
                                w++;
                        }
                        format_put_safe(stdout, hs, 0);
                        w += hs ? (int)strlen(hs) : 0;
                }
                for (; w < 30; w++)
                        fputc(' ', stdout);
                fputc(' ', stdout);
                format_put_safe(stdout, json_string_value(json_object_get(s, "placeholder")), 0);
                fputc('\n', stdout);
        }
        return CLI_EXIT_OK;
}

/* ---- secrets rm ---- */

static const char rm_help[] = "Deletes secrets. Sandboxes keep the placeholder in their environment, but\n"
                              "the proxy no longer replaces it.\n\n"
                              "Example:\n  runtime secrets rm OPENAI_API_KEY\n";

int cmd_secrets_rm(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        char **pos, path[128];
        int npos, r, rc = CLI_EXIT_OK;
        CliError e;

        r = cli_simple_args(ctx, "secrets rm", "NAME...", rm_help, argc, argv, 1, 64, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        for (int i = 0; i < npos; i++)
                if (!secret_name_valid(pos[i]))
                        return cli_usage_error("secrets rm", "NAME...", "'%.80s' is not a secret name",
                                               pos[i]);
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        for (int i = 0; i < npos; i++) {
                _cleanup_json_ json_t *ans = NULL;
                snprintf(path, sizeof(path), "/v1/egress-secrets/%s", pos[i]);
                r = client_json(c, "DELETE", path, NULL, &ans, &e);
                if (r < 0) {
                        rc = cli_error_print(&e);
                        continue;
                }
                if (ctx->json)
                        cli_print_json(ans);
                else
                        printf("%s deleted\n", pos[i]);
        }
        return rc;
}

/* ---- sandbox egress ---- */

static const char egress_usage[] = "[--limit N] ID";
static const char egress_help[] =
        "Shows the sandbox's egress audit log, newest first: every connection the proxy\n"
        "allowed or refused, why, and the bytes each way.\n\n"
        "Options:\n"
        "  --limit N   at most N entries (default 100, at most 10000)\n\n"
        "Example:\n  runtime sandbox egress sbx_9f2c4e1a7b3d5c6e8f01\n";

int cmd_sandbox_egress(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, 'j'},
                {"limit", required_argument, NULL, 'l'},
                {NULL, 0, NULL, 0},
        };
        static const char verb[] = "sandbox egress";
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL;
        long limit = 100;
        char path[160];
        int opt, r;
        CliError e;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
                switch (opt) {
                case 'h':
                        return cli_help(verb, egress_usage, egress_help);
                case 'j':
                        ctx->json = true;
                        break;
                case 'l': {
                        char *end;
                        errno = 0;
                        limit = strtol(optarg, &end, 10);
                        if (errno || end == optarg || *end || limit < 1 || limit > EGRESS_LIMIT_MAX)
                                return cli_usage_error(verb, egress_usage, "--limit: a number from 1 to %d",
                                                       EGRESS_LIMIT_MAX);
                        break;
                }
                case ':':
                        return cli_usage_error(verb, egress_usage, "%s needs a value", argv[optind - 1]);
                default:
                        return cli_usage_error(verb, egress_usage, "unknown option '%s'", argv[optind - 1]);
                }
        }
        if (argc - optind != 1)
                return cli_usage_error(verb, egress_usage,
                                       argc - optind < 1 ? "an ID is required" : "too many arguments");
        r = cli_check_id(verb, egress_usage, argv[optind]);
        if (r > 0)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/egress?limit=%ld", argv[optind], limit);
        r = client_json(c, "GET", path, NULL, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json) {
                cli_print_json(ans);
                return CLI_EXIT_OK;
        }
        printf("%-21s %-8s %-32s %-8s %9s %9s  %s\n", "TIME", "KIND", "HOST:PORT", "RESULT", "OUT", "IN",
               "REASON");
        size_t i;
        json_t *en;
        json_array_foreach(json_object_get(ans, "entries"), i, en) {
                char hp[300], out[32], in[32];
                const char *host = json_string_value(json_object_get(en, "host"));
                snprintf(hp, sizeof(hp), "%s:%lld", host ? host : "?",
                         (long long)json_integer_value(json_object_get(en, "port")));
                format_bytes(out, sizeof(out),
                             (long long)json_integer_value(json_object_get(en, "bytesOut")));
                format_bytes(in, sizeof(in), (long long)json_integer_value(json_object_get(en, "bytesIn")));
                format_put_safe(stdout, json_string_value(json_object_get(en, "at")), 21);
                fputc(' ', stdout);
                format_put_safe(stdout, json_string_value(json_object_get(en, "kind")), 8);
                fputc(' ', stdout);
                format_put_safe(stdout, hp, 32);
                fputc(' ', stdout);
                const char *result =
                        json_is_true(json_object_get(en, "allowed"))
                                ? (json_is_true(json_object_get(en, "intercepted")) ? "allowed*" : "allowed")
                                : "refused";
                printf("%-8s %9s %9s  ", result, out, in);
                format_put_safe(stdout, json_string_value(json_object_get(en, "reason")), 0);
                fputc('\n', stdout);
        }
        if (json_array_size(json_object_get(ans, "entries")) == 0)
                fprintf(stderr, "no egress yet\n");
        return CLI_EXIT_OK;
}
