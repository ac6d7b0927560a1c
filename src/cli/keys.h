#pragma once
/* The key verbs (keys create, ls, revoke), money on the command line, and
 * the trial key that `--trial` fetches once and keeps. */
#include <stddef.h>

#include "cli/cli.h"

/* The largest amount the CLI takes: $1,000,000,000. */
#define CLI_DOLLARS_MAX_MICROS 1000000000000000LL

/* "25", "0.5", "$1.25": dollars with at most six decimals, as micro-dollars
 * in [0, CLI_DOLLARS_MAX_MICROS]. */
int parse_dollars(const char *what, const char *s, long long *ret_micros, char *err, size_t errlen);

/* Points ctx->key at the trial key kept in <state dir>/trial.key, asking the
 * daemon for one (POST /v1/trial) and keeping it when there is none yet.
 * Returns 0, or an exit code after printing why. */
int cli_use_trial_key(CliContext *ctx);

int cmd_keys_create(CliContext *ctx, int argc, char **argv);
int cmd_keys_ls(CliContext *ctx, int argc, char **argv);
int cmd_keys_revoke(CliContext *ctx, int argc, char **argv);
