"""The asyncio client: :class:`AsyncSandbox` and its :class:`AsyncFiles`, with the same names
as the blocking client, awaitable. Each call's body is in _core.py, driven here by asyncio
(_drive.py); callbacks may be plain functions or coroutines."""

from __future__ import annotations

import functools
import inspect
from types import TracebackType
from typing import Any, Awaitable, Callable, Dict, Generator, Mapping, Optional, Type, Union  # noqa: F401

from ._config import resolve_api_key, resolve_endpoint
from ._computer import BrowserOps, DesktopOps, RecordingsOps
from ._core import FilesOps, NetworkOps, PreviewsOps, RuntimeOps, SandboxOps, SecretsOps, SnapshotsOps
from ._drive import arun, awaitable, awaitable_iter
from ._http import AsyncHTTP, websocket_headers
from ._images import ImagesOps, RegistriesOps
from ._mcp import McpOps, SandboxMcpOps
from ._models import CLIENT_OPTIONS, SandboxInfo, build_create_body
from ._observability import AuditOps, EventsOps, OtelOps, WebhooksOps
from ._volumes import VolumesOps
from ._process import AsyncProcess, idempotency_headers
from ._sessions import SessionsOps, WatchOps, WatchesOps, check_session_token
from ._terminal import AsyncTerminal, terminal_target
from ._tunnel import AsyncPortForward, check_port
from ._ws import AsyncWebSocket
from .interpreter import AsyncInterpreter

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

    _connect = staticmethod(_connect)
    _process_class = AsyncProcess

    def __init__(self, http: AsyncHTTP, data: Dict[str, Any], *, keep: bool = True, owns_http: bool = True) -> None:
        self._http = http
        self._owns_http = owns_http
        self._keep = keep
        self._set_data(data)
        self.files = AsyncFiles(self)
        self.sessions = AsyncSessions(self)
        self.previews = AsyncPreviews(self)
        self.browser = AsyncBrowser(self)
        self.desktop = AsyncDesktop(self)
        self.mcp = AsyncSandboxMcp(self)

    @classmethod
    def from_session(cls, token: str, sandbox_id: str, base_url: Optional[str] = None, *,
                     http_timeout: Optional[float] = None, transport: Any = None) -> "AsyncSandbox":
        """The awaitable twin of :meth:`withruntime.sandbox.Sandbox.from_session`. Makes no call."""
        http = _connect(check_session_token(token), base_url, http_timeout, transport)
        return cls(http, {"id": sandbox_id})

    @functools.cached_property
    def interpreter(self) -> AsyncInterpreter:
        """The sandbox's code interpreter, made on first use (as the blocking client's)."""
        return AsyncInterpreter(self)

    @classmethod
    @functools.wraps(SandboxOps.create)
    def create(cls, **kwargs: Any) -> _Creating:
        # A wrong field or key is an error at the call, before anything is awaited.
        build_create_body({k: v for k, v in kwargs.items() if k not in CLIENT_OPTIONS and k != "_transport"})
        idempotency_headers(kwargs.get("idempotency_key"))
        return _Creating(lambda: arun(SandboxOps.create(cls, **kwargs)))

    create.__func__.__signature__ = inspect.signature(SandboxOps.create).replace(return_annotation="_Creating")  # type: ignore[attr-defined]

    connect = classmethod(awaitable(SandboxOps.connect))
    get_or_create = classmethod(awaitable(SandboxOps.get_or_create))
    list = classmethod(awaitable(SandboxOps.list))
    stop_all = classmethod(awaitable(SandboxOps.stop_all))
    delete_all = classmethod(awaitable(SandboxOps.delete_all))
    refresh = awaitable(SandboxOps.refresh)
    stop = awaitable(SandboxOps.stop)
    pause = awaitable(SandboxOps.pause)
    wake = awaitable(SandboxOps.wake)
    restart = awaitable(SandboxOps.restart)
    snapshot = awaitable(SandboxOps.snapshot)
    fork = awaitable(SandboxOps.fork)
    update = awaitable(SandboxOps.update)
    extend = awaitable(SandboxOps.extend)
    set_network = awaitable(SandboxOps.set_network)
    egress_log = awaitable(SandboxOps.egress_log)
    metrics = awaitable(SandboxOps.metrics)
    delete = awaitable(SandboxOps.delete)
    close = awaitable(SandboxOps.close)
    exec = awaitable(SandboxOps.exec)
    exec_stream = awaitable_iter(SandboxOps.exec_stream)
    spawn = awaitable(SandboxOps.spawn)
    processes = awaitable(SandboxOps.processes)
    process = awaitable(SandboxOps.process)

    @property
    def network(self) -> "AsyncNetwork":
        """The egress policy as last answered (a dict), with awaitable ``.set(...)``."""
        return AsyncNetwork(self, self._data.get("network") or {})

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await arun(SandboxOps._exit(self, exc_type))

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


class AsyncPreviews:
    """Ports of one sandbox shared at a host name of their own, awaitable."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    _base = PreviewsOps._base
    create = awaitable(PreviewsOps.create)
    list = awaitable(PreviewsOps.list)
    get = awaitable(PreviewsOps.get)
    rotate = awaitable(PreviewsOps.rotate)
    delete = awaitable(PreviewsOps.delete)


class AsyncBrowser:
    """Chromium in the sandbox, awaitable."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    _base = BrowserOps._base
    start = awaitable(BrowserOps.start)
    get = awaitable(BrowserOps.get)
    stop = awaitable(BrowserOps.stop)


class AsyncDesktopRecordings:
    """The desktop's screen to MP4, awaitable."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    _base = RecordingsOps._base
    start = awaitable(RecordingsOps.start)
    stop = awaitable(RecordingsOps.stop)
    get = awaitable(RecordingsOps.get)
    list = awaitable(RecordingsOps.list)
    download = awaitable(RecordingsOps.download)
    delete = awaitable(RecordingsOps.delete)


class AsyncDesktop:
    """The sandbox's X desktop, awaitable."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox
        self.recordings = AsyncDesktopRecordings(sandbox)

    _base = DesktopOps._base
    _act = DesktopOps._act
    start = awaitable(DesktopOps.start)
    stop = awaitable(DesktopOps.stop)
    screenshot = awaitable(DesktopOps.screenshot)
    move = awaitable(DesktopOps.move)
    click = awaitable(DesktopOps.click)
    double_click = awaitable(DesktopOps.double_click)
    right_click = awaitable(DesktopOps.right_click)
    mouse_down = awaitable(DesktopOps.mouse_down)
    mouse_up = awaitable(DesktopOps.mouse_up)
    drag = awaitable(DesktopOps.drag)
    scroll = awaitable(DesktopOps.scroll)
    type = awaitable(DesktopOps.type)
    press = awaitable(DesktopOps.press)
    cursor = awaitable(DesktopOps.cursor)
    windows = awaitable(DesktopOps.windows)
    focus = awaitable(DesktopOps.focus)
    open = awaitable(DesktopOps.open)
    launch = awaitable(DesktopOps.launch)


class AsyncSandboxMcp:
    """The awaitable twin of :class:`withruntime.sandbox.SandboxMcp`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    start = awaitable(SandboxMcpOps.start)
    get = awaitable(SandboxMcpOps.get)
    ready = awaitable(SandboxMcpOps.ready)
    stop = awaitable(SandboxMcpOps.stop)

    @staticmethod
    async def _sleep(seconds: float) -> None:
        import asyncio

        await asyncio.sleep(seconds)


class AsyncFiles:
    """File operations inside one sandbox, awaitable."""

    _reads_files = False  # str or bytes only: a file object is refused, as before

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    _url = FilesOps._url
    read = awaitable(FilesOps.read)
    read_text = awaitable(FilesOps.read_text)
    write = awaitable(FilesOps.write)
    list = awaitable(FilesOps.list)
    glob = awaitable(FilesOps.glob)
    stat = awaitable(FilesOps.stat)
    exists = awaitable(FilesOps.exists)
    mkdir = awaitable(FilesOps.mkdir)
    remove = awaitable(FilesOps.remove)
    rename = awaitable(FilesOps.rename)
    archive = awaitable(FilesOps.archive)
    unarchive = awaitable(FilesOps.unarchive)
    upload = awaitable(FilesOps.upload)
    download = awaitable(FilesOps.download)
    download_url = awaitable(FilesOps.download_url)
    upload_url = awaitable(FilesOps.upload_url)
    revoke_links = awaitable(FilesOps.revoke_links)

    @property
    def watches(self) -> "AsyncWatches":
        """The watches running in the sandbox."""
        return AsyncWatches(self._sbx)

    async def watch(self, path: str, **options: Any) -> "AsyncWatch":
        """The awaitable twin of :meth:`withruntime.sandbox.Files.watch`."""
        return await self.watches.start(path, **options)


class AsyncWatch(WatchOps):
    """The awaitable twin of :class:`withruntime.sandbox.Watch`."""

    def __init__(self, sandbox: AsyncSandbox, info: Dict[str, Any]) -> None:
        self._init(sandbox, info)

    _url = WatchOps._url
    get_new_events = awaitable(WatchOps.get_new_events)
    stop = awaitable(WatchOps.stop)

    async def events(self) -> Any:
        """Each change as it comes, until the watch ends (``exit_reason`` says why)."""
        while self.exit_reason is None:
            for event in await self.get_new_events(wait_ms=8000):
                yield event


class AsyncWatches:
    """The awaitable twin of :class:`withruntime.sandbox.Watches`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    _base = WatchesOps._base
    list = awaitable(WatchesOps.list)
    stop = awaitable(WatchesOps.stop)

    async def start(self, path: str, **options: Any) -> AsyncWatch:
        return AsyncWatch(self._sbx, await arun(WatchesOps._start(self, path, **options)))


class AsyncSessions:
    """The awaitable twin of :class:`withruntime.sandbox.Sessions`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sbx = sandbox

    _base = SessionsOps._base
    create = awaitable(SessionsOps.create)
    list = awaitable(SessionsOps.list)
    revoke = awaitable(SessionsOps.revoke)


class AsyncNetwork(Dict[str, Any]):
    """The awaitable twin of :class:`withruntime.sandbox.Network`."""

    def __init__(self, sandbox: AsyncSandbox, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self._sandbox = sandbox

    set = awaitable(NetworkOps.set)
    get = awaitable(NetworkOps.get)  # type: ignore[assignment]
    off = awaitable(NetworkOps.off)
    on = awaitable(NetworkOps.on)


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

    set = awaitable(SecretsOps.set)
    rotate = awaitable(SecretsOps.rotate)
    get = awaitable(SecretsOps.get)
    list = awaitable(SecretsOps.list)
    delete = awaitable(SecretsOps.delete)
    close = awaitable(SecretsOps.close)

    async def __aenter__(self) -> "AsyncSecrets":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSnapshots:
    """The awaitable twin of :class:`withruntime.sandbox.Snapshots`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    get = awaitable(SnapshotsOps.get)
    list = awaitable(SnapshotsOps.list)
    update = awaitable(SnapshotsOps.update)
    extend = awaitable(SnapshotsOps.extend)
    delete = awaitable(SnapshotsOps.delete)


class AsyncEvents:
    """The awaitable twin of :class:`withruntime.sandbox.Events`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    list = awaitable(EventsOps.list)


class AsyncVolumes:
    """The awaitable twin of :class:`withruntime.sandbox.Volumes`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    create = awaitable(VolumesOps.create)
    get = awaitable(VolumesOps.get)
    list = awaitable(VolumesOps.list)
    resize = awaitable(VolumesOps.resize)
    delete = awaitable(VolumesOps.delete)
    attach = awaitable(VolumesOps.attach)
    detach = awaitable(VolumesOps.detach)
    get_attachment = awaitable(VolumesOps.get_attachment)
    backup = awaitable(VolumesOps.backup)
    set_backup_policy = awaitable(VolumesOps.set_backup_policy)
    backups = awaitable(VolumesOps.backups)
    get_backup = awaitable(VolumesOps.get_backup)
    delete_backup = awaitable(VolumesOps.delete_backup)
    restore = awaitable(VolumesOps.restore)


class AsyncWebhooks:
    """The awaitable twin of :class:`withruntime.sandbox.Webhooks`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    create = awaitable(WebhooksOps.create)
    list = awaitable(WebhooksOps.list)
    get = awaitable(WebhooksOps.get)
    update = awaitable(WebhooksOps.update)
    rotate_secret = awaitable(WebhooksOps.rotate_secret)
    delete = awaitable(WebhooksOps.delete)
    test = awaitable(WebhooksOps.test)
    deliveries = awaitable(WebhooksOps.deliveries)
    retry = awaitable(WebhooksOps.retry)


class AsyncOtel:
    """The awaitable twin of :class:`withruntime.sandbox.Otel`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    create = awaitable(OtelOps.create)
    list = awaitable(OtelOps.list)
    get = awaitable(OtelOps.get)
    update = awaitable(OtelOps.update)
    flush = awaitable(OtelOps.flush)
    delete = awaitable(OtelOps.delete)


class AsyncAudit:
    """The awaitable twin of :class:`withruntime.sandbox.Audit`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    list = awaitable(AuditOps.list)


class AsyncRegistries:
    """``runtime.images.registries`` (awaitable): credentials of private registries, sealed."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    list = awaitable(RegistriesOps.list)
    set = awaitable(RegistriesOps.set)
    delete = awaitable(RegistriesOps.delete)


class AsyncImages:
    """The awaitable twin of :class:`withruntime.sandbox.Images`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http
        self.registries = AsyncRegistries(http)

    upload_context = awaitable(ImagesOps.upload_context)
    create = awaitable(ImagesOps.create)
    build = awaitable(ImagesOps.build)
    get = awaitable(ImagesOps.get)
    resolve = awaitable(ImagesOps.resolve)
    logs = awaitable(ImagesOps.logs)
    list = awaitable(ImagesOps.list)
    versions = awaitable(ImagesOps.versions)
    tag = awaitable(ImagesOps.tag)
    untag = awaitable(ImagesOps.untag)
    delete = awaitable(ImagesOps.delete)

    @staticmethod
    async def _sleep(seconds: float) -> None:
        import asyncio

        await asyncio.sleep(seconds)


class AsyncMcp:
    """The awaitable twin of :class:`withruntime.sandbox.Mcp`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    catalog = awaitable(McpOps.catalog)


class AsyncRuntime:
    """The awaitable twin of :class:`Runtime`."""

    def __init__(self, *, api_key: Optional[str] = None, base_url: Optional[str] = None,
                 http_timeout: Optional[float] = None, _transport: Any = None) -> None:
        self.secrets = AsyncSecrets(api_key=api_key, base_url=base_url, http_timeout=http_timeout,
                                    _transport=_transport)
        self._http = self.secrets._http
        self.snapshots = AsyncSnapshots(self._http)
        self.events = AsyncEvents(self._http)
        self.webhooks = AsyncWebhooks(self._http)
        self.otel = AsyncOtel(self._http)
        self.audit = AsyncAudit(self._http)
        self.images = AsyncImages(self._http)
        self.volumes = AsyncVolumes(self._http)
        self.mcp = AsyncMcp(self._http)

    me = awaitable(RuntimeOps.me)
    limits = awaitable(RuntimeOps.limits)
    usage_export = awaitable(RuntimeOps.usage_export)
    close = awaitable(RuntimeOps.close)

    async def __aenter__(self) -> "AsyncRuntime":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
