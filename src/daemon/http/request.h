#pragma once
/*
 * Parsing and validation of every JSON body and path a client sends. Pure
 * functions (no I/O, no globals), so that they are unit-tested and fuzzed.
 * Each fills an ApiError naming the field on failure and returns -EINVAL.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/http/apierror.h"
#include "daemon/model/file_link.h"
#include "daemon/model/sandbox_request.h"

#define REQ_MAX_BODY (1024u * 1024u)
#define REQ_MAX_EXEC_BODY (24u * 1024u * 1024u)
#define REQ_MAX_DEPTH 32u
#define REQ_MAX_PATH 4096u
#define REQ_MAX_ENV SANDBOX_MAX_ENV
#define REQ_MAX_ENV_NAME 255u
#define REQ_MAX_ENV_VALUE (32u * 1024u)
#define REQ_MAX_ENV_TOTAL SANDBOX_MAX_ENV_TOTAL
#define REQ_MAX_LABELS 32u
#define REQ_MAX_LABEL_KEY 63u
#define REQ_MAX_LABEL_VALUE 256u
#define REQ_MAX_NAME 64u
#define REQ_MAX_HOST_PATTERNS 256u
#define REQ_MAX_SECRET_SCOPE 100u /* names in a create's "secrets" */
#define REQ_MAX_HOST_PATTERN 253u
#define REQ_MAX_ARGV 4096u
#define REQ_MAX_STDIN (16u * 1024u * 1024u)
#define REQ_MAX_OUTPUT (16u * 1024u * 1024u)
#define REQ_MAX_TIMEOUT_SECONDS SANDBOX_MAX_LEASE_SECONDS
#define REQ_MAX_EXEC_TIMEOUT_MS 86400000LL

typedef struct ReqLimits {
        unsigned max_vcpu;
        unsigned max_memory_mib;
        unsigned max_disk_mib;
} ReqLimits;

typedef struct ExecRequest {
        char *command; /* exactly one of command and argv */
        json_t *argv;
        char *cwd;   /* absolute */
        json_t *env; /* object, may be empty */
        uint8_t *stdin_data;
        size_t stdin_len;
        bool has_stdin;
        int64_t timeout_ms;
        bool stream;
        size_t max_output_bytes;
        ReqUser user;     /* the user asked for; DEFAULT: the sandbox's own */
        bool base64;      /* outputEncoding "base64": every output event carries its bytes */
        bool stdin_pipe;  /* spawn with stdinMode "pipe": input comes later through :write */
        bool pty;         /* spawn with pty {cols, rows}: a terminal; input stays open */
        unsigned pty_cols, pty_rows;
} ExecRequest;

/* POST .../processes (a background process): exec's fields without stream
 * and maxOutputBytes, plus stdinMode and outputEncoding; timeoutMs defaults
 * to the maximum, a day. */
int request_parse_spawn(json_t *body, ExecRequest *ret, ApiError *e);
/* A terminal's size: cols and rows, each 1..REQ_MAX_PTY_SIDE. */
#define REQ_MAX_PTY_SIDE 1000
int request_parse_pty(json_t *pty, unsigned *ret_cols, unsigned *ret_rows, ApiError *e);
/* POST .../processes/{pid}:resize: {"cols", "rows"}, both required, each
 * 1..REQ_MAX_PTY_SIDE. */
int request_parse_resize(json_t *body, unsigned *ret_cols, unsigned *ret_rows, ApiError *e);
/* The cursor of GET .../output: a decimal byte offset, 0..2^53. */
int request_parse_cursor(const char *s, uint64_t *ret, ApiError *e);
/* A signal by name ("SIGTERM" or "TERM") or number, among those a client may
 * send (HUP INT QUIT KILL USR1 USR2 TERM CONT STOP TSTP). */
int request_parse_signal(json_t *body, int *ret, ApiError *e);
/* POST .../processes/{pid}:write: {"base64"|"data", "offset", "eof"}. */
int request_parse_proc_write(json_t *body, uint8_t **ret_data, size_t *ret_len, int64_t *ret_offset, bool *ret_eof,
                             ApiError *e);
/* An Idempotency-Key header: 1..128 of [A-Za-z0-9_.:-]. */
bool request_idempotency_key_ok(const char *s);

/* A request body: at most REQ_MAX_BODY bytes, depth REQ_MAX_DEPTH, no
 * duplicate names, an object. An empty body is an empty object when
 * empty_ok. */
int request_body_parse(const char *buf, size_t len, bool empty_ok, json_t **ret, ApiError *e);

int request_parse_create(json_t *body, const ReqLimits *lim, CreateRequest *ret, ApiError *e);
/* The network object of a create or of PUT .../network, normalized. */
int request_parse_network(json_t *v, const char *field, json_t **ret, ApiError *e);
/* A create's "secrets": the names of the egress secrets the sandbox may use.
 * *ret is NULL when absent or null (every secret), else a new array. */
int request_parse_secret_scope(json_t *v, const char *field, json_t **ret, ApiError *e);

/* A trial key's sandbox: smaller defaults and bounds (KEYS_TRIAL_*). 400
 * naming the field. */
int request_apply_trial_shape(bool trial, json_t *body, CreateRequest *req, ApiError *e);

int request_parse_exec(json_t *body, ExecRequest *ret, ApiError *e);
void exec_request_done(ExecRequest *r);

/* A sandbox path: at most REQ_MAX_PATH bytes, no NUL, not empty; relative
 * paths are taken under /workspace. Lexical only: the agent resolves it
 * inside the sandbox's own root. */
int request_resolve_path(const char *in, size_t len, const char *field, char **ret, ApiError *e);
/* The path of a JSON field (must be a string). */
int request_path_field(json_t *body, const char *field, bool required, char **ret, ApiError *e);
/* Who a command or file operation runs as: "sandbox" or "root", the two
 * users the published client names; absent or null is REQ_AS_DEFAULT (the
 * sandbox's own user decides). 0 and *ret; a 400 for any other value, type,
 * an embedded NUL or a long one. */
#define REQ_USER_SANDBOX "sandbox"
#define REQ_USER_ROOT "root"
int request_parse_user(json_t *v, ReqUser *ret, ApiError *e);
/* The same from a query argument (NULL: the default). */
int request_parse_user_text(const char *s, ReqUser *ret, ApiError *e);

/* A files:link body (docs/api.md, "File links"): path (as every file
 * route's), method GET or PUT (download or upload), expiresInSeconds
 * (FILE_LINK_TTL_MIN..MAX, FILE_LINK_TTL_DEFAULT left out), oneTime, wake
 * (true left out); filename and archive for a download, maxBytes (1 to
 * max_bytes) for an upload. */
typedef struct FileLinkRequest {
        char *path;
        FileLinkOp op;
        int64_t ttl_seconds;
        bool once, wake;
        uint64_t max_bytes; /* 0: the daemon's bound */
        char *filename;     /* NULL: none */
} FileLinkRequest;
int request_parse_file_link(json_t *body, uint64_t max_bytes, FileLinkRequest *ret, ApiError *e);
void file_link_request_done(FileLinkRequest *q);

int request_parse_mkdir(json_t *body, char **ret_path, bool *ret_parents, ApiError *e);
int request_parse_remove(json_t *body, char **ret_path, bool *ret_recursive, ApiError *e);
/* overwrite: absent replaces an existing target, as before the field existed. */
int request_parse_rename(json_t *body, char **ret_from, char **ret_to, bool *ret_overwrite, ApiError *e);
/* POST .../{id}:update: what the published client's update() sends. */
typedef struct UpdateRequest {
        bool set_name;
        char *name; /* NULL with set_name: clear it */
        json_t *labels, *network;
        int64_t timeout_seconds; /* 0: unchanged */
        const char *on_lease_end; /* static: "stop", "pause" or "delete"; NULL: unchanged */
        json_t *env;              /* NULL: unchanged; name -> string sets, name -> null removes */
        int auto_wake;            /* -1: unchanged */
        int64_t idle_pause_seconds; /* -1: unchanged */
        bool set_max_total;
        int64_t max_total_cost_micros; /* -1 with set_max_total: no cap */
        bool set_user;
        bool run_as_root; /* with set_user; null is back to the default, the sandbox user */
} UpdateRequest;
int request_parse_update(json_t *body, UpdateRequest *ret, ApiError *e);
/* A name and labels as a create takes them (snapshots, fork): *ret_name
 * borrowed from body, NULL when absent or null; *ret_labels a new
 * reference, NULL when absent. */
int request_parse_name_labels(json_t *body, const char **ret_name, json_t **ret_labels, ApiError *e);
void update_request_done(UpdateRequest *u);
int request_parse_extend(json_t *body, int64_t *ret_seconds, ApiError *e);
/* :wake's body: an optional timeoutSeconds (0 in *ret when left out). */
int request_parse_wake(json_t *body, int64_t *ret_timeout_seconds, ApiError *e);
/* GET /v1/sandboxes/{id}?waitFor=STATE&timeoutSeconds=N: a state's name
 * (one of the lifecycle's; *ret_state is a static string) and N seconds,
 * 0 .. REQ_MAX_WAIT_FOR_SECONDS, 60 when left out. */
#define REQ_MAX_WAIT_FOR_SECONDS 120
int request_parse_wait_for(const char *state, const char *timeout, SandboxState *ret_state, int64_t *ret_timeout_ms,
                           ApiError *e);
/* A body that takes no fields ({} or none): :pause, :restart. */
int request_parse_no_fields(json_t *body, ApiError *e);
/* A file mode from a query string: octal, at most 0777. */
int request_parse_mode(const char *s, unsigned *ret, ApiError *e);
/* A list depth from a query string: 1..10. */
int request_parse_depth(const char *s, unsigned *ret, ApiError *e);

bool request_env_name_ok(const char *s, size_t len);
/* Fills a create body's driver, image and shape from a snapshot's spec
 * where the body leaves them out; another driver, image or diskMiB is a
 * 400, and of a memory snapshot another vcpu or memoryMiB too. */
int snapshot_merge_create_defaults(json_t *body, json_t *spec, bool memory, ApiError *e);
