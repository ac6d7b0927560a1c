"""Sandbox metrics (docs/api.md, "Metrics"): a live sandbox read every interval (CPU from its
cgroup, memory, its writable layer, network through the egress proxy), kept in the store and read
back by the published client's sbx.metrics(range=...) and its E2B drop-in's get_metrics(), on
each store; the same figures per sandbox on /metrics, an owner's own only; bad ranges refused;
another owner's sandbox is not found; a stopped sandbox's readings stay readable."""
from __future__ import annotations

import os
import re
import sys
import uuid

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import REPO, Api, assert_error, wait_until


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def sampled(request, build_dir, image_dir, tmp_path_factory):
    """A daemon of this module that reads every live sandbox each second, on each store."""
    args = ["--sandbox-metrics-interval-seconds", "1"]
    if request.param == "postgresql":
        pg = request.getfixturevalue("postgres")
        db = f"rt_{uuid.uuid4().hex[:12]}"
        pg.psql(f"CREATE DATABASE {db}")
        args += ["--database", pg.url(db)]
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("metrics") / "state",
                      f"runtime-test-{os.getpid()}-mx-{request.param}", extra_args=args)
    yield d
    _finish_daemon(d)


def _owner_key(d, owner: str, access: str = "full") -> str:
    with Api(d) as admin:
        r = admin.post("/v1/keys", json={"name": owner, "owner": owner, "access": access})
        assert r.status_code in (200, 201), r.text
        return r.json()["key"]


# A CPU burner for a few seconds, 64 MiB held in memory meanwhile, and 48 MiB written to disk.
WORK = ("head -c 50331648 /dev/zero > /workspace/blob && "
        "python3 -c \"import time; x = bytearray(64 << 20); end = time.time() + 6\n"
        "while time.time() < end: pass\"")


def test_a_busy_sandbox_read_back(sampled, published_client):
    owner = f"mx-{uuid.uuid4().hex[:8]}"
    key = _owner_key(sampled, owner)
    reader = _owner_key(sampled, owner, access="read")
    with Api(sampled, key=key) as c:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=120, vcpu=1, memoryMiB=512)
        r = c.post(f"/v1/sandboxes/{sbx.id}/processes", json={"command": WORK})
        assert r.status_code in (200, 201), r.text

        def busy():
            m = c.get(f"/v1/sandboxes/{sbx.id}/metrics", params={"range": "15m"}).json()
            pts = [p for p in m["points"] if p["cpuPercent"] is not None]
            return m if any(p["cpuPercent"] > 50 for p in pts) and \
                any(p["memoryBytes"] > 64 << 20 for p in pts) and \
                any(p["diskBytes"] >= 48 << 20 for p in pts) else None
        m = wait_until(busy, timeout=60, interval=0.5, what="a reading of the busy sandbox")
    assert m["sandboxId"] == sbx.id and m["range"] == "15m" and m["intervalSeconds"] == 1
    assert m["stepSeconds"] == 3  # 900 s in at most 300 steps
    assert m["vcpu"] == 1 and m["memoryLimitBytes"] == 512 << 20 and m["diskLimitBytes"] > 0
    for p in m["points"]:
        assert p["cpuPercent"] is None or 0 <= p["cpuPercent"] <= 150, p  # a step's sum, sampled not exactly
        assert p["readings"] >= 1 and p["at"].endswith("Z")
    assert m["latest"] and m["latest"]["memoryBytes"] > 0

    # The published client, and its E2B drop-in, read the same, with a read-only key.
    got = published_client.run_json(sampled, f"""
import json
from withruntime import Runtime
from withruntime.e2b import Sandbox
rt = Runtime()
sbx = rt.sandboxes.get({sbx.id!r})
m = sbx.metrics(range="1h")
e2b = Sandbox.connect({sbx.id!r}).get_metrics()
print(json.dumps({{"m": m, "e2b": [[x.cpu_used_pct, x.cpu_count, x.mem_used, x.mem_total, x.disk_total]
                                   for x in e2b]}}))
""", env={"RUNTIME_API_KEY": reader})
    assert got["m"]["range"] == "1h" and got["m"]["stepSeconds"] == 12 and got["m"]["points"]
    assert any(p["cpuPercent"] and p["cpuPercent"] > 50 for p in got["m"]["points"])
    assert got["e2b"] and all(x[1] == 1 and x[3] == 512 << 20 for x in got["e2b"]), got["e2b"]
    assert any(x[0] > 50 for x in got["e2b"]) and any(x[2] > 64 << 20 for x in got["e2b"])

    # Stopped: its readings stay readable, and it leaves the per-sandbox series of /metrics.
    with Api(sampled, key=key) as c:
        assert c.post(f"/v1/sandboxes/{sbx.id}:stop", json={}).status_code == 200
        after = c.get(f"/v1/sandboxes/{sbx.id}/metrics", params={"range": "15m"}).json()
        assert after["points"] and after["latest"]
        assert sbx.id not in c.get("/metrics").text


def test_metrics_refusals_and_owners(sampled):
    owner, other = f"mx-{uuid.uuid4().hex[:8]}", f"mx-{uuid.uuid4().hex[:8]}"
    key, other_key = _owner_key(sampled, owner), _owner_key(sampled, other)
    with Api(sampled, key=key) as c, Api(sampled, key=other_key) as o:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        for bad in ("2h", "", "1H", "15m ", "-1h", "x" * 300):
            assert_error(c.get(f"/v1/sandboxes/{sbx.id}/metrics", params={"range": bad}), 400, "invalid_request")
        # Another owner's sandbox: not found, not a refusal that says it exists.
        assert_error(o.get(f"/v1/sandboxes/{sbx.id}/metrics"), 404)
        assert_error(c.get("/v1/sandboxes/sbx_00000000000000000000/metrics"), 404)
        theirs = o.create_sandbox(driver="namespace", timeoutSeconds=60)
        wait_until(lambda: c.get(f"/v1/sandboxes/{sbx.id}/metrics").json()["latest"], timeout=30,
                   what="a first reading")
        wait_until(lambda: o.get(f"/v1/sandboxes/{theirs.id}/metrics").json()["latest"], timeout=30,
                   what="their first reading")
        # Our SDK reads the same, and refuses a range not offered before any request.
        sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
        from withruntime import Sandbox as SdkSandbox
        from withruntime.errors import InvalidRequestError
        with SdkSandbox.connect(sbx.id, api_key=key, base_url=sampled.base_url) as s:
            m = s.metrics(range="15m")
            assert m["sandboxId"] == sbx.id and m["latest"] and m["points"]
            assert s.metrics()["range"] == "1h"
            with pytest.raises(InvalidRequestError):
                s.metrics(range="2h")
        # /metrics: a key's own sandboxes' series; the admin key's, every one's.
        mine = c.get("/metrics").text
        assert f'runtime_sandbox_memory_bytes{{sandbox="{sbx.id}"}}' in mine
        assert theirs.id not in mine
        series = re.findall(r'^runtime_sandbox_cpu_seconds_total\{sandbox="(sbx_[0-9a-f]{20})"\} [0-9.]+$', mine,
                            re.M)
        assert series == [sbx.id], series
        assert "runtime_sandbox_series_omitted 0" in mine
        with Api(sampled) as admin:
            every = admin.get("/metrics").text
        assert sbx.id in every and theirs.id in every
        assert "# TYPE runtime_sandbox_network_receive_bytes_total counter" in every


def test_every_driver_is_read(sampled, driver):
    """Each driver's sandbox has readings: its cgroup's CPU time and memory (gVisor's Sentry, the
    microVM's VMM, guest memory and all)."""
    key = _owner_key(sampled, f"mx-{uuid.uuid4().hex[:8]}")
    with Api(sampled, key=key) as c:
        sbx = c.create_sandbox(driver=driver, timeoutSeconds=120)
        url = f"/v1/sandboxes/{sbx.id}/metrics"
        first = wait_until(lambda: c.get(url).json()["latest"], timeout=60, what=f"a {driver} sandbox's first reading")
        assert first["memoryBytes"] > 1 << 20, first
        # Work after the first reading: the next one's CPU time holds it.
        assert sbx.exec("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")["exitCode"] == 0

        def busy():
            m = c.get(url, params={"range": "15m"}).json()
            return m if any(p["cpuPercent"] and p["cpuPercent"] > 0 for p in m["points"]) else None
        wait_until(busy, timeout=60, interval=0.5, what=f"the CPU time of a {driver} sandbox's command")
