#pragma once
/* Strict routing of the HTTP API: a path matches exactly one route or is a
 * 404; a known path with another method is a 405. Pure. */
#include <stdbool.h>

typedef enum RouteKind {
        ROUTE_HEALTHZ,
        ROUTE_METRICS,
        ROUTE_INFO,
        ROUTE_LIMITS,
        ROUTE_IMAGES,
        ROUTE_IMAGE_BUILD,
        ROUTE_SANDBOX_LIST,
        ROUTE_SANDBOX_CREATE,
        ROUTE_SANDBOX_GET,
        ROUTE_SANDBOX_DELETE,
        ROUTE_SANDBOX_EXEC,
        ROUTE_SANDBOX_STOP,
        ROUTE_SANDBOX_EXTEND,
        ROUTE_SANDBOX_NETWORK,
        ROUTE_FILES_READ,
        ROUTE_FILES_WRITE,
        ROUTE_FILES_LIST,
        ROUTE_FILES_STAT,
        ROUTE_FILES_MKDIR,
        ROUTE_FILES_REMOVE,
        ROUTE_FILES_RENAME,
        ROUTE_KEYS_LIST,
        ROUTE_KEYS_CREATE,
        ROUTE_KEY_REVOKE,
        ROUTE_USAGE,
        ROUTE_TRIAL,
        ROUTE_SECRETS_LIST,
        ROUTE_SECRET_GET,
        ROUTE_SECRET_PUT,
        ROUTE_SECRET_DELETE,
        ROUTE_SANDBOX_EGRESS,
        _ROUTE_MAX,
} RouteKind;

#define ROUTE_ID_LEN 24 /* "sbx_" + 20 hex */
#define ROUTE_KEY_ID_LEN 20 /* "key_" + 16 hex */
#define ROUTE_MAX_URL 1024

typedef struct Route {
        RouteKind kind;
        char sandbox_id[ROUTE_ID_LEN + 1];
        char image[65];
        char key_id[ROUTE_KEY_ID_LEN + 1];
        char secret[65]; /* an egress secret's name, checked by its handler */
        const char *allow; /* for a 405: the methods the path has */
} Route;

/* 0 and *ret; -ENOENT for an unknown path; -EMSGSIZE for an over-long one;
 * -EOPNOTSUPP for a known path and a method it does not have (ret->allow is
 * set). */
int route_parse(const char *method, const char *url, Route *ret);
bool route_sandbox_id_ok(const char *s);
bool route_key_id_ok(const char *s);
/* Whether a `read` key is refused on this route: it creates, runs, writes,
 * deletes, extends or spends. */
bool route_needs_full_access(RouteKind k);
bool route_needs_auth(RouteKind k);
const char *route_name(RouteKind k);
