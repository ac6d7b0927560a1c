#pragma once
/*
 * The previews as a backend keeps them (store.h): one row per sandbox and
 * port, with its owner, whether a token is needed, its signing secret
 * (sealed: the daemon seals and opens it, the store sees text) and when the
 * preview ends (0: with its sandbox), and the sites that may frame it (its
 * embed origins, one a line; "": any site). Every host of a fleet reads the same
 * rows, so any host can answer a preview's request.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store/store.h"

#define STORE_PREVIEW_ID_MAX 64
#define STORE_PREVIEW_OWNER_MAX 128
#define STORE_PREVIEW_SECRET_MAX 512
/* Up to 16 origins of up to 255 bytes, one a line. */
#define STORE_PREVIEW_EMBED_MAX 4096

typedef struct StorePreview {
        char sandbox_id[STORE_PREVIEW_ID_MAX];
        char owner[STORE_PREVIEW_OWNER_MAX];
        unsigned port;
        bool public;
        char secret[STORE_PREVIEW_SECRET_MAX]; /* sealed */
        int64_t created_at, rotated_at;
        int64_t expires_at; /* 0: lives as long as its sandbox */
        char embed_origins[STORE_PREVIEW_EMBED_MAX]; /* one a line; "": any site may frame it */
} StorePreview;

typedef struct StorePreviews StorePreviews;

struct StorePreviewOps {
        int (*open)(const char *location, StorePreviews **ret);
        void (*close)(StorePreviews *h);
        /* The host whose writes these are, at its epoch (a fleet): writes
         * are made only while it is still registered at it, else
         * -EOWNERDEAD. A backend with one host ignores it. */
        int (*set_writer)(StorePreviews *h, const char *host_id, int64_t epoch);
        /* Makes the preview of p->sandbox_id and p->port, or changes the
         * visibility and end of the one there (whose secret stays), and its
         * embed origins when set_embed (else the row's are kept); *ret is
         * the row kept. */
        int (*put)(StorePreviews *h, const StorePreview *p, bool set_embed, StorePreview *ret);
        /* -ENOENT when the port is not shared. */
        int (*get)(StorePreviews *h, const char *sandbox_id, unsigned port, StorePreview *ret);
        /* The sandbox's previews by port; *ret is malloc'd (free it). */
        int (*list)(StorePreviews *h, const char *sandbox_id, StorePreview **ret, size_t *ret_n);
        /* A new sealed secret: every token signed with the one before fails.
         * -ENOENT when the port is not shared. */
        int (*rotate)(StorePreviews *h, const char *sandbox_id, unsigned port, const char *sealed, int64_t now);
        /* -ENOENT when the port was not shared. port 0: every preview of the
         * sandbox (its end), never -ENOENT. */
        int (*remove)(StorePreviews *h, const char *sandbox_id, unsigned port);
};

extern const StorePreviewOps store_sqlite_previews;
extern const StorePreviewOps store_postgres_previews;
