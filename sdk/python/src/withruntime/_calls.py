"""The halves of a call that the blocking and the asyncio clients share: what to
send and what an answer means, without the I/O (which each client does its own
way). Private: sandbox.py and async_sandbox.py import it."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._models import (
    DEFAULT_STREAM_KEEP_BYTES,
    MAX_EXEC_TIMEOUT_SECONDS,
    ExecStream,
    build_exec_body,
    check_path,
    event_end,
    sandbox_path,
)
from ._process import idempotency_headers, spawn_body, with_aliases
from .errors import InvalidRequestError


def list_page(data: Any) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """A page of GET /v1/sandboxes: its sandboxes (``data``, or an older daemon's
    ``sandboxes``) and the cursor of the next page, None after the last."""
    if not isinstance(data, dict):
        return [], None
    return list(data.get("data", data.get("sandboxes")) or []), data.get("nextCursor") or None


def page_params(params: List[Any], cursor: Optional[str]) -> List[Any]:
    return params + ([("cursor", cursor)] if cursor else [])


class ExecCall:
    """POST :exec: its path, body, wait and headers, and for a streamed one the
    output folded as it comes. ``fields`` are build_exec_body's (cwd, env, stdin,
    timeout_seconds, max_output_bytes, timeout_ms, user)."""

    def __init__(self, sandbox_id: str, command: Union[str, Sequence[str]], *, stream: bool,
                 idempotency_key: Optional[str], **fields: Any) -> None:
        self.stream = stream
        self.body, self.wait = build_exec_body(command, stream=stream, **fields)
        self.headers = idempotency_headers(idempotency_key)
        self.path = sandbox_path(sandbox_id, ":exec")
        keep = fields.get("max_output_bytes")
        self.folded = ExecStream(keep if keep is not None else DEFAULT_STREAM_KEEP_BYTES)


def stream_exec_call(sandbox_id: str, command: Union[str, Sequence[str]], *, timeout_ms: Optional[int],
                     timeout_seconds: Optional[float], idempotency_key: Optional[str], **fields: Any) -> ExecCall:
    """exec_stream's call: the timeout defaults to a day."""
    if timeout_ms is None and timeout_seconds is None:
        timeout_seconds = MAX_EXEC_TIMEOUT_SECONDS
    return ExecCall(sandbox_id, command, stream=True, idempotency_key=idempotency_key, timeout_ms=timeout_ms,
                    timeout_seconds=timeout_seconds, max_output_bytes=None, **fields)


class ExecEvents:
    """Reads a streamed exec's events. :meth:`feed` answers the event to hand
    out (with its aliases) or None; :attr:`done` once the stream ended, and
    :attr:`resume` (process id, cursor) when the daemon ended a long stream with
    ``continue`` and the rest is to be read from the process's output."""

    def __init__(self, body: Dict[str, Any]) -> None:
        self.body = {**body, "stream": True}
        self.body.pop("maxOutputBytes", None)
        self.done = False
        self.resume: Optional[Tuple[str, int]] = None
        self._process_id: Optional[str] = None
        self._cursor = 0

    def feed(self, ev: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        if self.done:
            return None
        if ev.get("type") == "start":
            self._process_id = ev.get("processId")
        if ev.get("type") == "continue":
            process_id = ev.get("processId")
            self.done = True
            if process_id:
                self.resume = (process_id, int(ev.get("cursor") or 0))
            return None
        self._cursor = event_end(ev, self._cursor)
        if ev.get("type") in ("exit", "error"):
            self.done = True
        return with_aliases(ev)


def spawn_request(command: Union[str, Sequence[str]], *, stdin: Union[str, bytes, None],
                  output_encoding: Optional[str], pty: Optional[Mapping[str, int]], **fields: Any) -> Dict[str, Any]:
    """The body of POST .../processes (``fields``: cwd, env, timeout_ms, user).
    ``stdin="pipe"`` keeps the input open."""
    body, _ = build_exec_body(command, stdin=None if stdin == "pipe" else stdin,
                              timeout_seconds=MAX_EXEC_TIMEOUT_SECONDS, stream=False, max_output_bytes=None, **fields)
    spawn_body(body, stdin, output_encoding)
    if pty is not None:
        # A terminal (pty={"cols": 120, "rows": 40}): its input stays open for write(), and
        # terminal(process_id=...) attaches to it.
        body["pty"] = {"cols": int(pty.get("cols", 80)), "rows": int(pty.get("rows", 24))}
    return body


def unarchive_request(path: str, data: bytes, gzip: Optional[bool]) -> Tuple[str, bytes]:
    """The checked path and the bytes of PUT .../files/archive; whether it is gzip is told
    by its first bytes, and a ``gzip`` that says otherwise is refused."""
    p = check_path(path)
    payload = bytes(data)
    if gzip is not None and gzip != payload.startswith(b"\x1f\x8b"):
        raise InvalidRequestError("gzip does not match the archive's first bytes")
    return p, payload


def save_local_file(local_path: str, data: bytes) -> None:
    """Writes a downloaded file under a temporary name beside ``local_path`` and renames it
    into place once whole."""
    target = os.path.abspath(local_path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    partial = f"{target}.partial-{os.getpid()}"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, target)
