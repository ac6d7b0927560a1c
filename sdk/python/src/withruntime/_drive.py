"""The one body of every call, driven by the blocking or the asyncio client.

A call's logic (what it sends, what it checks, what an answer or an error means) is written once,
as a generator that yields the steps it needs done and gets back their results:

- ``Call(fn, *args)``: run ``fn``; the asyncio driver awaits what it returns when that is
  awaitable (a request of AsyncHTTP, a coroutine callback, ``asyncio.sleep``). What ``fn`` raises
  is raised inside the generator, where the call's logic may catch it.
- ``Open(cm)``: enter a streamed reply's context manager; the result is its events.
- ``Next(events)``: the next event, or None at their end.
- ``Shut(events)``: leave the stream before its end.
- ``Emit(event)``: hand an event to the caller (a call that answers a stream of them).

:func:`blocking` and :func:`awaitable` (and their ``_iter`` forms for calls that emit) turn such
a generator function into a method with its name, signature and docstring. The classes in
sandbox.py and async_sandbox.py say which client, process and sleep they use, and nothing more."""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Dict, Generator, Iterator, Optional, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Concatenate, ParamSpec

    P = ParamSpec("P")

T = TypeVar("T")
S = TypeVar("S")
Op = Generator[Any, Any, T]


class Call:
    __slots__ = ("fn", "args", "kwargs")

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs


class Open:
    __slots__ = ("cm",)

    def __init__(self, cm: Any) -> None:
        self.cm = cm


class Next:
    __slots__ = ("events",)

    def __init__(self, events: Any) -> None:
        self.events = events


class Shut(Next):
    __slots__ = ()


class Emit:
    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event


def _sync_step(step: Any, streams: Dict[int, contextlib.ExitStack]) -> Any:
    if type(step) is Call:
        return step.fn(*step.args, **step.kwargs)
    if type(step) is Next:
        return next(step.events, None)
    if type(step) is Open:
        stack = contextlib.ExitStack()
        events = stack.enter_context(step.cm)
        streams[id(events)] = stack
        return events
    if type(step) is Shut:
        streams.pop(id(step.events)).close()
        return None
    raise TypeError(f"not a step: {step!r}")


def _drive_sync(op: Op[Any], out: list) -> Iterator[Any]:
    """Runs op: yields what it emits, and puts its value in out."""
    streams: Dict[int, contextlib.ExitStack] = {}
    value: Any = None
    error: Optional[BaseException] = None
    try:
        while True:
            try:
                step = op.throw(error) if error is not None else op.send(value)
            except StopIteration as stop:
                out.append(stop.value)
                return
            value, error = None, None
            if type(step) is Emit:
                yield step.event
                continue
            try:
                value = _sync_step(step, streams)
            except BaseException as e:  # noqa: BLE001 - handed to the call's logic, which may clean up
                error = e
    finally:
        for stack in reversed(list(streams.values())):
            stack.close()
        op.close()


async def _async_step(step: Any, streams: Dict[int, contextlib.AsyncExitStack]) -> Any:
    if type(step) is Call:
        out = step.fn(*step.args, **step.kwargs)
        return await out if inspect.isawaitable(out) else out
    if type(step) is Next:
        try:
            return await step.events.__anext__()
        except StopAsyncIteration:
            return None
    if type(step) is Open:
        stack = contextlib.AsyncExitStack()
        events = await stack.enter_async_context(step.cm)
        streams[id(events)] = stack
        return events
    if type(step) is Shut:
        await streams.pop(id(step.events)).aclose()
        return None
    raise TypeError(f"not a step: {step!r}")


async def _drive_async(op: Op[Any], out: list) -> AsyncIterator[Any]:
    streams: Dict[int, contextlib.AsyncExitStack] = {}
    value: Any = None
    error: Optional[BaseException] = None
    try:
        while True:
            try:
                step = op.throw(error) if error is not None else op.send(value)
            except StopIteration as stop:
                out.append(stop.value)
                return
            value, error = None, None
            if type(step) is Emit:
                yield step.event
                continue
            try:
                value = await _async_step(step, streams)
            except BaseException as e:  # noqa: BLE001 - handed to the call's logic, which may clean up
                error = e
    finally:
        for stack in reversed(list(streams.values())):
            await stack.aclose()
        op.close()


def run(op: Op[T]) -> T:
    """The op's value, its steps done by blocking calls."""
    out: list = []
    for _ in _drive_sync(op, out):
        raise RuntimeError("a call that answers one value emitted an event")
    return out[0]


async def arun(op: Op[T]) -> T:
    """The op's value, its steps awaited."""
    out: list = []
    async for _ in _drive_async(op, out):
        raise RuntimeError("a call that answers one value emitted an event")
    return out[0]


def emitted(op: Op[Any]) -> Iterator[Any]:
    """What the op emits, as a blocking iterator."""
    return _drive_sync(op, [])


def aemitted(op: Op[Any]) -> AsyncIterator[Any]:
    """What the op emits, as an async iterator."""
    return _drive_async(op, [])


# The blocking client's names in a call's annotations, and the asyncio client's.
ASYNC_NAMES = {"Sandbox": "AsyncSandbox", "Process": "AsyncProcess", "Network": "AsyncNetwork",
               "Iterator": "AsyncIterator", "OutputCallback": "AsyncOutputCallback",
               "FileData": "Union[str, bytes, bytearray, memoryview]"}
_ASYNC_NAME = re.compile(r"\b(%s)\b" % "|".join(ASYNC_NAMES))


def _asyncio_signature(method: Any, op: Callable[..., Any]) -> None:
    """The op's signature with the asyncio client's names in its annotations."""
    def rename(a: Any) -> Any:
        return _ASYNC_NAME.sub(lambda m: ASYNC_NAMES[m.group(1)], a) if isinstance(a, str) else a

    sig = inspect.signature(op)
    method.__signature__ = sig.replace(
        parameters=[p.replace(annotation=rename(p.annotation)) for p in sig.parameters.values()],
        return_annotation=rename(sig.return_annotation))


def blocking(op: "Callable[Concatenate[S, P], Op[T]]") -> "Callable[Concatenate[S, P], T]":
    @functools.wraps(op)
    def method(*args: Any, **kwargs: Any) -> Any:
        return run(op(*args, **kwargs))

    return method


def awaitable(op: "Callable[Concatenate[S, P], Op[T]]") -> "Callable[Concatenate[S, P], Any]":
    @functools.wraps(op)
    async def method(*args: Any, **kwargs: Any) -> Any:
        return await arun(op(*args, **kwargs))

    _asyncio_signature(method, op)
    return method


def blocking_iter(op: "Callable[Concatenate[S, P], Op[Any]]") -> "Callable[Concatenate[S, P], Iterator[Any]]":
    @functools.wraps(op)
    def method(*args: Any, **kwargs: Any) -> Iterator[Any]:
        return emitted(op(*args, **kwargs))

    return method


def awaitable_iter(op: "Callable[Concatenate[S, P], Op[Any]]") -> "Callable[Concatenate[S, P], AsyncIterator[Any]]":
    @functools.wraps(op)
    def method(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return aemitted(op(*args, **kwargs))

    _asyncio_signature(method, op)
    return method


def relay(sub: Op[T], on_event: Callable[[Any], Optional[Call]]) -> Op[T]:
    """Runs sub inside the calling op: its steps pass on, what it emits goes to on_event, which
    may answer a step to take for it (a callback's Call). Use: ``yield from relay(sub, f)``."""
    value: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            step = sub.throw(error) if error is not None else sub.send(value)
        except StopIteration as stop:
            return stop.value
        value, error = None, None
        if type(step) is Emit:
            extra = on_event(step.event)
            if extra is not None:
                yield extra
            continue
        try:
            value = yield step
        except BaseException as e:  # noqa: BLE001 - sub's to handle
            error = e
