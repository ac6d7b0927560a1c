"""Large transfers through the files API and what keeps them fast and safe:
a 100 MiB file streamed both ways and checked by hash, a client that stops
reading stalls its own download only, and (namespace driver) the pieces of
a sandbox start that the fast path changed: every cgroup joined, a fresh
layer per sandbox, the layer's loop device in direct I/O mode."""
from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from helpers import assert_error, host_pids, proc_cmdline

MiB = 1024 * 1024


def slices(data: bytes, size: int = MiB):
    view = memoryview(data)
    for o in range(0, len(data), size):
        yield view[o:o + size]


def put_streamed(sandbox, path: str, data: bytes) -> httpx.Response:
    return sandbox.api.put(f"/v1/sandboxes/{sandbox.id}/files/content", params={"path": path},
                           content=slices(data), headers={"Content-Length": str(len(data))})


def names(sandbox, path: str = "/workspace") -> list[str]:
    """The names in path but the interpreter's own directory, which its kernel's start ahead makes
    in /workspace at a time of its own after the create (docs/interpreter.md)."""
    r = sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/files/list", params={"path": path})
    assert r.status_code == 200, r.text
    return sorted(e["name"] for e in r.json()["data"] if not (path == "/workspace" and e["name"] == ".runtime"))


def test_100mib_round_trip_by_hash(sandbox):
    data = os.urandom(100 * MiB)
    want = hashlib.sha256(data).hexdigest()
    r = put_streamed(sandbox, "/workspace/big.bin", data)
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/workspace/big.bin", "size": len(data)}
    h, n = hashlib.sha256(), 0
    with sandbox.api.stream("GET", f"/v1/sandboxes/{sandbox.id}/files/content",
                            params={"path": "/workspace/big.bin"}) as resp:
        assert resp.status_code == 200
        assert resp.headers.get("content-length") == str(len(data))
        for chunk in resp.iter_raw():
            h.update(chunk)
            n += len(chunk)
    assert n == len(data)
    assert h.hexdigest() == want
    # what the sandbox itself reads is the same, and no temporary file is left
    assert sandbox.run("sha256sum /workspace/big.bin | cut -d' ' -f1").strip() == want
    assert names(sandbox) == ["big.bin"]


def test_overwrite_of_a_large_file_is_whole(sandbox):
    a, b = os.urandom(24 * MiB), os.urandom(8 * MiB)
    assert put_streamed(sandbox, "/workspace/f.bin", a).status_code == 200
    assert put_streamed(sandbox, "/workspace/f.bin", b).status_code == 200
    assert sandbox.read("/workspace/f.bin") == b


@pytest.mark.microvm_subset
def test_upload_cut_short_leaves_the_target_untouched(sandbox):
    old = os.urandom(MiB)
    sandbox.write("/workspace/keep.bin", old)
    data = os.urandom(16 * MiB)

    def short():
        yield from slices(data[:8 * MiB])
        raise RuntimeError("client gives up")
    with pytest.raises(Exception):
        sandbox.api.put(f"/v1/sandboxes/{sandbox.id}/files/content", params={"path": "/workspace/keep.bin"},
                        content=short(), headers={"Content-Length": str(len(data))})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if names(sandbox) == ["keep.bin"]:
            break
        time.sleep(0.2)
    assert names(sandbox) == ["keep.bin"], "a temporary file was left"
    assert sandbox.read("/workspace/keep.bin") == old


def test_slow_reader_stalls_only_its_own_stream(sandbox):
    """A download nobody reads fills its window and stops there: the channel
    it shares with every other operation of the sandbox keeps moving."""
    data = os.urandom(48 * MiB)
    assert put_streamed(sandbox, "/workspace/slow.bin", data).status_code == 200
    reader = httpx.Client(base_url=sandbox.api.daemon.base_url, timeout=60,
                          headers={"Authorization": f"Bearer {sandbox.api.daemon.api_key}"})
    try:
        with reader.stream("GET", f"/v1/sandboxes/{sandbox.id}/files/content",
                           params={"path": "/workspace/slow.bin"}) as resp:
            assert resp.status_code == 200
            it = resp.iter_raw(64 * 1024)
            h = hashlib.sha256(next(it))
            # Stalled: socket buffers and the stream's window fill up.
            time.sleep(1.5)
            t = time.monotonic()
            for i in range(5):
                assert sandbox.run(f"echo {i}") == f"{i}\n"
            small = os.urandom(256 * 1024)
            sandbox.write("/workspace/small.bin", small)
            assert sandbox.read("/workspace/small.bin") == small
            assert time.monotonic() - t < 10, "other operations waited for the stalled download"
            for chunk in it:
                h.update(chunk)
        assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    finally:
        reader.close()


def test_concurrent_uploads_do_not_mix(sandbox):
    blobs = {f"/workspace/c{i}.bin": os.urandom((4 + i) * MiB) for i in range(4)}
    errors = []

    def up(path, data):
        try:
            r = put_streamed(sandbox, path, data)
            if r.status_code != 200:
                errors.append(r.text)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    threads = [threading.Thread(target=up, args=kv) for kv in blobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for path, data in blobs.items():
        assert sandbox.read(path) == data


# ---------------------------------------------------------------------------
# The namespace driver's start


def _namespace(api, daemon):
    from helpers import skip_unless_driver
    skip_unless_driver(daemon, "namespace")
    return api.create_sandbox(driver="namespace")


def test_sandbox_processes_are_in_every_cgroup(api, daemon):
    sbx = _namespace(api, daemon)
    # Its supervisor (which names it on its command line) is the daemon's, outside: a freeze of
    # the sandbox must not stop it (docs/lifecycle.md, "Live restore").
    pids = [p for p in host_pids(sbx.id) if not proc_cmdline(p)[:1] or
            not proc_cmdline(p)[0].endswith("runtime-supervisor")]
    assert pids, "no host process of the sandbox found"
    # The agent is the sandbox's init; bwrap its parent. Both were created in
    # or moved into the sandbox's cgroup before they ran anything.
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            continue
        by_hier = {}
        for line in lines:
            _, ctrls, path = line.split(":", 2)
            for c in (ctrls.split(",") if ctrls else [""]):
                by_hier[c] = path
        v2_only = set(by_hier) == {""}
        wanted = [""] if v2_only else ["memory", "cpu", "pids", "freezer"]
        if not v2_only and Path("/sys/fs/cgroup/unified").is_dir():
            wanted.append("")
        for c in wanted:
            assert sbx.id in by_hier.get(c, ""), f"pid {pid} not in the sandbox's {c or 'v2'} cgroup: {lines}"


def test_each_sandbox_gets_a_fresh_layer(api, daemon):
    """Layers come from a synced copy of an empty filesystem made ahead of
    time: every sandbox still starts with nothing of the others'."""
    seen = []
    for i in range(4):
        sbx = _namespace(api, daemon)
        assert names(sbx) == [], f"sandbox {i} did not start empty"
        sbx.write("/workspace/mine.txt", sbx.id.encode())
        assert sbx.run("df -P / | tail -1 | awk '{print $2}'").strip().isdigit()
        seen.append(sbx)
    for sbx in seen:
        assert sbx.read("/workspace/mine.txt") == sbx.id.encode()


def _loop_of(sandbox_dir_part: str) -> Path | None:
    for dev in Path("/sys/block").glob("loop*"):
        try:
            backing = (dev / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if sandbox_dir_part in backing:
            return dev
    return None


def test_layer_loop_device_uses_direct_io(api, daemon):
    sbx = _namespace(api, daemon)
    dev = _loop_of(f"/{sbx.id}/layer.img")
    if dev is None:
        pytest.skip("the sandbox has no loop-backed layer here (tmpfs fallback)")
    assert (dev / "loop" / "dio").read_text().strip() == "1"
    # and the data written inside is durable where the agent says so
    data = os.urandom(20 * MiB)
    assert put_streamed(sbx, "/workspace/d.bin", data).status_code == 200
    assert sbx.read("/workspace/d.bin") == data


def test_upload_to_unknown_sandbox_is_404(api):
    r = api.put("/v1/sandboxes/sbx_00000000000000000000/files/content", params={"path": "/workspace/x"},
                content=slices(b"x" * MiB), headers={"Content-Length": str(MiB)})
    assert_error(r, 404, "not_found")
