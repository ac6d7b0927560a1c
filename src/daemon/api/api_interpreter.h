#pragma once
/* The stateful interpreter's routes: POST .../interpreter:run, the contexts
 * (list, create, restart, interrupt, remove; one handler switching on the
 * route) and GET .../contexts/{context}/results/{result}. */
#include "daemon/http/http.h"

enum MHD_Result handle_interpreter_run(Req *r);
enum MHD_Result handle_interpreter_contexts(Req *r);
enum MHD_Result handle_interpreter_result(Req *r);
/* Starts the default python context's kernel of a new sandbox in the
 * background (unless --no-interpreter-prestart), so that its first cell
 * need not wait for a kernel's start. Returns at once. */
void interpreter_prestart(App *app, const KeyInfo *key, const char *id);
