"""Webhooks (docs/api.md, "Webhooks"): the published client's calls against a daemon that allows
loopback receivers; each delivery checked by the client's own verify_webhook on a receiver the
test runs on loopback; retries with backoff, a rotation's two signatures, a restart that loses
nothing, and the receivers a webhook may never reach (metadata, link-local, loopback on a daemon
that did not allow it, a name that resolves there, a redirect)."""
from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, free_port, wait_until


class Receiver:
    """An HTTP server on loopback that records each POST and answers from a script of statuses
    (then `default`); a 3xx answer names `redirect_to`."""

    def __init__(self, port: int = 0):
        self.seen: list[dict] = []
        self.script: list[int] = []
        self.default = 204
        self.redirect_to = ""
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.seen.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                                       "body": body.decode()})
                    status = outer.script.pop(0) if outer.script else outer.default
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", outer.redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def of_type(self, t: str) -> list[dict]:
        with self.lock:
            return [s for s in self.seen if json.loads(s["body"])["type"] == t]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def hooked(request, build_dir, image_dir, tmp_path_factory):
    """A daemon of this module that allows loopback receivers and retries after one second, on
    each store."""
    args = ["--webhook-allow-cidr", "127.0.0.0/8", "--webhook-retry-seconds", "1"]
    if request.param == "postgresql":
        pg = request.getfixturevalue("postgres")
        db = f"rt_{uuid.uuid4().hex[:12]}"
        pg.psql(f"CREATE DATABASE {db}")
        args += ["--database", pg.url(db)]
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("webhooks") / "state",
                      f"runtime-test-{os.getpid()}-wh-{request.param}", extra_args=args)
    yield d
    _finish_daemon(d)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _owner_key(d, owner: str, access: str = "full") -> str:
    with Api(d) as admin:
        r = admin.post("/v1/keys", json={"name": owner, "owner": owner, "access": access})
        assert r.status_code in (200, 201), r.text
        return r.json()["key"]


def test_the_published_client_drives_webhooks(published_client, hooked, receiver):
    # Create (the secret once), list and get (never the secret), a sandbox's events delivered and
    # checked by the client's verify_webhook, deliveries listed, test, update, delete.
    got = published_client.run_json(hooked, """
import json, sys, time
from withruntime import Runtime, verify_webhook
rt = Runtime()
hook = rt.webhooks.create(url=sys.argv[1], events=["sandbox.created", "sandbox.deleted"], description="ci")
listed = rt.webhooks.list()
one = rt.webhooks.get(hook["id"])
tested = rt.webhooks.test(hook["id"])
print(json.dumps({"hook": hook, "listed": listed, "one": one, "tested": tested}))
""", args=[receiver.url])
    hook, secret = got["hook"], got["hook"]["secret"]
    assert secret.startswith("whsec_") and len(secret) == 70
    assert hook["events"] == ["sandbox.created", "sandbox.deleted"] and hook["enabled"] is True
    assert [w["id"] for w in got["listed"]["data"]] == [hook["id"]]
    assert "secret" not in got["listed"]["data"][0] and "secret" not in got["one"]
    assert got["tested"]["delivered"] is True and got["tested"]["responseStatus"] == 204, got["tested"]
    assert len(receiver.of_type("webhook.test")) == 1

    with Api(hooked) as c:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        c.post(f"/v1/sandboxes/{sbx.id}:stop", json={})
        assert c.delete(f"/v1/sandboxes/{sbx.id}").status_code == 200
    wait_until(lambda: len(receiver.of_type("sandbox.deleted")) == 1, 30, interval=0.1,
               what="the sandbox.deleted delivery")
    # Only the types it takes: created and deleted, not started or stopped.
    types = sorted(json.loads(s["body"])["type"] for s in receiver.seen)
    assert types == ["sandbox.created", "sandbox.deleted", "webhook.test"], types
    checked = published_client.run_json(hooked, """
import json, sys
from withruntime import verify_webhook, WebhookVerificationError
seen, secret = json.loads(sys.argv[1]), sys.argv[2]
out = [verify_webhook(s["body"], s["headers"]["runtime-signature"], secret)["type"] for s in seen]
try:
    verify_webhook(seen[0]["body"], seen[0]["headers"]["runtime-signature"], "whsec_" + "0" * 64)
    wrong = "accepted"
except WebhookVerificationError:
    wrong = "refused"
print(json.dumps({"types": out, "wrong": wrong}))
""", args=[json.dumps(receiver.seen), secret])
    assert sorted(checked["types"]) == types and checked["wrong"] == "refused"
    created = json.loads(receiver.of_type("sandbox.created")[0]["body"])
    assert created["resourceId"] == sbx.id and created["id"].startswith("evt_")
    h = receiver.of_type("sandbox.created")[0]["headers"]
    assert h["runtime-webhook-id"] == hook["id"] and h["runtime-delivery-id"].startswith("whd_")
    assert h["runtime-event-type"] == "sandbox.created" and h["content-type"] == "application/json"

    got = published_client.run_json(hooked, """
import json, sys
from withruntime import Runtime
rt = Runtime()
d = rt.webhooks.deliveries(sys.argv[1])
done = rt.webhooks.deliveries(sys.argv[1], state="delivered", limit=1)
up = rt.webhooks.update(sys.argv[1], enabled=False, description="off")
rt.webhooks.delete(sys.argv[1])
try:
    rt.webhooks.get(sys.argv[1])
    gone = "still there"
except Exception as e:
    gone = getattr(e, "status", None) or getattr(e, "status_code", None) or str(e)
print(json.dumps({"d": d, "done": done, "up": up, "gone": gone}))
""", args=[hook["id"]])
    states = {x["eventType"]: x for x in got["d"]["data"]}
    assert set(states) == {"sandbox.created", "sandbox.deleted"}, got["d"]
    assert all(x["state"] == "delivered" and x["attempts"] == 1 and x["responseStatus"] == 204
               for x in states.values()), got["d"]
    assert len(got["done"]["data"]) == 1 and got["done"]["hasMore"] is True
    assert got["up"]["enabled"] is False and got["up"]["description"] == "off"
    assert "404" in str(got["gone"]) or got["gone"] == 404, got["gone"]


def test_failed_attempts_are_retried_with_backoff(hooked, receiver):
    with Api(hooked) as c:
        hook = c.post("/v1/webhooks", json={"url": receiver.url,
                                            "events": ["sandbox.created", "sandbox.deleted"]}).json()
        # Two 503s, then a 200: the third attempt delivers, a second and then two after the first.
        receiver.script = [503, 503, 200]
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        wait_until(lambda: any(d["eventType"] == "sandbox.created" and d["state"] == "delivered" for d in
                               c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]),
                   30, interval=0.2, what="the retried delivery")
        d = next(d for d in c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]
                 if d["eventType"] == "sandbox.created")
        assert d["attempts"] == 3 and d["responseStatus"] == 200 and d["lastError"] is None, d
        got = [s for s in receiver.seen if json.loads(s["body"])["type"] == "sandbox.created"]
        assert len(got) == 3 and len({s["headers"]["runtime-delivery-id"] for s in got}) == 1
        # A delivery that keeps failing is pending with its error and next time, then retried by hand.
        receiver.default = 500
        c.delete(f"/v1/sandboxes/{sbx.id}")
        wait_until(lambda: any(d["eventType"] == "sandbox.deleted" and d["attempts"] >= 2 for d in
                               c.get(f"/v1/webhooks/{hook['id']}/deliveries",
                                     params={"state": "pending"}).json()["data"]),
                   30, interval=0.2, what="a failing delivery to be tried twice")
        d = next(d for d in c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]
                 if d["eventType"] == "sandbox.deleted")
        assert d["state"] == "pending" and d["responseStatus"] == 500 and "500" in d["lastError"], d
        assert d["nextAttemptAt"] is not None
        receiver.default = 204
        r = c.post(f"/v1/webhook-deliveries/{d['id']}:retry", json={})
        assert r.status_code == 200 and r.json()["state"] == "delivered", r.text
        assert_error(c.post("/v1/webhook-deliveries/whd_00000000000000000000:retry", json={}), 404, "not_found")
        # A webhook disabled while a delivery of it waits: the delivery is given up at its next turn.
        receiver.default = 500
        sbx2 = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        wait_until(lambda: any(d["eventType"] == "sandbox.created" and d["attempts"] >= 1 and
                               d["state"] == "pending" for d in
                               c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]),
                   30, interval=0.2, what="a second failing delivery")
        assert c.post(f"/v1/webhooks/{hook['id']}:update", json={"enabled": False}).json()["enabled"] is False
        wait_until(lambda: c.get(f"/v1/webhooks/{hook['id']}/deliveries",
                                 params={"state": "failed"}).json()["data"], 30, interval=0.2,
                   what="the delivery of a disabled webhook to be given up")
        d = c.get(f"/v1/webhooks/{hook['id']}/deliveries", params={"state": "failed"}).json()["data"][0]
        assert "disabled" in d["lastError"], d
        c.delete(f"/v1/sandboxes/{sbx2.id}")
        c.post(f"/v1/webhooks/{hook['id']}:delete", json={})


def test_a_rotation_signs_with_both_secrets_until_the_old_one_ends(published_client, hooked, receiver):
    with Api(hooked) as c:
        hook = c.post("/v1/webhooks", json={"url": receiver.url}).json()
        old = hook["secret"]
        rot = c.post(f"/v1/webhooks/{hook['id']}:rotate-secret", json={"keepPreviousSeconds": 3600}).json()
        new = rot["secret"]
        assert new != old and rot["previousSecretExpiresAt"] is not None and "secret" not in \
            c.get(f"/v1/webhooks/{hook['id']}").json()
        assert c.post(f"/v1/webhooks/{hook['id']}:test", json={}).json()["delivered"] is True
        both = receiver.seen[-1]
        assert both["headers"]["runtime-signature"].count("v1=") == 2
        rot2 = c.post(f"/v1/webhooks/{hook['id']}:rotate-secret", json={"keepPreviousSeconds": 0}).json()
        assert rot2["previousSecretExpiresAt"] is None
        assert c.post(f"/v1/webhooks/{hook['id']}:test", json={}).json()["delivered"] is True
        only = receiver.seen[-1]
        assert only["headers"]["runtime-signature"].count("v1=") == 1
        for bad in ({"keepPreviousSeconds": -1}, {"keepPreviousSeconds": 604801}, {"keep": 1}):
            assert_error(c.post(f"/v1/webhooks/{hook['id']}:rotate-secret", json=bad), 400, "invalid_request")
        c.delete(f"/v1/webhooks/{hook['id']}")
    got = published_client.run_json(hooked, """
import json, sys
from withruntime import verify_webhook, WebhookVerificationError
both, only = json.loads(sys.argv[1]), json.loads(sys.argv[2])
old, new, newer = sys.argv[3:6]
def ok(s, key):
    try:
        verify_webhook(s["body"], s["headers"]["runtime-signature"], key)
        return True
    except WebhookVerificationError:
        return False
print(json.dumps([ok(both, old), ok(both, new), ok(only, new), ok(only, newer)]))
""", args=[json.dumps(both), json.dumps(only), old, new, rot2["secret"]])
    assert got == [True, True, False, True], got


def test_receivers_a_webhook_may_not_reach(daemon, hooked, receiver):
    with Api(hooked) as c:
        for url, why in (("http://169.254.169.254/latest/meta-data", "link-local"),
                         ("http://[fe80::1]/x", "link-local"), ("http://224.0.0.1/", "multicast"),
                         ("http://0.0.0.0/", "unspecified"), ("ftp://example.com/", "http or https"),
                         ("http://user:pw@example.com/", "user name"), ("/relative", "absolute"),
                         ("http://exa mple.com/", "space"), ("x" * 3000, "2048")):
            r = c.post("/v1/webhooks", json={"url": url})
            assert_error(r, 400, "invalid_request")
            assert why in r.json()["error"]["message"], (url, r.text)
        for body in ({}, {"url": 5}, {"url": receiver.url, "events": ["nope"]},
                     {"url": receiver.url, "events": "sandbox.created"},
                     {"url": receiver.url, "description": "d" * 257}, {"url": receiver.url, "extra": 1},
                     {"url": receiver.url, "enabled": False}):
            assert_error(c.post("/v1/webhooks", json=body), 400, "invalid_request")
        # A redirect is not followed: the attempt fails and says so.
        receiver.script = [302]
        receiver.redirect_to = "http://169.254.169.254/"
        hook = c.post("/v1/webhooks", json={"url": receiver.url}).json()
        t = c.post(f"/v1/webhooks/{hook['id']}:test", json={}).json()
        assert t["delivered"] is False and t["responseStatus"] == 302 and "redirect" in t["error"], t
        c.delete(f"/v1/webhooks/{hook['id']}")
    # The suite's daemon allows no range: loopback is refused as a literal at once, and as a name
    # that resolves there when the delivery connects.
    before = len(receiver.seen)
    with Api(daemon) as c:
        for url in (receiver.url, f"http://0x7f.1:{receiver.port}/", f"http://[::ffff:127.0.0.1]:{receiver.port}/",
                    f"http://2130706433:{receiver.port}/", "http://10.1.2.3/", "http://[fd00::1]/"):
            r = c.post("/v1/webhooks", json={"url": url})
            assert_error(r, 400, "invalid_request")
            assert "webhook-allow-cidr" in r.json()["error"]["message"], (url, r.text)
        hook = c.post("/v1/webhooks", json={"url": f"http://localhost:{receiver.port}/hook"})
        assert hook.status_code == 201, hook.text
        t = c.post(f"/v1/webhooks/{hook.json()['id']}:test", json={}).json()
        assert t["delivered"] is False and "loopback" in t["error"], t
        c.delete(f"/v1/webhooks/{hook.json()['id']}")
    assert len(receiver.seen) == before


def test_webhooks_are_an_owners_own(hooked, receiver):
    alice, bob = _owner_key(hooked, "alice"), _owner_key(hooked, "bob")
    reader = _owner_key(hooked, "alice", access="read")
    with Api(hooked, key=alice) as a, Api(hooked, key=bob) as b, Api(hooked, key=reader) as ro:
        hook = a.post("/v1/webhooks", json={"url": receiver.url}).json()
        assert_error(b.get(f"/v1/webhooks/{hook['id']}"), 404, "not_found")
        assert_error(b.post(f"/v1/webhooks/{hook['id']}:delete", json={}), 404, "not_found")
        assert_error(b.post(f"/v1/webhooks/{hook['id']}:test", json={}), 404, "not_found")
        assert_error(b.get(f"/v1/webhooks/{hook['id']}/deliveries"), 404, "not_found")
        assert b.get("/v1/webhooks").json()["data"] == []
        assert [w["id"] for w in ro.get("/v1/webhooks").json()["data"]] == [hook["id"]]
        assert ro.post("/v1/webhooks", json={"url": receiver.url}).status_code == 403
        assert ro.post(f"/v1/webhooks/{hook['id']}:rotate-secret", json={}).status_code == 403
        # Bob's sandbox is not told to Alice's webhook.
        sbx = b.create_sandbox(driver="namespace", timeoutSeconds=60)
        b.delete(f"/v1/sandboxes/{sbx.id}")
        assert a.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"] == []
        # At most 20 an owner.
        made = [a.post("/v1/webhooks", json={"url": receiver.url}) for _ in range(20)]
        assert [m.status_code for m in made].count(201) == 19
        assert_error(made[-1], 409, "limit_exceeded")
        for w in a.get("/v1/webhooks").json()["data"]:
            a.delete(f"/v1/webhooks/{w['id']}")
        for bad in ("wh_1", "wh_" + "g" * 20, "x"):
            assert a.get(f"/v1/webhooks/{bad}").status_code == 404


def test_queued_deliveries_outlive_a_restart(hooked):
    # The receiver is down: the delivery fails and waits; runtimed restarts; the receiver comes up
    # and the delivery is made, with the same id.
    port = free_port()
    with Api(hooked) as c:
        hook = c.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/hook",
                                            "events": ["sandbox.created"]}).json()
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        wait_until(lambda: any(d["attempts"] >= 1 for d in
                               c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]),
                   30, interval=0.2, what="a first failed attempt")
        first = c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"][0]
        assert first["state"] == "pending" and first["responseStatus"] is None and first["lastError"], first
    hooked.restart()
    r = Receiver(port)
    try:
        with Api(hooked) as c:
            wait_until(lambda: c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"][0]["state"]
                       == "delivered", 60, interval=0.3, what="the delivery after the restart")
            assert r.seen and r.seen[-1]["headers"]["runtime-delivery-id"] == first["id"]
            c.delete(f"/v1/webhooks/{hook['id']}")
            c.delete(f"/v1/sandboxes/{sbx.id}")
    finally:
        r.close()


class Hanging:
    """A receiver on loopback that accepts each connection and never answers: every attempt sent
    to it lasts until the daemon's attempt timeout."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.held: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.held.append(conn)

    def accepted(self) -> int:
        with self.lock:
            return len(self.held)

    def close(self):
        self.sock.close()
        with self.lock:
            for conn in self.held:
                conn.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def two_workers(request, build_dir, image_dir, tmp_path_factory):
    """A daemon of the test's own with two webhook workers, so that one owner's hanging receivers
    would fill every worker were deliveries not shared between owners."""
    args = ["--webhook-allow-cidr", "127.0.0.0/8", "--webhook-workers", "2"]
    if request.param == "postgresql":
        pg = request.getfixturevalue("postgres")
        db = f"rt_{uuid.uuid4().hex[:12]}"
        pg.psql(f"CREATE DATABASE {db}")
        args += ["--database", pg.url(db)]
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("webhooks-fair") / "state",
                      f"runtime-test-{os.getpid()}-whfair-{request.param}", extra_args=args)
    yield d
    _finish_daemon(d)


def test_one_owners_hanging_receivers_never_hold_anothers_deliveries(two_workers, receiver):
    # Alice's eight webhooks answer nothing (each attempt hangs for the daemon's 10 s timeout) and
    # a sandbox of hers queues a flood of deliveries to them; Bob's one webhook answers at once, and
    # his event, made after Alice's flood, is delivered within a few seconds while hers still hang.
    hang = Hanging()
    alice, bob = _owner_key(two_workers, "alice"), _owner_key(two_workers, "bob")
    try:
        with Api(two_workers, key=alice) as a, Api(two_workers, key=bob) as b:
            hooks = [a.post("/v1/webhooks", json={"url": hang.url}).json()["id"] for _ in range(8)]
            b.post("/v1/webhooks", json={"url": receiver.url, "events": ["sandbox.created"]})
            sbx_a = a.create_sandbox(driver="namespace", timeoutSeconds=60)
            wait_until(lambda: hang.accepted() >= 1, 10, interval=0.05, what="Alice's first hanging attempt")

            def alice_waiting() -> int:
                return sum(1 for h in hooks for d in a.get(f"/v1/webhooks/{h}/deliveries",
                                                           params={"state": "pending"}).json()["data"]
                           if d["attempts"] == 0)
            assert alice_waiting() >= 4, "Alice's flood is queued"
            sbx_b = b.create_sandbox(driver="namespace", timeoutSeconds=60)
            wait_until(lambda: receiver.of_type("sandbox.created"), 3, interval=0.05,
                       what="Bob's delivery while Alice's receivers hang")
            assert alice_waiting() >= 1, "Alice's deliveries were still queued behind her hanging ones"
            got = json.loads(receiver.of_type("sandbox.created")[0]["body"])
            assert got["resourceId"] == sbx_b.id
            b.delete(f"/v1/sandboxes/{sbx_b.id}")
            for h in hooks:
                a.delete(f"/v1/webhooks/{h}")
            a.delete(f"/v1/sandboxes/{sbx_a.id}")
    finally:
        hang.close()
