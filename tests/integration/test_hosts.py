"""GET /v1/hosts (docs/api.md): a runtimed registers itself in its store at start-up, under the
id kept in <state-dir>/host.id, and heartbeats; a restart registers again at the next epoch.
Only the admin key sees the hosts."""
from __future__ import annotations

import os
import re
import stat

from helpers import Api, assert_error, wait_until

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def _this_host(daemon) -> dict:
    host_id = (daemon.state_dir / "host.id").read_text().strip()
    with Api(daemon) as c:
        r = c.get("/v1/hosts")
        assert r.status_code == 200, r.text
        hosts = {h["id"]: h for h in r.json()["hosts"]}
    assert host_id in hosts, hosts
    return hosts[host_id]


def test_a_daemon_registers_itself(fresh_daemon):
    path = fresh_daemon.state_dir / "host.id"
    assert re.fullmatch(r"host_[0-9a-f]{16}", path.read_text().strip())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    h = _this_host(fresh_daemon)
    assert h["url"] == fresh_daemon.base_url
    assert h["state"] == "live"
    assert h["epoch"] == 1
    assert h["version"]
    assert isinstance(h["drivers"], list) and h["drivers"], h
    assert h["vcpu"] >= 1 and h["memoryMiB"] >= 1
    assert RFC3339.match(h["startedAt"]) and RFC3339.match(h["heartbeatAt"]), h
    first = h["heartbeatAt"]
    # Heartbeats every 5 s move heartbeatAt on (RFC 3339 compares as text).
    wait_until(lambda: _this_host(fresh_daemon)["heartbeatAt"] > first, 20, interval=0.5,
               what="a later heartbeatAt")


def test_a_restart_registers_the_same_id_at_the_next_epoch(fresh_daemon):
    before = _this_host(fresh_daemon)
    assert before["epoch"] == 1
    assert fresh_daemon.stop() == 0
    fresh_daemon.start()
    after = _this_host(fresh_daemon)
    assert after["id"] == before["id"]
    assert after["epoch"] == 2
    assert after["state"] == "live"


def test_the_hosts_are_the_admin_keys(api, daemon):
    r = api.post("/v1/keys", json={"name": "hosts-other", "owner": "hosts-other"})
    assert r.status_code == 201, r.text
    with Api(daemon, key=r.json()["key"]) as full:
        assert_error(full.get("/v1/hosts"), 403, "forbidden")
        r = full.post("/v1/keys", json={"name": "hosts-other-read", "access": "read"})
        assert r.status_code == 201, r.text
        with Api(daemon, key=r.json()["key"]) as read:
            assert_error(read.get("/v1/hosts"), 403, "forbidden")
    assert api.get("/v1/hosts").status_code == 200


def test_a_drained_host_starts_nothing_new(fresh_daemon, build_dir):
    # Drained (through the CLI), the host refuses a create with the published client's
    # capacity error (which its create waits out), keeps the sandbox it has, stays drained
    # across a restart, and takes creates again once undrained.
    import subprocess
    host_id = _this_host(fresh_daemon)["id"]

    def cli(*args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        env.update(fresh_daemon.env())
        return subprocess.run([str(build_dir / "runtime"), *args], env=env, capture_output=True, text=True,
                              timeout=60)

    with Api(fresh_daemon) as c:
        kept = c.create_sandbox(timeoutSeconds=120)
        r = cli("hosts", "drain", host_id)
        assert r.returncode == 0 and "draining" in r.stdout, (r.stdout, r.stderr)
        assert_error(c.post("/v1/sandboxes", json={}), 503, "no_capacity")
        assert kept.run("echo on") == "on\n"
        r = cli("hosts", "ls")
        assert r.returncode == 0 and host_id in r.stdout and "draining" in r.stdout, r.stdout
        r = cli("hosts", "drain", "no/such")
        assert r.returncode != 0 and "not a host id" in r.stderr, r.stderr
        assert_error(c.post("/v1/hosts/host-none:drain", json={}), 404, "not_found")
    assert fresh_daemon.stop() == 0
    fresh_daemon.start()
    assert _this_host(fresh_daemon)["state"] == "draining"
    with Api(fresh_daemon) as c:
        assert_error(c.post("/v1/sandboxes", json={}), 503, "no_capacity")
        r = cli("--json", "hosts", "undrain", host_id)
        assert r.returncode == 0, r.stderr
        assert '"live"' in r.stdout, r.stdout
        assert c.create_sandbox(timeoutSeconds=60).run("echo again") == "again\n"


def test_draining_is_the_admin_keys(api, daemon):
    r = api.post("/v1/keys", json={"name": "drain-other", "owner": "drain-other"})
    assert r.status_code == 201, r.text
    host_id = (daemon.state_dir / "host.id").read_text().strip()
    with Api(daemon, key=r.json()["key"]) as full:
        assert_error(full.post(f"/v1/hosts/{host_id}:drain", json={}), 403, "forbidden")
    assert _this_host(daemon)["state"] == "live"


def test_a_single_host_keeps_its_sandboxes_under_a_new_id(fresh_daemon):
    # A SQLite store is one host's: given another --host-id, the daemon still owns every sandbox
    # of its file (it wakes and answers), and its snapshots stay its own.
    with Api(fresh_daemon) as c:
        sbx = c.create_sandbox(timeoutSeconds=120)
        sbx.run("echo kept > /workspace/k")
        r = c.post(f"/v1/sandboxes/{sbx.id}:snapshot", json={})
        assert r.status_code in (200, 201), r.text
        snap = r.json()["id"]
    assert fresh_daemon.stop() == 0
    fresh_daemon.extra_args += ["--host-id", "renamed-host"]
    fresh_daemon.start()
    with Api(fresh_daemon) as c:
        r = c.post(f"/v1/sandboxes/{sbx.id}:wake", json={})
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        assert c.exec(sbx.id, command="cat /workspace/k")["stdout"] == "kept\n"
        copy = c.create_sandbox(snapshot=snap)
        assert c.exec(copy.id, command="cat /workspace/k")["stdout"] == "kept\n"
