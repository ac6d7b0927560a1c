#pragma once
/* The stateful interpreter's routes: POST .../interpreter:run, the contexts
 * (list, create, restart, interrupt, remove; one handler switching on the
 * route) and GET .../contexts/{context}/results/{result}. */
#include "daemon/http/http.h"

enum MHD_Result handle_interpreter_run(Req *r);
enum MHD_Result handle_interpreter_contexts(Req *r);
enum MHD_Result handle_interpreter_result(Req *r);
