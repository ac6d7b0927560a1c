#pragma once
/*
 * Snapshots: what a sandbox's disk held at a moment, kept apart from the
 * sandbox, owned by the owner of the key that took it. The store keeps one
 * record per snapshot in the store's backend (store/store_snapshots.h) and
 * its files under state_dir/snapshots/<id>/, written by the driver's
 * snapshot_disk.
 *
 * Crash safety: files are written under a temporary name (.<id>.part),
 * synced, renamed into place and the directory synced, and only then is
 * the row inserted. A row always has its files; files without a row (a
 * daemon killed between the rename and the insert) and every .part are
 * removed by snapshot_store_recover. Storage is billed as a ledger series
 * of its own, "<id>:disk", at the disk rate, from the commit to the delete.
 *
 * A fork's snapshot that no one asked to keep (keepSnapshot false) is
 * transient: its spec says SNAPSHOT_TRANSIENT, get and list never show it,
 * the fork deletes it once its copies are made, and recovery deletes one
 * that a daemon killed in the middle of the fork left.
 *
 * A build's per-step layer (docs/images.md, "Per-step layers") is the
 * daemon's own: its spec says SNAPSHOT_LAYER, get, list, update and the
 * API's delete never see it, it is outside the owner's snapshot bounds and
 * has no storage charge; the builder bounds layers on their own
 * (--image-layer-max-mib-per-owner) and finds one with
 * snapshot_store_get_layer.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/manager/ledger.h"
#include "daemon/store/store.h"
#include "daemon/store/store_snapshots.h"

typedef struct SnapshotStore SnapshotStore;

#define SNAPSHOT_MAX_RETENTION_DAYS 365
#define SNAPSHOT_DEFAULT_RETENTION_DAYS 7
/* Snapshots one owner may keep at once: each holds disk on the host. */
#define SNAPSHOT_MAX_PER_OWNER 256
/* The bytes one owner's snapshots may hold in all, the sum of their
 * size_bytes with a fork's transient ones (--max-snapshot-mib-per-owner),
 * so that one owner cannot fill the disk that every owner's snapshots share.
 * In MiB: the default and the largest that may be set. */
#define SNAPSHOT_OWNER_MIB_DEFAULT (20u * 1024u)
#define SNAPSHOT_OWNER_MIB_MAX (16u * 1024u * 1024u)

void snapshot_row_done(SnapshotRow *r);
bool snapshot_id_ok(const char *s);

/* The records in backend b's store at location, the files under
 * state_dir/snapshots; price_disk_gib_hour_micros: the storage rate per
 * GiB-hour. */
int snapshot_store_open(const StoreBackend *b, const char *location, const char *state_dir,
                        uint64_t price_disk_gib_hour_micros, SnapshotStore **ret);
void snapshot_store_close(SnapshotStore *s);
void snapshot_store_set_ledger(SnapshotStore *s, Ledger *ledger);
/* The owner's bound on bytes, SNAPSHOT_OWNER_MIB_DEFAULT until set: -ERANGE
 * (the bound unchanged) outside 1 .. SNAPSHOT_OWNER_MIB_MAX. Before the
 * daemon serves. */
int snapshot_store_set_owner_max_mib(SnapshotStore *s, uint64_t mib);
uint64_t snapshot_store_owner_max_mib(SnapshotStore *s);
/* This host: the snapshots it makes are kept here (their home), and its
 * recovery, charges and expiry see only those. Before snapshot_store_recover. */
void snapshot_store_set_host(SnapshotStore *s, const char *host_id);
/* The epoch this host registered at: the store's writes of snapshots are made
 * only while the host is still registered at it and not declared dead
 * (-EOWNERDEAD otherwise). */
int snapshot_store_set_epoch(SnapshotStore *s, const char *host_id, int64_t epoch);
/* After a crash: removes transient snapshots, partial and row-less
 * snapshot directories, and closes each snapshot's storage charge at the last heartbeat, opening it
 * again from now. */
int snapshot_store_recover(SnapshotStore *s);
/* Calls fn with each snapshot of this host (layers and transient ones
 * too); a non-zero return ends the walk with it. fn may not delete:
 * collect the ids and delete after. */
int snapshot_store_each(SnapshotStore *s, int (*fn)(void *userdata, const SnapshotRow *row), void *userdata);
/* Starts the thread that deletes snapshots whose retention has passed. */
int snapshot_store_start(SnapshotStore *s);

/* A new id and its temporary directory (made, empty). */
int snapshot_store_begin(SnapshotStore *s, char ret_id[SNAPSHOT_ID_LEN + 1], char **ret_tmpdir);
/* The files in the temporary directory become the snapshot of row (its
 * size measured here): synced, renamed, then the row inserted and its
 * storage charge opened. On failure nothing is left (no files, no row, no
 * charge); -EDQUOT when its owner keeps SNAPSHOT_MAX_PER_OWNER snapshots
 * already, -EFBIG when its size would take the bytes they hold past the
 * owner's bound (row->size_bytes says how big it was). */
int snapshot_store_commit(SnapshotStore *s, SnapshotRow *row);
/* A new snapshot of owner's that shares source's files (hard links: its
 * layers are read-only once committed, so the blocks are kept once and
 * go when the last snapshot naming them is deleted), recorded for key_id
 * with labels (JSON object text) and no expiry; committed as a snapshot
 * of a sandbox is, so a crash leaves no half of it. Its layer counts in
 * full against the owner's bounds and is billed as its own: it may outlive
 * the source. With `layer` it is a build's layer instead (SNAPSHOT_LAYER in
 * its spec): outside the owner's bounds and not billed, as a layer taken
 * from a sandbox is. -ENOENT when source is not owner's (or not one the
 * owner sees), -EOPNOTSUPP for a memory snapshot, and commit's errors. */
int snapshot_store_link(SnapshotStore *s, const char *owner, const char *source, const char *key_id,
                        const char *labels, bool layer, SnapshotRow *ret);
/* Removes a begun snapshot's temporary directory. */
void snapshot_store_abort(SnapshotStore *s, const char *id);
/* The directory of a committed snapshot (a new string). */
char *snapshot_store_dir(SnapshotStore *s, const char *id);

/* The snapshot if it is owner's: -ENOENT otherwise (another owner's, a
 * transient one or a layer is not told apart from none). */
int snapshot_store_get(SnapshotStore *s, const char *owner, const char *id, SnapshotRow *ret);
/* owner's layer id (the builder's): -ENOENT for anything else. */
int snapshot_store_get_layer(SnapshotStore *s, const char *owner, const char *id, SnapshotRow *ret);
typedef int (*SnapshotFn)(void *userdata, SnapshotRow *row);
/* owner's snapshots oldest first, after the cursor (created_at, id) when
 * cursor_id is given; filters may be NULL; at most limit rows. */
int snapshot_store_list(SnapshotStore *s, const char *owner, const char *sandbox_id, const char *name,
                        int64_t cursor_at, const char *cursor_id, unsigned limit, SnapshotFn fn, void *userdata);
/* Replaces name (set_name; NULL clears), labels (non-NULL) and expiry
 * (expires_at > 0), if the snapshot's version is still `version` (the
 * version of a row read before; STORE_SNAPSHOT_ANY_VERSION: any): -ESTALE
 * when another update came first, -ENOENT. */
int snapshot_store_update(SnapshotStore *s, const char *owner, const char *id, uint64_t version, bool set_name,
                          const char *name, const char *labels, int64_t expires_at, SnapshotRow *ret);
/* How many snapshots owner keeps and the bytes they hold, as the bounds
 * count them (a fork's transient ones included, layers not). */
int snapshot_store_usage(SnapshotStore *s, const char *owner, StoreSnapshotUsage *ret);
/* Deletes the row, closes its charge and removes its files. -ENOENT. A
 * transient one or a layer too: the daemon's own deletes. */
int snapshot_store_delete(SnapshotStore *s, const char *owner, const char *id);
/* snapshot_store_delete of one a client may see (snapshot_store_get's):
 * -ENOENT for a transient one or a layer. */
int snapshot_store_delete_visible(SnapshotStore *s, const char *owner, const char *id);
