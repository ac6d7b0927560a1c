#pragma once
/* Volumes (docs/volumes.md): GET/POST /v1/volumes, GET/DELETE
 * /v1/volumes/{volume}, POST /v1/volumes/{volume}:resize, :delete and
 * :backup and :backup-policy, GET /v1/volume-backups[/{backup}], and their
 * deletes. The published client's live attach is answered 501. */
#include "daemon/http/http.h"

enum MHD_Result handle_volumes_list(Req *r);
enum MHD_Result handle_volumes_create(Req *r);
enum MHD_Result handle_volume_get(Req *r);
enum MHD_Result handle_volume_resize(Req *r);
enum MHD_Result handle_volume_delete(Req *r);
enum MHD_Result handle_volume_backup(Req *r);
enum MHD_Result handle_volume_backups_list(Req *r);
enum MHD_Result handle_volume_backup_get(Req *r);
enum MHD_Result handle_volume_backup_delete(Req *r);
enum MHD_Result handle_volume_backup_policy(Req *r);
/* :attach. */
enum MHD_Result handle_volume_not_offered(Req *r);
