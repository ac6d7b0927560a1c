#pragma once
/*
 * The daemon's one client of the agent protocol (docs/protocol.md), over a
 * stream of a sandbox's channel: the requests it sends (one builder per op),
 * the waits for their results, whole-file reads and writes, and the agent's
 * error codes. exec, the file routes and egress (the CA install) all go
 * through here; a new capability adds an op here, not a loop of its own.
 * Logs nothing; knows nothing of HTTP.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/manager/channel.h"

/* Whether the caller gave up (its client left); polled between events. */
typedef bool (*AgentGiveUpFn)(void *userdata);

/* The requests (new references; NULL on ENOMEM). env and argv are borrowed;
 * exactly one of command and argv. */
json_t *agent_req_exec(const char *command, json_t *argv, const char *cwd, json_t *env, int64_t timeout_ms,
                       bool has_stdin);
/* Names the user the agent runs req as (exec, archive, unarchive and the
 * file ops): "root" or "sandbox". A request without one runs as the agent's
 * own root: the daemon's internal writes (the egress CA) leave it out. 0 or
 * -ENOMEM. */
int agent_req_set_user(json_t *req, bool root);
json_t *agent_req_read(const char *path);
json_t *agent_req_write(const char *path, unsigned mode, bool mkdirs);
/* depth 0: as deep as the glob reaches (a glob is then required); glob NULL for every entry. */
json_t *agent_req_list(const char *path, unsigned depth, const char *glob, bool hidden, unsigned limit);
/* A directory out as a tar (stdout), gzip or not; exclude: relative paths (borrowed). */
json_t *agent_req_archive(const char *path, bool gzip, json_t *exclude);
/* A tar, gzip or not, on stdin into a directory; bounded in file bytes and members. */
json_t *agent_req_unarchive(const char *path, uint64_t max_bytes, uint64_t max_entries);
json_t *agent_req_stat(const char *path);
json_t *agent_req_mkdir(const char *path, bool parents);
/* Changes under path (recursive: below it too, with at most max_watches
 * inotify descriptors): EVENT {"watching":true}, then NDJSON lines as DATA
 * fd 1 until a CANCEL or the path's end (docs/protocol.md, "watch"). */
json_t *agent_req_watch(const char *path, bool recursive, unsigned max_watches);
json_t *agent_req_remove(const char *path, bool recursive);
json_t *agent_req_rename(const char *from, const char *to, bool overwrite);
/* A TCP connection to 127.0.0.1:port inside the sandbox (port forwarding):
 * EVENT {"event":"connected"}, then DATA both ways; RESULT ends it. */
json_t *agent_req_forward(unsigned port);
/* A microVM's or gVisor's agent goes quiet before its machine is saved (channel_checkpoint_begin). */
json_t *agent_req_checkpoint(void);
/* gVisor: the volume the host brought under the live directory as name,
 * bound at path by the agent's helper; and that bind undone (never lazily). */
json_t *agent_req_mount(const char *path, const char *name, bool read_only);
json_t *agent_req_unmount(const char *path);
/* A signal to the process group of the exec running on host stream `stream`. */
json_t *agent_req_signal(uint32_t stream, int signo);

/* Waits up to timeout_ms for the stream's RESULT (a new reference in *ret;
 * it may carry an {"error"}). A listing's EVENT batches of "entries" are
 * joined into the RESULT's; an exec-like op's first line of stdout and of
 * stderr (an unarchive's counts or its reason) as "stdoutHead" and
 * "stderrHead". -ETIMEDOUT; -ECONNRESET when the channel closed
 * first; -ECANCELED when give_up (may be NULL) said so. The stream stays the
 * caller's. */
int agent_wait_result(ChanStream *s, int64_t timeout_ms, AgentGiveUpFn give_up, void *userdata, json_t **ret);
/* Sends all of data and the end of input; 0, -ETIMEDOUT or -EPIPE. */
int agent_send_all(ChanStream *s, const void *data, size_t len, int timeout_ms);
/* Reads a whole file of the sandbox (at most max bytes, NUL-terminated).
 * -ENOENT when the agent says not_found, -E2BIG past max, -EIO otherwise. */
int agent_read_file(Channel *c, const char *path, size_t max, int timeout_ms, char **ret, size_t *ret_len);
/* Opens a write of path (mode 0644, parents made) and sends all of data; the
 * answer is awaited by agent_write_finish, so that several writes are in
 * flight at once. The stream is freed on failure. */
int agent_write_begin(Channel *c, const char *path, const void *data, size_t len, int timeout_ms,
                      ChanStream **ret);
/* Waits for a write's result (the file and its directory synced) and frees
 * the stream: 0 or -EIO. */
int agent_write_finish(ChanStream *s, int timeout_ms);

/* The agent's error code of a RESULT (NULL when it succeeded) and its
 * message (may be NULL). */
const char *agent_result_error(json_t *result, const char **ret_message);
