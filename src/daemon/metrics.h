#pragma once
/* Counters for GET /metrics (Prometheus text format). Lock-free. */
#include <stdint.h>

#include "daemon/db.h"

void metrics_sandbox_created(void);
void metrics_exec_done(uint64_t duration_ms);
void metrics_http_response(unsigned status);
/* The whole exposition, malloc'ed; sandboxes per state come from the DB. */
/* The whole daemon's figures (the admin key's view). */
char *metrics_render(Db *db);

/* One owner's sandboxes by state: what a key that is not the admin's sees. */
#define METRICS_MAX_STATES 16
typedef struct MetricsStates {
        char state[METRICS_MAX_STATES][16];
        int64_t count[METRICS_MAX_STATES];
        size_t n;
} MetricsStates;
char *metrics_render_owner(const MetricsStates *states);
