#pragma once
/*
 * The images users build, as a backend keeps them (store.h): one record per
 * image (a version of its owner's name), and the tags that point a name at
 * one of its versions. A record's doc is the build's result as the image
 * module writes it (JSON text: what it was built from, its config, its
 * disk); the store does not read it.
 *
 * A name's versions are numbered from 1 by the insert, in the transaction
 * that inserts, so that two builds of one name at once take two numbers.
 * A tag names one version of a name at a time: tagging another moves it,
 * atomically.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/store/store.h"

#define IMAGE_ID_LEN 36 /* a UUID, as the published client expects */

typedef struct ImageRow {
        char id[IMAGE_ID_LEN + 1];
        char *owner;
        char *name;
        int64_t version;
        char state[16]; /* "queued", "building", "ready", "failed" */
        char *error;    /* NULL: none */
        char *doc;      /* JSON object text */
        int64_t created_at;
        int64_t finished_at; /* 0: not yet */
        char host_id[64];    /* the host that builds it and keeps its files */
} ImageRow;

static inline void store_image_row_clear(ImageRow *r) {
        if (!r)
                return;
        free(r->owner);
        free(r->name);
        free(r->error);
        free(r->doc);
        *r = (ImageRow){ 0 };
}

typedef struct StoreImages StoreImages;
/* Called for each row of a listing (borrowed for the call); a negative
 * return stops it and is returned. */
typedef int (*StoreImageFn)(void *userdata, const ImageRow *row);
typedef int (*StoreImageTagFn)(void *userdata, const char *tag);
/* A registry's credentials of an owner: the secret only as sealed text,
 * which the store never opens. */
typedef int (*StoreRegistryFn)(void *userdata, const char *registry, const char *username, int64_t updated_at);
/* A build layer of an owner's (docs/images.md, "Per-step layers"): the
 * layer's key (64 hex digits), the snapshot that holds its tree, its bytes
 * and when a build last used it. */
typedef int (*StoreLayerFn)(void *userdata, const char *key, const char *snapshot_id, int64_t size_bytes,
                            int64_t used_at);

struct StoreImageOps {
        int (*open)(const char *location, StoreImages **ret);
        void (*close)(StoreImages *h);
        /* The host whose writes these are, at the epoch it registered at
         * (a fleet): from now on every write (a build's record, its ends,
         * tags, deletes, layers) is made only while the store still has
         * that host at that epoch and not declared dead, else -EOWNERDEAD
         * and nothing changes (a layer's time of use aside). No-op for a
         * backend only one host writes. */
        int (*set_writer)(StoreImages *h, const char *host_id, int64_t epoch);
        /* Inserts row with the next version of its owner's name, written
         * into row->version. -EEXIST for an id taken. */
        int (*insert)(StoreImages *h, ImageRow *row);
        /* owner's image id (owner NULL: any owner's); -ENOENT. */
        int (*get)(StoreImages *h, const char *owner, const char *id, ImageRow *ret);
        /* owner's images, newest first (created_at, then id), of name and in
         * state when not NULL, those after the cursor (before_created,
         * before_id; before_id "" for the first page), at most limit. */
        int (*list)(StoreImages *h, const char *owner, const char *name, const char *state, int64_t before_created,
                    const char *before_id, unsigned limit, StoreImageFn fn, void *userdata);
        /* Sets a build's state: "building" over a queued one, or its end
         * ("ready", "failed") over a queued or building one, with error
         * (NULL: none), doc and finished_at. An end is written once:
         * -ENOENT for no such image or one that ended already. */
        int (*finish)(StoreImages *h, const char *id, const char *state, const char *error, const char *doc,
                      int64_t finished_at);
        /* Marks what host_id was building when it stopped as failed with
         * error; the count in *ret_n. */
        int (*fail_unfinished)(StoreImages *h, const char *host_id, const char *error, int64_t now, int64_t *ret_n);
        /* fail_unfinished for a host the fleet declared dead, by another
         * (the sweeper): only while the hosts table still has host_id
         * dead, so that the builds it queues once it registered again are
         * not touched. */
        int (*fail_dead_host)(StoreImages *h, const char *host_id, const char *error, int64_t now, int64_t *ret_n);
        /* Points owner's name:tag at image id (moved from another version). */
        int (*tag)(StoreImages *h, const char *owner, const char *name, const char *tag, const char *id);
        /* Takes tag off image id: -ENOENT when it is not on it. */
        int (*untag)(StoreImages *h, const char *id, const char *tag);
        /* The tags on image id, in order. */
        int (*tags)(StoreImages *h, const char *id, StoreImageTagFn fn, void *userdata);
        /* The image owner's name:tag or name@version points at: its id in
         * ret_id. -ENOENT. version 0: by tag. */
        int (*resolve)(StoreImages *h, const char *owner, const char *name, const char *tag, int64_t version,
                       char ret_id[IMAGE_ID_LEN + 1]);
        /* Deletes owner's image id and its tags. -ENOENT. */
        int (*delete)(StoreImages *h, const char *owner, const char *id);
        /* Sets owner's credentials of registry (replacing any). */
        int (*registry_set)(StoreImages *h, const char *owner, const char *registry, const char *username,
                            const char *sealed, int64_t updated_at);
        /* owner's registries, by name, without their secrets. */
        int (*registry_list)(StoreImages *h, const char *owner, StoreRegistryFn fn, void *userdata);
        /* owner's sealed secret of registry (malloc'ed) in *ret_sealed. -ENOENT. */
        int (*registry_get)(StoreImages *h, const char *owner, const char *registry, char **ret_sealed);
        /* -ENOENT when owner has none for registry. */
        int (*registry_delete)(StoreImages *h, const char *owner, const char *registry);
        /* Records owner's layer key, held by snapshot_id on host_id, used
         * at now. -EEXIST when the owner has that key on host_id already
         * (another host keeps a key of its own: its snapshot is its files). */
        int (*layer_put)(StoreImages *h, const char *owner, const char *key, const char *snapshot_id,
                         const char *host_id, int64_t size_bytes, int64_t now);
        /* owner's layer key kept on host_id: its snapshot (malloc'ed) in
         * *ret_snapshot, and its use set to now. -ENOENT. */
        int (*layer_use)(StoreImages *h, const char *owner, const char *key, const char *host_id, int64_t now,
                         char **ret_snapshot);
        /* owner's layers kept on host_id, least recently used first (used_at,
         * then key). */
        int (*layer_list)(StoreImages *h, const char *owner, const char *host_id, StoreLayerFn fn, void *userdata);
        /* -ENOENT when owner has no layer key on host_id. */
        int (*layer_delete)(StoreImages *h, const char *owner, const char *key, const char *host_id);
};

extern const StoreImageOps store_sqlite_images;
extern const StoreImageOps store_postgres_images;
