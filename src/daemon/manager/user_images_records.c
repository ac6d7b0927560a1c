/* The images' records: reads, resolving a reference, tags and deletes
 * (user_images.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "daemon/manager/snapshot.h"
#include "daemon/manager/user_images-internal.h"
#include "daemon/manager/user_images.h"

/* ---- records ---- */

int user_images_get(UserImages *u, const char *owner, const char *id, ImageRow *ret) {
        if (!user_images_id_ok(id))
                return -ENOENT;
        return u->ops->get(u->h, owner, id, ret);
}

int user_images_resolve(UserImages *u, const char *owner, const char *ref, ImageRow *ret) {
        if (user_images_id_ok(ref))
                return user_images_get(u, owner, ref, ret);
        char name[160];
        const char *at = strrchr(ref, '@'), *colon = strrchr(ref, ':');
        const char *tag = "latest";
        int64_t version = 0;
        size_t nl = strlen(ref);
        if (at) {
                char *end;
                version = strtoll(at + 1, &end, 10);
                if (at[1] == 'v')
                        version = strtoll(at + 2, &end, 10);
                if (*end || version <= 0)
                        return -ENOENT;
                nl = (size_t)(at - ref);
        } else if (colon && !strchr(colon, '/')) {
                tag = colon + 1;
                nl = (size_t)(colon - ref);
        }
        if (nl >= sizeof name)
                return -ENOENT;
        memcpy(name, ref, nl);
        name[nl] = '\0';
        if (!user_images_name_ok(name) || !user_images_tag_ok(tag))
                return -ENOENT;
        char id[IMAGE_ID_LEN + 1];
        int r = u->ops->resolve(u->h, owner, name, tag, version, id);
        if (r < 0)
                return r;
        return u->ops->get(u->h, owner, id, ret);
}

int user_images_list(UserImages *u, const char *owner, const char *name, const char *state, int64_t before_created,
                     const char *before_id, unsigned limit, StoreImageFn fn, void *userdata) {
        return u->ops->list(u->h, owner, name, state, before_created, before_id, limit, fn, userdata);
}

static int tag_append(void *userdata, const char *tag) {
        return json_array_append_new(userdata, json_string(tag)) < 0 ? -ENOMEM : 0;
}

json_t *user_images_tags(UserImages *u, const char *id) {
        json_t *a = json_array();
        if (a && u->ops->tags(u->h, id, tag_append, a) < 0) {
                json_decref(a);
                return NULL;
        }
        return a;
}

static int owned(UserImages *u, const char *owner, const char *id, ImageRow *row, SandboxError *e) {
        int r = user_images_get(u, owner, id, row);
        if (r == -ENOENT)
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "GET /v1/images lists yours", "no image %.40s", id);
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the image");
        return 0;
}

int user_images_tag(UserImages *u, const char *owner, const char *id, const char *tag, SandboxError *e) {
        if (!user_images_tag_ok(tag))
                return sandbox_error(e, SANDBOX_ERR_INVALID, "letters, digits, _ . - (up to 128)", "%.64s is not a tag",
                                     tag);
        ImageRow row;
        int r = owned(u, owner, id, &row, e);
        if (r < 0)
                return r;
        if (strcmp(row.state, "ready") != 0) {
                r = sandbox_error(e, SANDBOX_ERR_CONFLICT, "wait for its build to end", "image %s is %s, not ready", id,
                                  row.state);
        } else if ((r = u->ops->tag(u->h, owner, row.name, tag, id)) < 0)
                r = sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not tag the image");
        store_image_row_clear(&row);
        return r;
}

int user_images_untag(UserImages *u, const char *owner, const char *id, const char *tag, SandboxError *e) {
        ImageRow row;
        int r = owned(u, owner, id, &row, e);
        if (r < 0)
                return r;
        store_image_row_clear(&row);
        r = u->ops->untag(u->h, id, tag ? tag : "");
        if (r == -ENOENT)
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, NULL, "image %s has no tag %.64s", id, tag ? tag : "");
        return r < 0 ? sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not untag the image") : 0;
}

int user_images_delete(UserImages *u, const char *owner, const char *id, SandboxError *e) {
        ImageRow row;
        int r = owned(u, owner, id, &row, e);
        if (r < 0)
                return r;
        if (strcmp(row.state, "queued") == 0 || strcmp(row.state, "building") == 0) {
                store_image_row_clear(&row);
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "wait for its build to end", "image %s is %s", id,
                                     row.state);
        }
        _cleanup_json_ json_t *doc = json_loads(row.doc, 0, NULL);
        store_image_row_clear(&row);
        if ((r = u->ops->delete(u->h, owner, id)) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not delete the image");
        const char *snap = json_string_value(json_object_get(doc, "snapshot"));
        if (snap && snapshot_store_delete(u->snapshots, owner, snap) < 0)
                log_warn(NULL, "image %s: its disk %s could not be deleted", id, snap);
        _cleanup_free_ char *lp = user_images_log_path(u, id);
        if (lp)
                unlink(lp);
        return 0;
}
