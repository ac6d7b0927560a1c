"""The body of every call of the sandbox, its files, network, secrets and snapshots, written
once as generators of steps (_drive.py) that the blocking client (sandbox.py) and the asyncio
client (async_sandbox.py) drive with their own I/O. The annotations are the blocking client's;
the asyncio client's methods show their own (_drive.ASYNC_NAMES). Private."""

from __future__ import annotations

import os
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import _calls
from ._drive import Call, Emit, Next, Op, Open, Shut, relay
from ._process import ProcessOps
from ._models import (
    CREATE_HTTP_TIMEOUT_SECONDS,
    CommandResult,
    FileEntry,
    FileList,
    WriteResult,
    build_create_body,
    build_list_params,
    build_network_body,
    build_sandbox_list_params,
    build_secret_body,
    check_limit,
    check_path,
    check_sandbox_id,
    check_secret_name,
    check_secret_value,
    encode_content,
    fork_body,
    pack_directory,
    parse_egress_log,
    parse_entry,
    parse_exec_result,
    parse_list,
    parse_write,
    sandbox_path,
    secret_path,
    snapshot_body,
    snapshot_path,
    snapshot_update_body,
    unpack_directory,
    wake_body,
    with_user,
)
from ._observability import Moment, moment
from ._process import idempotency_headers
from .errors import APIError, CommandError, InvalidRequestError, NotFoundError, NotPausedError

# The ranges a sandbox's metrics are read over (the daemon's, and the published client's).
METRICS_RANGES = ("15m", "1h", "6h", "24h", "7d", "30d")

OutputCallback = Callable[[str], Any]
FileData = Union[str, bytes, bytearray, memoryview, IO[bytes]]
_UPLOAD_CHUNK = 1024 * 1024


class SandboxOps:
    """A sandbox on a Runtime daemon.

    Make one with :meth:`create` or attach to one with :meth:`connect`. As a context manager
    it deletes the sandbox when the block ends, unless it was created with ``keep=True``.
    Safe to use from several threads at once.
    """

    # -- lifecycle -----------------------------------------------------------------------

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
    ) -> "Sandbox":
        """Create and start a sandbox; returns once it is running.

        Fields (all optional, the API's defaults apply): ``timeout_seconds``, ``on_lease_end``
        (``"stop"``, ``"pause"`` or ``"delete"``), ``idle_pause_seconds``, ``auto_wake``,
        ``pausable``, ``vcpu``, ``memory_mib``, ``disk_mib``, ``network``
        (``{"internet": bool, "allow": [...], "deny": [...]}``), ``env``, ``image``,
        ``driver``, ``name``, ``labels``, ``max_cost_micros``, ``max_total_cost_micros``,
        ``secrets`` (the names of the egress secrets it may use, fixed for its life; ``[]`` is
        none, left out every secret), ``user`` (``"sandbox"``, the default, or ``"root"``: who
        its commands run as when they name none). The published client's ``persistent``,
        ``funding``, ``region``, ``cpu``, ``cpu_floor_millis``, ``spread_from`` and
        ``tailscale`` are taken and sent; the daemon refuses them by name (501), except
        ``persistent=False``. ``volumes`` attaches volumes (docs/volumes.md):
        ``[{"volume_id", "path", "read_only"}]``.

        ``idempotency_key``: a retry with the same key within a day answers the sandbox the
        first call made (``replayed`` is then true), and never makes or bills a second.

        ``keep=True`` leaves the sandbox running after a ``with`` block. ``api_key`` and
        ``base_url`` override ``RUNTIME_API_KEY`` and ``RUNTIME_BASE_URL``.
        """
        body = build_create_body(fields)
        http = cls._connect(api_key, base_url, http_timeout, _transport)
        try:
            data = (yield Call(http.request, "POST", "/v1/sandboxes", json_body=body, timeout=CREATE_HTTP_TIMEOUT_SECONDS,
                                headers=idempotency_headers(idempotency_key)))
            return cls(http, data, keep=keep)
        except BaseException:
            yield Call(http.close)
            raise

    def connect(
        cls,
        sandbox_id: str,
        *,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        http_timeout: Optional[float] = None,
        _transport: Any = None,
    ) -> "Sandbox":
        """Attach to an existing sandbox. A ``with`` block on it does not delete it."""
        check_sandbox_id(sandbox_id)
        http = cls._connect(api_key, base_url, http_timeout, _transport)
        try:
            data = (yield Call(http.request, "GET", sandbox_path(sandbox_id)))
            return cls(http, data, keep=True)
        except BaseException:
            yield Call(http.close)
            raise

    def get_or_create(cls, name: str, **fields: Any) -> "Sandbox":
        """The caller's sandbox named ``name``, running as it is, or one created with
        ``fields`` when none has the name (``sbx.data["reused"]`` says which). Calls with one
        name make one sandbox. A paused one is woken, a stopped one booted again from its disk.
        The other fields apply only when it is created; ``keep`` defaults to True here."""
        fields.setdefault("keep", True)
        return (yield from SandboxOps.create(cls, name=name, get_or_create=True, **fields))

    def list(
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
    ) -> List["Sandbox"]:
        """The caller's sandboxes, oldest first, every page of them. ``state`` (e.g.
        ``["running"]``), ``labels`` (all must match), ``name`` filter; ``include_stopped=False``
        leaves out stopped and failed ones; ``limit`` (1 to 100) is the page size. They share
        one connection pool."""
        params = build_sandbox_list_params(state, labels, name, include_stopped, limit)
        http = cls._connect(api_key, base_url, None, _transport)
        out: List[Any] = []
        try:
            cursor: Optional[str] = None
            while True:
                page = (yield Call(http.request, "GET", "/v1/sandboxes", params=_calls.page_params(params, cursor)))
                items, cursor = _calls.list_page(page)
                out += [cls(http, d, keep=True, owns_http=False) for d in items]
                if not cursor:
                    break
        except BaseException:
            yield Call(http.close)
            raise
        if not out:
            yield Call(http.close)
        return out

    def stop_all(cls, *, labels: Mapping[str, str], **client: Any) -> Dict[str, Any]:
        """Stops every running sandbox whose labels all match: ``{"stopped": [ids],
        "failed": [{"id", "error"}]}``. Needs at least one label."""
        return (yield from SandboxOps._each_labelled(cls, "stop", labels, False, client))

    def delete_all(cls, *, labels: Mapping[str, str], **client: Any) -> Dict[str, Any]:
        """Deletes every sandbox whose labels all match, stopped ones included:
        ``{"deleted": [ids], "failed": [{"id", "error"}]}``. Needs at least one label."""
        return (yield from SandboxOps._each_labelled(cls, "delete", labels, True, client))

    def _each_labelled(cls, verb: str, labels: Mapping[str, str], include_stopped: bool,
                       client: Dict[str, Any]) -> Dict[str, Any]:
        if not labels:
            raise InvalidRequestError(f"{verb}_all needs at least one label to match")
        # Every match first, then each: acting while paging would move the pages.
        matches = yield from SandboxOps.list(cls, labels=labels, include_stopped=include_stopped, limit=100, **client)
        done: List[str] = []
        failed: List[Dict[str, Any]] = []
        for sbx in matches:
            try:
                yield from getattr(SandboxOps, verb)(sbx)
                done.append(sbx.id)
            except APIError as e:
                failed.append({"id": sbx.id, "error": e})
        if matches:
            yield Call(matches[0]._http.close)
        return {"stopped" if verb == "stop" else "deleted": done, "failed": failed}

    def refresh(self) -> "Sandbox":
        """Reload the sandbox's state from the daemon."""
        self._set_data((yield Call(self._http.request, "GET", sandbox_path(self.id))))
        return self

    def stop(self) -> "Sandbox":
        """Kill every process and keep the files. Stopping a stopped sandbox does nothing."""
        self._set_data((yield Call(self._http.request, "POST", sandbox_path(self.id, ":stop"))))
        return self

    def pause(self, idempotency_key: Optional[str] = None) -> "Sandbox":
        """Freeze every process where it stands, memory kept; a paused sandbox costs only its
        disk. Pausing a paused sandbox does nothing."""
        self._set_data((yield Call(self._http.request, "POST", sandbox_path(self.id, ":pause"), json_body={},
                                          headers=idempotency_headers(idempotency_key))))
        return self

    def wake(self, timeout_seconds: Optional[int] = None, idempotency_key: Optional[str] = None) -> "Sandbox":
        """Carry on a paused sandbox with the same processes, or boot a stopped one from its
        files. ``timeout_seconds`` is a new lease (else what the pause left, else its timeout).
        Waking one that is already running is done, not an error, unless a lease was asked for
        (then :class:`NotPausedError`)."""
        body = wake_body(timeout_seconds)
        try:
            data = (yield Call(self._http.request, "POST", sandbox_path(self.id, ":wake"), json_body=body,
                                      headers=idempotency_headers(idempotency_key),
                                      timeout=CREATE_HTTP_TIMEOUT_SECONDS))
        except NotPausedError:
            if timeout_seconds is not None:
                raise
            data = (yield Call(self._http.request, "GET", sandbox_path(self.id)))
            if data.get("state") not in ("running", "starting"):
                raise
        self._set_data(data)
        return self

    def restart(self, idempotency_key: Optional[str] = None) -> "Sandbox":
        """Boot it again from its files (a running or paused one is stopped first): files
        kept, processes and memory not."""
        self._set_data((yield Call(self._http.request, "POST", sandbox_path(self.id, ":restart"), json_body={},
                                          headers=idempotency_headers(idempotency_key),
                                          timeout=CREATE_HTTP_TIMEOUT_SECONDS)))
        return self

    def snapshot(self, *, name: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                 retention_days: Optional[int] = None, mode: Optional[str] = None,
                 idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Keep its disk (files and /workspace) as a snapshot; returns the snapshot's dict
        (``id``, ``state`` "ready", ``mode``, ``sizeBytes``, ``expiresAt``...). A running
        sandbox is frozen only while its disk is copied. ``retention_days`` (1 to 365, 7 by
        default) is how long the daemon keeps it. ``mode="memory"`` keeps the
        running machine too on the microVM and gVisor, and is refused (501) on namespace."""
        body = snapshot_body(name, labels, retention_days, mode)
        return dict((yield Call(self._http.request, "POST", sandbox_path(self.id, ":snapshot"), json_body=body,
                                       headers=idempotency_headers(idempotency_key),
                                       timeout=CREATE_HTTP_TIMEOUT_SECONDS)))

    def fork(self, count: Optional[int] = None, *, name: Optional[str] = None,
             labels: Optional[Mapping[str, str]] = None, keep_snapshot: Optional[bool] = None,
             secrets: Optional[Sequence[str]] = None, mode: Optional[str] = None,
             idempotency_key: Optional[str] = None) -> Any:
        """Copies of this sandbox's files as they are now, each running: one Sandbox without
        ``count``, a list with it (1 to 16, made all or none). ``keep_snapshot`` keeps the
        snapshot they were made from. ``mode="memory"`` copies its memory and running
        processes too, where its driver can (the microVM and gVisor; 501 on namespace)."""
        body = fork_body(count, name, labels, keep_snapshot, secrets, mode)
        data = (yield Call(self._http.request, "POST", sandbox_path(self.id, ":fork"), json_body=body,
                                  headers=idempotency_headers(idempotency_key),
                                  timeout=CREATE_HTTP_TIMEOUT_SECONDS * (count or 1)))
        made = [type(self)(self._http, info, keep=True, owns_http=False) for info in data["sandboxes"]]
        return made if count is not None else made[0]

    def update(self, **settings: Any) -> "Sandbox":
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
        self._set_data((yield Call(self._http.request, "POST", sandbox_path(self.id, ":update"), json_body=body)))
        return self

    def extend(self, seconds: int) -> "Sandbox":
        """Renew the lease: it now ends ``seconds`` after the later of now and its old end."""
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            raise InvalidRequestError(f"seconds must be an integer, not {type(seconds).__name__}")
        self._set_data(
            (yield Call(self._http.request, "POST", sandbox_path(self.id, ":extend"), json_body={"seconds": seconds}))
        )
        return self

    def set_network(self, network: Mapping[str, Any]) -> "Sandbox":
        """Replace the egress policy; it applies to new connections."""
        self._set_data((yield Call(self._http.request, "PUT", sandbox_path(self.id, "/network"), json_body=dict(network))))
        return self

    def egress_log(self, limit: int = 100) -> List[Dict[str, Any]]:
        """The egress audit log, newest first: ``at``, ``host``, ``port``, ``kind``, ``allowed``,
        ``reason``, ``address``, ``bytesOut``, ``bytesIn``, ``intercepted``, ``secretsUsed``."""
        return parse_egress_log(
            (yield Call(self._http.request, "GET", sandbox_path(self.id, "/egress"), params={"limit": check_limit(limit)}))
        )

    def metrics(self, range: Optional[str] = None) -> Dict[str, Any]:
        """Its CPU, memory, disk and network use over ``range`` (15m, 1h (the default), 6h, 24h,
        7d or 30d): ``points`` (``at``, ``cpuPercent`` of its vCPUs, ``cpuCores``,
        ``memoryBytes``, ``diskBytes``, ``networkInBytes``, ``networkOutBytes``) in steps of
        ``stepSeconds``, and ``latest``, its newest reading."""
        if range is not None and range not in METRICS_RANGES:
            raise InvalidRequestError(f"range must be one of {', '.join(METRICS_RANGES)}")
        params = {} if range is None else {"range": range}
        data = yield Call(self._http.request, "GET", sandbox_path(self.id, "/metrics"), params=params)
        if not isinstance(data, dict) or not isinstance(data.get("points"), list):
            raise APIError("the daemon's answer is not a sandbox's metrics")
        return data

    def delete(self, idempotency_key: Optional[str] = None) -> None:
        """Stop the sandbox and remove its files and everything it had on the host."""
        (yield Call(self._http.request, "DELETE", sandbox_path(self.id), headers=idempotency_headers(idempotency_key)))
        self._data["state"] = "deleted"

    def close(self) -> None:
        """Release the HTTP connections (the sandbox itself is left as it is)."""
        if self._owns_http:
            yield Call(self._http.close)

    def _exit(self, exc_type: Any) -> Op[None]:
        try:
            if not self._keep:
                try:
                    yield from SandboxOps.delete(self)
                except NotFoundError:
                    pass
                except APIError:
                    # Do not hide the error that ended the block behind a cleanup failure.
                    if exc_type is None:
                        raise
        finally:
            yield from SandboxOps.close(self)

    # -- commands ------------------------------------------------------------------------

    def exec(
        self,
        command: Union[str, Sequence[str]],
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout_seconds: Optional[float] = 60,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        max_output_bytes: Optional[int] = None,
        timeout_ms: Optional[int] = None,
        check: bool = False,
        idempotency_key: Optional[str] = None,
        user: Optional[str] = None,
    ) -> CommandResult:
        """Run a command and wait for it.

        A string runs under ``bash -c``; a list runs as argv with no shell. With ``on_stdout``
        or ``on_stderr`` the output is streamed to them as it happens. A timeout is a result
        (``timed_out=True``, exit code 137), not an exception. ``max_output_bytes`` bounds
        the output kept per stream (its end is kept). The published client's names work too:
        ``timeout_ms`` (wins over ``timeout_seconds``), ``check=True`` (raise
        :class:`CommandError` on a non-zero exit or a timeout), ``idempotency_key`` (the same
        key within ten minutes gives back the first run instead of running it again) and
        ``user`` (``"root"``).
        """
        call = _calls.ExecCall(self.id, command, cwd=cwd, env=env, stdin=stdin, timeout_seconds=timeout_seconds,
                               stream=on_stdout is not None or on_stderr is not None,
                               max_output_bytes=max_output_bytes, timeout_ms=timeout_ms, user=user,
                               idempotency_key=idempotency_key)
        if not call.stream:
            result = parse_exec_result(
                (yield Call(self._http.request, "POST", call.path, json_body=call.body, timeout=call.wait, headers=call.headers))
            )
        else:
            def on_event(ev: Dict[str, Any]) -> Optional[Call]:
                kind, data = call.folded.feed_event(ev)
                callback = on_stdout if kind == "stdout" else on_stderr if kind == "stderr" else None
                return Call(callback, data) if callback is not None else None

            yield from relay(SandboxOps._exec_events(self, call), on_event)
            result = call.folded.finish()
        if check and not result.ok:
            raise CommandError(result)
        return result

    def _exec_events(self, call: _calls.ExecCall) -> Op[None]:
        events = _calls.ExecEvents(call.body)
        stream = yield Open(self._http.stream_events("POST", call.path, json_body=events.body, timeout=call.wait,
                                                     headers=call.headers))
        while not events.done:
            event = yield Next(stream)
            if event is None:
                break
            ev = events.feed(event)
            if ev is not None:
                yield Emit(ev)
        yield Shut(stream)
        if events.resume:
            process_id, cursor = events.resume
            yield from ProcessOps.output(self._process_class(self._http, self.id, {"id": process_id}), cursor)

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
    ) -> Iterator[Dict[str, Any]]:
        """The command's events as they happen: ``start`` (with ``processId``), ``stdout``,
        ``stderr``, ``truncated`` when output was lost, ``exit``. When the daemon ends a long
        stream (``continue``) it is followed on from the cursor. Events carry snake_case
        aliases beside their camelCase fields. The timeout defaults to a day."""
        call = _calls.stream_exec_call(self.id, command, cwd=cwd, env=env, stdin=stdin, timeout_ms=timeout_ms,
                                       timeout_seconds=timeout_seconds, user=user, idempotency_key=idempotency_key)
        yield from SandboxOps._exec_events(self, call)

    def spawn(
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
    ) -> Process:
        """Starts a background process and returns at once. ``stdin="pipe"`` keeps its input
        open for :meth:`Process.write`; other text or bytes are its whole input. Without
        ``timeout_ms`` it may run for a day."""
        body = _calls.spawn_request(command, cwd=cwd, env=env, stdin=stdin, timeout_ms=timeout_ms, user=user,
                                    output_encoding=output_encoding, pty=pty)
        info = (yield Call(self._http.request, "POST", sandbox_path(self.id, "/processes"), json_body=body,
                                  headers=idempotency_headers(idempotency_key)))
        return self._process_class(self._http, self.id, info)

    def processes(self) -> List[Dict[str, Any]]:
        """The sandbox's processes, running and recently ended, oldest first."""
        return list((yield Call(self._http.request, "GET", sandbox_path(self.id, "/processes")))["data"])

    def process(self, process_id: str) -> Process:  # noqa: F821  (a name of the client that drives it)
        info = yield Call(self._http.request, "GET", sandbox_path(self.id, f"/processes/{process_id}"))
        return self._process_class(self._http, self.id, info)

class PreviewsOps:
    """``sbx.previews``: ports of the sandbox shared at a host name of their own
    (``http://PORT-SANDBOX.DOMAIN``, served by the daemon's preview listener). Each answer is
    the preview as a dict: ``url``, ``token`` (None for a public one), ``urlWithToken`` (what
    a browser opens), ``tokenExpiresAt``, ``expiresAt``, ``visibility``, ``port``."""

    def _base(self) -> str:
        return sandbox_path(self._sbx.id, "/previews")

    def create(self, port: int, *, visibility: Optional[str] = None, ttl_seconds: Optional[int] = None,
               expires_at: Optional[str] = None, embed_origins: Optional[Sequence[str]] = None,
               idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Shares ``port`` (1 to 65535), or changes the visibility and end of the preview
        already there. ``visibility`` is "private" (the default: a token is needed) or
        "public". ``ttl_seconds`` and ``expires_at`` (an ISO time in UTC) end the preview; with
        both, the earlier. ``embed_origins`` names the only sites that may show the preview in a
        frame (``["https://app.example.com", "https://*.example.com"]``, up to 16); ``[]`` is
        any site, the default; left out, a shared port keeps its list."""
        body: Dict[str, Any] = {"port": int(port)}
        if visibility is not None:
            body["visibility"] = visibility
        if ttl_seconds is not None:
            body["ttlSeconds"] = int(ttl_seconds)
        if expires_at is not None:
            body["expiresAt"] = expires_at
        if embed_origins is not None:
            body["embedOrigins"] = list(embed_origins)
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", PreviewsOps._base(self), json_body=body,
                                         headers=idempotency_headers(idempotency_key))
        return out

    def list(self) -> List[Dict[str, Any]]:
        """Every shared port, each private one with a fresh token."""
        return list((yield Call(self._sbx._http.request, "GET", PreviewsOps._base(self)))["data"])

    def get(self, port: int, *, ttl_seconds: Optional[int] = None,
            expires_at: Optional[str] = None) -> Dict[str, Any]:
        """The preview of ``port``, its token ending no later than ``ttl_seconds`` from now or
        ``expires_at`` when given."""
        params: Dict[str, Any] = {}
        if ttl_seconds is not None:
            params["ttlSeconds"] = int(ttl_seconds)
        if expires_at is not None:
            params["expiresAt"] = expires_at
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "GET", f"{PreviewsOps._base(self)}/{int(port)}",
                                         params=params or None)
        return out

    def rotate(self, port: int) -> Dict[str, Any]:
        """Refuses every token made for ``port`` so far, closes its connections and returns the
        preview with a new token."""
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", f"{PreviewsOps._base(self)}/{int(port)}:rotate",
                                         json_body={})
        return out

    def delete(self, port: int) -> Dict[str, Any]:
        """Stops sharing ``port``; its open connections are closed before this returns."""
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "DELETE", f"{PreviewsOps._base(self)}/{int(port)}")
        return out


class FilesOps:
    """File operations inside one sandbox. Relative paths are relative to ``/workspace``."""

    def _url(self, suffix: str) -> str:
        return sandbox_path(self._sbx.id, suffix)

    def read(self, path: str, *, user: Optional[str] = None) -> bytes:
        """The file's bytes, read with the rights of ``user`` ("sandbox", the default, or "root")."""
        p = check_path(path)
        data: bytes = (yield Call(self._sbx._http.request, "GET", self._url("/files/content"), params=with_user({"path": p}, user),
                                              raw=True))
        return data

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The file decoded as text."""
        return (yield from FilesOps.read(self, path)).decode(encoding, errors)

    def write(self, path: str, data: FileData, *, mode: Optional[int] = None,
              user: Optional[str] = None) -> WriteResult:
        """Write a whole file atomically, making parent directories. ``data`` is str (written as
        UTF-8), bytes, or a binary file object. ``mode`` is the permission bits (e.g. 0o755).
        The file and the directories made for it belong to ``user``: "sandbox" (the default)
        or "root", whose rights the write has."""
        p = check_path(path)
        params: Dict[str, Union[str, int]] = with_user({"path": p}, user)
        if mode is not None:
            params["mode"] = format(int(mode), "o")
        if self._reads_files and hasattr(data, "read") and not isinstance(data, (str, bytes, bytearray, memoryview)):
            f: Any = data

            def chunks() -> Any:
                while True:
                    chunk = f.read(_UPLOAD_CHUNK)
                    if not chunk:
                        return
                    yield chunk

            out = (yield Call(self._sbx._http.request, "PUT", self._url("/files/content"), params=params, content=chunks()))
            return parse_write(out, p, -1)
        content = encode_content(data)
        out = (yield Call(self._sbx._http.request, "PUT", self._url("/files/content"), params=params, content=content))
        return parse_write(out, p, len(content))

    def list(self, path: str = "/workspace", *, depth: Optional[int] = None, glob: Optional[str] = None,
             hidden: Optional[bool] = None, limit: Optional[int] = None) -> FileList:
        """Entries under ``path`` as dicts (see FileEntry), down to ``depth`` levels (1 to 10;
        1 when left out). ``glob`` keeps those whose path relative to ``path`` matches
        (``*.py``, ``src/*``, ``**/*.py``; it walks as deep as the pattern reaches, at most 32
        levels); ``hidden=False`` leaves out names starting with '.'; ``limit`` (1 to 10000)
        caps the count. ``.truncated`` says whether more were left out."""
        p = check_path(path)
        params = build_list_params(p, depth, glob, hidden, limit)
        return parse_list((yield Call(self._sbx._http.request, "GET", self._url("/files/list"), params=params)))

    def glob(self, pattern: str, root: str = "/workspace") -> FileList:
        """Entries under ``root`` whose relative path matches ``pattern`` (``**/*.py``)."""
        return (yield from FilesOps.list(self, root, glob=pattern))

    def stat(self, path: str) -> FileEntry:
        """One entry, with ``exists``: a path with nothing there answers
        ``{"path": ..., "exists": False}`` rather than raising."""
        p = check_path(path)
        return parse_entry((yield Call(self._sbx._http.request, "GET", self._url("/files/stat"), params={"path": p})))

    def exists(self, path: str) -> bool:
        try:
            return (yield from FilesOps.stat(self, path)).exists
        except NotFoundError:  # a daemon from before exists: false
            return False

    def mkdir(self, path: str, parents: bool = True, *, user: Optional[str] = None) -> None:
        """Makes a directory; with ``parents`` (the default) its missing parents too, and an
        existing directory is fine."""
        p = check_path(path)
        (yield Call(self._sbx._http.request, "POST", self._url("/files:mkdir"), params=with_user({}, user),
                                json_body={"path": p, "parents": bool(parents)}))

    def remove(self, path: str, recursive: bool = False) -> bool:
        """Removes a file, an empty directory, or with ``recursive=True`` a whole tree (links
        are removed, never followed). True when something was removed, False when nothing
        was there."""
        p = check_path(path)
        out = (yield Call(self._sbx._http.request, 
            "POST", self._url("/files:remove"), json_body={"path": p, "recursive": bool(recursive)}
        ))
        return bool(out.get("removed", True)) if isinstance(out, Mapping) else True

    def rename(self, source: str, target: str, overwrite: bool = False, *, user: Optional[str] = None) -> None:
        """Moves ``source`` to ``target``; an existing ``target`` is a ConflictError unless
        ``overwrite=True``."""
        s = check_path(source, "source")
        d = check_path(target, "target")
        (yield Call(self._sbx._http.request, "POST", self._url("/files:rename"), params=with_user({}, user),
                                json_body={"from": s, "to": d, "overwrite": bool(overwrite)}))


    def download_url(self, path: str, *, expires_in_seconds: Optional[int] = None,
                     filename: Optional[str] = None, wake: Optional[bool] = None,
                     archive: Optional[bool] = None, one_time: Optional[bool] = None) -> Dict[str, Any]:
        """A signed link anyone can open without a key to download ``path`` (with
        ``archive=True`` a directory, as .tar.gz). It lives ``expires_in_seconds`` (1 s to 7
        days; an hour when left out); ``one_time=True`` makes its first use its only one;
        ``filename`` is the name a browser saves it as; ``wake=False`` refuses to wake a paused
        sandbox. Answers ``{"url", "id", "expiresAt", ...}``: ``url`` is the link."""
        body = {"path": check_path(path), "method": "GET", "expiresInSeconds": expires_in_seconds,
                "filename": filename, "wake": wake, "archive": archive, "oneTime": one_time}
        out: Dict[str, Any] = (yield Call(self._sbx._http.request, "POST", self._url("/files:link"),
                                          json_body={k: v for k, v in body.items() if v is not None}))
        return out

    def upload_url(self, path: str, *, expires_in_seconds: Optional[int] = None,
                   max_bytes: Optional[int] = None, wake: Optional[bool] = None,
                   one_time: Optional[bool] = None) -> Dict[str, Any]:
        """A signed link anyone can PUT a raw body to without a key, writing ``path``
        atomically (its parent directories made). ``max_bytes`` bounds the body under the
        daemon's own bound; the rest as :meth:`download_url`."""
        body = {"path": check_path(path), "method": "PUT", "expiresInSeconds": expires_in_seconds,
                "maxBytes": max_bytes, "wake": wake, "oneTime": one_time}
        out: Dict[str, Any] = (yield Call(self._sbx._http.request, "POST", self._url("/files:link"),
                                          json_body={k: v for k, v in body.items() if v is not None}))
        return out

    def revoke_links(self) -> Dict[str, Any]:
        """Ends every download and upload link made for this sandbox so far."""
        out: Dict[str, Any] = (yield Call(self._sbx._http.request, "POST", self._url("/files:revoke-links"),
                                          json_body={}))
        return out

    def archive(self, path: str, *, gzip: bool = True, exclude: Optional[Sequence[str]] = None,
                user: Optional[str] = None) -> bytes:
        """The directory ``path`` as tar bytes, gzip-compressed by default; ``exclude`` holds
        relative paths (not patterns) left out with everything below them."""
        p = check_path(path)
        params: List[Any] = [("path", p), ("gzip", "true" if gzip else "false")]
        params += [("exclude", str(x)) for x in (exclude or [])]
        params += list(with_user({}, user).items())
        data: bytes = (yield Call(self._sbx._http.request, "GET", self._url("/files/archive"), params=params, raw=True))
        return data

    def unarchive(self, path: str, data: bytes, *, gzip: Optional[bool] = None,
                  user: Optional[str] = None) -> Dict[str, Any]:
        """Unpacks tar bytes (gzip or not, told by their first bytes) into the directory
        ``path``, merging; answers ``{"path", "entries", "bytes"}``. The sandbox refuses
        absolute names, "..", links that lead out and device files."""
        p, payload = _calls.unarchive_request(path, data, gzip)
        out: Dict[str, Any] = (yield Call(self._sbx._http.request, "PUT", self._url("/files/archive"), params=with_user({"path": p}, user),
                                                         content=payload))
        return out

    def upload(self, local_path: str, remote_path: str, *, user: Optional[str] = None) -> None:
        """Copies a local file (its permissions kept) or directory (as one tar) in, owned by
        ``user`` ("sandbox", the default, or "root")."""
        if os.path.isdir(local_path):
            yield from FilesOps.unarchive(self, remote_path, pack_directory(local_path), user=user)
            return
        with open(local_path, "rb") as f:
            data = f.read()
        yield from FilesOps.write(self, remote_path, data, mode=os.stat(local_path).st_mode & 0o777, user=user)

    def download(self, remote_path: str, local_path: str, *, user: Optional[str] = None) -> None:
        """Copies a file or a directory out. A file lands under a temporary name beside
        ``local_path`` and is renamed into place once whole; a directory is unpacked into
        ``local_path`` (see unpack_directory's refusals)."""
        st = yield from FilesOps.stat(self, remote_path)
        if not st.exists:
            raise NotFoundError(f"{remote_path} does not exist", code="not_found", status=404)
        if st.is_dir:
            unpack_directory((yield from FilesOps.archive(self, remote_path, gzip=True, user=user)), local_path)
            return
        _calls.save_local_file(local_path, (yield from FilesOps.read(self, remote_path, user=user)))


class NetworkOps:
    """The calls of ``sbx.network`` (the dict of the policy as last answered)."""

    def set(
        self,
        *,
        internet: Optional[bool] = None,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
    ) -> "Network":
        """Replace the policy; the sandbox's next connections follow it (open ones go on).

        ``internet=False``: nothing leaves. ``internet=True``: any public host on ports 80 and
        443, or with ``allow`` only those hosts (``"pypi.org"``, ``"*.example.org"`` for
        sub-domains, ``"host:8443"`` for another port). ``deny`` wins over ``allow``. ``allow``
        alone implies ``internet=True``. Returns the new policy."""
        body = build_network_body(internet, allow, deny)
        yield from SandboxOps.set_network(self._sandbox, body)
        return self._sandbox.network

    def get(self) -> "Network":
        """The sandbox's network settings as the daemon holds them now."""
        data = (yield Call(self._sandbox._http.request, "GET", sandbox_path(self._sandbox.id, "/network")))
        self._sandbox._data["network"] = data
        return self._sandbox.network

    def off(self) -> "Network":
        """No outbound connections at all."""
        yield from SandboxOps.set_network(self._sandbox, {"internet": False})
        return self._sandbox.network

    def on(self) -> "Network":
        """Any public host, on ports 80 and 443, and nothing narrower."""
        yield from SandboxOps.set_network(self._sandbox, {"internet": True})
        return self._sandbox.network


class SecretsOps:
    """The key owner's egress secrets: values the proxy puts in place of a placeholder in
    requests to the secret's hosts. Sandboxes only ever see ``$NAME`` = the placeholder; values
    are never returned."""

    def set(
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
        return dict((yield Call(self._http.request, "PUT", secret_path(name), json_body=body,
                                             headers=idempotency_headers(idempotency_key))))

    def rotate(self, name: str, value: str, *, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """A new value for a secret, with its placeholder, hosts, header and rules kept."""
        body = {"value": check_secret_value(value)}
        return dict((yield Call(self._http.request, "POST", secret_path(name) + ":rotate", json_body=body,
                                             headers=idempotency_headers(idempotency_key))))

    def get(self, name: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "GET", secret_path(name))))

    def list(self, *, limit: Optional[int] = None, after: Optional[str] = None) -> List[Dict[str, Any]]:
        """Names, hosts, headers and placeholders; never values. With ``limit`` (1 to 100) or
        ``after`` (a name), one page by name; without, every secret."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100):
            raise InvalidRequestError("limit must be an integer from 1 to 100")
        out: List[Dict[str, Any]] = []
        start = check_secret_name(after) if after is not None else None
        while True:
            params = {k: v for k, v in (("limit", limit), ("after", start)) if v is not None}
            data = (yield Call(self._http.request, "GET", "/v1/egress-secrets", params=params or None))
            out += [s for s in (data or {}).get("secrets", []) if isinstance(s, dict)]
            if limit is not None or after is not None or not (data or {}).get("next"):
                return out
            start = data["next"]

    def delete(self, name: str, *, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Delete a secret: its placeholder stops working for new requests."""
        return dict((yield Call(self._http.request, "DELETE", secret_path(name),
                                             headers=idempotency_headers(idempotency_key))) or {})

    def close(self) -> None:
        yield Call(self._http.close)


class SnapshotsOps:
    """The key owner's snapshots (``runtime.snapshots``): take one with
    ``sbx.snapshot()``, start from one with ``Sandbox.create(snapshot=ID)``."""

    def get(self, snapshot_id: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "GET", snapshot_path(snapshot_id))))

    def list(self, *, sandbox_id: Optional[str] = None, name: Optional[str] = None,
             limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """Oldest first, following every page (or one page of ``limit``)."""
        out: List[Dict[str, Any]] = []
        cursor: Optional[str] = None
        while True:
            params = {k: v for k, v in (("sandboxId", sandbox_id), ("name", name), ("limit", limit),
                                        ("cursor", cursor)) if v is not None}
            page = (yield Call(self._http.request, "GET", "/v1/snapshots", params=params or None))
            out += list(page.get("data") or [])
            cursor = page.get("nextCursor")
            if not cursor or limit is not None:
                return out

    def update(self, snapshot_id: str, **fields: Any) -> Dict[str, Any]:
        """``name`` (None clears it), ``labels`` (replaces them), ``if_labels`` (only over
        these labels) and ``retention_days`` (counted from its creation)."""
        return dict((yield Call(self._http.request, "POST", snapshot_path(snapshot_id, ":update"),
                                       json_body=snapshot_update_body(fields))))

    def extend(self, snapshot_id: str, retention_days: int) -> Dict[str, Any]:
        """Keep it ``retention_days`` from now."""
        return dict((yield Call(self._http.request, "POST", snapshot_path(snapshot_id, ":extend"),
                                       json_body={"retentionDays": retention_days})))

    def delete(self, snapshot_id: str) -> None:
        (yield Call(self._http.request, "POST", snapshot_path(snapshot_id, ":delete"), json_body={}))


class RuntimeOps:
    """``runtime.me()``, ``runtime.limits()`` and ``runtime.usage_export()``."""

    def me(self) -> Dict[str, Any]:
        """Who this key is: ``owner`` (also ``orgId``/``orgName``: a self-hosted daemon is one
        organization), ``keyId``, ``access`` (``full`` or ``read``) and ``limits``."""
        return dict((yield Call(self._http.request, "GET", "/v1/me")))

    def limits(self) -> Dict[str, Any]:
        """The key's access and its daily spending: ``GET /v1/limits``."""
        return dict((yield Call(self._http.request, "GET", "/v1/limits")))

    def usage_export(self, since: Moment, until: Moment, *, cursor: Optional[str] = None,
                     limit: Optional[int] = None) -> Dict[str, Any]:
        """One page of the owner's settled charges that ended at ``since`` or later and before
        ``until`` (RFC 3339 UTC text such as ``"2026-12-05T00:00:00Z"``, unix seconds, or an
        aware datetime): ``{"csv", "rows", "nextCursor", "hasMore", "finalThrough", ...}``.
        Follow ``nextCursor`` with the same range until it is None and join each page's ``csv``
        (the header is on the first only); ``limit`` is 1 to 1000 (100)."""
        params = {"since": moment(since, "since"), "until": moment(until, "until")}
        params.update({k: v for k, v in (("cursor", cursor), ("limit", limit)) if v is not None})
        return dict((yield Call(self._http.request, "GET", "/v1/usage/export", params=params)))

    def close(self) -> None:
        yield from SecretsOps.close(self.secrets)
