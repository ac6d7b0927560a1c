"""Our SDKs' account-level observability calls against the real daemon, under the published
client's names (docs/sdk.md, "The account: events, webhooks, OpenTelemetry, audit, usage"):
runtime.events listed, filtered and paged; a webhook made, tested, its deliveries received on a
loopback receiver and checked by withruntime.verify_webhook (a changed body, a wrong secret, an old
or a future stamp and a malformed header refused), a failed delivery retried by hand, the secret
rotated with and without an overlap, the webhook disabled and deleted; the audit log by action,
by sandbox and by page; the usage export followed page by page; an OpenTelemetry export made,
listed, flushed to a loopback collector, changed and deleted; the same calls from AsyncRuntime;
the names and parameters set beside the published client's; and the TypeScript SDK's same calls
(sdk/js/test/observability.test.mjs) against the same daemon.

The module's daemon allows loopback receivers, tries a failed delivery again only after an hour
and pushes exports only every hour, so that a retry and a flush by hand are the only ones."""
from __future__ import annotations

import asyncio
import csv
import hashlib
import hmac
import io
import json
import os
import shutil
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, first_driver, wait_until
from test_js_sdk import _env, js_build, run_node  # noqa: F401 - js_build: the fixture that builds sdk/js
from test_otel import Collector
from test_webhooks import Receiver

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))

from withruntime import AsyncRuntime, Runtime, Sandbox, WebhookVerificationError, verify_webhook  # noqa: E402
from withruntime.errors import ConflictError, InvalidRequestError, NotFoundError  # noqa: E402

# What the published client's Runtime has, by product ("" for the client itself), and what ours
# takes beyond it.
PUBLISHED_CALLS = {
    "events": ["list"],
    "webhooks": ["create", "list", "get", "update", "rotate_secret", "delete", "test", "deliveries", "retry"],
    "otel": ["create", "list", "get", "update", "flush", "delete"],
    "audit": ["list"],
    "": ["usage_export"],
}
OURS_BEYOND = {"audit.list": ["sandbox_id"]}


@pytest.fixture(scope="module")
def watched(build_dir, image_dir, tmp_path_factory):
    args = ["--webhook-allow-cidr", "127.0.0.0/8", "--webhook-retry-seconds", "3600",
            "--otel-interval-seconds", "3600"]
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("observability") / "state",
                      f"runtime-test-{os.getpid()}-obs", extra_args=args)
    yield d
    _finish_daemon(d)


def _owner(d) -> dict:
    """The client arguments of a new owner's full key: each test sees only what it made."""
    owner = f"obs-{uuid.uuid4().hex[:8]}"
    with Api(d) as admin:
        r = admin.post("/v1/keys", json={"name": owner, "owner": owner})
        assert r.status_code == 201, r.text
        return {"api_key": r.json()["key"], "base_url": d.base_url}


def _sandbox(d, conn: dict) -> Sandbox:
    return Sandbox.create(driver=first_driver(d), timeout_seconds=120, **conn)


def _gone(sbx: Sandbox) -> None:
    sbx.delete()
    sbx.close()


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _sign(secret: str, stamp: int, body: str) -> str:
    """A Runtime-Signature made here by the scheme docs/api.md states, not by our SDK."""
    mac = hmac.new(secret.encode(), f"{stamp}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"t={stamp},v1={mac}"


def test_events_listed_filtered_and_paged(watched):
    conn = _owner(watched)
    sbx = _sandbox(watched, conn)
    sbx.stop()
    _gone(sbx)
    with Runtime(**conn) as rt:
        page = rt.events.list(resource_id=sbx.id)
        assert [e["type"] for e in page["data"]] == ["sandbox.deleted", "sandbox.stopped", "sandbox.started",
                                                     "sandbox.created"], page
        assert page["hasMore"] is False and page["nextCursor"] is None
        created = page["data"][-1]
        assert created["id"].startswith("evt_") and created["resourceType"] == "sandbox"
        assert created["resourceId"] == sbx.id and created["data"]["driver"] == first_driver(watched)
        assert created["keyId"].startswith("key_") and created["time"].endswith("Z")
        stopped = rt.events.list(resource_id=sbx.id, type="sandbox.stopped")["data"]
        assert [e["id"] for e in stopped] == [page["data"][1]["id"]]
        # The owner has these four only: the group, and pages of three then one, give them again.
        assert rt.events.list(type="sandbox.")["data"] == page["data"]
        first = rt.events.list(limit=3)
        assert len(first["data"]) == 3 and first["hasMore"] is True and first["nextCursor"]
        second = rt.events.list(limit=3, cursor=first["nextCursor"])
        assert first["data"] + second["data"] == page["data"] and second["hasMore"] is False
        with pytest.raises(InvalidRequestError) as e:
            rt.events.list(limit=0)
        assert e.value.status == 400


def test_a_webhooks_deliveries_verified_retried_and_rotated(watched):
    conn = _owner(watched)
    receiver = Receiver()
    try:
        with Runtime(**conn) as rt:
            hook = rt.webhooks.create(url=receiver.url, events=["sandbox.created", "sandbox.deleted"],
                                      description="sdk")
            secret = hook["secret"]
            assert secret.startswith("whsec_") and len(secret) == 70 and hook["id"].startswith("wh_")
            assert (hook["url"], hook["events"], hook["description"], hook["enabled"]) == \
                (receiver.url, ["sandbox.created", "sandbox.deleted"], "sdk", True)
            assert [w["id"] for w in rt.webhooks.list()["data"]] == [hook["id"]]
            got = rt.webhooks.get(hook["id"])
            assert got["url"] == receiver.url and "secret" not in got

            tested = rt.webhooks.test(hook["id"])
            assert tested["delivered"] is True and tested["responseStatus"] == 204 and tested["error"] is None
            (sent,) = receiver.of_type("webhook.test")
            body, header = sent["body"], sent["headers"]["runtime-signature"]
            event = verify_webhook(body, header, secret)
            assert event["type"] == "webhook.test" and event["id"].startswith("evt_")
            assert verify_webhook(body.encode(), header, secret) == event
            _refusals(body, header, secret)

            # A refused first attempt waits an hour here; a retry by hand delivers it now.
            receiver.default = 503
            sbx = _sandbox(watched, conn)
            first = wait_until(lambda: [d for d in rt.webhooks.deliveries(hook["id"], state="pending")["data"]
                                        if d["attempts"] == 1], 30, interval=0.2, what="the refused first attempt")
            (pending,) = first
            assert pending["id"].startswith("whd_") and pending["webhookId"] == hook["id"]
            assert pending["eventType"] == "sandbox.created" and pending["responseStatus"] == 503
            receiver.default = 204
            retried = rt.webhooks.retry(pending["id"])
            assert (retried["id"], retried["state"], retried["attempts"], retried["responseStatus"]) == \
                (pending["id"], "delivered", 2, 204), retried
            tries = receiver.of_type("sandbox.created")
            assert [t["headers"]["runtime-delivery-id"] for t in tries] == [pending["id"]] * 2
            delivered = verify_webhook(tries[-1]["body"], tries[-1]["headers"]["runtime-signature"], secret)
            assert delivered["id"] == pending["eventId"] and delivered["resourceId"] == sbx.id
            _gone(sbx)

            wait_until(lambda: len(rt.webhooks.deliveries(hook["id"], state="delivered")["data"]) == 2, 30,
                       interval=0.2, what="the sandbox.deleted delivery")
            one = rt.webhooks.deliveries(hook["id"], limit=1)
            assert len(one["data"]) == 1 and one["hasMore"] is True and one["nextCursor"]
            two = rt.webhooks.deliveries(hook["id"], limit=1, cursor=one["nextCursor"])
            assert [d["eventType"] for d in one["data"] + two["data"]] == ["sandbox.deleted", "sandbox.created"]
            assert two["hasMore"] is False

            _rotations(rt, hook["id"], secret, receiver)

            off = rt.webhooks.update(hook["id"], enabled=False, description="off")
            assert (off["enabled"], off["description"], off["url"]) == (False, "off", receiver.url)
            assert rt.webhooks.delete(hook["id"]) == {"id": hook["id"], "deleted": True}
            with pytest.raises(NotFoundError):
                rt.webhooks.get(hook["id"])
            assert rt.webhooks.list()["data"] == []
            with pytest.raises(NotFoundError):
                rt.webhooks.retry("whd_00000000000000000000")
    finally:
        receiver.close()


def _refusals(body: str, header: str, secret: str) -> None:
    """What verify_webhook refuses of a real delivery, and the edges of its tolerance."""
    stamp = int(header.split(",")[0].split("=", 1)[1])
    for changed in (body.replace('"webhook.test"', '"webhook.tesu"'), body + " ", body[:-1]):
        with pytest.raises(WebhookVerificationError, match="matches"):
            verify_webhook(changed, header, secret)
    with pytest.raises(WebhookVerificationError, match="matches"):
        verify_webhook(body, header, "whsec_" + "0" * 64)
    with pytest.raises(WebhookVerificationError, match="301 s ago"):
        verify_webhook(body, header, secret, now=stamp + 301)
    with pytest.raises(WebhookVerificationError, match="in the future"):
        verify_webhook(body, header, secret, now=stamp - 301)
    assert verify_webhook(body, header, secret, now=stamp + 300)["type"] == "webhook.test"
    with pytest.raises(WebhookVerificationError, match="ago"):
        verify_webhook(body, header, secret, tolerance_seconds=0, now=stamp + 1)
    # Signed here by the documented scheme: ten minutes old is refused, a fresh one taken.
    with pytest.raises(WebhookVerificationError, match="ago"):
        verify_webhook(body, _sign(secret, int(time.time()) - 600, body), secret)
    assert verify_webhook(body, _sign(secret, int(time.time()), body), secret)["type"] == "webhook.test"
    # Another stamp under the same signature does not match.
    with pytest.raises(WebhookVerificationError, match="matches"):
        verify_webhook(body, header.replace(f"t={stamp}", f"t={stamp + 1}"), secret, now=stamp)
    for bad in (None, "", header.split(",")[1], header.split(",")[0], f"t=x{stamp},{header.split(',')[1]}",
                f"{header},t={stamp}"):
        with pytest.raises(WebhookVerificationError, match="header"):
            verify_webhook(body, bad, secret)
    with pytest.raises(WebhookVerificationError, match="not JSON"):
        verify_webhook("not json", _sign(secret, int(time.time()), "not json"), secret)
    with pytest.raises(InvalidRequestError):
        verify_webhook(body, header, [])


def _rotations(rt: Runtime, hook_id: str, old: str, receiver: Receiver) -> None:
    """A rotation with an overlap signs with both secrets; one without, with the new one only."""
    rotated = rt.webhooks.rotate_secret(hook_id, keep_previous_seconds=120)
    new = rotated["secret"]
    assert new.startswith("whsec_") and new != old and rotated["previousSecretExpiresAt"]
    assert rt.webhooks.test(hook_id)["delivered"] is True
    sent = receiver.of_type("webhook.test")[-1]
    header = sent["headers"]["runtime-signature"]
    assert header.count("v1=") == 2, header
    for secret in (new, old, ["whsec_" + "1" * 64, new]):
        assert verify_webhook(sent["body"], header, secret)["type"] == "webhook.test"
    newest = rt.webhooks.rotate_secret(hook_id, keep_previous_seconds=0)["secret"]
    assert rt.webhooks.test(hook_id)["delivered"] is True
    sent = receiver.of_type("webhook.test")[-1]
    header = sent["headers"]["runtime-signature"]
    assert header.count("v1=") == 1, header
    assert verify_webhook(sent["body"], header, newest)["type"] == "webhook.test"
    for secret in (new, old):
        with pytest.raises(WebhookVerificationError, match="matches"):
            verify_webhook(sent["body"], header, secret)


def test_audit_by_action_by_sandbox_and_paged(watched):
    conn = _owner(watched)
    a, b = _sandbox(watched, conn), _sandbox(watched, conn)
    try:
        assert a.exec("exit 3").exit_code == 3
        assert b.exec("true").exit_code == 0
        assert a.exec("echo ok").stdout == "ok\n"
        with Runtime(**conn) as rt:
            # A record is written once its call is answered: the last may come just after.
            wait_until(lambda: len(rt.audit.list(limit=100)["events"]) == 5, 10, what="the five records")
            everything = rt.audit.list(limit=100)["events"]
            assert [(e["action"], e["sandboxId"]) for e in reversed(everything)] == [
                ("sandbox.create", a.id), ("sandbox.create", b.id), ("sandbox.exec", a.id), ("sandbox.exec", b.id),
                ("sandbox.exec", a.id)]
            of_a = rt.audit.list(sandbox_id=a.id)["events"]
            assert [(e["action"], e["detail"].get("command"), e["detail"].get("exitCode")) for e in of_a] == [
                ("sandbox.exec", "echo ok", 0), ("sandbox.exec", "exit 3", 3), ("sandbox.create", None, None)]
            execs = rt.audit.list(action="sandbox.exec")["events"]
            assert [e["sandboxId"] for e in execs] == [a.id, b.id, a.id]
            assert [e["detail"]["command"] for e in rt.audit.list(action="sandbox.exec", sandbox_id=b.id)["events"]] \
                == ["true"]
            assert [e["id"] for e in rt.audit.list(action="sandbox.")["events"]] == [e["id"] for e in everything]
            pages, before = [], None
            while True:
                page = rt.audit.list(limit=2, before=before)
                pages.append(page)
                before = page["next"]
                if not page["hasMore"]:
                    break
            assert [len(p["events"]) for p in pages] == [2, 2, 1]
            assert [e["id"] for p in pages for e in p["events"]] == [e["id"] for e in everything]
            with pytest.raises(InvalidRequestError):
                rt.audit.list(sandbox_id="x y")
    finally:
        _gone(a)
        _gone(b)


def test_usage_export_followed_page_by_page(watched):
    conn = _owner(watched)
    start = datetime.now(timezone.utc) - timedelta(minutes=1)
    made = []
    for _ in range(3):
        sbx = _sandbox(watched, conn)
        made.append(sbx.id)
        _gone(sbx)
    until = datetime.now(timezone.utc) + timedelta(minutes=1)
    with Runtime(**conn) as rt:
        pages, cursor = [], None
        while True:
            page = rt.usage_export(_iso(start), _iso(until), cursor=cursor, limit=2)
            pages.append(page)
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert [p["hasMore"] for p in pages] == [True, False]
        rows = [r for p in pages for r in p["rows"]]
        assert sorted(r["resourceId"] for r in rows) == sorted(made)
        assert all(r["product"] == "sandbox" and r["final"] is True and r["quantity"].isdigit() for r in rows), rows
        text = "".join(p["csv"] for p in pages)
        assert text.count("settledAt,") == 1
        assert [t["resourceId"] for t in csv.DictReader(io.StringIO(text, newline=""))] == \
            [r["resourceId"] for r in rows]
        # The same range as aware datetimes and as unix seconds: the same rows.
        assert rt.usage_export(start, until, limit=1000)["rows"] == rows
        assert rt.usage_export(int(start.timestamp()), int(until.timestamp()), limit=1000)["rows"] == rows
        with pytest.raises(InvalidRequestError, match="time zone"):
            rt.usage_export(start.replace(tzinfo=None), until)
        with pytest.raises(InvalidRequestError) as e:
            rt.usage_export(until, start)
        assert e.value.status == 400 and "since" in e.value.message


def test_an_otel_export_made_flushed_and_deleted(watched):
    conn = _owner(watched)
    collector = Collector()
    try:
        with Runtime(**conn) as rt:
            x = rt.otel.create(endpoint=collector.url, headers={"Authorization": "Bearer sdk-T0KEN-7"},
                               signals=["logs"])
            assert x["id"].startswith("otx_") and x["endpoint"] == collector.url and x["enabled"] is True
            assert x["headerNames"] == ["Authorization"] and x["signals"] == ["logs"]
            listed, one = rt.otel.list(), rt.otel.get(x["id"])
            assert [e["id"] for e in listed["data"]] == [x["id"]] and one["endpoint"] == collector.url
            assert "sdk-T0KEN-7" not in json.dumps([x, listed, one])
            sbx = _sandbox(watched, conn)
            _gone(sbx)

            types = sorted(e["type"] for e in rt.events.list(resource_id=sbx.id)["data"])

            def flushed():
                # Records younger than two seconds wait for the next push: flush until all came.
                try:
                    after = rt.otel.flush(x["id"])
                except ConflictError:  # a push of it in flight
                    return None
                kinds = sorted(r["attrs"]["event.name"] for r in collector.logs()
                               if r["attrs"]["runtime.resource.id"] == sbx.id)
                return after if kinds == types else None
            after = wait_until(flushed, 30, interval=0.5, what=f"the sandbox's events {types} pushed by flush")
            assert len(types) >= 3 and after["lastStatus"] == 200 and after["lastError"] is None
            assert after["sentLogs"] == len(collector.logs()) >= len(types) and after["lastPushAt"], after
            assert {s["path"] for s in collector.seen} == {"/otlp/v1/logs"}
            assert {s["headers"]["authorization"] for s in collector.seen} == {"Bearer sdk-T0KEN-7"}

            up = rt.otel.update(x["id"], enabled=False, signals=["logs", "metrics"])
            assert up["enabled"] is False and up["signals"] == ["logs", "metrics"]
            assert rt.otel.delete(x["id"]) == {"id": x["id"], "deleted": True}
            with pytest.raises(NotFoundError):
                rt.otel.get(x["id"])
            assert rt.otel.list()["data"] == []
    finally:
        collector.close()


def test_the_asyncio_client_has_the_same_calls(watched):
    conn = _owner(watched)
    receiver, collector = Receiver(), Collector()
    since = datetime.now(timezone.utc) - timedelta(minutes=1)

    async def run() -> dict:
        async with AsyncRuntime(**conn) as rt:
            hook = await rt.webhooks.create(url=receiver.url)
            out = {"hook": hook, "tested": await rt.webhooks.test(hook["id"]),
                   "listed": await rt.webhooks.list(), "deliveries": await rt.webhooks.deliveries(hook["id"]),
                   "rotated": await rt.webhooks.rotate_secret(hook["id"], keep_previous_seconds=0),
                   "updated": await rt.webhooks.update(hook["id"], description="async"),
                   "deleted": await rt.webhooks.delete(hook["id"])}
            x = await rt.otel.create(endpoint=collector.url)
            out.update(export=x, exports=await rt.otel.list(), flushed=await rt.otel.flush(x["id"]),
                       export_off=await rt.otel.update(x["id"], enabled=False),
                       export_gone=await rt.otel.delete(x["id"]), events=await rt.events.list(),
                       audit=await rt.audit.list(action="webhook."),
                       export_rows=await rt.usage_export(since, datetime.now(timezone.utc) + timedelta(minutes=1)))
            try:
                await rt.webhooks.get(hook["id"])
            except NotFoundError as e:
                out["gone"] = e.status
            return out

    try:
        got = asyncio.run(run())
    finally:
        receiver.close()
        collector.close()
    hook = got["hook"]
    assert got["tested"]["delivered"] is True
    (sent,) = receiver.of_type("webhook.test")
    assert verify_webhook(sent["body"], sent["headers"]["runtime-signature"], hook["secret"])["type"] == "webhook.test"
    assert [w["id"] for w in got["listed"]["data"]] == [hook["id"]] and got["deliveries"]["data"] == []
    assert got["rotated"]["secret"] != hook["secret"] and got["updated"]["description"] == "async"
    assert got["deleted"] == {"id": hook["id"], "deleted": True} and got["gone"] == 404
    assert got["exports"]["data"][0]["id"] == got["export"]["id"] and got["flushed"]["id"] == got["export"]["id"]
    assert got["export_off"]["enabled"] is False and got["export_gone"]["deleted"] is True
    assert got["flushed"]["lastError"] is None and got["flushed"]["sentLogs"] == 0  # nothing happened to push
    assert got["events"]["data"] == [] and got["export_rows"]["rows"] == []
    actions = [e["action"] for e in reversed(got["audit"]["events"])]
    # The SDK deletes through POST :delete: the same act as DELETE, recorded as webhook.delete.
    assert actions == ["webhook.create", "webhook.test", "webhook.rotate", "webhook.update", "webhook.delete"], \
        actions


def _parameters(fn) -> list:
    import inspect
    return [[p.name, p.kind.name, None if p.default is p.empty else repr(p.default)]
            for p in inspect.signature(fn).parameters.values()]


def test_same_names_and_parameters_as_the_published_client(published_client, watched):
    published = published_client.run_json(watched, """
import inspect, json, sys
import withruntime
from withruntime import Runtime, verify_webhook, WebhookVerificationError
from withruntime.webhooks import verify_webhook as in_module

def parameters(fn):
    return [[p.name, p.kind.name, None if p.default is p.empty else repr(p.default)]
            for p in inspect.signature(fn).parameters.values()]

rt = Runtime()
out = {}
for product, names in json.loads(sys.argv[1]).items():
    for name in names:
        out[f"{product}.{name}".lstrip(".")] = parameters(getattr(getattr(rt, product) if product else rt, name))
out["verify_webhook"] = parameters(verify_webhook)
out["same function"] = in_module is verify_webhook and issubclass(WebhookVerificationError, Exception)
print(json.dumps(out))
""", args=[json.dumps(PUBLISHED_CALLS)])
    from withruntime import webhooks

    rt = Runtime(api_key=watched.api_key, base_url=watched.base_url)
    art = AsyncRuntime(api_key=watched.api_key, base_url=watched.base_url)
    try:
        for product, names in PUBLISHED_CALLS.items():
            for name in names:
                call = f"{product}.{name}".lstrip(".")
                ours = _parameters(getattr(getattr(rt, product) if product else rt, name))
                beyond = OURS_BEYOND.get(call, [])
                assert [p for p in ours if p[0] not in beyond] == published[call], call
                assert _parameters(getattr(getattr(art, product) if product else art, name)) == ours, call
        assert _parameters(verify_webhook) == published["verify_webhook"]
        assert published["same function"] is True and webhooks.verify_webhook is verify_webhook
    finally:
        rt.close()
        asyncio.run(art.close())


@pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")),
                    reason="node and npm are not installed (scripts/install-deps.sh)")
def test_the_typescript_sdk_has_the_same_calls(js_build, watched):
    run_node("observability.test.mjs", _env(watched, first_driver(watched), RUNTIME_API_KEY=_owner(watched)["api_key"]),
             600)
