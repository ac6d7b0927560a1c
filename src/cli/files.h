#pragma once
/* files get / put / ls: copies in and out of a sandbox, streamed. */
#include "cli/cli.h"

int cmd_files_get(CliContext *ctx, int argc, char **argv);
int cmd_files_put(CliContext *ctx, int argc, char **argv);
int cmd_files_cp(CliContext *ctx, int argc, char **argv);
int cmd_files_ls(CliContext *ctx, int argc, char **argv);

/* Where `files get` writes: LOCAL itself, or LOCAL/<last part of PATH> when
 * LOCAL is a directory. NULL with *ret_errno when no name can be made. */
char *files_local_target(const char *local, const char *remote, int *ret_errno);
