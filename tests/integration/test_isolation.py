"""What a sandbox cannot see or reach on the host, checked from inside and
from outside, on every driver."""
from __future__ import annotations

import base64
import os
import secrets
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from helpers import assert_error, error_of, host_ipv4_addresses, host_pids, proc_cmdline, proc_uid

# Isolation is what differs most in a VM: every test here runs on the microVM too.
pytestmark = pytest.mark.microvm_subset

LIST_PROCS = "for p in /proc/[0-9]*; do printf '%s ' ${p#/proc/}; tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


@pytest.fixture
def host_marker():
    path = Path("/tmp") / f"runtime-itest-host-{uuid.uuid4().hex}"
    path.write_text("host secret\n")
    yield path
    path.unlink(missing_ok=True)


def test_host_files_invisible(sandbox, host_marker):
    res = sandbox.exec(f"test -e {host_marker} && echo VISIBLE; ls -a /tmp")
    assert "VISIBLE" not in res["stdout"]
    assert host_marker.name not in res["stdout"]
    assert_error(sandbox.get_file(str(host_marker)), 404, "not_found")
    st = sandbox.stat(str(host_marker))  # the published client's shape: 200, exists false
    assert st.status_code == 200 and st.json()["exists"] is False, st.text


def test_host_home_and_state_invisible(sandbox, daemon):
    # the daemon's state dir (with the admin key) is not there inside
    res = sandbox.exec(f"ls {daemon.state_dir} 2>&1; cat {daemon.state_dir}/admin.key 2>&1")
    assert daemon.api_key not in res["stdout"]
    assert_error(sandbox.get_file(str(daemon.state_dir / "admin.key")), 404, "not_found")


def test_host_processes_invisible(sandbox):
    tag = str(900000 + secrets.randbelow(99999))
    host = subprocess.Popen(["sleep", f"{tag}.5"])
    try:
        out = sandbox.run(LIST_PROCS)
        assert f"{tag}.5" not in out, "a host process is visible inside"
        assert "runtimed" not in out and "pytest" not in out
        lines = [line.split() for line in out.splitlines() if line.strip()]
        if sandbox.driver == "microvm":
            # The guest kernel's own threads (no command line) are not host
            # processes: what runs in the guest is its init and our probe.
            lines = [f for f in lines if len(f) > 1]
        pids = [f[0] for f in lines]
        assert len(pids) < 20, f"too many processes visible inside: {out}"
        res = sandbox.exec(f"kill -0 {host.pid} 2>/dev/null && echo reached")
        assert "reached" not in res["stdout"]
    finally:
        host.kill()
        host.wait()


def test_pid1_is_the_agent(sandbox):
    out = sandbox.run("tr '\\0' ' ' < /proc/1/cmdline; echo; cat /proc/1/comm")
    argv0 = out.split()[0]
    assert "agent" in os.path.basename(argv0) or "runtime-agent" in out, \
        f"/proc/1 is not the agent: {out!r}"


def test_other_sandboxes_invisible(api, driver):
    a = api.create_sandbox(driver=driver)
    b = api.create_sandbox(driver=driver)
    tag = str(800000 + secrets.randbelow(99999))
    ev = a.exec_stream(command=f"echo go; sleep {tag}", timeoutMs=30000)
    it = iter(ev)
    for _, e in it:
        if e["type"] == "stdout":
            break
    try:
        assert tag not in b.run(LIST_PROCS)
    finally:
        ev.close()


def test_only_loopback_network(sandbox):
    out = sandbox.run("cat /proc/net/dev")
    names = {line.split(":")[0].strip() for line in out.splitlines()[2:] if ":" in line}
    assert names <= {"lo"}, f"network interfaces inside: {names}"
    res = sandbox.exec("ls /sys/class/net 2>/dev/null")
    if res["exitCode"] == 0 and res["stdout"].strip():
        assert set(res["stdout"].split()) <= {"lo"}, res["stdout"]
    res = sandbox.exec("command -v ip >/dev/null && ip -o link show")
    if res["exitCode"] == 0:
        links = {line.split(":")[1].strip().split("@")[0] for line in res["stdout"].splitlines()
                 if line.count(":") >= 2}
        assert links <= {"lo"}, f"`ip link` inside shows {links}"


def test_cannot_reach_the_host(sandbox, daemon):
    """A listener on every host address and the daemon's own port: neither is
    reachable from inside."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    targets = [("127.0.0.1", daemon.port), ("127.0.0.1", port)]
    targets += [(a, port) for a in host_ipv4_addresses()]
    try:
        probe = ("import socket,sys\n"
                 "for h,p in %r:\n"
                 " s=socket.socket(); s.settimeout(3)\n"
                 " try:\n  s.connect((h,p)); print('CONNECTED',h,p)\n"
                 " except OSError as e: print('refused',h,p,e)\n" % (targets,))
        res = sandbox.exec(argv=["python3", "-c", probe], timeoutMs=60000)
        assert res["exitCode"] == 0, res
        assert "CONNECTED" not in res["stdout"], res["stdout"]
        refused = [line for line in res["stdout"].splitlines() if line.startswith("refused ")]
        assert len(refused) == len(targets), res
    finally:
        srv.close()


def test_root_inside_is_not_root_outside(sandbox):
    # Root inside, asked for: commands run as the sandbox user otherwise.
    assert sandbox.run("id -u", user="root") == "0\n"
    assert sandbox.run("id -u") == "1000\n"
    if sandbox.driver == "namespace":
        uid_map = sandbox.run("cat /proc/self/uid_map")
        rows = [list(map(int, line.split())) for line in uid_map.splitlines() if line.strip()]
        for inside, outside, count in rows:
            if inside <= 0 < inside + count:
                assert outside + (0 - inside) != 0, f"uid 0 inside is root outside: {uid_map!r}"
                break
        else:
            pytest.fail(f"uid 0 is not mapped: {uid_map!r}")
        # and from the host: the agent runs with a non-zero uid
        agents = [p for p in host_pids(sandbox.id)
                  if any("runtime-agent" in a or "agent" in os.path.basename(a)
                         for a in proc_cmdline(p)[:1])]
        assert agents, f"agent of {sandbox.id} not found on the host"
        for p in agents:
            assert proc_uid(p) != 0, f"agent pid {p} runs as host root"
    else:
        # gVisor: what runs the sandbox's code on the host is the sentry
        # ("runsc ... boot"); it must not be host root.
        sentries = [p for p in host_pids(sandbox.id) if "boot" in proc_cmdline(p)]
        if not sentries:
            pytest.skip("gVisor sentry process not found on the host to check its uid")
        for p in sentries:
            assert proc_uid(p) != 0, f"gVisor sentry pid {p} runs as host root"


def test_no_capabilities_to_escape(sandbox, image_dir):
    """Things a sandbox never needs are refused: mounting, new user namespaces,
    loading modules, raw devices."""
    if sandbox.driver == "microvm":
        # Root of a kernel of its own: mounting or namespaces there concern
        # that kernel only. What must hold however root inside tries: the
        # image's disk, shared by every sandbox, is read-only below the guest.
        image = image_dir / "default" / "microvm" / "root.ext4"
        with open(image, "rb") as f:
            before = (f.read(1 << 20), os.fstat(f.fileno()).st_mtime_ns)
        res = sandbox.exec(
            "for b in /sys/block/vd*; do [ \"$(cat $b/serial)\" = root ] && d=/dev/${b##*/}; done; echo \"disk $d\"; "
            "blockdev --setrw $d 2>&1; "
            "dd if=/dev/urandom of=$d bs=4096 count=16 oflag=direct conv=notrunc 2>&1 && echo WROTE; "
            "mount -o remount,rw $d 2>&1; python3 -c \"import os; fd = os.open('$d', os.O_RDWR); "
            "os.pwrite(fd, b'x' * 4096, 0); os.fsync(fd); print('WROTE')\" 2>&1; sync", user="root")
        assert "disk /dev/vd" in res["stdout"], res
        assert "WROTE" not in res["stdout"], res
        with open(image, "rb") as f:
            assert (f.read(1 << 20), os.fstat(f.fileno()).st_mtime_ns) == before, "the image's disk changed"
        return
    res = sandbox.exec("mount -t tmpfs none /mnt 2>&1 && echo MOUNTED; "
                       "test -e /dev/sda -o -e /dev/vda && echo DISK; "
                       "cat /proc/sys/kernel/hostname >/dev/null; "
                       "python3 -c \"import ctypes\nl = ctypes.CDLL(None, use_errno=True)\n"
                       "print('USERNS' if l.unshare(0x10000000) == 0 else 'no userns')\"", user="root")
    assert "MOUNTED" not in res["stdout"], res
    assert "DISK" not in res["stdout"], res
    assert "USERNS" not in res["stdout"], res


def test_dotdot_path_reads_the_sandbox_etc(sandbox):
    marker = f"sandbox-marker-{uuid.uuid4().hex}"
    sandbox.run(f"echo {marker} > /etc/runtime-itest-marker", user="root")
    assert not Path("/etc/runtime-itest-marker").exists()
    assert sandbox.read("../../etc/runtime-itest-marker").decode() == marker + "\n"
    assert sandbox.read("/workspace/../../../../etc/runtime-itest-marker").decode() == marker + "\n"
    r = sandbox.get_file("../../etc/shadow")
    host_shadow = Path("/etc/shadow").read_bytes()
    if r.status_code == 200:
        inside = sandbox.exec("base64 -w0 /etc/shadow")
        assert r.content == base64.b64decode(inside["stdout"])
        assert r.content != host_shadow or not host_shadow
    else:
        assert r.status_code in (403, 404), r.text


def test_symlink_to_root_never_reaches_the_host(sandbox, host_marker):
    """The security half, on every driver: whatever a path through a symlink
    to / resolves to, it is the sandbox's, never the host's."""
    sandbox.run(f"ln -s / /workspace/rootlink; ln -s {host_marker} /workspace/hostlink")
    for path in (f"/workspace/rootlink{host_marker}", "/workspace/hostlink"):
        r = sandbox.get_file(path)
        assert b"host secret" not in r.content, f"{path} read the host's file"
        err = error_of(r)
        if sandbox.driver == "gvisor":
            # runsc 20221219 takes the path for a directory (400), which is
            # wrong but reads nothing: test_symlink_to_root_resolves_inside.
            assert r.status_code in (400, 404), (path, r.status_code, err)
        else:
            assert (r.status_code, err["code"]) == (404, "not_found"), (path, r.status_code, err)
    name = f"runtime-itest-written-{uuid.uuid4().hex}"
    r = sandbox.put_file(f"/workspace/rootlink/tmp/{name}", b"inside")
    assert not (Path("/tmp") / name).exists(), "a write through a symlink reached the host"
    if r.status_code != 200:
        error_of(r)  # a refusal, in the API's error shape
    sandbox.put_file("/workspace/hostlink", b"overwritten")
    assert host_marker.read_text() == "host secret\n", "a write through a symlink reached the host"


def test_symlink_to_root_resolves_inside(sandbox):
    marker = f"sandbox-marker-{uuid.uuid4().hex}"
    sandbox.run(f"echo {marker} > /etc/runtime-itest-marker; ln -s / /workspace/rootlink", user="root")
    assert sandbox.read("/workspace/rootlink/etc/runtime-itest-marker").decode() == marker + "\n"
    # writes through it land in the sandbox
    name = f"runtime-itest-written-{uuid.uuid4().hex}"
    r = sandbox.put_file(f"/workspace/rootlink/tmp/{name}", b"inside")
    assert r.status_code == 200, r.text
    assert sandbox.run(f"cat /tmp/{name}") == "inside"
    st = sandbox.stat("/workspace/rootlink").json()
    assert st["type"] == "symlink" and st["target"] == "/"


def test_proc_and_sys_do_not_leak_host_secrets(sandbox, daemon):
    res = sandbox.exec(f"grep -r {daemon.api_key} /proc/1/environ /proc/self/environ 2>/dev/null; "
                       "env")
    assert daemon.api_key not in res["stdout"]
    assert "RUNTIME_API_KEY" not in res["stdout"]
