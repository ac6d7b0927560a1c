#pragma once
/*
 * The registry of uploads in parts (api_uploads.c serves their routes): each
 * upload's staging file under state_dir/uploads and its record in the store
 * (store/store_uploads.h), so that an upload survives a daemon restart. A
 * part is recorded only once its bytes are on the disk (fdatasync of the
 * staging file, then the record's durable write: in SQLite a commit with
 * synchronous=FULL): a part acknowledged is a part kept, through a crash of
 * the daemon or of the host.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/model/sandbox_request.h"
#include "daemon/store/store.h"

#define UPLOAD_ID_LEN 20 /* "upl_" + 16 hex */
/* The published client's part size; a part is one request body. */
#define UPLOAD_CHUNK (1024u * 1024u)
/* Uploads in progress: per sandbox, in all, and their declared bytes in all
 * (staging files are sparse, but a client may fill every one). */
#define UPLOADS_PER_SANDBOX 8
#define UPLOADS_MAX 64
#define UPLOADS_MAX_TOTAL_MIB 4096u
/* An upload left this long without a part is dropped. */
#define UPLOAD_IDLE_S 3600

typedef struct Uploads Uploads;

/* What a begin declares. An archive's size is not said up front: its parts
 * come in order, at most max_parts of them. */
typedef struct UploadSpec {
        bool archive;
        const char *sandbox_id;
        const char *owner;
        const char *path;
        unsigned mode;
        uint64_t size;      /* a file's length */
        uint8_t sha256[32]; /* a file's digest */
        uint64_t max_parts; /* an archive's bound */
        ReqUser user;
} UploadSpec;

/* One upload as a part or its commit works on it: a copy of its fields and a
 * descriptor of its own on the staging file (upload_ref_done closes it). */
typedef struct UploadRef {
        char id[UPLOAD_ID_LEN + 1];
        size_t slot;
        bool archive;
        bool exclusive;
        char *path;
        unsigned mode;
        uint64_t size;
        uint64_t parts; /* a file's part count, or an archive's bound */
        uint8_t sha256[32];
        ReqUser user;
        int fd;
} UploadRef;

/* Opens the registry: the uploads of backend b at location (for SQLite,
 * tables made by db_open's migrations) and its staging directory under
 * state_dir. */
int uploads_open(const StoreBackend *b, const char *location, const char *state_dir, Uploads **ret);
/* Takes back what the database and the staging directory hold after a
 * restart: an upload is kept with the parts recorded for it when its
 * sandbox is not deleted, it has had a part within the idle time, it fits
 * max_bytes (--max-file-mib now) and the bounds, and its staging file is
 * there; a staging file without a kept row, and a row without its file, go.
 * ret_kept and ret_dropped count uploads. In a store that several hosts
 * share, an upload whose sandbox another host runs is that host's (its
 * staging file is there): ours (may be NULL: every one is) says which are
 * this host's, and the others are left alone. */
typedef bool (*UploadsOurs)(void *userdata, const char *sandbox_id);
int uploads_restore(Uploads *u, uint64_t max_bytes, UploadsOurs ours, void *userdata, unsigned *ret_kept,
                    unsigned *ret_dropped);
/* Starts the sweep that drops uploads idle for UPLOAD_IDLE_S. */
int uploads_start(Uploads *u);
void uploads_close(Uploads *u);

/* An owner's share of the bounds: uploads in progress and their declared
 * bytes (--max-uploads-per-owner, --max-upload-mib-per-owner), so that one
 * owner's uploads never make another's wait. Defaults until set. */
#define UPLOADS_PER_OWNER_DEFAULT 16
#define UPLOADS_PER_OWNER_MIB_DEFAULT 1024u
void uploads_set_owner_bounds(Uploads *u, unsigned max_uploads, uint64_t max_mib);
/* The epoch this host registered at: the store's writes of uploads are made
 * only while the host is still registered at it and not declared dead
 * (-EOWNERDEAD otherwise). */
int uploads_set_epoch(Uploads *u, const char *host_id, int64_t epoch);
void uploads_owner_bounds(Uploads *u, unsigned *ret_max_uploads, uint64_t *ret_max_mib);

/* A new upload: its staging file (sparse, the declared size) and row, both
 * durable before it returns. Past a bound: -EMFILE the owner's (uploads or
 * bytes), -EMLINK the sandbox's, -EUSERS the host's (in all, the declared
 * bytes); else a negative errno. */
int uploads_begin(Uploads *u, const UploadSpec *spec, char ret_id[UPLOAD_ID_LEN + 1]);
/* The upload `id` of that sandbox and owner, for a part (shared) or for its
 * commit or abort (exclusive: one at a time). -ENOENT: no such upload for
 * them; -EBUSY: exclusive while another holds it. */
int uploads_take(Uploads *u, const char *id, const char *sandbox_id, const char *owner, bool exclusive,
                 UploadRef *ret);
void upload_ref_done(UploadRef *r);
/* Part `index` of `bytes` bytes, written through r->fd, has arrived: its
 * bytes are made durable, then it is recorded. -ENOENT when the upload went
 * meanwhile (the part is not kept). */
int uploads_part_arrived(Uploads *u, const UploadRef *r, uint64_t index, uint64_t bytes);
/* Which parts arrived (an exclusive ref): per part 0 missing, 1 whole, 2
 * short; a copy of r->parts bytes. */
int uploads_received(Uploads *u, const UploadRef *r, uint8_t **ret);
/* Gives an exclusive ref back with the upload kept (a commit refused). */
void uploads_release(Uploads *u, UploadRef *r);
/* Drops the upload of an exclusive ref: its row, its file, its slot. */
void uploads_drop(Uploads *u, UploadRef *r);
/* Drops every upload of a sandbox (deleted). */
void uploads_drop_sandbox(Uploads *u, const char *sandbox_id);
/* Uploads in progress, in all (for tests and metrics). */
unsigned uploads_count(Uploads *u);
