#pragma once
/* runtime usage and runtime limits: what was spent, and what is left. */
#include "cli/cli.h"

int cmd_usage(CliContext *ctx, int argc, char **argv);
int cmd_limits(CliContext *ctx, int argc, char **argv);
