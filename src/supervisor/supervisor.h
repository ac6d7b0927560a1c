#pragma once
/*
 * runtime-supervisor: one small process per running sandbox that holds the
 * host's end of the agent channel, so that the sandbox outlives its daemon
 * (docs/lifecycle.md, "Live restore"). The attached daemon reads and writes
 * that channel itself (the supervisor hands it over); the supervisor only
 * watches the daemon's connection. When the daemon goes, it tells the agent
 * DETACH and reads and drops what the agent sends, until a later daemon
 * attaches through a unix socket:
 *
 *   daemon -> supervisor   ATTACH <version> <sandbox-id> <nonce>\n
 *   supervisor -> daemon   OK <version> <pid> <n> <state or ->\n
 *                          (SCM_RIGHTS: the agent channel, then the n kept fds)
 *                     or   NO busy\n | NO version <ours>\n | NO nonce\n | NO malformed\n
 *
 * After OK the connection carries nothing: its end is the daemon's going.
 * Version 1 (the first) relayed the channel's frames over the connection
 * instead; this supervisor speaks version 2 only.
 */
#include <stdbool.h>
#include <stddef.h>

#define SUPERVISOR_PROTOCOL_VERSION 2
#define SUPERVISOR_PROTOCOL_MIN 2
#define SUPERVISOR_NONCE_LEN 32
#define SUPERVISOR_ID_MAX 64
#define SUPERVISOR_STATE_MAX 512
/* The longest handshake line, its '\n' included. */
#define SUPERVISOR_LINE_MAX 256
/* The most handles one supervisor keeps (a driver keeps a few). */
#define SUPERVISOR_KEEP_MAX 16
/* Connections that have not sent their handshake yet, and how long each may take. */
#define SUPERVISOR_PENDING_MAX 4
#define SUPERVISOR_HANDSHAKE_TIMEOUT_MS 5000

typedef struct SupervisorConfig {
        const char *sandbox_id; /* [a-z0-9_-]{1,64} */
        const char *nonce;      /* SUPERVISOR_NONCE_LEN lowercase hex digits */
        const char *state;      /* the driver's opaque state, echoed back; NULL for none */
        int agent_fd;           /* the agent channel */
        int listen_fd;          /* a listening unix stream socket */
        int conn_fd;            /* the first daemon's connection, or -1 to start detached */
        const int *keep_fds;    /* handed to every daemon that attaches */
        size_t n_keep;
} SupervisorConfig;

typedef struct Supervisor Supervisor;

/* Everything the loop needs before it runs: its buffer, non-blocking fds,
 * SIGTERM and SIGINT as a signalfd, SIGPIPE ignored. After this, the
 * supervisor makes only the calls main's seccomp filter allows. On success
 * conn_fd is the Supervisor's (closed when that daemon leaves); the other fds
 * stay the caller's, and cfg's strings and keep_fds must outlive the
 * Supervisor. -EINVAL, -ENOMEM or a negative errno. */
int supervisor_new(const SupervisorConfig *cfg, Supervisor **ret);
void supervisor_free(Supervisor *s);

/* Runs until the sandbox ends. 0 when the agent's side ended or on
 * SIGTERM/SIGINT; a negative errno when the loop itself failed. Logs one line
 * per attach, detach, refusal and its end. */
int supervisor_run(Supervisor *s);

/* Checks one handshake line (len bytes, the '\n' included) against the
 * sandbox's id and nonce: 0 and *ret_version (SUPERVISOR_PROTOCOL_MIN .. SUPERVISOR_PROTOCOL_VERSION)
 * when the line is a valid ATTACH for this sandbox; -EBADMSG for a malformed
 * or over-long line; -EPROTONOSUPPORT for a version we do not speak (checked
 * before the rest, which a later version may lay out otherwise); -EPERM for a
 * wrong id or nonce. The nonce is compared in constant time. */
int supervisor_handshake_parse(const char *line, size_t len, const char *sandbox_id, const char *nonce,
                               unsigned *ret_version);

/* The checks of the command line's and the environment's values. */
bool supervisor_id_valid(const char *id);
bool supervisor_nonce_valid(const char *nonce);
bool supervisor_state_valid(const char *state);

/* One line on stderr, "runtime-supervisor[<id>]: ...". Write errors are ignored:
 * the daemon that started us may be gone. */
void supervisor_log(const char *sandbox_id, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
