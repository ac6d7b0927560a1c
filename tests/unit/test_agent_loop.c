/* The agent's event loop end to end over a socketpair, as the host sees it:
 * an exec's frames (start, output, both EOFs, RESULT) in order, a file
 * written within the flow-control window and read back whole, and the loop
 * ending when the host closes the channel. Then a daemon's restart as the
 * sandbox's supervisor makes the agent live it: DETACH, the output held in
 * between (bounded, newest kept), ATTACH and its HELLO, and the held bytes
 * once the new host's WINDOW came. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/agent.h"
#include "proto/proto.h"

typedef struct Host {
        int fd;
        int sig_fd;
        Agent *agent;
        pthread_t thread;
        int status;
        ProtoReader *reader;
        char dir[64];
        uint16_t relay_port; /* 0: no egress relay */
        bool joined;         /* agent_run returned before the teardown */
} Host;

static void *agent_main(void *arg) {
        Host *h = arg;
        h->status = agent_run(h->agent);
        return NULL;
}

/* The next frame from the agent within timeout_ms, copied into out
 * (NUL-terminated): true, or false when none came. */
static bool frame_within(Host *h, ProtoHeader *hdr, uint8_t *out, size_t cap, int timeout_ms) {
        for (;;) {
                const uint8_t *p;
                int k = proto_reader_next(h->reader, hdr, &p);
                assert_true(k >= 0);
                if (k == 1) {
                        assert_true(hdr->length < cap);
                        memcpy(out, p, hdr->length);
                        out[hdr->length] = 0;
                        return true;
                }
                struct pollfd pfd = {.fd = h->fd, .events = POLLIN};
                int r = poll(&pfd, 1, timeout_ms);
                assert_true(r >= 0);
                if (r == 0)
                        return false;
                static uint8_t buf[1 << 16];
                ssize_t n = read(h->fd, buf, sizeof buf);
                assert_true(n > 0);
                assert_int_equal(proto_reader_feed(h->reader, buf, (size_t)n), 0);
        }
}

/* Next frame from the agent; fails the test after 10 s. */
static void next_frame(Host *h, ProtoHeader *hdr, uint8_t *out, size_t cap) {
        assert_true(frame_within(h, hdr, out, cap, 10000));
}

static int start(void **state, bool relay) {
        Host *h = calloc(1, sizeof *h);
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGCHLD);
        assert_int_equal(pthread_sigmask(SIG_BLOCK, &mask, NULL), 0);
        h->sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        assert_true(h->sig_fd >= 0);
        h->fd = sv[0];
        h->agent = agent_new(sv[1], sv[1], h->sig_fd);
        assert_non_null(h->agent);
        /* The relay on a free port of the test machine's loopback. */
        for (uint16_t port = (uint16_t)(20000 + getpid() % 20000); relay && !h->relay_port; port++)
                if (agent_relay_listen(h->agent, port) == 0)
                        h->relay_port = port;
        h->reader = proto_reader_new();
        snprintf(h->dir, sizeof h->dir, "/tmp/agent-loop-XXXXXX");
        assert_non_null(mkdtemp(h->dir));
        assert_int_equal(pthread_create(&h->thread, NULL, agent_main, h), 0);
        ProtoHeader hdr;
        uint8_t buf[4096];
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.type, PROTO_HELLO);
        *state = h;
        return 0;
}

static int setup(void **state) {
        return start(state, false);
}

static int setup_relay(void **state) {
        return start(state, true);
}

static int teardown(void **state) {
        Host *h = *state;
        /* The host going away ends the loop. */
        shutdown(h->fd, SHUT_RDWR);
        if (!h->joined) {
                pthread_join(h->thread, NULL);
                assert_int_equal(h->status, 0);
        }
        close(h->fd);
        agent_free(h->agent);
        proto_reader_free(h->reader);
        close(h->sig_fd);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", h->dir);
        assert_int_equal(system(cmd), 0);
        free(h);
        return 0;
}

static void send_json(Host *h, uint8_t type, uint32_t stream, const char *json) {
        assert_int_equal(proto_write_frame(h->fd, type, 0, stream, json, strlen(json)), 0);
}

static void test_exec_frames_in_order(void **state) {
        Host *h = *state;
        send_json(h, PROTO_OPEN, 1,
                  "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"printf hi; printf err >&2; exit 3\"],"
                  "\"cwd\":\"/\",\"env\":{},\"timeoutMs\":0,\"stdin\":false}");
        ProtoHeader hdr;
        static uint8_t buf[1 << 16];
        char out[64] = "", err[64] = "";
        bool eof[3] = {false, false, false}, started = false;
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                assert_int_equal(hdr.stream, 1);
                if (hdr.type == PROTO_EVENT) {
                        assert_false(started);
                        assert_non_null(strstr((char *)buf, "\"start\""));
                        started = true;
                } else if (hdr.type == PROTO_DATA) {
                        assert_true(started);
                        assert_false(eof[hdr.flags]);
                        char *dst = hdr.flags == PROTO_FD_OUT ? out : err;
                        size_t have = strlen(dst);
                        assert_true(have + hdr.length < sizeof out);
                        memcpy(dst + have, buf, hdr.length + 1);
                } else if (hdr.type == PROTO_EOF) {
                        eof[hdr.flags] = true;
                } else {
                        assert_int_equal(hdr.type, PROTO_RESULT);
                        break;
                }
        }
        /* Both pipes end before the RESULT, which is the stream's last word. */
        assert_true(eof[PROTO_FD_OUT] && eof[PROTO_FD_ERR]);
        assert_string_equal(out, "hi");
        assert_string_equal(err, "err");
        json_t *j = json_loads((char *)buf, 0, NULL);
        assert_non_null(j);
        assert_int_equal(json_integer_value(json_object_get(j, "exitCode")), 3);
        json_decref(j);
}

static void test_many_execs(void **state) {
        Host *h = *state;
        /* Back to back, as a client running `true` in a loop does. */
        for (uint32_t id = 3; id < 3 + 2 * 50; id += 2) {
                send_json(h, PROTO_OPEN, id,
                          "{\"op\":\"exec\",\"argv\":[\"true\"],\"cwd\":\"/\",\"env\":{},\"timeoutMs\":0,"
                          "\"stdin\":false}");
                ProtoHeader hdr;
                uint8_t buf[4096];
                do {
                        next_frame(h, &hdr, buf, sizeof buf);
                        assert_int_equal(hdr.stream, id);
                } while (hdr.type != PROTO_RESULT);
                assert_non_null(strstr((char *)buf, "\"exitCode\":0"));
        }
}

/* A signal op reaches a running exec's group; one for a stream that is not a
 * running exec is not_found. */
static void test_signal_running_exec(void **state) {
        Host *h = *state;
        send_json(h, PROTO_OPEN, 1,
                  "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"sleep 30\"],\"cwd\":\"/\",\"timeoutMs\":0}");
        ProtoHeader hdr;
        static uint8_t buf[4096];
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.type, PROTO_EVENT);
        send_json(h, PROTO_OPEN, 3, "{\"op\":\"signal\",\"stream\":5,\"signal\":15}");
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.stream, 3);
        assert_int_equal(hdr.type, PROTO_RESULT);
        assert_non_null(strstr((char *)buf, "not_found"));
        send_json(h, PROTO_OPEN, 5, "{\"op\":\"signal\",\"stream\":1,\"signal\":15}");
        bool answered = false;
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                if (hdr.stream == 5) {
                        assert_int_equal(hdr.type, PROTO_RESULT);
                        assert_string_equal((char *)buf, "{}");
                        answered = true;
                } else if (hdr.stream == 1 && hdr.type == PROTO_RESULT)
                        break;
        }
        assert_true(answered);
        json_t *j = json_loads((char *)buf, 0, NULL);
        assert_int_equal(json_integer_value(json_object_get(j, "exitCode")), 128 + SIGTERM);
        json_decref(j);
}

/* uid and gid: the child runs as that user, with no supplementary groups. */
static void test_exec_as_user(void **state) {
        Host *h = *state;
        if (geteuid() != 0)
                skip();
        send_json(h, PROTO_OPEN, 1,
                  "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"echo $(id -u):$(id -g):$(id -G)\"],"
                  "\"cwd\":\"/\",\"uid\":1234,\"gid\":4321}");
        ProtoHeader hdr;
        static uint8_t buf[4096];
        char out[128] = "";
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                if (hdr.type == PROTO_DATA && hdr.flags == PROTO_FD_OUT && strlen(out) + hdr.length < sizeof out)
                        strcat(out, (char *)buf);
                if (hdr.type == PROTO_RESULT)
                        break;
        }
        assert_string_equal(out, "1234:4321:4321\n");
}

/* One exec to its result: the exit code, and what it wrote to stderr. */
static int exec_stderr(Host *h, uint32_t id, const char *open_json, char *err, size_t cap) {
        send_json(h, PROTO_OPEN, id, open_json);
        ProtoHeader hdr;
        static uint8_t buf[4096];
        err[0] = 0;
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                assert_int_equal(hdr.stream, id);
                if (hdr.type == PROTO_DATA && hdr.flags == PROTO_FD_ERR && strlen(err) + hdr.length < cap)
                        strcat(err, (char *)buf);
                if (hdr.type == PROTO_RESULT)
                        break;
        }
        json_t *j = json_loads((char *)buf, 0, NULL);
        assert_non_null(j);
        int code = (int)json_integer_value(json_object_get(j, "exitCode"));
        json_decref(j);
        return code;
}

/* A child that cannot start says why and exits as a shell would, while the
 * agent (whose memory it ran on until then) goes on: a missing program,
 * a missing directory, a directory as the program. */
static void test_exec_that_cannot_start(void **state) {
        Host *h = *state;
        char err[1024];
        assert_int_equal(exec_stderr(h, 1, "{\"op\":\"exec\",\"argv\":[\"no-such-program-here\"],\"cwd\":\"/\"}",
                                     err, sizeof err),
                         127);
        assert_non_null(strstr(err, "no-such-program-here"));
        assert_int_equal(exec_stderr(h, 3, "{\"op\":\"exec\",\"argv\":[\"true\"],\"cwd\":\"/no/such/dir\"}", err,
                                     sizeof err),
                         127);
        assert_non_null(strstr(err, "cd: /no/such/dir"));
        assert_int_equal(exec_stderr(h, 5, "{\"op\":\"exec\",\"argv\":[\"/tmp\"],\"cwd\":\"/\"}", err, sizeof err),
                         126);
        assert_int_equal(exec_stderr(h, 7,
                                     "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"echo ok >&2; exit 7\"],"
                                     "\"cwd\":\"/\"}",
                                     err, sizeof err),
                         7);
        assert_string_equal(err, "ok\n");
}

static void test_file_round_trip_within_window(void **state) {
        Host *h = *state;
        const size_t size = 3 * 1024 * 1024 + 12345;
        uint8_t *data = malloc(size);
        for (size_t i = 0; i < size; i++)
                data[i] = (uint8_t)(i * 7 + (i >> 11));
        char req[256];
        snprintf(req, sizeof req, "{\"op\":\"write\",\"path\":\"%s/sub/f.bin\",\"mode\":420,\"mkdirs\":true}", h->dir);
        send_json(h, PROTO_OPEN, 201, req);
        size_t sent = 0;
        uint64_t credit = PROTO_INITIAL_WINDOW;
        ProtoHeader hdr;
        static uint8_t buf[PROTO_MAX_PAYLOAD + 1];
        while (sent < size) {
                while (credit == 0) {
                        next_frame(h, &hdr, buf, sizeof buf);
                        assert_int_equal(hdr.stream, 201);
                        assert_int_equal(hdr.type, PROTO_WINDOW);
                        credit += proto_get_u32(buf);
                }
                size_t n = size - sent;
                if (n > credit)
                        n = (size_t)credit;
                if (n > 200000)
                        n = 200000;
                assert_int_equal(proto_write_frame(h->fd, PROTO_DATA, PROTO_FD_IN, 201, data + sent, n), 0);
                sent += n;
                credit -= n;
        }
        assert_int_equal(proto_write_frame(h->fd, PROTO_EOF, PROTO_FD_IN, 201, NULL, 0), 0);
        do {
                next_frame(h, &hdr, buf, sizeof buf);
                assert_int_equal(hdr.stream, 201);
        } while (hdr.type == PROTO_WINDOW);
        assert_int_equal(hdr.type, PROTO_RESULT);
        char want[64];
        snprintf(want, sizeof want, "\"size\":%zu", size);
        assert_non_null(strstr((char *)buf, want));

        snprintf(req, sizeof req, "{\"op\":\"read\",\"path\":\"%s/sub/f.bin\"}", h->dir);
        send_json(h, PROTO_OPEN, 203, req);
        size_t got = 0, unacked = 0;
        bool eof = false;
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                assert_int_equal(hdr.stream, 203);
                if (hdr.type == PROTO_EVENT)
                        continue;
                if (hdr.type == PROTO_RESULT)
                        break;
                if (hdr.type == PROTO_EOF) {
                        eof = true;
                        continue;
                }
                assert_int_equal(hdr.type, PROTO_DATA);
                assert_true(hdr.length <= PROTO_MAX_PAYLOAD);
                assert_true(got + hdr.length <= size);
                assert_memory_equal(buf, data + got, hdr.length);
                got += hdr.length;
                unacked += hdr.length;
                /* The agent never runs past its credit. */
                assert_true(unacked <= PROTO_INITIAL_WINDOW);
                if (unacked >= 256 * 1024) {
                        uint8_t w[4];
                        proto_put_u32(w, (uint32_t)unacked);
                        assert_int_equal(proto_write_frame(h->fd, PROTO_WINDOW, 0, 203, w, 4), 0);
                        unacked = 0;
                }
        }
        assert_true(eof);
        assert_int_equal(got, size);
        free(data);
}

/* ---- a daemon's restart: detach and attach ---- */

typedef struct Bytes {
        uint8_t *p;
        size_t len, cap;
} Bytes;

static void bytes_add(Bytes *b, const void *p, size_t n) {
        if (b->len + n > b->cap) {
                b->cap = (b->len + n) * 2;
                b->p = realloc(b->p, b->cap);
                assert_non_null(b->p);
        }
        memcpy(b->p + b->len, p, n);
        b->len += n;
}

static void send_frame(Host *h, uint8_t type, uint8_t flags, uint32_t stream, const void *p, size_t n) {
        assert_int_equal(proto_write_frame(h->fd, type, flags, stream, p, n), 0);
}

static void send_window(Host *h, uint32_t stream, uint32_t credit) {
        uint8_t w[4];
        proto_put_u32(w, credit);
        send_frame(h, PROTO_WINDOW, 0, stream, w, 4);
}

static void sleep_ms(long ms) {
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
}

static void touch(const Host *h, const char *name) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", h->dir, name);
        int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        close(fd);
}

static bool exists(const Host *h, const char *name) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", h->dir, name);
        return access(path, F_OK) == 0;
}

/* The number a command last wrote to the file `name`, -1 while there is none. */
static long file_number(const Host *h, const char *name) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", h->dir, name);
        FILE *f = fopen(path, "r");
        if (!f)
                return -1;
        long v;
        if (fscanf(f, "%ld", &v) != 1)
                v = -1;
        fclose(f);
        return v;
}

/* Polls (10 s at most) until the command's counter reached min. */
static void wait_number(const Host *h, const char *name, long min) {
        for (int i = 0; i < 1000 && file_number(h, name) < min; i++)
                sleep_ms(10);
        assert_true(file_number(h, name) >= min);
}

static void wait_file(const Host *h, const char *name) {
        for (int i = 0; i < 1000 && !exists(h, name); i++)
                sleep_ms(10);
        assert_true(exists(h, name));
}

/* The complete lines of b, each the next number from 0 (checked): their count. */
static long lines_in_order(const Bytes *b) {
        long n = 0;
        size_t start = 0;
        for (size_t i = 0; i < b->len; i++) {
                if (b->p[i] != '\n')
                        continue;
                char line[32];
                size_t len = i - start;
                assert_true(len > 0 && len < sizeof line);
                memcpy(line, b->p + start, len);
                line[len] = 0;
                assert_int_equal(strtol(line, NULL, 10), n);
                n++;
                start = i + 1;
        }
        return n;
}

/* A PING and its PONG: every frame the agent queued before it has come,
 * none of them on `stream`, and none an OPEN. */
static void expect_silence(Host *h, uint32_t stream) {
        send_frame(h, PROTO_PING, 0, 0, "sync", 4);
        ProtoHeader hdr;
        static uint8_t buf[PROTO_MAX_PAYLOAD + 1];
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                if (hdr.type == PROTO_PONG)
                        return;
                assert_int_not_equal(hdr.stream, stream);
                assert_int_not_equal(hdr.type, PROTO_OPEN);
        }
}

/* Sends ATTACH and reads up to its HELLO. DATA on `stream` before it (queued
 * before the detach) is added to out; nothing else may come on that stream
 * but the credit for its stdin. */
static json_t *attach(Host *h, uint32_t stream, Bytes *out) {
        send_json(h, PROTO_ATTACH, 0, "{}");
        ProtoHeader hdr;
        static uint8_t buf[PROTO_MAX_PAYLOAD + 1];
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                if (hdr.type == PROTO_HELLO)
                        break;
                if (hdr.stream != stream || hdr.type == PROTO_WINDOW)
                        continue;
                assert_int_equal(hdr.type, PROTO_DATA);
                bytes_add(out, buf, hdr.length);
        }
        json_t *hello = json_loads((char *)buf, 0, NULL);
        assert_non_null(hello);
        assert_int_equal(json_integer_value(json_object_get(hello, "version")), PROTO_VERSION);
        assert_true(json_is_array(json_object_get(json_object_get(hello, "attached"), "processes")));
        return hello;
}

static json_t *kept(json_t *hello, size_t i) {
        return json_array_get(json_object_get(json_object_get(hello, "attached"), "processes"), i);
}

static size_t n_kept(json_t *hello) {
        return json_array_size(json_object_get(json_object_get(hello, "attached"), "processes"));
}

static json_int_t member(json_t *o, const char *key) {
        json_t *v = json_object_get(o, key);
        assert_true(json_is_integer(v));
        return json_integer_value(v);
}

/* Reads a stream to its RESULT once its credit came: DATA (credit handed
 * back as it comes) into out and err, both EOFs after their DATA. The RESULT. */
static json_t *drain_to_result(Host *h, uint32_t id, Bytes *out, Bytes *err) {
        ProtoHeader hdr;
        static uint8_t buf[PROTO_MAX_PAYLOAD + 1];
        bool eof[3] = { false, false, false };
        size_t unacked = 0;
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                if (hdr.stream != id)
                        continue;
                if (hdr.type == PROTO_DATA) {
                        assert_false(eof[hdr.flags]);
                        bytes_add(hdr.flags == PROTO_FD_ERR ? err : out, buf, hdr.length);
                        unacked += hdr.length;
                        if (unacked >= 256 * 1024) {
                                send_window(h, id, (uint32_t)unacked);
                                unacked = 0;
                        }
                } else if (hdr.type == PROTO_EOF)
                        eof[hdr.flags] = true;
                else if (hdr.type == PROTO_RESULT)
                        break;
        }
        assert_true(eof[PROTO_FD_OUT]);
        json_t *res = json_loads((char *)buf, 0, NULL);
        assert_non_null(res);
        return res;
}

/* A command printing a numbered line every 50 ms: while detached its lines
 * are held; the HELLO lists it with its tag; nothing comes before the new
 * host's WINDOW, then the held lines in one frame, then the rest as it is
 * printed, with no line missing or twice. */
static void test_detach_holds_output_until_window(void **state) {
        Host *h = *state;
        static const char tag_json[] = "{\"id\":\"proc_1\",\"n\":[1,2.5,null],\"s\":\"\\u00e9\"}";
        char req[1024];
        snprintf(req, sizeof req,
                 "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"cd %s; i=0; while [ ! -e stop ]; do echo $i; "
                 "echo $i >n.tmp; mv -f n.tmp n; i=$((i+1)); sleep 0.05; done\"],\"cwd\":\"/\",\"tag\":%s}",
                 h->dir, tag_json);
        send_json(h, PROTO_OPEN, 1, req);
        ProtoHeader hdr;
        static uint8_t buf[PROTO_MAX_PAYLOAD + 1];
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.type, PROTO_EVENT);
        Bytes out = { 0 }, err = { 0 };
        while (lines_in_order(&out) < 3) {
                next_frame(h, &hdr, buf, sizeof buf);
                assert_int_equal(hdr.stream, 1);
                assert_int_equal(hdr.type, PROTO_DATA);
                bytes_add(&out, buf, hdr.length);
        }
        send_frame(h, PROTO_DETACH, 0, 0, NULL, 0);
        /* Ten lines more while nobody reads them. */
        wait_number(h, "n", lines_in_order(&out) + 10);

        json_t *hello = attach(h, 1, &out);
        assert_int_equal(n_kept(hello), 1);
        json_t *p = kept(hello, 0), *tag = json_loads(tag_json, 0, NULL);
        assert_int_equal(member(p, "stream"), 1);
        assert_true(member(p, "pid") > 0);
        assert_true(json_equal(json_object_get(p, "tag"), tag));
        /* Every byte queued before the detach reached this host. */
        assert_int_equal(member(p, "sent"), out.len);
        assert_int_equal(member(p, "dropped"), 0);
        json_int_t held = member(p, "held");
        assert_true(held >= 20);
        assert_true(json_is_false(json_object_get(p, "exited")));
        assert_int_equal(member(p, "stdin"), 0);
        assert_true(json_is_false(json_object_get(p, "stdinOpen")));

        /* Silent while the command prints on. */
        wait_number(h, "n", file_number(h, "n") + 2);
        expect_silence(h, 1);
        send_window(h, 1, PROTO_INITIAL_WINDOW);
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.stream, 1);
        assert_int_equal(hdr.type, PROTO_DATA);
        assert_int_equal(hdr.flags, PROTO_FD_OUT);
        assert_int_equal(hdr.length, held);
        bytes_add(&out, buf, hdr.length);
        assert_int_equal(out.p[out.len - 1], '\n');
        long lines = lines_in_order(&out);
        /* Then as before the detach. */
        while (lines_in_order(&out) < lines + 3) {
                next_frame(h, &hdr, buf, sizeof buf);
                assert_int_equal(hdr.stream, 1);
                assert_int_equal(hdr.type, PROTO_DATA);
                bytes_add(&out, buf, hdr.length);
        }
        touch(h, "stop");
        json_t *res = drain_to_result(h, 1, &out, &err);
        assert_int_equal(member(res, "exitCode"), 0);
        assert_true(lines_in_order(&out) >= lines + 3);
        assert_int_equal(out.p[out.len - 1], '\n');
        assert_int_equal(err.len, 0);
        json_decref(res);
        json_decref(tag);
        json_decref(hello);
        free(out.p);
}

/* Far more than AGENT_HOLD_STREAM_BYTES printed while detached: the oldest
 * bytes are dropped and counted, the newest held, up to the last line. */
static void test_detach_keeps_newest_output(void **state) {
        Host *h = *state;
        const long last = 1500000;
        Bytes want = { 0 };
        for (long i = 1; i <= last; i++) {
                char line[32];
                int n = snprintf(line, sizeof line, "%ld\n", i);
                bytes_add(&want, line, (size_t)n);
        }
        char req[512];
        snprintf(req, sizeof req,
                 "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"cd %s; while [ ! -e go ]; do sleep 0.01; done; "
                 "seq 1 %ld; touch done\"],\"cwd\":\"/\"}",
                 h->dir, last);
        send_json(h, PROTO_OPEN, 1, req);
        ProtoHeader hdr;
        static uint8_t buf[4096];
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.type, PROTO_EVENT);
        send_frame(h, PROTO_DETACH, 0, 0, NULL, 0);
        expect_silence(h, 1);
        touch(h, "go");
        wait_file(h, "done");
        /* The last MiB may still be in the pipe: attached once the agent
         * read it all (detached again in between, when it reads). */
        Bytes before = { 0 };
        json_t *hello = NULL, *p = NULL;
        for (int i = 0; i < 1000; i++) {
                if (hello) {
                        send_frame(h, PROTO_DETACH, 0, 0, NULL, 0);
                        sleep_ms(10);
                        json_decref(hello);
                }
                hello = attach(h, 1, &before);
                assert_int_equal(n_kept(hello), 1);
                p = kept(hello, 0);
                if (json_is_true(json_object_get(p, "exited")) &&
                    member(p, "sent") + member(p, "dropped") + member(p, "held") == (json_int_t)want.len)
                        break;
        }
        assert_int_equal(before.len, 0);
        assert_int_equal(member(p, "sent"), 0);
        json_int_t dropped = member(p, "dropped"), held = member(p, "held");
        assert_int_equal(dropped + held, want.len);
        assert_true(dropped > 0);
        assert_true(held <= AGENT_HOLD_STREAM_BYTES);
        assert_true(held >= AGENT_HOLD_STREAM_BYTES / 2);

        expect_silence(h, 1);
        send_window(h, 1, PROTO_INITIAL_WINDOW);
        Bytes out = { 0 }, err = { 0 };
        json_t *res = drain_to_result(h, 1, &out, &err);
        assert_int_equal(member(res, "exitCode"), 0);
        assert_int_equal(out.len, held);
        assert_memory_equal(out.p, want.p + dropped, out.len);
        json_decref(res);
        json_decref(hello);
        free(want.p);
        free(out.p);
}

/* Two commands end while detached, one by itself and one by its timeout:
 * listed in the order of their ids, each sends its held output, its EOFs
 * and its RESULT only once its own WINDOW came, and the RESULT is the one
 * it would have been. */
static void test_end_while_detached_waits_for_window(void **state) {
        Host *h = *state;
        char req[512];
        snprintf(req, sizeof req,
                 "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"cd %s; echo a; while [ ! -e go ]; do sleep 0.01; "
                 "done; echo b; echo c >&2; exit 7\"],\"cwd\":\"/\"}",
                 h->dir);
        send_json(h, PROTO_OPEN, 5, req);
        ProtoHeader hdr;
        static uint8_t buf[4096];
        Bytes out = { 0 }, err = { 0 };
        while (out.len < 2) {
                next_frame(h, &hdr, buf, sizeof buf);
                assert_int_equal(hdr.stream, 5);
                if (hdr.type == PROTO_DATA)
                        bytes_add(&out, buf, hdr.length);
        }
        send_json(h, PROTO_OPEN, 3,
                  "{\"op\":\"exec\",\"argv\":[\"sleep\",\"30\"],\"cwd\":\"/\",\"timeoutMs\":300}");
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.stream, 3);
        assert_int_equal(hdr.type, PROTO_EVENT);
        send_frame(h, PROTO_DETACH, 0, 0, NULL, 0);
        expect_silence(h, 5);
        touch(h, "go");

        Bytes none = { 0 };
        json_t *hello = NULL, *p3 = NULL, *p5 = NULL;
        for (int i = 0; i < 1000; i++) {
                if (hello) {
                        send_frame(h, PROTO_DETACH, 0, 0, NULL, 0);
                        sleep_ms(10);
                        json_decref(hello);
                }
                hello = attach(h, 5, &none);
                assert_int_equal(n_kept(hello), 2);
                p3 = kept(hello, 0);
                p5 = kept(hello, 1);
                bool ended = json_is_true(json_object_get(p3, "exited")) &&
                             json_is_true(json_object_get(p5, "exited"));
                if (ended && member(p5, "held") == 4)
                        break;
        }
        assert_int_equal(member(p3, "stream"), 3);
        assert_int_equal(member(p5, "stream"), 5);
        assert_true(json_is_null(json_object_get(p5, "tag")));
        assert_int_equal(member(p5, "sent"), 2);
        assert_int_equal(member(p5, "held"), 4);
        assert_int_equal(member(p3, "held"), 0);
        assert_true(json_is_true(json_object_get(p3, "exited")));

        expect_silence(h, 5);
        expect_silence(h, 3);
        send_window(h, 5, PROTO_INITIAL_WINDOW);
        json_t *res = drain_to_result(h, 5, &out, &err);
        bytes_add(&out, "", 1);
        bytes_add(&err, "", 1);
        assert_string_equal((char *)out.p, "a\nb\n");
        assert_string_equal((char *)err.p, "c\n");
        assert_int_equal(member(res, "exitCode"), 7);
        assert_true(json_is_null(json_object_get(res, "signal")));
        assert_true(json_is_false(json_object_get(res, "timedOut")));
        json_decref(res);

        /* The other still waits for its own WINDOW. */
        expect_silence(h, 3);
        send_window(h, 3, PROTO_INITIAL_WINDOW);
        out.len = err.len = 0;
        res = drain_to_result(h, 3, &out, &err);
        assert_int_equal(member(res, "exitCode"), 128 + SIGKILL);
        assert_int_equal(member(res, "signal"), SIGKILL);
        assert_true(json_is_true(json_object_get(res, "timedOut")));
        json_decref(res);
        json_decref(hello);
        free(out.p);
        free(err.p);
}

static int relay_connect(const Host *h) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(c >= 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(h->relay_port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
        return c;
}

/* The client of a relay connection sees it end (EOF or a reset) within 10 s. */
static void expect_closed(int c) {
        struct pollfd pfd = { .fd = c, .events = POLLIN };
        assert_int_equal(poll(&pfd, 1, 10000), 1);
        char ch;
        assert_true(read(c, &ch, 1) <= 0);
        close(c);
}

/* Reads frames up to the OPEN of a relay connection: its (even) id. */
static uint32_t relay_opened(Host *h) {
        ProtoHeader hdr;
        static uint8_t buf[PROTO_MAX_PAYLOAD + 1];
        do
                next_frame(h, &hdr, buf, sizeof buf);
        while (hdr.type != PROTO_OPEN);
        assert_int_equal(hdr.stream % 2, 0);
        assert_non_null(strstr((char *)buf, "\"connect\""));
        return hdr.stream;
}

/* At a DETACH a file read, a file write and a relay connection end without
 * a frame: the write leaves nothing, the relay's client sees its connection
 * end, and a new one is closed at once until the next ATTACH. */
static void test_detach_ends_other_streams_silently(void **state) {
        Host *h = *state;
        assert_true(h->relay_port > 0);
        char path[128], req[256];
        snprintf(path, sizeof path, "%s/big", h->dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        static const char kib[1024];
        for (int i = 0; i < 3 * 1024; i++)
                assert_int_equal(fwrite(kib, 1, sizeof kib, f), sizeof kib);
        fclose(f);
        snprintf(req, sizeof req, "{\"op\":\"read\",\"path\":\"%s\"}", path);
        send_json(h, PROTO_OPEN, 1, req);
        snprintf(req, sizeof req, "{\"op\":\"write\",\"path\":\"%s/w.bin\"}", h->dir);
        send_json(h, PROTO_OPEN, 3, req);
        send_frame(h, PROTO_DATA, PROTO_FD_IN, 3, "hello", 5);
        int c = relay_connect(h);
        uint32_t relay = relay_opened(h);
        assert_int_equal(write(c, "GET", 3), 3);

        send_frame(h, PROTO_DETACH, 0, 0, NULL, 0);
        /* Only what was queued before: DATA and credit, no EOF, RESULT or CANCEL. */
        send_frame(h, PROTO_PING, 0, 0, "sync", 4);
        ProtoHeader hdr;
        static uint8_t buf[PROTO_MAX_PAYLOAD + 1];
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                if (hdr.type == PROTO_PONG)
                        break;
                assert_true(hdr.type == PROTO_DATA || hdr.type == PROTO_WINDOW || hdr.type == PROTO_EVENT);
        }
        expect_closed(c);
        expect_closed(relay_connect(h));
        expect_silence(h, relay);
        assert_false(exists(h, "w.bin"));
        DIR *d = opendir(h->dir);
        assert_non_null(d);
        for (struct dirent *e; (e = readdir(d));)
                assert_true(strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
                            strcmp(e->d_name, "big") == 0);
        closedir(d);

        Bytes ignored = { 0 };
        json_t *hello = attach(h, 1, &ignored);
        assert_int_equal(n_kept(hello), 0);
        json_decref(hello);
        free(ignored.p);
        /* Attached, the relay is back. */
        c = relay_connect(h);
        relay = relay_opened(h);
        close(c);
        /* The client's end is the last frame, before the teardown's. */
        do
                next_frame(h, &hdr, buf, sizeof buf);
        while (hdr.stream != relay || hdr.type != PROTO_EOF);
}

/* {"k":"xx...x"} with n x's, spaced out or compact. */
static void tag_of(char *out, size_t cap, bool spaced, size_t n) {
        static char xs[4200];
        memset(xs, 'x', sizeof xs);
        assert_true(n < sizeof xs);
        snprintf(out, cap, spaced ? "{ \"k\" : \"%.*s\" }" : "{\"k\":\"%.*s\"}", (int)n, xs);
}

/* One exec to its RESULT, which it returns. */
static json_t *exec_result(Host *h, uint32_t id, const char *tag) {
        static char req[8192];
        snprintf(req, sizeof req, "{\"op\":\"exec\",\"argv\":[\"true\"],\"cwd\":\"/\",\"tag\":%s}", tag);
        send_json(h, PROTO_OPEN, id, req);
        ProtoHeader hdr;
        static uint8_t buf[4096];
        do {
                next_frame(h, &hdr, buf, sizeof buf);
                assert_int_equal(hdr.stream, id);
        } while (hdr.type != PROTO_RESULT);
        json_t *res = json_loads((char *)buf, 0, NULL);
        assert_non_null(res);
        return res;
}

/* An exec's tag is a JSON object of at most 4096 bytes dumped compactly, or
 * null; anything else is refused. Other ops ignore it. */
static void test_tag_must_be_small_object(void **state) {
        Host *h = *state;
        static char tag[5000];
        const char *bad[] = { "\"x\"", "[1]", "3", "true", NULL, NULL };
        uint32_t id = 1;
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++, id += 2) {
                if (bad[i])
                        snprintf(tag, sizeof tag, "%s", bad[i]);
                else
                        tag_of(tag, sizeof tag, i % 2, 4089); /* 4097 bytes compact */
                json_t *res = exec_result(h, id, tag);
                json_t *e = json_object_get(res, "error");
                assert_string_equal(json_string_value(json_object_get(e, "code")), "invalid");
                assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "tag"));
                json_decref(res);
        }
        /* 4096 bytes once compact, though more as sent; and null. */
        for (int i = 0; i < 2; i++, id += 2) {
                if (i == 0)
                        tag_of(tag, sizeof tag, true, 4088);
                else
                        snprintf(tag, sizeof tag, "null");
                json_t *res = exec_result(h, id, tag);
                assert_int_equal(member(res, "exitCode"), 0);
                json_decref(res);
        }
        send_json(h, PROTO_OPEN, id, "{\"op\":\"stat\",\"path\":\"/\",\"tag\":\"x\"}");
        ProtoHeader hdr;
        static uint8_t buf[4096];
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.type, PROTO_RESULT);
        assert_null(strstr((char *)buf, "\"error\""));
}

/* A daemon taking the channel over sends DETACH with a token: the agent
 * echoes it behind every frame it queued before, and the HELLO of the ATTACH
 * after it is the next frame. */
static void test_detach_token_is_echoed_after_what_was_queued(void **state) {
        Host *h = *state;
        send_json(h, PROTO_OPEN, 1,
                  "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"seq 1 2000; sleep 30\"],\"cwd\":\"/\"}");
        ProtoHeader hdr;
        static uint8_t buf[PROTO_MAX_PAYLOAD + 1];
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.type, PROTO_EVENT);
        static const char token[] = "0123456789abcdef";
        send_frame(h, PROTO_DETACH, 0, 0, token, 16);
        send_json(h, PROTO_ATTACH, 0, "{}");
        /* Output queued before the DETACH may come first; the echo, then the
         * HELLO, and nothing between them. */
        for (;;) {
                next_frame(h, &hdr, buf, sizeof buf);
                if (hdr.type == PROTO_DETACH)
                        break;
                assert_int_equal(hdr.stream, 1);
        }
        assert_int_equal(hdr.stream, 0);
        assert_int_equal(hdr.length, 16);
        assert_memory_equal(buf, token, 16);
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.type, PROTO_HELLO);
        send_frame(h, PROTO_CANCEL, 0, 1, NULL, 0);
        /* A token longer than the protocol allows is a malformed frame. */
        uint8_t bad[PROTO_HEADER_SIZE];
        ProtoHeader big = { .length = PROTO_MAX_DETACH_TOKEN + 1, .type = PROTO_DETACH };
        assert_int_equal(proto_header_encode(&big, bad), -EINVAL);
}

/* ATTACH with no DETACH before it: the agent detaches first, lists the
 * command, and carries on once the WINDOW came; new streams work. */
static void test_attach_without_detach(void **state) {
        Host *h = *state;
        char req[512];
        snprintf(req, sizeof req,
                 "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"cd %s; echo one; while [ ! -e stop ]; do "
                 "sleep 0.01; done; echo two\"],\"cwd\":\"/\"}",
                 h->dir);
        send_json(h, PROTO_OPEN, 1, req);
        ProtoHeader hdr;
        static uint8_t buf[4096];
        Bytes out = { 0 }, err = { 0 };
        while (out.len < 4) {
                next_frame(h, &hdr, buf, sizeof buf);
                assert_int_equal(hdr.stream, 1);
                if (hdr.type == PROTO_DATA)
                        bytes_add(&out, buf, hdr.length);
        }
        json_t *hello = attach(h, 1, &out);
        assert_int_equal(n_kept(hello), 1);
        json_t *p = kept(hello, 0);
        assert_int_equal(member(p, "stream"), 1);
        assert_int_equal(member(p, "sent"), 4);
        assert_int_equal(member(p, "held"), 0);
        assert_int_equal(member(p, "dropped"), 0);
        expect_silence(h, 1);
        send_window(h, 1, PROTO_INITIAL_WINDOW);
        touch(h, "stop");
        json_t *res = drain_to_result(h, 1, &out, &err);
        bytes_add(&out, "", 1);
        assert_string_equal((char *)out.p, "one\ntwo\n");
        assert_int_equal(member(res, "exitCode"), 0);
        json_decref(res);
        json_decref(hello);
        free(out.p);
        free(err.p);
        char e[64];
        assert_int_equal(exec_stderr(h, 3,
                                     "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"echo new >&2\"],"
                                     "\"cwd\":\"/\"}",
                                     e, sizeof e),
                         0);
        assert_string_equal(e, "new\n");
}

/* Stdin across an attach: what the last host sent and the child has not
 * read yet is still written, first, and never credited to the new host,
 * which starts with a whole window of its own. */
static void test_attach_keeps_queued_stdin(void **state) {
        Host *h = *state;
        const size_t old_bytes = 200000, total = old_bytes + PROTO_INITIAL_WINDOW;
        uint8_t *in = malloc(total);
        for (size_t i = 0; i < total; i++)
                in[i] = (uint8_t)(i * 13 + (i >> 12));
        char req[512];
        snprintf(req, sizeof req,
                 "{\"op\":\"exec\",\"argv\":[\"/bin/sh\",\"-c\",\"cd %s; while [ ! -e go ]; do sleep 0.01; done; "
                 "exec cat\"],\"cwd\":\"/\",\"stdin\":true}",
                 h->dir);
        send_json(h, PROTO_OPEN, 1, req);
        ProtoHeader hdr;
        static uint8_t buf[4096];
        next_frame(h, &hdr, buf, sizeof buf);
        assert_int_equal(hdr.type, PROTO_EVENT);
        for (size_t off = 0; off < old_bytes; off += 65536)
                send_frame(h, PROTO_DATA, PROTO_FD_IN, 1, in + off,
                           old_bytes - off < 65536 ? old_bytes - off : 65536);
        send_frame(h, PROTO_DETACH, 0, 0, NULL, 0);
        Bytes out = { 0 }, err = { 0 };
        json_t *hello = attach(h, 1, &out);
        json_t *p = kept(hello, 0);
        assert_int_equal(member(p, "stdin"), old_bytes);
        assert_true(json_is_true(json_object_get(p, "stdinOpen")));
        assert_int_equal(out.len, 0);

        send_window(h, 1, PROTO_INITIAL_WINDOW);
        for (size_t off = old_bytes; off < total; off += 65536)
                send_frame(h, PROTO_DATA, PROTO_FD_IN, 1, in + off, total - off < 65536 ? total - off : 65536);
        send_frame(h, PROTO_EOF, PROTO_FD_IN, 1, NULL, 0);
        touch(h, "go");
        /* The output, with the credit the new host got back. */
        static uint8_t big[PROTO_MAX_PAYLOAD + 1];
        size_t unacked = 0;
        uint64_t credit = 0;
        for (;;) {
                next_frame(h, &hdr, big, sizeof big);
                assert_int_equal(hdr.stream, 1);
                if (hdr.type == PROTO_WINDOW)
                        credit += proto_get_u32(big);
                else if (hdr.type == PROTO_DATA) {
                        bytes_add(&out, big, hdr.length);
                        unacked += hdr.length;
                        if (unacked >= 256 * 1024) {
                                send_window(h, 1, (uint32_t)unacked);
                                unacked = 0;
                        }
                } else if (hdr.type == PROTO_RESULT)
                        break;
        }
        assert_non_null(strstr((char *)big, "\"exitCode\":0"));
        assert_int_equal(out.len, total);
        assert_memory_equal(out.p, in, total);
        assert_int_equal(credit, PROTO_INITIAL_WINDOW);
        json_decref(hello);
        free(out.p);
        free(err.p);
        free(in);
}

/* An ATTACH whose payload is not a JSON object is malformed: the channel closes. */
static void test_malformed_attach_closes_channel(void **state) {
        Host *h = *state;
        send_json(h, PROTO_ATTACH, 0, "[]");
        /* The loop ends by itself, as after any malformed frame. */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 10;
        assert_int_equal(pthread_timedjoin_np(h->thread, NULL, &dl), 0);
        h->joined = true;
        assert_int_equal(h->status, 1);
}

int main(void) {
        signal(SIGPIPE, SIG_IGN);
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_exec_frames_in_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_many_execs, setup, teardown),
                cmocka_unit_test_setup_teardown(test_signal_running_exec, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_as_user, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_that_cannot_start, setup, teardown),
                cmocka_unit_test_setup_teardown(test_file_round_trip_within_window, setup, teardown),
                cmocka_unit_test_setup_teardown(test_detach_holds_output_until_window, setup, teardown),
                cmocka_unit_test_setup_teardown(test_detach_keeps_newest_output, setup, teardown),
                cmocka_unit_test_setup_teardown(test_end_while_detached_waits_for_window, setup, teardown),
                cmocka_unit_test_setup_teardown(test_detach_ends_other_streams_silently, setup_relay, teardown),
                cmocka_unit_test_setup_teardown(test_tag_must_be_small_object, setup, teardown),
                cmocka_unit_test_setup_teardown(test_attach_without_detach, setup, teardown),
                cmocka_unit_test_setup_teardown(test_detach_token_is_echoed_after_what_was_queued, setup, teardown),
                cmocka_unit_test_setup_teardown(test_attach_keeps_queued_stdin, setup, teardown),
                cmocka_unit_test_setup_teardown(test_malformed_attach_closes_channel, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
