"""Errors raised by the withruntime SDK.

Every failure the daemon reports has one shape (``code``, ``status``, ``message``, ``hint``,
``requestId``); the SDK raises it as an :class:`APIError` subclass chosen by ``code`` and
``status``. A daemon that cannot be reached raises :class:`APIConnectionError`, which names the
address that was tried.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "APIError",
    "APIConnectionError",
    "APITimeoutError",
    "ConfigurationError",
    "InvalidRequestError",
    "AuthenticationError",
    "SpendingLimitError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "CommandError",
    "BudgetExceededError",
    "PayloadTooLargeError",
    "RateLimitError",
    "InternalServerError",
    "UnavailableError",
    "WebhookVerificationError",
    "error_from_response",
]


class APIError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        code: the API's stable error code (``"not_found"``, ``"conflict"``, ...).
        status: the HTTP status, or None when no answer came (connection errors).
        message: what went wrong.
        hint: what to do about it, or None.
        request_id: the daemon's ``X-Request-Id`` for its log, or None.
    """

    default_code = "error"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        hint: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.status = status
        self.hint = hint
        self.request_id = request_id

    def __str__(self) -> str:
        head = self.code if self.status is None else f"{self.status} {self.code}"
        text = f"[{head}] {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        if self.request_id:
            text += f"\n  request id: {self.request_id}"
        return text

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, "
            f"message={self.message!r}, hint={self.hint!r}, request_id={self.request_id!r})"
        )


class APIConnectionError(APIError):
    """The daemon could not be reached (not running, wrong address, connection dropped)."""

    default_code = "connection_error"


class APITimeoutError(APIConnectionError):
    """The daemon did not answer in time."""

    default_code = "timeout"


class ConfigurationError(APIError):
    """The SDK could not find what it needs to talk to the daemon (address or key)."""

    default_code = "configuration_error"


class InvalidRequestError(APIError):
    """400: malformed request, unknown field, value out of range, bad path."""

    default_code = "invalid_request"


class AuthenticationError(APIError):
    """401: no key, an unknown key or a revoked key."""

    default_code = "unauthorized"


class SpendingLimitError(APIError):
    """402: the key's daily spending limit would be passed."""

    default_code = "spending_limit_reached"


class PermissionDeniedError(APIError):
    """403: a read-only key on a route that changes or spends, or a permission denied in the sandbox."""

    default_code = "forbidden"


class NotFoundError(APIError):
    """404: no such sandbox, file or route."""

    default_code = "not_found"


class ConflictError(APIError):
    """409: the sandbox is not running, the file exists, the directory is not empty."""

    default_code = "conflict"


class NotPausedError(ConflictError):
    """A wake of a sandbox that is not paused (409 ``not_paused``)."""

    default_code = "not_paused"


class CommandError(APIError):
    """A command run with ``check=True`` exited non-zero or timed out; ``result`` is its
    :class:`CommandResult`."""

    default_code = "command_failed"

    def __init__(self, result: Any) -> None:
        why = "timed out" if result.timed_out else f"exited with {result.exit_code}"
        super().__init__(f"the command {why}: {result.stderr[-500:]}".rstrip(": "))
        self.result = result


class BudgetExceededError(ConflictError):
    """409: the first lease would cost more than ``max_cost_micros``."""

    default_code = "budget_exceeded"


class PayloadTooLargeError(APIError):
    """413: a body over its limit, or the sandbox's disk is full."""

    default_code = "payload_too_large"


class RateLimitError(APIError):
    """429: too many sandboxes or concurrent requests for this key or daemon."""

    default_code = "rate_limited"


class InternalServerError(APIError):
    """500: a bug in the daemon; its log has the details under the request id."""

    default_code = "internal"


class UnavailableError(APIError):
    """503: no driver can run the request, the image is not built, the sandbox failed to start."""

    default_code = "unavailable"


class WebhookVerificationError(APIError):
    """A webhook delivery that :func:`withruntime.verify_webhook` refused: no signature of the
    secret matches its body, its signature is older (or newer) than the tolerance, or its
    header or body is malformed. Never a daemon's answer: ``status`` is None."""

    default_code = "webhook_verification_failed"


_BY_CODE: Dict[str, Type[APIError]] = {
    "invalid_request": InvalidRequestError,
    "unauthorized": AuthenticationError,
    "spending_limit_reached": SpendingLimitError,
    "forbidden": PermissionDeniedError,
    "not_found": NotFoundError,
    "budget_exceeded": BudgetExceededError,
    "conflict": ConflictError,
    "not_paused": NotPausedError,
    "payload_too_large": PayloadTooLargeError,
    "rate_limited": RateLimitError,
    "internal": InternalServerError,
    "unavailable": UnavailableError,
}

_BY_STATUS: Dict[int, Type[APIError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    402: SpendingLimitError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: InvalidRequestError,
    409: ConflictError,
    413: PayloadTooLargeError,
    429: RateLimitError,
    500: InternalServerError,
    503: UnavailableError,
}

# A hostile or broken peer could send megabytes of "message"; keep what goes into a
# traceback readable.
_MAX_TEXT = 2000


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    if len(text) > _MAX_TEXT:
        text = text[:_MAX_TEXT] + "..."
    return text


def error_from_response(
    status: int,
    body: Any,
    *,
    request_id: Optional[str] = None,
    raw_text: str = "",
) -> APIError:
    """Build the right :class:`APIError` subclass for an error answer.

    ``body`` is the decoded JSON body (or None when it was not JSON); ``raw_text`` is used for
    the message when the body is not in the API's error shape.
    """
    err: Mapping[str, Any] = {}
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        err = body["error"]
    code = err.get("code") if isinstance(err.get("code"), str) else None
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status)
    if cls is None:
        cls = InternalServerError if status >= 500 else APIError
    message = _text(err.get("message")) or _text(raw_text.strip()) or f"HTTP {status}"
    rid = err.get("requestId") if isinstance(err.get("requestId"), str) else None
    if code is None:
        code = cls.default_code if cls is not APIError else f"http_{status}"
    return cls(
        message,
        code=code,
        status=status,
        hint=_text(err.get("hint")),
        request_id=rid or request_id,
    )
