#include "daemon/route.h"

#include <errno.h>
#include <string.h>

#include "daemon/request.h"

bool route_sandbox_id_ok(const char *s) {
        if (strncmp(s, "sbx_", 4) != 0 || strlen(s) != ROUTE_ID_LEN)
                return false;
        for (const char *p = s + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

bool route_key_id_ok(const char *s) {
        if (strncmp(s, "key_", 4) != 0 || strlen(s) != ROUTE_KEY_ID_LEN)
                return false;
        for (const char *p = s + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static const char *const names[_ROUTE_MAX] = {
        [ROUTE_HEALTHZ] = "healthz",
        [ROUTE_METRICS] = "metrics",
        [ROUTE_INFO] = "info",
        [ROUTE_LIMITS] = "limits",
        [ROUTE_IMAGES] = "images",
        [ROUTE_IMAGE_BUILD] = "image_build",
        [ROUTE_SANDBOX_LIST] = "sandbox_list",
        [ROUTE_SANDBOX_CREATE] = "sandbox_create",
        [ROUTE_SANDBOX_GET] = "sandbox_get",
        [ROUTE_SANDBOX_DELETE] = "sandbox_delete",
        [ROUTE_SANDBOX_EXEC] = "exec",
        [ROUTE_SANDBOX_STOP] = "stop",
        [ROUTE_SANDBOX_EXTEND] = "extend",
        [ROUTE_SANDBOX_NETWORK] = "network",
        [ROUTE_FILES_READ] = "files_read",
        [ROUTE_FILES_WRITE] = "files_write",
        [ROUTE_FILES_LIST] = "files_list",
        [ROUTE_FILES_STAT] = "files_stat",
        [ROUTE_FILES_MKDIR] = "files_mkdir",
        [ROUTE_FILES_REMOVE] = "files_remove",
        [ROUTE_FILES_RENAME] = "files_rename",
        [ROUTE_KEYS_LIST] = "keys_list",
        [ROUTE_KEYS_CREATE] = "keys_create",
        [ROUTE_KEY_REVOKE] = "key_revoke",
        [ROUTE_USAGE] = "usage",
        [ROUTE_TRIAL] = "trial",
        [ROUTE_SECRETS_LIST] = "secrets_list",
        [ROUTE_SECRET_GET] = "secret_get",
        [ROUTE_SECRET_PUT] = "secret_put",
        [ROUTE_SECRET_DELETE] = "secret_delete",
        [ROUTE_SANDBOX_EGRESS] = "sandbox_egress",
};

const char *route_name(RouteKind k) {
        return k < _ROUTE_MAX ? names[k] : "unknown";
}

bool route_needs_auth(RouteKind k) {
        /* POST /v1/trial mints a key: it is refused but on loopback. */
        return k != ROUTE_HEALTHZ && k != ROUTE_TRIAL;
}

bool route_needs_full_access(RouteKind k) {
        switch (k) {
        case ROUTE_IMAGE_BUILD:
        case ROUTE_SANDBOX_CREATE:
        case ROUTE_SANDBOX_DELETE:
        case ROUTE_SANDBOX_EXEC:
        case ROUTE_SANDBOX_STOP:
        case ROUTE_SANDBOX_EXTEND:
        case ROUTE_SANDBOX_NETWORK:
        case ROUTE_FILES_WRITE:
        case ROUTE_FILES_MKDIR:
        case ROUTE_FILES_REMOVE:
        case ROUTE_FILES_RENAME:
        case ROUTE_KEYS_LIST:
        case ROUTE_KEYS_CREATE:
        case ROUTE_KEY_REVOKE:
        case ROUTE_SECRET_PUT:
        case ROUTE_SECRET_DELETE:
                return true;
        default:
                return false;
        }
}

typedef struct MethodRoute {
        const char *method;
        RouteKind kind;
} MethodRoute;

/* Picks the route for `method` among those of one path. */
static int pick(const char *method, const MethodRoute *routes, size_t n, const char *allow, Route *ret) {
        for (size_t i = 0; i < n; i++)
                if (strcmp(method, routes[i].method) == 0) {
                        ret->kind = routes[i].kind;
                        return 0;
                }
        ret->allow = allow;
        return -EOPNOTSUPP;
}

#define PICK(method, allow, ret, ...)                                                                      \
        ({                                                                                                  \
                static const MethodRoute _r[] = { __VA_ARGS__ };                                           \
                pick(method, _r, sizeof(_r) / sizeof(_r[0]), allow, ret);                                  \
        })

static int sandbox_routes(const char *method, const char *rest, Route *ret) {
        /* rest is what follows the id. */
        if (strcmp(rest, "") == 0)
                return PICK(method, "GET, DELETE", ret, { "GET", ROUTE_SANDBOX_GET },
                            { "DELETE", ROUTE_SANDBOX_DELETE });
        if (strcmp(rest, ":exec") == 0)
                return PICK(method, "POST", ret, { "POST", ROUTE_SANDBOX_EXEC });
        if (strcmp(rest, ":stop") == 0)
                return PICK(method, "POST", ret, { "POST", ROUTE_SANDBOX_STOP });
        if (strcmp(rest, ":extend") == 0)
                return PICK(method, "POST", ret, { "POST", ROUTE_SANDBOX_EXTEND });
        if (strcmp(rest, "/network") == 0)
                return PICK(method, "PUT", ret, { "PUT", ROUTE_SANDBOX_NETWORK });
        if (strcmp(rest, "/egress") == 0)
                return PICK(method, "GET", ret, { "GET", ROUTE_SANDBOX_EGRESS });
        if (strcmp(rest, "/files/content") == 0)
                return PICK(method, "GET, PUT", ret, { "GET", ROUTE_FILES_READ }, { "PUT", ROUTE_FILES_WRITE });
        if (strcmp(rest, "/files/list") == 0)
                return PICK(method, "GET", ret, { "GET", ROUTE_FILES_LIST });
        if (strcmp(rest, "/files/stat") == 0)
                return PICK(method, "GET", ret, { "GET", ROUTE_FILES_STAT });
        if (strcmp(rest, "/files:mkdir") == 0)
                return PICK(method, "POST", ret, { "POST", ROUTE_FILES_MKDIR });
        if (strcmp(rest, "/files:remove") == 0)
                return PICK(method, "POST", ret, { "POST", ROUTE_FILES_REMOVE });
        if (strcmp(rest, "/files:rename") == 0)
                return PICK(method, "POST", ret, { "POST", ROUTE_FILES_RENAME });
        return -ENOENT;
}

int route_parse(const char *method, const char *url, Route *ret) {
        Route r = { 0 };
        if (!method || !url)
                return -ENOENT;
        if (strlen(url) > ROUTE_MAX_URL)
                return -EMSGSIZE;
        int rc;
        if (strcmp(url, "/healthz") == 0)
                rc = PICK(method, "GET", &r, { "GET", ROUTE_HEALTHZ });
        else if (strcmp(url, "/metrics") == 0)
                rc = PICK(method, "GET", &r, { "GET", ROUTE_METRICS });
        else if (strcmp(url, "/v1/info") == 0)
                rc = PICK(method, "GET", &r, { "GET", ROUTE_INFO });
        else if (strcmp(url, "/v1/limits") == 0)
                rc = PICK(method, "GET", &r, { "GET", ROUTE_LIMITS });
        else if (strcmp(url, "/v1/keys") == 0)
                rc = PICK(method, "GET, POST", &r, { "GET", ROUTE_KEYS_LIST }, { "POST", ROUTE_KEYS_CREATE });
        else if (strcmp(url, "/v1/usage") == 0)
                rc = PICK(method, "GET", &r, { "GET", ROUTE_USAGE });
        else if (strcmp(url, "/v1/trial") == 0)
                rc = PICK(method, "POST", &r, { "POST", ROUTE_TRIAL });
        else if (strncmp(url, "/v1/keys/", 9) == 0) {
                const char *id = url + 9;
                if (!route_key_id_ok(id))
                        return -ENOENT;
                memcpy(r.key_id, id, ROUTE_KEY_ID_LEN + 1);
                rc = PICK(method, "DELETE", &r, { "DELETE", ROUTE_KEY_REVOKE });
        } else if (strcmp(url, "/v1/egress-secrets") == 0)
                rc = PICK(method, "GET", &r, { "GET", ROUTE_SECRETS_LIST });
        else if (strncmp(url, "/v1/egress-secrets/", 19) == 0) {
                const char *name = url + 19;
                size_t len = strlen(name);
                if (len == 0 || len >= sizeof(r.secret) || strchr(name, '/'))
                        return -ENOENT;
                memcpy(r.secret, name, len + 1);
                rc = PICK(method, "GET, PUT, DELETE", &r, { "GET", ROUTE_SECRET_GET }, { "PUT", ROUTE_SECRET_PUT },
                          { "DELETE", ROUTE_SECRET_DELETE });
        } else if (strcmp(url, "/v1/images") == 0)
                rc = PICK(method, "GET", &r, { "GET", ROUTE_IMAGES });
        else if (strcmp(url, "/v1/sandboxes") == 0)
                rc = PICK(method, "GET, POST", &r, { "GET", ROUTE_SANDBOX_LIST }, { "POST", ROUTE_SANDBOX_CREATE });
        else if (strncmp(url, "/v1/images/", 11) == 0) {
                const char *name = url + 11;
                const char *colon = strchr(name, ':');
                size_t len = colon ? (size_t)(colon - name) : 0;
                if (!colon || strcmp(colon, ":build") != 0 || len == 0 || len >= sizeof(r.image))
                        return -ENOENT;
                memcpy(r.image, name, len);
                r.image[len] = '\0';
                if (!request_image_name_ok(r.image))
                        return -ENOENT;
                rc = PICK(method, "POST", &r, { "POST", ROUTE_IMAGE_BUILD });
        } else if (strncmp(url, "/v1/sandboxes/", 14) == 0) {
                const char *id = url + 14;
                if (strlen(id) < ROUTE_ID_LEN)
                        return -ENOENT;
                memcpy(r.sandbox_id, id, ROUTE_ID_LEN);
                r.sandbox_id[ROUTE_ID_LEN] = '\0';
                if (!route_sandbox_id_ok(r.sandbox_id))
                        return -ENOENT;
                rc = sandbox_routes(method, id + ROUTE_ID_LEN, &r);
        } else
                return -ENOENT;
        if (rc == -ENOENT)
                return rc;
        *ret = r;
        return rc;
}
