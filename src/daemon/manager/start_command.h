#pragma once
/*
 * An image's start command run on a sandbox made from it (docs/images.md,
 * "The start command"): a background process of the processes table, so
 * that it is listed, read and killed as any other, then its readiness
 * polled (a port listening in the sandbox, or a command exiting 0) up to
 * the start's timeout. A failed start is reported, never an error of the
 * create: the sandbox runs on. The report is the create's alone (nothing
 * keeps it).
 */
#include <jansson.h>

#include "daemon/manager/process.h"
#include "daemon/manager/sandbox.h"

#define START_OUTPUT_TAIL 2048 /* bytes of a failed start's output in its report */
#define START_POLL_MS 200      /* between readiness checks */
#define START_CHECK_MS 5000    /* one readiness check's bound */
#define START_RUN_MS (24LL * 3600 * 1000) /* the command's own bound, a background process's default */

/* Runs start (model/image_start.h's normalized object, borrowed) on sandbox
 * id in workdir as the sandbox's user; the report in *ret:
 * {command, processId, state ("ready", "running", "failed"), readyMs,
 * error, output}. -ENOMEM; every other failure is the report's. */
int start_command_run(Manager *m, ProcTable *procs, const KeyInfo *key, const char *id, json_t *start,
                      const char *workdir, json_t **ret);
