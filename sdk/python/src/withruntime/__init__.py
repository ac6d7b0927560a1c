"""withruntime: the Python SDK of Runtime, secure sandboxes for AI agents.

    from withruntime import Sandbox

    with Sandbox.create(timeout_seconds=600) as sbx:
        sbx.files.write("/workspace/hello.py", "print(6 * 7)")
        print(sbx.exec("python3 hello.py").stdout)

The daemon's address and key come from ``RUNTIME_BASE_URL`` and ``RUNTIME_API_KEY``, or from
the daemon's own admin key file on the same machine. ``withruntime.tools.sandbox_tools`` turns a
sandbox into four functions for LlamaIndex's ``FunctionTool.from_defaults``.
"""

from ._models import CommandResult, FileEntry, FileList, WriteResult
from ._process import AsyncProcess, Process
from ._terminal import AsyncTerminal, Terminal
from ._tunnel import AsyncPortForward, PortForward
from ._version import __version__
from .async_sandbox import AsyncFiles, AsyncNetwork, AsyncSandbox, AsyncSecrets, AsyncSnapshots
from .client import AsyncRuntime, Runtime
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
)
from .sandbox import Files, Network, Sandbox, Secrets, Snapshots

__all__ = [
    "__version__",
    "Sandbox",
    "AsyncSandbox",
    "Files",
    "AsyncFiles",
    "Network",
    "AsyncNetwork",
    "Secrets",
    "AsyncSecrets",
    "Snapshots",
    "AsyncSnapshots",
    "Runtime",
    "AsyncRuntime",
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
