"""Conformance: the published withruntime client (0.35.0, in a venv of its own) drives runtimed's
lifecycle: pause(), wake() (also of a sandbox already awake, which it takes as done), stop()
then restart() and wake(), create(on_lease_end="pause", idle_pause_seconds=..., auto_wake=...),
and a paused sandbox woken by a command. The sandbox is made by the suite where the driver
matters (the published create has no driver field) and attached to with Sandbox.connect."""
from __future__ import annotations

import pytest


@pytest.fixture
def pub(published_client, daemon):
    def run(script: str, *args: str, **kw):
        return published_client.run_json(daemon, script, args=list(args), **kw)
    return run


PRELUDE = """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
"""


@pytest.mark.microvm_subset
def test_pause_wake_keeps_the_process(pub, api, driver):
    sbx = api.create_sandbox(driver=driver, timeoutSeconds=900)
    got = pub(PRELUDE + """
p = sbx.spawn("i=0; while :; do i=$((i+1)); echo $i > /workspace/n; sleep 0.05; done")
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
