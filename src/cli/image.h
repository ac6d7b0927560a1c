#pragma once
/* image build / ls. */
#include "cli/cli.h"

int cmd_image_build(CliContext *ctx, int argc, char **argv);
int cmd_image_import(CliContext *ctx, int argc, char **argv);
int cmd_image_ls(CliContext *ctx, int argc, char **argv);
