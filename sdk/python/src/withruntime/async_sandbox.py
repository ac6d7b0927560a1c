"""The asyncio client: :class:`AsyncSandbox` and its :class:`AsyncFiles`, with the same names
as the blocking client, awaitable."""

from __future__ import annotations

import os

import inspect
from types import TracebackType
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Generator, List, Mapping, Optional, Sequence, Type, Union

from ._config import resolve_api_key, resolve_endpoint
from ._http import AsyncHTTP, websocket_headers
from ._models import (
    fork_body,
    snapshot_body,
    snapshot_path,
    snapshot_update_body,
    CREATE_HTTP_TIMEOUT_SECONDS,
    CommandResult,
    FileEntry,
    FileList,
    SandboxInfo,
    WriteResult,
    build_create_body,
    build_network_body,
    build_secret_body,
    check_secret_name,
    check_secret_value,
    check_limit,
    parse_egress_log,
    secret_path,
    build_list_params,
    pack_directory,
    unpack_directory,
    build_sandbox_list_params,
    check_path,
    check_sandbox_id,
    encode_content,
    parse_entry,
    parse_exec_result,
    parse_list,
    parse_write,
    sandbox_path,
    wake_body,
    with_user,
)
from . import _calls
from ._process import AsyncProcess, idempotency_headers
from ._tunnel import AsyncPortForward, check_port
from ._terminal import AsyncTerminal, terminal_target
from ._ws import AsyncWebSocket
from .interpreter import AsyncInterpreter
from .errors import APIError, CommandError, InvalidRequestError, NotFoundError, NotPausedError

AsyncOutputCallback = Callable[[str], Union[Any, Awaitable[Any]]]


def _connect(
    api_key: Optional[str], base_url: Optional[str], http_timeout: Optional[float], transport: Any
) -> AsyncHTTP:
    endpoint = resolve_endpoint(base_url)
    return AsyncHTTP(endpoint, resolve_api_key(api_key), timeout=http_timeout, transport=transport)


class _Creating:
    """What :meth:`AsyncSandbox.create` returns: await it for the sandbox, or use it directly
    in ``async with`` to delete the sandbox when the block ends."""

    def __init__(self, make: Callable[[], Awaitable["AsyncSandbox"]]) -> None:
        self._make = make
        self._sbx: Optional[AsyncSandbox] = None

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self._make().__await__()

    async def __aenter__(self) -> "AsyncSandbox":
        self._sbx = await self._make()
        return self._sbx

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._sbx is not None:
            await self._sbx.__aexit__(exc_type, exc, tb)


class AsyncSandbox(SandboxInfo):
    """A sandbox on a Runtime daemon, for asyncio code.

    ``sbx = await AsyncSandbox.create(...)`` or ``async with AsyncSandbox.create(...) as sbx:``
    (the sandbox is deleted when the block ends unless ``keep=True``).
    """

    def __init__(self, http: AsyncHTTP, data: Dict[str, Any], *, keep: bool = True, owns_http: bool = True) -> None:
        self._http = http
        self._owns_http = owns_http
        self._keep = keep
        self._set_data(data)
        self.files = AsyncFiles(self)
        self.interpreter = AsyncInterpreter(self)

    @classmethod
    def create(
        cls,
        *,
        keep: bool = False,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        http_timeout: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        _transport: Any = None,
        **fields: Any,
    ) -> _Creating:
        """Create and start a sandbox; the fields are those of :meth:`Sandbox.create`."""
        body = build_create_body(fields)
        headers = idempotency_headers(idempotency_key)

        async def make() -> "AsyncSandbox":
            http = _connect(api_key, base_url, http_timeout, _transport)
            try:
                data = await http.request(
                    "POST", "/v1/sandboxes", json_body=body, timeout=CREATE_HTTP_TIMEOUT_SECONDS, headers=headers
                )
                return cls(http, data, keep=keep)
            except BaseException:
                await http.aclose()
                raise

        return _Creating(make)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        http_timeout: Optional[float] = None,
        _transport: Any = None,
    ) -> "AsyncSandbox":
        """Attach to an existing sandbox. An ``async with`` block on it does not delete it."""
        check_sandbox_id(sandbox_id)
        http = _connect(api_key, base_url, http_timeout, _transport)
        try:
            data = await http.request("GET", sandbox_path(sandbox_id))
            return cls(http, data, keep=True)
        except BaseException:
            await http.aclose()
            raise

    @classmethod
    async def get_or_create(cls, name: str, **fields: Any) -> "AsyncSandbox":
        """The awaitable twin of :meth:`withruntime.Sandbox.get_or_create`."""
        fields.setdefault("keep", True)
        return await cls.create(name=name, get_or_create=True, **fields)

    @classmethod
    async def list(
        cls,
        *,
        state: Optional[Sequence[str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        name: Optional[str] = None,
        include_stopped: bool = True,
        limit: Optional[int] = None,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        _transport: Any = None,
    ) -> List["AsyncSandbox"]:
        """The caller's sandboxes, oldest first, every page: see :meth:`withruntime.Sandbox.list`."""
        params = build_sandbox_list_params(state, labels, name, include_stopped, limit)
        http = _connect(api_key, base_url, None, _transport)
        out: List[AsyncSandbox] = []
        try:
            cursor: Optional[str] = None
            while True:
                page = await http.request("GET", "/v1/sandboxes", params=_calls.page_params(params, cursor))
                items, cursor = _calls.list_page(page)
                out += [cls(http, d, keep=True, owns_http=False) for d in items]
                if not cursor:
                    break
        except BaseException:
            await http.aclose()
            raise
        if not out:
            await http.aclose()
        return out

    @classmethod
    async def stop_all(cls, *, labels: Mapping[str, str], **client: Any) -> Dict[str, Any]:
        """The awaitable twin of :meth:`withruntime.Sandbox.stop_all`."""
        return await cls._each_labelled("stop", labels, False, client)

    @classmethod
    async def delete_all(cls, *, labels: Mapping[str, str], **client: Any) -> Dict[str, Any]:
        """The awaitable twin of :meth:`withruntime.Sandbox.delete_all`."""
        return await cls._each_labelled("delete", labels, True, client)

    @classmethod
    async def _each_labelled(cls, verb: str, labels: Mapping[str, str], include_stopped: bool,
                             client: Dict[str, Any]) -> Dict[str, Any]:
        if not labels:
            raise InvalidRequestError(f"{verb}_all needs at least one label to match")
        matches = await cls.list(labels=labels, include_stopped=include_stopped, limit=100, **client)
        done: List[str] = []
        failed: List[Dict[str, Any]] = []
        for sbx in matches:
            try:
                await getattr(sbx, verb)()
                done.append(sbx.id)
            except APIError as e:
                failed.append({"id": sbx.id, "error": e})
        if matches:
            await matches[0]._http.aclose()
        return {"stopped" if verb == "stop" else "deleted": done, "failed": failed}

    async def refresh(self) -> "AsyncSandbox":
        self._set_data(await self._http.request("GET", sandbox_path(self.id)))
        return self

    async def stop(self) -> "AsyncSandbox":
        self._set_data(await self._http.request("POST", sandbox_path(self.id, ":stop")))
        return self

    async def pause(self, idempotency_key: Optional[str] = None) -> "AsyncSandbox":
        """See :meth:`Sandbox.pause`."""
        self._set_data(await self._http.request("POST", sandbox_path(self.id, ":pause"), json_body={},
                                          headers=idempotency_headers(idempotency_key)))
        return self

    async def wake(self, timeout_seconds: Optional[int] = None, idempotency_key: Optional[str] = None) -> "AsyncSandbox":
        """See :meth:`Sandbox.wake`."""
        body = wake_body(timeout_seconds)
        try:
            data = await self._http.request("POST", sandbox_path(self.id, ":wake"), json_body=body,
                                      headers=idempotency_headers(idempotency_key),
                                            timeout=CREATE_HTTP_TIMEOUT_SECONDS)
        except NotPausedError:
            if timeout_seconds is not None:
                raise
            data = await self._http.request("GET", sandbox_path(self.id))
            if data.get("state") not in ("running", "starting"):
                raise
        self._set_data(data)
        return self

    async def restart(self, idempotency_key: Optional[str] = None) -> "AsyncSandbox":
        """See :meth:`Sandbox.restart`."""
        self._set_data(await self._http.request("POST", sandbox_path(self.id, ":restart"), json_body={},
                                          headers=idempotency_headers(idempotency_key),
                                                timeout=CREATE_HTTP_TIMEOUT_SECONDS))
        return self

    async def snapshot(self, *, name: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                 retention_days: Optional[int] = None, mode: Optional[str] = None,
                 idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Keep its disk (files and /workspace) as a snapshot; returns the snapshot's dict
        (``id``, ``state`` "ready", ``mode``, ``sizeBytes``, ``expiresAt``...). A running
        sandbox is frozen only while its disk is copied. ``retention_days`` (1 to 365, 7 by
        default) is how long the daemon keeps it. ``mode="memory"`` is refused
        (:class:`UnavailableError`, 501) on every driver of this daemon."""
        body = snapshot_body(name, labels, retention_days, mode)
        return dict(await self._http.request("POST", sandbox_path(self.id, ":snapshot"), json_body=body,
                                       headers=idempotency_headers(idempotency_key),
                                       timeout=CREATE_HTTP_TIMEOUT_SECONDS))

    async def fork(self, count: Optional[int] = None, *, name: Optional[str] = None,
             labels: Optional[Mapping[str, str]] = None, keep_snapshot: Optional[bool] = None,
             secrets: Optional[Sequence[str]] = None, idempotency_key: Optional[str] = None) -> Any:
        """Copies of this sandbox's files as they are now, each running: one Sandbox without
        ``count``, a list with it (1 to 16, made all or none). ``keep_snapshot`` keeps the
        snapshot they were made from."""
        body = fork_body(count, name, labels, keep_snapshot, secrets)
        data = await self._http.request("POST", sandbox_path(self.id, ":fork"), json_body=body,
                                  headers=idempotency_headers(idempotency_key),
                                  timeout=CREATE_HTTP_TIMEOUT_SECONDS * (count or 1))
        made = [type(self)(self._http, info, keep=True, owns_http=False) for info in data["sandboxes"]]
        return made if count is not None else made[0]

    async def update(self, **settings: Any) -> "AsyncSandbox":
        """Changes its settings, all or nothing; what is left out stays: ``name`` (None
        removes it), ``labels`` (replaces them all; None removes them), ``network``, ``env`` (a
        value sets a variable, None removes it; commands started afterwards see it), ``user``
        (``"sandbox"`` or ``"root"``: who later commands, processes, terminals and file
        operations run as when they name none; None is back to ``"sandbox"``), ``auto_wake``,
        ``idle_pause_seconds`` (counted from now; 0 never), ``max_total_cost_micros`` (None
        removes the cap), ``timeout_seconds`` (a new lease counted from now, 1 to 86400) and
        ``on_timeout`` (``"stop"``, ``"pause"`` or ``"delete"``). The same names as the
        published client's ``update``; ``persistent=True`` and ``timeout_seconds=0`` are
        refused (every sandbox here has a lease)."""
        body = {"".join(w.capitalize() if i else w for i, w in enumerate(k.split("_"))): v
                for k, v in settings.items()}
        self._set_data(await self._http.request("POST", sandbox_path(self.id, ":update"), json_body=body))
        return self

    async def extend(self, seconds: int) -> "AsyncSandbox":
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            raise InvalidRequestError(f"seconds must be an integer, not {type(seconds).__name__}")
        self._set_data(
            await self._http.request("POST", sandbox_path(self.id, ":extend"), json_body={"seconds": seconds})
        )
        return self

    async def set_network(self, network: Mapping[str, Any]) -> "AsyncSandbox":
        self._set_data(
            await self._http.request("PUT", sandbox_path(self.id, "/network"), json_body=dict(network))
        )
        return self

    @property
    def network(self) -> "AsyncNetwork":
        """The egress policy as last answered (a dict), with awaitable ``.set(...)``."""
        return AsyncNetwork(self, self._data.get("network") or {})

    async def egress_log(self, limit: int = 100) -> List[Dict[str, Any]]:
        return parse_egress_log(
            await self._http.request("GET", sandbox_path(self.id, "/egress"), params={"limit": check_limit(limit)})
        )

    async def delete(self, idempotency_key: Optional[str] = None) -> None:
        await self._http.request("DELETE", sandbox_path(self.id), headers=idempotency_headers(idempotency_key))
        self._data["state"] = "deleted"

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            if not self._keep:
                try:
                    await self.delete()
                except NotFoundError:
                    pass
                except APIError:
                    if exc_type is None:
                        raise
        finally:
            await self.close()

    async def exec(
        self,
        command: Union[str, Sequence[str]],
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout_seconds: Optional[float] = 60,
        on_stdout: Optional[AsyncOutputCallback] = None,
        on_stderr: Optional[AsyncOutputCallback] = None,
        max_output_bytes: Optional[int] = None,
        timeout_ms: Optional[int] = None,
        check: bool = False,
        idempotency_key: Optional[str] = None,
        user: Optional[str] = None,
    ) -> CommandResult:
        """As :meth:`Sandbox.exec`; the callbacks may be plain functions or coroutines."""
        call = _calls.ExecCall(self.id, command, cwd=cwd, env=env, stdin=stdin, timeout_seconds=timeout_seconds,
                               stream=on_stdout is not None or on_stderr is not None,
                               max_output_bytes=max_output_bytes, timeout_ms=timeout_ms, user=user,
                               idempotency_key=idempotency_key)
        if not call.stream:
            result = parse_exec_result(
                await self._http.request("POST", call.path, json_body=call.body, timeout=call.wait,
                                         headers=call.headers)
            )
        else:
            async for ev in self._exec_events(call):
                kind, data = call.folded.feed_event(ev)
                cb = on_stdout if kind == "stdout" else on_stderr if kind == "stderr" else None
                if cb is not None:
                    ret = cb(data)
                    if inspect.isawaitable(ret):
                        await ret
            result = call.folded.finish()
        if check and not result.ok:
            raise CommandError(result)
        return result

    async def _exec_events(self, call: _calls.ExecCall) -> AsyncIterator[Dict[str, Any]]:
        events = _calls.ExecEvents(call.body)
        async with self._http.stream_events("POST", call.path, json_body=events.body, timeout=call.wait,
                                           headers=call.headers) as stream:
            async for event in stream:
                ev = events.feed(event)
                if ev is not None:
                    yield ev
                if events.done:
                    break
        if events.resume:
            process_id, cursor = events.resume
            async for ev in AsyncProcess(self._http, self.id, {"id": process_id}).output(cursor):
                yield ev

    def exec_stream(
        self,
        command: Union[str, Sequence[str]],
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout_ms: Optional[int] = None,
        timeout_seconds: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        user: Optional[str] = None,
    ) -> AsyncIterator[Dict[str, Any]]:
        """As :meth:`Sandbox.exec_stream`: ``async for event in sbx.exec_stream(...)``."""
        call = _calls.stream_exec_call(self.id, command, cwd=cwd, env=env, stdin=stdin, timeout_ms=timeout_ms,
                                       timeout_seconds=timeout_seconds, user=user, idempotency_key=idempotency_key)
        return self._exec_events(call)

    async def spawn(
        self,
        command: Union[str, Sequence[str]],
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout_ms: Optional[int] = None,
        user: Optional[str] = None,
        output_encoding: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        pty: Optional[Mapping[str, int]] = None,
    ) -> AsyncProcess:
        """As :meth:`Sandbox.spawn`."""
        body = _calls.spawn_request(command, cwd=cwd, env=env, stdin=stdin, timeout_ms=timeout_ms, user=user,
                                    output_encoding=output_encoding, pty=pty)
        info = await self._http.request("POST", sandbox_path(self.id, "/processes"), json_body=body,
                                        headers=idempotency_headers(idempotency_key))
        return AsyncProcess(self._http, self.id, info)

    async def forward_port(self, port: int, *, local_port: Optional[int] = None,
                           host: str = "127.0.0.1") -> AsyncPortForward:
        """As :meth:`Sandbox.forward_port`, for asyncio code."""
        check_port(port)
        if local_port is not None:
            check_port(local_port, "local_port", zero_ok=True)
        ws = AsyncWebSocket(self._http.endpoint, f"/v1/sandboxes/{self.id}/tunnel", websocket_headers(self._http.api_key))
        return await AsyncPortForward(ws, port, local_port, host)._start()


    async def terminal(
        self,
        *,
        cols: int = 80,
        rows: int = 24,
        command: Optional[str] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        process_id: Optional[str] = None,
    ) -> AsyncTerminal:
        """An interactive terminal over a WebSocket: a login shell, or ``command``, on a PTY of
        ``cols`` x ``rows``; or, with ``process_id``, the running process spawned with ``pty=``.
        ``write()`` types, ``recv()`` reads, ``resize()``; ``close()`` hangs up a process it
        started."""
        target = terminal_target(self.id, cols, rows, command, cwd, user, process_id)
        return await AsyncTerminal(AsyncWebSocket(self._http.endpoint, target, websocket_headers(self._http.api_key)))._start()

    async def processes(self) -> List[Dict[str, Any]]:
        return list((await self._http.request("GET", sandbox_path(self.id, "/processes")))["data"])

    async def process(self, process_id: str) -> AsyncProcess:
        info = await self._http.request("GET", sandbox_path(self.id, f"/processes/{process_id}"))
        return AsyncProcess(self._http, self.id, info)


class AsyncFiles:
    """File operations inside one sandbox, awaitable."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    def _url(self, suffix: str) -> str:
        return sandbox_path(self._sbx.id, suffix)

    async def read(self, path: str, *, user: Optional[str] = None) -> bytes:
        p = check_path(path)
        data: bytes = await self._sbx._http.request(
            "GET", self._url("/files/content"), params=with_user({"path": p}, user), raw=True
        )
        return data

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return (await self.read(path)).decode(encoding, errors)

    async def write(
        self, path: str, data: Union[str, bytes, bytearray, memoryview], *, mode: Optional[int] = None,
        user: Optional[str] = None
    ) -> WriteResult:
        p = check_path(path)
        params: Dict[str, Union[str, int]] = with_user({"path": p}, user)
        if mode is not None:
            params["mode"] = format(int(mode), "o")
        content = encode_content(data)
        out = await self._sbx._http.request("PUT", self._url("/files/content"), params=params, content=content)
        return parse_write(out, p, len(content))

    async def list(self, path: str = "/workspace", *, depth: Optional[int] = None, glob: Optional[str] = None,
             hidden: Optional[bool] = None, limit: Optional[int] = None) -> FileList:
        p = check_path(path)
        params = build_list_params(p, depth, glob, hidden, limit)
        return parse_list(await self._sbx._http.request("GET", self._url("/files/list"), params=params))

    async def glob(self, pattern: str, root: str = "/workspace") -> FileList:
        return await self.list(root, glob=pattern)

    async def stat(self, path: str) -> FileEntry:
        p = check_path(path)
        return parse_entry(await self._sbx._http.request("GET", self._url("/files/stat"), params={"path": p}))

    async def exists(self, path: str) -> bool:
        try:
            return (await self.stat(path)).exists
        except NotFoundError:  # a daemon from before exists: false
            return False

    async def mkdir(self, path: str, parents: bool = True, *, user: Optional[str] = None) -> None:
        p = check_path(path)
        await self._sbx._http.request("POST", self._url("/files:mkdir"), params=with_user({}, user),
                                json_body={"path": p, "parents": bool(parents)})

    async def remove(self, path: str, recursive: bool = False) -> bool:
        p = check_path(path)
        out = await self._sbx._http.request(
            "POST", self._url("/files:remove"), json_body={"path": p, "recursive": bool(recursive)}
        )
        return bool(out.get("removed", True)) if isinstance(out, Mapping) else True

    async def rename(self, source: str, target: str, overwrite: bool = False, *, user: Optional[str] = None) -> None:
        s = check_path(source, "source")
        d = check_path(target, "target")
        await self._sbx._http.request("POST", self._url("/files:rename"), params=with_user({}, user),
                                json_body={"from": s, "to": d, "overwrite": bool(overwrite)})


    async def archive(self, path: str, *, gzip: bool = True, exclude: Optional[Sequence[str]] = None,
                user: Optional[str] = None) -> bytes:
        """The directory ``path`` as tar bytes, gzip-compressed by default; ``exclude`` holds
        relative paths (not patterns) left out with everything below them."""
        p = check_path(path)
        params: List[Any] = [("path", p), ("gzip", "true" if gzip else "false")]
        params += [("exclude", str(x)) for x in (exclude or [])]
        params += list(with_user({}, user).items())
        data: bytes = await self._sbx._http.request("GET", self._url("/files/archive"), params=params, raw=True)
        return data

    async def unarchive(self, path: str, data: bytes, *, gzip: Optional[bool] = None,
                  user: Optional[str] = None) -> Dict[str, Any]:
        """Unpacks tar bytes (gzip or not, told by their first bytes) into the directory
        ``path``, merging; answers ``{"path", "entries", "bytes"}``. The sandbox refuses
        absolute names, "..", links that lead out and device files."""
        p, payload = _calls.unarchive_request(path, data, gzip)
        out: Dict[str, Any] = await self._sbx._http.request("PUT", self._url("/files/archive"), params=with_user({"path": p}, user),
                                                         content=payload)
        return out

    async def upload(self, local_path: str, remote_path: str, *, user: Optional[str] = None) -> None:
        """Copies a local file (its permissions kept) or directory (as one tar) in, owned by
        ``user`` ("sandbox", the default, or "root")."""
        if os.path.isdir(local_path):
            await self.unarchive(remote_path, pack_directory(local_path), user=user)
            return
        with open(local_path, "rb") as f:
            await self.write(remote_path, f.read(), mode=os.stat(local_path).st_mode & 0o777, user=user)

    async def download(self, remote_path: str, local_path: str, *, user: Optional[str] = None) -> None:
        """Copies a file or a directory out. A file lands under a temporary name beside
        ``local_path`` and is renamed into place once whole; a directory is unpacked into
        ``local_path`` (see unpack_directory's refusals)."""
        st = await self.stat(remote_path)
        if not st.exists:
            raise NotFoundError(f"{remote_path} does not exist", code="not_found", status=404)
        if st.is_dir:
            unpack_directory(await self.archive(remote_path, gzip=True, user=user), local_path)
            return
        _calls.save_local_file(local_path, await self.read(remote_path, user=user))


class AsyncNetwork(Dict[str, Any]):
    """The awaitable twin of :class:`withruntime.sandbox.Network`."""

    def __init__(self, sandbox: AsyncSandbox, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self._sandbox = sandbox

    async def set(
        self,
        *,
        internet: Optional[bool] = None,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
    ) -> "AsyncNetwork":
        body = build_network_body(internet, allow, deny)
        await self._sandbox.set_network(body)
        return self._sandbox.network

    async def get(self) -> "AsyncNetwork":
        """The sandbox's network settings as the daemon holds them now."""
        data = await self._sandbox._http.request("GET", sandbox_path(self._sandbox.id, "/network"))
        self._sandbox._data["network"] = data
        return self._sandbox.network

    async def off(self) -> "AsyncNetwork":
        """No outbound connections at all."""
        await self._sandbox.set_network({"internet": False})
        return self._sandbox.network

    async def on(self) -> "AsyncNetwork":
        """Any public host, on ports 80 and 443, and nothing narrower."""
        await self._sandbox.set_network({"internet": True})
        return self._sandbox.network


class AsyncSecrets:
    """The awaitable twin of :class:`withruntime.sandbox.Secrets`."""

    def __init__(
        self,
        *,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        http_timeout: Optional[float] = None,
        _transport: Any = None,
    ) -> None:
        self._http = _connect(api_key, base_url, http_timeout, _transport)

    async def set(
        self,
        name: str,
        value: Optional[str] = None,
        hosts: Optional[Sequence[str]] = None,
        *,
        header: Optional[str] = None,
        format: Optional[str] = None,
        rules: Optional[Sequence[Mapping[str, Any]]] = None,
        idempotency_key: Optional[str] = None,
    ) -> Dict[str, Any]:
        """Store or replace a secret; returns ``{name, hosts, placeholder, header, format, rules}``.

        ``value`` is visible ASCII and spaces, at most 8 KiB. ``hosts`` are names or
        ``*.domain``. ``header`` (with ``format``, ``{value}`` where the secret goes) makes the
        proxy set that header on every request to the hosts. ``rules`` (1 to 16, such as
        ``[{"methods": ["GET"], "paths": ["/repos/acme/*"]}]``) limit the value to the requests
        a rule allows; others are refused and logged. A replace keeps the placeholder and sets
        everything else anew: rules or a header left out are cleared."""
        body = build_secret_body(value, hosts, header, format, rules)
        return dict(await self._http.request("PUT", secret_path(name), json_body=body,
                                             headers=idempotency_headers(idempotency_key)))

    async def rotate(self, name: str, value: str, *, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """A new value for a secret, with its placeholder, hosts, header and rules kept."""
        body = {"value": check_secret_value(value)}
        return dict(await self._http.request("POST", secret_path(name) + ":rotate", json_body=body,
                                             headers=idempotency_headers(idempotency_key)))

    async def get(self, name: str) -> Dict[str, Any]:
        return dict(await self._http.request("GET", secret_path(name)))

    async def list(self, *, limit: Optional[int] = None, after: Optional[str] = None) -> List[Dict[str, Any]]:
        """Names, hosts, headers and placeholders; never values. With ``limit`` (1 to 100) or
        ``after`` (a name), one page by name; without, every secret."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100):
            raise InvalidRequestError("limit must be an integer from 1 to 100")
        out: List[Dict[str, Any]] = []
        start = check_secret_name(after) if after is not None else None
        while True:
            params = {k: v for k, v in (("limit", limit), ("after", start)) if v is not None}
            data = await self._http.request("GET", "/v1/egress-secrets", params=params or None)
            out += [s for s in (data or {}).get("secrets", []) if isinstance(s, dict)]
            if limit is not None or after is not None or not (data or {}).get("next"):
                return out
            start = data["next"]

    async def delete(self, name: str, *, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Delete a secret: its placeholder stops working for new requests."""
        return dict(await self._http.request("DELETE", secret_path(name),
                                             headers=idempotency_headers(idempotency_key)) or {})

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncSecrets":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSnapshots:
    """The awaitable twin of :class:`withruntime.sandbox.Snapshots`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def get(self, snapshot_id: str) -> Dict[str, Any]:
        return dict(await self._http.request("GET", snapshot_path(snapshot_id)))

    async def list(self, *, sandbox_id: Optional[str] = None, name: Optional[str] = None,
                   limit: Optional[int] = None) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        cursor: Optional[str] = None
        while True:
            params = {k: v for k, v in (("sandboxId", sandbox_id), ("name", name), ("limit", limit),
                                        ("cursor", cursor)) if v is not None}
            page = await self._http.request("GET", "/v1/snapshots", params=params or None)
            out += list(page.get("data") or [])
            cursor = page.get("nextCursor")
            if not cursor or limit is not None:
                return out

    async def update(self, snapshot_id: str, **fields: Any) -> Dict[str, Any]:
        return dict(await self._http.request("POST", snapshot_path(snapshot_id, ":update"),
                                             json_body=snapshot_update_body(fields)))

    async def extend(self, snapshot_id: str, retention_days: int) -> Dict[str, Any]:
        return dict(await self._http.request("POST", snapshot_path(snapshot_id, ":extend"),
                                             json_body={"retentionDays": retention_days}))

    async def delete(self, snapshot_id: str) -> None:
        await self._http.request("POST", snapshot_path(snapshot_id, ":delete"), json_body={})
