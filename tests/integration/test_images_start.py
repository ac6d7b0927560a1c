"""An image's start command (docs/images.md, "The start command"): built through the published
client with an explicit start (a web server and its ready port), a sandbox from it serves the page
and the create reports the start ready, its process listed; a CMD-only image starts its CMD; a
start of null (no_start) starts nothing; a command that exits at once is reported failed with its
output while the sandbox runs on; an ENTRYPOINT combines with CMD as Docker's; bad start specs are
400s."""
from __future__ import annotations

import uuid

import pytest

from helpers import wait_until

SERVE = """\
FROM default
WORKDIR /srv/site
RUN echo served-from-the-image > index.html
CMD ["python3", "-m", "http.server", "8000"]
"""

BUILD = """
import json, sys
from withruntime import Runtime
rt = Runtime()
kw = json.loads(sys.argv[2])
image = rt.images.build(dockerfile=sys.argv[1], name=sys.argv[3], **kw)
print(json.dumps(image))
"""


def _name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _build(published_client, daemon, dockerfile, **kw):
    import json
    image = published_client.run_json(daemon, BUILD, args=[dockerfile, json.dumps(kw), _name("start")],
                                      timeout=600)
    assert image["state"] == "ready", image
    return image


@pytest.fixture(scope="module")
def served(published_client, daemon):
    return _build(published_client, daemon, SERVE,
                  start={"command": ["python3", "-m", "http.server", "8000"], "ready_port": 8000,
                         "ready_timeout_seconds": 60})


@pytest.mark.parametrize("driver", ["namespace", "gvisor"], indirect=True)
def test_start_command_is_ready_and_serves(served, api, driver):
    assert served["start"] == {"command": ["python3", "-m", "http.server", "8000"], "readyPort": 8000,
                               "readyTimeoutSeconds": 60}, served
    sbx = api.create_sandbox(driver=driver, image=served["id"])
    start = sbx["start"]
    assert start["state"] == "ready" and start["error"] is None and start["readyMs"] >= 0, start
    out = api.exec(sbx.id, command="python3 -c \"import urllib.request as u; "
                   "print(u.urlopen('http://127.0.0.1:8000/index.html').read().decode())\"")
    assert out["stdout"].strip() == "served-from-the-image", out
    procs = api.get(f"/v1/sandboxes/{sbx.id}/processes").json()["data"]
    assert any(p["id"] == start["processId"] and p["state"] == "running" for p in procs), procs
    base = f"/v1/sandboxes/{sbx.id}/processes/{start['processId']}"
    assert "GET /index.html" in api.get(f"{base}/output").text  # the server's log, on stderr
    r = api.post(f"{base}:signal", json={"signal": "SIGTERM"})
    assert r.status_code == 200, r.text
    wait_until(lambda: api.get(base).json()["state"] != "running", 30, 0.2, what="the start command ended")


CREATE = """
import json, sys
from withruntime import Runtime
rt = Runtime()
sbx = rt.sandboxes.create(image=sys.argv[1])
page = sbx.exec("python3 -c \\"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/').read().decode())\\"")
sbx.refresh()
print(json.dumps({"start": sbx.info.get("start"), "page": page.stdout}))
sbx.delete()
"""


@pytest.mark.driver_independent
@pytest.mark.parametrize("driver", ["namespace", "gvisor"], indirect=True)
def test_the_published_client_sees_the_start(served, published_client, daemon, driver):
    """The published create's info["start"] is the report, kept there after a later read."""
    got = published_client.run_json(daemon, CREATE, args=[served["id"]], timeout=300)
    assert got["start"]["state"] == "ready" and got["start"]["processId"], got
    assert got["page"].strip() == "served-from-the-image", got


@pytest.mark.driver_independent
@pytest.mark.parametrize("driver", ["namespace", "gvisor"], indirect=True)
def test_cmd_no_start_and_a_failed_start(published_client, daemon, api, driver):
    # The Dockerfile's CMD is the start command when the build names none (no readiness check).
    cmd_only = _build(published_client, daemon, SERVE)
    assert cmd_only["start"]["command"] == ["python3", "-m", "http.server", "8000"], cmd_only
    assert "readyPort" not in cmd_only["start"], cmd_only
    sbx = api.create_sandbox(driver=driver, image=cmd_only["id"])
    assert sbx["start"]["state"] == "running", sbx["start"]
    wait_until(lambda: api.exec(sbx.id, command="grep -q ':1F40 ' /proc/net/tcp && echo up")["stdout"] == "up\n",
               30, 0.3, what="the CMD's server listening")
    # A HEALTHCHECK CMD is the readiness check of the CMD.
    checked = _build(published_client, daemon, SERVE + "HEALTHCHECK --interval=5s CMD grep -q ':1F40 ' /proc/net/tcp\n")
    assert checked["start"]["readyCommand"] == ["/bin/sh", "-c", "grep -q ':1F40 ' /proc/net/tcp"], checked
    sbx = api.create_sandbox(driver=driver, image=checked["id"])
    assert sbx["start"]["state"] == "ready", sbx["start"]
    # An ENTRYPOINT takes the stage's CMD as arguments, and drops the one its FROM gave.
    ep = _build(published_client, daemon, 'FROM default\nCMD ["-m", "http.server"]\nENTRYPOINT ["python3"]\n')
    assert ep["start"]["command"] == ["python3", "-m", "http.server"], ep
    ep = _build(published_client, daemon, f'FROM {cmd_only["name"]}\nENTRYPOINT ["python3"]\n')
    assert ep["start"]["command"] == ["python3"], ep
    # no_start keeps none: nothing runs, the create says nothing of a start.
    none = _build(published_client, daemon, SERVE, no_start=True)
    assert none["start"] is None, none
    sbx = api.create_sandbox(driver=driver, image=none["id"])
    assert "start" not in sbx, sbx
    assert api.get(f"/v1/sandboxes/{sbx.id}/processes").json()["data"] == []
    # A command that exits at once: failed, with its output; the sandbox runs on.
    gone = _build(published_client, daemon, "FROM default\n",
                  start={"command": "echo about to fail; exit 3", "ready_port": 8000, "ready_timeout_seconds": 30})
    sbx = api.create_sandbox(driver=driver, image=gone["id"])
    start = sbx["start"]
    assert start["state"] == "failed" and "code 3" in start["error"], start
    assert "about to fail" in start["output"], start
    assert api.exec(sbx.id, command="echo alive")["stdout"] == "alive\n"
    # One that never gets ready: failed at its timeout, and left running for the caller.
    slow = _build(published_client, daemon, "FROM default\n",
                  start={"command": ["sleep", "300"], "ready_port": 9, "ready_timeout_seconds": 1})
    sbx = api.create_sandbox(driver=driver, image=slow["id"])
    start = sbx["start"]
    assert start["state"] == "failed" and "not ready after 1 s" in start["error"], start
    assert api.get(f"/v1/sandboxes/{sbx.id}/processes/{start['processId']}").json()["state"] == "running"


@pytest.mark.driver_independent
def test_bad_start_specs_are_refused(api):
    base = {"name": _name("bad"), "dockerfile": "FROM default\n"}
    cases = [
        ({"command": ""}, "start.command"),
        ({"command": []}, "start.command"),
        ({"command": ["ok", 1]}, "start.command[1]"),
        ({"command": "x" * 20000}, "start.command"),
        ({"command": ["x"] * 300}, "start.command"),
        ({"command": "x", "readyPort": 0}, "readyPort"),
        ({"command": "x", "readyPort": 65536}, "readyPort"),
        ({"command": "x", "readyPort": "80"}, "readyPort"),
        ({"command": "x", "readyPort": 80, "readyCommand": "true"}, "not both"),
        ({"command": "x", "readyCommand": "y" * 5000}, "readyCommand"),
        ({"command": "x", "readyTimeoutSeconds": 0}, "readyTimeoutSeconds"),
        ({"command": "x", "readyTimeoutSeconds": 601}, "readyTimeoutSeconds"),
        ({"command": "x", "bogus": 1}, "start.bogus"),
        ({"readyPort": 80}, "start.command"),
        ("python3 -m http.server", "start must be an object"),
    ]
    for start, says in cases:
        r = api.post("/v1/images", json={**base, "start": start})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", (start, r.text)
        assert says in r.json()["error"]["message"], (start, r.text)
    assert api.get("/v1/images", params={"name": base["name"]}).json()["data"] == []
