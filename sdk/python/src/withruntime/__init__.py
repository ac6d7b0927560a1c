"""withruntime: the Python SDK of Runtime, secure sandboxes for AI agents.

    from withruntime import Sandbox

    with Sandbox.create(timeout_seconds=600) as sbx:
        sbx.files.write("/workspace/hello.py", "print(6 * 7)")
        print(sbx.exec("python3 hello.py").stdout)

The daemon's address and key come from ``RUNTIME_BASE_URL`` and ``RUNTIME_API_KEY``, or from
the daemon's own admin key file on the same machine. ``withruntime.tools.sandbox_tools`` turns a
sandbox into four functions for LlamaIndex's ``FunctionTool.from_defaults``.
"""

from typing import TYPE_CHECKING, Any

from ._models import CommandResult, FileEntry, FileList, WriteResult
from ._process import AsyncProcess, Process
from ._version import __version__
from .errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BudgetExceededError,
    CommandError,
    ConfigurationError,
    ConflictError,
    NotPausedError,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    SpendingLimitError,
    UnavailableError,
    WebhookVerificationError,
)
from .sandbox import Audit, Events, Files, Network, Otel, Previews, Runtime, Sandbox, Secrets, Snapshots, Webhooks

# What a first call of the blocking client does not need is imported when first named:
# ``withruntime.AsyncSandbox`` or ``from withruntime import AsyncSandbox`` loads it then.
_LAZY = {
    "AsyncSandbox": "async_sandbox",
    "AsyncFiles": "async_sandbox",
    "AsyncPreviews": "async_sandbox",
    "AsyncNetwork": "async_sandbox",
    "AsyncSecrets": "async_sandbox",
    "AsyncSnapshots": "async_sandbox",
    "AsyncRuntime": "async_sandbox",
    "AsyncEvents": "async_sandbox",
    "AsyncWebhooks": "async_sandbox",
    "AsyncOtel": "async_sandbox",
    "AsyncAudit": "async_sandbox",
    "verify_webhook": "webhooks",
    "Terminal": "_terminal",
    "AsyncTerminal": "_terminal",
    "PortForward": "_tunnel",
    "AsyncPortForward": "_tunnel",
}

if TYPE_CHECKING:
    from ._terminal import AsyncTerminal, Terminal
    from ._tunnel import AsyncPortForward, PortForward
    from .async_sandbox import (AsyncAudit, AsyncEvents, AsyncFiles, AsyncNetwork, AsyncOtel, AsyncPreviews,
                                AsyncRuntime, AsyncSandbox, AsyncSecrets, AsyncSnapshots, AsyncWebhooks)
    from .webhooks import verify_webhook


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'withruntime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> "list[str]":
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__",
    "Sandbox",
    "AsyncSandbox",
    "Files",
    "AsyncFiles",
    "Previews",
    "AsyncPreviews",
    "Network",
    "AsyncNetwork",
    "Secrets",
    "AsyncSecrets",
    "Snapshots",
    "AsyncSnapshots",
    "Runtime",
    "AsyncRuntime",
    "Events",
    "AsyncEvents",
    "Webhooks",
    "AsyncWebhooks",
    "Otel",
    "AsyncOtel",
    "Audit",
    "AsyncAudit",
    "verify_webhook",
    "WebhookVerificationError",
    "CommandResult",
    "CommandError",
    "Process",
    "AsyncProcess",
    "Terminal",
    "PortForward",
    "AsyncPortForward",
    "AsyncTerminal",
    "FileEntry",
    "FileList",
    "WriteResult",
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
    "NotPausedError",
    "BudgetExceededError",
    "PayloadTooLargeError",
    "RateLimitError",
    "InternalServerError",
    "UnavailableError",
]
