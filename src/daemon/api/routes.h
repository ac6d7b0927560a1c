#pragma once
/* The route table of the API: every route's method, path pattern, access,
 * body kind and handler, in one place. Only the entry point (which hands the
 * table to the HTTP server) and the tests include this header: the handlers
 * never see the table, so no handler reaches another through it. */
#include <stdbool.h>
#include <stddef.h>

#include "daemon/api/api.h"

extern const HttpRoute api_routes[];
extern const size_t api_n_routes;

/* Routing over the table (for tests and tools); see http_route_match. */
int route_parse(const char *method, const char *url, Route *ret);
bool route_needs_auth(RouteKind k);
/* Whether a `read` key is refused on this route: it creates, runs, writes,
 * deletes, extends or spends. */
bool route_needs_full_access(RouteKind k);
const char *route_name(RouteKind k);
