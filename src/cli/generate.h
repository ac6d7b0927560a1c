#pragma once
/* What the build makes from the CLI's command table (commands.c), so that
 * neither drifts from the commands the CLI has: the manual page runtime(1)
 * and the shell completions. `runtime --help-man` and
 * `runtime --completion bash|zsh` print them. */
#include <stdio.h>

#include "cli/cli.h"

/* runtime(1) in roff. */
void cli_generate_man(FILE *f, const Command *commands);
/* A completion script for shell ("bash" or "zsh"); -EINVAL for another. */
int cli_generate_completion(FILE *f, const char *shell, const Command *commands);
