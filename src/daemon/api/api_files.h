#pragma once
/* The file routes, each mapped onto one agent stream. */
#include "daemon/http/http.h"

enum MHD_Result handle_files_read(Req *r);
enum MHD_Result handle_files_list(Req *r);
enum MHD_Result handle_files_stat(Req *r);
enum MHD_Result handle_files_mkdir(Req *r);
enum MHD_Result handle_files_remove(Req *r);
enum MHD_Result handle_files_rename(Req *r);
/* PUT .../files/content: the body streams into the sandbox (files_upload);
 * the handler answers once it is all in. */
enum MHD_Result handle_files_write(Req *r);
extern const HttpUpload files_upload;
