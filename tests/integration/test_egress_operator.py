"""Egress on networks whose upstreams sit on private or reserved addresses and
present certificates of a CA of their own (a registry gateway, split-horizon
DNS, TLS inspection): the operator settings --egress-public-cidr and
--egress-trust-ca, and PEP 668 in the image.

Most tests stay on the machine: a TLS server on 127.0.0.1 with a certificate
from a CA made here, reached under a test name (--egress-test-upstream), shows
that the sandbox trusts the operator's CA end to end through a plain tunnel.
The pip tests talk to the real package index through the daemon's proxy, with
the package index's addresses as the public ranges and the host's own trust
store as the trusted bundle, as an operator on such a network would start
runtimed; they skip when the host itself cannot reach the index.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import urllib.request

import pytest

from conftest import DRIVERS, _finish_daemon, _need_root
from egress_servers import EchoServer, TestCa
from helpers import LIVE_DAEMONS, Api, Daemon, DaemonError, daemon_info, skip_unless_driver, tail
from test_egress import HOSTS_MARK, egress_log, refused

INDEX_HOSTS = ("pypi.org", "files.pythonhosted.org")
# A small pure-Python package that no image has (six came into the default image with the
# interpreter's kernel): pip has to fetch it.
PKG = "iniconfig"
TLS_NAME = "operator-ca.test"
PIP = ("python3 -m pip install --no-cache-dir --disable-pip-version-check --retries 0 --timeout 30 "
       "--progress-bar off")


def host_ca_bundle() -> str | None:
    paths = ssl.get_default_verify_paths()
    for p in (paths.cafile, paths.openssl_cafile):
        if p and os.path.isfile(p):
            return p
    return None


PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----\n.*?\n-----END CERTIFICATE-----\n?", re.S)


def certs_of(text: str) -> list[str]:
    return [m.group(0).rstrip("\n") + "\n" for m in PEM_CERT.finditer(text)]


def network_cas(image_dir) -> str:
    """What an operator hands to --egress-trust-ca: the CAs that the host
    trusts and the image does not (the network's own), else the host's whole
    store when the image's cannot be read."""
    host = host_ca_bundle()
    if not host:
        return ""
    host_certs = certs_of(open(host).read())
    try:
        image = (image_dir / "default/rootfs/etc/ssl/certs/ca-certificates.crt").read_text()
    except OSError:
        return "".join(host_certs)
    known = {"".join(c.split()) for c in certs_of(image)}
    return "".join(c for c in host_certs if "".join(c.split()) not in known)


def index_addresses() -> dict[str, list[str]]:
    """The package index's addresses as this host resolves them."""
    out = {}
    for name in INDEX_HOSTS:
        try:
            infos = socket.getaddrinfo(name, 443, type=socket.SOCK_STREAM)
        except socket.gaierror:
            return {}
        out[name] = sorted({i[4][0] for i in infos})
    return out


def index_reachable() -> str | None:
    """None when the host reaches the index with its own trust store, else why not."""
    try:
        with urllib.request.urlopen("https://pypi.org/simple/six/", timeout=30) as r:
            if r.status != 200:
                return f"https://pypi.org/simple/six/ answered {r.status} on the host"
    except Exception as e:  # any failure means: not reachable from here
        return f"the host cannot reach the package index: {e}"
    return None


class Operator:
    def __init__(self, tmp, image_dir):
        self.ca = TestCa(tmp / "ca", "runtime operator CA (tests)")
        self.tls = EchoServer(tls=self.ca.leaf("op", [TLS_NAME])).start()
        self.addresses = index_addresses()
        self.unreachable = "the package index's names do not resolve on this host" \
            if not self.addresses else index_reachable()
        # The ranges an operator would name: the index's addresses that the
        # proxy would otherwise refuse, each as a single host.
        self.cidrs = sorted({f"{a}/{32 if ':' not in a else 128}"
                             for addrs in self.addresses.values() for a in addrs
                             if not ipaddress.ip_address(a).is_global})
        # One bundle: the test CA and the network's CAs.
        self.bundle = tmp / "trusted.pem"
        self.bundle.write_text(self.ca.cert_path.read_text() + network_cas(image_dir))
        self.daemon: Daemon | None = None


@pytest.fixture(scope="module")
def op(build_dir, image_dir, tmp_path_factory):
    _need_root()
    tmp = tmp_path_factory.mktemp("egress-operator")
    o = Operator(tmp, image_dir)
    args = ["--egress-test-upstream", f"{TLS_NAME}=127.0.0.1:{o.tls.port}",
            "--egress-trust-ca", str(o.bundle)]
    if not o.unreachable:
        for c in o.cidrs:
            args += ["--egress-public-cidr", c]
    d = Daemon(build_dir, image_dir, tmp / "state", f"runtime-test-{os.getpid()}-egress-op",
               extra_args=args)
    try:
        d.start()
    except DaemonError as err:
        o.tls.stop()
        pytest.fail(str(err), pytrace=False)
    o.daemon = d
    yield o
    _finish_daemon(d)
    o.tls.stop()


@pytest.fixture
def oapi(op):
    # pip under the microVM's software emulation takes minutes.
    c = Api(op.daemon, timeout=420.0)
    yield c
    problems = c.delete_all()
    c.close()
    assert op.daemon.alive(), f"runtimed died during the test; log:\n{tail(op.daemon.log_path)}"
    assert not problems, problems


@pytest.fixture(params=DRIVERS)
def odriver(request, op) -> str:
    skip_unless_driver(op.daemon, request.param)
    return request.param


@pytest.fixture
def index(op):
    if op.unreachable:
        pytest.skip(op.unreachable)
    return op


# ---------------------------------------------------------------------------
# Start-up refusals


def start_refused(build_dir, image_dir, tmp_path, args: list[str]) -> str:
    """Starts runtimed with args, expects it to exit at start; its log."""
    _need_root()
    d = Daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-egress-refused",
               extra_args=args)
    try:
        d.start(timeout=60)
    except DaemonError:
        return tail(d.log_path)
    finally:
        if d in LIVE_DAEMONS:
            LIVE_DAEMONS.remove(d)
    d.stop()
    pytest.fail(f"runtimed started with {args}")


def own_addresses() -> list[str]:
    if not shutil.which("ip"):
        return []
    out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True).stdout
    return [a["local"] for i in json.loads(out or "[]") for a in i.get("addr_info", [])
            if not a["local"].startswith(("127.", "::1", "fe80:"))]


@pytest.mark.parametrize("cidr,why", [
    ("127.0.0.0/8", "loopback"), ("127.0.0.1", "loopback"), ("0.0.0.0/0", "unspecified"),
    ("169.254.169.254/32", "metadata"), ("169.254.0.0/16", "link-local"),
    ("100.64.0.0/10", "metadata"), ("224.0.0.0/4", "multicast"), ("::1/128", "loopback"),
    ("::/0", "unspecified"), ("::ffff:203.0.113.0/120", "IPv4-mapped"), ("fe80::/10", "link-local"),
    ("fd00:ec2::254", "metadata"), ("2002::/16", "6to4"),
    ("203.0.113.80/24", "host bits"), ("0177.0.0.1/32", "dotted quad"), ("127.1", "dotted quad"),
    ("203.0.113.0/08", "ADDRESS/PREFIX"), ("[2001:db8::]/32", "ADDRESS/PREFIX"),
    ("pypi.org", "ADDRESS/PREFIX"), ("", "ADDRESS/PREFIX"),
])
def test_public_cidr_refused_at_start(build_dir, image_dir, tmp_path, cidr, why):
    log = start_refused(build_dir, image_dir, tmp_path, ["--egress-public-cidr", cidr])
    assert "--egress-public-cidr" in log and why in log, log


def test_public_cidr_holding_this_host_refused(build_dir, image_dir, tmp_path):
    own = own_addresses()
    if not own:
        pytest.skip("this host has no address besides loopback and link-local (or no `ip`)")
    for addr in own[:2]:
        net = ipaddress.ip_network(f"{addr}/{24 if ':' not in addr else 64}", strict=False)
        log = start_refused(build_dir, image_dir, tmp_path, ["--egress-public-cidr", str(net)])
        assert f"holds {addr}, an address of this host" in log, log


def test_trust_ca_refused_at_start(build_dir, image_dir, tmp_path):
    ca = TestCa(tmp_path / "ca", "refused CA")
    leaf_crt, leaf_key = ca.leaf("leaf", ["leaf.test"])
    with_key = tmp_path / "with-key.pem"
    with_key.write_text(ca.cert_path.read_text() + leaf_key.read_text())
    cases = [(with_key, "PRIVATE KEY"), (leaf_crt, "not a CA certificate"),
             (tmp_path / "missing.pem", "cannot read"), (tmp_path, "not a regular file")]
    empty = tmp_path / "empty.pem"
    empty.write_text("no certificate here\n")
    cases.append((empty, "no PEM certificate"))
    for path, why in cases:
        log = start_refused(build_dir, image_dir, tmp_path, ["--egress-trust-ca", str(path)])
        assert why in log, f"{path}: {log}"


# ---------------------------------------------------------------------------
# The operator's CA inside the sandbox (no traffic leaves the machine)


def test_trusted_ca_in_sandbox_store_and_variables(oapi, odriver, op):
    sbx = oapi.create_sandbox(driver=odriver, network={"internet": True, "allow": [TLS_NAME]})
    env = sbx.run("env | sort")
    for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"):
        assert f"{var}=/etc/ssl/certs/ca-certificates.crt" in env, env
    assert "NODE_EXTRA_CA_CERTS=/usr/local/share/ca-certificates/runtime-egress.crt" in env, env
    ours = op.ca.cert_path.read_text().strip().splitlines()[1]  # a line of the base64 body
    store = sbx.read("/etc/ssl/certs/ca-certificates.crt").decode()
    extra = sbx.read("/usr/local/share/ca-certificates/runtime-egress.crt").decode()
    assert ours in store and ours in extra
    # The image's own roots are still there: the bundle grew, it was not replaced.
    assert store.count("BEGIN CERTIFICATE") > extra.count("BEGIN CERTIFICATE") > 1
    assert "PRIVATE KEY" not in store + extra

    # A plain tunnel (no secret, so no interception): the sandbox's own TLS
    # client verifies the upstream against the operator's CA.
    # Bounds that the microVM under TCG meets on a loaded machine.
    res = sbx.exec(f"curl -sS --max-time 100 -o /dev/null -w '%{{http_code}}' https://{TLS_NAME}/curl",
                   timeoutMs=110000)
    assert res["exitCode"] == 0 and res["stdout"] == "200", res
    out = sbx.run("env -u NO_PROXY -u no_proxy python3 -c \"import urllib.request,json;"
                  f"print(json.load(urllib.request.urlopen('https://{TLS_NAME}/py'))['path'])\"",
                  timeoutMs=110000)
    assert out.strip() == "/py"
    assert [r["path"] for r in op.tls.seen()][-2:] == ["/curl", "/py"]
    log = egress_log(oapi, sbx.id)
    assert any(e["host"] == TLS_NAME and e["allowed"] and not e["intercepted"] for e in log), log


def test_without_trust_ca_only_the_daemons_ca_is_added(api, driver):
    """Off by default: the suite's daemon has no --egress-trust-ca, and its
    sandboxes get the daemon's CA alone."""
    sbx = api.create_sandbox(driver=driver)
    extra = sbx.read("/usr/local/share/ca-certificates/runtime-egress.crt").decode()
    assert extra.count("BEGIN CERTIFICATE") == 1


# ---------------------------------------------------------------------------
# PEP 668


# pip's settings are the image's and its connections are decided by the proxy on the host, the
# same on namespace and gVisor: the pip tests run on namespace by default (gVisor's cases took
# 27 s) and on every driver with RUNTIME_TEST_ALL=1 (conftest.py, driver_independent).
@pytest.mark.driver_independent
def test_pep668_does_not_stop_pip(oapi, odriver):
    # oapi: its client waits as long as pip takes on the microVM under TCG.
    sbx = oapi.create_sandbox(driver=odriver)
    res = sbx.exec("python3 -m pip --version", timeoutMs=300000)
    assert not res["timedOut"], res
    if res["exitCode"] != 0:
        pytest.skip("the image has no pip")
    res = sbx.exec("python3 -c \"import glob; print(glob.glob('/usr/lib/python3*/EXTERNALLY-MANAGED'))\"; "
                   "python3 -m pip config list", timeoutMs=300000)
    assert res["exitCode"] == 0 and res["stdout"].startswith("[]\n"), res
    assert "global.break-system-packages='true'" in res["stdout"], res
    # No index reachable (no network): pip gets past the PEP 668 check to
    # the resolver and fails there, not at the marker.
    res = sbx.exec(f"{PIP} --no-index {PKG}", timeoutMs=300000)
    assert res["exitCode"] != 0
    assert "externally-managed-environment" not in res["stdout"] + res["stderr"], res
    assert "No matching distribution" in res["stderr"] or "Could not find" in res["stderr"], res


# ---------------------------------------------------------------------------
# The real package index through the proxy


def test_host_without_settings_refused(api, driver, index):
    """The reproduction: without the operator settings the index's address is
    refused (when it is not a public one)."""
    if not index.cidrs:
        pytest.skip("the package index resolves to public addresses here: nothing to show")
    sbx = api.create_sandbox(driver=driver, network={"internet": True, "allow": list(INDEX_HOSTS)})
    refused(sbx, "https://pypi.org/simple/six/")
    log = egress_log(api, sbx.id)
    assert log and not log[0]["allowed"] and "pypi.org resolves to" in log[0]["reason"], log


@pytest.mark.driver_independent
def test_pip_install_through_allow_list(oapi, odriver, index):
    microvm = {x.get("name"): x for x in daemon_info(index.daemon).get("drivers", [])}.get("microvm", {})
    if odriver == "microvm" and "TCG" in (microvm.get("reason") or ""):
        # Measured here: the gateway resets a connection that sends nothing
        # for 10 s, and pip under TCG takes longer than that between the
        # proxy's "200 Connection established" and its ClientHello (the audit
        # shows the tunnel allowed, 0 bytes either way). With KVM it runs.
        pytest.skip("microvm under TCG: pip sends its TLS ClientHello later than this network's "
                    "package gateway waits for one (10 s)")
    sbx = oapi.create_sandbox(driver=odriver, network={"internet": True, "allow": list(INDEX_HOSTS)})
    res = sbx.exec(f"{PIP} {PKG} && python3 -c 'import importlib.metadata as m, {PKG}; "
                   f"print({PKG}.__name__, m.version(\"{PKG}\"))'", timeoutMs=300000)
    assert res["exitCode"] == 0, f"{res['exitCode']} {res['timedOut']}\n{res['stdout'][-2000:]}\n{res['stderr'][-2000:]}"
    assert res["stdout"].strip().splitlines()[-1].startswith(f"{PKG} "), res
    # Each connection's entry is written at its decision, before pip had
    # a byte of an answer: it is there as the exec returns.
    log = egress_log(oapi, sbx.id)
    for host in INDEX_HOSTS:
        ok = [e for e in log if e["host"] == host and e["allowed"]]
        assert ok, f"no allowed connection to {host}: {log}"
        if index.cidrs:
            assert all("operator public range" in e["reason"] for e in ok), ok


@pytest.mark.driver_independent
@pytest.mark.parametrize("missing", INDEX_HOSTS)
def test_pip_refused_without_either_host(oapi, odriver, index, missing):
    allow = [h for h in INDEX_HOSTS if h != missing]
    sbx = oapi.create_sandbox(driver=odriver, network={"internet": True, "allow": allow})
    res = sbx.exec(f"{PIP} {PKG}", timeoutMs=300000)
    assert res["exitCode"] != 0, res
    assert sbx.exec(f"python3 -c 'import {PKG}'")["exitCode"] != 0
    log = egress_log(oapi, sbx.id)
    no = [e for e in log if e["host"] == missing and not e["allowed"]]
    assert no and "allow list" in no[0]["reason"], log


def test_names_resolving_to_loopback_or_metadata_still_refused(oapi, odriver, op):
    """With public ranges set, a name that resolves to loopback or the
    metadata address is refused all the same."""
    names = {"lo.rt-egress-op.test": "127.0.0.1", "meta.rt-egress-op.test": "169.254.169.254"}
    path = "/etc/hosts"
    if not os.access(path, os.W_OK):
        pytest.skip("/etc/hosts is not writable")
    with open(path, "a") as f:
        f.write("".join(f"{addr} {name} {HOSTS_MARK}\n" for name, addr in names.items()))
    try:
        sbx = oapi.create_sandbox(driver=odriver, network={"internet": True, "allow": list(names)})
        for name, addr in names.items():
            text = refused(sbx, f"http://{name}/")
            assert addr in text, f"{name}: {text[:300]}"
            refused(sbx, f"https://{name}/", "--proxytunnel", "-k")
        log = egress_log(oapi, sbx.id)
        assert not any(e["allowed"] for e in log), log
    finally:
        now = open(path).read()
        with open(path, "w") as f:
            f.write("".join(ln for ln in now.splitlines(keepends=True) if HOSTS_MARK not in ln))
