"""Processes: every streamed exec and every spawn is one, with an id, its output kept by the
daemon and read from a cursor (docs/api.md, Processes). :class:`Process` and
:class:`AsyncProcess` share their request shapes and event folding here."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any, Dict, Iterator, Mapping, Optional, Union

from ._drive import Call, Emit, Next, Open, Shut, awaitable, awaitable_iter, blocking, blocking_iter, relay
from ._models import ExecStream, event_end, sandbox_path
from .errors import InvalidRequestError

if TYPE_CHECKING:
    from ._http import AsyncHTTP, SyncHTTP

#: How long one output request may run; the daemon ends long ones with ``continue``.
OUTPUT_READ_TIMEOUT_SECONDS = 600.0
SIGNALS = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGCONT", "SIGSTOP",
           "SIGTSTP")


def with_aliases(ev: Dict[str, Any]) -> Dict[str, Any]:
    """snake_case aliases beside the camelCase fields, as the published client gives."""
    if ev.get("type") in ("stdout", "stderr"):
        return ev  # none of the aliased fields: no copy per output event
    return {**ev, **{alias: ev[name] for name, alias in _ALIASES.items() if name in ev}}


_ALIASES = {"processId": "process_id", "exitCode": "exit_code", "timedOut": "timed_out",
            "durationMs": "duration_ms", "droppedBytes": "dropped_bytes", "resumeAt": "resume_at",
            "outOfMemory": "out_of_memory"}


class OutputReading:
    """Where a read of a process's output stands, across the requests it takes: ``params`` for
    the next one, ``feed`` each event (the event to hand out, or None), and ``again`` when the
    daemon ended a long reply with ``continue`` and the rest is to be read from ``cursor``."""

    def __init__(self, cursor: int, follow: bool) -> None:
        self.cursor = cursor
        self.follow = follow
        self.again = True
        self.stop = False

    def params(self) -> Dict[str, Any]:
        self.again = False
        return {"cursor": self.cursor, "follow": "true" if self.follow else "false"}

    def feed(self, ev: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        kind = ev.get("type")
        if kind == "continue":
            self.cursor, self.again, self.stop = max(self.cursor, int(ev.get("cursor") or 0)), True, True
            return None
        if kind == "truncated" and isinstance(ev.get("resumeAt"), int):
            self.cursor = max(self.cursor, ev["resumeAt"])
        self.cursor = event_end(ev, self.cursor)
        self.stop = kind in ("exit", "error")
        return with_aliases(ev)


def spawn_body(exec_body: Dict[str, Any], stdin: Union[str, bytes, None], output_encoding: Optional[str]) -> None:
    exec_body.pop("stream", None)
    exec_body.pop("maxOutputBytes", None)
    if stdin == "pipe":
        exec_body.pop("stdin", None)
        exec_body["stdinMode"] = "pipe"
    if output_encoding is not None:
        if output_encoding not in ("utf8", "base64"):
            raise InvalidRequestError("output_encoding must be 'utf8' or 'base64'")
        exec_body["outputEncoding"] = output_encoding


def idempotency_headers(key: Optional[str]) -> Optional[Dict[str, str]]:
    if key is None:
        return None
    if not isinstance(key, str) or not 0 < len(key) <= 128:
        raise InvalidRequestError("idempotency_key must be 1-128 characters")
    return {"Idempotency-Key": key}


def signal_name(signal: Union[str, int]) -> Union[str, int]:
    if isinstance(signal, str) and not signal.startswith("SIG"):
        signal = "SIG" + signal
    if isinstance(signal, str) and signal not in SIGNALS:
        raise InvalidRequestError(f"signal must be one of {', '.join(SIGNALS)}")
    return signal


def write_body(chunk: bytes, offset: int, eof: bool) -> Dict[str, Any]:
    return {"base64": base64.b64encode(chunk).decode("ascii"), "offset": offset, "eof": eof}


class _ProcessBase:
    def __init__(self, sandbox_id: str, info: Mapping[str, Any]) -> None:
        self.sandbox_id = sandbox_id
        self.info: Dict[str, Any] = dict(info)
        self._stdin_offset = int(self.info.get("stdinOffset") or 0)

    @property
    def id(self) -> str:
        return str(self.info["id"])

    @property
    def state(self) -> Optional[str]:
        """"running", "exited", "killed", "timed_out" or "lost" (its sandbox stopped), as of
        the last answer."""
        return self.info.get("state")

    @property
    def exit_code(self) -> Optional[int]:
        """None while it runs, and when a signal or a timeout ended it."""
        return self.info.get("exitCode")

    @property
    def command(self) -> Optional[str]:
        return self.info.get("command")

    def _path(self, suffix: str = "") -> str:
        return sandbox_path(self.sandbox_id, f"/processes/{self.id}{suffix}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self.state!r}, exit_code={self.exit_code!r})"


class ProcessOps:
    """The body of each call of :class:`Process` and :class:`AsyncProcess` (see _drive.py;
    the annotations are the blocking client's)."""

    def refresh(self) -> "Process":
        self.info = yield Call(self._http.request, "GET", self._path())
        return self

    def output(self, cursor: int = 0, *, follow: bool = True) -> Iterator[Dict[str, Any]]:
        """Its output events from ``cursor`` (bytes of stdout and stderr together): ``stdout``,
        ``stderr`` (``data``, and ``base64`` when the bytes are not UTF-8), ``truncated`` for
        output the daemon no longer kept, and at the end ``exit`` (or ``error`` when its sandbox
        stopped). With ``follow`` it waits for the end; without, it stops at what exists."""
        reading = OutputReading(cursor, follow)
        while reading.again:
            events = yield Open(self._http.stream_events("GET", self._path("/output"), params=reading.params(),
                                                         timeout=OUTPUT_READ_TIMEOUT_SECONDS))
            while not reading.stop:
                ev = yield Next(events)
                if ev is None:
                    break
                out = reading.feed(ev)
                if out is not None:
                    yield Emit(out)
            yield Shut(events)

    def wait(self) -> "CommandResult":
        """Follows the output to the end and returns it as a result."""
        folded = ExecStream()
        folded.process_id = self.id
        yield from relay(ProcessOps.output(self), lambda ev: folded.feed_event(ev) and None)
        yield from ProcessOps.refresh(self)
        return folded.finish()

    def write(self, data: Union[str, bytes], eof: bool = False) -> None:
        """Sends input (a pipe spawned with ``stdin="pipe"``); ``eof=True`` closes it after.
        Offsets are tracked, so a retried write is never typed twice."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        sent = 0
        while True:
            chunk = payload[sent : sent + 512 * 1024]
            last = sent + len(chunk) == len(payload)
            reply = yield Call(self._http.request, "POST", self._path(":write"),
                               json_body=write_body(chunk, self._stdin_offset, eof and last))
            took = int(reply.get("offset", self._stdin_offset)) - self._stdin_offset
            self._stdin_offset += took
            sent += took
            if sent >= len(payload) and (not eof or last):
                return
            if took == 0:
                yield Call(self._sleep, 0.05)  # the process has not read what it was sent yet

    def kill(self, signal: Union[str, int] = "SIGTERM") -> None:
        """Sends ``signal`` to its whole process group."""
        self.info = yield Call(self._http.request, "POST", self._path(":signal"),
                               json_body={"signal": signal_name(signal)})


class Process(_ProcessBase):
    """A process in a sandbox: its output from a cursor, its stdin, signals, its end."""

    _sleep = staticmethod(time.sleep)

    def __init__(self, http: SyncHTTP, sandbox_id: str, info: Mapping[str, Any]) -> None:
        super().__init__(sandbox_id, info)
        self._http = http

    refresh = blocking(ProcessOps.refresh)
    output = blocking_iter(ProcessOps.output)
    wait = blocking(ProcessOps.wait)
    write = blocking(ProcessOps.write)
    kill = blocking(ProcessOps.kill)


class AsyncProcess(_ProcessBase):
    """As :class:`Process`, awaitable."""

    @staticmethod
    async def _sleep(seconds: float) -> None:
        import asyncio  # here, not at the top: the blocking client never needs it

        await asyncio.sleep(seconds)

    def __init__(self, http: AsyncHTTP, sandbox_id: str, info: Mapping[str, Any]) -> None:
        super().__init__(sandbox_id, info)
        self._http = http

    refresh = awaitable(ProcessOps.refresh)
    output = awaitable_iter(ProcessOps.output)
    wait = awaitable(ProcessOps.wait)
    write = awaitable(ProcessOps.write)
    kill = awaitable(ProcessOps.kill)


from ._models import CommandResult  # noqa: E402  (for the annotations above)
