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
