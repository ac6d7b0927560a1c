"""Leases: a sandbox ends when its lease does (stopped or deleted), :extend
renews it, and the timers survive a daemon restart. Lease logic is above the
driver, so one driver is enough here (any usable one; test_sandbox_fields uses the default)."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from helpers import assert_error, assert_no_cgroups, assert_no_host_trace, wait_until


def ts(s: str) -> datetime:
    assert isinstance(s, str) and s.endswith("Z"), f"not an RFC 3339 UTC time: {s!r}"
    return datetime.fromisoformat(s[:-1]).replace(tzinfo=timezone.utc)


def test_sandbox_fields(api):
    """Created with every field left out but these: the daemon's defaults."""
    sbx = api.create_sandbox(name="fields", labels={"team": "a"}, timeoutSeconds=120)
    for f in ("id", "name", "labels", "state", "driver", "image", "vcpu", "memoryMiB", "diskMiB",
              "network", "timeoutSeconds", "onLeaseEnd", "createdAt", "startedAt", "stoppedAt",
              "leaseEndsAt", "costMicrosPerHour", "costMicros", "maxCostMicros", "failureReason"):
        assert f in sbx, f"sandbox lacks {f}: {sbx}"
    assert sbx.id.startswith("sbx_")
    assert sbx["name"] == "fields" and sbx["labels"] == {"team": "a"}
    assert sbx["vcpu"] == 1 and sbx["memoryMiB"] == 1024 and sbx["diskMiB"] == 2048
    assert sbx["network"]["internet"] is False
    assert sbx["onLeaseEnd"] == "stop" and sbx["image"] == "default"
    assert sbx["driver"] == api.get("/healthz").json()["defaultDriver"]
    assert sbx["stoppedAt"] is None and sbx["failureReason"] is None
    # the lease runs from the start (a slow driver's start-up is not billed)
    lease = (ts(sbx["leaseEndsAt"]) - ts(sbx["startedAt"])).total_seconds()
    assert 115 <= lease <= 125, (lease, sbx)
    assert ts(sbx["createdAt"]) <= ts(sbx["startedAt"])
    got = api.sandbox(sbx.id)
    assert got["id"] == sbx.id and got["state"] == "running"
    listed = api.get("/v1/sandboxes").json()["sandboxes"]
    assert any(s["id"] == sbx.id for s in listed)


def test_list_is_oldest_first(api, any_driver):
    """The published client's contract: live sandboxes, oldest first, a page at a time."""
    a = api.create_sandbox(driver=any_driver)
    b = api.create_sandbox(driver=any_driver)
    ids = [s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]]
    assert ids.index(a.id) < ids.index(b.id)


def test_lease_end_stops(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=2, onLeaseEnd="stop")
    sbx.write("/workspace/kept.txt", b"x")
    t0 = time.monotonic()
    st = api.wait_state(sbx.id, "stopped", 15)
    assert time.monotonic() - t0 < 10
    assert st["stoppedAt"], st
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "true"}), 409, "conflict")
    assert_error(sbx.get_file("/workspace/kept.txt"), 409, "conflict")
    assert_no_host_trace(sbx.id)


def test_lease_end_deletes(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=2, onLeaseEnd="delete")
    wait_until(lambda: api.get(f"/v1/sandboxes/{sbx.id}").status_code == 404, 15, 0.2,
               what="the sandbox to be deleted at lease end")
    assert all(s["id"] != sbx.id for s in api.get("/v1/sandboxes").json()["sandboxes"])
    assert_no_host_trace(sbx.id)
    assert_no_cgroups(sbx.id)


def test_extend(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=3)
    before = ts(sbx["leaseEndsAt"])
    r = api.post(f"/v1/sandboxes/{sbx.id}:extend", json={"seconds": 60})
    assert r.status_code == 200, r.text
    after = ts(r.json()["leaseEndsAt"])
    assert 59 <= (after - before).total_seconds() <= 61, (before, after)
    time.sleep(5)
    assert api.sandbox(sbx.id)["state"] == "running"
    assert sbx.run("echo still") == "still\n"
    for bad in (0, -5, 86401, "10", None):
        assert_error(api.post(f"/v1/sandboxes/{sbx.id}:extend", json={"seconds": bad}), 400,
                     "invalid_request", mentions="seconds")
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:extend", json={}), 400, "invalid_request")


def test_extend_a_stopped_sandbox_is_409(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=2, onLeaseEnd="stop")
    api.wait_state(sbx.id, "stopped", 15)
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:extend", json={"seconds": 30}), 409, "conflict")


def test_lease_timers_survive_restart(fresh_daemon, fresh_api, any_driver):
    stop_me = fresh_api.create_sandbox(driver=any_driver, timeoutSeconds=4, onLeaseEnd="stop")
    delete_me = fresh_api.create_sandbox(driver=any_driver, timeoutSeconds=4, onLeaseEnd="delete")
    fresh_daemon.kill()
    fresh_daemon.start()
    with fresh_daemon.client() as api:
        # after a crash the daemon may have marked it failed ("daemon
        # restarted"); either way it must not run past its lease
        st = api.wait_state(stop_me.id, ("stopped", "failed"), 20)
        assert st["state"] == "stopped" or st["failureReason"], st
        wait_until(lambda: api.get(f"/v1/sandboxes/{delete_me.id}").status_code == 404, 20, 0.2,
                   what="the lease-end delete after a restart")
    assert_no_host_trace(stop_me.id)
    assert_no_host_trace(delete_me.id)
