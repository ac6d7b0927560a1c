"""TLS files for a fleet's hop (docs/fleet.md, "TLS between hosts"), made with the openssl command:
a CA, and a --fleet-tls-dir per host with a certificate of that CA for an address or name."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (args, r.stderr[-2000:])


def fleet_ca(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "30",
             "-subj", "/CN=runtime-test-fleet-ca", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    return d


def fleet_host_dir(ca: Path, d: Path, san: str) -> Path:
    """A --fleet-tls-dir: a certificate of ca for san (`IP:10.0.0.5`, `DNS:host-a`), its key, and
    ca as the CA the host trusts."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=host",
             "-keyout", "key.pem", "-out", "host.csr", cwd=d)
    (d / "san.ext").write_text(f"subjectAltName={san}\n")
    _openssl("x509", "-req", "-in", "host.csr", "-CA", str(ca / "ca.pem"), "-CAkey", str(ca / "ca.key"),
             "-CAcreateserial", "-days", "30", "-extfile", "san.ext", "-out", "cert.pem", cwd=d)
    (d / "ca.pem").write_text((ca / "ca.pem").read_text())
    os.chmod(d / "key.pem", 0o600)
    return d
