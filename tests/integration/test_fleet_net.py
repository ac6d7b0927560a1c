"""A fleet in network namespaces (helpers/fleet.py): three runtimed hosts, each in a namespace of
its own on a bridge the test makes, on a PostgreSQL they reach over TCP with a password. Creates
spread over the hosts and any host answers for any sandbox; a host killed with SIGKILL has its
sandboxes lost within the dead-after time and rejoins at a new epoch without bringing them back; a
host whose link goes down fences itself (its sandboxes stopped), is declared dead by the others,
and rejoins when its link is back."""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from conftest import _finish_daemon
from helpers import Api, wait_until
from helpers.postgres import available as postgres_available

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter") or postgres_available() is not None,
    reason="needs root, iproute2, nsenter and Debian's PostgreSQL 15")


@pytest.fixture
def fleet(build_dir, image_dir, tmp_path):
    from helpers.fleet import FleetNet
    secret = tmp_path / "fleet.secret"
    secret.write_text(uuid.uuid4().hex + "\n")
    os.chmod(secret, 0o600)
    with FleetNet(3) as net:
        pg = net.postgres()
        pg.psql("CREATE DATABASE fleet")
        hosts = net.hosts(build_dir, image_dir, tmp_path, pg.url("fleet"),
                          extra=["--host-dead-after-seconds", "3", "--fleet-secret-file", str(secret)])
        try:
            yield net, pg, hosts
        finally:
            for h in hosts:
                if h.alive():
                    _finish_daemon(h)


def _states(c: Api) -> dict:
    return {h["id"]: h for h in c.get("/v1/hosts").json()["hosts"]}


def _home(pg, sid: str) -> str:
    return pg.psql(f"SELECT host_id FROM sandboxes WHERE id = '{sid}'", "fleet").strip()


def _running(marker: str) -> bool:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0


def test_three_hosts_in_their_namespaces(fleet):
    net, pg, hosts = fleet
    key = hosts[0].api_key
    apis = [Api(h, key=key) for h in hosts]
    try:
        # Each host's own view (its placement's) has the three live.
        for c in apis:
            wait_until(lambda c=c: '\nruntime_fleet_hosts{state="live"} 3\n' in c.get("/metrics").text, 20,
                       what="three live hosts in each host's view")
        # Creates through one host land on all three (best of two by free memory, as each host
        # last reported it: two of each within a bounded number); each answers through any host.
        made: list[str] = []
        while len(made) < 40 and min(sum(_home(pg, m) == n for m in made) for n in ("node0", "node1", "node2")) < 2:
            made.append(apis[0].create_sandbox(driver="namespace", timeoutSeconds=300).id)
        homes = {_home(pg, s) for s in made}
        assert homes == {"node0", "node1", "node2"}, (homes, len(made))
        for i, sid in enumerate(made[:6]):
            assert apis[(i + 1) % 3].exec(sid, command="echo ok")["stdout"] == "ok\n"

        # node1 killed: its sandboxes lost within the dead-after time (plus a sweep), seen
        # through every other host; creates avoid it; restarted, a new epoch, nothing back.
        on1 = [s for s in made if _home(pg, s) == "node1"]
        epoch = _states(apis[0])["node1"]["epoch"]
        hosts[1].kill()
        for sid in on1:
            st = apis[2].wait_state(sid, "lost", timeout=20)
            assert "node1" in st["failureReason"], st
        # The death is in the admin's audit trail (and events), with the epoch it died at.
        dead = apis[0].get("/v1/audit", params={"action": "host.dead"}).json()["events"]
        assert any(e["detail"].get("host") == "node1" and e["detail"].get("epoch") == epoch for e in dead), dead
        for _ in range(4):
            sid = apis[0].create_sandbox(driver="namespace", timeoutSeconds=120).id
            assert _home(pg, sid) != "node1"
        hosts[1].start()
        back = _states(apis[0])["node1"]
        assert back["state"] == "live" and back["epoch"] > epoch, back
        assert all(apis[0].get(f"/v1/sandboxes/{s}").json()["state"] == "lost" for s in on1)

        # node2's link down: it fences itself and stops its sandboxes; the others declare it dead.
        on2 = [s for s in made if _home(pg, s) == "node2"]
        marker = f"sleep {20000 + os.getpid() % 1000}.75"
        r = apis[0].post(f"/v1/sandboxes/{on2[0]}/processes", json={"command": marker})
        assert r.status_code in (200, 201), r.text
        wait_until(lambda: _running(marker), 15, what="the process on node2")
        net_host = hosts[2]
        net_host.link_down()
        try:
            wait_until(lambda: not _running(marker), 20, interval=0.2, what="node2 to stop its sandboxes")
            assert "is fenced" in net_host.log_path.read_text()
            st = apis[0].wait_state(on2[0], "lost", timeout=20)
            assert "node2" in st["failureReason"], st
            assert _states(apis[0])["node2"]["state"] == "dead"
        finally:
            net_host.link_up()
        wait_until(lambda: _states(apis[0])["node2"]["state"] == "live", 30, interval=0.5,
                   what="node2 to rejoin")
        # Registered again, it lifts its fence once it has marked what was its own.
        wait_until(lambda: apis[2].get("/healthz").status_code == 200, 30, interval=0.2, what="node2 to serve")
    finally:
        for c in apis:
            c.close()


def _sweeper(apis: list[Api]) -> int | None:
    """The index of the host that holds the sweeper lease, as each host's metrics say."""
    held = [i for i, c in enumerate(apis) if "\nruntime_host_sweeper 1\n" in c.get("/metrics").text]
    return held[0] if len(held) == 1 else None


def test_the_sweeper_killed(fleet):
    # The host holding the sweeper lease (the fleet's timed work: dead hosts, retention) killed: another
    # host takes the lease within the dead-after time and declares the killed one dead, its sandbox
    # lost; a lease that ends on a surviving host ends on time and once (lease ends are each owner
    # host's own work, not the sweeper's).
    net, pg, hosts = fleet
    key = hosts[0].api_key
    apis = [Api(h, key=key) for h in hosts]
    try:
        wait_until(lambda: _sweeper(apis) is not None, 20, interval=0.2, what="one sweeper")
        s = _sweeper(apis)
        others = [i for i in range(3) if i != s]
        # A sandbox on the sweeper, one on another host with a lease of 15 s: creates land anywhere,
        # so create until each has its own.
        on_s = on_t = None
        t = others[0]
        for _ in range(40):
            sid = apis[t].create_sandbox(driver="namespace", timeoutSeconds=15 if on_t is None else 300).id
            home = _home(pg, sid)
            if home == f"node{s}" and on_s is None:
                on_s = sid
            elif home == f"node{t}" and on_t is None:
                on_t = sid
            else:
                apis[t].delete(f"/v1/sandboxes/{sid}")
            if on_s and on_t:
                break
        assert on_s and on_t, "no create landed on the sweeper and on the other host in 40"
        hosts[s].kill()
        wait_until(lambda: _sweeper([apis[i] for i in others]) is not None, 20, interval=0.2,
                   what="another host to take the sweeper lease")
        st = apis[t].wait_state(on_s, "lost", timeout=20)
        assert f"node{s}" in st["failureReason"], st
        # The 15 s lease of the sandbox on the surviving host ends (by its owner), once.
        st = apis[others[1]].wait_state(on_t, "stopped", timeout=30)
        stops = [e for e in apis[t].get("/v1/events", params={"resourceId": on_t}).json()["data"]
                 if e["type"] == "sandbox.stopped"]
        assert len(stops) == 1, stops
        hosts[s].start()
    finally:
        for c in apis:
            c.close()
