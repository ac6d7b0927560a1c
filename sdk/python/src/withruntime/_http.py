"""HTTP plumbing shared by the sync and async clients: a request and its reply go over a
keep-alive connection of the process's pool for the daemon (_pool.py), read by the same HTTP/1.1
reader as the streams (_stream.py); errors turned into :mod:`withruntime.errors` classes.

httpx carries the requests only where the plain path cannot: a proxy named by the environment,
or a transport a test hands in. It is imported then and not before: importing it costs more
than the rest of the package, and building its client loads the CA bundle even for an http://
daemon."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Tuple, Union
from urllib.parse import urlsplit

from . import _pool
from ._config import Endpoint
from ._stream import READ_SIZE, EventReader, ReplyError, ReplyReader, goes_direct, json_body as _json_bytes
from ._stream import request_head, tls_context
from ._version import __version__
from .errors import APIConnectionError, APIError, APITimeoutError, error_from_response

if TYPE_CHECKING:
    import asyncio

    import httpx

Event = Dict[str, Any]

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


def _request_kwargs(params: Params, json_body: Any, content: Any, timeout: Optional[float],
                    headers: Optional[Dict[str, str]], is_async: bool) -> Dict[str, Any]:
    """httpx's arguments for one request, the same for both clients."""
    kwargs: Dict[str, Any] = {"params": params}
    if headers:
        kwargs["headers"] = headers
    if json_body is not None:
        kwargs["json"] = json_body
    if content is not None:
        kwargs.update(_body_kwargs(content, is_async=is_async))
    if timeout is not None:
        kwargs["timeout"] = _timeout(timeout)
    return kwargs


def _headers(api_key: str) -> Dict[str, str]:
    return {
        "Authorization": f"Bearer {api_key}",
        "User-Agent": f"withruntime-python/{__version__}",
        "Accept": "application/json",
    }


def websocket_headers(api_key: str) -> Dict[str, str]:
    """The headers of a WebSocket handshake (a terminal): the same key as every request."""
    return {k: v for k, v in _headers(api_key).items() if k != "Accept"}


def _timeout(seconds: Optional[float]) -> "httpx.Timeout":
    import httpx

    return httpx.Timeout(seconds if seconds is not None else DEFAULT_TIMEOUT, connect=CONNECT_TIMEOUT)


def _is_timeout(exc: Exception) -> bool:
    """A timeout of a socket, of asyncio or of httpx (each looked for only when loaded)."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return True
    asyncio, httpx = sys.modules.get("asyncio"), sys.modules.get("httpx")
    return ((asyncio is not None and isinstance(exc, asyncio.TimeoutError))
            or (httpx is not None and isinstance(exc, httpx.TimeoutException)))


def transport_error(endpoint: Endpoint, exc: Exception, connecting: bool = False) -> APIError:
    """One clear error naming the address tried, whatever httpx or the socket raised underneath."""
    reason = str(exc) or type(exc).__name__
    if _is_timeout(exc):
        return APITimeoutError(
            f"the Runtime daemon at {endpoint.display} did not answer in time ({reason})",
            hint="the daemon may be overloaded; retry, or pass a longer timeout",
        )
    httpx = sys.modules.get("httpx")
    if connecting or (httpx is not None and isinstance(exc, httpx.ConnectError)):
        return APIConnectionError(
            f"cannot connect to the Runtime daemon at {endpoint.display}: {reason}",
            hint="is runtimed running? Start it, or point RUNTIME_BASE_URL at it",
        )
    return APIConnectionError(
        f"the connection to the Runtime daemon at {endpoint.display} failed: {reason}",
        hint="the daemon may have restarted; retry",
    )


def _decode_error(status: int, headers: Mapping[str, str], raw: bytes) -> APIError:
    text = raw[:_MAX_ERROR_BODY].decode("utf-8", "replace")
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = None
    return error_from_response(status, body, request_id=headers.get("x-request-id"), raw_text=text)


class _Stream:
    """A streamed request on a connection of its own (see _stream.py): the request's bytes, the
    reply's reader, its events as the body's bytes are fed, and an error body gathered."""

    def __init__(self, http: Any, method: str, path: str, params: Params, body: Any,
                 headers: Optional[Dict[str, str]], timeout: Optional[float]) -> None:
        self.endpoint = http.endpoint
        self.timeout = timeout if timeout is not None else DEFAULT_TIMEOUT
        self.request = request_head(http.endpoint, method, path, params=params,
                                    headers={**_headers(http.api_key), **(headers or {})}, body=_json_bytes(body))
        self.reply = ReplyReader()
        self.reply.on_head = self.head_read
        self.events: List[Event] = []
        self.error_body = bytearray()
        self._reader = EventReader()

    def address(self) -> Tuple[Any, Any]:
        """(family, address) to connect to, and the TLS server name (None for plain)."""
        if self.endpoint.uds:
            return (socket.AF_UNIX, self.endpoint.uds), None
        url = urlsplit(self.endpoint.url)
        port = url.port or (443 if url.scheme == "https" else 80)
        return (None, (url.hostname or "127.0.0.1", port)), (url.hostname if url.scheme == "https" else None)

    def head_read(self) -> None:
        """Once the head is in: the body goes to the events, or, for an error, is gathered."""
        if self.reply.status >= 400:
            self.reply.on_body = self._gather_error
        else:
            self.reply.on_body = lambda buf, start, end: self.events.extend(self._reader.feed(buf, start, end))

    def _gather_error(self, buf: Any, start: int, end: int) -> None:
        room = _MAX_ERROR_BODY + 1 - len(self.error_body)
        if room > 0:
            self.error_body += memoryview(buf)[start:min(end, start + room)]

    def error_gathered(self) -> bool:
        return self.reply.done or len(self.error_body) > _MAX_ERROR_BODY

    def error(self) -> APIError:
        return _decode_error(self.reply.status, self.reply.headers, bytes(self.error_body))

    def end(self) -> List[Event]:
        return self._reader.end()

    def failed(self, exc: Exception, connecting: bool = False) -> APIError:
        if isinstance(exc, ReplyError):
            return APIConnectionError(f"the connection to the Runtime daemon at {self.endpoint.display} failed: {exc}",
                                      hint="the daemon may have restarted; retry")
        return transport_error(self.endpoint, exc, connecting)


def _tcp_socket(infos: List[Any]) -> Tuple[socket.socket, Any]:
    """A non-blocking socket for the first address getaddrinfo gave, and that address."""
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind | socket.SOCK_CLOEXEC, proto)
    sock.setblocking(False)
    return sock, sockaddr


def _events_of(chunks: Iterator[bytes]) -> Iterator[Event]:
    reader = EventReader()
    for chunk in chunks:
        yield from reader.feed(chunk)
    yield from reader.end()


def _decode_json(resp: "httpx.Response") -> Any:
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
    import httpx

    if endpoint.uds is None:
        return None
    if is_async:
        return httpx.AsyncHTTPTransport(uds=endpoint.uds)
    return httpx.HTTPTransport(uds=endpoint.uds)


#: One read of a reply on a pooled connection takes up to this much.
_REPLY_READ = 256 * 1024
#: A request body up to this size is sent in one write with its head.
_JOINED_BODY = 64 * 1024
# Requests sent again, once, when a reused connection failed before any byte of the reply came
# (the daemon closed it as the request went out): those whose repetition does no harm.
_RETRIED = frozenset(("GET", "HEAD", "PUT", "DELETE"))


class _Exchange:
    """One request on a pooled connection: its head (and body when it is in memory), the
    reply's reader, and the body gathered (an error's up to _MAX_ERROR_BODY)."""

    def __init__(self, http: Any, method: str, path: str, params: Params, json_body: Any, content: Any,
                 headers: Optional[Dict[str, str]], timeout: Optional[float]) -> None:
        self.endpoint = http.endpoint
        self.method, self.path = method, path
        self.timeout = timeout if timeout is not None else http.timeout
        body: Optional[bytes] = None
        self.chunks: Optional[Any] = None
        content_type = "application/json"
        if json_body is not None:
            body = _json_bytes(json_body)
        elif content is not None:
            content_type = "application/octet-stream"
            if isinstance(content, (bytes, bytearray, memoryview)):
                body = content if isinstance(content, bytes) else bytes(content)
            elif isinstance(content, str):
                body = content.encode("utf-8")
            else:
                self.chunks = content
        self.head = request_head(self.endpoint, method, path, params=params,
                                 headers={**_headers(http.api_key), **(headers or {})}, body=None,
                                 keep_alive=True, content_type=content_type, chunked=self.chunks is not None,
                                 body_length=None if body is None else len(body))
        # A small body goes out in the head's write: one segment, so the daemon reads the whole
        # request at one wake instead of the head and then, woken again, the body. A large one
        # goes after the head rather than being copied behind it.
        if body is not None and len(body) <= _JOINED_BODY:
            self.head, body = self.head + body, None
        self.body = body
        self.retry = method in _RETRIED and self.chunks is None
        self.restart()

    def restart(self) -> None:
        self.reply = ReplyReader()
        self.reply.on_body = self._gather
        self.data = bytearray()
        self.answered = False  # any byte of the reply came

    def _gather(self, buf: Any, start: int, end: int) -> None:
        if self.reply.status >= 400:
            end = min(end, start + max(0, _MAX_ERROR_BODY + 1 - len(self.data)))
        self.data += memoryview(buf)[start:end]

    def feed(self, buf: Any, n: int) -> None:
        if n == 0:
            self.reply.eof()
        else:
            self.answered = True
            self.reply.feed(buf, 0, n)

    def failed(self, exc: Exception, connecting: bool = False) -> APIError:
        if isinstance(exc, ReplyError):
            return APIConnectionError(f"the connection to the Runtime daemon at {self.endpoint.display} failed: {exc}",
                                      hint="the daemon may have restarted; retry")
        return transport_error(self.endpoint, exc, connecting)

    def result(self, raw: bool) -> Any:
        reply = self.reply
        if reply.status >= 400:
            raise _decode_error(reply.status, reply.headers, bytes(self.data))
        if raw:
            return bytes(self.data)
        if not self.data:
            return None
        try:
            return json.loads(self.data)
        except ValueError:
            raise APIConnectionError(
                f"the daemon answered {self.method} {self.path} with a body that is not JSON",
                status=reply.status,
                request_id=reply.headers.get("x-request-id"),
            ) from None


def _chunk_frames(chunks: Any) -> Iterator[bytes]:
    """A body of unknown length as HTTP/1.1 chunks, and the last, empty one."""
    for chunk in chunks:
        if chunk:
            yield b"%x\r\n" % len(chunk)
            yield chunk
            yield b"\r\n"
    yield b"0\r\n\r\n"


def _close_socket(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def _httpx_client(http: Any, is_async: bool) -> Any:
    """The httpx client of the path that needs one (a proxy in the environment, a test's
    transport), made on its first request. Through a proxy (which may itself be https://) the
    trust is the process's one SSL context; a test's transport makes no connection to verify."""
    import httpx

    cls = httpx.AsyncClient if is_async else httpx.Client
    verify: Any = False if http._transport is not None else tls_context()
    return cls(base_url=http.endpoint.url, headers=_headers(http.api_key), timeout=_timeout(http.timeout),
               transport=http._transport or _make_transport(http.endpoint, is_async=is_async),
               follow_redirects=False, verify=verify)


class SyncHTTP:
    """Blocking client. Requests go over the connections of the process's pool for the
    daemon (_pool.py), which a lock guards, so one instance serves several threads at once
    (LlamaIndex runs sync tools in worker threads). Nothing is connected or built before the
    first request."""

    def __init__(
        self,
        endpoint: Endpoint,
        api_key: str,
        *,
        timeout: Optional[float] = None,
        transport: Optional["httpx.BaseTransport"] = None,
    ) -> None:
        self.endpoint = endpoint
        self.api_key = api_key
        self.timeout = timeout if timeout is not None else DEFAULT_TIMEOUT
        self._transport = transport
        # Requests and streams go on connections of their own unless a transport of the
        # caller's (a test's) or a proxy from the environment stands in the way (then httpx).
        self._direct = transport is None and goes_direct(endpoint)
        self._pool: Optional[_pool.Pool] = None
        self._joining = threading.Lock()
        self._httpx: Any = None
        self._closed = False

    @property
    def _client(self) -> "httpx.Client":
        if self._httpx is None:
            self._httpx = _httpx_client(self, is_async=False)
        return self._httpx

    def _connections(self) -> _pool.Pool:
        # A child made by fork uses a pool of its own, never its parent's connections.
        pool = self._pool
        if pool is None or pool.pid != os.getpid():
            with self._joining:  # two threads' first requests join the pool once
                if self._pool is None or self._pool.pid != os.getpid():
                    joined = _pool.pool_for(self.endpoint, is_async=False)
                    joined.join()
                    self._pool = joined
                pool = self._pool
        return pool

    def _connect(self) -> socket.socket:
        family, address, tls_name = _pool.address(self.endpoint)
        if family == socket.AF_UNIX:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.settimeout(CONNECT_TIMEOUT)
                sock.connect(address)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls_name is not None:
            try:
                sock = tls_context().wrap_socket(sock, server_hostname=tls_name)
            except BaseException:
                sock.close()
                raise
        return sock

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
        if not self._direct:
            return self._httpx_request(method, path, params, json_body, content, timeout, raw, headers)
        ex = _Exchange(self, method, path, params, json_body, content, headers, timeout)
        pool = self._connections()
        while True:
            sock = pool.take(_pool.readable, _close_socket)
            reused = sock is not None
            if sock is None:
                try:
                    sock = self._connect()
                except OSError as e:
                    raise ex.failed(e, connecting=True) from None
            try:
                self._exchange(sock, ex)
            except (OSError, ReplyError) as e:
                _close_socket(sock)
                if reused and ex.retry and not ex.answered:
                    ex.restart()
                    continue
                raise ex.failed(e) from None
            except BaseException:
                _close_socket(sock)
                raise
            if ex.reply.keeps_connection:
                pool.give(sock, _close_socket)
            else:
                _close_socket(sock)
            return ex.result(raw)

    @staticmethod
    def _exchange(sock: socket.socket, ex: _Exchange) -> None:
        buf = bytearray(_REPLY_READ)
        view = memoryview(buf)
        sock.settimeout(ex.timeout)
        try:
            sock.sendall(ex.head)
            if ex.body:
                sock.sendall(ex.body)
            elif ex.chunks is not None:
                for frame in _chunk_frames(ex.chunks):
                    sock.sendall(frame)
        except OSError:
            # The daemon may have answered (a 413 for a body too large) and closed its end:
            # its reply says more than the broken pipe, when there is one to read.
            sock.settimeout(min(ex.timeout, 1.0))
            try:
                while not ex.reply.done:
                    ex.feed(buf, sock.recv_into(view))
            except (OSError, ReplyError):
                pass
            if not ex.reply.head_done or ex.reply.status < 400:
                raise
            ex.reply.done = True
            ex.reply.headers["connection"] = "close"
            return
        while not ex.reply.done:
            ex.feed(buf, sock.recv_into(view))

    def _httpx_request(self, method: str, path: str, params: Params, json_body: Any, content: Content,
                       timeout: Optional[float], raw: bool, headers: Optional[Dict[str, str]]) -> Any:
        import httpx

        kwargs = _request_kwargs(params, json_body, content, timeout, headers, is_async=False)
        try:
            resp = self._client.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None
        if resp.status_code >= 400:
            raise _decode_error(resp.status_code, resp.headers, resp.content)
        return resp.content if raw else _decode_json(resp)

    @contextlib.contextmanager
    def stream_events(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        timeout: Optional[float] = None,
        params: Params = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> Iterator[Iterator[Event]]:
        """A streamed reply's NDJSON events; an error reply raises on entering."""
        if self._direct:
            with self._raw_stream(_Stream(self, method, path, params, json_body, headers, timeout)) as events:
                yield events
            return
        import httpx

        try:
            with self._client.stream(
                method, path, json=json_body, params=params, headers=headers, timeout=_timeout(timeout)
            ) as resp:
                if resp.status_code >= 400:
                    raise _decode_error(
                        resp.status_code, resp.headers, _read_capped(resp.iter_bytes())
                    )
                yield self._guarded(_events_of(resp.iter_bytes()))
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None

    def _guarded(self, events: Iterator[Event]) -> Iterator[Event]:
        import httpx

        try:
            yield from events
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None

    @contextlib.contextmanager
    def _raw_stream(self, st: _Stream) -> Iterator[Iterator[Event]]:
        (family, address), tls_name = st.address()
        try:
            if family == socket.AF_UNIX:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                sock.settimeout(CONNECT_TIMEOUT)
                sock.connect(address)
            else:
                sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT)
            if tls_name is not None:
                sock = tls_context().wrap_socket(sock, server_hostname=tls_name)
        except OSError as e:
            raise st.failed(e, connecting=True) from None
        with contextlib.closing(sock):
            buf = bytearray(READ_SIZE)
            view = memoryview(buf)

            def fill() -> None:
                n = sock.recv_into(view)
                if n == 0:
                    st.reply.eof()
                else:
                    st.reply.feed(buf, 0, n)

            try:
                sock.settimeout(st.timeout)
                sock.sendall(st.request)
                while not st.reply.head_done:
                    fill()
                while st.reply.status >= 400 and not st.error_gathered():
                    fill()
            except (OSError, ReplyError) as e:
                raise st.failed(e) from None
            if st.reply.status >= 400:
                raise st.error()

            def events() -> Iterator[Event]:
                try:
                    while True:
                        batch, st.events = st.events, []
                        yield from batch
                        if st.reply.done:
                            break
                        fill()
                except (OSError, ReplyError) as e:
                    raise st.failed(e) from None
                yield from st.end()

            yield events()

    def close(self) -> None:
        """Done with the pool (its idle connections close after the last user's close) and
        with the httpx client, if one was made."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.leave(_close_socket)
        if self._httpx is not None:
            self._httpx.close()


class _AsyncConnection:
    """A pooled connection of the asyncio client: a non-blocking socket read straight into
    the caller's buffer (plain TCP, unix), or asyncio's streams (TLS), which belong to the loop
    that opened them."""

    __slots__ = ("sock", "reader", "writer", "loop")

    def __init__(self, loop: Any, sock: Optional[socket.socket] = None, reader: Any = None,
                 writer: Any = None) -> None:
        self.loop, self.sock, self.reader, self.writer = loop, sock, reader, writer

    async def send(self, data: Any, timeout: float) -> None:
        import asyncio

        if self.writer is not None:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), timeout)
        else:
            await asyncio.wait_for(self.loop.sock_sendall(self.sock, data), timeout)

    async def recv(self, buf: bytearray, view: memoryview, timeout: float) -> Tuple[Any, int]:
        import asyncio

        if self.writer is not None:
            data = await asyncio.wait_for(self.reader.read(len(buf)), timeout)
            return data, len(data)
        return buf, await asyncio.wait_for(self.loop.sock_recv_into(self.sock, view), timeout)

    def stale(self) -> bool:
        import asyncio

        try:
            if asyncio.get_running_loop() is not self.loop:
                return True
        except RuntimeError:
            return True
        if self.writer is not None:
            return self.writer.is_closing() or self.reader.at_eof()
        return _pool.readable(self.sock)

    def close(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
        if self.sock is not None:
            _close_socket(self.sock)


def _close_async(conn: _AsyncConnection) -> None:
    conn.close()


class AsyncHTTP:
    """The same for asyncio."""

    def __init__(
        self,
        endpoint: Endpoint,
        api_key: str,
        *,
        timeout: Optional[float] = None,
        transport: Optional["httpx.AsyncBaseTransport"] = None,
    ) -> None:
        self.endpoint = endpoint
        self.api_key = api_key
        self.timeout = timeout if timeout is not None else DEFAULT_TIMEOUT
        self._transport = transport
        # Requests and streams go on connections of their own unless a transport of the
        # caller's (a test's) or a proxy from the environment stands in the way (then httpx).
        self._direct = transport is None and goes_direct(endpoint)
        self._pool: Optional[_pool.Pool] = None
        self._joining = threading.Lock()
        self._httpx: Any = None
        self._closed = False

    @property
    def _client(self) -> "httpx.AsyncClient":
        if self._httpx is None:
            self._httpx = _httpx_client(self, is_async=True)
        return self._httpx

    def _connections(self) -> _pool.Pool:
        # A child made by fork uses a pool of its own, never its parent's connections.
        pool = self._pool
        if pool is None or pool.pid != os.getpid():
            with self._joining:  # two threads' first requests join the pool once
                if self._pool is None or self._pool.pid != os.getpid():
                    joined = _pool.pool_for(self.endpoint, is_async=True)
                    joined.join()
                    self._pool = joined
                pool = self._pool
        return pool

    async def _connect(self) -> _AsyncConnection:
        import asyncio

        loop = asyncio.get_running_loop()
        family, address, tls_name = _pool.address(self.endpoint)
        if tls_name is not None:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                address[0], address[1], limit=2 * _REPLY_READ, ssl=tls_context(), server_hostname=tls_name),
                CONNECT_TIMEOUT)
            return _AsyncConnection(loop, reader=reader, writer=writer)
        if family == socket.AF_UNIX:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sockaddr: Any = address
        else:
            sock, sockaddr = _tcp_socket(await loop.getaddrinfo(*address, type=socket.SOCK_STREAM))
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, sockaddr), CONNECT_TIMEOUT)
            if family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            sock.close()
            raise
        return _AsyncConnection(loop, sock=sock)

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
        if not self._direct:
            return await self._httpx_request(method, path, params, json_body, content, timeout, raw, headers)
        import asyncio

        ex = _Exchange(self, method, path, params, json_body, content, headers, timeout)
        pool = self._connections()
        while True:
            conn = pool.take(_AsyncConnection.stale, _close_async)
            reused = conn is not None
            if conn is None:
                try:
                    conn = await self._connect()
                except (OSError, asyncio.TimeoutError) as e:
                    raise ex.failed(e, connecting=True) from None
            try:
                await self._exchange(conn, ex)
            except (OSError, asyncio.TimeoutError, ReplyError) as e:
                conn.close()
                if reused and ex.retry and not ex.answered:
                    ex.restart()
                    continue
                raise ex.failed(e) from None
            except BaseException:
                conn.close()
                raise
            if ex.reply.keeps_connection:
                pool.give(conn, _close_async)
            else:
                conn.close()
            return ex.result(raw)

    @staticmethod
    async def _exchange(conn: _AsyncConnection, ex: _Exchange) -> None:
        buf = bytearray(_REPLY_READ)
        view = memoryview(buf)
        await conn.send(ex.head, ex.timeout)
        if ex.body:
            await conn.send(ex.body, ex.timeout)
        elif hasattr(ex.chunks, "__aiter__"):
            async for chunk in ex.chunks:
                if chunk:
                    await conn.send(b"%x\r\n" % len(chunk) + bytes(chunk) + b"\r\n", ex.timeout)
            await conn.send(b"0\r\n\r\n", ex.timeout)
        elif ex.chunks is not None:
            for frame in _chunk_frames(ex.chunks):
                await conn.send(frame, ex.timeout)
        while not ex.reply.done:
            data, n = await conn.recv(buf, view, ex.timeout)
            ex.feed(data, n)

    async def _httpx_request(self, method: str, path: str, params: Params, json_body: Any, content: Any,
                             timeout: Optional[float], raw: bool, headers: Optional[Dict[str, str]]) -> Any:
        import httpx

        kwargs = _request_kwargs(params, json_body, content, timeout, headers, is_async=True)
        try:
            resp = await self._client.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None
        if resp.status_code >= 400:
            raise _decode_error(resp.status_code, resp.headers, resp.content)
        return resp.content if raw else _decode_json(resp)

    @contextlib.asynccontextmanager
    async def stream_events(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        timeout: Optional[float] = None,
        params: Params = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> AsyncIterator[AsyncIterator[Event]]:
        """As :meth:`SyncHTTP.stream_events`."""
        if self._direct:
            async with self._raw_stream(_Stream(self, method, path, params, json_body, headers, timeout)) as events:
                yield events
            return
        import httpx

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
                yield self._events(resp)
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None

    async def _events(self, resp: "httpx.Response") -> AsyncIterator[Event]:
        import httpx

        try:
            reader = EventReader()
            async for chunk in resp.aiter_bytes():
                for ev in reader.feed(chunk):
                    yield ev
            for ev in reader.end():
                yield ev
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e) from None

    @contextlib.asynccontextmanager
    async def _raw_stream(self, st: _Stream) -> AsyncIterator[AsyncIterator[Event]]:
        # Plain TCP and unix sockets are read straight into one buffer (loop.sock_recv_into);
        # TLS goes through asyncio's streams, which copy each read once more.
        import asyncio

        (family, address), tls_name = st.address()
        loop = asyncio.get_running_loop()
        sock: Optional[socket.socket] = None
        writer: Optional[asyncio.StreamWriter] = None
        try:
            if tls_name is not None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    address[0], address[1], limit=2 * READ_SIZE, ssl=tls_context(), server_hostname=tls_name),
                    CONNECT_TIMEOUT)
            else:
                if family == socket.AF_UNIX:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                    sock.setblocking(False)
                    await asyncio.wait_for(loop.sock_connect(sock, address), CONNECT_TIMEOUT)
                else:
                    sock, sockaddr = _tcp_socket(await loop.getaddrinfo(*address, type=socket.SOCK_STREAM))
                    await asyncio.wait_for(loop.sock_connect(sock, sockaddr), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as e:
            if sock is not None:
                sock.close()
            raise st.failed(e, connecting=True) from None
        buf = bytearray(READ_SIZE)
        view = memoryview(buf)

        async def fill() -> None:
            if writer is not None:
                data = await asyncio.wait_for(reader.read(READ_SIZE), st.timeout)
                n = len(data)
            else:
                data, n = buf, await asyncio.wait_for(loop.sock_recv_into(sock, view), st.timeout)
            if n == 0:
                st.reply.eof()
            else:
                st.reply.feed(data, 0, n)

        try:
            try:
                if writer is not None:
                    writer.write(st.request)
                    await asyncio.wait_for(writer.drain(), st.timeout)
                else:
                    await asyncio.wait_for(loop.sock_sendall(sock, st.request), st.timeout)
                while not st.reply.head_done:
                    await fill()
                while st.reply.status >= 400 and not st.error_gathered():
                    await fill()
            except (OSError, asyncio.TimeoutError, ReplyError) as e:
                raise st.failed(e) from None
            if st.reply.status >= 400:
                raise st.error()

            async def events() -> AsyncIterator[Event]:
                try:
                    while True:
                        batch, st.events = st.events, []
                        for ev in batch:
                            yield ev
                        if st.reply.done:
                            break
                        await fill()
                except (OSError, asyncio.TimeoutError, ReplyError) as e:
                    raise st.failed(e) from None
                for ev in st.end():
                    yield ev

            yield events()
        finally:
            if writer is not None:
                writer.close()
            if sock is not None:
                sock.close()

    async def aclose(self) -> None:
        """As :meth:`SyncHTTP.close`."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.leave(_close_async)
        if self._httpx is not None:
            await self._httpx.aclose()

    close = aclose  # the name the calls' bodies (_core.py) use for either client


def _read_capped(chunks: Iterator[bytes]) -> bytes:
    body = bytearray()
    for chunk in chunks:
        body += chunk
        if len(body) > _MAX_ERROR_BODY:
            break
    return bytes(body)
