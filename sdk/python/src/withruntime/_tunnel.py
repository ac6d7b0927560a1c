"""Port forwarding over the daemon's tunnel WebSocket: a local listener whose every connection
becomes a stream of one WebSocket, carried to a port on the sandbox's loopback.

Frames both ways are binary: a kind byte (``o`` open, ``d`` data, ``e`` end of input, ``c``
close, ``a`` credit), a 32-bit stream number and a payload. This side sends at most ``WINDOW``
data bytes beyond the last credit (``a``: the total the daemon has taken) and waits past it."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import struct
import threading
from typing import Any, Dict, Optional

from ._ws import AsyncWebSocket, SyncWebSocket
from .errors import APIError, APIConnectionError, error_from_response

WINDOW = 1024 * 1024
CHUNK = 64 * 1024


def check_port(port: Any, name: str = "port", zero_ok: bool = False) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not (0 if zero_ok else 1) <= port <= 65535:
        raise ValueError(f"{name} must be an integer from {0 if zero_ok else 1} to 65535")
    return port


def _frame(kind: bytes, stream: int, payload: bytes = b"") -> bytes:
    return kind + struct.pack("!I", stream) + payload


def _ready(message: Any) -> None:
    event = json.loads(message) if isinstance(message, str) else None
    if isinstance(event, dict) and event.get("type") == "ready":
        return
    if isinstance(event, dict) and isinstance(event.get("error"), dict):
        err = event["error"]
        raise error_from_response(int(err.get("status") or 500), {"error": err})
    raise APIConnectionError("the tunnel did not open")


class PortForward:
    """A local port forwarded to ``port`` inside the sandbox until :meth:`close`. ``local_port``
    and ``host`` say where it listens (loopback unless asked)."""

    def __init__(self, ws: SyncWebSocket, port: int, local_port: Optional[int], host: str) -> None:
        self._ws, self.port, self.host = ws, port, host
        _ready(ws.recv())
        self._send_lock = threading.Lock()
        self._credit = threading.Condition()
        self._sent = self._credited = 0
        self._next = 1
        self._over: Optional[str] = None
        self._conns: Dict[int, "queue.Queue[Optional[bytes]]"] = {}
        self._socks: Dict[int, socket.socket] = {}
        self._opening: Dict[int, list] = {}
        try:
            self._listener = socket.create_server((host, port if local_port is None else local_port))
        except OSError:
            ws.close()
            raise
        self.local_port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._accept, daemon=True).start()

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            self._ws.send(data)

    def _read(self) -> None:
        while True:
            message = self._ws.recv()
            if message is None:
                break
            if isinstance(message, str):
                event = json.loads(message)
                if event.get("type") == "error":
                    self._over = (event.get("error") or {}).get("message", "the tunnel failed")
                continue
            kind, stream, payload = message[:1], struct.unpack("!I", message[1:5])[0], message[5:]
            if kind == b"a":
                with self._credit:
                    self._credited = max(self._credited, struct.unpack("!Q", payload)[0])
                    self._credit.notify_all()
                continue
            waiter = self._opening.pop(stream, None)
            if waiter is not None:
                waiter[1] = None if kind == b"o" else payload.decode("utf-8", "replace") or "refused"
                waiter[0].set()
                continue
            out = self._conns.get(stream)
            if out is None:
                continue
            if kind == b"d":
                out.put(payload)
            elif kind == b"e":
                out.put(b"")
            elif kind == b"c":
                self._conns.pop(stream, None)
                out.put(None)
        with self._credit:
            self._over = self._over or "the tunnel closed"
            self._credit.notify_all()
        for waiter in list(self._opening.values()):
            waiter[1] = self._over
            waiter[0].set()
        for out in list(self._conns.values()):
            out.put(None)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(conn,), daemon=True).start()

    def _deliver(self, stream: int, conn: socket.socket, out: "queue.Queue[Optional[bytes]]") -> None:
        """The sandbox's bytes to the local connection, in its own thread: a slow local reader
        holds up only itself."""
        while True:
            data = out.get()
            try:
                if data is None:
                    conn.close()
                    return
                if data == b"":
                    conn.shutdown(socket.SHUT_WR)
                    continue
                conn.sendall(data)
            except OSError:
                if self._conns.pop(stream, None) is not None:
                    try:
                        self._send(_frame(b"c", stream))
                    except OSError:
                        pass  # the tunnel is closing too
                conn.close()
                return

    def _carry(self, conn: socket.socket) -> None:
        if self._over:
            conn.close()
            return
        with self._send_lock:
            stream = self._next
            self._next += 1
        waiter: list = [threading.Event(), None]
        # The outbox is there before the open is answered: a server that speaks first sends
        # data right behind its "o", before this thread would run again.
        out: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._conns[stream] = out
        self._opening[stream] = waiter
        self._send(_frame(b"o", stream, f"tcp {self.port}".encode()))
        waiter[0].wait()
        if waiter[1] is not None:
            self._conns.pop(stream, None)
            conn.close()
            return
        self._socks[stream] = conn
        threading.Thread(target=self._deliver, args=(stream, conn, out), daemon=True).start()
        try:
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    self._send(_frame(b"e", stream))
                    return
                with self._credit:
                    while self._sent + len(data) - self._credited > WINDOW and not self._over:
                        self._credit.wait()
                    if self._over:
                        return
                    self._sent += len(data)
                self._send(_frame(b"d", stream, data))
        except OSError:
            if self._conns.pop(stream, None) is not None:
                try:
                    self._send(_frame(b"c", stream))
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()
        for conn in list(self._socks.values()):
            conn.close()
        self._ws.close()

    def __enter__(self) -> "PortForward":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


class AsyncPortForward:
    """The async twin of :class:`PortForward`."""

    def __init__(self, ws: AsyncWebSocket, port: int, local_port: Optional[int], host: str) -> None:
        self._ws, self.port, self.host, self._local = ws, port, host, local_port
        self.local_port = 0
        self._sent = self._credited = 0
        self._next = 1
        self._over: Optional[str] = None
        self._credit = asyncio.Event()
        self._conns: Dict[int, asyncio.StreamWriter] = {}
        self._opening: Dict[int, "asyncio.Future[Optional[str]]"] = {}
        self._server: Any = None
        self._reader: Any = None

    async def _start(self) -> "AsyncPortForward":
        await self._ws.connect()
        try:
            _ready(await self._ws.recv())
            self._server = await asyncio.start_server(self._carry, self.host,
                                                      self.port if self._local is None else self._local)
        except BaseException:
            await self._ws.close()
            raise
        self.local_port = self._server.sockets[0].getsockname()[1]
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        while True:
            message = await self._ws.recv()
            if message is None:
                break
            if isinstance(message, str):
                event = json.loads(message)
                if event.get("type") == "error":
                    self._over = (event.get("error") or {}).get("message", "the tunnel failed")
                continue
            kind, stream, payload = message[:1], struct.unpack("!I", message[1:5])[0], message[5:]
            if kind == b"a":
                self._credited = max(self._credited, struct.unpack("!Q", payload)[0])
                self._credit.set()
                continue
            opening = self._opening.pop(stream, None)
            if opening is not None:
                opening.set_result(None if kind == b"o" else payload.decode("utf-8", "replace") or "refused")
                continue
            writer = self._conns.get(stream)
            if writer is None:
                continue
            if kind == b"d":
                writer.write(payload)
            elif kind == b"e" and writer.can_write_eof():
                writer.write_eof()
            elif kind == b"c":
                self._conns.pop(stream, None)
                writer.close()
        self._over = self._over or "the tunnel closed"
        self._credit.set()
        for opening in self._opening.values():
            if not opening.done():
                opening.set_result(self._over)
        for writer in self._conns.values():
            writer.close()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._over:
            writer.close()
            return
        stream, self._next = self._next, self._next + 1
        opened: "asyncio.Future[Optional[str]]" = asyncio.get_running_loop().create_future()
        # Registered before the open is answered: the reader may take the data that follows
        # the "o" before this task runs again.
        self._conns[stream] = writer
        self._opening[stream] = opened
        await self._ws.send(_frame(b"o", stream, f"tcp {self.port}".encode()))
        if await opened is not None:
            self._conns.pop(stream, None)
            writer.close()
            return
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    await self._ws.send(_frame(b"e", stream))
                    return
                while self._sent + len(data) - self._credited > WINDOW and not self._over:
                    self._credit.clear()
                    await self._credit.wait()
                if self._over:
                    return
                self._sent += len(data)
                await self._ws.send(_frame(b"d", stream, data))
        except (ConnectionError, OSError):
            if self._conns.pop(stream, None) is not None:
                await self._ws.send(_frame(b"c", stream))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._conns.values()):
            writer.close()
        await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()

    async def __aenter__(self) -> "AsyncPortForward":
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()
