"""TLS between hosts (docs/fleet.md, "TLS between hosts"): two runtimed on one PostgreSQL on
loopback, each with a certificate of the fleet's CA for 127.0.0.1 and a TLS listener of its own for
the hop. A request sent to the host that does not run the sandbox goes on to the one that does over
TLS: a JSON call, an NDJSON stream, a file both ways and a terminal (a WebSocket). The fleet secret
is refused on the clients' listener once the TLS listener is there, and a request on the TLS
listener needs it; the TLS listener speaks no plain HTTP. A host whose certificate is of another CA,
or names another address, is not reached (503 saying why). Bad files and options stop a host at
its start, saying which."""
from __future__ import annotations

import itertools
import os
import socket
import ssl
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, Daemon, DaemonError, assert_error, free_port, read_until, wait_until
from helpers.tls import fleet_ca as _ca, fleet_host_dir as _host_dir

SECRET = "fleet-" + uuid.uuid4().hex
_N = itertools.count()


def _pair(build_dir, image_dir, tmp_path, postgres, dirs: list[Path]):
    db = f"rt_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {db}")
    secret = tmp_path / "fleet.secret"
    secret.write_text(SECRET + "\n")
    os.chmod(secret, 0o600)
    n = next(_N)
    hosts = []
    try:
        for i, tls in enumerate(dirs):
            state = tmp_path / f"h{i}"
            if hosts:
                state.mkdir()
                for name in ("admin.key", "secrets.key"):
                    (state / name).write_text((hosts[0].state_dir / name).read_text())
                    os.chmod(state / name, 0o600)
            port, preview_port = free_port(), free_port()
            h = _start_daemon(build_dir, image_dir, state, f"runtime-test-{os.getpid()}-tls{n}{i}",
                              extra_args=["--database", postgres.url(db), "--fleet-secret-file", str(secret),
                                          "--host-id", f"tls-{i}", "--host-dead-after-seconds", "3",
                                          "--fleet-tls-dir", str(tls),
                                          "--fleet-listen", f"127.0.0.1:{port}",
                                          "--advertise", f"https://127.0.0.1:{port}",
                                          "--preview-listen", f"127.0.0.1:{preview_port}"])
            h.hop_port, h.db, h.preview_port = port, db, preview_port
            hosts.append(h)
        for h in hosts:
            with Api(h) as c:
                wait_until(lambda: len([x for x in c.get("/v1/hosts").json()["hosts"]
                                        if x["state"] == "live"]) == len(hosts), 20, what="every host live")
        return hosts
    except Exception:
        for h in reversed(hosts):
            _finish_daemon(h)
        raise


def _home(postgres, h, sandbox_id: str) -> str:
    return postgres.psql(f"SELECT host_id FROM sandboxes WHERE id = '{sandbox_id}'", db=h.db).strip()


def _on(postgres, owner, c: Api):
    """A sandbox that host `owner` runs, created through c (creates are placed on either host)."""
    for _ in range(30):
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=120)
        if _home(postgres, owner, sbx.id) == owner.extra_args[owner.extra_args.index("--host-id") + 1]:
            return sbx
        c.delete(f"/v1/sandboxes/{sbx.id}")
    raise AssertionError("no create landed on the host wanted in 30")


@pytest.fixture
def tls_pair(build_dir, image_dir, tmp_path, postgres):
    ca = _ca(tmp_path / "ca")
    dirs = [_host_dir(ca, tmp_path / f"tls{i}", "IP:127.0.0.1") for i in range(2)]
    hosts = _pair(build_dir, image_dir, tmp_path, postgres, dirs)
    yield hosts
    for h in reversed(hosts):
        _finish_daemon(h)


def test_requests_go_on_over_tls(tls_pair, postgres):
    a, b = tls_pair
    with Api(b) as cb:
        sbx = _on(postgres, a, cb)
        try:
            res = cb.exec(sbx.id, command="echo over-$((6*7))")
            assert res["stdout"] == "over-42\n", res
            lines = [e["data"] for _, e in cb.exec_stream(sbx.id, command="echo one; echo two")
                     if e.get("type") == "stdout"]
            assert "".join(lines) == "one\ntwo\n", lines
            # A file both ways, larger than any TLS record or buffer of the hop.
            blob = os.urandom(3 * 1024 * 1024 + 17)
            r = cb.put(f"/v1/sandboxes/{sbx.id}/files/content", params={"path": "/workspace/blob"}, content=blob)
            assert r.status_code in (200, 201, 204), r.text
            r = cb.get(f"/v1/sandboxes/{sbx.id}/files/content", params={"path": "/workspace/blob"})
            assert r.status_code == 200 and r.content == blob
        finally:
            cb.delete(f"/v1/sandboxes/{sbx.id}")


def test_a_terminal_over_tls(tls_pair, postgres, monkeypatch):
    a, b = tls_pair
    with Api(b) as cb:
        sbx = _on(postgres, a, cb)
    monkeypatch.setenv("RUNTIME_BASE_URL", b.base_url)
    monkeypatch.setenv("RUNTIME_API_KEY", b.api_key)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
    from withruntime import Sandbox
    try:
        with Sandbox.connect(sbx.id) as s:
            with s.terminal(cols=90, rows=20) as term:
                term.write("stty size; echo FROM-$((40+2))\n")
                out = read_until(term, b"FROM-42", 30)
                assert b"20 90" in out
    finally:
        with Api(b) as cb:
            cb.delete(f"/v1/sandboxes/{sbx.id}")


def test_a_preview_relayed_over_tls(tls_pair, postgres):
    """A preview request to the host that does not run the sandbox is relayed over the TLS hop
    (the owner's upgraded connection is TLS's): a page and a WebSocket echo."""
    from test_previews import name_of, start_app, websocket_echo
    a, b = tls_pair
    with Api(b) as cb:
        sbx = _on(postgres, a, cb)
        try:
            start_app(cb, sbx.id, 8000)
            tok = cb.post(f"/v1/sandboxes/{sbx.id}/previews", json={"port": 8000}).json()["token"]
            with httpx.Client(timeout=30) as c:
                r = c.get(f"http://127.0.0.1:{b.preview_port}/",
                          headers={"Host": name_of(sbx.id), "x-runtime-preview-token": tok})
            assert r.status_code == 200 and "hello from the sandbox" in r.text, r.text
            websocket_echo(b, name_of(sbx.id), f"x-runtime-preview-token: {tok}\r\n")
        finally:
            cb.delete(f"/v1/sandboxes/{sbx.id}")


def test_the_secret_is_refused_in_the_clear_and_needed_on_tls(tls_pair):
    a, _ = tls_pair
    # The clients' listener: the secret is never taken there.
    r = httpx.get(a.base_url + "/v1/sandboxes", headers={"Runtime-Fleet-Secret": SECRET,
                                                         "Authorization": f"Bearer {a.api_key}"})
    assert_error(r, 403, "forbidden")
    assert "TLS" in r.json()["error"]["message"]
    # The TLS listener: a client's key alone is refused.
    ctx = ssl.create_default_context(cafile=str(Path(a.extra_args[a.extra_args.index("--fleet-tls-dir") + 1])
                                                / "ca.pem"))
    r = httpx.get(f"https://127.0.0.1:{a.hop_port}/v1/sandboxes", verify=ctx,
                  headers={"Authorization": f"Bearer {a.api_key}"})
    assert_error(r, 403, "forbidden")
    # With the secret it serves (as a hop from another host would be).
    r = httpx.get(f"https://127.0.0.1:{a.hop_port}/v1/sandboxes", verify=ctx,
                  headers={"Authorization": f"Bearer {a.api_key}", "Runtime-Fleet-Secret": SECRET,
                           "Runtime-Forwarded-By": "test"})
    assert r.status_code == 200, r.text
    # Plain HTTP to the TLS listener gets no HTTP answer.
    with socket.create_connection(("127.0.0.1", a.hop_port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    assert not got.startswith(b"HTTP/"), got[:100]


@pytest.mark.parametrize("wrong", ["another CA", "another address"])
def test_a_host_whose_certificate_is_wrong_is_not_reached(build_dir, image_dir, tmp_path, postgres, wrong):
    ca = _ca(tmp_path / "ca")
    good = _host_dir(ca, tmp_path / "tls0", "IP:127.0.0.1")
    if wrong == "another CA":
        other = _ca(tmp_path / "other-ca")
        # Host 1's certificate is the other CA's (it trusts that CA itself, so it starts).
        bad = _host_dir(other, tmp_path / "tls1", "IP:127.0.0.1")
    else:
        bad = _host_dir(ca, tmp_path / "tls1", "IP:127.0.0.2")
    a, b = _pair(build_dir, image_dir, tmp_path, postgres, [good, bad])
    try:
        with Api(a) as ca_, Api(b) as cb:
            sbx = _on(postgres, b, cb)
            try:
                r = ca_.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "true"})
                assert_error(r, 503, "host_unavailable")
                assert "certificate is refused" in r.json()["error"]["message"], r.text
            finally:
                cb.delete(f"/v1/sandboxes/{sbx.id}")
    finally:
        _finish_daemon(b)
        _finish_daemon(a)


def _refused(build_dir, image_dir, tmp_path, args: list[str], why: str) -> None:
    tmp_path.mkdir(parents=True, exist_ok=True)
    d = Daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-tlsbad{next(_N)}",
               extra_args=args)
    with pytest.raises(DaemonError) as e:
        d.start()
    assert why in str(e.value), str(e.value)[-2000:]


def test_bad_files_and_options_stop_a_host_at_its_start(build_dir, image_dir, tmp_path):
    ca = _ca(tmp_path / "ca")
    tls = _host_dir(ca, tmp_path / "tls", "IP:127.0.0.1")
    port = free_port()
    (tmp_path / "fleet.secret").write_text(SECRET + "\n")
    os.chmod(tmp_path / "fleet.secret", 0o600)
    secret = ["--fleet-secret-file", str(tmp_path / "fleet.secret")]
    good = ["--fleet-tls-dir", str(tls), "--fleet-listen", f"127.0.0.1:{port}",
            "--advertise", f"https://127.0.0.1:{port}"]
    cases = [
        (good[:2] + secret + good[4:], "--fleet-tls-dir and --fleet-listen go together"),
        (good, "needs --fleet-secret-file"),
        (secret + good[:4] + ["--advertise", f"http://127.0.0.1:{port}"], "must be an https:// URL"),
        (secret + ["--advertise", f"https://127.0.0.1:{port}"], "an https:// URL needs --fleet-tls-dir"),
    ]
    for i, (args, why) in enumerate(cases):
        _refused(build_dir, image_dir, tmp_path / f"c{i}", args, why)
    # A key others may read; a key that is not the certificate's.
    os.chmod(tls / "key.pem", 0o644)
    _refused(build_dir, image_dir, tmp_path / "k1", secret + good, "key.pem is not runtimed's user's with mode 0600")
    os.chmod(tls / "key.pem", 0o600)
    other = _host_dir(ca, tmp_path / "other", "IP:127.0.0.1")
    (tls / "key.pem").write_text((other / "key.pem").read_text())
    _refused(build_dir, image_dir, tmp_path / "k2", secret + good, "key.pem is not cert.pem's key")
    (tls / "ca.pem").write_text("not a certificate\n")
    (tls / "key.pem").write_text((other / "key.pem").read_text())
    (tls / "cert.pem").write_text((other / "cert.pem").read_text())
    _refused(build_dir, image_dir, tmp_path / "k3", secret + good, "ca.pem holds no CA certificate")


def test_the_tls_hop_keeps_its_connection_alive(tls_pair, postgres):
    # One TLS connection (one handshake) carries calls through b one after another.
    from helpers.fleet import hop_ports
    a, b = tls_pair
    with Api(b) as cb:
        sbx = _on(postgres, a, cb)
        try:
            seen = set()
            for _ in range(5):
                assert cb.exec(sbx.id, command="true")["exitCode"] == 0
                seen |= hop_ports(a.hop_port)
            assert len(seen) == 1, seen
        finally:
            cb.delete(f"/v1/sandboxes/{sbx.id}")
