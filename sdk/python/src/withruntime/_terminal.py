"""Interactive terminals over the daemon's WebSocket: the published client's names
(``write``, ``resize``, ``recv``, ``close``, ``process_id``, ``exit_code``)."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Union
from urllib.parse import quote, urlencode

from ._ws import AsyncWebSocket, SyncWebSocket
from .errors import APIError, error_from_response


def terminal_target(sandbox_id: str, cols: int, rows: int, command: Optional[str], cwd: Optional[str],
                    user: Optional[str], process_id: Optional[str]) -> str:
    for name, side in (("cols", cols), ("rows", rows)):
        if not isinstance(side, int) or isinstance(side, bool) or not 1 <= side <= 1000:
            raise ValueError(f"{name} must be an integer from 1 to 1000")
    query: Dict[str, Any] = {"cols": cols, "rows": rows}
    for k, v in (("command", command), ("cwd", cwd), ("user", user), ("processId", process_id)):
        if v is not None:
            query[k] = v
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}/terminal?{urlencode(query)}"


def _ready(message: Any) -> Dict[str, Any]:
    """The daemon's first message: ready, or the API's error that kept the terminal from starting."""
    event = json.loads(message) if isinstance(message, str) else None
    if isinstance(event, dict) and event.get("type") == "ready":
        return event
    if isinstance(event, dict) and isinstance(event.get("error"), dict):
        err = event["error"]
        raise error_from_response(int(err.get("status") or 500), {"error": err})
    raise APIError("the terminal did not start", code="terminal_refused")


class Terminal:
    """An interactive terminal in the sandbox: ``write()`` types, ``recv()`` reads the screen's bytes."""

    def __init__(self, socket: SyncWebSocket) -> None:
        self._socket = socket
        ready = _ready(socket.recv())
        self.process_id: Optional[str] = ready.get("processId")
        self.exit_code: Optional[int] = None

    def write(self, data: Union[str, bytes]) -> None:
        self._socket.send(data.encode() if isinstance(data, str) else bytes(data))

    def resize(self, cols: int, rows: int) -> None:
        self._socket.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def recv(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next output bytes, or None once the terminal has ended (``exit_code`` is then set
        when its process exited). With ``timeout``, TimeoutError when none came."""
        while True:
            message = self._socket.recv(timeout)
            if message is None:
                return None
            if isinstance(message, bytes):
                return message
            event = json.loads(message)
            if event.get("type") == "exit":
                self.exit_code = event.get("exitCode")

    def close(self) -> None:
        """Ends the terminal: a process it started is hung up (SIGHUP)."""
        self._socket.close()

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


class AsyncTerminal:
    """The async twin of :class:`Terminal`."""

    def __init__(self, socket: AsyncWebSocket) -> None:
        self._socket = socket
        self.process_id: Optional[str] = None
        self.exit_code: Optional[int] = None

    async def _start(self) -> "AsyncTerminal":
        await self._socket.connect()
        self.process_id = _ready(await self._socket.recv()).get("processId")
        return self

    async def write(self, data: Union[str, bytes]) -> None:
        await self._socket.send(data.encode() if isinstance(data, str) else bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        await self._socket.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def recv(self) -> Optional[bytes]:
        while True:
            message = await self._socket.recv()
            if message is None:
                return None
            if isinstance(message, bytes):
                return message
            event = json.loads(message)
            if event.get("type") == "exit":
                self.exit_code = event.get("exitCode")

    async def close(self) -> None:
        await self._socket.close()

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()
