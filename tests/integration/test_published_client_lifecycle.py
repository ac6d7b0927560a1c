"""Conformance: the published withruntime client (0.35.0, in a venv of its own) drives runtimed's
lifecycle: pause(), wake() (also of a sandbox already awake, which it takes as done), stop()
then restart() and wake(), create(on_lease_end="pause", idle_pause_seconds=..., auto_wake=...),
a paused sandbox woken by a command, and create(user="root") with update()'s user, env and
settings. The sandbox is made by the suite where the driver
matters (the published create has no driver field) and attached to with Sandbox.connect."""
from __future__ import annotations

import pytest


PRELUDE = """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
"""


@pytest.mark.microvm_subset
def test_pause_wake_keeps_the_process(pub, api, driver):
    sbx = api.create_sandbox(driver=driver, timeoutSeconds=900)
    got = pub(PRELUDE + """
# Each count lands whole (written aside, then renamed over): a read never finds the file emptied.
p = sbx.spawn("i=0; while :; do i=$((i+1)); echo $i > /workspace/n.new; mv /workspace/n.new /workspace/n; "
              "sleep 0.05; done")
import time
deadline = time.monotonic() + 240
while sbx.exec("cat /workspace/n 2>/dev/null || echo 0").stdout.strip() in ("", "0"):
    assert time.monotonic() < deadline
before = int(sbx.exec("cat /workspace/n").stdout)
sbx.pause()
paused = sbx.state
sbx.wake()
woke = sbx.state
again = sbx.wake()          # awake already: the client takes not_paused as done
after = int(sbx.exec("cat /workspace/n").stdout)
procs = [q["id"] for q in sbx.processes() if q["state"] == "running"]
print(json.dumps({"paused": paused, "woke": woke, "again": again.state, "before": before,
                  "after": after, "pid": p.id, "running": procs}))
""", sbx.id)
    assert got["paused"] == "paused" and got["woke"] == "running" and got["again"] == "running", got
    assert got["after"] >= got["before"] >= 1, got
    assert got["pid"] in got["running"], got


@pytest.mark.microvm_subset
def test_stop_restart_and_wake_boot_from_disk(pub, api, driver):
    sbx = api.create_sandbox(driver=driver)
    got = pub(PRELUDE + """
sbx.files.write("/workspace/kept.txt", "files stay")
sbx.stop()
stopped = sbx.state
sbx.restart()
restarted = sbx.state
kept1 = sbx.files.read("/workspace/kept.txt")
sbx.stop()
sbx.wake()
woke = sbx.state
kept2 = sbx.files.read("/workspace/kept.txt")
print(json.dumps({"stopped": stopped, "restarted": restarted, "woke": woke,
                  "kept": [kept1 if isinstance(kept1, str) else kept1.decode(),
                           kept2 if isinstance(kept2, str) else kept2.decode()]}))
""", sbx.id)
    assert got == {"stopped": "stopped", "restarted": "running", "woke": "running",
                   "kept": ["files stay", "files stay"]}, got


def test_create_fields_and_refusals(pub, api):
    got = pub("""
import json
from withruntime import Runtime, RuntimeError as RtError
rt = Runtime()
sbx = rt.sandboxes.create(on_lease_end="pause", idle_pause_seconds=600, auto_wake=True, timeout_seconds=600)
out = {"state": sbx.state, "onLeaseEnd": sbx.info["onLeaseEnd"], "idle": sbx.info["idlePauseSeconds"],
       "autoWake": sbx.info["autoWake"]}
sbx.pause()
out["paused"] = sbx.state
out["echo"] = sbx.exec("echo woken").stdout       # auto-wake: a command wakes it first
out["after_exec"] = sbx.refresh().state
sbx.stop()
try:
    sbx.pause()
    out["pause_stopped"] = "accepted"
except RtError as e:
    out["pause_stopped"] = [e.code, e.status, "stopped" in str(e)]
sbx.delete()
print(json.dumps(out))
""")
    assert got["state"] == "running" and got["onLeaseEnd"] == "pause", got
    assert got["idle"] == 600 and got["autoWake"] is True, got
    assert got["paused"] == "paused" and got["echo"] == "woken\n" and got["after_exec"] == "running", got
    assert got["pause_stopped"] == ["conflict", 409, True], got


def test_user_and_update_settings(pub, api):
    """Sandbox.create(user="root") runs commands as root; update(user=...), update(env=...) (None
    removes a variable), auto_wake, idle_pause_seconds and max_total_cost_micros change it; a bad
    value or a field this daemon has no counterpart for raises with the status and changes
    nothing."""
    got = pub("""
import json
from withruntime import Sandbox, RuntimeError as RtError
sbx = Sandbox.create(user="root", timeout_seconds=600)
out = {"user": sbx.info.get("user"), "root": sbx.exec("id -u").stdout}
sbx.update(user="sandbox")
out["sandbox"] = sbx.exec("id -u").stdout
out["asked"] = sbx.exec("id -u", user="root").stdout
sbx.update(env={"A": "1"})
out["set"] = sbx.exec("echo $A").stdout
sbx.update(env={"A": None})
out["removed"] = sbx.exec("echo ${A-unset}").stdout
sbx.update(auto_wake=False, idle_pause_seconds=600, max_total_cost_micros=None)
out["settings"] = [sbx.info["autoWake"], sbx.info["idlePauseSeconds"], sbx.info["maxTotalCostMicros"]]
refused = {}
for name, fields in (("user", {"user": "admin", "env": {"B": "1"}}),
                     ("env", {"env": {"1B": "x"}, "user": "root"}),
                     ("timeout", {"timeout_seconds": 0, "env": {"B": "1"}}),
                     ("persistent", {"persistent": True, "env": {"B": "1"}}),
                     ("cap", {"max_total_cost_micros": 1, "env": {"B": "1"}})):
    try:
        sbx.update(**fields)
        refused[name] = "accepted"
    except RtError as e:
        refused[name] = [e.status, e.code]
out["refused"] = refused
sbx.refresh()
out["after"] = [sbx.info["user"], sbx.exec("id -u; echo ${B-unset}").stdout]
try:
    Sandbox.create(region="eu-1")
    out["region"] = "accepted"
except RtError as e:
    out["region"] = [e.status, e.code, "region" in str(e)]
sbx.delete()
print(json.dumps(out))
""")
    assert got["user"] == "root" and got["root"] == "0\n", got
    assert got["sandbox"] == "1000\n" and got["asked"] == "0\n", got
    assert got["set"] == "1\n" and got["removed"] == "unset\n", got
    assert got["settings"] == [False, 600, None], got
    assert got["refused"] == {"user": [400, "invalid_request"], "env": [400, "invalid_request"],
                              "timeout": [400, "invalid_request"], "persistent": [501, "not_implemented"],
                              "cap": [409, "budget_exceeded"]}, got
    assert got["after"] == ["sandbox", "1000\nunset\n"], got
    assert got["region"] == [501, "not_implemented", True], got


def test_keep_alive_extends_the_lease(pub, api):
    """keep_alive() reads the sandbox's endsAt and extends its lease so that margin_seconds remain
    (before the API gave endsAt, it had no end to read and extended nothing)."""
    sbx = api.create_sandbox(timeoutSeconds=30)
    got = pub(PRELUDE + """
import time
from datetime import datetime
def ends():
    sbx.refresh()
    return datetime.fromisoformat(sbx.info["endsAt"].replace("Z", "+00:00")).timestamp()
first = ends()
stop = sbx.keep_alive(every_seconds=10, margin_seconds=120)
deadline = time.monotonic() + 30
while ends() - time.time() < 110 and time.monotonic() < deadline:
    time.sleep(0.2)
left = ends() - time.time()
stop()
print(json.dumps({"first": first - time.time(), "left": left, "same": sbx.info["endsAt"] == sbx.info["leaseEndsAt"]}))
""", sbx.id)
    assert got["first"] <= 31, got
    assert 110 <= got["left"] <= 125, got
    assert got["same"] is True, got
