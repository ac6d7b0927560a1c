"""Guard rails, money: per-second metering into the ledger, maxCostMicros and
maxTotalCostMicros, daily limits with reservations (sequential and twenty
concurrent creates), leases that end billing, and the SIGKILL accounting
check. Against the real daemon; prices are the defaults (9375 per vCPU-hour,
3125 per GiB-hour)."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import datetime, timezone

import httpx
import pytest

from helpers import Api, assert_error, first_driver, wait_until

# 1 vCPU and 64 MiB: 9375 + 64 * 3125 / 1024 = 9570 micro-dollars an hour.
SMALL = {"vcpu": 1, "memoryMiB": 64}
SMALL_PER_HOUR = 9570


def cost(per_hour: int, seconds: int) -> int:
    return per_hour * seconds // 3600


def reserve(per_hour: int, seconds: int) -> int:
    return -(-per_hour * seconds // 3600)


def ts(s: str) -> float:
    return datetime.fromisoformat(s[:-1]).replace(tzinfo=timezone.utc).timestamp()


@pytest.fixture
def drv(daemon) -> str:
    return first_driver(daemon)


@pytest.fixture
def limited(api):
    """A client on a new key of a new owner with the given daily limit."""
    made: list[Api] = []
    n = [0]

    def make(limit: int) -> Api:
        n[0] += 1
        owner = f"ci-bill-{int(time.time() * 1000) % 10**9}-{n[0]}"
        r = api.post("/v1/keys", json={"name": owner, "owner": owner, "dailyLimitMicros": limit})
        assert r.status_code == 201, r.text
        c = Api(api.daemon, key=r.json()["key"])
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def usage_of(c: Api, sid: str) -> dict:
    u = c.get("/v1/usage", params={"since": "0"}).json()
    found = [s for s in u["sandboxes"] if s["sandboxId"] == sid]
    assert len(found) == 1, u
    return found[0]


def test_default_price_and_budget_exceeded(api, drv):
    # The default prices: 2 vCPU + 4 GiB = 31,250 micro-dollars an hour.
    r = api.post("/v1/sandboxes", json={"driver": drv, "vcpu": 2, "memoryMiB": 4096,
                                        "timeoutSeconds": 3600, "maxCostMicros": 10000})
    err = assert_error(r, 409, "budget_exceeded", mentions=["31250", "3600 seconds", "maxCostMicros"])
    assert "1152 seconds" in err["hint"], err  # 10000 * 3600 / 31250
    assert "smaller" in err["hint"], err
    # The fit the hint names does fit.
    sbx = api.create_sandbox(driver=drv, vcpu=2, memoryMiB=4096, timeoutSeconds=1152, maxCostMicros=10000)
    assert sbx["costMicrosPerHour"] == 31250 and sbx["maxCostMicros"] == 10000


def test_max_total_cost_caps_extends(api, drv):
    sbx = api.create_sandbox(driver=drv, timeoutSeconds=10, maxTotalCostMicros=100, **SMALL)
    assert sbx["maxTotalCostMicros"] == 100
    r = api.post(f"/v1/sandboxes/{sbx.id}:extend", json={"seconds": 10})
    assert r.status_code == 200, r.text
    before = r.json()["leaseEndsAt"]
    # 100 micro-dollars buy 37 seconds of this sandbox in all.
    r = api.post(f"/v1/sandboxes/{sbx.id}:extend", json={"seconds": 60})
    assert_error(r, 409, "budget_exceeded", mentions="maxTotalCostMicros")
    assert api.sandbox(sbx.id)["leaseEndsAt"] == before
    assert_error(api.post("/v1/sandboxes", json={"driver": drv, "timeoutSeconds": 600,
                                                 "maxTotalCostMicros": 100, **SMALL}),
                 409, "budget_exceeded", mentions="maxTotalCostMicros")


def test_daily_limit_sequential(limited, drv):
    per = reserve(SMALL_PER_HOUR, 60)  # 160
    c = limited(2 * per + per // 2)
    a = c.create_sandbox(driver=drv, timeoutSeconds=60, **SMALL)
    c.create_sandbox(driver=drv, timeoutSeconds=60, **SMALL)
    lim = c.get("/v1/limits").json()["daily"]
    assert lim["reservedMicros"] == 2 * per and lim["usedMicros"] == 2 * per, lim
    r = c.post("/v1/sandboxes", json={"driver": drv, "timeoutSeconds": 60, **SMALL})
    err = assert_error(r, 402, "spending_limit_reached",
                       mentions=[str(2 * per + per // 2), str(2 * per), "room frees up"])
    assert err["hint"], err
    # An extend that could pass the limit is refused the same way.
    assert_error(c.post(f"/v1/sandboxes/{a.id}:extend", json={"seconds": 3600}), 402,
                 "spending_limit_reached")
    # Stopping settles: the reservation goes, the true cost stays.
    time.sleep(1.2)
    st = c.post(f"/v1/sandboxes/{a.id}:stop")
    assert st.status_code == 200, st.text
    st = st.json()
    lim = c.get("/v1/limits").json()["daily"]
    assert lim["reservedMicros"] == per, lim
    assert lim["settledMicros"] == st["costMicros"] == cost(SMALL_PER_HOUR, st["runSeconds"]), (lim, st)
    assert lim["freesAt"], lim
    c.create_sandbox(driver=drv, timeoutSeconds=60, **SMALL)
    lim = c.get("/v1/limits").json()["daily"]
    assert lim["usedMicros"] <= lim["limitMicros"], lim


def test_twenty_concurrent_creates_never_overshoot(limited, drv):
    per = reserve(SMALL_PER_HOUR, 60)
    limit = 5 * per
    c = limited(limit)
    results: list[int] = []
    made: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(20)

    def one():
        with httpx.Client(base_url=c.daemon.base_url, headers=dict(c.headers), timeout=120) as h:
            start.wait()
            r = h.post("/v1/sandboxes", json={"driver": drv, "timeoutSeconds": 60, **SMALL})
            with lock:
                results.append(r.status_code)
                if r.status_code == 201:
                    made.append(r.json()["id"])
                else:
                    assert r.json()["error"]["code"] == "spending_limit_reached", r.text

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    c.created.extend(made)
    assert len(results) == 20, results
    assert results.count(201) == 5 and results.count(402) == 15, sorted(results)
    lim = c.get("/v1/limits").json()["daily"]
    assert lim["usedMicros"] <= limit and lim["reservedMicros"] == 5 * per, lim


def test_lease_end_stops_billing(api, drv):
    stop = api.create_sandbox(driver=drv, timeoutSeconds=2, onLeaseEnd="stop", **SMALL)
    gone = api.create_sandbox(driver=drv, timeoutSeconds=2, onLeaseEnd="delete", **SMALL)
    st = api.wait_state(stop.id, "stopped", 15)
    wait_until(lambda: api.get(f"/v1/sandboxes/{gone.id}").status_code == 404, 15, 0.2,
               what="the sandbox to be deleted at lease end")
    time.sleep(1.5)
    st = api.sandbox(stop.id)
    # Billed for its lease at most, and the ledger says the same as the sandbox.
    assert st["runSeconds"] <= 2, st
    u = usage_of(api, stop.id)
    assert u["seconds"] == st["runSeconds"] and u["micros"] == st["costMicros"], (u, st)
    assert u["running"] is False
    ug = usage_of(api, gone.id)
    assert ug["seconds"] <= 2 and ug["running"] is False, ug
    # Nothing accrues once it is stopped.
    time.sleep(1.1)
    assert usage_of(api, stop.id) == u


def test_running_cost_grows_per_second(api, drv):
    sbx = api.create_sandbox(driver=drv, timeoutSeconds=120, vcpu=2, memoryMiB=4096)
    time.sleep(2.2)
    got = api.sandbox(sbx.id)
    assert got["runSeconds"] >= 2 and got["costMicros"] == cost(31250, got["runSeconds"]), got
    u = usage_of(api, sbx.id)
    assert u["running"] is True and u["seconds"] >= 2, u


def test_usage_window_and_bad_input(api):
    u = api.get("/v1/usage").json()
    for f in ("since", "until", "totalMicros", "totalSeconds", "sandboxes", "keys"):
        assert f in u, u
    assert u["totalMicros"] == sum(s["micros"] for s in u["sandboxes"])
    for params, field in [({"since": "yesterday"}, "since"), ({"until": "-5"}, "until"),
                          ({"since": "2026-13-01T00:00:00Z"}, "since"),
                          ({"since": "99999999999999999999"}, "since"),
                          ({"since": "2026-11-30T10:00:00Z", "until": "2026-11-30T09:00:00Z"}, "since")]:
        assert_error(api.get("/v1/usage", params=params), 400, "invalid_request", mentions=field)


@pytest.mark.parametrize("body, field", [
    ({"timeoutSeconds": -1}, "timeoutSeconds"),
    ({"timeoutSeconds": 0}, "timeoutSeconds"),
    ({"timeoutSeconds": 86401}, "timeoutSeconds"),
    ({"timeoutSeconds": 10**20}, "timeoutSeconds"),
    ({"timeoutSeconds": "300"}, "timeoutSeconds"),
    ({"timeoutSeconds": 1.5}, "timeoutSeconds"),
    ({"maxCostMicros": -1}, "maxCostMicros"),
    ({"maxTotalCostMicros": -1}, "maxTotalCostMicros"),
    ({"maxTotalCostMicros": "10"}, "maxTotalCostMicros"),
    ({"maxTotalCostMicros": 10**30}, "maxTotalCostMicros"),
])
def test_create_bad_input(api, body, field):
    assert_error(api.post("/v1/sandboxes", json=body), 400, "invalid_request", mentions=field)


def test_extend_bad_input(api, drv):
    sbx = api.create_sandbox(driver=drv, timeoutSeconds=60, **SMALL)
    for bad in (-1, 0, 86401, 10**20, "60"):
        assert_error(api.post(f"/v1/sandboxes/{sbx.id}:extend", json={"seconds": bad}), 400,
                     "invalid_request", mentions="seconds")


@pytest.mark.parametrize("args, name", [
    (["--price-vcpu-hour-micros", "-5"], "price-vcpu-hour-micros"),
    (["--price-gib-hour-micros", "1e3"], "price-gib-hour-micros"),
    (["--price-gib-hour-micros", "99999999999999999999"], "price-gib-hour-micros"),
    (["--trial-hours", "-1"], "trial-hours"),
    (["--max-trial-keys", "many"], "max-trial-keys"),
])
def test_daemon_refuses_bad_prices(build_dir, tmp_path, args, name):
    r = subprocess.run([str(build_dir / "runtimed"), "--state-dir", str(tmp_path / "s"), *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and name in r.stderr, (r.returncode, r.stderr)


def test_sigkill_accounting(fresh_daemon, fresh_api):
    """SIGKILL the daemon while sandboxes run, start it again: each is billed
    for the time it ran up to the last heartbeat (2 s) before the kill, never
    twice; a lease that ended while it was down is acted on at once; the
    ledger adds up to the sandboxes' recorded run times."""
    drv = first_driver(fresh_daemon)
    # The sandboxes end with the daemon (test_live_restore.py bills the ones that outlive it).
    fresh_daemon.without_live_restore()
    a = fresh_api.create_sandbox(driver=drv, timeoutSeconds=300, **SMALL)
    b = fresh_api.create_sandbox(driver=drv, timeoutSeconds=6, onLeaseEnd="delete", **SMALL)
    c = fresh_api.create_sandbox(driver=drv, timeoutSeconds=300, vcpu=2, memoryMiB=4096)
    time.sleep(1.5)
    stopped = fresh_api.post(f"/v1/sandboxes/{c.id}:stop").json()
    time.sleep(3)
    assert fresh_api.get("/v1/limits").json()["daily"]["reservedMicros"] > 0
    fresh_daemon.kill()
    killed_at = time.time()
    time.sleep(5)  # b's lease ends while the daemon is down
    fresh_daemon.start()

    # The due lease is acted on at once.
    assert fresh_api.get(f"/v1/sandboxes/{b.id}").status_code == 404
    got_a = fresh_api.sandbox(a.id)
    assert got_a["state"] == "stopped" and got_a["failureReason"] == "daemon restarted", got_a
    ran = killed_at - ts(got_a["startedAt"])
    # Billed up to the last heartbeat: at most 2 s (+1 for whole seconds) short, never more.
    assert ran - 3.5 <= got_a["runSeconds"] <= ran + 1, (ran, got_a)
    assert got_a["costMicros"] == cost(SMALL_PER_HOUR, got_a["runSeconds"])

    usage = fresh_api.get("/v1/usage", params={"since": "0"}).json()
    by = {s["sandboxId"]: s for s in usage["sandboxes"]}
    assert set(by) == {a.id, b.id, c.id}, usage
    assert by[a.id]["seconds"] == got_a["runSeconds"] and by[a.id]["micros"] == got_a["costMicros"]
    got_c = fresh_api.sandbox(c.id)
    assert got_c["runSeconds"] == stopped["runSeconds"], "a stopped sandbox is not billed again"
    assert by[c.id]["seconds"] == got_c["runSeconds"] and by[c.id]["micros"] == got_c["costMicros"]
    assert by[b.id]["seconds"] <= 6 and by[b.id]["micros"] == cost(SMALL_PER_HOUR, by[b.id]["seconds"])
    assert all(not s["running"] for s in usage["sandboxes"])
    assert usage["totalSeconds"] == sum(s["seconds"] for s in usage["sandboxes"])
    assert usage["totalMicros"] == sum(s["micros"] for s in usage["sandboxes"])
    lim = fresh_api.get("/v1/limits").json()["daily"]
    assert lim["reservedMicros"] == 0, lim
    assert lim["settledMicros"] == usage["totalMicros"], (lim, usage)

    # Never twice: another crash and start changes nothing.
    fresh_daemon.kill()
    fresh_daemon.start()
    again = fresh_api.get("/v1/usage", params={"since": "0"}).json()
    assert again["sandboxes"] == usage["sandboxes"] and again["totalMicros"] == usage["totalMicros"]
    assert fresh_api.sandbox(a.id)["runSeconds"] == got_a["runSeconds"]


def test_cli_max_cost_usage_limits(daemon, build_dir, api, drv):
    env = {**os.environ, **daemon.env()}
    cli = [str(build_dir / "runtime")]
    r = subprocess.run(cli + ["sandbox", "create", "--driver", drv, "--lease", "1h", "--vcpu", "2",
                              "--memory", "4G", "--max-cost", "0.01"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "31250" in r.stderr and "1152 seconds" in r.stderr, r
    r = subprocess.run(cli + ["sandbox", "create", "--max-cost", "1.0000001"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--max-cost" in r.stderr, r
    r = subprocess.run(cli + ["--json", "sandbox", "create", "--driver", drv, "--lease", "60",
                              "--memory", "64", "--max-cost", "$0.01"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r
    sid = json.loads(r.stdout)["id"]
    api.created.append(sid)
    assert api.sandbox(sid)["maxCostMicros"] == 10000
    time.sleep(1.1)
    r = subprocess.run(cli + ["usage", "--since", "1h"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and sid in r.stdout and "running" in r.stdout, r
    r = subprocess.run(cli + ["usage", "--since", "yesterday"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--since" in r.stderr, r
    r = subprocess.run(cli + ["limits"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "access: full" in r.stdout and "remaining: unlimited" in r.stdout, r
