#pragma once
/* What every verb of the CLI shares: the global options, the command table,
 * exit codes, and the edge helpers that print (only verbs and main print). */
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>

#include "cli/client.h"

/* Exit codes (docs/cli.md). run and exec pass the command's own code on. */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAILURE 1
#define CLI_EXIT_USAGE 2
#define CLI_EXIT_TIMEOUT 124
#define CLI_EXIT_INTERRUPTED 130

typedef struct CliContext {
        const char *url; /* --url, or NULL */
        const char *key; /* --key, or NULL */
        bool json;       /* --json: print the API's JSON */
} CliContext;

typedef struct Command Command;
struct Command {
        const char *name;
        const char *summary;
        int (*run)(CliContext *ctx, int argc, char **argv); /* argv[0] is the verb */
        const Command *subcommands;                         /* NULL-terminated by name */
};

/* Dispatches argv (argv[0] is the program) through the command table; the
 * whole CLI but for process set-up. Returns the exit code. */
int cli_main(int argc, char **argv);

/* Set by SIGINT/SIGTERM/SIGHUP to the signal number; _again by the second one. */
extern volatile sig_atomic_t cli_interrupted, cli_interrupted_again;
void cli_signals_install(void);
/* 128 + the signal that interrupted (130 for Ctrl-C), as a shell reports it. */
int cli_interrupted_exit(void);

/* Prints "runtime: <verb>: <message>" and the usage line; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *verb, const char *usage, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
/* Prints the help of a verb on stdout; returns CLI_EXIT_OK. */
int cli_help(const char *verb, const char *usage, const char *help);
/* Prints an error ("runtime: <message>", "hint: <hint>") on stderr; returns CLI_EXIT_FAILURE. */
int cli_error_print(const CliError *err);
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Resolves the daemon's URL and the key and makes a client; on failure
 * prints why and returns an exit code (> 0). need_key: refuse to go on
 * without a key. */
int cli_connect(CliContext *ctx, bool need_key, Client **ret);
/* Prints j on stdout, indented, with a newline. */
void cli_print_json(json_t *j);
/* Connects (with a key), POSTs body to path and answers the reply in *ret:
 * CLI_EXIT_OK, or the exit code after the error is printed. */
int cli_post(CliContext *ctx, const char *path, json_t *body, json_t **ret);
/* Parses a verb that takes only --help, --json (as the global option) and
 * min..max positional arguments (options and arguments in any order; "--"
 * ends options). Returns CLI_PROCEED with the arguments in ret_pos/ret_npos,
 * or an exit code. */
#define CLI_PROCEED (-1)
int cli_simple_args(CliContext *ctx, const char *verb, const char *usage, const char *help, int argc,
                    char **argv, int min, int max, char ***ret_pos, int *ret_npos);
/* A verb that only reads one resource: no arguments, GET path. With --json
 * it prints the answer and returns CLI_EXIT_OK; otherwise CLI_PROCEED with
 * the answer in *ret for the caller's human output. Other exit codes on
 * failure (already reported). */
int cli_get_resource(CliContext *ctx, const char *verb, const char *help, int argc, char **argv, const char *path,
                     json_t **ret);
/* Checks a sandbox id argument; prints a usage error when it is malformed. */
int cli_check_id(const char *verb, const char *usage, const char *id);
