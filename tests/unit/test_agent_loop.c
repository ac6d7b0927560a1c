/* The agent's event loop end to end over a socketpair, as the host sees it:
 * an exec's frames (start, output, both EOFs, RESULT) in order, a file
 * written within the flow-control window and read back whole, and the loop
 * ending when the host closes the channel. */
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
#include <sys/stat.h>
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
} Host;

static void *agent_main(void *arg) {
        Host *h = arg;
        h->status = agent_run(h->agent);
        return NULL;
}

/* Next frame from the agent, copied into out (NUL-terminated); fails the
 * test after 10 s. */
static void next_frame(Host *h, ProtoHeader *hdr, uint8_t *out, size_t cap) {
        for (;;) {
                const uint8_t *p;
                int k = proto_reader_next(h->reader, hdr, &p);
                assert_true(k >= 0);
                if (k == 1) {
                        assert_true(hdr->length < cap);
                        memcpy(out, p, hdr->length);
                        out[hdr->length] = 0;
                        return;
                }
                struct pollfd pfd = {.fd = h->fd, .events = POLLIN};
                assert_int_equal(poll(&pfd, 1, 10000), 1);
                static uint8_t buf[1 << 16];
                ssize_t n = read(h->fd, buf, sizeof buf);
                assert_true(n > 0);
                assert_int_equal(proto_reader_feed(h->reader, buf, (size_t)n), 0);
        }
}

static int setup(void **state) {
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

static int teardown(void **state) {
        Host *h = *state;
        /* The host going away ends the loop. */
        shutdown(h->fd, SHUT_RDWR);
        pthread_join(h->thread, NULL);
        assert_int_equal(h->status, 0);
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

int main(void) {
        signal(SIGPIPE, SIG_IGN);
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_exec_frames_in_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_many_execs, setup, teardown),
                cmocka_unit_test_setup_teardown(test_signal_running_exec, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_as_user, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_that_cannot_start, setup, teardown),
                cmocka_unit_test_setup_teardown(test_file_round_trip_within_window, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
