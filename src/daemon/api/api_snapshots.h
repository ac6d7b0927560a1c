#pragma once
/* The snapshot routes: :snapshot and :fork of a sandbox, and
 * /v1/snapshots (list, get, update, extend, delete). */
#include <stdint.h>

#include <jansson.h>

#include "daemon/http/http.h"
#include "daemon/manager/sandbox.h"

enum MHD_Result handle_sandbox_snapshot(Req *r);
enum MHD_Result handle_sandbox_fork(Req *r);
enum MHD_Result handle_snapshot_list(Req *r);
enum MHD_Result handle_snapshot_get(Req *r);
enum MHD_Result handle_snapshot_update(Req *r);
enum MHD_Result handle_snapshot_extend(Req *r);
enum MHD_Result handle_snapshot_delete(Req *r);

/* The bodies' checks, apart from the store so they can be fuzzed. Labels
 * come back owned by the caller (NULL when not given); names point into
 * the body. Each answers -EINVAL with e set on a bad body. */
int snapshot_parse_body(json_t *body, SnapshotRequest *sr, json_t **ret_labels, ApiError *e);
int fork_parse_body(json_t *body, int64_t *ret_count, const char **ret_name, const char **ret_mode, json_t **ret_labels,
                    ApiError *e);
int snapshot_update_parse_body(json_t *body, const char **ret_name, json_t **ret_labels, int64_t *ret_days,
                               ApiError *e);
/* retentionDays, required. */
int snapshot_extend_parse_body(json_t *body, int64_t *ret_days, ApiError *e);
