"""Local upstream servers for the egress tests, all on 127.0.0.1 in threads.

  EchoServer        plain HTTP; records every request and answers it as JSON
  EchoServer(tls=)  the same over HTTPS with a certificate from a test CA
  PackageIndex      a PyPI-style simple index serving one small wheel

TestCa makes a CA and leaf certificates with the `cryptography` package, so
the daemon can be told to trust the CA (--egress-extra-ca) and a second CA
can stand for an upstream it does not trust.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import io
import json
import ssl
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class TestCa:
    """A certificate authority kept in a directory: ca.crt, and per leaf
    NAME.crt/NAME.key."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, common_name: str):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder()
                     .subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=2))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                                  crl_sign=True, content_commitment=False,
                                                  key_encipherment=False, data_encipherment=False,
                                                  key_agreement=False, encipher_only=False,
                                                  decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.cert_path = self.dir / "ca.crt"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def leaf(self, label: str, names: list[str]) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                .issuer_name(self.cert.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]),
                               critical=False)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        crt, kp = self.dir / f"{label}.crt", self.dir / f"{label}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        kp.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
        kp.chmod(0o600)
        return crt, kp


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Base:
    def __init__(self, handler_cls, tls: tuple[Path, Path] | None = None):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(handler_cls):
            server_ref = outer

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                       daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def record(self, entry: dict) -> None:
        with self.lock:
            self.requests.append(entry)

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()

    def seen(self) -> list[dict]:
        with self.lock:
            return list(self.requests)


class _EchoHandler(BaseHTTPRequestHandler):
    server_ref: "EchoServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(n, 1 << 20)) if n else b""
        entry = {"method": self.command, "path": self.path,
                 "headers": [[k, v] for k, v in self.headers.items()],
                 "body": body.decode("latin-1")}
        self.server_ref.record(entry)
        if self.path.startswith("/bytes/"):
            out = b"x" * min(int(self.path.split("/")[2] or 0), 1 << 24)
            ctype = "application/octet-stream"
        else:
            out = json.dumps(entry).encode()
            ctype = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _answer


class EchoServer(_Base):
    """Records (method, path, headers, body) of each request; answers them as JSON.
    GET /bytes/N answers N bytes."""

    def __init__(self, tls: tuple[Path, Path] | None = None):
        super().__init__(_EchoHandler, tls)


def build_wheel(name: str, version: str) -> tuple[str, bytes]:
    """A minimal pure-Python wheel: a module that prints a marker."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"MARKER = 'hello from {name} {version}'\n".encode(),
        f"{dist}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                             "Summary: egress test package\n").encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: egress-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = io.StringIO()
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{path},sha256={digest},{len(data)}\n")
    record.write(f"{dist}/RECORD,,\n")
    files[f"{dist}/RECORD"] = record.getvalue().encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


class _IndexHandler(BaseHTTPRequestHandler):
    server_ref: "PackageIndex"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _send(self, code: int, body: bytes, ctype: str):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        idx = self.server_ref
        idx.record({"method": "GET", "path": self.path,
                    "headers": [[k, v] for k, v in self.headers.items()]})
        p = self.path.split("?")[0]
        if p in ("/simple/", "/simple"):
            self._send(200, f'<html><body><a href="/simple/{idx.name}/">{idx.name}</a></body></html>'
                       .encode(), "text/html")
        elif p.rstrip("/") == f"/simple/{idx.name}":
            sha = hashlib.sha256(idx.wheel).hexdigest()
            self._send(200, (f'<html><body><a href="/files/{idx.wheel_name}#sha256={sha}">'
                             f'{idx.wheel_name}</a></body></html>').encode(), "text/html")
        elif p == f"/files/{idx.wheel_name}":
            self._send(200, idx.wheel, "application/octet-stream")
        else:
            self._send(404, b"not found", "text/plain")


class PackageIndex(_Base):
    """PEP 503 simple index for one package."""

    def __init__(self, name: str = "rtegressdemo", version: str = "1.0",
                 tls: tuple[Path, Path] | None = None):
        self.name = name
        self.wheel_name, self.wheel = build_wheel(name, version)
        super().__init__(_IndexHandler, tls)
