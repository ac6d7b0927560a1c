/* COPY --from=IMAGE (docs/images.md, "Multi-stage builds"): the image as a
 * stage without steps, started in a sandbox of the build's own for the one
 * step, from which the step's sources are gathered and moved as a stage's
 * are (the same path rules: cleaned of "..", no link followed out). Only an
 * image a FROM of the owner's could start from without a pull: a built-in
 * one or one the owner built; another owner's is no such image. */
#include "daemon/manager/user_images-internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "daemon/manager/images.h"

int build_image_source(Build *b, const char *ref, Build **ret) {
        _cleanup_free_ char *name = NULL;
        DockerfileError e = { 0 };
        if (dockerfile_expand(ref, build_var_lookup, b, &name, &e) < 0)
                return build_fail(b, "%s", e.message);
        _cleanup_free_ char *identity = NULL;
        int r = build_image_identity(b, name, &identity);
        if (r == -ENOMEM)
                return build_fail(b, "out of memory");
        if (r < 0)
                return build_fail(b, "COPY --from=%.128s: no such image ready (a built-in image, or one of yours)",
                                  name);
        Build *o = calloc(1, sizeof(*o));
        if (!o)
                return build_fail(b, "out of memory");
        *o = (Build){ .u = b->u, .job = b->job, .log = b->log, .stages = b->stages, .stage = b->stage,
                      .deadline_ms = b->deadline_ms, .root = true };
        *ret = o;
        o->vars = json_object();
        o->env = json_object();
        o->config = json_pack("{s:{},s:[]}", "labels", "exposedPorts");
        o->workdir = strdup("/");
        if (!o->vars || !o->env || !o->config || !o->workdir)
                return build_fail(b, "out of memory");
        _cleanup_json_ json_t *config = NULL;
        build_log_sys(b->log, "COPY --from=%s: the image %s", name, identity);
        r = build_resolve_from(o, name, &o->base, &o->base_snap, &config);
        if (r == 0)
                r = build_stage_sandbox(o);
        /* Said as the step's own failure (its line, as a FROM's is). */
        if (r < 0)
                return build_fail(b, "%s", o->error[0] ? o->error : "out of memory");
        return 0;
}

void build_image_source_free(Build **o) {
        if (!*o)
                return;
        build_drop_sandbox(*o);
        build_state_free(*o);
        free(*o);
        *o = NULL;
}
