#pragma once
/* The host verbs (hosts ls, drain, undrain): the hosts that share one
 * store, for an admin key. */
#include "cli/cli.h"

int cmd_hosts_ls(CliContext *ctx, int argc, char **argv);
int cmd_hosts_drain(CliContext *ctx, int argc, char **argv);
int cmd_hosts_undrain(CliContext *ctx, int argc, char **argv);
