"""Keep-alive connections to the daemon: one pool per daemon address in a process, shared by
every client object of that address (each ``Sandbox.create`` makes one), so that twenty sandboxes
share their connections instead of each opening its own.

A pool costs nothing to make (a list and a lock) and connects on the first request. A plain
``http://`` or ``unix:`` daemon never makes an SSL context; an ``https://`` one shares the one
context of the process (_stream.tls_context), made at its first TLS connection.

A connection idle for longer than IDLE_SECONDS, or that the daemon has closed (a socket that
reads as ready while no request is out), is dropped rather than reused. When the last client
object of a pool closes, its idle connections are closed. A child made by ``fork`` starts a pool
of its own: a connection shared with the parent would mix their replies."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from ._config import Endpoint

#: An idle connection older than this is closed rather than reused (httpcore's default).
IDLE_SECONDS = 5.0
#: Idle connections kept per pool; more are closed when handed back.
MAX_IDLE = 16


def address(endpoint: Endpoint) -> Tuple[int, Any, Optional[str]]:
    """(family, address, TLS server name or None) of the daemon."""
    if endpoint.uds:
        return socket.AF_UNIX, endpoint.uds, None
    url = urlsplit(endpoint.url)
    tls = url.scheme == "https"
    return socket.AF_INET, (url.hostname or "127.0.0.1", url.port or (443 if tls else 80)), (
        url.hostname if tls else None)


def readable(sock: socket.socket) -> bool:
    """True when an idle connection has something to read: the daemon closed it (or sent what
    no request asked for), so it cannot carry a request."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


class Pool:
    """Idle connections to one daemon address. ``conn`` objects are what the client makes
    (a socket, or an asyncio stream pair); ``stale(conn)`` says whether one can be reused."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.pid = os.getpid()
        self._idle: List[Tuple[float, Any]] = []
        self._lock = threading.Lock()
        self._users = 0

    def join(self) -> None:
        """A client object starts using the pool."""
        with self._lock:
            self._users += 1

    def leave(self, close: Any) -> None:
        """A client object is done with it; after the last one, ``close(conn)`` on each idle
        connection."""
        with self._lock:
            self._users = max(0, self._users - 1)
            idle, self._idle = (self._idle, []) if self._users == 0 else ([], self._idle)
        for _, conn in idle:
            close(conn)

    def take(self, stale: Any, close: Any) -> Optional[Any]:
        """The most recently used idle connection still good, or None."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    return None
                since, conn = self._idle.pop()
            if now - since <= IDLE_SECONDS and not stale(conn):
                return conn
            close(conn)

    def give(self, conn: Any, close: Any) -> None:
        """Hands a connection back after a whole reply was read on it."""
        with self._lock:
            if len(self._idle) < MAX_IDLE and self._users > 0:
                self._idle.append((time.monotonic(), conn))
                return
        close(conn)

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)


_pools: Dict[Tuple[str, Optional[str], bool], Pool] = {}
_pools_lock = threading.Lock()


def pool_for(endpoint: Endpoint, is_async: bool) -> Pool:
    """The process's pool for the daemon at ``endpoint`` (blocking sockets and asyncio's apart)."""
    key = (endpoint.url, endpoint.uds, is_async)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool.pid != os.getpid():
            pool = _pools[key] = Pool(endpoint)
        return pool
