#pragma once
/* What the request handlers (server.c, exec.c, files.c, images.c) share:
 * one request's context and the ways to answer it. Internal to the daemon's
 * HTTP layer. */
#include <jansson.h>
#include <microhttpd.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "daemon/apierror.h"
#include "daemon/config.h"
#include "daemon/db.h"
#include "daemon/egress_service.h"
#include "daemon/keys.h"
#include "daemon/ledger.h"
#include "daemon/route.h"
#include "daemon/sandbox.h"

typedef struct Server {
        const DaemonConfig *cfg;
        Db *db;
        Manager *manager;
        Ledger *ledger;
        KeyStore *keys;
        EgressService *egress; /* NULL: no egress routes */
        struct MHD_Daemon *mhd;
        atomic_bool building; /* one image build at a time */
} Server;

typedef struct FileUpload FileUpload;

typedef struct Req {
        Server *srv;
        struct MHD_Connection *conn;
        char rid[24];
        const char *method;
        char path[128]; /* for the log, cut */
        uint64_t t0;
        Route route;
        KeyInfo key;
        char *body;
        size_t body_len;
        size_t discarded;
        json_t *json; /* the parsed body, for handlers that take it */
        bool refused; /* the body broke a limit: drop the rest, answer `refusal` at the end */
        ApiError refusal;
        bool answered; /* a response is queued */
        unsigned status;
        FileUpload *upload;
} Req;

/* Queue a response; the reply functions add X-Request-Id. */
enum MHD_Result reply_json(Req *r, unsigned status, json_t *body); /* steals body */
enum MHD_Result reply_error(Req *r, const ApiError *e);
enum MHD_Result reply_response(Req *r, unsigned status, struct MHD_Response *resp, const char *content_type);
enum MHD_Result reply_internal(Req *r);

/* The socket of the request's connection, to notice a client that left. */
int req_socket(Req *r);
/* Whether the client hung up (POLLRDHUP / POLLHUP / POLLERR on the socket). */
bool socket_hung_up(int fd);
const char *req_query(Req *r, const char *name);

enum MHD_Result handle_exec(Req *r);
enum MHD_Result handle_files_read(Req *r);
enum MHD_Result handle_files_list(Req *r);
enum MHD_Result handle_files_stat(Req *r);
enum MHD_Result handle_files_op(Req *r);
/* PUT .../files/content: begin (first call), data, end (last call), and
 * release when the request ends any way. */
enum MHD_Result files_upload_begin(Req *r);
enum MHD_Result files_upload_data(Req *r, const char *data, size_t len);
enum MHD_Result files_upload_end(Req *r);
void files_upload_free(FileUpload *u);
/* Maps an agent {"error":{code,message}} to the API's error. */
void agent_error_to_api(json_t *result, const char *path, ApiError *e);

enum MHD_Result handle_images(Req *r);
enum MHD_Result handle_image_build(Req *r);
/* The guard rails' routes (keys.c): keys, usage, limits, trial. */
enum MHD_Result handle_keys_list(Req *r);
enum MHD_Result handle_keys_create(Req *r, json_t *body);
enum MHD_Result handle_key_revoke(Req *r);
enum MHD_Result handle_usage(Req *r);
enum MHD_Result handle_limits(Req *r);
enum MHD_Result handle_trial(Req *r);

/* {"name","built","builtAt","sizeBytes"} for each image. */
json_t *images_json(const DaemonConfig *cfg);
