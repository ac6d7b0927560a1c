"""Checking a webhook delivery (docs/api.md, "A delivery").

    from withruntime import verify_webhook

    event = verify_webhook(request_body, request.headers.get("Runtime-Signature"), secret)
    if event["type"] == "sandbox.stopped":
        ...

runtimed signs each delivery with ``Runtime-Signature: t=<unix seconds>,v1=<hex>``: the hex
HMAC-SHA256, keyed with the webhook's secret (the whole ``whsec_...`` text), of the stamp, a dot
and the body; while a rotation overlaps, a second ``v1`` made with the previous secret. Pass the
body exactly as received, before any JSON parsing: a body parsed and written again is other
bytes, and its signature does not match.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .errors import InvalidRequestError, WebhookVerificationError

__all__ = ["verify_webhook", "WebhookVerificationError", "DEFAULT_TOLERANCE_SECONDS"]

# How far a signature's stamp may be from now: long enough for a retry's queueing and a clock
# that is a little off, short enough that a captured delivery cannot be sent again later.
DEFAULT_TOLERANCE_SECONDS = 300
# A stamp is unix seconds; more digits than this is not one (and int() of a long run of digits
# is slow).
_MAX_STAMP_DIGITS = 12

Secret = Union[str, bytes]


def _signatures(header: Optional[str]) -> Tuple[str, List[bytes]]:
    """The header's stamp and its ``v1`` signatures."""
    if not header:
        raise WebhookVerificationError("no Runtime-Signature header")
    stamps: List[str] = []
    given: List[bytes] = []
    for part in header.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq:
            continue
        if key == "t":
            stamps.append(value)
        elif key == "v1" and value:
            given.append(value.encode("utf-8", "replace"))
    if len(stamps) != 1 or not stamps[0].isascii() or not stamps[0].isdigit() \
            or len(stamps[0]) > _MAX_STAMP_DIGITS or not given:
        raise WebhookVerificationError("the Runtime-Signature header is not t=<unix seconds>,v1=<hex>")
    return stamps[0], given


def _keys(secret: Union[Secret, Sequence[Secret]]) -> List[bytes]:
    if isinstance(secret, (str, bytes)):
        secrets: List[Any] = [secret]
    elif isinstance(secret, (list, tuple)):
        secrets = list(secret)
    else:
        secrets = []
    if not secrets or not all(isinstance(s, (str, bytes)) and s for s in secrets):
        raise InvalidRequestError("secret must be the webhook's secret (whsec_...), or a list of them")
    return [s.encode("utf-8") if isinstance(s, str) else s for s in secrets]


def verify_webhook(body: Union[str, bytes], header: Optional[str], secret: Union[Secret, Sequence[Secret]], *,
                   tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS, now: Optional[int] = None) -> Dict[str, Any]:
    """The event a delivery carries, once ``header`` (its ``Runtime-Signature``) holds a
    signature of ``body`` by ``secret`` (or by any of a list of secrets, as during a rotation)
    made within ``tolerance_seconds`` of ``now`` (default: the clock), which keeps a captured
    delivery from being accepted again later. Raises :class:`WebhookVerificationError`
    otherwise. Signatures are compared in constant time."""
    if isinstance(tolerance_seconds, bool) or not isinstance(tolerance_seconds, (int, float)) \
            or tolerance_seconds < 0:
        raise InvalidRequestError("tolerance_seconds must be a number of seconds, 0 or more")
    if isinstance(body, str):
        payload = body.encode("utf-8")
    elif isinstance(body, (bytes, bytearray, memoryview)):
        payload = bytes(body)
    else:
        raise InvalidRequestError(f"body must be the delivery's bytes or text, not {type(body).__name__}")
    keys = _keys(secret)
    stamp, given = _signatures(header)
    signed = stamp.encode("ascii") + b"." + payload
    matched = False
    # Every pair is compared, a match or not: how long this takes says nothing about the secret.
    for key in keys:
        expected = hmac.new(key, signed, hashlib.sha256).hexdigest().encode("ascii")
        for value in given:
            matched |= hmac.compare_digest(expected, value)
    if not matched:
        raise WebhookVerificationError("no signature in the Runtime-Signature header matches the body and the secret")
    age = (time.time() if now is None else now) - int(stamp)
    if abs(age) > tolerance_seconds:
        when = f"{int(age)} s ago" if age > 0 else f"{int(-age)} s in the future"
        raise WebhookVerificationError(f"the signature was made {when}, beyond the tolerance of "
                                       f"{tolerance_seconds} s: the delivery may be a replay")
    try:
        event = json.loads(payload)
    except ValueError:
        raise WebhookVerificationError("the delivery's body is not JSON") from None
    if not isinstance(event, dict):
        raise WebhookVerificationError("the delivery's body is not an event object")
    return event
