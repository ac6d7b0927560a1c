#include "cli/process.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/client.h"
#include "cli/parse.h"
#include "common/macro.h"

#define PROC_PATH_MAX 160

bool cli_process_id_ok(const char *s) {
        if (!s || strncmp(s, "proc_", 5) != 0 || strlen(s) != 21)
                return false;
        for (const char *p = s + 5; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static int check_proc(const char *verb, const char *usage, const char *id) {
        if (!cli_process_id_ok(id))
                return cli_usage_error(verb, usage, "'%s' is not a process id (proc_ and 16 hex digits)", id);
        return 0;
}

static const char spawn_usage[] = "[--user USER] ID -- COMMAND [ARG...]";
static const char spawn_help[] =
        "Starts a background process and prints its id at once. One argument runs\n"
        "under bash -c; more run as argv without a shell. Read its output with\n"
        "'sandbox logs', end it with 'sandbox kill'.\n\n"
        "Options:\n"
        "  --user USER  sandbox (the default, unprivileged, HOME=/workspace) or root\n\n"
        "Example:\n  runtime sandbox spawn sbx_9f2c4e1a7b3d5c6e8f01 -- 'python3 -m http.server 8000'\n";

int cmd_sandbox_spawn(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, 'j'},
                {"user", required_argument, NULL, 'u'},
                {NULL, 0, NULL, 0},
        };
        _cleanup_json_ json_t *body = NULL, *ans = NULL;
        const char *user = NULL;
        char path[PROC_PATH_MAX];
        int opt, r;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
                if (opt == 'h')
                        return cli_help("sandbox spawn", spawn_usage, spawn_help);
                if (opt == 'j') {
                        ctx->json = true;
                        continue;
                }
                if (opt == 'u' && cli_user_valid(optarg)) {
                        user = optarg;
                        continue;
                }
                if (opt == 'u')
                        return cli_usage_error("sandbox spawn", spawn_usage, "--user: '%.32s' is not sandbox or root",
                                               optarg);
                return cli_usage_error("sandbox spawn", spawn_usage, "unknown option '%s'", argv[optind - 1]);
        }
        if (argc - optind < 2)
                return cli_usage_error("sandbox spawn", spawn_usage, "missing arguments");
        const char *id = argv[optind++];
        r = cli_check_id("sandbox spawn", spawn_usage, id);
        if (r > 0)
                return r;
        if (strcmp(argv[optind], "--") == 0)
                optind++;
        int n = argc - optind;
        if (n < 1)
                return cli_usage_error("sandbox spawn", spawn_usage, "missing the command");
        if (n == 1)
                body = json_pack("{s:s}", "command", argv[optind]);
        else {
                json_t *arr = json_array();
                for (int i = optind; arr && i < argc; i++)
                        if (json_array_append_new(arr, json_string(argv[i])) < 0) {
                                json_decref(arr);
                                arr = NULL;
                        }
                body = arr ? json_pack("{s:o}", "argv", arr) : NULL;
        }
        if (!body)
                return cli_fail("an argument is not valid UTF-8");
        if (user && json_object_set_new(body, "user", json_string(user)) < 0)
                return cli_fail("out of memory");
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/processes", id);
        r = cli_post(ctx, path, body, &ans);
        if (r != CLI_EXIT_OK)
                return r;
        if (ctx->json)
                cli_print_json(ans);
        else
                printf("%s\n", json_string_value(json_object_get(ans, "id")) ?: "");
        return CLI_EXIT_OK;
}

static const char ps_help[] = "Lists a sandbox's processes, running and recently ended.\n\n"
                              "Example:\n  runtime sandbox ps sbx_9f2c4e1a7b3d5c6e8f01\n";

int cmd_sandbox_ps(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL;
        char **pos, path[PROC_PATH_MAX];
        int npos, r;
        CliError e;

        r = cli_simple_args(ctx, "sandbox ps", "ID", ps_help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        r = cli_check_id("sandbox ps", "ID", pos[0]);
        if (r > 0)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/processes", pos[0]);
        r = client_json(c, "GET", path, NULL, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json) {
                cli_print_json(ans);
                return CLI_EXIT_OK;
        }
        printf("%-21s  %-9s  %4s  %s\n", "ID", "STATE", "EXIT", "COMMAND");
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(ans, "data"), i, p) {
                json_t *code = json_object_get(p, "exitCode");
                char exit_text[16] = "-";
                if (json_is_integer(code))
                        snprintf(exit_text, sizeof(exit_text), "%lld", (long long)json_integer_value(code));
                /* The command is the sandbox's text: no control characters reach the terminal. */
                char cmd[81];
                const char *s = json_string_value(json_object_get(p, "command")) ?: "";
                size_t k = 0;
                for (; *s && k < sizeof(cmd) - 1; s++)
                        cmd[k++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
                cmd[k] = '\0';
                printf("%-21s  %-9s  %4s  %s\n", json_string_value(json_object_get(p, "id")) ?: "?",
                       json_string_value(json_object_get(p, "state")) ?: "?", exit_text, cmd);
        }
        return CLI_EXIT_OK;
}

typedef struct LogRead {
        bool json;
        long long cursor;
        bool resume;
        bool exited;
        long long exit_code;
        bool failed;
        CliError err;
} LogRead;

static int on_log_line(const char *line, size_t len, void *userdata) {
        LogRead *l = userdata;
        _cleanup_json_ json_t *ev = json_loadb(line, len, 0, NULL);
        const char *type = json_string_value(json_object_get(ev, "type"));
        if (!type)
                return -EBADMSG;
        if (strcmp(type, "continue") == 0) {
                l->resume = true;
                l->cursor = (long long)json_integer_value(json_object_get(ev, "cursor"));
                return 0;
        }
        if (l->json) {
                fwrite(line, 1, len, stdout);
                fputc('\n', stdout);
        }
        if (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0) {
                json_t *data = json_object_get(ev, "data");
                if (!l->json && json_is_string(data)) {
                        FILE *f = strcmp(type, "stdout") == 0 ? stdout : stderr;
                        fwrite(json_string_value(data), 1, json_string_length(data), f);
                        fflush(f);
                }
        } else if (strcmp(type, "truncated") == 0) {
                if (!l->json)
                        fprintf(stderr, "runtime: %lld bytes of output were no longer kept\n",
                                (long long)json_integer_value(json_object_get(ev, "droppedBytes")));
        } else if (strcmp(type, "exit") == 0) {
                json_t *code = json_object_get(ev, "exitCode");
                l->exited = true;
                l->exit_code = json_is_integer(code) ? (long long)json_integer_value(code) : 255;
        } else if (strcmp(type, "error") == 0) {
                l->failed = true;
                cli_error_from_json(&l->err, 0, line, len);
        }
        return 0;
}

static const char logs_usage[] = "ID PROCESS [-f]";
static const char logs_help[] =
        "Prints a process's output kept so far; with -f, follows it until the\n"
        "process ends and exits with its exit code.\n\n"
        "Example:\n  runtime sandbox logs -f sbx_9f2c4e1a7b3d5c6e8f01 proc_3b1f0c9a2d4e5f60\n";

int cmd_sandbox_logs(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, 'j'},
                {"follow", no_argument, NULL, 'f'},
                {NULL, 0, NULL, 0},
        };
        _cleanup_client_ Client *c = NULL;
        char path[PROC_PATH_MAX];
        bool follow = false;
        int opt, r;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, "hf", opts, NULL)) != -1) {
                if (opt == 'h')
                        return cli_help("sandbox logs", logs_usage, logs_help);
                if (opt == 'j')
                        ctx->json = true;
                else if (opt == 'f')
                        follow = true;
                else
                        return cli_usage_error("sandbox logs", logs_usage, "unknown option '%s'", argv[optind - 1]);
        }
        if (argc - optind != 2)
                return cli_usage_error("sandbox logs", logs_usage, "want a sandbox id and a process id");
        const char *id = argv[optind], *pid = argv[optind + 1];
        if ((r = cli_check_id("sandbox logs", logs_usage, id)) > 0 || (r = check_proc("sandbox logs", logs_usage, pid)) > 0)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        client_set_interrupt(c, &cli_interrupted);
        LogRead l = {.json = ctx->json};
        do {
                CliError e;
                l.resume = false;
                snprintf(path, sizeof(path), "/v1/sandboxes/%s/processes/%s/output?cursor=%lld&follow=%s", id, pid,
                         l.cursor, follow ? "true" : "false");
                r = client_stream_lines(c, "GET", path, NULL, on_log_line, &l, &e);
                if (r == -EINTR)
                        return cli_interrupted_exit();
                if (r < 0)
                        return cli_error_print(&e);
        } while (l.resume);
        if (l.failed)
                return cli_error_print(&l.err);
        if (follow && l.exited)
                return l.exit_code < 0 || l.exit_code > 255 ? 255 : (int)l.exit_code;
        return CLI_EXIT_OK;
}

static const char kill_usage[] = "ID PROCESS [-s SIGNAL]";
static const char kill_help[] = "Sends a signal (default SIGTERM) to a process and everything it started.\n\n"
                                "Example:\n  runtime sandbox kill -s KILL sbx_9f2c4e1a7b3d5c6e8f01 proc_3b1f0c9a2d4e5f60\n";

int cmd_sandbox_kill(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, 'j'},
                {"signal", required_argument, NULL, 's'},
                {NULL, 0, NULL, 0},
        };
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *body = NULL, *ans = NULL;
        const char *sig = "SIGTERM";
        char path[PROC_PATH_MAX];
        CliError e;
        int opt, r;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, "hs:", opts, NULL)) != -1) {
                if (opt == 'h')
                        return cli_help("sandbox kill", kill_usage, kill_help);
                if (opt == 'j')
                        ctx->json = true;
                else if (opt == 's')
                        sig = optarg;
                else
                        return cli_usage_error("sandbox kill", kill_usage, "unknown option or missing value '%s'",
                                               argv[optind - 1]);
        }
        if (argc - optind != 2)
                return cli_usage_error("sandbox kill", kill_usage, "want a sandbox id and a process id");
        const char *id = argv[optind], *pid = argv[optind + 1];
        if ((r = cli_check_id("sandbox kill", kill_usage, id)) > 0 || (r = check_proc("sandbox kill", kill_usage, pid)) > 0)
                return r;
        char *end = NULL;
        long num = strtol(sig, &end, 10);
        body = *sig && end && *end == '\0' ? json_pack("{s:i}", "signal", (int)num) : json_pack("{s:s}", "signal", sig);
        if (!body)
                return cli_fail("the signal is not valid UTF-8");
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/processes/%s:signal", id, pid);
        r = client_json(c, "POST", path, body, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json)
                cli_print_json(ans);
        return CLI_EXIT_OK;
}
