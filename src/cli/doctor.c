#include "cli/doctor.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/client.h"
#include "cli/endpoint.h"
#include "cli/parse.h"
#include "common/macro.h"
#include "common/path.h"

static const char doctor_help[] =
        "Runs 'runtimed --doctor' (the runtimed next to this program, else the one on PATH)\n"
        "and prints its report on this host: drivers, KVM, cgroups, images. Then says\n"
        "whether the daemon at the URL answers and where the key comes from (the key itself\n"
        "is never printed). Exits 0 when all is well, 1 otherwise.\n\n"
        "Example:\n  runtime doctor\n";

char *doctor_find_runtimed(void) {
        char self[PATH_MAX], *r = NULL;
        const char *path;

        if (path_self_dir(self, sizeof(self)) == 0) {
                if (asprintf(&r, "%s/runtimed", self) < 0)
                        return NULL;
                if (access(r, X_OK) == 0)
                        return r;
                free(r);
                r = NULL;
        }
        path = getenv("PATH");
        if (!path)
                return NULL;
        while (*path) {
                size_t len = strcspn(path, ":");
                /* An empty PATH entry means the current directory: not searched. */
                if (len > 0) {
                        if (asprintf(&r, "%.*s/runtimed", (int)len, path) < 0)
                                return NULL;
                        if (access(r, X_OK) == 0)
                                return r;
                        free(r);
                        r = NULL;
                }
                path += len;
                if (*path == ':')
                        path++;
        }
        return NULL;
}

static int run_doctor(const char *runtimed) {
        int status;
        pid_t pid;

        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                char *const args[] = {(char *)"runtimed", (char *)"--doctor", NULL};
                signal(SIGPIPE, SIG_DFL);
                execv(runtimed, args);
                fprintf(stderr, "runtime: cannot run %s: %s\n", runtimed, strerror(errno));
                _exit(127);
        }
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        if (WIFEXITED(status))
                return WEXITSTATUS(status);
        return 128 + WTERMSIG(status);
}

int cmd_doctor(CliContext *ctx, int argc, char **argv) {
        _cleanup_(key_info_done) KeyInfo key = {0};
        _cleanup_client_ Client *c = NULL;
        _cleanup_free_ char *runtimed = NULL;
        _cleanup_json_ json_t *health = NULL, *limits = NULL;
        char **pos, err[CLI_ERR_MAX];
        int npos, r, rc = CLI_EXIT_OK;
        bool reachable = false;
        CliError e;

        r = cli_simple_args(ctx, "doctor", "", doctor_help, argc, argv, 0, 0, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;

        runtimed = doctor_find_runtimed();
        if (!runtimed) {
                printf("runtimed: not found next to runtime or on PATH\n");
                rc = CLI_EXIT_FAILURE;
        } else {
                printf("== %s --doctor\n", runtimed);
                r = run_doctor(runtimed);
                if (r != 0) {
                        if (r < 0)
                                printf("runtimed --doctor: cannot run it: %s\n", strerror(-r));
                        else
                                printf("runtimed --doctor: exited with %d\n", r);
                        rc = CLI_EXIT_FAILURE;
                }
        }

        printf("== client\n");
        r = cli_connect(ctx, false, &c);
        if (r > 0)
                return r;
        r = client_json(c, "GET", "/healthz", NULL, &health, &e);
        if (r < 0) {
                printf("daemon: %s\n", e.message);
                rc = CLI_EXIT_FAILURE;
        } else {
                const char *v = json_string_value(json_object_get(health, "version"));
                const char *d = json_string_value(json_object_get(health, "defaultDriver"));
                _cleanup_(endpoint_done) Endpoint ep = {0};
                reachable = true;
                (void)endpoint_parse(endpoint_choose(ctx->url), &ep, err, sizeof(err));
                printf("daemon: reachable at %s (version %s, default driver %s)\n",
                       ep.display ? ep.display : "?", v ? v : "?", d ? d : "?");
        }

        r = key_discover(ctx->key, &key, err, sizeof(err));
        if (r < 0) {
                printf("key: %s\n", r == -ENOMEM ? "out of memory" : err);
                return CLI_EXIT_FAILURE;
        }
        switch (key.source) {
        case KEY_SOURCE_FLAG:
                printf("key: from --key\n");
                break;
        case KEY_SOURCE_ENV:
                printf("key: from RUNTIME_API_KEY\n");
                break;
        case KEY_SOURCE_FILE:
                printf("key: from %s\n", key.file);
                break;
        default:
                printf("key: none; not given with --key or RUNTIME_API_KEY, and %s %s\n",
                       key.file ? key.file : "the state dir", key_file_problem(key.file_errno));
                return CLI_EXIT_FAILURE;
        }
        if (reachable) {
                r = client_json(c, "GET", "/v1/limits", NULL, &limits, &e);
                if (r < 0) {
                        printf("key: not accepted: %s\n", e.message);
                        rc = CLI_EXIT_FAILURE;
                } else {
                        const char *access = json_string_value(json_object_get(limits, "access"));
                        printf("key: accepted (access: %s)\n", access ? access : "?");
                }
        }
        return rc;
}
