#pragma once
/* The wiring of runtimed: the state directory, the drivers, the
 * capabilities, then the parts (database, key store, ledger, egress,
 * snapshots, uploads, manager, HTTP server) in order, the wait for SIGTERM
 * or SIGINT, and the stop in reverse. An edge: it logs what it does and,
 * with context, every step that fails. */
#include "daemon/options.h"

/* The state directory when none is given: $RUNTIME_STATE_DIR, else
 * /var/lib/runtime as root, else $XDG_STATE_HOME/runtime or
 * ~/.local/state/runtime. NULL when out of memory. */
char *daemon_default_state_dir(void);

/* Serves until SIGTERM or SIGINT. Returns the process's exit status: 0
 * after a clean stop, 1 when a part cannot start (the --driver asked for
 * among them, when it cannot run here). */
int daemon_run(const DaemonOptions *opts);
