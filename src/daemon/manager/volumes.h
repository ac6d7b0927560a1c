#pragma once
/*
 * Volumes (docs/volumes.md): disks of a fixed size that outlive the
 * sandboxes they are attached to. The records are the store's
 * (store_volumes.h); each volume's bytes are an ext4 image in the daemon's
 * state directory (volume_disk.h), mounted on the host while some sandbox
 * may use it and bound into each sandbox that attached it. A volume
 * belongs to one owner. Library code: returns, logs nothing.
 */
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/model/sandbox_spec.h"
#include "daemon/store/store.h"
#include "daemon/store/store_volumes.h"
#include "driver/driver.h"

/* The bounds a daemon puts on its volumes (--volume-* options). */
typedef struct VolumeLimits {
        uint32_t max_mib;       /* one volume's size */
        uint32_t max_count;     /* volumes per owner */
        uint64_t max_total_mib; /* an owner's volumes together */
} VolumeLimits;

#define VOLUME_MIN_MIB 16u
#define VOLUME_DEFAULT_MIB 1024u
#define VOLUME_DEFAULT_MAX_MIB 65536u
#define VOLUME_DEFAULT_MAX_COUNT 20u
#define VOLUME_DEFAULT_MAX_TOTAL_MIB 262144u

typedef struct Volumes Volumes;

int volumes_open(const StoreBackend *b, const char *location, const char *state_dir, const VolumeLimits *lim,
                 Volumes **ret);
void volumes_close(Volumes *vs);
const VolumeLimits *volumes_limits(const Volumes *vs);
/* The host whose writes these are, at its epoch (a fleet). */
int volumes_set_epoch(Volumes *vs, const char *host_id, int64_t epoch);

/* A new volume of the owner, its disk made: -EUSERS past the count,
 * -EDQUOT past the total, -ENOSPC when the host has no room for the file,
 * -ENOENT without mkfs.ext4. labels is a JSON object's text. */
int volumes_create(Volumes *vs, const char *owner, const char *name, const char *labels, uint32_t size_mib,
                   bool shared, StoreVolume *ret);
int volumes_get(Volumes *vs, const char *owner, const char *id, StoreVolume *ret);
int volumes_list(Volumes *vs, const char *owner, const char *name, int64_t after_created, const char *after_id,
                 size_t limit, StoreVolume **ret, size_t *ret_n);
int volumes_attachments(Volumes *vs, const char *id, StoreVolumeAttachment **ret, size_t *ret_n);
/* Grows a detached volume to size_mib: -EINVAL when that is not larger,
 * -EBUSY while attached or resizing, -EDQUOT past the owner's total. */
int volumes_resize(Volumes *vs, const char *owner, const char *id, uint32_t size_mib, StoreVolume *ret);
/* Deletes the volume and its bytes; -EBUSY while attached unless force. */
int volumes_delete(Volumes *vs, const char *owner, const char *id, bool force);

/* The most backups an owner keeps. */
#define VOLUME_BACKUPS_PER_OWNER 50u

/* A copy of the volume's disk as it is now, kept apart from it on this
 * host: a mounted volume's filesystem is frozen for the copy (writers in
 * sandboxes wait), so the copy is consistent. -EUSERS past
 * VOLUME_BACKUPS_PER_OWNER, -ENOSPC when the host has no room. With
 * retention_days (0: none) the sweep deletes it that many days on. */
int volumes_backup(Volumes *vs, const char *owner, const char *id, const char *name, uint32_t retention_days,
                   StoreVolumeBackup *ret);
int volumes_backup_get(Volumes *vs, const char *owner, const char *id, StoreVolumeBackup *ret);
int volumes_backup_list(Volumes *vs, const char *owner, const char *volume_id, int64_t after_created,
                        const char *after_id, size_t limit, StoreVolumeBackup **ret, size_t *ret_n);
int volumes_backup_delete(Volumes *vs, const char *owner, const char *id);
/* A new volume of the owner from a backup, of the backup's size; the
 * bounds of volumes_create. */
int volumes_restore(Volumes *vs, const char *owner, const char *backup_id, const char *name, StoreVolume *ret);

/* The bounds of a backup policy (docs/volumes.md, "Backups"). */
#define VOLUME_BACKUP_EVERY_MIN_MINUTES 15u
#define VOLUME_BACKUP_EVERY_MAX_MINUTES (7u * 1440u)
#define VOLUME_BACKUP_DAILY_MINUTES 1440u
#define VOLUME_RETENTION_MAX_DAYS 365u
#define VOLUME_DAY_SECONDS 86400u
#define VOLUME_SWEEP_DEFAULT_SECONDS 60u

/* The owner's volume is backed up by the sweep every p->every_minutes, or
 * at the times of p->cron (neither: never), each copy kept
 * p->retention_days (0: until deleted); with p->keep, the sweep deletes
 * the volume's backups that no count keeps. A new interval is due at the
 * next sweep, a new cron at its next time; the same schedule keeps its
 * time. p->next_at is ignored. -EINVAL for a cron that cron_parse refuses
 * or that never falls (-ERANGE). */
int volumes_set_backup_policy(Volumes *vs, const char *owner, const char *id, const StoreVolumeBackupPolicy *p,
                              StoreVolume *ret);
/* The sweep, every sweep_seconds: deletes the expired backups and those
 * no keep count keeps, and takes the due ones whose files are on this host, each claimed in the store so
 * that one host of a fleet does it once. day_seconds is the length of a
 * day in the policies' times (VOLUME_DAY_SECONDS but in tests). Stopped by
 * volumes_close. */
int volumes_start_sweep(Volumes *vs, unsigned sweep_seconds, unsigned day_seconds);
/* When a copy taken now with retention_days expires (0: never). */
int64_t volumes_expiry(const Volumes *vs, int64_t now, uint32_t retention_days);

/* Attaches the spec's volumes to the sandbox, all or none: -ENOENT (no
 * such volume of the owner's), -EBUSY (another sandbox writes it), -EAGAIN
 * (it is being resized); *ret_failed is the index of the one refused. */
int volumes_attach_spec(Volumes *vs, const char *owner, const char *sandbox_id, const SandboxSpec *spec,
                        size_t *ret_failed);
/* One volume attached to a running sandbox (its writer claimed as at a
 * create): the errors of volumes_attach_spec. volumes_detach ends it:
 * -ENOENT for none. */
int volumes_attach(Volumes *vs, const char *owner, const char *sandbox_id, const SandboxVolume *v);
int volumes_detach(Volumes *vs, const char *volume_id, const char *sandbox_id);
/* The sandbox's attachments end (it is deleted). */
int volumes_release(Volumes *vs, const char *sandbox_id);

/* What a start binds: each volume of the spec mounted on the host and its
 * mount's root as source. paths holds the sources' strings. -ENOENT when a
 * volume has been deleted, -EBUSY when its file is held by a loop device
 * that is not the daemon's mount or by a guest kernel.
 *
 * With images (a driver whose sandbox has its own kernel) each source is
 * the volume's image instead, never mounted on the host, with a descriptor
 * holding it for the guest (volume_disk_hold): the daemon's idle host mount
 * is taken down first, and -EBUSY when another sandbox still holds the
 * filesystem through the host's kernel or another guest's lock conflicts
 * (one writer, or readers only). volumes_mounts_close closes them once the
 * driver has started (or failed). */
typedef struct VolumeMountPaths {
        char source[SANDBOX_MAX_VOLUMES][PATH_MAX];
        DriverMount mounts[SANDBOX_MAX_VOLUMES];
        size_t n;
} VolumeMountPaths;
int volumes_mounts(Volumes *vs, const SandboxSpec *spec, bool images, VolumeMountPaths *ret, size_t *ret_failed);
void volumes_mounts_close(VolumeMountPaths *m);
