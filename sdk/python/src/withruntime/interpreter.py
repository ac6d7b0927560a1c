"""``sbx.interpreter``: a stateful Python in the sandbox, like a notebook.

``sbx.interpreter.run("x = 1")`` then ``sbx.interpreter.run("x + 1")`` answers an
execution whose ``results`` hold ``{"main": True, "data": {"text/plain": "2"}, "refs": {}}``.
The names and shapes are the published client's, so code moves between the two unchanged.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Union
from urllib.parse import quote

from ._drive import Call, Next, Open, awaitable, blocking
from .errors import APIError, InvalidRequestError, error_from_response

Callback = Optional[Callable[[Any], Any]]
_CONTEXT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_RESULT = re.compile(r"^/workspace/\.runtime/interpreter/([a-z0-9][a-z0-9-]{0,62})/out/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})$")
#: The MIME type of a DataFrame's rows: {"columns", "index", "rows", "dtypes", "totalRows", "truncated"}.
TABLE_MIME = "application/vnd.runtime.table+json"


def _check_context(context_id: str) -> str:
    if not isinstance(context_id, str) or not _CONTEXT.match(context_id):
        raise InvalidRequestError("a context id is 1-63 of [a-z0-9-], starting with a letter or digit")
    return context_id


def _run_body(code: str, language: Optional[str], context: Optional[str], timeout_ms: Optional[int],
              interrupt_on_disconnect: Optional[bool]) -> Dict[str, Any]:
    if not isinstance(code, str):
        raise InvalidRequestError("code must be a string")
    body: Dict[str, Any] = {"code": code}
    if context is not None:
        body["context"] = _check_context(context)
    for name, value in (("language", language), ("timeoutMs", timeout_ms),
                        ("interruptOnDisconnect", interrupt_on_disconnect)):
        if value is not None:
            body[name] = value
    return body


def _wait(timeout_ms: Optional[int]) -> Optional[float]:
    # The daemon answers a cell past its timeout; the HTTP wait only covers a lost daemon.
    return None if timeout_ms == 0 else (timeout_ms or 60_000) / 1000 + 60


def _result_path(ref: Union[Dict[str, Any], str]) -> str:
    path = ref if isinstance(ref, str) else ref.get("path", "")
    match = _RESULT.match(path or "")
    if not match:
        raise InvalidRequestError("not an interpreter result path")
    return f"contexts/{match[1]}/results/{match[2]}"


def _failure(event: Dict[str, Any]) -> APIError:
    return error_from_response(int(event.get("status") or 500), {"error": {
        k: event.get(k) for k in ("code", "status", "message", "hint", "requestId")}})


class ContextsOps:
    """``sbx.interpreter.contexts``: interpreters with their own state, directory and
    environment. ``"python"`` is the default context, started on first use."""

    def _base(self) -> str:
        return f"/v1/sandboxes/{quote(self._sandbox.id, safe='')}/interpreter/contexts"

    def list(self) -> List[Dict[str, Any]]:
        return (yield Call(self._sandbox._http.request, "GET", ContextsOps._base(self)))["data"]

    def create(self, *, id: Optional[str] = None, language: Optional[str] = None,  # noqa: A002
               cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        body = {k: v for k, v in {"id": id, "language": language, "cwd": cwd, "env": env}.items() if v is not None}
        if id is not None:
            _check_context(id)
        return (yield Call(self._sandbox._http.request, "POST", ContextsOps._base(self), json_body=body))

    def restart(self, context_id: str) -> Dict[str, Any]:
        """Start the context again with empty state."""
        return (yield Call(self._sandbox._http.request, "POST",
                           f"{ContextsOps._base(self)}/{_check_context(context_id)}:restart", json_body={}))

    def interrupt(self, context_id: str) -> bool:
        """Stop the running cell, as Ctrl-C would; the state stays."""
        return bool((yield Call(self._sandbox._http.request, "POST",
                                f"{ContextsOps._base(self)}/{_check_context(context_id)}:interrupt",
                                json_body={}))["interrupted"])

    def remove(self, context_id: str) -> bool:
        return bool((yield Call(self._sandbox._http.request, "DELETE",
                                f"{ContextsOps._base(self)}/{_check_context(context_id)}"))["deleted"])


class InterpreterOps:
    def _base(self) -> str:
        return f"/v1/sandboxes/{quote(self._sandbox.id, safe='')}/interpreter"

    def run(self, code: str, *, language: Optional[str] = None, context: Optional[str] = None,
            timeout_ms: Optional[int] = None, on_stdout: Callback = None, on_stderr: Callback = None,
            on_result: Callback = None, on_error: Callback = None,
            interrupt_on_disconnect: Optional[bool] = None) -> Dict[str, Any]:
        """Run a cell and return the execution: ``status`` (ok, error, timeout, lost),
        ``stdout``, ``stderr``, ``results`` (MIME bundles: text/plain, text/html, image/png as
        base64, application/json, :data:`TABLE_MIME`), ``error`` (name, value, traceback) and
        ``executionCount``. With any ``on_*`` callback, output streams to it as it happens;
        for the asyncio client the callbacks may be plain or async functions."""
        body = _run_body(code, language, context, timeout_ms, interrupt_on_disconnect)
        http = self._sandbox._http
        path = f"{InterpreterOps._base(self)}:run"
        if not (on_stdout or on_stderr or on_result or on_error):
            return (yield Call(http.request, "POST", path, json_body=body, timeout=_wait(timeout_ms)))
        events = yield Open(http.stream_events("POST", path, json_body={**body, "stream": True},
                                               timeout=_wait(timeout_ms)))
        while True:
            event = yield Next(events)
            if event is None:
                break
            kind = event.get("k")
            if kind in ("stdout", "stderr"):
                handler = on_stdout if kind == "stdout" else on_stderr
                if handler:
                    yield Call(handler, event["text"])
            elif kind == "result" and on_result:
                yield Call(on_result, {"main": event["main"], "data": event["data"], "refs": event["refs"]})
            elif kind == "error" and on_error:
                yield Call(on_error, {"name": event["name"], "value": event["value"], "traceback": event["traceback"]})
            elif kind == "execution":
                return event["execution"]
            elif kind == "failure":
                raise _failure(event)
        raise APIError("the interpreter stream ended without a result", code="stream_ended")

    def result(self, ref: Union[Dict[str, Any], str]) -> bytes:
        """The bytes of a result too large to travel inline (a ``refs`` entry or its path)."""
        return (yield Call(self._sandbox._http.request, "GET", f"{InterpreterOps._base(self)}/{_result_path(ref)}",
                           raw=True))


class InterpreterContexts:
    __doc__ = ContextsOps.__doc__

    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox

    list = blocking(ContextsOps.list)
    create = blocking(ContextsOps.create)
    restart = blocking(ContextsOps.restart)
    interrupt = blocking(ContextsOps.interrupt)
    remove = blocking(ContextsOps.remove)


class Interpreter:
    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox
        self.contexts = InterpreterContexts(sandbox)

    run = blocking(InterpreterOps.run)
    result = blocking(InterpreterOps.result)


class AsyncInterpreterContexts:
    """The async :class:`InterpreterContexts`."""

    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox

    list = awaitable(ContextsOps.list)
    create = awaitable(ContextsOps.create)
    restart = awaitable(ContextsOps.restart)
    interrupt = awaitable(ContextsOps.interrupt)
    remove = awaitable(ContextsOps.remove)


class AsyncInterpreter:
    """The async :class:`Interpreter`; callbacks may be plain or async functions."""

    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox
        self.contexts = AsyncInterpreterContexts(sandbox)

    run = awaitable(InterpreterOps.run)
    result = awaitable(InterpreterOps.result)
