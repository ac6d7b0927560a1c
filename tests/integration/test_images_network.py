"""A build's own egress policy (docs/images.md, "The build's network"): `build.network` in
`POST /v1/images`, a sandbox create's `network` read by the create's own parser, on a daemon of
this module per driver (namespace and gVisor) whose builds run on that driver.

No traffic leaves the machine: the upstreams are EchoServers of egress_servers.py on 127.0.0.1,
reached under the names echo.test and other.test (plain HTTP) and api.test (HTTPS, a test CA's)
that the daemon maps with --egress-test-upstream, as test_egress.py does.

A RUN that fetches from an allowed host makes an image holding what it fetched; the same build
without the policy hits the cache (the policy is not in the key, as Docker's network is not in
its) and with `cache: false` fails its RUN, the step named; a host off the list and a denied host
are refused by the proxy; the owner's egress secret is never substituted in a build's request,
nor its placeholder in a step's env; a trial key's build reaches web ports only and is no larger
than its sandboxes; bad values are 400 naming `build.network...` in the create's own words; the
published client and ours pass `build={"network": ...}` through."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import httpx
import pytest

from conftest import _finish_daemon, _need_root
from egress_servers import EchoServer, TestCa
from helpers import REPO, Api, Daemon, DaemonError, skip_unless_driver, wait_until

NONE = {"internet": False, "allow": [], "deny": []}


class Net:
    """A daemon whose builds run on one driver, and the upstreams its sandboxes may be let reach:
    echo (plain HTTP, echo.test and other.test) and tls (HTTPS, api.test, a test CA's)."""

    def __init__(self, daemon: Daemon, echo: EchoServer, tls: EchoServer, driver: str):
        self.daemon, self.echo, self.tls, self.driver = daemon, echo, tls, driver

    def paths(self) -> list[str]:
        return [r["path"] for r in self.echo.seen()]


@pytest.fixture(scope="module", params=["namespace", "gvisor"])
def net(request, build_dir, image_dir, tmp_path_factory):
    _need_root()
    driver = request.param
    tmp = tmp_path_factory.mktemp(f"imgnet-{driver}")
    ca = TestCa(tmp / "ca", "runtime image network tests CA")
    echo = EchoServer().start()
    tls = EchoServer(tls=ca.leaf("api", ["api.test"])).start()
    args = ["--driver", driver, "--egress-extra-ca", str(ca.cert_path),
            "--egress-test-upstream", f"api.test=127.0.0.1:{tls.port}"]
    for name in ("echo.test", "other.test"):
        args += ["--egress-test-upstream", f"{name}=127.0.0.1:{echo.port}"]
    d = Daemon(build_dir, image_dir, tmp / "state", f"runtime-test-{os.getpid()}-imgnet-{driver}",
               extra_args=args)
    try:
        d.start()
    except DaemonError as err:
        echo.stop()
        tls.stop()
        if "driver" in str(err):
            pytest.skip(f"driver {driver}: the daemon does not start with it: {str(err)[-300:]}")
        pytest.fail(str(err), pytrace=False)
    try:
        skip_unless_driver(d, driver)
        yield Net(d, echo, tls, driver)
    finally:
        _finish_daemon(d)
        echo.stop()
        tls.stop()


@pytest.fixture
def napi(net):
    c = Api(net.daemon, timeout=300)
    net.echo.clear()
    net.tls.clear()
    yield c
    for image in c.get("/v1/images", params={"limit": 100}).json().get("data", []):
        c.post(f"/v1/images/{image['id']}:delete", json={})
    problems = c.delete_all()
    c.close()
    assert net.daemon.alive(), "runtimed died during the test"
    assert not problems, problems


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _wait(api: Api, image_id: str, timeout: float = 300) -> dict:
    def done():
        j = api.get(f"/v1/images/{image_id}").json()
        return j if j["state"] not in ("queued", "building") else None
    return wait_until(done, timeout, 0.3, what=f"image {image_id} built")


def _build(api: Api, dockerfile: str, **body) -> dict:
    r = api.post("/v1/images", json={"name": _name("net"), "dockerfile": dockerfile, **body})
    assert r.status_code == 201, r.text
    return _wait(api, r.json()["id"])


def _log(api: Api, image_id: str) -> str:
    return "\n".join(l["line"] for l in api.get(f"/v1/images/{image_id}/logs").json()["lines"])


def _fetch(marker: str) -> str:
    return f"FROM default\nRUN curl -fsS http://echo.test/{marker} -o /opt/fetched.json && echo fetched\n"


def test_a_build_fetches_from_an_allowed_host(net, napi):
    marker = uuid.uuid4().hex
    image = _build(napi, _fetch(marker), build={"network": {"allow": ["echo.test"]}})
    assert image["state"] == "ready", image
    allowed = {"internet": True, "allow": ["echo.test"], "deny": []}
    assert image["build"]["network"] == allowed, image
    assert napi.get(f"/v1/images/{image['id']}").json()["build"]["network"] == allowed
    log = _log(napi, image["id"])
    assert f"({net.driver})" in log and "fetched" in log, log
    assert f"/{marker}" in net.paths(), net.paths()
    # What the step fetched is in the image.
    sbx = napi.create_sandbox(driver=net.driver, image=image["id"])
    out = napi.exec(sbx.id, command="cat /opt/fetched.json")
    assert out["exitCode"] == 0 and json.loads(out["stdout"])["path"] == f"/{marker}", out

    # The same build with no network is the same cache key: a new version sharing the disk,
    # recording the policy it was asked with.
    again = _build(napi, _fetch(marker))
    assert again["state"] == "ready" and again["build"]["network"] == NONE, again
    assert again["snapshotId"] != image["snapshotId"], again
    assert f"using the cache: the same build as image {image['id']}" in _log(napi, again["id"])
    assert net.paths().count(f"/{marker}") == 1, net.paths()

    # Run again (cache: false) with no network: its RUN fails, the step named.
    failed = _build(napi, _fetch(marker), cache=False)
    assert failed["state"] == "failed", failed
    assert "step 2/2 (line 2, RUN): the command returned a non-zero code" in failed["error"], failed
    assert failed["build"]["network"] == NONE, failed
    assert net.paths().count(f"/{marker}") == 1, net.paths()


def test_hosts_off_the_list_and_denied_hosts_are_refused(net, napi):
    marker = uuid.uuid4().hex
    probe = ("code=$(curl -sS -o /tmp/body -w '%{{http_code}}' http://{host}/{marker}); cat /tmp/body; echo; "
             "test \"$code\" = 200")
    # An allow-list: the host not on it is refused by the proxy.
    dockerfile = (f"FROM default\nRUN {probe.format(host='echo.test', marker=marker + '-1')}\n"
                  f"RUN {probe.format(host='other.test', marker=marker + '-2')}\n")
    image = _build(napi, dockerfile, build={"network": {"allow": ["echo.test"]}})
    assert image["state"] == "failed", image
    assert "step 3/3 (line 3, RUN): the command returned a non-zero code: 1" in image["error"], image
    log = _log(napi, image["id"])
    assert "runtime egress: other.test:80 refused: the host is not in the sandbox's allow list" in log, log
    assert f"/{marker}-1" in net.paths() and f"/{marker}-2" not in net.paths(), net.paths()

    # The internet with a deny-list: the denied host is refused, others reached.
    image = _build(napi, dockerfile.replace(marker, marker + "b"),
                   build={"network": {"internet": True, "deny": ["other.test"]}})
    assert image["state"] == "failed" and "step 3/3 (line 3, RUN)" in image["error"], image
    assert image["build"]["network"] == {"internet": True, "allow": [], "deny": ["other.test"]}, image
    assert "runtime egress: other.test:80 refused" in _log(napi, image["id"])
    assert f"/{marker}b-1" in net.paths() and f"/{marker}b-2" not in net.paths(), net.paths()


SECRET_VALUE = "sk-live-0123456789abcdefBUILDSECRET"


def test_a_build_gets_no_egress_secret(net, napi):
    """The owner's secret for api.test is substituted for its placeholder in a sandbox's request
    (the control) but never in a build's, even one that sends the placeholder, which the key can
    read: no placeholder is in a step's environment and the value never reaches the upstream."""
    r = napi.put("/v1/egress-secrets/BUILD_TOKEN", json={"value": SECRET_VALUE, "hosts": ["api.test"]})
    assert r.status_code in (200, 201), r.text
    placeholder = r.json()["placeholder"]
    try:
        sbx = napi.create_sandbox(driver=net.driver, network={"allow": ["api.test"]})
        out = sbx.exec(f"curl -fsS -H 'Authorization: Bearer {placeholder}' https://api.test/control")
        assert out["exitCode"] == 0, out
        headers = {k.lower(): v for k, v in net.tls.seen()[-1]["headers"]}
        assert headers["authorization"] == f"Bearer {SECRET_VALUE}", net.tls.seen()
        # The build: the placeholder sent by hand. Without a secret in scope the proxy tunnels
        # (no interception, so the upstream's own certificate: -k), and the placeholder arrives.
        assert sbx.run("printenv BUILD_TOKEN").strip() == placeholder
        dockerfile = ("FROM default\nRUN env > /opt/env.txt\n"
                      f"RUN curl -fsSk -H 'Authorization: Bearer {placeholder}' https://api.test/build "
                      "-o /opt/seen.json\n")
        image = _build(napi, dockerfile, build={"network": {"allow": ["api.test"]}})
        assert image["state"] == "ready", image
        # The step's environment: the proxy's variables, no placeholder.
        built = napi.create_sandbox(driver=net.driver, image=image["id"])
        env = dict(l.split("=", 1) for l in built.run("cat /opt/env.txt").splitlines() if "=" in l)
        assert env.get("HTTPS_PROXY", "").startswith("http://127.0.0.1:"), env
        assert "BUILD_TOKEN" not in env and placeholder not in json.dumps(env), env
        seen = net.tls.seen()
        assert [r["path"] for r in seen] == ["/control", "/build"], seen
        assert SECRET_VALUE not in json.dumps(seen[-1]), seen[-1]
        assert {k.lower(): v for k, v in seen[-1]["headers"]}["authorization"] == f"Bearer {placeholder}"
    finally:
        napi.delete("/v1/egress-secrets/BUILD_TOKEN")


# What the parser of a create's `network` says of each: the build's names the field build.network.
BAD = [
    ("yes", 400, "build.network must be"),
    ({"internet": "yes"}, 400, "build.network.internet must be a boolean"),
    ({"allow": "echo.test"}, 400, "build.network.allow must be"),
    ({"allow": ["echo.test", 7]}, 400, "build.network.allow[1] must be a string"),
    ({"allow": ["not a host!"]}, 400, "build.network.allow[0] is not a host pattern"),
    ({"deny": ["x" * 254]}, 400, "build.network.deny[0] must be 1..253 bytes"),
    ({"allow": [f"h{i}.example.org" for i in range(257)]}, 400, "build.network.allow has more than 256 entries"),
    ({"bogus": 1}, 400, "unknown field build.network.bogus"),
    ({"connect": ["db.example.org:5432"]}, 501, "build.network.connect"),
]


@pytest.mark.driver_independent
def test_bad_build_networks_are_refused_naming_the_field(net, napi):
    name = _name("bad")
    for value, status, says in BAD:
        r = napi.post("/v1/images", json={"name": name, "dockerfile": "FROM default\n",
                                          "build": {"network": value}})
        assert r.status_code == status and says in r.json()["error"]["message"], (value, r.text)
        # The same words as a create's, the field aside: one parser.
        c = napi.post("/v1/sandboxes", json={"network": value, "driver": net.driver})
        assert c.status_code == status, (value, c.text)
        assert c.json()["error"]["message"] == r.json()["error"]["message"].replace("build.network", "network")
    r = napi.post("/v1/images", json={"name": name, "dockerfile": "FROM default\n", "build": {"networks": {}}})
    assert r.status_code == 400 and "unknown field build.networks" in r.json()["error"]["message"], r.text
    assert "network" in r.json()["error"]["hint"], r.text
    # null is the default: no network.
    r = napi.post("/v1/images", json={"name": name, "dockerfile": "FROM default\n", "build": {"network": None}})
    assert r.status_code == 201 and r.json()["build"]["network"] == NONE, r.text
    assert _wait(napi, r.json()["id"])["state"] == "ready"
    assert [i["id"] for i in napi.get("/v1/images", params={"name": name}).json()["data"]] == [r.json()["id"]]


@pytest.mark.driver_independent
def test_a_trial_keys_build_is_a_trial_sandbox(net, napi):
    """Web ports only (the proxy acts on the build sandbox's trial flag, as on any of the key's
    sandboxes), and no larger than a trial create may ask for; a read key builds nothing."""
    r = httpx.post(net.daemon.base_url + "/v1/trial")
    if r.status_code != 201:
        pytest.skip(f"no trial key: {r.status_code} {r.text[:200]}")
    port = net.echo.port
    marker = uuid.uuid4().hex
    with Api(net.daemon, key=r.json()["key"], timeout=300) as trial:
        dockerfile = (f"FROM default\nRUN curl -fsS http://echo.test/{marker}-80\n"
                      f"RUN curl -sS http://other.test:{port}/{marker}-port; exit 1\n")
        image = _build(trial, dockerfile, build={"network": {"allow": ["echo.test", f"other.test:{port}"]}})
        try:
            assert image["state"] == "failed" and "step 3/3 (line 3, RUN)" in image["error"], image
            log = _log(trial, image["id"])
            assert "reaches ports 80 and 443 only (a trial key)" in log, log
            assert f"/{marker}-80" in net.paths() and f"/{marker}-port" not in net.paths(), net.paths()
        finally:
            trial.post(f"/v1/images/{image['id']}:delete", json={})
        for field, value in (("memoryMiB", 4096), ("vcpu", 3)):
            r = trial.post("/v1/images", json={"name": _name("big"), "dockerfile": "FROM default\n",
                                               "build": {field: value}})
            assert r.status_code == 400 and f"build.{field}" in r.json()["error"]["message"], r.text
    r = napi.post("/v1/keys", json={"name": "reader", "access": "read"})
    assert r.status_code == 201, r.text
    with Api(net.daemon, key=r.json()["key"]) as reader:
        r = reader.post("/v1/images", json={"name": _name("ro"), "dockerfile": "FROM default\n",
                                            "build": {"network": {"internet": True}}})
        assert r.status_code == 403, r.text


CLIENT = """
import json, sys
from withruntime import Runtime
runtime = Runtime()
marker, name = sys.argv[1], sys.argv[2]
image = runtime.images.build(dockerfile="FROM default\\nRUN curl -fsS http://echo.test/" + marker + " -o /opt/f\\n",
                             name=name, build={"network": {"allow": ["echo.test"]}, "timeout_seconds": 300})
print(json.dumps({"state": image["state"], "build": image.get("build")}))
"""


@pytest.mark.driver_independent
def test_the_published_client_and_ours_pass_the_network(net, napi, published_client):
    marker = uuid.uuid4().hex
    got = published_client.run_json(net.daemon, CLIENT, args=[marker + "-pub", _name("pub")], timeout=600)
    want = {"vcpu": 1, "memoryMiB": 1024, "diskMiB": 4096, "timeoutSeconds": 300,
            "network": {"internet": True, "allow": ["echo.test"], "deny": []}}
    assert got == {"state": "ready", "build": want}, got
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "sdk" / "python" / "src"),
           "RUNTIME_API_KEY": net.daemon.api_key, "RUNTIME_BASE_URL": net.daemon.base_url}
    r = subprocess.run([sys.executable, "-c", CLIENT, marker + "-ours", _name("ours")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"state": "ready", "build": want}, r.stdout
    assert f"/{marker}-pub" in net.paths() and f"/{marker}-ours" in net.paths(), net.paths()


@pytest.mark.driver_independent
def test_the_cli_builds_with_a_network(net, napi, build_dir, tmp_path):
    """runtime image build --allow HOST (--deny, --internet) -t NAME DIR: the steps reach HOST;
    without it the same fetch fails its step; the flags without -t are a usage error."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    marker = uuid.uuid4().hex
    (ctx / "Dockerfile").write_text(_fetch(marker + "-cli"))
    env = {"PATH": "/usr/bin:/bin", **net.daemon.env()}
    name = _name("cli")

    def run(*args):
        return subprocess.run([str(build_dir / "runtime"), "image", "build", *args], env=env,
                              capture_output=True, text=True, timeout=300)
    r = run("--allow", "echo.test", "--deny", "other.test", "-t", f"{name}:v1", str(ctx))
    assert r.returncode == 0 and f"image {name}:v1 is ready" in r.stderr, r.stderr + r.stdout
    image = napi.get("/v1/images/resolve", params={"ref": f"{name}:v1"}).json()
    assert image["build"]["network"] == {"internet": True, "allow": ["echo.test"], "deny": ["other.test"]}, image
    assert f"/{marker}-cli" in net.paths(), net.paths()
    (ctx / "Dockerfile").write_text(_fetch(marker + "-none"))
    r = run("-t", f"{name}:v2", str(ctx))
    assert r.returncode != 0 and "step 2/2 (line 2, RUN): the command returned a non-zero code" in r.stderr, \
        r.stderr
    assert f"/{marker}-none" not in net.paths(), net.paths()
    r = run("--allow", "not a host!", "-t", f"{name}:v3", str(ctx))
    assert r.returncode != 0 and "build.network.allow[0] is not a host pattern" in r.stderr, r.stderr
    r = run("--internet", "default")
    assert r.returncode == 2 and "are for -t builds" in r.stderr, r.stderr
