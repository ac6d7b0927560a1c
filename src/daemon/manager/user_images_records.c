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
#include "common/timeutil.h"
#include "daemon/manager/oci_pull.h"
#include "daemon/manager/snapshot.h"
#include "daemon/manager/user_images-internal.h"
#include "daemon/manager/user_images.h"

/* ---- the fleet ---- */

int user_images_set_epoch(UserImages *u, const char *host_id, int64_t epoch) {
        return u ? u->ops->set_writer(u->h, host_id, epoch) : 0;
}

int user_images_fail_dead_host(UserImages *u, const char *host_id, const char *error, int64_t *ret_n) {
        *ret_n = 0;
        return u ? u->ops->fail_dead_host(u->h, host_id, error, time_now_unix(), ret_n) : 0;
}

/* ---- records ---- */

json_t *user_images_build_json(const ImageBuildRequest *req) {
        _cleanup_json_ json_t *none = req->network ? NULL : json_pack("{s:b,s:[],s:[]}", "internet", false, "allow",
                                                                       "deny");
        return json_pack("{s:I,s:I,s:I,s:I,s:O}", "vcpu", (json_int_t)req->vcpu, "memoryMiB",
                         (json_int_t)req->memory_mib, "diskMiB", (json_int_t)req->disk_mib, "timeoutSeconds",
                         (json_int_t)req->timeout_seconds, "network", req->network ? req->network : none);
}

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
        /* A pulled tree only this image started from goes now, not at
         * the owner's next build. */
        user_images_collect_trees_idle(u, owner);
        return 0;
}

/* ---- registry credentials ---- */

void user_images_set_seal_key(UserImages *u, const uint8_t key[32]) {
        memcpy(u->seal_key, key, SEAL_KEY_LEN);
        u->have_seal_key = true;
}

/* The associated data: a sealed secret moved to another owner's or
 * registry's row does not open there. */
static char *registry_aad(const char *owner, const char *registry) {
        char *aad = NULL;
        return asprintf(&aad, "image-registry\n%s\n%s", owner, registry) < 0 ? NULL : aad;
}

static int count_one(void *userdata, const char *registry, const char *username, int64_t updated_at) {
        (*(unsigned *)userdata)++;
        return 0;
}

static int add_registry(void *userdata, const char *registry, const char *username, int64_t updated_at) {
        char at[RFC3339_LEN] = "";
        time_format_rfc3339(updated_at, at);
        json_t *j = json_pack("{s:s,s:s,s:s}", "registry", registry, "username", username, "updatedAt", at);
        return j && json_array_append_new(userdata, j) == 0 ? 0 : -ENOMEM;
}

int user_images_registry_set(UserImages *u, const char *owner, const char *registry, const char *username,
                             const char *password, json_t **ret) {
        char name[256];
        if (!u->have_seal_key)
                return -EOPNOTSUPP;
        if (oci_registry_normalize(registry, name) < 0)
                return -EINVAL;
        if (strlen(username) > 256 || strlen(password) > 16384)
                return -E2BIG;
        _cleanup_free_ char *old = NULL;
        if (u->ops->registry_get(u->h, owner, name, &old) == -ENOENT) {
                unsigned n = 0;
                int r = u->ops->registry_list(u->h, owner, count_one, &n);
                if (r < 0)
                        return r;
                if (n >= USER_IMAGES_REGISTRIES_PER_OWNER)
                        return -EDQUOT;
        }
        _cleanup_json_ json_t *plain = json_pack("{s:s,s:s}", "username", username, "password", password);
        _cleanup_free_ char *text = plain ? json_dumps(plain, JSON_COMPACT) : NULL;
        _cleanup_free_ char *aad = registry_aad(owner, name);
        _cleanup_free_ char *sealed = NULL;
        if (!text || !aad)
                return -ENOMEM;
        int r = seal_encrypt(u->seal_key, aad, text, &sealed);
        explicit_bzero(text, strlen(text));
        if (r < 0)
                return r;
        int64_t now = time_now_unix();
        if ((r = u->ops->registry_set(u->h, owner, name, username, sealed, now)) < 0)
                return r;
        json_t *out = json_array();
        if (!out || add_registry(out, name, username, now) < 0) {
                json_decref(out);
                return -ENOMEM;
        }
        *ret = json_incref(json_array_get(out, 0));
        json_decref(out);
        return 0;
}

int user_images_registry_list(UserImages *u, const char *owner, json_t **ret) {
        json_t *data = json_array();
        if (!data)
                return -ENOMEM;
        int r = u->ops->registry_list(u->h, owner, add_registry, data);
        if (r < 0) {
                json_decref(data);
                return r;
        }
        *ret = data;
        return 0;
}

int user_images_registry_delete(UserImages *u, const char *owner, const char *registry) {
        char name[256];
        if (oci_registry_normalize(registry, name) < 0)
                return -ENOENT;
        return u->ops->registry_delete(u->h, owner, name);
}

json_t *user_images_registry_auth(UserImages *u, const char *owner, const char *registry) {
        _cleanup_free_ char *sealed = NULL, *aad = registry_aad(owner, registry), *plain = NULL;
        if (!u->have_seal_key || !aad || u->ops->registry_get(u->h, owner, registry, &sealed) < 0 ||
            seal_decrypt(u->seal_key, aad, sealed, &plain) < 0)
                return NULL;
        json_t *auth = json_loads(plain, 0, NULL);
        explicit_bzero(plain, strlen(plain));
        return auth;
}
