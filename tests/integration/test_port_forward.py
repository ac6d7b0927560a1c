"""Port forwarding: forward_port() reaches a TCP server listening inside the sandbox over the
tunnel WebSocket, through our SDK (sync and async) and raw frames, on every driver (the emulated
microVM runs the marked subset): an HTTP GET of a file served by `python3 -m http.server`, many
concurrent connections, uploads with flow control, a port nothing listens on, the local listener
on loopback only, and the attacks: frames that are not the protocol, data past the window, no key."""
from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import socket
import struct
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from withruntime import AsyncSandbox, Sandbox  # noqa: E402

from test_terminals import _connect, _frame, _read_frames  # noqa: E402

# A server inside that answers each connection with the sha256 of all it read, so an upload's
# every byte is checked; "hold" connections are accepted and never read.
HASH_SERVER = r"""
import hashlib, socket, sys, threading, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1]))); srv.listen(64)
print("LISTENING", flush=True)
def serve(c):
    first = c.recv(4)
    if first == b"hold":
        time.sleep(600)
    h = hashlib.sha256(first)
    while True:
        b = c.recv(65536)
        if not b:
            break
        h.update(b)
    c.sendall(h.hexdigest().encode()); c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


@pytest.fixture
def sdk(daemon, monkeypatch):
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    return daemon


@pytest.fixture
def sbx(sdk, sandbox):
    with Sandbox.connect(sandbox.id) as s:
        yield s


def bound(driver: str) -> float:
    return 240.0 if driver == "microvm" else 60.0


def serve(sbx, driver, command: str, port: int) -> None:
    """Starts a server in the sandbox and waits until its port accepts connections."""
    p = sbx.spawn(command)
    deadline = time.monotonic() + bound(driver)
    probe = f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2).close()'"
    while sbx.exec(probe, timeout_ms=int(bound(driver) * 1000)).exit_code != 0:
        p.refresh()
        assert p.state == "running", f"the server ended: {p.info}"
        assert time.monotonic() < deadline, f"nothing listens on {port} in the sandbox"
        time.sleep(0.2)


@pytest.mark.microvm_subset
def test_http_get_through_forward_port(sbx, driver):
    sbx.exec("mkdir -p /workspace/www && head -c 3000000 /dev/urandom > /workspace/www/blob")
    want = sbx.files.read("/workspace/www/blob")
    serve(sbx, driver, "cd /workspace/www && exec python3 -m http.server 8000 --bind 127.0.0.1", 8000)
    with sbx.forward_port(8000, local_port=0) as fwd:
        assert fwd.host == "127.0.0.1" and fwd.local_port > 0
        body = urllib.request.urlopen(f"http://127.0.0.1:{fwd.local_port}/blob", timeout=bound(driver)).read()
        assert body == want


def test_many_concurrent_connections_and_uploads(sbx, driver):
    serve(sbx, driver, f"exec python3 -c '{HASH_SERVER}' 9000", 9000)
    payloads = [os.urandom(1 + i * 97_003) for i in range(24)]  # up to 2.2 MB each

    def one(data: bytes, port: int) -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=bound(driver)) as c:
            c.sendall(data)
            c.shutdown(socket.SHUT_WR)
            out = b""
            while True:
                b = c.recv(65536)
                if not b:
                    return out.decode()
                out += b

    with sbx.forward_port(9000, local_port=0) as fwd:
        with concurrent.futures.ThreadPoolExecutor(12) as ex:
            got = list(ex.map(lambda d: one(d, fwd.local_port), payloads))
    assert got == [hashlib.sha256(d).hexdigest() for d in payloads]


# A server that speaks first: 2 MB to every connection the moment it is accepted, then closes.
SPEAKER = r"""
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1]))); srv.listen(64)
def speak(c):
    c.sendall(bytes(range(256)) * 8192); c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=speak, args=(c,), daemon=True).start()
"""


def test_a_server_that_speaks_first_loses_nothing(sbx, sdk, sandbox, driver):
    """Data right behind the open's answer reaches the client whole, sync and async."""
    serve(sbx, driver, f"exec python3 -c '{SPEAKER}' 9004", 9004)
    want = bytes(range(256)) * 8192

    def one(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=bound(driver)) as c:
            out = b""
            while chunk := c.recv(1 << 16):
                out += chunk
            return out

    with sbx.forward_port(9004, local_port=0) as fwd:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda _: one(fwd.local_port), range(16)))
    assert [len(g) for g in got] == [len(want)] * 16 and all(g == want for g in got)

    async def go() -> list[bytes]:
        async with await AsyncSandbox.connect(sandbox.id) as a:
            async with await a.forward_port(9004, local_port=0) as fwd:
                async def read_all() -> bytes:
                    reader, writer = await asyncio.open_connection("127.0.0.1", fwd.local_port)
                    data = await asyncio.wait_for(reader.read(), bound(driver))
                    writer.close()
                    return data
                return await asyncio.gather(*(read_all() for _ in range(8)))
    assert all(g == want for g in asyncio.run(go()))


def test_a_port_nothing_listens_on_is_refused_cleanly(sbx, driver):
    with sbx.forward_port(8999, local_port=0) as fwd:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", fwd.local_port), timeout=bound(driver)) as c:
                c.settimeout(bound(driver))
                try:
                    assert c.recv(1) == b""
                except ConnectionResetError:
                    pass
        # The tunnel itself goes on: a server started now is reached through it.
        serve(sbx, driver, "exec python3 -m http.server 8999 --bind 127.0.0.1", 8999)
        r = urllib.request.urlopen(f"http://127.0.0.1:{fwd.local_port}/", timeout=bound(driver))
        assert r.status == 200


def test_async_forward_port(sdk, sandbox, driver):
    with Sandbox.connect(sandbox.id) as s:
        serve(s, driver, f"exec python3 -c '{HASH_SERVER}' 9001", 9001)

    async def go() -> str:
        async with await AsyncSandbox.connect(sandbox.id) as a:
            async with await a.forward_port(9001, local_port=0) as fwd:
                reader, writer = await asyncio.open_connection("127.0.0.1", fwd.local_port)
                writer.write(b"hello async")
                writer.write_eof()
                out = await asyncio.wait_for(reader.read(), bound(driver))
                writer.close()
                return out.decode()
    assert asyncio.run(go()) == hashlib.sha256(b"hello async").hexdigest()


def test_forward_port_refusals(sbx, sdk):
    with pytest.raises(ValueError):
        sbx.forward_port(0)
    with pytest.raises(ValueError):
        sbx.forward_port(70000)
    s, head = _connect(sdk, "/v1/sandboxes/sbx_00000000000000000000/tunnel")
    frames = _read_frames(s, 30)
    s.close()
    err = json.loads([p for op, p in frames if op == 0x1][0])
    assert err["type"] == "error" and err["error"]["code"] == "not_found"


def _open_tunnel(sdk, sid):
    s, head = _connect(sdk, f"/v1/sandboxes/{sid}/tunnel")
    assert b" 101 " in head.split(b"\r\n", 1)[0], head
    s.settimeout(60)
    return s


def test_raw_frames_that_are_not_the_protocol_close_the_tunnel(sdk, sbx, sandbox, driver):
    for bad in (b"x\x00\x00\x00\x01", b"o\x00\x00\x00\x01tcp 0", b"o\x00\x00\x00\x00tcp 80",
                b"a\x00\x00\x00\x01" + struct.pack("!Q", 1), b"e\x00\x00\x00\x01extra", b"abc"):
        s = _open_tunnel(sdk, sandbox.id)
        s.sendall(_frame(0x2, bad))
        frames = _read_frames(s, bound(driver))
        s.close()
        assert frames[-1][0] == 0x8 and struct.unpack("!H", frames[-1][1][:2])[0] == 1002, (bad, frames)
    # An over-long message closes it as too big.
    s = _open_tunnel(sdk, sandbox.id)
    s.sendall(_frame(0x2, b"d\x00\x00\x00\x01" + b"x" * (64 * 1024 + 1)))
    frames = _read_frames(s, bound(driver))
    s.close()
    assert struct.unpack("!H", frames[-1][1][:2])[0] == 1009


def test_data_past_the_window_closes_the_tunnel(sdk, sbx, sandbox, driver):
    serve(sbx, driver, f"exec python3 -c '{HASH_SERVER}' 9002", 9002)
    s = _open_tunnel(sdk, sandbox.id)
    s.sendall(_frame(0x2, b"o\x00\x00\x00\x07tcp 9002"))
    frames = []
    while not any(op == 0x2 and p[:1] == b"o" for op, p in frames):
        frames += _read_frames_some(s)
    # The program inside reads nothing; the client ignores every credit.
    s.sendall(_frame(0x2, b"d\x00\x00\x00\x07hold"))
    chunk = _frame(0x2, b"d\x00\x00\x00\x07" + b"y" * 60000)
    closed = False
    try:
        for _ in range(200):  # 12 MB, far past the 2 MiB a client may have waiting
            s.sendall(chunk)
    except OSError:
        closed = True
    if not closed:
        frames = _read_frames(s, bound(driver))
        assert frames[-1][0] == 0x8 and struct.unpack("!H", frames[-1][1][:2])[0] == 1002, frames[-3:]
    s.close()
    # The daemon serves the next tunnel.
    with sbx.forward_port(9002, local_port=0) as fwd:
        with socket.create_connection(("127.0.0.1", fwd.local_port), timeout=bound(driver)) as c:
            c.sendall(b"ok")
            c.shutdown(socket.SHUT_WR)
            assert c.recv(100).decode() == hashlib.sha256(b"ok").hexdigest()


def _read_frames_some(s: socket.socket) -> list[tuple[int, bytes]]:
    head = s.recv(2)
    n, extra = head[1] & 0x7F, b""
    if n == 126:
        n = struct.unpack("!H", _recv_exact(s, 2))[0]
    elif n == 127:
        n = struct.unpack("!Q", _recv_exact(s, 8))[0]
    return [(head[0] & 0x0F, _recv_exact(s, n))]


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            raise ConnectionError("closed")
        out += b
    return out


def test_tunnel_needs_the_key(sdk, sandbox):
    s, head = _connect(sdk, f"/v1/sandboxes/{sandbox.id}/tunnel", key="rt_" + "1" * 40)
    s.close()
    assert b" 401 " in head.split(b"\r\n", 1)[0], head


def test_cli_port_forward(sdk, build_dir, sbx, sandbox, driver):
    import signal
    import subprocess
    serve(sbx, driver, f"exec python3 -c '{HASH_SERVER}' 9003", 9003)
    env = {**os.environ, **sdk.env()}
    p = subprocess.Popen([str(build_dir / "runtime"), "sandbox", "port-forward", sandbox.id, "0:9003"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("Forwarding 127.0.0.1:"), (line, p.stderr.read() if p.poll() is not None else "")
        port = int(line.split()[1].rsplit(":", 1)[1])
        data = [os.urandom(300_000 * (i + 1)) for i in range(6)]

        def one(d: bytes) -> str:
            with socket.create_connection(("127.0.0.1", port), timeout=bound(driver)) as c:
                c.sendall(d)
                c.shutdown(socket.SHUT_WR)
                out = b""
                while chunk := c.recv(65536):
                    out += chunk
                return out.decode()
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            assert list(ex.map(one, data)) == [hashlib.sha256(d).hexdigest() for d in data]
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    bad = subprocess.run([str(build_dir / "runtime"), "sandbox", "port-forward", sandbox.id, "70000"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "REMOTE" in bad.stderr
