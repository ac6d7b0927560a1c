/* The webhooks routes (docs/api.md, "Webhooks"). Every webhook is its key's
 * owner's: another owner's is 404, as if it were not there. The secret is in
 * the answers of a create and a rotation only. */
#include "daemon/api/api_webhooks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "daemon/api/api.h"
#include "daemon/manager/webhooks.h"

#define DELIVERIES_LIST_DEFAULT 50
#define DELIVERIES_LIST_MAX 100

static json_t *webhook_json(const WebhookRecord *w) {
        json_t *events = json_loads(w->events ? w->events : "[]", 0, NULL);
        return json_pack("{s:s,s:s,s:o,s:s?,s:b,s:o,s:o,s:o}", "id", w->id, "url", w->url, "events",
                         events ? events : json_array(), "description",
                         w->description && *w->description ? w->description : NULL, "enabled", w->enabled,
                         "createdAt", json_time_or_null(w->created_at), "updatedAt", json_time_or_null(w->updated_at),
                         "previousSecretExpiresAt",
                         w->previous_secret && *w->previous_secret ? json_time_or_null(w->previous_until)
                                                                   : json_null());
}

static json_t *delivery_json(const DeliveryRecord *d) {
        bool pending = d->state && strcmp(d->state, "pending") == 0;
        return json_pack("{s:s,s:s,s:s,s:s,s:s,s:i,s:o,s:o,s:s?,s:o,s:o}", "id", d->id, "webhookId", d->webhook_id,
                         "eventId", d->event_id, "eventType", d->event_type, "state", d->state, "attempts",
                         d->attempts, "nextAttemptAt", pending ? json_time_or_null(d->next_at) : json_null(),
                         "responseStatus", d->response_status ? json_integer(d->response_status) : json_null(),
                         "lastError", d->last_error && *d->last_error ? d->last_error : NULL, "createdAt",
                         json_time_or_null(d->created_at), "updatedAt", json_time_or_null(d->updated_at));
}

/* The one record a call hands back. */
typedef struct One {
        json_t *j;
} One;

static int one_webhook(void *userdata, const WebhookRecord *w) {
        One *o = userdata;
        json_decref(o->j);
        o->j = webhook_json(w);
        return o->j ? 0 : -ENOMEM;
}

static int one_delivery(void *userdata, const DeliveryRecord *d) {
        One *o = userdata;
        json_decref(o->j);
        o->j = delivery_json(d);
        return o->j ? 0 : -ENOMEM;
}

/* A manager's or store's refusal as the API's error. */
static enum MHD_Result refusal(Req *r, int rc, const char *what) {
        ApiError e;
        switch (rc) {
        case -ENOENT:
                if (r->route.kind == ROUTE_DELIVERY_RETRY)
                        api_error(&e, 404, "not_found", "GET /v1/webhooks/{id}/deliveries lists them",
                                  "no delivery %s", r->route.delivery_id);
                else
                        api_error(&e, 404, "not_found", "GET /v1/webhooks lists them", "no webhook %s",
                                  r->route.webhook_id);
                break;
        case -EDQUOT:
                api_error(&e, 409, "limit_exceeded", "delete a webhook you no longer use",
                          "an owner has at most %d webhooks", WEBHOOKS_MAX_PER_OWNER);
                break;
        case -EBUSY:
                api_error(&e, 409, "conflict", "try again in a minute",
                          "an attempt of this delivery is in flight");
                break;
        case -ENOTCONN:
        case -ETIMEDOUT:
                api_error(&e, 503, "unavailable", "try again", "the store did not answer");
                break;
        default:
                log_error(r->rid, "%s: %s", what, strerror(-rc));
                api_error(&e, 500, "internal", "the daemon's log has details", "could not %s", what);
        }
        return reply_error(r, &e);
}

/* The fields of a create or an update, checked: what the manager takes.
 * events_text is malloc'ed (the caller frees it). */
static int parse_input(Req *r, bool create, WebhookInput *in, char **events_text, char *why, size_t n) {
        json_t *body = r->json;
        *in = (WebhookInput){ .enabled = create ? 1 : -1 };
        *events_text = NULL;
        if (!json_is_object(body)) {
                snprintf(why, n, "the body must be a JSON object");
                return -EINVAL;
        }
        const char *k;
        json_t *v;
        json_object_foreach(body, k, v) {
                if (strcmp(k, "url") == 0) {
                        if (!json_is_string(v)) {
                                snprintf(why, n, "url must be a string");
                                return -EINVAL;
                        }
                        in->url = json_string_value(v);
                        if (webhooks_check_url(r->app->webhooks, in->url, why, n) < 0)
                                return -EINVAL;
                } else if (strcmp(k, "events") == 0) {
                        if (json_is_null(v))
                                continue;
                        *events_text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
                        if (!*events_text)
                                return -ENOMEM;
                        if (webhooks_check_events(*events_text, why, n) < 0)
                                return -EINVAL;
                        in->events = *events_text;
                } else if (strcmp(k, "description") == 0) {
                        if (json_is_null(v))
                                continue;
                        const char *d = json_string_value(v);
                        if (!d || json_string_length(v) > WEBHOOK_DESCRIPTION_MAX ||
                            strlen(d) != json_string_length(v)) {
                                snprintf(why, n, "description must be a string of at most %d bytes",
                                         WEBHOOK_DESCRIPTION_MAX);
                                return -EINVAL;
                        }
                        in->description = d;
                } else if (strcmp(k, "enabled") == 0 && !create) {
                        if (!json_is_boolean(v)) {
                                snprintf(why, n, "enabled must be true or false");
                                return -EINVAL;
                        }
                        in->enabled = json_is_true(v);
                } else {
                        snprintf(why, n, "unknown field %.64s", k);
                        return -EINVAL;
                }
        }
        if (create && !in->url) {
                snprintf(why, n, "url is required");
                return -EINVAL;
        }
        return 0;
}

static int add_webhook(void *userdata, const WebhookRecord *w) {
        json_t *j = webhook_json(w);
        return j && json_array_append_new(userdata, j) == 0 ? 0 : -ENOMEM;
}

enum MHD_Result handle_webhooks_list(Req *r) {
        if (!r->app->webhooks)
                return api_reply_not_offered(r, "webhooks are");
        json_t *arr = json_array();
        int rc = arr ? webhooks_list(r->app->webhooks, r->key.owner, add_webhook, arr) : -ENOMEM;
        if (rc < 0) {
                json_decref(arr);
                return refusal(r, rc, "list the webhooks");
        }
        json_t *j = json_pack("{s:o}", "data", arr);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

/* The answer of a create or a rotation: the webhook, with its secret. */
static enum MHD_Result with_secret(Req *r, unsigned status, json_t *j, char *secret) {
        int bad = json_object_set_new(j, "secret", json_string(secret));
        explicit_bzero(secret, WEBHOOK_SECRET_LEN + 1);
        if (bad < 0) {
                json_decref(j);
                return reply_internal(r);
        }
        return reply_json(r, status, j);
}

enum MHD_Result handle_webhooks_create(Req *r) {
        if (!r->app->webhooks)
                return api_reply_not_offered(r, "webhooks are");
        WebhookInput in;
        char why[256], secret[WEBHOOK_SECRET_LEN + 1];
        _cleanup_free_ char *events = NULL;
        int rc = parse_input(r, true, &in, &events, why, sizeof why);
        if (rc == -EINVAL)
                return api_reply_invalid(r, NULL, why);
        if (rc < 0)
                return reply_internal(r);
        One o = { 0 };
        rc = webhooks_create(r->app->webhooks, r->key.owner, &in, secret, one_webhook, &o);
        if (rc < 0) {
                json_decref(o.j);
                explicit_bzero(secret, sizeof secret);
                return refusal(r, rc, "create the webhook");
        }
        log_info(r->rid, "webhook %s created by key %s", json_string_value(json_object_get(o.j, "id")), r->key.id);
        return with_secret(r, 201, o.j, secret);
}

enum MHD_Result handle_webhook_get(Req *r) {
        if (!r->app->webhooks)
                return api_reply_not_offered(r, "webhooks are");
        One o = { 0 };
        int rc = webhooks_get(r->app->webhooks, r->route.webhook_id, r->key.owner, one_webhook, &o);
        if (rc < 0) {
                json_decref(o.j);
                return refusal(r, rc, "read the webhook");
        }
        return reply_json(r, 200, o.j);
}

enum MHD_Result handle_webhook_update(Req *r) {
        if (!r->app->webhooks)
                return api_reply_not_offered(r, "webhooks are");
        WebhookInput in;
        char why[256];
        _cleanup_free_ char *events = NULL;
        int rc = parse_input(r, false, &in, &events, why, sizeof why);
        if (rc == -EINVAL)
                return api_reply_invalid(r, NULL, why);
        if (rc < 0)
                return reply_internal(r);
        One o = { 0 };
        rc = webhooks_update(r->app->webhooks, r->route.webhook_id, r->key.owner, &in, one_webhook, &o);
        if (rc < 0) {
                json_decref(o.j);
                return refusal(r, rc, "update the webhook");
        }
        return reply_json(r, 200, o.j);
}

enum MHD_Result handle_webhook_rotate(Req *r) {
        if (!r->app->webhooks)
                return api_reply_not_offered(r, "webhooks are");
        int64_t keep = WEBHOOK_KEEP_PREVIOUS_DEFAULT;
        if (r->json) {
                const char *k;
                json_t *v;
                json_object_foreach(r->json, k, v) {
                        if (strcmp(k, "keepPreviousSeconds") != 0)
                                return api_reply_invalid(r, NULL, "the body takes keepPreviousSeconds alone");
                        if (json_is_null(v))
                                continue;
                        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                            json_integer_value(v) > WEBHOOK_KEEP_PREVIOUS_MAX)
                                return api_reply_invalid(r, NULL, "keepPreviousSeconds must be an integer from 0 to 604800 (a week)");
                        keep = json_integer_value(v);
                }
        }
        One o = { 0 };
        char secret[WEBHOOK_SECRET_LEN + 1];
        int rc = webhooks_rotate(r->app->webhooks, r->route.webhook_id, r->key.owner, keep, secret, one_webhook, &o);
        if (rc < 0) {
                json_decref(o.j);
                explicit_bzero(secret, sizeof secret);
                return refusal(r, rc, "rotate the webhook's secret");
        }
        log_info(r->rid, "webhook %s: secret rotated by key %s", r->route.webhook_id, r->key.id);
        return with_secret(r, 200, o.j, secret);
}

enum MHD_Result handle_webhook_delete(Req *r) {
        if (!r->app->webhooks)
                return api_reply_not_offered(r, "webhooks are");
        int rc = webhooks_delete(r->app->webhooks, r->route.webhook_id, r->key.owner);
        if (rc < 0)
                return refusal(r, rc, "delete the webhook");
        log_info(r->rid, "webhook %s deleted by key %s", r->route.webhook_id, r->key.id);
        json_t *j = json_pack("{s:s,s:b}", "id", r->route.webhook_id, "deleted", 1);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_webhook_test(Req *r) {
        if (!r->app->webhooks)
                return api_reply_not_offered(r, "webhooks are");
        WebhookAttempt a;
        int rc = webhooks_test(r->app->webhooks, r->route.webhook_id, r->key.owner, &a);
        if (rc < 0)
                return refusal(r, rc, "test the webhook");
        json_t *j = json_pack("{s:b,s:o,s:s?,s:I}", "delivered", a.delivered, "responseStatus",
                              a.status ? json_integer(a.status) : json_null(), "error", a.error[0] ? a.error : NULL,
                              "durationMs", (json_int_t)a.duration_ms);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

typedef struct Page {
        json_t *data;
        unsigned limit;
        int64_t last_seq;
} Page;

static int add_delivery(void *userdata, const DeliveryRecord *d) {
        Page *p = userdata;
        json_t *j = delivery_json(d);
        if (!j || json_array_append_new(p->data, j) < 0)
                return -ENOMEM;
        if (json_array_size(p->data) == p->limit)
                p->last_seq = d->seq;
        return 0;
}

enum MHD_Result handle_webhook_deliveries(Req *r) {
        if (!r->app->webhooks)
                return api_reply_not_offered(r, "webhooks are");
        DeliveryFilter f = { 0 };
        ApiError e;
        if (api_page_query(r, DELIVERIES_LIST_DEFAULT, DELIVERIES_LIST_MAX, &f.limit, &f.before, &e) < 0)
                return reply_error(r, &e);
        f.state = req_query(r, "state");
        if (f.state && strcmp(f.state, "pending") != 0 && strcmp(f.state, "delivered") != 0 &&
            strcmp(f.state, "failed") != 0)
                return api_reply_invalid(r, NULL, "state must be pending, delivered or failed");
        Page p = { .data = json_array(), .limit = f.limit };
        f.limit += 1; /* one past the page says whether there is a next one */
        int rc = p.data ? webhooks_deliveries(r->app->webhooks, r->route.webhook_id, r->key.owner, &f, add_delivery, &p)
                        : -ENOMEM;
        if (rc < 0) {
                json_decref(p.data);
                return refusal(r, rc, "list the deliveries");
        }
        json_t *j = api_page_json(p.data, p.limit, p.last_seq);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_delivery_retry(Req *r) {
        if (!r->app->webhooks)
                return api_reply_not_offered(r, "webhooks are");
        One o = { 0 };
        int rc = webhooks_retry(r->app->webhooks, r->route.delivery_id, r->key.owner, one_delivery, &o);
        if (rc < 0) {
                json_decref(o.j);
                return refusal(r, rc, "retry the delivery");
        }
        return reply_json(r, 200, o.j);
}
