/* A build's RUN step and the secrets it mounts (docs/images.md, "Build
 * secrets"). A secret's value is the build request's, kept in the daemon's
 * memory only. For the step, a file secret is written by a root exec of the
 * build's sandbox into a directory of its /dev, which every driver gives the
 * sandbox as a tmpfs of its own (bubblewrap's --dev, gVisor's /dev mount):
 * never the disk whose layers and image are taken, where a deleted file's
 * blocks would keep the bytes. The target is a symbolic link to it, made
 * (with any directory it needs) before the step and removed after it,
 * whatever the step's outcome, so the layer taken next holds neither. An env
 * secret is a variable of the step's exec alone. Neither is in a key of the
 * cache: a changed value does not run a cached step again, as in Docker. */
#include "daemon/manager/user_images-internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"

/* On the sandbox's /dev tmpfs; 0711, so the step's user reaches its file
 * by name and lists nothing. */
#define SECRETS_DIR "/dev/.runtime-build-secrets"
#define SECRET_VAR "RUNTIME_BUILD_SECRET_"

static int append(char **buf, size_t *len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int append(char **buf, size_t *len, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        char *more = NULL;
        int n = vasprintf(&more, fmt, ap);
        va_end(ap);
        if (n < 0)
                return -ENOMEM;
        char *b = realloc(*buf, *len + (size_t)n + 1);
        if (!b) {
                free(more);
                return -ENOMEM;
        }
        memcpy(b + *len, more, (size_t)n + 1);
        free(more);
        *buf = b;
        *len += (size_t)n;
        return 0;
}

/* The script that puts step s's file secrets in place: each value (from
 * the exec's environment, never its command line) into its own file of
 * SECRETS_DIR, mode 0400 and the step user's, the directories its target
 * needs made and noted for the removal, the target a link to the file. A
 * target the image already has is refused rather than covered: the link
 * would replace it for good. Targets and ids are of a plain set of
 * characters (the parser's), quoted all the same. */
static int mount_script(Build *b, const DockerfileStep *s, json_t *env, char **ret, bool *ret_any) {
        const json_t *values = b->job->req.secrets;
        _cleanup_free_ char *sc = NULL;
        size_t len = 0;
        bool any = false;
        int r = append(&sc, &len, "set -e\numask 077\nd=" SECRETS_DIR "\nrm -rf \"$d\"\nmkdir -m 0711 \"$d\"\n"
                                  ": > \"$d/.made\"\n");
        for (size_t i = 0; r == 0 && i < s->n_secrets; i++) {
                const DockerfileSecret *m = &s->secrets[i];
                json_t *v = json_object_get(values, m->id);
                if (!v || !m->target)
                        continue;
                any = true;
                char var[64];
                snprintf(var, sizeof var, SECRET_VAR "%zu", i);
                if (json_object_set(env, var, v) < 0)
                        return -ENOMEM;
                r = append(&sc, &len, "f=\"$d/%zu\"\nprintf '%%s' \"$%s\" > \"$f\"\nchmod 0400 \"$f\"\n%s", i, var,
                           b->root ? "" : "chown sandbox \"$f\"\n");
                /* Each missing directory on the way, shallowest first. */
                for (const char *q = strchr(m->target + 1, '/'); r == 0 && q; q = strchr(q + 1, '/'))
                        r = append(&sc, &len, "[ -d '%.*s' ] || { mkdir -m 0755 '%.*s' && echo '%.*s' >> \"$d/.made\"; }\n",
                                   (int)(q - m->target), m->target, (int)(q - m->target), m->target,
                                   (int)(q - m->target), m->target);
                if (r == 0)
                        r = append(&sc, &len, "if [ -e '%s' ] || [ -L '%s' ]; then echo 'the secret %s'\"'\"'s target "
                                              "%s is in the image already' >&2; exit 3; fi\nln -s \"$f\" '%s'\n",
                                   m->target, m->target, m->id, m->target, m->target);
        }
        if (r < 0)
                return r;
        *ret_any = any;
        *ret = TAKE_PTR(sc);
        return 0;
}

/* Removes what mount_script made: the links, the directories it noted
 * (deepest first, each only while empty) and the files; with `sync` the
 * agent syncs the sandbox's files after it, in the step's place (its layer
 * is taken next). */
static int unmount_secrets(Build *b, const DockerfileStep *s, bool sync) {
        _cleanup_free_ char *sc = NULL;
        size_t len = 0;
        int r = 0;
        for (size_t i = 0; r == 0 && i < s->n_secrets; i++)
                if (s->secrets[i].target && json_object_get(b->job->req.secrets, s->secrets[i].id))
                        r = append(&sc, &len, "[ ! -L '%s' ] || rm -f '%s'\n", s->secrets[i].target,
                                   s->secrets[i].target);
        if (r == 0)
                r = append(&sc, &len, "d=" SECRETS_DIR "\nset --\nif [ -f \"$d/.made\" ]; then\n"
                                      "  while read -r l; do set -- \"$l\" \"$@\"; done < \"$d/.made\"\nfi\n"
                                      "for x; do rmdir \"$x\" 2>/dev/null || true; done\nrm -rf \"$d\"\n");
        if (r < 0)
                return -ENOMEM;
        _cleanup_json_ json_t *argv = json_array();
        _cleanup_json_ json_t *env = json_pack("{s:s}", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        if (!argv || !env)
                return -ENOMEM;
        build_shell_form(argv, sc);
        int code = 0;
        r = build_run_in_sandbox(b, argv, env, "/", true, true, sync, 60000, &code);
        if (r == 0 && code != 0)
                r = build_fail(b, "the step's secrets could not be removed (%d)", code);
        return r;
}

int build_step_run(Build *b, const DockerfileStep *s, int64_t deadline_ms, bool sync) {
        _cleanup_json_ json_t *argv = json_array();
        if (!argv)
                return -ENOMEM;
        if (s->exec) {
                /* The exec form is not expanded, as Docker's is not. */
                for (size_t i = 0; i < s->n_words; i++)
                        json_array_append_new(argv, json_string(s->words[i]));
        } else
                build_shell_form(argv, s->words[0]);
        _cleanup_json_ json_t *env = build_step_env(b);
        if (!env)
                return -ENOMEM;
        /* Env secrets: variables of this exec alone. */
        for (size_t i = 0; i < s->n_secrets; i++) {
                json_t *v = json_object_get(b->job->req.secrets, s->secrets[i].id);
                if (v && s->secrets[i].env && json_object_set(env, s->secrets[i].env, v) < 0)
                        return -ENOMEM;
        }
        int64_t left = deadline_ms - (int64_t)time_now_mono_ms();
        if (left <= 0)
                return build_fail(b, "the build's time ran out");
        bool mounted = false;
        int code = 0, r = 0;
        if (s->n_secrets) {
                _cleanup_free_ char *sc = NULL;
                _cleanup_json_ json_t *menv = json_pack("{s:s}", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
                _cleanup_json_ json_t *margv = json_array();
                if (!menv || !margv || mount_script(b, s, menv, &sc, &mounted) < 0)
                        return -ENOMEM;
                if (mounted) {
                        build_shell_form(margv, sc);
                        /* quiet: what the script says is the daemon's to
                         * word, and never holds a value. */
                        r = build_run_in_sandbox(b, margv, menv, "/", true, true, false, 60000, &code);
                        if (r == 0 && code == 3)
                                r = build_fail(b, "a secret's target is a path the image already has: mount it "
                                                  "elsewhere (target=...)");
                        else if (r == 0 && code != 0)
                                r = build_fail(b, "the step's secrets could not be put in place (%d)", code);
                }
        }
        if (r == 0) {
                r = build_run_in_sandbox(b, argv, env, b->workdir, b->root, false, sync && !mounted, left, &code);
                if (r == 0 && code != 0)
                        r = build_fail(b, "the command returned a non-zero code: %d", code);
        }
        if (mounted) {
                /* Whatever the step did: its layer, or the next step, must
                 * find nothing of the secrets. */
                char error[sizeof b->error];
                memcpy(error, b->error, sizeof error);
                int u = unmount_secrets(b, s, sync);
                if (r < 0)
                        memcpy(b->error, error, sizeof error);
                else
                        r = u;
        }
        return r;
}
