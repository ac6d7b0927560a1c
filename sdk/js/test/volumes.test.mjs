// runtime.volumes against the real daemon: create, get, list, resize (grow only), delete, and a
// sandbox that attaches one at its create. tests/integration/test_volumes.py runs this file.
import assert from "node:assert/strict";

import { ConflictError, InvalidRequestError, NotFoundError, Runtime, Sandbox } from "withruntime";

import { DRIVER, daemonTest } from "./env.mjs";

daemonTest("volumes: the published client's names, and an attach at create", async () => {
  const rt = new Runtime();
  const vol = await rt.volumes.create(32, { name: "js-vol", labels: { k: "v" } });
  try {
    assert.equal(vol.state, "ready");
    assert.deepEqual((await rt.volumes.get(vol.id)).labels, { k: "v" });
    assert.ok((await rt.volumes.list({ name: "js-vol" })).data.some((v) => v.id === vol.id));
    assert.equal((await rt.volumes.resize(vol.id, 48)).sizeMiB, 48);
    await assert.rejects(rt.volumes.resize(vol.id, 16), InvalidRequestError);
    const sbx = await Sandbox.create({ driver: DRIVER, volumes: [{ volumeId: vol.id, path: "/data" }] });
    try {
      assert.equal((await sbx.exec("echo js > /data/f && cat /data/f")).stdout, "js\n");
      await assert.rejects(rt.volumes.delete(vol.id), ConflictError);
      const b = await rt.volumes.backup(vol.id, { name: "js" });
      assert.deepEqual((await rt.volumes.backups(vol.id)).data.map((x) => x.id), [b.id]);
      assert.equal((await rt.volumes.getBackup(b.id)).volumeId, vol.id);
      const copy = await rt.volumes.restore(b.id);
      assert.equal((await sbx.exec("cat /data/f")).stdout, "js\n");
      await rt.volumes.delete(copy.id);
      assert.equal((await rt.volumes.deleteBackup(b.id)).deleted, true);
      const kept = await rt.volumes.backup(vol.id, { retentionDays: 2 });
      assert.ok(kept.expiresAt);
      await rt.volumes.deleteBackup(kept.id);
      const every = await rt.volumes.setBackupPolicy(vol.id, { everyMinutes: 30, retentionDays: 3 });
      assert.deepEqual(every.backupPolicy.schedule, { everyMinutes: 30 });
      const cron = await rt.volumes.setBackupPolicy(vol.id, { cron: "0 */6 * * *", keep: { daily: 7 } });
      assert.deepEqual(cron.backupPolicy.schedule, { cron: "0 */6 * * *" });
      assert.equal(cron.backupPolicy.keep.daily, 7);
      assert.equal((await rt.volumes.setBackupPolicy(vol.id, { noKeep: true })).backupPolicy.keep, null);
      assert.equal((await rt.volumes.setBackupPolicy(vol.id, { daily: false })).backupPolicy.enabled, false);
      const other = await Sandbox.create({ driver: DRIVER });
      try {
        const att = await rt.volumes.attach(vol.id, other.id, "/live", { readOnly: true });
        assert.equal((await rt.volumes.getAttachment(vol.id, att.id)).readOnly, true);
        assert.equal((await other.exec("cat /live/f")).stdout, "js\n");
        assert.equal((await rt.volumes.detach(vol.id, att.id)).state, "detached");
      } finally {
        await other.delete();
        other.close();
      }
    } finally {
      await sbx.delete();
      sbx.close();
    }
  } finally {
    await rt.volumes.delete(vol.id, { force: true });
  }
  await assert.rejects(rt.volumes.get(vol.id), NotFoundError);
  rt.close();
});
