"""Conformance: the published withruntime client (0.35.0, in a venv of its own) takes snapshots
with sbx.snapshot() (mode disk, and mode memory: kept on gVisor and the microVM, refused in the API's
error shape on namespace), starts a
sandbox from one with Sandbox.create(snapshot=...), lists, reads, renames, extends and deletes
them through runtime.snapshots, and forks with sbx.fork() and sbx.fork(count). The source is made
by the suite (the published create has no driver field) and attached to with Sandbox.connect."""
from __future__ import annotations


PRELUDE = """
import json, sys
from withruntime import Runtime, Sandbox
sbx = Sandbox.connect(sys.argv[1])
runtime = Runtime()
"""


def test_snapshot_create_from_it_and_manage(pub, api, driver):
    sbx = api.create_sandbox(driver=driver, timeoutSeconds=600)
    got = pub(PRELUDE + """
sbx.files.write("/workspace/kept.txt", "from the published client")
snap = sbx.snapshot(mode="disk", name="pub", labels={"a": "b"}, retention_days=2)
default = sbx.snapshot()
state_after = sbx.refresh().state if hasattr(sbx, "refresh") else None
try:
    live = sbx.snapshot(mode="memory")
    memory = {"mode": live["mode"], "state": live["state"]}
    runtime.snapshots.delete(live["id"])
except Exception as e:
    memory = {"code": getattr(e, "code", None), "status": getattr(e, "status", None), "message": str(e)}
copy = Sandbox.create(snapshot=snap["id"])
text = copy.files.read("/workspace/kept.txt")
text = text.decode() if isinstance(text, bytes) else text
copy.delete()
listed = [s["id"] for s in runtime.snapshots.list(sandbox_id=sbx.id)]
got = runtime.snapshots.get(snap["id"])
renamed = runtime.snapshots.update(snap["id"], name="renamed")
extended = runtime.snapshots.extend(snap["id"], 30)
runtime.snapshots.delete(snap["id"])
runtime.snapshots.delete(default["id"])
try:
    runtime.snapshots.get(snap["id"])
    gone = False
except Exception as e:
    gone = getattr(e, "code", None) == "not_found"
print(json.dumps({"snap": snap, "default_mode": default["mode"], "state_after": state_after,
                  "memory": memory, "text": text, "listed": listed, "got": got["id"],
                  "renamed": renamed["name"], "retention": extended["retentionDays"], "gone": gone}))
""", sbx.id)
    snap = got["snap"]
    assert snap["state"] == "ready" and snap["mode"] == "disk" and snap["name"] == "pub", snap
    assert got["default_mode"] == "disk" and got["state_after"] == "running", got
    if driver == "namespace":
        assert got["memory"]["code"] == "not_implemented" and got["memory"]["status"] == 501, got
    else:
        assert got["memory"] == {"mode": "memory", "state": "ready"}, got
    assert got["text"] == "from the published client", got
    assert snap["id"] in got["listed"] and got["got"] == snap["id"], got
    assert got["renamed"] == "renamed" and got["retention"] >= 30 and got["gone"], got


def test_fork(pub, api, driver):
    sbx = api.create_sandbox(driver=driver, timeoutSeconds=600)
    got = pub(PRELUDE + """
sbx.files.write("/workspace/state", "prepared")
one = sbx.fork()
many = sbx.fork(2, name="try", labels={"k": "v"})
out = []
for c in [one, *many]:
    t = c.files.read("/workspace/state")
    out.append({"id": c.id, "text": t.decode() if isinstance(t, bytes) else t})
    c.delete()
print(json.dumps({"copies": out, "single": not isinstance(one, list), "n": len(many)}))
""", sbx.id)
    assert got["single"] and got["n"] == 2, got
    assert [c["text"] for c in got["copies"]] == ["prepared"] * 3, got
    assert len({c["id"] for c in got["copies"]}) == 3
