#pragma once
/*
 * Uploads in parts, as the published client sends a file over 1 MiB: begin
 * (path, size, SHA-256), parts at any offset in any order (eight at once),
 * commit, abort. The parts are staged in a sparse file under the daemon's
 * state directory; the commit checks every part arrived and the SHA-256,
 * then streams the whole into the sandbox through the agent's atomic write.
 */
#include "daemon/http/http.h"

enum MHD_Result handle_upload_begin(Req *r);
/* PUT .../uploads/{upload}?offset=N: the body goes straight to its place. */
enum MHD_Result handle_upload_part(Req *r);
extern const HttpUpload upload_part_stream;
enum MHD_Result handle_upload_commit(Req *r);
enum MHD_Result handle_upload_abort(Req *r);
/* POST .../files/archive/uploads {path, gzip, user}: an archive in parts
 * (the published client's unarchive of more than 1 MiB), its size not said
 * up front; the same part, commit and abort routes follow, and the commit
 * unpacks the whole as PUT .../files/archive does. */
enum MHD_Result handle_archive_upload_begin(Req *r);
