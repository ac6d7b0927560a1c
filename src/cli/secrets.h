#pragma once
/* The egress verbs: secrets (set, rotate, ls, rm), whose values the CLI reads from
 * stdin and never prints, and a sandbox's egress audit log. */
#include <stddef.h>

#include "cli/cli.h"

/* A secret's value travels in HTTP headers: at most this many bytes. */
#define CLI_SECRET_VALUE_MAX 8192

/* Takes a value read from stdin: one trailing "\n" or "\r\n" (what echo and
 * a here-string add) is dropped; an empty value, one over
 * CLI_SECRET_VALUE_MAX bytes, or one holding CR, LF or NUL is refused.
 * Returns the new length, or -EINVAL with err set. */
int secret_value_trim(char *buf, size_t len, char *err, size_t errlen);

int cmd_secrets_set(CliContext *ctx, int argc, char **argv);
int cmd_secrets_ls(CliContext *ctx, int argc, char **argv);
int cmd_secrets_rotate(CliContext *ctx, int argc, char **argv);
int cmd_secrets_rm(CliContext *ctx, int argc, char **argv);
int cmd_sandbox_egress(CliContext *ctx, int argc, char **argv);
