"""The stateful interpreter on every driver: POST .../interpreter:run and the
contexts. State persists between cells, a cell past its timeout or
interrupted stops while the state stays, a context that runs out of memory
dies alone, output and results are bounded, and what a client names (a
context id, a result name) is validated."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import struct
import threading
import time
import zlib

import pytest

from helpers import assert_error, wait_until


def run(sbx, code: str, expect: int = 200, http_timeout: float | None = None, **body):
    kw = {"timeout": http_timeout} if http_timeout else {}
    r = sbx.api.post(f"/v1/sandboxes/{sbx.id}/interpreter:run", json={"code": code, **body}, **kw)
    assert r.status_code == expect, f"run {code!r}: {r.status_code} {r.text[:2000]}"
    return r.json()


def contexts(sbx, method: str, suffix: str = "", expect: int = 200, **kw):
    r = sbx.api.request(method, f"/v1/sandboxes/{sbx.id}/interpreter/contexts{suffix}", **kw)
    assert r.status_code == expect, f"{method} contexts{suffix}: {r.status_code} {r.text[:2000]}"
    return r.json()


def plain(execution) -> str:
    mains = [r for r in execution["results"] if r["main"]]
    assert mains, execution
    return mains[0]["data"]["text/plain"]


@pytest.mark.microvm_subset
def test_state_persists_between_cells(sandbox):
    first = run(sandbox, "x = 41\nprint('set')")
    assert first["status"] == "ok", first
    assert first["stdout"] == "set\n" and first["results"] == [] and first["error"] is None
    second = run(sandbox, "x + 1")
    assert second["status"] == "ok" and plain(second) == "42"
    assert second["executionCount"] == first["executionCount"] + 1
    assert second["context"] == "python"


@pytest.mark.driver_independent  # the result's shape is the daemon's and the kernel's
def test_error_is_a_result_and_the_state_stays(sandbox):
    run(sandbox, "kept = 'yes'")
    out = run(sandbox, "print('before')\nimport sys; print('warn', file=sys.stderr)\nraise ValueError('bad value')")
    assert out["status"] == "error"
    assert out["stdout"] == "before\n" and out["stderr"] == "warn\n"
    err = out["error"]
    assert err["name"] == "ValueError" and err["value"] == "bad value"
    # IPython names a cell "Cell In [N]" in a traceback (8.5, Debian 12's), the loop "<cell-N>".
    assert "ValueError: bad value" in err["traceback"]
    assert "Cell In [" in err["traceback"] or "<cell-" in err["traceback"], err
    # The program's own frames are not shown.
    assert "run_cell" not in err["traceback"]
    assert plain(run(sandbox, "kept")) == "'yes'"
    syntax = run(sandbox, "def (")
    assert syntax["status"] == "error" and syntax["error"]["name"] == "SyntaxError"


def test_subprocess_output_joins_the_cell(sandbox):
    out = run(sandbox, "import os\nos.system('echo from-a-child')")
    assert "from-a-child" in out["stdout"], out


def test_timeout_stops_the_cell_and_keeps_the_state(sandbox):
    run(sandbox, "n = 5")
    t0 = time.monotonic()
    out = run(sandbox, "while True:\n    n = n", timeoutMs=1500)
    assert out["status"] == "timeout", out
    assert out["error"]["name"] == "TimeoutError"
    assert time.monotonic() - t0 < 60
    assert plain(run(sandbox, "n")) == "5"


def test_interrupt_stops_the_cell_and_keeps_the_state(sandbox):
    run(sandbox, "before = 7")
    got = {}

    def slow():
        got["out"] = run(sandbox, "import time\nfor i in range(600):\n    time.sleep(0.1)", timeoutMs=120000)

    t = threading.Thread(target=slow)
    t.start()
    # Interrupt until the cell has started and stops: the first SIGINT may
    # land before the cell runs, which the context ignores by design.
    def interrupted():
        contexts(sandbox, "POST", "/python:interrupt", json={})
        t.join(0.5)
        return not t.is_alive()
    wait_until(interrupted, 90, 0.2, what="the cell to stop on interrupt")
    out = got["out"]
    assert out["status"] == "error" and out["error"]["name"] == "KeyboardInterrupt", out
    assert plain(run(sandbox, "before")) == "7"


@pytest.mark.driver_independent  # the contexts' routes are the daemon's; each driver starts kernels in the tests above
def test_contexts_lifecycle(sandbox):
    made = contexts(sandbox, "POST", expect=201, json={"id": "ctx-a", "language": "python",
                                                        "cwd": "/tmp", "env": {"GREETING": "hi"}})
    assert made["id"] == "ctx-a" and made["language"] == "python" and made["cwd"] == "/tmp"
    contexts(sandbox, "POST", expect=409, json={"id": "ctx-a"})
    listed = contexts(sandbox, "GET")["data"]
    assert "ctx-a" in [c["id"] for c in listed]
    out = run(sandbox, "import os\n(os.getcwd(), os.environ['GREETING'])", context="ctx-a")
    assert plain(out) == "('/tmp', 'hi')"
    run(sandbox, "mine = 1", context="ctx-a")
    # Contexts do not share state.
    other = run(sandbox, "mine")
    assert other["status"] == "error" and other["error"]["name"] == "NameError"
    restarted = contexts(sandbox, "POST", "/ctx-a:restart", json={})
    assert restarted["id"] == "ctx-a"
    gone = run(sandbox, "mine", context="ctx-a")
    assert gone["error"]["name"] == "NameError"
    assert contexts(sandbox, "DELETE", "/ctx-a") == {"deleted": True}
    assert contexts(sandbox, "DELETE", "/ctx-a") == {"deleted": False}
    r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/interpreter:run", json={"code": "1", "context": "ctx-a"})
    assert_error(r, 404, "not_found")
    fresh = contexts(sandbox, "POST", expect=201, json={})
    assert fresh["id"].startswith("ctx-")


@pytest.mark.driver_independent  # the stream's framing is the daemon's
def test_streamed_events(sandbox):
    lines = []
    with sandbox.api.stream("POST", f"/v1/sandboxes/{sandbox.id}/interpreter:run",
                            json={"code": "print('a')\nprint('b')\n6*7", "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        for line in r.iter_lines():
            if line.strip():
                lines.append(json.loads(line))
    kinds = [e["k"] for e in lines]
    assert kinds[-1] == "execution" and "stdout" in kinds and "result" in kinds, lines
    assert "".join(e["text"] for e in lines if e["k"] == "stdout") == "a\nb\n"
    execution = lines[-1]["execution"]
    assert execution["status"] == "ok" and plain(execution) == "42"


@pytest.mark.driver_independent  # the bound is the daemon's and the agent's
def test_output_flood_is_bounded(sandbox):
    out = run(sandbox, "import sys\nfor _ in range(64):\n    sys.stdout.write('x' * 65536)\n'done'")
    assert out["status"] == "ok" and plain(out) == "'done'"
    assert len(out["stdout"]) <= 1024 * 1024
    assert len(out["stdout"]) >= 512 * 1024


@pytest.mark.driver_independent  # the reference is the daemon's
def test_large_result_is_kept_by_reference(sandbox):
    code = ("class Big:\n    def _repr_html_(self):\n        return '<p>' + 'y' * 2_000_000 + '</p>'\n"
            "    def __repr__(self):\n        return 'Big'\nBig()")
    out = run(sandbox, code)
    res = out["results"][0]
    assert "text/html" not in res["data"] and res["data"]["text/plain"] == "Big"
    ref = res["refs"]["text/html"]
    assert ref["path"].startswith("/workspace/.runtime/interpreter/python/out/")
    name = ref["path"].rsplit("/", 1)[1]
    got = sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/interpreter/contexts/python/results/{name}")
    assert got.status_code == 200 and len(got.content) == ref["size"] == 2_000_007
    missing = sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/interpreter/contexts/python/results/nope.png")
    assert_error(missing, 404, "not_found")


def test_forged_lines_from_the_sandbox_are_filtered(sandbox):
    # Code in the sandbox can write anything to the pipe the daemon reads:
    # a reference outside its context's out/, an unknown MIME key, a line
    # over the bound, garbage. The daemon drops what it does not accept.
    # The cell reaches the connection's writer in the loop's own process (a
    # context that asks for the loop); a kernel's cell can only display, and
    # a bundle it displays is filtered the same way.
    kernel = run(sandbox, "from IPython.display import display\n"
                          "display({'text/plain': 'forged', 'no mime': 1}, raw=True)")
    assert kernel["results"] == [{"main": False, "data": {"text/plain": "forged"}, "refs": {}}], kernel
    made = contexts(sandbox, "POST", expect=201, json={"id": "loop", "env": {"RUNTIME_INTERPRETER_KERNEL": "loop"}})
    assert made["kernel"] == "loop"
    code = """
import gc
cell = [o for o in gc.get_objects() if type(o).__name__ == 'Cell'][0]
cell.line({'k': 'result', 'main': True, 'data': {'text/plain': 'forged', 'no mime': 1},
           'refs': {'image/png': {'path': '/etc/shadow', 'size': 1},
                    'text/html': {'path': '/workspace/.runtime/interpreter/other/out/x.html', 'size': 1}}})
cell.out.write(b'{"k":"stdout","text":"' + b'z' * (5 * 1024 * 1024) + b'"}\\n')
cell.out.write(b'not json\\n[1,2]\\n{"k":"error","name":5}\\n')
cell.out.flush()
'after'
"""
    out = run(sandbox, code, context="loop")
    forged = out["results"][0]
    assert forged["data"] == {"text/plain": "forged"} and forged["refs"] == {}
    assert "z" * 1000 not in out["stdout"]
    assert out["error"] == {"name": "", "value": "", "traceback": ""}
    assert out["results"][-1]["data"]["text/plain"] == "'after'"
    assert sandbox.api.daemon.alive()


PORT_FILE = "/workspace/.runtime/interpreter/python/port"


def test_port_file_from_the_sandbox_is_checked(sandbox):
    """The daemon reaches a context at the port its directory names, a file the sandbox can
    rewrite. Garbage there is a context that is not running (409, fixed by a restart); a port of
    another server of the sandbox reaches that server, whose lines are checked like the
    context's."""
    assert plain(run(sandbox, "x = 1\nx")) == "1"
    for bad in ("garbage", "0", "99999999", "-5", "1" * 40):
        sandbox.exec(f"printf %s '{bad}' > {PORT_FILE}")
        assert_error(sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/interpreter:run", json={"code": "x"}),
                     409, "conflict")
    contexts(sandbox, "POST", "/python:restart", json={})
    assert plain(run(sandbox, "x = 2\nx")) == "2"
    # A server of the sandbox's own on the context's port file: what it says is filtered.
    forged = (b'{"k":"result","main":true,"data":{"text/plain":"forged","no mime":1},'
              b'"refs":{"image/png":{"path":"/etc/shadow","size":1}}}\n'
              b'not json\n{"k":"end","status":"pwned","executionCount":"x"}\n')
    server = f"""
import os, socket, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(4)
def serve():
    while True:
        c, _ = s.accept()
        c.recv(65536)
        c.sendall({forged!r})
        c.close()
threading.Thread(target=serve, daemon=True).start()
open("{PORT_FILE}.tmp", "w").write(str(s.getsockname()[1]))
os.rename("{PORT_FILE}.tmp", "{PORT_FILE}")
"""
    run(sandbox, server)
    out = run(sandbox, "x")
    assert out["results"] == [{"main": True, "data": {"text/plain": "forged"}, "refs": {}}], out
    assert out["status"] == "error" and out["executionCount"] == 0, out
    assert sandbox.api.daemon.alive()


def test_bad_input(sandbox):
    base = f"/v1/sandboxes/{sandbox.id}/interpreter"
    api = sandbox.api
    assert_error(api.post(f"{base}:run", json={"code": "1", "context": "../etc"}), 400, "invalid_request")
    assert_error(api.post(f"{base}:run", json={"code": "1", "context": "A" * 80}), 400, "invalid_request")
    assert_error(api.post(f"{base}:run", json={"code": 1}), 400, "invalid_request")
    assert_error(api.post(f"{base}:run", json={}), 400, "invalid_request")
    assert_error(api.post(f"{base}:run", json={"code": "1", "language": "cobol"}), 400, "invalid_request")
    assert_error(api.post(f"{base}:run", json={"code": "1", "timeoutMs": -1}), 400, "invalid_request")
    assert_error(api.post(f"{base}:run", json={"code": "1", "bogus": 1}), 400, "invalid_request")
    assert_error(api.post(f"{base}/contexts", json={"id": "bad/id"}), 400, "invalid_request")
    assert_error(api.post(f"{base}/contexts", json={"cwd": "relative"}), 400, "invalid_request")
    assert_error(api.post(f"{base}/contexts", json={"env": {"A=B": "x"}}), 400, "invalid_request")
    assert_error(api.post(f"{base}/contexts", json={"cwd": "/no/such/dir"}), 400, "invalid_request")
    assert api.post(f"{base}/contexts/..%2Fx:restart", json={}).status_code == 404
    assert api.get(f"{base}/contexts/python/results/.hidden").status_code == 404
    assert api.get(f"{base}/contexts/python/results/a%2Fb").status_code == 404
    assert_error(api.post(f"{base}/contexts/nope:restart", json={}), 404, "not_found")
    assert api.post(f"{base}/contexts/nope:interrupt", json={}).status_code == 404
    assert_error(api.post("/v1/sandboxes/sbx_00000000000000000000/interpreter:run", json={"code": "1"}),
                 404, "not_found")


def test_small_sandbox_kernel_starts_every_time(api, driver):
    """A 256 MiB sandbox's kernel (its address space capped at 192 MiB under gVisor)
    starts on each restart and has room for numpy: the cap counts reservations, and how
    many the kernel makes must not depend on its threads' timing."""
    sbx = api.create_sandbox(driver=driver, memoryMiB=256)
    base = f"/v1/sandboxes/{sbx.id}/interpreter"
    for i in range(4):
        out = run(sbx, "import numpy\nint(numpy.arange(4 * 1024 * 1024).sum() % 1000)")
        assert out["status"] == "ok", json.dumps(out)[:3000]
        assert plain(out) == str(sum(range(4 * 1024 * 1024)) % 1000)
        if i < 3:
            r = api.post(f"{base}/contexts/python:restart", json={})
            assert r.status_code == 200, r.text


def test_out_of_memory_kills_the_context_only(api, driver):
    sbx = api.create_sandbox(driver=driver, memoryMiB=256)
    run(sbx, "x = 1")
    out = run(sbx, "hog = []\nwhile True:\n    hog.append(bytearray(16 * 1024 * 1024))", timeoutMs=120000)
    if out["status"] == "error" and out["error"]["name"] == "MemoryError":
        # gVisor and some kernels refuse the allocation before the OOM
        # killer acts: the context survives, which is as good.
        assert plain(run(sbx, "del hog\nx")) == "1"
        return
    assert out["status"] == "lost", out
    assert out["error"]["name"] == "ContextDied"
    # The sandbox and its agent are fine.
    assert sbx.exec("echo alive")["stdout"] == "alive\n"
    # The kernel died, its context did not: the next run starts a new kernel, empty.
    again = run(sbx, "x")
    assert again["status"] == "error" and again["error"]["name"] == "NameError", again
    assert plain(run(sbx, "2 + 2")) == "4"


def test_contexts_die_with_the_sandbox(api, driver):
    sbx = api.create_sandbox(driver=driver)
    made = contexts(sbx, "POST", expect=201, json={"id": "k"})
    assert made["running"] and made["pid"]
    r = api.delete(f"/v1/sandboxes/{sbx.id}")
    assert r.status_code == 200
    r = api.post(f"/v1/sandboxes/{sbx.id}/interpreter:run", json={"code": "1", "context": "k"})
    assert r.status_code in (404, 409), r.text


# ---- the analysis image: charts and tables ----------------------------------

def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    # The compressed image data inflates: the PNG is whole.
    pos, idat = 8, b""
    while pos < len(data):
        n, k = struct.unpack(">I4s", data[pos:pos + 8])
        if k == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    assert zlib.decompress(idat)
    return width, height


# The emulated microVM imports pandas and draws with matplotlib several times
# slower than the others, more so under load: its cells get minutes.
SLOW_CELL = {"timeoutMs": 600_000, "http_timeout": 660}


# The tables and charts are the interpreter's, alike on every driver; under TCG the microVM
# imports pandas and draws for close to a minute, so its case runs with RUNTIME_TEST_ALL=1.
@pytest.mark.parametrize("analysis_driver", ["namespace", "gvisor", "microvm"])
@pytest.mark.driver_independent  # the charts and tables are the kernel's formatters
def test_analysis_image_tables_and_charts(api, daemon, build_dir, image_dir, analysis_image, analysis_driver):
    """One cell defines a DataFrame, a later one shows it as a table and another draws it: the chart
    comes back as a PNG that decodes."""
    from conftest import need_microvm_parts
    from helpers import skip_unless_driver
    skip_unless_driver(daemon, analysis_driver)
    slow = {}
    if analysis_driver == "microvm":
        need_microvm_parts(build_dir, image_dir, "analysis")
        slow = SLOW_CELL
    # Under load the emulated microVM's cells outlast the default lease of 5 minutes.
    sbx = api.create_sandbox(driver=analysis_driver, image="analysis", timeoutSeconds=3600)
    made = run(sbx, "import pandas as pd\ndf = pd.DataFrame({'city': ['a', 'b', 'c'], 'sales': [3, 1, 2]})",
               **slow)
    assert made["status"] == "ok", made
    table = run(sbx, "df.sort_values('sales')", **slow)
    data = [r for r in table["results"] if r["main"]][0]["data"]
    assert "<table" in data["text/html"]
    t = data["application/vnd.runtime.table+json"]
    assert t["columns"] == ["city", "sales"] and t["rows"] == [["b", 1], ["c", 2], ["a", 3]]
    assert t["totalRows"] == 3 and t["truncated"] is False
    chart = run(sbx, "import matplotlib.pyplot as plt\ndf.plot.bar(x='city', y='sales')\nNone", **slow)
    assert chart["status"] == "ok", chart
    pngs = [r["data"]["image/png"] for r in chart["results"] if "image/png" in r["data"]]
    assert len(pngs) == 1
    w, h = _png_size(base64.b64decode(pngs[0]))
    assert w > 100 and h > 100


def test_cli_run_code(build_dir, daemon, api, analysis_image, tmp_path):
    """`runtime sandbox run-code`: state across runs, code from stdin, charts saved as PNG files,
    the exit codes its help names (0 ran, 1 raised, 124 timed out, 2 bad usage)."""
    from helpers import skip_unless_driver
    skip_unless_driver(daemon, "namespace")
    sbx = api.create_sandbox(driver="namespace", image="analysis")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    env.update(daemon.env())

    def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(build_dir / "runtime"), "sandbox", "run-code", *args], env=env,
                              input=stdin, capture_output=True, timeout=180, cwd=str(tmp_path))

    r = cli(sbx.id, "x = 6 * 7\nprint('set')")
    assert (r.returncode, r.stdout) == (0, b"set\n"), r.stderr
    r = cli(sbx.id, "-", stdin=b"x")
    assert r.returncode == 0 and r.stdout.strip() == b"42", (r.stdout, r.stderr)
    r = cli(sbx.id, "1 / 0")
    assert r.returncode == 1 and b"ZeroDivisionError" in r.stdout + r.stderr
    r = cli("--timeout", "2s", sbx.id, "import time\ntime.sleep(60)")
    assert r.returncode == 124, (r.stdout, r.stderr)
    r = cli(sbx.id, "x + 1")
    assert r.returncode == 0 and r.stdout.strip() == b"43", "the state outlives the timeout"
    charts = tmp_path / "charts"
    charts.mkdir()
    r = cli("--save-dir", str(charts), sbx.id,
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nNone")
    assert r.returncode == 0, (r.stdout, r.stderr)
    saved = sorted(charts.glob("*.png"))
    assert len(saved) == 1 and str(saved[0]).encode() in r.stdout, (saved, r.stdout)
    w, h = _png_size(saved[0].read_bytes())
    assert w > 100 and h > 100
    r = cli("--json", sbx.id, "x")
    assert r.returncode == 0 and json.loads(r.stdout)["results"][0]["data"]["text/plain"] == "42"
    r = cli("--context", "../x", sbx.id, "1")
    assert r.returncode == 1 and b"context must be" in r.stderr, (r.stdout, r.stderr)
    r = cli(sbx.id)
    assert r.returncode == 2 and b"give the sandbox's ID and the code" in r.stderr
    r = cli("sbx_nonexistent0000000", "1")
    assert r.returncode != 0
