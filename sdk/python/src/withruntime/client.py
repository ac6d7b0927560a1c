"""``Runtime``: the calls about the key and its owner rather than one sandbox, under the
published client's names (``runtime.secrets``, ``runtime.me()``), sync and async."""

from __future__ import annotations

from typing import Any, Dict, Optional

from .async_sandbox import AsyncSecrets, AsyncSnapshots
from .sandbox import Secrets, Snapshots


class Runtime:
    """``runtime.secrets`` (:class:`Secrets`), ``runtime.snapshots`` (:class:`Snapshots`), ``runtime.me()`` and ``runtime.limits()``.
    ``api_key`` and ``base_url`` override ``RUNTIME_API_KEY`` and ``RUNTIME_BASE_URL``."""

    def __init__(self, *, api_key: Optional[str] = None, base_url: Optional[str] = None,
                 http_timeout: Optional[float] = None, _transport: Any = None) -> None:
        self.secrets = Secrets(api_key=api_key, base_url=base_url, http_timeout=http_timeout,
                               _transport=_transport)
        self._http = self.secrets._http
        self.snapshots = Snapshots(self._http)

    def me(self) -> Dict[str, Any]:
        """Who this key is: ``owner`` (also ``orgId``/``orgName``: a self-hosted daemon is one
        organization), ``keyId``, ``access`` (``full`` or ``read``) and ``limits``."""
        return dict(self._http.request("GET", "/v1/me"))

    def limits(self) -> Dict[str, Any]:
        """The key's access and its daily spending: ``GET /v1/limits``."""
        return dict(self._http.request("GET", "/v1/limits"))

    def close(self) -> None:
        self.secrets.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncRuntime:
    """The awaitable twin of :class:`Runtime`."""

    def __init__(self, *, api_key: Optional[str] = None, base_url: Optional[str] = None,
                 http_timeout: Optional[float] = None, _transport: Any = None) -> None:
        self.secrets = AsyncSecrets(api_key=api_key, base_url=base_url, http_timeout=http_timeout,
                                    _transport=_transport)
        self._http = self.secrets._http
        self.snapshots = AsyncSnapshots(self._http)

    async def me(self) -> Dict[str, Any]:
        return dict(await self._http.request("GET", "/v1/me"))

    async def limits(self) -> Dict[str, Any]:
        return dict(await self._http.request("GET", "/v1/limits"))

    async def close(self) -> None:
        await self.secrets.close()

    async def __aenter__(self) -> "AsyncRuntime":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
