/*
 * libFuzzer target for the Dockerfile parser (daemon/model/dockerfile.h),
 * whose text any client with a key sends: whatever it takes has at least
 * one FROM, its first step a FROM or an ARG, every step's line within the
 * text's lines and not before the step ahead of it, every COPY --from an
 * earlier stage or an image (naming no stage); a refusal has a message.
 * Every word of what it takes then goes through the expansion and the
 * context path cleaner, whose results are checked too (bounded; a clean
 * path never holds "..").
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/dockerfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *lookup(void *userdata, const char *name) {
        /* A value that holds expansions of its own: never expanded again. */
        return name[0] == 'A' ? "${A}$A" : name[0] == 'B' ? "" : NULL;
}

static void words(const DockerfileStep *s) {
        for (size_t i = 0; i < s->n_words; i++) {
                if (!s->words[i])
                        continue;
                char *out = NULL;
                DockerfileError e;
                if (dockerfile_expand(s->words[i], lookup, NULL, &out, &e) == 0) {
                        if (strlen(out) > DOCKERFILE_MAX_EXPANDED)
                                abort();
                        free(out);
                } else if (!e.message[0])
                        abort();
                char *clean = NULL;
                if (dockerfile_context_path(s->words[i], &clean) == 0) {
                        if (strncmp(clean, "../", 3) == 0 || strcmp(clean, "..") == 0 || strstr(clean, "/../") ||
                            clean[0] == '/')
                                abort();
                        free(clean);
                }
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        unsigned lines = 1;
        for (size_t i = 0; i < size; i++)
                lines += data[i] == '\n';
        Dockerfile d;
        DockerfileError e;
        int r = dockerfile_parse((const char *)data, size, &d, &e);
        if (r < 0) {
                if (!e.message[0] || e.line > lines)
                        abort();
                return 0;
        }
        if (d.n_steps == 0 || d.n_stages == 0 || (d.steps[0].op != DF_FROM && d.steps[0].op != DF_ARG))
                abort();
        unsigned last = 0;
        for (size_t i = 0; i < d.n_steps; i++) {
                const DockerfileStep *s = &d.steps[i];
                if (s->line < last || s->line > lines || s->stage >= d.n_stages)
                        abort();
                last = s->line;
                if (s->from) {
                        int st = dockerfile_stage(&d, s->from);
                        if (s->from_image ? st >= 0 : (st < 0 || (unsigned)st >= s->stage))
                                abort();
                }
                words(s);
        }
        dockerfile_done(&d);
        return 0;
}
