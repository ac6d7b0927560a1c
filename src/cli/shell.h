#pragma once
/* runtime sandbox shell ID [-- COMMAND]: an interactive terminal in the
 * sandbox over the daemon's WebSocket, this terminal in raw mode meanwhile. */
#include "cli/cli.h"

int cmd_sandbox_shell(CliContext *ctx, int argc, char **argv);
