/* Image recipes and inline files (daemon/model/image_recipe.h): the
 * Dockerfile a recipe makes, in its fixed order and read back by the
 * Dockerfile's parser as the same steps; every bad item refused naming its
 * field and index; inline files' paths normalized, their clashes, bounds and
 * base64 checked; and their archive the same bytes for the same files. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "daemon/model/dockerfile.h"
#include "daemon/model/image_recipe.h"

static void refused(const char *recipe, const char *says) {
        _cleanup_json_ json_t *v = json_loads(recipe, 0, NULL);
        if (!v)
                fail_msg("not JSON: %s", recipe);
        ImageRecipe r;
        char why[512] = "";
        assert_int_equal(image_recipe_parse(v, &r, why, sizeof why), -EINVAL);
        assert_null(r.dockerfile);
        if (!strstr(why, says))
                fail_msg("\"%s\" does not say \"%s\"", why, says);
}

static void test_order_and_parse_back(void **state) {
        (void)state;
        _cleanup_json_ json_t *v = json_loads(
                "{\"pip\": [\"./pkg-1.0-py3-none-any.whl\", \"requests[socks]>=2.0\"], \"apt\": [\"curl\", "
                "\"libssl-dev:amd64=3.0.11-1\"], \"npm\": [\"@scope/tool@^1.2\"], \"env\": {\"B\": \"two $HOME \\\"q\\\" "
                "\\\\\", \"A\": \"one\"}, \"workdir\": \"/opt/app\", \"commands\": [\"echo hi > x\", \"printf 'a\\nb'\"], "
                "\"files\": [{\"path\": \"./d//f.txt\", \"content\": \"hi\"}], \"base\": \"python:3.12-slim\", "
                "\"user\": \"sandbox\"}",
                0, NULL);
        assert_non_null(v);
        ImageRecipe r;
        char why[512] = "";
        assert_int_equal(image_recipe_parse(v, &r, why, sizeof why), 0);
        const char *want[] = { "FROM python:3.12-slim", "ENV A=", "ENV B=", "WORKDIR /opt/app", "RUN [\"/bin/sh\"",
                               "COPY . ./", "RUN [\"env\"", "RUN [\"npm\"", "RUN echo hi > x",
                               "RUN [\"/bin/sh\",\"-c\",\"printf 'a\\nb'\"]", "USER sandbox" };
        const char *p = r.dockerfile;
        for (size_t i = 0; i < ELEMENTSOF(want); i++) {
                if (strncmp(p, want[i], strlen(want[i])) != 0)
                        fail_msg("line %zu is not \"%s\": %s", i + 1, want[i], r.dockerfile);
                p = strchr(p, '\n') + 1;
        }
        assert_string_equal(p, "");
        assert_string_equal(image_recipe_field_of_line(&r, 5), "recipe.apt");
        assert_string_equal(image_recipe_field_of_line(&r, 10), "recipe.commands[1]");
        Dockerfile d;
        DockerfileError e;
        assert_int_equal(dockerfile_parse(r.dockerfile, strlen(r.dockerfile), &d, &e), 0);
        assert_int_equal(d.n_steps, 11);
        assert_int_equal(d.steps[10].op, DF_USER);
        assert_string_equal(image_recipe_field_of_line(&r, 11), "recipe.user");
        /* The ENV value is read back literally once expanded. */
        assert_int_equal(d.steps[2].op, DF_ENV);
        assert_string_equal(d.steps[2].words[0], "B");
        char *x = NULL;
        assert_int_equal(dockerfile_expand(d.steps[2].words[1], NULL, NULL, &x, &e), 0);
        assert_string_equal(x, "two $HOME \"q\" \\");
        free(x);
        /* apt's packages are the script's arguments, not its text. */
        assert_true(d.steps[4].exec);
        assert_string_equal(d.steps[4].words[4], "curl");
        assert_string_equal(d.steps[4].words[5], "libssl-dev:amd64=3.0.11-1");
        assert_true(d.steps[6].exec);
        assert_string_equal(d.steps[6].words[9], "--");
        assert_string_equal(d.steps[6].words[10], "./pkg-1.0-py3-none-any.whl");
        assert_true(d.steps[9].exec);
        assert_string_equal(d.steps[9].words[2], "printf 'a\nb'");
        dockerfile_done(&d);
        /* The record keeps the recipe, its files as sizes and digests. */
        json_t *f = json_array_get(json_object_get(r.record, "files"), 0);
        assert_string_equal(json_string_value(json_object_get(f, "path")), "d/f.txt");
        assert_int_equal(json_integer_value(json_object_get(f, "size")), 2);
        assert_null(json_object_get(f, "content"));
        assert_string_equal(json_string_value(json_object_get(r.record, "base")), "python:3.12-slim");
        image_recipe_done(&r);
}

static void test_defaults(void **state) {
        (void)state;
        _cleanup_json_ json_t *v = json_object();
        ImageRecipe r;
        char why[512] = "";
        assert_int_equal(image_recipe_parse(v, &r, why, sizeof why), 0);
        assert_string_equal(r.dockerfile, "FROM default\nWORKDIR /workspace\n");
        image_recipe_done(&r);
}

static void test_refusals(void **state) {
        (void)state;
        refused("[]", "recipe must be an object");
        refused("{\"pythonPackages\": []}", "unknown field pythonPackages");
        refused("{\"apt\": [\"curl\", \"-o=APT::Get::AllowUnauthenticated=1\"]}", "recipe.apt[1] starts with \"-\"");
        refused("{\"apt\": [\"curl; rm -rf /\"]}", "recipe.apt[0] is not a Debian package");
        refused("{\"apt\": [\"lib*\"]}", "recipe.apt[0]");
        refused("{\"apt\": [\"Curl\"]}", "recipe.apt[0]");
        refused("{\"pip\": [\"--index-url=http://evil/\"]}", "recipe.pip[0] starts with \"-\"");
        refused("{\"pip\": [\"ok\", \"x$(id)\"]}", "recipe.pip[1] is not a pip requirement");
        refused("{\"pip\": [\"a b\"]}", "recipe.pip[0]");
        refused("{\"pip\": [\"\"]}", "recipe.pip[0] must be a string");
        refused("{\"pip\": \"pandas\"}", "recipe.pip must be an array");
        refused("{\"npm\": [\"-g\"]}", "recipe.npm[0] starts with \"-\"");
        refused("{\"npm\": [\"x`id`\"]}", "recipe.npm[0] is not an npm package");
        refused("{\"commands\": [\"true\", 7]}", "recipe.commands[1]");
        refused("{\"commands\": [\"cat <<EOF\\nx\\nEOF\"], \"base\": \"--platform=x\"}", "recipe.base");
        refused("{\"env\": {\"1A\": \"x\"}}", "recipe.env: 1A is not a variable's name");
        refused("{\"env\": {\"A\": \"x\\ny\"}}", "recipe.env.A");
        refused("{\"env\": {\"A\": 1}}", "recipe.env.A");
        refused("{\"user\": \"root; id\"}", "recipe.user");
        refused("{\"user\": \"Sandbox\"}", "recipe.user");
        refused("{\"user\": \"-u\"}", "recipe.user");
        refused("{\"user\": \"sandbox:sandbox\"}", "recipe.user");
        refused("{\"user\": \"1000\"}", "recipe.user must be \"root\" or \"sandbox\"");
        refused("{\"user\": 1000}", "recipe.user");
        refused("{\"workdir\": \"rel\"}", "recipe.workdir");
        refused("{\"workdir\": \"/a/../b\"}", "recipe.workdir");
        refused("{\"workdir\": \"/a b\"}", "recipe.workdir");
        refused("{\"base\": \"default\\nRUN x\"}", "recipe.base");
        refused("{\"files\": [{\"path\": \"../x\", \"content\": \"\"}]}", "recipe.files[0].path holds \"..\"");
        /* 300 apt packages: past the bound. */
        char big[8192] = "{\"apt\": [";
        for (int i = 0; i < 300; i++)
                strcat(big, i ? ",\"ab\"" : "\"ab\"");
        strcat(big, "]}");
        refused(big, "recipe.apt must be an array of at most 256");
}

static void files_refused(const char *files, const char *says) {
        _cleanup_json_ json_t *v = json_loads(files, 0, NULL);
        if (!v)
                fail_msg("not JSON: %s", files);
        ImageFiles f;
        char why[512] = "";
        assert_int_equal(image_files_parse(v, "files", &f, why, sizeof why), -EINVAL);
        assert_int_equal(f.n, 0);
        if (!strstr(why, says))
                fail_msg("\"%s\" does not say \"%s\"", why, says);
}

static void test_files(void **state) {
        (void)state;
        files_refused("{\"a\": \"x\"}", "files must be an array");
        files_refused("[{\"path\": \"/etc/passwd\", \"content\": \"\"}]", "files[0].path is absolute");
        files_refused("[{\"path\": \"a/../../x\", \"content\": \"\"}]", "files[0].path holds \"..\"");
        files_refused("[{\"path\": \"./\", \"content\": \"\"}]", "files[0].path names no file");
        files_refused("[{\"path\": \"\", \"content\": \"\"}]", "files[0].path is empty");
        files_refused("[{\"path\": \"a\\nb\", \"content\": \"\"}]", "files[0].path holds a control");
        files_refused("[{\"path\": \"a\", \"content\": \"\"}, {\"path\": \"./a\", \"content\": \"\"}]",
                      "a is given twice");
        files_refused("[{\"path\": \"a\", \"content\": \"\"}, {\"path\": \"a-b\", \"content\": \"\"}, "
                      "{\"path\": \"a/b\", \"content\": \"\"}]", "a is a file, and a/b is under it");
        files_refused("[{\"path\": \"a\", \"content\": \"!!!!\", \"encoding\": \"base64\"}]",
                      "files[0].content is not base64");
        files_refused("[{\"path\": \"a\", \"content\": \"YQ\", \"encoding\": \"base64\"}]", "not base64");
        files_refused("[{\"path\": \"a\", \"content\": \"\", \"encoding\": \"hex\"}]", "files[0].encoding");
        files_refused("[{\"path\": \"a\", \"content\": \"\", \"mode\": 2541}]", "files[0].mode");
        files_refused("[{\"path\": \"a\", \"content\": \"\", \"owner\": 0}]", "unknown field owner");
        files_refused("[{\"path\": \"a\"}]", "files[0].content must be a string");
        /* 1001 files, and 9 MiB. */
        json_t *many = json_array();
        for (int i = 0; i < 1001; i++)
                json_array_append_new(many, json_pack("{s:s,s:s}", "path", "f", "content", ""));
        char *t = json_dumps(many, 0);
        files_refused(t, "files has 1001 files; the most is 1000");
        free(t);
        json_decref(many);
        char *blob = malloc(5u << 20);
        memset(blob, 'a', 5u << 20);
        blob[(5u << 20) - 1] = '\0';
        json_t *two = json_pack("[{s:s,s:s},{s:s,s:s}]", "path", "a", "content", blob, "path", "b", "content", blob);
        free(blob);
        t = json_dumps(two, 0);
        json_decref(two);
        files_refused(t, "files[1]: the files are over 8 MiB together");
        free(t);
}

static void test_archive(void **state) {
        (void)state;
        _cleanup_json_ json_t *v = json_loads("[{\"path\": \"z/y/b.txt\", \"content\": \"YmluAA==\", \"encoding\": "
                                              "\"base64\", \"mode\": 493}, {\"path\": \"a.txt\", \"content\": \"hi\"}, "
                                              "{\"path\": \"z/y/a.txt\", \"content\": \"x\"}]",
                                              0, NULL);
        ImageFiles f;
        char why[512] = "";
        assert_int_equal(image_files_parse(v, "files", &f, why, sizeof why), 0);
        assert_int_equal(f.n, 3);
        assert_int_equal(f.bytes, 7);
        assert_string_equal(f.v[0].path, "a.txt");
        assert_int_equal(f.v[2].len, 4);
        assert_memory_equal(f.v[2].data, "bin\0", 4);
        assert_int_equal(f.v[2].mode, 0755);
        uint8_t *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        assert_int_equal(image_files_archive(&f, &a, &al), 0);
        assert_int_equal(image_files_archive(&f, &b, &bl), 0);
        /* a.txt, z/, z/y/, z/y/a.txt, z/y/b.txt: headers, three blocks of
         * data, the end. */
        assert_int_equal(al, 512 * (5 + 3 + 2));
        assert_int_equal(al, bl);
        assert_memory_equal(a, b, al);
        assert_string_equal((char *)a, "a.txt");
        assert_string_equal((char *)a + 1024, "z/");
        assert_string_equal((char *)a + 1536, "z/y/");
        free(a);
        free(b);
        image_files_done(&f);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_order_and_parse_back), cmocka_unit_test(test_defaults),
                cmocka_unit_test(test_refusals), cmocka_unit_test(test_files), cmocka_unit_test(test_archive),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
