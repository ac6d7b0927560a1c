#include "cli/usage.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/client.h"
#include "cli/format.h"
#include "cli/parse.h"
#include "common/macro.h"

#define USAGE_SINCE_MAX_S (400LL * 86400)


static void money(char *buf, size_t len, json_t *v) {
        if (!json_is_integer(v)) {
                snprintf(buf, len, "none");
                return;
        }
        long long m = (long long)json_integer_value(v);
        snprintf(buf, len, "$%lld.%06lld", m / 1000000, m % 1000000);
}

/* A time for the query: a duration back from now ("24h", "7d") as unix
 * seconds, or an RFC 3339 time passed on as it is (the daemon checks it). */
static int time_arg(const char *what, const char *s, char *out, size_t outlen, char *err, size_t errlen) {
        long long secs;
        if (strchr(s, 'T') && strchr(s, '-')) {
                for (const char *p = s; *p; p++)
                        if (!strchr("0123456789-:TZ", *p)) {
                                snprintf(err, errlen, "%s: '%.40s' is not a time like 2026-11-30T09:00:00Z", what, s);
                                return -EINVAL;
                        }
                if (strlen(s) > 32) {
                        snprintf(err, errlen, "%s: too long for a time", what);
                        return -EINVAL;
                }
                snprintf(out, outlen, "%s", s);
                return 0;
        }
        if (parse_duration_s(what, s, 1, USAGE_SINCE_MAX_S, &secs, err, errlen) < 0)
                return -EINVAL;
        snprintf(out, outlen, "%lld", (long long)time(NULL) - secs);
        return 0;
}

static const char usage_usage[] = "[--since DURATION|TIME] [--until TIME]";
static const char usage_help[] =
        "Shows what your owner's sandboxes were billed in a window, per sandbox and per key.\n"
        "Running time is billed per second; open charges count up to now.\n\n"
        "Options:\n"
        "  --since WHEN   the window's start: a duration back from now (24h, 7d) or a time\n"
        "                 (2026-11-30T09:00:00Z); default 24h\n"
        "  --until WHEN   the window's end, the same way (default now)\n"
        "\nExample:\n  runtime usage --since 7d\n";

int cmd_usage(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, 'j'},
                {"since", required_argument, NULL, 's'},
                {"until", required_argument, NULL, 'u'},
                {NULL, 0, NULL, 0},
        };
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL;
        char since[64] = "", until[64] = "", err[CLI_ERR_MAX], path[256];
        int opt, r;
        CliError e;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
                switch (opt) {
                case 'h':
                        return cli_help("usage", usage_usage, usage_help);
                case 'j':
                        ctx->json = true;
                        break;
                case 's':
                        if (time_arg("--since", optarg, since, sizeof(since), err, sizeof(err)) < 0)
                                return cli_usage_error("usage", usage_usage, "%s", err);
                        break;
                case 'u':
                        if (time_arg("--until", optarg, until, sizeof(until), err, sizeof(err)) < 0)
                                return cli_usage_error("usage", usage_usage, "%s", err);
                        break;
                case ':':
                        return cli_usage_error("usage", usage_usage, "%s needs a value", argv[optind - 1]);
                default:
                        return cli_usage_error("usage", usage_usage, "unknown option '%s'", argv[optind - 1]);
                }
        }
        if (optind < argc)
                return cli_usage_error("usage", usage_usage, "unexpected argument '%.80s'", argv[optind]);
        snprintf(path, sizeof(path), "/v1/usage");
        if (since[0])
                snprintf(path + strlen(path), sizeof(path) - strlen(path), "?since=%s", since);
        if (until[0])
                snprintf(path + strlen(path), sizeof(path) - strlen(path), "%cuntil=%s", since[0] ? '&' : '?',
                         until);
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        r = client_json(c, "GET", path, NULL, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json) {
                cli_print_json(ans);
                return CLI_EXIT_OK;
        }
        char total[48];
        money(total, sizeof(total), json_object_get(ans, "totalMicros"));
        fputs("window: ", stdout);
        format_put_safe(stdout, json_string_value(json_object_get(ans, "since")), 0);
        fputs(" .. ", stdout);
        format_put_safe(stdout, json_string_value(json_object_get(ans, "until")), 0);
        printf("\ntotal: %s for %lld sandbox-seconds\n\n", total,
               (long long)json_integer_value(json_object_get(ans, "totalSeconds")));
        printf("%-26s%-22s%-10s%-16s%s\n", "SANDBOX", "KEY", "SECONDS", "COST", "");
        size_t i;
        json_t *s;
        json_array_foreach (json_object_get(ans, "sandboxes"), i, s) {
                char m[48], secs[32];
                money(m, sizeof(m), json_object_get(s, "micros"));
                snprintf(secs, sizeof(secs), "%lld", (long long)json_integer_value(json_object_get(s, "seconds")));
                format_put_safe(stdout, json_string_value(json_object_get(s, "sandboxId")), 26);
                format_put_safe(stdout, json_string_value(json_object_get(s, "keyId")), 22);
                format_put_safe(stdout, secs, 10);
                format_put_safe(stdout, m, 16);
                printf("%s\n", json_is_true(json_object_get(s, "running")) ? "running" : "");
        }
        printf("\n%-22s%-18s%-10s%s\n", "KEY", "NAME", "SECONDS", "COST");
        json_array_foreach (json_object_get(ans, "keys"), i, s) {
                char m[48], secs[32];
                money(m, sizeof(m), json_object_get(s, "micros"));
                snprintf(secs, sizeof(secs), "%lld", (long long)json_integer_value(json_object_get(s, "seconds")));
                format_put_safe(stdout, json_string_value(json_object_get(s, "keyId")), 22);
                format_put_safe(stdout, json_string_value(json_object_get(s, "name")), 18);
                format_put_safe(stdout, secs, 10);
                format_put_safe(stdout, m, 0);
                fputc('\n', stdout);
        }
        return CLI_EXIT_OK;
}

static const char limits_help[] =
        "Shows the key's access, its daily spending limit (rolling 24 hours: settled charges plus\n"
        "what running sandboxes hold in reserve), and a trial key's remaining free time.\n";

int cmd_limits(CliContext *ctx, int argc, char **argv) {
        _cleanup_json_ json_t *ans = NULL;
        int r = cli_get_resource(ctx, "limits", limits_help, argc, argv, "/v1/limits", &ans);
        if (r != CLI_PROCEED)
                return r;
        json_t *d = json_object_get(ans, "daily");
        char lim[48], used[48], left[48], settled[48], reserved[48];
        money(lim, sizeof(lim), json_object_get(d, "limitMicros"));
        money(used, sizeof(used), json_object_get(d, "usedMicros"));
        money(left, sizeof(left), json_object_get(d, "remainingMicros"));
        money(settled, sizeof(settled), json_object_get(d, "settledMicros"));
        money(reserved, sizeof(reserved), json_object_get(d, "reservedMicros"));
        fputs("key: ", stdout);
        format_put_safe(stdout, json_string_value(json_object_get(ans, "keyId")), 0);
        fputs("\nowner: ", stdout);
        format_put_safe(stdout, json_string_value(json_object_get(ans, "owner")), 0);
        fputs("\naccess: ", stdout);
        format_put_safe(stdout, json_string_value(json_object_get(ans, "access")), 0);
        printf("\ndaily limit: %s\nused (24h): %s (%s settled, %s reserved)\nremaining: %s\n", lim, used, settled,
               reserved, json_is_integer(json_object_get(d, "remainingMicros")) ? left : "unlimited");
        if (json_is_string(json_object_get(d, "freesAt"))) {
                fputs("oldest charge leaves the window: ", stdout);
                format_put_safe(stdout, json_string_value(json_object_get(d, "freesAt")), 0);
                fputc('\n', stdout);
        }
        json_t *t = json_object_get(ans, "trialAllowance");
        if (json_is_object(t))
                printf("trial: %lld of %lld free sandbox-seconds left\n",
                       (long long)json_integer_value(json_object_get(t, "remainingSandboxSeconds")),
                       (long long)json_integer_value(json_object_get(t, "sandboxSeconds")));
        return CLI_EXIT_OK;
}
