#pragma once
/*
 * The uploads in parts as a backend keeps them (store.h): an upload's row,
 * owned by the owner it names and belonging to a sandbox, and the parts
 * recorded for it (which belong to it and go with it). An upload is written
 * by its own parts only, each recorded atomically with its upload's time,
 * and dropped whole; no write is conditional on what a caller read before,
 * so an upload carries no version. The bounds on uploads in progress are
 * the daemon's, over the staging files of its own host (uploads.c).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/model/sandbox_request.h"
#include "daemon/store/store.h"

/* An upload's row. */
typedef struct StoreUpload {
        const char *id;
        const char *sandbox_id;
        const char *owner;
        const char *path;
        bool archive;
        ReqUser user;
        unsigned mode;
        int64_t size;        /* a file's length; 0 for an archive */
        bool has_sha256;     /* a file's digest is there */
        uint8_t sha256[32];
        int64_t chunk_bytes; /* the part size it was begun with */
        int64_t parts;       /* a file's part count, or an archive's bound */
        int64_t created_at;
        int64_t touched_at;
} StoreUpload;

/* A part recorded for an upload. */
typedef struct StoreUploadPart {
        int64_t index;
        int64_t bytes;
} StoreUploadPart;

/* An upload as a listing hands it over: its row, whether its sandbox is
 * there and not deleted, and its parts. Everything lives until the
 * callback returns. */
typedef struct StoreUploadListed {
        StoreUpload row;
        bool sandbox_live;
        const StoreUploadPart *parts;
        size_t n_parts;
} StoreUploadListed;

/* Called per upload of a listing; a negative return stops it and is
 * returned. It must not call back into the store. */
typedef int (*StoreUploadEach)(const StoreUploadListed *u, void *userdata);

typedef struct StoreUploads StoreUploads;

struct StoreUploadOps {
        /* Opens the uploads at location; the tables are the daemon's (made
         * by its migrations). Each write is durable when it returns. */
        int (*open)(const char *location, StoreUploads **ret);
        void (*close)(StoreUploads *h);
        /* Inserts an upload's row. -EEXIST when its id is taken. */
        int (*insert)(StoreUploads *h, const StoreUpload *u);
        /* The host whose writes these are, at the epoch it registered at
         * (a fleet): each write from now on is made only while the host is
         * still registered at it and not declared dead, and is -EOWNERDEAD,
         * changing nothing, otherwise. Epoch 0: no condition. A backend with
         * one host ignores it. */
        int (*set_writer)(StoreUploads *h, const char *host_id, int64_t epoch);
        /* Atomically: records part index of bytes bytes (again: replaced)
         * and sets the upload's touched_at to now. -ENOENT when the upload
         * is gone (nothing is recorded). */
        int (*record_part)(StoreUploads *h, const char *id, uint64_t index, uint64_t bytes, int64_t now);
        /* Deletes an upload with its parts; 0 also when there is none. */
        int (*remove)(StoreUploads *h, const char *id);
        /* Deletes every upload of a sandbox with their parts. */
        int (*remove_sandbox)(StoreUploads *h, const char *sandbox_id);
        /* Every upload, oldest first. */
        int (*list)(StoreUploads *h, StoreUploadEach each, void *userdata);
};

/* The SQLite backend's uploads (sqlite_uploads.c). */
extern const StoreUploadOps store_sqlite_uploads;
/* The PostgreSQL backend's uploads (postgres_uploads.c). */
extern const StoreUploadOps store_postgres_uploads;
