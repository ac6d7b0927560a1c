#pragma once
/*
 * The volumes as a backend keeps them (store.h): one row per volume, with
 * its owner, size and state, and one row per attachment of a volume to a
 * sandbox. The rule that one sandbox at a time writes a volume that is not
 * shared is the store's: an attachment that writes such a volume is
 * "exclusive", and a unique index on the exclusive attachments of a volume
 * lets exactly one of two racing attaches in, for every host of a fleet.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/model/backup_policy.h"
#include "daemon/store/store.h"

#define STORE_VOLUME_ID_MAX 32
#define STORE_VOLUME_OWNER_MAX 128
#define STORE_VOLUME_NAME_MAX 64
#define STORE_VOLUME_LABELS_MAX 4096
#define STORE_VOLUME_PATH_MAX 256

typedef enum StoreVolumeState {
        STORE_VOLUME_READY,    /* attachable */
        STORE_VOLUME_RESIZING, /* its file is being grown: no attach until it is ready again */
} StoreVolumeState;

/* When a volume is backed up by the daemon's sweep (docs/volumes.md,
 * "Backups"): every every_minutes, or at the times of cron, from next_at
 * on, each copy kept retention_days; the keep counts prune its backups. */
typedef struct StoreVolumeBackupPolicy {
        uint32_t every_minutes;  /* 0: none by interval */
        char cron[CRON_TEXT_MAX + 1]; /* "" for none; read by cron_parse when set */
        uint32_t retention_days; /* 0: kept until deleted */
        int64_t next_at;         /* the next one is due from here (Unix seconds) */
        BackupKeep keep;         /* all 0: no pruning by counts */
} StoreVolumeBackupPolicy;

typedef struct StoreVolume {
        char id[STORE_VOLUME_ID_MAX]; /* vol_ and 20 hex digits */
        char owner[STORE_VOLUME_OWNER_MAX];
        char name[STORE_VOLUME_NAME_MAX];       /* "" for none */
        char labels[STORE_VOLUME_LABELS_MAX];   /* a JSON object's text */
        uint32_t size_mib;
        bool shared; /* any number of sandboxes may write it at once */
        StoreVolumeState state;
        int64_t created_at;
        StoreVolumeBackupPolicy policy;
} StoreVolume;

typedef struct StoreVolumeAttachment {
        char volume_id[STORE_VOLUME_ID_MAX];
        char sandbox_id[STORE_VOLUME_ID_MAX];
        char path[STORE_VOLUME_PATH_MAX];
        bool read_only;
        int64_t created_at;
} StoreVolumeAttachment;

/* A copy of a volume's disk at one moment, kept apart from it. */
typedef struct StoreVolumeBackup {
        char id[STORE_VOLUME_ID_MAX]; /* vb_ and 20 hex digits */
        char owner[STORE_VOLUME_OWNER_MAX];
        char volume_id[STORE_VOLUME_ID_MAX];
        char name[STORE_VOLUME_NAME_MAX];
        uint32_t size_mib;
        int64_t created_at;
        int64_t expires_at; /* 0: kept until deleted */
        bool scheduled;     /* taken by the sweep: its policy's keep counts apply to it */
} StoreVolumeBackup;

/* The bounds of one owner's volumes, checked in the insert itself. */
typedef struct StoreVolumeBounds {
        uint32_t max_count;     /* volumes per owner */
        uint64_t max_total_mib; /* their sizes together */
} StoreVolumeBounds;

typedef struct StoreVolumes StoreVolumes;

struct StoreVolumeOps {
        int (*open)(const char *location, StoreVolumes **ret);
        void (*close)(StoreVolumes *h);
        /* The host whose writes these are, at its epoch (a fleet). */
        int (*set_writer)(StoreVolumes *h, const char *host_id, int64_t epoch);
        /* Adds v unless the owner would then pass a bound: -EUSERS for the
         * count, -EDQUOT for the total size; -EEXIST for a taken id. */
        int (*insert)(StoreVolumes *h, const StoreVolume *v, const StoreVolumeBounds *b);
        /* The owner's volume; -ENOENT for another owner's or none. */
        int (*get)(StoreVolumes *h, const char *owner, const char *id, StoreVolume *ret);
        /* The owner's volumes, oldest first (created_at, then id), after
         * (after_created, after_id) (after_id "" from the first), at most
         * `limit`; name "" for any. *ret is malloc'd (free it). */
        int (*list)(StoreVolumes *h, const char *owner, const char *name, int64_t after_created,
                    const char *after_id, size_t limit, StoreVolume **ret, size_t *ret_n);
        /* READY to RESIZING, only while nothing is attached and while the
         * owner's sizes with this one at new_mib stay within b's total:
         * -EBUSY when something is attached or it is resizing already,
         * -EDQUOT past the total, -ENOENT for none. */
        int (*resize_begin)(StoreVolumes *h, const char *owner, const char *id, uint32_t new_mib,
                            const StoreVolumeBounds *b);
        /* RESIZING to READY at size_mib (its old size when the grow
         * failed). */
        int (*resize_end)(StoreVolumes *h, const char *id, uint32_t size_mib);
        /* Removes the volume and, with force, its attachments; without,
         * -EBUSY while it has any. -ENOENT for none. */
        int (*remove)(StoreVolumes *h, const char *owner, const char *id, bool force);
        /* Attaches the owner's READY volume a->volume_id: -ENOENT for none
         * (or not the owner's), -EAGAIN while it resizes, -EBUSY when it is
         * not shared, a is not read-only and another sandbox writes it. */
        int (*attach)(StoreVolumes *h, const char *owner, const StoreVolumeAttachment *a);
        /* The sandbox's attachment of the volume goes (a detach from a
         * running sandbox); -ENOENT for none. */
        int (*detach)(StoreVolumes *h, const char *volume_id, const char *sandbox_id);
        /* Every attachment of the sandbox goes (its end); never -ENOENT. */
        int (*detach_sandbox)(StoreVolumes *h, const char *sandbox_id);
        /* The volume's attachments, oldest first; *ret malloc'd. */
        int (*attachments)(StoreVolumes *h, const char *volume_id, StoreVolumeAttachment **ret, size_t *ret_n);
        /* Adds a backup unless the owner has max_count already (-EUSERS). */
        int (*backup_insert)(StoreVolumes *h, const StoreVolumeBackup *b, uint32_t max_count);
        int (*backup_get)(StoreVolumes *h, const char *owner, const char *id, StoreVolumeBackup *ret);
        /* The owner's backups (of volume_id; "" any), newest first, after
         * (after_created, after_id) (after_id "" from the newest). */
        int (*backup_list)(StoreVolumes *h, const char *owner, const char *volume_id, int64_t after_created,
                           const char *after_id, size_t limit, StoreVolumeBackup **ret, size_t *ret_n);
        /* -ENOENT for none of the owner's. */
        int (*backup_remove)(StoreVolumes *h, const char *owner, const char *id);
        /* Every owner's backups whose expires_at has come by now, oldest
         * expiry first, at most `limit`; *ret malloc'd. */
        int (*backups_expired)(StoreVolumes *h, int64_t now, size_t limit, StoreVolumeBackup **ret, size_t *ret_n);
        /* The owner's volume's backup policy is p; -ENOENT for none. */
        int (*set_policy)(StoreVolumes *h, const char *owner, const char *id, const StoreVolumeBackupPolicy *p);
        /* Every owner's volumes with a schedule (every_minutes or cron)
         * whose next_at has come by now, the longest due first, at most
         * `limit`; *ret malloc'd. */
        int (*backups_due)(StoreVolumes *h, int64_t now, size_t limit, StoreVolume **ret, size_t *ret_n);
        /* Takes the due backup of volume id that was due at due_at: its
         * next_at becomes next_at. -EALREADY when another host (or a policy
         * change) got there first: exactly one claim of one due time wins. */
        int (*claim_backup)(StoreVolumes *h, const char *id, int64_t due_at, int64_t next_at);
        /* Every owner's volumes with a keep count set, by id, after after_id
         * ("" from the first), at most `limit`; *ret malloc'd. */
        int (*kept_by_counts)(StoreVolumes *h, const char *after_id, size_t limit, StoreVolume **ret, size_t *ret_n);
};

const char *store_volume_state_name(StoreVolumeState s);
int store_volume_state_from_name(const char *s, StoreVolumeState *ret);

extern const StoreVolumeOps store_sqlite_volumes;
extern const StoreVolumeOps store_postgres_volumes;
