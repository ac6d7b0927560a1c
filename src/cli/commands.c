#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/doctor.h"
#include "cli/files.h"
#include "cli/generate.h"
#include "cli/image.h"
#include "cli/hosts.h"
#include "cli/keys.h"
#include "cli/parse.h"
#include "cli/process.h"
#include "cli/run.h"
#include "cli/runcode.h"
#include "cli/sandbox.h"
#include "cli/secrets.h"
#include "cli/portfwd.h"
#include "cli/shell.h"
#include "cli/snapshot.h"
#include "cli/usage.h"
#include "common/macro.h"

volatile sig_atomic_t cli_interrupted, cli_interrupted_again;

static const Command sandbox_commands[] = {
        {"run", "create a sandbox, run a command in it, delete it", cmd_sandbox_run, NULL},
        {"create", "create a sandbox and print its id", cmd_sandbox_create, NULL},
        {"ls", "list your sandboxes", cmd_sandbox_ls, NULL},
        {"get", "show one sandbox", cmd_sandbox_get, NULL},
        {"exec", "run a command in a running sandbox", cmd_sandbox_exec, NULL},
        {"run-code", "run Python in the sandbox's stateful interpreter", cmd_sandbox_run_code, NULL},
        {"stop", "stop a sandbox, keeping its files", cmd_sandbox_stop, NULL},
        {"pause", "pause a sandbox, keeping its memory and processes", cmd_sandbox_pause, NULL},
        {"wake", "carry on a paused sandbox, or boot a stopped one", cmd_sandbox_wake, NULL},
        {"restart", "boot a sandbox again from its files", cmd_sandbox_restart, NULL},
        {"snapshot", "keep a sandbox's disk as a snapshot", cmd_sandbox_snapshot, NULL},
        {"fork", "make running copies of a sandbox's files", cmd_sandbox_fork, NULL},
        {"rm", "delete sandboxes", cmd_sandbox_rm, NULL},
        {"extend", "renew a sandbox's lease", cmd_sandbox_extend, NULL},
        {"egress", "show a sandbox's egress audit log", cmd_sandbox_egress, NULL},
        {"spawn", "start a background process and print its id", cmd_sandbox_spawn, NULL},
        {"ps", "list a sandbox's processes", cmd_sandbox_ps, NULL},
        {"logs", "print (-f: follow) a process's output", cmd_sandbox_logs, NULL},
        {"kill", "send a signal to a process", cmd_sandbox_kill, NULL},
        {"shell", "an interactive terminal in a sandbox", cmd_sandbox_shell, NULL},
        {"port-forward", "carry a local port to a port inside a sandbox", cmd_sandbox_port_forward, NULL},
        {NULL, NULL, NULL, NULL},
};

static const Command files_commands[] = {
        {"get", "copy a file out of a sandbox", cmd_files_get, NULL},
        {"put", "copy a file into a sandbox", cmd_files_put, NULL},
        {"ls", "list a directory in a sandbox", cmd_files_ls, NULL},
        {"cp", "copy a file or a directory in or out (ID:PATH on one side)", cmd_files_cp, NULL},
        {NULL, NULL, NULL, NULL},
};

static const Command snapshot_commands[] = {
        {"ls", "list your snapshots", cmd_snapshot_ls, NULL},
        {"get", "show one snapshot", cmd_snapshot_get, NULL},
        {"rm", "delete snapshots", cmd_snapshot_rm, NULL},
        {NULL, NULL, NULL, NULL},
};

static const Command image_commands[] = {
        {"build", "build an image", cmd_image_build, NULL},
        {"ls", "list images", cmd_image_ls, NULL},
        {"import", "import an OCI layout or docker save archive", cmd_image_import, NULL},
        {NULL, NULL, NULL, NULL},
};

static const Command keys_commands[] = {
        {"create", "make an API key (full or read-only, with a daily limit)", cmd_keys_create, NULL},
        {"ls", "list keys", cmd_keys_ls, NULL},
        {"revoke", "revoke a key", cmd_keys_revoke, NULL},
        {NULL, NULL, NULL, NULL},
};

static const Command hosts_commands[] = {
        {"ls", "list the hosts that share the store", cmd_hosts_ls, NULL},
        {"drain", "stop a host from starting new sandboxes", cmd_hosts_drain, NULL},
        {"undrain", "let a drained host start sandboxes again", cmd_hosts_undrain, NULL},
        {NULL, NULL, NULL, NULL},
};

static const Command secrets_commands[] = {
        {"set", "store a secret for the egress proxy (value from stdin)", cmd_secrets_set, NULL},
        {"rotate", "give a secret a new value (from stdin), keeping its placeholder", cmd_secrets_rotate, NULL},
        {"ls", "list secrets (names, hosts, placeholders; never values)", cmd_secrets_ls, NULL},
        {"rm", "delete secrets", cmd_secrets_rm, NULL},
        {NULL, NULL, NULL, NULL},
};

static const Command commands[] = {
        {"sandbox", "create, run, list and delete sandboxes", NULL, sandbox_commands},
        {"files", "copy files in and out of a sandbox", NULL, files_commands},
        {"snapshot", "list, show and delete snapshots", NULL, snapshot_commands},
        {"image", "build and list images", NULL, image_commands},
        {"keys", "make, list and revoke API keys", NULL, keys_commands},
        {"secrets", "secrets sandboxes use through the egress proxy, never holding them", NULL,
         secrets_commands},
        {"hosts", "the hosts that share the store: list, drain, undrain (admin)", NULL, hosts_commands},
        {"usage", "what your sandboxes were billed", cmd_usage, NULL},
        {"limits", "the key's daily limit and what is left", cmd_limits, NULL},
        {"doctor", "check this host, the daemon and the key", cmd_doctor, NULL},
        {NULL, NULL, NULL, NULL},
};

static const char global_usage[] = "usage: runtime [--url URL] [--key KEY] [--json] COMMAND ...";

static void print_command_list(FILE *f, const char *prefix, const Command *table) {
        for (const Command *c = table; c->name; c++) {
                if (c->subcommands)
                        for (const Command *s = c->subcommands; s->name; s++) {
                                char name[64];
                                snprintf(name, sizeof(name), "%s%s %s", prefix, c->name, s->name);
                                fprintf(f, "  %-22s %s\n", name, s->summary);
                        }
                else {
                        char name[64];
                        snprintf(name, sizeof(name), "%s%s", prefix, c->name);
                        fprintf(f, "  %-22s %s\n", name, c->summary);
                }
        }
}

static int print_global_help(void) {
        printf("%s\n\n"
               "The command-line client of runtimed: secure sandboxes for AI agents.\n\n"
               "Commands:\n",
               global_usage);
        print_command_list(stdout, "", commands);
        printf("\nGlobal options (before the command):\n"
               "  --url URL    the daemon: http://HOST:PORT or unix:/path/to/socket\n"
               "               (default: $RUNTIME_BASE_URL, else %s)\n"
               "  --key KEY    the API key (default: $RUNTIME_API_KEY, else admin.key in the state dir)\n"
               "  --json       print the API's JSON instead of tables\n"
               "  --help       this help; 'runtime COMMAND --help' for a command's\n"
               "  --version    print the version\n\n"
               "Exit codes: 0 success, 1 error, 2 usage error; run and exec pass the command's own\n"
               "code on, 124 when it timed out, 130 when interrupted.\n",
               CLI_DEFAULT_URL);
        return CLI_EXIT_OK;
}

int cli_usage_error(const char *verb, const char *usage, const char *fmt, ...) {
        va_list ap;

        fprintf(stderr, "runtime: %s%s", verb ? verb : "", verb ? ": " : "");
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        if (verb)
                fprintf(stderr, "usage: runtime %s %s\nTry 'runtime %s --help'.\n", verb, usage, verb);
        else
                fprintf(stderr, "%s\nTry 'runtime --help'.\n", global_usage);
        return CLI_EXIT_USAGE;
}

int cli_help(const char *verb, const char *usage, const char *help) {
        printf("usage: runtime %s %s\n\n%s", verb, usage, help);
        return CLI_EXIT_OK;
}

int cli_error_print(const CliError *err) {
        fprintf(stderr, "runtime: %s\n", err->message[0] ? err->message : "unknown error");
        if (err->hint[0])
                fprintf(stderr, "hint: %s\n", err->hint);
        return CLI_EXIT_FAILURE;
}

int cli_fail(const char *fmt, ...) {
        va_list ap;

        fprintf(stderr, "runtime: ");
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        return CLI_EXIT_FAILURE;
}

int cli_check_id(const char *verb, const char *usage, const char *id) {
        if (sandbox_id_valid(id))
                return 0;
        return cli_usage_error(verb, usage, "'%.80s' is not a sandbox id (letters, digits, '_' and '-')",
                               id);
}

int cli_get_resource(CliContext *ctx, const char *verb, const char *help, int argc, char **argv, const char *path,
                     json_t **ret) {
        _cleanup_client_ Client *c = NULL;
        char **pos;
        int npos;
        CliError e;
        int r = cli_simple_args(ctx, verb, "", help, argc, argv, 0, 0, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        json_t *ans = NULL;
        if (client_json(c, "GET", path, NULL, &ans, &e) < 0)
                return cli_error_print(&e);
        if (ctx->json) {
                cli_print_json(ans);
                json_decref(ans);
                return CLI_EXIT_OK;
        }
        *ret = ans;
        return CLI_PROCEED;
}

int cli_simple_args(CliContext *ctx, const char *verb, const char *usage, const char *help, int argc,
                    char **argv, int min, int max, char ***ret_pos, int *ret_npos) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, 'j'},
                {NULL, 0, NULL, 0},
        };
        int c, n;

        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                if (c == 'h')
                        return cli_help(verb, usage, help);
                if (c == 'j') {
                        ctx->json = true;
                        continue;
                }
                return cli_usage_error(verb, usage, "unknown option '%s'", argv[optind - 1]);
        }
        n = argc - optind;
        if (n < min)
                return cli_usage_error(verb, usage, "missing arguments");
        if (n > max)
                return cli_usage_error(verb, usage, "too many arguments");
        *ret_pos = argv + optind;
        *ret_npos = n;
        return CLI_PROCEED;
}

void cli_print_json(json_t *j) {
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_ENCODE_ANY);
        fputc('\n', stdout);
        fflush(stdout);
}

int cli_connect(CliContext *ctx, bool need_key, Client **ret) {
        _cleanup_(endpoint_done) Endpoint ep = {0};
        _cleanup_(key_info_done) KeyInfo key = {0};
        char err[CLI_ERR_MAX];
        const char *url = endpoint_choose(ctx->url);
        int r;

        r = endpoint_parse(url, &ep, err, sizeof(err));
        if (r == -ENOMEM)
                return cli_fail("out of memory");
        if (r < 0) {
                if (ctx->url)
                        return cli_usage_error(NULL, NULL, "--url: %s", err);
                return cli_fail("RUNTIME_BASE_URL: %s", err);
        }
        r = key_discover(ctx->key, &key, err, sizeof(err));
        if (r == -ENOMEM)
                return cli_fail("out of memory");
        if (r < 0)
                return ctx->key ? cli_usage_error(NULL, NULL, "%s", err) : cli_fail("%s", err);
        if (!key.key && need_key) {
                fprintf(stderr, "runtime: no API key: none given with --key or RUNTIME_API_KEY, and %s %s\n",
                        key.file ? key.file : "the state dir", key_file_problem(key.file_errno));
                fprintf(stderr, "hint: export RUNTIME_API_KEY=<key>, or run as the daemon's user, or set "
                                "RUNTIME_STATE_DIR to the daemon's --state-dir; or try it for free with "
                                "'runtime sandbox run --trial -- CMD'\n");
                return CLI_EXIT_FAILURE;
        }
        r = client_new(&ep, key.key, ret);
        if (r < 0)
                return cli_fail("out of memory");
        client_set_interrupt(*ret, &cli_interrupted);
        return 0;
}

static void on_signal(int sig) {
        if (cli_interrupted)
                cli_interrupted_again = sig;
        cli_interrupted = sig;
}

int cli_interrupted_exit(void) {
        return cli_interrupted ? 128 + cli_interrupted : CLI_EXIT_INTERRUPTED;
}

void cli_signals_install(void) {
        struct sigaction sa = {.sa_handler = on_signal};

        /* No SA_RESTART: a read of stdin must return so the transfer can end. */
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
        /* Writes to a closed pipe fail with EPIPE and are handled there. */
        signal(SIGPIPE, SIG_IGN);
}

static const Command *find_command(const Command *table, const char *name) {
        for (const Command *c = table; c->name; c++)
                if (strcmp(c->name, name) == 0)
                        return c;
        return NULL;
}

static int group_help(const Command *group, FILE *f) {
        char prefix[64];

        fprintf(f, "usage: runtime %s COMMAND ...\n\nCommands:\n", group->name);
        snprintf(prefix, sizeof(prefix), "%s ", group->name);
        for (const Command *s = group->subcommands; s->name; s++) {
                char name[64];
                snprintf(name, sizeof(name), "%s%s", prefix, s->name);
                fprintf(f, "  %-22s %s\n", name, s->summary);
        }
        fprintf(f, "\n'runtime %s COMMAND --help' shows a command's options.\n", group->name);
        return 0;
}

int cli_main(int argc, char **argv) {
        static const struct option opts[] = {
                {"url", required_argument, NULL, 'u'}, {"key", required_argument, NULL, 'k'},
                {"json", no_argument, NULL, 'j'},      {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, 'V'},   {"help-man", no_argument, NULL, 'M'},
                {"completion", required_argument, NULL, 'C'}, {NULL, 0, NULL, 0},
        };
        CliContext ctx = {0};
        const Command *cmd, *sub;
        int c;

        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
                switch (c) {
                case 'u':
                        ctx.url = optarg;
                        break;
                case 'k':
                        ctx.key = optarg;
                        break;
                case 'j':
                        ctx.json = true;
                        break;
                case 'h':
                        return print_global_help();
                case 'V':
                        printf("runtime %s\n", RUNTIME_VERSION);
                        return CLI_EXIT_OK;
                /* What the build makes from the command table: runtime(1) and the completions. */
                case 'M':
                        cli_generate_man(stdout, commands);
                        return CLI_EXIT_OK;
                case 'C':
                        if (cli_generate_completion(stdout, optarg, commands) < 0)
                                return cli_usage_error(NULL, NULL, "--completion is bash or zsh, not '%.32s'", optarg);
                        return CLI_EXIT_OK;
                case ':':
                        return cli_usage_error(NULL, NULL, "%s needs a value", argv[optind - 1]);
                default:
                        return cli_usage_error(NULL, NULL,
                                               "unknown option '%s' (global options come before the "
                                               "command)",
                                               argv[optind - 1]);
                }
        }
        if (optind >= argc)
                return cli_usage_error(NULL, NULL, "a command is required");
        if (strcmp(argv[optind], "help") == 0)
                return print_global_help();
        if (strcmp(argv[optind], "version") == 0) {
                printf("runtime %s\n", RUNTIME_VERSION);
                return CLI_EXIT_OK;
        }
        cmd = find_command(commands, argv[optind]);
        if (!cmd)
                return cli_usage_error(NULL, NULL, "unknown command '%.64s'", argv[optind]);
        if (!cmd->subcommands) {
                cli_signals_install();
                return cmd->run(&ctx, argc - optind, argv + optind);
        }
        optind++;
        if (optind >= argc) {
                group_help(cmd, stderr);
                return CLI_EXIT_USAGE;
        }
        if (strcmp(argv[optind], "--help") == 0 || strcmp(argv[optind], "-h") == 0 ||
            strcmp(argv[optind], "help") == 0) {
                group_help(cmd, stdout);
                return CLI_EXIT_OK;
        }
        sub = find_command(cmd->subcommands, argv[optind]);
        if (!sub) {
                fprintf(stderr, "runtime: %s: unknown command '%.64s'\n", cmd->name, argv[optind]);
                group_help(cmd, stderr);
                return CLI_EXIT_USAGE;
        }
        cli_signals_install();
        return sub->run(&ctx, argc - optind, argv + optind);
}

int cli_post(CliContext *ctx, const char *path, json_t *body, json_t **ret) {
        _cleanup_client_ Client *c = NULL;
        CliError e;
        int r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        if (client_json(c, "POST", path, body, ret, &e) < 0)
                return cli_error_print(&e);
        return CLI_EXIT_OK;
}
