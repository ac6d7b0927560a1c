"""``sbx.browser`` and ``sbx.desktop``: Chromium and an X desktop in a sandbox of the ``desktop``
image (docs/computer-use.md), with the published client's names. Each operation is written once
as a generator of calls; the blocking and awaitable classes in sandbox.py and async_sandbox.py
drive it."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._models import sandbox_path
from ._drive import Call


def _body(**fields: Any) -> Dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class BrowserOps:
    """Chromium in the sandbox. ``start`` answers ``cdpUrl``: a ``ws`` URL on the daemon's
    preview listener, with a token, for Playwright's ``connect_over_cdp``."""

    def _base(self) -> str:
        return sandbox_path(self._sbx.id, "/browser")

    def start(self, *, headless: Optional[bool] = None, width: Optional[int] = None,
              height: Optional[int] = None) -> Dict[str, Any]:
        """Starts Chromium (or answers the one running): ``{running, headless, cdpUrl,
        streamUrl, width, height}``. ``headless=False`` shows it on the desktop."""
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", f"{BrowserOps._base(self)}:start",
                                         json_body=_body(headless=headless, width=width, height=height))
        return out

    def get(self) -> Dict[str, Any]:
        """Whether it runs, and a fresh ``cdpUrl`` when it does."""
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "GET", BrowserOps._base(self))
        return out

    def stop(self) -> bool:
        out = yield Call(self._sbx._http.request, "POST", f"{BrowserOps._base(self)}:stop", json_body={})
        return bool(out["stopped"])


class DesktopOps:
    """The X desktop: start, screenshots, and the input actions of ``:act``."""

    def _base(self) -> str:
        return sandbox_path(self._sbx.id, "/desktop")

    def _act(self, body: Dict[str, Any]) -> Any:
        return (yield Call(self._sbx._http.request, "POST", f"{DesktopOps._base(self)}:act", json_body=body))

    def start(self, *, width: Optional[int] = None, height: Optional[int] = None) -> Dict[str, Any]:
        """Starts Xvfb and the window manager: ``{running, width, height, display, streamUrl}``."""
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", f"{DesktopOps._base(self)}:start",
                                         json_body=_body(width=width, height=height))
        return out

    def stop(self) -> Dict[str, Any]:
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", f"{DesktopOps._base(self)}:stop",
                                         json_body={})
        return out

    def screenshot(self, *, format: str = "png", quality: Optional[int] = None) -> bytes:  # noqa: A002
        """The screen as PNG, or JPEG with ``format="jpeg"`` (``quality`` 1 to 100)."""
        data: bytes = yield Call(self._sbx._http.request, "GET", f"{DesktopOps._base(self)}/screenshot",
                                 params=_body(format=format, quality=quality), raw=True)
        return data

    def move(self, x: int, y: int) -> Any:
        return (yield from DesktopOps._act(self, {"action": "move", "x": x, "y": y}))

    def click(self, x: Optional[int] = None, y: Optional[int] = None, *, button: str = "left",
              double: bool = False) -> Any:
        body: Dict[str, Any] = {"action": "click", "button": button}
        if x is not None and y is not None:
            body.update(x=x, y=y)
        if double:
            body["double"] = True
        return (yield from DesktopOps._act(self, body))

    def double_click(self, x: Optional[int] = None, y: Optional[int] = None) -> Any:
        return (yield from DesktopOps.click(self, x, y, double=True))

    def right_click(self, x: Optional[int] = None, y: Optional[int] = None) -> Any:
        return (yield from DesktopOps.click(self, x, y, button="right"))

    def mouse_down(self, button: str = "left") -> Any:
        return (yield from DesktopOps._act(self, {"action": "mouseDown", "button": button}))

    def mouse_up(self, button: str = "left") -> Any:
        return (yield from DesktopOps._act(self, {"action": "mouseUp", "button": button}))

    def drag(self, start: Tuple[int, int], end: Tuple[int, int]) -> Any:
        return (yield from DesktopOps._act(self, {"action": "drag", "from": list(start), "to": list(end)}))

    def scroll(self, dy: int, *, dx: int = 0, x: Optional[int] = None, y: Optional[int] = None) -> Any:
        """Wheel clicks: positive ``dy`` scrolls down, positive ``dx`` right."""
        body: Dict[str, Any] = {"action": "scroll", "dy": dy}
        if dx:
            body["dx"] = dx
        if x is not None and y is not None:
            body.update(x=x, y=y)
        return (yield from DesktopOps._act(self, body))

    def type(self, text: str, *, delay_ms: Optional[int] = None) -> Any:  # noqa: A003
        return (yield from DesktopOps._act(self, _body(action="type", text=text, delayMs=delay_ms)))

    def press(self, keys: str) -> Any:
        """X key names as xdotool takes them, space separated: "ctrl+l", "Return", "alt+Tab"."""
        return (yield from DesktopOps._act(self, {"action": "key", "keys": keys}))

    def cursor(self) -> Dict[str, int]:
        return (yield from DesktopOps._act(self, {"action": "cursor"}))

    def windows(self) -> List[Dict[str, Any]]:
        return list((yield from DesktopOps._act(self, {"action": "windows"}))["windows"])

    def focus(self, window_id: str) -> Any:
        return (yield from DesktopOps._act(self, {"action": "focus", "windowId": window_id}))

    def open(self, url: str) -> Any:
        """Opens an http(s) or file URL in Chromium on the desktop, or a path with xdg-open."""
        return (yield from DesktopOps._act(self, {"action": "open", "url": url}))

    def launch(self, argv: Sequence[str]) -> Any:
        """Starts a program on the desktop, detached: ``{ok, pid}``."""
        return (yield from DesktopOps._act(self, {"action": "launch", "argv": list(argv)}))


class RecordingsOps:
    """The screen to MP4, one recording at a time (``sbx.desktop.recordings``)."""

    def _base(self) -> str:
        return sandbox_path(self._sbx.id, "/desktop/recordings")

    def start(self, *, fps: Optional[int] = None, max_seconds: Optional[int] = None,
              max_mib: Optional[int] = None, crf: Optional[int] = None) -> Dict[str, Any]:
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", RecordingsOps._base(self),
                                         json_body=_body(fps=fps, maxSeconds=max_seconds, maxMiB=max_mib, crf=crf))
        return out

    def stop(self, recording_id: str) -> Dict[str, Any]:
        """Answers once the file is whole."""
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "POST",
                                         f"{RecordingsOps._base(self)}/{recording_id}:stop", json_body={})
        return out

    def get(self, recording_id: str) -> Dict[str, Any]:
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "GET", f"{RecordingsOps._base(self)}/{recording_id}")
        return out

    def list(self) -> List[Dict[str, Any]]:
        return list((yield Call(self._sbx._http.request, "GET", RecordingsOps._base(self)))["data"])

    def download(self, recording_id: str) -> bytes:
        """The MP4's bytes."""
        data: bytes = yield Call(self._sbx._http.request, "GET", f"{RecordingsOps._base(self)}/{recording_id}/video",
                                 raw=True)
        return data

    def delete(self, recording_id: str) -> bool:
        out = yield Call(self._sbx._http.request, "DELETE", f"{RecordingsOps._base(self)}/{recording_id}")
        return bool(out["deleted"])
