#include "cli/run.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/client.h"
#include "cli/format.h"
#include "cli/keys.h"
#include "cli/parse.h"
#include "cli/sandbox.h"
#include "common/macro.h"
#include "common/timeutil.h"

/* Exit code for output that cannot be written (a reader that went away, as
 * in `runtime sandbox run -- yes | head`): what a shell reports for SIGPIPE. */
#define EXIT_BROKEN_PIPE 141

typedef struct ExecOutcome {
        bool json; /* --json: pass the events on as they are */
        bool exited;
        bool timed_out;
        long long exit_code;
        bool failed; /* an "error" event */
        CliError err;
        char process_id[32]; /* from the start event */
} ExecOutcome;

int run_exit_code(long long exit_code, bool timed_out) {
        if (timed_out)
                return CLI_EXIT_TIMEOUT;
        if (exit_code < 0 || exit_code > 255)
                return 255;
        return (int)exit_code;
}

/* A reader that went away is -EPIPE whatever the output is: a pipe says
 * EPIPE, a socket (what many supervisors hand a child as its stdout) says
 * ECONNRESET when its reader closed with output still unread. */
static int write_errno(void) {
        int e = errno ?: EIO;
        return e == ECONNRESET ? -EPIPE : -e;
}

static int write_all(FILE *f, const char *data, size_t len) {
        if (len > 0 && fwrite(data, 1, len, f) != len)
                return write_errno();
        if (fflush(f) != 0)
                return write_errno();
        return 0;
}

static int on_event(const char *line, size_t len, void *userdata) {
        ExecOutcome *o = userdata;
        _cleanup_json_ json_t *ev = NULL;
        const char *type;
        json_t *data;
        int r;

        ev = json_loadb(line, len, 0, NULL);
        type = json_string_value(json_object_get(ev, "type"));
        if (!type)
                return -EBADMSG;
        if (o->json) {
                r = write_all(stdout, line, len);
                if (r == 0)
                        r = write_all(stdout, "\n", 1);
                if (r < 0)
                        return r;
        }
        if (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0) {
                bool is_stdout = strcmp(type, "stdout") == 0;

                data = json_object_get(ev, "data");
                if (!json_is_string(data))
                        return -EBADMSG;
                if (!o->json)
                        return write_all(is_stdout ? stdout : stderr, json_string_value(data),
                                         json_string_length(data));
        } else if (strcmp(type, "exit") == 0) {
                json_t *code = json_object_get(ev, "exitCode");
                if (!json_is_integer(code))
                        return -EBADMSG;
                o->exited = true;
                o->exit_code = (long long)json_integer_value(code);
                o->timed_out = json_is_true(json_object_get(ev, "timedOut"));
        } else if (strcmp(type, "error") == 0) {
                o->failed = true;
                cli_error_from_json(&o->err, 0, line, len);
        } else if (strcmp(type, "start") == 0) {
                const char *pid = json_string_value(json_object_get(ev, "processId"));
                if (pid && strlen(pid) < sizeof(o->process_id))
                        snprintf(o->process_id, sizeof(o->process_id), "%s", pid);
        }
        /* Types this version does not know are skipped. */
        return 0;
}

/* Reads all of stdin for -i, at most the API's 16 MiB. */
static int read_stdin(char **ret, size_t *ret_len) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0, cap = 0;
        ssize_t n;

        for (;;) {
                if (len == cap) {
                        size_t ncap = cap ? cap * 2 : 65536;
                        char *b;
                        if (ncap > (size_t)CLI_STDIN_MAX + 1)
                                ncap = (size_t)CLI_STDIN_MAX + 1;
                        if (ncap == cap)
                                return -EFBIG;
                        b = realloc(buf, ncap);
                        if (!b)
                                return -ENOMEM;
                        buf = b;
                        cap = ncap;
                }
                n = read(STDIN_FILENO, buf + len, cap - len);
                if (n < 0) {
                        if (errno == EINTR && !cli_interrupted)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        break;
                len += (size_t)n;
        }
        *ret = TAKE_PTR(buf);
        *ret_len = len;
        return 0;
}

static int add_stdin(json_t *body) {
        _cleanup_free_ char *data = NULL, *b64 = NULL;
        size_t len = 0;
        int r;

        r = read_stdin(&data, &len);
        if (r == -EFBIG)
                return cli_fail("stdin is larger than 16 MiB; copy big inputs in with 'runtime files put'");
        if (r == -EINTR)
                return cli_interrupted_exit();
        if (r < 0)
                return cli_fail("cannot read stdin: %s", strerror(-r));
        b64 = base64_encode(data ? data : "", len);
        if (!b64 || json_object_set_new(body, "stdinBase64", json_string(b64)) < 0)
                return cli_fail("out of memory");
        return 0;
}

/* Runs the exec stream and turns its outcome into an exit code. */
static int stream_exec(Client *c, const char *id, json_t *body, bool json) {
        ExecOutcome o = {.json = json};
        char path[128];
        CliError e;
        int r;

        snprintf(path, sizeof(path), "/v1/sandboxes/%s:exec", id);
        r = client_stream_lines(c, "POST", path, body, on_event, &o, &e);
        if ((r == -EINTR || r == -EPIPE) && o.process_id[0]) {
                /* The command is a process that outlives its stream: end it, as
                 * Ctrl-C at a terminal would. */
                _cleanup_json_ json_t *sig = json_pack("{s:s}", "signal", "SIGKILL");
                client_set_interrupt(c, NULL);
                snprintf(path, sizeof(path), "/v1/sandboxes/%s/processes/%s:signal", id, o.process_id);
                if (sig)
                        (void)client_json(c, "POST", path, sig, NULL, &e);
        }
        if (r == -EINTR)
                return cli_interrupted_exit();
        if (r == -EPIPE)
                return EXIT_BROKEN_PIPE;
        if (r == -EBADMSG)
                return cli_fail("runtimed sent an event this client cannot read");
        if (r < 0)
                return cli_error_print(&e);
        if (o.failed)
                return cli_error_print(&o.err);
        if (!o.exited)
                return cli_fail("the output of the command ended before it exited");
        return run_exit_code(o.exit_code, o.timed_out);
}

/* Renews the lease of a `run` sandbox while its command runs, so a command
 * without --timeout is not cut off by a short lease, and a CLI that dies
 * leaves a sandbox that goes away within one lease. */
typedef struct LeaseKeeper {
        pthread_t thread;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        bool stop, started, warned;
        volatile sig_atomic_t abort_request; /* cuts an extend in flight short at stop */
        Client *client;
        const char *id;
        long long lease_s;
        int64_t ends_s; /* the lease's end, in seconds of the monotonic clock */
} LeaseKeeper;

static void *keeper_main(void *userdata) {
        LeaseKeeper *k = userdata;
        char path[128];
        sigset_t mask;

        /* Signals go to the main thread, which decides what they mean. */
        sigemptyset(&mask);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGHUP);
        pthread_sigmask(SIG_BLOCK, &mask, NULL);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s:extend", k->id);
        pthread_mutex_lock(&k->lock);
        while (!k->stop) {
                struct timespec wake;
                long long remaining, add;

                time_mono_deadline(&wake, (k->lease_s / 4 > 0 ? k->lease_s / 4 : 1) * 1000LL);
                pthread_cond_timedwait(&k->cond, &k->lock, &wake);
                if (k->stop)
                        break;
                int64_t now_s = (int64_t)(time_now_mono_ms() / 1000);
                remaining = (long long)(k->ends_s - now_s);
                if (remaining > k->lease_s / 2)
                        continue;
                add = k->lease_s - (remaining > 0 ? remaining : 0);
                pthread_mutex_unlock(&k->lock);
                {
                        _cleanup_json_ json_t *body = json_pack("{s:I}", "seconds", (json_int_t)add);
                        CliError e;
                        int r = body ? client_json(k->client, "POST", path, body, NULL, &e) : -ENOMEM;
                        pthread_mutex_lock(&k->lock);
                        if (r == 0)
                                k->ends_s = (remaining > 0 ? k->ends_s : now_s) + add;
                        else if (!k->warned && !k->stop) {
                                k->warned = true;
                                fprintf(stderr, "runtime: cannot renew the lease of %s: %s\n", k->id,
                                        r == -ENOMEM ? "out of memory" : e.message);
                        }
                }
        }
        pthread_mutex_unlock(&k->lock);
        return NULL;
}

static int keeper_start(LeaseKeeper *k, CliContext *ctx, const char *id, long long lease_s) {
        int r;

        *k = (LeaseKeeper){.id = id, .lease_s = lease_s};
        r = cli_connect(ctx, true, &k->client);
        if (r > 0)
                return -EIO;
        /* Not Ctrl-C but keeper_stop() ends this thread's requests. */
        client_set_interrupt(k->client, &k->abort_request);
        k->ends_s = (int64_t)(time_now_mono_ms() / 1000) + lease_s;
        pthread_mutex_init(&k->lock, NULL);
        r = time_cond_init_mono(&k->cond);
        if (r < 0) {
                pthread_mutex_destroy(&k->lock);
                k->client = client_free(k->client);
                return r;
        }
        r = pthread_create(&k->thread, NULL, keeper_main, k);
        if (r != 0) {
                k->client = client_free(k->client);
                return -r;
        }
        k->started = true;
        return 0;
}

static void keeper_stop(LeaseKeeper *k) {
        if (!k->started)
                return;
        pthread_mutex_lock(&k->lock);
        k->stop = true;
        k->abort_request = 1;
        pthread_cond_signal(&k->cond);
        pthread_mutex_unlock(&k->lock);
        pthread_join(k->thread, NULL);
        pthread_cond_destroy(&k->cond);
        pthread_mutex_destroy(&k->lock);
        k->client = client_free(k->client);
        k->started = false;
}

static void delete_sandbox(Client *c, const char *id) {
        char path[128];
        CliError e;

        /* A first Ctrl-C must not cut the clean-up short; a second one may. */
        client_set_interrupt(c, &cli_interrupted_again);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        /* Gone already (its lease ended with onLeaseEnd "delete") is what we want. */
        if (client_json(c, "DELETE", path, NULL, NULL, &e) < 0 && e.status != 404) {
                fprintf(stderr, "runtime: could not delete sandbox %s: %s\n", id, e.message);
                if (e.hint[0])
                        fprintf(stderr, "hint: %s\n", e.hint);
        }
}

int cmd_sandbox_run(CliContext *ctx, int argc, char **argv) {
        _cleanup_(sandbox_args_done) SandboxArgs a = {0};
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *create = NULL, *exec = NULL, *sbx = NULL;
        _cleanup_free_ char *id = NULL;
        LeaseKeeper keeper = {0};
        char err[CLI_ERR_MAX];
        CliError e;
        int r;

        r = sandbox_args_parse(SANDBOX_VERB_RUN, argc, argv, &a, err, sizeof(err));
        if (r < 0)
                return cli_usage_error("sandbox run", sandbox_run_usage, "%s", err);
        if (a.help) {
                sandbox_print_help(SANDBOX_VERB_RUN);
                return CLI_EXIT_OK;
        }
        ctx->json |= a.json;
        create = sandbox_create_body(&a, SANDBOX_VERB_RUN);
        exec = sandbox_exec_body(&a, SANDBOX_VERB_RUN);
        if (!create || !exec)
                return cli_fail("an argument is not valid UTF-8");
        if (a.trial && (r = cli_use_trial_key(ctx)) > 0)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        /* Stdin first: a sandbox should not wait on a typist. */
        if (a.interactive) {
                r = add_stdin(exec);
                if (r > 0)
                        return r;
        }
        if (cli_interrupted)
                return cli_interrupted_exit();

        /* A create cut short may still make a sandbox that we would never
         * learn the id of; only a second Ctrl-C abandons it. */
        client_set_interrupt(c, &cli_interrupted_again);
        r = client_json(c, "POST", "/v1/sandboxes", create, &sbx, &e);
        if (r == -EINTR)
                return cli_interrupted_exit();
        if (r < 0)
                return cli_error_print(&e);
        if (!json_is_string(json_object_get(sbx, "id")) ||
            !sandbox_id_valid(json_string_value(json_object_get(sbx, "id"))))
                return cli_fail("runtimed answered a sandbox without a valid id");
        id = strdup(json_string_value(json_object_get(sbx, "id")));
        if (!id)
                return cli_fail("out of memory");

        if (cli_interrupted)
                r = cli_interrupted_exit();
        else {
                if (a.timeout_ms < 0 && a.lease_s < 0)
                        (void)keeper_start(&keeper, ctx, id, sandbox_run_lease(&a));
                client_set_interrupt(c, &cli_interrupted);
                r = stream_exec(c, id, exec, ctx->json);
                keeper_stop(&keeper);
        }
        if (a.keep)
                fprintf(stderr, "%s\n", id);
        else
                delete_sandbox(c, id);
        return r;
}

int cmd_sandbox_exec(CliContext *ctx, int argc, char **argv) {
        _cleanup_(sandbox_args_done) SandboxArgs a = {0};
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *exec = NULL;
        char err[CLI_ERR_MAX];
        int r;

        r = sandbox_args_parse(SANDBOX_VERB_EXEC, argc, argv, &a, err, sizeof(err));
        if (r < 0)
                return cli_usage_error("sandbox exec", sandbox_exec_usage, "%s", err);
        if (a.help) {
                sandbox_print_help(SANDBOX_VERB_EXEC);
                return CLI_EXIT_OK;
        }
        ctx->json |= a.json;
        exec = sandbox_exec_body(&a, SANDBOX_VERB_EXEC);
        if (!exec)
                return cli_fail("an argument is not valid UTF-8");
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        if (a.interactive) {
                r = add_stdin(exec);
                if (r > 0)
                        return r;
        }
        if (cli_interrupted)
                return cli_interrupted_exit();
        /* Leaving the stream makes the daemon kill the command's process group. */
        return stream_exec(c, a.id, exec, ctx->json);
}
