"""The HTTP edge (docs/api.md, "Connections"): a connection is held without a thread of its own
until its request's head is whole, a head has a time from the connection's start (or the answer
before it) however slowly it trickles, a NUL in a head is a 400 before any header reaches a handler
(libmicrohttpd would cut the value at it), a head too long is a 431, and one owner's requests in
progress are bounded so that its streams never take every connection."""
from __future__ import annotations

import json
import os
import socket
import time
import uuid

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, wait_until

HEAD_S = 2


@pytest.fixture(scope="module")
def edge(build_dir, image_dir, tmp_path_factory):
    """A daemon whose heads have 2 s, and whose owners may have 2 requests in progress."""
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("edge") / "state",
                      f"runtime-test-{os.getpid()}-edge",
                      extra_args=["--http-head-timeout-seconds", str(HEAD_S), "--max-requests-per-owner", "2"])
    yield d
    _finish_daemon(d)


def _connect(d) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    return s


def _read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer with a Content-Length, read whole."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"the connection ended before an answer: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = s.recv(65536)
        assert chunk, "the connection ended inside an answer"
        rest += chunk
    return status, headers, rest[:n]


def _ends_within(s: socket.socket, seconds: float) -> float:
    """Reads until the peer closes; how long that took. Fails if it stays open past `seconds`."""
    t0 = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - t0 < seconds:
        try:
            if not s.recv(4096):
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - t0
    raise AssertionError(f"the connection was still open after {seconds} s")


def _threads(d) -> int:
    return len(os.listdir(f"/proc/{d.proc.pid}/task"))


def test_a_trickled_head_is_closed_at_its_time(edge):
    # A byte every 0.3 s: each read resets an idle timer, never the head's own time.
    s = _connect(edge)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        t0 = time.monotonic()
        closed = False
        s.settimeout(0.3)
        while time.monotonic() - t0 < HEAD_S + 8:
            try:
                s.sendall(b"X")
            except OSError:
                closed = True
                break
            try:
                if not s.recv(4096):
                    closed = True
                    break
            except socket.timeout:
                pass
            except OSError:
                closed = True
                break
        took = time.monotonic() - t0
        assert closed, f"a head trickled for {took:.1f} s and the connection is still open"
        assert took >= HEAD_S - 0.5, f"closed after {took:.1f} s, before its {HEAD_S} s"
    finally:
        s.close()


def test_a_kept_alive_connection_has_the_same_time_for_its_next_head(edge):
    s = _connect(edge)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, _ = _read_answer(s)
        assert status == 200
        # Idle after an answer: closed once the head's time is over (a sweep's 0.5 s later at most).
        took = _ends_within(s, HEAD_S + 5)
        assert took >= HEAD_S - 0.5, took
    finally:
        s.close()
    s = _connect(edge)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_answer(s)[0] == 200
        # The next head begun and trickled: the server's thread for it is let go at the same time.
        s.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        t0 = time.monotonic()
        s.settimeout(0.3)
        while time.monotonic() - t0 < HEAD_S + 8:
            try:
                s.sendall(b"a")
                if not s.recv(4096):
                    break
            except socket.timeout:
                continue
            except OSError:
                break
        else:
            raise AssertionError("a kept-alive connection trickled its next head past its time")
        assert time.monotonic() - t0 < HEAD_S + 8
    finally:
        s.close()
    # A client that is quick is served on one connection as often as it likes.
    s = _connect(edge)
    try:
        for _ in range(5):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_answer(s)[0] == 200
    finally:
        s.close()


@pytest.mark.parametrize("head", [
    b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x00b\r\n\r\n",
    b"GET /v1/sandb\x00oxes HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-\x00: 1\r\n\r\n",
], ids=["value", "target", "name"])
def test_a_nul_in_a_head_is_400(edge, head):
    s = _connect(edge)
    try:
        s.sendall(head)
        status, headers, body = _read_answer(s)
        assert status == 400, body
        err = json.loads(body)["error"]
        assert err["code"] == "invalid_request" and "NUL" in err["message"], err
        assert headers.get("x-request-id", "").startswith("req_"), headers
        _ends_within(s, 5)
    finally:
        s.close()


def test_an_idempotency_key_with_a_nul_never_replays_another(edge):
    # `a\0b` and `a\0c` were both `a` to the server: now neither reaches it.
    with Api(edge) as api:
        for k in (b"a\x00b", b"a\x00c"):
            s = _connect(edge)
            try:
                body = b"{}"
                s.sendall(b"POST /v1/keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                          edge.api_key.encode() + b"\r\nIdempotency-Key: " + k +
                          b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n" + body)
                assert _read_answer(s)[0] == 400
            finally:
                s.close()
        assert api.get("/healthz").status_code == 200


def test_a_head_too_long_is_431(edge):
    s = _connect(edge)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        filler = b"X-Fill: " + b"a" * 4000 + b"\r\n"
        sent = 0
        try:
            while sent < 80 * 1024:
                s.sendall(filler)
                sent += len(filler)
        except OSError:
            pass
        status, _, body = _read_answer(s)
        assert status == 431, body
        assert json.loads(body)["error"]["code"] == "payload_too_large"
    finally:
        s.close()


def test_waiting_connections_hold_no_thread(edge):
    """200 connections that each send half a head: the daemon's threads stay as they were (the
    edge holds them in one thread); a client meanwhile is served; all are closed at their time."""
    with Api(edge) as api:
        assert api.get("/healthz").status_code == 200
        before = _threads(edge)
        socks = []
        try:
            for _ in range(200):
                s = _connect(edge)
                s.sendall(b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                socks.append(s)
            during = _threads(edge)
            assert during <= before + 4, f"{before} threads before 200 waiting connections, {during} with them"
            assert api.get("/healthz").status_code == 200
            for s in socks:
                _ends_within(s, HEAD_S + 5)
        finally:
            for s in socks:
                s.close()


def _owner(d, name: str) -> str:
    with Api(d) as admin:
        r = admin.post("/v1/keys", json={"name": name, "owner": f"{name}-{uuid.uuid4().hex[:8]}"})
        assert r.status_code == 201, r.text
        return r.json()["key"]


def test_one_owners_requests_in_progress_are_bounded(edge, any_driver):
    """Owner A with 2 commands running (its bound here) gets 429 naming its bound; owner B is
    served meanwhile; once A's clients leave, A is served again."""
    key_a, key_b = _owner(edge, "edge-a"), _owner(edge, "edge-b")
    with Api(edge, key=key_a) as a, Api(edge, key=key_b) as b:
        sbx = a.create_sandbox(driver=any_driver, timeoutSeconds=120)
        held: list[socket.socket] = []

        def long_exec() -> socket.socket:
            s = _connect(edge)
            body = json.dumps({"command": "sleep 60"}).encode()
            s.sendall(f"POST /v1/sandboxes/{sbx.id}:exec HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {key_a}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            return s

        def third_refused():
            # A request's share is given back once its answer is sent, a moment after its client
            # has it: a command sent just after the create may itself have been refused. One that
            # was answered is sent again, until two run and a third request is refused.
            for i, s in enumerate(held):
                s.setblocking(False)
                try:
                    s.recv(65536)
                    answered = True
                except BlockingIOError:
                    answered = False
                except OSError:
                    answered = True
                if answered:
                    s.close()
                    held[i] = long_exec()
            r = a.get(f"/v1/sandboxes/{sbx.id}")
            return r if r.status_code == 429 else None

        try:
            held.extend(long_exec() for _ in range(2))
            r = wait_until(third_refused, 30, 0.2, what="owner A's third request refused")
            err = assert_error(r, 429, "rate_limited")
            assert "max-requests-per-owner" in err["message"] and "2" in err["message"], err
            assert b.get("/v1/sandboxes").status_code == 200
            with Api(edge) as admin:
                assert admin.get("/v1/sandboxes").status_code == 200
        finally:
            for s in held:
                s.close()
        # The daemon sees its clients gone, ends their commands, and A has its share back.
        wait_until(lambda: a.get(f"/v1/sandboxes/{sbx.id}").status_code == 200, 30,
                   what="owner A served again")


def _terminal(d, key: str, sid: str) -> socket.socket:
    """A terminal opened; one refused 429 (the request before it not yet given back) is asked
    again, for 10 s at most."""
    import base64
    deadline = time.monotonic() + 10
    while True:
        s = _connect(d)
        wskey = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET /v1/sandboxes/{sid}/terminal?command=sleep%20600 HTTP/1.1\r\nHost: x\r\n"
                   f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {wskey}\r\n"
                   f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {key}\r\n\r\n").encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            chunk = s.recv(1)
            assert chunk, head
            head += chunk
        if head.startswith(b"HTTP/1.1 429") and time.monotonic() < deadline:
            s.close()
            time.sleep(0.1)
            continue
        assert head.startswith(b"HTTP/1.1 101"), head
        return s


def test_open_websockets_count_as_requests_in_progress(edge, any_driver):
    """A terminal is a request in progress while it is open: an owner with 2 open has none left;
    one left past the head's time is not cut (it is no longer HTTP); closing one gives it back."""
    key = _owner(edge, "edge-ws")
    with Api(edge, key=key) as a:
        sbx = a.create_sandbox(driver=any_driver, timeoutSeconds=120)
        t1, t2 = _terminal(edge, key, sbx.id), _terminal(edge, key, sbx.id)
        try:
            assert_error(a.get(f"/v1/sandboxes/{sbx.id}"), 429, "rate_limited")
            t1.settimeout(HEAD_S + 2)
            try:
                data = t1.recv(1)
            except socket.timeout:
                data = None
            assert data != b"", "an open terminal was cut at the head's time"
        finally:
            t1.close()
        try:
            wait_until(lambda: a.get(f"/v1/sandboxes/{sbx.id}").status_code == 200, 30,
                       what="owner A served again once a terminal closed")
        finally:
            t2.close()


@pytest.mark.parametrize("value", [b"a\x00b", b"a\x00\x01b"], ids=["nul", "nul-then-control"])
def test_a_nul_in_a_kept_alive_connections_next_head_is_400(edge, value):
    # The heads after a connection's first are looked at before the server reads them: a NUL
    # there is refused too, and the request is never served.
    s = _connect(edge)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_answer(s)[0] == 200
        s.sendall(b"GET /v1/me HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + edge.api_key.encode() +
                  b"\r\nIdempotency-Key: " + value + b"\r\n\r\n")
        status, _, body = _read_answer(s)
        assert status == 400, body
        assert "NUL" in json.loads(body)["error"]["message"]
        _ends_within(s, 5)
    finally:
        s.close()
    # A head split across many writes on a kept-alive connection still goes through whole.
    s = _connect(edge)
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_answer(s)[0] == 200
        for part in (b"GET /v1/me HTTP/1.1\r\n", b"Host: x\r\n", b"Authorization: Bearer ",
                     edge.api_key.encode(), b"\r\n", b"\r\n"):
            s.sendall(part)
            time.sleep(0.05)
        status, _, body = _read_answer(s)
        assert status == 200, body
    finally:
        s.close()
