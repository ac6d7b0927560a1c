/*
 * The agent's streams on their descriptors: a child's pipes read into DATA
 * frames and its stdin written from the host's, its end reaped and
 * reported, and the egress relay's connections (127.0.0.1:3128 inside) each
 * a stream to the host's proxy.
 */
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
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/timeutil.h"

/* ---- children ---- */

static void reap(Agent *a) {
        for (;;) {
                int status;
                pid_t pid = waitpid(-1, &status, WNOHANG);
                if (pid <= 0)
                        return;
                for (size_t i = 0; i < a->n_streams; i++) {
                        Stream *s = a->streams[i];
                        if (s->kind == STREAM_EXEC && s->pid == pid && !s->exited) {
                                s->exited = true;
                                s->status = status;
                                s->end_ms = time_now_mono_ms();
                                break;
                        }
                }
                /* Anything else is an orphan re-parented to us: reaped, forgotten. */
        }
}

void agent_read_signals(Agent *a) {
        struct signalfd_siginfo si;
        while (read(a->sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (si.ssi_signo == SIGCHLD)
                        reap(a);
                else if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
                        agent_log_msg("signal %u: stopping", si.ssi_signo);
                        a->quit = true;
                        a->exit_status = 0;
                }
        }
        /* SIGCHLDs coalesce; a reap pass costs one syscall. */
        reap(a);
}

/* Reads up to `want` bytes from fd straight into a new DATA frame's buffer
 * (no copy between the read and the channel) and queues it. The bytes read,
 * or what read() said (0, -1 with errno). */
static ssize_t read_into_frame(Agent *a, Stream *s, int fd, uint8_t flags, size_t want) {
        OutFrame *f = calloc(1, sizeof(OutFrame));
        uint8_t *buf = malloc(PROTO_HEADER_SIZE + want);
        if (!f || !buf) {
                free(f);
                free(buf);
                agent_fatal(a, "cannot queue a frame");
                errno = ENOMEM;
                return -1;
        }
        ssize_t n = read(fd, buf + PROTO_HEADER_SIZE, want);
        if (n <= 0) {
                int k = errno;
                free(f);
                free(buf);
                errno = k;
                return n;
        }
        ProtoHeader h = {.length = (uint32_t)n, .stream = s->id, .type = PROTO_DATA, .flags = flags};
        (void)proto_header_encode(&h, buf);
        /* A short read keeps only what it used: the queue's bounds count
         * frame bytes, and so must its memory. */
        if ((size_t)n < want / 2) {
                uint8_t *small = realloc(buf, PROTO_HEADER_SIZE + (size_t)n);
                if (small)
                        buf = small;
        }
        f->buf = buf;
        f->len = PROTO_HEADER_SIZE + (size_t)n;
        agent_queue_frame(a, f, PROTO_DATA, s->id);
        s->credit -= (uint64_t)n;
        s->out_sent += (uint64_t)n;
        return n;
}

void agent_pipe_readable(Agent *a, Stream *s, int which) {
        ssize_t n;
        if (s->hold == HOLD_DETACHED)
                /* No host to wait for: the pipe is read whatever the credit,
                 * so that the process never blocks on its output. */
                n = agent_hold_read(a, s, which);
        else {
                /* A whole largest frame per read: what a big pipe holds goes
                 * out in few frames, few writes and few wakeups of the host. */
                size_t want = BIG_CHUNK;
                if (s->credit < want)
                        want = (size_t)s->credit;
                if (want == 0)
                        return;
                n = read_into_frame(a, s, s->fds[which], (uint8_t)which, want);
        }
        if (n > 0 || a->quit)
                return;
        if (n < 0 && (errno == EINTR || (errno == EAGAIN && !s->final_until_ms)))
                return;
        /* EOF, an error, or nothing left once the group is dead. */
        agent_pipe_ended(a, s, which);
}

/* A child's pipe `which` is done: its EOF goes out, or waits for the bytes
 * held before it. */
void agent_pipe_ended(Agent *a, Stream *s, int which) {
        agent_close_fd(&s->fds[which]);
        if (s->hold != HOLD_NONE)
                s->held_eof |= (uint8_t)(1u << which);
        else
                agent_send_frame(a, PROTO_EOF, (uint8_t)which, s->id, NULL, 0);
        /* A child closes its pipes as it exits: reaped now, its RESULT
         * leaves with these EOFs instead of after another turn of the loop
         * for the SIGCHLD. */
        if (!s->exited && s->fds[PIPE_OUT] < 0 && s->fds[PIPE_ERR] < 0)
                reap(a);
}

/* ---- a terminal's size ---- */

/*
 * Readline, as it takes the terminal for each prompt, reads the window size
 * and writes the same size back (rltty.c, set_winsize). A resize from the
 * host that lands between the two is undone: the shell's next command sees
 * the old size, and no later SIGWINCH says otherwise. gVisor's slower system
 * calls make that window wide enough to hit under load. For a while after a
 * resize the agent puts the host's size back when the terminal has the one
 * from before it again, checked before each write of the host's keys (which
 * the shell reads once readline has written the size back) and every few ms.
 * A program that sets the size itself is left alone unless it picks that
 * very size within the guard's second.
 */
void agent_pty_resize(Stream *s, unsigned cols, unsigned rows) {
        int fd = s->fds[PIPE_OUT];
        struct winsize was;
        bool known = ioctl(fd, TIOCGWINSZ, &was) == 0;
        if (exec_pty_resize(fd, cols, rows) < 0)
                return;
        s->pty_cols = (unsigned short)cols;
        s->pty_rows = (unsigned short)rows;
        s->pty_guard_until_ms = 0;
        if (known && (was.ws_col != s->pty_cols || was.ws_row != s->pty_rows)) {
                s->pty_was_cols = was.ws_col;
                s->pty_was_rows = was.ws_row;
                s->pty_guard_until_ms = time_now_mono_ms() + PTY_GUARD_MS;
        }
}

void agent_pty_guard(Stream *s, uint64_t now) {
        if (!s->pty_guard_until_ms || s->fds[PIPE_OUT] < 0)
                return;
        if (now >= s->pty_guard_until_ms) {
                s->pty_guard_until_ms = 0;
                return;
        }
        struct winsize w;
        if (ioctl(s->fds[PIPE_OUT], TIOCGWINSZ, &w) == 0 && w.ws_col == s->pty_was_cols &&
            w.ws_row == s->pty_was_rows)
                (void)exec_pty_resize(s->fds[PIPE_OUT], s->pty_cols, s->pty_rows);
}

/* ---- a child's stdin ---- */

void agent_stdin_writable(Agent *a, Stream *s) {
        if (s->pty)
                agent_pty_guard(s, time_now_mono_ms());
        while (s->in_head) {
                Chunk *c = s->in_head;
                ssize_t n = write(s->fds[PIPE_IN], c->data + c->off, c->len - c->off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                break;
                        /* EPIPE: the child closed its stdin; the rest is dropped
                         * but credited, so the host is not left waiting. */
                        agent_drop_stdin(a, s);
                        return;
                }
                c->off += (size_t)n;
                agent_consumed(a, s, (size_t)n, false);
                if (c->off == c->len) {
                        s->in_head = c->next;
                        if (!s->in_head)
                                s->in_tail = NULL;
                        free(c);
                }
        }
        if (!s->in_head) {
                agent_send_window(a, s, true);
                if (s->in_eof)
                        agent_close_fd(&s->fds[PIPE_IN]);
        }
}

void agent_exec_check(Agent *a, Stream *s, uint64_t now) {
        if (s->pty)
                agent_pty_guard(s, now);
        if (!s->exited) {
                if (s->deadline_ms && now >= s->deadline_ms && !s->timed_out) {
                        s->timed_out = true;
                        agent_exec_kill(a, s);
                }
                return;
        }
        bool pipes_open = s->fds[PIPE_OUT] >= 0 || s->fds[PIPE_ERR] >= 0;
        if (pipes_open) {
                if (!s->drain_until_ms)
                        s->drain_until_ms = s->end_ms + AGENT_DRAIN_MS;
                if (now >= s->drain_until_ms && !s->final_until_ms) {
                        agent_exec_kill(a, s);
                        s->final_until_ms = now + FINAL_DRAIN_MS;
                }
                /* Past the last drain, an escaped writer is cut off; a host
                 * that has not taken the output yet is waited for (none is
                 * while detached: the pipes were read all along; after an
                 * attach, not before the held bytes are out). */
                if (s->final_until_ms && now >= s->final_until_ms &&
                    (s->hold == HOLD_DETACHED || (s->hold == HOLD_NONE && s->credit > 0))) {
                        for (int i = PIPE_OUT; i <= PIPE_ERR; i++)
                                if (s->fds[i] >= 0)
                                        agent_pipe_ended(a, s, i);
                        pipes_open = false;
                }
                if (pipes_open)
                        return;
        }
        /* Its end waits for the host's attach and for the output held
         * before it: reported then as it would have been now. */
        if (s->hold != HOLD_NONE)
                return;
        agent_drop_stdin(a, s);
        int code, sig = 0;
        if (WIFSIGNALED(s->status)) {
                sig = WTERMSIG(s->status);
                code = 128 + sig;
        } else
                code = WEXITSTATUS(s->status);
        unsigned oom = s->oom_killed;
        if (!oom && limits_was_oom_kill(s->status, s->timed_out, s->oom_kills_before))
                oom = 1;
        /* Its files written to the sandbox's disk before the host hears of
         * its end, so a snapshot the host takes next needs no sync (which
         * would cost a process started in the sandbox). The root's
         * filesystem alone (the disk a snapshot copies): a sync() would
         * also flush every other filesystem of a namespace sandbox's host. */
        if (s->sync_after) {
                int root = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (root < 0 || syncfs(root) < 0)
                        sync();
                if (root >= 0)
                        close(root);
        }
        json_t *res = json_pack("{s:i,s:o,s:b,s:i,s:I}", "exitCode", code, "signal",
                                sig ? json_integer(sig) : json_null(), "timedOut", s->timed_out, "outOfMemory",
                                (int)oom, "durationMs", (json_int_t)(s->end_ms - s->start_ms));
        agent_send_json_new(a, PROTO_RESULT, s->id, res);
        s->finished = true;
}

void agent_read_pump(Agent *a, Stream *s) {
        size_t want = BIG_CHUNK;
        if (s->credit < want)
                want = (size_t)s->credit;
        if (want == 0)
                return;
        static uint8_t buf[BIG_CHUNK];
        ssize_t n = read(s->file_fd, buf, want);
        if (n < 0) {
                if (errno == EINTR || errno == EAGAIN)
                        return;
                int k = -errno;
                agent_close_fd(&s->file_fd);
                agent_finish_error(a, s, fsops_error_code(k), strerror(-k));
                return;
        }
        if (n == 0) {
                agent_close_fd(&s->file_fd);
                agent_send_frame(a, PROTO_EOF, PROTO_FD_OUT, s->id, NULL, 0);
                agent_send_json_new(a, PROTO_RESULT, s->id, json_pack("{s:I}", "size", (json_int_t)s->sent));
                s->finished = true;
                return;
        }
        agent_send_frame(a, PROTO_DATA, PROTO_FD_OUT, s->id, buf, (size_t)n);
        s->credit -= (uint64_t)n;
        s->sent += (uint64_t)n;
}

void agent_sweep(Agent *a) {
        size_t j = 0;
        for (size_t i = 0; i < a->n_streams; i++) {
                Stream *s = a->streams[i];
                if (s->finished) {
                        agent_hold_release(a, s);
                        a->list_bytes -= s->list_cost;
                        agent_stream_free(s);
                } else
                        a->streams[j++] = a->streams[i];
        }
        a->n_streams = j;
}

/* ---- the egress relay ---- */

/* A program in the sandbox connected to the relay: the connection becomes a
 * stream of ours, and the proxy in the daemon decides what it may reach. */
void agent_relay_accept(Agent *a) {
        int c = accept4(a->relay_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0)
                return;
        /* What arrives from the proxy is written as it comes, often a TLS
         * record at a time: Nagle would hold the second small write for the
         * client's delayed ACK, 40 ms a round trip. */
        int one = 1;
        (void)setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        /* Detached, no proxy would answer: the program sees its connection
         * end at once, not hang until a daemon comes back. */
        if (a->n_streams >= AGENT_MAX_STREAMS || a->detached) {
                close(c);
                return;
        }
        Stream *s = calloc(1, sizeof(Stream));
        if (!s) {
                close(c);
                return;
        }
        s->fds[0] = s->fds[1] = s->fds[2] = -1;
        s->file_fd = -1;
        s->sock = c;
        s->kind = STREAM_RELAY;
        s->credit = PROTO_INITIAL_WINDOW;
        do {
                s->id = a->next_even;
                a->next_even += 2;
                if (a->next_even == 0)
                        a->next_even = 2;
        } while (agent_stream_find(a, s->id));
        a->streams[a->n_streams++] = s;
        agent_send_json_new(a, PROTO_OPEN, s->id, json_pack("{s:s}", "op", "connect"));
}

void agent_relay_readable(Agent *a, Stream *s) {
        size_t want = BIG_CHUNK < s->credit ? BIG_CHUNK : (size_t)s->credit;
        if (want == 0 || s->sock_eof)
                return;
        uint8_t fd = s->kind == STREAM_RELAY ? PROTO_FD_IN : PROTO_FD_OUT;
        ssize_t n = read_into_frame(a, s, s->sock, fd, want);
        if (n > 0 || a->quit)
                return;
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
                return;
        s->sock_eof = true;
        agent_send_frame(a, PROTO_EOF, fd, s->id, NULL, 0);
        if (n < 0 && s->kind == STREAM_FORWARD) {
                /* Reset by the program: nothing more goes either way. */
                agent_drop_stdin(a, s);
                s->wr_shut = true;
                return;
        }
        if (n < 0) {
                /* The client is gone: nothing more can be written to it either. */
                agent_send_frame(a, PROTO_CANCEL, 0, s->id, NULL, 0);
                s->finished = true;
        }
}

void agent_relay_writable(Agent *a, Stream *s) {
        while (s->in_head) {
                Chunk *c = s->in_head;
                ssize_t n = write(s->sock, c->data + c->off, c->len - c->off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                return;
                        if (s->kind == STREAM_FORWARD) {
                                /* The program closed its side: the rest is
                                 * dropped but credited, the host told by the
                                 * end of the stream. */
                                agent_drop_stdin(a, s);
                                s->wr_shut = true;
                                return;
                        }
                        /* The client went away: tell the proxy, forget the stream. */
                        agent_send_frame(a, PROTO_CANCEL, 0, s->id, NULL, 0);
                        s->finished = true;
                        return;
                }
                c->off += (size_t)n;
                agent_consumed(a, s, (size_t)n, false);
                if (c->off == c->len) {
                        s->in_head = c->next;
                        if (!s->in_head)
                                s->in_tail = NULL;
                        free(c);
                }
        }
        agent_send_window(a, s, true);
        if (s->in_eof)
                agent_relay_shut_write(s);
        if (s->host_done)
                s->finished = true;
}

int agent_relay_listen(Agent *a, uint16_t port) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 128) < 0) {
                int e = -errno;
                close(fd);
                return e;
        }
        agent_close_fd(&a->relay_fd);
        a->relay_fd = fd;
        return 0;
}
