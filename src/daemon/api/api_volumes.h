#pragma once
/* Volumes (docs/volumes.md): GET/POST /v1/volumes, GET/DELETE
 * /v1/volumes/{volume}, POST /v1/volumes/{volume}:resize and :delete. The
 * published client's backups and live attach are answered 501. */
#include "daemon/http/http.h"

enum MHD_Result handle_volumes_list(Req *r);
enum MHD_Result handle_volumes_create(Req *r);
enum MHD_Result handle_volume_get(Req *r);
enum MHD_Result handle_volume_resize(Req *r);
enum MHD_Result handle_volume_delete(Req *r);
/* :attach, :backup, :backup-policy and /v1/volume-backups. */
enum MHD_Result handle_volume_not_offered(Req *r);
