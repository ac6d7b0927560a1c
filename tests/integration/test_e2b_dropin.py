"""Conformance: code written for E2B, as E2B's documentation shows it, run through the published
client's E2B drop-in (`from withruntime.e2b import Sandbox`, and `withruntime.e2b.code_interpreter`
for E2B's code interpreter) against runtimed: the sandbox's lifecycle, commands (foreground,
background, stdin, users, timeouts, callbacks), the filesystem, PTYs and the code interpreter.

What the drop-in refuses by design (NotSupportedException naming the alternative) is checked too,
so that docs/e2b.md's list stays true: a refusal is the drop-in's, never a 404 or a 501 of ours.

The suite makes each sandbox on the driver under test; the drop-in attaches with Sandbox.connect,
as E2B code that reconnects by id does. Sandbox.create itself is tested once, driver-independent."""
from __future__ import annotations

import pytest

from helpers import wait_until

CONNECT = """
import json, sys, time
from withruntime.e2b import (Sandbox, CommandExitException, TimeoutException, FileNotFoundException,
                             FileType, NotSupportedException, PtySize, SandboxQuery, SandboxNotFoundException)
sb = Sandbox.connect(sys.argv[1])
out = {}
"""


def test_commands(pub, sandbox):
    got = pub(CONNECT + """
r = sb.commands.run("echo hello; echo oops >&2")
out["run"] = [r.stdout, r.stderr, r.exit_code]
out["envs_cwd"] = sb.commands.run("echo $GREETING; pwd", envs={"GREETING": "hi"}, cwd="/tmp").stdout
out["whoami"] = [sb.commands.run("whoami").stdout.strip(), sb.commands.run("whoami", user="root").stdout.strip()]
try:
    sb.commands.run("echo partial; echo bad >&2; exit 3")
    out["exit"] = "no exception"
except CommandExitException as e:
    out["exit"] = [e.exit_code, e.stdout, e.stderr]
lines = []
sb.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=lambda s: lines.append(s))
out["on_stdout"] = "".join(lines)
t = time.monotonic()
try:
    sb.commands.run("sleep 30", timeout=1)
    out["timeout"] = "no exception"
except TimeoutException:
    out["timeout"] = round(time.monotonic() - t)

h = sb.commands.run("sleep 60", background=True)
out["listed"] = h.pid in [p.pid for p in sb.commands.list()]
out["killed"] = sb.commands.kill(h.pid)
try:
    h.wait()
    out["after_kill"] = "no exception"
except CommandExitException as e:
    out["after_kill"] = e.exit_code
out["listed_after"] = h.pid in [p.pid for p in sb.commands.list()]

c = sb.commands.run("cat", background=True, stdin=True)
sb.commands.send_stdin(c.pid, "through stdin\\n")
sb.commands.close_stdin(c.pid)
out["stdin"] = c.wait().stdout

b = sb.commands.run("echo begun; sleep 0.3; echo ended", background=True)
again = sb.commands.connect(b.pid)
out["connect"] = again.wait().stdout
print(json.dumps(out))
""", sandbox.id)
    assert got["run"] == ["hello\n", "oops\n", 0], got
    assert got["envs_cwd"] == "hi\n/tmp\n", got
    assert got["whoami"] == ["sandbox", "root"], got
    assert got["exit"] == [3, "partial\n", "bad\n"], got
    assert got["on_stdout"] == "line1\nline2\nline3\n", got
    assert got["timeout"] in (1, 2), got
    assert got["listed"] is True and got["killed"] is True, got
    # Killed by SIGKILL: E2B's handle reports a failed exit (137 in a shell's terms, or -9).
    assert got["after_kill"] != "no exception" and got["after_kill"] != 0, got
    assert got["listed_after"] is False, got
    assert got["stdin"] == "through stdin\n", got
    # connect() follows the command from now on, as E2B's does: what it printed before is not replayed.
    assert got["connect"].endswith("ended\n"), got


def test_files(pub, sandbox):
    got = pub(CONNECT + """
f = sb.files
w = f.write("/workspace/e2b/hello.txt", "hello e2b")
out["write"] = [w.name, w.path]
out["read"] = f.read("/workspace/e2b/hello.txt")
f.write("/workspace/e2b/blob.bin", bytes(range(256)))
out["bytes"] = list(f.read("/workspace/e2b/blob.bin", format="bytes")) == list(range(256))
out["mkdir"] = [f.make_dir("/workspace/e2b/sub"), f.make_dir("/workspace/e2b/sub")]
entries = f.list("/workspace/e2b")
out["list"] = sorted([e.name, e.type.value if hasattr(e.type, "value") else str(e.type)] for e in entries)
info = f.get_info("/workspace/e2b/hello.txt")
out["info"] = [info.name, info.size, info.type == FileType.FILE]
out["exists"] = [f.exists("/workspace/e2b/hello.txt"), f.exists("/workspace/e2b/none")]
moved = f.rename("/workspace/e2b/hello.txt", "/workspace/e2b/sub/moved.txt")
out["rename"] = [moved.path, f.exists("/workspace/e2b/hello.txt"), f.read("/workspace/e2b/sub/moved.txt")]
f.remove("/workspace/e2b/sub")
out["removed"] = f.exists("/workspace/e2b/sub")
try:
    f.read("/workspace/e2b/missing.txt")
    out["missing"] = "no exception"
except FileNotFoundException:
    out["missing"] = "FileNotFoundException"
f.write_files([{"path": "/workspace/e2b/a.txt", "data": "A"}, {"path": "/workspace/e2b/b.txt", "data": b"B"}])
out["write_files"] = [f.read("/workspace/e2b/a.txt"), f.read("/workspace/e2b/b.txt")]
root = f.write("/workspace/e2b/root.txt", "r", user="root")
out["as_root"] = sb.commands.run("stat -c %U /workspace/e2b/root.txt").stdout.strip()
print(json.dumps(out))
""", sandbox.id)
    assert got["write"] == ["hello.txt", "/workspace/e2b/hello.txt"], got
    assert got["read"] == "hello e2b", got
    assert got["bytes"] is True, got
    assert got["mkdir"] == [True, False], got
    assert got["list"] == [["blob.bin", "file"], ["hello.txt", "file"], ["sub", "dir"]], got
    assert got["info"] == ["hello.txt", 9, True], got
    assert got["exists"] == [True, False], got
    assert got["rename"] == ["/workspace/e2b/sub/moved.txt", False, "hello e2b"], got
    assert got["removed"] is False, got
    assert got["missing"] == "FileNotFoundException", got
    assert got["write_files"] == ["A", "B"], got
    assert got["as_root"] == "root", got


@pytest.mark.microvm_subset
def test_pty(pub, sandbox):
    got = pub(CONNECT + """
h = sb.pty.create(PtySize(rows=24, cols=80))
seen = b""
step = [0]
def on_pty(data):
    # Typed, read back, resized and typed again from the callback, as a terminal front end does.
    global seen
    seen += data
    if step[0] == 0 and b"pty-42" in seen and b"24 80" in seen:
        step[0] = 1
        out["first"] = True
        sb.pty.resize(h.pid, PtySize(rows=40, cols=120))
        sb.pty.send_stdin(h.pid, b"stty size; exit 7\\n")
sb.pty.send_stdin(h.pid, b"echo pty-$((6*7)); stty size\\n")
try:
    h.wait(on_pty=on_pty)
    out["exit"] = 0
except Exception as e:
    out["exit"] = getattr(e, "exit_code", type(e).__name__)
out["resized"] = b"40 120" in seen
print(json.dumps(out))
""", sandbox.id)
    assert got.get("first") is True, got
    assert got["resized"] is True, got
    assert got["exit"] == 7, got


def test_lifecycle(pub, api):
    """Sandbox.create on the daemon's default driver (the client has no field for another)."""
    got = pub("""
import json, sys
from withruntime.e2b import Sandbox, SandboxQuery, SandboxNotFoundException
out = {}
sb = Sandbox.create(timeout=120, metadata={"suite": "e2b-lifecycle"}, envs={"FROM_CREATE": "yes"})
out["id"] = sb.sandbox_id
info = sb.get_info()
out["info"] = [info.sandbox_id == sb.sandbox_id, info.metadata.get("suite"), 100 <= (info.end_at - info.started_at).total_seconds() <= 140]
out["env"] = sb.commands.run("echo $FROM_CREATE").stdout
out["running"] = sb.is_running()
before = sb.get_info().end_at
sb.set_timeout(600)
out["timeout_moved"] = sb.get_info().end_at > before
p = Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b-lifecycle"}))
found = []
while p.has_next:
    found += [i.sandbox_id for i in p.next_items()]
out["listed"] = found == [sb.sandbox_id]
sb.commands.run("echo kept > /workspace/kept.txt")
out["paused"] = sb.pause()
out["running_paused"] = sb.is_running()
again = Sandbox.connect(sb.sandbox_id)
out["resumed"] = [again.is_running(), again.files.read("/workspace/kept.txt")]
out["killed"] = again.kill()
try:
    Sandbox.connect(sb.sandbox_id).commands.run("true")
    out["after_kill"] = "connected"
except SandboxNotFoundException:
    out["after_kill"] = "SandboxNotFoundException"
except Exception as e:
    out["after_kill"] = type(e).__name__
print(json.dumps(out))
""")
    api.created.append(got["id"])
    assert got["info"] == [True, "e2b-lifecycle", True], got
    assert got["env"] == "yes\n", got
    assert got["running"] is True and got["timeout_moved"] is True, got
    assert got["listed"] is True, got
    assert got["paused"] is True and got["running_paused"] is False, got
    assert got["resumed"] == [True, "kept\n"], got
    assert got["killed"] is True, got
    assert got["after_kill"] == "SandboxNotFoundException", got


CI = """
import json, sys
from withruntime.e2b.code_interpreter import Sandbox
from withruntime.e2b import NotSupportedException
sb = Sandbox.connect(sys.argv[1])
out = {}
"""


@pytest.mark.driver_independent  # the drop-in's calls; the interpreter per driver: test_interpreter*.py
def test_code_interpreter(pub, sandbox):
    got = pub(CI + """
sb.run_code("x = 41")
e = sb.run_code("x + 1")
out["value"] = [e.text, e.results[0].is_main_result, e.execution_count is not None]
e = sb.run_code("print('to stdout'); import sys; print('to stderr', file=sys.stderr)")
out["logs"] = [e.logs.stdout, e.logs.stderr]
e = sb.run_code("1 / 0")
out["error"] = [e.error.name, e.error.value, "ZeroDivisionError" in e.error.traceback]
seen = []
sb.run_code("for i in range(3): print(i)", on_stdout=lambda m: seen.append(m.line))
out["on_stdout"] = "".join(seen)
e = sb.run_code("{'a': 1}")
out["json"] = [e.results[0].json, e.results[0].text]
e = sb.run_code("from IPython.display import display, HTML\\ndisplay(HTML('<b>hi</b>'))\\n7")
out["display"] = [[r.html for r in e.results if r.html], e.text]
e = sb.run_code("!echo from-a-shell")
out["shell"] = e.logs.stdout

ctx = sb.create_code_context(cwd="/tmp")
e = sb.run_code("import os; os.getcwd()", context=ctx)
out["ctx_cwd"] = e.text
sb.run_code("y = 'only here'", context=ctx)
out["ctx_state"] = [sb.run_code("y", context=ctx).text, sb.run_code("y").error.name]
out["ctx_listed"] = ctx.id in [c.id for c in sb.list_code_contexts()]
sb.restart_code_context(ctx)
out["ctx_restarted"] = sb.run_code("y", context=ctx).error.name
sb.remove_code_context(ctx)
out["ctx_removed"] = ctx.id in [c.id for c in sb.list_code_contexts()]
try:
    sb.run_code("1", envs={"A": "1"})
    out["envs"] = "ran"
except NotSupportedException:
    out["envs"] = "NotSupportedException"
print(json.dumps(out))
""", sandbox.id)
    assert got["value"] == ["42", True, True], got
    assert got["logs"] == [["to stdout\n"], ["to stderr\n"]], got
    assert got["error"][0] == "ZeroDivisionError" and got["error"][2] is True, got
    assert got["on_stdout"] == "0\n1\n2\n", got
    assert got["json"][0] == {"a": 1} and got["json"][1] == "{'a': 1}", got
    assert got["display"] == [["<b>hi</b>"], "7"], got
    # IPython runs `!cmd` on a terminal, so its lines end in CR LF, in Jupyter as here.
    assert got["shell"] == ["from-a-shell\r\n"], got
    assert got["ctx_cwd"] == "'/tmp'", got
    assert got["ctx_state"] == ["'only here'", "NameError"], got
    assert got["ctx_listed"] is True, got
    assert got["ctx_restarted"] == "NameError", got
    assert got["ctx_removed"] is False, got
    # Per-run environment variables are refused by the drop-in itself, naming contexts' env.
    assert got["envs"] == "NotSupportedException", got


def test_code_interpreter_chart(pub, api, driver, analysis_image):
    """A matplotlib figure as the last expression: a PNG in the main result, as Jupyter gives it
    (the analysis image has matplotlib; the fixture builds it where it is missing)."""
    sbx = api.create_sandbox(driver=driver, image=analysis_image)
    got = pub(CI + """
import base64
e = sb.run_code('''
import matplotlib
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [1, 4, 9])
fig
''')
png = [r for r in e.results if r.png]
out["png"] = [len(png), base64.b64decode(png[0].png)[:8].hex() if png else None,
              png[0].is_main_result if png else None, e.error.name if e.error else None]
print(json.dumps(out))
""", sbx.id)
    assert got["png"][0] >= 1 and got["png"][1] == "89504e470d0a1a0a" and got["png"][2] is True, got


@pytest.mark.driver_independent
def test_refused_by_design(pub, sandbox):
    """What docs/e2b.md lists as refused: the drop-in raises NotSupportedException with the
    alternative, before any request reaches the daemon."""
    got = pub(CONNECT + """
import withruntime.e2b as e2b
def refused(f):
    try:
        f()
        return "ran"
    except NotSupportedException as e:
        return "NotSupportedException"
    except Exception as e:
        return type(e).__name__
out["template"] = refused(lambda: e2b.Template().from_image("x"))
out["volume"] = refused(lambda: e2b.Volume.create("v"))
out["secret"] = refused(lambda: e2b.Secret.create("s"))
out["create_mcp"] = refused(lambda: Sandbox.create(mcp={"x": {}}))
out["create_network"] = refused(lambda: Sandbox.create(network={"allow_out": ["1.1.1.1"]}))
out["git"] = refused(lambda: sb.git)
out["update_network"] = refused(lambda: sb.update_network({}))
out["reboot"] = refused(lambda: sb.connect(on_resume="reboot"))
out["watch_network_mounts"] = refused(lambda: sb.files.watch_dir("/workspace", allow_network_mounts=True))
print(json.dumps(out))
""", sandbox.id)
    assert set(got.values()) == {"NotSupportedException"}, got
