#pragma once
/* The lifecycle routes: :pause, :wake and :restart (docs/lifecycle.md). */
#include "daemon/http.h"

enum MHD_Result handle_sandbox_pause(Req *r);
enum MHD_Result handle_sandbox_wake(Req *r);
enum MHD_Result handle_sandbox_restart(Req *r);
