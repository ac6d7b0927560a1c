"""A daemon whose descriptors are numbered past 1023, as one with a few hundred sandboxes is (each
holds about five: its channel, its supervisor's pipe, its cgroup files): new connections are still
served and new sandboxes still start.

Two limits stood there. libmicrohttpd's per-connection threads waited in select(), which refuses a
socket numbered at FD_SETSIZE (1024) or more, so every new connection was reset; and the agent
refused the cgroup descriptors the driver hands it (--cgroup-fds) past 1023, so the 194th sandbox
on a host failed to start. bench/idle_scale.py runs 500; this test gets there without them, by
starting the daemon with descriptors 3 to 1100 already taken, so that everything it opens is
numbered past 1100."""
from __future__ import annotations

import os
import shlex

import httpx
import pytest

from helpers import Api, Daemon

TAKEN = 1100


class CrowdedDaemon(Daemon):
    """runtimed started with descriptors 3..TAKEN open on /dev/null."""

    def argv(self) -> list[str]:
        script = (f"ulimit -n {TAKEN + 4096} 2>/dev/null || true; "
                  f"for i in $(seq 3 {TAKEN}); do eval \"exec $i</dev/null\"; done; "
                  f"exec {shlex.join(super().argv())}")
        return ["/bin/bash", "-c", script]


@pytest.fixture
def crowded(build_dir, image_dir, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("runtimed needs root")
    d = CrowdedDaemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-fds-{os.getpid()}")
    d.start()
    yield d
    d.stop()


def test_descriptors_past_1023(crowded, driver):
    fds = [int(x) for x in os.listdir(f"/proc/{crowded.pid}/fd")]
    assert TAKEN in fds and max(fds) > TAKEN, max(fds)
    api = Api(crowded, timeout=120)
    try:
        sbx = api.create_sandbox(driver=driver)
        # Commands are born in the sandbox's cgroup leaf, whose descriptors the agent was handed.
        assert sbx.exec("echo ok")["stdout"] == "ok\n"
        assert max(int(x) for x in os.listdir(f"/proc/{crowded.pid}/fd")) > TAKEN
        # Each on a connection of its own: its socket is numbered past 1100 too.
        for _ in range(3):
            r = httpx.post(f"{crowded.base_url}/v1/sandboxes/{sbx.id}:exec", json={"argv": ["true"]},
                           headers={"Authorization": f"Bearer {crowded.api_key}"}, timeout=60)
            assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text
        assert api.delete(f"/v1/sandboxes/{sbx.id}").status_code == 200
    finally:
        api.close()
