#pragma once
/* Previews (docs/previews.md): POST/GET .../previews, GET/DELETE
 * .../previews/{port}, POST .../previews/{port}:rotate. The requests to a
 * preview itself are served on a listener of their own (preview_proxy.h). */
#include "daemon/http/http.h"

enum MHD_Result handle_previews_create(Req *r);
enum MHD_Result handle_previews_list(Req *r);
enum MHD_Result handle_preview_get(Req *r);
enum MHD_Result handle_preview_delete(Req *r);
enum MHD_Result handle_preview_rotate(Req *r);

#include "daemon/http/apierror.h"
#include "daemon/manager/previews.h"

/* The route's sandbox's port shared for a part of the daemon that serves
 * through the preview listener (the browser's DevTools, the desktop's live
 * view): the preview there, a private one made when there is none. Its URL
 * (http(s)://PORT-sbx-HEX.DOMAIN[:PORT]) in ret_url and a token of the
 * default life in ret_token; 501 previews_unavailable without a listener. */
int api_preview_share(Req *r, unsigned port, char *ret_url, size_t url_len, char ret_token[PREVIEW_TOKEN_MAX],
                      ApiError *e);
