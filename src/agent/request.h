#pragma once
/*
 * Parsing and validation of the JSON requests a host sends in OPEN frames
 * (docs/protocol.md). Everything here is pure: no I/O, so the fuzz target can
 * feed it arbitrary bytes.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_t;

#define REQUEST_MAX_DEPTH 32
#define REQUEST_MAX_PATH 4096
#define REQUEST_MAX_ARGV 4096
#define REQUEST_MAX_ENV 256
#define REQUEST_MAX_LIST_DEPTH 10
/* A glob walk may go deeper than a listing ("**" reaches every level) but
 * no deeper than this; its pattern is bounded too. */
#define REQUEST_MAX_GLOB_DEPTH 32
#define REQUEST_MAX_GLOB 1024
#define REQUEST_MAX_LIST_LIMIT 10000
#define REQUEST_MAX_EXCLUDES 256
/* One day, the API's own upper bound for timeoutMs. */
#define REQUEST_MAX_TIMEOUT_MS 86400000LL
/* resume: bytes of entropy (as 2 hex digits each) and the hostname's bound. */
/* A terminal's size bounds: what TIOCSWINSZ takes, kept to screens that exist. */
#define REQUEST_MAX_PTY_SIDE 1000
#define REQUEST_RESUME_ENTROPY 64
#define REQUEST_MAX_HOSTNAME 64
/* An exec's "tag", dumped compactly: the host's own record of what it
 * started, which the agent keeps and lists after an ATTACH. */
#define REQUEST_MAX_TAG 4096

typedef enum AgentRequestOp {
        REQ_EXEC,
        REQ_READ,
        REQ_WRITE,
        REQ_LIST,
        REQ_STAT,
        REQ_MKDIR,
        REQ_REMOVE,
        REQ_RENAME,
        REQ_RESUME, /* microVM restored from a snapshot: fresh entropy, clock, hostname */
        REQ_SIGNAL, /* a signal to the process group of one of the host's exec streams */
        REQ_FORWARD, /* a TCP connection to a port on the sandbox's loopback (port forwarding) */
        REQ_ARCHIVE,   /* a directory out as a tar: an exec of the agent's own tar writer */
        REQ_UNARCHIVE, /* a tar (gzip or not) on stdin into a directory: its own reader */
        REQ_CHECKPOINT, /* microVM about to be saved: answer, then send nothing until the host speaks */
        REQ_WATCH,      /* changes under a path, as NDJSON lines until cancelled (agent/watch.h) */
        REQ_MOUNT,      /* gVisor: a volume the host bound for it, bound at path (agent/live_mounts.h) */
        REQ_UNMOUNT,    /* gVisor: that bind at path undone, never lazily */
} AgentRequestOp;

typedef struct AgentRequest {
        AgentRequestOp op;
        /* mount: the volume's name under the live directory; "readOnly" in flag. */
        char *mount_name;
        /* exec: argv is NULL-terminated; a "command" becomes argv {command} with
         * shell set, and the agent runs it through bash -c (or /bin/sh -c). */
        char **argv;
        size_t argc;
        bool shell;
        char *cwd;
        char **env; /* "K=V" strings, NULL-terminated */
        size_t envc;
        int64_t timeout_ms; /* 0: none */
        bool stdin_stream;
        /* exec: "syncAfter", the agent syncs the sandbox's files once the
         * command has ended, before its result (a snapshot of the disk
         * taken next then needs no sync of its own). */
        bool sync_after;
        int64_t uid, gid; /* -1: the agent's own (root) */
        /* A user by name (exec, archive, unarchive and the file ops), looked
         * up in the sandbox's /etc/passwd when the request is run; NULL: the
         * agent's own. The lookup fills uid, gid and home. */
        char *user;
        char *home;
        /* exec with a terminal: "pty": {"cols","rows"}; stdout and stdin are
         * its master side, there is no separate stderr. */
        bool pty;
        unsigned pty_cols, pty_rows;
        /* exec: "tag", a JSON object the agent never reads, returned as it
         * came when it lists the exec after an ATTACH; NULL for none.
         * tag_len is its compact dump's length. */
        struct json_t *tag;
        size_t tag_len;
        /* file ops */
        char *path;
        char *to; /* rename destination; path holds "from" */
        unsigned mode;
        bool flag;      /* write: mkdirs, mkdir: parents, remove: recursive, rename: overwrite */
        unsigned depth; /* list: 0 with a glob is as deep as the pattern reaches */
        char *glob;     /* list: a pattern relative to path, NULL for all */
        bool hidden;    /* list: names starting with '.' too */
        /* archive (argv holds the relative paths to exclude), unarchive */
        bool gzip;
        uint64_t max_bytes, max_entries;
        unsigned limit; /* list: at most this many entries; watch: inotify descriptors at most */
        /* resume */
        uint8_t entropy[REQUEST_RESUME_ENTROPY];
        int64_t time_ns; /* CLOCK_REALTIME to set */
        char *hostname;
        /* signal */
        uint32_t target; /* the exec's stream id */
        int signo;
        /* forward */
        uint16_t port;
} AgentRequest;


/* A path the agent accepts: absolute, at most REQUEST_MAX_PATH bytes, no NUL. */
bool agent_request_path_valid(const char *path, size_t len);

/* Parses an OPEN payload. 0 and *ret (free with agent_request_free); -EINVAL with
 * *ret_error set to a static message for the client; -ENOMEM. */
int agent_request_parse(const uint8_t *buf, size_t len, AgentRequest **ret, const char **ret_error);
void agent_request_free(AgentRequest *r);
/* A resize EVENT on an exec stream, {"event":"resize","cols","rows"}: 0 and the
 * size, -EINVAL for anything else. Pure, like the parser above. */
int agent_request_parse_resize(const uint8_t *buf, size_t len, unsigned *ret_cols, unsigned *ret_rows);
/* An ATTACH frame's payload: 0 for a JSON object (its members are for
 * later versions), -EINVAL for anything else. */
int agent_request_parse_attach(const uint8_t *buf, size_t len);
/* The signals a host may send to an exec's process group. */
bool agent_request_signal_allowed(int signo);
