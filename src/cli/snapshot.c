#include "cli/snapshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/client.h"
#include "cli/parse.h"
#include "common/macro.h"

#define FORK_COUNT_MAX 16

/* Takes "--OPT VALUE" or "--OPT=VALUE" out of argv (anywhere before "--"),
 * so that what is left is cli_simple_args' to parse. NULL when absent. */
static const char *take_option(int *argc, char **argv, const char *opt) {
        size_t n = strlen(opt);
        for (int i = 1; i < *argc; i++) {
                if (strcmp(argv[i], "--") == 0)
                        break;
                const char *v = NULL;
                int used = 0;
                if (strcmp(argv[i], opt) == 0 && i + 1 < *argc) {
                        v = argv[i + 1];
                        used = 2;
                } else if (strncmp(argv[i], opt, n) == 0 && argv[i][n] == '=') {
                        v = argv[i] + n + 1;
                        used = 1;
                }
                if (used) {
                        memmove(&argv[i], &argv[i + used], (size_t)(*argc - i - used + 1) * sizeof(*argv));
                        *argc -= used;
                        return v;
                }
        }
        return NULL;
}

bool snapshot_id_valid(const char *s) {
        if (strncmp(s, "snp_", 4) != 0 || strlen(s) != 24)
                return false;
        for (const char *p = s + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static void print_snapshot_line(json_t *s) {
        json_t *size = json_object_get(s, "sizeBytes");
        printf("%-26s %-26s %-6s %10.1f MiB  %-20s %s\n", json_string_value(json_object_get(s, "id")) ?: "?",
               json_string_value(json_object_get(s, "sandboxId")) ?: "-",
               json_string_value(json_object_get(s, "mode")) ?: "?",
               (double)json_integer_value(size) / (1024.0 * 1024.0),
               json_string_value(json_object_get(s, "expiresAt")) ?: "-",
               json_string_value(json_object_get(s, "name")) ?: "");
}

static const char snapshot_help[] =
        "Keeps a sandbox's disk (its files and /workspace) as a snapshot and prints its id.\n"
        "A running sandbox is frozen only while its disk is copied. A sandbox starts from it\n"
        "with the API's or the SDK's create (snapshot: ID); `runtime sandbox fork` does both.\n\n"
        "  --mode disk|memory   disk (the default); memory keeps the running machine too (microvm, gvisor)\n"
        "  --name NAME          a name for it\n"
        "  --retention DAYS     how long the daemon keeps it (1 to 365; default 7)\n\n"
        "Example:\n  runtime sandbox snapshot --name prepared sbx_9f2c4e1a7b3d5c6e8f01\n";

int cmd_sandbox_snapshot(CliContext *ctx, int argc, char **argv) {
        static const char verb[] = "sandbox snapshot", usage[] = "[--mode disk|memory] [--name N] [--retention DAYS] ID";
        _cleanup_json_ json_t *ans = NULL, *body = json_object();
        char **pos, path[160], err[CLI_ERR_MAX];
        int npos, r;
        const char *mode = take_option(&argc, argv, "--mode");
        const char *name = take_option(&argc, argv, "--name");
        const char *retention = take_option(&argc, argv, "--retention");
        if (!body)
                return cli_fail("out of memory");
        if (mode && strcmp(mode, "disk") != 0 && strcmp(mode, "memory") != 0)
                return cli_usage_error(verb, usage, "--mode: '%.32s' is not disk or memory", mode);
        if (name && (strlen(name) == 0 || strlen(name) > CLI_NAME_MAX))
                return cli_usage_error(verb, usage, "--name must be 1 to %d bytes", CLI_NAME_MAX);
        long long days = 0;
        if (retention && parse_uint_bounded("--retention", retention, 1, 365, &days, err, sizeof err) < 0)
                return cli_usage_error(verb, usage, "%s", err);
        r = cli_simple_args(ctx, verb, usage, snapshot_help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        r = cli_check_id(verb, usage, pos[0]);
        if (r > 0)
                return r;
        if ((mode && json_object_set_new(body, "mode", json_string(mode)) < 0) ||
            (name && json_object_set_new(body, "name", json_string(name)) < 0) ||
            (days && json_object_set_new(body, "retentionDays", json_integer(days)) < 0))
                return cli_fail("out of memory");
        snprintf(path, sizeof path, "/v1/sandboxes/%s:snapshot", pos[0]);
        r = cli_post(ctx, path, body, &ans);
        if (r != CLI_EXIT_OK)
                return r;
        if (ctx->json)
                cli_print_json(ans);
        else
                printf("%s\n", json_string_value(json_object_get(ans, "id")) ?: "?");
        return CLI_EXIT_OK;
}

static const char fork_help[] =
        "Makes copies of a sandbox's files as they are now, each a running sandbox, and\n"
        "prints their ids. All are made or none (a daily limit is checked for all at once).\n\n"
        "  --count N            how many copies (1 to 16; default 1)\n"
        "  --mode disk|memory   disk (the default); memory copies the running machine too,\n"
        "                       its processes carrying on in each copy (microvm, gvisor)\n"
        "  --name NAME          their name (NAME-1, NAME-2, ... with --count)\n\n"
        "Example:\n  runtime sandbox fork --count 3 sbx_9f2c4e1a7b3d5c6e8f01\n";

int cmd_sandbox_fork(CliContext *ctx, int argc, char **argv) {
        static const char verb[] = "sandbox fork", usage[] = "[--count N] [--mode disk|memory] [--name N] ID";
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL, *body = json_object();
        char **pos, path[160], err[CLI_ERR_MAX];
        int npos, r;
        const char *count_s = take_option(&argc, argv, "--count");
        const char *mode = take_option(&argc, argv, "--mode");
        const char *name = take_option(&argc, argv, "--name");
        if (!body)
                return cli_fail("out of memory");
        if (mode && strcmp(mode, "disk") != 0 && strcmp(mode, "memory") != 0)
                return cli_usage_error(verb, usage, "--mode: '%.32s' is not disk or memory", mode);
        long long count = 0;
        if (count_s && parse_uint_bounded("--count", count_s, 1, FORK_COUNT_MAX, &count, err, sizeof err) < 0)
                return cli_usage_error(verb, usage, "%s", err);
        if (name && (strlen(name) == 0 || strlen(name) > CLI_NAME_MAX))
                return cli_usage_error(verb, usage, "--name must be 1 to %d bytes", CLI_NAME_MAX);
        r = cli_simple_args(ctx, verb, usage, fork_help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        r = cli_check_id(verb, usage, pos[0]);
        if (r > 0)
                return r;
        if ((count && json_object_set_new(body, "count", json_integer(count)) < 0) ||
            (mode && json_object_set_new(body, "mode", json_string(mode)) < 0) ||
            (name && json_object_set_new(body, "name", json_string(name)) < 0))
                return cli_fail("out of memory");
        snprintf(path, sizeof path, "/v1/sandboxes/%s:fork", pos[0]);
        r = cli_post(ctx, path, body, &ans);
        if (r != CLI_EXIT_OK)
                return r;
        if (ctx->json) {
                cli_print_json(ans);
                return CLI_EXIT_OK;
        }
        json_t *s;
        size_t i;
        json_array_foreach(json_object_get(ans, "sandboxes"), i, s)
                printf("%s\n", json_string_value(json_object_get(s, "id")) ?: "?");
        return CLI_EXIT_OK;
}

static const char ls_help[] =
        "Lists your snapshots, oldest first: id, source sandbox, mode, size, expiry, name.\n\n"
        "  --sandbox ID  only those of one sandbox\n\n"
        "Example:\n  runtime snapshot ls\n";

int cmd_snapshot_ls(CliContext *ctx, int argc, char **argv) {
        static const char verb[] = "snapshot ls", usage[] = "[--sandbox ID]";
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *all = json_array();
        char **pos;
        int npos, r;
        CliError e;
        const char *sandbox = take_option(&argc, argv, "--sandbox");
        if (!all)
                return cli_fail("out of memory");
        r = cli_simple_args(ctx, verb, usage, ls_help, argc, argv, 0, 0, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        if (sandbox && (r = cli_check_id(verb, usage, sandbox)) > 0)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        char cursor[96] = "";
        for (unsigned pages = 0; pages < 10000; pages++) {
                char path[256];
                snprintf(path, sizeof path, "/v1/snapshots?limit=100%s%s%s%s", sandbox ? "&sandboxId=" : "",
                         sandbox ? sandbox : "", cursor[0] ? "&cursor=" : "", cursor);
                _cleanup_json_ json_t *page = NULL;
                r = client_json(c, "GET", path, NULL, &page, &e);
                if (r < 0)
                        return cli_error_print(&e);
                json_array_extend(all, json_object_get(page, "data"));
                const char *next = json_string_value(json_object_get(page, "nextCursor"));
                /* The daemon's cursors are "<digits>.snp_<hex>": nothing to escape. */
                if (!next || strlen(next) >= sizeof cursor || strspn(next, "0123456789._abcdefnps") != strlen(next))
                        break;
                snprintf(cursor, sizeof cursor, "%s", next);
        }
        if (ctx->json) {
                _cleanup_json_ json_t *out = json_pack("{s:O}", "data", all);
                cli_print_json(out);
                return CLI_EXIT_OK;
        }
        json_t *s;
        size_t i;
        json_array_foreach(all, i, s)
                print_snapshot_line(s);
        return CLI_EXIT_OK;
}

static const char get_help[] = "Shows one snapshot.\n\nExample:\n  runtime snapshot get snp_4b1e9c0d2a7f3e5c8d10\n";

int cmd_snapshot_get(CliContext *ctx, int argc, char **argv) {
        static const char verb[] = "snapshot get", usage[] = "ID";
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL;
        char **pos, path[96];
        int npos, r;
        CliError e;
        r = cli_simple_args(ctx, verb, usage, get_help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        if (!snapshot_id_valid(pos[0]))
                return cli_usage_error(verb, usage, "'%.64s' is not a snapshot id (snp_ and 20 hex digits)", pos[0]);
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        snprintf(path, sizeof path, "/v1/snapshots/%s", pos[0]);
        r = client_json(c, "GET", path, NULL, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json)
                cli_print_json(ans);
        else
                print_snapshot_line(ans);
        return CLI_EXIT_OK;
}

static const char rm_help[] =
        "Deletes snapshots and their files. Goes on past a failure and exits 1 if any failed.\n\n"
        "Example:\n  runtime snapshot rm snp_4b1e9c0d2a7f3e5c8d10\n";

int cmd_snapshot_rm(CliContext *ctx, int argc, char **argv) {
        static const char verb[] = "snapshot rm", usage[] = "ID...";
        _cleanup_client_ Client *c = NULL;
        char **pos;
        int npos, r, rc = CLI_EXIT_OK;
        r = cli_simple_args(ctx, verb, usage, rm_help, argc, argv, 1, 4096, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        for (int i = 0; i < npos; i++)
                if (!snapshot_id_valid(pos[i]))
                        return cli_usage_error(verb, usage, "'%.64s' is not a snapshot id (snp_ and 20 hex digits)",
                                               pos[i]);
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        for (int i = 0; i < npos; i++) {
                char path[96];
                _cleanup_json_ json_t *ans = NULL;
                CliError e;
                snprintf(path, sizeof path, "/v1/snapshots/%s", pos[i]);
                if (client_json(c, "DELETE", path, NULL, &ans, &e) < 0) {
                        cli_error_print(&e);
                        rc = CLI_EXIT_FAILURE;
                } else if (!ctx->json)
                        printf("%s\n", pos[i]);
        }
        return rc;
}
