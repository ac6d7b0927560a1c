/* The collection of the trees pulled from registries (docs/images.md,
 * "Images from registries"): after each of an owner's builds and each
 * delete of an owner's image, the owner's trees past
 * --image-tree-max-mib-per-owner go, least recently pulled first, unless
 * an image, a layer, a snapshot or a sandbox of the owner's still starts
 * from one. Pulls run only in builds and an owner runs one build at a
 * time: after a build, the build's own worker collects; outside one, the
 * owner counts as running while its trees are collected (the queue starts
 * none of its builds meanwhile), and an owner with a build queued or
 * running is left to that build's end. */
#include "daemon/manager/user_images.h"
#include "daemon/manager/user_images-internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/config.h"
#include "daemon/manager/oci_pull.h"
#include "daemon/manager/sandbox.h"
#include "daemon/manager/snapshot.h"

/* The trees one owner keeps at most, used or not. */
#define TREES_MAX_PER_OWNER 64u
/* The sweep of every owner's trees, at a build's end, at most this often. */
#define TREES_SWEEP_EVERY_SECONDS 300
/* The owner's images one collection reads at most. */
#define TREES_IMAGES_SCAN_MAX 100000u

typedef struct InUse {
        UserImages *u;
        const char *owner;
        json_t *names; /* the trees in use; NULL until first asked */
        bool failed;   /* a listing failed: every tree counts as used */
        unsigned seen;
        int64_t last_created;
        char last_id[IMAGE_ID_LEN + 1];
} InUse;

static void mark(InUse *iu, const char *name) {
        if (name && strncmp(name, OCI_IMAGE_PREFIX, strlen(OCI_IMAGE_PREFIX)) == 0 &&
            json_object_set_new(iu->names, name, json_true()) < 0)
                iu->failed = true;
}

static int image_uses(void *userdata, const ImageRow *row) {
        InUse *iu = userdata;
        iu->seen++;
        iu->last_created = row->created_at;
        snprintf(iu->last_id, sizeof iu->last_id, "%s", row->id);
        _cleanup_json_ json_t *doc = row->doc ? json_loads(row->doc, 0, NULL) : NULL;
        mark(iu, json_string_value(json_object_get(doc, "base")));
        return 0;
}

static int sandbox_uses(void *userdata, SandboxRow *row) {
        mark(userdata, row->spec.image);
        return 0;
}

/* A snapshot (an image's disk, a layer, one the owner took) starts
 * sandboxes on its source's image. */
static int snapshot_uses(void *userdata, const SnapshotRow *row) {
        InUse *iu = userdata;
        if (!row->owner || strcmp(row->owner, iu->owner) != 0)
                return 0;
        _cleanup_json_ json_t *spec = row->spec ? json_loads(row->spec, 0, NULL) : NULL;
        mark(iu, json_string_value(json_object_get(spec, "image")));
        return 0;
}

static void in_use_read(InUse *iu) {
        UserImages *u = iu->u;
        if (!(iu->names = json_object())) {
                iu->failed = true;
                return;
        }
        for (;;) {
                unsigned before = iu->seen;
                if (user_images_list(u, iu->owner, NULL, NULL, iu->last_id[0] ? iu->last_created : 0,
                                     iu->last_id[0] ? iu->last_id : NULL, 100, image_uses, iu) < 0 ||
                    iu->seen >= TREES_IMAGES_SCAN_MAX) {
                        iu->failed = true;
                        return;
                }
                if (iu->seen - before < 100)
                        break;
        }
        KeyInfo key = { .access = KEY_ACCESS_FULL };
        SandboxError se;
        snprintf(key.owner, sizeof key.owner, "%s", iu->owner);
        if (sandbox_list(u->m, &key, sandbox_uses, iu, &se) < 0 ||
            snapshot_store_each(u->snapshots, snapshot_uses, iu) < 0)
                iu->failed = true;
}

static bool tree_in_use(void *userdata, const char *name) {
        InUse *iu = userdata;
        if (!iu->names && !iu->failed)
                in_use_read(iu);
        return iu->failed || json_object_get(iu->names, name) != NULL;
}

static void collect(UserImages *u, const char *owner) {
        InUse iu = { .u = u, .owner = owner };
        int r = oci_trees_collect(u->cfg->state_dir, owner, (uint64_t)u->cfg->image_tree_max_mib_per_owner << 20,
                                  TREES_MAX_PER_OWNER, tree_in_use, &iu);
        if (r < 0)
                log_warn(NULL, "collecting the pulled trees of an owner: %s", strerror(-r));
        json_decref(iu.names);
}

void user_images_collect_trees_idle(UserImages *u, const char *owner) {
        pthread_mutex_lock(&u->lock);
        OwnerCount *c = owner_count(u, owner, true);
        bool busy = !c || c->running > 0 || c->queued > 0;
        if (!busy)
                c->running++;
        pthread_mutex_unlock(&u->lock);
        if (busy)
                return;
        collect(u, owner);
        pthread_mutex_lock(&u->lock);
        if ((c = owner_count(u, owner, false)))
                c->running--;
        /* A build of the owner's queued meanwhile may start. */
        pthread_cond_broadcast(&u->cond);
        pthread_mutex_unlock(&u->lock);
}

/* Every owner's trees, at most every TREES_SWEEP_EVERY_SECONDS: an image
 * deleted while a build of its owner's ran, or a sandbox deleted, leaves a
 * tree nothing uses that no delete of an image of the owner's collects. */
static pthread_mutex_t sweep_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t swept_at;

static void owner_seen(void *userdata, const char *owner) {
        json_object_set_new(userdata, owner, json_true());
}

static void sweep(UserImages *u, const char *but) {
        int64_t t = time_now_unix();
        pthread_mutex_lock(&sweep_lock);
        bool due = t - swept_at >= TREES_SWEEP_EVERY_SECONDS;
        if (due)
                swept_at = t;
        pthread_mutex_unlock(&sweep_lock);
        _cleanup_json_ json_t *owners = due ? json_object() : NULL;
        if (!owners || oci_trees_owners(u->cfg->state_dir, owner_seen, owners) < 0)
                return;
        const char *owner;
        json_t *v;
        json_object_foreach(owners, owner, v)
                if (strcmp(owner, but) != 0)
                        user_images_collect_trees_idle(u, owner);
}

void user_images_collect_trees(UserImages *u, const char *owner) {
        collect(u, owner);
        sweep(u, owner);
        user_images_context_sweep(u, false);
}
