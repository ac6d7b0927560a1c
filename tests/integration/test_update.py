"""POST /v1/sandboxes/{id}:update with every setting the published client's update() sends, and a
sandbox-wide user: `user` on create and update decides who commands, processes, file operations
and archives run as when a request names none (a request's own user wins); `env` sets (a string)
or removes (null) variables for commands started afterwards; `autoWake`, `idlePauseSeconds` and
`maxTotalCostMicros` change as at create; an update is all or nothing, concurrent ones serialise,
and what it set survives a daemon restart. The client's create fields this daemon has no
counterpart for are refused by name."""
from __future__ import annotations

import concurrent.futures
import io
import json
import os
import signal
import sys
import tarfile
import time
from pathlib import Path

import pytest

from helpers import assert_error, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))


def update(api, sid: str, status: int = 200, **fields) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}:update", json=fields)
    assert r.status_code == status, r.text
    return r.json()


def uid(sbx, **body) -> str:
    return sbx.run("id -u", **body).strip()


def test_user_at_create_and_update(api, driver):
    """A sandbox created with user "root" runs commands, processes, file writes and archive
    unpacks as root; a request naming a user still gets it; :update moves the default and null
    brings back the sandbox user."""
    if driver == "microvm":
        pytest.skip("the user is the agent's, the same on every driver; namespace and gVisor cover it")
    sbx = api.create_sandbox(driver=driver, user="root")
    assert sbx["user"] == "root", sbx
    assert uid(sbx) == "0"
    assert uid(sbx, user="sandbox") == "1000"  # the request's own user wins
    assert sbx.put_file("/workspace/by-default", b"x").status_code in (200, 201)
    assert sbx.run("stat -c %u /workspace/by-default").strip() == "0"

    got = update(api, sbx.id, user="sandbox")
    assert got["user"] == "sandbox", got
    assert uid(sbx) == "1000"
    assert uid(sbx, user="root") == "0"
    assert sbx.put_file("/workspace/as-sandbox", b"x").status_code in (200, 201)
    assert sbx.run("stat -c %u /workspace/as-sandbox").strip() == "1000"
    # A file the sandbox user may not write is refused as that user, not written as root.
    assert sbx.put_file("/etc/not-theirs", b"x").status_code >= 400
    assert sbx.exec("test -e /etc/not-theirs")["exitCode"] == 1

    assert update(api, sbx.id, user="root")["user"] == "root"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("from-tar")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"y"))
    r = api.put(f"/v1/sandboxes/{sbx.id}/files/archive", params={"path": "/workspace/unpacked"},
                content=buf.getvalue(), headers={"Content-Type": "application/gzip"})
    assert r.status_code in (200, 201), r.text
    assert sbx.run("stat -c %u /workspace/unpacked/from-tar").strip() == "0"

    assert update(api, sbx.id, user=None)["user"] == "sandbox"  # null: back to the default
    assert uid(sbx) == "1000"
    assert api.sandbox(sbx.id)["user"] == "sandbox"


def test_process_runs_as_the_sandbox_default(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, user="root")
    r = api.post(f"/v1/sandboxes/{sbx.id}/processes", json={"command": "id -u; whoami"})
    assert r.status_code == 201, r.text
    pid = r.json()["id"]
    with api.stream("GET", f"/v1/sandboxes/{sbx.id}/processes/{pid}/output",
                    params={"follow": "true"}) as out:
        assert out.status_code == 200
        evs = [json.loads(line) for line in out.iter_lines() if line.strip()]
    assert "".join(e["data"] for e in evs if e["type"] == "stdout") == "0\nroot\n", evs
    assert api.get(f"/v1/sandboxes/{sbx.id}/processes/{pid}").json()["user"] == "root"


def test_terminal_and_interpreter_follow_the_sandbox_user(api, daemon, any_driver, monkeypatch):
    """A terminal that names no user, and an interpreter context started after :update, run as
    the sandbox's own user."""
    from withruntime import Sandbox as SdkSandbox
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    sbx = api.create_sandbox(driver=any_driver)
    update(api, sbx.id, user="root")
    r = api.post(f"/v1/sandboxes/{sbx.id}/interpreter:run",
                 json={"code": "import os; print(os.getuid())"}, timeout=180)
    assert r.status_code == 200 and r.json()["stdout"] == "0\n", r.text
    with SdkSandbox.connect(sbx.id) as s, s.terminal(command="id -u; exit 0") as term:
        seen = b""
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, seen
            try:
                chunk = term.recv(timeout=deadline - time.monotonic())
            except TimeoutError:
                continue
            if chunk is None:
                break
            seen += chunk
    assert seen.split() == [b"0"], seen


def test_create_refuses_bad_user(api, any_driver):
    for bad in ("nobody", "", "Root", 0, True, ["root"]):
        assert_error(api.post("/v1/sandboxes", json={"driver": any_driver, "user": bad}), 400,
                     "invalid_request", mentions="user")


def test_update_env(api, any_driver):
    """A value sets a variable, null removes it; the creator's other variables stay; commands
    started afterwards see the change; an exec's own env still wins."""
    sbx = api.create_sandbox(driver=any_driver, env={"KEEP": "k"})
    update(api, sbx.id, env={"A": "1"})
    assert sbx.run('echo "$A $KEEP"') == "1 k\n"
    assert sbx.run('echo "$A"', env={"A": "mine"}) == "mine\n"
    update(api, sbx.id, env={"A": "2", "B": "b"})
    assert sbx.run('echo "$A $B"') == "2 b\n"
    update(api, sbx.id, env={"A": None, "NEVER_SET": None})
    assert sbx.run('echo "${A-unset} $B $KEEP"') == "unset b k\n"


def test_update_env_bounds(api, any_driver):
    """Bounded as a create's env, for the whole env the update leaves: a refusal changes nothing."""
    sbx = api.create_sandbox(driver=any_driver, env={f"V{i}": "x" for i in range(100)})
    too_many = {f"W{i}": "y" for i in range(29)}
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json={"env": too_many, "labels": {"x": "1"}}),
                 400, "invalid_request", mentions="128")
    assert api.sandbox(sbx.id)["labels"] == {}
    assert sbx.run('echo "${W0-unset}"') == "unset\n"
    # Removing makes room in the same update.
    update(api, sbx.id, env={**too_many, "V0": None})
    assert sbx.run('echo "$W28 ${V0-unset}"') == "y unset\n"
    big = "z" * (32 * 1024)
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json={"env": {"BIG": big + "z"}}), 400,
                 "invalid_request", mentions="env.BIG")
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json={"env": {"B1": big, "B2": big}}), 400,
                 "invalid_request", mentions="bytes")
    for bad in ({"1A": "x"}, {"A=B": "x"}, {"A": 1}, {"A": ["x"]}, [], "A=1", None):
        assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json={"env": bad}), 400, "invalid_request",
                     mentions="env")
    assert sbx.run('echo "${B1-unset}"') == "unset\n"


def test_update_is_all_or_nothing(api, any_driver):
    """Every field is checked before anything changes: a refused one (a bad value, a cap below
    the sandbox's lease, no lease at all, persistent) leaves name, labels, env, user and the
    rest as they were."""
    sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=600, vcpu=1, memoryMiB=256, name="before")
    before = api.sandbox(sbx.id)
    refused = [
        ({"name": "after", "labels": {"a": "1"}, "env": {"A": "1"}, "user": "nobody"}, 400, "user"),
        ({"name": "after", "env": {"A": "1"}, "autoWake": "yes"}, 400, "autoWake"),
        ({"name": "after", "env": {"A": "1"}, "idlePauseSeconds": -1}, 400, "idlePauseSeconds"),
        ({"name": "after", "env": {"A": "1"}, "onTimeout": "later"}, 400, "onTimeout"),
        ({"name": "after", "env": {"A": "1"}, "maxTotalCostMicros": -1}, 400, "maxTotalCostMicros"),
        ({"name": "after", "env": {"A": "1"}, "timeoutSeconds": 0}, 400, "lease"),
        ({"name": "after", "env": {"A": "1"}, "persistent": True}, 501, "persistent"),
        # 600 s of this sandbox cost more than 1 micro-dollar.
        ({"name": "after", "env": {"A": "1"}, "user": "root", "maxTotalCostMicros": 1}, 409,
         "maxTotalCostMicros"),
        ({"name": "after", "region": "eu"}, 400, "region"),
    ]
    for body, status, mentions in refused:
        assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json=body), status, mentions=mentions)
        now = api.sandbox(sbx.id)
        for k in ("name", "labels", "user", "autoWake", "idlePauseSeconds", "maxTotalCostMicros",
                  "leaseEndsAt", "onLeaseEnd"):
            assert now[k] == before[k], (body, k, now[k], before[k])
        assert sbx.run('echo "${A-unset}"') == "unset\n", body
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:update", json={"maxTotalCostMicros": 1}), 409,
                 "budget_exceeded")
    # persistent: false is what every sandbox here is.
    assert update(api, sbx.id, persistent=False)["name"] == "before"


def test_update_lifecycle_settings(api, any_driver):
    """autoWake, idlePauseSeconds (raised to the daemon's minimum), onTimeout "pause" and the
    total cap (null removes it) as a create takes them; the answer is the sandbox."""
    sbx = api.create_sandbox(driver=any_driver, timeoutSeconds=600, maxTotalCostMicros=10**9)
    got = update(api, sbx.id, autoWake=False, idlePauseSeconds=5, onTimeout="pause", maxTotalCostMicros=None)
    assert got["autoWake"] is False and got["onLeaseEnd"] == "pause", got
    assert got["idlePauseSeconds"] == 60, got  # the daemon's --idle-pause-min-seconds
    assert got["maxTotalCostMicros"] is None, got
    assert update(api, sbx.id, idlePauseSeconds=0)["idlePauseSeconds"] == 0
    r = api.post(f"/v1/sandboxes/{sbx.id}:pause", json={})
    assert r.status_code == 200, r.text
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "true"}), 409, "conflict",
                 mentions="autoWake")
    update(api, sbx.id, autoWake=True)
    assert sbx.run("echo woken") == "woken\n"
    assert api.sandbox(sbx.id)["state"] == "running"
    got = update(api, sbx.id, maxTotalCostMicros=10**9, onLeaseEnd="stop")
    assert got["maxTotalCostMicros"] == 10**9 and got["onLeaseEnd"] == "stop", got

    fixed = api.create_sandbox(driver=any_driver, pausable=False)
    for body in ({"onTimeout": "pause"}, {"idlePauseSeconds": 600}):
        assert_error(api.post(f"/v1/sandboxes/{fixed.id}:update", json=body), 400, "invalid_request",
                     mentions="pausable")
    assert api.sandbox(fixed.id)["onLeaseEnd"] == "stop"


def test_idle_pause_set_by_update_counts_from_now(fresh_daemon, fresh_api, any_driver):
    """idlePauseSeconds set by :update pauses a sandbox left idle that long from the update (a
    daemon with a 1 s minimum, so that the wait is short)."""
    fresh_daemon.stop()
    fresh_daemon.extra_args = list(fresh_daemon.extra_args or []) + ["--idle-pause-min-seconds", "1"]
    fresh_daemon.start()
    with fresh_daemon.client() as api:
        r = api.post("/v1/sandboxes", json={"driver": any_driver})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        r = api.post(f"/v1/sandboxes/{sid}:update", json={"idlePauseSeconds": 2})
        assert r.status_code == 200 and r.json()["idlePauseSeconds"] == 2, r.text
        wait_until(lambda: api.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused", timeout=60,
                   what="the idle pause")


def test_concurrent_updates_serialise(api, any_driver):
    """Updates of one sandbox run one at a time: each one's env change is merged into what the
    one before left, none lost."""
    sbx = api.create_sandbox(driver=any_driver)

    def one(i: int) -> int:
        return api.post(f"/v1/sandboxes/{sbx.id}:update",
                        json={"env": {f"V{i}": str(i)}, "labels": {"last": str(i)}}).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(16))) == {200}
    out = sbx.run("env | grep -c '^V[0-9]*='")
    assert out.strip() == "16", out
    assert api.sandbox(sbx.id)["labels"]["last"] in {str(i) for i in range(16)}


def test_update_survives_a_restart(fresh_daemon, fresh_api, any_driver):
    """user, env and autoWake set by :update are the sandbox's record: a daemon killed and
    started again re-attaches the sandbox with them, and a :restart boots it with them."""
    sbx = fresh_api.create_sandbox(driver=any_driver, env={"KEEP": "k"})
    update(fresh_api, sbx.id, user="root", env={"A": "1"}, autoWake=False, idlePauseSeconds=600)
    os.kill(fresh_daemon.pid, signal.SIGKILL)
    fresh_daemon.proc.wait(30)
    fresh_daemon.start()
    with fresh_daemon.client() as api:
        got = api.get(f"/v1/sandboxes/{sbx.id}").json()
        want = "stopped" if any_driver == "microvm" else "running"
        assert got["state"] == want and got["user"] == "root", got
        assert got["autoWake"] is False and got["idlePauseSeconds"] == 600, got
        r = api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": 'id -u; echo "$A $KEEP"'})
        if want == "running":
            assert r.status_code == 200 and r.json()["stdout"] == "0\n1 k\n", r.text
        r = api.post(f"/v1/sandboxes/{sbx.id}:restart", json={})
        assert r.status_code == 200, r.text
        r = api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": 'id -u; echo "$A $KEEP"'})
        assert r.status_code == 200 and r.json()["stdout"] == "0\n1 k\n", r.text


def test_fork_copies_the_user(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, user="root")
    r = api.post(f"/v1/sandboxes/{sbx.id}:fork", json={})
    if r.status_code == 501:
        pytest.skip(f"no fork on {any_driver}: {r.text}")
    assert r.status_code in (200, 201), r.text
    copy = r.json()["sandboxes"][0]
    api.created.append(copy["id"])
    assert copy["user"] == "root", copy
    res = api.exec(copy["id"], command="id -u")
    assert res["stdout"] == "0\n", res


@pytest.mark.parametrize("field,value", [
    ("persistent", True), ("funding", "credit"), ("region", "eu-1"), ("spreadFrom", ["sbx_x"]),
    ("cpu", "performance"), ("cpuFloorMillis", 250),
    ("tailscale", {"authKey": "k"}),
])
def test_create_names_client_fields_it_has_no_counterpart_for(api, any_driver, field, value):
    err = assert_error(api.post("/v1/sandboxes", json={"driver": any_driver, field: value}), 501,
                       "not_implemented")
    assert err["message"].startswith(f"{field}:") and err["hint"], err


def test_create_takes_persistent_false(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver, persistent=False)
    assert sbx["leaseEndsAt"] is not None, sbx
