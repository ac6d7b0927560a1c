"""Images from OCI registries (docs/images.md): a registry this test starts on loopback (Debian's
docker-registry), a small image the test makes with umoci and pushes there with skopeo, then
`FROM 127.0.0.1:PORT/repo:tag` and `FROM ...@sha256:digest` in a Dockerfile and `images.build(image=...)`
of the published client, and sandboxes from the results on namespace and gVisor. The attacks and
failures: a digest the registry does not have, an answer of garbage from a loopback HTTP server, a
missing image, an image larger than the pull's bound, a plain-HTTP registry the operator did not
allow, a pulled tree's internal name given by a client; each a clear error, nothing listed as
ready, and nothing of the pull left on disk. On the microVM, an image FROM a registry's image
(with a RUN and a COPY) boots on a disk holding the registry's whole root, whose entries shadowing
the agent's directory, an init and a mount point of the agent's change nothing of its start, and
nothing of the built-in root beneath shows through."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
import uuid

import pytest

from conftest import _finish_daemon, _start_daemon, need_microvm_parts
from helpers import Api, free_port, skip_unless_driver, wait_until

TOOLS = ("/usr/bin/docker-registry", "/usr/bin/skopeo", "/usr/bin/umoci")
PULL_MAX_MIB = 24
ARCHIVES: dict = {}
PRIVATE_LOGIN = ("puller", "s3cret-" + uuid.uuid4().hex[:8])


def _need_tools():
    missing = [t for t in TOOLS if not os.access(t, os.X_OK)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/install-deps.sh installs them)")


def _tiny_rootfs(root):
    """A root filesystem of a few host programs and their libraries: enough for a shell step."""
    (root / "etc").mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "bin").mkdir()
    progs = ["sh", "cat", "ls", "mkdir", "rm", "cp", "chown", "chmod", "dirname", "env", "id", "date"]
    libs = set()
    for p in progs:
        path = shutil.which(p)
        shutil.copy(os.path.realpath(path), root / "bin" / p)
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        libs.update(tok for tok in out.split() if tok.startswith("/"))
    for lib in libs:
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(lib), dest)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000::/workspace:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\nsandbox:x:1000:\n")
    (root / "etc" / "marker").write_text("from the registry\n")


def _hostile_rootfs(tiny, root):
    """The tiny root with an os-release and a file to delete, and what would take the agent's
    start if the guest read it: a script at the agent's path and at /sbin/init that leave a mark,
    and /run (a mount point of the agent's) a symbolic link out of the root."""
    shutil.copytree(tiny, root, symlinks=True)
    (root / "etc" / "os-release").write_text('PRETTY_NAME="Registry Base"\nID=registry\n')
    (root / "etc" / "gone").write_text("deleted by the build\n")
    for script in (".runtime/agent", "sbin/init"):
        (root / script).parent.mkdir(parents=True, exist_ok=True)
        (root / script).write_text("#!/bin/sh\n# hostile\necho pwned > /pwned\n")
        (root / script).chmod(0o755)
    (root / "run").symlink_to("../../../../etc")


def _run(*argv, cwd=None):
    r = subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd, timeout=300)
    assert r.returncode == 0, f"{argv}: {r.stdout}\n{r.stderr}"
    return r.stdout


def _serve_registry(work, auth: tuple[str, str] | None = None):
    """docker-registry on a loopback port of its own; with auth, behind an htpasswd of one user."""
    import crypt
    import httpx
    port = free_port()
    config = (f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {work}/data\n"
              f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
    if auth:
        (work / "htpasswd").write_text(f"{auth[0]}:{crypt.crypt(auth[1], crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")
        config += f"auth:\n  htpasswd:\n    realm: test\n    path: {work}/htpasswd\n"
    (work / "config.yml").write_text(config)
    proc = subprocess.Popen(["/usr/bin/docker-registry", "serve", str(work / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=open(work / "registry.log", "w"))
    def up():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v2/").status_code in (200, 401)
        except httpx.TransportError:
            return proc.poll() is not None  # ended: said below
    try:
        wait_until(up, 20, 0.2, what="the registry up")
        assert proc.poll() is None, (work / "registry.log").read_text()
    except BaseException:
        proc.terminate()
        raise
    return proc, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """docker-registry on loopback, with the test's image pushed as test/tiny:v1 and a large one
    as test/big:v1, and a second one behind a password with the tiny image as private/tiny:v1.
    Yields (host:port, digest of tiny, host:port of the private one)."""
    import httpx
    _need_tools()
    work = tmp_path_factory.mktemp("registry")
    (work / "private").mkdir()
    proc, host = _serve_registry(work)
    private = None
    try:
        private, private_host = _serve_registry(work / "private", PRIVATE_LOGIN)
        _tiny_rootfs(work / "root")
        lay = str(work / "layout")
        _run("umoci", "init", "--layout", lay)
        _run("umoci", "new", "--image", f"{lay}:v1")
        _run("umoci", "insert", "--rootless", "--image", f"{lay}:v1", str(work / "root"), "/")
        _run("umoci", "config", "--image", f"{lay}:v1", "--config.env", "FROM_IMAGE=yes",
             "--config.workingdir", "/tmp", "--config.label", "origin=test")
        _run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{lay}:v1", f"docker://{host}/test/tiny:v1")
        # The microVM's: the tiny root with an os-release, and what a hostile image could shadow.
        _hostile_rootfs(work / "root", work / "mvm")
        _run("umoci", "new", "--image", f"{lay}:mvm")
        _run("umoci", "insert", "--rootless", "--image", f"{lay}:mvm", str(work / "mvm"), "/")
        _run("umoci", "config", "--image", f"{lay}:mvm", "--config.env", "FROM_IMAGE=yes")
        _run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{lay}:mvm", f"docker://{host}/test/mvm:v1")
        # Incompressible bytes past the pull's bound.
        (work / "big").mkdir()
        (work / "big" / "blob").write_bytes(os.urandom((PULL_MAX_MIB + 8) << 20))
        _run("umoci", "new", "--image", f"{lay}:big")
        _run("umoci", "insert", "--rootless", "--image", f"{lay}:big", str(work / "big"), "/")
        _run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{lay}:big", f"docker://{host}/test/big:v1")
        _run("skopeo", "copy", "--dest-tls-verify=false", "--dest-creds", ":".join(PRIVATE_LOGIN), f"oci:{lay}:v1",
             f"docker://{private_host}/private/tiny:v1")
        digest = json.loads(_run("skopeo", "inspect", "--tls-verify=false", f"docker://{host}/test/tiny:v1"))["Digest"]
        # A multi-platform index of the tiny image, as test/tiny:multi.
        raw = _run("skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{host}/test/tiny:v1").encode()
        index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                           "digest": digest, "size": len(raw),
                                           "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
        r = httpx.put(f"http://{host}/v2/test/tiny/manifests/multi", content=index,
                      headers={"Content-Type": "application/vnd.oci.image.index.v1+json"})
        assert r.status_code == 201, r.text
        ARCHIVES["index"] = "sha256:" + hashlib.sha256(index).hexdigest()
        # The same image as the two archives `runtime image import` reads.
        _run("skopeo", "copy", f"oci:{lay}:v1", f"oci-archive:{work}/tiny-oci.tar")
        _run("skopeo", "copy", f"oci:{lay}:v1", f"docker-archive:{work}/tiny-docker.tar:test/tiny:v1")
        (work / "garbage.tar").write_bytes(b"not an archive\n" * 1000)
        ARCHIVES.update(oci=work / "tiny-oci.tar", docker=work / "tiny-docker.tar", garbage=work / "garbage.tar")
        yield host, digest, private_host
    finally:
        for p in (proc, private):
            if p is not None:
                p.terminate()
                p.wait(10)


class _Garbage(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"\x00\xffnot a registry{{{" * 64
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def garbage():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.fixture(scope="module")
def oci_daemon(registry, garbage, build_dir, image_dir, tmp_path_factory):
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("oci") / "state", f"runtime-test-{os.getpid()}-oci",
                      extra_args=["--image-insecure-registry", registry[0], "--image-insecure-registry", garbage,
                                  "--image-insecure-registry", registry[2],
                                  "--image-pull-max-mib", str(PULL_MAX_MIB)])
    yield d
    _finish_daemon(d)


@pytest.fixture
def oapi(oci_daemon):
    c = Api(oci_daemon)
    yield c
    c.delete_all()
    c.close()


def _build(api, dockerfile=None, image=None, timeout=300, files=None):
    body = {"name": f"oci-{uuid.uuid4().hex[:8]}"}
    if dockerfile:
        body["dockerfile"] = dockerfile
    if files:
        body["files"] = files
    if image:
        body["image"] = image
    r = api.post("/v1/images", json=body)
    assert r.status_code == 201, r.text
    image_id = r.json()["id"]

    def done():
        j = api.get(f"/v1/images/{image_id}").json()
        return j if j["state"] not in ("queued", "building") else None
    return wait_until(done, timeout, 0.5, what=f"image {image_id} built")


def _log(api, image_id):
    return "\n".join(l["line"] for l in api.get(f"/v1/images/{image_id}/logs").json()["lines"])


@pytest.fixture(scope="module")
def from_registry(registry, oci_daemon):
    host = registry[0]
    with Api(oci_daemon) as api:
        img = _build(api, f"FROM {host}/test/tiny:v1\nRUN echo built on $FROM_IMAGE > /built.txt\n")
        return img, _log(api, img["id"])


@pytest.mark.parametrize("driver", ["namespace", "gvisor"])
def test_from_a_registry_image(from_registry, oci_daemon, oapi, driver):
    skip_unless_driver(oci_daemon, driver)
    img, log = from_registry
    assert img["state"] == "ready", (img, log)
    assert "pulling 127.0.0.1:" in log and "sha256:" in log, log
    assert img["config"]["env"]["FROM_IMAGE"] == "yes" and img["config"]["workdir"] == "/tmp", img
    assert img["labels"].get("origin") == "test", img
    sbx = oapi.create_sandbox(driver=driver, image=img["id"])
    out = oapi.exec(sbx.id, command="cat /built.txt /etc/marker; echo $FROM_IMAGE")
    assert out["exitCode"] == 0, out
    assert out["stdout"].splitlines() == ["built on yes", "from the registry", "yes"], out


# What a sandbox sees of the image, read with the tiny root's programs.
MVM_LOOK = ("cat /etc/os-release /etc/marker /app/app.txt /app/built.txt; echo \"$FROM_IMAGE\"; "
            "for f in /etc/gone /etc/debian_version /usr/bin/python3 /opt /pwned; do "
            "test -e $f && echo \"$f present\" || echo \"$f absent\"; done; "
            "test -d /run && ! test -L /run && echo run-dir; "
            "read -r first < /.runtime/agent; case \"$first\" in *sh*) echo agent-shadowed;; *) echo agent-own;; esac")
MVM_EXPECTED = ['PRETTY_NAME="Registry Base"', "ID=registry", "from the registry", "copied", "built on yes", "yes",
                "/etc/gone absent", "/etc/debian_version absent", "/usr/bin/python3 absent", "/opt absent",
                "/pwned absent", "run-dir", "agent-own"]


@pytest.mark.microvm_subset
@pytest.mark.parametrize("mvm", ["microvm"])
def test_a_microvm_sandbox_from_an_image_built_from_a_registry(registry, oci_daemon, oapi, build_dir, image_dir, mvm):
    """The disk holds the registry's whole root and the image's layers over it: its files, its
    env, none of the built-in root's beneath, and the agent its own whatever the tree put at its
    path, at /sbin/init or at /run. Two boots: a first create that makes the disk, a later one
    that copies it; deleting the image removes it."""
    skip_unless_driver(oci_daemon, mvm)
    need_microvm_parts(build_dir, image_dir)
    files = [{"path": "app.txt", "content": "copied\n"}]
    img = _build(oapi, f"FROM {registry[0]}/test/mvm:v1\nCOPY app.txt /app/app.txt\n"
                       "RUN echo built on $FROM_IMAGE > /app/built.txt && rm /etc/gone\n", files=files)
    assert img["state"] == "ready", (img, _log(oapi, img["id"]))
    disk = oci_daemon.state_dir / "snapshots" / img["snapshotId"] / "upper.ext4"
    t0 = time.monotonic()
    first = oapi.create_sandbox(driver=mvm, image=img["id"])
    first_s = time.monotonic() - t0
    st = os.stat(disk)
    t0 = time.monotonic()
    later = oapi.create_sandbox(driver=mvm, image=img["id"])
    later_s = time.monotonic() - t0
    again = os.stat(disk)
    assert (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    for sid in (first.id, later.id):
        out = oapi.exec(sid, command=MVM_LOOK)
        assert out["exitCode"] == 0 and out["stdout"].splitlines() == MVM_EXPECTED, out
    # The same top level as on namespace: the registry's root, not the built-in one.
    ns = oapi.create_sandbox(driver="namespace", image=img["id"])
    tops = [oapi.exec(sid, command="ls -A /")["stdout"].split() for sid in (ns.id, first.id)]
    assert tops[0] == tops[1] and "app" in tops[1] and "opt" not in tops[1], tops
    made = [line for line in oci_daemon.log_path.read_text().splitlines() if "disk made from its layers" in line]
    assert [first.id in line for line in made if first.id in line or later.id in line] == [True], made
    # About what the tree and the layers hold, not the built-in root's hundreds of MiB.
    assert st.st_blocks * 512 <= img["sizeBytes"] + (32 << 20), (st.st_blocks, img["sizeBytes"])
    print(f"\na first microVM create from a registry-based image {first_s:.2f} s (the disk made: "
          f"{[m for m in made if first.id in m][0].split('(')[-1]}, a later one {later_s:.2f} s; "
          f"the disk {st.st_blocks * 512 / 2**20:.1f} MiB; load {os.getloadavg()[0]:.1f}")
    for sid in (first.id, later.id, ns.id):
        assert oapi.delete(f"/v1/sandboxes/{sid}").status_code == 200
    assert oapi.post(f"/v1/images/{img['id']}:delete", json={}).status_code == 200
    assert not disk.exists()


def test_by_digest_through_the_published_client(registry, oci_daemon, published_client):
    host, digest = registry[0], registry[1]
    got = published_client.run_json(oci_daemon, """
import json, sys
from withruntime import Runtime, Sandbox
runtime = Runtime()
image = runtime.images.build(image=sys.argv[1], name=sys.argv[2])
sbx = Sandbox.create(image=sys.argv[2])
try:
    out = sbx.exec("cat /etc/marker", user="root")
    print(json.dumps({"image": image, "stdout": out.stdout}))
finally:
    sbx.delete()
""", args=[f"{host}/test/tiny@{digest}", f"pulled-{uuid.uuid4().hex[:6]}"], timeout=300)
    assert got["image"]["state"] == "ready", got
    assert got["stdout"].strip() == "from the registry", got


def _failed(api, dockerfile, *needles):
    img = _build(api, dockerfile)
    assert img["state"] == "failed", img
    for n in needles:
        assert n in img["error"], img["error"]
    assert "/oci-pull" not in img["error"] and "oci-images" not in img["error"], img["error"]
    return img


def test_by_the_digest_of_a_multi_platform_index(registry, oapi):
    """An index's digest names no manifest of one platform: the index itself is checked against it
    and must list the manifest skopeo chose."""
    host = registry[0]
    img = _build(oapi, f"FROM {host}/test/tiny@{ARCHIVES['index']}\nRUN cat /etc/marker\n")
    assert img["state"] == "ready", img
    assert "from the registry" in _log(oapi, img["id"])


def test_pull_failures_are_clear_and_leave_nothing(registry, garbage, oci_daemon, oapi):
    host, digest = registry[0], registry[1]
    _failed(oapi, f"FROM {host}/test/tiny@sha256:{'0' * 64}\n", "no such image")
    _failed(oapi, f"FROM {host}/test/absent:v1\n", "no such image")
    _failed(oapi, f"FROM {garbage}/test/tiny:v1\n", garbage)
    _failed(oapi, f"FROM {host}/test/big:v1\n", f"larger than the {PULL_MAX_MIB} MiB")
    # The same registry under another name is not one the operator allowed over plain HTTP.
    port = host.split(":")[1]
    _failed(oapi, f"FROM localhost:{port}/test/tiny:v1\n", "--image-insecure-registry")
    ready = [i for i in oapi.get("/v1/images", params={"state": "ready"}).json()["data"]
             if "/test/absent" in (i.get("from") or "") or "big" in (i.get("from") or "")]
    assert ready == [], ready
    pulls = oci_daemon.state_dir / "oci-pull"
    assert not pulls.exists() or list(pulls.iterdir()) == [], list(pulls.iterdir())
    trees = oci_daemon.state_dir / "oci-images"
    assert not trees.exists() or all(not p.name.startswith(".") for p in trees.iterdir()), list(trees.iterdir())


def test_refusals_at_the_request(oapi):
    r = oapi.post("/v1/images", json={"name": "x", "image": "-v/evil:tag"})
    assert r.status_code == 400 and "image reference" in r.json()["error"]["message"], r.text
    r = oapi.post("/v1/images", json={"name": "x", "image": "a/b:c", "dockerfile": "FROM default\n"})
    assert r.status_code == 400 and "not both" in r.json()["error"]["message"], r.text
    r = oapi.post("/v1/images", json={"name": "x", "image": "a" * 300})
    assert r.status_code == 400, r.text


def test_an_unnamed_pull_is_named_as_its_repository(registry, oapi):
    r = oapi.post("/v1/images", json={"image": f"{registry[0]}/test/tiny:v1"})
    assert r.status_code == 201 and r.json()["name"] == "tiny", r.text
    image_id = r.json()["id"]
    done = wait_until(lambda: (lambda j: j if j["state"] not in ("queued", "building") else None)(
        oapi.get(f"/v1/images/{image_id}").json()), 300, 0.5, what="the pull built")
    assert done["state"] == "ready", done
    # A pulled tree's name is the daemon's own: a client cannot start one by it.
    r = oapi.post("/v1/sandboxes", json={"image": "oci-" + "0" * 60})
    assert r.status_code == 404 and r.json()["error"]["code"] == "image_not_found", r.text


def test_private_registry_with_stored_credentials(registry, oci_daemon, oapi, published_client):
    """Credentials set through the published client's images.registries: sealed, listed without the
    secret, used by the pull, another owner's pull stays anonymous, and a delete takes them away."""
    private = registry[2]
    _failed(oapi, f"FROM {private}/private/tiny:v1\n", "refused access")
    got = published_client.run_json(oci_daemon, """
import json, sys
from withruntime import Runtime
runtime = Runtime()
out = {"set": runtime.images.registries.set(sys.argv[1], username=sys.argv[2], password=sys.argv[3])}
out["list"] = runtime.images.registries.list()
print(json.dumps(out))
""", args=[f"http://{private}/v2/", *PRIVATE_LOGIN], timeout=120)
    assert got["set"]["registry"] == private and got["set"]["username"] == PRIVATE_LOGIN[0], got
    assert [r["registry"] for r in got["list"]] == [private], got
    assert PRIVATE_LOGIN[1] not in json.dumps(got), got
    img = _build(oapi, f"FROM {private}/private/tiny:v1\n")
    assert img["state"] == "ready", img
    assert "with your credentials" in _log(oapi, img["id"])
    # The secret is in the store only sealed.
    for db in oci_daemon.state_dir.glob("runtime.db*"):
        assert PRIVATE_LOGIN[1].encode() not in db.read_bytes(), db
    # Another owner has none of them.
    r = oapi.post("/v1/keys", json={"name": "other", "owner": f"other-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201, r.text
    other = Api(oci_daemon, key=r.json()["key"])
    try:
        assert other.get("/v1/images/registries").json()["data"] == []
        _failed(other, f"FROM {private}/private/tiny:v1\n", "refused access")
        assert other.post("/v1/images/registries:delete", json={"registry": private}).status_code == 404
    finally:
        other.close()
    # Bad input.
    for body in ({"registry": "not a host!", "username": "u", "password": "p"},
                 {"registry": private, "username": "u"},
                 {"registry": private, "username": "u", "password": "p", "extra": 1},
                 {"registry": private, "username": "u" * 300, "password": "p"}):
        r = oapi.post("/v1/images/registries", json=body)
        assert r.status_code == 400, (body, r.text)
    r = oapi.post("/v1/images/registries", json={"registry": "x.dkr.ecr.us-east-1.amazonaws.com",
                                                  "accessKeyId": "A", "secretAccessKey": "B"})
    assert r.status_code == 501 and "Amazon ECR" in r.json()["error"]["message"], r.text
    r = oapi.post("/v1/images/registries:delete", json={"registry": private})
    assert r.status_code == 200, r.text
    assert oapi.get("/v1/images/registries").json()["data"] == []
    _failed(oapi, f"FROM {private}/private/tiny:v1\n", "refused access")


def test_our_sdk_pulls_and_keeps_credentials(registry, oci_daemon):
    """Our SDK has the same calls: images.build(image=...) and images.registries, sync and async."""
    import asyncio
    import sys
    from helpers import REPO
    sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
    from withruntime import AsyncRuntime, Runtime

    host, digest, private = registry[0], registry[1], registry[2]
    d = oci_daemon
    with Runtime(api_key=d.api_key, base_url=d.base_url) as rt:
        image = rt.images.build(image=f"{host}/test/tiny@{digest}", name=f"sdk-{uuid.uuid4().hex[:6]}")
        assert image["state"] == "ready", image
        made = rt.images.registries.set(private, username=PRIVATE_LOGIN[0], password=PRIVATE_LOGIN[1])
        assert made["registry"] == private and PRIVATE_LOGIN[1] not in json.dumps(rt.images.registries.list())
        built = rt.images.build(image=f"{private}/private/tiny:v1", name=f"sdk-{uuid.uuid4().hex[:6]}")
        assert built["state"] == "ready", built

    async def run():
        async with AsyncRuntime(api_key=d.api_key, base_url=d.base_url) as art:
            listed = await art.images.registries.list()
            gone = await art.images.registries.delete(private)
            return listed, gone
    listed, gone = asyncio.run(run())
    assert [r["registry"] for r in listed] == [private] and gone["deleted"] is True


def test_cli_imports_oci_and_docker_archives(registry, oci_daemon, oapi, build_dir):
    """`runtime image import -t NAME:TAG FILE`: an OCI layout archive and a docker save archive
    become images a sandbox starts from; garbage fails clearly and leaves nothing behind."""
    env = {"PATH": "/usr/bin:/bin", **oci_daemon.env()}

    def run(*args):
        return subprocess.run([str(build_dir / "runtime"), "image", "import", *args], env=env,
                              capture_output=True, text=True, timeout=300)
    for kind in ("oci", "docker"):
        name = f"imported-{kind}-{uuid.uuid4().hex[:6]}"
        r = run("-t", f"{name}:v1", str(ARCHIVES[kind]))
        assert r.returncode == 0, r.stderr + r.stdout
        assert f"image {name}:v1 is ready" in r.stderr, r.stderr
        sbx = oapi.create_sandbox(image=f"{name}:v1")
        out = oapi.exec(sbx.id, command="cat /etc/marker; echo $FROM_IMAGE")
        assert out["stdout"].splitlines() == ["from the registry", "yes"], out
    r = run("-t", "imported-garbage:v1", str(ARCHIVES["garbage"]))
    assert r.returncode != 0 and "not an OCI layout archive nor a docker save archive" in r.stderr, r.stderr
    r = run("-t", "Bad Name", str(ARCHIVES["oci"]))
    assert r.returncode != 0 and "name" in r.stderr, r.stderr
    r = run(str(ARCHIVES["oci"]))
    assert r.returncode != 0, r.stderr
    # Past the pull's bound: 413 before anything is queued.
    big = ARCHIVES["garbage"].parent / "big.tar"
    with open(big, "wb") as f:
        f.truncate((PULL_MAX_MIB + 1) << 20)
    r = run("-t", "imported-big:v1", str(big))
    assert r.returncode != 0 and f"at most {PULL_MAX_MIB} MiB" in r.stderr, r.stderr
    assert oapi.get("/v1/images", params={"name": "imported-big"}).json()["data"] == []
    pulls = oci_daemon.state_dir / "oci-pull"
    assert not pulls.exists() or list(pulls.iterdir()) == [], list(pulls.iterdir())


def test_a_restart_removes_what_cut_pulls_left(oci_daemon):
    """A pull's directory and a tree half moved into place, as a daemon killed mid-pull leaves them,
    are gone after the next start."""
    pulls = oci_daemon.state_dir / "oci-pull"
    (pulls / "cutXYZ" / "s" / "layout").mkdir(parents=True, exist_ok=True)
    (pulls / "cutXYZ" / "s" / "layout" / "blob").write_bytes(b"x" * 4096)
    (pulls / "import-cut").write_bytes(b"y")
    half = oci_daemon.state_dir / "oci-images" / (".oci-" + "0" * 60 + ".0000abcd")
    (half / "rootfs").mkdir(parents=True, exist_ok=True)
    oci_daemon.restart()
    assert not pulls.exists() or list(pulls.iterdir()) == [], list(pulls.iterdir())
    assert not half.exists()


def _trees(daemon):
    """The pulled trees on disk that name their owner: {name: owner}."""
    root = daemon.state_dir / "oci-images"
    return {p.name: (p / "owner").read_text() for p in root.iterdir()
            if not p.name.startswith(".") and (p / "owner").is_file()} if root.is_dir() else {}


def test_pulled_trees_nothing_uses_are_collected(registry, oci_daemon):
    """With no room for unused trees (--image-tree-max-mib-per-owner 0), a pulled tree stays while an
    image or a sandbox starts from it and goes at the owner's next build once nothing does."""
    oci_daemon.extra_args = list(oci_daemon.extra_args or []) + ["--image-tree-max-mib-per-owner", "0"]
    oci_daemon.restart()
    try:
        with Api(oci_daemon) as api:
            owner = f"trees-{uuid.uuid4().hex[:8]}"
            r = api.post("/v1/keys", json={"name": "trees", "owner": owner})
            assert r.status_code == 201, r.text
        with Api(oci_daemon, key=r.json()["key"]) as api:
            img = _build(api, f"FROM {registry[0]}/test/tiny:v1\nRUN echo hi > /hi\n")
            assert img["state"] == "ready", img
            (tree,) = [n for n, o in _trees(oci_daemon).items() if o == owner]
            sbx = api.create_sandbox(image=img["id"])
            assert api.post(f"/v1/images/{img['id']}:delete", json={}).status_code == 200
            trivial = "FROM default\nRUN true\n"
            assert _build(api, trivial)["state"] == "ready"
            assert tree in _trees(oci_daemon)  # the sandbox still starts from it
            assert api.delete(f"/v1/sandboxes/{sbx.id}").status_code in (200, 204)
            assert _build(api, trivial)["state"] == "ready"
            assert tree not in _trees(oci_daemon)
            assert not (oci_daemon.state_dir / "oci-images" / tree).exists()
            # Pulled again: a new tree, kept while its image is there.
            img = _build(api, f"FROM {registry[0]}/test/tiny:v1\nRUN echo again > /hi\n")
            assert img["state"] == "ready", img
            assert _build(api, trivial)["state"] == "ready"
            assert tree in _trees(oci_daemon)
    finally:
        oci_daemon.extra_args.remove("--image-tree-max-mib-per-owner")
        oci_daemon.extra_args.remove("0")
        oci_daemon.restart()


def test_a_tree_goes_with_its_last_image_without_another_build(registry, oci_daemon):
    """With no room for unused trees, deleting the last image that starts from a pulled tree removes
    the tree then, not at the owner's next build. A tree from before trees named their owner (its
    owner file removed here) is its owner's again once a pull of the owner's finds it, and goes the
    same way."""
    oci_daemon.extra_args = list(oci_daemon.extra_args or []) + ["--image-tree-max-mib-per-owner", "0"]
    oci_daemon.restart()
    try:
        with Api(oci_daemon) as api:
            owner = f"trees-{uuid.uuid4().hex[:8]}"
            r = api.post("/v1/keys", json={"name": "trees", "owner": owner})
            assert r.status_code == 201, r.text
        with Api(oci_daemon, key=r.json()["key"]) as api:
            img = _build(api, f"FROM {registry[0]}/test/tiny:v1\nRUN echo one > /hi\n")
            assert img["state"] == "ready", img
            (tree,) = [n for n, o in _trees(oci_daemon).items() if o == owner]
            path = oci_daemon.state_dir / "oci-images" / tree
            # As a tree pulled before trees named their owner: a pull of the owner's finds it again.
            (path / "owner").unlink()
            again = _build(api, f"FROM {registry[0]}/test/tiny:v1\nRUN echo two > /hi\n")
            assert again["state"] == "ready", again
            assert _trees(oci_daemon).get(tree) == owner, (_log(api, again["id"]), list(path.iterdir()))
            assert api.post(f"/v1/images/{img['id']}:delete", json={}).status_code == 200
            assert path.exists()  # the other image starts from it
            assert api.post(f"/v1/images/{again['id']}:delete", json={}).status_code == 200
            wait_until(lambda: not path.exists(), 30, 0.1, what="the tree's removal")
            assert tree not in _trees(oci_daemon)
    finally:
        oci_daemon.extra_args.remove("--image-tree-max-mib-per-owner")
        oci_daemon.extra_args.remove("0")
        oci_daemon.restart()
