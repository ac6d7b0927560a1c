/* Dockerfiles (daemon/model/dockerfile.h): each supported instruction
 * becomes its typed step with the line it starts on; continuations,
 * comments and quotes read as Docker reads them; what is not supported is
 * refused by name with its line; variables expand; context paths never
 * leave the context. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/model/dockerfile.h"

static int parse(const char *text, Dockerfile *d, DockerfileError *e) {
        return dockerfile_parse(text, strlen(text), d, e);
}

static void test_supported_instructions(void **state) {
        const char *text = "# syntax=docker/dockerfile:1\n"
                           "ARG BASE=default\n"
                           "FROM $BASE AS build\n"
                           "ENV A=1 B=\"two words\"\n"
                           "ENV LEGACY value with blanks\n"
                           "WORKDIR /app\n"
                           "COPY --chown=sandbox:sandbox --chmod=0755 a.py b/ /app/\n"
                           "RUN echo hi && \\\n"
                           "# a comment inside\n"
                           "    echo there\n"
                           "USER sandbox\n"
                           "LABEL org.example=\"x y\" k=v\n"
                           "EXPOSE 8080 53/udp\n"
                           "FROM default\n"
                           "COPY --from=build /app /app\n"
                           "COPY [\"with space\", \"/dst/\"]\n"
                           "CMD [\"python3\", \"-m\", \"http.server\"]\n"
                           "ENTRYPOINT exec python3\n";
        Dockerfile d;
        DockerfileError e;
        assert_int_equal(parse(text, &d, &e), 0);
        assert_int_equal(d.n_stages, 2);
        assert_int_equal(d.n_steps, 15);
        DockerfileStep *s = d.steps;
        assert_int_equal(s[0].op, DF_ARG);
        assert_string_equal(s[0].words[0], "BASE");
        assert_string_equal(s[0].words[1], "default");
        assert_int_equal(s[1].op, DF_FROM);
        assert_int_equal(s[1].line, 3);
        assert_string_equal(s[1].words[0], "$BASE");
        assert_string_equal(s[1].as, "build");
        assert_int_equal(s[2].op, DF_ENV);
        assert_int_equal(s[2].n_words, 4);
        assert_string_equal(s[2].words[3], "two words");
        assert_string_equal(s[3].words[0], "LEGACY");
        assert_string_equal(s[3].words[1], "value with blanks");
        assert_int_equal(s[4].op, DF_WORKDIR);
        assert_int_equal(s[5].op, DF_COPY);
        assert_string_equal(s[5].chown, "sandbox:sandbox");
        assert_string_equal(s[5].chmod, "0755");
        assert_int_equal(s[5].n_words, 3);
        assert_string_equal(s[5].words[2], "/app/");
        assert_int_equal(s[6].op, DF_RUN);
        assert_int_equal(s[6].line, 8);
        assert_false(s[6].exec);
        assert_int_equal(s[6].n_words, 1);
        assert_string_equal(s[6].words[0], "echo hi &&     echo there");
        assert_int_equal(s[7].op, DF_USER);
        assert_int_equal(s[7].line, 11);
        assert_int_equal(s[8].op, DF_LABEL);
        assert_string_equal(s[8].words[0], "org.example");
        assert_string_equal(s[8].words[1], "x y");
        assert_int_equal(s[9].op, DF_EXPOSE);
        assert_int_equal(s[10].op, DF_FROM);
        assert_int_equal(s[10].stage, 1);
        assert_int_equal(s[11].stage, 1);
        assert_string_equal(s[11].from, "build");
        assert_string_equal(s[12].words[0], "with space");
        assert_true(s[13].exec);
        assert_int_equal(s[13].n_words, 3);
        assert_int_equal(s[14].op, DF_ENTRYPOINT);
        assert_false(s[14].exec);
        assert_int_equal(dockerfile_stage(&d, "build"), 0);
        assert_int_equal(dockerfile_stage(&d, "1"), 1);
        assert_int_equal(dockerfile_stage(&d, "2"), -1);
        assert_int_equal(dockerfile_stage(&d, "nope"), -1);
        dockerfile_done(&d);
}

/* HEALTHCHECK: Docker's flags taken, CMD's shell and exec forms, NONE. */
static void test_healthcheck(void **state) {
        Dockerfile d;
        DockerfileError e;
        assert_int_equal(parse("FROM default\nHEALTHCHECK --interval=5s --timeout=3s --retries=3 CMD curl -f "
                               "localhost:8000 || exit 1\nHEALTHCHECK CMD [\"true\", \"x\"]\nHEALTHCHECK none\n",
                               &d, &e), 0);
        assert_int_equal(d.n_steps, 4);
        assert_int_equal(d.steps[1].op, DF_HEALTHCHECK);
        assert_false(d.steps[1].exec);
        assert_int_equal(d.steps[1].n_words, 1);
        assert_string_equal(d.steps[1].words[0], "curl -f localhost:8000 || exit 1");
        assert_true(d.steps[2].exec);
        assert_int_equal(d.steps[2].n_words, 2);
        assert_string_equal(d.steps[2].words[1], "x");
        assert_int_equal(d.steps[3].n_words, 0);
        dockerfile_done(&d);
}

/* Each refused with its line and a message that names what. */
/* A "<<" in the exec form's JSON is the command's own (a shell it runs
 * reads the heredoc), as BuildKit reads it; in the shell form it is
 * refused (test_refusals). */
static void test_heredoc_in_the_exec_form(void **state) {
        Dockerfile d;
        DockerfileError e;
        assert_int_equal(parse("FROM default\nRUN [\"/bin/sh\",\"-c\",\"cat > f <<'EOF'\\nx\\nEOF\"]\nUSER sandbox\n", &d, &e), 0);
        assert_int_equal(d.n_steps, 3);
        assert_int_equal(d.steps[1].op, DF_RUN);
        assert_true(d.steps[1].exec);
        assert_int_equal(d.steps[1].n_words, 3);
        assert_string_equal(d.steps[1].words[2], "cat > f <<'EOF'\nx\nEOF");
        assert_int_equal(d.steps[2].op, DF_USER);
        assert_int_equal(d.steps[2].line, 3);
        dockerfile_done(&d);
}

static void test_refusals(void **state) {
        static const struct {
                const char *text;
                unsigned line;
                const char *says;
        } cases[] = {
                { "FROM default\nFOO bar\n", 2, "unknown instruction FOO" },
                { "FROM default\n\nHEALTHCHECK true\n", 3, "HEALTHCHECK takes CMD" },
                { "FROM default\nHEALTHCHECK NONE x\n", 2, "HEALTHCHECK takes CMD" },
                { "FROM default\nHEALTHCHECK CMD\n", 2, "HEALTHCHECK CMD needs a command" },
                { "FROM default\nHEALTHCHECK CMD []\n", 2, "HEALTHCHECK CMD needs a command" },
                { "FROM default\nHEALTHCHECK --bogus=1 CMD true\n", 2, "HEALTHCHECK --bogus is not supported" },
                { "FROM default\nHEALTHCHECK --retries CMD true\n", 2, "needs a value" },
                { "FROM default\nSTOPSIGNAL TERM\n", 2, "STOPSIGNAL is not supported" },
                { "FROM default\nVOLUME /data\n", 2, "VOLUME is not supported" },
                { "FROM default\nONBUILD RUN x\n", 2, "ONBUILD is not supported" },
                { "FROM default\nSHELL [\"/bin/sh\"]\n", 2, "SHELL is not supported" },
                { "RUN true\n", 1, "before the first FROM" },
                { "FROM default\nRUN --mount=type=cache,target=/x true\n", 2, "type=cache is not supported" },
                { "FROM default\nRUN --mount=target=/x true\n", 2, "bind mount, which is not supported" },
                { "FROM default\nRUN --mount true\n", 2, "RUN --mount needs a value" },
                { "FROM default\nRUN --mount=type=secret true\n", 2, "needs id=" },
                { "FROM default\nRUN --mount=type=secret,id=a/b true\n", 2, "id must be" },
                { "FROM default\nRUN --mount=type=secret,id=.. true\n", 2, "id must be" },
                { "FROM default\nRUN --mount=type=secret,id=a,target=rel true\n", 2, "absolute path" },
                { "FROM default\nRUN --mount=type=secret,id=a,target=/x/../etc/passwd true\n", 2, "absolute path" },
                { "FROM default\nRUN --mount=type=secret,id=a,target=/proc/self/x true\n", 2, "absolute path" },
                { "FROM default\nRUN --mount=type=secret,id=a,target=/dev/shm/x true\n", 2, "absolute path" },
                { "FROM default\nRUN --mount=type=secret,id=a,target=/ true\n", 2, "absolute path" },
                { "FROM default\nRUN --mount=type=secret,id=a,env=1X true\n", 2, "variable's name" },
                { "FROM default\nRUN --mount=type=secret,id=a,mode=0444 true\n", 2, "option mode is not supported" },
                { "FROM default\nRUN --mount=type=secret,id=a,required=yes true\n", 2, "true or false" },
                { "FROM default\nRUN --mount=type=secret,id=a,id=b true\n", 2, "gives id twice" },
                { "FROM default\nRUN --mount=type=secret,id=a --mount=type=secret,id=a,env=A true\n", 2, "twice" },
                { "FROM default\nRUN --mount=type=secret,id=a --network=none true\n", 2, "RUN --network is not supported" },
                { "FROM default\nCMD --mount=type=secret,id=a true\n", 2, "takes no flags" },
                { "FROM default\nRUN --network=none true\n", 2, "RUN --network is not supported" },
                { "FROM default\nCOPY --link a /b\n", 2, "COPY --link is not supported" },
                { "FROM --platform=linux/arm64 default\n", 1, "FROM --platform is not supported" },
                { "FROM default\nRUN <<EOF\necho\nEOF\n", 2, "heredoc" },
                { "FROM default\nADD https://example.com/x /x\n", 2, "ADD from a URL" },
                { "FROM default\nADD a.tar.gz /x\n", 2, "ADD of an archive" },
                { "FROM default\nCOPY onlyone\n", 2, "a source and a destination" },
                { "FROM default\nCOPY --from=7 /a /b\n", 2, "names no earlier stage" },
                { "FROM default\nCOPY --from=b /a /b\nFROM default AS b\n", 2, "names a later stage" },
                { "FROM default\nCOPY --from=\"a b\" /a /b\n", 2, "neither an earlier stage nor an image" },
                { "FROM default AS a\nCOPY --from=a /a /b\n", 2, "names no earlier stage" },
                { "FROM default AS a\nFROM default AS a\n", 2, "named twice" },
                { "FROM default\nENV \"unclosed\n", 2, "not closed" },
                { "FROM default\nLABEL novalue\n", 2, "name=value" },
                { "FROM default\nEXPOSE 70000\n", 2, "not a port" },
                { "FROM default\nCOPY --chmod=999 a /b\n", 2, "not an octal mode" },
                { "FROM default\nWORKDIR\n", 2, "takes one path" },
                { "FROM a b\n", 1, "AS name at most" },
                { "# escape=`\nFROM default\n", 1, "escape directive" },
                { "# only a comment\n", 0, "no FROM" },
                { "", 0, "no FROM" },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                Dockerfile d;
                DockerfileError e;
                int r = parse(cases[i].text, &d, &e);
                if (r == 0 || e.line != cases[i].line || !strstr(e.message, cases[i].says))
                        fail_msg("case %zu: %d line %u: %s", i, r, e.line, e.message);
        }
}

/* RUN --mount=type=secret: ids, targets (the default /run/secrets/ID),
 * env, required, several on one step; the command after them as written. */
static void test_secret_mounts(void **state) {
        const char *text = "FROM default\n"
                           "RUN --mount=type=secret,id=tok cat /run/secrets/tok\n"
                           "RUN --mount=type=secret,id=a,target=/etc/a.key,required=true \\\n"
                           "    --mount=type=secret,id=b,env=B_TOKEN,required [\"sh\", \"-c\", \"x\"]\n"
                           "RUN --mount=type=secret,target=/root/.npmrc,env=NPM,required=false echo \"$NPM\"\n"
                           "RUN true\n";
        Dockerfile d;
        DockerfileError e;
        assert_int_equal(parse(text, &d, &e), 0);
        assert_int_equal(d.n_steps, 5);
        const DockerfileStep *s = &d.steps[1];
        assert_int_equal(s->n_secrets, 1);
        assert_string_equal(s->secrets[0].id, "tok");
        assert_string_equal(s->secrets[0].target, "/run/secrets/tok");
        assert_null(s->secrets[0].env);
        assert_false(s->secrets[0].required);
        assert_string_equal(s->words[0], "cat /run/secrets/tok");
        s = &d.steps[2];
        assert_int_equal(s->n_secrets, 2);
        assert_string_equal(s->secrets[0].target, "/etc/a.key");
        assert_true(s->secrets[0].required);
        assert_string_equal(s->secrets[1].id, "b");
        assert_null(s->secrets[1].target); /* env only: no file */
        assert_string_equal(s->secrets[1].env, "B_TOKEN");
        assert_true(s->secrets[1].required);
        assert_true(s->exec);
        assert_int_equal(s->n_words, 3);
        s = &d.steps[3];
        assert_string_equal(s->secrets[0].id, ".npmrc"); /* the target's last part */
        assert_string_equal(s->secrets[0].target, "/root/.npmrc");
        assert_string_equal(s->secrets[0].env, "NPM");
        assert_false(s->secrets[0].required);
        assert_string_equal(s->words[0], "echo \"$NPM\"");
        assert_int_equal(d.steps[4].n_secrets, 0);
        dockerfile_done(&d);
        /* COPY --from a name no stage has: an image. */
        assert_int_equal(parse("FROM default AS a\nFROM default\nCOPY --from=a /x /y\nCOPY --from=app:v1 /x /y\n"
                               "COPY --from=${BASE} /x /y\n", &d, &e), 0);
        assert_false(d.steps[2].from_image);
        assert_true(d.steps[3].from_image);
        assert_string_equal(d.steps[3].from, "app:v1");
        assert_true(d.steps[4].from_image);
        dockerfile_done(&d);
        /* The bound of mounts on one step. */
        char many[4096] = "FROM default\nRUN";
        for (unsigned i = 0; i <= DOCKERFILE_MAX_SECRETS; i++)
                snprintf(many + strlen(many), sizeof many - strlen(many), " --mount=type=secret,id=s%u", i);
        strcat(many, " true\n");
        assert_int_equal(parse(many, &d, &e), -EINVAL);
        assert_non_null(strstr(e.message, "more than"));
}

static void test_bounds(void **state) {
        Dockerfile d;
        DockerfileError e;
        /* A NUL byte. */
        assert_int_equal(dockerfile_parse("FROM a\0", 7, &d, &e), -EINVAL);
        /* Past the byte bound. */
        size_t n = DOCKERFILE_MAX_BYTES + 1;
        char *big = malloc(n);
        assert_non_null(big);
        memset(big, '#', n);
        assert_int_equal(dockerfile_parse(big, n, &d, &e), -E2BIG);
        free(big);
        /* Past the steps' bound. */
        size_t cap = (DOCKERFILE_MAX_STEPS + 2) * 8 + 16, o = 0;
        char *many = malloc(cap);
        assert_non_null(many);
        o += (size_t)sprintf(many, "FROM a\n");
        for (unsigned i = 0; i < DOCKERFILE_MAX_STEPS + 1; i++)
                o += (size_t)sprintf(many + o, "USER u\n");
        assert_int_equal(dockerfile_parse(many, o, &d, &e), -E2BIG);
        assert_non_null(strstr(e.message, "more than"));
        free(many);
        /* A continuation at the very end still makes its step. */
        assert_int_equal(parse("FROM a\nRUN echo \\", &d, &e), 0);
        assert_int_equal(d.n_steps, 2);
        assert_string_equal(d.steps[1].words[0], "echo ");
        dockerfile_done(&d);
}

static const char *lookup(void *userdata, const char *name) {
        if (strcmp(name, "A") == 0)
                return "one";
        if (strcmp(name, "EMPTY") == 0)
                return "";
        return NULL;
}

static void test_expand(void **state) {
        static const struct {
                const char *in, *out;
        } cases[] = {
                { "$A", "one" },          { "${A}x", "onex" },        { "x$A-y", "xone-y" },
                { "$NONE.", "." },        { "${NONE:-d}", "d" },      { "${EMPTY:-d}", "d" },
                { "${A:-d}", "one" },     { "${A:+set}", "set" },     { "${NONE:+set}", "" },
                { "\\$A", "$A" },         { "cost $", "cost $" },     { "${NONE:-${A}}", "one" },
                { "$1", "$1" },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                char *out = NULL;
                DockerfileError e;
                assert_int_equal(dockerfile_expand(cases[i].in, lookup, NULL, &out, &e), 0);
                if (strcmp(out, cases[i].out) != 0)
                        fail_msg("%s gave %s, not %s", cases[i].in, out, cases[i].out);
                free(out);
        }
        char *out;
        DockerfileError e;
        assert_int_equal(dockerfile_expand("${A", lookup, NULL, &out, &e), -EINVAL);
        assert_int_equal(dockerfile_expand("${A/x/y}", lookup, NULL, &out, &e), -EINVAL);
        assert_non_null(strstr(e.message, "only ${NAME:-word}"));
        assert_int_equal(dockerfile_expand("${}", lookup, NULL, &out, &e), -EINVAL);
        /* A single-quoted $ is not expanded: the parser escapes it. */
        Dockerfile d;
        assert_int_equal(parse("FROM a\nENV X='$A' Y=\"$A\"\n", &d, &e), 0);
        assert_int_equal(dockerfile_expand(d.steps[1].words[1], lookup, NULL, &out, &e), 0);
        assert_string_equal(out, "$A");
        free(out);
        assert_int_equal(dockerfile_expand(d.steps[1].words[3], lookup, NULL, &out, &e), 0);
        assert_string_equal(out, "one");
        free(out);
        dockerfile_done(&d);
}

static void test_context_path(void **state) {
        static const struct {
                const char *in, *out;
        } ok[] = {
                { "a/b", "a/b" }, { "./a//b/", "a/b" }, { "/a/../b", "b" }, { ".", "" }, { "a/..", "" }, { "/", "" },
        };
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
                char *out;
                assert_int_equal(dockerfile_context_path(ok[i].in, &out), 0);
                assert_string_equal(out, ok[i].out);
                free(out);
        }
        char *out;
        assert_int_equal(dockerfile_context_path("..", &out), -EPERM);
        assert_int_equal(dockerfile_context_path("../etc/passwd", &out), -EPERM);
        assert_int_equal(dockerfile_context_path("a/../../b", &out), -EPERM);
        assert_int_equal(dockerfile_context_path("/../x", &out), -EPERM);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_supported_instructions),
                cmocka_unit_test(test_healthcheck),
                cmocka_unit_test(test_heredoc_in_the_exec_form),
                cmocka_unit_test(test_refusals),
                cmocka_unit_test(test_secret_mounts),
                cmocka_unit_test(test_bounds),
                cmocka_unit_test(test_expand),
                cmocka_unit_test(test_context_path),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
