#pragma once
/* What every backend's volumes kind keeps (store_volumes.h), run on a
 * fresh handle by each backend's test. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_volumes.h"

static inline StoreVolume volume_row(const char *id, const char *owner, const char *name, uint32_t mib,
                                     bool shared, int64_t created_at) {
        StoreVolume v = { .size_mib = mib, .shared = shared, .state = STORE_VOLUME_READY, .created_at = created_at };
        snprintf(v.id, sizeof v.id, "%s", id);
        snprintf(v.owner, sizeof v.owner, "%s", owner);
        snprintf(v.name, sizeof v.name, "%s", name);
        snprintf(v.labels, sizeof v.labels, "%s", "{\"team\":\"a\"}");
        return v;
}

static inline StoreVolumeAttachment volume_attachment(const char *volume_id, const char *sandbox_id, bool ro) {
        StoreVolumeAttachment a = { .read_only = ro, .created_at = 10 };
        snprintf(a.volume_id, sizeof a.volume_id, "%s", volume_id);
        snprintf(a.sandbox_id, sizeof a.sandbox_id, "%s", sandbox_id);
        snprintf(a.path, sizeof a.path, "%s", "/data");
        return a;
}

static inline void volumes_contract(const StoreVolumeOps *ops, StoreVolumes *h) {
        const StoreVolumeBounds b = { .max_count = 3, .max_total_mib = 1000 };
        StoreVolume got, v1 = volume_row("vol_1", "alice", "one", 100, false, 1);
        StoreVolume v2 = volume_row("vol_2", "alice", "two", 200, true, 2);
        StoreVolume v3 = volume_row("vol_3", "alice", "one", 300, false, 2);
        assert_int_equal(ops->get(h, "alice", "vol_1", &got), -ENOENT);
        assert_int_equal(ops->insert(h, &v1, &b), 0);
        assert_int_equal(ops->insert(h, &v1, &b), -EEXIST);
        assert_int_equal(ops->insert(h, &v2, &b), 0);
        /* The total size is a bound: 100 + 200 + 800 > 1000. */
        StoreVolume big = volume_row("vol_9", "alice", "", 800, false, 3);
        assert_int_equal(ops->insert(h, &big, &b), -EDQUOT);
        assert_int_equal(ops->insert(h, &v3, &b), 0);
        /* And the count: three is the most. */
        StoreVolume four = volume_row("vol_4", "alice", "", 1, false, 4);
        assert_int_equal(ops->insert(h, &four, &b), -EUSERS);
        /* Another owner has bounds of its own, and sees none of alice's. */
        StoreVolume bobs = volume_row("vol_b", "bob", "", 900, false, 1);
        assert_int_equal(ops->insert(h, &bobs, &b), 0);
        assert_int_equal(ops->get(h, "bob", "vol_1", &got), -ENOENT);
        assert_int_equal(ops->get(h, "alice", "vol_1", &got), 0);
        assert_string_equal(got.name, "one");
        assert_string_equal(got.labels, "{\"team\":\"a\"}");
        assert_int_equal(got.size_mib, 100);
        assert_false(got.shared);
        assert_int_equal(got.state, STORE_VOLUME_READY);

        /* Pages, oldest first, then by id; by name. */
        StoreVolume *all = NULL;
        size_t n = 0;
        assert_int_equal(ops->list(h, "alice", "", 0, "", 2, &all, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(all[0].id, "vol_1");
        assert_string_equal(all[1].id, "vol_2");
        int64_t at = all[1].created_at;
        free(all);
        assert_int_equal(ops->list(h, "alice", "", at, "vol_2", 2, &all, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(all[0].id, "vol_3");
        free(all);
        assert_int_equal(ops->list(h, "alice", "one", 0, "", 10, &all, &n), 0);
        assert_int_equal(n, 2);
        free(all);

        /* One writer of a volume that is not shared; readers besides. */
        StoreVolumeAttachment w1 = volume_attachment("vol_1", "sbx_a", false);
        StoreVolumeAttachment w2 = volume_attachment("vol_1", "sbx_b", false);
        StoreVolumeAttachment r3 = volume_attachment("vol_1", "sbx_c", true);
        assert_int_equal(ops->attach(h, "alice", &w1), 0);
        assert_int_equal(ops->attach(h, "alice", &w2), -EBUSY);
        assert_int_equal(ops->attach(h, "alice", &r3), 0);
        assert_int_equal(ops->attach(h, "bob", &w2), -ENOENT);
        /* A shared one takes every writer. */
        StoreVolumeAttachment s1 = volume_attachment("vol_2", "sbx_a", false);
        StoreVolumeAttachment s2 = volume_attachment("vol_2", "sbx_b", false);
        assert_int_equal(ops->attach(h, "alice", &s1), 0);
        assert_int_equal(ops->attach(h, "alice", &s2), 0);
        StoreVolumeAttachment *atts = NULL;
        assert_int_equal(ops->attachments(h, "vol_1", &atts, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(atts[0].path, "/data");
        free(atts);

        /* Attached: no resize, no removal unless forced. */
        assert_int_equal(ops->resize_begin(h, "alice", "vol_1", 150, &b), -EBUSY);
        assert_int_equal(ops->remove(h, "alice", "vol_1", false), -EBUSY);
        assert_int_equal(ops->detach_sandbox(h, "sbx_a"), 0);
        assert_int_equal(ops->detach_sandbox(h, "sbx_c"), 0);
        /* The writer gone, another may write. */
        assert_int_equal(ops->attach(h, "alice", &w2), 0);
        assert_int_equal(ops->detach_sandbox(h, "sbx_b"), 0);

        /* A resize: the total bound, then no attach while it runs. */
        assert_int_equal(ops->resize_begin(h, "alice", "vol_1", 600, &b), -EDQUOT);
        assert_int_equal(ops->resize_begin(h, "alice", "vol_1", 150, &b), 0);
        assert_int_equal(ops->resize_begin(h, "alice", "vol_1", 150, &b), -EBUSY);
        assert_int_equal(ops->attach(h, "alice", &w1), -EAGAIN);
        assert_int_equal(ops->resize_end(h, "vol_1", 150), 0);
        assert_int_equal(ops->get(h, "alice", "vol_1", &got), 0);
        assert_int_equal(got.size_mib, 150);
        assert_int_equal(got.state, STORE_VOLUME_READY);
        assert_int_equal(ops->resize_begin(h, "bob", "vol_1", 150, &b), -ENOENT);

        /* Removal: another owner's is not found; forced takes attachments. */
        assert_int_equal(ops->remove(h, "bob", "vol_1", false), -ENOENT);
        assert_int_equal(ops->attach(h, "alice", &w1), 0);
        assert_int_equal(ops->remove(h, "alice", "vol_1", true), 0);
        assert_int_equal(ops->attachments(h, "vol_1", &atts, &n), 0);
        assert_int_equal(n, 0);
        free(atts);
        assert_int_equal(ops->get(h, "alice", "vol_1", &got), -ENOENT);
        assert_int_equal(ops->remove(h, "alice", "vol_1", true), -ENOENT);
        assert_int_equal(ops->remove(h, "alice", "vol_3", false), 0);

        /* Backups: a count bound, the owner's only, newest first, by volume. */
        StoreVolumeBackup b1 = { .size_mib = 100, .created_at = 5 },
                          b2 = { .size_mib = 200, .created_at = 6, .scheduled = true };
        snprintf(b1.id, sizeof b1.id, "vb_1");
        snprintf(b2.id, sizeof b2.id, "vb_2");
        snprintf(b1.owner, sizeof b1.owner, "alice");
        snprintf(b2.owner, sizeof b2.owner, "alice");
        snprintf(b1.volume_id, sizeof b1.volume_id, "vol_1");
        snprintf(b2.volume_id, sizeof b2.volume_id, "vol_2");
        snprintf(b1.name, sizeof b1.name, "nightly");
        assert_int_equal(ops->backup_insert(h, &b1, 2), 0);
        assert_int_equal(ops->backup_insert(h, &b2, 2), 0);
        StoreVolumeBackup b3 = b2;
        snprintf(b3.id, sizeof b3.id, "vb_3");
        assert_int_equal(ops->backup_insert(h, &b3, 2), -EUSERS);
        StoreVolumeBackup bg;
        assert_int_equal(ops->backup_get(h, "bob", "vb_1", &bg), -ENOENT);
        assert_int_equal(ops->backup_get(h, "alice", "vb_1", &bg), 0);
        assert_string_equal(bg.name, "nightly");
        assert_string_equal(bg.volume_id, "vol_1");
        assert_int_equal(bg.size_mib, 100);
        assert_false(bg.scheduled);
        assert_int_equal(ops->backup_get(h, "alice", "vb_2", &bg), 0);
        assert_true(bg.scheduled);
        StoreVolumeBackup *bs = NULL;
        assert_int_equal(ops->backup_list(h, "alice", "", 0, "", 10, &bs, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(bs[0].id, "vb_2");
        assert_true(bs[0].scheduled && !bs[1].scheduled);
        free(bs);
        assert_int_equal(ops->backup_list(h, "alice", "", 6, "vb_2", 10, &bs, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(bs[0].id, "vb_1");
        free(bs);
        assert_int_equal(ops->backup_list(h, "alice", "vol_2", 0, "", 10, &bs, &n), 0);
        assert_int_equal(n, 1);
        free(bs);
        assert_int_equal(ops->backup_remove(h, "bob", "vb_1"), -ENOENT);
        assert_int_equal(ops->backup_remove(h, "alice", "vb_1"), 0);
        assert_int_equal(ops->backup_remove(h, "alice", "vb_1"), -ENOENT);

        /* Expiry: a backup with expires_at is listed once that time has
         * come, every owner's, the earliest first; one without never. */
        StoreVolumeBackup e1 = b2, e2 = b2, e3 = b2;
        snprintf(e1.id, sizeof e1.id, "vb_e1");
        snprintf(e2.id, sizeof e2.id, "vb_e2");
        snprintf(e3.id, sizeof e3.id, "vb_e3");
        snprintf(e2.owner, sizeof e2.owner, "carol");
        e1.expires_at = 50;
        e2.expires_at = 40;
        e3.expires_at = 0;
        assert_int_equal(ops->backup_insert(h, &e1, 10), 0);
        assert_int_equal(ops->backup_insert(h, &e2, 10), 0);
        assert_int_equal(ops->backup_insert(h, &e3, 10), 0);
        assert_int_equal(ops->backup_get(h, "alice", "vb_e1", &bg), 0);
        assert_int_equal(bg.expires_at, 50);
        assert_int_equal(ops->backups_expired(h, 39, 10, &bs, &n), 0);
        assert_int_equal(n, 0);
        free(bs);
        assert_int_equal(ops->backups_expired(h, 100, 10, &bs, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(bs[0].id, "vb_e2");
        assert_string_equal(bs[0].owner, "carol");
        assert_string_equal(bs[1].id, "vb_e1");
        free(bs);
        assert_int_equal(ops->backups_expired(h, 100, 1, &bs, &n), 0);
        assert_int_equal(n, 1);
        free(bs);

        /* Policies: stored and read back; due once next_at has come; one
         * claim of one due time wins. */
        StoreVolumeBackupPolicy pol = { .every_minutes = 60, .retention_days = 7, .next_at = 100 };
        assert_int_equal(ops->set_policy(h, "bob", "vol_2", &pol), -ENOENT);
        assert_int_equal(ops->set_policy(h, "alice", "vol_2", &pol), 0);
        assert_int_equal(ops->get(h, "alice", "vol_2", &got), 0);
        assert_int_equal(got.policy.every_minutes, 60);
        assert_int_equal(got.policy.retention_days, 7);
        assert_int_equal(got.policy.next_at, 100);
        StoreVolume *due = NULL;
        assert_int_equal(ops->backups_due(h, 99, 10, &due, &n), 0);
        assert_int_equal(n, 0);
        free(due);
        assert_int_equal(ops->backups_due(h, 100, 10, &due, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(due[0].id, "vol_2");
        assert_string_equal(due[0].owner, "alice");
        assert_int_equal(due[0].policy.next_at, 100);
        free(due);
        assert_int_equal(ops->claim_backup(h, "vol_2", 100, 3700), 0);
        assert_int_equal(ops->claim_backup(h, "vol_2", 100, 3700), -EALREADY);
        assert_int_equal(ops->backups_due(h, 200, 10, &due, &n), 0);
        assert_int_equal(n, 0);
        free(due);
        /* Off: never due, and nothing to claim. */
        pol = (StoreVolumeBackupPolicy){ 0 };
        assert_int_equal(ops->set_policy(h, "alice", "vol_2", &pol), 0);
        assert_int_equal(ops->backups_due(h, 1000000, 10, &due, &n), 0);
        assert_int_equal(n, 0);
        free(due);
        assert_int_equal(ops->claim_backup(h, "vol_2", 0, 10), -EALREADY);
        assert_int_equal(ops->kept_by_counts(h, "", 10, &due, &n), 0);
        assert_int_equal(n, 0);
        free(due);

        /* A cron schedule (no interval) is due and claimed as one; the keep
         * counts are read back, and their volumes listed by id. */
        pol = (StoreVolumeBackupPolicy){ .retention_days = 3, .next_at = 500,
                                         .keep = { .last = 1, .hourly = 2, .daily = 3, .weekly = 4, .monthly = 5,
                                                   .yearly = 1000 } };
        snprintf(pol.cron, sizeof pol.cron, "%s", "*/15 1-5 1,15 jan-mar mon-fri");
        assert_int_equal(ops->set_policy(h, "alice", "vol_2", &pol), 0);
        assert_int_equal(ops->get(h, "alice", "vol_2", &got), 0);
        assert_string_equal(got.policy.cron, pol.cron);
        assert_int_equal(got.policy.every_minutes, 0);
        assert_memory_equal(&got.policy.keep, &pol.keep, sizeof pol.keep);
        assert_int_equal(ops->backups_due(h, 500, 10, &due, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(due[0].policy.cron, pol.cron);
        free(due);
        assert_int_equal(ops->claim_backup(h, "vol_2", 500, 900), 0);
        assert_int_equal(ops->claim_backup(h, "vol_2", 500, 900), -EALREADY);
        assert_int_equal(ops->kept_by_counts(h, "", 10, &due, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(due[0].id, "vol_2");
        assert_int_equal(due[0].policy.keep.yearly, 1000);
        free(due);
        assert_int_equal(ops->kept_by_counts(h, "vol_2", 10, &due, &n), 0);
        assert_int_equal(n, 0);
        free(due);
        /* Keep counts alone: pruned, never due. */
        pol = (StoreVolumeBackupPolicy){ .keep = { .daily = 7 } };
        assert_int_equal(ops->set_policy(h, "alice", "vol_2", &pol), 0);
        assert_int_equal(ops->backups_due(h, 1000000, 10, &due, &n), 0);
        assert_int_equal(n, 0);
        free(due);
        assert_int_equal(ops->kept_by_counts(h, "", 10, &due, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(due[0].policy.cron, "");
        free(due);
        pol = (StoreVolumeBackupPolicy){ 0 };
        assert_int_equal(ops->set_policy(h, "alice", "vol_2", &pol), 0);

        /* One attachment goes, the writer's claim with it: another writer
         * gets in. */
        assert_int_equal(ops->detach(h, "vol_2", "sbx_live1"), -ENOENT);
        StoreVolume ex = volume_row("vol_x", "alice", "", 16, false, 9);
        assert_int_equal(ops->insert(h, &ex, &b), 0);
        StoreVolumeAttachment x1 = volume_attachment("vol_x", "sbx_live1", false),
                              x2 = volume_attachment("vol_x", "sbx_live2", false);
        assert_int_equal(ops->attach(h, "alice", &x1), 0);
        assert_int_equal(ops->attach(h, "alice", &x2), -EBUSY);
        assert_int_equal(ops->detach(h, "vol_x", "sbx_live1"), 0);
        assert_int_equal(ops->detach(h, "vol_x", "sbx_live1"), -ENOENT);
        assert_int_equal(ops->attach(h, "alice", &x2), 0);
}
