/* What a daemon killed during builds left, removed at its next start
 * (docs/images.md, "How a build runs"): the builds' sandboxes,
 * the disks of images whose record never became ready, layers whose record
 * was never written, context chunks half received and the logs of images
 * deleted meanwhile. The builds' records
 * are then marked failed (user_images_start). */
#include "daemon/manager/user_images.h"
#include "daemon/manager/user_images-internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/path.h"
#include "daemon/manager/sandbox.h"
#include "daemon/manager/snapshot.h"

/* Whether image id is one of owner's that this host had queued or building
 * when it stopped: at a start no build of this host runs, so such a record
 * is one the stop cut. */
static bool image_cut(UserImages *u, const char *owner, const char *id) {
        if (!owner || !id || !user_images_id_ok(id))
                return false;
        ImageRow row = { 0 };
        if (u->ops->get(u->h, owner, id, &row) < 0)
                return false;
        bool cut = strcmp(row.host_id, u->host_id) == 0 &&
                   (strcmp(row.state, "queued") == 0 || strcmp(row.state, "building") == 0);
        store_image_row_clear(&row);
        return cut;
}

/* The value of label key in a labels object's text (NULL: none). */
static char *label_of(const char *labels, const char *key) {
        if (!labels)
                return NULL;
        _cleanup_json_ json_t *o = json_loads(labels, 0, NULL);
        const char *v = json_string_value(json_object_get(o, key));
        return v ? strdup(v) : NULL;
}

static int cut_sandbox(void *userdata, SandboxRow *row) {
        UserImages *u = userdata;
        _cleanup_free_ char *image = label_of(row->labels, "runtime.imageBuild");
        if (!image || !image_cut(u, row->owner, image))
                return 0;
        CutSandbox *n = realloc(u->cut, (u->n_cut + 1) * sizeof(*n));
        if (!n)
                return -ENOMEM;
        u->cut = n;
        CutSandbox *c = &u->cut[u->n_cut++];
        *c = (CutSandbox){ 0 };
        snprintf(c->id, sizeof c->id, "%s", row->id);
        snprintf(c->key.owner, sizeof c->key.owner, "%s", row->owner);
        snprintf(c->key.id, sizeof c->key.id, "%s", row->key_id ? row->key_id : "");
        c->key.access = KEY_ACCESS_FULL;
        return 0;
}

int user_images_recover_sandboxes(UserImages *u) {
        return manager_each_active(u->m, cut_sandbox, u);
}

/* The snapshots to delete: the disk of an image the stop cut (labelled
 * runtime.image with its id, the owner's, taken before its record became
 * ready) and a layer no layer record names (taken before its record was
 * written). */
typedef struct Stale {
        UserImages *u;
        size_t n;
        struct {
                char id[SNAPSHOT_ID_LEN + 1];
                char owner[128];
                bool layer;
        } *s;
} Stale;

typedef struct Named {
        const char *id;
        bool found;
} Named;

static int layer_named(void *userdata, const char *key, const char *snapshot_id, int64_t size_bytes,
                       int64_t used_at) {
        Named *n = userdata;
        n->found = n->found || strcmp(n->id, snapshot_id) == 0;
        return 0;
}

static int stale_snapshot(void *userdata, const SnapshotRow *row) {
        Stale *st = userdata;
        UserImages *u = st->u;
        bool stale;
        if (row->layer) {
                /* A record names it, or the records could not be read: kept. */
                Named n = { .id = row->id };
                stale = u->ops->layer_list(u->h, row->owner, u->host_id, layer_named, &n) == 0 && !n.found;
        } else {
                _cleanup_free_ char *image = label_of(row->labels, "runtime.image");
                stale = image && image_cut(u, row->owner, image);
        }
        if (!stale)
                return 0;
        void *n = realloc(st->s, (st->n + 1) * sizeof(*st->s));
        if (!n)
                return -ENOMEM;
        st->s = n;
        snprintf(st->s[st->n].id, sizeof st->s[0].id, "%s", row->id);
        snprintf(st->s[st->n].owner, sizeof st->s[0].owner, "%s", row->owner);
        st->s[st->n++].layer = row->layer;
        return 0;
}

/* Chunks half received (".<digest>.part") in each owner's directory. */
static void partial_chunks(UserImages *u) {
        DIR *d = opendir(u->ctx_dir);
        if (!d)
                return;
        struct dirent *e;
        while ((e = readdir(d))) {
                if (e->d_name[0] == '.')
                        continue;
                _cleanup_close_ int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                DIR *od = fd >= 0 ? fdopendir(fd) : NULL;
                if (!od)
                        continue;
                fd = -1; /* the DIR's now */
                struct dirent *c;
                while ((c = readdir(od)))
                        if (c->d_name[0] == '.' && strcmp(c->d_name, ".") != 0 && strcmp(c->d_name, "..") != 0)
                                (void)path_remove_tree_at(dirfd(od), c->d_name);
                closedir(od);
        }
        closedir(d);
}

/* Build logs ("<id>.log") of images with no record: one deleted through
 * another host of a fleet while this one was down (its disk, likewise
 * without a record, goes with the snapshots' recovery). When in doubt (the
 * store failed), the file stays. */
static void orphan_logs(UserImages *u) {
        DIR *d = opendir(u->dir);
        if (!d)
                return;
        struct dirent *e;
        while ((e = readdir(d))) {
                char id[IMAGE_ID_LEN + 1];
                size_t n = strlen(e->d_name);
                if (n != IMAGE_ID_LEN + 4 || strcmp(e->d_name + IMAGE_ID_LEN, ".log") != 0)
                        continue;
                memcpy(id, e->d_name, IMAGE_ID_LEN);
                id[IMAGE_ID_LEN] = '\0';
                if (!user_images_id_ok(id))
                        continue;
                ImageRow row;
                int r = u->ops->get(u->h, NULL, id, &row);
                if (r == 0)
                        store_image_row_clear(&row);
                if (r == -ENOENT && unlinkat(dirfd(d), e->d_name, 0) == 0)
                        log_info(NULL, "the build log of image %s removed: the image was deleted", id);
        }
        closedir(d);
}

void user_images_recover(UserImages *u) {
        for (size_t i = 0; i < u->n_cut; i++) {
                SandboxError se;
                if (sandbox_delete(u->m, &u->cut[i].key, u->cut[i].id, NULL, &se) < 0)
                        log_warn(NULL, "deleting sandbox %s, of a build the daemon's stop cut: %s", u->cut[i].id,
                                 se.message);
                else
                        log_info(NULL, "sandbox %s deleted: its build was cut by the daemon's stop", u->cut[i].id);
        }
        free(u->cut);
        u->cut = NULL;
        u->n_cut = 0;
        Stale st = { .u = u };
        int r = snapshot_store_each(u->snapshots, stale_snapshot, &st);
        if (r < 0)
                log_error(NULL, "looking for what builds cut by the daemon's stop kept: %s", strerror(-r));
        for (size_t i = 0; i < st.n; i++)
                if (snapshot_store_delete(u->snapshots, st.s[i].owner, st.s[i].id) == 0)
                        log_info(NULL, "snapshot %s deleted: %s", st.s[i].id,
                                 st.s[i].layer ? "a layer that the daemon's stop left without its record"
                                               : "an image's disk taken before the daemon's stop cut its build");
        free(st.s);
        partial_chunks(u);
        orphan_logs(u);
        user_images_context_sweep(u, true);
}
