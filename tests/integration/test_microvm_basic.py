"""The microVM driver through the real daemon: each sandbox its own guest
kernel under QEMU (TCG on hosts where KVM does not boot a guest, as here).

The default suite runs exec, files, a timeout, a limit (diskMiB), the guest's
own kernel, delete and a daemon restart; the 20 consecutive cold boots are
marked slow. A boot under TCG takes several seconds, so every test here
shares as few sandboxes as it can.

A sandbox's first start restores its shape's template (a guest saved once
per image, agent and shape) unless the daemon runs with
RUNTIME_MICROVM_SNAPSHOTS=0: the `cold_api` tests boot every guest.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import time
import uuid

import pytest

from conftest import _finish_daemon, _start_daemon, need_microvm_parts
from helpers import (assert_no_cgroups, assert_no_host_trace, cgroup_dirs, host_pids, proc_cmdline,
                     proc_uid, skip_unless_driver)

DRIVER = "microvm"
# Cold boots in a row: a few by default (each takes 5-10 s under TCG), twenty
# with RUNTIME_TEST_ALL=1.
COLD_BOOTS = 20 if os.environ.get("RUNTIME_TEST_ALL") == "1" else 5


def _need_microvm(d, build_dir):
    skip_unless_driver(d, DRIVER)
    need_microvm_parts(build_dir, d.image_dir)


@pytest.fixture
def mvm_api(api, daemon, build_dir):
    _need_microvm(daemon, build_dir)
    return api


@pytest.fixture
def cold_api(build_dir, image_dir, tmp_path):
    """A daemon of its own that boots every guest (no templates)."""
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-cold",
                      extra_env={"RUNTIME_MICROVM_SNAPSHOTS": "0"})
    try:
        _need_microvm(d, build_dir)
        with d.client() as api:
            yield api
    finally:
        _finish_daemon(d)


def _vmm_log(d, sid: str) -> str:
    p = d.state_dir / "sandboxes" / sid / "vmm.log"
    return p.read_text(errors="replace") if p.exists() else ""


def _template_of(d, sid: str, image_dir):
    """The template a sandbox was restored from, by its log."""
    import re
    m = re.search(r"restoring from template ([0-9a-f]{16})", _vmm_log(d, sid))
    assert m, _vmm_log(d, sid)
    return image_dir / "default" / "microvm" / "templates" / m.group(1)


def _template_dirs(image_dir, mem: int, disk: int) -> list:
    root = image_dir / "default" / "microvm" / "templates"
    if not root.is_dir():
        return []
    return [t for t in root.iterdir() if (t / "key").exists()
            and f" mem={mem} disk={disk} " in (t / "key").read_text()]


def _vmm_pids(sid: str) -> list[int]:
    return [p for p in host_pids(sid) if any("qemu-system" in a for a in proc_cmdline(p)[:1])]


def test_exec_files_timeout_and_own_kernel(mvm_api):
    sbx = mvm_api.create_sandbox(driver=DRIVER, memoryMiB=512, diskMiB=256)
    assert sbx.driver == DRIVER

    res = sbx.exec("echo out; echo err >&2; exit 3")
    assert (res["exitCode"], res["stdout"], res["stderr"]) == (3, "out\n", "err\n"), res

    # Its own kernel: not the host's.
    guest = sbx.run("uname -r").strip()
    assert guest and guest != os.uname().release, guest
    assert os.uname().release not in sbx.run("cat /proc/version")

    # Files through the API, and seen by commands.
    data = uuid.uuid4().bytes * 1000
    sbx.write("/workspace/sub/blob.bin", data)
    assert sbx.read("/workspace/sub/blob.bin") == data
    assert sbx.run("wc -c < /workspace/sub/blob.bin").strip() == str(len(data))

    # A timeout is a result, and the guest's process group is gone after it.
    t0 = time.monotonic()
    res = sbx.exec("sleep 30", timeoutMs=1500)
    assert res["timedOut"] is True, res
    assert time.monotonic() - t0 < 20
    assert sbx.run("pgrep -x sleep || echo none").strip() == "none"

    # The VMM runs unprivileged and without a network device in the guest.
    vmm = _vmm_pids(sbx.id)
    assert vmm, f"no QEMU process for {sbx.id}: {host_pids(sbx.id)}"
    assert all(proc_uid(p) not in (0, None) for p in vmm), [(p, proc_uid(p)) for p in vmm]
    assert sbx.run("ls /sys/class/net").split() == ["lo"]


def test_missing_image_part_fails_fast_with_its_reason(build_dir, tmp_path):
    """An image without its microVM parts: the create fails at once (no
    builder runs inside it) and says what to do, in the error's message and
    the sandbox's failureReason, without a host path."""
    images = tmp_path / "images"
    (images / "default" / "rootfs").mkdir(parents=True)
    (images / "default" / "built-at").write_text("2026-01-01T00:00:00Z\n")
    d = _start_daemon(build_dir, images, tmp_path / "state", f"runtime-test-{os.getpid()}-noparts")
    try:
        skip_unless_driver(d, DRIVER)
        with d.client() as api:
            t0 = time.monotonic()
            r = api.post("/v1/sandboxes", json={"driver": DRIVER, "memoryMiB": 256})
            took = time.monotonic() - t0
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert err["code"] == "unavailable"
            assert "runtime image build" in err["message"], err
            assert "microVM" in err["message"], err
            assert str(tmp_path) not in r.text and "/microvm/" not in r.text, r.text
            # A builder would take minutes; a refusal takes no boot at all.
            assert took < 30, took
            listed = api.get("/v1/sandboxes").json()
            rows = listed.get("sandboxes", listed.get("data", []))
            failed = [x for x in rows if x.get("state") == "failed"]
            assert len(failed) == 1, listed
            reason = api.sandbox(failed[0]["id"])["failureReason"]
            assert "runtime image build" in reason, reason
            assert str(tmp_path) not in reason, reason
            assert not (images / "default" / "microvm").exists()
    finally:
        _finish_daemon(d)


@pytest.mark.slow
def test_image_build_makes_the_microvm_parts(build_dir, tmp_path):
    """The image build runs runtime-microvm-build (found beside the image
    builder) after the root filesystem's, so creates never have to. A small
    root filesystem stands in for debootstrap's; the kernel is Debian's."""
    img = tmp_path / "images" / "default"
    (img / "rootfs" / "etc").mkdir(parents=True)
    (img / "rootfs" / "etc" / "hostname").write_text("sandbox\n")
    script = (build_dir / "runtime-image-build").read_bytes()
    # The recipe's hash as images/build.sh takes it: the script, then the base packages, the
    # default recipe's own, the pinned PyPI ones and the pinned Deno, a line each, then the MCP
    # servers' pins (found beside the builder).
    lists = [re.search(rb'^%s="(.*)"$' % name, script, re.M).group(1)
             for name in (b"PACKAGES", b"DEFAULT_PACKAGES", b"PIP_PACKAGES", b"DENO_PACKAGE")]
    pins = b"".join((build_dir / "mcp" / f).read_bytes() for f in ("requirements.txt", "package-lock.json"))
    (img / "recipe.sha256").write_text(
        hashlib.sha256(script + b"".join(x + b"\n" for x in lists) + pins).hexdigest() + "\n")
    (img / "built-at").write_text("2026-01-01T00:00:00Z\n")
    assert subprocess.run([str(build_dir / "runtime-image-build"), "--check", str(img.parent), "default"]
                          ).returncode == 0
    d = _start_daemon(build_dir, img.parent, tmp_path / "state", f"runtime-test-{os.getpid()}-imgbuild")
    try:
        skip_unless_driver(d, DRIVER)
        with d.client(timeout=1500) as api:
            r = api.post("/v1/images/default:build")
            assert r.status_code == 200, r.text
            events = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    finally:
        _finish_daemon(d)
    assert events and events[-1]["type"] == "done", events[-10:]
    assert any("runtime-microvm-build: kernel" in e.get("line", "") for e in events), events
    for part in ("vmlinuz", "root.ext4", "root.stamp", "modules"):
        assert (img / "microvm" / part).exists(), part
    assert subprocess.run([str(build_dir / "runtime-microvm-build"), "--check", str(img.parent), "default"]
                          ).returncode == 0


def test_disk_limit(cold_api):
    """A booted guest (no template): the cold path stays in the default
    suite."""
    sbx = cold_api.create_sandbox(driver=DRIVER, memoryMiB=256, diskMiB=64)
    assert "restored" not in _vmm_log(cold_api.daemon, sbx.id)
    res = sbx.exec("dd if=/dev/zero of=/workspace/big bs=1M count=256; sync")
    assert res["exitCode"] != 0 or "No space left" in res["stderr"], res
    assert "No space left" in res["stderr"], res
    # The sandbox is still usable once the file is gone.
    sbx.run("rm -f /workspace/big")
    assert sbx.run("echo fine") == "fine\n"


def test_stop_and_delete_leave_nothing(mvm_api, daemon):
    sbx = mvm_api.create_sandbox(driver=DRIVER, memoryMiB=256, diskMiB=64)
    sbx.write("/workspace/keep.txt", b"kept")
    assert _vmm_pids(sbx.id)
    assert cgroup_dirs(sbx.id)
    r = mvm_api.post(f"/v1/sandboxes/{sbx.id}:stop")
    assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
    assert_no_host_trace(sbx.id)
    assert_no_cgroups(sbx.id)
    r = mvm_api.delete(f"/v1/sandboxes/{sbx.id}")
    assert r.status_code == 200, r.text
    left = [str(p) for p in daemon.state_dir.rglob(f"*{sbx.id}*")]
    assert not left, f"files of a deleted microVM left in the state dir: {left}"


def test_daemon_restart(fresh_daemon, fresh_api, build_dir):
    _need_microvm(fresh_daemon, build_dir)
    sbx = fresh_api.create_sandbox(driver=DRIVER, memoryMiB=256, diskMiB=64)
    sbx.write("/workspace/keep.txt", b"kept")
    vmm = _vmm_pids(sbx.id)
    assert vmm
    fresh_daemon.kill()
    fresh_daemon.start()
    api = fresh_daemon.client()
    try:
        st = api.get(f"/v1/sandboxes/{sbx.id}").json()
        assert st["state"] in ("stopped", "failed", "running"), st
        if st["state"] != "running":
            # The orphaned VMM was reaped: no QEMU, no cgroup.
            assert_no_host_trace(sbx.id, timeout=30)
            assert_no_cgroups(sbx.id)
        r = api.post("/v1/sandboxes", json={"driver": DRIVER, "memoryMiB": 256, "diskMiB": 64})
        assert r.status_code == 201, r.text
        new = r.json()["id"]
        r = api.post(f"/v1/sandboxes/{new}:exec", json={"command": "echo fine"})
        assert r.status_code == 200 and r.json()["stdout"] == "fine\n", r.text
        for sid in (sbx.id, new):
            assert api.delete(f"/v1/sandboxes/{sid}").status_code == 200
            assert_no_host_trace(sid)
            assert_no_cgroups(sid)
    finally:
        api.close()


def test_restored_sandboxes_are_their_own(mvm_api, daemon, image_dir):
    """Two sandboxes of one shape restored from the same saved guest: each
    has its own hostname, clock, kernel randomness and disk."""
    probe = ("hostname; cat /proc/sys/kernel/random/boot_id; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; "
             "echo; python3 -c 'import os; print(os.urandom(16).hex())'; date +%s.%N")
    seen = []
    for _ in range(2):
        sbx = mvm_api.create_sandbox(driver=DRIVER, memoryMiB=256, diskMiB=64)
        assert "restored from a template" in _vmm_log(daemon, sbx.id), _vmm_log(daemon, sbx.id)
        host_now = time.time()
        out = sbx.run(probe).split("\n")
        seen.append((sbx, out))
        assert out[0] == sbx.id, out
        assert abs(float(out[4]) - host_now) < 30, (out[4], host_now)
    (a, oa), (b, ob) = seen
    assert oa[1] != ob[1], "the same boot_id in two restored guests"
    assert oa[2] != ob[2] and oa[3] != ob[3], "the same random bytes in two restored guests"
    a.write("/workspace/mine.txt", b"a's")
    assert b.run("cat /workspace/mine.txt 2>/dev/null || echo absent") == "absent\n"
    assert _template_dirs(image_dir, 256, 64), "no template of that shape in the image"


@pytest.mark.slow
def test_damaged_template_falls_back_and_is_made_again(mvm_api, daemon, image_dir):
    """A template that does not restore (here: a truncated saved state) costs
    one cold boot, then is made anew."""
    shape = {"memoryMiB": 256, "diskMiB": 80}
    first = mvm_api.create_sandbox(driver=DRIVER, **shape)
    assert first.run("echo one") == "one\n"
    tpl = _template_of(daemon, first.id, image_dir)
    with open(tpl / "state", "r+b") as f:
        f.truncate(4096)
    second = mvm_api.create_sandbox(driver=DRIVER, **shape)
    assert second.run("echo two") == "two\n"
    log = _vmm_log(daemon, second.id)
    assert "no fast start" in log and "restored from a template" not in log, log
    assert not (tpl / "state").exists(), "the damaged template was kept"
    third = mvm_api.create_sandbox(driver=DRIVER, **shape)
    assert third.run("echo three") == "three\n"
    assert "restored from a template" in _vmm_log(daemon, third.id), _vmm_log(daemon, third.id)
    # A template missing a part (as a crash while it was removed would
    # leave it) goes too, instead of failing every start after.
    tpl = _template_of(daemon, third.id, image_dir)
    (tpl / "state").unlink()
    fourth = mvm_api.create_sandbox(driver=DRIVER, **shape)
    assert fourth.run("echo four") == "four\n"
    log = _vmm_log(daemon, fourth.id)
    assert "incomplete" in log and "restored from a template" not in log, log
    assert not tpl.exists(), "the incomplete template was kept"


@pytest.mark.slow
def test_cold_boots(cold_api):
    """Consecutive cold boots under the host's accelerator (5 by default,
    20 with RUNTIME_TEST_ALL=1): every one reaches the agent; the
    create-to-first-exec times are printed."""
    times = []
    for i in range(COLD_BOOTS):
        t0 = time.monotonic()
        sbx = cold_api.create_sandbox(driver=DRIVER, memoryMiB=256, diskMiB=64)
        assert sbx.run("echo 42") == "42\n"
        times.append(time.monotonic() - t0)
        assert cold_api.delete(f"/v1/sandboxes/{sbx.id}").status_code == 200
        cold_api.created.remove(sbx.id)
    q = statistics.quantiles(times, n=10)
    print(f"\n{COLD_BOOTS} cold boots to first exec: min {min(times):.2f}s p50 {statistics.median(times):.2f}s "
          f"p90 {q[-1]:.2f}s max {max(times):.2f}s")
