"""Egress end to end: the relay in the sandbox, the proxy in the daemon, the
policy, the SSRF rules, secrets with interception, and the audit log.

No traffic leaves the machine: every upstream is a server of this module on
127.0.0.1, reached under a test name that the daemon maps with
--egress-test-upstream; the test CA's certificate is handed over with
--egress-extra-ca. The mapped address carries the server's port, so a
sandbox asks for http://echo.test/ (port 80) or https://api.test/ (443) and
the policy sees the ports it would see on the internet.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import time

import httpx
import pytest

from conftest import DRIVERS, _finish_daemon, _need_root
from egress_servers import EchoServer, PackageIndex, TestCa
from helpers import REPO, Api, Daemon, DaemonError, skip_unless_driver, tail, wait_until

PLAIN_NAMES = ["echo.test", "other.test", "wild.test", "a.wild.test", "b.a.wild.test",
               "no.wild.test"]


class Env:
    """The servers and the daemon of this module."""

    def __init__(self, tmp):
        self.ca = TestCa(tmp / "ca", "runtime egress tests CA")
        self.rogue = TestCa(tmp / "rogue", "a CA nobody trusts")
        self.echo = EchoServer().start()
        self.tls = EchoServer(tls=self.ca.leaf("api", ["api.test", "api2.test"])).start()
        self.bad = EchoServer(tls=self.rogue.leaf("bad", ["bad.test"])).start()
        self.index = PackageIndex().start()
        self.tls_index = PackageIndex(tls=self.ca.leaf("pypi", ["pypis.test"])).start()
        self.mapping = {n: self.echo.port for n in PLAIN_NAMES}
        self.mapping.update({"api.test": self.tls.port, "api2.test": self.tls.port,
                             "bad.test": self.bad.port, "pypi.test": self.index.port,
                             "pypis.test": self.tls_index.port})
        self.daemon: Daemon | None = None

    def stop(self):
        for s in (self.echo, self.tls, self.bad, self.index, self.tls_index):
            s.stop()

    def clear(self):
        for s in (self.echo, self.tls, self.bad, self.index, self.tls_index):
            s.clear()


@pytest.fixture(scope="module")
def env(build_dir, image_dir, tmp_path_factory):
    _need_root()
    tmp = tmp_path_factory.mktemp("egress")
    e = Env(tmp)
    args = []
    for name, port in e.mapping.items():
        args += ["--egress-test-upstream", f"{name}=127.0.0.1:{port}"]
    args += ["--egress-extra-ca", str(e.ca.cert_path)]
    d = Daemon(build_dir, image_dir, tmp / "state", f"runtime-test-{os.getpid()}-egress",
               extra_args=args)
    try:
        d.start()
    except DaemonError as err:
        e.stop()
        pytest.fail(str(err), pytrace=False)
    e.daemon = d
    yield e
    if d.alive():
        with d.client() as c:
            for s in c.get("/v1/sandboxes").json().get("sandboxes", []):
                c.delete(f"/v1/sandboxes/{s['id']}")
            for s in c.get("/v1/egress-secrets").json().get("secrets", []):
                c.delete(f"/v1/egress-secrets/{s['name']}")
    _finish_daemon(d)
    e.stop()


@pytest.fixture
def eapi(env):
    c = Api(env.daemon)
    env.clear()
    yield c
    problems = c.delete_all()
    c.close()
    assert env.daemon.alive(), f"runtimed died during the test; log:\n{tail(env.daemon.log_path)}"
    assert not problems, problems


@pytest.fixture(params=DRIVERS)
def edriver(request, env) -> str:
    skip_unless_driver(env.daemon, request.param)
    return request.param


def curl(sbx, *args: str, timeout: int = 30) -> tuple[int, str, str]:
    """curl in the sandbox, through the proxy even for loopback names (NO_PROXY
    is dropped); returns (HTTP status or 0, body, stderr)."""
    cmd = ("env -u NO_PROXY -u no_proxy curl -sS --max-time 20 -o /tmp/body -w '%{http_code}' " + " ".join(shlex.quote(a) for a in args)
           + "; rc=$?; echo; echo ===; cat /tmp/body 2>/dev/null; exit $rc")
    res = sbx.exec(cmd, timeoutMs=timeout * 1000)
    head, _, body = res["stdout"].partition("\n===\n")
    code = int(head.strip() or 0) if head.strip().isdigit() else 0
    return code, body, res["stderr"]


def allowed(sbx, url: str, *extra: str) -> dict:
    code, body, err = curl(sbx, *extra, url)
    assert code == 200, f"{url}: expected 200, got {code}: {body[:500]} {err[:500]}"
    return json.loads(body) if body.startswith("{") else {"raw": body}


def refused(sbx, url: str, *extra: str, why: str | None = None) -> str:
    code, body, err = curl(sbx, *extra, url)
    text = body + err
    assert code != 200, f"{url}: expected a refusal, got 200: {body[:300]}"
    if "--proxytunnel" in extra or url.startswith("https://"):
        # A refused CONNECT reaches curl as the proxy's status.
        assert "403" in err or code == 403, f"{url}: {code} {body[:300]} {err[:300]}"
    else:
        assert code == 403, f"{url}: expected 403, got {code}: {body[:300]} {err[:300]}"
        assert body.startswith("runtime egress: "), f"{url}: unclear refusal: {body[:300]}"
    if why:
        assert re.search(why, text, re.I), f"{url}: refusal does not say {why!r}: {text[:400]}"
    return text


def egress_log(api: Api, sid: str) -> list[dict]:
    r = api.get(f"/v1/sandboxes/{sid}/egress", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["entries"]


# ---------------------------------------------------------------------------
# The path


@pytest.mark.microvm_subset
def test_proxy_env_and_relay(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    out = sbx.run("env | grep -i _proxy | sort")
    assert "HTTP_PROXY=http://127.0.0.1:3128" in out and "https_proxy=http://127.0.0.1:3128" in out, out
    assert "NO_PROXY=localhost,127.0.0.1" in out, out
    got = allowed(sbx, "http://echo.test/hello?x=1")
    assert got["path"] == "/hello?x=1" and got["method"] == "GET"
    # python urllib, unmodified
    out = sbx.run("python3 -c \"import urllib.request,json;"
                  "print(json.load(urllib.request.urlopen('http://echo.test/py'))['path'])\"")
    assert out.strip() == "/py"
    assert [r["path"] for r in env.echo.seen()] == ["/hello?x=1", "/py"]


@pytest.mark.microvm_subset
def test_internet_off_refuses_everything(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver)
    assert sbx["network"]["internet"] is False
    refused(sbx, "http://echo.test/")
    refused(sbx, "https://api.test/")
    assert env.echo.seen() == [] and env.tls.seen() == []


@pytest.mark.microvm_subset
def test_programs_ignoring_the_proxy_fail_fast(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True})
    # What curl costs before it connects (seconds in an emulated guest on a
    # loaded host); failing fast means within 2 s of that, never curl's timeout.
    t0 = time.monotonic()
    assert sbx.exec("curl --version >/dev/null")["exitCode"] == 0
    start_cost = time.monotonic() - t0
    for target in ("http://192.0.2.1/", f"http://127.0.0.1:{env.echo.port}/",
                   f"http://127.0.0.1:{env.daemon.port}/healthz"):
        t0 = time.monotonic()
        res = sbx.exec(f"curl -sS --noproxy '*' --max-time 10 {target}")
        took = time.monotonic() - t0
        assert res["exitCode"] != 0, f"{target} reached without the proxy: {res!r}"
        assert res["exitCode"] != 28, f"{target}: curl timed out instead of failing: {res!r}"
        assert took < start_cost + 2.0, f"{target}: took {took:.1f}s to fail (curl starts in {start_cost:.1f}s)"
    assert env.echo.seen() == []


@pytest.mark.microvm_subset
def test_daemon_port_unreachable_through_proxy(eapi, edriver, env):
    port = env.daemon.port
    sbx = eapi.create_sandbox(driver=edriver, network={
        "internet": True, "allow": [f"127.0.0.1:{port}", f"localhost:{port}"]})
    refused(sbx, f"http://127.0.0.1:{port}/healthz")
    refused(sbx, f"http://localhost:{port}/healthz")
    refused(sbx, f"https://127.0.0.1:{port}/", "--proxytunnel", "-k")


# ---------------------------------------------------------------------------
# Policy


def test_open_internet_is_ports_80_and_443(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True})
    allowed(sbx, "http://echo.test/")
    allowed(sbx, "http://other.test:80/")
    code, _, err = curl(sbx, "--proxytunnel", "-k", "https://echo.test:443/")
    assert "403" not in err, err  # the tunnel is allowed (TLS to a plain server then fails)
    refused(sbx, "http://echo.test:8080/", why="port")
    refused(sbx, "http://echo.test:22/", why="port")


def test_allow_list_exact_wildcard_case_and_dot(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={
        "internet": True, "allow": ["echo.test", "*.wild.test", f"other.test:{env.echo.port}"]})
    allowed(sbx, "http://echo.test/")
    allowed(sbx, "http://ECHO.Test/")
    allowed(sbx, "http://echo.test./")
    allowed(sbx, "http://a.wild.test/")
    allowed(sbx, "http://b.a.wild.test/")
    allowed(sbx, "http://A.WILD.TEST./")
    refused(sbx, "http://wild.test/")             # the bare domain is not a sub-domain
    refused(sbx, "http://other.test/")            # listed with another port only
    refused(sbx, "http://echo.test:8443/")        # default ports only
    refused(sbx, "http://notecho.test/")
    # the port named in the pattern works (the mapping keeps the real server)
    allowed(sbx, f"http://other.test:{env.echo.port}/")


def test_deny_wins_over_allow(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={
        "internet": True, "allow": ["*.wild.test", "echo.test"], "deny": ["no.wild.test", "ECHO.test."]})
    allowed(sbx, "http://a.wild.test/")
    refused(sbx, "http://no.wild.test/", why="den")
    refused(sbx, "http://echo.test/", why="den")
    refused(sbx, "https://echo.test/", "--proxytunnel")
    # open internet with a deny list
    sbx2 = eapi.create_sandbox(driver=edriver, network={"internet": True, "deny": ["other.test"]})
    allowed(sbx2, "http://echo.test/")
    refused(sbx2, "http://other.test/")


def test_connect_and_plain_http_share_the_decision(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    # plain HTTP through a CONNECT tunnel: curl --proxytunnel
    got = allowed(sbx, "http://echo.test/tunnel", "--proxytunnel")
    assert got["path"] == "/tunnel"
    refused(sbx, "http://other.test/tunnel", "--proxytunnel")
    refused(sbx, "http://other.test/plain")
    assert [r["path"] for r in env.echo.seen()] == ["/tunnel"]


def test_live_network_change(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    allowed(sbx, "http://echo.test/")
    refused(sbx, "http://other.test/")
    r = eapi.put(f"/v1/sandboxes/{sbx.id}/network",
                 json={"internet": True, "allow": ["other.test"]})
    assert r.status_code == 200, r.text
    assert r.json()["network"]["allow"] == ["other.test"]
    allowed(sbx, "http://other.test/")
    refused(sbx, "http://echo.test/")
    r = eapi.put(f"/v1/sandboxes/{sbx.id}/network", json={"internet": False})
    assert r.status_code == 200, r.text
    refused(sbx, "http://other.test/")
    bad = eapi.put(f"/v1/sandboxes/{sbx.id}/network", json={"internet": True, "allow": ["bad host!"]})
    assert bad.status_code == 400, bad.text


def test_bad_network_objects_are_refused(eapi, env):
    for net in ({"internet": "yes"}, {"internet": True, "allow": "echo.test"},
                {"internet": True, "allow": [1]}, {"internet": True, "allow": ["a" * 300]},
                {"internet": True, "allow": ["x.test"] * 257}, {"internet": True, "allow": ["*"]},
                {"internet": True, "allow": ["echo.test:0"]}, {"internet": True, "allow": ["echo.test:70000"]},
                {"internet": True, "allow": ["e\r\ncho.test"]}):
        r = eapi.post("/v1/sandboxes", json={"network": net})
        if r.status_code == 201:
            eapi.created.append(r.json()["id"])
        assert r.status_code == 400, f"{net!r}: {r.status_code} {r.text[:300]}"


# ---------------------------------------------------------------------------
# SSRF

SSRF_SPELLINGS = ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "[::1]",
                  "[::ffff:127.0.0.1]", "169.254.169.254", "10.0.0.1", "100.64.0.1", "0.0.0.0",
                  "192.168.1.1", "172.16.0.1", "[fe80::1]", "[fd00::1]", "224.0.0.1", "0x7f.1"]


def test_ssrf_spellings_refused_even_when_allowed(eapi, edriver, env):
    # Every spelling is named in allow: the address rules still refuse it.
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": SSRF_SPELLINGS})
    for host in SSRF_SPELLINGS:
        text = refused(sbx, f"http://{host}/latest/meta-data/")
        assert host.strip("[]") in text or "address" in text.lower(), f"{host}: {text[:300]}"
        refused(sbx, f"https://{host}/", "--proxytunnel", "-k")
    log = egress_log(eapi, sbx.id)
    assert all(not e["allowed"] for e in log), log
    assert env.echo.seen() == []


def test_name_resolving_to_loopback_refused(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["localhost", "ip6-localhost"]})
    text = refused(sbx, "http://localhost/")
    assert "127.0.0.1" in text or "::1" in text or "loopback" in text.lower(), text[:300]


def test_test_upstream_needs_the_flag(api, driver, env):
    """The suite-wide daemon (fixture `daemon`) runs without --egress-test-upstream: the same names
    resolve for real (and fail, or point nowhere public) and are refused."""
    sbx = api.create_sandbox(driver=driver, network={"internet": True, "allow": ["echo.test", "api.test"]})
    for url in ("http://echo.test/", "https://api.test/"):
        code, body, err = curl(sbx, url)
        assert code != 200, f"{url} reached without the test mapping: {body[:200]}"
    assert env.echo.seen() == [] and env.tls.seen() == []


# ---------------------------------------------------------------------------
# Secrets

SECRET_VALUE = "sk-live-0123456789abcdefSECRETVALUE"


def put_secret(api, name, value, hosts):
    return api.put(f"/v1/egress-secrets/{name}", json={"value": value, "hosts": hosts})


@pytest.fixture
def secret(eapi):
    r = put_secret(eapi, "API_TOKEN", SECRET_VALUE, ["api.test", "bad.test"])
    assert r.status_code in (200, 201), r.text
    body = r.json()
    assert SECRET_VALUE not in r.text
    yield body
    eapi.delete("/v1/egress-secrets/API_TOKEN")


def test_secret_values_with_line_breaks_refused(eapi):
    for v in ("a\r\nX-Evil: 1", "a\nb", "a\rb", "a\x00b"):
        r = put_secret(eapi, "BAD_ONE", v, ["api.test"])
        assert r.status_code == 400, f"{v!r}: {r.status_code} {r.text}"
    for name, hosts in (("1BAD", ["api.test"]), ("A" * 300, ["api.test"]), ("OK_NAME", []),
                        ("OK_NAME", "api.test")):
        r = put_secret(eapi, name, "v", hosts)
        if r.status_code in (200, 201):
            eapi.delete(f"/v1/egress-secrets/{name}")
        assert r.status_code in (400, 404), f"{name!r} {hosts!r}: {r.status_code} {r.text[:200]}"
    assert eapi.get("/v1/egress-secrets/NOPE").status_code == 404


def test_secret_substituted_for_its_host_only(eapi, edriver, env, secret):
    placeholder = secret["placeholder"]
    assert placeholder.startswith("runtime-secret-API_TOKEN-") and SECRET_VALUE not in placeholder
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True,
                                                       "allow": ["api.test", "echo.test"]})
    assert sbx.run("printf %s \"$API_TOKEN\"") == placeholder
    # HTTPS to the secret's host: intercepted, the value arrives upstream.
    got = allowed(sbx, "https://api.test/v1/models", "-H", f"Authorization: Bearer {placeholder}")
    hdrs = {k.lower(): v for k, v in got["headers"]}
    assert hdrs["authorization"] == f"Bearer {SECRET_VALUE}"
    seen = env.tls.seen()
    assert len(seen) == 1 and dict((k.lower(), v) for k, v in seen[0]["headers"])["authorization"] \
        == f"Bearer {SECRET_VALUE}"
    # The echo the sandbox read back holds the value: that is the secret host's own
    # answer; the point is the other direction: an echo elsewhere sees the placeholder.
    res = sbx.exec("curl -sS --max-time 20 -H \"Authorization: Bearer $API_TOKEN\" "
                   "\"http://echo.test/leak?t=$API_TOKEN\"")
    assert res["exitCode"] == 0, res
    rec = env.echo.seen()[-1]
    assert SECRET_VALUE not in json.dumps(rec), rec
    assert placeholder in dict((k.lower(), v) for k, v in rec["headers"])["authorization"]
    assert placeholder in rec["path"]
    # python (requests-style CA variables) through the same interception
    out = sbx.run("python3 - <<'EOF'\nimport os,json,urllib.request\n"
                  "req=urllib.request.Request('https://api.test/py',"
                  "headers={'X-Key':os.environ['API_TOKEN']})\n"
                  "print(json.load(urllib.request.urlopen(req))['path'])\nEOF")
    assert out.strip() == "/py"
    assert dict((k.lower(), v) for k, v in env.tls.seen()[-1]["headers"])["x-key"] == SECRET_VALUE
    # A connection's entry gets its counts when the proxy reports its end,
    # which can come after the client has its answer and exits.
    log = wait_until(lambda: (lambda l: all(e["end"] for e in l) and l)(egress_log(eapi, sbx.id)),
                     timeout=20, what="every connection's end in the egress log")
    used = [e for e in log if e["host"] == "api.test" and e["allowed"]]
    assert used and all(e["intercepted"] for e in used), log
    assert any(e["secretsUsed"] >= 1 for e in used), used


def search_sandbox(sbx, needle: str) -> str:
    """Lines holding needle in the sandbox's environment, files under /etc
    /root /workspace /tmp /run, process list, and every process's environ and
    command line. The needle reaches the shell base64-encoded and grep reads
    it from a pipe, so no command line of the search itself holds it."""
    b64 = base64.b64encode(needle.encode()).decode()
    # The echo server is the secret's own host, so its answer (kept by curl()
    # in /tmp/body) holds the value by design: that file goes first.
    res = sbx.exec("rm -f /tmp/body; v=$(printf %s " + b64 + " | base64 -d); "
                   "f() { grep -aF -f <(printf '%s\\n' \"$v\") \"$@\"; }; "
                   "env | f; grep -raF -f <(printf '%s\\n' \"$v\") /etc /root /workspace /tmp /run; "
                   "ps auxww | f; "
                   "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null | tr '\\0' '\\n'; done | f; "
                   "true", timeoutMs=120000, user="root")  # root reads every file there
    return res["stdout"]


def test_secret_value_never_visible(eapi, edriver, env, secret):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["api.test"]})
    allowed(sbx, "https://api.test/", "-H", f"Authorization: Bearer {secret['placeholder']}")
    # The search finds the placeholder (a positive control) but not the value.
    assert secret["placeholder"] in search_sandbox(sbx, secret["placeholder"])
    found = search_sandbox(sbx, SECRET_VALUE)
    assert SECRET_VALUE not in found, found[:2000]
    assert sbx.run("printf %s \"$API_TOKEN\"") == secret["placeholder"]
    texts = [eapi.get(f"/v1/sandboxes/{sbx.id}").text, eapi.get("/v1/sandboxes").text,
             eapi.get("/v1/egress-secrets").text, eapi.get("/v1/egress-secrets/API_TOKEN").text,
             eapi.get(f"/v1/sandboxes/{sbx.id}/egress").text]
    for t in texts:
        assert SECRET_VALUE not in t, t[:500]
    lst = eapi.get("/v1/egress-secrets").json()["secrets"]
    entry = [s for s in lst if s["name"] == "API_TOKEN"][0]
    assert set(entry) >= {"name", "hosts", "placeholder"} and "value" not in entry
    assert SECRET_VALUE not in env.daemon.log_path.read_text(errors="replace")


def test_interception_fails_closed_on_untrusted_upstream(eapi, edriver, env, secret):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["bad.test"]})
    code, body, err = curl(sbx, "-H", f"Authorization: Bearer {secret['placeholder']}", "https://bad.test/x")
    assert code == 502, f"{code} {body[:300]} {err[:300]}"
    assert re.search(r"certificate|verif", body, re.I), body[:300]
    assert env.bad.seen() == []
    log = [e for e in egress_log(eapi, sbx.id) if e["host"] == "bad.test"]
    assert log, "no audit entry for the failed interception"


def test_secrets_crud(eapi):
    r = put_secret(eapi, "CRUD_TOKEN", "v1", ["api.test", "*.api.test"])
    assert r.status_code in (200, 201), r.text
    p1 = r.json()["placeholder"]
    r = put_secret(eapi, "CRUD_TOKEN", "v2", ["api.test"])
    assert r.status_code in (200, 201), r.text
    assert r.json()["placeholder"] == p1  # kept across updates
    g = eapi.get("/v1/egress-secrets/CRUD_TOKEN")
    assert g.status_code == 200 and g.json()["hosts"] == ["api.test"] and "v2" not in json.dumps(g.json())
    d = eapi.delete("/v1/egress-secrets/CRUD_TOKEN")
    assert d.status_code == 200, d.text
    assert eapi.get("/v1/egress-secrets/CRUD_TOKEN").status_code == 404


# ---------------------------------------------------------------------------
# Audit


def test_audit_log_lists_decisions(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    allowed(sbx, "http://echo.test/bytes/5000")
    refused(sbx, "http://other.test/")
    refused(sbx, "http://169.254.169.254/")
    # The byte counts complete an entry when its connection ends, which
    # the client's answer may beat by a moment: wait for the ends.
    log = wait_until(lambda: (lambda l: len(l) == 3 and all(e["end"] for e in l) and l)(egress_log(eapi, sbx.id)),
                     timeout=30, what="three entries with their ends")
    fields = {"at", "host", "port", "kind", "allowed", "reason", "address", "bytesOut", "bytesIn",
              "intercepted", "secretsUsed", "rule", "end", "durationMs"}
    for e in log:
        assert fields <= set(e), e
        assert isinstance(e["durationMs"], int) and e["durationMs"] >= 0, e
    ok = [e for e in log if e["host"] == "echo.test" and e["allowed"]]
    assert ok[0]["rule"] == "allow echo.test" and ok[0]["end"] != "refused", ok
    assert ok and ok[0]["port"] == 80 and ok[0]["bytesIn"] >= 5000 and ok[0]["bytesOut"] > 0, log
    no = [e for e in log if e["host"] == "other.test"]
    assert no and not no[0]["allowed"] and no[0]["reason"], log
    meta = [e for e in log if "169.254" in e["host"]]
    assert meta and not meta[0]["allowed"], log
    lim = eapi.get(f"/v1/sandboxes/{sbx.id}/egress", params={"limit": 1})
    assert lim.status_code == 200 and len(lim.json()["entries"]) == 1
    for bad in ("0", "-1", "x", "100000000"):
        r = eapi.get(f"/v1/sandboxes/{sbx.id}/egress", params={"limit": bad})
        assert r.status_code == 400, f"limit={bad}: {r.status_code} {r.text}"
    assert eapi.get("/v1/sandboxes/sbx_doesnotexist00000/egress").status_code == 404


def test_audit_entry_exists_when_the_request_returns(eapi, edriver, env):
    """The proxy sends its decision before it relays a byte upstream or
    answers a refusal, and the daemon writes the entry before it passes on
    anything the proxy sent after it: the log is read right after each exec,
    without waiting, and holds the connection that exec used. Each
    connection stays one entry, completed in place when it ends."""
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test", "api2.test"],
                                                       "deny": ["other.test"]})
    rounds = 5
    for i in range(rounds):
        allowed(sbx, f"http://echo.test/now/{i}")
        log = egress_log(eapi, sbx.id)
        ok = [e for e in log if e["host"] == "echo.test"]
        assert len(ok) == i + 1 and ok[0]["allowed"] and ok[0]["kind"] == "http", log
        assert ok[0]["rule"] == "allow echo.test" and ok[0]["address"], ok[0]

        refused(sbx, f"http://other.test/now/{i}")
        log = egress_log(eapi, sbx.id)
        no = [e for e in log if e["host"] == "other.test"]
        assert len(no) == i + 1 and not no[0]["allowed"] and "deny list" in no[0]["reason"], log
        assert no[0]["rule"] == "deny other.test", no[0]

        # A tunnel (no secret applies to api2.test): decided before its 200.
        allowed(sbx, f"https://api2.test/now/{i}", "-k")
        log = egress_log(eapi, sbx.id)
        tun = [e for e in log if e["host"] == "api2.test"]
        assert len(tun) == i + 1 and tun[0]["allowed"] and tun[0]["kind"] == "connect", log
    log = wait_until(lambda: (lambda l: all(e["end"] for e in l) and l)(egress_log(eapi, sbx.id)),
                     timeout=30, what="every entry's end")
    assert len(log) == 3 * rounds, log
    for e in log:
        if e["allowed"]:
            assert e["bytesIn"] > 0 and e["bytesOut"] > 0 and e["end"] != "refused", e
        else:
            assert e["end"] == "refused" and e["bytesOut"] == 0, e


# ---------------------------------------------------------------------------
# pip through the proxy


def test_pip_install_from_local_index(eapi, edriver, env):
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["pypi.test"]})
    if sbx.exec("python3 -m pip --version")["exitCode"] != 0:
        pytest.skip("the image has no pip")
    res = sbx.exec("python3 -m pip install --break-system-packages --no-cache-dir --disable-pip-version-check "
                   "--index-url http://pypi.test/simple/ --trusted-host pypi.test "
                   f"--target /workspace/pkgs {env.index.name} && "
                   f"PYTHONPATH=/workspace/pkgs python3 -c 'import {env.index.name} as m; print(m.MARKER)'",
                   timeoutMs=120000)
    assert res["exitCode"] == 0, res
    assert f"hello from {env.index.name}" in res["stdout"]
    assert any(r["path"].startswith("/files/") for r in env.index.seen())


def test_pip_install_over_https_intercepted(eapi, edriver, env):
    """HTTPS index behind a secret (so the proxy intercepts): pip trusts the
    daemon's CA through PIP_CERT and the system store."""
    r = put_secret(eapi, "INDEX_TOKEN", "index-secret-value", ["pypis.test"])
    assert r.status_code in (200, 201), r.text
    try:
        sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["pypis.test"]})
        if sbx.exec("python3 -m pip --version")["exitCode"] != 0:
            pytest.skip("the image has no pip")
        res = sbx.exec("python3 -m pip install --break-system-packages --no-cache-dir "
                       "--disable-pip-version-check --index-url https://pypis.test/simple/ "
                       f"--target /workspace/pkgs {env.tls_index.name}", timeoutMs=120000)
        assert res["exitCode"] == 0, res
        assert any(r["path"].startswith("/files/") for r in env.tls_index.seen())
    finally:
        eapi.delete("/v1/egress-secrets/INDEX_TOKEN")


# ---------------------------------------------------------------------------
# Trial keys: web ports only


def test_trial_key_web_ports_only(env, edriver):
    r = httpx.post(env.daemon.base_url + "/v1/trial")
    if r.status_code != 201:
        pytest.skip(f"no trial key: {r.status_code} {r.text[:200]}")
    key = r.json()["key"]
    with Api(env.daemon, key=key) as tapi:
        try:
            sbx = tapi.create_sandbox(driver=edriver, network={
                "internet": True, "allow": ["echo.test", f"other.test:{env.echo.port}"]})
            allowed(sbx, "http://echo.test/")
            refused(sbx, f"http://other.test:{env.echo.port}/", why="trial|80|443|port")
        finally:
            tapi.delete_all()


# ---------------------------------------------------------------------------
# CLI: secrets set/ls/rm, sandbox egress, --internet/--no-internet/--allow/--deny


@pytest.fixture
def ecli(build_dir, env):
    def run(*args: str, input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        e = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        e.update(env.daemon.env())
        return subprocess.run([str(build_dir / "runtime"), *args], env=e, capture_output=True,
                              timeout=timeout, input=input)
    return run


def test_cli_secrets(ecli, eapi, env):
    value = "cli-secret-value-42"
    r = ecli("secrets", "set", "CLI_TOKEN", "--hosts", "api.test,*.api.test", "--hosts", "api2.test",
             input=(value + "\n").encode())
    assert r.returncode == 0, r.stderr
    assert b"runtime-secret-CLI_TOKEN-" in r.stdout and value.encode() not in r.stdout
    g = eapi.get("/v1/egress-secrets/CLI_TOKEN").json()
    assert g["hosts"] == ["api.test", "*.api.test", "api2.test"]
    # the trailing newline was dropped: the value arrives upstream exactly
    sbx = eapi.create_sandbox(network={"internet": True, "allow": ["api.test"]})
    res = sbx.exec("curl -sS --max-time 20 -H \"X-Token: $CLI_TOKEN\" https://api.test/cli")
    assert res["exitCode"] == 0, res
    assert dict((k.lower(), v) for k, v in env.tls.seen()[-1]["headers"])["x-token"] == value
    ls = ecli("secrets", "ls")
    assert ls.returncode == 0 and b"CLI_TOKEN" in ls.stdout and b"api.test,*.api.test,api2.test" in ls.stdout
    assert value.encode() not in ls.stdout
    js = json.loads(ecli("--json", "secrets", "ls").stdout)
    assert any(s["name"] == "CLI_TOKEN" for s in js["secrets"])
    # refusals: value on argv, no hosts, bad name, line breaks, empty
    assert ecli("secrets", "set", "CLI_TOKEN", value, "--hosts", "api.test", input=b"x").returncode == 2
    assert ecli("secrets", "set", "CLI_TOKEN", input=b"x").returncode == 2
    assert ecli("secrets", "set", "1BAD", "--hosts", "api.test", input=b"x").returncode == 2
    bad = ecli("secrets", "set", "CLI_TOKEN", "--hosts", "api.test", input=b"a\nb\n")
    assert bad.returncode == 1 and b"line break" in bad.stderr
    assert ecli("secrets", "set", "CLI_TOKEN", "--hosts", "api.test", input=b"").returncode == 1
    big = ecli("secrets", "set", "CLI_TOKEN", "--hosts", "api.test", input=b"x" * 9000)
    assert big.returncode == 1 and b"longer" in big.stderr
    assert ecli("secrets", "rm", "CLI_TOKEN").returncode == 0
    gone = ecli("secrets", "rm", "CLI_TOKEN")
    assert gone.returncode == 1 and b"no secret" in gone.stderr


def test_cli_network_flags_and_egress_log(ecli, eapi, env):
    r = ecli("sandbox", "create", "--allow", "echo.test", "--deny", "other.test")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    eapi.created.append(sid)
    net = eapi.sandbox(sid)["network"]
    assert net["internet"] is True and net["allow"] == ["echo.test"] and net["deny"] == ["other.test"]
    from helpers import Sandbox
    sbx = Sandbox(eapi, eapi.sandbox(sid))
    allowed(sbx, "http://echo.test/bytes/3000")
    refused(sbx, "http://other.test/")
    eg = ecli("sandbox", "egress", sid)
    assert eg.returncode == 0, eg.stderr
    lines = eg.stdout.decode().splitlines()
    assert lines[0].split()[:4] == ["TIME", "KIND", "HOST:PORT", "RESULT"]
    assert any("echo.test:80" in ln and "allowed" in ln for ln in lines), lines
    assert any("other.test:80" in ln and "refused" in ln for ln in lines), lines
    one = json.loads(ecli("--json", "sandbox", "egress", "--limit", "1", sid).stdout)
    assert len(one["entries"]) == 1
    assert ecli("sandbox", "egress", "--limit", "0", sid).returncode == 2
    assert ecli("sandbox", "egress", "not an id").returncode == 2

    r = ecli("sandbox", "create", "--internet")
    assert r.returncode == 0, r.stderr
    eapi.created.append(r.stdout.decode().strip())
    assert eapi.sandbox(eapi.created[-1])["network"]["internet"] is True
    r = ecli("sandbox", "create", "--no-internet")
    assert r.returncode == 0, r.stderr
    eapi.created.append(r.stdout.decode().strip())
    assert eapi.sandbox(eapi.created[-1])["network"]["internet"] is False
    assert ecli("sandbox", "create", "--no-internet", "--allow", "echo.test").returncode == 2
    assert ecli("sandbox", "create", "--no-internet", "--internet").returncode == 2
    out = ecli("sandbox", "run", "--allow", "echo.test", "--",
               "sh", "-c", "curl -sS --max-time 20 http://echo.test/run >/dev/null && echo ok")
    assert out.returncode == 0 and out.stdout.strip() == b"ok", out.stderr
    assert ecli("sandbox", "run", "--", "sh", "-c",
                "curl -sS --max-time 20 -o /dev/null -w '%{http_code}' http://echo.test/").stdout == b"403"


# ---------------------------------------------------------------------------
# SDK: sbx.network.set, egress_log, Secrets against the real daemon


def test_sdk_network_set_and_secrets(eapi, env):
    import sys
    sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
    from withruntime import Sandbox as SdkSandbox, Secrets

    d = env.daemon
    with Secrets(api_key=d.api_key, base_url=d.base_url) as secrets:
        made = secrets.set("SDK_TOKEN", "sdk-secret-value", ["api.test"])
        assert made["placeholder"].startswith("runtime-secret-SDK_TOKEN-")
        assert "sdk-secret-value" not in json.dumps(secrets.list())
        try:
            with SdkSandbox.create(api_key=d.api_key, base_url=d.base_url,
                                   network={"internet": True, "allow": ["echo.test"]}) as sbx:
                assert sbx.network["allow"] == ["echo.test"]
                probe = "curl -sS --max-time 20 -o /dev/null -w '%{http_code}' "
                assert sbx.exec(probe + "http://other.test/").stdout == "403"
                new = sbx.network.set(internet=True, allow=["other.test", "api.test"], deny=["echo.test"])
                assert new["allow"] == ["other.test", "api.test"] and new["deny"] == ["echo.test"]
                assert sbx.exec(probe + "http://other.test/").stdout == "200"
                assert sbx.exec(probe + "http://echo.test/").stdout == "403"
                assert sbx.exec(probe + "-H \"X-K: $SDK_TOKEN\" https://api.test/").stdout == "200"
                hdrs = dict((k.lower(), v) for k, v in env.tls.seen()[-1]["headers"])
                assert hdrs["x-k"] == "sdk-secret-value"
                log = sbx.egress_log(limit=10)
                assert any(e["host"] == "echo.test" and not e["allowed"] for e in log), log
        finally:
            secrets.delete("SDK_TOKEN")


EOF_PROBE = r'''
import socket, ssl, sys, time
host, verify = sys.argv[1], sys.argv[2] == "verify"
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
ctx = ssl.create_default_context() if verify else ssl._create_unverified_context()
t = ctx.wrap_socket(s, server_hostname=host)
t.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
t0, out = time.monotonic(), b""
try:
    while True:
        b = t.recv(65536)
        if not b:
            print(f"EOF {time.monotonic() - t0:.3f}")
            break
        out += b
except (TimeoutError, socket.timeout):
    print(f"NOEOF {time.monotonic() - t0:.3f}")
except ssl.SSLError as e:  # an EOF without close_notify is an end too
    print(f"EOF {time.monotonic() - t0:.3f} {e}")
print(out.split(b"\r\n")[0].decode())
'''


@pytest.mark.parametrize("intercepted", [False, True], ids=["tunnel", "intercepted"])
def test_upstream_close_reaches_the_client(eapi, edriver, env, secret, intercepted):
    """A server that answers `Connection: close` and closes: the sandbox's
    client must see the end of the stream, through a plain tunnel and through
    interception alike (clients that read to EOF would otherwise hang)."""
    host = "api.test" if intercepted else "api2.test"  # the secret applies to api.test only
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": [host]})
    sbx.write("/tmp/eof.py", EOF_PROBE.encode())
    res = sbx.exec(argv=["python3", "/tmp/eof.py", host, "verify" if intercepted else "noverify"],
                   timeoutMs=30000)
    assert res["exitCode"] == 0, res
    first, status = res["stdout"].splitlines()[:2]
    assert status.startswith("HTTP/1.1 200"), res["stdout"]
    assert first.startswith("EOF"), f"no end of stream within 5 s after the server closed: {res['stdout']}"


HOSTS_MARK = "# runtime egress test (removed at teardown)"
RESOLVER_NAMES = {"lo.rt-egress.test": "127.0.0.1", "ten.rt-egress.test": "10.0.0.1",
                  "meta.rt-egress.test": "169.254.169.254", "v6lo.rt-egress.test": "::1",
                  "mapped.rt-egress.test": "::ffff:10.0.0.1", "cgnat.rt-egress.test": "100.64.0.1"}


@pytest.fixture
def hosts_overrides():
    """Names that the host's resolver (/etc/hosts) points at internal
    addresses, as an attacker's DNS would; removed at teardown."""
    path = "/etc/hosts"
    if not os.access(path, os.W_OK):
        pytest.skip("/etc/hosts is not writable")
    original = open(path).read()
    with open(path, "a") as f:
        f.write("".join(f"{addr} {name} {HOSTS_MARK}\n" for name, addr in RESOLVER_NAMES.items()))
    try:
        yield RESOLVER_NAMES
    finally:
        now = open(path).read()
        kept = "".join(ln for ln in now.splitlines(keepends=True) if HOSTS_MARK not in ln)
        with open(path, "w") as f:
            f.write(kept if kept.strip() else original)


def test_names_resolving_to_internal_addresses_refused(api, driver, hosts_overrides):
    """The suite-wide daemon (fixture `daemon`) has no --egress-test-upstream: names whose lookup
    gives loopback, private, link-local, CGNAT or mapped addresses are refused
    after resolution, even when the policy names them."""
    sbx = api.create_sandbox(driver=driver, network={"internet": True, "allow": list(hosts_overrides)})
    for name, addr in hosts_overrides.items():
        text = refused(sbx, f"http://{name}/")
        assert addr.split(":")[-1] in text or "address" in text.lower(), f"{name}: {text[:300]}"
        refused(sbx, f"https://{name}/", "--proxytunnel", "-k")


REFUSED_UPLOAD = r'''
import socket, sys, threading
host, rounds = sys.argv[1], int(sys.argv[2])
lost = []
for i in range(rounds):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    body = b"x" * 65536
    def send():
        try:
            s.sendall(f"POST http://{host}/up HTTP/1.1\r\nHost: {host}\r\nContent-Length: {64 * len(body)}\r\n\r\n".encode())
            for _ in range(64):
                s.sendall(body)
        except OSError:
            pass
    t = threading.Thread(target=send)
    t.start()
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except OSError as e:
        out += f" [{e}]".encode()
    t.join()
    s.close()
    if not out.startswith(b"HTTP/1.1 403"):
        lost.append((i, out[:80]))
print(f"lost {len(lost)} of {rounds}: {lost[:3]}")
'''


def test_refusal_reaches_a_client_still_sending(eapi, edriver, env):
    """A refused request whose body is still on its way: the proxy answers
    after the head and stops reading, and the sandbox's client must still
    get the answer, not an end of stream without it (the daemon kept
    relaying the proxy's answer after the proxy stopped taking bytes)."""
    sbx = eapi.create_sandbox(driver=edriver, network={"internet": True, "allow": ["echo.test"]})
    sbx.write("/tmp/up.py", REFUSED_UPLOAD.encode())
    res = sbx.exec(argv=["python3", "/tmp/up.py", "other.test", "40"], timeoutMs=120000)
    assert res["exitCode"] == 0, res
    assert res["stdout"].startswith("lost 0 of 40"), res["stdout"]
    assert env.echo.seen() == []
