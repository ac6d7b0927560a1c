/*
 * The daemon's channel (src/daemon/channel.c) against the real agent
 * (build/runtime-agent), over a socketpair. When bwrap is usable the agent
 * runs as PID 1 of its own PID namespace on a tmpfs root (so its /workspace
 * leaves no trace on the host), with the host's /usr, /etc, /tmp and /dev/shm
 * bound in; otherwise (or with RUNTIME_TEST_NO_BWRAP set) it runs directly.
 * File tests work in a temporary directory the agent sees at the same path.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/manager/channel.h"
#include "driver/driver_agent.h"
#include "proto/proto.h"

typedef struct Fixture {
        pid_t pid;  /* the agent, or bwrap around it */
        int raw_fd; /* a duplicate of the channel's fd, for raw frames */
        Channel *c;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        int closed;
        char reason[128];
        char tmp[PATH_MAX];
} Fixture;

static char agent_path[PATH_MAX];
static char agent_dir[PATH_MAX];
static bool use_bwrap;

static void on_closed(void *userdata, const char *reason) {
        Fixture *f = userdata;
        pthread_mutex_lock(&f->lock);
        f->closed++;
        snprintf(f->reason, sizeof f->reason, "%s", reason);
        pthread_cond_broadcast(&f->cond);
        pthread_mutex_unlock(&f->lock);
}

/* In a forked child: runs program as PID 1 of a new PID namespace. */
static void exec_sandboxed(const char *program) {
        execlp("bwrap", "bwrap", "--tmpfs", "/", "--ro-bind", "/usr", "/usr", "--ro-bind-try", "/bin",
               "/bin", "--ro-bind-try", "/sbin", "/sbin", "--ro-bind-try", "/lib", "/lib", "--ro-bind-try",
               "/lib64", "/lib64", "--ro-bind-try", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev",
               "--bind", "/tmp", "/tmp", "--bind-try", "/dev/shm", "/dev/shm", "--ro-bind", agent_dir,
               agent_dir, "--unshare-pid", "--as-pid-1", "--die-with-parent", "--", program, (char *)NULL);
        _exit(127);
}

static void find_agent(void) {
        char self[PATH_MAX - 32];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        assert_true(n > 0);
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        assert_non_null(slash);
        *slash = '\0';
        char guess[PATH_MAX];
        snprintf(guess, sizeof guess, "%s/../runtime-agent", self);
        if (!realpath(guess, agent_path) || access(agent_path, X_OK) != 0) {
                fprintf(stderr, "%s is missing: run `make build/runtime-agent` first\n", guess);
                fail();
        }
        snprintf(agent_dir, sizeof agent_dir, "%s", agent_path);
        *strrchr(agent_dir, '/') = '\0';
        use_bwrap = false;
        if (getenv("RUNTIME_TEST_NO_BWRAP") == NULL) {
                pid_t pid = fork();
                assert_true(pid >= 0);
                if (pid == 0) {
                        int null_fd = open("/dev/null", O_WRONLY);
                        dup2(null_fd, 1);
                        dup2(null_fd, 2);
                        exec_sandboxed("/usr/bin/true");
                }
                int status;
                assert_int_equal(waitpid(pid, &status, 0), pid);
                use_bwrap = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        }
}

/* A tmpfs where there is one: creating 10000 files on a virtual disk takes
 * seconds. */
static const char *scratch_base(void) {
        return access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
}

static int setup(void **state) {
        if (!agent_path[0])
                find_agent();
        Fixture *f = calloc(1, sizeof(Fixture));
        assert_non_null(f);
        pthread_mutex_init(&f->lock, NULL);
        pthread_cond_init(&f->cond, NULL);
        snprintf(f->tmp, sizeof f->tmp, "%s/runtime-test-channel-XXXXXX", scratch_base());
        assert_non_null(mkdtemp(f->tmp));

        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        f->pid = fork();
        assert_true(f->pid >= 0);
        if (f->pid == 0) {
                dup2(sv[1], 0);
                dup2(sv[1], 1);
                if (!getenv("RUNTIME_TEST_VERBOSE")) {
                        int null_fd = open("/dev/null", O_WRONLY);
                        dup2(null_fd, 2);
                }
                if (use_bwrap)
                        exec_sandboxed(agent_path);
                execl(agent_path, agent_path, (char *)NULL);
                _exit(127);
        }
        close(sv[1]);
        f->raw_fd = dup(sv[0]);
        f->c = channel_new(sv[0], on_closed, f);
        assert_non_null(f->c);
        json_t *hello = NULL;
        assert_int_equal(channel_wait_hello(f->c, 10000, &hello), 0);
        assert_int_equal(json_integer_value(json_object_get(hello, "version")), 1);
        if (use_bwrap)
                assert_int_equal(json_integer_value(json_object_get(hello, "pid")), 1);
        assert_non_null(json_string_value(json_object_get(hello, "kernel")));
        json_decref(hello);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        channel_free(f->c);
        close(f->raw_fd);
        /* The agent exits when the channel ends; make sure. */
        for (int i = 0; i < 100 && f->pid > 0; i++) {
                if (waitpid(f->pid, NULL, WNOHANG) == f->pid) {
                        f->pid = 0;
                        break;
                }
                usleep(20000);
        }
        if (f->pid > 0) {
                kill(f->pid, SIGKILL);
                waitpid(f->pid, NULL, 0);
        }
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->tmp);
        assert_int_equal(system(cmd), 0);
        pthread_mutex_destroy(&f->lock);
        pthread_cond_destroy(&f->cond);
        free(f);
        return 0;
}

/* ---- helpers ---- */

typedef struct Buf {
        uint8_t *p;
        size_t len, cap;
} Buf;

static void buf_add(Buf *b, const void *p, size_t n) {
        if (b->len + n + 1 > b->cap) {
                b->cap = (b->len + n + 1) * 2;
                b->p = realloc(b->p, b->cap);
                assert_non_null(b->p);
        }
        memcpy(b->p + b->len, p, n);
        b->len += n;
        b->p[b->len] = '\0';
}

typedef struct Outcome {
        Buf out, err;
        size_t out_bytes; /* counted even when not kept */
        json_t *start;    /* EVENT */
        json_t *result;
        bool got_eof[3];
} Outcome;

static void outcome_clear(Outcome *o) {
        free(o->out.p);
        free(o->err.p);
        if (o->start)
                json_decref(o->start);
        if (o->result)
                json_decref(o->result);
        memset(o, 0, sizeof *o);
}

static json_t *parse(const char *fmt, ...) {
        char buf[8192];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        json_error_t e;
        json_t *j = json_loads(buf, JSON_ALLOW_NUL, &e);
        if (!j)
                fprintf(stderr, "bad test JSON %s: %s\n", buf, e.text);
        assert_non_null(j);
        return j;
}

typedef struct Feeder {
        ChanStream *s;
        const void *buf;
        size_t len;
        int write_r, close_r;
} Feeder;

static void *feeder_main(void *arg) {
        Feeder *fd = arg;
        fd->write_r = chan_stream_write(fd->s, fd->buf, fd->len, 30000);
        fd->close_r = fd->write_r == 0 ? chan_stream_close_write(fd->s) : 0;
        return NULL;
}

/* Runs one request to its RESULT. Input is written from a second thread while
 * this one reads: a child like cat only takes more input once its output was
 * taken. keep_out false only counts stdout bytes. *ret_write_r, when given,
 * gets the input writer's result instead of asserting it succeeded. */
static void run_stream_ex(Channel *c, json_t *req, const void *in, size_t in_len, bool send_in,
                          bool keep_out, Outcome *o, int *ret_write_r) {
        memset(o, 0, sizeof *o);
        ChanStream *s = NULL;
        assert_int_equal(channel_open_stream(c, req, &s), 0);
        Feeder feeder = {.s = s, .buf = in, .len = in_len};
        pthread_t th;
        if (send_in)
                assert_int_equal(pthread_create(&th, NULL, feeder_main, &feeder), 0);
        for (;;) {
                ChanEvent ev;
                assert_int_equal(chan_stream_next(s, 60000, &ev), 0);
                if (ev.type == CHAN_EV_DATA) {
                        if (ev.fd == PROTO_FD_OUT) {
                                o->out_bytes += ev.len;
                                if (keep_out)
                                        buf_add(&o->out, ev.data, ev.len);
                        } else if (ev.fd == PROTO_FD_ERR)
                                buf_add(&o->err, ev.data, ev.len);
                } else if (ev.type == CHAN_EV_EOF) {
                        o->got_eof[ev.fd] = true;
                } else if (ev.type == CHAN_EV_EVENT) {
                        if (!o->start)
                                o->start = json_incref(ev.json);
                } else if (ev.type == CHAN_EV_RESULT) {
                        o->result = json_incref(ev.json);
                        chan_event_clear(&ev);
                        break;
                } else {
                        fail_msg("channel closed before the RESULT");
                }
                chan_event_clear(&ev);
        }
        if (send_in) {
                pthread_join(th, NULL);
                if (ret_write_r)
                        *ret_write_r = feeder.write_r;
                else {
                        assert_int_equal(feeder.write_r, 0);
                        assert_int_equal(feeder.close_r, 0);
                }
        }
        ChanEvent ev;
        assert_int_equal(chan_stream_next(s, 0, &ev), 0);
        assert_int_equal(ev.type, CHAN_EV_CLOSED);
        chan_stream_free(s);
}

static void run_stream(Channel *c, json_t *req, const void *in, size_t in_len, bool send_in, bool keep_out,
                       Outcome *o) {
        run_stream_ex(c, req, in, in_len, send_in, keep_out, o, NULL);
}

static void run_simple(Channel *c, const char *json, Outcome *o) {
        json_t *req = parse("%s", json);
        run_stream(c, req, NULL, 0, false, true, o);
        json_decref(req);
}

static json_int_t result_int(Outcome *o, const char *key) {
        json_t *v = json_object_get(o->result, key);
        if (!json_is_integer(v)) {
                char *s = json_dumps(o->result, 0);
                fprintf(stderr, "result without integer %s: %s\n", key, s);
                free(s);
        }
        assert_true(json_is_integer(v));
        return json_integer_value(v);
}

static const char *error_code(Outcome *o) {
        return json_string_value(json_object_get(json_object_get(o->result, "error"), "code"));
}

/* ---- tests ---- */

static void test_ping(void **state) {
        Fixture *f = *state;
        for (int i = 0; i < 10; i++)
                assert_int_equal(channel_ping(f->c, 5000), 0);
        assert_true(channel_is_open(f->c));
}

static void test_exec_echo(void **state) {
        Fixture *f = *state;
        Outcome o;
        run_simple(f->c, "{\"op\":\"exec\",\"command\":\"echo hi; echo oops >&2; exit 3\"}", &o);
        assert_string_equal((char *)o.out.p, "hi\n");
        assert_string_equal((char *)o.err.p, "oops\n");
        assert_int_equal(result_int(&o, "exitCode"), 3);
        assert_true(json_is_null(json_object_get(o.result, "signal")));
        assert_true(json_is_false(json_object_get(o.result, "timedOut")));
        assert_true(json_integer_value(json_object_get(o.start, "pid")) > 1);
        assert_true(o.got_eof[1] && o.got_eof[2]);
        outcome_clear(&o);

        run_simple(f->c, "{\"op\":\"exec\",\"argv\":[\"sh\",\"-c\",\"kill -TERM $$\"]}", &o);
        assert_int_equal(result_int(&o, "exitCode"), 128 + SIGTERM);
        assert_int_equal(result_int(&o, "signal"), SIGTERM);
        outcome_clear(&o);
}

static void test_exec_cannot_start(void **state) {
        Fixture *f = *state;
        Outcome o;
        run_simple(f->c, "{\"op\":\"exec\",\"argv\":[\"/nonexistent/program\"]}", &o);
        assert_int_equal(result_int(&o, "exitCode"), 127);
        assert_non_null(strstr((char *)o.err.p, "/nonexistent/program"));
        outcome_clear(&o);

        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/noexec", f->tmp);
        FILE *fp = fopen(path, "w");
        assert_non_null(fp);
        fputs("#!/bin/sh\necho no\n", fp);
        fclose(fp);
        chmod(path, 0644);
        json_t *req = json_pack("{s:s,s:[s]}", "op", "exec", "argv", path);
        run_stream(f->c, req, NULL, 0, false, true, &o);
        json_decref(req);
        assert_int_equal(result_int(&o, "exitCode"), 126);
        outcome_clear(&o);

        run_simple(f->c, "{\"op\":\"exec\",\"argv\":[\"true\"],\"cwd\":\"/nonexistent/dir\"}", &o);
        assert_int_equal(result_int(&o, "exitCode"), 127);
        assert_non_null(strstr((char *)o.err.p, "/nonexistent/dir"));
        outcome_clear(&o);
}

static void test_exec_stdin(void **state) {
        Fixture *f = *state;
        /* Three windows' worth: the host must wait for credit on the way in. */
        size_t n = 3 * PROTO_INITIAL_WINDOW + 12345;
        uint8_t *data = malloc(n);
        assert_non_null(data);
        for (size_t i = 0; i < n; i++)
                data[i] = (uint8_t)(i * 2654435761u >> 13);
        json_t *req = parse("{\"op\":\"exec\",\"argv\":[\"cat\"],\"stdin\":true}");
        Outcome o;
        run_stream(f->c, req, data, n, true, true, &o);
        json_decref(req);
        assert_int_equal(result_int(&o, "exitCode"), 0);
        assert_int_equal(o.out.len, n);
        assert_memory_equal(o.out.p, data, n);
        outcome_clear(&o);

        /* Without "stdin" the child reads /dev/null. */
        run_simple(f->c, "{\"op\":\"exec\",\"command\":\"wc -c\"}", &o);
        assert_int_equal(atoi((char *)o.out.p), 0);
        outcome_clear(&o);

        /* A child that does not read its stdin: the host is not left waiting. */
        req = parse("{\"op\":\"exec\",\"command\":\"exec 0<&-; echo done\",\"stdin\":true}");
        int write_r = 0;
        run_stream_ex(f->c, req, data, n, true, true, &o, &write_r);
        json_decref(req);
        assert_string_equal((char *)o.out.p, "done\n");
        /* Either all input was taken (and dropped) or the stream ended first. */
        assert_true(write_r == 0 || write_r == -EPIPE);
        outcome_clear(&o);
        free(data);
}

static void test_exec_env_cwd(void **state) {
        Fixture *f = *state;
        Outcome o;
        json_t *req = json_pack("{s:s,s:s,s:s,s:{s:s,s:s}}", "op", "exec", "command",
                                "echo \"$FOO|$HOME|$LANG|$PATH\"; pwd", "cwd", f->tmp, "env", "FOO",
                                "bar baz", "HOME", "/home/x");
        run_stream(f->c, req, NULL, 0, false, true, &o);
        json_decref(req);
        char want[PATH_MAX + 256];
        snprintf(
                want, sizeof want,
                "bar baz|/home/x|C.UTF-8|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n%s\n",
                f->tmp);
        assert_string_equal((char *)o.out.p, want);
        outcome_clear(&o);

        if (use_bwrap) {
                run_simple(f->c, "{\"op\":\"exec\",\"command\":\"pwd\"}", &o);
                assert_string_equal((char *)o.out.p, "/workspace\n");
                outcome_clear(&o);
        }
}

static bool pid_alive(Fixture *f, long pid) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "{\"op\":\"exec\",\"command\":\"kill -0 %ld 2>/dev/null\"}", pid);
        Outcome o;
        run_simple(f->c, cmd, &o);
        bool alive = result_int(&o, "exitCode") == 0;
        outcome_clear(&o);
        return alive;
}

static void test_exec_timeout_kills_group(void **state) {
        Fixture *f = *state;
        Outcome o;
        run_simple(f->c,
                   "{\"op\":\"exec\",\"command\":\"sleep 100 & echo $!; sleep 100\",\"timeoutMs\":300}", &o);
        assert_true(json_is_true(json_object_get(o.result, "timedOut")));
        assert_int_equal(result_int(&o, "exitCode"), 137);
        assert_int_equal(result_int(&o, "signal"), SIGKILL);
        assert_true(result_int(&o, "durationMs") >= 300);
        long grandchild = atol((char *)o.out.p);
        assert_true(grandchild > 1);
        outcome_clear(&o);
        bool alive = true;
        for (int i = 0; i < 50 && alive; i++) {
                alive = pid_alive(f, grandchild);
                if (alive)
                        usleep(20000);
        }
        assert_false(alive);
}

static void test_exec_background_holder(void **state) {
        Fixture *f = *state;
        /* The leader exits at once; a background job keeps stdout open. The
         * RESULT must not wait for the job's 100 s. */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        Outcome o;
        run_simple(f->c, "{\"op\":\"exec\",\"command\":\"sleep 100 & echo started\"}", &o);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        assert_int_equal(result_int(&o, "exitCode"), 0);
        assert_string_equal((char *)o.out.p, "started\n");
        assert_true(t1.tv_sec - t0.tv_sec < 5);
        outcome_clear(&o);
}

static void test_exec_cancel(void **state) {
        Fixture *f = *state;
        json_t *req = parse("{\"op\":\"exec\",\"command\":\"echo go; sleep 100\"}");
        ChanStream *s;
        assert_int_equal(channel_open_stream(f->c, req, &s), 0);
        json_decref(req);
        ChanEvent ev;
        /* Wait for the output so the child surely runs. */
        bool saw_go = false;
        while (!saw_go) {
                assert_int_equal(chan_stream_next(s, 10000, &ev), 0);
                saw_go = ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_OUT;
                chan_event_clear(&ev);
        }
        chan_stream_cancel(s);
        chan_stream_cancel(s); /* once only */
        for (;;) {
                assert_int_equal(chan_stream_next(s, 10000, &ev), 0);
                if (ev.type == CHAN_EV_RESULT) {
                        assert_int_equal(json_integer_value(json_object_get(ev.json, "signal")), SIGKILL);
                        assert_true(json_is_false(json_object_get(ev.json, "timedOut")));
                        chan_event_clear(&ev);
                        break;
                }
                assert_int_not_equal(ev.type, CHAN_EV_CLOSED);
                chan_event_clear(&ev);
        }
        chan_stream_free(s);

        /* Freeing a stream without its RESULT cancels it; the channel goes on. */
        req = parse("{\"op\":\"exec\",\"command\":\"sleep 100\"}");
        assert_int_equal(channel_open_stream(f->c, req, &s), 0);
        json_decref(req);
        chan_stream_free(s);
        assert_int_equal(channel_ping(f->c, 5000), 0);
}

static void test_exec_large_output(void **state) {
        Fixture *f = *state;
        const size_t total = 50u * 1024u * 1024u;
        json_t *req = parse("{\"op\":\"exec\",\"command\":\"head -c %zu /dev/zero\"}", total);
        ChanStream *s;
        assert_int_equal(channel_open_stream(f->c, req, &s), 0);
        json_decref(req);
        size_t got = 0;
        bool paused = false;
        for (;;) {
                ChanEvent ev;
                assert_int_equal(chan_stream_next(s, 30000, &ev), 0);
                assert_int_not_equal(ev.type, CHAN_EV_CLOSED);
                if (ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_OUT) {
                        got += ev.len;
                        /* A slow consumer: the agent must stall, not buffer. */
                        if (!paused && got > 4u * 1024u * 1024u) {
                                paused = true;
                                usleep(300000);
                        }
                }
                bool done = ev.type == CHAN_EV_RESULT;
                if (done)
                        assert_int_equal(json_integer_value(json_object_get(ev.json, "exitCode")), 0);
                chan_event_clear(&ev);
                if (done)
                        break;
        }
        chan_stream_free(s);
        assert_int_equal(got, total);

        /* The agent's peak memory stays far below the output's size. */
        pid_t agent = f->pid;
        if (use_bwrap) {
                char path[64], line[64];
                snprintf(path, sizeof path, "/proc/%d/task/%d/children", f->pid, f->pid);
                FILE *fp = fopen(path, "r");
                assert_non_null(fp);
                assert_non_null(fgets(line, sizeof line, fp));
                fclose(fp);
                agent = atoi(line);
        }
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/%d/status", agent);
        FILE *fp = fopen(path, "r");
        assert_non_null(fp);
        long hwm_kb = -1;
        while (fgets(line, sizeof line, fp))
                if (sscanf(line, "VmHWM: %ld kB", &hwm_kb) == 1)
                        break;
        fclose(fp);
        assert_true(hwm_kb > 0);
#if defined(__SANITIZE_ADDRESS__)
        /* The sanitizer lane builds the agent with ASan too, whose quarantine
         * keeps freed memory: only the plain build measures the agent. */
        (void)hwm_kb;
#else
        if (hwm_kb >= 32 * 1024)
                fail_msg("the agent peaked at %ld KiB for a 50 MiB output", hwm_kb);
#endif
}

typedef struct Worker {
        Fixture *f;
        int n;
        bool ok;
} Worker;

static void *worker_main(void *arg) {
        Worker *w = arg;
        char n[16];
        snprintf(n, sizeof n, "%d", w->n);
        json_t *req =
                json_pack("{s:s,s:s,s:{s:s}}", "op", "exec", "command", "sleep 1; echo $N", "env", "N", n);
        ChanStream *s;
        if (channel_open_stream(w->f->c, req, &s) < 0) {
                json_decref(req);
                return NULL;
        }
        json_decref(req);
        char out[64] = "";
        size_t len = 0;
        for (;;) {
                ChanEvent ev;
                if (chan_stream_next(s, 30000, &ev) < 0 || ev.type == CHAN_EV_CLOSED)
                        break;
                if (ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_OUT && len + ev.len < sizeof out) {
                        memcpy(out + len, ev.data, ev.len);
                        len += ev.len;
                }
                bool done = ev.type == CHAN_EV_RESULT;
                if (done)
                        w->ok = json_integer_value(json_object_get(ev.json, "exitCode")) == 0;
                chan_event_clear(&ev);
                if (done)
                        break;
        }
        chan_stream_free(s);
        char want[32];
        snprintf(want, sizeof want, "%d\n", w->n);
        w->ok = w->ok && strcmp(out, want) == 0;
        return NULL;
}

static void test_exec_concurrent(void **state) {
        Fixture *f = *state;
        enum { N = 20 };
        pthread_t th[N];
        Worker w[N];
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < N; i++) {
                w[i] = (Worker){.f = f, .n = i};
                assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
        }
        for (int i = 0; i < N; i++) {
                pthread_join(th[i], NULL);
                assert_true(w[i].ok);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        /* They ran side by side, not 20 x 1 s one after the other. */
        assert_true((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 10000);
}

static void test_file_write_read(void **state) {
        Fixture *f = *state;
        size_t n = 10u * 1024u * 1024u;
        uint8_t *data = malloc(n);
        assert_non_null(data);
        for (size_t i = 0; i < n; i++)
                data[i] = (uint8_t)((i * 7919u) ^ (i >> 11));
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/a/b/c/data.bin", f->tmp);

        Outcome o;
        json_t *req = json_pack("{s:s,s:s,s:i,s:b}", "op", "write", "path", path, "mode", 0640, "mkdirs", 1);
        run_stream(f->c, req, data, n, true, true, &o);
        json_decref(req);
        assert_int_equal(result_int(&o, "size"), n);
        outcome_clear(&o);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_size, n);
        assert_int_equal(st.st_mode & 07777, 0640);

        req = json_pack("{s:s,s:s}", "op", "read", "path", path);
        run_stream(f->c, req, NULL, 0, false, true, &o);
        json_decref(req);
        assert_int_equal(result_int(&o, "size"), n);
        assert_int_equal(json_integer_value(json_object_get(o.start, "size")), n);
        assert_int_equal(json_integer_value(json_object_get(o.start, "mode")), 0640);
        assert_true(o.got_eof[1]);
        assert_int_equal(o.out.len, n);
        assert_memory_equal(o.out.p, data, n);
        outcome_clear(&o);

        /* Overwrite is atomic and leaves no temporary file behind. */
        req = json_pack("{s:s,s:s}", "op", "write", "path", path);
        run_stream(f->c, req, "short", 5, true, true, &o);
        json_decref(req);
        assert_int_equal(result_int(&o, "size"), 5);
        outcome_clear(&o);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_size, 5);
        char dir[PATH_MAX + 64];
        snprintf(dir, sizeof dir, "%s/a/b/c", f->tmp);
        req = json_pack("{s:s,s:s}", "op", "list", "path", dir);
        run_stream(f->c, req, NULL, 0, false, true, &o);
        json_decref(req);
        assert_int_equal(json_array_size(json_object_get(o.result, "entries")), 1);
        outcome_clear(&o);

        /* Reading a directory, a missing file. */
        req = json_pack("{s:s,s:s}", "op", "read", "path", dir);
        run_stream(f->c, req, NULL, 0, false, true, &o);
        json_decref(req);
        assert_string_equal(error_code(&o), "is_a_directory");
        outcome_clear(&o);
        run_simple(f->c, "{\"op\":\"read\",\"path\":\"/nonexistent/file\"}", &o);
        assert_string_equal(error_code(&o), "not_found");
        outcome_clear(&o);
        free(data);
}

static void test_file_write_cancel(void **state) {
        Fixture *f = *state;
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/keep.txt", f->tmp);
        FILE *fp = fopen(path, "w");
        assert_non_null(fp);
        fputs("original", fp);
        fclose(fp);

        json_t *req = json_pack("{s:s,s:s}", "op", "write", "path", path);
        ChanStream *s;
        assert_int_equal(channel_open_stream(f->c, req, &s), 0);
        json_decref(req);
        assert_int_equal(chan_stream_write(s, "partial new content", 19, 5000), 0);
        chan_stream_cancel(s);
        ChanEvent ev;
        for (;;) {
                assert_int_equal(chan_stream_next(s, 10000, &ev), 0);
                assert_int_not_equal(ev.type, CHAN_EV_CLOSED);
                if (ev.type == CHAN_EV_RESULT)
                        break;
                chan_event_clear(&ev);
        }
        assert_non_null(json_object_get(ev.json, "error"));
        chan_event_clear(&ev);
        chan_stream_free(s);

        char buf[64] = "";
        fp = fopen(path, "r");
        assert_non_null(fp);
        assert_non_null(fgets(buf, sizeof buf, fp));
        fclose(fp);
        assert_string_equal(buf, "original");
        char cmd[PATH_MAX + 64];
        snprintf(cmd, sizeof cmd, "test \"$(ls -A '%s' | wc -l)\" = 1", f->tmp);
        assert_int_equal(system(cmd), 0);
}

static void test_file_ops(void **state) {
        Fixture *f = *state;
        Outcome o;
        json_t *req;
        char d[PATH_MAX + 64], d2[PATH_MAX + 64], file[PATH_MAX + 64], link[PATH_MAX + 64];
        snprintf(d, sizeof d, "%s/x/y", f->tmp);
        snprintf(d2, sizeof d2, "%s/z", f->tmp);
        snprintf(file, sizeof file, "%s/x/y/f.txt", f->tmp);
        snprintf(link, sizeof link, "%s/x/link", f->tmp);

#define RUN(...)                                                                                            \
        do {                                                                                                \
                req = json_pack(__VA_ARGS__);                                                               \
                assert_non_null(req);                                                                       \
                run_stream(f->c, req, NULL, 0, false, true, &o);                                            \
                json_decref(req);                                                                           \
        } while (0)

        RUN("{s:s,s:s}", "op", "mkdir", "path", d);
        assert_string_equal(error_code(&o), "not_found");
        outcome_clear(&o);
        RUN("{s:s,s:s,s:b}", "op", "mkdir", "path", d, "parents", 1);
        assert_null(json_object_get(o.result, "error"));
        outcome_clear(&o);
        RUN("{s:s,s:s}", "op", "mkdir", "path", d);
        assert_string_equal(error_code(&o), "exists");
        outcome_clear(&o);

        FILE *fp = fopen(file, "w");
        assert_non_null(fp);
        fputs("12345", fp);
        fclose(fp);
        assert_int_equal(symlink("/", link), 0);

        RUN("{s:s,s:s}", "op", "stat", "path", file);
        assert_string_equal(json_string_value(json_object_get(o.result, "type")), "file");
        assert_string_equal(json_string_value(json_object_get(o.result, "name")), "f.txt");
        assert_int_equal(result_int(&o, "size"), 5);
        assert_non_null(json_string_value(json_object_get(o.result, "mtime")));
        outcome_clear(&o);
        RUN("{s:s,s:s}", "op", "stat", "path", link);
        assert_string_equal(json_string_value(json_object_get(o.result, "type")), "symlink");
        assert_string_equal(json_string_value(json_object_get(o.result, "target")), "/");
        outcome_clear(&o);
        char missing[PATH_MAX + 64];
        snprintf(missing, sizeof missing, "%s/missing", f->tmp);
        RUN("{s:s,s:s}", "op", "stat", "path", missing);
        assert_string_equal(error_code(&o), "not_found");
        outcome_clear(&o);
        char under_file[PATH_MAX + 64];
        snprintf(under_file, sizeof under_file, "%s/x/y/f.txt/sub", f->tmp);
        RUN("{s:s,s:s}", "op", "stat", "path", under_file);
        assert_string_equal(error_code(&o), "not_a_directory");
        outcome_clear(&o);

        /* The symlink to / is listed, never followed. */
        RUN("{s:s,s:s,s:i}", "op", "list", "path", f->tmp, "depth", 10);
        json_t *entries = json_object_get(o.result, "entries");
        assert_int_equal(json_array_size(entries), 4); /* x, x/y, x/y/f.txt, x/link */
        assert_true(json_is_false(json_object_get(o.result, "truncated")));
        assert_int_equal(result_int(&o, "total"), 4);
        outcome_clear(&o);
        RUN("{s:s,s:s,s:i}", "op", "list", "path", f->tmp, "depth", 1);
        assert_int_equal(json_array_size(json_object_get(o.result, "entries")), 1);
        outcome_clear(&o);
        RUN("{s:s,s:s,s:i}", "op", "list", "path", f->tmp, "depth", 11);
        assert_string_equal(error_code(&o), "invalid");
        outcome_clear(&o);
        RUN("{s:s,s:s}", "op", "list", "path", file);
        assert_string_equal(error_code(&o), "not_a_directory");
        outcome_clear(&o);

        /* Non-empty directory without recursive; rename; recursive remove. */
        char x[PATH_MAX + 64];
        snprintf(x, sizeof x, "%s/x", f->tmp);
        RUN("{s:s,s:s}", "op", "remove", "path", x);
        assert_string_equal(error_code(&o), "not_empty");
        outcome_clear(&o);
        RUN("{s:s,s:s,s:s}", "op", "rename", "from", x, "to", d2);
        assert_null(json_object_get(o.result, "error"));
        outcome_clear(&o);
        RUN("{s:s,s:s,s:s}", "op", "rename", "from", x, "to", d2);
        assert_string_equal(error_code(&o), "not_found");
        outcome_clear(&o);
        RUN("{s:s,s:s,s:b}", "op", "remove", "path", d2, "recursive", 1);
        assert_null(json_object_get(o.result, "error"));
        assert_int_equal(result_int(&o, "removed"), 4); /* z, z/y, z/y/f.txt, z/link */
        outcome_clear(&o);
        struct stat st;
        assert_int_equal(lstat(d2, &st), -1);
        assert_int_equal(lstat("/", &st), 0); /* the link's target survived, of course */
        /* Nothing there: done, and the answer says nothing went. */
        RUN("{s:s,s:s}", "op", "remove", "path", d2);
        assert_null(json_object_get(o.result, "error"));
        assert_int_equal(result_int(&o, "removed"), 0);
        outcome_clear(&o);
#undef RUN
}

static void test_list_large(void **state) {
        Fixture *f = *state;
        /* More entries than fit one frame and than the bound: EVENT batches,
         * then the RESULT with the rest, "total" and "truncated". */
        for (int i = 0; i < 10005; i++) {
                char path[PATH_MAX + 64];
                snprintf(path, sizeof path, "%s/f-%05d", f->tmp, i);
                int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
                assert_true(fd >= 0);
                close(fd);
        }
        json_t *req = json_pack("{s:s,s:s}", "op", "list", "path", f->tmp);
        ChanStream *s;
        assert_int_equal(channel_open_stream(f->c, req, &s), 0);
        json_decref(req);
        size_t got = 0, batches = 0;
        for (;;) {
                ChanEvent ev;
                assert_int_equal(chan_stream_next(s, 10000, &ev), 0);
                assert_true(ev.type == CHAN_EV_EVENT || ev.type == CHAN_EV_RESULT);
                got += json_array_size(json_object_get(ev.json, "entries"));
                batches++;
                if (ev.type == CHAN_EV_RESULT) {
                        assert_true(json_is_true(json_object_get(ev.json, "truncated")));
                        assert_int_equal(json_integer_value(json_object_get(ev.json, "total")), 10000);
                        chan_event_clear(&ev);
                        break;
                }
                chan_event_clear(&ev);
        }
        chan_stream_free(s);
        assert_int_equal(got, 10000);
        assert_true(batches > 1);
}

static void test_invalid_requests(void **state) {
        Fixture *f = *state;
        static const char *const bad[] = {
                "{\"op\":\"stat\",\"path\":\"relative/path\"}",
                "{\"op\":\"stat\",\"path\":\"\"}",
                "{\"op\":\"stat\"}",
                "{\"op\":\"stat\",\"path\":\"/a\\u0000b\"}",
                "{\"op\":\"nope\"}",
                "[1,2,3]",
                "{\"op\":\"exec\"}",
                "{\"op\":\"exec\",\"argv\":[]}",
                "{\"op\":\"exec\",\"argv\":[\"a\"],\"command\":\"b\"}",
                "{\"op\":\"exec\",\"argv\":[1]}",
                "{\"op\":\"exec\",\"command\":\"true\",\"env\":{\"A=B\":\"c\"}}",
                "{\"op\":\"exec\",\"command\":\"true\",\"timeoutMs\":-1}",
                "{\"op\":\"exec\",\"command\":\"true\",\"cwd\":\"tmp\"}",
                "{\"op\":\"write\",\"path\":\"/tmp/x\",\"mode\":99999}",
                "{\"op\":\"remove\",\"path\":\"/\"}",
                /* Well-formed, but only a restored microVM's agent takes it,
                 * and only as its first request. */
                "{\"op\":\"resume\",\"entropy\":\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
                "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\",\"timeNs\":1796000000000000000,"
                "\"hostname\":\"evil\"}",
                "{\"op\":\"stat\",\"path\":\"/"
                "\",\"x\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                Outcome o;
                run_simple(f->c, bad[i], &o);
                if (!error_code(&o) || strcmp(error_code(&o), "invalid") != 0)
                        fail_msg("request %s was not invalid", bad[i]);
                outcome_clear(&o);
        }
        /* A path of 4097 bytes. */
        char *longp = malloc(4098);
        assert_non_null(longp);
        memset(longp, 'a', 4097);
        longp[0] = '/';
        longp[4097] = '\0';
        json_t *req = json_pack("{s:s,s:s}", "op", "stat", "path", longp);
        Outcome o;
        run_stream(f->c, req, NULL, 0, false, true, &o);
        json_decref(req);
        assert_string_equal(error_code(&o), "invalid");
        outcome_clear(&o);
        free(longp);
        assert_true(channel_is_open(f->c));
}

static void test_busy(void **state) {
        Fixture *f = *state;
        enum { N = 256 };
        ChanStream *s[N + 1];
        for (int i = 0; i <= N; i++) {
                char path[PATH_MAX + 32];
                snprintf(path, sizeof path, "%s/w%d", f->tmp, i);
                json_t *req = json_pack("{s:s,s:s}", "op", "write", "path", path);
                assert_int_equal(channel_open_stream(f->c, req, &s[i]), 0);
                json_decref(req);
        }
        /* The 257th is refused while the others stay open. */
        ChanEvent ev;
        assert_int_equal(chan_stream_next(s[N], 10000, &ev), 0);
        assert_int_equal(ev.type, CHAN_EV_RESULT);
        assert_string_equal(json_string_value(json_object_get(json_object_get(ev.json, "error"), "code")),
                            "busy");
        chan_event_clear(&ev);
        for (int i = 0; i <= N; i++)
                chan_stream_free(s[i]);
        /* Once the cancels are through, a new stream works again. */
        for (int i = 0; i < 50; i++) {
                Outcome o;
                run_simple(f->c, "{\"op\":\"stat\",\"path\":\"/\"}", &o);
                bool ok = error_code(&o) == NULL;
                outcome_clear(&o);
                if (ok)
                        return;
                usleep(20000);
        }
        fail_msg("the agent stayed busy");
}

/* The on_closed callback runs after the streams were woken: wait for it. */
static int wait_closed(Fixture *f) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 10;
        pthread_mutex_lock(&f->lock);
        while (!f->closed && pthread_cond_timedwait(&f->cond, &f->lock, &dl) == 0)
                ;
        int closed = f->closed;
        pthread_mutex_unlock(&f->lock);
        return closed;
}

static void test_malformed_frame_closes(void **state) {
        Fixture *f = *state;
        /* A header with non-zero reserved bytes. */
        uint8_t bad[PROTO_HEADER_SIZE] = {0, 0, 0, 0, 0, 0, 0, 1, PROTO_EOF, 0, 0xff, 0xff};
        assert_int_equal(write(f->raw_fd, bad, sizeof bad), (ssize_t)sizeof bad);
        assert_int_equal(wait_closed(f), 1);
        assert_false(channel_is_open(f->c));
        assert_int_equal(channel_ping(f->c, 1000), -EPIPE);
        json_t *req = parse("{\"op\":\"stat\",\"path\":\"/\"}");
        ChanStream *s;
        assert_int_equal(channel_open_stream(f->c, req, &s), -EPIPE);
        json_decref(req);
        int status;
        assert_int_equal(waitpid(f->pid, &status, 0), f->pid);
        f->pid = 0;
        assert_true(WIFEXITED(status));
        assert_int_not_equal(WEXITSTATUS(status), 0);
}

static void test_closed_wakes_streams(void **state) {
        Fixture *f = *state;
        json_t *req = parse("{\"op\":\"exec\",\"command\":\"sleep 100\"}");
        ChanStream *s;
        assert_int_equal(channel_open_stream(f->c, req, &s), 0);
        json_decref(req);
        ChanEvent ev;
        assert_int_equal(chan_stream_next(s, 10000, &ev), 0);
        assert_int_equal(ev.type, CHAN_EV_EVENT);
        chan_event_clear(&ev);
        kill(f->pid, SIGKILL); /* the sandbox dies under the stream */
        waitpid(f->pid, NULL, 0);
        f->pid = 0;
        assert_int_equal(chan_stream_next(s, 10000, &ev), 0);
        assert_int_equal(ev.type, CHAN_EV_CLOSED);
        assert_int_equal(chan_stream_write(s, "x", 1, 1000), -EPIPE);
        chan_stream_free(s);
        assert_int_equal(wait_closed(f), 1);
}

static void test_free_channel_with_streams(void **state) {
        Fixture *f = *state;
        json_t *req = parse("{\"op\":\"exec\",\"command\":\"sleep 100\",\"stdin\":true}");
        ChanStream *s1, *s2;
        assert_int_equal(channel_open_stream(f->c, req, &s1), 0);
        assert_int_equal(channel_open_stream(f->c, req, &s2), 0);
        json_decref(req);
        /* sleep never reads: past its pipe's buffer and the window, a writer
         * blocks on credit. */
        static uint8_t block[2 * PROTO_INITIAL_WINDOW];
        assert_int_equal(chan_stream_write(s2, block, sizeof block, 500), -ETIMEDOUT);
        channel_free(f->c);
        f->c = NULL;
        ChanEvent ev;
        /* Streams outlive the channel until their owners free them. */
        for (;;) {
                assert_int_equal(chan_stream_next(s1, 1000, &ev), 0);
                if (ev.type == CHAN_EV_CLOSED)
                        break;
                chan_event_clear(&ev);
        }
        assert_int_equal(chan_stream_write(s2, "x", 1, 1000), -EPIPE);
        assert_int_equal(chan_stream_close_write(s2), -EPIPE);
        chan_stream_cancel(s2);
        chan_stream_free(s1);
        chan_stream_free(s2);
        /* on_closed is for the agent's end of things, not the host's own free. */
        pthread_mutex_lock(&f->lock);
        assert_int_equal(f->closed, 0);
        pthread_mutex_unlock(&f->lock);
}

/* ---- a scripted agent: the channel against a hostile peer ---- */

typedef struct Fake {
        int fd; /* the agent's end */
        Channel *c;
        ProtoReader *r;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        int closed;
} Fake;

static void fake_on_closed(void *userdata, const char *reason) {
        Fake *k = userdata;
        pthread_mutex_lock(&k->lock);
        k->closed++;
        pthread_cond_broadcast(&k->cond);
        pthread_mutex_unlock(&k->lock);
}

static int fake_setup(void **state) {
        Fake *k = calloc(1, sizeof(Fake));
        assert_non_null(k);
        pthread_mutex_init(&k->lock, NULL);
        pthread_cond_init(&k->cond, NULL);
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        k->fd = sv[1];
        k->c = channel_new(sv[0], fake_on_closed, k);
        assert_non_null(k->c);
        k->r = proto_reader_new();
        static const char hello[] = "{\"version\":1,\"pid\":1,\"kernel\":\"test\"}";
        assert_int_equal(proto_write_frame(k->fd, PROTO_HELLO, 0, 0, hello, sizeof hello - 1), 0);
        json_t *h = NULL;
        assert_int_equal(channel_wait_hello(k->c, 5000, &h), 0);
        json_decref(h);
        *state = k;
        return 0;
}

static int fake_teardown(void **state) {
        Fake *k = *state;
        channel_free(k->c);
        close(k->fd);
        proto_reader_free(k->r);
        pthread_mutex_destroy(&k->lock);
        pthread_cond_destroy(&k->cond);
        free(k);
        return 0;
}

/* The next frame the host sent, skipping PINGs (never answered here) and
 * WINDOW frames unless wanted. */
static void fake_read(Fake *k, bool want_window, ProtoHeader *h, uint8_t *payload, size_t cap) {
        for (;;) {
                const uint8_t *p;
                int r = proto_reader_next(k->r, h, &p);
                assert_true(r >= 0);
                if (r == 1) {
                        if ((h->type == PROTO_WINDOW && !want_window) || h->type == PROTO_PING)
                                continue;
                        assert_true(h->length <= cap);
                        memcpy(payload, p, h->length);
                        return;
                }
                uint8_t buf[65536];
                ssize_t n = read(k->fd, buf, sizeof buf);
                assert_true(n > 0);
                assert_int_equal(proto_reader_feed(k->r, buf, (size_t)n), 0);
        }
}

static ChanStream *fake_open(Fake *k, uint32_t *ret_id) {
        json_t *req = parse("{\"op\":\"exec\",\"command\":\"x\"}");
        ChanStream *s;
        assert_int_equal(channel_open_stream(k->c, req, &s), 0);
        json_decref(req);
        ProtoHeader h;
        uint8_t p[PROTO_MAX_JSON];
        fake_read(k, false, &h, p, sizeof p);
        assert_int_equal(h.type, PROTO_OPEN);
        assert_int_equal(h.stream & 1u, 1);
        *ret_id = h.stream;
        return s;
}

static int fake_wait_closed(Fake *k) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 5;
        pthread_mutex_lock(&k->lock);
        while (!k->closed && pthread_cond_timedwait(&k->cond, &k->lock, &dl) == 0)
                ;
        int closed = k->closed;
        pthread_mutex_unlock(&k->lock);
        return closed;
}

typedef struct DataWrite {
        ChanStream *s;
        const uint8_t *data;
        size_t n;
        int r;
} DataWrite;

static void *data_write(void *arg) {
        DataWrite *w = arg;
        w->r = chan_stream_write(w->s, w->data, w->n, 5000);
        return NULL;
}

/* DATA to the agent goes in frames that a writable socket has room for
 * whole (frame_room waits for that room): a daemon that dies never leaves
 * the agent part of one. As root the daemon raises the socket's buffer so
 * that the largest frame fits; otherwise a default buffer takes about
 * 128 KiB. */
static void test_fake_data_frames_are_bounded(void **state) {
        Fake *k = *state;
        uint32_t id;
        ChanStream *s = fake_open(k, &id);
        uint8_t w[4];
        proto_put_u32(w, 1024 * 1024);
        assert_int_equal(proto_write_frame(k->fd, PROTO_WINDOW, 0, id, w, 4), 0);
        static uint8_t data[300 * 1024];
        memset(data, 'd', sizeof data);
        /* More than the socket holds: written while it is read. */
        DataWrite dw = { .s = s, .data = data, .n = sizeof data };
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, data_write, &dw), 0);
        size_t got = 0, first = 0;
        static uint8_t p[PROTO_MAX_PAYLOAD];
        while (got < sizeof data) {
                ProtoHeader h;
                fake_read(k, false, &h, p, sizeof p);
                assert_int_equal(h.type, PROTO_DATA);
                if (!first)
                        first = h.length;
                assert_true(h.length <= first);
                got += h.length;
        }
        if (geteuid() == 0)
                assert_int_equal(first, PROTO_MAX_PAYLOAD);
        else
                assert_true(first >= 16 * 1024 && first <= 160 * 1024);
        assert_int_equal(got, sizeof data);
        pthread_join(th, NULL);
        assert_int_equal(dw.r, 0);
        chan_stream_cancel(s);
        chan_stream_free(s);
}

static void send_all_fd(int fd, const void *buf, size_t n) {
        const uint8_t *p = buf;
        while (n > 0) {
                ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
                assert_true(k > 0);
                p += k;
                n -= (size_t)k;
        }
}

typedef struct TakeOver {
        Channel *c;
        json_t *hello;
        int r;
} TakeOver;

static void *take_over_attach(void *arg) {
        TakeOver *t = arg;
        t->r = channel_attach(t->c, 10000, &t->hello);
        return NULL;
}

static void wait_taken(int fd) {
        for (int i = 0; i < 10000; i++) {
                int queued = -1;
                assert_int_equal(ioctl(fd, SIOCOUTQ, &queued), 0);
                if (queued == 0)
                        return;
                usleep(1000);
        }
        fail_msg("the channel did not read what was sent");
}

/* A channel taken over from a supervisor: whatever the agent sent before
 * (the rest of a frame the last daemon began to read, garbage) is skipped up
 * to the echo of the DETACH the daemon sends, even split across reads. */
static void test_take_over_skips_to_the_echo(void **state) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        /* The supervisor's copy of the host's end. */
        int sup = fcntl(sv[0], F_DUPFD_CLOEXEC, 3);
        assert_true(sup >= 0);
        Fake k = { .fd = sv[1] };
        pthread_mutex_init(&k.lock, NULL);
        pthread_cond_init(&k.cond, NULL);
        k.r = proto_reader_new();
        /* Bytes before the take-over: the tail of a frame and garbage. */
        static uint8_t before[5000];
        memset(before, 0xee, sizeof before);
        send_all_fd(k.fd, before, sizeof before);
        k.c = channel_take_over(sv[0], fake_on_closed, &k);
        assert_non_null(k.c);
        TakeOver t = { .c = k.c };
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, take_over_attach, &t), 0);
        ProtoHeader h;
        uint8_t token[64];
        fake_read(&k, false, &h, token, sizeof token);
        assert_int_equal(h.type, PROTO_DETACH);
        assert_int_equal(h.length, CHANNEL_TOKEN_LEN);
        uint8_t body[16];
        fake_read(&k, false, &h, body, sizeof body);
        assert_int_equal(h.type, PROTO_ATTACH);
        /* More garbage, a header of the right kind with another token, then
         * the echo in two reads, then the HELLO right behind it. */
        send_all_fd(k.fd, before, 100);
        uint8_t echo[PROTO_HEADER_SIZE + CHANNEL_TOKEN_LEN];
        ProtoHeader eh = { .length = CHANNEL_TOKEN_LEN, .type = PROTO_DETACH };
        assert_int_equal(proto_header_encode(&eh, echo), 0);
        memset(echo + PROTO_HEADER_SIZE, 0, CHANNEL_TOKEN_LEN);
        send_all_fd(k.fd, echo, sizeof echo);
        memcpy(echo + PROTO_HEADER_SIZE, token, CHANNEL_TOKEN_LEN);
        send_all_fd(k.fd, echo, 20);
        wait_taken(k.fd);
        send_all_fd(k.fd, echo + 20, sizeof echo - 20);
        static const char hello[] = "{\"version\":1,\"pid\":1,\"kernel\":\"test\",\"attached\":{\"processes\":[]}}";
        assert_int_equal(proto_write_frame(k.fd, PROTO_HELLO, 0, 0, hello, sizeof hello - 1), 0);
        pthread_join(th, NULL);
        assert_int_equal(t.r, 0);
        assert_non_null(json_object_get(t.hello, "attached"));
        json_decref(t.hello);
        assert_true(channel_is_open(k.c));
        /* Let go at a stop: the socket is left as it is for the supervisor,
         * by the reader's end and by the free (a shut-down socket would
         * refuse the agent's writes). */
        channel_let_go(k.c);
        assert_int_equal(fake_wait_closed(&k), 1);
        assert_int_equal(send(k.fd, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT), 1);
        channel_free(k.c);
        assert_int_equal(send(k.fd, "y", 1, MSG_NOSIGNAL | MSG_DONTWAIT), 1);
        char two[2];
        assert_int_equal(recv(sup, two, 2, MSG_DONTWAIT), 2);
        close(sup);
        close(k.fd);
        proto_reader_free(k.r);
        pthread_mutex_destroy(&k.lock);
        pthread_cond_destroy(&k.cond);
}

static void test_fake_tiny_frames(void **state) {
        Fake *k = *state;
        uint32_t id;
        ChanStream *s = fake_open(k, &id);
        /* 200000 one-byte frames alternating stdout and stderr, plus empty
         * ones, nobody consuming: the queue stays bounded and nothing is lost
         * or reordered within one fd. */
        enum { N = 100000 };
        uint8_t *batch = malloc((size_t)N * 2 * (PROTO_HEADER_SIZE + 1) + PROTO_HEADER_SIZE);
        size_t off = 0;
        for (int i = 0; i < N; i++) {
                for (int fd = 1; fd <= 2; fd++) {
                        ProtoHeader h = {
                                .length = 1, .stream = id, .type = PROTO_DATA, .flags = (uint8_t)fd};
                        assert_int_equal(proto_header_encode(&h, batch + off), 0);
                        batch[off + PROTO_HEADER_SIZE] = (uint8_t)(fd == 1 ? i : ~i);
                        off += PROTO_HEADER_SIZE + 1;
                }
        }
        ProtoHeader empty = {.length = 0, .stream = id, .type = PROTO_DATA, .flags = 1};
        assert_int_equal(proto_header_encode(&empty, batch + off), 0);
        off += PROTO_HEADER_SIZE;
        for (size_t w = 0; w < off;) {
                ssize_t n = write(k->fd, batch + w, off - w);
                assert_true(n > 0);
                w += (size_t)n;
        }
        free(batch);
        assert_int_equal(proto_write_frame(k->fd, PROTO_RESULT, 0, id, "{}", 2), 0);
        /* Frames are handled in order: once the PONG is back, all of the
         * above sits in the stream's queue. */
        assert_int_equal(proto_write_frame(k->fd, PROTO_PING, 0, 0, "sync", 4), 0);
        ProtoHeader h;
        uint8_t p[64];
        fake_read(k, false, &h, p, sizeof p);
        assert_int_equal(h.type, PROTO_PONG);
        size_t got[3] = {0};
        size_t events = 0;
        for (;;) {
                ChanEvent ev;
                assert_int_equal(chan_stream_next(s, 5000, &ev), 0);
                if (ev.type == CHAN_EV_RESULT) {
                        chan_event_clear(&ev);
                        break;
                }
                assert_int_equal(ev.type, CHAN_EV_DATA);
                for (size_t i = 0; i < ev.len; i++) {
                        size_t n = got[ev.fd]++;
                        assert_int_equal(ev.data[i], (uint8_t)(ev.fd == 1 ? n : ~n));
                }
                events++;
                chan_event_clear(&ev);
        }
        assert_int_equal(got[1], N);
        assert_int_equal(got[2], N);
        assert_true(events < 5000);
        chan_stream_free(s);
        assert_true(channel_is_open(k->c));
}

typedef struct CreditWriter {
        ChanStream *s;
        int first, second;
} CreditWriter;

static void *credit_writer_main(void *arg) {
        CreditWriter *cw = arg;
        static uint8_t big[PROTO_INITIAL_WINDOW];
        cw->first = chan_stream_write(cw->s, big, sizeof big, 10000);
        cw->second = chan_stream_write(cw->s, big, 1000, 300);
        return NULL;
}

static void test_fake_protocol(void **state) {
        Fake *k = *state;
        /* PING from the agent is answered. */
        assert_int_equal(proto_write_frame(k->fd, PROTO_PING, 0, 0, "abc", 3), 0);
        ProtoHeader h;
        static uint8_t p[PROTO_MAX_PAYLOAD + 1];
        fake_read(k, false, &h, p, sizeof p);
        assert_int_equal(h.type, PROTO_PONG);
        assert_memory_equal(p, "abc", 3);
        /* An agent-opened (egress) stream is refused for now. */
        assert_int_equal(proto_write_frame(k->fd, PROTO_OPEN, 0, 2, "{\"op\":\"connect\"}", 16), 0);
        fake_read(k, false, &h, p, sizeof p);
        assert_int_equal(h.type, PROTO_RESULT);
        assert_int_equal(h.stream, 2);
        p[h.length] = '\0';
        assert_non_null(strstr((char *)p, "egress is not enabled"));
        /* Frames for streams nobody opened are ignored. */
        assert_int_equal(proto_write_frame(k->fd, PROTO_DATA, 1, 99, "zz", 2), 0);
        assert_int_equal(proto_write_frame(k->fd, PROTO_RESULT, 0, 97, "{}", 2), 0);
        assert_int_equal(channel_ping(k->c, 0), -ETIMEDOUT); /* nobody answers our pings here */

        /* Host writes wait for credit and resume on WINDOW. */
        uint32_t id;
        ChanStream *s = fake_open(k, &id);
        CreditWriter cw = {.s = s};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, credit_writer_main, &cw), 0);
        size_t got = 0;
        while (got < PROTO_INITIAL_WINDOW) {
                fake_read(k, false, &h, p, sizeof p);
                assert_int_equal(h.type, PROTO_DATA);
                assert_int_equal(h.flags, PROTO_FD_IN);
                got += h.length;
        }
        pthread_join(th, NULL);
        assert_int_equal(got, PROTO_INITIAL_WINDOW);
        assert_int_equal(cw.first, 0);
        assert_int_equal(cw.second, -ETIMEDOUT);
        uint8_t w[4];
        proto_put_u32(w, 500);
        assert_int_equal(proto_write_frame(k->fd, PROTO_WINDOW, 0, id, w, 4), 0);
        assert_int_equal(chan_stream_write(s, "0123456789", 10, 5000), 0);
        fake_read(k, false, &h, p, sizeof p);
        assert_int_equal(h.type, PROTO_DATA);
        assert_int_equal(h.length, 10);
        /* Consuming DATA hands credit back, in batches. */
        static uint8_t data[70000];
        assert_int_equal(proto_write_frame(k->fd, PROTO_DATA, 1, id, data, 5), 0);
        assert_int_equal(proto_write_frame(k->fd, PROTO_DATA, 2, id, data, sizeof data), 0);
        ChanEvent ev;
        for (int i = 0; i < 2; i++) {
                assert_int_equal(chan_stream_next(s, 5000, &ev), 0);
                assert_int_equal(ev.type, CHAN_EV_DATA);
                assert_int_equal(ev.len, i == 0 ? 5 : sizeof data);
                chan_event_clear(&ev);
        }
        for (;;) {
                fake_read(k, true, &h, p, sizeof p);
                if (h.type == PROTO_WINDOW)
                        break;
        }
        assert_int_equal(h.stream, id);
        assert_int_equal(proto_get_u32(p), 5 + sizeof data);
        /* Freeing before the RESULT cancels. */
        chan_stream_free(s);
        for (;;) {
                fake_read(k, false, &h, p, sizeof p);
                if (h.type == PROTO_CANCEL)
                        break;
        }
        assert_int_equal(h.stream, id);
        assert_true(channel_is_open(k->c));
}

static void test_fake_beyond_credit(void **state) {
        Fake *k = *state;
        uint32_t id;
        ChanStream *s = fake_open(k, &id);
        static uint8_t chunk[PROTO_MAX_PAYLOAD];
        for (unsigned i = 0; i <= PROTO_INITIAL_WINDOW / PROTO_MAX_PAYLOAD; i++)
                if (proto_write_frame(k->fd, PROTO_DATA, 1, id, chunk, sizeof chunk) < 0)
                        break;
        assert_int_equal(fake_wait_closed(k), 1);
        ChanEvent ev;
        /* What was within the credit is still delivered, then CLOSED. */
        for (;;) {
                assert_int_equal(chan_stream_next(s, 5000, &ev), 0);
                if (ev.type == CHAN_EV_CLOSED)
                        break;
                chan_event_clear(&ev);
        }
        chan_stream_free(s);
}

static void test_fake_event_flood(void **state) {
        Fake *k = *state;
        uint32_t id;
        ChanStream *s = fake_open(k, &id);
        char ev_json[8192];
        memset(ev_json, ' ', sizeof ev_json);
        memcpy(ev_json, "{}", 2);
        for (int i = 0; i < 1024; i++)
                if (proto_write_frame(k->fd, PROTO_EVENT, 0, id, ev_json, sizeof ev_json) < 0)
                        break;
        assert_int_equal(fake_wait_closed(k), 1);
        chan_stream_free(s);
}

static void test_fake_bad_json(void **state) {
        Fake *k = *state;
        uint32_t id;
        ChanStream *s = fake_open(k, &id);
        char deep[200];
        memset(deep, '[', 100);
        memset(deep + 100, ']', 100);
        assert_int_equal(proto_write_frame(k->fd, PROTO_RESULT, 0, id, deep, sizeof deep), 0);
        assert_int_equal(fake_wait_closed(k), 1);
        ChanEvent ev;
        assert_int_equal(chan_stream_next(s, 5000, &ev), 0);
        assert_int_equal(ev.type, CHAN_EV_CLOSED);
        chan_stream_free(s);
}

/* Only a microVM's agent, or one started --restorable (gVisor's), takes a
 * checkpoint: this one refuses it, and the channel's write lock is not left
 * held. */
static void test_checkpoint_refused_outside_vm(void **state) {
        Fixture *f = *state;
        json_t *req = parse("{\"op\":\"checkpoint\"}");
        assert_int_equal(channel_checkpoint_begin(f->c, req, 10000), -EPROTO);
        json_decref(req);
        assert_int_equal(channel_ping(f->c, 5000), 0);
        assert_true(channel_is_open(f->c));
}

/* The next frame from a raw agent that is not a WINDOW or a PING. */
static void raw_next(int fd, ProtoReader *rd, ProtoHeader *h, char *payload, size_t cap) {
        for (;;) {
                const uint8_t *p;
                int r = proto_reader_next(rd, h, &p);
                assert_true(r >= 0);
                if (r == 1) {
                        if (h->type == PROTO_WINDOW || h->type == PROTO_PING)
                                continue;
                        assert_true(h->length < cap);
                        memcpy(payload, p, h->length);
                        payload[h->length] = '\0';
                        return;
                }
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                assert_int_equal(poll(&pfd, 1, 10000), 1);
                uint8_t buf[65536];
                ssize_t n = read(fd, buf, sizeof buf);
                assert_true(n > 0);
                assert_int_equal(proto_reader_feed(rd, buf, (size_t)n), 0);
        }
}

/* gVisor's agent (--restorable): a fresh start refuses resume (a client
 * of the channel cannot make it drop its streams); after a checkpoint it
 * sends nothing, and a copy's first request, resume, is answered and
 * followed by a new HELLO on which the copy's channel starts. */
static void test_restorable_checkpoint_and_resume(void **state) {
        (void)state;
        if (!agent_path[0])
                find_agent();
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                dup2(sv[1], 0);
                dup2(sv[1], 1);
                int null_fd = open("/dev/null", O_WRONLY);
                dup2(null_fd, 2);
                execl(agent_path, agent_path, "--restorable", (char *)NULL);
                _exit(127);
        }
        close(sv[1]);
        int fd = sv[0];
        ProtoReader *rd = proto_reader_new();
        assert_non_null(rd);
        ProtoHeader h;
        char payload[4096], why[256] = "";
        raw_next(fd, rd, &h, payload, sizeof payload);
        assert_int_equal(h.type, PROTO_HELLO);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        assert_int_equal(driver_agent_resume(fd, "copy-1", now_ms + 10000, why, sizeof why), -EIO);
        assert_non_null(strstr(why, "resume"));
        const char ck[] = "{\"op\":\"checkpoint\"}";
        assert_int_equal(proto_write_frame(fd, PROTO_OPEN, 0, 3, ck, sizeof ck - 1), 0);
        raw_next(fd, rd, &h, payload, sizeof payload);
        assert_int_equal(h.type, PROTO_RESULT);
        assert_int_equal(h.stream, 3);
        assert_null(strstr(payload, "error"));
        /* Quiet now: nothing comes until the host's next frame. */
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, 200), 0);
        assert_int_equal(driver_agent_resume(fd, "copy-1", now_ms + 10000, why, sizeof why), 0);
        raw_next(fd, rd, &h, payload, sizeof payload);
        assert_int_equal(h.type, PROTO_HELLO);
        proto_reader_free(rd);
        close(fd);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
}

typedef struct CheckpointCall {
        Channel *c;
        int r;
        bool opened;
} CheckpointCall;

static void *checkpoint_thread(void *arg) {
        CheckpointCall *cc = arg;
        json_t *req = parse("{\"op\":\"checkpoint\"}");
        cc->r = channel_checkpoint_begin(cc->c, req, 10000);
        json_decref(req);
        return NULL;
}

static void *open_thread(void *arg) {
        CheckpointCall *cc = arg;
        json_t *req = parse("{\"op\":\"stat\",\"path\":\"/\"}");
        ChanStream *s = NULL;
        cc->opened = channel_open_stream(cc->c, req, &s) == 0;
        json_decref(req);
        chan_stream_free(s);
        return NULL;
}

/* A checkpoint answered after a flood of DATA on its stream (an agent the
 * sandbox controls): no credit goes back while the write lock is held, so
 * nothing deadlocks; until the end nothing at all is written to the agent,
 * and a request made meanwhile goes out after it. */
static void test_fake_checkpoint(void **state) {
        Fake *k = *state;
        CheckpointCall cc = { .c = k->c };
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, checkpoint_thread, &cc), 0);
        ProtoHeader h;
        static uint8_t p[PROTO_MAX_PAYLOAD];
        fake_read(k, false, &h, p, sizeof p);
        assert_int_equal(h.type, PROTO_OPEN);
        assert_non_null(memmem(p, h.length, "checkpoint", 10));
        memset(p, 'x', 65536);
        for (int i = 0; i < 2; i++)
                assert_int_equal(proto_write_frame(k->fd, PROTO_DATA, PROTO_FD_OUT, h.stream, p, 65536), 0);
        assert_int_equal(proto_write_frame(k->fd, PROTO_RESULT, 0, h.stream, "{}", 2), 0);
        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(cc.r, 0);
        pthread_t o;
        assert_int_equal(pthread_create(&o, NULL, open_thread, &cc), 0);
        /* Watched, not slept on: the subject is that nothing arrives. */
        struct pollfd pf = { .fd = k->fd, .events = POLLIN };
        assert_int_equal(poll(&pf, 1, 300), 0);
        channel_checkpoint_end(k->c);
        fake_read(k, false, &h, p, sizeof p);
        assert_int_equal(h.type, PROTO_OPEN);
        assert_non_null(memmem(p, h.length, "stat", 4));
        assert_int_equal(proto_write_frame(k->fd, PROTO_RESULT, 0, h.stream, "{}", 2), 0);
        assert_int_equal(pthread_join(o, NULL), 0);
        assert_true(cc.opened);
        assert_true(channel_is_open(k->c));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_ping, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_echo, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_cannot_start, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_stdin, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_env_cwd, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_timeout_kills_group, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_background_holder, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_cancel, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_large_output, setup, teardown),
                cmocka_unit_test_setup_teardown(test_exec_concurrent, setup, teardown),
                cmocka_unit_test_setup_teardown(test_file_write_read, setup, teardown),
                cmocka_unit_test_setup_teardown(test_file_write_cancel, setup, teardown),
                cmocka_unit_test_setup_teardown(test_file_ops, setup, teardown),
                cmocka_unit_test_setup_teardown(test_list_large, setup, teardown),
                cmocka_unit_test_setup_teardown(test_invalid_requests, setup, teardown),
                cmocka_unit_test_setup_teardown(test_busy, setup, teardown),
                cmocka_unit_test_setup_teardown(test_malformed_frame_closes, setup, teardown),
                cmocka_unit_test_setup_teardown(test_closed_wakes_streams, setup, teardown),
                cmocka_unit_test_setup_teardown(test_free_channel_with_streams, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fake_tiny_frames, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_protocol, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_beyond_credit, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_event_flood, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_bad_json, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_data_frames_are_bounded, fake_setup, fake_teardown),
                cmocka_unit_test(test_take_over_skips_to_the_echo),
                cmocka_unit_test_setup_teardown(test_checkpoint_refused_outside_vm, setup, teardown),
                cmocka_unit_test(test_restorable_checkpoint_and_resume),
                cmocka_unit_test_setup_teardown(test_fake_checkpoint, fake_setup, fake_teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
