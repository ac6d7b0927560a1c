#pragma once
/* Signed file links (docs/api.md, "File links"): POST .../files:link makes
 * one, POST .../files:revoke-links ends them all; a link is then used on the
 * file routes themselves, checked by api_links_check at admission. */
#include "daemon/http/http.h"

enum MHD_Result handle_files_link(Req *r);
enum MHD_Result handle_files_revoke_links(Req *r);
/* HttpLinks' check and claim, userdata the App. */
int api_links_check(void *userdata, Req *r, const char *op, ApiError *e);
int api_links_claim(void *userdata, Req *r, ApiError *e);
