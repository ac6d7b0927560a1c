#pragma once
/* Counters for GET /metrics (Prometheus text format). Lock-free. */
#include <stdint.h>
#include <stdio.h>

#include "daemon/manager/db.h"

void metrics_sandbox_created(void);
void metrics_exec_done(uint64_t duration_ms);
void metrics_http_response(unsigned status);
/* The whole exposition, malloc'ed; sandboxes per state come from the DB. */
/* The whole daemon's figures (the admin key's view). */
/* extra (may be NULL) writes more of the exposition at its end (the
 * fleet's figures). */
typedef void (*MetricsExtra)(void *userdata, FILE *out);
char *metrics_render(Db *db, MetricsExtra extra, void *userdata);

/* One owner's sandboxes by state: what a key that is not the admin's sees. */
typedef struct MetricsStates {
        int64_t count[_SANDBOX_STATE_MAX]; /* by SandboxState; a state counted 0 is shown as 0 */
        bool seen[_SANDBOX_STATE_MAX];
} MetricsStates;
char *metrics_render_owner(const MetricsStates *states, MetricsExtra extra, void *userdata);
