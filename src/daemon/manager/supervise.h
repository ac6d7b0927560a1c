#pragma once
/*
 * The daemon's side of a sandbox's supervisor (runtime-supervisor,
 * docs/lifecycle.md "Live restore"): a small process, never the daemon's
 * child, that holds the host's end of the agent channel and the driver's
 * handles, and hands the channel to whichever daemon is attached (version 2;
 * the first version relayed its frames). A daemon that ends leaves it
 * running, and it tells the agent DETACH; the next one attaches
 * through the unix socket in the sandbox's directory (mode 0600 in the
 * daemon's 0700 state directory), proves with the sandbox's id and nonce that
 * it is the same sandbox's, and gets the handles back.
 */
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "driver/driver.h"

#define SUPERVISE_PROTOCOL_VERSION 2
#define SUPERVISE_SOCKET "supervisor.sock"
#define SUPERVISE_NONCE_LEN 32

typedef struct SuperviseHandles {
        int fds[DRIVER_MAX_HANDLES];
        size_t n;
        char state[DRIVER_STATE_MAX + 1]; /* "" for none */
        pid_t pid;                        /* the supervisor's */
        unsigned version;                 /* the supervisor's protocol version */
} SuperviseHandles;

/* A new random nonce: SUPERVISE_NONCE_LEN lowercase hex digits. */
int supervise_nonce(char ret[SUPERVISE_NONCE_LEN + 1]);

/* Starts `program` as the supervisor of sandbox `id`, listening on
 * sandbox_dir/SUPERVISE_SOCKET, with agent_fd (the host's end of the channel,
 * which stays the caller's too: the daemon reads and writes it, writing each
 * frame in one piece) and h's fds and state to keep; h's fds are taken over,
 * also on failure. *ret_conn is the daemon's connection, which carries
 * nothing: closing it (or the daemon's end) makes the supervisor detach the
 * agent. h->pid is the supervisor's pid. */
int supervise_start(const char *program, const char *sandbox_dir, const char *id, const char *nonce, int agent_fd,
                    SuperviseHandles *h, int *ret_conn);

/* Attaches to the running supervisor of sandbox `id`: 0, *ret_channel (the
 * agent's channel, to take over: channel_take_over), *ret_conn (the
 * connection to keep open while attached) and *ret (the handles it kept, the
 * caller's to close). A supervisor of version 1 gets a second handshake in
 * its version: its *ret_channel is the connection, which carries the frames,
 * *ret_conn is -1 and ret->version 1 (channel_new then, not take_over).
 * -ENOENT: no socket; -ECONNREFUSED: no supervisor listens (it ended with
 * its sandbox); -EPERM: it refused (why says: a wrong nonce, another daemon
 * attached, a version it does not speak); -EPROTO: it answered no
 * supervisor's answer; -ETIMEDOUT. */
int supervise_attach(const char *sandbox_dir, const char *id, const char *nonce, int timeout_ms, int *ret_channel,
                     int *ret_conn, SuperviseHandles *ret, char *why, size_t why_len);

/* Closes the fds of h. */
void supervise_handles_close(SuperviseHandles *h);

/* Waits up to timeout_ms for the supervisor with that pid to end (at once
 * when it is gone already), and kills it after that when `kill_after`. */
void supervise_wait_end(pid_t pid, int timeout_ms, bool kill_after);
