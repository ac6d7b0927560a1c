#pragma once
/* The webhooks routes (docs/api.md, "Webhooks"): an owner's webhooks, their
 * secrets (shown once), tests, deliveries and retries. */
#include "daemon/http/http.h"

enum MHD_Result handle_webhooks_list(Req *r);
enum MHD_Result handle_webhooks_create(Req *r);
enum MHD_Result handle_webhook_get(Req *r);
enum MHD_Result handle_webhook_update(Req *r);
enum MHD_Result handle_webhook_rotate(Req *r);
enum MHD_Result handle_webhook_delete(Req *r);
enum MHD_Result handle_webhook_test(Req *r);
enum MHD_Result handle_webhook_deliveries(Req *r);
enum MHD_Result handle_delivery_retry(Req *r);
