"""``Runtime``: the calls about the key and its owner rather than one sandbox, under the
published client's names (``runtime.secrets``, ``runtime.me()``), sync and async. Their bodies
are in _core.py; the classes are in sandbox.py and async_sandbox.py beside the others."""

from .async_sandbox import AsyncRuntime
from .sandbox import Runtime

__all__ = ["Runtime", "AsyncRuntime"]
