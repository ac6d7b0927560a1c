#pragma once
/* The sandbox verbs and the options they share. */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "cli/cli.h"

typedef enum SandboxVerb {
        SANDBOX_VERB_RUN,
        SANDBOX_VERB_CREATE,
        SANDBOX_VERB_EXEC,
} SandboxVerb;

typedef struct SandboxArgs {
        bool help;
        long long lease_s;                    /* -1: not given */
        long long timeout_ms;                 /* -1: not given (run, exec) */
        long long vcpu, memory_mib, disk_mib; /* -1: not given */
        const char *driver, *image, *name, *cwd, *on_lease_end;
        const char *snapshot; /* create: --snapshot, the snapshot to start from */
        const char *user; /* run, exec: "sandbox" or "root" */
        json_t *env;          /* owned, NULL when none: the sandbox's (run, create) or the exec's */
        json_t *labels;       /* owned, NULL when none */
        json_t *allow, *deny; /* owned, NULL when none: egress host patterns */
        int internet;         /* --internet 1, --no-internet 0, -1: not given */
        bool keep, interactive;
        bool trial;                /* --trial: use (and get, the first time) a trial key */
        long long max_cost_micros; /* --max-cost; -1: not given */
        bool json;      /* --json given after the verb */
        const char *id; /* exec */
        char **command; /* run, exec: points into argv */
        int command_len;
} SandboxArgs;

extern const char sandbox_run_usage[], sandbox_create_usage[], sandbox_exec_usage[];

/* Parses the options of run, create or exec (argv[0] is the verb). On a
 * usage error returns -EINVAL with err set. */
int sandbox_args_parse(SandboxVerb verb, int argc, char **argv, SandboxArgs *ret, char *err, size_t errlen);
void sandbox_args_done(SandboxArgs *a);

/* Prints the help of run, create or exec on stdout. */
void sandbox_print_help(SandboxVerb verb);

/* The POST /v1/sandboxes body for run or create. */
json_t *sandbox_create_body(const SandboxArgs *a, SandboxVerb verb);
/* The :exec body: argv, stream, timeoutMs, cwd, env; stdin is added by the caller. */
json_t *sandbox_exec_body(const SandboxArgs *a, SandboxVerb verb);

/* run's lease: --lease, else max(300, timeout + 60) capped at the API's maximum. */
long long sandbox_run_lease(const SandboxArgs *a);

int cmd_sandbox_create(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_ls(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_get(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_stop(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_pause(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_wake(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_restart(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_rm(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_extend(CliContext *ctx, int argc, char **argv);
