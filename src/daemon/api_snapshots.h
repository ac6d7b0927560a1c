#pragma once
/* The snapshot routes: :snapshot and :fork of a sandbox, and
 * /v1/snapshots (list, get, update, extend, delete). */
#include "daemon/http.h"

enum MHD_Result handle_sandbox_snapshot(Req *r);
enum MHD_Result handle_sandbox_fork(Req *r);
enum MHD_Result handle_snapshot_list(Req *r);
enum MHD_Result handle_snapshot_get(Req *r);
enum MHD_Result handle_snapshot_update(Req *r);
enum MHD_Result handle_snapshot_extend(Req *r);
enum MHD_Result handle_snapshot_delete(Req *r);
/* A create's `snapshot` field: takes it out of r->json, checks it is one of
 * the key owner's snapshots, fills the fields the create left out (driver,
 * image, shape) from it and answers its directory in *ret_dir (NULL when the
 * create has no snapshot). A diskMiB smaller than the snapshot's, or
 * another driver or image, is a 400. */
int api_snapshot_create_defaults(Req *r, char **ret_dir, ApiError *e);
