"""POST /v1/images/{name}:build runs the image builder for as long as its
client listens and streams its progress, mmdebstrap's steps included: a
client that disconnects stops the build, mmdebstrap and all, within seconds. The build goes into a scratch image directory, never
the suite's image."""
from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import wait_until

# mmdebstrap must be gone this soon after the client hung up (the daemon
# notices within half a second; the builder's trap then stops mmdebstrap).
STOP_BOUND_S = 10.0


def _procs() -> list[tuple[int, int, str]]:
    """(pid, pgid, cmdline) of every process."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out.append((int(d), int(fields[2]), cmd))
    return out


def _group_alive(pgid: int) -> list[int]:
    return [pid for pid, g, _ in _procs() if g == pgid]


def _open_build(d, name: str) -> socket.socket:
    """Sends the build request by hand, so that the test decides when the
    connection ends."""
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    s.sendall((f"POST /v1/images/{name}:build HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer {d.api_key}\r\nContent-Length: 0\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        assert chunk, f"the daemon closed the connection: {head!r}"
        head += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        s.close()
        raise BuildRefused(head[:500])
    return s


class BuildRefused(AssertionError):
    pass


@pytest.fixture
def build_daemon(build_dir, tmp_path):
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap is not installed: no image build to stop")
    scratch = tmp_path / "images"
    scratch.mkdir()
    d = _start_daemon(build_dir, scratch, tmp_path / "state", f"runtime-test-{os.getpid()}-imgbuild")
    yield d, scratch
    _finish_daemon(d)


@pytest.mark.timeout(300)
def test_disconnect_stops_the_build(build_daemon):
    d, scratch = build_daemon
    s = _open_build(d, "default")
    try:
        # mmdebstrap runs in a session of its own (the builder's setsid);
        # find it by the scratch directory it fills.
        def mmdebstrap():
            for pid, pgid, cmd in _procs():
                if "mmdebstrap" in cmd and str(scratch) in cmd and "setsid" not in cmd.split()[0]:
                    return pid, pgid
            return None

        deadline = time.monotonic() + 120
        found = None
        seen = b""
        # The build shows progress while mmdebstrap runs: its steps reach
        # the client as log events before the build ends.
        while (found is None or b'"line":"mmdebstrap: ' not in seen) and time.monotonic() < deadline:
            found = found or mmdebstrap()
            s.settimeout(0.2)
            try:
                data = s.recv(65536)
            except socket.timeout:
                data = None
            seen += data or b""
            if data == b"" or (data and b'"type":"error"' in data):
                pytest.skip("the builder ended before mmdebstrap ran (no Debian mirror?): "
                            + (data or b"connection closed").decode("utf-8", "replace")[-500:])
        assert found, "no mmdebstrap process appeared within 120 s of the build request"
        assert b'"line":"mmdebstrap: ' in seen, f"no mmdebstrap step reached the client: {seen[-2000:]!r}"
        _, ds_pgid = found
        builder = [pid for pid, _, cmd in _procs() if "runtime-image-build" in cmd and str(scratch) in cmd]
        assert builder, "the builder is not running"
        builder_pgid = [g for pid, g, _ in _procs() if pid == builder[0]][0]
        assert builder_pgid == builder[0], "the builder does not lead a process group of its own"
    finally:
        s.close()
    t0 = time.monotonic()
    wait_until(lambda: not _group_alive(ds_pgid), STOP_BOUND_S,
               what=f"mmdebstrap's process group {ds_pgid} to end after the client left")
    wait_until(lambda: not _group_alive(builder_pgid), STOP_BOUND_S,
               what=f"the builder's process group {builder_pgid} to end after the client left")
    took = time.monotonic() - t0
    print(f"build stopped {took:.1f} s after the client left")
    # The one-build-at-a-time slot is free again: a new build starts (and
    # stops as its client leaves at once).
    # The daemon frees the slot once it has reaped the builder, a moment
    # after the group is gone: a 409 until then.
    def reopen():
        try:
            _open_build(d, "default").close()
            return True
        except BuildRefused as e:
            assert b" 409 " in bytes(e.args[0])[:20], e
            return False
    wait_until(reopen, STOP_BOUND_S, 0.2, what="the build slot to be free again")
    wait_until(lambda: not [p for p, _, c in _procs() if str(scratch) in c and "runtime-image-build" in c],
               STOP_BOUND_S + 5, what="the second build to stop")
    wait_until(lambda: not any(p.name.startswith("default.tmp-") for p in scratch.iterdir()), 30,
               what="the partial build to be removed")
