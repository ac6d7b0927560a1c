#pragma once
/* sandbox run and sandbox exec: a command streamed to this terminal. */
#include "cli/cli.h"

int cmd_sandbox_run(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_exec(CliContext *ctx, int argc, char **argv);

/* The exit code of an exec's "exit" event: 124 when it timed out, else the
 * command's code (0..255; anything else, which a sane daemon never sends, is 255). */
int run_exit_code(long long exit_code, bool timed_out);
