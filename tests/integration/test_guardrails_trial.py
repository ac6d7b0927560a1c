"""Guard rails, the trial: `runtime sandbox run --trial` on a clean state
directory with no key set up, the trial key kept and reused, small trial
sandboxes, and the allowance running out with a message that says how to get
a full key. A daemon of its own with a one-hour allowance and three trial keys."""
from __future__ import annotations

import os
import stat
import subprocess

import httpx
import pytest

from helpers import Daemon, DaemonError, assert_error, first_driver, remove_empty_cgroup_tree, tail


@pytest.fixture
def trial_daemon(build_dir, image_dir, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the daemon needs root (cgroups, namespaces, mounts)")
    d = Daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-trial",
               extra_args=["--trial-hours", "1", "--max-trial-keys", "3"])
    try:
        d.start()
    except DaemonError as e:
        pytest.fail(str(e), pytrace=False)
    d.trial_sandboxes = []  # (key, id): trial owners' sandboxes are invisible to the admin key
    yield d
    for key, sid in d.trial_sandboxes:
        httpx.delete(f"{d.base_url}/v1/sandboxes/{sid}", headers={"Authorization": f"Bearer {key}"})
    rc = d.stop()
    remove_empty_cgroup_tree(d.cgroup_parent)
    assert rc == 0, f"runtimed exited with {rc}; log:\n{tail(d.log_path)}"


def trial_key(d: Daemon) -> str:
    r = httpx.post(d.base_url + "/v1/trial")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["trial"] is True and body["trialAllowance"]["sandboxSeconds"] == 3600, body
    assert body["owner"].startswith("trial_")
    return body["key"]


def test_trial_run_from_a_clean_state_dir(trial_daemon, build_dir, tmp_path):
    d = trial_daemon
    drv = first_driver(d)
    user_state = tmp_path / "user" / "state"  # does not exist yet
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    env.update(RUNTIME_BASE_URL=d.base_url, RUNTIME_STATE_DIR=str(user_state))
    cli = [str(build_dir / "runtime")]

    # No key at all: the error says how to try it.
    r = subprocess.run(cli + ["sandbox", "run", "--", "true"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "--trial" in r.stderr, r

    run = cli + ["sandbox", "run", "--trial", "--driver", drv, "--", "python3", "-c", "print(6 * 7)"]
    r = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr, tail(d.log_path, 40))
    assert r.stdout == "42\n"
    assert "trial key" in r.stderr, r.stderr
    key_file = user_state / "trial.key"
    key = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key.startswith("rt_")

    # Later --trial runs reuse the kept key.
    r = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "42\n", r
    assert key_file.read_text().strip() == key
    keys = httpx.get(d.base_url + "/v1/keys", headers={"Authorization": f"Bearer {d.api_key}"}).json()
    assert sum(1 for k in keys["keys"] if k["trial"]) == 1, keys

    lim = httpx.get(d.base_url + "/v1/limits", headers={"Authorization": f"Bearer {key}"}).json()
    assert lim["trial"] is True and lim["trialAllowance"]["sandboxSeconds"] == 3600, lim
    assert lim["trialAllowance"]["remainingSandboxSeconds"] <= 3600
    usage = httpx.get(d.base_url + "/v1/usage", headers={"Authorization": f"Bearer {key}"},
                      params={"since": "0"}).json()
    assert len(usage["sandboxes"]) == 2 and usage["owner"].startswith("trial_"), usage


def test_trial_shape_and_allowance(trial_daemon):
    d = trial_daemon
    drv = first_driver(d)
    key = trial_key(d)
    with httpx.Client(base_url=d.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
        r = c.post("/v1/sandboxes", json={"driver": drv, "timeoutSeconds": 3000})
        assert r.status_code == 201, r.text
        d.trial_sandboxes.append((key, r.json()["id"]))
        sbx = r.json()
        assert sbx["vcpu"] == 1 and sbx["memoryMiB"] == 512, "a trial sandbox is small by default"
        assert_error(c.post("/v1/sandboxes", json={"driver": drv, "vcpu": 4}), 400, "invalid_request",
                     mentions="vcpu")
        assert_error(c.post("/v1/sandboxes", json={"driver": drv, "memoryMiB": 8192}), 400,
                     "invalid_request", mentions="memoryMiB")
        # 3000 of the 3600 free seconds are held by the running sandbox.
        err = assert_error(c.post("/v1/sandboxes", json={"driver": drv, "timeoutSeconds": 1000}), 402,
                           "spending_limit_reached", mentions="trial")
        assert "full key" in err["hint"], err
        assert_error(c.post(f"/v1/sandboxes/{sbx['id']}:extend", json={"seconds": 1200}), 402,
                     "spending_limit_reached")
        # A trial key makes no keys.
        assert_error(c.post("/v1/keys", json={"name": "more", "access": "read"}), 403, "forbidden")
        lim = c.get("/v1/limits").json()["trialAllowance"]
        assert lim["usedSandboxSeconds"] == 3000 and lim["remainingSandboxSeconds"] == 600, lim
        # Stopping settles the reservation to the seconds it ran.
        assert c.post(f"/v1/sandboxes/{sbx['id']}:stop").status_code == 200
        lim = c.get("/v1/limits").json()["trialAllowance"]
        assert lim["usedSandboxSeconds"] < 60, lim
        r = c.post("/v1/sandboxes", json={"driver": drv, "timeoutSeconds": 1000})
        assert r.status_code == 201, r.text
        d.trial_sandboxes.append((key, r.json()["id"]))


def test_trial_keys_are_bounded(trial_daemon):
    d = trial_daemon
    for _ in range(3):
        trial_key(d)
    assert_error(httpx.post(d.base_url + "/v1/trial"), 429, "rate_limited")
    # The route takes no body.
    assert_error(httpx.post(d.base_url + "/v1/trial", json={"hours": 1000}), 400, "invalid_request")
