"""An upgrade keeps an installation's state: a state directory written by the runtimed
users run today (BASELINE, the release before the store and the typed model) is opened
by the runtimed of this tree, and every sandbox, file, key, secret, snapshot and ledger
row is still there and works. The old daemon is built from its commit (helpers/baseline.py)."""
from __future__ import annotations

import os
from datetime import datetime

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, skip_unless_driver, wait_until
from helpers.baseline import BaselineUnavailable, baseline_build

# The main of the last release: its schema, its stored spec and its files.
BASELINE = "7f6fcf458d53365f048380fbacdb0daee23b85e9"


@pytest.fixture
def old_build() -> os.PathLike:
    try:
        return baseline_build(BASELINE)
    except BaselineUnavailable as e:
        pytest.skip(str(e))


def _instant(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _states(api: Api, ids: list[str]) -> dict[str, dict]:
    r = api.get("/v1/sandboxes")
    assert r.status_code == 200, r.text
    body = r.json()
    rows = body.get("sandboxes", body.get("data", body)) if isinstance(body, dict) else body
    return {s["id"]: s for s in rows if s["id"] in ids}


def test_a_state_dir_of_the_last_release_opens_and_works(old_build, build_dir, image_dir, tmp_path):
    # The last release knows no --stop-sandboxes-on-exit: it stops its sandboxes on SIGTERM anyway.
    d = _start_daemon(old_build, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-upgrade",
                      keep_sandboxes=True)
    admin = d.client()
    try:
        skip_unless_driver(d, "namespace")
        # What users have: a key of another owner with a daily limit, a read key, a secret.
        r = admin.post("/v1/keys", json={"name": "agent-prod", "owner": "team-a",
                                         "dailyLimitMicros": 25_000_000})
        assert r.status_code == 201, r.text
        key = r.json()
        team = Api(d, key=key["key"])
        r = team.post("/v1/keys", json={"name": "dashboard", "access": "read"})
        assert r.status_code == 201, r.text
        read_key = r.json()["key"]
        r = team.put("/v1/egress-secrets/GH_TOKEN", json={"value": "s3cret-value",
                                                          "hosts": ["api.github.com"]})
        assert r.status_code in (200, 201), r.text
        placeholder = r.json()["placeholder"]

        # A running sandbox, a stopped one and a paused one, each with a file of its own.
        made = {}
        for which in ("live", "stopped", "paused"):
            sbx = team.create_sandbox(driver="namespace", name=f"up-{which}", labels={"role": which},
                                      timeoutSeconds=3600, env={"WHICH": which})
            sbx.write("/workspace/kept.txt", f"kept by {which}\n".encode())
            made[which] = sbx.id
        r = team.post(f"/v1/sandboxes/{made['live']}:snapshot", json={"name": "before-upgrade"})
        assert r.status_code == 201, r.text
        snap = r.json()
        assert team.post(f"/v1/sandboxes/{made['stopped']}:stop", json={}).status_code == 200
        assert team.post(f"/v1/sandboxes/{made['paused']}:pause", json={}).status_code == 200
        before = _states(team, list(made.values()))
        assert {s["state"] for s in before.values()} == {"running", "stopped", "paused"}, before
        usage_before = team.get("/v1/usage").json()
        assert {s["sandboxId"] for s in usage_before["sandboxes"]} >= set(made.values()), usage_before

        # The upgrade: the old daemon stops, the new one starts on the same state dir and port.
        assert d.stop() == 0, "the old runtimed did not stop cleanly"
        d.build_dir = build_dir
        d.keep_sandboxes = False
        d.start()

        # Every sandbox with its name, labels, spec and files; each one works again.
        after = _states(team, list(made.values()))
        assert set(after) == set(made.values()), f"sandboxes lost in the upgrade: {before} -> {after}"
        for which, sid in made.items():
            s = after[sid]
            assert s["name"] == f"up-{which}" and s["labels"] == {"role": which}, s
            for field in ("vcpu", "memoryMiB", "diskMiB", "driver", "image", "network"):
                assert s[field] == before[sid][field], (field, before[sid], s)
            # The same instant; this daemon writes it with milliseconds (.000 for a row of before).
            assert _instant(s["createdAt"]) == _instant(before[sid]["createdAt"]), (before[sid], s)
            if s["state"] != "running":
                r = team.post(f"/v1/sandboxes/{sid}:wake", json={})
                assert r.status_code == 200, r.text
                team.wait_state(sid, "running")
            res = team.exec(sid, command="cat /workspace/kept.txt; echo $WHICH")
            assert res["stdout"] == f"kept by {which}\n{which}\n", res

        # Keys: the team's key still works and is still limited; the read key still only reads.
        limits = team.get("/v1/limits").json()
        assert limits["owner"] == "team-a" and limits["daily"]["limitMicros"] == 25_000_000, limits
        reader = Api(d, key=read_key)
        try:
            assert reader.get(f"/v1/sandboxes/{made['live']}").status_code == 200
            assert_error(reader.post("/v1/sandboxes", json={}), 403, "forbidden")
            # Made before keepsAwake: its requests are still no activity.
            assert reader.get("/v1/me").json()["keepsAwake"] is False
            listed = {k["name"]: k for k in team.get("/v1/keys").json()["keys"]}
            assert listed["dashboard"]["keepsAwake"] is False and listed["agent-prod"]["keepsAwake"] is True, listed
        finally:
            reader.close()
        # The secret keeps its placeholder and hosts.
        r = team.get("/v1/egress-secrets/GH_TOKEN")
        assert r.status_code == 200, r.text
        assert r.json()["placeholder"] == placeholder and r.json()["hosts"] == ["api.github.com"], r.json()
        # The ledger: what was charged before is still charged.
        usage_after = team.get("/v1/usage").json()
        assert usage_after["totalMicros"] >= usage_before["totalMicros"], (usage_before, usage_after)
        assert {s["sandboxId"] for s in usage_after["sandboxes"]} >= set(made.values()), usage_after
        # The snapshot: listed, and a sandbox made from it has the file.
        r = team.get(f"/v1/snapshots/{snap['id']}")
        assert r.status_code == 200 and r.json()["name"] == "before-upgrade", r.text
        copy = team.create_sandbox(snapshot=snap["id"])
        assert copy.run("cat /workspace/kept.txt") == "kept by live\n"
        # And something new works.
        fresh = team.create_sandbox(driver="namespace")
        assert fresh.run("echo $((6*7))") == "42\n"
        wait_until(lambda: team.get(f"/v1/sandboxes/{fresh.id}").json()["state"] == "running", 10)
        team.created += list(made.values())
        team.close()
    finally:
        admin.close()
        _finish_daemon(d)
