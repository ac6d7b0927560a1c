#pragma once
/* runtime sandbox run-code: one cell of the sandbox's stateful interpreter. */
#include "cli/cli.h"

int cmd_sandbox_run_code(CliContext *ctx, int argc, char **argv);
