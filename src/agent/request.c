#include "agent/request.h"
#include "agent/watch.h"

#include "agent/live_mounts.h"
#include "agent/user.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"

bool agent_request_path_valid(const char *path, size_t len) {
        if (!path || len == 0 || len > REQUEST_MAX_PATH || path[0] != '/')
                return false;
        return memchr(path, '\0', len) == NULL;
}

void agent_request_free(AgentRequest *r) {
        if (!r)
                return;
        if (r->argv)
                for (size_t i = 0; i < r->argc; i++)
                        free(r->argv[i]);
        free(r->argv);
        if (r->env)
                for (size_t i = 0; i < r->envc; i++)
                        free(r->env[i]);
        free(r->env);
        free(r->cwd);
        free(r->path);
        free(r->to);
        free(r->mount_name);
        free(r->glob);
        free(r->hostname);
        free(r->user);
        free(r->home);
        json_decref(r->tag);
        explicit_bzero(r->entropy, sizeof(r->entropy));
        free(r);
}

static void agent_request_freep(AgentRequest **r) {
        agent_request_free(*r);
}

/* A JSON string without embedded NUL, copied. NULL when absent or not one. */
static int get_string(json_t *o, const char *key, bool required, char **ret, size_t *ret_len) {
        json_t *v = json_object_get(o, key);
        if (!v || json_is_null(v)) {
                if (required)
                        return -EINVAL;
                *ret = NULL;
                return 0;
        }
        if (!json_is_string(v))
                return -EINVAL;
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (memchr(s, '\0', n))
                return -EINVAL;
        char *copy = strndup(s, n);
        if (!copy)
                return -ENOMEM;
        *ret = copy;
        if (ret_len)
                *ret_len = n;
        return 0;
}

static int get_path(json_t *o, const char *key, char **ret) {
        json_t *v = json_object_get(o, key);
        if (!v || !json_is_string(v))
                return -EINVAL;
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (!agent_request_path_valid(s, n))
                return -EINVAL;
        char *copy = strndup(s, n);
        if (!copy)
                return -ENOMEM;
        *ret = copy;
        return 0;
}

static int get_bool(json_t *o, const char *key, bool *ret) {
        json_t *v = json_object_get(o, key);
        if (!v || json_is_null(v)) {
                *ret = false;
                return 0;
        }
        if (!json_is_boolean(v))
                return -EINVAL;
        *ret = json_is_true(v);
        return 0;
}

static int get_int(json_t *o, const char *key, json_int_t def, json_int_t min, json_int_t max,
                   json_int_t *ret) {
        json_t *v = json_object_get(o, key);
        if (!v || json_is_null(v)) {
                *ret = def;
                return 0;
        }
        if (!json_is_integer(v))
                return -EINVAL;
        json_int_t i = json_integer_value(v);
        if (i < min || i > max)
                return -EINVAL;
        *ret = i;
        return 0;
}

/* argv, or command (run by the shell): exactly one of them. */
static int parse_exec_argv(json_t *o, AgentRequest *r, const char **ret_error) {
        json_t *argv = json_object_get(o, "argv");
        json_t *command = json_object_get(o, "command");
        if ((argv && !json_is_null(argv)) == (command && !json_is_null(command))) {
                *ret_error = "exactly one of argv and command is required";
                return -EINVAL;
        }
        if (argv && !json_is_null(argv)) {
                if (!json_is_array(argv) || json_array_size(argv) == 0) {
                        *ret_error = "argv must be a non-empty array of strings";
                        return -EINVAL;
                }
                if (json_array_size(argv) > REQUEST_MAX_ARGV) {
                        *ret_error = "argv has too many entries";
                        return -EINVAL;
                }
                size_t n = json_array_size(argv);
                r->argv = calloc(n + 1, sizeof(char *));
                if (!r->argv)
                        return -ENOMEM;
                for (size_t i = 0; i < n; i++) {
                        json_t *a = json_array_get(argv, i);
                        if (!json_is_string(a) ||
                            memchr(json_string_value(a), '\0', json_string_length(a))) {
                                *ret_error = "argv must be a non-empty array of strings without NUL";
                                return -EINVAL;
                        }
                        r->argv[i] = strndup(json_string_value(a), json_string_length(a));
                        if (!r->argv[i])
                                return -ENOMEM;
                        r->argc = i + 1;
                }
        } else {
                char *cmd = NULL;
                int k = get_string(o, "command", true, &cmd, NULL);
                if (k == -ENOMEM)
                        return k;
                if (k < 0) {
                        *ret_error = "command must be a string without NUL";
                        return -EINVAL;
                }
                r->argv = calloc(2, sizeof(char *));
                if (!r->argv) {
                        free(cmd);
                        return -ENOMEM;
                }
                r->argv[0] = cmd;
                r->argc = 1;
                r->shell = true;
        }
        return 0;
}

static int parse_exec(json_t *o, AgentRequest *r, const char **ret_error) {
        int k = parse_exec_argv(o, r, ret_error);
        if (k < 0)
                return k;
        json_t *cwd = json_object_get(o, "cwd");
        if (cwd && !json_is_null(cwd)) {
                k = get_path(o, "cwd", &r->cwd);
                if (k == -ENOMEM)
                        return k;
                if (k < 0) {
                        *ret_error = "cwd must be an absolute path of at most 4096 bytes without NUL";
                        return -EINVAL;
                }
        } else {
                r->cwd = strdup("/workspace");
                if (!r->cwd)
                        return -ENOMEM;
        }

        json_t *env = json_object_get(o, "env");
        if (env && !json_is_null(env)) {
                if (!json_is_object(env)) {
                        *ret_error = "env must be an object of strings";
                        return -EINVAL;
                }
                size_t n = json_object_size(env);
                if (n > REQUEST_MAX_ENV) {
                        *ret_error = "env has too many entries";
                        return -EINVAL;
                }
                r->env = calloc(n + 1, sizeof(char *));
                if (!r->env)
                        return -ENOMEM;
                const char *key;
                json_t *val;
                json_object_foreach(env, key, val) {
                        /* jansson keys are NUL-terminated; a key with an
                         * embedded NUL shows up shorter, which the '=' and
                         * empty checks below still make harmless. */
                        if (!json_is_string(val) || key[0] == '\0' || strchr(key, '=') ||
                            memchr(json_string_value(val), '\0', json_string_length(val))) {
                                *ret_error =
                                        "env keys must be non-empty without '=', values strings without NUL";
                                return -EINVAL;
                        }
                        if (asprintf(&r->env[r->envc], "%s=%s", key, json_string_value(val)) < 0) {
                                r->env[r->envc] = NULL;
                                return -ENOMEM;
                        }
                        r->envc++;
                }
        }

        json_int_t t;
        if (get_int(o, "timeoutMs", 0, 0, REQUEST_MAX_TIMEOUT_MS, &t) < 0) {
                *ret_error = "timeoutMs must be an integer between 0 and 86400000";
                return -EINVAL;
        }
        r->timeout_ms = t;
        if (get_bool(o, "syncAfter", &r->sync_after) < 0) {
                *ret_error = "syncAfter must be a boolean";
                return -EINVAL;
        }
        if (get_bool(o, "stdin", &r->stdin_stream) < 0) {
                *ret_error = "stdin must be a boolean";
                return -EINVAL;
        }
        /* 65534 and above are nobody and the overflow ids: a command never
         * runs as those on purpose. */
        if (get_int(o, "uid", -1, 0, 65533, &t) < 0 || (r->uid = t, get_int(o, "gid", -1, 0, 65533, &t) < 0)) {
                *ret_error = "uid and gid must be integers between 0 and 65533";
                return -EINVAL;
        }
        r->gid = t;
        if ((r->uid < 0) != (r->gid < 0)) {
                *ret_error = "uid and gid go together";
                return -EINVAL;
        }
        json_t *pty = json_object_get(o, "pty");
        if (pty && !json_is_null(pty)) {
                json_int_t cols, rows;
                if (!json_is_object(pty) || get_int(pty, "cols", -1, 1, REQUEST_MAX_PTY_SIDE, &cols) < 0 ||
                    get_int(pty, "rows", -1, 1, REQUEST_MAX_PTY_SIDE, &rows) < 0 || cols < 0 || rows < 0) {
                        *ret_error = "pty must be {\"cols\", \"rows\"}, each an integer between 1 and 1000";
                        return -EINVAL;
                }
                r->pty = true;
                r->pty_cols = (unsigned)cols;
                r->pty_rows = (unsigned)rows;
        }
        json_t *tag = json_object_get(o, "tag");
        if (tag && !json_is_null(tag)) {
                /* Bounded: the agent holds it as long as the process runs,
                 * and every tag must fit in one HELLO's list. */
                size_t n = json_is_object(tag) ? json_dumpb(tag, NULL, 0, JSON_COMPACT) : 0;
                if (n == 0 || n > REQUEST_MAX_TAG) {
                        *ret_error = "tag must be a JSON object of at most 4096 bytes";
                        return -EINVAL;
                }
                r->tag = json_incref(tag);
                r->tag_len = n;
        }
        return 0;
}

int agent_request_parse_attach(const uint8_t *buf, size_t len) {
        if (!json_depth_ok(buf, len, REQUEST_MAX_DEPTH))
                return -EINVAL;
        json_error_t err;
        _cleanup_json_ json_t *o = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, &err);
        return json_is_object(o) ? 0 : -EINVAL;
}

int agent_request_parse_resize(const uint8_t *buf, size_t len, unsigned *ret_cols, unsigned *ret_rows) {
        json_error_t err;
        if (!json_depth_ok(buf, len, REQUEST_MAX_DEPTH))
                return -EINVAL;
        _cleanup_json_ json_t *o = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, &err);
        json_int_t cols, rows;
        const char *ev = o ? json_string_value(json_object_get(o, "event")) : NULL;
        if (!ev || strcmp(ev, "resize") != 0 || get_int(o, "cols", -1, 1, REQUEST_MAX_PTY_SIDE, &cols) < 0 ||
            get_int(o, "rows", -1, 1, REQUEST_MAX_PTY_SIDE, &rows) < 0 || cols < 0 || rows < 0)
                return -EINVAL;
        *ret_cols = (unsigned)cols;
        *ret_rows = (unsigned)rows;
        return 0;
}

/* {"op":"signal","stream":N,"signal":S}: N an odd (host-opened) stream id,
 * S one of the signals a client may send. */
static int parse_signal(json_t *o, AgentRequest *r, const char **ret_error) {
        json_int_t v;
        if (get_int(o, "stream", -1, 1, UINT32_MAX, &v) < 0 || v < 0 || (v & 1) == 0) {
                *ret_error = "stream must be the odd id of an exec stream";
                return -EINVAL;
        }
        r->target = (uint32_t)v;
        if (get_int(o, "signal", -1, 1, 64, &v) < 0 || !agent_request_signal_allowed((int)v)) {
                *ret_error = "signal must be one of HUP INT QUIT KILL USR1 USR2 TERM CONT STOP TSTP";
                return -EINVAL;
        }
        r->signo = (int)v;
        return 0;
}

bool agent_request_signal_allowed(int signo) {
        switch (signo) {
        case SIGHUP:
        case SIGINT:
        case SIGQUIT:
        case SIGKILL:
        case SIGUSR1:
        case SIGUSR2:
        case SIGTERM:
        case SIGCONT:
        case SIGSTOP:
        case SIGTSTP:
                return true;
        default:
                return false;
        }
}

static const struct {
        const char *name;
        AgentRequestOp op;
} ops[] = {
        {"exec", REQ_EXEC}, {"read", REQ_READ},   {"write", REQ_WRITE},   {"list", REQ_LIST},
        {"stat", REQ_STAT}, {"mkdir", REQ_MKDIR}, {"remove", REQ_REMOVE}, {"rename", REQ_RENAME},
        {"resume", REQ_RESUME}, {"signal", REQ_SIGNAL}, {"forward", REQ_FORWARD},
        {"archive", REQ_ARCHIVE}, {"unarchive", REQ_UNARCHIVE}, {"checkpoint", REQ_CHECKPOINT},
        {"watch", REQ_WATCH}, {"mount", REQ_MOUNT}, {"unmount", REQ_UNMOUNT},
};

/* {"op":"archive","path","gzip","exclude":[relative paths]} and
 * {"op":"unarchive","path","maxBytes","maxEntries"}: run as an exec of the
 * agent's own code, so their output and input stream with its flow control. */
static int parse_archive(json_t *o, AgentRequest *r, const char **ret_error) {
        json_t *g = json_object_get(o, "gzip");
        if (g && !json_is_null(g) && !json_is_boolean(g)) {
                *ret_error = "gzip must be a boolean";
                return -EINVAL;
        }
        r->gzip = json_is_true(g);
        r->cwd = strdup("/");
        if (!r->cwd)
                return -ENOMEM;
        r->uid = r->gid = -1;
        json_t *ex = json_object_get(o, "exclude");
        size_t n = json_is_array(ex) ? json_array_size(ex) : 0;
        if ((ex && !json_is_null(ex) && !json_is_array(ex)) || n > REQUEST_MAX_EXCLUDES) {
                *ret_error = "exclude must be a list of at most 256 relative paths";
                return -EINVAL;
        }
        r->argv = calloc(n + 1, sizeof(char *));
        if (!r->argv)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                json_t *v = json_array_get(ex, i);
                const char *s = json_string_value(v);
                if (!s || json_string_length(v) == 0 || json_string_length(v) > REQUEST_MAX_PATH ||
                    memchr(s, '\0', json_string_length(v)) || s[0] == '/') {
                        *ret_error = "exclude must be a list of at most 256 relative paths";
                        return -EINVAL;
                }
                /* "./a/b/" is "a/b", the writer's own spelling. */
                while (s[0] == '.' && s[1] == '/')
                        s += 2;
                size_t len = strlen(s);
                while (len > 1 && s[len - 1] == '/')
                        len--;
                r->argv[i] = strndup(s, len);
                if (!r->argv[i])
                        return -ENOMEM;
                r->argc++;
        }
        json_int_t v;
        if (get_int(o, "maxBytes", 1LL << 40, 0, 1LL << 50, &v) < 0) {
                *ret_error = "maxBytes must be a non-negative integer";
                return -EINVAL;
        }
        r->max_bytes = (uint64_t)v;
        if (get_int(o, "maxEntries", 100000, 0, 10000000, &v) < 0) {
                *ret_error = "maxEntries must be a non-negative integer";
                return -EINVAL;
        }
        r->max_entries = (uint64_t)v;
        r->stdin_stream = r->op == REQ_UNARCHIVE;
        return 0;
}

/* {"op":"watch","path","recursive","maxWatches"} */
static int parse_watch(json_t *o, AgentRequest *r, const char **ret_error) {
        json_int_t v;
        if (get_int(o, "maxWatches", WATCH_DEFAULT_DESCRIPTORS, 1, WATCH_MAX_DESCRIPTORS, &v) < 0) {
                *ret_error = "maxWatches must be an integer between 1 and 65536";
                return -EINVAL;
        }
        r->limit = (unsigned)v;
        if (get_bool(o, "recursive", &r->flag) < 0) {
                *ret_error = "recursive must be a boolean";
                return -EINVAL;
        }
        return 0;
}

static int hex_digit(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

/* {"op":"mount","path","name":"<16 hex digits>","readOnly"} */
static int parse_mount(json_t *o, AgentRequest *r, const char **ret_error) {
        size_t n = 0;
        int k = get_string(o, "name", true, &r->mount_name, &n);
        if (k < 0 || n != strlen(r->mount_name) || !live_mounts_name_valid(r->mount_name)) {
                *ret_error = "name must be 16 lowercase hex digits";
                return k == -ENOMEM ? k : -EINVAL;
        }
        if (get_bool(o, "readOnly", &r->flag) < 0) {
                *ret_error = "readOnly must be a boolean";
                return -EINVAL;
        }
        return 0;
}

/* {"op":"resume","entropy":"<128 lowercase hex digits>","timeNs":N,"hostname":"..."} */
static int parse_resume(json_t *o, AgentRequest *r, const char **ret_error) {
        json_t *e = json_object_get(o, "entropy");
        const char *hex = json_string_value(e);
        if (!hex || json_string_length(e) != 2 * REQUEST_RESUME_ENTROPY) {
                *ret_error = "entropy must be 128 hex digits";
                return -EINVAL;
        }
        for (size_t i = 0; i < REQUEST_RESUME_ENTROPY; i++) {
                int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
                if (hi < 0 || lo < 0) {
                        *ret_error = "entropy must be 128 hex digits";
                        return -EINVAL;
                }
                r->entropy[i] = (uint8_t)(hi << 4 | lo);
        }
        json_int_t t;
        /* 2001 .. 2200: a clock outside that is a bug of the host's. */
        if (get_int(o, "timeNs", -1, 978307200LL * 1000000000LL, 7258118400LL * 1000000000LL, &t) < 0 || t < 0) {
                *ret_error = "timeNs must be an integer (nanoseconds since the epoch)";
                return -EINVAL;
        }
        r->time_ns = t;
        size_t n = 0;
        int k = get_string(o, "hostname", true, &r->hostname, &n);
        if (k == -ENOMEM)
                return k;
        bool ok = k == 0 && n > 0 && n <= REQUEST_MAX_HOSTNAME;
        for (size_t i = 0; ok && i < n; i++) {
                char c = r->hostname[i];
                ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        }
        if (!ok) {
                *ret_error = "hostname must be 1-64 characters of a-z, 0-9, - and _";
                return -EINVAL;
        }
        return 0;
}

int agent_request_parse(const uint8_t *buf, size_t len, AgentRequest **ret, const char **ret_error) {
        const char *dummy;
        if (!ret_error)
                ret_error = &dummy;
        *ret_error = "invalid request";
        if (!json_depth_ok(buf, len, REQUEST_MAX_DEPTH)) {
                *ret_error = "request nests too deeply";
                return -EINVAL;
        }
        json_error_t jerr;
        _cleanup_json_ json_t *o = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!o || !json_is_object(o)) {
                *ret_error = "request is not a JSON object";
                return -EINVAL;
        }
        const char *op = json_string_value(json_object_get(o, "op"));
        if (!op) {
                *ret_error = "op is required";
                return -EINVAL;
        }
        _cleanup_(agent_request_freep) AgentRequest *r = calloc(1, sizeof(AgentRequest));
        if (!r)
                return -ENOMEM;
        size_t i;
        for (i = 0; i < ELEMENTSOF(ops); i++)
                if (strcmp(ops[i].name, op) == 0)
                        break;
        if (i == ELEMENTSOF(ops)) {
                *ret_error = "unknown op";
                return -EINVAL;
        }
        r->op = ops[i].op;
        r->uid = r->gid = -1;

        int k = 0;
        json_int_t v;
        if (r->op == REQ_EXEC) {
                k = parse_exec(o, r, ret_error);
                if (k < 0)
                        return k;
        } else if (r->op == REQ_RESUME) {
                k = parse_resume(o, r, ret_error);
                if (k < 0)
                        return k;
        } else if (r->op == REQ_SIGNAL) {
                k = parse_signal(o, r, ret_error);
                if (k < 0)
                        return k;
        } else if (r->op == REQ_FORWARD) {
                /* {"op":"forward","port":N}: only a port, only on 127.0.0.1. */
                if (get_int(o, "port", -1, 1, 65535, &v) < 0 || v < 0) {
                        *ret_error = "port must be an integer between 1 and 65535";
                        return -EINVAL;
                }
                r->port = (uint16_t)v;
        } else if (r->op == REQ_RENAME) {
                if ((k = get_path(o, "from", &r->path)) < 0 || (k = get_path(o, "to", &r->to)) < 0) {
                        *ret_error = "from and to must be absolute paths of at most 4096 bytes without NUL";
                        return k == -ENOMEM ? k : -EINVAL;
                }
                /* Absent means replace, as before the field existed. */
                json_t *ow = json_object_get(o, "overwrite");
                if (ow && !json_is_null(ow) && !json_is_boolean(ow)) {
                        *ret_error = "overwrite must be a boolean";
                        return -EINVAL;
                }
                r->flag = !ow || json_is_null(ow) || json_is_true(ow);
        } else if (r->op == REQ_CHECKPOINT) {
                /* {"op":"checkpoint"}: nothing more. */
        } else {
                if ((k = get_path(o, "path", &r->path)) < 0) {
                        *ret_error = "path must be an absolute path of at most 4096 bytes without NUL";
                        return k == -ENOMEM ? k : -EINVAL;
                }
        }

        k = r->op == REQ_WATCH                                ? parse_watch(o, r, ret_error)
            : r->op == REQ_ARCHIVE || r->op == REQ_UNARCHIVE ? parse_archive(o, r, ret_error)
            : r->op == REQ_MOUNT                             ? parse_mount(o, r, ret_error)
                                                              : 0;
        if (k < 0)
                return k;
        switch (r->op) {
        case REQ_WRITE:
                if (get_int(o, "mode", 0644, 0, 07777, &v) < 0) {
                        *ret_error = "mode must be an integer between 0 and 4095";
                        return -EINVAL;
                }
                r->mode = (unsigned)v;
                k = get_bool(o, "mkdirs", &r->flag);
                break;
        case REQ_LIST: {
                size_t glen = 0;
                if ((k = get_string(o, "glob", false, &r->glob, &glen)) < 0 || (r->glob && (glen == 0 || glen > REQUEST_MAX_GLOB))) {
                        *ret_error = "glob must be a pattern of 1 to 1024 bytes without NUL";
                        return k == -ENOMEM ? k : -EINVAL;
                }
                if (get_int(o, "depth", r->glob ? 0 : 1, 1, r->glob ? REQUEST_MAX_GLOB_DEPTH : REQUEST_MAX_LIST_DEPTH,
                            &v) < 0) {
                        *ret_error = r->glob ? "depth must be an integer between 1 and 32"
                                             : "depth must be an integer between 1 and 10";
                        return -EINVAL;
                }
                r->depth = (unsigned)v;
                if (get_int(o, "limit", REQUEST_MAX_LIST_LIMIT, 1, REQUEST_MAX_LIST_LIMIT, &v) < 0) {
                        *ret_error = "limit must be an integer between 1 and 10000";
                        return -EINVAL;
                }
                r->limit = (unsigned)v;
                json_t *h = json_object_get(o, "hidden");
                if (h && !json_is_null(h) && !json_is_boolean(h)) {
                        *ret_error = "hidden must be a boolean";
                        return -EINVAL;
                }
                r->hidden = !h || json_is_null(h) || json_is_true(h);
                k = 0;
                break;
        }
        case REQ_MKDIR:
                k = get_bool(o, "parents", &r->flag);
                break;
        case REQ_REMOVE:
                k = get_bool(o, "recursive", &r->flag);
                break;
        default:
                break;
        }
        if (k < 0) {
                *ret_error = "flags must be booleans";
                return -EINVAL;
        }
        json_t *user = json_object_get(o, "user");
        if (user && !json_is_null(user)) {
                bool takes_user = r->op != REQ_RESUME && r->op != REQ_SIGNAL && r->op != REQ_FORWARD &&
                                  r->op != REQ_CHECKPOINT && r->op != REQ_MOUNT && r->op != REQ_UNMOUNT;
                const char *u = json_string_value(user);
                if (!takes_user || !u || json_string_length(user) != strlen(u) || !user_name_valid(u)) {
                        *ret_error = "user must be a user name of 1 to 32 characters of a-z, 0-9, _ and -";
                        return -EINVAL;
                }
                if (r->uid >= 0) {
                        *ret_error = "user and uid exclude each other";
                        return -EINVAL;
                }
                if (!(r->user = strdup(u)))
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(r);
        return 0;
}
