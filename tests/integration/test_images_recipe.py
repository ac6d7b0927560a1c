"""Image recipes and inline files (docs/images.md, "Recipes and inline files"): the published
client's images.build(recipe=...) makes an image whose sandboxes (namespace and gVisor) see the
recipe's files, env and workdir and import the package pip installed from a wheel the recipe
carries (builds have no network); the recipe and the Dockerfile made of it are the log's first
lines and the record keeps the recipe; a Dockerfile with inline files builds, and an unchanged
rebuild is cached while a changed file is not; apt's line is checked in the log. Every bad item is
a 400 naming its field and index: unknown keys, package names that are not names, options
smuggled as packages, "..", absolute and duplicate paths, too many or too large files, bad base64,
files with a context, and a recipe beside a Dockerfile."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
import uuid
import zipfile

import pytest

from helpers import skip_unless_driver, wait_until
from test_js_sdk import FILE_TIMEOUT, NODE, NPM, js_build, run_node  # noqa: F401 (js_build: the fixture)
from test_js_sdk import _env as js_env

WHEEL_NAME = "rtrecipe_probe-0.1-py3-none-any.whl"


def _wheel() -> bytes:
    """A wheel of one module, made here: pip installs it with no index to reach."""
    files = {
        "rtrecipe_probe/__init__.py": b"VALUE = 'from-the-wheel'\n",
        "rtrecipe_probe-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: rtrecipe-probe\nVersion: 0.1\n",
        "rtrecipe_probe-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                              b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("rtrecipe_probe-0.1.dist-info/RECORD,,")
    files["rtrecipe_probe-0.1.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in files.items():
            z.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


def _name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


BUILD = """
import base64, json, sys
from withruntime import Runtime
rt = Runtime()
kw = json.loads(sys.argv[1])
for where in (kw.get("recipe") or {}, kw):
    for path, content in list((where.get("files") or {}).items()):
        if isinstance(content, dict):
            where["files"][path] = base64.b64decode(content["b64"])
lines = []
image = rt.images.build(on_log=lambda l: lines.append(l["line"]), **kw)
print(json.dumps({"image": image, "lines": lines}))
"""


def _build(published_client, daemon, **kw):
    """images.build through the published client; bytes go over as {"b64": ...}, the client's
    own bytes form (base64 on the wire)."""
    def enc(files):
        return {p: {"b64": base64.b64encode(c).decode()} if isinstance(c, bytes) else c for p, c in files.items()}
    if "files" in kw:
        kw["files"] = enc(kw["files"])
    if "files" in kw.get("recipe", {}):
        kw["recipe"] = {**kw["recipe"], "files": enc(kw["recipe"]["files"])}
    return published_client.run_json(daemon, BUILD, args=[json.dumps(kw)], timeout=600)


RECIPE = {
    "env": {"GREETING": 'hello $HOME "quoted" \\ end', "MODE": "recipe"},
    "workdir": "/opt/app",
    "pip": ["./" + WHEEL_NAME],
    "commands": ["echo built > built.txt",
                 "python3 -c 'import rtrecipe_probe; print(rtrecipe_probe.VALUE)' > imported.txt",
                 "printf 'two\\nlines\\n' > multi.txt",
                 "echo first > lines.txt\necho second >> lines.txt",
                 "cat > here.txt <<'EOF'\nfrom a heredoc $HOME\nEOF"],
    "user": "sandbox",
}


@pytest.fixture(scope="module")
def recipe_built(published_client, daemon):
    recipe = {**RECIPE, "files": {"data/hello.txt": "hi from a file\n", WHEEL_NAME: _wheel(),
                                  "bin/tool.sh": "#!/bin/sh\necho tool ran\n"}}
    got = _build(published_client, daemon, recipe=recipe, name=_name("recipe"))
    assert got["image"]["state"] == "ready", got["lines"][-30:]
    return got


def test_recipe_log_and_record(recipe_built):
    image, lines = recipe_built["image"], recipe_built["lines"]
    assert lines[0].startswith("recipe: {"), lines[:5]
    assert lines[1] == "the recipe's Dockerfile:", lines[:5]
    made = [l[2:] for l in lines[2:] if l.startswith("  ")]
    assert made[0] == "FROM default" and made[1].startswith("ENV GREETING=") and made[2] == 'ENV MODE="recipe"', made
    assert made[3] == "WORKDIR /opt/app" and made[4] == "COPY . ./", made
    assert made[5].startswith('RUN ["env","PIP_BREAK_SYSTEM_PACKAGES=1"') and made[5].endswith(
        '"--","./' + WHEEL_NAME + '"]'), made
    assert made[6] == "RUN echo built > built.txt", made
    assert made[8] == "RUN printf 'two\\nlines\\n' > multi.txt", made
    # A line break: the exec form, so that the Dockerfile reads the command back whole.
    assert made[9] == 'RUN ["/bin/sh","-c","echo first > lines.txt\\necho second >> lines.txt"]', made
    # A heredoc: the exec form too, its lines the shell's, never the Dockerfile's.
    assert made[10] == 'RUN ["/bin/sh","-c","cat > here.txt <<\'EOF\'\\nfrom a heredoc $HOME\\nEOF"]', made
    # Its lines ran as root; the image's sandboxes run as its user.
    assert made[11] == "USER sandbox" and len(made) == 12, made
    first_step = next(i for i, l in enumerate(lines) if "step 1" in l)
    assert first_step > len(made), lines[:20]
    # The record keeps the recipe as given, its files as their sizes and digests.
    rec = image["recipe"]
    assert rec["pip"] == RECIPE["pip"] and rec["env"] == RECIPE["env"] and rec["workdir"] == "/opt/app", rec
    files = {f["path"]: f for f in rec["files"]}
    assert set(files) == {"data/hello.txt", WHEEL_NAME, "bin/tool.sh"}, rec
    assert files["data/hello.txt"] == {"path": "data/hello.txt", "size": 15, "mode": 0o644,
                                       "sha256": hashlib.sha256(b"hi from a file\n").hexdigest()}, files
    assert image["config"]["workdir"] == "/opt/app" and image["config"]["user"] == "sandbox", image["config"]
    assert image["name"].startswith("recipe-"), image["name"]


@pytest.mark.parametrize("driver", ["namespace", "gvisor"], indirect=True)
def test_sandbox_from_the_recipe(recipe_built, api, driver):
    image = recipe_built["image"]
    sbx = api.create_sandbox(driver=driver, image=image["id"])
    out = api.exec(sbx.id, command="cd /opt/app && cat data/hello.txt built.txt imported.txt multi.txt lines.txt here.txt && "
                   "echo \"$GREETING|$MODE\" && sh bin/tool.sh && "
                   "python3 -c 'import rtrecipe_probe; print(rtrecipe_probe.VALUE)' && id -un && stat -c %U built.txt")
    assert out["exitCode"] == 0, out
    assert out["stdout"].splitlines() == ["hi from a file", "built", "from-the-wheel", "two", "lines", "first",
                                          "second", "from a heredoc $HOME", 'hello $HOME "quoted" \\ end|recipe', "tool ran",
                                          "from-the-wheel", "sandbox", "root"], out


DOCKERFILE = "FROM default\nCOPY . /srv/\nRUN cat /srv/a.txt /srv/bin/blob > /srv/copied\n"


def test_dockerfile_with_inline_files(published_client, daemon, api):
    name = _name("inline")
    blob = bytes(range(256))
    files = {"a.txt": "A text\n", "bin/blob": blob}
    got = _build(published_client, daemon, dockerfile=DOCKERFILE, files=files, name=name)
    assert got["image"]["state"] == "ready", got["lines"][-20:]
    sbx = api.create_sandbox(image=got["image"]["id"])
    out = api.exec(sbx.id, command="python3 -c \"import sys; d=open('/srv/copied','rb').read(); "
                   "sys.stdout.write(str(d == b'A text\\\\n' + bytes(range(256))))\"")
    assert out["stdout"] == "True", out
    # The same files again: the whole build is found in the cache. One file changed: the COPY's
    # layer is keyed by the files' content, so the build runs again from there.
    again = _build(published_client, daemon, dockerfile=DOCKERFILE, files=files, name=name)
    assert any("CACHED" in l for l in again["lines"]), again["lines"]
    changed = _build(published_client, daemon, dockerfile=DOCKERFILE, files={**files, "a.txt": "B\n"}, name=name)
    assert changed["image"]["state"] == "ready", changed["lines"][-20:]
    assert not any(l.startswith("CACHED step 2/") for l in changed["lines"]), changed["lines"]
    assert changed["image"]["id"] != got["image"]["id"]


def _wait(api, image_id, timeout=600):
    def done():
        j = api.get(f"/v1/images/{image_id}").json()
        return j if j["state"] not in ("queued", "building") else None
    return wait_until(done, timeout, 0.5, what=f"image {image_id} built")


def test_apt_line_in_the_log(api):
    """apt needs the network a build does not have here: its line is read in the log."""
    r = api.post("/v1/images", json={"name": _name("apt"), "recipe": {"apt": ["curl", "ca-certificates=20230311"],
                                                                       "base": "default"}})
    assert r.status_code == 201, r.text
    image = _wait(api, r.json()["id"])
    lines = [l["line"] for l in api.get(f"/v1/images/{image['id']}/logs").json()["lines"]]
    want = ('  RUN ["/bin/sh","-c","apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y '
            '--no-install-recommends \\"$@\\" && rm -rf /var/lib/apt/lists/*","apt","curl",'
            '"ca-certificates=20230311"]')
    assert want in lines[:8], lines[:8]
    assert image["recipe"] == {"apt": ["curl", "ca-certificates=20230311"], "base": "default"}, image


def _files(n, size=0, path="f{}"):
    return [{"path": path.format(i), "content": "a" * size} for i in range(n)]


REFUSED = [
    ({"recipe": {"pythonPackages": ["x"]}}, "recipe has an unknown field pythonPackages"),
    ({"recipe": "pip install x"}, "recipe must be an object"),
    ({"recipe": {"apt": ["curl", "curl; id"]}}, "recipe.apt[1] is not a Debian package"),
    ({"recipe": {"apt": ["-oAPT::Get::AllowUnauthenticated=true"]}}, "recipe.apt[0] starts with \"-\""),
    ({"recipe": {"apt": ["python3*"]}}, "recipe.apt[0]"),
    ({"recipe": {"pip": ["ok", "--index-url=http://evil.example/"]}}, "recipe.pip[1] starts with \"-\""),
    ({"recipe": {"pip": ["-e", "."]}}, "recipe.pip[0] starts with \"-\""),
    ({"recipe": {"pip": ["x$(id)"]}}, "recipe.pip[0] is not a pip requirement"),
    ({"recipe": {"pip": ["x; python_version<'3'"]}}, "recipe.pip[0]"),
    ({"recipe": {"npm": ["--prefix=/"]}}, "recipe.npm[0] starts with \"-\""),
    ({"recipe": {"npm": ["left-pad", "a|b"]}}, "recipe.npm[1] is not an npm package"),
    ({"recipe": {"pip": "numpy"}}, "recipe.pip must be an array"),
    ({"recipe": {"commands": ["true", ""]}}, "recipe.commands[1]"),
    ({"recipe": {"env": {"BAD-NAME": "x"}}}, "recipe.env: BAD-NAME"),
    ({"recipe": {"env": {"A": "line\nbreak"}}}, "recipe.env.A"),
    ({"recipe": {"workdir": "relative"}}, "recipe.workdir"),
    ({"recipe": {"user": "nobody"}}, 'recipe.user must be "root" or "sandbox"'),
    ({"recipe": {"base": "default\nRUN id"}}, "recipe.base"),
    ({"recipe": {"files": [{"path": "../escape", "content": "x"}]}}, "recipe.files[0].path holds \"..\""),
    ({"dockerfile": "FROM default\n", "files": [{"path": "a/../../x", "content": ""}]}, "files[0].path holds \"..\""),
    ({"dockerfile": "FROM default\n", "files": [{"path": "/etc/passwd", "content": ""}]}, "files[0].path is absolute"),
    ({"dockerfile": "FROM default\n", "files": [{"path": "a", "content": ""}, {"path": "./a", "content": ""}]},
     "a is given twice"),
    ({"dockerfile": "FROM default\n", "files": _files(1001)}, "files has 1001 files; the most is 1000"),
    ({"dockerfile": "FROM default\n", "files": _files(3, 3 << 20)}, "files[2]: the files are over 8 MiB"),
    ({"dockerfile": "FROM default\n", "files": [{"path": "a", "content": "not base64!", "encoding": "base64"}]},
     "files[0].content is not base64"),
    ({"dockerfile": "FROM default\n", "files": [{"path": "a", "content": "", "mode": 0o4755}]}, "files[0].mode"),
    ({"dockerfile": "FROM default\n", "files": [{"path": "a", "content": "x"}],
      "context": {"archive": {"sha256": "0" * 64, "size": 1, "chunks": ["0" * 64]}}}, "give files or context"),
    ({"recipe": {"files": [{"path": "a", "content": "x"}]},
      "context": {"archive": {"sha256": "0" * 64, "size": 1, "chunks": ["0" * 64]}}}, "give files or context"),
    ({"dockerfile": "FROM default\n", "recipe": {"pip": ["x"]}}, "give one of image, dockerfile and recipe"),
    ({"recipe": {"pip": ["x"]}, "files": [{"path": "a", "content": ""}]}, "a recipe's files are its own"),
    ({"image": "python:3.12-slim", "files": [{"path": "a", "content": ""}]}, "files go with a dockerfile"),
]


@pytest.mark.parametrize("body,says", REFUSED, ids=[s[:40] for _, s in REFUSED])
def test_refusals(api, body, says):
    r = api.post("/v1/images", json={"name": _name("bad"), **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and says in err["message"], err


def test_a_body_past_its_bound_is_413(api):
    r = api.post("/v1/images", json={"dockerfile": "FROM default\n", "files": _files(1, 13 << 20)})
    assert r.status_code == 413, r.text[:500]


def test_published_client_sees_the_refusal(published_client, daemon):
    got = published_client.run_json(daemon, """
import json
from withruntime import Runtime
try:
    Runtime().images.create(recipe={"pip": ["--extra-index-url=http://evil.example/"]})
    print(json.dumps(None))
except Exception as e:
    print(json.dumps([getattr(e, "code", None), str(e)]))
""")
    assert got[0] == "invalid_request" and "recipe.pip[0]" in got[1], got


OURS = """
import json, sys
from withruntime import Runtime
rt = Runtime()
image = rt.images.build(recipe={"env": {"FROM_OURS": "yes"}, "files": {"note.txt": "ours\\n", "b.bin": b"\\x00\\x01"},
                                "commands": ["cat note.txt > seen.txt"]}, name=sys.argv[1])
inline = rt.images.build(dockerfile="FROM default\\nCOPY x.txt /srv/\\n", files=[{"path": "x.txt", "content": "x"}],
                         name=sys.argv[1] + "-inline")
print(json.dumps({"state": image["state"], "recipe": image["recipe"], "inline": inline["state"]}))
"""


def test_our_sdk_sends_recipes_and_files(api):
    from helpers import REPO
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "sdk" / "python" / "src"),
           "RUNTIME_API_KEY": api.daemon.api_key, "RUNTIME_BASE_URL": api.daemon.base_url}
    r = subprocess.run([sys.executable, "-c", OURS, _name("ours")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["state"] == "ready" and got["inline"] == "ready", got
    assert {f["path"]: f["size"] for f in got["recipe"]["files"]} == {"note.txt": 5, "b.bin": 2}, got
    assert got["recipe"]["env"] == {"FROM_OURS": "yes"}, got


@pytest.mark.skipif(not (NODE and NPM), reason="node and npm are not installed (scripts/install-deps.sh)")
def test_our_typescript_sdk_sends_recipes_and_files(js_build, daemon):
    """runtime.images of sdk/js (sdk/js/test/images.test.mjs) on the namespace driver: recipes, inline
    files and build secrets."""
    skip_unless_driver(daemon, "namespace")
    run_node("images.test.mjs", js_env(daemon, "namespace"), FILE_TIMEOUT["namespace"])
