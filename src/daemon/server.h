#pragma once
/* The HTTP server: libmicrohttpd with a thread per connection (exec and file
 * transfers block their thread), routing, auth and the error shape. */
#include "daemon/config.h"
#include "daemon/db.h"
#include "daemon/egress_service.h"
#include "daemon/keys.h"
#include "daemon/ledger.h"
#include "daemon/sandbox.h"

typedef struct Server Server;

int server_new(const DaemonConfig *cfg, Db *db, Manager *m, Server **ret);
/* The ledger and the key store the guard rails' routes use (before start). */
/* Serves the egress routes (secrets, audit). */
void server_set_egress(Server *s, EgressService *egress);
void server_set_guardrails(Server *s, Ledger *ledger, KeyStore *keys);
/* Serves on listen_fd (bound and listening; the server takes it). */
int server_start(Server *s, int listen_fd);
/* Stops accepting new connections; running requests go on. */
void server_quiesce(Server *s);
/* Closes every connection and joins their threads. */
void server_stop(Server *s);
void server_free(Server *s);
