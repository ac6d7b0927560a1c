"""HTTP plumbing shared by the sync and async clients: one httpx client per Runtime client,
errors turned into :mod:`withruntime.errors` classes."""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Union

import httpx

from ._config import Endpoint
from ._version import __version__
from .errors import APIConnectionError, APIError, APITimeoutError, error_from_response

DEFAULT_TIMEOUT = 60.0
CONNECT_TIMEOUT = 10.0
# An error body is read whole to build the exception; a peer that sends more is not our daemon.
_MAX_ERROR_BODY = 64 * 1024

Params = Optional[Mapping[str, Union[str, int]]]
Content = Union[bytes, Iterator[bytes], None]
# A body in memory goes out in slices of this size, with its length said up front: handed
# whole to httpx's sync client, each partial send would copy the rest of it (quadratic).
_BODY_SLICE = 1024 * 1024


def _slices(data: bytes) -> Iterator[memoryview]:
    view = memoryview(data)
    for i in range(0, len(view), _BODY_SLICE):
        yield view[i : i + _BODY_SLICE]


async def _aslices(data: bytes) -> AsyncIterator[memoryview]:
    for s in _slices(data):
        yield s


def _body_kwargs(content: Any, is_async: bool) -> Dict[str, Any]:
    headers = {"Content-Type": "application/octet-stream"}
    if isinstance(content, (bytes, bytearray, memoryview)):
        n = memoryview(content).nbytes
        if n > _BODY_SLICE:
            headers["Content-Length"] = str(n)
            data = bytes(content) if not isinstance(content, bytes) else content
            return {"content": _aslices(data) if is_async else _slices(data), "headers": headers}
    return {"content": content, "headers": headers}


def _headers(api_key: str) -> Dict[str, str]:
    return {
        "Authorization": f"Bearer {api_key}",
        "User-Agent": f"withruntime-python/{__version__}",
        "Accept": "application/json",
    }


def websocket_headers(api_key: str) -> Dict[str, str]:
    """The headers of a WebSocket handshake (a terminal): the same key as every request."""
    return {k: v for k, v in _headers(api_key).items() if k != "Accept"}


def _timeout(seconds: Optional[float]) -> httpx.Timeout:
    return httpx.Timeout(seconds if seconds is not None else DEFAULT_TIMEOUT, connect=CONNECT_TIMEOUT)


def transport_error(endpoint: Endpoint, exc: Exception) -> APIError:
    """One clear error naming the address tried, whatever httpx raised underneath."""
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(
            f"the Runtime daemon at {endpoint.display} did not answer in time ({reason})",
            hint="the daemon may be overloaded; retry, or pass a longer timeout",
        )
    if isinstance(exc, httpx.ConnectError):
        return APIConnectionError(
            f"cannot connect to the Runtime daemon at {endpoint.display}: {reason}",
            hint="is runtimed running? Start it, or point RUNTIME_BASE_URL at it",
        )
    return APIConnectionError(
        f"the connection to the Runtime daemon at {endpoint.display} failed: {reason}",
        hint="the daemon may have restarted; retry",
    )


def _decode_error(status: int, headers: httpx.Headers, raw: bytes) -> APIError:
    text = raw[:_MAX_ERROR_BODY].decode("utf-8", "replace")
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = None
    return error_from_response(status, body, request_id=headers.get("x-request-id"), raw_text=text)


def _decode_json(resp: httpx.Response) -> Any:
    if not resp.content:
        return None
    try:
        return resp.json()
    except ValueError:
        raise APIConnectionError(
            f"the daemon answered {resp.request.method} {resp.request.url.path} with a body that is not JSON",
            status=resp.status_code,
            request_id=resp.headers.get("x-request-id"),
        ) from None


def _make_transport(endpoint: Endpoint, *, is_async: bool) -> Any:
    if endpoint.uds is None:
        return None
    if is_async:
        return httpx.AsyncHTTPTransport(uds=endpoint.uds)
    return httpx.HTTPTransport(uds=endpoint.uds)


class SyncHTTP:
    """Blocking client. httpx.Client's connection pool is guarded by locks, so one instance
    serves several threads at once (LlamaIndex runs sync tools in worker threads)."""

    def __init__(
        self,
        endpoint: Endpoint,
        api_key: str,
        *,
        timeout: Optional[float] = None,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self.endpoint = endpoint
        self.api_key = api_key
        self._client = httpx.Client(
            base_url=endpoint.url,
            headers=_headers(api_key),
            timeout=_timeout(timeout),
            transport=transport or _make_transport(endpoint, is_async=False),
            follow_redirects=False,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json_body: Any = None,
        content: Content = None,
        timeout: Optional[float] = None,
        raw: bool = False,
        headers: Optional[Dict[str, str]] = None,
    ) -> Any:
        kwargs: Dict[str, Any] = {"params": params}
        if headers:
            kwargs["headers"] = headers
        if json_body is not None:
            kwargs["json"] = json_body
        if content is not None:
            kwargs.update(_body_kwargs(content, is_async=False))
        if timeout is not None:
            kwargs["timeout"] = _timeout(timeout)
        try:
            resp = self._client.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None
        if resp.status_code >= 400:
            raise _decode_error(resp.status_code, resp.headers, resp.content)
        return resp.content if raw else _decode_json(resp)

    @contextlib.contextmanager
    def stream_lines(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        timeout: Optional[float] = None,
        params: Params = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> Iterator[Iterator[str]]:
        try:
            with self._client.stream(
                method, path, json=json_body, params=params, headers=headers, timeout=_timeout(timeout)
            ) as resp:
                if resp.status_code >= 400:
                    raise _decode_error(
                        resp.status_code, resp.headers, _read_capped(resp.iter_bytes())
                    )
                yield self._lines(resp)
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None

    def _lines(self, resp: httpx.Response) -> Iterator[str]:
        try:
            splitter = _LineSplitter()
            for chunk in resp.iter_bytes():
                yield from splitter.feed(chunk)
            yield from splitter.end()
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None

    def close(self) -> None:
        self._client.close()


class AsyncHTTP:
    """The same for asyncio."""

    def __init__(
        self,
        endpoint: Endpoint,
        api_key: str,
        *,
        timeout: Optional[float] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self.endpoint = endpoint
        self.api_key = api_key
        self._client = httpx.AsyncClient(
            base_url=endpoint.url,
            headers=_headers(api_key),
            timeout=_timeout(timeout),
            transport=transport or _make_transport(endpoint, is_async=True),
            follow_redirects=False,
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json_body: Any = None,
        content: Union[bytes, None] = None,
        timeout: Optional[float] = None,
        raw: bool = False,
        headers: Optional[Dict[str, str]] = None,
    ) -> Any:
        kwargs: Dict[str, Any] = {"params": params}
        if headers:
            kwargs["headers"] = headers
        if json_body is not None:
            kwargs["json"] = json_body
        if content is not None:
            kwargs.update(_body_kwargs(content, is_async=True))
        if timeout is not None:
            kwargs["timeout"] = _timeout(timeout)
        try:
            resp = await self._client.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None
        if resp.status_code >= 400:
            raise _decode_error(resp.status_code, resp.headers, resp.content)
        return resp.content if raw else _decode_json(resp)

    @contextlib.asynccontextmanager
    async def stream_lines(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        timeout: Optional[float] = None,
        params: Params = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> AsyncIterator[AsyncIterator[str]]:
        try:
            async with self._client.stream(
                method, path, json=json_body, params=params, headers=headers, timeout=_timeout(timeout)
            ) as resp:
                if resp.status_code >= 400:
                    body = bytearray()
                    async for chunk in resp.aiter_bytes():
                        body += chunk
                        if len(body) > _MAX_ERROR_BODY:
                            break
                    raise _decode_error(resp.status_code, resp.headers, bytes(body))
                yield self._lines(resp)
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None

    async def _lines(self, resp: httpx.Response) -> AsyncIterator[str]:
        try:
            splitter = _LineSplitter()
            async for chunk in resp.aiter_bytes():
                for line in splitter.feed(chunk):
                    yield line
            for line in splitter.end():
                yield line
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None

    async def aclose(self) -> None:
        await self._client.aclose()


class _LineSplitter:
    """NDJSON lines out of a body's chunks, in time linear in its size: httpx's iter_lines joins
    the pieces of a long line again at every chunk (about 18 MB/s on the 256 KiB lines of process
    output). Lines end at b"\\n" only; JSON text has no other line break of its own."""

    def __init__(self) -> None:
        self._pieces: List[bytes] = []

    def feed(self, chunk: bytes) -> List[str]:
        parts = chunk.split(b"\n")
        if len(parts) == 1:
            if chunk:
                self._pieces.append(chunk)
            return []
        self._pieces.append(parts[0])
        lines = [b"".join(self._pieces).decode("utf-8", "replace")]
        lines += [p.decode("utf-8", "replace") for p in parts[1:-1]]
        self._pieces = [parts[-1]] if parts[-1] else []
        return lines

    def end(self) -> List[str]:
        rest, self._pieces = b"".join(self._pieces), []
        return [rest.decode("utf-8", "replace")] if rest else []


def _read_capped(chunks: Iterator[bytes]) -> bytes:
    body = bytearray()
    for chunk in chunks:
        body += chunk
        if len(body) > _MAX_ERROR_BODY:
            break
    return bytes(body)
