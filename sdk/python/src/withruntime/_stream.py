"""Streamed replies (process output, streamed exec, interpreter cells): their NDJSON events out of
the body's bytes, and the request on a connection of its own that carries the stream.

Why not httpx for these: reading 100 MiB of process output through httpx costs the client more
CPU than everything else together (httpcore reads 64 KiB at a time and each read walks h11's event
machinery; the asyncio client pays about three times the blocking one), and on a shared machine a
reader's speed is its CPU time. Here one read takes up to 1 MiB into one buffer, the chunked framing
is stepped over in place, and lines are cut from the bytes as they are.

The events: an output event as runtimed writes it, ``{"type":"stdout","offset":N,"data":"..."}``
whose text has nothing escaped in it (no quote, backslash or control character), is read without
the JSON scanner (which takes about 3 ns a character here): its text is the bytes decoded. Every
other line, escapes included, goes through ``json.loads``. Both give the same dict.

Sans-I/O: :class:`EventReader` and :class:`ReplyReader` take bytes and give events; the blocking
and asyncio clients in _http.py only move the bytes."""

from __future__ import annotations

import json
import os
import re
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Union
from urllib.parse import quote, urlencode, urlsplit

from ._config import Endpoint
from .errors import APIConnectionError, InvalidRequestError

if TYPE_CHECKING:
    import ssl

#: One read of a streamed reply takes up to this much.
READ_SIZE = 1024 * 1024
# A reply's head (status line and headers) larger than this is not our daemon's.
MAX_HEAD = 64 * 1024
# A line larger than this is not an event: runtimed's largest (256 KiB of output, every byte
# escaped, and again in base64) is under 2 MiB.
MAX_LINE = 16 * 1024 * 1024

_OUTPUT_HEAD = re.compile(rb'\{"type":"(stdout|stderr)","offset":(0|[1-9][0-9]{0,18}),"data":"')
_TYPES = {b"stdout": "stdout", b"stderr": "stderr"}
Buffer = Union[bytes, bytearray]


def parse_event(line: Union[str, bytes]) -> Optional[Dict[str, Any]]:
    """One NDJSON line as an event; None for a blank line."""
    line = line.strip()
    if not line:
        return None
    try:
        ev = json.loads(line)
    except ValueError:
        raise APIConnectionError("the daemon sent an output event that is not JSON") from None
    if not isinstance(ev, dict):
        raise APIConnectionError("the daemon sent an output event that is not an object")
    return ev


def _plain_output(buf: Buffer, view: memoryview, start: int, end: int) -> Optional[Dict[str, Any]]:
    """The output event in buf[start:end] when it is runtimed's shape with no escape in its text
    (then the text is the bytes themselves), else None. With no quote between the head and the
    closing '"}', the line cannot hold another member or end its string early. (A raw control
    character, which runtimed always escapes and json.loads would refuse, is let through.)"""
    m = _OUTPUT_HEAD.match(buf, start, end)
    if m is None or end - m.end() < 2 or buf[end - 2] != 0x22 or buf[end - 1] != 0x7D:
        return None
    text_start, text_end = m.end(), end - 2
    if buf.find(b"\\", text_start, text_end) >= 0 or buf.find(b'"', text_start, text_end) >= 0:
        return None
    try:
        data = str(view[text_start:text_end], "utf-8")
    except UnicodeDecodeError:
        return None
    return {"type": _TYPES[m.group(1)], "offset": int(m.group(2)), "data": data}


class EventReader:
    """NDJSON events out of a body's bytes, fed in pieces of any size: ``feed(buf, start, end)``
    reads buf[start:end] (bytes or a bytearray, which the caller may reuse once it returns)."""

    def __init__(self) -> None:
        self._partial = bytearray()

    def _line(self, buf: Buffer, view: memoryview, start: int, end: int, out: List[Dict[str, Any]]) -> None:
        ev = _plain_output(buf, view, start, end)
        if ev is None:
            ev = parse_event(str(view[start:end], "utf-8", "replace"))
        if ev is not None:
            out.append(ev)

    def feed(self, buf: Buffer, start: int = 0, end: Optional[int] = None) -> List[Dict[str, Any]]:
        end = len(buf) if end is None else end
        out: List[Dict[str, Any]] = []
        nl = buf.find(b"\n", start, end)
        with memoryview(buf) as view:
            if nl >= 0 and self._partial:
                # The line begun in an earlier piece ends here: made whole, then read.
                part = self._partial
                part += view[start:nl]
                with memoryview(part) as pview:
                    self._line(part, pview, 0, len(part), out)
                self._partial = bytearray()
                start = nl + 1
                nl = buf.find(b"\n", start, end)
            while nl >= 0:
                if nl > start:
                    self._line(buf, view, start, nl, out)
                start = nl + 1
                nl = buf.find(b"\n", start, end)
            if start < end:
                self._partial += view[start:end]
                if len(self._partial) > MAX_LINE:
                    raise APIConnectionError("the daemon sent a line longer than 16 MiB")
        return out

    def end(self) -> List[Dict[str, Any]]:
        """The events of a last line without its newline."""
        out: List[Dict[str, Any]] = []
        if self._partial:
            part, self._partial = self._partial, bytearray()
            with memoryview(part) as view:
                self._line(part, view, 0, len(part), out)
        return out


# -- the request and its reply ---------------------------------------------------------------

# RFC 3986's path characters: anything else in a path (a space, a line break) is escaped, so a
# name from the caller can never end the request line early.
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"


def _header_value(name: str, value: str) -> str:
    if any(c in value for c in "\r\n\0") or not value.isascii():
        raise InvalidRequestError(f"the {name} header holds a line break or a character that is not ASCII")
    return value


def _query_value(value: Any) -> str:
    if value is True or value is False:
        return "true" if value else "false"
    return str(value)


def request_head(endpoint: Endpoint, method: str, path: str, *, params: Any, headers: Mapping[str, str],
                 body: Optional[bytes], keep_alive: bool = False, content_type: str = "application/json",
                 chunked: bool = False, body_length: Optional[int] = None) -> bytes:
    """An HTTP/1.1 request's head, and its body when ``body`` is given: with ``keep_alive`` for a
    connection of the pool (_pool.py), else for a reply read on a connection of its own. The
    caller sends the body itself after the head when it gives its ``body_length``, or with
    ``chunked`` (Transfer-Encoding: chunked) when its length is not known."""
    url = urlsplit(endpoint.url)
    target = url.path.rstrip("/") + quote(path, safe=_PATH_SAFE)
    if params:
        items = params.items() if isinstance(params, Mapping) else params
        target += "?" + urlencode([(k, _query_value(v)) for k, v in items if v is not None], quote_via=quote)
    lines = [f"{method} {target} HTTP/1.1", f"Host: {url.netloc or 'runtimed'}",
             "Connection: keep-alive" if keep_alive else "Connection: close"]
    lines += [f"{k}: {_header_value(k, v)}" for k, v in headers.items()]
    if chunked:
        lines += [f"Content-Type: {content_type}", "Transfer-Encoding: chunked"]
    elif body is not None or body_length is not None:
        length = len(body) if body is not None else body_length
        lines += [f"Content-Type: {content_type}", f"Content-Length: {length}"]
    elif method in ("POST", "PUT", "PATCH"):
        lines.append("Content-Length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (body or b"")


def json_body(value: Any) -> Optional[bytes]:
    return None if value is None else json.dumps(value, separators=(",", ":")).encode("utf-8")


def goes_direct(endpoint: Endpoint) -> bool:
    """False when the environment names a proxy for the daemon's address (then requests go
    through httpx, which honours it). urllib's proxy reading is imported only when the
    environment names one at all."""
    if endpoint.uds or not any(k.lower().endswith("_proxy") for k in os.environ):
        return True
    import urllib.request

    url = urlsplit(endpoint.url)
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get(url.scheme) or proxies.get("all")):
        return True
    return bool(urllib.request.proxy_bypass_environment(url.netloc, proxies))


_tls: List["ssl.SSLContext"] = []
_tls_lock = threading.Lock()


def tls_context() -> "ssl.SSLContext":
    """The trust httpx's client has (its CA bundle, SSL_CERT_FILE), for an https daemon: made
    once in a process, on the first https connection, and shared by every connection after it
    (loading the CA bundle costs tens of milliseconds). An http:// or unix: daemon never makes
    one."""
    with _tls_lock:
        if not _tls:
            import httpx

            _tls.append(httpx.create_ssl_context())
        return _tls[0]


class ReplyError(Exception):
    """The daemon's reply broke HTTP/1.1; turned into APIConnectionError by the caller."""


class ReplyReader:
    """An HTTP/1.1 reply's bytes in (``feed``, ``eof``): its ``status`` and ``headers``
    (lower-case names), ``on_head()`` called once they are read, then each piece of its body
    handed to ``on_body(buf, start, end)`` with the chunked framing stepped over; ``done`` at
    its end."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: Dict[str, str] = {}
        self.head_done = False
        self.done = False
        self.on_head: Callable[[], None] = lambda: None
        self.on_body: Callable[[Buffer, int, int], None] = lambda buf, start, end: None
        self._head = bytearray()
        self._mode = ""  # "chunked", "length" or "close"
        self._http10 = False
        self._state = "size"  # chunked: "size", "data", "data_end", "trailer"
        self._left = 0
        self._line = bytearray()

    def feed(self, buf: Buffer, start: int, end: int) -> None:
        if not self.head_done:
            start = self._feed_head(buf, start, end)
        while start < end and not self.done:
            if self._mode == "chunked":
                start = self._chunked(buf, start, end)
            else:
                take = end - start if self._mode == "close" else min(self._left, end - start)
                self.on_body(buf, start, start + take)
                start += take
                self._left -= take
                self.done = self._mode == "length" and self._left == 0

    @property
    def keeps_connection(self) -> bool:
        """Whether the connection may carry another request once this reply has ended."""
        if not self.done or self._mode == "close" or self._http10:
            return False
        return "close" not in self.headers.get("connection", "").lower()

    def eof(self) -> None:
        """The connection closed: the end of a reply that runs to it, else too soon."""
        if self._mode == "close":
            self.done = True
        if not self.done:
            raise ReplyError("the daemon closed the connection before its reply ended")

    def _feed_head(self, buf: Buffer, start: int, end: int) -> int:
        seen = max(0, len(self._head) - 3)
        self._head += memoryview(buf)[start:end]
        stop = self._head.find(b"\r\n\r\n", seen)
        if stop < 0:
            if len(self._head) > MAX_HEAD:
                raise ReplyError("the daemon's reply head is larger than 64 KiB")
            return end
        head, body = bytes(self._head[:stop]), bytes(self._head[stop + 4:])
        self._head = bytearray()
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise ReplyError(f"the daemon's reply does not start with an HTTP/1.1 status line: {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:  # an interim reply; the real one follows
            self._feed_head(body, 0, len(body))
            return end
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ReplyError("the daemon's reply has a header line without a colon")
            headers[name.strip().lower()] = value.strip()
        self.status, self.headers, self.head_done = status, headers, True
        self._http10 = parts[0] == "HTTP/1.0"
        if status in (204, 304):  # never a body, whatever the headers say (RFC 9112, 6.3)
            self._mode, self._left, self.done = "length", 0, True
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._mode = "chunked"
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit() or len(length) > 18:
                raise ReplyError("the daemon's reply has a Content-Length that is not a number")
            self._mode, self._left = "length", int(length)
            self.done = self._left == 0
        else:
            self._mode = "close"
        self.on_head()
        if body:
            self.feed(body, 0, len(body))
        return end

    def _chunked(self, buf: Buffer, start: int, end: int) -> int:
        if self._state == "data":
            take = min(self._left, end - start)
            self.on_body(buf, start, start + take)
            self._left -= take
            if self._left == 0:
                self._state = "data_end"
            return start + take
        nl = buf.find(b"\n", start, end)
        if nl < 0:
            self._line += memoryview(buf)[start:end]
            if len(self._line) > 4096:
                raise ReplyError("the daemon's reply has a chunk line longer than 4 KiB")
            return end
        self._line += memoryview(buf)[start:nl]
        line, self._line = bytes(self._line).rstrip(b"\r"), bytearray()
        if self._state == "size":
            size = line.split(b";", 1)[0].strip()
            try:
                self._left = int(size, 16)
            except ValueError:
                raise ReplyError(f"the daemon's reply has a bad chunk size: {size[:20]!r}") from None
            if self._left < 0 or len(size) > 16:
                raise ReplyError("the daemon's reply has a bad chunk size")
            self._state = "data" if self._left else "trailer"
        elif self._state == "data_end":
            if line:
                raise ReplyError("the daemon's reply has a chunk longer than its size")
            self._state = "size"
        elif not line:  # the empty line after the trailers
            self.done = True
        return nl + 1
