#pragma once
/* GET /v1/images and POST /v1/images/{name}:build. */
#include "daemon/http/http.h"

enum MHD_Result handle_images(Req *r);
enum MHD_Result handle_image_build(Req *r);