"""``Runtime``: the calls about the key and its owner rather than one sandbox, under the
published client's names (``runtime.secrets``, ``runtime.me()``, ``runtime.events``,
``runtime.webhooks``, ``runtime.otel``, ``runtime.audit``, ``runtime.usage_export()``), sync and
async. Their bodies are in _core.py and _observability.py; the classes are in sandbox.py and
async_sandbox.py beside the others."""

from typing import TYPE_CHECKING, Any

from .sandbox import Runtime

if TYPE_CHECKING:
    from .async_sandbox import AsyncRuntime

__all__ = ["Runtime", "AsyncRuntime"]


def __getattr__(name: str) -> Any:
    # The asyncio client is imported when first named, not with the blocking one.
    if name == "AsyncRuntime":
        from .async_sandbox import AsyncRuntime

        return AsyncRuntime
    raise AttributeError(f"module 'withruntime.client' has no attribute {name!r}")
