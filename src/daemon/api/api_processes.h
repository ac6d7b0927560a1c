#pragma once
/* The routes under /v1/sandboxes/{id}/processes (docs/api.md, Processes). */
#include "daemon/http/http.h"

enum MHD_Result handle_proc_list(Req *r);
enum MHD_Result handle_proc_spawn(Req *r);
enum MHD_Result handle_proc_get(Req *r);
enum MHD_Result handle_proc_output(Req *r);
enum MHD_Result handle_proc_write(Req *r);
enum MHD_Result handle_proc_signal(Req *r);
enum MHD_Result handle_proc_wait(Req *r);
enum MHD_Result handle_proc_resize(Req *r);
