#pragma once
/* Volumes (docs/volumes.md): GET/POST /v1/volumes, GET/DELETE
 * /v1/volumes/{volume}, POST /v1/volumes/{volume}:resize, :delete and
 * :backup and :backup-policy, GET /v1/volume-backups[/{backup}], and their
 * deletes; :attach to a running sandbox and its attachments' :detach. */
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
/* :attach, and GET .../attachments/{sandbox} and its :detach: a volume
 * and a running sandbox (the attachment's id is the sandbox's). */
enum MHD_Result handle_volume_attach(Req *r);
enum MHD_Result handle_volume_attachment_get(Req *r);
enum MHD_Result handle_volume_detach(Req *r);
