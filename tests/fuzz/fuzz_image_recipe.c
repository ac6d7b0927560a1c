/*
 * libFuzzer target for image recipes and inline files
 * (daemon/model/image_recipe.h), which any client with a key sends to
 * POST /v1/images: whatever is taken makes a Dockerfile that the
 * Dockerfile's parser takes back, each line's field named, every file's
 * path relative with no "..", "." or empty part, the files within their
 * bounds, and their archive one the agent's tar reader would get.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "daemon/model/dockerfile.h"
#include "daemon/model/image_recipe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_files(const ImageFiles *f) {
        if (f->n > IMAGE_FILES_MAX || f->bytes > IMAGE_FILES_BYTES)
                abort();
        for (size_t i = 0; i < f->n; i++) {
                const char *p = f->v[i].path;
                if (!p[0] || p[0] == '/' || strstr(p, "//") || p[strlen(p) - 1] == '/' || f->v[i].mode > 0777)
                        abort();
                for (const char *s = p; *s; s += strcspn(s, "/"), s += *s == '/') {
                        size_t n = strcspn(s, "/");
                        if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
                                abort();
                }
                if (i && strcmp(f->v[i - 1].path, p) >= 0)
                        abort();
        }
        uint8_t *tar = NULL;
        size_t len = 0;
        if (image_files_archive(f, &tar, &len) == 0 && (len % 512 || len < 1024))
                abort();
        free(tar);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 65536)
                return 0;
        json_t *v = json_loadb((const char *)data, size, 0, NULL);
        if (!v)
                return 0;
        char why[512];
        ImageRecipe r;
        if (image_recipe_parse(v, &r, why, sizeof why) == 0) {
                Dockerfile d;
                DockerfileError e;
                int k = dockerfile_parse(r.dockerfile, strlen(r.dockerfile), &d, &e);
                if (k == 0) {
                        if (d.n_steps != r.n_fields || d.steps[0].op != DF_FROM)
                                abort();
                        dockerfile_done(&d);
                } else if (k != -EINVAL || !image_recipe_field_of_line(&r, e.line))
                        abort();
                check_files(&r.files);
                image_recipe_done(&r);
        }
        ImageFiles f;
        if (image_files_parse(v, "files", &f, why, sizeof why) == 0) {
                check_files(&f);
                image_files_done(&f);
        }
        json_decref(v);
        return 0;
}
