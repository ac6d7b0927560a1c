"""Any host answers for any sandbox (docs/fleet.md): two runtimed on one PostgreSQL on loopback,
sharing a fleet secret; a request sent to the host that does not run the sandbox goes on to the
one that does, and comes back as it came: JSON calls, an NDJSON stream, files both ways, a
download larger than any buffer, a terminal and a port forward (WebSockets), and a client's hang-up
that ends the command on the owner. A forged or wrong secret is refused; without a secret the
other host says where the sandbox runs; a dead owner answers 503 at once."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import httpx
import pytest

from conftest import _two_hosts
from helpers import Api, assert_error, host_pids, read_until, skip_unless_driver, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))

SECRET = "fleet-" + uuid.uuid4().hex


@pytest.fixture
def pair(build_dir, image_dir, tmp_path, postgres):
    yield from _hosts(build_dir, image_dir, tmp_path, postgres, 3)


@pytest.fixture
def patient_pair(build_dir, image_dir, tmp_path, postgres):
    """A pair whose hosts wait a minute before they take a silent one for dead: a restart of a
    host is not its death."""
    yield from _hosts(build_dir, image_dir, tmp_path, postgres, 60)


def _hosts(build_dir, image_dir, tmp_path, postgres, dead_after: int):
    for a, b, _ in _two_hosts(build_dir, image_dir, tmp_path, postgres, dead_after=dead_after, ids=("fwd-a", "fwd-b"),
                              secret=SECRET):
        POSTGRES[:] = [postgres]
        yield a, b


def _on_a(pair, c: Api, **create):
    """A sandbox that host a runs: creates are placed on either host, so create until one lands on a
    (the others are deleted)."""
    a, _ = pair
    for _ in range(30):
        sbx = c.create_sandbox(**create)
        if postgres_home(POSTGRES[0], a, sbx.id) == "fwd-a":
            return sbx
        c.delete(f"/v1/sandboxes/{sbx.id}")
    raise AssertionError("no create landed on host a in 30")


POSTGRES: list = []


def test_requests_go_on_to_the_owner(pair, monkeypatch):
    a, b = pair
    with Api(a) as on_a, Api(b, key=a.api_key) as via_b:
        sbx = _on_a(pair, on_a, driver="namespace", timeoutSeconds=300)
        # JSON: a read and an exec through the other host.
        r = via_b.get(f"/v1/sandboxes/{sbx.id}")
        assert r.status_code == 200 and r.json()["id"] == sbx.id, r.text
        res = via_b.exec(sbx.id, command="hostname; echo $((6*7))")
        assert res["stdout"].endswith("42\n"), res
        assert "X-Forwarded-Request-Id" in via_b.post(f"/v1/sandboxes/{sbx.id}:exec",
                                                       json={"command": "true"}).headers
        # An NDJSON stream arrives as it is made, not at the end.
        t0 = time.monotonic()
        seen = []
        for at, ev in via_b.exec_stream(sbx.id, command="echo one; sleep 1.5; echo two"):
            seen.append((at - t0, ev))
        lines = [(t, e) for t, e in seen if e.get("type") == "stdout"]
        assert [e["data"] for _, e in lines] in (["one\n", "two\n"], ["one\ntwo\n"]) or len(lines) >= 2, seen
        assert lines[0][0] < 1.2, "the first line waited for the last"
        # Files both ways, and a download larger than any buffer of the hop.
        blob = os.urandom(3 * 1024 * 1024 + 17)
        r = via_b.put(f"/v1/sandboxes/{sbx.id}/files/content", params={"path": "/workspace/blob"}, content=blob)
        assert r.status_code in (200, 201, 204), r.text
        r = via_b.get(f"/v1/sandboxes/{sbx.id}/files/content", params={"path": "/workspace/blob"})
        assert r.status_code == 200 and hashlib.sha256(r.content).digest() == hashlib.sha256(blob).digest()
        on_a.exec(sbx.id, command="head -c 60000000 /dev/zero > /workspace/big")
        with via_b.stream("GET", f"/v1/sandboxes/{sbx.id}/files/content", params={"path": "/workspace/big"}) as resp:
            assert resp.status_code == 200
            got = sum(len(c) for c in resp.iter_bytes())
        assert got == 60000000
        # A process list and a lifecycle call.
        assert via_b.get(f"/v1/sandboxes/{sbx.id}/processes").status_code == 200
        r = via_b.post(f"/v1/sandboxes/{sbx.id}:extend", json={"seconds": 60})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("driver", ["namespace", "gvisor"])
def test_a_volume_attaches_through_the_other_host(pair, driver, published_client):
    """A volume made on host a and a running sandbox of a: an attach sent to host b names its
    sandbox in its body, not its path, and still goes on to a, which holds the volume's image and
    binds it; the sandbox writes it; the detach through b goes on too and unbinds it. The
    published client, pointed at b, makes the attach and the detach."""
    a, b = pair
    skip_unless_driver(a, driver)
    with Api(a) as on_a, Api(b, key=a.api_key) as via_b:
        r = on_a.post("/v1/volumes", json={"sizeMiB": 16})
        assert r.status_code == 201, r.text
        vid = r.json()["id"]
        sbx = _on_a(pair, on_a, driver=driver, timeoutSeconds=300)
        r = via_b.post(f"/v1/volumes/{vid}:attach", json={"sandboxId": sbx.id, "path": "/plain"})
        assert r.status_code == 201 and r.json()["sandboxId"] == sbx.id, r.text
        assert "X-Forwarded-Request-Id" in r.headers
        assert via_b.post(f"/v1/volumes/{vid}/attachments/{sbx.id}:detach", json={}).status_code == 200
        att = published_client.run_json(_Via(b, a.api_key), """
import json, sys
from withruntime import Runtime
print(json.dumps(Runtime().volumes.attach(sys.argv[1], sys.argv[2], "/mnt/data")))
""", args=[vid, sbx.id], timeout=120)
        assert att["sandboxId"] == sbx.id and att["path"] == "/mnt/data", att
        res = via_b.exec(sbx.id, command="echo v > /mnt/data/f && stat -c %u /mnt/data/f")
        assert res["stdout"] == "1000\n", res
        assert via_b.get(f"/v1/volumes/{vid}").json()["attachments"][0]["sandboxId"] == sbx.id
        out = published_client.run_json(_Via(b, a.api_key), """
import json, sys
from withruntime import Runtime
print(json.dumps(Runtime().volumes.detach(sys.argv[1], sys.argv[2])))
""", args=[vid, att["id"]], timeout=120)
        assert out["state"] == "detached", out
        assert on_a.exec(sbx.id, command="test -e /mnt/data/f")["exitCode"] != 0
        on_a.delete(f"/v1/sandboxes/{sbx.id}")
        assert on_a.post(f"/v1/volumes/{vid}:delete", json={}).status_code == 200


def test_a_terminal_and_a_port_forward_through_the_other_host(pair, monkeypatch):
    a, b = pair
    with Api(a) as on_a:
        sbx = _on_a(pair, on_a, driver="namespace", timeoutSeconds=300)
    monkeypatch.setenv("RUNTIME_BASE_URL", b.base_url)
    monkeypatch.setenv("RUNTIME_API_KEY", a.api_key)
    from withruntime import Sandbox
    with Sandbox.connect(sbx.id) as s:
        with s.terminal(cols=90, rows=20) as term:
            term.write("stty size; echo FROM-$((40+2))\n")
            out = read_until(term, b"FROM-42", 30)
            assert b"20 90" in out
            term.write("exit 3\n")
            deadline = time.monotonic() + 30
            while term.recv(timeout=max(0.1, deadline - time.monotonic())) is not None:
                pass
            assert term.exit_code == 3
        s.exec("mkdir -p /workspace/www && head -c 2000000 /dev/urandom > /workspace/www/blob")
        want = s.files.read("/workspace/www/blob")
        p = s.spawn("cd /workspace/www && exec python3 -m http.server 8000 --bind 127.0.0.1")
        wait_until(lambda: s.exec("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000))\"")
                   .exit_code == 0, 30, interval=0.3, what="the server in the sandbox")
        with s.forward_port(8000, local_port=0) as fwd:
            body = urllib.request.urlopen(f"http://127.0.0.1:{fwd.local_port}/blob", timeout=30).read()
        assert body == want


def test_a_hang_up_reaches_the_owner(pair):
    # A client that drops a streamed exec sent through the other host: the owner sees its own
    # request end early, as from a direct client, and the command is left to be followed or
    # signalled (docs/api.md), which works through the other host too.
    a, b = pair
    with Api(a) as on_a, Api(b, key=a.api_key) as via_b:
        sbx = _on_a(pair, on_a, driver="namespace", timeoutSeconds=300)
        with httpx.Client(base_url=b.base_url, headers={"Authorization": f"Bearer {a.api_key}"}, timeout=30) as c:
            with c.stream("POST", f"/v1/sandboxes/{sbx.id}:exec",
                          json={"command": "echo started; sleep 600", "stream": True}) as resp:
                assert resp.status_code == 200
                pid = None
                for line in resp.iter_lines():
                    if '"type":"start"' in line:
                        pid = json.loads(line)["processId"]
                    if "started" in line:
                        break
        assert pid
        wait_until(lambda: "POST /v1/sandboxes/" in a.log_path.read_text() and
                   ":exec 200" in a.log_path.read_text() and "connection ended early" in a.log_path.read_text(),
                   15, interval=0.2, what="the owner to see the hop end")
        info = via_b.get(f"/v1/sandboxes/{sbx.id}/processes/{pid}").json()
        assert info["state"] == "running", info
        r = via_b.post(f"/v1/sandboxes/{sbx.id}/processes/{pid}:signal", json={"signal": "SIGKILL"})
        assert r.status_code == 200, r.text
        wait_until(lambda: via_b.get(f"/v1/sandboxes/{sbx.id}/processes/{pid}").json()["state"] != "running",
                   15, interval=0.2, what="the command to end")


def test_secrets_are_checked(pair, build_dir, image_dir, tmp_path, postgres):
    a, b = pair
    with Api(a) as on_a:
        sbx = _on_a(pair, on_a, driver="namespace", timeoutSeconds=120)
        # A forged hop with a wrong secret is refused, and so is one to a host with no secret.
        for bad in ("wrong", "", SECRET + "x"):
            r = httpx.get(f"{b.base_url}/v1/sandboxes/{sbx.id}",
                          headers={"Authorization": f"Bearer {a.api_key}", "Runtime-Fleet-Secret": bad})
            assert_error(r, 403, "forbidden")
        # A client that sends the forwarding host's name without the secret changes nothing.
        r = httpx.get(f"{b.base_url}/v1/sandboxes/{sbx.id}",
                      headers={"Authorization": f"Bearer {a.api_key}", "Runtime-Forwarded-By": "fwd-a"})
        assert r.status_code == 200
        # The secret alone grants nothing: the owner checks the client's key.
        r = httpx.get(f"{b.base_url}/v1/sandboxes/{sbx.id}", headers={"Authorization": "Bearer nope"})
        assert_error(r, 401, "unauthorized")


def test_a_dead_owner_answers_at_once(pair):
    a, b = pair
    with Api(a) as on_a:
        sbx = _on_a(pair, on_a, driver="namespace", timeoutSeconds=120)
    b_api = Api(b, key=a.api_key)
    try:
        a.kill()
        t0 = time.monotonic()
        r = b_api.get(f"/v1/sandboxes/{sbx.id}/processes")
        assert time.monotonic() - t0 < 5, "a call to a dead owner hung"
        assert r.status_code in (502, 503) and r.json()["error"]["code"] == "host_unavailable", r.text
        # New creates avoid it at once: placed on the dead host, a create runs where it was sent.
        for _ in range(4):
            t0 = time.monotonic()
            r = b_api.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 60})
            assert r.status_code == 201 and time.monotonic() - t0 < 5, r.text
        # Once declared dead its sandbox reads as lost, from the host that is left.
        st = b_api.wait_state(sbx.id, "lost", timeout=30)
        assert "fwd-a" in st["failureReason"]
        # Its sandbox ran on without it (live restore); the host's next start, finding it lost,
        # ends it.
        a.start()
        wait_until(lambda: not host_pids(sbx.id), 30, what="the lost sandbox ended by its host's start")
    finally:
        b_api.close()


def test_a_restarted_owner_is_read_through_the_other_host(patient_pair, published_client):
    # Host a killed with SIGKILL and started again: its sandbox ran on, and the published client,
    # pointed at host b, finds it running, reads the output of a process started before the kill
    # (from where the killed daemon's ring ended: what it had is gone with it) with no line
    # missing across the gap, runs a new command and reads a file.
    a, b = patient_pair
    with Api(a) as on_a:
        sbx = _on_a(patient_pair, on_a, driver="namespace", timeoutSeconds=300)
        on_a.exec(sbx.id, command="echo before > /workspace/kept.txt")
        r = on_a.post(f"/v1/sandboxes/{sbx.id}/processes",
                      json={"command": "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); echo $i; sleep 0.05; done"})
        assert r.status_code == 201, r.text
        pid = r.json()["id"]
        wait_until(lambda: on_a.get(f"/v1/sandboxes/{sbx.id}/processes/{pid}").json()["outputBytes"] > 20, 30,
                   what="the ticker's first lines")
    a.kill()
    a.start()
    got = published_client.run_json(_Via(b, a.api_key), f"""
import json
from withruntime import Sandbox
s = Sandbox.connect({sbx.id!r})
text = ""
for ev in s.process({pid!r}).output():
    if ev.get("type") == "stdout":
        text += ev["data"]
    if text.count("\\n") >= 60:
        break
lines = text.splitlines()[:60]
r = s.exec("cat /workspace/kept.txt; echo after")
print(json.dumps([s.state, lines, r.stdout]))
""", timeout=240)
    state, lines, out = got
    assert state == "running"
    first = int(lines[0])
    assert lines == [str(i) for i in range(first, first + 60)], lines
    assert out == "before\nafter\n"
    with Api(a) as on_a:
        assert on_a.sandbox(sbx.id)["state"] == "running"
        r = on_a.post(f"/v1/sandboxes/{sbx.id}/processes/{pid}:signal", json={"signal": "SIGKILL"})
        assert r.status_code in (200, 202), r.text


def test_creates_are_placed_across_hosts(pair, postgres):
    # Creates sent to one host land on both (best of two by free memory; on one machine both
    # have the same, so the draw decides); one from a snapshot lands on its home; a retry with
    # the same Idempotency-Key, sent to either host, answers the first create; a drained host
    # sends every create to the other.
    a, b = pair
    with Api(a) as on_a, Api(b, key=a.api_key) as via_b:
        ids = [via_b.create_sandbox(driver="namespace", timeoutSeconds=120).id for _ in range(12)]
        homes = {postgres_home(postgres, a, i) for i in ids}
        assert homes == {"fwd-a", "fwd-b"}, homes
        # A sandbox made on a: its snapshot's creates, sent to b, run on a.
        src = next(i for i in ids if postgres_home(postgres, a, i) == "fwd-a")
        on_a.exec(src, command="echo kept > /workspace/k")
        r = via_b.post(f"/v1/sandboxes/{src}:snapshot", json={})
        assert r.status_code in (200, 201), r.text
        snap = r.json()["id"]
        for _ in range(3):
            r = via_b.post("/v1/sandboxes", json={"snapshot": snap})
            assert r.status_code == 201, r.text
            assert postgres_home(postgres, a, r.json()["id"]) == "fwd-a"
        # Idempotency across hosts and a placement hop.
        key = f"place-{uuid.uuid4().hex}"
        first = via_b.post("/v1/sandboxes", json={"driver": "namespace"}, headers={"Idempotency-Key": key})
        assert first.status_code == 201, first.text
        for c in (on_a, via_b):
            again = c.post("/v1/sandboxes", json={"driver": "namespace"}, headers={"Idempotency-Key": key})
            assert again.status_code == 201 and again.json()["id"] == first.json()["id"], again.text
        # b drained: creates sent to it run on a.
        assert on_a.post("/v1/hosts/fwd-b:drain", json={}).status_code == 200
        # b's own view of the hosts catches up at its next beat.
        wait_until(lambda: "\nruntime_host_draining 1\n" in via_b.get("/metrics").text, 10, what="b to see it drains")
        for _ in range(4):
            r = via_b.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 60})
            assert r.status_code == 201, r.text
            assert postgres_home(postgres, a, r.json()["id"]) == "fwd-a"


def postgres_home(postgres, daemon_obj, sandbox_id: str) -> str:
    db = next(arg.split("/")[3].split("?")[0] for arg in daemon_obj.extra_args if arg.startswith("postgresql://"))
    return postgres.psql(f"SELECT host_id FROM sandboxes WHERE id = '{sandbox_id}'", db).strip()


class _Via:
    """A daemon as the published client's harness sees one: host b's URL with a's key."""

    def __init__(self, host, key):
        self.base_url, self.api_key = host.base_url, key


def test_the_published_client_through_either_host(pair, published_client):
    # The published client, pointed at b, makes sandboxes wherever placement puts them and
    # drives them (commands, files, a background process, the lifecycle) without knowing.
    a, b = pair
    got = published_client.run_json(_Via(b, a.api_key), """
import json
from withruntime import Sandbox
seen = []
for i in range(4):
    s = Sandbox.create(timeout_seconds=120)
    r = s.exec("echo $((20+22))")
    s.files.write("/workspace/f.txt", "hello %d" % i)
    back = s.files.read("/workspace/f.txt")
    p = s.spawn("sleep 30")
    s.pause()
    s.wake()
    running = [q["id"] for q in s.processes() if q["state"] == "running"]
    seen.append([r.stdout, back if isinstance(back, str) else back.decode(), s.state, p.id in running])
    s.delete()
print(json.dumps(seen))
""", timeout=240)
    assert got == [["42\n", "hello %d" % i, "running", True] for i in range(4)], got


def test_the_hop_keeps_its_connection_alive(pair):
    # Calls through b one after another travel on one kept-alive connection to a (the same local
    # port each time); one idle past the pool's 2 s is not used again.
    from helpers.fleet import hop_ports
    a, b = pair
    with Api(a) as on_a:
        sbx = _on_a(pair, on_a, driver="namespace", timeoutSeconds=300)
    # The test's own connection to a is closed: what is left at a's port is b's hop.
    wait_until(lambda: not hop_ports(a.port), 10, what="no connection to a but the hop's")
    try:
        with Api(b, key=a.api_key) as via_b:
            seen = set()
            for _ in range(5):
                assert via_b.exec(sbx.id, command="true")["exitCode"] == 0
                seen |= hop_ports(a.port)
            assert len(seen) == 1, seen
            time.sleep(2.5)
            assert via_b.exec(sbx.id, command="true")["exitCode"] == 0
            now = hop_ports(a.port)
            assert len(now) == 1 and now.isdisjoint(seen), (seen, now)
    finally:
        with Api(a) as on_a:
            on_a.delete(f"/v1/sandboxes/{sbx.id}")


def test_watches_sessions_and_the_interpreter_through_the_other_host(pair):
    """The routes added with watches, sessions and the interpreter's contexts answer through the
    host that does not run the sandbox as through its own: a watch made, read by cursor and
    followed, and stopped through b; a session made through b used on either host and revoked;
    a cell run through b."""
    a, b = pair
    with Api(a) as on_a, Api(b, key=a.api_key) as via_b:
        sbx = _on_a(pair, on_a, driver="namespace", timeoutSeconds=300)
        base = f"/v1/sandboxes/{sbx.id}"
        on_a.exec(sbx.id, command="mkdir -p /workspace/w")
        # A watch: made through b, the change seen through b by cursor and followed.
        r = via_b.post(f"{base}/files/watches", json={"path": "/workspace/w", "recursive": True})
        assert r.status_code == 201, r.text
        watch = r.json()
        assert watch["sandboxId"] == sbx.id and watch["running"], watch
        on_a.exec(sbx.id, command="mkdir -p /workspace/w/d/e && echo x > /workspace/w/d/e/f.txt")
        seen, cursor = set(), 0
        deadline = time.monotonic() + 20
        while ("create", "/workspace/w/d/e/f.txt") not in seen and time.monotonic() < deadline:
            r = via_b.get(f"{base}/files/watches/{watch['id']}/events", params={"cursor": cursor, "waitMs": 2000})
            assert r.status_code == 200, r.text
            page = r.json()
            seen |= {(e["type"], e["path"]) for e in page["events"]}
            cursor = page["nextCursor"]
        assert ("create", "/workspace/w/d/e/f.txt") in seen, seen
        assert via_b.get(f"{base}/files/watches").json()["data"][0]["id"] == watch["id"]
        with via_b.stream("GET", f"{base}/files/watches/{watch['id']}/events",
                          params={"cursor": cursor, "follow": "true"}) as resp:
            assert resp.status_code == 200
            on_a.exec(sbx.id, command="echo y > /workspace/w/streamed.txt")
            streamed = []
            for line in resp.iter_lines():
                if not line:
                    continue
                m = json.loads(line)
                streamed += [e["path"] for e in m.get("events", [])]
                if "/workspace/w/streamed.txt" in streamed:
                    break
        assert "/workspace/w/streamed.txt" in streamed, streamed
        r = via_b.delete(f"{base}/files/watches/{watch['id']}")
        assert r.status_code == 200 and r.json()["stopped"], r.text
        assert via_b.get(f"{base}/files/watches/{watch['id']}").status_code == 404
        # A session made through b works on either host, and its revocation holds on both.
        r = via_b.post(f"{base}/sessions", json={"ttlSeconds": 600})
        assert r.status_code == 201, r.text
        session = r.json()
        for host in (a, b):
            with Api(host, key=session["token"]) as s:
                assert s.exec(sbx.id, command="echo $((40+2))")["stdout"] == "42\n"
                # A session's bounds hold through the hop too: no interpreter, no sessions.
                assert s.post(f"{base}/interpreter:run", json={"code": "1"}).status_code == 403
        r = via_b.post(f"{base}/sessions/{session['id']}:revoke", json={})
        assert r.status_code == 200 and r.json()["state"] == "revoked", r.text
        for host in (a, b):
            with Api(host, key=session["token"]) as s:
                assert s.get(base).status_code == 401
        # A cell through b, its state kept for the next one through a.
        r = via_b.post(f"{base}/interpreter:run", json={"code": "x = 20 + 22\nx"})
        assert r.status_code == 200, r.text
        r = on_a.post(f"{base}/interpreter:run", json={"code": "x"})
        assert r.status_code == 200, r.text
        assert [x["data"]["text/plain"] for x in r.json()["results"] if x["main"]] == ["42"], r.text
