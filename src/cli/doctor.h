#pragma once
/* doctor: runtimed's own host check, then the daemon and the key as this client sees them. */
#include "cli/cli.h"

int cmd_doctor(CliContext *ctx, int argc, char **argv);

/* The runtimed next to the running executable, else the first on PATH; NULL if none. */
char *doctor_find_runtimed(void);
