"""The TypeScript SDK (sdk/js, the npm package `withruntime`) against the real daemon.

Once per pytest run it builds sdk/js as CI would from a clean checkout: `npm ci` from the committed
package-lock.json (its `prepare` script runs `tsc`). Then node's own test runner runs the files of
sdk/js/test against the suite's daemon, with its URL and key in the environment. One pytest test
per node test file (and driver): node's runner already reports each subtest by name, so a failure
here shows node's whole output rather than a second, lossy copy of it parsed from TAP.

  sdk.test.mjs    the SDK (on namespace by default, every driver with RUNTIME_TEST_ALL=1)
  processes.test.mjs  processes (execStream, spawn, Process) and the interpreter, likewise
  cli.test.mjs    the `withruntime` bin and the C CLI `runtime` against the same expectations, likewise
  agent.test.mjs  a LlamaIndex.TS agent driving the four tools against the scripted LLM server

and, from here: the tools' schemas against the Python tools', `npm pack` + install + the README's
`npx withruntime sandbox run --trial` line, and a daemon on a unix socket.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
JS = REPO / "sdk" / "js"
sys.path.insert(0, str(REPO / "tests" / "llm"))
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))

from scripted_openai import ScriptedOpenAI  # noqa: E402

NODE = shutil.which("node")
NPM = shutil.which("npm")
pytestmark = pytest.mark.skipif(not (NODE and NPM), reason="node and npm are not installed (scripts/install-deps.sh)")

# Seconds one node test file may take: the microVM under emulation needs minutes per start.
FILE_TIMEOUT = {"namespace": 600, "gvisor": 900, "microvm": 1800}


def _node_major() -> int:
    out = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout.strip()
    return int(out.lstrip("v").split(".")[0])


def _lock_installed() -> bool:
    """node_modules holds exactly what package-lock.json pins (npm's own record of it)."""
    hidden = JS / "node_modules" / ".package-lock.json"
    if not hidden.exists():
        return False
    want = json.loads((JS / "package-lock.json").read_text())["packages"]
    have = json.loads(hidden.read_text())["packages"]
    want = {k: v.get("version") for k, v in want.items() if k}
    have = {k: v.get("version") for k, v in have.items()}
    return want == have


@pytest.fixture(scope="session")
def js_build() -> Path:
    if _node_major() < 20:
        pytest.skip("the SDK needs Node 20 or newer")
    env = {**os.environ, "npm_config_audit": "false", "npm_config_fund": "false", "npm_config_update_notifier": "false"}
    if not _lock_installed():
        r = subprocess.run([NPM, "ci"], cwd=JS, capture_output=True, text=True, env=env, timeout=900)
        if r.returncode != 0:
            if any(s in r.stderr for s in ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT")):
                pytest.skip(f"npm ci cannot reach the registry: {r.stderr[-500:]}")
            pytest.fail(f"npm ci failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}", pytrace=False)
    r = subprocess.run([NPM, "run", "build"], cwd=JS, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"tsc failed:\n{r.stdout[-5000:]}\n{r.stderr[-3000:]}", pytrace=False)
    assert (JS / "dist" / "index.js").exists() and (JS / "dist" / "index.d.ts").exists()
    return JS


def _fast_driver(daemon) -> str | None:
    r = httpx.get(daemon.base_url + "/v1/info", headers={"Authorization": f"Bearer {daemon.api_key}"})
    available = {d.get("name") for d in r.json().get("drivers", []) if d.get("available")}
    return next((d for d in ("namespace", "gvisor") if d in available), None)


def _env(daemon, driver: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    env.update(daemon.env())
    if driver:
        env["RUNTIME_TEST_DRIVER"] = driver
    env.update(extra)
    return env


def run_node(test_file: str, env: dict[str, str], timeout: float) -> str:
    """Runs one node test file; fails with node's output unless every test in it passed."""
    try:
        r = subprocess.run([NODE, "--test", "--test-reporter=spec", f"test/{test_file}"], cwd=JS, env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"node --test {test_file} took more than {timeout} s:\n{out[-8000:]}", pytrace=False)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        pytest.fail(f"node --test {test_file} failed ({r.returncode}):\n{out[-12000:]}", pytrace=False)
    # Node counts what ran; a file whose tests all skipped would pass while checking nothing.
    summary = {line.split()[1]: int(line.split()[2]) for line in out.splitlines()
               if line.startswith("ℹ ") and len(line.split()) == 3 and line.split()[2].isdigit()}
    assert summary.get("pass", 0) > 0, f"no test passed in {test_file}:\n{out[-4000:]}"
    assert summary.get("fail", 1) == 0, out[-4000:]
    print(out[-3000:])
    return out


# The SDK's and the CLIs' answers do not depend on the driver (each driver's
# behaviour is checked by the suite's own tests of it): by default these run
# on namespace (gVisor's cases of the three took 128 s); RUNTIME_TEST_ALL=1
# runs them on every driver.
@pytest.mark.driver_independent
def test_js_sdk(js_build, daemon, driver):
    run_node("sdk.test.mjs", _env(daemon, driver), FILE_TIMEOUT[driver])


@pytest.mark.driver_independent
def test_js_sdk_processes_interpreter(js_build, daemon, driver):
    run_node("processes.test.mjs", _env(daemon, driver), FILE_TIMEOUT[driver])


@pytest.mark.driver_independent
def test_js_cli_same_as_c_cli(js_build, build_dir, daemon, driver):
    clis = [["runtime", str(build_dir / "runtime")], ["withruntime", NODE, str(JS / "dist" / "cli.js")]]
    run_node("cli.test.mjs", _env(daemon, driver, RUNTIME_TEST_CLIS=json.dumps(clis)),
             FILE_TIMEOUT[driver] * 2)


def test_js_llamaindex_agent(js_build, daemon):
    driver = _fast_driver(daemon)
    with ScriptedOpenAI() as server:
        run_node("agent.test.mjs", _env(daemon, driver, SCRIPTED_OPENAI_URL=server.base_url), 600)


def test_js_tools_match_python(js_build):
    """Same names, descriptions and parameters as the Python SDK's tools, as each framework
    shows them to the model (LlamaIndex.TS's metadata; llama-index-core's FunctionTool)."""
    core = pytest.importorskip("llama_index.core.tools")
    from withruntime import Sandbox
    from withruntime.tools import sandbox_tools

    script = ("import { sandboxTools } from 'withruntime/tools';"
              "const fake = { exec() {}, files: {} };"
              "console.log(JSON.stringify(sandboxTools(fake, { root: '/srv', timeoutSeconds: 120 })"
              ".map((t) => t.metadata)));")
    r = subprocess.run([NODE, "--input-type=module", "-e", script], cwd=JS, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout)
    py = [core.FunctionTool.from_defaults(fn=f).metadata
          for f in sandbox_tools(Sandbox.__new__(Sandbox), root="/srv", timeout_seconds=120)]
    assert [t["name"] for t in js] == [m.name for m in py]
    for j, p in zip(js, py):
        # Python's description is "name(signature)\n" + the docstring; the prose before "Args:"
        # is the tool's description, the "Args:" lines are the parameters' own.
        prose = p.description.split("\n", 1)[1].split("\n\nArgs:")[0]
        assert j["description"] == prose, p.name
        want = p.get_parameters_dict()
        for prop in want["properties"].values():
            prop.pop("title", None)
        assert j["parameters"]["properties"] == want["properties"], p.name
        assert sorted(j["parameters"].get("required", [])) == sorted(want.get("required", [])), p.name


def test_npm_pack_install_and_npx_trial(js_build, daemon, any_driver, tmp_path):
    """The README's path for a new user: the packed tarball installed with npm, then
    `npx withruntime sandbox run --trial -- python3 -c 'print(6 * 7)'` prints 42."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    env.update({"npm_config_audit": "false", "npm_config_fund": "false", "npm_config_update_notifier": "false"})
    r = subprocess.run([NPM, "pack", "--pack-destination", str(tmp_path)], cwd=JS, capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    tarball = next(tmp_path.glob("withruntime-*.tgz"))
    prefix = tmp_path / "prefix"
    r = subprocess.run([NPM, "install", "-g", "--prefix", str(prefix), "--offline", str(tarball)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    state = tmp_path / "state"
    env.update({"RUNTIME_BASE_URL": daemon.base_url, "RUNTIME_STATE_DIR": str(state),
                "PATH": f"{prefix / 'bin'}:{env.get('PATH', '')}", "npm_config_prefix": str(prefix),
                "npm_config_offline": "true"})
    cmd = [shutil.which("npx") or "npx", "withruntime", "sandbox", "run", "--trial", "--driver", any_driver,
           "--", "python3", "-c", "print(6 * 7)"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "42\n"
    assert (state / "trial.key").exists()


def test_js_over_unix_socket(js_build, build_dir, image_dir, tmp_path):
    """RUNTIME_BASE_URL=unix:/path with the key from the daemon's admin.key: the SDK's buffered and
    streamed exec, and the bin's --trial (the trial route answers on the unix socket too)."""
    import signal

    from helpers import remove_empty_cgroup_tree, wait_until

    if os.geteuid() != 0:
        pytest.skip("the daemon needs root")
    sock = tmp_path / "runtimed.sock"
    state = tmp_path / "state"
    cgroup = f"runtime-test-js-uds-{os.getpid()}"
    log = open(tmp_path / "runtimed.log", "wb")
    proc = subprocess.Popen([str(build_dir / "runtimed"), "--state-dir", str(state), "--socket", str(sock),
                             "--image-dir", str(image_dir), "--cgroup-parent", cgroup],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        wait_until(lambda: sock.exists() and (state / "admin.key").exists() or proc.poll() is not None, 60,
                   what="the daemon's socket")
        assert proc.poll() is None, (tmp_path / "runtimed.log").read_text()
        key = (state / "admin.key").read_text().strip()
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://runtimed") as c:
            info = c.get("/v1/info", headers={"Authorization": f"Bearer {key}"}).json()
        available = {d["name"] for d in info.get("drivers", []) if d.get("available")}
        drv = next((d for d in ("namespace", "gvisor") if d in available), None)
        if drv is None:
            pytest.skip("neither namespace nor gvisor is available")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        env.update({"RUNTIME_BASE_URL": f"unix:{sock}", "RUNTIME_STATE_DIR": str(state)})
        script = ("import { Sandbox } from 'withruntime';"
                  f"const sbx = await Sandbox.create({{ driver: '{drv}', timeoutSeconds: 60 }});"
                  "const a = await sbx.exec('echo over the socket');"
                  "const got = []; const b = await sbx.exec('echo streamed', { onStdout: (d) => got.push(d) });"
                  "await sbx.delete(); sbx.close();"
                  "console.log(JSON.stringify([a.stdout, b.stdout, got]));")
        r = subprocess.run([NODE, "--input-type=module", "-e", script], cwd=JS, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == ["over the socket\n", "streamed\n", ["streamed\n"]]
        trial_state = tmp_path / "trial-state"
        env["RUNTIME_STATE_DIR"] = str(trial_state)
        r = subprocess.run([NODE, str(JS / "dist" / "cli.js"), "sandbox", "run", "--trial", "--driver", drv, "--",
                            "python3", "-c", "print(6 * 7)"], env=env, capture_output=True, text=True, timeout=300)
        assert (r.returncode, r.stdout) == (0, "42\n"), r.stderr
        assert (trial_state / "trial.key").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        remove_empty_cgroup_tree(cgroup)


def test_js_volumes(js_build, daemon):
    """runtime.volumes of the TypeScript SDK (sdk/js/test/volumes.test.mjs) on the namespace
    driver, which attaches volumes."""
    from helpers import skip_unless_driver
    skip_unless_driver(daemon, "namespace")
    run_node("volumes.test.mjs", _env(daemon, "namespace"), FILE_TIMEOUT["namespace"])
