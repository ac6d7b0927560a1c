#pragma once
/* GET /v1/hosts: the hosts that registered themselves in the store. */
#include "daemon/http/http.h"

/* A host whose last heartbeat is older than this is dead. */
#define HOSTS_DEAD_AFTER_SECONDS 30

enum MHD_Result handle_hosts(Req *r);
