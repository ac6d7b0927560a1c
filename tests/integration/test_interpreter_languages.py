"""The interpreter's languages and default contexts: each language's own context is listed
from the sandbox's start and started lazily; the default python context's kernel is started
ahead with the sandbox and keeps it busy for nothing; a context's removal kills what its
cells left running; a language without a kernel is refused by name. Bash runs on
bash_kernel where the image has it (the default image does): state across cells, errors
with their output, env, cwd and the sandbox's user."""
from __future__ import annotations

import os
import threading
import time

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, wait_until
from test_interpreter import contexts, plain, run
from test_lifecycle import quick_daemon  # noqa: F401 (a fixture)


def listed(sbx) -> dict[str, dict]:
    return {c["id"]: c for c in contexts(sbx, "GET")["data"]}


def has_bash_kernel(sbx) -> bool:
    return sbx.exec("python3 -c 'import bash_kernel'")["exitCode"] == 0


def need_bash(sbx) -> None:
    if not has_bash_kernel(sbx):
        pytest.skip("the image has no bash_kernel (the default image of images/build.sh has it)")


@pytest.mark.driver_independent  # the listing is the daemon's
def test_default_contexts_are_listed_from_the_start(sandbox):
    got = listed(sandbox)
    assert "python" in got, got
    assert got["python"]["language"] == "python" and got["python"]["cwd"] == "/workspace"
    if has_bash_kernel(sandbox):
        assert got["bash"]["language"] == "bash" and got["bash"]["running"] is False, got
        assert got["bash"]["kernel"] == "bash_kernel" and got["bash"]["createdAt"] is None
        # A restart of a default context not started yet starts it.
        restarted = contexts(sandbox, "POST", "/bash:restart", json={})
        assert restarted["running"] is True and restarted["language"] == "bash", restarted
        assert listed(sandbox)["bash"]["createdAt"]
    else:
        assert "bash" not in got, got


@pytest.fixture
def prestart_daemon(build_dir, image_dir, tmp_path):
    """A daemon that starts the kernel ahead in one sandbox per 10 s, and ends it unused after
    10 s."""
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-prestart",
                      extra_args=["--interpreter-prestart-max", "1", "--interpreter-prestart-idle-seconds", "10"])
    yield d
    _finish_daemon(d)


def kernels(sbx) -> int:
    return int(sbx.exec("ps -eo args | grep -c '[i]pykernel' || true")["stdout"].strip() or 0)


def test_the_default_python_kernel_is_started_ahead_within_its_bounds(prestart_daemon, any_driver):
    """Nothing has run in the sandbox; its python context comes up by itself and its first cell
    is the kernel's first (no second kernel). The host starts at most
    --interpreter-prestart-max kernels ahead within --interpreter-prestart-idle-seconds: the
    next sandbox gets none, so hundreds of sandboxes that run no cell hold no kernel each; and
    a kernel started ahead that no cell used ends itself after that time, its memory given
    back, its context started again by the next run."""
    api = Api(prestart_daemon, timeout=300)
    try:
        a = api.create_sandbox(driver=any_driver)
        t0 = time.monotonic()
        if listed(a)["python"]["kernel"] != "ipykernel":
            pytest.skip("the image has no ipykernel: its contexts run on the loop, which starts in milliseconds")
        b = api.create_sandbox(driver=any_driver)
        wait_until(lambda: listed(a)["python"]["running"], 120, what="the prestarted python context")
        pid = listed(a)["python"]["pid"]
        out = run(a, "6*7")
        assert plain(out) == "42" and out["executionCount"] == 1, out
        assert listed(a)["python"]["pid"] == pid and kernels(a) == 1
        # b came within the window, past the bound: no kernel of its own until its first cell.
        assert not listed(b)["python"]["running"] and kernels(b) == 0, listed(b)
        # c comes after the window: it has its turn; unused, its kernel ends itself.
        time.sleep(max(0.0, 10.5 - (time.monotonic() - t0)))
        c = api.create_sandbox(driver=any_driver)
        wait_until(lambda: listed(c)["python"]["running"], 120, what="c's prestarted python context")
        wait_until(lambda: not listed(c)["python"]["running"] and kernels(c) == 0, 60,
                   what="the unused kernel to end itself")
        # Used, a's kernel stays past the idle time.
        assert listed(a)["python"]["running"] and kernels(a) == 1, listed(a)
        out = run(c, "6*7")
        assert plain(out) == "42" and out["executionCount"] == 1, out
        assert run(b, "6*7")["executionCount"] == 1
    finally:
        api.delete_all()
        api.close()


def test_a_run_during_the_prestart_waits_for_it(api, driver):
    """A cell sent at once after the create shares the kernel being started rather than start
    a second one: one context process, one kernel, and the count starts at 1."""
    sbx = api.create_sandbox(driver=driver)
    out = run(sbx, "import os\nos.getpid()", http_timeout=300)
    assert out["status"] == "ok" and out["executionCount"] == 1, out
    procs = sbx.exec("ps -eo args | grep -c '[i]pykernel'")["stdout"].strip()
    assert procs == "1", sbx.exec("ps -eo pid,ppid,args")["stdout"]


def test_the_prestarted_kernel_keeps_no_sandbox_awake(quick_daemon, any_driver):  # noqa: F811
    with quick_daemon.client() as api:
        r = api.post("/v1/sandboxes", json={"driver": any_driver, "idlePauseSeconds": 2})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        api.wait_state(sid, "paused", 60)
        r = api.post(f"/v1/sandboxes/{sid}/interpreter:run", json={"code": "6*7"}, timeout=300)
        assert r.status_code == 200 and r.json()["results"][0]["data"]["text/plain"] == "42", r.text
        api.wait_state(sid, "paused", 60)
        api.delete(f"/v1/sandboxes/{sid}")


def test_removing_a_context_kills_what_its_cells_left_running(sandbox):
    """`!cmd` runs on a pseudo-terminal in a session of its own, a process may start a session
    of its own, and a job a cell's shell put in the background outlives that shell (its parent
    is then the agent): the removal finds all three."""
    contexts(sandbox, "POST", expect=201, json={"id": "jobs"})
    started = run(sandbox, "import subprocess\n"
                           "subprocess.Popen(['setsid', 'sleep', '1001'])\n"
                           "subprocess.Popen('sleep 1002 >/dev/null 2>&1 &', shell=True,\n"
                           "                 start_new_session=True).wait()", context="jobs")
    assert started["status"] == "ok", started
    got = {}

    def hang():
        got["out"] = run(sandbox, "!sleep 1003", context="jobs", timeoutMs=0, http_timeout=120)

    t = threading.Thread(target=hang)
    t.start()
    sleeps = "pgrep -af '^sleep 100[123]$' || true"
    wait_until(lambda: len(sandbox.exec(sleeps)["stdout"].splitlines()) == 3, 30,
               what="the three sleeps: " + sandbox.exec("ps -eo pid,ppid,sid,args")["stdout"])
    assert contexts(sandbox, "DELETE", "/jobs") == {"deleted": True}
    t.join(60)
    assert not t.is_alive()
    # The cell running when its context went is lost, not left hanging.
    assert got["out"]["status"] == "lost", got
    left = sandbox.exec(sleeps)["stdout"]
    assert left == "", left
    # Another context is untouched.
    assert plain(run(sandbox, "1 + 1")) == "2"


def test_languages_the_interpreter_does_not_run_are_refused(sandbox):
    base = f"/v1/sandboxes/{sandbox.id}/interpreter"
    api = sandbox.api
    for body in ({"code": "1", "language": "java"}, ):
        r = api.post(f"{base}:run", json=body)
        assert_error(r, 400, "invalid_request", mentions="java")
    r = api.post(f"{base}/contexts", json={"language": "java"})
    assert_error(r, 400, "invalid_request", mentions="java")
    for lang in ("cobol", "", "PYTHON", "JS"):
        r = api.post(f"{base}:run", json={"code": "1", "language": lang})
        assert_error(r, 400, "invalid_request", mentions="python, bash, javascript, typescript, r")
        r = api.post(f"{base}/contexts", json={"language": lang})
        assert_error(r, 400, "invalid_request", mentions="python, bash, javascript, typescript, r")
    assert_error(api.post(f"{base}:run", json={"code": "1", "language": 7}), 400, "invalid_request")
    assert_error(api.post(f"{base}/contexts", json={"language": ["bash"]}), 400, "invalid_request")


def test_the_minimal_image_runs_python_on_the_loop_and_no_bash(api, driver, image_dir):
    if not (image_dir / "minimal" / "rootfs").is_dir():
        pytest.skip(f"no minimal image in {image_dir} (runtime image build minimal)")
    sbx = api.create_sandbox(driver=driver, image="minimal")
    got = listed(sbx)
    assert list(got) == ["python"] and got["python"]["kernel"] == "loop", got
    assert plain(run(sbx, "6*7", http_timeout=300)) == "42"
    r = api.post(f"/v1/sandboxes/{sbx.id}/interpreter:run", json={"code": "echo hi", "language": "bash"})
    assert_error(r, 400, "invalid_request", mentions="bash_kernel")
    r = api.post(f"/v1/sandboxes/{sbx.id}/interpreter/contexts", json={"language": "js"})
    assert_error(r, 400, "invalid_request", mentions="language javascript needs its Jupyter kernel (deno)")


@pytest.mark.driver_independent  # bash's own semantics; bash per driver: its context, timeout and interrupt tests
def test_bash_keeps_state_between_cells(sandbox):
    need_bash(sandbox)
    first = run(sandbox, "x=6; cd /tmp; echo started", language="bash", http_timeout=300)
    assert first["status"] == "ok" and first["context"] == "bash", first
    assert first["stdout"].strip() == "started", first
    out = run(sandbox, "echo $((x * 7)) $(pwd)", language="bash")
    assert out["stdout"].strip() == "42 /tmp", out
    assert listed(sandbox)["bash"]["running"] is True


@pytest.mark.driver_independent  # the error's fields are the kernel's; bash per driver is above and below
def test_bash_errors_carry_their_output(sandbox):
    need_bash(sandbox)
    out = run(sandbox, "echo before; ls /no/such/dir", language="bash", http_timeout=300)
    assert out["status"] == "error", out
    err = out["error"]
    assert err["name"] == "ExitStatus" and err["value"] == "exit status 2", err
    assert "No such file or directory" in err["traceback"], err
    assert "before" in out["stdout"]
    # The context lives on.
    assert run(sandbox, "echo after", language="bash")["stdout"].strip() == "after"


def test_bash_context_with_cwd_env_and_the_sandbox_user(sandbox):
    need_bash(sandbox)
    made = contexts(sandbox, "POST", expect=201, json={"id": "sh", "language": "bash", "cwd": "/tmp",
                                                       "env": {"GREETING": "hi there"}})
    assert made["language"] == "bash" and made["kernel"] == "bash_kernel", made
    out = run(sandbox, 'echo "$GREETING|$(pwd)|$(id -un)"', context="sh", http_timeout=300)
    assert out["stdout"].strip() == "hi there|/tmp|sandbox", out
    # Python's contexts run as the same user.
    assert plain(run(sandbox, "import getpass\ngetpass.getuser()")) == "'sandbox'"
    assert contexts(sandbox, "DELETE", "/sh") == {"deleted": True}


def test_bash_cell_timeout_and_interrupt_keep_the_shell(sandbox):
    need_bash(sandbox)
    run(sandbox, "y=5", language="bash", http_timeout=300)
    out = run(sandbox, "sleep 30", language="bash", timeoutMs=1500)
    assert out["status"] == "timeout", out
    t0 = time.monotonic()
    assert run(sandbox, "echo $y", language="bash")["stdout"].strip() == "5"
    assert time.monotonic() - t0 < 30


E2B = """
import json, sys
from withruntime.e2b.code_interpreter import Sandbox
sbx = Sandbox.connect(sys.argv[1])
out = {"listed": sorted([c.id, c.language] for c in sbx.list_code_contexts())}
out["python"] = sbx.run_code("x = 6\\nx * 7").text
if sys.argv[2] == "bash":
    sbx.run_code("y=6", language="bash")
    ex = sbx.run_code("echo $((y * 7))", language="bash")
    out["bash"] = "".join(ex.logs.stdout).strip()
    ctx = sbx.create_code_context(cwd="/tmp", language="bash")
    out["bash_ctx"] = "".join(sbx.run_code("pwd", context=ctx).logs.stdout).strip()
    sbx.remove_code_context(ctx)
print(json.dumps(out))
"""


@pytest.mark.driver_independent  # the client's contexts; each language per driver is above
def test_e2b_drop_in_lists_and_runs_each_language(pub, sandbox):
    """The published client's E2B code interpreter: list_code_contexts shows one default
    context per language the image has, and run_code(language=...) reaches it."""
    bash = has_bash_kernel(sandbox)
    got = pub(E2B, sandbox.id, "bash" if bash else "-")
    want = [["python", "python"]] + ([["bash", "bash"]] if bash else [])
    if sandbox.exec("test -x /usr/local/bin/deno")["exitCode"] == 0:
        want += [["javascript", "javascript"], ["typescript", "typescript"]]
    assert got["listed"] == sorted(want), got
    assert got["python"] == "42"
    if bash:
        assert got["bash"] == "42" and got["bash_ctx"] == "/tmp", got
