#pragma once
/* The images users build (docs/images.md): the context's chunks, builds,
 * their logs, tags and deletes, over the image module (user_images.h). */
#include "daemon/api/api.h"

enum MHD_Result handle_image_context_missing(Req *r);
enum MHD_Result handle_image_context_put(Req *r);
extern const HttpUpload image_context_upload;
/* A create's body: inline files (8 MiB, 4/3 of that in base64) and the
 * JSON around them. */
#define IMAGE_CREATE_MAX_BODY (12u * 1024u * 1024u)
enum MHD_Result handle_image_create(Req *r);
enum MHD_Result handle_image_resolve(Req *r);
enum MHD_Result handle_image_get(Req *r);
enum MHD_Result handle_image_logs(Req *r);
enum MHD_Result handle_image_tag(Req *r);
enum MHD_Result handle_image_untag(Req *r);
enum MHD_Result handle_image_delete(Req *r);
enum MHD_Result handle_image_registries(Req *r);
extern const HttpUpload image_import_upload;
enum MHD_Result handle_image_import(Req *r);
enum MHD_Result handle_image_registry_set(Req *r);
enum MHD_Result handle_image_registry_delete(Req *r);
