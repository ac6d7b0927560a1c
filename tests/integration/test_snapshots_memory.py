"""Memory snapshots (`:snapshot` with mode "memory", `:fork` with mode "memory"): on the microVM the
running machine is saved with its disk (QEMU's migration to a file), on gVisor the Sentry's kernel
(runsc checkpoint), and a create from it resumes the same processes on a copy of the disk (a
counter kept in a shell's memory counts on from where it was, not from 1), with its own id, agent
channel and randomness (the microVM's kernel RNG reseeded and its hostname the copy's id; gVisor's
Sentry draws from the host afresh, its hostname the spec's); two copies diverge. A paused source
stays paused, a stopped one has no memory to keep (409), a copy must have the snapshot's shape
(400). namespace refuses the mode (501, the hint naming disk). The published client's
sbx.snapshot(mode="memory") and Sandbox.create(snapshot=...) work on both too.

Every create from a memory snapshot loads the saved guest under QEMU; under TCG on a loaded host
that takes seconds, so the bounds here are minutes."""
from __future__ import annotations

import time

import pytest

from helpers import assert_error, wait_until

# A loop whose count lives only in its shell's memory: a restarted process would count from 1.
COUNTER = ("i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; "
           "sleep 0.1; done")
# The microVM's shape these tests share (one template, one saved guest size).
SHAPE = {"memoryMiB": 256, "diskMiB": 64}
BOUND = 300  # seconds: a boot or a load under TCG on a loaded host
# The drivers that keep memory, and the files of their snapshots.
MEMORY_FILES = {"microvm": {"memory", "upper.ext4", "initrd.cpio", "machine"},
                "gvisor": {"checkpoint.img", "layer.img", "machine"}}


def start_counter(api, sbx) -> str:
    r = api.post(f"/v1/sandboxes/{sbx.id}/processes", json={"command": COUNTER})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def count(api, sid: str) -> int:
    out = api.exec(sid, command="cat /workspace/n 2>/dev/null || echo 0")["stdout"].strip()
    return int(out or 0)


def snapshot(api, sid: str, status: int = 201, **body) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}:snapshot", json=body)
    assert r.status_code == status, r.text
    return r.json()


def counting_on(api, sid: str, floor: int) -> int:
    """The copy's count is at least what the source had counted (its loop carried on, not
    restarted), then grows past it: the same process runs."""
    first = count(api, sid)
    assert first >= floor, f"the count restarted: {first} < {floor}"
    return wait_until(lambda: (n := count(api, sid)) > first and n, BOUND, 0.5,
                      what=f"the copy's counter passed {first}")


def hostname(driver: str, sid: str) -> str:
    """What a copy's hostname is: the microVM's agent sets the copy's id; every gVisor sandbox has
    its OCI spec's."""
    return sid if driver == "microvm" else "sandbox"


def random_bytes(api, sid: str) -> str:
    return api.exec(sid, command="head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")["stdout"]


@pytest.fixture
def counting(api, driver):
    """A running sandbox with the counter going and a file written before any snapshot."""
    sbx = api.create_sandbox(driver=driver, timeoutSeconds=1800, **(SHAPE if driver == "microvm" else {}))
    sbx.exec("echo before > /workspace/before.txt")
    start_counter(api, sbx)
    wait_until(lambda: count(api, sbx.id) >= 3, BOUND, 0.5, what="the counter reached 3")
    return sbx


@pytest.mark.microvm_subset
def test_memory_snapshot_resumes_the_running_machine(api, driver, counting):
    sbx = counting
    if driver not in MEMORY_FILES:
        err = assert_error(api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={"mode": "memory"}), 501,
                           "not_implemented", mentions=driver)
        assert "disk" in err["hint"], err
        assert_error(api.post(f"/v1/sandboxes/{sbx.id}:fork", json={"mode": "memory"}), 501, "not_implemented")
        assert api.sandbox(sbx.id)["state"] == "running"
        return
    t0 = time.monotonic()
    snap = snapshot(api, sbx.id, mode="memory", name="live")
    took = time.monotonic() - t0
    at = count(api, sbx.id)
    assert snap["mode"] == "memory" and snap["state"] == "ready" and snap["driver"] == driver, snap
    # The saved memory and the disk are both kept and billed.
    files = {p.name: p.stat().st_blocks * 512 for p in (api.daemon.state_dir / "snapshots" / snap["id"]).iterdir()}
    assert MEMORY_FILES[driver] <= set(files), files
    saved = files["memory" if driver == "microvm" else "checkpoint.img"]
    assert snap["sizeBytes"] >= saved > 0, (snap, files)
    # The source carries on where it was.
    assert api.sandbox(sbx.id)["state"] == "running"
    counting_on(api, sbx.id, at)
    sbx.exec("echo after > /workspace/after.txt")

    t1 = time.monotonic()
    copy = api.create_sandbox(snapshot=snap["id"], timeoutSeconds=900)
    restored = time.monotonic() - t1
    assert copy["driver"] == driver and copy["memoryMiB"] == (SHAPE["memoryMiB"] if driver == "microvm" else
                                                               sbx["memoryMiB"]), copy
    counting_on(api, copy.id, 3)
    out = copy.exec("cat /workspace/before.txt; test -e /workspace/after.txt && echo has-after; hostname")
    assert out["stdout"] == f"before\n{hostname(driver, copy.id)}\n", out
    # The copy's command channel is its own: new commands, files and processes work.
    copy.exec("echo mine > /workspace/before.txt")
    assert sbx.exec("cat /workspace/before.txt")["stdout"] == "before\n"
    r = api.post(f"/v1/sandboxes/{copy.id}/processes", json={"command": "echo fresh"})
    assert r.status_code == 201, r.text
    # The source's process list is its own; the copy knows none of the source's processes.
    assert api.get(f"/v1/sandboxes/{copy.id}/processes").json()["data"][0]["command"] == "echo fresh"
    print(f"memory snapshot {took:.1f} s, create from it {restored:.1f} s, {snap['sizeBytes']} bytes")


def test_memory_fork_copies_diverge(api, driver, counting):
    if driver not in MEMORY_FILES:
        pytest.skip("namespace keeps no memory; the 501 is tested above")
    src = counting
    at = count(api, src.id)
    r = api.post(f"/v1/sandboxes/{src.id}:fork", json={"count": 2, "mode": "memory", "name": "twin"})
    assert r.status_code == 201, r.text
    copies = [c["id"] for c in r.json()["sandboxes"]]
    api.created.extend(copies)
    assert len(set(copies)) == 2 and [c["name"] for c in r.json()["sandboxes"]] == ["twin-1", "twin-2"]
    for c in copies:
        counting_on(api, c, at)
        assert api.exec(c, command="hostname")["stdout"] == f"{hostname(driver, c)}\n"
    # Their randomness is their own (the microVM's kernel RNGs reseeded apart, gVisor's Sentry
    # reading the host's); their files go their own ways.
    assert random_bytes(api, copies[0]) != random_bytes(api, copies[1])
    for i, c in enumerate(copies):
        api.exec(c, command=f"echo {i} > /workspace/who")
    assert [api.exec(c, command="cat /workspace/who")["stdout"] for c in copies] == ["0\n", "1\n"]
    assert api.exec(src.id, command="test -e /workspace/who || echo none")["stdout"] == "none\n"
    assert api.sandbox(src.id)["state"] == "running"
    assert api.get("/v1/snapshots", params={"sandboxId": src.id}).json()["data"] == []


def test_memory_snapshot_of_paused_and_stopped(api, driver):
    if driver not in MEMORY_FILES:
        pytest.skip("namespace keeps no memory")
    sbx = api.create_sandbox(driver=driver, timeoutSeconds=1800, **(SHAPE if driver == "microvm" else {}))
    start_counter(api, sbx)
    wait_until(lambda: count(api, sbx.id) >= 3, BOUND, 0.5, what="the counter reached 3")
    assert api.post(f"/v1/sandboxes/{sbx.id}:pause", json={}).status_code == 200
    snap = snapshot(api, sbx.id, mode="memory")
    assert api.sandbox(sbx.id)["state"] == "paused"   # a paused source stays paused
    # A copy must have the shape the machine was saved with.
    assert_error(api.post("/v1/sandboxes", json={"snapshot": snap["id"], "memoryMiB": sbx["memoryMiB"] * 2}), 400,
                 "invalid_request", mentions="memoryMiB")
    assert_error(api.post("/v1/sandboxes", json={"snapshot": snap["id"], "vcpu": 2}), 400, mentions="vcpu")
    copy = api.create_sandbox(snapshot=snap["id"])
    counting_on(api, copy.id, 3)
    woke = api.post(f"/v1/sandboxes/{sbx.id}:wake", json={})
    assert woke.status_code == 200, woke.text
    counting_on(api, sbx.id, 3)
    assert api.post(f"/v1/sandboxes/{sbx.id}:stop", json={}).status_code == 200
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={"mode": "memory"}), 409, "conflict",
                 mentions="stopped")
    # The copy, stopped and woken, boots from its disk like any sandbox.
    assert api.post(f"/v1/sandboxes/{copy.id}:stop", json={}).status_code == 200
    assert api.post(f"/v1/sandboxes/{copy.id}:wake", json={}).status_code == 200
    assert api.exec(copy.id, command="pgrep -f '[w]hile :' >/dev/null || echo none")["stdout"] == "none\n"


def test_published_client_memory_snapshot(published_client, daemon, api, driver):
    if driver not in MEMORY_FILES:
        pytest.skip("namespace keeps no memory; the published client's 501 is in "
                    "test_published_client_snapshots.py")
    sbx = api.create_sandbox(driver=driver, timeoutSeconds=1800, **(SHAPE if driver == "microvm" else {}))
    start_counter(api, sbx)
    wait_until(lambda: count(api, sbx.id) >= 3, BOUND, 0.5, what="the counter reached 3")
    got = published_client.run_json(daemon, """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
snap = sbx.snapshot(mode="memory", name="pub-memory")
copy = Sandbox.create(snapshot=snap["id"])
print(json.dumps({"snap": snap, "copy": copy.id, "state": sbx.refresh().state}))
""", args=[sbx.id], timeout=2 * BOUND)
    api.created.append(got["copy"])
    assert got["snap"]["mode"] == "memory" and got["snap"]["state"] == "ready", got
    assert got["state"] == "running", got
    counting_on(api, got["copy"], 3)


def test_memory_snapshot_survives_a_daemon_restart(fresh_daemon, fresh_api, driver):
    if driver != "gvisor":
        pytest.skip("runs on gVisor; the microVM's saved guests across a restart are not covered here yet")
    api = fresh_api
    sbx = api.create_sandbox(driver=driver, timeoutSeconds=1800)
    sbx.exec("echo kept > /workspace/kept")
    start_counter(api, sbx)
    wait_until(lambda: count(api, sbx.id) >= 3, BOUND, 0.5, what="the counter reached 3")
    snap = snapshot(api, sbx.id, mode="memory")
    fresh_daemon.restart()
    assert api.sandbox(sbx.id)["state"] == "stopped"
    assert api.get(f"/v1/snapshots/{snap['id']}").json()["mode"] == "memory"
    copy = api.create_sandbox(snapshot=snap["id"])
    counting_on(api, copy.id, 3)
    assert copy.exec("cat /workspace/kept")["stdout"] == "kept\n"


def test_gvisor_deleted_file_held_open(api, driver, counting):
    """A file a process holds open after it was deleted: the pinned runsc saves it with the
    kernel, and the copy's process reads it on; runsc 20240729 (the fallback where Go is missing)
    cannot (its restore opens files by name), so there the snapshot is a 409 saying so, nothing is
    kept, the sandbox carries on, and once the file is closed the snapshot is taken."""
    if driver != "gvisor":
        pytest.skip("runsc checkpoint's own")
    sbx = counting
    holder = ("exec python3 -c \"import os, tempfile, time\n"
              "f = tempfile.TemporaryFile(dir='/workspace'); f.write(b'x' * 4096); f.flush()\n"
              "while True:\n"
              "    f.seek(0); n = len(f.read())\n"
              "    open('/workspace/held.tmp', 'w').write(str(n)); os.replace('/workspace/held.tmp', '/workspace/held')\n"
              "    time.sleep(0.2)\"")
    r = api.post(f"/v1/sandboxes/{sbx.id}/processes", json={"command": holder})
    assert r.status_code == 201, r.text
    pid = r.json()["id"]
    wait_until(lambda: sbx.exec("cat /workspace/held 2>/dev/null")["stdout"] == "4096", BOUND, 0.5,
               what="the deleted file held open")
    r = api.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={"mode": "memory"})
    if r.status_code == 201:
        snap = r.json()
        copy = api.create_sandbox(snapshot=snap["id"])
        api.exec(copy.id, command="rm -f /workspace/held")
        wait_until(lambda: api.exec(copy.id, command="cat /workspace/held 2>/dev/null")["stdout"] == "4096",
                   BOUND, 0.5, what="the copy's process reading the deleted file")
        counting_on(api, sbx.id, count(api, sbx.id))
        return
    err = assert_error(r, 409, "conflict", mentions="deleted file")
    assert "disk" in err["hint"], err
    assert api.get("/v1/snapshots", params={"sandboxId": sbx.id}).json()["data"] == []
    counting_on(api, sbx.id, count(api, sbx.id))
    r = api.post(f"/v1/sandboxes/{sbx.id}/processes/{pid}:signal", json={"signal": "KILL"})
    assert r.status_code == 200, r.text
    r = api.post(f"/v1/sandboxes/{sbx.id}/processes/{pid}:wait", json={"timeoutMs": 60000})
    assert r.status_code == 200 and r.json()["state"] != "running", r.text
    assert snapshot(api, sbx.id, mode="memory")["mode"] == "memory"


def test_gvisor_memory_snapshot_of_another_runsc_or_damaged_is_not_restored(api, driver, counting):
    """A saved kernel is restored only by the runsc, agent, image and shape it was saved with
    (its snapshot's machine file says which): one that does not match fails the create with the
    reason, and the copy is recorded failed rather than booted without its processes; so does a
    damaged image, without waiting."""
    if driver != "gvisor":
        pytest.skip("gVisor's description of a saved kernel")
    snap = snapshot(api, counting.id, mode="memory")
    machine = api.daemon.state_dir / "snapshots" / snap["id"] / "machine"
    machine.write_text(machine.read_text().replace("version=", "version=0.0~19700101."))
    err = assert_error(api.post("/v1/sandboxes", json={"snapshot": snap["id"]}), 503, "unavailable",
                       mentions="another runsc")
    failed = [s for s in api.get("/v1/sandboxes", params={"state": "failed"}).json()["data"]
              if "another runsc" in (s.get("failureReason") or "")]
    assert failed, err
    api.created.extend(s["id"] for s in failed)
    machine.write_text(machine.read_text().replace("version=0.0~19700101.", "version="))
    # A damaged image: runsc restore fails, and the create with it, at once.
    image = machine.parent / "checkpoint.img"
    saved = image.read_bytes()
    with open(image, "r+b") as f:
        f.truncate(len(saved) // 2)
    assert_error(api.post("/v1/sandboxes", json={"snapshot": snap["id"]}), 503, "unavailable",
                 mentions="could not be restored")
    api.created.extend(s["id"] for s in api.get("/v1/sandboxes", params={"state": "failed"}).json()["data"])
    with open(image, "r+b") as f:
        f.write(saved)
    # The snapshot as it was taken still restores.
    copy = api.create_sandbox(snapshot=snap["id"])
    counting_on(api, copy.id, 3)
