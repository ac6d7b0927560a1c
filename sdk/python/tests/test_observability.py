"""runtime.events, .webhooks, .otel, .audit, .usage_export() and verify_webhook, sync and async,
against the stand-in daemon: what each call sends, what it answers, and what it refuses before
sending."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from datetime import datetime, timedelta, timezone
from typing import Any, List, Tuple

import httpx
import pytest

from fakedaemon import FakeDaemon, api_error
from withruntime import (
    AsyncAudit,
    AsyncEvents,
    AsyncOtel,
    AsyncRuntime,
    AsyncWebhooks,
    Audit,
    Events,
    Otel,
    Runtime,
    WebhookVerificationError,
    Webhooks,
    verify_webhook,
)
from withruntime.errors import APIError, ConflictError, InvalidRequestError

SECRET = "whsec_" + "ab" * 32
BODY = '{"id":"evt_1","type":"sandbox.stopped","resourceId":"sbx_1"}'


def _echo(fake: FakeDaemon) -> None:
    """Every route of these calls answers what it was sent, so a test reads it back."""
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"method": req.method, "path": req.url.raw_path.decode(),
                                         "body": json.loads(req.content) if req.content else None,
                                         "key": req.headers.get("idempotency-key")})
    for method, path in (("GET", "/v1/events"), ("GET", "/v1/audit"), ("GET", "/v1/usage/export"),
                         ("POST", "/v1/webhooks"), ("GET", "/v1/webhooks"), ("GET", "/v1/webhooks/wh_1"),
                         ("POST", "/v1/webhooks/wh_1:update"), ("POST", "/v1/webhooks/wh_1:rotate-secret"),
                         ("POST", "/v1/webhooks/wh_1:delete"), ("POST", "/v1/webhooks/wh_1:test"),
                         ("GET", "/v1/webhooks/wh_1/deliveries"), ("POST", "/v1/webhook-deliveries/whd_1:retry"),
                         ("POST", "/v1/otel-exports"), ("GET", "/v1/otel-exports"), ("GET", "/v1/otel-exports/otx_1"),
                         ("POST", "/v1/otel-exports/otx_1:update"), ("POST", "/v1/otel-exports/otx_1:flush"),
                         ("POST", "/v1/otel-exports/otx_1:delete"), ("GET", "/v1/webhooks/a/b")):
        fake.on(method, path, handler)


# (call, what the echo answers: method, path with its query, body, Idempotency-Key)
CALLS: List[Tuple[Any, Tuple[str, str, Any, Any]]] = [
    (lambda rt: rt.events.list(), ("GET", "/v1/events", None, None)),
    (lambda rt: rt.events.list(resource_id="sbx_1", type="sandbox.", cursor="812", limit=10),
     ("GET", "/v1/events?resourceId=sbx_1&type=sandbox.&cursor=812&limit=10", None, None)),
    (lambda rt: rt.webhooks.create(url="https://h.test/x", events=("sandbox.stopped",), idempotency_key="k1"),
     ("POST", "/v1/webhooks", {"url": "https://h.test/x", "events": ["sandbox.stopped"]}, "k1")),
    (lambda rt: rt.webhooks.list(), ("GET", "/v1/webhooks", None, None)),
    (lambda rt: rt.webhooks.get("wh_1"), ("GET", "/v1/webhooks/wh_1", None, None)),
    (lambda rt: rt.webhooks.get("a/b"), ("GET", "/v1/webhooks/a%2Fb", None, None)),
    (lambda rt: rt.webhooks.update("wh_1", enabled=False, description="off"),
     ("POST", "/v1/webhooks/wh_1:update", {"description": "off", "enabled": False}, None)),
    (lambda rt: rt.webhooks.rotate_secret("wh_1"), ("POST", "/v1/webhooks/wh_1:rotate-secret", {}, None)),
    (lambda rt: rt.webhooks.rotate_secret("wh_1", keep_previous_seconds=0),
     ("POST", "/v1/webhooks/wh_1:rotate-secret", {"keepPreviousSeconds": 0}, None)),
    (lambda rt: rt.webhooks.delete("wh_1"), ("POST", "/v1/webhooks/wh_1:delete", {}, None)),
    (lambda rt: rt.webhooks.test("wh_1"), ("POST", "/v1/webhooks/wh_1:test", {}, None)),
    (lambda rt: rt.webhooks.deliveries("wh_1", state="failed", limit=5),
     ("GET", "/v1/webhooks/wh_1/deliveries?state=failed&limit=5", None, None)),
    (lambda rt: rt.webhooks.retry("whd_1"), ("POST", "/v1/webhook-deliveries/whd_1:retry", {}, None)),
    (lambda rt: rt.otel.create(endpoint="https://o.test", headers={"A": "b"}, signals=["logs"]),
     ("POST", "/v1/otel-exports", {"endpoint": "https://o.test", "headers": {"A": "b"}, "signals": ["logs"]}, None)),
    (lambda rt: rt.otel.list(), ("GET", "/v1/otel-exports", None, None)),
    (lambda rt: rt.otel.get("otx_1"), ("GET", "/v1/otel-exports/otx_1", None, None)),
    (lambda rt: rt.otel.update("otx_1", enabled=True, headers={}),
     ("POST", "/v1/otel-exports/otx_1:update", {"headers": {}, "enabled": True}, None)),
    (lambda rt: rt.otel.flush("otx_1"), ("POST", "/v1/otel-exports/otx_1:flush", {}, None)),
    (lambda rt: rt.otel.delete("otx_1"), ("POST", "/v1/otel-exports/otx_1:delete", {}, None)),
    (lambda rt: rt.audit.list(), ("GET", "/v1/audit", None, None)),
    (lambda rt: rt.audit.list(action="sandbox.", sandbox_id="sbx_1", limit=2, before="4711"),
     ("GET", "/v1/audit?action=sandbox.&sandboxId=sbx_1&limit=2&before=4711", None, None)),
    (lambda rt: rt.usage_export("2026-12-01T00:00:00Z", 1796000000, cursor="1.2.sbx_1", limit=2),
     ("GET", "/v1/usage/export?since=2026-12-01T00%3A00%3A00Z&until=1796000000&cursor=1.2.sbx_1&limit=2", None, None)),
    (lambda rt: rt.usage_export(datetime(2026, 12, 1, 2, 0, 5, 999, tzinfo=timezone(timedelta(hours=2))),
                                datetime(2026, 12, 2, tzinfo=timezone.utc)),
     ("GET", "/v1/usage/export?since=2026-12-01T00%3A00%3A05Z&until=2026-12-02T00%3A00%3A00Z", None, None)),
]


def _answer(method: str, path: str, body: Any, key: Any) -> dict:
    return {"method": method, "path": path, "body": body, "key": key}


def test_each_call_sends_the_apis_request_and_answers_its_json(fake) -> None:
    _echo(fake)
    with Runtime(_transport=fake.transport()) as rt:
        for call, want in CALLS:
            assert call(rt) == _answer(*want), want


def test_the_asyncio_client_sends_the_same(fake) -> None:
    _echo(fake)

    async def body() -> None:
        async with AsyncRuntime(_transport=httpx.MockTransport(fake)) as rt:
            for call, want in CALLS:
                assert await call(rt) == _answer(*want), want

    asyncio.run(body())


def test_same_names_sync_and_async() -> None:
    def names(cls: type) -> set:
        return {n for n in dir(cls) if not n.startswith("_")}
    for sync, asyn in ((Events, AsyncEvents), (Webhooks, AsyncWebhooks), (Otel, AsyncOtel), (Audit, AsyncAudit),
                       (Runtime, AsyncRuntime)):
        assert names(sync) == names(asyn), sync
    with Runtime() as rt:
        art = AsyncRuntime()
        assert {"events", "webhooks", "otel", "audit", "secrets", "snapshots"} <= set(vars(rt))
        assert {k: type(v).__name__ for k, v in vars(art).items() if not k.startswith("_")} == \
            {k: "Async" + type(v).__name__ for k, v in vars(rt).items() if not k.startswith("_")}
        asyncio.run(art.close())


def test_bad_arguments_refused_before_a_request(fake) -> None:
    with Runtime(_transport=fake.transport()) as rt:
        for call in (lambda: rt.webhooks.get(""), lambda: rt.webhooks.delete(None),  # type: ignore[arg-type]
                     lambda: rt.otel.flush(""), lambda: rt.webhooks.retry(""),
                     lambda: rt.webhooks.create(url="https://h.test", idempotency_key=""),
                     lambda: rt.usage_export(datetime(2026, 12, 1), "2026-12-02T00:00:00Z"),
                     lambda: rt.usage_export(1.5, 2), lambda: rt.usage_export(True, 2)):  # type: ignore[arg-type]
            with pytest.raises(InvalidRequestError):
                call()
        with pytest.raises(TypeError):
            rt.events.list(resource="sbx_1")  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            rt.audit.list("sandbox.")  # type: ignore[misc]
    assert fake.requests == []


def test_the_daemons_refusals_come_through(fake) -> None:
    fake.on("POST", "/v1/otel-exports/otx_1:flush", api_error(409, "conflict", "a push of it is in flight"))
    with Runtime(_transport=fake.transport()) as rt:
        with pytest.raises(ConflictError) as e:
            rt.otel.flush("otx_1")
        assert e.value.status == 409 and e.value.request_id == "req_1"


def _sign(stamp: int, body: str = BODY, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), f"{stamp}.{body}".encode(), hashlib.sha256).hexdigest()


def test_verify_webhook_takes_a_signature_of_the_secret() -> None:
    header = f"t=1796000000,v1={_sign(1796000000)}"
    event = verify_webhook(BODY, header, SECRET, now=1796000000)
    assert event == {"id": "evt_1", "type": "sandbox.stopped", "resourceId": "sbx_1"}
    assert verify_webhook(BODY.encode(), header, SECRET, now=1796000000) == event
    assert verify_webhook(bytearray(BODY.encode()), header, SECRET.encode(), now=1796000000) == event
    # During a rotation: two signatures, either secret; spaces after the commas are allowed.
    other = "whsec_" + "cd" * 32
    two = f"t=1796000000, v1={_sign(1796000000, secret=other)}, v1={_sign(1796000000)}"
    assert verify_webhook(BODY, two, SECRET, now=1796000000) == event
    assert verify_webhook(BODY, two, [other], now=1796000000) == event
    assert verify_webhook(BODY, header, ["whsec_x", SECRET], now=1796000000) == event
    # Unknown parts (a future scheme) are skipped.
    assert verify_webhook(BODY, f"{header},v2=abc,x", SECRET, now=1796000000) == event


@pytest.mark.parametrize("body, header, secret, now, why", [
    (BODY + " ", None, SECRET, 1796000000, "matches"),
    (BODY.replace("stopped", "started"), None, SECRET, 1796000000, "matches"),
    (BODY, None, "whsec_" + "00" * 32, 1796000000, "matches"),
    (BODY, f"t=1796000001,v1={_sign(1796000000)}", SECRET, 1796000000, "matches"),
    (BODY, f"t=1796000000,v1={_sign(1796000000).upper()}", SECRET, 1796000000, "matches"),
    (BODY, f"t=1796000000,v1=\u00e9{_sign(1796000000)[1:]}", SECRET, 1796000000, "matches"),
    (BODY, None, SECRET, 1796000301, "301 s ago"),
    (BODY, None, SECRET, 1795999699, "301 s in the future"),
    (BODY, "", SECRET, 1796000000, "no Runtime-Signature"),
    (BODY, f"v1={_sign(1796000000)}", SECRET, 1796000000, "header"),
    (BODY, "t=1796000000", SECRET, 1796000000, "header"),
    (BODY, "t=1796000000,v1=", SECRET, 1796000000, "header"),
    (BODY, f"t=-1,v1={_sign(1796000000)}", SECRET, 1796000000, "header"),
    (BODY, f"t=\u0661\u0662,v1={_sign(1796000000)}", SECRET, 1796000000, "header"),
    (BODY, f"t={'9' * 13},v1={_sign(1796000000)}", SECRET, 1796000000, "header"),
    (BODY, f"t=1796000000,t=1796000000,v1={_sign(1796000000)}", SECRET, 1796000000, "header"),
    ("[1]", f"t=1796000000,v1={_sign(1796000000, '[1]')}", SECRET, 1796000000, "event object"),
    ("{", f"t=1796000000,v1={_sign(1796000000, '{')}", SECRET, 1796000000, "not JSON"),
])
def test_verify_webhook_refusals(body: str, header: Any, secret: str, now: int, why: str) -> None:
    header = f"t=1796000000,v1={_sign(1796000000)}" if header is None else header
    with pytest.raises(WebhookVerificationError, match=why) as e:
        verify_webhook(body, header, secret, now=now)
    assert isinstance(e.value, APIError) and e.value.code == "webhook_verification_failed" and e.value.status is None


def test_verify_webhook_tolerance_and_arguments() -> None:
    header = f"t=1796000000,v1={_sign(1796000000)}"
    assert verify_webhook(BODY, header, SECRET, now=1796000300)["id"] == "evt_1"
    assert verify_webhook(BODY, header, SECRET, now=1796003600, tolerance_seconds=3600)["id"] == "evt_1"
    with pytest.raises(WebhookVerificationError):
        verify_webhook(BODY, header, SECRET, now=1796000001, tolerance_seconds=0)
    for secret in ("", [], [""], None, [1]):
        with pytest.raises(InvalidRequestError):
            verify_webhook(BODY, header, secret, now=1796000000)  # type: ignore[arg-type]
    for tolerance in (-1, True, "300"):
        with pytest.raises(InvalidRequestError):
            verify_webhook(BODY, header, SECRET, now=1796000000, tolerance_seconds=tolerance)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        verify_webhook({"id": "evt_1"}, header, SECRET)  # type: ignore[arg-type]
