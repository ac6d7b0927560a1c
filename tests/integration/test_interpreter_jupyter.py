"""The interpreter on a Jupyter kernel: where the image has ipykernel (the default and
analysis images), each context is an IPython kernel, so IPython's semantics are IPython's
own (`!cmd`, `%magics`, `display()`, its display formatters), and a value's MIME bundle is
what IPython's formatters give for it, checked object by object against IPython itself in
the same kernel. The faults: a kernel that dies mid-cell, a cell that prints without end,
a kernel that ignores an interrupt; none touches another context."""
from __future__ import annotations

import json
import time

import pytest

from test_interpreter import contexts, plain, run


def kernel_of(sbx, ctx: str = "python") -> str:
    listed = {c["id"]: c for c in contexts(sbx, "GET")["data"]}
    return listed[ctx]["kernel"]


@pytest.mark.driver_independent  # IPython's semantics are the kernel's, the same in every sandbox
def test_ipython_semantics(sandbox):
    out = run(sandbox, "!pwd")
    # IPython runs !cmd on a pseudo-terminal (pexpect): its lines end in \r\n, as in Jupyter.
    assert out["status"] == "ok" and out["stdout"].rstrip() == "/workspace", out
    assert kernel_of(sandbox) == "ipykernel"
    out = run(sandbox, "files = !ls -d /etc\nfiles")
    assert plain(out) == "['/etc']", out
    out = run(sandbox, "%cd /tmp\nimport os\nos.getcwd()")
    assert plain(out) == "'/tmp'", out
    out = run(sandbox, "from IPython.display import display, HTML, Markdown\n"
                       "display(HTML('<b>bold</b>'))\ndisplay(Markdown('*md*'))\n21 * 2")
    assert out["status"] == "ok", out
    shown = [(r["main"], r["data"]) for r in out["results"]]
    assert shown[0][0] is False and shown[0][1]["text/html"] == "<b>bold</b>", shown
    assert shown[1][1]["text/markdown"] == "*md*", shown
    assert shown[2] == (True, {"text/plain": "42"}), shown
    # execution_count is the kernel's: In[] and Out[] follow it.
    n = out["executionCount"]
    out = run(sandbox, "Out[%d]" % n)
    assert plain(out) == "42" and out["executionCount"] == n + 1, out
    # A magic that IPython has and Python has not.
    out = run(sandbox, "%%bash\necho from-bash")
    assert out["stdout"].rstrip() == "from-bash", out


# Each object's class, defined in the kernel; the last expression of a cell is one of them.
REPR_CLASSES = """
import base64, json
PNG = base64.b64decode(b'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg==')
class Html:
    def _repr_html_(self): return '<i>html</i>'
class Md:
    def _repr_markdown_(self): return '# md'
class Svg:
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"/>'
class Js:
    def _repr_json_(self): return {'a': [1, 2]}
class Latex:
    def _repr_latex_(self): return r'$x^2$'
class Png:
    def _repr_png_(self): return PNG
class Jpeg:
    def _repr_jpeg_(self): return b'\\xff\\xd8\\xff\\xe0fake-jpeg'
class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {'text/plain': 'bundle', 'application/vnd.custom+json': {'k': 1}, 'text/html': '<p>b</p>'}
"""


RENDERED = ["Html()", "Md()", "Svg()", "Js()", "Latex()", "Png()", "Jpeg()", "Bundle()", "{'a': 1}", "[1, 'x']",
            "'text'"]


@pytest.mark.driver_independent  # rendering is the kernel's formatters, the same in every sandbox
def test_last_value_is_rendered_as_ipython_renders_it(sandbox):
    """Object by object in one kernel (a sandbox each bought nothing but
    its start): the main result's bundle is what IPython's formatters give."""
    run(sandbox, REPR_CLASSES)
    for expr in RENDERED:
        run(sandbox, "obj = " + expr)
        out = run(sandbox, "obj")
        assert out["status"] == "ok", (expr, out)
        main = [r for r in out["results"] if r["main"]]
        assert len(main) == 1, (expr, out)
        # What IPython's display formatters give for the same object, in the same kernel.
        # Binary types (image/png, image/jpeg) are bytes there; the kernel protocol carries them in base64.
        ref = run(sandbox, "import base64, json\n"
                           "got = get_ipython().display_formatter.format(obj)[0]\n"
                           "print(json.dumps({k: base64.b64encode(v).decode() if isinstance(v, bytes) else v "
                           "for k, v in got.items()}))")
        expected = json.loads(ref["stdout"])
        assert main[0]["data"] == expected, (expr, main, expected)
        assert "text/plain" in expected, expr


def test_figure_renders_as_ipython_renders_it(api, analysis_image, any_driver):
    sbx = api.create_sandbox(driver=any_driver, image="analysis", timeoutSeconds=900)
    out = run(sbx, "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 3, 2])\nfig",
              timeoutMs=300000, http_timeout=330)
    assert out["status"] == "ok", out
    main = [r for r in out["results"] if r["main"]][0]["data"]
    assert set(main) >= {"image/png", "text/plain"} and main["text/plain"].startswith("<Figure size"), main
    ref = run(sbx, "import json\nprint(json.dumps(sorted(get_ipython().display_formatter.format(fig)[0])))")
    assert sorted(main) == json.loads(ref["stdout"])


def test_kernel_that_dies_mid_cell_restarts_on_the_next_run(sandbox):
    contexts(sandbox, "POST", expect=201, json={"id": "other"})
    run(sandbox, "kept = 'other'", context="other")
    run(sandbox, "x = 1\nprint('before')")
    out = run(sandbox, "import os, signal\nprint('dying', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)")
    assert out["status"] == "lost", out
    assert out["error"]["name"] == "ContextDied" and "kernel died" in out["error"]["value"], out
    assert "signal 9" in out["error"]["value"], out
    again = run(sandbox, "x")
    assert again["status"] == "error" and again["error"]["name"] == "NameError", again
    assert plain(run(sandbox, "y = 2\ny")) == "2"
    # The other context never noticed.
    assert plain(run(sandbox, "kept", context="other")) == "'other'"


@pytest.mark.driver_independent  # the bound is the daemon's and the agent's
def test_endless_output_is_bounded_and_reported_truncated(sandbox):
    run(sandbox, "kept = 3")
    t0 = time.monotonic()
    out = run(sandbox, "while True:\n    print('x' * 1000)", timeoutMs=4000)
    assert out["status"] == "timeout", {k: v for k, v in out.items() if k != "stdout"}
    assert out["stdoutTruncated"] is True
    assert 512 * 1024 <= len(out["stdout"]) <= 1024 * 1024
    assert time.monotonic() - t0 < 60
    assert plain(run(sandbox, "kept")) == "3"


# The kill after the timeout is the agent's; a kernel that dies per driver is above, and
# test_exec.py's timeouts kill per driver.
@pytest.mark.driver_independent
def test_kernel_that_ignores_an_interrupt_is_killed(sandbox):
    contexts(sandbox, "POST", expect=201, json={"id": "other"})
    run(sandbox, "kept = 'other'", context="other")
    t0 = time.monotonic()
    out = run(sandbox, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(120)",
              timeoutMs=1000)
    took = time.monotonic() - t0
    assert out["status"] == "timeout", out
    assert out["error"]["name"] == "TimeoutError" and "killed" in out["error"]["value"], out
    assert took < 30, took
    # A new kernel for the next run; the other context kept its state.
    again = run(sandbox, "signal")
    assert again["error"]["name"] == "NameError", again
    assert plain(run(sandbox, "kept", context="other")) == "'other'"


@pytest.mark.driver_independent  # which kernel runs is the image's, not the driver's
def test_loop_fallback_and_which_kernel_a_context_runs(sandbox):
    made = contexts(sandbox, "POST", expect=201, json={"id": "loop", "env": {"RUNTIME_INTERPRETER_KERNEL": "loop"}})
    assert made["kernel"] == "loop"
    assert plain(run(sandbox, "6 * 7", context="loop")) == "42"
    bang = run(sandbox, "!pwd", context="loop")
    assert bang["status"] == "error" and bang["error"]["name"] == "SyntaxError"
    made = contexts(sandbox, "POST", expect=201, json={"id": "kern"})
    assert made["kernel"] == "ipykernel"


def test_context_cwd_the_user_cannot_enter_is_a_clear_400(sandbox):
    r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/interpreter/contexts", json={"cwd": "/root"})
    assert r.status_code == 400, r.text
    assert "not open to the sandbox's user" in r.json()["error"]["message"]


# The escalation is the agent's; test_interpreter.py interrupts a cell per driver.
@pytest.mark.driver_independent
def test_interrupt_a_kernel_ignores_is_escalated_to_a_kill(sandbox):
    import threading
    got = {}
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('deaf', flush=True)\ntime.sleep(120)"
    run(sandbox, "0")  # the kernel is up: what follows times the cell alone
    t = threading.Thread(target=lambda: got.update(out=run(sandbox, code, timeoutMs=120000)))
    t0 = time.monotonic()
    t.start()
    time.sleep(3)  # the cell has started: its SIGINT handler is in place
    assert contexts(sandbox, "POST", "/python:interrupt", json={}) == {"interrupted": True}
    t.join(60)
    assert not t.is_alive()
    out = got["out"]
    assert out["status"] == "lost" and out["error"]["name"] == "ContextDied", out
    assert "did not stop within 5 s of the interrupt" in out["error"]["value"], out
    assert time.monotonic() - t0 < 40
    assert plain(run(sandbox, "1 + 1")) == "2"
