#pragma once
/*
 * GET /v1/sandboxes/{id}/terminal: an interactive terminal over a WebSocket
 * (docs/api.md). A PTY process (process.c) is started, or an existing one
 * attached with processId; its output goes to the client as binary
 * messages, the client's binary messages are its keys, a text message
 * {"type":"resize","cols","rows"} resizes it. One thread per terminal.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/http/http.h"
#include "daemon/model/sandbox_request.h"

/* A client message is at most this big: a paste, never a file. A bigger one
 * closes that terminal (1009) and no other. */
#define TERMINAL_MAX_MESSAGE (64u * 1024u)
/* Terminals open at once in this daemon. */
#define TERMINAL_MAX_OPEN 64
#define TERMINAL_MAX_OPEN_PER_OWNER 16 /* one owner's share: never all of the host's */
#define TERMINAL_MAX_COMMAND 4096

typedef struct TerminalQuery {
        unsigned cols, rows;
        const char *command; /* NULL: a login shell */
        size_t command_len;
        char *cwd;           /* malloc'ed, absolute; /workspace by default */
        ReqUser user; /* DEFAULT: the sandbox's own */
        char process_id[HTTP_PROCESS_ID_LEN + 1]; /* empty: start a new one */
} TerminalQuery;

/* The query of the route (each argument may be NULL). Pure: fuzzed. */
int terminal_parse_query(const char *cols, const char *rows, const char *command, size_t command_len,
                         const char *cwd, size_t cwd_len, const char *user, const char *process_id,
                         TerminalQuery *ret, ApiError *e);
void terminal_query_done(TerminalQuery *q);

typedef enum TerminalControlKind {
        TERMINAL_CONTROL_IGNORED, /* a text message this server does not know: dropped */
        TERMINAL_CONTROL_RESIZE,
} TerminalControlKind;

/* A text message from the client. Pure: fuzzed. */
TerminalControlKind terminal_parse_control(const uint8_t *data, size_t len, unsigned *ret_cols, unsigned *ret_rows);

enum MHD_Result handle_terminal(Req *r);
/* Ends every open terminal (the daemon is stopping) and waits for them. */
void terminal_close_all(void);
