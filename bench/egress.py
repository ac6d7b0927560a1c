#!/usr/bin/env python3
"""Egress proxy overhead on loopback: requests per second and added latency
through the sandbox's relay and the daemon's proxy, against the same client
talking to the same server directly from the host.

    sudo python3 bench/egress.py                 # writes the egress section of docs/benchmarks.md
    sudo python3 bench/egress.py --quick --out -  # fewer requests, print the section

Three kinds of request, each on a fresh connection (the proxy carries one
plain-HTTP request per connection, and a tunnel per CONNECT):
  plain HTTP      GET http://echo.test/ in absolute form through the proxy
  CONNECT tunnel  TLS to tunnel.test:443 through a CONNECT tunnel, untouched
  intercepted     TLS to api.test:443 with a secret for api.test: the proxy ends
                  the client's TLS with a minted certificate, replaces the
                  placeholder, and opens its own verified TLS upstream
The upstream is a local threaded HTTP(S) server; test names are mapped to it
with --egress-test-upstream, so no traffic leaves the machine. Needs root, a
built tree (it runs `make`), the default image, httpx and cryptography.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from _harness import bench_daemon, options, pct, prepare  # first: puts tests/integration on the path
from egress_servers import EchoServer, TestCa
from helpers import Api
from sections import emit

BEGIN = "<!-- egress benchmark: begin (bench/egress.py) -->"
END = "<!-- egress benchmark: end -->"

# The client runs the same on the host and in the sandbox: raw sockets, so
# that what is timed is the connection, the proxy and the server, not a
# library's connection pool.
CLIENT = r'''
import json, os, socket, ssl, sys, threading, time
mode, host, n, conc, via, target, cafile = sys.argv[1:8]
n, conc = int(n), int(conc)
th, tp = target.rsplit(":", 1)

def ctx():
    if mode == "tunnel":
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE
        return c
    return ssl.create_default_context(cafile=cafile or None)

def read_response(s):
    # By Content-Length, not to EOF: the client closes, as HTTP clients do.
    out = b""
    while b"\r\n\r\n" not in out:
        b = s.recv(65536)
        if not b:
            return out
        out += b
    head, _, body = out.partition(b"\r\n\r\n")
    want = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            want = int(v)
    while len(body) < want:
        b = s.recv(65536)
        if not b:
            break
        body += b
    return head + b"\r\n\r\n" + body

def one(c):
    t0 = time.perf_counter()
    if via == "proxy":
        s = socket.create_connection(("127.0.0.1", 3128))
    else:
        s = socket.create_connection((th, int(tp)))
    if mode == "plain":
        path = f"http://{host}/" if via == "proxy" else "/"
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    else:
        if via == "proxy":
            s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                b = s.recv(1)
                if not b:
                    raise RuntimeError("proxy closed")
                head += b
            if b" 200" not in head.split(b"\r\n")[0]:
                raise RuntimeError(head.decode(errors="replace"))
        s = c.wrap_socket(s, server_hostname=host)
        tok = os.environ.get("BENCH_TOKEN", "none")
        s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nX-Token: {tok}\r\nConnection: close\r\n\r\n".encode())
    body = read_response(s)
    s.close()
    if b" 200 " not in body.split(b"\r\n")[0]:
        raise RuntimeError(body[:200].decode(errors="replace"))
    return time.perf_counter() - t0

c = ctx()
for _ in range(5):
    one(c)
lat = [one(c) for _ in range(n)]
errs = []
def worker(k):
    for _ in range(k):
        try:
            one(c)
        except Exception as e:
            errs.append(str(e))
threads = [threading.Thread(target=worker, args=(n // conc,)) for _ in range(conc)]
t0 = time.perf_counter()
for t in threads: t.start()
for t in threads: t.join()
took = time.perf_counter() - t0
print(json.dumps({"lat": lat, "rps": (n // conc) * conc / took, "errors": len(errs),
                  "first_error": errs[0] if errs else None}))
'''


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def main() -> int:
    args = options(__doc__, "egress", quick="100 requests per case instead of 400", drivers=False).parse_args()
    if (rc := prepare("egress.py")) != 0:
        return rc
    n = 100 if args.quick else 400
    conc = 4

    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-egress-"))
    ca = TestCa(tmp / "ca", "runtime egress bench CA")
    plain = EchoServer().start()
    tls = EchoServer(tls=ca.leaf("srv", ["api.test", "tunnel.test"])).start()
    extra = ["--egress-test-upstream", f"echo.test=127.0.0.1:{plain.port}",
             "--egress-test-upstream", f"api.test=127.0.0.1:{tls.port}",
             "--egress-test-upstream", f"tunnel.test=127.0.0.1:{tls.port}",
             "--egress-extra-ca", str(ca.cert_path)]
    results: dict[str, dict[str, dict]] = {}
    client_path = tmp / "client.py"
    client_path.write_text(CLIENT)
    try:
        with bench_daemon("egress", args.image_dir, tmp, extra) as d:
            run_cases(d, results, n, conc, client_path, plain, tls, ca)
    finally:
        plain.stop()
        tls.stop()

    section = render(results, n, conc, args)
    emit(args.out, BEGIN, END, section)
    return 0


def run_cases(d, results, n, conc, client_path, plain, tls, ca) -> None:
    """Each case's client on the host and in a sandbox, through the daemon's proxy."""
    api = Api(d)
    r = api.put("/v1/egress-secrets/BENCH_TOKEN", json={"value": "bench-secret", "hosts": ["api.test"]})
    assert r.status_code in (200, 201), r.text
    sbx = api.create_sandbox(driver="namespace", network={
        "internet": True, "allow": ["echo.test", "api.test", "tunnel.test"]})
    sbx.write("/tmp/client.py", CLIENT.encode())
    cases = [("plain", "echo.test", f"127.0.0.1:{plain.port}", ""),
             ("tunnel", "tunnel.test", f"127.0.0.1:{tls.port}", ""),
             ("intercepted", "api.test", f"127.0.0.1:{tls.port}", str(ca.cert_path))]
    for mode, host, target, cafile in cases:
        cmode = "tls" if mode == "intercepted" else mode
        # direct: the same client on the host, to the same server
        h = run([sys.executable, str(client_path), cmode, host, str(n), str(conc), "direct", target,
                 cafile], timeout=600, env={**os.environ, "BENCH_TOKEN": "bench-secret"})
        if h.returncode != 0:
            raise RuntimeError(f"direct {mode}: {h.stderr[-2000:]}")
        # through the relay and the proxy, from inside the sandbox
        # $BENCH_TOKEN in the sandbox is the placeholder the daemon set
        res = sbx.exec(argv=["python3", "/tmp/client.py", cmode, host, str(n), str(conc), "proxy",
                             target, ""], timeoutMs=600000)
        if res["exitCode"] != 0:
            raise RuntimeError(f"sandbox {mode}: {res['stderr'][-2000:]}")
        results[mode] = {"direct": json.loads(h.stdout), "proxy": json.loads(res["stdout"])}
    # the intercepted requests carried the value upstream, the tunnels did not
    seen = [dict((k.lower(), v) for k, v in e["headers"]).get("x-token") for e in tls.seen()]
    assert "bench-secret" in seen, "interception did not substitute the secret"
    api.delete(f"/v1/sandboxes/{sbx.id}")
    api.delete("/v1/egress-secrets/BENCH_TOKEN")
    api.close()


def render(results, n, conc, args) -> str:
    names = {"plain": "plain HTTP (absolute-form GET)", "tunnel": "CONNECT tunnel (TLS, untouched)",
             "intercepted": "intercepted HTTPS (secret substituted)"}
    load = os.getloadavg()[0]
    lines = [BEGIN, "## Egress proxy", "",
             "Regenerate with `python3 bench/egress.py` (as root, from the repo root; "
             f"{'`--quick`, ' if args.quick else ''}it replaces this section only).", "",
             f"Run on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, kernel "
             f"{platform.release()}, namespace driver, load average {load:.2f} at the end.", "",
             "Each request opens a fresh connection. *direct*: the client on the host to the local server; "
             "*through the proxy*: the same client inside a sandbox, via the relay on 127.0.0.1:3128, the "
             f"agent channel and the daemon's proxy. Latency: {n} sequential requests after 5 warm-up ones; "
             f"requests per second: {conc} client threads, {n // conc * conc} requests.", "",
             "| request | direct p50 | direct p95 | proxy p50 | proxy p95 | added p50 | direct req/s | proxy req/s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode in ("plain", "tunnel", "intercepted"):
        r = results[mode]
        dl = [x * 1000 for x in r["direct"]["lat"]]
        pl = [x * 1000 for x in r["proxy"]["lat"]]
        dp50, pp50 = statistics.median(dl), statistics.median(pl)
        errs = r["proxy"]["errors"] + r["direct"]["errors"]
        lines.append(f"| {names[mode]} | {dp50:.2f} ms | {pct(dl, 95):.2f} ms | {pp50:.2f} ms | "
                     f"{pct(pl, 95):.2f} ms | +{pp50 - dp50:.2f} ms | {r['direct']['rps']:.0f} | "
                     f"{r['proxy']['rps']:.0f}{f' ({errs} errors)' if errs else ''} |")
    lines += ["", "The intercepted case includes two TLS handshakes (sandbox to proxy with a certificate "
              "minted for the host, proxy to upstream verified against the trust store) where the "
              "direct client does one.", END]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
