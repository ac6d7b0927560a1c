#pragma once
/* The images kind's contract (store_images.h), the same on every backend:
 * a name's versions numbered from 1 per owner, get scoped by owner, lists
 * newest first in pages, a build's end recorded, tags moved between
 * versions, name:tag and name@version resolved, a delete taking the tags,
 * and what a host left unfinished failed. */
#include <string.h>

#include "daemon/store/store_images.h"

/* A ready image's doc: its disk and its start command (docs/images.md). */
#define IMAGE_READY_DOC                                                                                               \
        "{\"snapshot\":\"snp_x\",\"start\":{\"command\":[\"python3\",\"-m\",\"http.server\",\"8000\"],"               \
        "\"readyPort\":8000,\"readyTimeoutSeconds\":60}}"

static void image_row(ImageRow *r, const char *id, const char *owner, const char *name, int64_t created) {
        *r = (ImageRow){ 0 };
        snprintf(r->id, sizeof r->id, "%s", id);
        r->owner = (char *)owner;
        r->name = (char *)name;
        snprintf(r->state, sizeof r->state, "queued");
        r->doc = (char *)"{\"dockerfile\":true}";
        r->created_at = created;
        snprintf(r->host_id, sizeof r->host_id, "host-a");
}

typedef struct ImageSeen {
        char ids[8][IMAGE_ID_LEN + 1];
        size_t n;
} ImageSeen;

static int image_seen(void *userdata, const ImageRow *row) {
        ImageSeen *s = userdata;
        if (s->n < 8)
                snprintf(s->ids[s->n++], IMAGE_ID_LEN + 1, "%s", row->id);
        return 0;
}

/* A listing's callback that reads the store again (as the API's does, for
 * each image's tags): it must not wait on the listing. */
typedef struct ImageReenter {
        const StoreImageOps *ops;
        StoreImages *h;
        size_t rows;
} ImageReenter;

static int count_tag(void *userdata, const char *tag) {
        return 0;
}

static int image_reenter(void *userdata, const ImageRow *row) {
        ImageReenter *x = userdata;
        x->rows++;
        return x->ops->tags(x->h, row->id, count_tag, NULL);
}

static int tag_seen(void *userdata, const char *tag) {
        ImageSeen *s = userdata;
        if (s->n < 8)
                snprintf(s->ids[s->n++], IMAGE_ID_LEN + 1, "%s", tag);
        return 0;
}

typedef struct RegistrySeen {
        unsigned n;
        char names[4][64];
        char users[4][64];
        int64_t updated[4];
} RegistrySeen;

typedef struct LayerSeen {
        unsigned n;
        char keys[4][65];
        int64_t sizes[4], used[4];
} LayerSeen;

static int layer_seen(void *userdata, const char *key, const char *snapshot_id, int64_t size_bytes, int64_t used_at) {
        LayerSeen *s = userdata;
        if (s->n < 4) {
                snprintf(s->keys[s->n], sizeof s->keys[0], "%s", key);
                s->sizes[s->n] = size_bytes;
                s->used[s->n] = used_at;
        }
        s->n++;
        return 0;
}

static int registry_seen(void *userdata, const char *registry, const char *username, int64_t updated_at) {
        RegistrySeen *s = userdata;
        if (s->n < 4) {
                snprintf(s->names[s->n], sizeof s->names[0], "%s", registry);
                snprintf(s->users[s->n], sizeof s->users[0], "%s", username);
                s->updated[s->n++] = updated_at;
        }
        return 0;
}

#define IMG(n) "00000000-0000-4000-8000-00000000000" #n

static void images_contract(const StoreImageOps *ops, StoreImages *h) {
        ImageRow r;
        image_row(&r, IMG(1), "alice", "app", 100);
        assert_int_equal(ops->insert(h, &r), 0);
        assert_int_equal(r.version, 1);
        image_row(&r, IMG(2), "alice", "app", 101);
        assert_int_equal(ops->insert(h, &r), 0);
        assert_int_equal(r.version, 2);
        /* Another owner's name numbers from 1 of its own. */
        image_row(&r, IMG(3), "bob", "app", 102);
        assert_int_equal(ops->insert(h, &r), 0);
        assert_int_equal(r.version, 1);
        image_row(&r, IMG(4), "alice", "other", 103);
        assert_int_equal(ops->insert(h, &r), 0);
        image_row(&r, IMG(1), "alice", "app", 104);
        assert_int_equal(ops->insert(h, &r), -EEXIST);

        ImageRow got;
        assert_int_equal(ops->get(h, "alice", IMG(2), &got), 0);
        assert_string_equal(got.name, "app");
        assert_int_equal(got.version, 2);
        assert_string_equal(got.state, "queued");
        assert_null(got.error);
        assert_string_equal(got.doc, "{\"dockerfile\":true}");
        assert_string_equal(got.host_id, "host-a");
        store_image_row_clear(&got);
        assert_int_equal(ops->get(h, "bob", IMG(2), &got), -ENOENT);
        assert_int_equal(ops->get(h, NULL, IMG(3), &got), 0);
        store_image_row_clear(&got);

        /* Newest first, in pages; by name; by state. */
        ImageSeen s = { 0 };
        assert_int_equal(ops->list(h, "alice", NULL, NULL, 0, "", 2, image_seen, &s), 0);
        assert_int_equal(s.n, 2);
        assert_string_equal(s.ids[0], IMG(4));
        assert_string_equal(s.ids[1], IMG(2));
        ImageSeen more = { 0 };
        assert_int_equal(ops->list(h, "alice", NULL, NULL, 101, IMG(2), 2, image_seen, &more), 0);
        assert_int_equal(more.n, 1);
        assert_string_equal(more.ids[0], IMG(1));
        ImageReenter again = { .ops = ops, .h = h };
        assert_int_equal(ops->list(h, "alice", NULL, NULL, 0, "", 10, image_reenter, &again), 0);
        assert_int_equal(again.rows, 3);
        ImageSeen named = { 0 };
        assert_int_equal(ops->list(h, "alice", "app", NULL, 0, "", 10, image_seen, &named), 0);
        assert_int_equal(named.n, 2);

        /* The doc is kept as given: the image's start command (docs/images.md)
         * is in it, read back unchanged. */
        static const char ready_doc[] = IMAGE_READY_DOC;
        assert_int_equal(ops->finish(h, IMG(1), "ready", NULL, ready_doc, 110), 0);
        assert_int_equal(ops->get(h, "alice", IMG(1), &got), 0);
        assert_string_equal(got.doc, ready_doc);
        store_image_row_clear(&got);
        assert_int_equal(ops->finish(h, IMG(2), "failed", "step 2/3 RUN false: exit 1", NULL, 111), 0);
        assert_int_equal(ops->finish(h, "00000000-0000-4000-8000-999999999999", "ready", NULL, NULL, 1), -ENOENT);
        assert_int_equal(ops->get(h, "alice", IMG(2), &got), 0);
        assert_string_equal(got.state, "failed");
        assert_string_equal(got.error, "step 2/3 RUN false: exit 1");
        assert_string_equal(got.doc, "{\"dockerfile\":true}"); /* kept when none is given */
        assert_int_equal(got.finished_at, 111);
        store_image_row_clear(&got);
        /* An end is written once: a late write over it (a fenced host's)
         * changes nothing, and an ended build is not building again. */
        assert_int_equal(ops->finish(h, IMG(2), "ready", NULL, ready_doc, 112), -ENOENT);
        assert_int_equal(ops->finish(h, IMG(1), "failed", "late", NULL, 112), -ENOENT);
        assert_int_equal(ops->finish(h, IMG(1), "building", NULL, NULL, 0), -ENOENT);
        assert_int_equal(ops->get(h, "alice", IMG(2), &got), 0);
        assert_string_equal(got.state, "failed");
        assert_int_equal(got.finished_at, 111);
        store_image_row_clear(&got);
        ImageSeen ready = { 0 };
        assert_int_equal(ops->list(h, "alice", NULL, "ready", 0, "", 10, image_seen, &ready), 0);
        assert_int_equal(ready.n, 1);

        /* A tag moves; resolve by tag and by version. */
        char id[IMAGE_ID_LEN + 1];
        assert_int_equal(ops->tag(h, "alice", "app", "latest", IMG(1)), 0);
        assert_int_equal(ops->tag(h, "alice", "app", "v1", IMG(1)), 0);
        assert_int_equal(ops->resolve(h, "alice", "app", "latest", 0, id), 0);
        assert_string_equal(id, IMG(1));
        assert_int_equal(ops->tag(h, "alice", "app", "latest", IMG(2)), 0);
        assert_int_equal(ops->resolve(h, "alice", "app", "latest", 0, id), 0);
        assert_string_equal(id, IMG(2));
        assert_int_equal(ops->resolve(h, "bob", "app", "latest", 0, id), -ENOENT);
        assert_int_equal(ops->resolve(h, "alice", "app", NULL, 1, id), 0);
        assert_string_equal(id, IMG(1));
        assert_int_equal(ops->resolve(h, "alice", "app", NULL, 9, id), -ENOENT);
        ImageSeen tags = { 0 };
        assert_int_equal(ops->tags(h, IMG(1), tag_seen, &tags), 0);
        assert_int_equal(tags.n, 1);
        assert_string_equal(tags.ids[0], "v1");
        assert_int_equal(ops->untag(h, IMG(1), "latest"), -ENOENT);
        assert_int_equal(ops->untag(h, IMG(1), "v1"), 0);
        assert_int_equal(ops->resolve(h, "alice", "app", "v1", 0, id), -ENOENT);

        /* A delete is the owner's, and takes the tags. */
        assert_int_equal(ops->delete(h, "bob", IMG(2)), -ENOENT);
        assert_int_equal(ops->delete(h, "alice", IMG(2)), 0);
        assert_int_equal(ops->resolve(h, "alice", "app", "latest", 0, id), -ENOENT);
        assert_int_equal(ops->get(h, "alice", IMG(2), &got), -ENOENT);
        assert_int_equal(ops->delete(h, "alice", IMG(2)), -ENOENT);

        /* What host-a left queued or building fails; what ended stays. */
        int64_t n = 0;
        assert_int_equal(ops->fail_unfinished(h, "host-a", "the daemon stopped during the build", 120, &n), 0);
        assert_int_equal(n, 2); /* IMG(3) and IMG(4) */
        assert_int_equal(ops->get(h, "alice", IMG(4), &got), 0);
        assert_string_equal(got.state, "failed");
        store_image_row_clear(&got);
        assert_int_equal(ops->get(h, "alice", IMG(1), &got), 0);
        assert_string_equal(got.state, "ready");
        store_image_row_clear(&got);

        /* Registry credentials: one per owner and registry, replaced by a
         * set, listed without the secret, an owner's own. */
        assert_int_equal(ops->registry_set(h, "alice", "ghcr.io", "al", "sealed:v1:AAAA", 200), 0);
        assert_int_equal(ops->registry_set(h, "alice", "127.0.0.1:5000", "al", "sealed:v1:BBBB", 201), 0);
        assert_int_equal(ops->registry_set(h, "alice", "ghcr.io", "al2", "sealed:v1:CCCC", 202), 0);
        assert_int_equal(ops->registry_set(h, "bob", "ghcr.io", "bo", "sealed:v1:DDDD", 203), 0);
        RegistrySeen rs = { 0 };
        assert_int_equal(ops->registry_list(h, "alice", registry_seen, &rs), 0);
        assert_int_equal(rs.n, 2);
        assert_string_equal(rs.names[0], "127.0.0.1:5000");
        assert_string_equal(rs.names[1], "ghcr.io");
        assert_string_equal(rs.users[1], "al2");
        assert_int_equal(rs.updated[1], 202);
        char *sealed = NULL;
        assert_int_equal(ops->registry_get(h, "alice", "ghcr.io", &sealed), 0);
        assert_string_equal(sealed, "sealed:v1:CCCC");
        free(sealed);
        assert_int_equal(ops->registry_get(h, "carol", "ghcr.io", &sealed), -ENOENT);
        assert_int_equal(ops->registry_delete(h, "carol", "ghcr.io"), -ENOENT);
        assert_int_equal(ops->registry_delete(h, "alice", "ghcr.io"), 0);
        assert_int_equal(ops->registry_get(h, "alice", "ghcr.io", &sealed), -ENOENT);
        assert_int_equal(ops->registry_get(h, "bob", "ghcr.io", &sealed), 0);
        free(sealed);
        /* Layers: an owner's own, one row per key and host, touched by a use, listed
         * least recently used first, on the host that keeps them. */
        const char *k1 = "1111111111111111111111111111111111111111111111111111111111111111";
        const char *k2 = "2222222222222222222222222222222222222222222222222222222222222222";
        assert_int_equal(ops->layer_put(h, "alice", k1, "snap-1", "host-a", 100, 300), 0);
        assert_int_equal(ops->layer_put(h, "alice", k2, "snap-2", "host-a", 200, 301), 0);
        assert_int_equal(ops->layer_put(h, "alice", k1, "snap-9", "host-a", 900, 302), -EEXIST);
        char *snap = NULL;
        assert_int_equal(ops->layer_use(h, "bob", k1, "host-a", 303, &snap), -ENOENT);
        assert_int_equal(ops->layer_use(h, "alice", k1, "host-b", 303, &snap), -ENOENT);
        assert_int_equal(ops->layer_use(h, "alice", k1, "host-a", 303, &snap), 0);
        assert_string_equal(snap, "snap-1");
        free(snap);
        LayerSeen ls = { 0 };
        assert_int_equal(ops->layer_list(h, "alice", "host-a", layer_seen, &ls), 0);
        assert_int_equal(ls.n, 2);
        assert_string_equal(ls.keys[0], k2); /* k1 was used after it */
        assert_int_equal(ls.sizes[0], 200);
        assert_string_equal(ls.keys[1], k1);
        assert_int_equal(ls.used[1], 303);
        ls = (LayerSeen){ 0 };
        assert_int_equal(ops->layer_list(h, "bob", "host-a", layer_seen, &ls), 0);
        assert_int_equal(ls.n, 0);
        /* Another host keeps the same key as its own (its files), found
         * and deleted apart from host-a's. */
        assert_int_equal(ops->layer_put(h, "alice", k1, "snap-b1", "host-b", 150, 303), 0);
        assert_int_equal(ops->layer_use(h, "alice", k1, "host-b", 304, &snap), 0);
        assert_string_equal(snap, "snap-b1");
        free(snap);
        assert_int_equal(ops->layer_delete(h, "bob", k1, "host-a"), -ENOENT);
        assert_int_equal(ops->layer_delete(h, "alice", k1, "host-a"), 0);
        assert_int_equal(ops->layer_delete(h, "alice", k1, "host-a"), -ENOENT);
        assert_int_equal(ops->layer_use(h, "alice", k1, "host-a", 304, &snap), -ENOENT);
        assert_int_equal(ops->layer_use(h, "alice", k1, "host-b", 305, &snap), 0);
        assert_string_equal(snap, "snap-b1");
        free(snap);
        assert_int_equal(ops->layer_delete(h, "alice", k1, "host-b"), 0);
}

