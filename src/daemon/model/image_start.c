#include "daemon/model/image_start.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/jsonutil.h"

static int bad(char *msg, size_t msg_len, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_len, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

/* A command as the wire gives it: a non-empty string (a shell's line) or a
 * non-empty array of strings (argv), bounded; argv in *ret. */
static int command_argv(json_t *v, json_t **ret, char *msg, size_t msg_len) {
        *ret = NULL;
        if (json_is_string(v)) {
                size_t n = json_string_length(v);
                if (n == 0 || n > IMAGE_START_COMMAND_MAX || strlen(json_string_value(v)) != n)
                        return bad(msg, msg_len, "start.command must be a non-empty string of at most %d bytes",
                                   IMAGE_START_COMMAND_MAX);
                *ret = json_pack("[s,s,O]", "/bin/sh", "-c", v);
                return *ret ? 0 : -ENOMEM;
        }
        if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > IMAGE_START_ARGV_MAX)
                return bad(msg, msg_len, "start.command must be a string or an array of 1 to %d strings",
                           IMAGE_START_ARGV_MAX);
        size_t i, total = 0;
        json_t *w;
        json_array_foreach(v, i, w) {
                if (!json_is_string(w) || strlen(json_string_value(w)) != json_string_length(w))
                        return bad(msg, msg_len, "start.command[%zu] must be a string", i);
                total += json_string_length(w) + 1;
        }
        if (total > IMAGE_START_COMMAND_MAX || json_string_length(json_array_get(v, 0)) == 0)
                return bad(msg, msg_len, "start.command must name a program and be at most %d bytes",
                           IMAGE_START_COMMAND_MAX);
        *ret = json_deep_copy(v);
        return *ret ? 0 : -ENOMEM;
}

int image_start_parse(json_t *v, json_t **ret, char *msg, size_t msg_len) {
        *ret = NULL;
        if (!json_is_object(v))
                return bad(msg, msg_len, "start must be an object, or null for none");
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) if (strcmp(k, "command") != 0 && strcmp(k, "readyPort") != 0 &&
                                         strcmp(k, "readyCommand") != 0 && strcmp(k, "readyTimeoutSeconds") != 0)
                return bad(msg, msg_len, "unknown field start.%.64s (start takes command, readyPort or "
                           "readyCommand, and readyTimeoutSeconds)", k);
        json_t *port = json_object_get(v, "readyPort"), *rc = json_object_get(v, "readyCommand"),
               *t = json_object_get(v, "readyTimeoutSeconds");
        if (port && json_is_null(port))
                port = NULL;
        if (rc && json_is_null(rc))
                rc = NULL;
        if (port && rc)
                return bad(msg, msg_len, "give start.readyPort or start.readyCommand, not both");
        if (port && (!json_is_integer(port) || json_integer_value(port) < 1 || json_integer_value(port) > 65535))
                return bad(msg, msg_len, "start.readyPort must be a port from 1 to 65535");
        json_int_t timeout = IMAGE_START_TIMEOUT_DEFAULT;
        if (t && !json_is_null(t)) {
                if (!json_is_integer(t) || json_integer_value(t) < IMAGE_START_TIMEOUT_MIN ||
                    json_integer_value(t) > IMAGE_START_TIMEOUT_MAX)
                        return bad(msg, msg_len, "start.readyTimeoutSeconds must be an integer from %d to %d",
                                   IMAGE_START_TIMEOUT_MIN, IMAGE_START_TIMEOUT_MAX);
                timeout = json_integer_value(t);
        }
        json_t *cmd = json_object_get(v, "command");
        if (!cmd || json_is_null(cmd))
                return bad(msg, msg_len, "start.command is required (null start keeps none)");
        _cleanup_json_ json_t *argv = NULL, *ready = NULL;
        int r = command_argv(cmd, &argv, msg, msg_len);
        if (r < 0)
                return r;
        if (rc) {
                /* The readiness check is bounded tighter: it runs once a poll. */
                char sub[256];
                r = command_argv(rc, &ready, sub, sizeof sub);
                if (r == -ENOMEM)
                        return r;
                size_t total = 0, i;
                json_t *w;
                json_array_foreach(ready, i, w) total += json_string_length(w) + 1;
                if (r < 0 || total > IMAGE_START_READY_COMMAND_MAX)
                        return bad(msg, msg_len, "start.readyCommand must be a non-empty string or array of strings "
                                   "of at most %d bytes", IMAGE_START_READY_COMMAND_MAX);
        }
        json_t *out = json_pack("{s:O,s:I}", "command", argv, "readyTimeoutSeconds", timeout);
        if (!out)
                return -ENOMEM;
        if ((port && json_object_set(out, "readyPort", port) < 0) ||
            (ready && json_object_set(out, "readyCommand", ready) < 0)) {
                json_decref(out);
                return -ENOMEM;
        }
        *ret = out;
        return 0;
}

int image_start_from_config(json_t *config, json_t **ret) {
        *ret = NULL;
        json_t *ep = json_object_get(config, "entrypoint"), *cmd = json_object_get(config, "cmd");
        if (!json_is_array(ep))
                ep = NULL;
        if (!json_is_array(cmd))
                cmd = NULL;
        if ((!ep || json_array_size(ep) == 0) && (!cmd || json_array_size(cmd) == 0))
                return 0;
        _cleanup_json_ json_t *argv = json_array();
        if (!argv)
                return -ENOMEM;
        /* A shell-form ENTRYPOINT (/bin/sh -c line) takes no arguments:
         * Docker ignores the CMD then, as sh -c would give them to $0. */
        bool shell_ep = json_is_true(json_object_get(config, "entrypointShell"));
        if (ep && json_array_extend(argv, ep) < 0)
                return -ENOMEM;
        if (cmd && !shell_ep && json_array_extend(argv, cmd) < 0)
                return -ENOMEM;
        /* An image of a registry's config is anyone's: one whose words are
         * not strings or are past the bounds gives no start. */
        char msg[128];
        _cleanup_json_ json_t *checked = NULL;
        int r = command_argv(argv, &checked, msg, sizeof msg);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return 0;
        json_t *out = json_pack("{s:O,s:i}", "command", argv, "readyTimeoutSeconds", IMAGE_START_TIMEOUT_DEFAULT);
        if (!out)
                return -ENOMEM;
        /* A HEALTHCHECK CMD is its readiness check. */
        _cleanup_json_ json_t *hc = NULL;
        r = json_is_array(json_object_get(config, "healthcheck"))
                    ? command_argv(json_object_get(config, "healthcheck"), &hc, msg, sizeof msg)
                    : 0;
        if (r == -ENOMEM || (hc && json_object_set(out, "readyCommand", hc) < 0)) {
                json_decref(out);
                return -ENOMEM;
        }
        *ret = out;
        return 0;
}
