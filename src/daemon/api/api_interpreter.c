/*
 * The stateful interpreter: POST /v1/sandboxes/{id}/interpreter:run, the
 * contexts (list, create, restart, interrupt, remove) and results kept as
 * files. A context is a Python process in the sandbox, started by the
 * program in src/interpreter (sent to python3's stdin, so any image with
 * python3 has it) in a session of its own under the agent; everything here
 * goes through ordinary execs on the agent channel. What comes back from the
 * sandbox is hostile: every line is bounded and re-validated before it
 * reaches a client. docs/interpreter.md has the design and the wire format.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/api/api.h"
#include "daemon/api/api_interpreter.h"
#include "daemon/manager/db.h"
#include "common/log.h"
#include "daemon/manager/output.h"
#include "daemon/http/request.h"
#include "proto/proto.h"

static const char program[] =
#include "interpreter_program.inc"
        ;

#define INTERP_ROOT "/workspace/.runtime/interpreter"
#define DEFAULT_CONTEXT "python"
/* The languages a context may have; each one's name is its default context,
 * started on its first run. Whether the sandbox's image has a language's
 * kernel is the sandbox's to say (a 400 from the start). */
static const char *const languages[] = { "python", "bash", "javascript", "typescript", "r" };
#define LANGUAGES_TEXT "python, bash, javascript, typescript, r"
/* The short names E2B's run_code takes for two of them: a context made with
 * one has the full name, and so does the default context a run reaches. */
static const struct {
        const char *alias;
        const char *language;
} language_aliases[] = {
        { "js", "javascript" },
        { "ts", "typescript" },
};
#define POLL_MS 250
/* Starting a context is a python3 start, which takes tens of seconds in the
 * emulated microVM under load: the bound on a control operation allows it. */
#define CONTROL_TIMEOUT_MS 120000
#define CONTROL_MAX_OUT (1024u * 1024u)
/* The context stops a cell at timeoutMs itself; the exec around the run
 * gets this much longer before it counts the context as wedged. On a kernel
 * the run may first start a new kernel (seconds under gVisor, more under
 * load), and a kernel deaf to the interrupt is killed 5 s after the timeout. */
#define RUN_GRACE_MS 30000
#define RUN_DEFAULT_TIMEOUT_MS 60000
#define MAX_LINE (4u * 1024u * 1024u)
#define MAX_TEXT (1024u * 1024u)
#define MAX_RESULTS 64
#define MAX_ERROR_TEXT (256u * 1024u)
#define MAX_RESULT_FILE (64u * 1024u * 1024u)
#define STDIN_CHUNK (64u * 1024u)

/* Runs one cell: "ready" once the context is there, then the context's own
 * lines. Exit 4: no such context; 3: its process is gone. The context serves
 * one connection at a time, so concurrent runs of one context take turns in
 * its listen queue, as cells of a notebook do (the connection is made, and
 * "ready" said, before the turn comes). Every process a run forks
 * costs tens of milliseconds under gVisor, more than a warm cell: the run
 * forks none. The checks are builtins, the connection is bash's /dev/tcp, a
 * request small enough for an argument ($2) is written by the shell itself,
 * and cat, the reader of the answer, replaces the shell. A larger request
 * comes on stdin, through one cat. */
static const char run_script[] =
        "d=" INTERP_ROOT "/\"$1\"\n"
        "[ -f \"$d/meta.json\" ] || exit 4\n"
        "p=; read -r p <\"$d/pid\" 2>/dev/null; [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null || exit 3\n"
        "port=; read -r port <\"$d/port\" 2>/dev/null\n"
        "case $port in ''|*[!0-9]*) exit 3 ;; esac\n"
        "exec 3<>\"/dev/tcp/127.0.0.1/$port\" || exit 3\n"
        "echo '{\"k\":\"ready\"}'\n"
        "if [ $# -ge 2 ]; then printf '%s\\n' \"$2\" >&3; else cat >&3; fi || exit 3\n"
        "exec cat <&3\n";
/* A request up to this size travels as an argument (the kernel's bound on
 * one is 128 KiB, the agent's on a request 64 KiB); a larger one on stdin. */
#define ARG_REQUEST_MAX (32u * 1024u)

/* ---- one exec on the agent ---- */

typedef struct AgentRun {
        Sandbox *sb;
        ChanStream *stream;
        bool finished;       /* RESULT or CLOSED seen */
        bool closed;         /* the channel closed */
        bool timed_out;      /* the agent killed it at its timeout */
        int exit_code;       /* -1 until known */
} AgentRun;

static void agent_run_done(AgentRun *a) {
        if (a->stream && !a->finished)
                chan_stream_cancel(a->stream);
        chan_stream_free(a->stream);
        a->stream = NULL;
}

static int agent_run_start(Sandbox *sb, json_t *argv, const char *in, size_t in_len, int64_t timeout_ms,
                           AgentRun *ret, ApiError *e) {
        _cleanup_json_ json_t *base = sandbox_env(sb);
        _cleanup_json_ json_t *env = json_deep_copy(base);
        if (!env)
                env = json_object();
        _cleanup_json_ json_t *req = env ? agent_req_exec(NULL, argv, "/", env, timeout_ms, true) : NULL;
        /* A context runs as the sandbox's own user when it starts, as a
         * command that names none does. */
        if (!req || api_req_user(req, sb) < 0)
                return -ENOMEM;
        AgentRun a = { .sb = sb, .exit_code = -1 };
        int r = api_open_stream(sb, req, &a.stream, e);
        if (r < 0)
                return r;
        /* The readers in the sandbox (python3 reading its program, cat
         * filling the context's FIFO) take all of stdin before they answer. */
        for (size_t off = 0; off < in_len;) {
                size_t n = in_len - off > STDIN_CHUNK ? STDIN_CHUNK : in_len - off;
                r = chan_stream_write(a.stream, in + off, n, 10000);
                if (r < 0)
                        break;
                off += n;
        }
        if (r == 0)
                r = chan_stream_close_write(a.stream);
        /* -EPIPE: it ended before it read everything (the run script exits 4
         * or 3 without reading when the context is missing or gone, and its
         * result can arrive before the input is written): its result, read
         * next, says why. A closed channel shows there too. */
        if (r == -EPIPE)
                r = 0;
        if (r < 0) {
                agent_run_done(&a);
                return api_error(e, 503, "unavailable", "retry, or create a new sandbox",
                                 "the sandbox did not take the interpreter's input");
        }
        *ret = a;
        return 0;
}

/* Next stdout bytes, or the end. 0 with *data set; 0 and *len 0 on a timeout
 * tick; 1 at the end. */
static int agent_run_next(AgentRun *a, ChanEvent *ev) {
        int rc = chan_stream_next(a->stream, POLL_MS, ev);
        if (rc == -ETIMEDOUT)
                return -ETIMEDOUT;
        if (rc < 0) {
                a->finished = a->closed = true;
                return 1;
        }
        if (ev->type == CHAN_EV_RESULT) {
                a->finished = true;
                json_t *ec = json_object_get(ev->json, "exitCode");
                a->exit_code = json_is_integer(ec) ? (int)json_integer_value(ec) : -1;
                a->timed_out = json_is_true(json_object_get(ev->json, "timedOut"));
                return 1;
        }
        if (ev->type == CHAN_EV_CLOSED) {
                a->finished = a->closed = true;
                return 1;
        }
        return 0;
}

/* ---- control operations: the program's start/list/restart/interrupt/remove ---- */

static int agent_error(json_t *err, ApiError *e) {
        const char *code = json_string_value(json_object_get(err, "code"));
        const char *msg = json_string_value(json_object_get(err, "message"));
        if (!msg)
                msg = "the interpreter refused";
        if (code && strcmp(code, "invalid_request") == 0)
                return api_error(e, 400, "invalid_request", NULL, "%.300s", msg);
        if (code && strcmp(code, "not_found") == 0)
                return api_error(e, 404, "not_found", "list the contexts: GET .../interpreter/contexts", "%.300s", msg);
        if (code && strcmp(code, "conflict") == 0)
                return api_error(e, 409, "conflict", "restart it or pick another id", "%.300s", msg);
        return api_error(e, 500, "internal", "see the sandbox's python3", "%.300s", msg);
}

/* Runs `python3 - OP ARGS...` with the program on stdin and answers its one
 * JSON line. */
static int control(Sandbox *sb, const char *rid, const char *const *args, size_t n, json_t **ret, ApiError *e) {
        _cleanup_json_ json_t *argv = json_pack("[s,s]", "python3", "-");
        if (!argv)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                json_array_append_new(argv, json_string(args[i]));
        AgentRun a;
        int r = agent_run_start(sb, argv, program, sizeof(program) - 1, CONTROL_TIMEOUT_MS, &a, e);
        if (r < 0)
                return r;
        TailBuf out;
        tailbuf_init(&out, CONTROL_MAX_OUT);
        uint64_t deadline = time_now_mono_ms() + CONTROL_TIMEOUT_MS + 5000;
        while (!a.finished && time_now_mono_ms() < deadline) {
                ChanEvent ev;
                int rc = agent_run_next(&a, &ev);
                if (rc == -ETIMEDOUT)
                        continue;
                if (rc == 0 && ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_OUT)
                        tailbuf_append(&out, ev.data, ev.len);
                chan_event_clear(&ev);
        }
        bool finished = a.finished, closed = a.closed;
        int exit_code = a.exit_code;
        agent_run_done(&a);
        size_t len;
        _cleanup_(freep) char *text = tailbuf_text(&out, &len);
        bool truncated = out.truncated;
        tailbuf_done(&out);
        if (closed)
                return api_error(e, 409, "conflict", "create a new sandbox", "the sandbox stopped");
        if (!finished) {
                log_warn(rid, "interpreter control %s on %s gave no answer", args[0], sandbox_id(sb));
                return api_error(e, 503, "unavailable", "retry", "the interpreter did not answer in time");
        }
        json_error_t jerr;
        _cleanup_json_ json_t *j = text && !truncated ? json_loadb(text, len, 0, &jerr) : NULL;
        if (!json_is_object(j)) {
                log_warn(rid, "interpreter control %s on %s: exit %d, no answer", args[0], sandbox_id(sb),
                         exit_code);
                return api_error(e, 503, "unavailable", "the interpreter needs python3 in the sandbox's image",
                                 "the interpreter could not run in this sandbox");
        }
        json_t *err = json_object_get(j, "error");
        if (err)
                return agent_error(err, e);
        *ret = TAKE_PTR(j);
        return 0;
}

/* The cap on a context's address space, in MiB as text; "0" for none. Under
 * gVisor the sandbox's memory limit is enforced on the host, where the OOM
 * killer takes the sentry and with it the whole sandbox, agent included; a
 * cell that eats memory must hit a MemoryError in its context first. The
 * other drivers leave it to the kernel's OOM killer inside, which the
 * context's oom_score_adj points at itself. */
static void memory_cap_text(SandboxDriver driver, unsigned mib, char *buf, size_t len) {
        snprintf(buf, len, "0");
        if (driver == SANDBOX_DRIVER_GVISOR && mib > 0)
                snprintf(buf, len, "%u", mib * 3 / 4);
}

static void memory_cap_of(Manager *m, const KeyInfo *key, const char *id, char *buf, size_t len) {
        snprintf(buf, len, "0");
        SandboxRow row = { 0 };
        SandboxError se;
        if (sandbox_get(m, key, id, &row, &se) < 0)
                return;
        memory_cap_text(row.spec.driver, row.spec.memory_mib, buf, len);
        sandbox_row_done(&row);
}

static void memory_cap(Req *r, char *buf, size_t len) {
        memory_cap_of(r->app->manager, &r->key, r->route.sandbox_id, buf, len);
}

/* A language the interpreter runs: its name (static) in *ret, or a 400
 * naming the ones it does. */
static int parse_language(json_t *v, const char **ret, ApiError *e) {
        const char *s = json_string_value(v);
        for (size_t i = 0; s && i < ELEMENTSOF(languages); i++)
                if (strcmp(s, languages[i]) == 0) {
                        *ret = languages[i];
                        return 0;
                }
        for (size_t i = 0; s && i < ELEMENTSOF(language_aliases); i++)
                if (strcmp(s, language_aliases[i].alias) == 0) {
                        *ret = language_aliases[i].language;
                        return 0;
                }
        if (s && strcmp(s, "java") == 0)
                return api_error(e, 400, "invalid_request", "the interpreter runs " LANGUAGES_TEXT,
                                 "language java is not offered: no Jupyter kernel for Java is packaged for the "
                                 "images' Debian release");
        return api_error(e, 400, "invalid_request", "the interpreter runs " LANGUAGES_TEXT,
                         "language must be one of " LANGUAGES_TEXT);
}

/* The language whose default context id is this one, or NULL. */
static const char *default_context_language(const char *ctx) {
        for (size_t i = 0; i < ELEMENTSOF(languages); i++)
                if (strcmp(ctx, languages[i]) == 0)
                        return languages[i];
        return NULL;
}

/* ---- the default context started ahead ---- */

typedef struct Prestart {
        Sandbox *sb;
        char cap[24];
        char idle[16];
        bool adopt; /* a pool kernel to hand its owner's env */
        const DaemonConfig *cfg;
} Prestart;

/* The host's bound on kernels started ahead: each holds 56-83 MiB of its
 * sandbox's memory until a cell uses it or it ends itself, unused, after
 * --interpreter-prestart-idle-seconds; so at most --interpreter-prestart-max
 * starts within that time, the last ones' times kept in a ring. A host of
 * hundreds of sandboxes that run no cell holds at most that many kernels. */
#define PRESTART_RING 1024
static pthread_mutex_t prestart_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t prestart_times[PRESTART_RING];
static size_t prestart_next;

static bool prestart_take_turn(unsigned max, unsigned idle_s) {
        if (max == 0)
                return false;
        uint64_t now = time_now_mono_ms(), window = (uint64_t)idle_s * 1000;
        pthread_mutex_lock(&prestart_lock);
        /* The max-th newest start: within the window, the bound is reached. */
        size_t i = (prestart_next + PRESTART_RING - (max <= PRESTART_RING ? max : PRESTART_RING)) % PRESTART_RING;
        bool ok = prestart_times[i] == 0 || now - prestart_times[i] >= window;
        if (ok) {
                prestart_times[prestart_next] = now;
                prestart_next = (prestart_next + 1) % PRESTART_RING;
        }
        pthread_mutex_unlock(&prestart_lock);
        return ok;
}

/* Sandboxes handed out by the warm pool whose kernel has not taken its
 * owner's env yet: their runs and context operations wait for it, so that
 * no cell ever runs with the pool's env. Registered before the create
 * answers; more at once than this, and the create gives the env itself. */
#define ADOPT_PENDING_MAX 64
#define ADOPT_WAIT_MS 30000
static pthread_mutex_t adopt_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t adopt_cond = PTHREAD_COND_INITIALIZER;
static char adopt_pending[ADOPT_PENDING_MAX][32];

static bool adopt_register(const char *id) {
        bool ok = false;
        pthread_mutex_lock(&adopt_lock);
        for (size_t i = 0; i < ADOPT_PENDING_MAX && !ok; i++)
                if (!adopt_pending[i][0]) {
                        snprintf(adopt_pending[i], sizeof adopt_pending[i], "%s", id);
                        ok = true;
                }
        pthread_mutex_unlock(&adopt_lock);
        return ok;
}

static void adopt_done(const char *id) {
        pthread_mutex_lock(&adopt_lock);
        for (size_t i = 0; i < ADOPT_PENDING_MAX; i++)
                if (strcmp(adopt_pending[i], id) == 0)
                        adopt_pending[i][0] = '\0';
        pthread_cond_broadcast(&adopt_cond);
        pthread_mutex_unlock(&adopt_lock);
}

static bool adopt_is_pending(const char *id) {
        for (size_t i = 0; i < ADOPT_PENDING_MAX; i++)
                if (strcmp(adopt_pending[i], id) == 0)
                        return true;
        return false;
}

static void adopt_wait(Sandbox *sb) {
        const char *id = sandbox_id(sb);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += ADOPT_WAIT_MS / 1000;
        pthread_mutex_lock(&adopt_lock);
        while (adopt_is_pending(id))
                if (pthread_cond_timedwait(&adopt_cond, &adopt_lock, &ts) == ETIMEDOUT)
                        break;
        pthread_mutex_unlock(&adopt_lock);
}

/* The prestart's low priority is its turn: it waits until the sandbox has
 * had no stream open (the client's first commands, sent right after the
 * create) for PRESTART_QUIET_MS, or PRESTART_WAIT_MS at the most, so that
 * the kernel's start (a second of CPU) does not run beside a first exec. A
 * nice value could not do it: raised in the sandbox, it cannot be lowered
 * again there, and every later cell would run niced. */
#define PRESTART_QUIET_MS 150
#define PRESTART_WAIT_MS 3000

/* A pool kernel's hand-out: the program's adopt runs as an exec of the
 * sandbox's, so the env it passes on is the one every command now gets
 * (the create's over the egress proxy's). Whether the kernel took it; one
 * that did not (the sandbox runs as another user) is gone afterwards. */
static bool pool_adopt(Prestart *p) {
        const char *args[] = { "adopt", p->idle };
        _cleanup_json_ json_t *j = NULL;
        ApiError e = { 0 };
        bool adopted = control(p->sb, NULL, args, ELEMENTSOF(args), &j, &e) == 0 &&
                       json_is_true(json_object_get(j, "adopted"));
        /* Not given its owner's env, the context runs no cell: the first run
         * it gets ends it, and the next starts it again with that env. */
        if (!j)
                log_warn(NULL, "interpreter: the pool kernel of %s did not take its env: %s", sandbox_id(p->sb),
                         e.message);
        sandbox_clear_pool_kernel(p->sb);
        adopt_done(sandbox_id(p->sb));
        return adopted;
}

static void prestart_run(Prestart *p) {
        /* A sandbox whose pool kernel went starts one as a cold create's
         * does, within the bound. */
        if (p->adopt && (pool_adopt(p) || p->cfg->no_interpreter_prestart ||
                         !prestart_take_turn(p->cfg->interpreter_prestart_max, p->cfg->interpreter_prestart_idle_s)))
                return;
        uint64_t start = time_now_mono_ms(), quiet_since = start;
        for (uint64_t now = start; now - start < PRESTART_WAIT_MS; now = time_now_mono_ms()) {
                if (sandbox_stream_count(p->sb) > 0)
                        quiet_since = now;
                else if (now - quiet_since >= PRESTART_QUIET_MS)
                        break;
                usleep(20 * 1000);
        }
        const char *args[] = { "prestart", p->cap, p->idle };
        _cleanup_json_ json_t *j = NULL;
        ApiError e = { 0 };
        /* The program answers at once and starts the kernel in the
         * background, in the sandbox; a failure (no python3 in the image) is
         * the first run's to report, as it was before. */
        if (control(p->sb, NULL, args, ELEMENTSOF(args), &j, &e) < 0)
                log_debug(NULL, "interpreter prestart on %s: %s", sandbox_id(p->sb), e.message);
}

static void *prestart_main(void *userdata) {
        Prestart *p = userdata;
        prestart_run(p);
        sandbox_release(p->sb);
        free(p);
        return NULL;
}

void interpreter_prestart(App *app, const KeyInfo *key, const char *id) {
        Prestart *p = calloc(1, sizeof(*p));
        SandboxError se;
        if (!p)
                return;
        if (sandbox_acquire(app->manager, key, id, &p->sb, &se) < 0) {
                free(p);
                return;
        }
        p->cfg = app->cfg;
        /* A pool kernel is outside the host's bound on kernels started
         * ahead: the pool's refills bound those (one start at a time, none
         * while a create runs), and handed out it ends unused after the
         * same idle time. */
        p->adopt = sandbox_has_pool_kernel(p->sb);
        if (!p->adopt && (app->cfg->no_interpreter_prestart ||
                          !prestart_take_turn(app->cfg->interpreter_prestart_max,
                                              app->cfg->interpreter_prestart_idle_s))) {
                sandbox_release(p->sb);
                free(p);
                return;
        }
        snprintf(p->idle, sizeof p->idle, "%u", app->cfg->interpreter_prestart_idle_s);
        memory_cap_of(app->manager, key, id, p->cap, sizeof(p->cap));
        if (p->adopt && !adopt_register(id)) {
                /* Too many hand-outs at once to track: this create gives the
                 * env itself before it answers. */
                bool kept = pool_adopt(p);
                p->adopt = false;
                if (kept || app->cfg->no_interpreter_prestart ||
                    !prestart_take_turn(app->cfg->interpreter_prestart_max, app->cfg->interpreter_prestart_idle_s)) {
                        sandbox_release(p->sb);
                        free(p);
                        return;
                }
        }
        pthread_attr_t attr;
        pthread_t th;
        bool started = false;
        if (pthread_attr_init(&attr) == 0) {
                pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
                started = pthread_create(&th, &attr, prestart_main, p) == 0;
                pthread_attr_destroy(&attr);
        }
        if (!started) {
                if (p->adopt)
                        pool_adopt(p);
                sandbox_release(p->sb);
                free(p);
        }
}

int interpreter_pool_warm(void *userdata, Sandbox *sb, SandboxDriver driver, unsigned memory_mib) {
        (void)userdata;
        char cap[24];
        memory_cap_text(driver, memory_mib, cap, sizeof cap);
        const char *args[] = { "warm", cap };
        _cleanup_json_ json_t *j = NULL;
        ApiError e = { 0 };
        if (control(sb, NULL, args, ELEMENTSOF(args), &j, &e) < 0) {
                log_debug(NULL, "warm pool: the kernel of %s did not start: %s", sandbox_id(sb), e.message);
                return -EIO;
        }
        /* The context's description once it serves; {"started": false}
         * where the image has no kernel. */
        return json_is_true(json_object_get(j, "running")) ? 0 : -ENOENT;
}

/* ---- one cell ---- */

typedef struct InterpRun {
        char rid[24];
        char context[64];
        Sandbox *sb;
        AgentRun agent;
        int sock;
        bool streamed;
        bool interrupt_on_disconnect;
        int64_t timeout_ms;
        uint64_t deadline_ms; /* a direct run's end at the latest; 0: none (an exec has its own) */
        /* line assembly of the agent's stdout */
        char *line;
        size_t line_len, line_cap;
        bool line_over;
        /* the execution */
        bool ready, ended;
        char *status;
        json_int_t count;
        TailBuf text[2]; /* stdout, stderr */
        json_t *results;
        json_t *error;
        bool dropped_lines;
        /* streamed: NDJSON waiting for the client */
        char *out;
        size_t out_len, out_off, out_cap;
        bool done;
} InterpRun;

static void interp_run_free(InterpRun *x) {
        if (!x)
                return;
        agent_run_done(&x->agent);
        sandbox_release(x->sb);
        free(x->line);
        free(x->status);
        tailbuf_done(&x->text[0]);
        tailbuf_done(&x->text[1]);
        json_decref(x->results);
        json_decref(x->error);
        free(x->out);
        free(x);
}

static int push_line(InterpRun *x, json_t *j) {
        LineQueue q = { x->out, x->out_off, x->out_len, x->out_cap };
        int r = line_queue_push(&q, j);
        x->out = q.buf, x->out_off = q.off, x->out_len = q.len, x->out_cap = q.cap;
        return r;
}

static bool mime_ok(const char *k) {
        size_t len = strlen(k);
        return len > 2 && len < 128 && strchr(k, '/') && !strpbrk(k, " \t\r\n\"");
}

/* A kept result's reference must point into this context's out/. */
static bool ref_ok(const InterpRun *x, json_t *ref) {
        const char *path = json_string_value(json_object_get(ref, "path"));
        json_t *size = json_object_get(ref, "size");
        if (!path || !json_is_integer(size) || json_integer_value(size) < 0)
                return false;
        char prefix[160];
        snprintf(prefix, sizeof(prefix), INTERP_ROOT "/%s/out/", x->context);
        size_t pl = strlen(prefix);
        if (strncmp(path, prefix, pl) != 0)
                return false;
        const char *name = path + pl;
        size_t nl = strlen(name);
        if (nl == 0 || nl > 128 || !((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= '0' && name[0] <= '9') ||
                                     (name[0] >= 'A' && name[0] <= 'Z')))
                return false;
        return strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == nl;
}

static json_t *bounded_string(json_t *v, size_t max) {
        const char *s = json_string_value(v);
        if (!s)
                return json_string("");
        size_t len = json_string_length(v);
        return json_stringn(s, len > max ? max : len);
}

/* One line from the context, checked field by field; what is not understood
 * is dropped, never passed on. */
static int take_line(InterpRun *x, const char *buf, size_t len) {
        json_error_t jerr;
        _cleanup_json_ json_t *j = json_loadb(buf, len, 0, &jerr);
        const char *k = json_string_value(json_object_get(j, "k"));
        if (!k) {
                x->dropped_lines = true;
                return 0;
        }
        if (strcmp(k, "ready") == 0) {
                x->ready = true;
                return 0;
        }
        if (!x->ready || x->ended)
                return 0;
        if (strcmp(k, "stdout") == 0 || strcmp(k, "stderr") == 0) {
                json_t *t = json_object_get(j, "text");
                if (!json_is_string(t))
                        return 0;
                int fd = k[3] == 'o' ? 0 : 1;
                tailbuf_append(&x->text[fd], json_string_value(t), json_string_length(t));
                if (x->streamed)
                        return push_line(x, json_pack("{s:s,s:O}", "k", k, "text", t));
                return 0;
        }
        if (strcmp(k, "result") == 0) {
                json_t *data = json_object_get(j, "data"), *refs = json_object_get(j, "refs");
                if (!json_is_object(data) || (refs && !json_is_object(refs)) ||
                    json_array_size(x->results) >= MAX_RESULTS) {
                        x->dropped_lines = true;
                        return 0;
                }
                json_t *d = json_object(), *rf = json_object();
                const char *mime;
                json_t *v;
                json_object_foreach(data, mime, v) {
                        if (mime_ok(mime))
                                json_object_set(d, mime, v);
                }
                json_object_foreach(refs, mime, v) {
                        if (mime_ok(mime) && ref_ok(x, v))
                                json_object_set_new(rf, mime,
                                                    json_pack("{s:O,s:O}", "path", json_object_get(v, "path"),
                                                              "size", json_object_get(v, "size")));
                }
                json_t *res = json_pack("{s:b,s:o,s:o}", "main", json_is_true(json_object_get(j, "main")), "data", d,
                                        "refs", rf);
                if (!res)
                        return -ENOMEM;
                json_array_append(x->results, res);
                int r = 0;
                if (x->streamed)
                        r = push_line(x, json_pack("{s:s,s:O,s:O,s:O}", "k", "result", "main",
                                                   json_object_get(res, "main"), "data", d, "refs", rf));
                json_decref(res);
                return r;
        }
        if (strcmp(k, "error") == 0) {
                json_t *err = json_pack("{s:o,s:o,s:o}", "name", bounded_string(json_object_get(j, "name"), 256),
                                        "value", bounded_string(json_object_get(j, "value"), MAX_ERROR_TEXT),
                                        "traceback",
                                        bounded_string(json_object_get(j, "traceback"), MAX_ERROR_TEXT));
                if (!err)
                        return -ENOMEM;
                json_decref(x->error);
                x->error = err;
                if (x->streamed)
                        return push_line(x, json_pack("{s:s,s:O,s:O,s:O}", "k", "error", "name",
                                                      json_object_get(err, "name"), "value",
                                                      json_object_get(err, "value"), "traceback",
                                                      json_object_get(err, "traceback")));
                return 0;
        }
        if (strcmp(k, "end") == 0) {
                const char *st = json_string_value(json_object_get(j, "status"));
                /* lost: the context's kernel died during the cell (it says so in
                 * an error line); the context starts a new one on the next run. */
                static const char *const known[] = { "ok", "error", "timeout", "lost" };
                const char *status = "error";
                for (size_t i = 0; st && i < ELEMENTSOF(known); i++)
                        if (strcmp(st, known[i]) == 0)
                                status = known[i];
                free(x->status);
                x->status = strdup(status);
                json_t *c = json_object_get(j, "executionCount");
                x->count = json_is_integer(c) ? json_integer_value(c) : 0;
                /* Output the context cut at its own bound is truncated too. */
                json_t *cut = json_object_get(j, "truncated");
                if (json_is_true(json_object_get(cut, "stdout")))
                        x->text[0].truncated = true;
                if (json_is_true(json_object_get(cut, "stderr")))
                        x->text[1].truncated = true;
                x->ended = true;
                return x->status ? 0 : -ENOMEM;
        }
        return 0;
}

static int feed(InterpRun *x, const uint8_t *data, size_t len) {
        for (size_t i = 0; i < len; i++) {
                if (data[i] == '\n') {
                        int r = x->line_over ? 0 : take_line(x, x->line, x->line_len);
                        if (x->line_over)
                                x->dropped_lines = true;
                        x->line_len = 0;
                        x->line_over = false;
                        if (r < 0)
                                return r;
                        continue;
                }
                if (x->line_over)
                        continue;
                if (x->line_len + 1 > MAX_LINE) {
                        x->line_over = true;
                        continue;
                }
                if (x->line_len + 1 > x->line_cap) {
                        size_t cap = x->line_cap ? x->line_cap * 2 : 4096;
                        if (cap > MAX_LINE)
                                cap = MAX_LINE;
                        char *b = realloc(x->line, cap);
                        if (!b)
                                return -ENOMEM;
                        x->line = b;
                        x->line_cap = cap;
                }
                x->line[x->line_len++] = (char)data[i];
        }
        return 0;
}

/* One step of the run: 1 when the exec ended, 0 on progress or a tick,
 * -EPIPE when the client left. */
static int run_step(InterpRun *x) {
        if (x->deadline_ms && !x->agent.finished && time_now_mono_ms() > x->deadline_ms) {
                /* What an exec's timeout does to the run script. */
                agent_run_done(&x->agent);
                x->agent.finished = x->agent.timed_out = true;
                return 1;
        }
        ChanEvent ev;
        int rc = agent_run_next(&x->agent, &ev);
        if (rc == -ETIMEDOUT)
                return socket_hung_up(x->sock) ? -EPIPE : 0;
        int r = 0;
        if (rc == 0 && ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_OUT)
                r = feed(x, ev.data, ev.len);
        chan_event_clear(&ev);
        if (r < 0)
                return r;
        return rc == 1 ? 1 : 0;
}

static json_t *execution_json(InterpRun *x) {
        size_t ol, el;
        _cleanup_(freep) char *out = tailbuf_text(&x->text[0], &ol);
        _cleanup_(freep) char *err = tailbuf_text(&x->text[1], &el);
        const char *status = x->status;
        json_t *error = x->error;
        _cleanup_json_ json_t *lost = NULL;
        if (!x->ended) {
                /* The context did not finish the cell: it was killed (out of
                 * memory, most often) or did not stop at its timeout. */
                status = x->agent.timed_out ? "timeout" : "lost";
                lost = json_pack("{s:s,s:s,s:s}", "name", x->agent.timed_out ? "TimeoutError" : "ContextDied",
                                 "value",
                                 x->agent.timed_out
                                         ? "the context did not stop the cell at its timeout; restart the context"
                                         : "the context's process ended during the cell (out of memory or killed); "
                                           "restart the context",
                                 "traceback", "");
                error = lost;
        }
        if (!out || !err)
                return NULL;
        return json_pack("{s:s,s:s,s:s%,s:s%,s:b,s:b,s:O,s:O,s:I}", "status", status ?: "error", "context", x->context,
                         "stdout", out, ol, "stderr", err, el, "stdoutTruncated", x->text[0].truncated,
                         "stderrTruncated", x->text[1].truncated, "results", x->results, "error",
                         error ?: json_null(), "executionCount", x->count);
}

static void interrupt_after_leave(InterpRun *x) {
        if (!x->interrupt_on_disconnect || !x->ready || x->ended)
                return;
        const char *args[] = { "interrupt", x->context };
        _cleanup_json_ json_t *j = NULL;
        ApiError e;
        if (control(x->sb, x->rid, args, 2, &j, &e) < 0)
                log_warn(x->rid, "interrupting context %s of %s: %s", x->context, sandbox_id(x->sb), e.message);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        InterpRun *x = cls;
        for (;;) {
                if (x->out_off < x->out_len) {
                        size_t n = x->out_len - x->out_off;
                        if (n > max)
                                n = max;
                        memcpy(buf, x->out + x->out_off, n);
                        x->out_off += n;
                        return (ssize_t)n;
                }
                if (x->done)
                        return MHD_CONTENT_READER_END_OF_STREAM;
                int r = run_step(x);
                if (r == -EPIPE) {
                        log_info(x->rid, "client left during a cell on %s", sandbox_id(x->sb));
                        agent_run_done(&x->agent);
                        interrupt_after_leave(x);
                        return MHD_CONTENT_READER_END_WITH_ERROR;
                }
                if (r < 0)
                        return MHD_CONTENT_READER_END_WITH_ERROR;
                if (r == 1) {
                        x->done = true;
                        if (x->agent.closed) {
                                ApiError e;
                                api_error(&e, 409, "conflict", "create a new sandbox", "the sandbox stopped during the cell");
                                r = push_line(x, json_pack("{s:s,s:s,s:i,s:s,s:s?,s:s}", "k", "failure", "code", e.code,
                                                           "status", (int)e.status, "message", e.message, "hint",
                                                           e.hint[0] ? e.hint : NULL, "requestId", x->rid));
                        } else
                                r = push_line(x, json_pack("{s:s,s:o}", "k", "execution", "execution",
                                                           execution_json(x)));
                        if (r < 0)
                                return MHD_CONTENT_READER_END_WITH_ERROR;
                }
        }
}

static void stream_free(void *cls) {
        interp_run_free(cls);
}

typedef struct RunRequest {
        const char *code;
        size_t code_len;
        const char *context;
        const char *language;
        int64_t timeout_ms;
        bool stream;
        bool interrupt_on_disconnect;
} RunRequest;

static int parse_run(json_t *body, RunRequest *q, ApiError *e) {
        *q = (RunRequest){ .timeout_ms = RUN_DEFAULT_TIMEOUT_MS, .interrupt_on_disconnect = true };
        const char *key;
        json_t *v;
        json_object_foreach(body, key, v) {
                if (strcmp(key, "code") == 0) {
                        if (!json_is_string(v))
                                return api_error(e, 400, "invalid_request", NULL, "code must be a string");
                        q->code = json_string_value(v);
                        q->code_len = json_string_length(v);
                } else if (strcmp(key, "language") == 0) {
                        if (!json_is_null(v) && parse_language(v, &q->language, e) < 0)
                                return -EINVAL;
                } else if (strcmp(key, "context") == 0) {
                        if (json_is_null(v))
                                continue;
                        if (!json_is_string(v) || !route_context_id_ok(json_string_value(v)))
                                return api_error(e, 400, "invalid_request", NULL,
                                                 "context must be 1-63 of [a-z0-9-], starting with a letter or digit");
                        q->context = json_string_value(v);
                } else if (strcmp(key, "timeoutMs") == 0) {
                        if (json_is_null(v))
                                continue;
                        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                            json_integer_value(v) > REQ_MAX_EXEC_TIMEOUT_MS)
                                return api_error(e, 400, "invalid_request", NULL,
                                                 "timeoutMs must be 0 (none) to %lld", REQ_MAX_EXEC_TIMEOUT_MS);
                        q->timeout_ms = json_integer_value(v);
                } else if (strcmp(key, "stream") == 0) {
                        if (!json_is_boolean(v))
                                return api_error(e, 400, "invalid_request", NULL, "stream must be a boolean");
                        q->stream = json_is_true(v);
                } else if (strcmp(key, "interruptOnDisconnect") == 0) {
                        if (!json_is_boolean(v) && !json_is_null(v))
                                return api_error(e, 400, "invalid_request", NULL,
                                                 "interruptOnDisconnect must be a boolean");
                        q->interrupt_on_disconnect = !json_is_false(v);
                } else
                        return api_error(e, 400, "invalid_request", NULL, "unknown field %.64s", key);
        }
        if (!q->code)
                return api_error(e, 400, "invalid_request", NULL, "code is required");
        return 0;
}

/* A small file of the sandbox, read by the agent itself: 0 and its text. */
static int read_small(Sandbox *sb, const char *path, char *buf, size_t size) {
        _cleanup_json_ json_t *req = agent_req_read(path);
        ApiError e;
        AgentRun a = { .sb = sb, .exit_code = -1 };
        if (!req || api_open_stream(sb, req, &a.stream, &e) < 0)
                return -EIO;
        size_t len = 0;
        int r = -EIO;
        uint64_t deadline = time_now_mono_ms() + CONTROL_TIMEOUT_MS;
        while (time_now_mono_ms() < deadline) {
                ChanEvent ev;
                int k = chan_stream_next(a.stream, POLL_MS, &ev);
                if (k == -ETIMEDOUT)
                        continue;
                if (k < 0)
                        break;
                bool end = ev.type == CHAN_EV_RESULT || ev.type == CHAN_EV_CLOSED;
                if (ev.type == CHAN_EV_DATA && len + ev.len < size) {
                        memcpy(buf + len, ev.data, ev.len);
                        len += ev.len;
                } else if (ev.type == CHAN_EV_DATA)
                        len = size; /* too long: not ours */
                if (ev.type == CHAN_EV_RESULT) {
                        a.finished = true;
                        r = !agent_result_error(ev.json, NULL) && len < size ? 0 : -EIO;
                }
                if (ev.type == CHAN_EV_CLOSED)
                        a.finished = true;
                chan_event_clear(&ev);
                if (end)
                        break;
        }
        agent_run_done(&a);
        if (r == 0)
                buf[len] = '\0';
        return r;
}

/* The direct way to a context: the agent connects to the port it listens on
 * (the request of port forwarding), so a run starts no process in the
 * sandbox at all: no bash, no cat, each tens of milliseconds under gVisor
 * and a second or more in the emulated microVM. 0 with the run open; 1 when
 * the port is not there or nothing accepts on it (no such context, or a dead
 * one): the run script then tells which. The port file is the sandbox's:
 * what answers there is validated like anything else from inside. */
static int run_open_direct(InterpRun *x, const char *input, size_t input_len) {
        char path[160], text[16];
        snprintf(path, sizeof(path), INTERP_ROOT "/%s/port", x->context);
        if (read_small(x->sb, path, text, sizeof(text)) < 0)
                return 1;
        char *end = NULL;
        errno = 0;
        long port = strtol(text, &end, 10);
        if (errno || end == text || (*end && *end != '\n') || port < 1 || port > 65535)
                return 1;
        _cleanup_json_ json_t *req = agent_req_forward((unsigned)port);
        ApiError e;
        AgentRun a = { .sb = x->sb, .exit_code = -1 };
        if (!req || api_open_stream(x->sb, req, &a.stream, &e) < 0)
                return 1;
        ChanEvent ev;
        int k = chan_stream_next(a.stream, CONTROL_TIMEOUT_MS, &ev);
        bool connected = k == 0 && ev.type == CHAN_EV_EVENT;
        if (k == 0 && (ev.type == CHAN_EV_RESULT || ev.type == CHAN_EV_CLOSED))
                a.finished = true;
        if (k == 0)
                chan_event_clear(&ev);
        int r = connected ? 0 : -ECONNREFUSED;
        for (size_t off = 0; r == 0 && off < input_len;) {
                size_t n = input_len - off > STDIN_CHUNK ? STDIN_CHUNK : input_len - off;
                r = chan_stream_write(a.stream, input + off, n, 10000);
                off += n;
        }
        if (r == 0)
                r = chan_stream_close_write(a.stream);
        if (r < 0) {
                agent_run_done(&a);
                return 1;
        }
        x->agent = a;
        x->ready = true;
        /* The context stops the cell at timeoutMs; past that and the grace an
         * exec would get, the run is over as an exec's would be. */
        if (x->timeout_ms)
                x->deadline_ms = time_now_mono_ms() + (uint64_t)x->timeout_ms + RUN_GRACE_MS;
        return 0;
}

/* Opens the run's exec and waits for the context to say it is there. 1 when
 * the context is missing (exit 4) or dead (exit 3): *ret_exit says which. */
static int run_open(InterpRun *x, const char *input, size_t input_len, int *ret_exit, ApiError *e) {
        _cleanup_json_ json_t *argv = json_pack("[s,s,s,s,s]", "bash", "-c", run_script, "run", x->context);
        if (!argv)
                return -ENOMEM;
        /* The request (one line) as an argument, without its newline, when
         * the exec request still fits in one frame with it (the sandbox's
         * env travels there too). */
        if (input_len <= ARG_REQUEST_MAX && !memchr(input, '\0', input_len)) {
                _cleanup_json_ json_t *arg = json_stringn(input, input_len - 1);
                _cleanup_json_ json_t *env = sandbox_env(x->sb);
                size_t need = json_dumpb(arg, NULL, 0, JSON_ENCODE_ANY) +
                              json_dumpb(env, NULL, 0, JSON_COMPACT) + sizeof(run_script) * 2 + 1024;
                if (arg && need <= PROTO_MAX_JSON) {
                        if (json_array_append(argv, arg) < 0)
                                return -ENOMEM;
                        input_len = 0;
                }
        }
        /* timeoutMs 0 is a cell without a limit: the exec gets none either. */
        int64_t exec_ms = x->timeout_ms ? x->timeout_ms + RUN_GRACE_MS : 0;
        int r = agent_run_start(x->sb, argv, input, input_len, exec_ms, &x->agent, e);
        if (r < 0)
                return r;
        uint64_t deadline = time_now_mono_ms() + CONTROL_TIMEOUT_MS;
        while (!x->ready) {
                r = run_step(x);
                if (r < 0 && r != -EPIPE)
                        return r;
                if (r == -EPIPE)
                        return api_error(e, 499, "invalid_request", NULL, "the client left");
                if (r == 1) {
                        if (x->agent.closed)
                                return api_error(e, 409, "conflict", "create a new sandbox",
                                                 "the sandbox stopped");
                        *ret_exit = x->agent.exit_code;
                        agent_run_done(&x->agent);
                        return 1;
                }
                if (time_now_mono_ms() > deadline)
                        return api_error(e, 503, "unavailable", "retry", "the interpreter did not answer in time");
        }
        return 0;
}

static enum MHD_Result handle_run(Req *r, json_t *body) {
        ApiError e = { 0 };
        RunRequest q;
        if (parse_run(body, &q, &e) < 0)
                return reply_error(r, &e);
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0)
                return reply_error(r, &e);
        adopt_wait(sb);
        InterpRun *x = calloc(1, sizeof(*x));
        if (!x) {
                sandbox_release(sb);
                return reply_internal(r);
        }
        snprintf(x->rid, sizeof(x->rid), "%s", r->rid);
        /* Without a context, the language's own (python's by default). */
        snprintf(x->context, sizeof(x->context), "%s", q.context ?: q.language ?: DEFAULT_CONTEXT);
        x->sb = sb;
        x->sock = req_socket(r);
        x->streamed = q.stream;
        x->interrupt_on_disconnect = q.interrupt_on_disconnect;
        x->timeout_ms = q.timeout_ms;
        x->results = json_array();
        tailbuf_init(&x->text[0], MAX_TEXT);
        tailbuf_init(&x->text[1], MAX_TEXT);
        _cleanup_json_ json_t *input_json =
                json_pack("{s:s%,s:I}", "code", q.code, q.code_len, "timeoutMs", (json_int_t)q.timeout_ms);
        _cleanup_(freep) char *line = input_json ? json_dumps(input_json, JSON_COMPACT) : NULL;
        _cleanup_(freep) char *input = NULL;
        if (line && asprintf(&input, "%s\n", line) < 0)
                input = NULL;
        if (!x->results || !input) {
                interp_run_free(x);
                return reply_internal(r);
        }
        int exit_code = -1;
        int rc = run_open_direct(x, input, strlen(input));
        if (rc == 1)
                rc = run_open(x, input, strlen(input), &exit_code, &e);
        const char *lang = default_context_language(x->context);
        if (rc == 1 && (exit_code == 4 || exit_code == 3) && lang) {
                /* A language's own context starts on first use, and again
                 * when its process has gone. A start under way (the
                 * prestart's) holds the context's start lock: this one waits
                 * for it and then finds the context there (409). */
                char cap[24];
                memory_cap(r, cap, sizeof(cap));
                const char *args[] = { "start", x->context, lang, "/workspace", "{}", cap };
                _cleanup_json_ json_t *made = NULL;
                rc = control(sb, r->rid, args, ELEMENTSOF(args), &made, &e);
                if (rc < 0 && e.status == 409)
                        rc = 0; /* a concurrent first run started it */
                if (rc == 0)
                        rc = run_open(x, input, strlen(input), &exit_code, &e);
        }
        if (rc == 1) {
                if (exit_code == 4)
                        api_error(&e, 404, "not_found", "create it: POST .../interpreter/contexts",
                                  "no interpreter context %s", x->context);
                else if (exit_code == 3)
                        api_error(&e, 409, "conflict", "restart it: POST .../interpreter/contexts/{id}:restart",
                                  "interpreter context %s is not running (its process ended)", x->context);
                else
                        api_error(&e, 503, "unavailable", "the interpreter needs bash and python3 in the image",
                                  "the interpreter could not run in this sandbox");
                rc = -1;
        }
        if (rc < 0) {
                interp_run_free(x);
                return e.code ? reply_error(r, &e) : reply_internal(r);
        }
        if (x->streamed) {
                struct MHD_Response *resp =
                        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_reader, x, stream_free);
                if (!resp) {
                        interp_run_free(x);
                        return reply_internal(r);
                }
                return reply_response(r, 200, resp, "application/x-ndjson");
        }
        for (;;) {
                int s = run_step(x);
                if (s == -EPIPE) {
                        log_info(r->rid, "client left during a cell on %s", sandbox_id(sb));
                        agent_run_done(&x->agent);
                        interrupt_after_leave(x);
                        interp_run_free(x);
                        return MHD_NO;
                }
                if (s < 0) {
                        interp_run_free(x);
                        return reply_internal(r);
                }
                if (s == 1)
                        break;
        }
        if (x->agent.closed) {
                interp_run_free(x);
                api_error(&e, 409, "conflict", "create a new sandbox", "the sandbox stopped during the cell");
                return reply_error(r, &e);
        }
        json_t *exec = execution_json(x);
        interp_run_free(x);
        return exec ? reply_json(r, 200, exec) : reply_internal(r);
}

/* ---- contexts ---- */

static int parse_create(json_t *body, char *id, size_t id_size, const char **language, const char **cwd,
                        char **env_json, ApiError *e) {
        const char *key;
        json_t *v;
        *cwd = "/workspace";
        *language = DEFAULT_CONTEXT;
        json_object_foreach(body, key, v) {
                if (json_is_null(v))
                        continue;
                if (strcmp(key, "id") == 0) {
                        if (!json_is_string(v) || !route_context_id_ok(json_string_value(v)))
                                return api_error(e, 400, "invalid_request", NULL,
                                                 "id must be 1-63 of [a-z0-9-], starting with a letter or digit");
                        snprintf(id, id_size, "%s", json_string_value(v));
                } else if (strcmp(key, "language") == 0) {
                        if (parse_language(v, language, e) < 0)
                                return -EINVAL;
                } else if (strcmp(key, "cwd") == 0) {
                        if (!json_is_string(v) || json_string_value(v)[0] != '/' ||
                            json_string_length(v) > REQ_MAX_PATH || strlen(json_string_value(v)) != json_string_length(v))
                                return api_error(e, 400, "invalid_request", NULL,
                                                 "cwd must be an absolute path in the sandbox");
                        *cwd = json_string_value(v);
                } else if (strcmp(key, "env") == 0) {
                        if (!json_is_object(v) || json_object_size(v) > REQ_MAX_ENV)
                                return api_error(e, 400, "invalid_request", NULL,
                                                 "env must be an object of at most %u strings", REQ_MAX_ENV);
                        const char *name;
                        json_t *val;
                        json_object_foreach(v, name, val) {
                                size_t nl = strlen(name);
                                if (!json_is_string(val) || nl == 0 || nl > REQ_MAX_ENV_NAME || strchr(name, '=') ||
                                    json_string_length(val) > REQ_MAX_ENV_VALUE)
                                        return api_error(e, 400, "invalid_request", NULL,
                                                         "env must map names (no '=') to strings");
                        }
                        *env_json = json_dumps(v, JSON_COMPACT);
                        if (!*env_json || strlen(*env_json) > REQ_MAX_ENV_TOTAL)
                                return api_error(e, 400, "invalid_request", NULL, "env is over %u bytes",
                                                 REQ_MAX_ENV_TOTAL);
                } else
                        return api_error(e, 400, "invalid_request", NULL, "unknown field %.64s", key);
        }
        return 0;
}

static int context_op(Req *r, json_t *body, json_t **ret, ApiError *e) {
        Sandbox *sb;
        int rc = api_sandbox_acquire(r, &sb, e);
        if (rc < 0)
                return rc;
        adopt_wait(sb);
        const char *ctx = r->route.context;
        switch (r->route.kind) {
        case ROUTE_INTERP_CONTEXT_LIST: {
                const char *args[] = { "list" };
                rc = control(sb, r->rid, args, 1, ret, e);
                break;
        }
        case ROUTE_INTERP_CONTEXT_CREATE: {
                char id[64], hex[17];
                const char *cwd, *language;
                _cleanup_(freep) char *env = NULL;
                /* Without an id, a fresh one. */
                if ((rc = random_hex(hex, 8)) < 0)
                        break;
                snprintf(id, sizeof(id), "ctx-%s", hex);
                rc = parse_create(body, id, sizeof(id), &language, &cwd, &env, e);
                if (rc == 0) {
                        char cap[24];
                        memory_cap(r, cap, sizeof(cap));
                        const char *args[] = { "start", id, language, cwd, env ?: "{}", cap };
                        rc = control(sb, r->rid, args, ELEMENTSOF(args), ret, e);
                }
                break;
        }
        case ROUTE_INTERP_CONTEXT_RESTART:
        case ROUTE_INTERP_CONTEXT_INTERRUPT:
        case ROUTE_INTERP_CONTEXT_DELETE: {
                if (json_object_size(body) > 0) {
                        rc = api_error(e, 400, "invalid_request", NULL, "unknown field %.64s",
                                       json_object_iter_key(json_object_iter(body)));
                        break;
                }
                const char *op = r->route.kind == ROUTE_INTERP_CONTEXT_RESTART     ? "restart"
                                 : r->route.kind == ROUTE_INTERP_CONTEXT_INTERRUPT ? "interrupt"
                                                                                   : "remove";
                const char *args[] = { op, ctx };
                rc = control(sb, r->rid, args, 2, ret, e);
                const char *lang = default_context_language(ctx);
                if (rc < 0 && e->status == 404 && lang && r->route.kind == ROUTE_INTERP_CONTEXT_RESTART) {
                        /* A language's default context not started yet: a
                         * restart starts it, empty, as a restart would. */
                        char cap[24];
                        memory_cap(r, cap, sizeof(cap));
                        const char *start[] = { "start", ctx, lang, "/workspace", "{}", cap };
                        *e = (ApiError){ 0 };
                        rc = control(sb, r->rid, start, ELEMENTSOF(start), ret, e);
                }
                break;
        }
        default:
                rc = -EINVAL;
        }
        sandbox_release(sb);
        return rc;
}

/* GET .../contexts/{ctx}/results/{name}: the bytes of a kept result. */
static enum MHD_Result handle_result(Req *r) {
        ApiError e = { 0 };
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0)
                return reply_error(r, &e);
        adopt_wait(sb);
        char path[256];
        snprintf(path, sizeof(path), INTERP_ROOT "/%s/out/%s", r->route.context, r->route.result);
        /* -- and a fixed directory: the names are checked by the router, and
         * cat refuses nothing else of ours. A symlink planted by the sandbox
         * points inside the sandbox only. */
        _cleanup_json_ json_t *argv = json_pack("[s,s,s]", "cat", "--", path);
        AgentRun a;
        if (agent_run_start(sb, argv, NULL, 0, CONTROL_TIMEOUT_MS, &a, &e) < 0) {
                sandbox_release(sb);
                return reply_error(r, &e);
        }
        TailBuf out;
        tailbuf_init(&out, MAX_RESULT_FILE);
        uint64_t deadline = time_now_mono_ms() + CONTROL_TIMEOUT_MS + 5000;
        while (!a.finished && time_now_mono_ms() < deadline) {
                ChanEvent ev;
                int rc = agent_run_next(&a, &ev);
                if (rc == 0 && ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_OUT)
                        tailbuf_append(&out, ev.data, ev.len);
                if (rc != -ETIMEDOUT)
                        chan_event_clear(&ev);
        }
        int exit_code = a.exit_code;
        bool finished = a.finished && !a.closed;
        agent_run_done(&a);
        sandbox_release(sb);
        size_t len;
        char *data = tailbuf_text(&out, &len);
        bool truncated = out.truncated;
        tailbuf_done(&out);
        if (!finished || exit_code != 0 || truncated || !data) {
                free(data);
                if (finished && exit_code == 1)
                        api_error(&e, 404, "not_found", "results are kept until the context is removed",
                                  "no result %s in context %s", r->route.result, r->route.context);
                else if (truncated)
                        api_error(&e, 413, "payload_too_large", "read it with GET .../files/content",
                                  "the result is over %u MiB", MAX_RESULT_FILE >> 20);
                else
                        api_error(&e, 503, "unavailable", "retry", "the result could not be read");
                return reply_error(r, &e);
        }
        struct MHD_Response *resp = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(data);
                return reply_internal(r);
        }
        return reply_response(r, 200, resp, "application/octet-stream");
}

static enum MHD_Result context_route(Req *r) {
        ApiError e = { 0 };
        _cleanup_json_ json_t *j = NULL;
        if (context_op(r, r->json, &j, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        unsigned status = r->route.kind == ROUTE_INTERP_CONTEXT_CREATE ? 201 : 200;
        return reply_json(r, status, TAKE_PTR(j));
}

enum MHD_Result handle_interpreter_run(Req *r) {
        return handle_run(r, r->json);
}

enum MHD_Result handle_interpreter_contexts(Req *r) {
        return context_route(r);
}

enum MHD_Result handle_interpreter_result(Req *r) {
        return handle_result(r);
}
