#pragma once
/* Previews (docs/previews.md): POST/GET .../previews, GET/DELETE
 * .../previews/{port}, POST .../previews/{port}:rotate. The requests to a
 * preview itself are served on a listener of their own (preview_proxy.h). */
#include <stdbool.h>

#include "daemon/http/http.h"

/* Where previews are reached: http(s)://PORT-SANDBOX.DOMAIN[:PORT]. */
typedef struct PreviewSite {
        char domain[254];
        unsigned public_port; /* the port in the URLs; 80 or 443 is left out */
        bool https;           /* URLs say https (TLS ends at a proxy in front) */
} PreviewSite;

/* The query argument and cookie that carry a private preview's token, and
 * its header. */
#define PREVIEW_TOKEN_ARG "runtime_preview_token"
#define PREVIEW_TOKEN_HEADER "x-runtime-preview-token"

enum MHD_Result handle_previews_create(Req *r);
enum MHD_Result handle_previews_list(Req *r);
enum MHD_Result handle_preview_get(Req *r);
enum MHD_Result handle_preview_delete(Req *r);
enum MHD_Result handle_preview_rotate(Req *r);
/* A deleted sandbox's previews go with it (its handler calls this). */
void api_previews_forget(App *app, const char *sandbox_id);
