"""The process's connection pool (_pool.py) and what a first call costs: sandboxes share one pool
and its keep-alive connections, an http:// daemon never makes an SSL context, an https one makes
one per process, and ``import withruntime`` leaves httpx, asyncio, ssl and llama_index unloaded
until they are used. A keep-alive HTTP/1.1 server on loopback stands in for the daemon."""

from __future__ import annotations

import asyncio
import io
import json
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from fakedaemon import KEY

from withruntime import AsyncSandbox, NotFoundError, Sandbox
from withruntime import _pool, _stream
from withruntime._config import Endpoint
from withruntime._http import AsyncHTTP, SyncHTTP

SRC = Path(__file__).resolve().parents[1] / "src"

Reply = Tuple[int, Dict[str, str], bytes]


class KeepAliveServer:
    """Serves many requests per connection until the client closes it (or ``close_after``
    replies, without saying so). Records each request as (method, target, headers, body) and
    how many connections were accepted and are open."""

    def __init__(self, handler: Optional[Callable[[str, str, bytes], Reply]] = None, close_after: int = 0,
                 tls: Any = None) -> None:
        self.handler = handler or sandbox_api
        self.close_after = close_after
        self.tls = tls  # a server-side ssl.SSLContext, or None for plain HTTP
        self.requests: List[Tuple[str, str, Dict[str, str], bytes]] = []
        self.accepted = 0
        self.open = 0
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> Endpoint:
        url = f"https://localhost:{self.port}" if self.tls else f"http://127.0.0.1:{self.port}"
        return Endpoint(url=url, uds=None, display=url)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.open += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                with self.lock:
                    self.open -= 1
                return
        f = conn.makefile("rb")
        served = 0
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                method, target, _ = line.decode().split(" ", 2)
                headers: Dict[str, str] = {}
                while True:
                    h = f.readline().decode().rstrip("\r\n")
                    if not h:
                        break
                    k, _, v = h.partition(":")
                    headers[k.strip().lower()] = v.strip()
                if headers.get("transfer-encoding") == "chunked":
                    body = b""
                    while True:
                        size = int(f.readline().strip(), 16)
                        if size == 0:
                            f.readline()
                            break
                        body += f.read(size)
                        f.readline()
                else:
                    body = f.read(int(headers.get("content-length", "0")))
                self.requests.append((method, target, headers, body))
                status, extra, out = self.handler(method, target, body)
                head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(out)}\r\n"
                head += "".join(f"{k}: {v}\r\n" for k, v in extra.items())
                conn.sendall(head.encode() + b"\r\n" + out)
                served += 1
                if self.close_after and served >= self.close_after:
                    return
        except (OSError, ValueError):
            return
        finally:
            f.close()
            conn.close()
            with self.lock:
                self.open -= 1

    def close(self) -> None:
        self.sock.close()


def sandbox_api(method: str, target: str, body: bytes) -> Reply:
    if method == "POST" and target == "/v1/sandboxes":
        return 201, {}, json.dumps({"id": "sbx_1", "state": "running"}).encode()
    if method == "POST" and target.endswith(":exec"):
        return 200, {}, json.dumps({"exitCode": 0, "stdout": "", "stderr": ""}).encode()
    if method == "DELETE":
        return 200, {}, json.dumps({"id": "sbx_1", "state": "deleted"}).encode()
    if method == "PUT":
        return 200, {}, json.dumps({"path": "/workspace/f", "bytes": len(body)}).encode()
    if method == "GET" and target.startswith("/v1/sandboxes/sbx_1/files/content"):
        return 200, {}, b"\x00\x01raw"
    err = {"error": {"code": "not_found", "status": 404, "message": "no such thing", "requestId": "req_7"}}
    return 404, {"X-Request-Id": "req_7"}, json.dumps(err).encode()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Any:
    s = KeepAliveServer()
    monkeypatch.setenv("RUNTIME_BASE_URL", s.endpoint.url)
    yield s
    s.close()


def wait_for(pred: Callable[[], bool], what: str) -> None:
    done = threading.Event()
    for _ in range(500):
        if pred():
            return
        done.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_twenty_sandboxes_share_one_pool_and_one_connection(server: KeepAliveServer) -> None:
    boxes = [Sandbox.create() for _ in range(20)]
    assert len({id(b._http._pool) for b in boxes}) == 1
    for b in boxes:
        assert b.exec("true").exit_code == 0
    assert server.accepted == 1 and len(server.requests) == 40
    assert all(r[2]["connection"] == "keep-alive" and r[2]["authorization"] == f"Bearer {KEY}"
               for r in server.requests)
    for b in boxes:
        b.delete()
        b.close()
    # The last user's close closes the idle connection.
    wait_for(lambda: server.open == 0, "the idle connection to close")
    assert boxes[0]._http._pool.idle_count() == 0


def test_threads_get_connections_of_their_own(server: KeepAliveServer) -> None:
    sbx = Sandbox.create()
    errors: List[BaseException] = []

    def work() -> None:
        try:
            for _ in range(10):
                assert sbx.exec("true").exit_code == 0
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(server.requests) == 41
    assert 1 <= server.accepted <= 5
    sbx.close()


def test_a_connection_the_daemon_closed_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    s = KeepAliveServer(close_after=1)  # closes after each reply without saying so
    try:
        http = SyncHTTP(s.endpoint, KEY)
        for _ in range(3):
            wait_for(lambda: s.open == 0, "the server to close its end")
            assert http.request("POST", "/v1/sandboxes", json_body={})["id"] == "sbx_1"
        assert s.accepted == 3
        http.close()
    finally:
        s.close()


def test_errors_bodies_and_uploads_over_the_pool(server: KeepAliveServer) -> None:
    sbx = Sandbox.create()
    with pytest.raises(NotFoundError) as e:
        sbx.files.list("/nowhere")
    assert e.value.request_id == "req_7" and e.value.message == "no such thing"
    assert sbx.files.read("/workspace/f") == b"\x00\x01raw"
    sbx.files.write("/workspace/f", b"x" * 3000)
    assert server.requests[-1][3] == b"x" * 3000 and server.requests[-1][2]["content-length"] == "3000"
    sbx.files.write("/workspace/f", io.BytesIO(b"y" * (3 * 1024 * 1024 + 5)))  # chunked, length unknown
    assert server.requests[-1][2]["transfer-encoding"] == "chunked"
    assert server.requests[-1][3] == b"y" * (3 * 1024 * 1024 + 5)
    sbx.close()
    assert server.accepted == 1


def first_reads(sizes: List[int]) -> List[bytes]:
    """What a server's first read of each request held, for requests whose JSON bodies are about
    ``sizes`` bytes, made by the blocking and then by the asyncio client: the server reads once,
    after the connection is readable, as the daemon does, then reads the rest and answers."""
    srv = socket.create_server(("127.0.0.1", 0))
    first: List[bytes] = []

    def serve() -> None:
        for _ in range(2 * len(sizes)):
            conn, _ = srv.accept()
            with conn:
                select.select([conn], [], [], 10)
                data = conn.recv(1 << 20)
                first.append(data)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(h.split(b":")[1] for h in head.split(b"\r\n")
                                  if h.lower().startswith(b"content-length:")))
                while len(body) < length:
                    body += conn.recv(1 << 20)
                out = b'{"exitCode": 0}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(out) + out)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    endpoint = Endpoint(f"http://127.0.0.1:{srv.getsockname()[1]}", None, "x")
    http = SyncHTTP(endpoint, KEY)
    for n in sizes:
        http.request("POST", "/v1/sandboxes/sbx_1:exec", json_body={"argv": ["x" * n]})
    http.close()

    async def main() -> None:
        ahttp = AsyncHTTP(endpoint, KEY)
        for n in sizes:
            await ahttp.request("POST", "/v1/sandboxes/sbx_1:exec", json_body={"argv": ["x" * n]})
        await ahttp.close()

    asyncio.run(main())
    t.join(10)
    srv.close()
    return first


def test_a_small_request_is_one_write() -> None:
    """A request whose body is small goes out in one write with its head, so the daemon reads it
    whole at one wake; a large body goes after the head, not copied behind it."""
    small, large = 100, 200 * 1024
    reads = first_reads([small, large])
    assert len(reads) == 4
    for data in (reads[0], reads[2]):
        assert data.startswith(b"POST /v1/sandboxes/sbx_1:exec HTTP/1.1\r\n")
        assert data.endswith(json.dumps({"argv": ["x" * small]}, separators=(",", ":")).encode())
    for data in (reads[1], reads[3]):  # answered: the rest was read after the first read
        assert data.startswith(b"POST /v1/sandboxes/sbx_1:exec HTTP/1.1\r\n")


def test_nothing_listening_is_a_connection_error() -> None:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    from withruntime import APIConnectionError

    with pytest.raises(APIConnectionError, match="cannot connect"):
        SyncHTTP(Endpoint(f"http://127.0.0.1:{port}", None, "x"), KEY).request("GET", "/v1/me")


def test_asyncio_sandboxes_share_one_pool(server: KeepAliveServer) -> None:
    async def main() -> List[Any]:
        boxes = [await AsyncSandbox.create() for _ in range(20)]
        for b in boxes:
            assert (await b.exec("true")).exit_code == 0
        pools = {id(b._http._pool) for b in boxes}
        for b in boxes:
            await b.delete()
            await b.close()
        return [pools]

    (pools,) = asyncio.run(main())
    assert len(pools) == 1
    assert server.accepted == 1 and len(server.requests) == 60
    wait_for(lambda: server.open == 0, "the idle connection to close")


def test_one_pool_per_address_and_a_new_one_after_fork(server: KeepAliveServer) -> None:
    a = _pool.pool_for(server.endpoint, is_async=False)
    assert _pool.pool_for(server.endpoint, is_async=False) is a
    assert _pool.pool_for(server.endpoint, is_async=True) is not a
    other = Endpoint("http://127.0.0.1:1", None, "x")
    assert _pool.pool_for(other, is_async=False) is not a
    a.pid = -1  # as a child made by fork sees its parent's pool
    assert _pool.pool_for(server.endpoint, is_async=False) is not a


def run_fresh(code: str, env: Optional[Dict[str, str]] = None) -> str:
    """Runs code in a new interpreter that imports this tree's SDK; its stdout."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    full.update(env or {})
    full["PYTHONPATH"] = str(SRC)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


HEAVY = ("httpx", "httpcore", "asyncio", "ssl", "llama_index", "certifi", "urllib.request", "http.client",
         "websockets", "pathlib")
# The SDK's own modules that a first create, exec and delete of the blocking client never needs.
OPTIONAL = ("withruntime.async_sandbox", "withruntime.interpreter", "withruntime.tools",
            "withruntime._interpreter_tool", "withruntime._terminal", "withruntime._tunnel", "withruntime._ws",
            "withruntime.webhooks")


def test_import_leaves_the_heavy_modules_unloaded() -> None:
    # Measured against what the interpreter had already loaded (a site hook may load certifi).
    out = run_fresh("import sys, json; before = set(sys.modules); import withruntime; "
                    f"print(json.dumps([m for m in {HEAVY + OPTIONAL!r} if m in sys.modules and m not in before]))")
    assert json.loads(out) == []


def test_every_public_name_resolves() -> None:
    code = """
import sys, json, withruntime
from withruntime import Sandbox, AsyncSandbox, Terminal, AsyncPortForward
from withruntime.client import Runtime, AsyncRuntime
names = [n for n in withruntime.__all__ if getattr(withruntime, n, None) is None]
print(json.dumps({"missing": names, "dir": sorted(set(withruntime.__all__) - set(dir(withruntime))),
                  "asyncio": "asyncio" in sys.modules, "same": AsyncRuntime is withruntime.AsyncRuntime}))
"""
    out = json.loads(run_fresh(code))
    assert out == {"missing": [], "dir": [], "asyncio": True, "same": True}
    with pytest.raises(AttributeError):
        import withruntime

        withruntime.NoSuchName  # noqa: B018


def test_an_http_daemon_never_makes_an_ssl_context(server: KeepAliveServer, tmp_path: Path) -> None:
    # The key comes from the daemon's key file, as on the daemon's own machine.
    (tmp_path / "admin.key").write_text(KEY + "\n")
    code = f"""
import sys, json
before = set(sys.modules)
from withruntime import Sandbox
for _ in range(3):
    with Sandbox.create() as sbx:
        sbx.exec(["true"])
print(json.dumps([m for m in {HEAVY + OPTIONAL!r} if m in sys.modules and m not in before]))
"""
    out = run_fresh(code, {"RUNTIME_BASE_URL": server.endpoint.url, "RUNTIME_STATE_DIR": str(tmp_path)})
    assert json.loads(out) == []
    # Each block's end closed the last user of the pool, and with it the idle connection.
    assert server.accepted == 3 and len(server.requests) == 9


def test_https_makes_one_ssl_context_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    made: List[Any] = []
    real = httpx.create_ssl_context

    def counting(*a: Any, **kw: Any) -> Any:
        made.append(real(*a, **kw))
        return made[-1]

    monkeypatch.setattr(httpx, "create_ssl_context", counting)
    monkeypatch.setattr(_stream, "_tls", [])
    first = _stream.tls_context()
    assert _stream.tls_context() is first and len(made) == 1
    # Behind a proxy (httpx's path), an https daemon's client uses the same context.
    ep = Endpoint("https://runtime.example:7878", None, "https://runtime.example:7878")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")
    http = SyncHTTP(ep, KEY)
    assert not http._direct
    assert http._client is not None and len(made) == 1
    http.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_of_fork_never_uses_its_parents_connections(server: KeepAliveServer) -> None:
    sbx = Sandbox.create()
    assert server.accepted == 1
    pid = os.fork()
    if pid == 0:  # the child: its request goes on a connection of its own
        code = 0
        try:
            sbx.exec("true")
            code = 0 if sbx._http._pool.pid == os.getpid() else 3
        except BaseException:  # noqa: BLE001
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert server.accepted == 2
    assert sbx.exec("true").exit_code == 0  # the parent's connection still works
    assert server.accepted == 2
    sbx.close()


@pytest.fixture
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A keep-alive server over TLS with a certificate for localhost that SSL_CERT_FILE trusts,
    and the process's SSL context cleared so that the test makes it."""
    import shutil
    import ssl

    if not shutil.which("openssl"):
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                        "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {r.stderr[-300:]}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.setattr(_stream, "_tls", [])
    s = KeepAliveServer(tls=ctx)
    monkeypatch.setenv("RUNTIME_BASE_URL", s.endpoint.url)
    yield s
    s.close()


def test_https_requests_share_one_context_and_one_connection(tls_server: KeepAliveServer) -> None:
    boxes = [Sandbox.create() for _ in range(5)]
    for b in boxes:
        assert b.exec("true").exit_code == 0

    async def main() -> None:
        async with AsyncSandbox.create() as sbx:
            assert (await sbx.exec("true")).exit_code == 0
            assert (await sbx.exec("true")).exit_code == 0

    asyncio.run(main())
    assert len(_stream._tls) == 1
    # One connection for the blocking sandboxes, one for the asyncio one.
    assert tls_server.accepted == 2 and len(tls_server.requests) == 10 + 4
    for b in boxes:
        b.close()
