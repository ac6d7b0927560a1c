"""The interpreter's JavaScript and TypeScript (Deno's Jupyter kernel, in the default image) and
R (IRkernel, in the analysis image): state kept between cells, a cell's last expression as its
result, console output as stdout, errors with name, value and traceback, a cell that never ends
stopped by its timeout and by an interrupt with the state kept, E2B's short names, the published
client's contexts and E2B drop-in, and a language whose kernel the image lacks refused by name."""
from __future__ import annotations

import threading
import time

import pytest

from helpers import assert_error, wait_until
from test_interpreter import contexts, plain, run

# A kernel's first cell waits for its start: seconds, more under gVisor and under load.
FIRST = {"http_timeout": 300}


def has_deno(sbx) -> bool:
    return sbx.exec("test -x /usr/local/bin/deno")["exitCode"] == 0


def need_deno(sbx) -> None:
    if not has_deno(sbx):
        pytest.skip("the image has no deno (the default image of images/build.sh has it)")


def listed(sbx) -> dict[str, dict]:
    return {c["id"]: c for c in contexts(sbx, "GET")["data"]}


def test_javascript_keeps_state_and_gives_its_last_expression(sandbox):
    need_deno(sandbox)
    first = run(sandbox, "let x = 6;\nconsole.log('set');", language="javascript", **FIRST)
    assert first["status"] == "ok" and first["context"] == "javascript", first
    assert first["stdout"] == "set\n", first
    out = run(sandbox, "x * 7", language="javascript")
    assert out["status"] == "ok" and plain(out) == "42", out
    assert out["executionCount"] == first["executionCount"] + 1
    got = listed(sandbox)["javascript"]
    assert got["running"] is True and got["kernel"] == "deno", got


@pytest.mark.driver_independent
def test_javascript_top_level_await_objects_and_stderr(sandbox):
    need_deno(sandbox)
    out = run(sandbox, "const v = await new Promise(r => setTimeout(() => r(21), 10));\n"
                       "console.error('warn');\n({doubled: v * 2, list: [1, 'a']})",
              language="javascript", **FIRST)
    assert out["status"] == "ok", out
    assert out["stderr"] == "warn\n", out
    text = plain(out)
    assert "doubled: 42" in text and '"a"' in text, text


@pytest.mark.driver_independent  # the error's fields are the kernel's; JavaScript per driver is above
def test_javascript_errors_carry_name_value_and_traceback(sandbox):
    need_deno(sandbox)
    run(sandbox, "const kept = 'yes';", language="javascript", **FIRST)
    out = run(sandbox, "console.log('before');\nthrow new TypeError('bad value');", language="javascript")
    assert out["status"] == "error", out
    err = out["error"]
    assert err["name"] == "TypeError" and "bad value" in err["value"], err
    assert "bad value" in err["traceback"], err
    assert "before" in out["stdout"]
    missing = run(sandbox, "noSuchName + 1", language="javascript")
    assert missing["status"] == "error" and missing["error"]["name"] == "ReferenceError", missing
    assert plain(run(sandbox, "kept", language="javascript")) == '"yes"'


def test_javascript_timeout_and_interrupt_stop_a_loop_that_never_ends(sandbox):
    """`while (true) {}` never yields to the event loop: the timeout and the interrupt reach it
    through the kernel's control channel (V8 terminates the script; a SIGINT would end Deno),
    and the kernel and its state stay."""
    need_deno(sandbox)
    run(sandbox, "var n = 5;", language="javascript", **FIRST)
    t0 = time.monotonic()
    out = run(sandbox, "while (true) {}", language="javascript", timeoutMs=1500)
    assert out["status"] == "timeout" and out["error"]["name"] == "TimeoutError", out
    assert time.monotonic() - t0 < 30
    assert plain(run(sandbox, "n", language="javascript")) == "5"
    got = {}

    def hang():
        got["out"] = run(sandbox, "while (true) {}", language="javascript", timeoutMs=0, http_timeout=120)

    t = threading.Thread(target=hang)
    t.start()
    time.sleep(1.5)
    r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/interpreter/contexts/javascript:interrupt", json={})
    assert r.status_code == 200 and r.json()["interrupted"] is True, r.text
    t.join(60)
    assert not t.is_alive(), "the interrupt did not end the cell"
    assert got["out"]["status"] == "error", got
    assert plain(run(sandbox, "n + 37", language="javascript")) == "42"


@pytest.mark.driver_independent
def test_typescript_types_and_state(sandbox):
    need_deno(sandbox)
    made = contexts(sandbox, "POST", expect=201, json={"id": "ts1", "language": "typescript", "cwd": "/tmp",
                                                       "env": {"GREETING": "hi"}}, timeout=300)
    assert made["language"] == "typescript" and made["kernel"] == "deno", made
    out = run(sandbox, "interface P { x: number }\nconst p: P = { x: 41 };\n"
                       "console.log(Deno.env.get('GREETING'), Deno.cwd());", context="ts1", **FIRST)
    assert out["status"] == "ok" and out["stdout"] == "hi /tmp\n", out
    assert plain(run(sandbox, "p.x + 1", context="ts1")) == "42"
    # The default typescript context is another kernel.
    assert run(sandbox, "typeof p", language="ts", **FIRST)["results"][0]["data"]["text/plain"] == '"undefined"'
    assert contexts(sandbox, "DELETE", "/ts1") == {"deleted": True}


def made_with_cwd_and_env(sbx, ctx: str, language: str, show: str, want: str) -> dict:
    """A context of language made with cwd /tmp and GREETING in its env: the cell `show`
    prints both as `want`. The context made, as its create answered."""
    made = contexts(sbx, "POST", expect=201, json={"id": ctx, "language": language, "cwd": "/tmp",
                                                   "env": {"GREETING": "hi"}}, timeout=300)
    assert made["language"] == language and made["cwd"] == "/tmp", made
    out = run(sbx, show, context=ctx, **FIRST)
    assert out["status"] == "ok" and out["stdout"] == want, out
    return made


@pytest.mark.driver_independent
def test_javascript_context_with_cwd_and_env(sandbox):
    need_deno(sandbox)
    made_with_cwd_and_env(sandbox, "js-env", "javascript", "console.log(Deno.env.get('GREETING'), Deno.cwd())",
                          "hi /tmp\n")
    # The default javascript context has neither.
    out = run(sandbox, "[Deno.env.get('GREETING') ?? null, Deno.cwd()]", language="javascript", **FIRST)
    assert out["status"] == "ok" and plain(out).replace(" ", "") == '[null,"/workspace"]', out
    assert contexts(sandbox, "DELETE", "/js-env") == {"deleted": True}


@pytest.mark.driver_independent
def test_deno_fetches_nothing_and_keeps_its_cache_in_the_context(sandbox):
    need_deno(sandbox)
    out = run(sandbox, "[Deno.env.get('DENO_DIR'), Deno.env.get('DENO_NO_UPDATE_CHECK')]",
              language="javascript", **FIRST)
    assert out["status"] == "ok", out
    text = plain(out)
    assert "/workspace/.runtime/interpreter/javascript/deno" in text and '"1"' in text, text


@pytest.mark.driver_independent
def test_e2b_short_names_reach_the_full_ones(sandbox):
    need_deno(sandbox)
    out = run(sandbox, "const a = 40;", language="js", **FIRST)
    assert out["context"] == "javascript", out
    assert plain(run(sandbox, "a + 2", language="javascript")) == "42"
    made = contexts(sandbox, "POST", expect=201, json={"id": "short", "language": "ts"}, timeout=300)
    assert made["language"] == "typescript", made


@pytest.mark.driver_independent
def test_unknown_languages_are_refused_with_the_list(sandbox):
    base = f"/v1/sandboxes/{sandbox.id}/interpreter"
    for lang in ("JavaScript", "node", "deno", "R", "rust", "j" * 5000):
        r = sandbox.api.post(f"{base}:run", json={"code": "1", "language": lang})
        assert_error(r, 400, "invalid_request", mentions="javascript, typescript, r")
        r = sandbox.api.post(f"{base}/contexts", json={"language": lang})
        assert_error(r, 400, "invalid_request", mentions="javascript, typescript, r")


@pytest.mark.driver_independent
def test_r_needs_the_analysis_image(sandbox):
    """The default image has no R: a context of it is a 400 naming what the image has."""
    if sandbox.exec("test -x /usr/bin/R")["exitCode"] == 0:
        pytest.skip("this image has R")
    base = f"/v1/sandboxes/{sandbox.id}/interpreter"
    r = sandbox.api.post(f"{base}:run", json={"code": "1", "language": "r"}, timeout=120)
    assert_error(r, 400, "invalid_request", mentions="IRkernel")
    assert "javascript" in r.json()["error"]["message"] or not has_deno(sandbox), r.text
    assert "r" not in listed(sandbox)


@pytest.fixture
def analysis_sandbox(api, driver, analysis_image):
    return api.create_sandbox(driver=driver, image=analysis_image)


def test_r_cells_in_the_analysis_image(analysis_sandbox):
    sbx = analysis_sandbox
    if sbx.exec("test -x /usr/bin/R")["exitCode"] != 0:
        pytest.skip("the analysis image has no R (images/build.sh's analysis recipe installs r-cran-irkernel)")
    assert listed(sbx)["r"]["kernel"] == "IRkernel"
    first = run(sbx, "x <- 6\ncat('set\\n')", language="r", **FIRST)
    assert first["status"] == "ok" and first["stdout"] == "set\n" and first["context"] == "r", first
    # IRkernel sends a value as display data, not as the cell's execute_result: a result
    # that is not the main one.
    out = run(sbx, "x * 7", language="r")
    assert out["status"] == "ok" and out["results"][-1]["data"]["text/plain"] == "[1] 42", out
    df = run(sbx, "data.frame(a = c(1, 2), b = c('u', 'v'))", language="r")
    assert df["status"] == "ok" and "<table" in df["results"][-1]["data"]["text/html"], df
    err = run(sbx, "stop('bad value')", language="r")
    assert err["status"] == "error" and err["error"]["name"] == "ERROR", err
    assert "bad value" in err["error"]["value"] and "stop(" in err["error"]["traceback"], err
    warned = run(sbx, "message('m'); warning('w')", language="r")
    assert warned["status"] == "ok" and "m\n" in warned["stderr"] and "w" in warned["stderr"], warned
    t0 = time.monotonic()
    slow = run(sbx, "while (TRUE) {}", language="r", timeoutMs=1500)
    assert slow["status"] == "timeout", slow
    assert time.monotonic() - t0 < 60
    kept = run(sbx, "x * 7", language="r", http_timeout=120)
    assert kept["results"][-1]["data"]["text/plain"] == "[1] 42", kept


E2B_R = """
import json, sys
from withruntime.e2b.code_interpreter import Sandbox
sbx = Sandbox.connect(sys.argv[1])
out = {"listed": sorted([c.id, c.language] for c in sbx.list_code_contexts())}
sbx.run_code("y <- 2", language="r")
out["value"] = [r.text for r in sbx.run_code("y * 21", language="r").results]
out["stdout"] = sbx.run_code("cat('hi\\n')", language="r").logs.stdout
err = sbx.run_code("stop('too far')", language="r").error
out["error"] = [err.name, err.value]
ctx = sbx.create_code_context(cwd="/tmp", language="r")
out["cwd"] = sbx.run_code("cat(getwd())", context=ctx).logs.stdout
out["ctx_language"] = ctx.language
sbx.remove_code_context(ctx)
print(json.dumps(out))
"""


@pytest.mark.driver_independent  # the client's contexts; R per driver is test_r_cells_in_the_analysis_image
def test_r_context_with_cwd_and_env_and_the_e2b_drop_in(pub, analysis_sandbox):
    """R as the other languages are held to: a context's cwd and env, and E2B's drop-in
    (run_code with language="r", a context made with a cwd) against the analysis image."""
    sbx = analysis_sandbox
    if sbx.exec("test -x /usr/bin/R")["exitCode"] != 0:
        pytest.skip("the analysis image has no R (images/build.sh's analysis recipe installs r-cran-irkernel)")
    made = made_with_cwd_and_env(sbx, "r1", "r", "cat(paste(Sys.getenv('GREETING'), getwd()), '\\n', sep = '')",
                                 "hi /tmp\n")
    assert made["kernel"] == "IRkernel", made
    # The default r context has neither.
    out = run(sbx, "cat(Sys.getenv('GREETING'), '|', getwd(), sep = '')", language="r", **FIRST)
    assert out["status"] == "ok" and out["stdout"] == "|/workspace", out
    assert contexts(sbx, "DELETE", "/r1") == {"deleted": True}
    got = pub(E2B_R, sbx.id, timeout=600)
    assert ["r", "r"] in got["listed"], got
    assert got["value"] == ["[1] 42"] and got["stdout"] == ["hi\n"], got
    assert got["error"][0] == "ERROR" and "too far" in got["error"][1], got
    assert got["cwd"] == ["/tmp"] and got["ctx_language"] == "r", got


E2B = """
import json, sys
from withruntime.e2b.code_interpreter import Sandbox
sbx = Sandbox.connect(sys.argv[1])
out = {"listed": sorted([c.id, c.language] for c in sbx.list_code_contexts())}
sbx.run_code("const x = 6;", language="js")
out["js"] = sbx.run_code("x * 7", language="js").text
out["stdout"] = "".join(sbx.run_code("console.log('hi')", language="javascript").logs.stdout)
err = sbx.run_code("throw new RangeError('too far')", language="js").error
out["error"] = [err.name, err.value]
ctx = sbx.create_code_context(language="typescript")
out["ts"] = sbx.run_code("const n: number = 2; n * 21", context=ctx).text
out["ts_language"] = ctx.language
sbx.remove_code_context(ctx)
print(json.dumps(out))
"""


@pytest.mark.driver_independent  # the client's calls; JavaScript per driver is above
def test_e2b_drop_in_runs_javascript_and_typescript(pub, sandbox):
    need_deno(sandbox)
    got = pub(E2B, sandbox.id, timeout=600)
    assert ["javascript", "javascript"] in got["listed"] and ["typescript", "typescript"] in got["listed"], got
    assert got["js"] == "42" and got["stdout"] == "hi\n", got
    assert got["error"][0] == "RangeError" and "too far" in got["error"][1], got
    assert got["ts"] == "42" and got["ts_language"] == "typescript", got


CONTEXTS = """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
made = sbx.interpreter.contexts.create(id="js2", language="javascript")
sbx.interpreter.run("let total = 40;", context="js2")
ex = sbx.interpreter.run("total + 2", context="js2")
print(json.dumps({"made": made["language"], "result": ex["results"][0]["data"]["text/plain"],
                  "removed": sbx.interpreter.contexts.remove("js2")}))
"""


@pytest.mark.driver_independent
def test_published_client_contexts_in_javascript(pub, sandbox):
    need_deno(sandbox)
    got = pub(CONTEXTS, sandbox.id, timeout=600)
    assert got == {"made": "javascript", "result": "42", "removed": True}, got


def test_javascript_out_of_memory_kills_the_context_only(api, driver):
    """A 512 MiB sandbox (Deno's kernel holds 220 to 280 MiB resident from its start, so a
    smaller one has no room for it next to the python kernel started ahead): a cell that
    allocates without end costs its kernel only, ended by V8's heap cap under gVisor and by
    the kernel's OOM killer on namespace, and the next run starts a new one, empty."""
    sbx = api.create_sandbox(driver=driver, memoryMiB=512)
    need_deno(sbx)
    run(sbx, "const x = 1;", language="javascript", **FIRST)
    out = run(sbx, "const hog = [];\nwhile (true) { hog.push(new Array(1 << 20).fill(7)); }",
              language="javascript", timeoutMs=120000, http_timeout=300)
    assert out["status"] == "lost" and out["error"]["name"] == "ContextDied", out
    assert sbx.exec("echo alive")["stdout"] == "alive\n"
    again = run(sbx, "typeof x", language="javascript", http_timeout=300)
    assert again["status"] == "ok" and plain(again) == '"undefined"', again
