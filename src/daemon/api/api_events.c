/* GET /v1/events (docs/api.md, "Events"): the key's owner's lifecycle events
 * (the admin key's: every owner's), newest first, in pages by cursor, with
 * the published client's filters (resourceId, type). */
#include "daemon/api/api_events.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "daemon/api/api.h"
#include "daemon/manager/events.h"

#define EVENTS_LIST_DEFAULT 50

typedef struct Page {
        json_t *data;
        unsigned limit;
        int64_t last_seq; /* of the page's last event: the next page's cursor */
} Page;

static int add_one(void *userdata, const EventRecord *ev) {
        Page *p = userdata;
        json_t *data = ev->data ? json_loads(ev->data, 0, NULL) : NULL;
        json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s?,s:s,s:o,s:o}", "id", ev->id, "type", ev->type, "resourceType",
                              ev->resource_type, "resourceId", ev->resource_id, "keyId", ev->key_id, "hostId",
                              ev->host_id ? ev->host_id : "", "time", json_time_or_null(ev->at), "data",
                              data ? data : json_object());
        if (!j || json_array_append_new(p->data, j) < 0)
                return -ENOMEM;
        if (json_array_size(p->data) == p->limit)
                p->last_seq = ev->seq;
        return 0;
}

enum MHD_Result handle_events(Req *r) {
        ApiError e = { 0 };
        EventFilter f = { 0 };
        if (api_page_query(r, EVENTS_LIST_DEFAULT, EVENTS_LIST_MAX, &f.limit, &f.before, &e) < 0)
                return reply_error(r, &e);
        f.resource_id = req_query(r, "resourceId");
        f.type = req_query(r, "type");
        if ((f.resource_id && !api_filter_ok(f.resource_id)) || (f.type && !api_filter_ok(f.type))) {
                api_error(&e, 400, "invalid_request", NULL,
                          "resourceId and type are 1 to 64 letters, digits, '.', '_' or '-'");
                return reply_error(r, &e);
        }
        /* The admin key sees every owner's; any other key its owner's. */
        f.owner = keys_is_admin(&r->key) ? NULL : r->key.owner;
        Page p = { .data = json_array(), .limit = f.limit };
        f.limit += 1; /* one past the page says whether there is a next one */
        int rc = p.data ? events_list(r->app->events, &f, add_one, &p) : -ENOMEM;
        if (rc < 0) {
                json_decref(p.data);
                if (rc == -ENOTCONN || rc == -ETIMEDOUT) {
                        api_error(&e, 503, "unavailable", "try again", "the store did not answer");
                        return reply_error(r, &e);
                }
                return reply_internal(r);
        }
        json_t *j = api_page_json(p.data, p.limit, p.last_seq);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}
