"""Build secrets (docs/images.md, "Build secrets"): `RUN --mount=type=secret,id=ID[,target=PATH]
[,env=VAR][,required=true]` with the values in `POST /v1/images`'s `secrets` ({id: value}), on a
daemon of this module per driver (namespace and gVisor) whose builds run on that driver.

The step that mounts a secret reads it (a file of mode 0400 and the step user's, at
/run/secrets/ID or its target, or a variable); a step without the mount sees nothing of it; the
value is in no file of the image (a sandbox from it searches its whole root), in no byte the daemon
keeps on disk (its layers' and the image's disks, its database and logs, read on the host), in no
line of the build log (masked where a step prints it) and in no answer of the images API. A
changed value hits the cache, as Docker's does. A required secret the request lacks is a 400
naming it and its line; an owner's stored egress secrets are not build secrets, its own nor
another owner's."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import _finish_daemon, _need_root
from helpers import REPO, Api, Daemon, DaemonError, skip_unless_driver, wait_until


@pytest.fixture(scope="module", params=["namespace", "gvisor"])
def sdaemon(request, build_dir, image_dir, tmp_path_factory):
    _need_root()
    driver = request.param
    tmp = tmp_path_factory.mktemp(f"imgsec-{driver}")
    d = Daemon(build_dir, image_dir, tmp / "state", f"runtime-test-{os.getpid()}-imgsec-{driver}",
               extra_args=["--driver", driver])
    try:
        d.start()
    except DaemonError as err:
        if "driver" in str(err):
            pytest.skip(f"driver {driver}: the daemon does not start with it: {str(err)[-300:]}")
        pytest.fail(str(err), pytrace=False)
    try:
        skip_unless_driver(d, driver)
        yield d
    finally:
        _finish_daemon(d)


@pytest.fixture
def sapi(sdaemon):
    c = Api(sdaemon, timeout=300)
    yield c
    for image in c.get("/v1/images", params={"limit": 100}).json().get("data", []):
        c.post(f"/v1/images/{image['id']}:delete", json={})
    problems = c.delete_all()
    c.close()
    assert sdaemon.alive(), "runtimed died during the test"
    assert not problems, problems


def _name(prefix: str = "sec") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _wait(api: Api, image_id: str, timeout: float = 300) -> dict:
    def done():
        j = api.get(f"/v1/images/{image_id}").json()
        return j if j["state"] not in ("queued", "building") else None
    return wait_until(done, timeout, 0.3, what=f"image {image_id} built")


def _build(api: Api, dockerfile: str, **body) -> dict:
    r = api.post("/v1/images", json={"name": body.pop("name", None) or _name(), "dockerfile": dockerfile, **body})
    assert r.status_code == 201, r.text
    return _wait(api, r.json()["id"])


def _log(api: Api, image_id: str) -> str:
    return "\n".join(l["line"] for l in api.get(f"/v1/images/{image_id}/logs").json()["lines"])


def _on_disk(root: Path, needle: bytes) -> list[str]:
    """The files under root holding needle: every byte of their data read (a disk's holes skipped)."""
    found = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                end = os.fstat(fd).st_size
                off = 0
                while off < end:
                    try:
                        off = os.lseek(fd, off, os.SEEK_DATA)
                        hole = os.lseek(fd, off, os.SEEK_HOLE)
                    except OSError:
                        break
                    while off < hole:
                        os.lseek(fd, off, os.SEEK_SET)
                        chunk = os.read(fd, min(8 << 20, hole - off) + len(needle))
                        if not chunk:
                            break
                        if needle in chunk:
                            found.append(p)
                            off = end
                            break
                        off += max(1, len(chunk) - len(needle))
                    off = max(off, hole)
            finally:
                os.close(fd)
    return found


def test_a_run_reads_its_secret_and_nothing_keeps_it(sdaemon, sapi):
    value = "tok-" + uuid.uuid4().hex + "-tail"
    digest = hashlib.sha256(value.encode()).hexdigest()
    dockerfile = (
        "FROM default\n"
        f"RUN --mount=type=secret,id=tok test \"$(sha256sum < /run/secrets/tok | cut -c1-64)\" = {digest} && "
        "stat -L -c '%a %U' /run/secrets/tok > /opt/mode-root && echo \"printed: $(cat /run/secrets/tok)\"\n"
        f"RUN --mount=type=secret,id=tok,env=TOK,target=/etc/app/token test \"$(printf %s \"$TOK\" | sha256sum | "
        f"cut -c1-64)\" = {digest} && cat /etc/app/token > /dev/null\n"
        "RUN test ! -e /run/secrets/tok && test ! -e /run/secrets && test ! -e /etc/app && test -z \"${TOK:-}\" && "
        "test ! -e /dev/.runtime-build-secrets && echo without > /opt/without\n"
        "USER sandbox\n"
        "RUN --mount=type=secret,id=tok,target=/home/sandbox/tok stat -L -c '%a %U' /home/sandbox/tok && "
        "test \"$(stat -L -c '%a %U' /home/sandbox/tok)\" = '400 sandbox' && cat /home/sandbox/tok > /dev/null\n"
        "RUN --mount=type=secret,id=absent true\n")
    image = _build(sapi, dockerfile, secrets={"tok": value})
    assert image["state"] == "ready", (image, _log(sapi, image["id"]))
    log = _log(sapi, image["id"])
    assert value not in log and "printed: ****" in log, log
    # In no answer of the images API.
    for path in (f"/v1/images/{image['id']}", "/v1/images", f"/v1/images/resolve?ref={image['name']}",
                 f"/v1/images/{image['id']}/logs"):
        r = sapi.get(path)
        assert r.status_code == 200 and value not in r.text, path
    assert "secrets" not in image, image
    # The image: what the steps wrote, and nothing of the secret anywhere in its root.
    sbx = sapi.create_sandbox(image=image["id"])
    assert "400 sandbox" in log, log
    out = sapi.exec(sbx.id, command="cat /opt/mode-root /opt/without; ls /run/secrets /etc/app 2>&1 | head -1")
    assert out["stdout"].splitlines()[:2] == ["400 root", "without"], out
    assert "No such file" in out["stdout"], out
    # The value in two halves, so that the command (which the audit keeps) does not hold it.
    half = len(value) // 2
    found = sapi.exec(sbx.id, command=f"find / /workspace -xdev -type f -print0 2>/dev/null | "
                      f"xargs -0 grep -lF -- '{value[:half]}''{value[half:]}' 2>/dev/null; "
                      "find / -xdev -type f 2>/dev/null | wc -l",
                      timeoutMs=600000)
    lines = found["stdout"].split()
    assert len(lines) == 1 and int(lines[0]) > 10000, found
    # Nothing the daemon keeps on disk holds it: the image's disk, the layers, the database, the logs.
    assert _on_disk(sdaemon.state_dir, value.encode()) == [], "the value is on the host's disk"
    assert value not in Path(sdaemon.log_path).read_text(errors="replace")


def test_a_changed_value_hits_the_cache(sapi):
    dockerfile = ("FROM default\nRUN --mount=type=secret,id=k,required=true echo \"size $(wc -c < /run/secrets/k)\" "
                  "&& echo read-once > /opt/once\n")
    first = _build(sapi, dockerfile, secrets={"k": "first-" + uuid.uuid4().hex + "x" * (16 * 1024 - 38)})
    assert first["state"] == "ready" and "size 16384" in _log(sapi, first["id"]), _log(sapi, first["id"])
    again = _build(sapi, dockerfile, secrets={"k": "second-" + uuid.uuid4().hex})
    assert again["state"] == "ready", _log(sapi, again["id"])
    log = _log(sapi, again["id"])
    assert "using the cache" in log or "CACHED" in log, log


def test_a_missing_required_secret_is_a_400_naming_it(sapi):
    r = sapi.post("/v1/images", json={"name": _name(), "dockerfile":
                                      "FROM default\nRUN true\nRUN --mount=type=secret,id=npmrc,required=true true\n",
                                      "secrets": {"other": "x"}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and "npmrc" in err["message"] and "line 3" in err["message"], err
    for bad, says in (([1], "secrets must be an object"), ({"a/b": "x"}, "an id must be"),
                      ({"a": 1}, "secrets.a must be a string"), ({"a": "x" * (16 * 1024 + 1)}, "secrets.a must be"),
                      ({"a": "x" * (16 * 1024), "b": "y" * (16 * 1024), "c": "z"}, "32 KiB together"),
                      ({f"s{i}": "x" for i in range(33)}, "at most 32")):
        r = sapi.post("/v1/images", json={"name": _name(), "dockerfile": "FROM default\nRUN true\n", "secrets": bad})
        assert r.status_code == 400 and says in r.json()["error"]["message"], (bad, r.text)
    r = sapi.post("/v1/images", json={"name": _name(), "dockerfile":
                                      "FROM default\nRUN --mount=type=cache,target=/x true\n"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_dockerfile", r.text
    assert "line 2" in r.json()["error"]["message"] and "type=cache" in r.json()["error"]["message"], r.text


def test_stored_egress_secrets_are_not_build_secrets(sapi):
    """An owner's egress secret, or another owner's, is not reached by naming it in a mount."""
    own = "OWN_" + uuid.uuid4().hex[:6].upper()
    value = "egress-" + uuid.uuid4().hex
    assert sapi.put(f"/v1/egress-secrets/{own}", json={"value": value, "hosts": ["api.example.com"]}).status_code in (200, 201)
    r = sapi.post("/v1/keys", json={"name": "other-owner", "owner": f"other-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201, r.text
    other = Api(sapi.daemon, key=r.json()["key"])
    theirs = "THEIRS_" + uuid.uuid4().hex[:6].upper()
    try:
        assert other.put(f"/v1/egress-secrets/{theirs}", json={"value": value, "hosts": ["api.example.com"]}
                         ).status_code in (200, 201)
        for name in (own, theirs):
            r = sapi.post("/v1/images", json={"name": _name(), "dockerfile":
                                              f"FROM default\nRUN --mount=type=secret,id={name},required=true true\n"})
            assert r.status_code == 400 and name in r.json()["error"]["message"], r.text
        image = _build(sapi, f"FROM default\nRUN --mount=type=secret,id={own} --mount=type=secret,id={theirs},"
                       f"env=T test ! -e /run/secrets/{own} && test ! -e /run/secrets/{theirs} && test -z \"${{T:-}}\" "
                       f"&& ! env | grep -q '{value}'\n")
        assert image["state"] == "ready", _log(sapi, image["id"])
    finally:
        other.delete(f"/v1/egress-secrets/{theirs}")
        other.close()
        sapi.delete(f"/v1/egress-secrets/{own}")


OURS = """
import json, sys
from withruntime import Runtime
runtime = Runtime()
name, value = sys.argv[1], sys.argv[2]
image = runtime.images.build(dockerfile="FROM default\\nRUN --mount=type=secret,id=tok,env=TOK,required "
                             "test -n \\"$TOK\\" && echo \\"got $TOK\\"\\n", name=name, secrets={"tok": value})
print(json.dumps({"state": image["state"], "log": [l["line"] for l in runtime.images.logs(image["id"])["lines"]]}))
"""


@pytest.mark.driver_independent
def test_our_sdk_and_the_cli_send_secrets(sdaemon, sapi, build_dir, tmp_path):
    """Our SDK's images.build(secrets=...), and runtime image build --secret id=,src= and id=,env=."""
    value = "sdk-" + uuid.uuid4().hex
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "sdk" / "python" / "src"),
           "RUNTIME_API_KEY": sdaemon.api_key, "RUNTIME_BASE_URL": sdaemon.base_url}
    r = subprocess.run([sys.executable, "-c", OURS, _name("ours"), value], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["state"] == "ready" and "got ****" in got["log"] and value not in r.stdout, got
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        "FROM default\nRUN --mount=type=secret,id=npmrc,required --mount=type=secret,id=tok,env=TOK,required "
        "test \"$(cat /run/secrets/npmrc)\" = from-a-file && test \"$TOK\" = from-the-env\n")
    (tmp_path / "npmrc").write_text("from-a-file")
    cli_env = {"PATH": "/usr/bin:/bin", **sdaemon.env(), "MY_TOKEN": "from-the-env"}

    def run(*args):
        return subprocess.run([str(build_dir / "runtime"), "image", "build", *args], env=cli_env,
                              capture_output=True, text=True, timeout=300)
    name = _name("cli")
    r = run("--secret", f"id=npmrc,src={tmp_path / 'npmrc'}", "--secret", "id=tok,env=MY_TOKEN", "-t", name, str(ctx))
    assert r.returncode == 0 and f"image {name}:latest is ready" in r.stderr, r.stderr + r.stdout
    r = run("--secret", "id=tok,env=MY_TOKEN", "-t", name, str(ctx))
    assert r.returncode != 0 and "npmrc" in r.stderr and "line 2" in r.stderr, r.stderr
    r = run("--secret", "id=tok,src=/nonexistent", "-t", name, str(ctx))
    assert r.returncode != 0 and "cannot read the secret tok" in r.stderr, r.stderr
    r = run("--secret", "id=tok,env=MY_TOKEN", "default")
    assert r.returncode == 2 and "are for -t builds" in r.stderr, r.stderr
