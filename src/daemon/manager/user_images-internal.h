#pragma once
/* What the files of the images module share (user_images.c: the queue and
 * the builds; user_images_records.c: the records' reads, tags and
 * deletes). */
#include <pthread.h>
#include <stdbool.h>

#include "daemon/egress/egress_seal.h"
#include "daemon/manager/user_images.h"

#define BUILD_WORKERS 2

typedef struct Job {
        struct Job *next;
        char id[IMAGE_ID_LEN + 1];
        char rid[32];
        KeyInfo key;
        ImageBuildRequest req;
        int64_t version;
        char *name;
} Job;

typedef struct OwnerCount {
        char owner[128];
        unsigned running, queued;
} OwnerCount;

struct UserImages {
        const struct DaemonConfig *cfg;
        const StoreImageOps *ops;
        StoreImages *h;
        Manager *m;
        SnapshotStore *snapshots;
        char *dir;     /* state_dir/user-images */
        char *ctx_dir; /* state_dir/image-context */
        char host_id[64];
        pthread_mutex_t lock;
        pthread_cond_t cond;
        Job *queue; /* oldest first */
        OwnerCount *owners;
        size_t n_owners;
        bool stopping;
        pthread_t workers[BUILD_WORKERS];
        unsigned n_workers;
        uint8_t seal_key[SEAL_KEY_LEN]; /* the registries' secrets' */
        bool have_seal_key;
};

/* The build log's file of image id (malloc'ed; NULL on ENOMEM). */
char *user_images_log_path(UserImages *u, const char *id);
bool user_images_id_ok(const char *s);
