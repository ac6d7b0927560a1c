"""File watches and sandbox sessions, written once as generators of steps (_drive.py) that
the blocking client (sandbox.py) and the asyncio client (async_sandbox.py) drive. The names
are the published client's: ``sbx.files.watch(path, recursive=...)`` and ``sbx.files.watches``,
``sbx.sessions.create/list/revoke`` and ``Sandbox.from_session(token, sandbox_id)``. Private."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence
from urllib.parse import quote

from ._drive import Call
from ._models import sandbox_path
from ._process import idempotency_headers
from .errors import InvalidRequestError

#: A read by cursor waits at most this long for a change (the daemon's bound).
WATCH_WAIT_MAX_MS = 8000


def check_session_token(token: str) -> str:
    if not isinstance(token, str) or not token.startswith("rtsess_"):
        raise InvalidRequestError("That is not a sandbox session token (they start rtsess_).",
                                  hint="Make one on your backend with sbx.sessions.create() and pass its token.")
    return token


class WatchOps:
    """One running watch (docs/api.md, "File watches"): ``cursor`` is where the next read
    starts; ``notices`` collects the overflow, limit and lost notices (events were missed:
    rescan); ``exit_reason`` says why it ended."""

    def _init(self, sandbox: Any, info: Dict[str, Any]) -> None:
        self._sbx = sandbox
        self.id: str = info["id"]
        self.path: str = info.get("path", "")
        self.cursor: int = int(info.get("cursor") or 0)
        self.notices: List[Dict[str, Any]] = []
        self.exit_reason: Optional[str] = None

    def _url(self, suffix: str = "") -> str:
        return sandbox_path(self._sbx.id, f"/files/watches/{quote(self.id, safe='')}{suffix}")

    def get_new_events(self, wait_ms: int = 0) -> List[Dict[str, Any]]:
        """The changes since the last read, waiting up to ``wait_ms`` (8000 at most) for one."""
        read: Dict[str, Any] = yield Call(self._sbx._http.request, "GET", WatchOps._url(self, "/events"),
                                          params={"cursor": self.cursor,
                                                  "waitMs": max(0, min(WATCH_WAIT_MAX_MS, int(wait_ms)))})
        self.cursor = int(read["nextCursor"])
        for notice in read.get("notices", []):
            if notice.get("k") == "end":
                self.exit_reason = notice.get("reason")
            else:
                self.notices.append(notice)
        if read.get("ended") and self.exit_reason is None:
            self.exit_reason = "exited"
        return list(read.get("events", []))

    def stop(self) -> bool:
        """Stops the watch in the sandbox."""
        self.exit_reason = self.exit_reason or "stopped"
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "DELETE", WatchOps._url(self))
        return bool(out["stopped"])


class WatchesOps:
    """``sbx.files.watches``: the watches running in a sandbox."""

    def _base(self) -> str:
        return sandbox_path(self._sbx.id, "/files/watches")

    def _start(self, path: str, *, recursive: bool = False, events: Optional[Sequence[str]] = None,
               include: Optional[Sequence[str]] = None, exclude: Optional[Sequence[str]] = None,
               batch_ms: Optional[int] = None, timeout_ms: Optional[int] = None,
               max_watches: Optional[int] = None, id: Optional[str] = None,  # noqa: A002
               idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        body = {k: v for k, v in {"path": path, "recursive": bool(recursive), "events": events, "include": include,
                                  "exclude": exclude, "batchMs": batch_ms, "timeoutMs": timeout_ms,
                                  "maxWatches": max_watches, "id": id}.items() if v is not None}
        for name in ("events", "include", "exclude"):
            if name in body:
                body[name] = list(body[name])
        info: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", WatchesOps._base(self), json_body=body,
                                          headers=idempotency_headers(idempotency_key))
        return info

    def list(self) -> List[Dict[str, Any]]:
        """The sandbox's watches, running or ended."""
        return list((yield Call(self._sbx._http.request, "GET", WatchesOps._base(self)))["data"])

    def stop(self, watch_id: str) -> bool:
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "DELETE",
                                         f"{WatchesOps._base(self)}/{quote(watch_id, safe='')}")
        return bool(out["stopped"])


class SessionsOps:
    """``sbx.sessions``: short-lived tokens a backend makes for its own frontend, which then
    uses this one sandbox's commands, processes, files, terminals, watches and previews and
    nothing else (docs/sessions.md)."""

    def _base(self, suffix: str = "") -> str:
        return sandbox_path(self._sbx.id, f"/sessions{suffix}")

    def create(self, ttl_seconds: Optional[int] = None, origins: Optional[Sequence[str]] = None,
               name: Optional[str] = None, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """A new session; its ``token`` is in this answer only. ``origins`` are the exact pages
        that will use it (``https://app.example.com``): CORS is answered for them alone."""
        body: Dict[str, Any] = {}
        if ttl_seconds is not None:
            body["ttlSeconds"] = int(ttl_seconds)
        if origins is not None:
            body["origins"] = list(origins)
        if name is not None:
            body["name"] = name
        made: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", SessionsOps._base(self), json_body=body,
                                          headers=idempotency_headers(idempotency_key))
        if made.get("token"):
            return made
        # A replay of a create whose answer was lost: the token was shown once, so that
        # session ends and a fresh one is made.
        yield Call(self._sbx._http.request, "POST", SessionsOps._base(self, f"/{quote(made['id'], safe='')}:revoke"),
                   json_body={})
        fresh: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", SessionsOps._base(self), json_body=body)
        return fresh

    def list(self) -> List[Dict[str, Any]]:
        """Sessions still active, and those that ended in the last day, newest first."""
        return list((yield Call(self._sbx._http.request, "GET", SessionsOps._base(self)))["data"])

    def revoke(self, session_id: str) -> Dict[str, Any]:
        """Ends a session now: its next request is refused, its open streams close."""
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "POST",
                                         SessionsOps._base(self, f"/{quote(session_id, safe='')}:revoke"),
                                         json_body={})
        return out
