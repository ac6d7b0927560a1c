"""The blocking client: :class:`Sandbox` and its :class:`Files`. Each call's body is in _core.py,
driven here by blocking I/O (_drive.py)."""

from __future__ import annotations

import functools
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Dict, Iterator, Mapping, Optional, Type

from ._config import resolve_api_key, resolve_endpoint
from ._computer import BrowserOps, DesktopOps, RecordingsOps
from ._core import FilesOps, NetworkOps, PreviewsOps, RuntimeOps, SandboxOps, SecretsOps, SnapshotsOps
from ._drive import blocking, blocking_iter, run
from ._http import SyncHTTP, websocket_headers
from ._images import ImagesOps, RegistriesOps
from ._mcp import McpOps, SandboxMcpOps
from ._models import SandboxInfo
from ._observability import AuditOps, EventsOps, OtelOps, WebhooksOps
from ._volumes import VolumesOps
from ._process import Process
from ._sessions import SessionsOps, WatchOps, WatchesOps, check_session_token

if TYPE_CHECKING:
    from ._terminal import Terminal
    from ._tunnel import PortForward
    from .interpreter import Interpreter


def _connect(
    api_key: Optional[str], base_url: Optional[str], http_timeout: Optional[float], transport: Any
) -> SyncHTTP:
    endpoint = resolve_endpoint(base_url)
    return SyncHTTP(endpoint, resolve_api_key(api_key), timeout=http_timeout, transport=transport)


class Sandbox(SandboxInfo):
    """A sandbox on a Runtime daemon.

    Make one with :meth:`create` or attach to one with :meth:`connect`. As a context manager
    it deletes the sandbox when the block ends, unless it was created with ``keep=True``.
    Safe to use from several threads at once.
    """

    _connect = staticmethod(_connect)
    _process_class = Process

    def __init__(self, http: SyncHTTP, data: Dict[str, Any], *, keep: bool = True, owns_http: bool = True) -> None:
        self._http = http
        self._owns_http = owns_http
        self._keep = keep
        self._set_data(data)
        self.files = Files(self)
        self.previews = Previews(self)
        self.sessions = Sessions(self)
        self.browser = Browser(self)
        self.desktop = Desktop(self)
        self.mcp = SandboxMcp(self)

    @classmethod
    def from_session(cls, token: str, sandbox_id: str, base_url: Optional[str] = None, *,
                     http_timeout: Optional[float] = None, transport: Any = None) -> "Sandbox":
        """A sandbox reached with a session token (``rtsess_...``, made by a backend with
        ``sbx.sessions.create()``) instead of an API key: its commands, processes, files,
        terminals, watches and previews, and nothing else. Makes no call."""
        http = _connect(check_session_token(token), base_url, http_timeout, transport)
        return cls(http, {"id": sandbox_id})

    @functools.cached_property
    def interpreter(self) -> Interpreter:
        """The sandbox's code interpreter, made (and its module imported) on first use."""
        from .interpreter import Interpreter

        return Interpreter(self)

    create = classmethod(blocking(SandboxOps.create))
    connect = classmethod(blocking(SandboxOps.connect))
    get_or_create = classmethod(blocking(SandboxOps.get_or_create))
    list = classmethod(blocking(SandboxOps.list))
    stop_all = classmethod(blocking(SandboxOps.stop_all))
    delete_all = classmethod(blocking(SandboxOps.delete_all))
    refresh = blocking(SandboxOps.refresh)
    stop = blocking(SandboxOps.stop)
    pause = blocking(SandboxOps.pause)
    wake = blocking(SandboxOps.wake)
    restart = blocking(SandboxOps.restart)
    snapshot = blocking(SandboxOps.snapshot)
    fork = blocking(SandboxOps.fork)
    update = blocking(SandboxOps.update)
    extend = blocking(SandboxOps.extend)
    set_network = blocking(SandboxOps.set_network)
    egress_log = blocking(SandboxOps.egress_log)
    metrics = blocking(SandboxOps.metrics)
    delete = blocking(SandboxOps.delete)
    close = blocking(SandboxOps.close)
    exec = blocking(SandboxOps.exec)
    exec_stream = blocking_iter(SandboxOps.exec_stream)
    spawn = blocking(SandboxOps.spawn)
    processes = blocking(SandboxOps.processes)
    process = blocking(SandboxOps.process)

    @property
    def network(self) -> "Network":
        """The egress policy as last answered (a dict), with ``.set(...)`` to change it."""
        return Network(self, self._data.get("network") or {})

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        run(SandboxOps._exit(self, exc_type))

    def forward_port(self, port: int, *, local_port: Optional[int] = None, host: str = "127.0.0.1") -> PortForward:
        """Listens on ``host``:``local_port`` (``port`` unless given; 0 for any free one) and
        carries each connection to ``port`` on the sandbox's loopback over one authenticated
        WebSocket, until ``close()``. Nothing listens beyond loopback unless ``host`` says so."""
        from ._tunnel import PortForward, check_port
        from ._ws import SyncWebSocket

        check_port(port)
        if local_port is not None:
            check_port(local_port, "local_port", zero_ok=True)
        ws = SyncWebSocket(self._http.endpoint, f"/v1/sandboxes/{self.id}/tunnel", websocket_headers(self._http.api_key))
        try:
            return PortForward(ws, port, local_port, host)
        except BaseException:
            ws.close()
            raise


    def terminal(
        self,
        *,
        cols: int = 80,
        rows: int = 24,
        command: Optional[str] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        process_id: Optional[str] = None,
    ) -> Terminal:
        """An interactive terminal over a WebSocket: a login shell, or ``command``, on a PTY of
        ``cols`` x ``rows``; or, with ``process_id``, the running process spawned with ``pty=``.
        ``write()`` types, ``recv()`` reads, ``resize()``; ``close()`` hangs up a process it
        started."""
        from ._terminal import Terminal, terminal_target
        from ._ws import SyncWebSocket

        target = terminal_target(self.id, cols, rows, command, cwd, user, process_id)
        return Terminal(SyncWebSocket(self._http.endpoint, target, websocket_headers(self._http.api_key)))


class Files:
    """File operations inside one sandbox. Relative paths are relative to ``/workspace``."""

    _reads_files = True

    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox

    _url = FilesOps._url
    read = blocking(FilesOps.read)
    read_text = blocking(FilesOps.read_text)
    write = blocking(FilesOps.write)
    list = blocking(FilesOps.list)
    glob = blocking(FilesOps.glob)
    stat = blocking(FilesOps.stat)
    exists = blocking(FilesOps.exists)
    mkdir = blocking(FilesOps.mkdir)
    remove = blocking(FilesOps.remove)
    rename = blocking(FilesOps.rename)
    archive = blocking(FilesOps.archive)
    unarchive = blocking(FilesOps.unarchive)
    upload = blocking(FilesOps.upload)
    download = blocking(FilesOps.download)
    download_url = blocking(FilesOps.download_url)
    upload_url = blocking(FilesOps.upload_url)
    revoke_links = blocking(FilesOps.revoke_links)

    @property
    def watches(self) -> "Watches":
        """The watches running in the sandbox."""
        return Watches(self._sbx)

    def watch(self, path: str, **options: Any) -> "Watch":
        """Watches ``path`` for create, write, remove, rename and chmod events. Options:
        recursive, events, include, exclude (globs), batch_ms, timeout_ms (an hour by
        default, 0 until stopped), max_watches, id. Read with ``events()`` or
        ``get_new_events()``; ``stop()`` ends it."""
        return self.watches.start(path, **options)


class Watch(WatchOps):
    """A running watch; ``cursor`` is where the next read starts."""

    def __init__(self, sandbox: Sandbox, info: Dict[str, Any]) -> None:
        self._init(sandbox, info)

    _url = WatchOps._url
    get_new_events = blocking(WatchOps.get_new_events)
    stop = blocking(WatchOps.stop)

    def events(self) -> Iterator[Dict[str, Any]]:
        """Each change as it comes, until the watch ends (``exit_reason`` says why)."""
        while self.exit_reason is None:
            yield from self.get_new_events(wait_ms=8000)


class Watches:
    """The watches of one sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox

    _base = WatchesOps._base
    list = blocking(WatchesOps.list)
    stop = blocking(WatchesOps.stop)

    def start(self, path: str, **options: Any) -> Watch:
        return Watch(self._sbx, run(WatchesOps._start(self, path, **options)))


class Sessions:
    """Sandbox sessions: tokens for one sandbox that a backend hands its own frontend (docs/sessions.md)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox

    _base = SessionsOps._base
    create = blocking(SessionsOps.create)
    list = blocking(SessionsOps.list)
    revoke = blocking(SessionsOps.revoke)


class Previews:
    """Ports of one sandbox shared at a host name of their own (docs/previews.md)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox

    _base = PreviewsOps._base
    create = blocking(PreviewsOps.create)
    list = blocking(PreviewsOps.list)
    get = blocking(PreviewsOps.get)
    rotate = blocking(PreviewsOps.rotate)
    delete = blocking(PreviewsOps.delete)


class Browser:
    """Chromium in the sandbox (docs/computer-use.md)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox

    _base = BrowserOps._base
    start = blocking(BrowserOps.start)
    get = blocking(BrowserOps.get)
    stop = blocking(BrowserOps.stop)


class DesktopRecordings:
    """The desktop's screen to MP4, one recording at a time."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox

    _base = RecordingsOps._base
    start = blocking(RecordingsOps.start)
    stop = blocking(RecordingsOps.stop)
    get = blocking(RecordingsOps.get)
    list = blocking(RecordingsOps.list)
    download = blocking(RecordingsOps.download)
    delete = blocking(RecordingsOps.delete)


class Desktop:
    """The sandbox's X desktop, driven like a person would (docs/computer-use.md)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox
        self.recordings = DesktopRecordings(sandbox)

    _base = DesktopOps._base
    _act = DesktopOps._act
    start = blocking(DesktopOps.start)
    stop = blocking(DesktopOps.stop)
    screenshot = blocking(DesktopOps.screenshot)
    move = blocking(DesktopOps.move)
    click = blocking(DesktopOps.click)
    double_click = blocking(DesktopOps.double_click)
    right_click = blocking(DesktopOps.right_click)
    mouse_down = blocking(DesktopOps.mouse_down)
    mouse_up = blocking(DesktopOps.mouse_up)
    drag = blocking(DesktopOps.drag)
    scroll = blocking(DesktopOps.scroll)
    type = blocking(DesktopOps.type)
    press = blocking(DesktopOps.press)
    cursor = blocking(DesktopOps.cursor)
    windows = blocking(DesktopOps.windows)
    focus = blocking(DesktopOps.focus)
    open = blocking(DesktopOps.open)
    launch = blocking(DesktopOps.launch)


class SandboxMcp:
    """MCP servers of the catalog inside the sandbox, at URLs an MCP client connects to
    (docs/mcp.md, "Inside a sandbox")."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox

    _sleep = staticmethod(time.sleep)
    start = blocking(SandboxMcpOps.start)
    get = blocking(SandboxMcpOps.get)
    ready = blocking(SandboxMcpOps.ready)
    stop = blocking(SandboxMcpOps.stop)


class Network(Dict[str, Any]):
    """A sandbox's egress policy (``{"internet": ..., "allow": [...], "deny": [...]}``) as
    last answered; :meth:`set` replaces it."""

    def __init__(self, sandbox: Sandbox, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self._sandbox = sandbox

    set = blocking(NetworkOps.set)
    get = blocking(NetworkOps.get)  # type: ignore[assignment]
    off = blocking(NetworkOps.off)
    on = blocking(NetworkOps.on)


class Secrets:
    """The key owner's egress secrets: values the proxy puts in place of a placeholder in
    requests to the secret's hosts. Sandboxes only ever see ``$NAME`` = the placeholder; values
    are never returned."""

    def __init__(
        self,
        *,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        http_timeout: Optional[float] = None,
        _transport: Any = None,
    ) -> None:
        self._http = _connect(api_key, base_url, http_timeout, _transport)

    set = blocking(SecretsOps.set)
    rotate = blocking(SecretsOps.rotate)
    get = blocking(SecretsOps.get)
    list = blocking(SecretsOps.list)
    delete = blocking(SecretsOps.delete)
    close = blocking(SecretsOps.close)

    def __enter__(self) -> "Secrets":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Snapshots:
    """The key owner's snapshots (``runtime.snapshots``): take one with
    ``sbx.snapshot()``, start from one with ``Sandbox.create(snapshot=ID)``."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    get = blocking(SnapshotsOps.get)
    list = blocking(SnapshotsOps.list)
    update = blocking(SnapshotsOps.update)
    extend = blocking(SnapshotsOps.extend)
    delete = blocking(SnapshotsOps.delete)


class Events:
    """The key owner's lifecycle events (``runtime.events``)."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    list = blocking(EventsOps.list)


class Webhooks:
    """The key owner's webhooks (``runtime.webhooks``); check each delivery with
    :func:`withruntime.verify_webhook`."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    create = blocking(WebhooksOps.create)
    list = blocking(WebhooksOps.list)
    get = blocking(WebhooksOps.get)
    update = blocking(WebhooksOps.update)
    rotate_secret = blocking(WebhooksOps.rotate_secret)
    delete = blocking(WebhooksOps.delete)
    test = blocking(WebhooksOps.test)
    deliveries = blocking(WebhooksOps.deliveries)
    retry = blocking(WebhooksOps.retry)


class Otel:
    """The key owner's OpenTelemetry exports (``runtime.otel``)."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    create = blocking(OtelOps.create)
    list = blocking(OtelOps.list)
    get = blocking(OtelOps.get)
    update = blocking(OtelOps.update)
    flush = blocking(OtelOps.flush)
    delete = blocking(OtelOps.delete)


class Audit:
    """The key owner's audit log (``runtime.audit``)."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    list = blocking(AuditOps.list)


class Registries:
    """``runtime.images.registries``: credentials of private registries, sealed."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    list = blocking(RegistriesOps.list)
    set = blocking(RegistriesOps.set)
    delete = blocking(RegistriesOps.delete)


class Images:
    """The key owner's images built from Dockerfiles (``runtime.images``, docs/images.md)."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http
        self.registries = Registries(http)

    upload_context = blocking(ImagesOps.upload_context)
    create = blocking(ImagesOps.create)
    build = blocking(ImagesOps.build)
    get = blocking(ImagesOps.get)
    resolve = blocking(ImagesOps.resolve)
    logs = blocking(ImagesOps.logs)
    list = blocking(ImagesOps.list)
    versions = blocking(ImagesOps.versions)
    tag = blocking(ImagesOps.tag)
    untag = blocking(ImagesOps.untag)
    delete = blocking(ImagesOps.delete)
    _sleep = ImagesOps._sleep


class Volumes:
    """The key owner's volumes (``runtime.volumes``, docs/volumes.md)."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    create = blocking(VolumesOps.create)
    get = blocking(VolumesOps.get)
    list = blocking(VolumesOps.list)
    resize = blocking(VolumesOps.resize)
    delete = blocking(VolumesOps.delete)
    attach = blocking(VolumesOps.attach)
    detach = blocking(VolumesOps.detach)
    get_attachment = blocking(VolumesOps.get_attachment)
    backup = blocking(VolumesOps.backup)
    set_backup_policy = blocking(VolumesOps.set_backup_policy)
    backups = blocking(VolumesOps.backups)
    get_backup = blocking(VolumesOps.get_backup)
    delete_backup = blocking(VolumesOps.delete_backup)
    restore = blocking(VolumesOps.restore)


class Mcp:
    """The catalog of MCP servers a sandbox can run (``runtime.mcp``, docs/mcp.md)."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    catalog = blocking(McpOps.catalog)


class Runtime:
    """The calls about the key and its owner rather than one sandbox: ``runtime.secrets``
    (:class:`Secrets`), ``runtime.snapshots`` (:class:`Snapshots`), ``runtime.images``
    (:class:`Images`), ``runtime.volumes`` (:class:`Volumes`), ``runtime.mcp`` (:class:`Mcp`), ``runtime.events``,
    ``runtime.webhooks``, ``runtime.otel``, ``runtime.audit``, ``runtime.me()``,
    ``runtime.limits()`` and ``runtime.usage_export()``. They share one connection pool.
    ``api_key`` and ``base_url`` override ``RUNTIME_API_KEY`` and ``RUNTIME_BASE_URL``."""

    def __init__(self, *, api_key: Optional[str] = None, base_url: Optional[str] = None,
                 http_timeout: Optional[float] = None, _transport: Any = None) -> None:
        self.secrets = Secrets(api_key=api_key, base_url=base_url, http_timeout=http_timeout,
                               _transport=_transport)
        self._http = self.secrets._http
        self.snapshots = Snapshots(self._http)
        self.events = Events(self._http)
        self.webhooks = Webhooks(self._http)
        self.otel = Otel(self._http)
        self.audit = Audit(self._http)
        self.images = Images(self._http)
        self.volumes = Volumes(self._http)
        self.mcp = Mcp(self._http)

    me = blocking(RuntimeOps.me)
    limits = blocking(RuntimeOps.limits)
    usage_export = blocking(RuntimeOps.usage_export)
    close = blocking(RuntimeOps.close)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
