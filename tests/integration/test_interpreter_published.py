"""Conformance: the published client (withruntime 0.35.0 from the package index, in a venv of
its own since it has our SDK's name) drives runtimed's interpreter: run with state, streamed
callbacks, errors, contexts create/list/interrupt/restart/remove, and a result by reference.
Our SDK's sbx.interpreter answers the same calls alike."""
from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = "withruntime==0.35.0"

SCRIPT = r'''
import json, sys, threading, time
sid, url, key = sys.argv[1:4]
if sys.argv[4] == "published":
    from withruntime import Runtime
    sbx = Runtime(api_key=key, base_url=url).sandboxes.get(sid)
else:
    sys.path.insert(0, sys.argv[5])
    from withruntime import Sandbox
    sbx = Sandbox.connect(sid, api_key=key, base_url=url)
it = sbx.interpreter
out = {}
it.run("x = 20")
out["value"] = it.run("x * 2 + 2")["results"][0]["data"]["text/plain"]
seen = []
ex = it.run("print('a')\nx", on_stdout=lambda t: seen.append(("stdout", t)),
            on_result=lambda r: seen.append(("result", r["data"]["text/plain"])))
out["streamed"] = seen
out["streamed_status"] = ex["status"]
err = it.run("1/0")
out["error"] = [err["status"], err["error"]["name"]]
made = it.contexts.create(id="conf", cwd="/tmp")
out["made"] = [made["id"], made["language"], made["cwd"]]
out["listed"] = sorted(c["id"] for c in it.contexts.list())
it.run("y = 1", context="conf")
got = {}
t = threading.Thread(target=lambda: got.update(ex=it.run("import time\nfor _ in range(900): time.sleep(0.1)",
                                                          context="conf", timeout_ms=120000)))
t.start()
while t.is_alive():
    it.contexts.interrupt("conf")
    t.join(0.5)
out["interrupted"] = got["ex"]["error"]["name"]
out["kept"] = it.run("y", context="conf")["results"][0]["data"]["text/plain"]
it.contexts.restart("conf")
out["after_restart"] = it.run("y", context="conf")["error"]["name"]
big = it.run("class B:\n    def _repr_html_(self): return 'h' * 1_000_000\n    def __repr__(self): return 'B'\nB()")
ref = big["results"][0]["refs"]["text/html"]
out["ref_bytes"] = len(it.result(ref))
out["removed"] = it.contexts.remove("conf")
print(json.dumps(out))
'''


@pytest.fixture(scope="session")
def published_python(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("published-client")
    venv.create(where, with_pip=True)
    py = where / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", PUBLISHED],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.skip(f"pip install {PUBLISHED} failed (no package index here?): {r.stderr[-500:]}")
    return py


EXPECTED = {
    "value": "42", "streamed": [["stdout", "a\n"], ["result", "20"]], "streamed_status": "ok",
    "error": ["error", "ZeroDivisionError"], "made": ["conf", "python", "/tmp"],
    "listed": ["conf", "python"], "interrupted": "KeyboardInterrupt", "kept": "1",
    "after_restart": "NameError", "ref_bytes": 1_000_000, "removed": True,
}


def drive(python: str, sandbox, which: str) -> dict:
    d = sandbox.api.daemon
    r = subprocess.run([python, "-c", SCRIPT, sandbox.id, d.base_url, d.api_key, which,
                        str(REPO / "sdk" / "python" / "src")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{which} client failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


# The microVM's interpreter is test_interpreter.py's microvm case; the published client's calls
# on it repeat the same cells under TCG (16 s): RUNTIME_TEST_ALL=1 runs them.
def expected(sandbox) -> dict:
    """EXPECTED, with the default contexts of the image's other kernels listed: bash where it
    has bash_kernel, javascript and typescript where it has deno."""
    bash = sandbox.exec("python3 -c 'import bash_kernel'")["exitCode"] == 0
    deno = sandbox.exec("test -x /usr/local/bin/deno")["exitCode"] == 0
    return dict(EXPECTED, listed=sorted(EXPECTED["listed"] + (["bash"] if bash else [])
                                        + (["javascript", "typescript"] if deno else [])))


def test_published_client_interpreter(published_python, sandbox):
    assert drive(str(published_python), sandbox, "published") == expected(sandbox)


@pytest.mark.driver_independent  # our SDK's calls; the published client's run per driver
def test_our_sdk_interpreter_alike(sandbox):
    assert drive(sys.executable, sandbox, "ours") == expected(sandbox)
