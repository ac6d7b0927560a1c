#pragma once
/* The images users build (docs/images.md): the context's chunks, builds,
 * their logs, tags and deletes, over the image module (user_images.h). */
#include "daemon/api/api.h"

enum MHD_Result handle_image_context_missing(Req *r);
enum MHD_Result handle_image_context_put(Req *r);
extern const HttpUpload image_context_upload;
enum MHD_Result handle_image_create(Req *r);
enum MHD_Result handle_image_resolve(Req *r);
enum MHD_Result handle_image_get(Req *r);
enum MHD_Result handle_image_logs(Req *r);
enum MHD_Result handle_image_tag(Req *r);
enum MHD_Result handle_image_untag(Req *r);
enum MHD_Result handle_image_delete(Req *r);
enum MHD_Result handle_image_registries(Req *r);
/* The owner's images as a page of GET /v1/images: {data, nextCursor} set
 * into body. */
int api_user_images_page(Req *r, json_t *body, ApiError *e);
/* A create's `image` that names one of the owner's images (an id, name,
 * name:tag or name@version) becomes the `snapshot` of its disk, with the
 * image's env under the create's own and its user; left as it is when it
 * names none (a built-in image, or an unknown name the create refuses). */
int api_user_image_to_create(Req *r, bool *ret_from_image, ApiError *e);
