"""Images users build from Dockerfiles (docs/images.md), through the published client (0.35.0, in
a venv of its own) and the raw API: the context uploaded in chunks by digest, a build whose RUN,
COPY, ENV, ARG, WORKDIR, USER and LABEL steps show in a sandbox created from the result on
namespace and gVisor, its log as NDJSON and as pages, list, get, resolve, tag, untag and delete;
another owner gets 404; the E2B drop-in starts a sandbox from an image by name. Bad input: an
unknown instruction refused with its line, COPY out of the context, a context whose chunks lie,
a failing RUN (the image failed, its step named), a log without end, a bad name; the daemon stays
up and nothing failed is listed as ready."""
from __future__ import annotations

import hashlib
import json
import time
import uuid

import pytest

from helpers import Api, wait_until

DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG GREETING=hello
FROM default
ARG GREETING
ENV APP_HOME=/opt/app MODE="built here"
WORKDIR $APP_HOME
COPY app.py ./
COPY data/ ./data/
RUN echo "$GREETING from $MODE" > greeting.txt && \\
    python3 app.py > out.txt
LABEL team=agents purpose="a test"
USER sandbox
RUN whoami > /workspace/who
CMD ["python3", "app.py"]
"""

BUILD = """
import json, sys
from withruntime import Runtime
runtime = Runtime()
lines = []
image = runtime.images.build(dockerfile=open(sys.argv[1] + "/Dockerfile").read(), context_dir=sys.argv[1],
                             name=sys.argv[2], tags=["v1", "latest"], build_args={"GREETING": "hi"},
                             labels={"extra": "yes"}, on_log=lambda l: lines.append(l["line"]))
print(json.dumps({"image": image, "lines": lines}))
"""


def _context(tmp_path):
    ctx = tmp_path / "ctx"
    (ctx / "data").mkdir(parents=True)
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    (ctx / "app.py").write_text("print('app ran')\n")
    (ctx / "data" / "one.txt").write_text("one\n")
    (ctx / "secret.key").write_text("never copied\n")
    (ctx / ".dockerignore").write_text("secret.key\n")
    return ctx


def _name(prefix="img"):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def built(published_client, daemon, tmp_path_factory):
    """One image built through the published client, shared by the tests that read it."""
    ctx = _context(tmp_path_factory.mktemp("images"))
    name = _name()
    got = published_client.run_json(daemon, BUILD, args=[str(ctx), name], timeout=600)
    return name, got


def test_build_through_the_published_client(built):
    name, got = built
    image = got["image"]
    assert image["state"] == "ready" and image["name"] == name and image["version"] == 1, image
    assert sorted(image["tags"]) == ["latest", "v1"], image
    assert image["labels"] == {"team": "agents", "purpose": "a test", "extra": "yes"}, image
    assert image["config"]["cmd"] == ["python3", "app.py"] and image["config"]["user"] == "sandbox", image
    assert image["config"]["workdir"] == "/opt/app", image
    text = "\n".join(got["lines"])
    assert "step 1: FROM default" in text and "ready in" in text, text[-2000:]


@pytest.mark.parametrize("driver", ["namespace", "gvisor"], indirect=True)
def test_sandbox_from_the_image(built, api, driver):
    name, _ = built
    sbx = api.create_sandbox(driver=driver, image=f"{name}:v1")
    out = api.exec(sbx.id, command="cat /opt/app/greeting.txt /opt/app/out.txt /opt/app/data/one.txt; "
                   "echo $MODE; ls /opt/app; cat /workspace/who; ls /.runtime-build-context 2>&1 | head -1")
    assert out["exitCode"] == 0, out
    lines = out["stdout"].splitlines()
    assert lines[:4] == ["hi from built here", "app ran", "one", "built here"], out
    assert "secret.key" not in out["stdout"] and "Dockerfile" not in out["stdout"], out
    assert "sandbox" in lines, out
    assert "No such file" in out["stdout"], out


def test_list_get_resolve_tag_untag_delete(built, pub, api):
    name, got = built
    image_id = got["image"]["id"]
    res = pub("""
import json, sys
from withruntime import Runtime
runtime = Runtime()
image_id, name = sys.argv[1], sys.argv[2]
out = {}
out["get"] = runtime.images.get(image_id)["state"]
out["by_name"] = runtime.images.resolve(name)["id"]
out["by_tag"] = runtime.images.resolve(name + ":v1")["id"]
out["by_version"] = runtime.images.resolve(name + "@1")["id"]
out["listed"] = [i["id"] for i in runtime.images.list(name=name).data]
out["versions"] = [i["version"] for i in runtime.images.versions(name).data]
out["tagged"] = sorted(runtime.images.tag(name + ":v1", "stable")["tags"])
out["untagged"] = sorted(runtime.images.untag(image_id, "stable")["tags"])
page = runtime.images.logs(image_id)
out["log_page"] = [len(page["lines"]) > 0, page["done"], page["nextAfter"] > 0]
print(json.dumps(out))
""", image_id, name)
    assert res["get"] == "ready", res
    assert res["by_name"] == res["by_tag"] == res["by_version"] == image_id, res
    assert res["listed"] == [image_id] and res["versions"] == [1], res
    assert res["tagged"] == ["latest", "stable", "v1"] and res["untagged"] == ["latest", "v1"], res
    assert res["log_page"] == [True, True, True], res
    # Another owner sees none of it.
    r = api.post("/v1/keys", json={"name": "other-owner", "owner": f"other-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201, r.text
    other = Api(api.daemon, key=r.json()["key"])
    try:
        assert other.get(f"/v1/images/{image_id}").status_code == 404
        assert other.get("/v1/images/resolve", params={"ref": name}).status_code == 404
        assert other.post(f"/v1/images/{image_id}:delete", json={}).status_code == 404
        assert other.get("/v1/images").json()["data"] == []
        r = other.post("/v1/sandboxes", json={"image": f"{name}:v1"})
        assert r.status_code in (400, 404), r.text
    finally:
        other.close()


def _upload(api, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    r = api.post("/v1/images/context/missing", json={"digests": [digest]})
    assert r.status_code == 200 and r.json()["missing"] == [digest], r.text
    r = api.put(f"/v1/images/context/{digest}", content=data)
    assert r.status_code == 200, r.text
    assert api.post("/v1/images/context/missing", json={"digests": [digest]}).json()["missing"] == []
    return {"archive": {"sha256": digest, "size": len(data), "chunks": [digest]}, "files": []}


def _tar(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    import gzip
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for path, target in (links or {}).items():
            info = tarfile.TarInfo(path)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            t.addfile(info)
    return gzip.compress(buf.getvalue(), mtime=0)


def _wait(api, image_id, timeout=300):
    def done():
        j = api.get(f"/v1/images/{image_id}").json()
        return j if j["state"] not in ("queued", "building") else None
    return wait_until(done, timeout, 0.5, what=f"image {image_id} built")


def test_refusals_at_the_request(api):
    name = _name("bad")
    r = api.post("/v1/images", json={"name": name, "dockerfile": "FROM default\nRUN true\nFROBNICATE x\n"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_dockerfile", r.text
    assert "line 3" in r.json()["error"]["message"] and "FROBNICATE" in r.json()["error"]["message"], r.text
    r = api.post("/v1/images", json={"name": name, "dockerfile": "FROM default\nSTOPSIGNAL TERM\n"})
    assert r.status_code == 400 and "line 2: STOPSIGNAL is not supported" in r.json()["error"]["message"], r.text
    r = api.post("/v1/images", json={"name": "Not A Name!", "dockerfile": "FROM default\n"})
    assert r.status_code == 400 and "name" in r.json()["error"]["message"], r.text
    r = api.post("/v1/images", json={"name": name, "dockerfile": "FROM default\n", "tags": ["bad tag"]})
    assert r.status_code == 400, r.text
    r = api.post("/v1/images", json={"name": name, "dockerfile": "FROM default\n", "bogus": 1})
    assert r.status_code == 400 and "bogus" in r.text, r.text
    r = api.post("/v1/images", json={"name": name, "image": "Not A Reference!"})
    assert r.status_code == 400 and "image reference" in r.json()["error"]["message"], r.text
    r = api.get("/v1/images/registries")
    assert r.status_code == 200 and isinstance(r.json()["data"], list), r.text
    # A chunk whose bytes are not its digest.
    r = api.put(f"/v1/images/context/{'0' * 64}", content=b"not that")
    assert r.status_code == 400, r.text
    assert api.get("/v1/images", params={"name": name}).json()["data"] == []


@pytest.mark.parametrize("case", ["copy_outside", "chunks_lie", "link_out", "run_fails", "from_unknown", "forks",
                                  "fills_disk", "times_out"])
def test_failed_builds_say_why(api, case):
    name = _name(case.replace("_", "-"))
    body = {"name": name}
    if case == "copy_outside":
        body["dockerfile"] = "FROM default\nCOPY ../etc/passwd /x\n"
        body["context"] = _upload(api, _tar({"a.txt": name.encode()}))
        says = "outside the build context"
    elif case == "chunks_lie":
        ctx = _upload(api, _tar({"a.txt": name.encode()}))
        ctx["archive"]["sha256"] = "1" * 64
        body["dockerfile"] = "FROM default\nCOPY a.txt /a.txt\n"
        body["context"] = ctx
        says = "do not make the archive"
    elif case == "link_out":
        body["dockerfile"] = "FROM default\nCOPY . /app\n"
        body["context"] = _upload(api, _tar({"a.txt": name.encode()}, {"escape": "../../../etc/shadow"}))
        says = "context was refused"
    elif case == "run_fails":
        body["dockerfile"] = "FROM default\nRUN echo about to fail\nRUN exit 7\nRUN echo never\n"
        says = "step 3/4 (line 3, RUN): the command returned a non-zero code: 7"
    elif case == "forks":
        # Forks until the sandbox's pids bound refuses one: the shell gives up.
        body["dockerfile"] = "FROM default\nRUN i=0; while [ $i -lt 100000 ]; do sleep 600 & i=$((i+1)); done\n"
        body["build"] = {"timeoutSeconds": 120}
        says = "step 2/2 (line 2, RUN): the command returned a non-zero code"
    elif case == "fills_disk":
        body["dockerfile"] = "FROM default\nRUN dd if=/dev/zero of=/big bs=1M count=4096\n"
        body["build"] = {"diskMiB": 256, "timeoutSeconds": 120}
        says = "step 2/2 (line 2, RUN): the command returned a non-zero code"
    elif case == "times_out":
        body["dockerfile"] = "FROM default\nRUN sleep 600\n"
        body["build"] = {"timeoutSeconds": 10}
        says = "step 2/2 (line 2, RUN): the build's time ran out"
    else:
        body["dockerfile"] = "FROM nosuchimage\nRUN true\n"
        says = "FROM nosuchimage"
    r = api.post("/v1/images", json=body)
    assert r.status_code == 201, r.text
    image = _wait(api, r.json()["id"])
    assert image["state"] == "failed" and says in (image["error"] or ""), image
    assert api.get("/v1/images", params={"name": name, "state": "ready"}).json()["data"] == []
    # The build's sandbox is gone.
    sandboxes = api.get("/v1/sandboxes").json()
    items = sandboxes.get("sandboxes", sandboxes.get("data", []))
    assert not [s for s in items if (s.get("labels") or {}).get("runtime.imageBuild") == image["id"]
                and s.get("state") != "deleted"], items
    assert api.post(f"/v1/images/{image['id']}:delete", json={}).status_code == 200
    assert api.daemon.alive()


def test_log_without_end_stops_the_build(api):
    body = {"name": _name("loud"), "dockerfile": "FROM default\nRUN yes 'a line of log that goes on'\n",
            "build": {"timeoutSeconds": 300}}
    r = api.post("/v1/images", json=body)
    assert r.status_code == 201, r.text
    image = _wait(api, r.json()["id"])
    assert image["state"] == "failed" and "build log passed its bound" in image["error"], image
    assert api.daemon.alive()


def test_follow_streams_ndjson_and_a_per_owner_bound(api):
    ids = []
    try:
        for i in range(4):
            r = api.post("/v1/images", json={"name": _name("q"), "dockerfile": "FROM default\nRUN sleep 2\n"})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        r = api.post("/v1/images", json={"name": _name("q"), "dockerfile": "FROM default\nRUN true\n"})
        assert r.status_code == 429 and "4 image builds" in r.json()["error"]["message"], r.text
        events = []
        with api.stream("GET", f"/v1/images/{ids[0]}/logs", params={"follow": "true"}, timeout=300) as s:
            assert s.headers["content-type"].startswith("application/x-ndjson")
            for line in s.iter_lines():
                if line.strip():
                    events.append(json.loads(line))
        assert events[-1]["type"] == "done" and events[-1]["image"]["state"] == "ready", events[-3:]
        seqs = [e["seq"] for e in events if e["type"] == "line"]
        assert seqs == list(range(1, len(seqs) + 1)), seqs
    finally:
        for i in ids:
            _wait(api, i)
            api.post(f"/v1/images/{i}:delete", json={})


def test_e2b_drop_in_starts_an_image_by_name(built, pub):
    name, _ = built
    got = pub("""
import json, sys
from withruntime.e2b import Sandbox
sbx = Sandbox.create(sys.argv[1])
r = sbx.commands.run("cat /opt/app/greeting.txt")
sbx.kill()
print(json.dumps({"out": r.stdout}))
""", name)
    assert got["out"].strip() == "hi from built here", got


def test_delete_takes_the_disk(built, pub, api):
    name, got = built
    image_id = got["image"]["id"]
    snap = got["image"]["snapshotId"]
    assert api.get(f"/v1/snapshots/{snap}").status_code == 200
    res = pub("""
import json, sys
from withruntime import Runtime
runtime = Runtime()
runtime.images.delete(sys.argv[1] + ":v1")
try:
    runtime.images.get(sys.argv[2])
    gone = False
except Exception as e:
    gone = getattr(e, "code", None)
print(json.dumps({"gone": gone}))
""", name, image_id)
    assert res["gone"] == "image_not_found", res
    assert api.get(f"/v1/snapshots/{snap}").status_code == 404


def test_a_stop_cuts_a_build_and_a_kill_leaves_it_failed(fresh_daemon):
    """A daemon stopped during a build stops at once (the build given up, its sandbox gone) and
    the image is failed; one killed during a build finds it failed at its next start."""
    api = Api(fresh_daemon)
    try:
        r = api.post("/v1/images", json={"name": "slow", "dockerfile": "FROM default\nRUN sleep 600\n"})
        assert r.status_code == 201, r.text
        first = r.json()["id"]
        wait_until(lambda: api.get(f"/v1/images/{first}/logs").json()["lines"], 60, 0.2, what="the build started")
        time.sleep(1)
        t0 = time.monotonic()
        fresh_daemon.stop()
        assert time.monotonic() - t0 < 20
        fresh_daemon.start()
        image = api.get(f"/v1/images/{first}").json()
        assert image["state"] == "failed" and "the daemon stopped during the build" in image["error"], image
        r = api.post("/v1/images", json={"name": "slow", "dockerfile": "FROM default\nRUN sleep 600\n"})
        assert r.status_code == 201 and r.json()["version"] == 2, r.text
        second = r.json()["id"]
        wait_until(lambda: api.get(f"/v1/images/{second}/logs").json()["lines"], 60, 0.2, what="the build started")
        fresh_daemon.kill()
        fresh_daemon.start()
        image = api.get(f"/v1/images/{second}").json()
        assert image["state"] == "failed" and "stopped during the build" in image["error"], image
        assert api.get("/v1/images", params={"state": "ready"}).json()["data"] == []
    finally:
        api.close()


OURS = """
import asyncio, json, sys
from withruntime import Runtime
from withruntime.async_sandbox import AsyncRuntime
runtime = Runtime()
lines = []
image = runtime.images.build(dockerfile="FROM default\\nCOPY app.py /srv/\\nRUN python3 /srv/app.py > /srv/out\\n",
                             context_dir=sys.argv[1], name=sys.argv[2], tags=["one"],
                             on_log=lambda l: lines.append(l["line"]))
out = {"state": image["state"], "tags": image["tags"], "logged": any("ready in" in l for l in lines)}
out["resolved"] = runtime.images.resolve(sys.argv[2] + ":one")["id"] == image["id"]
out["versions"] = [i["version"] for i in runtime.images.versions(sys.argv[2])["data"]]
out["tagged"] = sorted(runtime.images.tag(sys.argv[2] + ":one", "two")["tags"])
out["untagged"] = runtime.images.untag(image["id"], "two")["tags"]
out["start"] = runtime.images.build(dockerfile="FROM default\\nCMD [\\"true\\"]\\n", name=sys.argv[2] + "-start",
                                    start={"command": "sleep 1", "ready_port": 80})["start"]
out["no_start"] = runtime.images.build(dockerfile="FROM default\\nCMD [\\"true\\"]\\n", name=sys.argv[2] + "-none",
                                       no_start=True)["start"]

async def main():
    r = AsyncRuntime()
    got = await r.images.get(image["id"])
    try:
        await r.images.build(dockerfile="FROM default\\nRUN exit 3\\n", name=sys.argv[2] + "-bad")
        failed = None
    except Exception as e:
        failed = [getattr(e, "code", None), str(e)]
    await r.images.delete(image["id"])
    await r.close()
    return got["id"], failed

got, failed = asyncio.run(main())
out["async_get"] = got == image["id"]
out["failed"] = failed
print(json.dumps(out))
"""


def test_our_sdk_has_the_same_images_calls(api, tmp_path):
    """Our SDK (sync and async) builds (with start and no_start), resolves, tags and deletes under the
    published names."""
    import subprocess
    import sys
    from helpers import REPO
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "app.py").write_text("print('from our sdk')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "sdk" / "python" / "src"),
           "RUNTIME_API_KEY": api.daemon.api_key, "RUNTIME_BASE_URL": api.daemon.base_url}
    r = subprocess.run([sys.executable, "-c", OURS, str(ctx), _name("ours")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["state"] == "ready" and got["tags"] == ["one"] and got["logged"], got
    assert got["resolved"] and got["versions"] == [1] and got["async_get"], got
    assert got["tagged"] == ["one", "two"] and got["untagged"] == ["one"], got
    assert got["failed"][0] == "image_build_failed" and "non-zero code: 3" in got["failed"][1], got
    assert got["start"] == {"command": ["/bin/sh", "-c", "sleep 1"], "readyPort": 80, "readyTimeoutSeconds": 60}, got
    assert got["no_start"] is None, got


MULTI = """\
FROM default AS builder
WORKDIR /src
COPY app.py ./
RUN python3 -m py_compile app.py && echo built > /src/stamp && mkdir -p /src/out && echo x > /src/out/a.txt
FROM default AS unused
RUN exit 9
FROM default
COPY --from=builder /src/stamp /srv/stamp
COPY --from=0 /src/out /srv/out/
COPY --from=builder /src/*.py /srv/py/
RUN cat /srv/stamp /srv/out/a.txt && ls /srv/py
"""


@pytest.mark.parametrize("driver", ["namespace", "gvisor"], indirect=True)
def test_multi_stage_copy_from(api, driver, tmp_path):
    """COPY --from an earlier stage (by name and by index, a file, a folder's contents and a
    wildcard); a stage nothing needs is not built; a target builds one stage alone."""
    data = _tar({"app.py": b"print('x')\n", "tag": _name().encode()})
    r = api.post("/v1/images", json={"name": _name("multi"), "dockerfile": MULTI, "context": _upload(api, data)})
    assert r.status_code == 201, r.text
    image = _wait(api, r.json()["id"])
    assert image["state"] == "ready", image
    lines = [l["line"] for l in api.get(f"/v1/images/{image['id']}/logs").json()["lines"]]
    assert "built" in lines and "x" in lines and "app.py" in lines, lines
    assert not any("stage 1" in l for l in lines), lines
    sbx = api.create_sandbox(driver=driver, image=image["id"])
    out = api.exec(sbx.id, command="cat /srv/stamp; ls /srv/py; ls / | grep runtime- || true")
    assert out["stdout"] == "built\napp.py\n", out
    r = api.post("/v1/images", json={"name": _name("target"), "dockerfile": MULTI, "target": "unused"})
    image = _wait(api, r.json()["id"])
    assert image["state"] == "failed" and "non-zero code: 9" in image["error"], image


def test_one_owners_queue_never_holds_back_anothers(api):
    """Two workers build; a worker passes over an owner that has a build running, so Bob's one
    build runs at once while Alice's four queue behind her first."""
    r = api.post("/v1/keys", json={"name": "bob", "owner": f"bob-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201, r.text
    bob = Api(api.daemon, key=r.json()["key"])
    alice = []
    try:
        for _ in range(4):
            r = api.post("/v1/images", json={"name": _name("alice"), "dockerfile": "FROM default\nRUN sleep 4\n"})
            assert r.status_code == 201, r.text
            alice.append(r.json()["id"])
        r = bob.post("/v1/images", json={"name": "bobs", "dockerfile": "FROM default\nRUN true\n"})
        assert r.status_code == 201, r.text
        mine = _wait(bob, r.json()["id"], timeout=60)
        assert mine["state"] == "ready", mine
        states = [api.get(f"/v1/images/{i}").json()["state"] for i in alice]
        assert states.count("queued") >= 2, states
    finally:
        for i in alice:
            _wait(api, i)
            api.post(f"/v1/images/{i}:delete", json={})
        bob.close()


def test_the_cli_builds_from_a_dockerfile(api, build_dir, tmp_path):
    """runtime image build -f Dockerfile -t name:tag DIR: the context sent (nothing the second
    time), the log printed as it happens, and a failed build's error with its step."""
    import subprocess
    ctx = tmp_path / "cli"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("from the cli\n")
    (ctx / "skip.me").write_text("left out\n")
    (ctx / ".dockerignore").write_text("skip.me\n")
    (ctx / "Dockerfile").write_text("FROM default\nCOPY . /cli/\nRUN cat /cli/hello.txt && ls /cli\n")
    env = {"PATH": "/usr/bin:/bin", **api.daemon.env()}
    name = _name("cli")

    def run(*args):
        return subprocess.run([str(build_dir / "runtime"), "image", "build", *args], env=env, capture_output=True,
                              text=True, timeout=300)
    r = run("-t", f"{name}:v1", str(ctx))
    assert r.returncode == 0, r.stderr + r.stdout
    assert "from the cli" in r.stdout and "skip.me" not in r.stdout, r.stdout
    assert "sent 1 of 1 context chunks" in r.stderr and f"image {name}:v1 is ready" in r.stderr, r.stderr
    r = run("-f", str(ctx / "Dockerfile"), "-t", f"{name}:v2", str(ctx))
    assert r.returncode == 0 and "is on runtimed already" in r.stderr, r.stderr
    versions = api.get("/v1/images", params={"name": name}).json()["data"]
    assert sorted(v["version"] for v in versions) == [1, 2], versions
    (ctx / "Dockerfile").write_text("FROM default\nRUN exit 4\n")
    r = run("-t", name, str(ctx))
    assert r.returncode != 0 and "step 2/2 (line 2, RUN): the command returned a non-zero code: 4" in r.stderr, \
        r.stderr
