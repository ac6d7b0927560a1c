#pragma once
/* The archive routes (docs/api.md, "Archives"). */
#include "daemon/http/http.h"

/* GET .../files/archive?path=&gzip=&exclude=...: a directory as a tar. */
enum MHD_Result handle_files_archive_get(Req *r);
/* PUT .../files/archive?path=: the body (a tar, gzip or not) streams into
 * the sandbox's unpacker (archive_upload); the handler answers at its end. */
enum MHD_Result handle_files_archive_put(Req *r);
extern const HttpUpload archive_upload;
