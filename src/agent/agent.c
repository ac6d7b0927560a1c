#include "agent/agent-internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/exec.h"
#include "agent/fsops.h"
#include "agent/live_mounts.h"
#include "agent/limits.h"
#include "agent/request.h"
#include "agent/user.h"
#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "proto/proto.h"

static void send_hello(Agent *a, json_t *attached);

void agent_log_msg(const char *fmt, ...) {
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
        va_end(ap);
        if (n < 0)
                return;
        if ((size_t)n > sizeof buf - 2)
                n = sizeof buf - 2;
        buf[n++] = '\n';
        (void)!write(STDERR_FILENO, "runtime-agent: ", 15);
        (void)!write(STDERR_FILENO, buf, (size_t)n);
}

/* ---- outgoing frames ---- */

Stream *agent_stream_find(Agent *a, uint32_t id) {
        for (size_t i = 0; i < a->n_streams; i++)
                if (a->streams[i]->id == id && !a->streams[i]->finished && !a->streams[i]->orphan)
                        return a->streams[i];
        return NULL;
}

void agent_fatal(Agent *a, const char *why) {
        agent_log_msg("%s; closing the channel", why);
        a->quit = true;
        a->exit_status = 1;
}

void agent_queue_frame(Agent *a, OutFrame *f, uint8_t type, uint32_t stream) {
        if (stream == ORPHAN_STREAM) {
                free(f->buf);
                free(f);
                return;
        }
        if (a->out_tail)
                a->out_tail->next = f;
        else
                a->out_head = f;
        a->out_tail = f;
        a->out_bytes += f->len;
        if (type == PROTO_DATA) {
                Stream *s = agent_stream_find(a, stream);
                if (s) {
                        f->data_stream = stream;
                        s->queued_out += f->len;
                }
        }
}

void agent_send_frame(Agent *a, uint8_t type, uint8_t flags, uint32_t stream, const void *payload,
                       size_t len) {
        OutFrame *f = calloc(1, sizeof(OutFrame));
        if (!f || proto_frame_build(type, flags, stream, payload, len, &f->buf, &f->len) < 0) {
                free(f);
                /* A frame we cannot queue would leave the host waiting for ever. */
                agent_fatal(a, "cannot queue a frame");
                return;
        }
        agent_queue_frame(a, f, type, stream);
}

static void send_json(Agent *a, uint8_t type, uint32_t stream, json_t *j) {
        _cleanup_free_ char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        if (!s) {
                agent_fatal(a, "out of memory");
                return;
        }
        size_t n = strlen(s);
        if (n > PROTO_MAX_JSON) {
                /* Never happens for the objects built here; an over-long one
                 * becomes an error rather than a malformed frame. */
                json_t *e = json_pack("{s:{s:s,s:s}}", "error", "code", "internal", "message",
                                      "reply too large");
                send_json(a, type, stream, e);
                json_decref(e);
                return;
        }
        agent_send_frame(a, type, 0, stream, s, n);
}

void agent_send_json_new(Agent *a, uint8_t type, uint32_t stream, json_t *j) {
        send_json(a, type, stream, j);
        json_decref(j);
}

void agent_finish_error(Agent *a, Stream *s, const char *code, const char *message) {
        agent_send_json_new(a, PROTO_RESULT, s->id,
                      json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", message));
        s->finished = true;
}

static void result_error(Agent *a, uint32_t id, const char *code, const char *message) {
        agent_send_json_new(a, PROTO_RESULT, id,
                      json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", message));
}

static void result_errno(Agent *a, uint32_t id, int err) {
        result_error(a, id, fsops_error_code(err), strerror(-err));
}

/* Queued frames go out together: an exec's last EOFs and its RESULT reach
 * the host in one write, and wake it once. */
static void flush_out(Agent *a) {
        while (a->out_head) {
                struct iovec iov[FLUSH_IOV];
                int k = 0;
                for (OutFrame *f = a->out_head; f && k < FLUSH_IOV; f = f->next)
                        iov[k++] = (struct iovec){.iov_base = f->buf + f->off, .iov_len = f->len - f->off};
                ssize_t n = writev(a->out_fd, iov, k);
                if (n == 0)
                        return;
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                return;
                        agent_log_msg("channel write failed: %s", strerror(errno));
                        a->quit = true;
                        a->exit_status = 1;
                        return;
                }
                size_t left = (size_t)n;
                a->out_bytes -= left;
                while (a->out_head && left > 0) {
                        OutFrame *f = a->out_head;
                        size_t part = f->len - f->off < left ? f->len - f->off : left;
                        f->off += part;
                        left -= part;
                        if (f->off < f->len)
                                return; /* the channel is full */
                        a->out_head = f->next;
                        if (!a->out_head)
                                a->out_tail = NULL;
                        if (f->data_stream) {
                                /* Clamped: a host may reuse a finished stream's id
                                 * while that stream's last frames are still queued. */
                                Stream *s = agent_stream_find(a, f->data_stream);
                                if (s)
                                        s->queued_out -= f->len < s->queued_out ? f->len : s->queued_out;
                        }
                        free(f->buf);
                        free(f);
                }
        }
}

/* ---- streams ---- */

void agent_close_fd(int *fd) {
        if (*fd >= 0) {
                close(*fd);
                *fd = -1;
        }
}

void agent_stream_free(Stream *s) {
        for (int i = 0; i < 3; i++)
                agent_close_fd(&s->fds[i]);
        agent_close_fd(&s->file_fd);
        if (s->kind == STREAM_RELAY || s->kind == STREAM_FORWARD)
                agent_close_fd(&s->sock);
        while (s->in_head) {
                Chunk *c = s->in_head;
                s->in_head = c->next;
                free(c);
        }
        while (s->held_head) {
                HeldChunk *c = s->held_head;
                s->held_head = c->next;
                free(c);
        }
        fsops_write_abort(s->write);
        agent_watch_free(s->watch);
        json_decref(s->tag);
        free(s);
}

void agent_send_window(Agent *a, Stream *s, bool force) {
        /* Detached, no host waits for credit: the next one starts afresh. */
        if (s->in_ack == 0 || (!force && s->in_ack < WINDOW_BATCH) || s->hold == HOLD_DETACHED)
                return;
        uint8_t p[4];
        proto_put_u32(p, (uint32_t)s->in_ack);
        agent_send_frame(a, PROTO_WINDOW, 0, s->id, p, 4);
        s->in_held -= s->in_ack;
        s->in_ack = 0;
}

void agent_consumed(Agent *a, Stream *s, size_t n, bool force) {
        /* The bytes of a host before the attach come first in the queue. */
        uint64_t stale = n < s->in_stale ? n : s->in_stale;
        s->in_stale -= stale;
        s->in_ack += n - stale;
        agent_send_window(a, s, force);
}

void agent_drop_stdin(Agent *a, Stream *s) {
        size_t n = 0;
        while (s->in_head) {
                Chunk *c = s->in_head;
                s->in_head = c->next;
                n += c->len - c->off;
                free(c);
        }
        s->in_tail = NULL;
        agent_close_fd(&s->fds[PIPE_IN]);
        agent_consumed(a, s, n, true);
}

/* A killed process group is killed again every AGENT_REKILL_MS until
 * kill(2) finds nothing of it: gVisor's kill of a group misses a child that
 * a member is forking at that moment (Linux's cannot: the fork fails once
 * the parent has the signal pending), and one such survivor of a fork bomb
 * rebuilds the group, which would then grow, unkilled, until the sandbox's
 * host tasks or memory ran out. */
static void doom_group(Agent *a, pid_t pgid) {
        if (pgid <= 1)
                return;
        for (size_t i = 0; i < a->n_doomed; i++)
                if (a->doomed[i] == pgid)
                        return;
        if (a->n_doomed == ELEMENTSOF(a->doomed)) {
                /* The oldest has been killed the most times. */
                memmove(a->doomed, a->doomed + 1, (a->n_doomed - 1) * sizeof a->doomed[0]);
                a->n_doomed--;
        }
        if (a->n_doomed == 0)
                a->next_rekill_ms = time_now_mono_ms() + AGENT_REKILL_MS;
        a->doomed[a->n_doomed++] = pgid;
}

static void rekill_groups(Agent *a, uint64_t now) {
        if (a->n_doomed == 0 || now < a->next_rekill_ms)
                return;
        a->next_rekill_ms = now + AGENT_REKILL_MS;
        size_t j = 0;
        for (size_t i = 0; i < a->n_doomed; i++) {
                pid_t g = a->doomed[i];
                /* A group id is not reused while the group has members:
                 * once it names a new command's group, the old one is gone. */
                Stream *s = NULL;
                for (size_t k = 0; k < a->n_streams && !s; k++)
                        if (a->streams[k]->kind == STREAM_EXEC && a->streams[k]->pid == g &&
                            !a->streams[k]->group_killed)
                                s = a->streams[k];
                if (s || (kill(-g, SIGKILL) < 0 && errno == ESRCH))
                        continue;
                a->doomed[j++] = g;
        }
        a->n_doomed = j;
}

void agent_exec_kill(Agent *a, Stream *s) {
        if (s->group_killed)
                return;
        s->group_killed = true;
        if (!s->exited)
                exec_kill_group(s->pid);
        else
                kill(-s->pid, SIGKILL);
        doom_group(a, s->pid);
}

static void exec_start(Agent *a, uint32_t id, AgentRequest *r, const char *as) {
        /* Every exec may have to be listed in one HELLO after an ATTACH. */
        size_t list_cost = HELLO_ENTRY_BYTES + r->tag_len;
        if (a->list_bytes + list_cost > HELLO_LIST_BUDGET) {
                result_error(a, id, "busy", "too many running commands with tags to list after a restart");
                return;
        }
        Stream *s = calloc(1, sizeof(Stream));
        if (!s) {
                result_error(a, id, "internal", "out of memory");
                return;
        }
        s->fds[0] = s->fds[1] = s->fds[2] = -1;
        s->file_fd = -1;
        ExecChild child;
        s->oom_kills_before = limits_oom_kills();
        int k = exec_spawn(r, &child);
        if (k < 0) {
                free(s);
                agent_log_msg("exec: cannot start a child: %s", strerror(-k));
                result_errno(a, id, k);
                return;
        }
        s->id = id;
        s->kind = STREAM_EXEC;
        s->credit = PROTO_INITIAL_WINDOW;
        s->pid = child.pid;
        s->fds[PIPE_IN] = child.stdin_fd;
        s->fds[PIPE_OUT] = child.stdout_fd;
        s->fds[PIPE_ERR] = child.stderr_fd;
        s->pty = r->pty;
        s->sync_after = r->sync_after;
        if (!s->pty)
                for (int i = PIPE_OUT; i <= PIPE_ERR; i++)
                        if (s->fds[i] >= 0)
                                (void)fcntl(s->fds[i], F_SETPIPE_SZ, (int)EXEC_PIPE_BYTES);
        s->start_ms = time_now_mono_ms();
        if (r->timeout_ms > 0)
                s->deadline_ms = s->start_ms + (uint64_t)r->timeout_ms;
        s->tag = TAKE_PTR(r->tag);
        s->list_cost = list_cost;
        a->list_bytes += list_cost;
        a->streams[a->n_streams++] = s;
        agent_send_json_new(a, PROTO_EVENT, id,
                      json_pack("{s:s,s:i,s:s}", "event", "start", "pid", (int)child.pid, "user", as));
}

static void read_start(Agent *a, uint32_t id, AgentRequest *r) {
        int fd;
        struct stat st;
        int k = fsops_open_read(r->path, &fd, &st);
        if (k < 0) {
                if (k == -EINVAL)
                        result_error(a, id, "invalid", "not a regular file");
                else
                        result_errno(a, id, k);
                return;
        }
        Stream *s = calloc(1, sizeof(Stream));
        if (!s) {
                close(fd);
                result_error(a, id, "internal", "out of memory");
                return;
        }
        s->fds[0] = s->fds[1] = s->fds[2] = -1;
        s->id = id;
        s->kind = STREAM_READ;
        s->credit = PROTO_INITIAL_WINDOW;
        s->file_fd = fd;
        a->streams[a->n_streams++] = s;
        agent_send_json_new(
                a, PROTO_EVENT, id,
                json_pack("{s:I,s:i}", "size", (json_int_t)st.st_size, "mode", (int)(st.st_mode & 07777)));
}

/* A watch runs with the rights of the request's user (entered by the
 * caller), which its later additions take again. */
static void watch_start(Agent *a, uint32_t id, AgentRequest *r) {
        AgentWatch *w = NULL;
        int k = agent_watch_open(r->path, r->flag, r->limit, r->uid, r->gid, &w);
        if (k < 0) {
                result_errno(a, id, k);
                return;
        }
        Stream *s = calloc(1, sizeof(Stream));
        if (!s) {
                agent_watch_free(w);
                result_error(a, id, "internal", "out of memory");
                return;
        }
        s->fds[0] = s->fds[1] = s->fds[2] = -1;
        s->file_fd = -1;
        s->id = id;
        s->kind = STREAM_WATCH;
        s->credit = PROTO_INITIAL_WINDOW;
        s->watch = w;
        a->streams[a->n_streams++] = s;
        agent_send_json_new(a, PROTO_EVENT, id, json_pack("{s:b}", "watching", true));
}

/* The kernel's events as lines, as far as the host's credit goes; the
 * RESULT once the watched path is gone. */
static void watch_pump(Agent *a, Stream *s) {
        static char buf[BIG_CHUNK];
        size_t cap = s->credit < BIG_CHUNK ? (size_t)s->credit : BIG_CHUNK;
        if (cap < 2 * WATCH_MAX_LINE)
                return;
        WatchEnd end = WATCH_RUNNING;
        ssize_t n = agent_watch_read(s->watch, buf, cap, &end);
        if (n < 0) {
                agent_finish_error(a, s, fsops_error_code((int)n), strerror((int)-n));
                return;
        }
        if (n > 0) {
                agent_send_frame(a, PROTO_DATA, PROTO_FD_OUT, s->id, buf, (size_t)n);
                s->credit -= (uint64_t)n;
        }
        if (end != WATCH_RUNNING) {
                agent_send_frame(a, PROTO_EOF, PROTO_FD_OUT, s->id, NULL, 0);
                agent_send_json_new(a, PROTO_RESULT, s->id,
                                    json_pack("{s:s}", "reason",
                                              end == WATCH_ROOT_MOVED ? "root-moved" : "root-removed"));
                s->finished = true;
        }
}

static void write_start(Agent *a, uint32_t id, AgentRequest *r) {
        FsWrite *w;
        int k = fsops_write_begin(r->path, r->mode, r->flag, &w);
        if (k < 0) {
                result_errno(a, id, k);
                return;
        }
        Stream *s = calloc(1, sizeof(Stream));
        if (!s) {
                fsops_write_abort(w);
                result_error(a, id, "internal", "out of memory");
                return;
        }
        s->fds[0] = s->fds[1] = s->fds[2] = -1;
        s->file_fd = -1;
        s->id = id;
        s->kind = STREAM_WRITE;
        s->credit = PROTO_INITIAL_WINDOW;
        s->write = w;
        s->write_uid = r->uid;
        s->write_gid = r->gid;
        a->streams[a->n_streams++] = s;
}

/* The list reply can be far larger than one JSON frame: entries go out in
 * EVENT {"entries":[...]} frames of bounded size, the RESULT carries the rest,
 * "truncated" and "total" (the number of entries over all frames). The whole
 * reply is bounded too, below what the host queues per stream: 10000 entries
 * with long paths would otherwise be tens of MiB. */
#define LIST_FRAME_BUDGET (PROTO_MAX_JSON - 8192)
#define LIST_REPLY_BUDGET (2u * 1024u * 1024u)

static void list_reply(Agent *a, uint32_t id, json_t *entries, bool truncated) {
        _cleanup_json_ json_t *batch = json_array();
        size_t batch_bytes = 0, reply_bytes = 0, total = 0;
        for (size_t i = 0; i < json_array_size(entries) && batch; i++) {
                json_t *e = json_array_get(entries, i);
                _cleanup_free_ char *s = json_dumps(e, JSON_COMPACT);
                if (!s) {
                        json_decref(TAKE_PTR(batch));
                        break;
                }
                /* An entry is two paths and a few numbers, far below the frame
                 * budget even with every byte escaped. */
                size_t n = strlen(s) + 1;
                if (reply_bytes + n > LIST_REPLY_BUDGET || n > LIST_FRAME_BUDGET) {
                        truncated = true;
                        break;
                }
                if (batch_bytes + n > LIST_FRAME_BUDGET) {
                        agent_send_json_new(a, PROTO_EVENT, id, json_pack("{s:O}", "entries", batch));
                        json_decref(batch);
                        batch = json_array();
                        batch_bytes = 0;
                        if (!batch)
                                break;
                }
                if (json_array_append(batch, e) < 0) {
                        json_decref(TAKE_PTR(batch));
                        break;
                }
                batch_bytes += n;
                reply_bytes += n;
                total++;
        }
        if (!batch) {
                result_error(a, id, "internal", "out of memory");
                return;
        }
        agent_send_json_new(a, PROTO_RESULT, id,
                      json_pack("{s:O,s:b,s:I}", "entries", batch, "truncated", truncated, "total",
                                (json_int_t)total));
}

/* stat and list: entries with their owners' and groups' names, read from
 * the sandbox's own files for each request. */
static void fs_query(Agent *a, uint32_t id, const AgentRequest *r) {
        FsNames names = { 0 };
        int k = fsops_names_load("/etc/passwd", "/etc/group", &names);
        if (k < 0) {
                result_errno(a, id, k);
                return;
        }
        if (r->op == REQ_STAT) {
                json_t *e = NULL;
                k = fsops_stat(r->path, &names, &e);
                fsops_names_done(&names);
                if (k < 0)
                        result_errno(a, id, k);
                else
                        agent_send_json_new(a, PROTO_RESULT, id, e);
                return;
        }
        json_t *entries = NULL;
        bool truncated = false;
        FsListOptions lo = { .path = r->path,
                             .depth = r->depth,
                             .glob = r->glob,
                             .hidden = r->hidden,
                             .limit = r->limit,
                             .names = &names };
        k = fsops_list(&lo, &entries, &truncated);
        fsops_names_done(&names);
        if (k < 0) {
                result_errno(a, id, k);
                return;
        }
        list_reply(a, id, entries, truncated);
        json_decref(entries);
}

/* Port forwarding: a connection to 127.0.0.1:port inside, for the host.
 * Only loopback: what a forward reaches is what the sandbox itself serves. */
static void forward_start(Agent *a, uint32_t id, AgentRequest *r) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                result_errno(a, id, -errno);
                return;
        }
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(r->port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        bool pending = false;
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
                if (errno != EINPROGRESS) {
                        int err = errno;
                        close(fd);
                        char msg[96];
                        snprintf(msg, sizeof msg, "nothing accepts connections on port %u in the sandbox: %s",
                                 (unsigned)r->port, strerror(err));
                        result_error(a, id, "refused", msg);
                        return;
                }
                pending = true;
        }
        Stream *s = calloc(1, sizeof(Stream));
        if (!s) {
                close(fd);
                result_error(a, id, "internal", "out of memory");
                return;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        s->fds[0] = s->fds[1] = s->fds[2] = -1;
        s->file_fd = -1;
        s->id = id;
        s->sock = fd;
        s->kind = STREAM_FORWARD;
        s->credit = PROTO_INITIAL_WINDOW;
        s->connecting = pending;
        s->pid = r->port; /* for the refusal's message only */
        a->streams[a->n_streams++] = s;
        if (!pending)
                agent_send_json_new(a, PROTO_EVENT, id, json_pack("{s:s}", "event", "connected"));
}

static void forward_connected(Agent *a, Stream *s) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(s->sock, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
                err = errno;
        if (err == EINPROGRESS || err == EALREADY)
                return;
        s->connecting = false;
        if (err) {
                char msg[96];
                snprintf(msg, sizeof msg, "nothing accepts connections on port %d in the sandbox: %s", (int)s->pid,
                         strerror(err));
                agent_finish_error(a, s, "refused", msg);
                return;
        }
        agent_send_json_new(a, PROTO_EVENT, s->id, json_pack("{s:s}", "event", "connected"));
}

/* A forward ends once both directions have: the program's EOF sent and the
 * host's written and shut. */
static void forward_check(Agent *a, Stream *s) {
        if (!s->connecting && s->sock_eof && s->wr_shut && !s->in_head) {
                agent_send_json_new(a, PROTO_RESULT, s->id, json_object());
                s->finished = true;
        }
}

/* Who a request runs as, named by its user: looked up in the sandbox's own
 * /etc/passwd each time (root inside may change it). An image without the
 * "sandbox" user (an older one, a custom one) runs its requests as root
 * instead, and an exec's start event says so; any other unknown name is an
 * error. Root runs as the agent itself, with HOME and USER of its own. */
static int resolve_user(AgentRequest *r, const char **ret_as, const char **ret_error) {
        *ret_as = "root";
        if (!r->user)
                return 0;
        AgentUser u;
        int k = user_lookup("/etc/passwd", r->user, &u);
        if (k == -ENOENT && strcmp(r->user, "sandbox") == 0) {
                free(r->user);
                r->user = strdup("root");
                if (!r->user)
                        return -ENOMEM;
                k = user_lookup("/etc/passwd", "root", &u);
                if (k == -ENOENT) {
                        /* Not even root listed: the agent's own identity. */
                        u = (AgentUser){ .name = "root", .home = "/root", .uid = 0, .gid = 0 };
                        k = 0;
                }
        }
        if (k == -ENOENT) {
                *ret_error = "no such user in this sandbox";
                return -EINVAL;
        }
        if (k == -ERANGE) {
                *ret_error = "the user's entry in /etc/passwd is not usable (ids above 65533 or no home)";
                return -EINVAL;
        }
        if (k < 0)
                return k;
        if (!(r->home = strdup(u.home)))
                return -ENOMEM;
        if (u.uid != 0) {
                r->uid = u.uid;
                r->gid = u.gid;
        }
        *ret_as = r->user;
        return 0;
}

/* A copy of a saved machine: its host knows none of the streams of the
 * channel before the checkpoint. A running command keeps running, its
 * output read and dropped and its stdin closed; a transfer, a relay or a
 * forwarded connection ends. */
static void orphan_streams(Agent *a) {
        for (size_t i = 0; i < a->n_streams; i++) {
                Stream *s = a->streams[i];
                s->id = ORPHAN_STREAM;
                s->orphan = true;
                s->credit = 1ull << 40;
                agent_hold_release(a, s);
                if (s->kind == STREAM_EXEC)
                        agent_drop_stdin(a, s);
                else
                        s->finished = true;
        }
}

static void handle_open(Agent *a, uint32_t id, const uint8_t *payload, size_t len) {
        if ((id & 1u) == 0) {
                agent_log_msg("ignoring OPEN on even stream %u", id);
                return;
        }
        AgentRequest *r = NULL;
        const char *msg = NULL;
        int k = agent_request_parse(payload, len, &r, &msg);
        /* The first request after a checkpoint: a resume comes from a copy
         * of the saved machine, whose host never saw the earlier streams. */
        if (a->checkpointed) {
                a->checkpointed = false;
                if (k == 0 && r->op == REQ_RESUME && a->resume)
                        orphan_streams(a);
        }
        for (size_t i = 0; i < a->n_streams; i++)
                if (a->streams[i]->id == id && !a->streams[i]->orphan) {
                        agent_log_msg("ignoring OPEN on stream %u which is in use", id);
                        agent_request_free(r);
                        return;
                }
        if (k < 0) {
                result_error(a, id, k == -ENOMEM ? "internal" : "invalid",
                             k == -ENOMEM ? "out of memory" : msg);
                return;
        }
        if (a->n_streams >= AGENT_MAX_STREAMS) {
                result_error(a, id, "busy", "too many concurrent operations");
                agent_request_free(r);
                return;
        }
        int (*resume)(const AgentRequest *) = a->resume;
        a->resume = NULL;
        const char *as;
        k = resolve_user(r, &as, &msg);
        if (k < 0) {
                result_error(a, id, k == -EINVAL ? "invalid" : "internal", k == -EINVAL ? msg : strerror(-k));
                agent_request_free(r);
                return;
        }
        /* A file operation runs with the user's rights and makes its files
         * the user's; a child (exec, archive, unarchive) sets its own ids. */
        bool in_child = r->op == REQ_EXEC || r->op == REQ_ARCHIVE || r->op == REQ_UNARCHIVE;
        if (r->uid >= 0 && !in_child && (k = user_enter((uid_t)r->uid, (gid_t)r->gid)) < 0) {
                result_errno(a, id, k);
                agent_request_free(r);
                return;
        }
        switch (r->op) {
        case REQ_RESUME:
                if (!resume) {
                        result_error(a, id, "invalid", "resume is only accepted as the first request of a restored VM");
                        break;
                }
                k = resume(r);
                if (k < 0) {
                        result_errno(a, id, k);
                        break;
                }
                agent_send_json_new(a, PROTO_RESULT, id, json_object());
                send_hello(a, NULL);
                break;
        case REQ_CHECKPOINT:
                if (!a->vm_resume) {
                        result_error(a, id, "invalid", "checkpoint is only for a microVM's or gVisor's agent");
                        break;
                }
                agent_send_json_new(a, PROTO_RESULT, id, json_object());
                a->quiet = true;
                a->checkpointed = true;
                a->resume = a->vm_resume;
                break;
        case REQ_EXEC:
        case REQ_ARCHIVE:
        case REQ_UNARCHIVE:
                exec_start(a, id, r, as);
                break;
        case REQ_SIGNAL: {
                /* Only a running exec of the host's own: a pid from the
                 * request could name any process in the sandbox. */
                Stream *t = agent_stream_find(a, r->target);
                if (!t || t->kind != STREAM_EXEC || t->group_killed || (t->exited && r->signo != SIGKILL))
                        result_error(a, id, "not_found", "no running process on that stream");
                else {
                        if (r->signo == SIGKILL)
                                agent_exec_kill(a, t);
                        else if (kill(-t->pid, r->signo) < 0 && errno == ESRCH)
                                /* The child has not reached its setsid() yet:
                                 * there is no group, only the leader. */
                                kill(t->pid, r->signo);
                        agent_send_json_new(a, PROTO_RESULT, id, json_object());
                }
                break;
        }
        case REQ_READ:
                read_start(a, id, r);
                break;
        case REQ_FORWARD:
                forward_start(a, id, r);
                break;
        case REQ_WRITE:
                write_start(a, id, r);
                break;
        case REQ_WATCH:
                watch_start(a, id, r);
                break;
        case REQ_STAT:
        case REQ_LIST:
                fs_query(a, id, r);
                break;
        case REQ_REMOVE: {
                uint64_t removed = 0;
                k = fsops_remove(r->path, r->flag, &removed);
                if (k < 0)
                        result_errno(a, id, k);
                else
                        agent_send_json_new(a, PROTO_RESULT, id, json_pack("{s:I}", "removed", (json_int_t)removed));
                break;
        }
        case REQ_MOUNT:
        case REQ_UNMOUNT:
                k = r->op == REQ_MOUNT ? a->mount(r->mount_name, r->path, r->flag) : a->unmount(r->path);
                if (k < 0)
                        agent_send_json_new(a, PROTO_RESULT, id,
                                            json_pack("{s:{s:s,s:s},s:i}", "error", "code", fsops_error_code(k),
                                                      "message", strerror(-k), "errno", -k));
                else
                        agent_send_json_new(a, PROTO_RESULT, id, json_object());
                break;
        case REQ_MKDIR:
        case REQ_RENAME:
                k = r->op == REQ_MKDIR ? fsops_mkdir(r->path, r->flag) : fsops_rename(r->path, r->to, r->flag);
                if (k < 0)
                        result_errno(a, id, k);
                else
                        agent_send_json_new(a, PROTO_RESULT, id, json_object());
                break;
        }
        if (r->uid >= 0 && !in_child)
                user_leave();
        agent_request_free(r);
}

static void handle_data(Agent *a, Stream *s, uint8_t fd, const uint8_t *p, size_t n) {
        if (fd != (s->kind == STREAM_RELAY ? PROTO_FD_OUT : PROTO_FD_IN))
                return;
        if (s->in_held + n > PROTO_INITIAL_WINDOW) {
                agent_fatal(a, "host sent DATA beyond its credit");
                return;
        }
        s->in_held += n;
        s->in_total += n;
        if (s->kind == STREAM_WRITE) {
                int k = fsops_write_data(s->write, p, n);
                if (k < 0) {
                        fsops_write_abort(TAKE_PTR(s->write));
                        agent_finish_error(a, s, fsops_error_code(k), strerror(-k));
                        return;
                }
                agent_consumed(a, s, n, true);
                return;
        }
        bool writable = s->kind == STREAM_EXEC ? s->fds[PIPE_IN] >= 0
                                               : (s->kind == STREAM_RELAY || s->kind == STREAM_FORWARD) && !s->wr_shut;
        if (!writable || s->in_eof || n == 0) {
                agent_consumed(a, s, n, true);
                return;
        }
        Chunk *c = malloc(sizeof(Chunk) + n);
        if (!c) {
                agent_fatal(a, "out of memory");
                return;
        }
        c->next = NULL;
        c->len = n;
        c->off = 0;
        memcpy(c->data, p, n);
        if (s->in_tail)
                s->in_tail->next = c;
        else
                s->in_head = c;
        s->in_tail = c;
}

void agent_relay_shut_write(Stream *s) {
        if (!s->wr_shut) {
                shutdown(s->sock, SHUT_WR);
                s->wr_shut = true;
        }
}

static void handle_eof(Agent *a, Stream *s, uint8_t fd) {
        if (s->kind == STREAM_RELAY || s->kind == STREAM_FORWARD) {
                if (fd == (s->kind == STREAM_RELAY ? PROTO_FD_OUT : PROTO_FD_IN)) {
                        s->in_eof = true;
                        if (!s->in_head)
                                agent_relay_shut_write(s);
                }
                return;
        }
        if (fd != PROTO_FD_IN)
                return;
        if (s->kind == STREAM_WRITE) {
                uint64_t size = 0;
                int k = s->write_uid >= 0 ? user_enter((uid_t)s->write_uid, (gid_t)s->write_gid) : 0;
                if (k >= 0) {
                        k = fsops_write_commit(TAKE_PTR(s->write), &size);
                        if (s->write_uid >= 0)
                                user_leave();
                } else
                        fsops_write_abort(TAKE_PTR(s->write));
                if (k < 0)
                        agent_finish_error(a, s, fsops_error_code(k), strerror(-k));
                else {
                        agent_send_json_new(a, PROTO_RESULT, s->id, json_pack("{s:I}", "size", (json_int_t)size));
                        s->finished = true;
                }
                return;
        }
        if (s->kind == STREAM_EXEC) {
                s->in_eof = true;
                if (!s->in_head)
                        agent_close_fd(&s->fds[PIPE_IN]);
        }
}

static void handle_cancel(Agent *a, Stream *s) {
        switch (s->kind) {
        case STREAM_EXEC:
                /* The RESULT follows once the group is gone and the pipes drained. */
                agent_exec_kill(a, s);
                agent_drop_stdin(a, s);
                if (s->exited && !s->final_until_ms)
                        s->final_until_ms = time_now_mono_ms() + FINAL_DRAIN_MS;
                break;
        case STREAM_READ:
                agent_finish_error(a, s, "io", "cancelled");
                break;
        case STREAM_WRITE:
                fsops_write_abort(TAKE_PTR(s->write));
                agent_finish_error(a, s, "io", "cancelled");
                break;
        case STREAM_RELAY:
                break; /* ours to cancel, not the host's */
        case STREAM_WATCH:
                agent_send_json_new(a, PROTO_RESULT, s->id, json_pack("{s:s}", "reason", "stopped"));
                s->finished = true;
                break;
        case STREAM_FORWARD:
                /* The client is gone: the connection inside closes at once. */
                agent_send_json_new(a, PROTO_RESULT, s->id, json_object());
                s->finished = true;
                break;
        }
}

static void handle_frame(Agent *a, const ProtoHeader *h, const uint8_t *p) {
        a->quiet = false;
        if (h->type == PROTO_PING) {
                agent_send_frame(a, PROTO_PONG, 0, 0, p, h->length);
                return;
        }
        if (h->type == PROTO_OPEN) {
                handle_open(a, h->stream, p, h->length);
                return;
        }
        if (h->type == PROTO_DETACH) {
                agent_detach(a);
                /* A daemon taking the channel over: its token back, behind
                 * all we queued before, tells it where our frames begin. */
                if (h->length > 0)
                        agent_send_frame(a, PROTO_DETACH, 0, 0, p, h->length);
                return;
        }
        if (h->type == PROTO_ATTACH) {
                if (agent_request_parse_attach(p, h->length) < 0) {
                        agent_fatal(a, "malformed ATTACH");
                        return;
                }
                json_t *kept = agent_attach(a);
                if (!kept) {
                        agent_fatal(a, "out of memory");
                        return;
                }
                send_hello(a, kept);
                return;
        }
        Stream *s = agent_stream_find(a, h->stream);
        if (!s)
                return; /* unknown or finished stream: frames may have been in flight */
        switch (h->type) {
        case PROTO_DATA:
                handle_data(a, s, h->flags, p, h->length);
                break;
        case PROTO_EOF:
                handle_eof(a, s, h->flags);
                break;
        case PROTO_WINDOW: {
                uint32_t v = proto_get_u32(p);
                /* A host handing out absurd credit only hurts itself, but keep
                 * the counter far from overflow. */
                if (s->credit + v <= (1ull << 40))
                        s->credit += v;
                agent_hold_window(a, s);
                break;
        }
        case PROTO_CANCEL:
                handle_cancel(a, s);
                break;
        case PROTO_RESULT:
                /* The proxy is done with one of our relay connections (or
                 * refused it): whatever it had to say was sent before. */
                if (s->kind == STREAM_RELAY) {
                        s->host_done = true;
                        if (!s->in_head)
                                s->finished = true;
                }
                break;
        case PROTO_EVENT: {
                /* The one event a host sends: a terminal's new size. */
                unsigned cols, rows;
                if (s->kind == STREAM_EXEC && s->pty && s->fds[PIPE_OUT] >= 0 &&
                    agent_request_parse_resize(p, h->length, &cols, &rows) == 0)
                        agent_pty_resize(s, cols, rows);
                break;
        }
        default:
                break; /* HELLO, PONG: nothing the agent waits for */
        }
}

static void read_channel(Agent *a) {
        static uint8_t buf[PROTO_HEADER_SIZE + BIG_CHUNK];
        ssize_t n = read(a->in_fd, buf, sizeof buf);
        if (n < 0) {
                if (errno == EINTR || errno == EAGAIN)
                        return;
                agent_log_msg("channel read failed: %s", strerror(errno));
                a->quit = true;
                a->exit_status = 1;
                return;
        }
        if (n == 0) {
                agent_log_msg("channel closed by the host");
                a->quit = true;
                a->exit_status = 0;
                return;
        }
        if (proto_reader_feed(a->reader, buf, (size_t)n) < 0) {
                agent_fatal(a, "malformed frame");
                return;
        }
        for (;;) {
                ProtoHeader h;
                const uint8_t *payload;
                int k = proto_reader_next(a->reader, &h, &payload);
                if (k == 0)
                        break;
                if (k < 0) {
                        agent_fatal(a, "malformed frame");
                        return;
                }
                handle_frame(a, &h, payload);
                if (a->quit)
                        return;
        }
}

/* ---- the loop ---- */

Agent *agent_new(int in_fd, int out_fd, int sig_fd) {
        Agent *a = calloc(1, sizeof(Agent));
        if (!a)
                return NULL;
        a->reader = proto_reader_new();
        if (!a->reader) {
                free(a);
                return NULL;
        }
        a->in_fd = in_fd;
        a->out_fd = out_fd;
        a->sig_fd = sig_fd;
        a->relay_fd = -1;
        a->mount = live_mounts_bind;
        a->unmount = live_mounts_unbind;
        a->next_even = 2;
        return a;
}

void agent_free(Agent *a) {
        if (!a)
                return;
        for (size_t i = 0; i < a->n_streams; i++)
                agent_stream_free(a->streams[i]);
        while (a->out_head) {
                OutFrame *f = a->out_head;
                a->out_head = f->next;
                free(f->buf);
                free(f);
        }
        proto_reader_free(a->reader);
        agent_close_fd(&a->relay_fd);
        free(a);
}

void agent_set_resume(Agent *a, int (*fn)(const AgentRequest *r)) {
        a->resume = fn;
        a->vm_resume = fn;
}

void agent_set_mounts(Agent *a, int (*mount)(const char *name, const char *dest, bool read_only),
                      int (*unmount)(const char *dest)) {
        a->mount = mount;
        a->unmount = unmount;
}

void agent_set_checkpoint(Agent *a, int (*fn)(const AgentRequest *r)) {
        a->vm_resume = fn;
}

/* attached (taken): the list of the execs kept, in the HELLO that answers
 * an ATTACH; NULL at a start and after a resume. */
static void send_hello(Agent *a, json_t *attached) {
        struct utsname u;
        const char *kernel = uname(&u) == 0 ? u.release : "unknown";
        json_t *hello = json_pack("{s:i,s:i,s:s}", "version", PROTO_VERSION, "pid", (int)getpid(), "kernel",
                                  kernel);
        if (!hello)
                json_decref(attached);
        else if (attached &&
                 json_object_set_new(hello, "attached", json_pack("{s:o}", "processes", attached)) < 0)
                json_decref(TAKE_PTR(hello));
        agent_send_json_new(a, PROTO_HELLO, 0, hello);
}

static void set_nonblock(int fd) {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0)
                (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Poll slots: the channel (one or two), the signalfd, the relay, then three
 * per stream. */
#define MAX_POLL (4 + 3 * AGENT_MAX_STREAMS)

/* The memory watch (agent_set_memory_limit): where the sandbox's kernel
 * does not end a process that exhausts the sandbox's memory (gVisor's
 * Sentry is one host process: the host's OOM killer would end all of it),
 * the agent does, choosing as the kernel would: the largest resident set,
 * never itself. Still over the limit at the next look, soon after, it kills
 * that process's whole group: a fork bomb's thousands of small processes
 * outgrow one kill at a time. A victim's memory comes back a while after
 * its death (gVisor gives freed pages back from a goroutine of its own,
 * later with few CPUs: in a 1-vCPU sandbox a second look found the count
 * still over the limit and took an innocent process): so while the count is
 * not up since the kill by more than a sixteenth of the limit, the watch
 * waits for it, AGENT_MEMORY_RELEASE_MS at most. A bomb's count goes up. */
uint64_t agent_memory_look_ms(uint64_t free_bytes) {
        uint64_t ms = free_bytes / (AGENT_MEMORY_FILL_BYTES_PER_S / 1000);
        return ms < AGENT_MEMORY_POLL_MS ? AGENT_MEMORY_POLL_MS
               : ms > AGENT_MEMORY_IDLE_POLL_MS ? AGENT_MEMORY_IDLE_POLL_MS : ms;
}

static void memory_watch(Agent *a, uint64_t now) {
        if (!a->memory_limit || now < a->next_memory_ms)
                return;
        a->next_memory_ms = now + AGENT_MEMORY_POLL_MS;
        uint64_t used;
        if (limits_memory_used(&used) < 0)
                return;
        if (used < a->memory_limit) {
                a->memory_escalate = false;
                a->next_memory_ms = now + agent_memory_look_ms(a->memory_limit - used);
                return;
        }
        if (a->memory_escalate && now < a->memory_hold_ms &&
            used <= a->memory_at_kill + (a->memory_limit >> 4))
                return;
        pid_t pid, pgid;
        if (limits_largest_process(&pid, &pgid) < 0)
                return;
        bool group = a->memory_escalate && pgid > 1;
        if (kill(group ? -pgid : pid, SIGKILL) < 0)
                return;
        agent_log_msg("memory: %llu MiB in use of %llu: killed %s %d", (unsigned long long)(used >> 20),
                (unsigned long long)(a->memory_limit >> 20), group ? "process group" : "pid",
                group ? (int)pgid : (int)pid);
        if (group)
                doom_group(a, pgid);
        for (size_t i = 0; i < a->n_streams; i++)
                if (a->streams[i]->kind == STREAM_EXEC && a->streams[i]->pid == pgid)
                        a->streams[i]->oom_killed++;
        a->memory_escalate = true;
        a->memory_at_kill = used;
        a->memory_hold_ms = now + AGENT_MEMORY_RELEASE_MS;
        a->next_memory_ms = now + AGENT_MEMORY_SETTLE_MS;
}

void agent_set_memory_limit(Agent *a, uint64_t bytes) {
        a->memory_limit = bytes;
}

/* Best effort: the kernel caps both at its own maxima (wmem_max,
 * pipe-max-size) for a process without the capability to pass them. */
static void grow_channel_buffer(int fd) {
        int bytes = (int)CHANNEL_SEND_BYTES;
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes) < 0 && errno == ENOTSOCK)
                (void)fcntl(fd, F_SETPIPE_SZ, bytes);
}

/* Quiet after a checkpoint: the answer goes out, then only the channel is
 * read, until the host's next frame (the source carrying on, or a copy's
 * resume) ends it. */
static void quiet_wait(Agent *a) {
        bool same = a->in_fd == a->out_fd;
        short out_ev = a->out_head ? POLLOUT : 0;
        struct pollfd pfd[2] = { { .fd = a->in_fd, .events = (short)(POLLIN | (same ? out_ev : 0)) },
                                 { .fd = !same && out_ev ? a->out_fd : -1, .events = out_ev } };
        if (poll(pfd, 2, -1) < 0) {
                if (errno != EINTR) {
                        agent_log_msg("poll failed: %s", strerror(errno));
                        a->quit = true;
                        a->exit_status = 1;
                }
                return;
        }
        if (a->out_head && ((pfd[0].revents | pfd[1].revents) & POLLOUT))
                flush_out(a);
        if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR))
                read_channel(a);
        agent_sweep(a);
        if (a->out_head)
                flush_out(a);
}

/* In how many ms an exec stream has something due (its deadline, the end
 * of its drain), at most a minute; -1: nothing. Past the final drain with no
 * credit, the host's WINDOW wakes the loop, not a timer; so does it for the
 * RESULT of a process that ended while its output was held. */
static int exec_due_ms(const Stream *s, uint64_t now) {
        uint64_t due = 0;
        bool pipes_open = s->fds[PIPE_OUT] >= 0 || s->fds[PIPE_ERR] >= 0;
        if (!s->exited) {
                if (s->deadline_ms && !s->timed_out)
                        due = s->deadline_ms;
        } else if (pipes_open && !s->final_until_ms)
                due = s->drain_until_ms ? s->drain_until_ms : now;
        else if (pipes_open && s->final_until_ms > now)
                due = s->final_until_ms;
        if (s->pty_guard_until_ms && (!due || now + PTY_GUARD_EVERY_MS < due))
                due = now + PTY_GUARD_EVERY_MS;
        if (!due)
                return -1;
        return due > now ? (int)(due - now < 60000 ? due - now : 60000) : 0;
}

/* A stream's descriptor `which` is ready with `revents`. */
static void stream_ready(Agent *a, Stream *s, int which, short revents) {
        if (which == RELAY_SOCK && s->connecting) {
                forward_connected(a, s);
                return;
        }
        if (which == RELAY_SOCK) {
                if (revents & POLLOUT)
                        agent_relay_writable(a, s);
                if (!s->finished && (revents & (POLLIN | POLLHUP | POLLERR)))
                        agent_relay_readable(a, s);
                return;
        }
        if (s->kind == STREAM_WATCH) {
                watch_pump(a, s);
                return;
        }
        if (s->fds[which] < 0)
                return;
        if (which == PIPE_IN)
                agent_stdin_writable(a, s);
        else
                agent_pipe_readable(a, s, which);
}

/* The streams' descriptors into pfd from n on (owner and which say whose
 * each is) and the poll's timeout in *timeout: kept, or cut to the nearest
 * deadline, or 0 when a stream has bytes to move at once. The new n. */
static size_t poll_streams(Agent *a, uint64_t now, struct pollfd *pfd, Stream **owner, int *which, size_t n,
                           int *timeout) {
        bool room = a->out_bytes < AGENT_OUT_SOFT_LIMIT;
        for (size_t i = 0; i < a->n_streams; i++) {
                Stream *s = a->streams[i];
                bool produce = room && s->queued_out < AGENT_STREAM_QUEUE_LIMIT && s->credit > 0;
                if ((s->kind == STREAM_READ || s->hold == HOLD_REPLAY) && produce)
                        *timeout = 0;
                /* Detached, the pipes are read whatever the credit;
                 * listed or with held bytes to send, not at all. */
                if (s->hold != HOLD_NONE)
                        produce = s->hold == HOLD_DETACHED;
                if (s->kind == STREAM_RELAY || s->kind == STREAM_FORWARD) {
                        short ev = s->connecting ? POLLOUT
                                                 : (short)((produce && !s->sock_eof ? POLLIN : 0) |
                                                           (s->in_head ? POLLOUT : 0));
                        owner[n] = s;
                        which[n] = RELAY_SOCK;
                        pfd[n++] = (struct pollfd){.fd = ev ? s->sock : -1, .events = ev};
                        continue;
                }
                if (s->kind == STREAM_WATCH) {
                        bool go = produce && s->credit >= 2 * WATCH_MAX_LINE;
                        if (go && agent_watch_pending(s->watch))
                                *timeout = 0;
                        owner[n] = s;
                        which[n] = PIPE_OUT;
                        pfd[n++] = (struct pollfd){.fd = go ? agent_watch_fd(s->watch) : -1,
                                                   .events = POLLIN};
                        continue;
                }
                if (s->kind != STREAM_EXEC)
                        continue;
                for (int k = 0; k < 3; k++) {
                        int fd = s->fds[k];
                        short ev = k == PIPE_IN ? POLLOUT : POLLIN;
                        /* A negative fd is skipped by poll: a pipe we may not
                         * read now must not report POLLHUP in a busy loop. */
                        if (k == PIPE_IN ? !s->in_head : !produce)
                                fd = -1;
                        owner[n] = s;
                        which[n] = k;
                        pfd[n++] = (struct pollfd){.fd = fd, .events = ev};
                }
                int ms = exec_due_ms(s, now);
                if (ms >= 0 && (*timeout < 0 || ms < *timeout))
                        *timeout = ms;
        }
        if (a->memory_limit) {
                int ms = a->next_memory_ms > now ? (int)(a->next_memory_ms - now) : 0;
                if (*timeout < 0 || ms < *timeout)
                        *timeout = ms;
        }
        if (a->n_doomed) {
                int ms = a->next_rekill_ms > now ? (int)(a->next_rekill_ms - now) : 0;
                if (*timeout < 0 || ms < *timeout)
                        *timeout = ms;
        }
        return n;
}

int agent_run(Agent *a) {
        set_nonblock(a->in_fd);
        set_nonblock(a->out_fd);
        grow_channel_buffer(a->out_fd);
        send_hello(a, NULL);
        struct pollfd pfd[MAX_POLL];
        Stream *owner[MAX_POLL];
        int which[MAX_POLL];

        /* Passes made since frames were queued: see batch below. stalled:
         * the last write left frames queued (the channel is full), so the
         * next poll waits for its room instead of looking again at once. */
        unsigned passes = 0;
        bool stalled = false;
        while (!a->quit) {
                if (a->quiet) {
                        quiet_wait(a);
                        continue;
                }
                uint64_t now = time_now_mono_ms();
                int timeout = -1;
                size_t n = 0;
                bool same = a->in_fd == a->out_fd;
                /* With frames queued, a look first at what is ready already
                 * (poll without waiting, the channel's room not asked): an
                 * exec's child that ended while its start was handled has
                 * its end and RESULT go out in the write of its start, and
                 * the host is woken once, not twice. At most AGENT_BATCH_PASSES
                 * looks, each bounded by the queue's limits, then the write. */
                bool batch = a->out_head && !stalled && passes < AGENT_BATCH_PASSES;
                short in_ev = a->out_bytes < AGENT_OUT_HARD_LIMIT ? POLLIN : 0;
                short out_ev = a->out_head && !batch ? POLLOUT : 0;
                pfd[n++] = (struct pollfd){.fd = a->in_fd, .events = (short)(in_ev | (same ? out_ev : 0))};
                if (!same)
                        pfd[n++] = (struct pollfd){.fd = a->out_head ? a->out_fd : -1, .events = out_ev};
                pfd[n++] = (struct pollfd){.fd = a->sig_fd, .events = POLLIN};
                size_t relay_slot = n;
                pfd[n++] = (struct pollfd){.fd = a->n_streams < AGENT_MAX_STREAMS ? a->relay_fd : -1,
                                           .events = POLLIN};
                size_t first_stream = n;
                n = poll_streams(a, now, pfd, owner, which, n, &timeout);
                int k = poll(pfd, n, batch ? 0 : timeout);
                if (k < 0 && errno != EINTR) {
                        agent_log_msg("poll failed: %s", strerror(errno));
                        a->exit_status = 1;
                        break;
                }
                if (batch && k == 0) {
                        /* Nothing more is ready: what is queued goes now. */
                        passes = 0;
                        flush_out(a);
                        stalled = a->out_head != NULL;
                        continue;
                }
                if (k > 0) {
                        size_t sig_slot = same ? 1 : 2;
                        if (pfd[sig_slot].revents)
                                agent_read_signals(a);
                        if (pfd[relay_slot].revents & POLLIN)
                                agent_relay_accept(a);
                        for (size_t i = first_stream; i < n; i++) {
                                if (pfd[i].revents && !owner[i]->finished)
                                        stream_ready(a, owner[i], which[i], pfd[i].revents);
                        }
                        if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR))
                                read_channel(a);
                }
                if (a->quiet) {
                        /* Nothing may follow the checkpoint's answer. */
                        agent_sweep(a);
                        if (a->out_head)
                                flush_out(a);
                        continue;
                }
                now = time_now_mono_ms();
                memory_watch(a, now);
                rekill_groups(a, now);
                for (size_t i = 0; i < a->n_streams && !a->quit; i++) {
                        Stream *s = a->streams[i];
                        if (s->finished)
                                continue;
                        if (s->kind == STREAM_EXEC) {
                                if (s->hold == HOLD_REPLAY)
                                        agent_hold_pump(a, s);
                                agent_exec_check(a, s, now);
                        } else if (s->kind == STREAM_FORWARD)
                                forward_check(a, s);
                        else if (s->kind == STREAM_READ && a->out_bytes < AGENT_OUT_SOFT_LIMIT &&
                                 s->queued_out < AGENT_STREAM_QUEUE_LIMIT)
                                agent_read_pump(a, s);
                        else if (s->kind == STREAM_WATCH && agent_watch_pending(s->watch) &&
                                 a->out_bytes < AGENT_OUT_SOFT_LIMIT && s->queued_out < AGENT_STREAM_QUEUE_LIMIT)
                                watch_pump(a, s);
                }
                agent_sweep(a);
                if (a->out_head && k > 0 && !stalled && passes < AGENT_BATCH_PASSES) {
                        passes++;
                        continue;
                }
                passes = 0;
                if (a->out_head)
                        flush_out(a);
                stalled = a->out_head != NULL;
        }

        for (size_t i = 0; i < a->n_streams; i++) {
                Stream *s = a->streams[i];
                if (s->kind == STREAM_EXEC)
                        agent_exec_kill(a, s);
        }
        return a->exit_status;
}
