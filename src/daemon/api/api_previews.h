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
/* GET .../previews/{port}:relay, from another host of the fleet only (its
 * secret checked by the HTTP edge): the connection, upgraded, becomes one
 * of this host's preview listener (docs/previews.md, "A fleet"). */
enum MHD_Result handle_preview_relay(Req *r);
