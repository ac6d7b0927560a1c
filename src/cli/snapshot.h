#pragma once
/* Snapshots and fork: runtime sandbox snapshot|fork, runtime snapshot ls|get|rm. */
#include <stdbool.h>

#include "cli/cli.h"

/* snp_ and 20 lowercase hex digits. */
bool snapshot_id_valid(const char *s);

int cmd_sandbox_snapshot(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_fork(CliContext *ctx, int argc, char **argv);
int cmd_snapshot_ls(CliContext *ctx, int argc, char **argv);
int cmd_snapshot_get(CliContext *ctx, int argc, char **argv);
int cmd_snapshot_rm(CliContext *ctx, int argc, char **argv);
