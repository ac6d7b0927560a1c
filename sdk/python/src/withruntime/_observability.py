"""The bodies of the account's observability calls: ``runtime.events``, ``runtime.webhooks``,
``runtime.otel`` and ``runtime.audit`` (``runtime.usage_export()`` is RuntimeOps's in _core.py,
beside ``me()``), under the published client's names and answering what it answers: the API's
pages and objects as the daemon sends them (docs/api.md, "Events", "Webhooks", "OpenTelemetry",
"Audit", "Keys, limits, usage"). Written once as generators of steps (_drive.py) for both
clients; the classes are in sandbox.py and async_sandbox.py. Private."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Union
from urllib.parse import quote

from ._drive import Call
from ._process import idempotency_headers
from .errors import InvalidRequestError

if TYPE_CHECKING:
    from datetime import datetime

# A webhook's test and a delivery's retry send to the receiver and wait for its answer (10 s
# after a connect of up to 5 s); a flush pushes logs and metrics to the collector in turn. The
# call waits that long whatever a short http_timeout of the client says.
OUTBOUND_HTTP_TIMEOUT_SECONDS = 60.0

Moment = Union[str, int, "datetime"]


def _present(**values: Any) -> Dict[str, Any]:
    """The values given, by their API names; None means left out."""
    return {k: v for k, v in values.items() if v is not None}


def _item_path(collection: str, item_id: Any, what: str, suffix: str = "") -> str:
    if not isinstance(item_id, str) or not item_id:
        raise InvalidRequestError(f"{what} must be a non-empty string, not {item_id!r}")
    return f"{collection}/{quote(item_id, safe='')}{suffix}"


def _webhook_path(webhook_id: str, suffix: str = "") -> str:
    return _item_path("/v1/webhooks", webhook_id, "webhook_id", suffix)


def _export_path(export_id: str, suffix: str = "") -> str:
    return _item_path("/v1/otel-exports", export_id, "export_id", suffix)


def moment(value: Moment, what: str) -> Union[str, int]:
    """A time as the API takes it: RFC 3339 UTC text or unix seconds; an aware datetime becomes
    the text. A naive one could be any zone and is refused."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    # Loaded here, not with the package: a caller that passes a datetime has it already.
    from datetime import datetime, timezone

    if not isinstance(value, datetime):
        raise InvalidRequestError(f"{what} must be RFC 3339 UTC text, unix seconds or a datetime, "
                                  f"not {type(value).__name__}")
    if value.tzinfo is None:
        raise InvalidRequestError(f"{what} is a datetime without a time zone; give one (timezone.utc)")
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventsOps:
    """``runtime.events``: lifecycle events of the key owner's sandboxes and snapshots."""

    def list(self, *, resource_id: Optional[str] = None, type: Optional[str] = None,
             cursor: Optional[str] = None, limit: Optional[int] = None) -> Dict[str, Any]:
        """One page, newest first: ``{"data": [event, ...], "nextCursor", "hasMore"}``.
        ``resource_id`` and ``type`` filter (a type ending in ``.`` is a group: ``"sandbox."``);
        ``limit`` is 1 to 100 (50); pass ``nextCursor`` back as ``cursor`` for older ones."""
        params = _present(resourceId=resource_id, type=type, cursor=cursor, limit=limit)
        return dict((yield Call(self._http.request, "GET", "/v1/events", params=params or None)))


class WebhooksOps:
    """``runtime.webhooks``: URLs the owner's events are POSTed to, signed; check each delivery
    with :func:`withruntime.verify_webhook`."""

    def create(self, *, url: str, events: Optional[Sequence[str]] = None, description: Optional[str] = None,
               idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """The webhook with its ``secret``, shown this once: keep it. ``events`` are types or
        groups (``"snapshot."``); left out, every type."""
        body = _present(url=url, events=None if events is None else list(events), description=description)
        return dict((yield Call(self._http.request, "POST", "/v1/webhooks", json_body=body,
                                headers=idempotency_headers(idempotency_key))))

    def list(self) -> Dict[str, Any]:
        """``{"data": [webhook, ...]}``, oldest first, never with a secret."""
        return dict((yield Call(self._http.request, "GET", "/v1/webhooks")))

    def get(self, webhook_id: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "GET", _webhook_path(webhook_id))))

    def update(self, webhook_id: str, *, url: Optional[str] = None, events: Optional[Sequence[str]] = None,
               description: Optional[str] = None, enabled: Optional[bool] = None) -> Dict[str, Any]:
        """Changes what is given; ``enabled=False`` stops new deliveries and gives up queued ones."""
        body = _present(url=url, events=None if events is None else list(events), description=description,
                        enabled=enabled)
        return dict((yield Call(self._http.request, "POST", _webhook_path(webhook_id, ":update"), json_body=body)))

    def rotate_secret(self, webhook_id: str, *, keep_previous_seconds: Optional[int] = None) -> Dict[str, Any]:
        """A new ``secret``, shown once. The old one keeps signing beside it for
        ``keep_previous_seconds`` (a day by default, a week at most; 0 ends it now)."""
        body = _present(keepPreviousSeconds=keep_previous_seconds)
        return dict((yield Call(self._http.request, "POST", _webhook_path(webhook_id, ":rotate-secret"),
                                json_body=body)))

    def delete(self, webhook_id: str) -> Dict[str, Any]:
        """``{"id", "deleted": True}``; its queued deliveries go with it."""
        return dict((yield Call(self._http.request, "POST", _webhook_path(webhook_id, ":delete"), json_body={})))

    def test(self, webhook_id: str) -> Dict[str, Any]:
        """Sends a signed ``webhook.test`` event now: ``{"delivered", "responseStatus", "error",
        "durationMs"}``. Nothing is queued."""
        return dict((yield Call(self._http.request, "POST", _webhook_path(webhook_id, ":test"), json_body={},
                                timeout=OUTBOUND_HTTP_TIMEOUT_SECONDS)))

    def deliveries(self, webhook_id: str, *, state: Optional[str] = None, cursor: Optional[str] = None,
                   limit: Optional[int] = None) -> Dict[str, Any]:
        """One page of its deliveries, newest first: ``{"data", "nextCursor", "hasMore"}``;
        ``state`` is ``pending``, ``delivered`` or ``failed``."""
        params = _present(state=state, cursor=cursor, limit=limit)
        return dict((yield Call(self._http.request, "GET", _webhook_path(webhook_id, "/deliveries"),
                                params=params or None)))

    def retry(self, delivery_id: str) -> Dict[str, Any]:
        """Sends one delivery again, once, now; answers the delivery after the attempt."""
        path = _item_path("/v1/webhook-deliveries", delivery_id, "delivery_id", ":retry")
        return dict((yield Call(self._http.request, "POST", path, json_body={},
                                timeout=OUTBOUND_HTTP_TIMEOUT_SECONDS)))


class OtelOps:
    """``runtime.otel``: the owner's events (as OTLP logs) and its sandboxes' readings (as OTLP
    metrics) pushed to a collector over OTLP/HTTP."""

    def create(self, *, endpoint: str, headers: Optional[Mapping[str, str]] = None,
               signals: Optional[Sequence[str]] = None, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """``endpoint`` is the OTLP/HTTP base URL, as OTEL_EXPORTER_OTLP_ENDPOINT. ``headers``
        authenticate to it and are never answered back (``headerNames`` lists them);
        ``signals``: ``"logs"``, ``"metrics"`` or both (the default)."""
        body = _present(endpoint=endpoint, headers=None if headers is None else dict(headers),
                        signals=None if signals is None else list(signals))
        return dict((yield Call(self._http.request, "POST", "/v1/otel-exports", json_body=body,
                                headers=idempotency_headers(idempotency_key))))

    def list(self) -> Dict[str, Any]:
        """``{"data": [export, ...]}``."""
        return dict((yield Call(self._http.request, "GET", "/v1/otel-exports")))

    def get(self, export_id: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "GET", _export_path(export_id))))

    def update(self, export_id: str, *, endpoint: Optional[str] = None, headers: Optional[Mapping[str, str]] = None,
               signals: Optional[Sequence[str]] = None, enabled: Optional[bool] = None) -> Dict[str, Any]:
        """Changes what is given; ``headers`` replaces them all."""
        body = _present(endpoint=endpoint, headers=None if headers is None else dict(headers),
                        signals=None if signals is None else list(signals), enabled=enabled)
        return dict((yield Call(self._http.request, "POST", _export_path(export_id, ":update"), json_body=body)))

    def flush(self, export_id: str) -> Dict[str, Any]:
        """Pushes now instead of at the next interval; answers the export after the push."""
        return dict((yield Call(self._http.request, "POST", _export_path(export_id, ":flush"), json_body={},
                                timeout=OUTBOUND_HTTP_TIMEOUT_SECONDS)))

    def delete(self, export_id: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "POST", _export_path(export_id, ":delete"), json_body={})))


class AuditOps:
    """``runtime.audit``: what the owner's keys changed, newest first."""

    def list(self, *, action: Optional[str] = None, limit: Optional[int] = None, before: Optional[str] = None,
             sandbox_id: Optional[str] = None) -> Dict[str, Any]:
        """One page: ``{"events": [...], "next", "hasMore"}``. ``action`` is one
        (``"sandbox.exec"``) or a group ending in a dot (``"sandbox."``); ``sandbox_id`` the
        records of one sandbox; ``limit`` 1 to 100 (50); pass ``next`` back as ``before`` for
        older ones."""
        params = _present(action=action, sandboxId=sandbox_id, limit=limit, before=before)
        return dict((yield Call(self._http.request, "GET", "/v1/audit", params=params or None)))

