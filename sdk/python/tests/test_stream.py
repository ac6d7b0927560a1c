"""The streamed-reply reader (_stream.py): events out of NDJSON bytes in any pieces, the same as
json.loads gives; HTTP/1.1 framing; and the blocking and asyncio clients reading a stream on a
connection of their own from a small server on loopback (errors, a cut, a hostile name)."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
from typing import Any, Callable, Dict, List

import pytest

from fakedaemon import KEY

from withruntime._config import Endpoint
from withruntime._http import AsyncHTTP, SyncHTTP
from withruntime._process import AsyncProcess, Process
from withruntime._stream import EventReader, ReplyError, ReplyReader
from withruntime.errors import APIConnectionError, InvalidRequestError, NotFoundError


def daemon_line(fd: str, offset: int, raw: bytes) -> bytes:
    """An output event escaped as runtimed escapes it (quote, backslash, \\n \\t \\r, other control
    characters as \\u00XX, invalid UTF-8 as U+FFFD with the bytes in base64)."""
    text = raw.decode("utf-8", "replace")
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif c < " ":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    line = f'{{"type":"{fd}","offset":{offset},"data":"{"".join(out)}"'
    if text.encode() != raw:
        import base64

        line += f',"base64":"{base64.b64encode(raw).decode()}"'
    return (line + "}").encode()


def read_all(body: bytes, piece: int) -> List[Dict[str, Any]]:
    reader = EventReader()
    out: List[Dict[str, Any]] = []
    buf = bytearray(piece)
    for i in range(0, len(body), piece):
        n = len(body[i:i + piece])
        buf[:n] = body[i:i + piece]  # the reader may not keep the buffer: it is reused
        out += reader.feed(buf, 0, n)
    return out + reader.end()


def test_events_are_json_loads_own_for_any_output_and_any_split() -> None:
    rnd = random.Random(7)
    alphabet = [b"a", b"\n", b'"', b"\\", b"\t", b"\r", b"\x1b", b"\x00", "é".encode(), "😀".encode(),
                b"\xff", b"\xc3", b"}", b'"}', b"\\u00", b'","base64":"']
    lines = []
    for i in range(300):
        raw = b"".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40)))
        if i % 3 == 0:
            raw = b"x" * rnd.randint(1, 5000)
        lines.append(daemon_line(rnd.choice(["stdout", "stderr"]), i * 100, raw))
    lines.append(b'{"type":"exit","exitCode":0,"timedOut":false}')
    lines.insert(5, b"   ")
    body = b"\n".join(lines) + b"\n"
    expected = [json.loads(x) for x in lines if x.strip()]
    for piece in (1, 2, 3, 7, 64, 4096, len(body)):
        assert read_all(body, piece) == expected, piece


def test_a_last_line_without_its_newline_is_read_at_the_end() -> None:
    assert read_all(b'{"type":"stdout","offset":0,"data":"ab"}\n{"type":"exit","exitCode":3}', 5) == [
        {"type": "stdout", "offset": 0, "data": "ab"}, {"type": "exit", "exitCode": 3}]


@pytest.mark.parametrize("line", [b"not json", b"[1, 2]", b'{"type":"stdout","offset":1,"data":"a"'])
def test_a_line_that_is_not_an_event_is_an_error(line: bytes) -> None:
    with pytest.raises(APIConnectionError):
        read_all(line + b"\n", 3)


def test_a_line_without_end_is_bounded() -> None:
    reader = EventReader()
    chunk = b"a" * (1 << 20)
    with pytest.raises(APIConnectionError, match="longer than 16 MiB"):
        for _ in range(17):
            reader.feed(chunk)


def chunked(body: bytes, sizes: List[int]) -> bytes:
    out, i = bytearray(), 0
    for n in sizes:
        if i >= len(body):
            break
        out += b"%x;ext=1\r\n" % len(body[i:i + n]) + body[i:i + n] + b"\r\n"
        i += n
    out += b"%x\r\n" % len(body[i:]) + body[i:] + b"\r\n" if i < len(body) else b""
    return bytes(out + b"0\r\nTrailer: x\r\n\r\n")


def reply_body(raw: bytes, piece: int) -> bytes:
    r = ReplyReader()
    got = bytearray()
    r.on_body = lambda buf, start, end: got.extend(memoryview(buf)[start:end])
    for i in range(0, len(raw), piece):
        r.feed(raw[i:i + piece], 0, len(raw[i:i + piece]))
    assert r.done and r.status == 200
    return bytes(got)


@pytest.mark.parametrize("piece", [1, 2, 5, 100, 1 << 20])
def test_reply_framing_chunked_and_length(piece: int) -> None:
    body = bytes(range(256)) * 40
    head = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Request-Id: r\r\n\r\n"
    assert reply_body(head + chunked(body, [1, 300, 4000, 7]), piece) == body
    assert reply_body(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body + b"extra", piece) == body


@pytest.mark.parametrize("raw", [
    b"SSH-2.0-x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000,
])
def test_a_broken_reply_is_refused(raw: bytes) -> None:
    r = ReplyReader()
    with pytest.raises(ReplyError):
        r.feed(raw, 0, len(raw))


def test_a_reply_cut_short_is_an_error() -> None:
    r = ReplyReader()
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"
    r.feed(raw, 0, len(raw))
    with pytest.raises(ReplyError):
        r.eof()


class Server:
    """One connection at a time on loopback: records the request's head, answers ``reply``."""

    def __init__(self, reply: Callable[[bytes], bytes]) -> None:
        self.reply = reply
        self.heads: List[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.heads.append(data)
                try:
                    conn.sendall(self.reply(data))
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


OUTPUT = [daemon_line("stdout", 0, b"x" * 70000), daemon_line("stderr", 70000, b'line "one"\n\x1b[0m'),
          b'{"type":"exit","exitCode":0}']


def ok_reply(_: bytes) -> bytes:
    body = b"\n".join(OUTPUT) + b"\n"
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(body, [10, 65536, 3])


@pytest.fixture
def server() -> Any:
    s = Server(ok_reply)
    yield s
    s.close()


def endpoint(port: int) -> Endpoint:
    return Endpoint(url=f"http://127.0.0.1:{port}", uds=None, display=f"http://127.0.0.1:{port}")


def test_the_blocking_client_reads_a_stream_on_its_own_connection(server: Server) -> None:
    http = SyncHTTP(endpoint(server.port), KEY)
    assert http._direct
    events = list(Process(http, "sbx_1", {"id": "proc_1"}).output(5))
    assert events[:2] == [json.loads(x) for x in OUTPUT[:2]] and events[2]["exit_code"] == 0
    head = server.heads[-1].decode()
    assert head.startswith("GET /v1/sandboxes/sbx_1/processes/proc_1/output?cursor=5&follow=true HTTP/1.1\r\n")
    assert f"Authorization: Bearer {KEY}\r\n" in head
    http.close()


def test_the_asyncio_client_reads_a_stream_on_its_own_connection(server: Server) -> None:
    async def main() -> List[Dict[str, Any]]:
        http = AsyncHTTP(endpoint(server.port), KEY)
        try:
            return [ev async for ev in AsyncProcess(http, "sbx_1", {"id": "proc_1"}).output()]
        finally:
            await http.aclose()

    events = asyncio.run(main())
    assert events[:2] == [json.loads(x) for x in OUTPUT[:2]] and events[2]["exit_code"] == 0


def error_reply(_: bytes) -> bytes:
    body = json.dumps({"error": {"code": "not_found", "status": 404, "message": "no such process",
                                 "hint": None, "requestId": "req_9"}}).encode()
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\nX-Request-Id: req_9\r\n\r\n" % len(body) + body


def cut_reply(_: bytes) -> bytes:
    return ok_reply(b"")[:300]


def test_errors_of_a_stream_are_the_api_errors_both_ways() -> None:
    for reply, error in ((error_reply, NotFoundError), (cut_reply, APIConnectionError)):
        s = Server(reply)
        try:
            with pytest.raises(error) as e:
                list(Process(SyncHTTP(endpoint(s.port), KEY), "sbx_1", {"id": "p"}).output())
            if error is NotFoundError:
                assert e.value.request_id == "req_9" and e.value.message == "no such process"

            async def main() -> None:
                async for _ in AsyncProcess(AsyncHTTP(endpoint(s.port), KEY), "sbx_1", {"id": "p"}).output():
                    pass

            with pytest.raises(error):
                asyncio.run(main())
        finally:
            s.close()


def test_nothing_listening_is_a_connection_error() -> None:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(APIConnectionError, match="cannot connect"):
        list(Process(SyncHTTP(endpoint(port), KEY), "sbx_1", {"id": "p"}).output())


def test_a_hostile_name_cannot_break_the_request_line(server: Server) -> None:
    http = SyncHTTP(endpoint(server.port), KEY)
    list(Process(http, "sbx_1", {"id": "p 1\r\nX-Evil: 1"}).output())
    head = server.heads[-1].decode()
    assert "X-Evil" not in head.split("\r\n", 1)[1] and "/processes/p%201%0D%0AX-Evil:%201/output" in head
    with pytest.raises(InvalidRequestError):
        with http.stream_events("POST", "/v1/x", json_body={}, headers={"Idempotency-Key": "k\r\nX-Evil: 1"}):
            pass
    assert len(server.heads) == 1  # refused before anything was sent


def test_a_proxy_in_the_environment_sends_streams_through_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:1")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert not SyncHTTP(Endpoint(url="http://10.1.2.3:7878", uds=None, display="x"), KEY)._direct
    monkeypatch.setenv("NO_PROXY", "10.1.2.3")
    assert SyncHTTP(Endpoint(url="http://10.1.2.3:7878", uds=None, display="x"), KEY)._direct


def test_unix_socket_streams(tmp_path: Any) -> None:
    path = str(tmp_path / "d.sock")
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path)
    ls.listen(4)

    def serve() -> None:
        for _ in range(2):
            conn, _ = ls.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(ok_reply(data))

    threading.Thread(target=serve, daemon=True).start()
    ep = Endpoint(url="http://runtimed", uds=path, display=f"unix:{path}")
    assert len(list(Process(SyncHTTP(ep, KEY), "sbx_1", {"id": "p"}).output())) == 3

    async def main() -> int:
        return len([ev async for ev in AsyncProcess(AsyncHTTP(ep, KEY), "sbx_1", {"id": "p"}).output()])

    assert asyncio.run(main()) == 3
    ls.close()


