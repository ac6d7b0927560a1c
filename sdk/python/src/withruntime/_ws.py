"""A small RFC 6455 WebSocket client for terminals: the handshake over the daemon's HTTP
connection (TCP, TLS or a unix socket), masked client frames, whole messages out. Standard
library only; sync over sockets, async over asyncio streams."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import struct
from typing import Dict, Optional, Tuple, Union
from urllib.parse import urlsplit

from ._config import Endpoint
from ._stream import tls_context
from .errors import APIConnectionError, error_from_response

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# A message from the daemon larger than this is not a terminal's: the connection is dropped.
MAX_MESSAGE = 16 * 1024 * 1024
_MAX_HEAD = 64 * 1024

Message = Union[bytes, str, None]


def _frame(opcode: int, payload: bytes) -> bytes:
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    if n:
        body = (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
    else:
        body = b""
    return head + mask + body


def _request(endpoint: Endpoint, path: str, headers: Dict[str, str]) -> Tuple[bytes, str]:
    key = base64.b64encode(os.urandom(16)).decode()
    host = urlsplit(endpoint.url).netloc or "runtimed"
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), accept


def _check_head(endpoint: Endpoint, head: bytes, accept: str) -> None:
    text = head.decode("latin-1", "replace")
    status_line, _, rest = text.partition("\r\n")
    parts = status_line.split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    fields = {}
    for line in rest.split("\r\n"):
        k, _, v = line.partition(":")
        fields[k.strip().lower()] = v.strip()
    if status != 101:
        raise error_from_response(status or 502, None, raw_text=f"{endpoint.display} refused the WebSocket: {status_line}")
    if fields.get("sec-websocket-accept") != accept:
        raise APIConnectionError(f"{endpoint.display} answered the WebSocket handshake wrongly")


class _Parser:
    """Frames in, messages out; what both clients share."""

    def __init__(self) -> None:
        self.buf = b""
        self.parts: list[bytes] = []
        self.opcode = 0

    def next(self) -> Tuple[Optional[int], bytes]:
        """(opcode, payload) of the next whole message or control frame, or (None, b"")."""
        while True:
            if len(self.buf) < 2:
                return None, b""
            first, second = self.buf[0], self.buf[1]
            n, at = second & 0x7F, 2
            if n == 126:
                if len(self.buf) < 4:
                    return None, b""
                n, at = struct.unpack("!H", self.buf[2:4])[0], 4
            elif n == 127:
                if len(self.buf) < 10:
                    return None, b""
                n, at = struct.unpack("!Q", self.buf[2:10])[0], 10
            if n > MAX_MESSAGE:
                raise APIConnectionError("the daemon sent a WebSocket frame larger than 16 MiB")
            if second & 0x80:
                at += 4
            if len(self.buf) < at + n:
                return None, b""
            payload, self.buf = self.buf[at:at + n], self.buf[at + n:]
            opcode, fin = first & 0x0F, bool(first & 0x80)
            if opcode >= 0x8:
                return opcode, payload
            if opcode != 0:
                self.opcode, self.parts = opcode, []
            self.parts.append(payload)
            if sum(len(p) for p in self.parts) > MAX_MESSAGE:
                raise APIConnectionError("the daemon sent a WebSocket message larger than 16 MiB")
            if fin:
                whole, self.parts = b"".join(self.parts), []
                return self.opcode, whole


def _message(opcode: int, payload: bytes) -> Message:
    return payload.decode("utf-8", "replace") if opcode == 0x1 else payload


class SyncWebSocket:
    def __init__(self, endpoint: Endpoint, path: str, headers: Dict[str, str], timeout: float = 30) -> None:
        self.endpoint = endpoint
        url = urlsplit(endpoint.url)
        try:
            if endpoint.uds:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                sock.connect(endpoint.uds)
            else:
                port = url.port or (443 if url.scheme == "https" else 80)
                sock = socket.create_connection((url.hostname or "127.0.0.1", port), timeout=timeout)
                # Keys are a few bytes each: no Nagle delay on them.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if url.scheme == "https":
                    sock = tls_context().wrap_socket(sock, server_hostname=url.hostname)
        except OSError as e:
            raise APIConnectionError(f"cannot connect to the Runtime daemon at {endpoint.display}: {e}") from e
        self._sock = sock
        self._parser = _Parser()
        self.closed = False
        request, accept = _request(endpoint, path, headers)
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk or len(data) > _MAX_HEAD:
                sock.close()
                raise APIConnectionError(f"{endpoint.display} closed the WebSocket handshake")
            data += chunk
        head, self._parser.buf = data.split(b"\r\n\r\n", 1)
        try:
            _check_head(endpoint, head, accept)
        except Exception:
            sock.close()
            raise
        sock.settimeout(None)

    def send(self, data: Union[bytes, str]) -> None:
        self._sock.sendall(_frame(0x1, data.encode()) if isinstance(data, str) else _frame(0x2, bytes(data)))

    def recv(self, timeout: Optional[float] = None) -> Message:
        """The next message: bytes, str, or None once the connection closed. With ``timeout``,
        raises TimeoutError when nothing whole came within it."""
        self._sock.settimeout(timeout)
        try:
            while True:
                opcode, payload = self._parser.next()
                if opcode is None:
                    chunk = self._sock.recv(65536)
                    if not chunk:
                        self.closed = True
                        return None
                    self._parser.buf += chunk
                    continue
                if opcode == 0x8:
                    if not self.closed:
                        self.closed = True
                        try:
                            self._sock.sendall(_frame(0x8, payload[:2]))
                        except OSError:
                            pass
                    return None
                if opcode == 0x9:
                    self._sock.sendall(_frame(0xA, payload))
                    continue
                if opcode in (0x1, 0x2):
                    return _message(opcode, payload)
        except socket.timeout as e:
            raise TimeoutError("no message within the timeout") from e
        except (ConnectionError, OSError):
            self.closed = True
            return None
        finally:
            try:
                self._sock.settimeout(None)
            except OSError:
                pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._sock.sendall(_frame(0x8, struct.pack("!H", 1000)))
            except OSError:
                pass
        self._sock.close()


class AsyncWebSocket:
    def __init__(self, endpoint: Endpoint, path: str, headers: Dict[str, str], timeout: float = 30) -> None:
        self.endpoint, self._path, self._headers, self._timeout = endpoint, path, headers, timeout
        self._parser = _Parser()
        self.closed = False

    async def connect(self) -> "AsyncWebSocket":
        url = urlsplit(self.endpoint.url)
        try:
            if self.endpoint.uds:
                opened = asyncio.open_unix_connection(self.endpoint.uds)
            else:
                tls = tls_context() if url.scheme == "https" else None
                port = url.port or (443 if url.scheme == "https" else 80)
                opened = asyncio.open_connection(url.hostname or "127.0.0.1", port, ssl=tls)
            self._reader, self._writer = await asyncio.wait_for(opened, self._timeout)
            raw = self._writer.get_extra_info("socket")
            if raw is not None and raw.family in (socket.AF_INET, socket.AF_INET6):
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, asyncio.TimeoutError) as e:
            raise APIConnectionError(f"cannot connect to the Runtime daemon at {self.endpoint.display}: {e}") from e
        request, accept = _request(self.endpoint, self._path, self._headers)
        self._writer.write(request)
        await self._writer.drain()
        try:
            head = await asyncio.wait_for(self._reader.readuntil(b"\r\n\r\n"), self._timeout)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError) as e:
            self._writer.close()
            raise APIConnectionError(f"{self.endpoint.display} closed the WebSocket handshake") from e
        try:
            _check_head(self.endpoint, head[:-4], accept)
        except Exception:
            self._writer.close()
            raise
        return self

    async def send(self, data: Union[bytes, str]) -> None:
        self._writer.write(_frame(0x1, data.encode()) if isinstance(data, str) else _frame(0x2, bytes(data)))
        await self._writer.drain()

    async def recv(self) -> Message:
        while True:
            opcode, payload = self._parser.next()
            if opcode is None:
                try:
                    chunk = await self._reader.read(65536)
                except (ConnectionError, OSError):
                    chunk = b""
                if not chunk:
                    self.closed = True
                    return None
                self._parser.buf += chunk
                continue
            if opcode == 0x8:
                if not self.closed:
                    self.closed = True
                    try:
                        self._writer.write(_frame(0x8, payload[:2]))
                    except OSError:
                        pass
                return None
            if opcode == 0x9:
                self._writer.write(_frame(0xA, payload))
                continue
            if opcode in (0x1, 0x2):
                return _message(opcode, payload)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._writer.write(_frame(0x8, struct.pack("!H", 1000)))
                await self._writer.drain()
            except OSError:
                pass
        self._writer.close()
