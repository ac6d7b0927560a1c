/* The sandbox routes: list, create, get, delete, stop, extend, network, pause,
 * wake, restart. The manager answers rows; the API's sandbox object is made
 * here. */
#include "daemon/api/api_sandboxes.h"
#include "daemon/api/preview_proxy.h"
#include "daemon/manager/snapshot.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/http/request.h"
#include "daemon/manager/start_command.h"

/* Answers a manager call's row (cleared here) with status, or its error. */
static enum MHD_Result reply_row(Req *r, int rc, SandboxRow *row, const SandboxError *se, unsigned status) {
        ApiError e = { 0 };
        if (rc < 0) {
                api_sandbox_error(se, &e);
                return reply_error(r, &e);
        }
        json_t *j = api_sandbox_json(r->app->manager, row);
        sandbox_row_done(row);
        if (!j) {
                api_error(&e, 500, "internal", NULL, "could not render the sandbox");
                return reply_error(r, &e);
        }
        return reply_json(r, status, j);
}

/* A list is paged and filtered the way the published client asks:
 * ?state=S (repeated), ?label=K:V (repeated, all must match), ?name=N,
 * ?includeStopped=false, ?limit=N (1..100), ?cursor=C, ?order=asc|desc.
 * Oldest first unless order=desc, by createdAt to the millisecond and then
 * by id, so that the order is total: the cursor is the (createdAt, id) of
 * the last one answered, opaque to clients, and a page starts right after
 * it in the order asked for whether or not that sandbox is still there. A
 * key's sandboxes are bounded (--max-sandboxes-per-key), so the filter runs
 * over them in memory. */
#define LIST_LIMIT_MAX 100
#define LIST_FILTERS_MAX 32

typedef struct ListQuery {
        const char *states[LIST_FILTERS_MAX];
        size_t n_states;
        const char *labels[LIST_FILTERS_MAX];
        size_t n_labels;
        bool too_many;
} ListQuery;

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        ListQuery *q = cls;
        if (!key || !value)
                return MHD_YES;
        if (strcmp(key, "state") == 0) {
                if (q->n_states >= LIST_FILTERS_MAX)
                        q->too_many = true;
                else
                        q->states[q->n_states++] = value;
        } else if (strcmp(key, "label") == 0) {
                if (q->n_labels >= LIST_FILTERS_MAX)
                        q->too_many = true;
                else
                        q->labels[q->n_labels++] = value;
        }
        return MHD_YES;
}

typedef struct ListItem {
        int64_t created_ms; /* unix milliseconds */
        char id[32];
        json_t *j;
} ListItem;

typedef struct ListCtx {
        Manager *m;
        const ListQuery *q;
        const char *name;
        bool include_stopped;
        ListItem *items;
        size_t n, cap;
} ListCtx;

static bool labels_match(const char *row_labels, const ListQuery *q) {
        if (q->n_labels == 0)
                return true;
        _cleanup_json_ json_t *labels = json_loads(row_labels ? row_labels : "{}", 0, NULL);
        for (size_t i = 0; i < q->n_labels; i++) {
                const char *colon = strchr(q->labels[i], ':');
                _cleanup_free_ char *k = colon ? strndup(q->labels[i], (size_t)(colon - q->labels[i])) : NULL;
                const char *have = k ? json_string_value(json_object_get(labels, k)) : NULL;
                if (!have || strcmp(have, colon + 1) != 0)
                        return false;
        }
        return true;
}

static int list_one(void *userdata, SandboxRow *row) {
        ListCtx *c = userdata;
        if (c->q->n_states > 0) {
                bool hit = false;
                for (size_t i = 0; i < c->q->n_states && !hit; i++)
                        hit = strcmp(c->q->states[i], sandbox_state_name(row->state)) == 0;
                if (!hit)
                        return 0;
        } else if (!c->include_stopped &&
                   (row->state == SANDBOX_STOPPED || row->state == SANDBOX_FAILED || row->state == SANDBOX_LOST))
                return 0;
        if (c->name && (!row->name || strcmp(c->name, row->name) != 0))
                return 0;
        if (!labels_match(row->labels, c->q))
                return 0;
        if (c->n == c->cap) {
                size_t cap = c->cap ? c->cap * 2 : 16;
                ListItem *items = realloc(c->items, cap * sizeof(*items));
                if (!items)
                        return -ENOMEM;
                c->items = items;
                c->cap = cap;
        }
        json_t *j = api_sandbox_json(c->m, row);
        if (!j)
                return -ENOMEM;
        ListItem *it = &c->items[c->n++];
        it->created_ms = row->created_at * 1000 + row->created_msec;
        snprintf(it->id, sizeof(it->id), "%s", row->id);
        it->j = j;
        return 0;
}

/* Oldest first; ids are unique, so no two items compare equal. */
static int item_cmp(const ListItem *x, const ListItem *y) {
        if (x->created_ms != y->created_ms)
                return x->created_ms < y->created_ms ? -1 : 1;
        return strcmp(x->id, y->id);
}

static int item_cmp_asc(const void *a, const void *b) {
        return item_cmp(a, b);
}

static int item_cmp_desc(const void *a, const void *b) {
        return item_cmp(b, a);
}

/* A cursor: "<createdAt in unix milliseconds>.<id>". */
static int parse_cursor(const char *s, ListItem *ret) {
        if (s[0] < '0' || s[0] > '9')
                return -EINVAL;
        char *end = NULL;
        errno = 0;
        long long t = strtoll(s, &end, 10);
        if (errno || end == s || *end != '.' || t < 0 || !route_sandbox_id_ok(end + 1))
                return -EINVAL;
        ret->created_ms = t;
        snprintf(ret->id, sizeof(ret->id), "%s", end + 1);
        return 0;
}

static bool state_word_ok(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > 15)
                return false;
        for (size_t i = 0; i < n; i++)
                if (s[i] < 'a' || s[i] > 'z')
                        return false;
        return true;
}

enum MHD_Result handle_sandbox_list(Req *r) {
        ApiError e = { 0 };
        ListQuery q = { 0 };
        MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, collect_arg, &q);
        if (q.too_many) {
                api_error(&e, 400, "invalid_request", NULL, "at most %d state and %d label filters", LIST_FILTERS_MAX,
                          LIST_FILTERS_MAX);
                return reply_error(r, &e);
        }
        for (size_t i = 0; i < q.n_states; i++)
                if (!state_word_ok(q.states[i])) {
                        api_error(&e, 400, "invalid_request", "e.g. state=running", "state must be a state's name");
                        return reply_error(r, &e);
                }
        for (size_t i = 0; i < q.n_labels; i++) {
                const char *colon = strchr(q.labels[i], ':');
                if (!colon || colon == q.labels[i] || strlen(q.labels[i]) > 512) {
                        api_error(&e, 400, "invalid_request", "e.g. label=team:search", "label must be key:value");
                        return reply_error(r, &e);
                }
        }
        const char *name = req_query(r, "name");
        if (name && (!*name || strlen(name) > REQ_MAX_NAME)) {
                api_error(&e, 400, "invalid_request", NULL, "name must be 1 to %u bytes", REQ_MAX_NAME);
                return reply_error(r, &e);
        }
        bool include_stopped = true;
        const char *inc = req_query(r, "includeStopped");
        if (inc) {
                if (strcmp(inc, "true") == 0 || strcmp(inc, "1") == 0)
                        include_stopped = true;
                else if (strcmp(inc, "false") == 0 || strcmp(inc, "0") == 0)
                        include_stopped = false;
                else {
                        api_error(&e, 400, "invalid_request", NULL, "includeStopped must be true or false");
                        return reply_error(r, &e);
                }
        }
        unsigned limit = LIST_LIMIT_MAX;
        const char *l = req_query(r, "limit");
        if (l) {
                char *end = NULL;
                errno = 0;
                unsigned long v = strtoul(l, &end, 10);
                if (errno || !*l || *end || l[0] == '-' || v < 1 || v > LIST_LIMIT_MAX) {
                        api_error(&e, 400, "invalid_request", NULL, "limit must be an integer from 1 to %d",
                                  LIST_LIMIT_MAX);
                        return reply_error(r, &e);
                }
                limit = (unsigned)v;
        }
        bool newest_first = false;
        const char *order = req_query(r, "order");
        if (order) {
                if (strcmp(order, "desc") == 0)
                        newest_first = true;
                else if (strcmp(order, "asc") != 0) {
                        api_error(&e, 400, "invalid_request", "asc: oldest first (the default); desc: newest first",
                                  "order must be asc or desc");
                        return reply_error(r, &e);
                }
        }
        ListItem after = { 0 };
        const char *cursor = req_query(r, "cursor");
        if (cursor && (strlen(cursor) > 64 || parse_cursor(cursor, &after) < 0)) {
                api_error(&e, 400, "invalid_request", "pass back the nextCursor of the page before",
                          "cursor is not one this server gave");
                return reply_error(r, &e);
        }
        ListCtx c = { .m = r->app->manager, .q = &q, .name = name, .include_stopped = include_stopped };
        SandboxError se;
        int rc = sandbox_list(r->app->manager, &r->key, list_one, &c, &se);
        _cleanup_json_ json_t *data = rc < 0 ? NULL : json_array();
        json_t *next = json_null();
        if (data) {
                int (*cmp)(const void *, const void *) = newest_first ? item_cmp_desc : item_cmp_asc;
                qsort(c.items, c.n, sizeof(*c.items), cmp);
                size_t i = 0;
                /* Right after the cursor's place in the order: the one it
                 * names need not be there any more. */
                if (cursor)
                        while (i < c.n && cmp(&c.items[i], &after) <= 0)
                                i++;
                size_t first = i;
                for (; i < c.n && json_array_size(data) < limit; i++)
                        json_array_append(data, c.items[i].j);
                if (i < c.n && i > first) {
                        char buf[64];
                        snprintf(buf, sizeof(buf), "%lld.%s", (long long)c.items[i - 1].created_ms, c.items[i - 1].id);
                        next = json_string(buf);
                }
        }
        for (size_t i = 0; i < c.n; i++)
                json_decref(c.items[i].j);
        free(c.items);
        if (rc < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        if (!data)
                return reply_internal(r);
        /* "sandboxes" is the same list under its first name, for the
         * clients written before pages. */
        json_t *j = json_pack("{s:O,s:O,s:o,s:b}", "data", data, "sandboxes", data, "nextCursor", next, "hasMore",
                              !json_is_null(next));
        return j ? reply_json(r, 200, j) : reply_internal(r);
}



/* A create's `snapshot` field: takes it out of r->json, checks it is one of
 * the key owner's snapshots, fills the fields the create left out (driver,
 * image, shape) from it and answers its directory in *ret_dir (NULL when the
 * create has no snapshot). A diskMiB smaller than the snapshot's, or
 * another driver or image, is a 400; but an image's disk (from_image) starts
 * on namespace and gVisor alike, both keeping a disk the same way, and on
 * the microVM, whose restore_disk makes its own disk of those layers. */
static int snapshot_create_defaults(Req *r, bool from_image, char **ret_dir, ApiError *e) {
        *ret_dir = NULL;
        json_t *v = json_object_get(r->json, "snapshot");
        if (!v || json_is_null(v)) {
                json_object_del(r->json, "snapshot");
                return 0;
        }
        const char *id = json_string_value(v);
        if (!id)
                return api_error(e, 400, "invalid_request", NULL, "snapshot must be a snapshot's id");
        SnapshotRow s;
        int rc = snapshot_store_get(r->app->snapshots, r->key.owner, id, &s);
        if (rc == -ENOENT)
                return api_error(e, 404, "not_found", "GET /v1/snapshots lists yours", "no snapshot %.32s", id);
        if (rc < 0)
                return api_error(e, 500, "internal", NULL, "could not read the snapshot");
        _cleanup_json_ json_t *spec = json_loads(s.spec, 0, NULL);
        const char *mine = json_string_value(json_object_get(r->json, "driver"));
        const char *theirs = json_string_value(json_object_get(spec, "driver"));
        if (from_image && mine && theirs &&
            (strcmp(mine, "namespace") == 0 || strcmp(mine, "gvisor") == 0 || strcmp(mine, "microvm") == 0) &&
            (strcmp(theirs, "namespace") == 0 || strcmp(theirs, "gvisor") == 0))
                json_object_set_new(spec, "driver", json_string(mine));
        rc = snapshot_merge_create_defaults(r->json, spec, strcmp(s.mode, "memory") == 0, e);
        if (rc == 0) {
                *ret_dir = snapshot_store_dir(r->app->snapshots, s.id);
                if (!*ret_dir)
                        rc = api_error(e, 500, "internal", NULL, "out of memory");
        }
        snapshot_row_done(&s);
        if (rc == 0)
                json_object_del(r->json, "snapshot");
        return rc;
}

/* A create's `image` that names a snapshot ("snp_" and its hex digits, as
 * the E2B drop-in sends a template that is a snapshot's id) becomes its
 * `snapshot`, so that the create starts from it as one with `snapshot`
 * does, another owner's or an unknown one a 404. No image name begins
 * "snp_": one that does and is no snapshot's id is a 400. */
static int image_snapshot_to_field(Req *r, ApiError *e) {
        json_t *image = json_object_get(r->json, "image");
        const char *id = json_string_value(image);
        if (!id || strncmp(id, "snp_", 4) != 0)
                return 0;
        if (json_string_length(image) != strlen(id) || !snapshot_id_ok(id))
                return api_error(e, 400, "invalid_request", "a snapshot's id is snp_ and 20 hex digits",
                                 "image %.64s names no snapshot: it is not a snapshot's id", id);
        json_t *snap = json_object_get(r->json, "snapshot");
        if (snap && !json_is_null(snap) && !json_equal(snap, image))
                return api_error(e, 400, "invalid_request", "give the snapshot once, as snapshot",
                                 "image names snapshot %s and snapshot another", id);
        if (json_object_set(r->json, "snapshot", image) < 0)
                return api_error(e, 500, "internal", NULL, "out of memory");
        json_object_del(r->json, "image");
        return 0;
}

/* A create from a snapshot or an image whose home host does not answer:
 * its files are on that host only (docs/fleet.md). */
static int unplaced_home(ApiError *e, const char *host, bool from_image) {
        if (from_image)
                return api_error(e, 503, "host_unavailable",
                                 "try again when that host is back, or build the image again (a build runs on the "
                                 "host it is sent to)",
                                 "host %s, which keeps the image's disk, does not answer", host);
        return api_error(e, 503, "host_unavailable", "try again, or create it without the snapshot",
                         "host %s, which keeps the snapshot, does not answer", host);
}

/* Where a create runs, when other hosts share the store (docs/fleet.md,
 * "Placement"): one from a snapshot on the snapshot's home, any other on a
 * live host that offers the driver and has the memory free (best of two).
 * 1: the request went on to that host (*ret its answer); 0: it runs here;
 * -1: refused (e). A request that came placed, or a getOrCreate (whose
 * claim is fleet-wide already), runs here. */
static int place_create(Req *r, bool get_or_create, bool from_image, enum MHD_Result *ret, ApiError *e) {
        Fleet *fleet = r->app->fleet;
        if (r->forwarded || get_or_create || fleet_single(fleet))
                return 0;
        const char *self = fleet_host_id(fleet);
        char host[64] = "", url[512];
        json_t *snap = json_object_get(r->json, "snapshot");
        if (json_is_string(snap)) {
                SnapshotRow s;
                if (snapshot_store_get(r->app->snapshots, r->key.owner, json_string_value(snap), &s) < 0)
                        return 0; /* not found: the create says so */
                snprintf(host, sizeof host, "%s", s.host_id);
                snapshot_row_done(&s);
                if (!host[0] || strcmp(host, self) == 0)
                        return 0;
                /* Its files are on that host only: alone here (the host
                 * dead) or without the secret to reach it, the create
                 * cannot run here either. */
                if (!http_forwards(r) || fleet_host_url(fleet, host, url, sizeof url) < 0)
                        return unplaced_home(e, host, from_image);
        } else if (fleet_alone(fleet) || !http_forwards(r)) {
                return 0;
        } else {
                SandboxSpec defaults;
                sandbox_spec_init(&defaults);
                json_t *drv = json_object_get(r->json, "driver"), *mem = json_object_get(r->json, "memoryMiB");
                const Driver *d = r->app->cfg->default_driver;
                FleetNeed need = { .driver = json_is_string(drv) ? json_string_value(drv) : d ? d->name : NULL,
                                   .memory_mib = json_is_integer(mem) ? json_integer_value(mem)
                                                                      : (int64_t)defaults.memory_mib };
                sandbox_spec_done(&defaults);
                int rc = fleet_place(fleet, &need, host, sizeof host, url, sizeof url);
                if (rc == -ENOSPC)
                        return api_error(e, 503, "no_capacity", "try again shortly: sandboxes end and hosts free room",
                                         "no host has room for the sandbox (%s, %lld MiB)",
                                         need.driver ? need.driver : "no driver", (long long)need.memory_mib);
                if (rc < 0 || strcmp(host, self) == 0)
                        return 0;
        }
        if (http_forward_whole(r, url, ret) == 0) {
                log_info(r->rid, "create placed on host %s", host);
                return 1;
        }
        /* The chosen host did not answer (it may have died within a beat):
         * a create without a snapshot runs here if this host may take it. */
        if (json_is_string(snap))
                return unplaced_home(e, host, from_image);
        if (fleet_draining(fleet))
                return api_error(e, 503, "host_unavailable", "try again", "host %s, chosen for the sandbox, does not "
                                 "answer", host);
        log_warn(r->rid, "host %s, chosen for a create, does not answer: it runs here", host);
        return 0;
}

enum MHD_Result handle_sandbox_create(Req *r) {
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        ReqLimits lim = { cfg->max_vcpu, cfg->max_memory_mib, cfg->max_disk_mib };
        CreateRequest cr;
        json_t *goc = json_object_get(r->json, "getOrCreate");
        if (goc && !json_is_null(goc) && !json_is_boolean(goc)) {
                api_error(&e, 400, "invalid_request", NULL, "getOrCreate must be a boolean");
                return reply_error(r, &e);
        }
        bool get_or_create = json_is_true(goc);
        bool from_image = false;
        _cleanup_json_ json_t *start = NULL;
        if (api_user_image_to_create(r, &from_image, &start, &e) < 0)
                return reply_error(r, &e);
        if (image_snapshot_to_field(r, &e) < 0)
                return reply_error(r, &e);
        enum MHD_Result placed = MHD_NO;
        int pr = place_create(r, get_or_create, from_image, &placed, &e);
        if (pr < 0)
                return reply_error(r, &e);
        if (pr > 0)
                return placed;
        /* A draining host starts nothing new; no_capacity is what the
         * published client waits out (its wait_for_capacity). */
        if (!get_or_create && fleet_draining(r->app->fleet)) {
                api_error(&e, 503, "no_capacity", "try again shortly, or send it to another host",
                          "this host is draining: it starts no new sandboxes");
                return reply_error(r, &e);
        }
        _cleanup_free_ char *snap_dir = NULL;
        int rc = snapshot_create_defaults(r, from_image, &snap_dir, &e);
        if (rc < 0)
                return reply_error(r, &e);
        rc = request_parse_create(r->json, &lim, &cr, &e);
        cr.restore_dir = snap_dir;
        if (rc < 0)
                return reply_result(r, rc, NULL, &e, 0);
        if ((rc = request_apply_trial_shape(r->key.trial, r->json, &cr, &e)) < 0) {
                create_request_done(&cr);
                return reply_result(r, rc, NULL, &e, 0);
        }
        /* interpreter_prestart below gives a pool kernel its owner's env. */
        cr.pool_kernel_ok = true;
        bool reused = false;
        if (get_or_create)
                rc = sandbox_get_or_create(r->app->manager, &r->key, &cr, r->rid, &row, &reused, &se);
        else
                rc = sandbox_create(r->app->manager, &r->key, &cr, r->rid, &row, &se);
        create_request_done(&cr);
        if (rc < 0)
                return reply_row(r, rc, &row, &se, 201);
        /* The audit trail's record of the create names the sandbox made. */
        snprintf(r->audit_sandbox_id, sizeof r->audit_sandbox_id, "%.*s", ROUTE_ID_LEN, row.id);
        if (!reused && row.state == SANDBOX_RUNNING)
                interpreter_prestart(r->app, &r->key, row.id);
        /* An image's start command runs once, at the create that makes the
         * sandbox: a getOrCreate that finds one runs nothing again. */
        _cleanup_json_ json_t *start_report = NULL;
        if (start && !reused && row.state == SANDBOX_RUNNING &&
            start_command_run(r->app->manager, r->app->procs, &r->key, row.id, json_object_get(start, "start"),
                              json_string_value(json_object_get(start, "workdir")), &start_report) < 0) {
                sandbox_row_done(&row);
                return reply_internal(r);
        }
        json_t *j = api_sandbox_json(r->app->manager, &row);
        sandbox_row_done(&row);
        if (j && start_report && json_object_set(j, "start", start_report) < 0)
                json_decref(TAKE_PTR(j));
        if (!j || json_object_set_new(j, "reused", json_boolean(reused)) < 0) {
                json_decref(j);
                return reply_internal(r);
        }
        return reply_json(r, reused ? 200 : 201, j);
}

enum MHD_Result handle_sandbox_get(Req *r) {
        SandboxError se;
        SandboxRow row;
        const char *wait_for = req_query(r, "waitFor");
        int rc;
        if (wait_for) {
                /* The published client waits for a state server-side. */
                ApiError e = { 0 };
                SandboxState state;
                int64_t timeout_ms;
                if (request_parse_wait_for(wait_for, req_query(r, "timeoutSeconds"), &state, &timeout_ms, &e) < 0)
                        return reply_error(r, &e);
                rc = sandbox_wait_state(r->app->manager, &r->key, r->route.sandbox_id, state, timeout_ms, &row, &se);
                return reply_row(r, rc, &row, &se, 200);
        }
        rc = sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_delete(Req *r) {
        SandboxError se;
        ApiError e = { 0 };
        if (sandbox_delete(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        preview_proxy_forget_sandbox(r->app, r->route.sandbox_id);
        json_t *j = json_pack("{s:s,s:s}", "id", r->route.sandbox_id, "state", "deleted");
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_sandbox_stop(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        if (json_object_size(r->json) > 0) {
                api_error(&e, 400, "invalid_request", NULL, "unknown field %.64s",
                          json_object_iter_key(json_object_iter(r->json)));
                return reply_error(r, &e);
        }
        int rc = sandbox_stop(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_extend(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        int64_t seconds;
        if (request_parse_extend(r->json, &seconds, &e) < 0)
                return reply_result(r, -EINVAL, NULL, &e, 0);
        int rc = sandbox_extend(r->app->manager, &r->key, r->route.sandbox_id, seconds, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_network(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        _cleanup_json_ json_t *net = NULL;
        if (request_parse_network(r->json, "network", &net, &e) < 0)
                return reply_result(r, -EINVAL, NULL, &e, 0);
        int rc = sandbox_set_network(r->app->manager, &r->key, r->route.sandbox_id, net, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

/* The lifecycle's transitions (docs/lifecycle.md): each answers the sandbox as
 * the transition left it, once it is done. */
enum MHD_Result handle_sandbox_pause(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        if (request_parse_no_fields(r->json, &e) < 0)
                return reply_error(r, &e);
        int rc = sandbox_pause(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_wake(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        int64_t timeout_seconds = 0;
        if (request_parse_wake(r->json, &timeout_seconds, &e) < 0)
                return reply_error(r, &e);
        int rc = sandbox_wake(r->app->manager, &r->key, r->route.sandbox_id, timeout_seconds, r->rid, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_restart(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        if (request_parse_no_fields(r->json, &e) < 0)
                return reply_error(r, &e);
        int rc = sandbox_restart(r->app->manager, &r->key, r->route.sandbox_id, r->rid, &row, &se);
        return reply_row(r, rc, &row, &se, 200);
}

enum MHD_Result handle_sandbox_network_get(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        int rc = sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se);
        if (rc < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        json_t *net = json_incref(row.spec.network);
        sandbox_row_done(&row);
        if (!net)
                return reply_internal(r);
        return reply_json(r, 200, net);
}

enum MHD_Result handle_sandbox_update(Req *r) {
        ApiError e = { 0 };
        SandboxError se;
        SandboxRow row;
        UpdateRequest u;
        if (request_parse_update(r->json, &u, &e) < 0)
                return reply_result(r, -EINVAL, NULL, &e, 0);
        SandboxUpdate su = { .set_name = u.set_name, .name = u.name, .labels = u.labels, .network = u.network,
                             .on_lease_end = u.on_lease_end,
                             .lease_end = u.timeout_seconds ? time_now_unix() + u.timeout_seconds : 0,
                             .env = u.env, .auto_wake = u.auto_wake, .idle_pause_seconds = u.idle_pause_seconds,
                             .set_max_total = u.set_max_total, .max_total_cost_micros = u.max_total_cost_micros,
                             .set_user = u.set_user, .run_as_root = u.run_as_root };
        int rc = sandbox_update(r->app->manager, &r->key, r->route.sandbox_id, &su, r->rid, &row, &se);
        update_request_done(&u);
        return reply_row(r, rc, &row, &se, 200);
}
