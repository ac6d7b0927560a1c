#pragma once
/* runtime sandbox port-forward ID [LOCAL:]REMOTE: a local port carried to a
 * port on the sandbox's loopback over the daemon's tunnel WebSocket. */
#include "cli/cli.h"

int cmd_sandbox_port_forward(CliContext *ctx, int argc, char **argv);
/* "[LOCAL:]REMOTE": REMOTE 1..65535, LOCAL 0..65535 (0: any free port; the
 * default is REMOTE). 0, or -EINVAL. */
int cli_parse_port_spec(const char *s, unsigned *ret_local, unsigned *ret_remote);
