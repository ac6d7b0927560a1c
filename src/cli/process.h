#pragma once
/* runtime sandbox spawn | ps | logs | kill: background processes. */
#include "cli/cli.h"

int cmd_sandbox_spawn(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_ps(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_logs(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_kill(CliContext *ctx, int argc, char **argv);
/* Whether s looks like a process id: "proc_" and 16 lowercase hex digits. */
bool cli_process_id_ok(const char *s);
