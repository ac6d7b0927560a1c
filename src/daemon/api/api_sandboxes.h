#pragma once
/* The sandbox routes: list, create, get, delete, stop, extend, network,
 * pause, wake, restart. */
#include "daemon/http/http.h"
#include "daemon/manager/sandbox.h"

enum MHD_Result handle_sandbox_list(Req *r);
enum MHD_Result handle_sandbox_create(Req *r);
enum MHD_Result handle_sandbox_get(Req *r);
enum MHD_Result handle_sandbox_delete(Req *r);
enum MHD_Result handle_sandbox_stop(Req *r);
enum MHD_Result handle_sandbox_extend(Req *r);
enum MHD_Result handle_sandbox_network(Req *r);
/* The sandbox's network settings as they are now: {internet, allow, deny}. */
enum MHD_Result handle_sandbox_network_get(Req *r);
enum MHD_Result handle_sandbox_pause(Req *r);
enum MHD_Result handle_sandbox_wake(Req *r);
enum MHD_Result handle_sandbox_restart(Req *r);
/* POST .../{id}:update: name, labels, network, lease (timeoutSeconds from now) and its end, env, user,
 * autoWake, idlePauseSeconds and maxTotalCostMicros, all or nothing. */
enum MHD_Result handle_sandbox_update(Req *r);
