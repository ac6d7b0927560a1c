#pragma once
/* Counters for GET /metrics (Prometheus text format). Lock-free. */
#include <stdint.h>

#include "daemon/db.h"

void metrics_sandbox_created(void);
void metrics_exec_done(uint64_t duration_ms);
void metrics_http_response(unsigned status);
/* The whole exposition, malloc'ed; sandboxes per state come from the DB. */
char *metrics_render(Db *db);
